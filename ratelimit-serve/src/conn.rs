//! The service's connections, on both listeners: accepted, bounded, and
//! handed to hyper (HTTP/1.1 for the HTTP API, HTTP/2 for gRPC), which calls
//! the listener's router for each request.
//!
//! What a flood of idle or slow clients can cost is bounded, the same on
//! both listeners, and the cap is one for both (the open-file limit is):
//! - at most [`Limits::max_connections`] are open ([`ratelimit_host::slots`]); past
//!   it, the one idle longest (it has no request in flight: it has not sent
//!   one, or waits between two) is closed for the newcomer, whichever
//!   listener either came by; when every one is busy with a request, an HTTP
//!   newcomer is answered 503 at once (at most [`OVERFLOW`] such answers at a
//!   time; past that it is closed unanswered) and a gRPC one is closed.
//!   Either is logged once per [`LOG_EVERY`](ratelimit_host::logs::LOG_EVERY),
//!   with the count since;
//! - a connection's first request must arrive within
//!   [`Limits::header_timeout`] of its opening (HTTP/1.1: a later request's
//!   headers within it from their first byte, and be at most [`MAX_HEAD`]
//!   bytes; HTTP/2: its header list at most as much, and at most
//!   [`MAX_STREAMS`] requests at once); a connection with no request in
//!   flight waits at most [`Limits::idle_timeout`] for its next; the body's
//!   own timeout and limit are the handlers' (see [`super::api`] and
//!   [`super::grpc`]);
//! - on shutdown, requests in flight have [`SHUTDOWN_GRACE`] to finish.
//!
//! With TLS, the handshake must end within the header timeout.

use std::{
    convert::Infallible,
    io,
    pin::Pin,
    sync::{Arc, Mutex, PoisonError},
    task::{Context, Poll},
    time::Duration,
};

use axum::Router;
use hyper_util::{
    rt::{TokioExecutor, TokioIo, TokioTimer},
    server::graceful::{GracefulShutdown, Watcher},
    service::TowerToHyperService,
};
use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{counter::Counter, family::Family, gauge::Gauge},
    registry::Registry,
};
use tokio::{
    io::{AsyncRead, AsyncWrite, ReadBuf},
    net::{TcpListener, TcpStream},
    sync::{Notify, Semaphore},
    time::Instant,
};
use tokio_rustls::TlsAcceptor;

use ratelimit_host::{
    logs::QuietLog,
    slots::{AcceptBackoff, Admission, Slot, Slots},
};

/// The largest request head (request line and headers), bytes; hyper
/// answers 431 past it. Also what a connection buffers of its input.
pub const MAX_HEAD: usize = 16 * 1024;
/// Requests in flight at once on one HTTP/2 (gRPC) connection: a client
/// that wants more opens another connection (Envoy's pool does).
pub(super) const MAX_STREAMS: u32 = 64;
/// What an HTTP/2 connection buffers of its requests' bodies before they
/// are read, bytes: a stream's window fits the largest request
/// ([`super::grpc::MAX_MESSAGE`] and its frame), the connection's two.
const STREAM_WINDOW: u32 = super::grpc::MAX_MESSAGE as u32 + 1024;
const CONNECTION_WINDOW: u32 = 2 * STREAM_WINDOW;
/// Connections answered 503 at once when every connection is busy.
pub(super) const OVERFLOW: usize = 32;
/// How long such a connection may take to send its request's headers.
pub(super) const OVERFLOW_WAIT: Duration = Duration::from_secs(1);
/// Sockets of connections closed for room, not let go yet, that may be held
/// beside the cap before accepting waits.
pub(super) const CLOSING: usize = 16;
/// How long a stopping service lets requests in flight finish.
pub(super) const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

