//! The command line of the throttling service, as clap parses it: one
//! definition for both ways it is started, `ratelimit serve` (the daemon's
//! binary, which hands its arguments on) and `ratelimit-serve`, so that
//! `--help`, the man page and the shell completions of either are the same.
//! `ratelimit_serve::options` validates them.

use std::path::PathBuf;

use clap::Args;

use crate::{Invalid, Result};

/// The port `--listen` defaults to (on 127.0.0.1).
pub const DEFAULT_PORT: u16 = 9478;
/// The port `--grpc-listen` defaults to (Envoy's ratelimit service's).
pub const DEFAULT_GRPC_PORT: u16 = 8081;
/// `--header-timeout` when not given: headers come at once from a program.
pub const DEFAULT_HEADER_TIMEOUT: &str = "5s";
/// `--idle-timeout` when not given: long enough for a client's pool to reuse
/// its connections; under pressure idle ones are closed for room anyway.
pub const DEFAULT_IDLE_TIMEOUT: &str = "30s";
/// `--body-timeout` when not given: a body of 16 KiB takes milliseconds.
pub const DEFAULT_BODY_TIMEOUT: &str = "10s";
/// `--max-body` when not given: a request names a key and a limit.
pub const DEFAULT_MAX_BODY: &str = "16KiB";

/// The examples after `--help`.
pub const EXAMPLES: &str = "\
Examples:
  ratelimit serve --redis redis://127.0.0.1:6379
  ratelimit serve --redis redis+cluster://198.18.0.10:7000,198.18.0.11:7000 --listen :9478 --max-connections 4096
  ratelimit serve --redis redis://127.0.0.1:6379 --config /etc/ratelimit/serve.toml --grpc-listen 127.0.0.1:8081 --tls-cert cert.pem --tls-key key.pem";

/// The options of `ratelimit serve` (and of `ratelimit-serve`), as typed.
#[derive(Debug, Args)]
pub struct ServeArgs {
    // The help text shows brackets as written; they are not links.
    #[allow(rustdoc::broken_intra_doc_links)]
    /// Address to listen on: HOST:PORT, [V6]:PORT, localhost:PORT, or :PORT
    /// (every IPv4 address).
    #[arg(long, default_value = "127.0.0.1:9478")]
    pub listen: String,
    /// Redis: redis://HOST:PORT[/DB] for one server, or
    /// redis+cluster://HOST:PORT,HOST:PORT for a Redis Cluster.
    #[arg(long)]
    pub redis: String,
    /// Prefix of the Redis keys (each key is PREFIX{KEY}).
    #[arg(long, default_value = "ratelimit:")]
    pub prefix: String,
    /// Client connections open at once, HTTP and gRPC together; past it the
    /// one idle longest is closed for a new one, and when all are busy a new
    /// one is answered 503 (gRPC: closed) [default: 1024, or the open-file
    /// limit minus 96 if lower].
    #[arg(long, value_name = "N")]
    pub max_connections: Option<String>,
    /// How long a request's headers may take to arrive, from the connection's
    /// opening (or a later request's first byte); a TLS handshake too.
    #[arg(long, value_name = "DURATION", default_value = DEFAULT_HEADER_TIMEOUT)]
    pub header_timeout: String,
    /// How long a keep-alive connection may wait for its next request (gRPC:
    /// a connection with no request in flight).
    #[arg(long, value_name = "DURATION", default_value = DEFAULT_IDLE_TIMEOUT)]
    pub idle_timeout: String,
    /// How long a request's body may take to arrive, from its headers
    /// (answered 408 past it; gRPC: DEADLINE_EXCEEDED).
    #[arg(long, value_name = "DURATION", default_value = DEFAULT_BODY_TIMEOUT)]
    pub body_timeout: String,
    /// Largest request body, like 16KiB or 65536 (bytes); answered 413 past
    /// it.
    #[arg(long, value_name = "SIZE", default_value = DEFAULT_MAX_BODY)]
    pub max_body: String,
    /// Limits, tenants and their tokens: a TOML file (see
    /// examples/serve.toml). Callers then name a limit, not its numbers, and
    /// send `Authorization: Bearer TOKEN`. Without it the service is open:
    /// any caller names any key and the limit's numbers.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Also serve Envoy's rate limit service API (gRPC,
    /// envoy.service.ratelimit.v3) on this address: HOST:PORT, like
    /// 127.0.0.1:8081.
    #[arg(long, value_name = "ADDR")]
    pub grpc_listen: Option<String>,
    /// TLS on both listeners: the certificate chain (PEM, leaf first).
    #[arg(long, value_name = "FILE", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// TLS on both listeners: the certificate's private key (PEM).
    #[arg(long, value_name = "FILE", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// Threads serving requests [default: half the CPUs, rounded up: the
    /// service mostly waits on Redis, and on a small host shares it with
    /// Redis or the programs it serves].
    #[arg(long, value_name = "N")]
    pub threads: Option<String>,
}

impl ServeArgs {
    /// `--threads`, checked, or its default.
    pub fn worker_threads(&self) -> Result<usize> {
        match &self.threads {
            None => Ok(std::thread::available_parallelism()
                .map_or(1, |n| n.get())
                .div_ceil(2)),
            Some(s) => match s.trim().parse::<usize>() {
                Ok(n) if (1..=1024).contains(&n) => Ok(n),
                _ => Err(Invalid::new(
                    "--threads",
                    format!("{s:?} is not a number of threads from 1 to 1024, like 2"),
                )),
            },
        }
    }
}
