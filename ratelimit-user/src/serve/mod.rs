//! `ratelimit serve`: a throttling service over HTTP and JSON (clients acquire
//! units for a key and refund what they did not use), for
//! programs not written in Rust. Stateless: every decision is one atomic script
//! in Redis ([`ratelimit_redis`]), so any number of replicas behind any load
//! balancer share every limit.
//!
//! - `POST /v1/acquire {"key", "amount", "limit": {"rate", "burst", "algorithm"}}`
//!   → `{"allowed", "granted", "retry_after_ms", "remaining"}`
//! - `POST /v1/refill {"key", "amount", "limit"?}` → `{"refunded", "remaining"}`
//! - `GET /metrics` (OpenMetrics), `GET /healthz` (200 while decisions succeed)
//!
//! A bad request is answered 400 with `{"error", "field"}`, a body past the
//! limit 413 alike; a Redis failure 503 with `{"error"}` naming the cause, and
//! a 503 took nothing (the caller decides whether to fail open or closed).
//!
//! What enters: the options ([`Options`], validated from the command line).
//! [`conn`] accepts and bounds the connections (a cap, header, idle and body
//! timeouts, a 503 when every connection is busy); [`api`] answers each
//! request. Called by the CLI's `serve` command.

mod api;
mod conn;

use std::{net::SocketAddr, sync::Arc, time::Duration};

pub use api::{MAX_KEY, limit_of};
pub use conn::{Limits, MAX_HEAD};
use ratelimit_redis::Store;

use crate::error::{Error, Result};

/// The port `--listen` defaults to (on 127.0.0.1).
pub const DEFAULT_PORT: u16 = 9478;
/// `--max-connections` when not given (lowered to what the open-file limit
/// allows: see [`RESERVED_FDS`]).
pub const DEFAULT_MAX_CONNECTIONS: usize = 1024;
/// `--header-timeout` when not given: headers come at once from a program.
pub const DEFAULT_HEADER_TIMEOUT: &str = "5s";
/// `--idle-timeout` when not given: long enough for a client's pool to reuse
/// its connections; under pressure idle ones are closed for room anyway.
pub const DEFAULT_IDLE_TIMEOUT: &str = "30s";
/// `--body-timeout` when not given: a body of 16 KiB takes milliseconds.
pub const DEFAULT_BODY_TIMEOUT: &str = "10s";
/// `--max-body` when not given: a request names a key and a limit.
pub const DEFAULT_MAX_BODY: &str = "16KiB";
/// The largest `--max-body`, bytes: a request names a key and a limit.
pub const MAX_MAX_BODY: usize = 1 << 20;
/// The longest timeout accepted.
pub const MAX_TIMEOUT: Duration = Duration::from_secs(3600);
/// File descriptors kept from the open-file limit for what is not a client
/// connection: the listener, Redis connections (one per Cluster node), the
/// runtime's own, the connections answered 503 ([`conn::OVERFLOW`]) and those
/// closed for room that are still closing ([`conn::CLOSING`]). The
/// connection cap is at most the limit minus these, so that accepting never
/// runs out of descriptors.
pub const RESERVED_FDS: u64 = 96;

/// The validated options of `ratelimit serve`.
#[derive(Clone, Debug)]
pub struct Options {
    /// Where to listen.
    pub listen: SocketAddr,
    /// The Redis URL.
    pub redis: String,
    /// Prefix of the Redis keys.
    pub prefix: String,
    /// `--max-connections`, if given.
    pub max_connections: Option<usize>,
    /// How long a request's headers may take to arrive.
    pub header_timeout: Duration,
    /// How long a keep-alive connection may wait for its next request.
    pub idle_timeout: Duration,
    /// How long a request's body may take to arrive, from its headers.
    pub body_timeout: Duration,
    /// Largest request body, bytes.
    pub max_body: usize,
}