/// The bounds of the connections.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// Connections open at once.
    pub max_connections: usize,
    /// How long a request's headers may take to arrive.
    pub header_timeout: Duration,
    /// How long a keep-alive connection may wait for its next request.
    pub idle_timeout: Duration,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct How {
    how: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Phase {
    phase: &'static str,
}

/// The connections' metrics.
#[derive(Clone)]
pub(super) struct ConnMetrics {
    open: Gauge,
    shed: Family<How, Counter>,
    timeouts: Family<Phase, Counter>,
}

impl ConnMetrics {
    /// Registers them in `registry`.
    pub(super) fn new(registry: &mut Registry) -> Self {
        let open = Gauge::default();
        registry.register(
            "ratelimit_serve_connections",
            "Client connections open",
            open.clone(),
        );
        let shed = Family::<How, Counter>::default();
        registry.register(
            "ratelimit_serve_connections_shed",
            "Connections shed at the cap: closed_idle (the one idle longest, closed for a newcomer), refused (a newcomer answered 503 or closed: every connection was busy)",
            shed.clone(),
        );
        let timeouts = Family::<Phase, Counter>::default();
        registry.register(
            "ratelimit_serve_timeouts",
            "Connections closed by a timeout: header (headers too slow), idle (no next request), body (body too slow, answered 408)",
            timeouts.clone(),
        );
        Self {
            open,
            shed,
            timeouts,
        }
    }

    /// A connection was closed by the timeout of `phase`.
    pub(super) fn timed_out(&self, phase: &'static str) {
        self.timeouts.get_or_create(&Phase { phase }).inc();
    }

    fn shed(&self, how: &'static str) {
        self.shed.get_or_create(&How { how }).inc();
    }
}

/// The answer to a request on a connection that found every slot busy (with
/// the cap): the router's, so that it is worded like its other errors.
pub(super) type Overload = fn(usize) -> axum::response::Response;

/// What a listener speaks.
#[derive(Clone, Copy)]
pub(super) enum Protocol {
    /// HTTP/1.1 (the HTTP API); a connection that finds every slot busy is
    /// answered this.
    Http1(Overload),
    /// HTTP/2 (gRPC); a connection that finds every slot busy is closed.
    Http2,
}

/// One listener: its socket, what it speaks, its router and its TLS.
pub(super) struct Listener {
    /// The bound socket.
    pub tcp: TcpListener,
    /// Its protocol.
    pub protocol: Protocol,
    /// Called for each request.
    pub router: Router,
    /// TLS, when the service has it.
    pub tls: Option<TlsAcceptor>,
}

/// The cap both listeners share: one set of slots for all the service's
/// connections, and its log lines (each once per
/// [`LOG_EVERY`](ratelimit_host::logs::LOG_EVERY) whichever listener hit it).
#[derive(Clone)]
pub(super) struct Cap {
    slots: Slots,
    made_room: Arc<Mutex<QuietLog>>,
    refused: Arc<Mutex<QuietLog>>,
}

impl Cap {
    /// The cap of `limits`.
    pub(super) fn new(limits: Limits) -> Self {
        Self {
            slots: Slots::new(limits.max_connections),
            made_room: Arc::default(),
            refused: Arc::default(),
        }
    }
}

fn warn(log: &Mutex<QuietLog>, what: &str, error: &dyn std::fmt::Display) {
    log.lock()
        .unwrap_or_else(PoisonError::into_inner)
        .warn(what, error);
}

/// Accepts connections on `listener` until `shutdown`, each in one of
/// `cap`'s slots (shared with the other listener), then lets requests in flight
/// finish (for at most [`SHUTDOWN_GRACE`]).
pub(super) async fn run(
    listener: Listener,
    cap: Cap,
    limits: Limits,
    metrics: ConnMetrics,
    shutdown: impl Future<Output = ()>,
) {
    let Listener {
        tcp: listener,
        protocol,
        router,
        tls,
    } = listener;
    let overflow = Arc::new(Semaphore::new(OVERFLOW));
    let graceful = GracefulShutdown::new();
    let mut backoff = AcceptBackoff::default();
    let Cap {
        slots,
        made_room,
        refused,
    } = cap;
    tokio::pin!(shutdown);
    loop {
        // Sockets of connections closed for room are let go a moment later:
        // no accept until they are, so that the descriptors suffice.
        tokio::select! {
            () = &mut shutdown => break,
            () = slots.room(limits.max_connections + CLOSING) => {}
        }
        let stream = tokio::select! {
            () = &mut shutdown => break,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(e) => {
                    backoff
                        .failed("serve: accepting a connection failed; backing off", &e)
                        .await;
                    continue;
                }
            },
        };
        backoff.accepted();
        let _ = stream.set_nodelay(true);
        let (router, metrics2, watcher) = (router.clone(), metrics.clone(), graceful.watcher());
        let tls2 = tls.clone();
        let admission = slots.spawn_with(stream, move |slot, stream| {
            connection(
                stream, slot, protocol, router, limits, metrics2, watcher, tls2,
            )
        });
        match admission {
            Admission::Admitted => {}
            Admission::MadeRoom => {
                metrics.shed("closed_idle");
                warn(
                    &made_room,
                    "serve: connection cap reached; closing the connection idle longest for each new one",
                    &format_args!(
                        "{} connections open (--max-connections)",
                        limits.max_connections
                    ),
                );
            }
            Admission::Full(stream) => {
                metrics.shed("refused");
                warn(
                    &refused,
                    "serve: overloaded: every connection is busy with a request; new ones are answered 503",
                    &format_args!(
                        "{} connections busy (--max-connections)",
                        limits.max_connections
                    ),
                );
                // Answered 503 if few are being answered so, else closed.
                let Protocol::Http1(overload) = protocol else {
                    continue;
                };
                if let Ok(permit) = overflow.clone().try_acquire_owned() {
                    let cap = limits.max_connections;
                    let tls = tls.clone();
                    tokio::spawn(async move {
                        let _permit = permit;
                        match tls {
                            None => overloaded(stream, cap, overload).await,
                            Some(tls) => {
                                if let Ok(Ok(s)) =
                                    tokio::time::timeout(OVERFLOW_WAIT, tls.accept(stream)).await
                                {
                                    overloaded(s, cap, overload).await;
                                }
                            }
                        }
                    });
                }
            }
        }
    }
    drop(listener);
    let _ = tokio::time::timeout(SHUTDOWN_GRACE, graceful.shutdown()).await;
}

