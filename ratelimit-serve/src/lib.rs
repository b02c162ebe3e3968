//! `ratelimit-serve` (also started as `ratelimit serve`): a throttling
//! service over HTTP and JSON, and Envoy's rate limit service API over gRPC
//! (clients acquire units for a key and refill what they did not use, bound
//! to the grant their acquire got), for programs not written in Rust and for
//! Envoy. Stateless: every decision is
//! one atomic script in Redis ([`ratelimit_redis`]), so any number of
//! replicas behind any load balancer share every limit.
//!
//! Without `--config` the service is open (as it always was): any caller
//! names any key and the limit's numbers. With `--config FILE` the limits,
//! the tenants and their bearer tokens are the server's ([`config`],
//! [`policy`]): a caller names a limit, and touches only its tenant's keys.
//!
//! A program of its own, unprivileged (no capability, a user of its own: the
//! unit `ratelimit-serve.service`), with nothing of the packet limiter: what
//! it shares with the daemon is the `ratelimit-host` crate (reading files and
//! options, connection slots, logs). Its errors are its own ([`Error`]), each
//! with an exit code, an HTTP status and a gRPC code.
//!
//! What enters: the options ([`Options`], validated from the command line by
//! [`options`]). [`conn`] accepts and bounds the HTTP connections (a cap, header, idle and
//! body timeouts, a 503 when every connection is busy, TLS); [`api`]
//! answers each HTTP request, [`grpc`] each gRPC one; both read what a
//! request asks with [`request`] and [`auth`], and decide through
//! [`decide`] (batching, grants) and [`breaker`] (503 at once while a Redis
//! node is down), which blames Redis for a timeout only when [`lag`] saw the
//! service's own runtime on time. Called by the binary's `main`.

mod api;
mod auth;
mod breaker;
pub mod config;
mod conn;
mod decide;
pub mod error;
mod grpc;
mod lag;
mod lease;
mod metrics;
pub mod policy;
mod request;
mod tls;

use std::{net::SocketAddr, path::PathBuf, sync::Arc, time::Duration};

pub use conn::{Limits, MAX_HEAD};
use ratelimit_redis::Store;
pub use request::{MAX_KEY, limit_of};

pub use ratelimit_host::serve_args::{
    DEFAULT_BODY_TIMEOUT, DEFAULT_GRPC_PORT, DEFAULT_HEADER_TIMEOUT, DEFAULT_IDLE_TIMEOUT,
    DEFAULT_MAX_BODY, DEFAULT_PORT,
};
use ratelimit_host::{
    listen::listen_addr,
    rate::{parse_duration, parse_size},
    serve_args::ServeArgs,
};

pub use crate::error::{Error, Result};

/// `--max-connections` when not given (lowered to what the open-file limit
/// allows: see [`RESERVED_FDS`]).
pub const DEFAULT_MAX_CONNECTIONS: usize = 1024;
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
    /// The config file: limits, tenants, tokens (`None`: the open mode).
    pub config: Option<PathBuf>,
    /// Where to serve the gRPC API too, if anywhere.
    pub grpc_listen: Option<SocketAddr>,
    /// TLS for both listeners: the certificate chain and its key (PEM).
    pub tls: Option<(PathBuf, PathBuf)>,
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

/// The validated options of a command line: each flag's error names it and
/// its forms.
pub fn options(args: &ServeArgs) -> Result<Options> {
    let timeout = |flag: &str, s: &str| -> Result<Duration> {
        let d = Duration::from_nanos(parse_duration(flag, s)?);
        if d < Duration::from_millis(1) || d > MAX_TIMEOUT {
            return Err(Error::invalid(
                flag,
                format!("{s:?} is out of range; write 1ms to 1h, like 500ms, 5s or 2min"),
            ));
        }
        Ok(d)
    };
    let max_connections = match &args.max_connections {
        None => None,
        Some(s) => match s.trim().parse::<usize>() {
            Ok(n) if (1..=1_000_000).contains(&n) => Some(n),
            _ => {
                return Err(Error::invalid(
                    "--max-connections",
                    format!("{s:?} is not a number of connections from 1 to 1000000, like 1024"),
                ));
            }
        },
    };
    let max_body = parse_size("--max-body", &args.max_body)?;
    if max_body == 0 || max_body > MAX_MAX_BODY as u64 {
        return Err(Error::invalid(
            "--max-body",
            format!(
                "{:?} is out of range; write 1 byte to 1MiB, like 16KiB or 65536",
                args.max_body
            ),
        ));
    }
    Ok(Options {
        listen: listen_addr("--listen", &args.listen, DEFAULT_PORT)?,
        redis: args.redis.clone(),
        prefix: args.prefix.clone(),
        max_connections,
        header_timeout: timeout("--header-timeout", &args.header_timeout)?,
        idle_timeout: timeout("--idle-timeout", &args.idle_timeout)?,
        body_timeout: timeout("--body-timeout", &args.body_timeout)?,
        max_body: max_body as usize,
        config: args.config.clone(),
        grpc_listen: args
            .grpc_listen
            .as_deref()
            .map(|a| listen_addr("--grpc-listen", a, DEFAULT_GRPC_PORT))
            .transpose()?,
        tls: args.tls_cert.clone().zip(args.tls_key.clone()),
    })
}