/// "5 s", "250 ms": a duration as the messages and logs say it.
pub fn human(d: Duration) -> String {
    if d.subsec_nanos() == 0 {
        format!("{} s", d.as_secs())
    } else if d.as_nanos().is_multiple_of(1_000_000) {
        format!("{} ms", d.as_millis())
    } else {
        format!("{d:?}")
    }
}

/// The connection cap: `asked` (or the default), at most what `nofile` open
/// files leave after [`RESERVED_FDS`]. Returns the cap, and whether `asked`
/// was lowered to it.
pub fn connection_cap(asked: Option<usize>, nofile: u64) -> Result<(usize, bool)> {
    let room = usize::try_from(nofile.saturating_sub(RESERVED_FDS)).unwrap_or(usize::MAX);
    if room == 0 {
        return Err(Error::invalid(
            "--max-connections",
            format!(
                "the open-file limit ({nofile}) leaves no room for connections (the service keeps {RESERVED_FDS}); raise it with `ulimit -n` or LimitNOFILE="
            ),
        ));
    }
    Ok(match asked {
        Some(n) if n > room => (room, true),
        Some(n) => (n, false),
        None => (DEFAULT_MAX_CONNECTIONS.min(room), false),
    })
}

/// Runs the service until `shutdown` completes; requests in flight then have
/// a few seconds to finish.
pub async fn serve(opts: Options, shutdown: impl Future<Output = ()>) -> Result<()> {
    let nofile = crate::host::slots::raise_nofile();
    let (max_connections, lowered) = connection_cap(opts.max_connections, nofile)?;
    if lowered {
        tracing::warn!(
            asked = opts.max_connections,
            serving = max_connections,
            open_file_limit = nofile,
            "--max-connections is more than the open-file limit allows; raise the limit (ulimit -n, LimitNOFILE=) to serve more"
        );
    }
    let store = Store::connect(&opts.redis)
        .await
        .map_err(|e| Error::invalid("--redis", e.to_string()))?;
    let listener = tokio::net::TcpListener::bind(opts.listen)
        .await
        .map_err(|e| {
            Error::invalid("--listen", format!("cannot listen on {}: {e}", opts.listen))
        })?;
    let app = Arc::new(api::App {
        store,
        prefix: opts.prefix.clone(),
        metrics: api::Metrics::new(),
        max_body: opts.max_body,
        body_timeout: opts.body_timeout,
    });
    if let Err(e) = api::check(&app).await {
        tracing::warn!(error = %e, "redis does not take decisions yet; requests get 503 until it does");
    }
    let limits = Limits {
        max_connections,
        header_timeout: opts.header_timeout,
        idle_timeout: opts.idle_timeout,
    };
    tracing::info!(
        addr = %opts.listen,
        redis = %opts.redis,
        prefix = %opts.prefix,
        max_connections,
        header_timeout = %human(opts.header_timeout),
        idle_timeout = %human(opts.idle_timeout),
        body_timeout = %human(opts.body_timeout),
        max_body = opts.max_body,
        "serving /v1/acquire and /v1/refill"
    );
    let metrics = app.metrics.conn.clone();
    conn::run(
        listener,
        api::router(app),
        api::overloaded,
        limits,
        metrics,
        shutdown,
    )
    .await;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cap_leaves_room_for_the_service_own_descriptors() {
        assert_eq!(connection_cap(None, 65_536).unwrap(), (1024, false));
        assert_eq!(connection_cap(None, 1024).unwrap(), (928, false));
        assert_eq!(connection_cap(Some(5000), 1024).unwrap(), (928, true));
        assert_eq!(connection_cap(Some(10), 1024).unwrap(), (10, false));
        match connection_cap(None, 64) {
            Err(Error::Invalid { field, message }) => {
                assert_eq!(field, "--max-connections");
                assert!(message.contains("ulimit -n"), "{message}");
            }
            other => panic!("a limit of 64 open files: {other:?}"),
        }
    }

    #[test]
    fn durations_read_as_written() {
        assert_eq!(human(Duration::from_secs(5)), "5 s");
        assert_eq!(human(Duration::from_millis(1500)), "1500 ms");
    }
}