/// Serves one connection until it closes or a timeout closes it.
#[allow(clippy::too_many_arguments)]
async fn connection(
    stream: TcpStream,
    slot: Slot,
    protocol: Protocol,
    router: Router,
    limits: Limits,
    metrics: ConnMetrics,
    watcher: Watcher,
    tls: Option<TlsAcceptor>,
) {
    metrics.open.inc();
    let _open = Decrement(metrics.open.clone());
    let Some(tls) = tls else {
        return serve_on(stream, slot, protocol, router, limits, metrics, watcher).await;
    };
    match tokio::time::timeout(limits.header_timeout, tls.accept(stream)).await {
        Ok(Ok(stream)) => {
            serve_on(stream, slot, protocol, router, limits, metrics, watcher).await;
        }
        // A handshake that failed: the client was told by TLS.
        Ok(Err(_)) => {}
        Err(_) => metrics.timed_out("header"),
    }
}

/// Serves the listener's protocol on `stream` until it closes or a timeout
/// closes it.
async fn serve_on<S>(
    stream: S,
    slot: Slot,
    protocol: Protocol,
    router: Router,
    limits: Limits,
    metrics: ConnMetrics,
    watcher: Watcher,
) where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let activity = Arc::new(Activity::new());
    let slot = Arc::new(slot);
    let service = {
        let activity = activity.clone();
        tower::service_fn(move |req| {
            let flight = InFlight::start(activity.clone(), slot.clone());
            let mut router = router.clone();
            async move {
                let response = tower::Service::call(&mut router, req).await;
                drop(flight);
                response
            }
        })
    };
    match protocol {
        Protocol::Http1(_) => {
            let io = TokioIo::new(Watched {
                stream,
                activity: activity.clone(),
            });
            let conn = hyper::server::conn::http1::Builder::new()
                // The header and idle timeouts are the watchdog's: hyper's
                // header timer would also run between requests.
                .header_read_timeout(None)
                .max_buf_size(MAX_HEAD)
                .serve_connection(io, TowerToHyperService::new(service));
            tokio::select! {
                _ = watcher.watch(conn) => {}
                phase = activity.watchdog(limits) => metrics.timed_out(phase),
            }
        }
        Protocol::Http2 => {
            // Not watched byte by byte: a ping or a window update is not a
            // request, and the header timeout runs until the first request
            // (its whole header list) is in.
            let conn = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                .timer(TokioTimer::new())
                .max_header_list_size(MAX_HEAD as u32)
                .max_concurrent_streams(MAX_STREAMS)
                .initial_stream_window_size(STREAM_WINDOW)
                .initial_connection_window_size(CONNECTION_WINDOW)
                .serve_connection(TokioIo::new(stream), TowerToHyperService::new(service));
            tokio::select! {
                _ = watcher.watch(conn) => {}
                phase = activity.watchdog(limits) => metrics.timed_out(phase),
            }
        }
    }
}

