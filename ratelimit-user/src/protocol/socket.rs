//! The CLI's side of the control socket: which daemons run in this network
//! namespace, and one request to one of them, whose answer is read into the
//! request's answer type. Only root talks to a daemon, and only to a socket
//! root owns with root at the other end.

use std::{
    os::{fd::AsRawFd as _, unix::fs::MetadataExt as _},
    path::{Path, PathBuf},
    time::Duration,
};

use serde::de::DeserializeOwned;
use tokio::{
    io::{AsyncBufReadExt, AsyncReadExt as _, AsyncWriteExt, BufReader},
    net::UnixStream,
};

use super::{MAX_LIST_REQUEST, Request, Response, socket_path};
use crate::{
    error::{Error, Result},
    host::identity::Identity,
    host::rundir,
};

fn is_root() -> bool {
    // SAFETY: no preconditions.
    unsafe { libc::geteuid() == 0 }
}

fn not_root() -> Error {
    Error::Permission(
        "the daemons' control sockets are root's; run the command as root (for example with sudo)"
            .into(),
    )
}

/// The interfaces of the daemons running in the calling thread's network
/// namespace. A socket nobody answers on (its daemon was killed) is removed.
pub fn daemons_here() -> Result<Vec<String>> {
    if !is_root() {
        return Err(not_root());
    }
    let here = Identity::here("")?;
    let dir = rundir::netns_dir(&here);
    let mut found = Vec::new();
    let Ok(entries) = std::fs::read_dir(&dir) else {
        return Ok(found);
    };
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let Some(iface) = name.strip_suffix(".sock") else {
            continue;
        };
        let path = e.path();
        match std::os::unix::net::UnixStream::connect(&path) {
            Ok(_) => found.push(iface.to_string()),
            Err(err) if err.kind() == std::io::ErrorKind::ConnectionRefused => {
                // Nobody listens: a daemon killed before it could clean up.
                if owned_by_root(&path) {
                    rundir::remove(&path);
                }
            }
            Err(_) => {}
        }
    }
    found.sort();
    Ok(found)
}

fn owned_by_root(path: &Path) -> bool {
    std::fs::symlink_metadata(path)
        .map(|m| m.uid() == 0 && !m.file_type().is_symlink())
        .unwrap_or(false)
}

/// The interface of the only daemon of this network namespace, for commands
/// without `--iface`.
pub fn only_daemon() -> Result<String> {
    let mut found = daemons_here()?;
    let here = Identity::here("")?;
    match found.len() {
        0 => Err(Error::NoDaemonHere {
            dir: rundir::netns_dir(&here),
        }),
        1 => Ok(found.remove(0)),
        _ => Err(Error::invalid(
            "--iface",
            format!(
                "daemons run on {} in this network namespace: say which with --iface",
                found.join(", ")
            ),
        )),
    }
}

/// A connection to a daemon, not yet asked anything.
pub struct Connection {
    stream: UnixStream,
    path: PathBuf,
}

/// Sends one request to the daemon on `iface` (in this network namespace) and
/// returns its answer, or its error.
pub async fn call<A: DeserializeOwned>(iface: &str, request: &Request) -> Result<A> {
    connect(iface).await?.ask(request).await
}

/// Connects to the daemon on `iface` (in this network namespace): a change
/// finds out that no daemon runs before its input is parsed, as it always
/// has (the daemon's checks came after).
pub async fn connect(iface: &str) -> Result<Connection> {
    if !is_root() {
        return Err(not_root());
    }
    let id = Identity::here(iface)?;
    let path = socket_path(&id);
    // The interface's name alone: the message's hint is a command to run,
    // and the socket's path names the namespace.
    let no_daemon = || Error::NoDaemon {
        iface: id.iface.clone(),
        socket: path.clone(),
    };
    // The socket must be root's, in a directory root owns: anybody else's
    // listener would be answering in the daemon's name.
    let meta = std::fs::symlink_metadata(&path).map_err(|_| no_daemon())?;
    if meta.file_type().is_symlink() || meta.uid() != 0 {
        return Err(Error::Refused(format!(
            "{} is not root's socket (uid {}): not talking to it; remove it and restart the daemon",
            path.display(),
            meta.uid()
        )));
    }
    rundir::secure(&id)?;
    let stream = UnixStream::connect(&path).await.map_err(|_| no_daemon())?;
    let peer = peer_uid(&stream);
    if peer != Some(0) {
        return Err(Error::Refused(format!(
            "the process listening on {} is not root's (uid {peer:?}): not talking to it",
            path.display()
        )));
    }
    Ok(Connection { stream, path })
}