/// Runs the service until `shutdown` completes; requests in flight then have
/// a few seconds to finish.
pub async fn serve(opts: Options, shutdown: impl Future<Output = ()>) -> Result<()> {
    let nofile = ratelimit_host::slots::raise_nofile();
    let (max_connections, lowered) = connection_cap(opts.max_connections, nofile)?;
    if lowered {
        tracing::warn!(
            asked = opts.max_connections,
            serving = max_connections,
            open_file_limit = nofile,
            "--max-connections is more than the open-file limit allows; raise the limit (ulimit -n, LimitNOFILE=) to serve more"
        );
    }
    let policy = opts
        .config
        .as_deref()
        .map(config::read)
        .transpose()
        .map_err(Error::Config)?;
    let tls = opts
        .tls
        .as_ref()
        .map(|(cert, key)| tls::read(cert, key))
        .transpose()?;
    let store = Store::connect(&opts.redis)
        .await
        .map_err(|e| Error::invalid("--redis", e.to_string()))?;
    let listener = tokio::net::TcpListener::bind(opts.listen)
        .await
        .map_err(|e| {
            Error::invalid("--listen", format!("cannot listen on {}: {e}", opts.listen))
        })?;
    let grpc_listener = match opts.grpc_listen {
        None => None,
        Some(addr) => Some(tokio::net::TcpListener::bind(addr).await.map_err(|e| {
            Error::invalid("--grpc-listen", format!("cannot listen on {addr}: {e}"))
        })?),
    };
    let metrics = Arc::new(metrics::Metrics::new());
    let node = if store.is_cluster() {
        "cluster"
    } else {
        "redis"
    };
    let breakers = breaker::Breakers::new(store.clone(), &opts.prefix, node, metrics.clone());
    breakers.refresh().await;
    let lag = lag::Lag::new();
    lag.watch();
    let app = Arc::new(api::App {
        decider: Arc::new(decide::Decider::new(
            store,
            &opts.prefix,
            breakers,
            metrics.clone(),
            lag,
        )),
        policy,
        metrics,
        max_body: opts.max_body,
        body_timeout: opts.body_timeout,
    });
    if let Err(e) = app.decider.check().await {
        tracing::warn!(error = %e, "redis does not take decisions yet; requests get 503 until it does");
    }
    let limits = Limits {
        max_connections,
        header_timeout: opts.header_timeout,
        idle_timeout: opts.idle_timeout,
    };
    tracing::info!(
        addr = %opts.listen,
        grpc = %opts.grpc_listen.map_or("off".to_string(), |a| a.to_string()),
        tls = tls.is_some(),
        mode = if app.policy.is_some() { "config" } else { "open" },
        redis = %opts.redis,
        prefix = %opts.prefix,
        max_connections,
        header_timeout = %human(opts.header_timeout),
        idle_timeout = %human(opts.idle_timeout),
        body_timeout = %human(opts.body_timeout),
        max_body = opts.max_body,
        "serving /v1/acquire and /v1/refill"
    );
    // Leases end on time: what they did not use goes back.
    let ending = {
        let app = app.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(lease::LEASE_TIME / 10);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                let ended = app.decider.leases.ended(std::time::Instant::now());
                if !ended.is_empty() {
                    app.decider.end_leases(ended).await;
                }
            }
        })
    };
    let cap = conn::Cap::new(limits);
    let stop = Arc::new(tokio::sync::Notify::new());
    let grpc_task = grpc_listener.map(|tcp| {
        let listener = conn::Listener {
            tcp,
            protocol: conn::Protocol::Http2,
            router: grpc::router(app.clone()),
            tls: tls
                .as_ref()
                .map(|t| tokio_rustls::TlsAcceptor::from(t.grpc.clone())),
        };
        let (cap, metrics, stop) = (cap.clone(), app.metrics.conn.clone(), stop.clone());
        tokio::spawn(conn::run(listener, cap, limits, metrics, async move {
            stop.notified().await;
        }))
    });
    let listener = conn::Listener {
        tcp: listener,
        protocol: conn::Protocol::Http1(api::overloaded),
        router: api::router(app.clone()),
        tls: tls.map(|t| tokio_rustls::TlsAcceptor::from(t.http)),
    };
    conn::run(listener, cap, limits, app.metrics.conn.clone(), shutdown).await;
    stop.notify_one();
    if let Some(t) = grpc_task {
        let _ = tokio::time::timeout(conn::SHUTDOWN_GRACE, t).await;
    }
    ending.abort();
    // What the leases hold goes back before the service stops.
    let held = app.decider.leases.end_all();
    let _ = tokio::time::timeout(conn::SHUTDOWN_GRACE, app.decider.end_leases(held)).await;
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