/// A request in flight on a connection: its connection is busy (neither
/// idle nor closed for room) until every request in flight is answered or
/// dropped (an HTTP/2 client may reset a stream).
struct InFlight {
    activity: Arc<Activity>,
    slot: Arc<Slot>,
}

impl InFlight {
    fn start(activity: Arc<Activity>, slot: Arc<Slot>) -> Self {
        slot.busy();
        activity.request();
        Self { activity, slot }
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        if self.activity.answered() == 0 {
            self.slot.idle();
        }
    }
}

/// Answers a connection that found every slot busy: 503, then closed.
async fn overloaded<S>(stream: S, cap: usize, answer: Overload)
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let service =
        hyper::service::service_fn(move |_req| async move { Ok::<_, Infallible>(answer(cap)) });
    let conn = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(OVERFLOW_WAIT)
        .max_buf_size(MAX_HEAD)
        .keep_alive(false)
        .serve_connection(TokioIo::new(stream), service);
    let _ = tokio::time::timeout(OVERFLOW_WAIT * 2, conn).await;
}

struct Decrement(Gauge);

impl Drop for Decrement {
    fn drop(&mut self) {
        self.0.dec();
    }
}

/// Where a connection is, for its timeouts.
struct State {
    /// Requests whose headers are in and whose answers are not made yet.
    in_flight: u32,
    /// Requests answered.
    answered: u64,
    /// Since when it waits for a request (its opening, or the last answer).
    waiting_since: Instant,
    /// The first byte read since then.
    first_byte: Option<Instant>,
}

/// A connection's activity, told by its reads and its service; watched by
/// [`Activity::watchdog`].
struct Activity {
    state: Mutex<State>,
    changed: Notify,
}

impl Activity {
    fn new() -> Self {
        Self {
            state: Mutex::new(State {
                in_flight: 0,
                answered: 0,
                waiting_since: Instant::now(),
                first_byte: None,
            }),
            changed: Notify::new(),
        }
    }

    fn with<T>(&self, f: impl FnOnce(&mut State) -> T) -> T {
        f(&mut self.state.lock().unwrap_or_else(PoisonError::into_inner))
    }

    /// Bytes came in.
    fn read(&self) {
        let first = self.with(|s| {
            let first = s.in_flight == 0 && s.first_byte.is_none();
            if first {
                s.first_byte = Some(Instant::now());
            }
            first
        });
        if first {
            self.changed.notify_one();
        }
    }

    /// A request's headers are in.
    fn request(&self) {
        self.with(|s| {
            s.in_flight += 1;
            s.first_byte = None;
        });
        self.changed.notify_one();
    }

    /// A request's answer is made (or the request was dropped): the
    /// requests still in flight.
    fn answered(&self) -> u32 {
        let left = self.with(|s| {
            s.in_flight = s.in_flight.saturating_sub(1);
            s.answered += 1;
            if s.in_flight == 0 {
                s.waiting_since = Instant::now();
                s.first_byte = None;
            }
            s.in_flight
        });
        self.changed.notify_one();
        left
    }

