//! The control socket's server: connections are served concurrently, so that a
//! slow or idle client holds up nobody; each request is handed to the daemon's
//! loop, which carries them out one at a time (one writer of the maps), and its
//! answer written back. `top` and `top --fleet` are made here from what the
//! loop answers, so the loop never waits a second, nor on Redis. Started by
//! [`super::run`]; its clients are [`crate::protocol::socket`]'s.
//!
//! Bounded: at most [`MAX_CONNECTIONS`] at a time (past it the oldest idle one
//! is closed for the newcomer), a request line of at most [`MAX_REQUEST`] bytes
//! that must arrive within [`REQUEST_TIMEOUT`], and accept errors back off. A
//! list (`deny --from FILE`) may be longer, up to [`MAX_LIST_REQUEST`] within
//! [`LIST_TIMEOUT`], read by one connection at a time.

use std::time::Duration;

use tokio::{
    io::{AsyncBufReadExt as _, AsyncReadExt as _, AsyncWriteExt as _, BufReader},
    net::{UnixListener, UnixStream},
    sync::{mpsc, oneshot},
};

use super::read::top_of;
use crate::{
    error::{Error, Result},
    host::slots::{AcceptBackoff, Slot, Slots},
    protocol::{
        MAX_LIST_REQUEST, MAX_REQUEST, Request, Response,
        answer::{Answer, Drops, FleetRules, FleetTop, Top},
    },
};

/// A request and where its answer goes.
pub type Job = (Request, oneshot::Sender<Result<Answer>>);

/// Control connections open at once; past it, the oldest idle one is closed
/// to make room (see [`crate::host::slots`]).
pub const MAX_CONNECTIONS: usize = 256;
/// A request line must arrive within this time.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(2);
/// A request longer than [`MAX_REQUEST`] (a list) must arrive within this time.
pub const LIST_TIMEOUT: Duration = Duration::from_secs(60);
/// How long `top` watches the drop counters: its rates are over this span,
/// ending at the request.
pub const TOP_WINDOW: Duration = Duration::from_secs(1);

/// Serves `listener` until the task is dropped.
pub async fn serve(listener: UnixListener, jobs: mpsc::Sender<Job>) {
    let slots = Slots::new(MAX_CONNECTIONS);
    // One long request (a list) is read at a time: memory stays bounded.
    let long = std::sync::Arc::new(tokio::sync::Semaphore::new(1));
    let mut backoff = AcceptBackoff::default();
    loop {
        match listener.accept().await {
            Ok((stream, _)) => {
                backoff.accepted();
                let jobs = jobs.clone();
                let long = long.clone();
                // Full: every connection is busy; this one is dropped (closed).
                let _ = slots.spawn(move |slot| async move {
                    connection(stream, slot, &jobs, &long).await;
                });
            }
            Err(e) => {
                backoff
                    .failed(
                        "control socket: accepting a connection failed; backing off",
                        &e,
                    )
                    .await
            }
        }
    }
}

async fn connection(
    stream: UnixStream,
    slot: Slot,
    jobs: &mpsc::Sender<Job>,
    long: &tokio::sync::Semaphore,
) {
    let (read, mut write) = stream.into_split();
    let mut line = Vec::new();
    let mut reader = BufReader::new(read).take(MAX_REQUEST as u64 + 1);
    let reading = reader.read_until(b'\n', &mut line);
    let mut read = tokio::time::timeout(REQUEST_TIMEOUT, reading).await;
    slot.busy();
    let mut _permit = None;
    // Only a list (the CLI writes its tag first) may be longer: anything else
    // is refused once MAX_REQUEST bytes came without a newline.
    let list = line.starts_with(br#"{"cmd":"load-list""#);
    if matches!(read, Ok(Ok(_))) && list && line.len() > MAX_REQUEST && line.last() != Some(&b'\n')
    {
        // A list: the rest of the line, one such connection at a time.
        _permit = long.acquire().await.ok();
        reader.set_limit((MAX_LIST_REQUEST + 1 - line.len()) as u64);
        let rest = reader.read_until(b'\n', &mut line);
        read = tokio::time::timeout(LIST_TIMEOUT, rest).await;
    }
    let response = match read {
        // Idle, closed or broken: nothing to answer.
        Err(_) | Ok(Err(_)) | Ok(Ok(0)) => return,
        Ok(Ok(_)) if line.len() > MAX_LIST_REQUEST => {
            Response::refused(format!("request longer than {MAX_LIST_REQUEST} bytes"))
        }
        Ok(Ok(_)) if !list && line.len() > MAX_REQUEST => {
            Response::refused(format!("request longer than {MAX_REQUEST} bytes"))
        }
        Ok(Ok(_)) => match serde_json::from_slice::<Request>(&line) {
            Ok(r) if line.len() > MAX_REQUEST && !matches!(r, Request::LoadList { .. }) => {
                Response::refused(format!("request longer than {MAX_REQUEST} bytes"))
            }
            Err(e) => Response::refused(format!("bad request: {e}")),
            Ok(Request::Top { n }) => Response::of(&top(n, jobs).await.map(Answer::from)),
            Ok(Request::FleetTop { n }) => {
                Response::of(&fleet_top(n, jobs).await.map(Answer::from))
            }
            Ok(request) => Response::of(&ask(jobs, request).await),
        },
    };
    let mut out = serde_json::to_vec(&response).expect("responses serialize");
    out.push(b'\n');
    let _ = tokio::time::timeout(REQUEST_TIMEOUT, write.write_all(&out)).await;
}

async fn ask(jobs: &mpsc::Sender<Job>, request: Request) -> Result<Answer> {
    let stopping = || Error::Refused("the daemon is stopping".into());
    let (reply, answer) = oneshot::channel();
    if jobs.send((request, reply)).await.is_err() {
        return Err(stopping());
    }
    answer.await.unwrap_or_else(|_| Err(stopping()))
}

/// Asks the loop for `request`, whose answer is an `A`.
async fn ask_for<A: TryFrom<Answer, Error = Answer>>(
    jobs: &mpsc::Sender<Job>,
    request: Request,
) -> Result<A> {
    A::try_from(ask(jobs, request).await?)
        .map_err(|other| Error::Refused(format!("the daemon's loop answered {other:?}")))
}

/// The fleet's use of the fleet-wide rules' keys, read from Redis here (the
/// daemon's loop never waits on Redis).
async fn fleet_top(n: usize, jobs: &mpsc::Sender<Job>) -> Result<FleetTop> {
    let FleetRules { redis, rules } = ask_for(jobs, Request::FleetRules).await?;
    let rules = crate::fleet::top(&redis, &rules, n)
        .await
        .map_err(Error::Refused)?;
    Ok(FleetTop { redis, rules })
}

/// The sources with the most drops: two readings of the drop counters a little
/// apart, ranked by the drop rate between them (then by total).
async fn top(n: usize, jobs: &mpsc::Sender<Job>) -> Result<Top> {
    let first: Drops = ask_for(jobs, Request::Drops).await?;
    tokio::time::sleep(TOP_WINDOW).await;
    let second: Drops = ask_for(jobs, Request::Drops).await?;
    Ok(top_of(&first, second, TOP_WINDOW, n))
}