/// The uid of the process at the other end of `stream` (SO_PEERCRED).
fn peer_uid(stream: &UnixStream) -> Option<u32> {
    let mut cred = libc::ucred {
        pid: 0,
        uid: u32::MAX,
        gid: u32::MAX,
    };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: a valid socket fd and an out buffer of `len` bytes.
    let rc = unsafe {
        libc::getsockopt(
            stream.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut cred as *mut libc::ucred).cast(),
            &mut len,
        )
    };
    (rc == 0).then_some(cred.uid)
}

/// How long the CLI waits for an answer, unless `RATELIMIT_TIMEOUT` (whole
/// seconds, 1 or more) says otherwise.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(30);

fn answer_timeout() -> Result<Duration> {
    match std::env::var("RATELIMIT_TIMEOUT") {
        Err(_) => Ok(ANSWER_TIMEOUT),
        Ok(v) => v
            .trim()
            .parse::<u64>()
            .ok()
            .filter(|s| *s > 0)
            .map(Duration::from_secs)
            .ok_or_else(|| {
                Error::invalid(
                    "RATELIMIT_TIMEOUT",
                    format!("{v:?} is not a number of seconds: give a whole number of 1 or more, like 30"),
                )
            }),
    }
}

impl Connection {
    /// Sends `request` and reads its answer as `A`, the answer type of the
    /// request.
    pub async fn ask<A: DeserializeOwned>(self, request: &Request) -> Result<A> {
        let Connection { stream, path } = self;
        let path = path.as_path();
        let (read, mut write) = stream.into_split();
        let mut line = serde_json::to_string(request).expect("requests serialize");
        line.push('\n');
        if line.len() > MAX_LIST_REQUEST {
            // Said here, not as a broken pipe when the daemon stops reading.
            return Err(Error::invalid(
                "--from",
                format!(
                    "the list takes {} bytes as a request, more than the daemon reads ({MAX_LIST_REQUEST}): remove its comments, or split it into several lists",
                    line.len()
                ),
            ));
        }
        let timeout = answer_timeout()?;
        let ctx = || format!("talking to the daemon on {}", path.display());
        write
            .write_all(line.as_bytes())
            .await
            .map_err(Error::io(ctx()))?;
        let mut answer = String::new();
        let mut reader = BufReader::new(read).take(64 << 20);
        let read = reader.read_line(&mut answer);
        // Not a refusal: the daemon may have made the change and not yet
        // answered (a large list to write), or been killed after it.
        let outcome = if request.is_change() {
            "; the change may have been applied: `ratelimit list` shows what is enforced"
        } else {
            ""
        };
        match tokio::time::timeout(timeout, read).await {
            Ok(Ok(0)) => {
                return Err(Error::NoAnswer(format!(
                    "the daemon on {} closed the connection without answering{outcome}",
                    path.display()
                )));
            }
            Ok(r) => {
                r.map_err(Error::io(ctx()))?;
            }
            Err(_) => {
                return Err(Error::NoAnswer(format!(
                    "no answer from the daemon on {} within {} s{outcome}",
                    path.display(),
                    timeout.as_secs()
                )));
            }
        }
        let response: Response = serde_json::from_str(&answer).map_err(|e| {
            Error::Refused(format!("the daemon sent a bad answer ({e}): {answer:?}"))
        })?;
        response.into_answer()
    }
}