    /// Completes when the connection is past a timeout, naming which.
    async fn watchdog(&self, limits: Limits) -> &'static str {
        loop {
            // Made before the state is read: a change after it is not missed.
            let changed = self.changed.notified();
            let due = self.with(|s| {
                if s.in_flight > 0 {
                    None
                } else if let Some(first) = s.first_byte {
                    Some((first + limits.header_timeout, "header"))
                } else if s.answered == 0 {
                    Some((s.waiting_since + limits.header_timeout, "header"))
                } else {
                    Some((s.waiting_since + limits.idle_timeout, "idle"))
                }
            });
            match due {
                None => changed.await,
                Some((at, phase)) => {
                    if Instant::now() >= at {
                        return phase;
                    }
                    tokio::select! {
                        () = tokio::time::sleep_until(at) => {}
                        () = changed => {}
                    }
                }
            }
        }
    }
}

/// A connection's stream that tells its [`Activity`] of what it reads.
struct Watched<S> {
    stream: S,
    activity: Arc<Activity>,
}

impl<S: AsyncRead + Unpin> AsyncRead for Watched<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let polled = Pin::new(&mut this.stream).poll_read(cx, buf);
        if matches!(polled, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            this.activity.read();
        }
        polled
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Watched<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().stream).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMITS: Limits = Limits {
        max_connections: 1,
        header_timeout: Duration::from_secs(5),
        idle_timeout: Duration::from_secs(30),
    };

    #[tokio::test(start_paused = true)]
    async fn each_phase_has_its_timeout() {
        // Silent from the start: the header timeout.
        let a = Activity::new();
        let start = tokio::time::Instant::now();
        assert_eq!(a.watchdog(LIMITS).await, "header");
        assert_eq!(start.elapsed(), Duration::from_secs(5));

        // Answered, then silent: the idle timeout, from the answer.
        let a = Arc::new(Activity::new());
        a.request();
        tokio::time::sleep(Duration::from_secs(60)).await;
        let start = tokio::time::Instant::now();
        let watch = tokio::spawn({
            let a = a.clone();
            async move { a.watchdog(LIMITS).await }
        });
        tokio::time::sleep(Duration::from_secs(2)).await;
        a.answered();
        assert_eq!(watch.await.unwrap(), "idle");
        assert_eq!(start.elapsed(), Duration::from_secs(32));

        // Idle for 20 s, then a byte of a request: its headers have the
        // header timeout from that byte.
        let a = Arc::new(Activity::new());
        a.request();
        a.answered();
        let start = tokio::time::Instant::now();
        let watch = tokio::spawn({
            let a = a.clone();
            async move { a.watchdog(LIMITS).await }
        });
        tokio::time::sleep(Duration::from_secs(20)).await;
        a.read();
        assert_eq!(watch.await.unwrap(), "header");
        assert_eq!(start.elapsed(), Duration::from_secs(25));
    }

    #[tokio::test(start_paused = true)]
    async fn a_connection_with_any_request_in_flight_is_not_idle() {
        // HTTP/2: two requests at once; the first answered, the second not
        // yet: no timeout runs.
        let a = Arc::new(Activity::new());
        a.request();
        a.request();
        assert_eq!(a.answered(), 1);
        let watch = tokio::spawn({
            let a = a.clone();
            async move { a.watchdog(LIMITS).await }
        });
        tokio::time::sleep(Duration::from_secs(120)).await;
        assert!(!watch.is_finished(), "timed out with a request in flight");
        // The second answered: idle from then.
        let start = tokio::time::Instant::now();
        assert_eq!(a.answered(), 0);
        assert_eq!(watch.await.unwrap(), "idle");
        assert_eq!(start.elapsed(), Duration::from_secs(30));
    }

    #[tokio::test]
    async fn a_dropped_request_leaves_its_connection_idle() {
        // A stream reset by its client drops the request's future: its
        // connection must not stay busy (never idle, never closed for room).
        let slots = Slots::new(1);
        let (tx, rx) = tokio::sync::oneshot::channel();
        let activity = Arc::new(Activity::new());
        let _ = slots.spawn({
            let activity = activity.clone();
            move |slot| async move {
                let slot = Arc::new(slot);
                let flight = InFlight::start(activity, slot.clone());
                drop(flight);
                let _ = tx.send(());
                std::future::pending::<()>().await;
            }
        });
        rx.await.unwrap();
        assert_eq!(activity.with(|s| s.in_flight), 0);
        // Its slot is idle: a newcomer makes room.
        assert!(matches!(slots.spawn(|_| async {}), Admission::MadeRoom));
    }
}
