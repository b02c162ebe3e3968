//! Limits that hold across processes and hosts, kept in Redis.
//!
//! One state per key, decided atomically inside Redis by one Lua script (loaded
//! once, re-sent when Redis answers NOSCRIPT) on the server's clock (`TIME`), so
//! any number of clients on any number of hosts share one limit per key. Keys
//! are `PREFIX{KEY}`: the `{hash tag}` keeps each key whole on one Redis Cluster
//! slot, and a cluster spreads keys over its masters, as a service of several
//! throttling servers spreads its users over them by hash. Every write sets a TTL at which the state would
//! read as a full bucket or an empty window, so idle keys vanish by themselves.
//!
//! The decisions are those of [`ratelimit_common::keyed::Limiter`] for the same
//! algorithm and the same arrival times, at microsecond resolution:
//! - [`Limit::Gcra`]: token bucket with greedy refill, kept exactly in integer
//!   units of `1/count` microsecond (no rounding of the refill interval);
//! - [`Limit::FixedWindow`] and [`Limit::SlidingWindow`]: counters per window of
//!   whole microseconds.
//!
//! The interval-refill bucket, the sliding log and the rolling quota stay
//! in-process: their state is a log or a schedule, not a few integers.
//!
//! A call that fails took nothing: every script call carries a deadline on
//! Redis's clock ([`DEADLINE`] after it is sent, see [`clock`]) and changes
//! nothing when Redis reaches it later (after a stall, say), and the client
//! waits [`RESPONSE_TIMEOUT`] for the answer, so the answer of a call that ran
//! in time has the difference to come back. Only an answer lost or delayed
//! by more than that after Redis decided leaves a decision the caller did not
//! see. The errors say why a call failed: Redis refused it (out of memory, a
//! read-only replica, ...), could not be reached, did not answer in time, or
//! reached the call after its deadline.
//!
//! Two features, both on by default, keep each program to its own part: `serve`
//! (grants bound to their keys, the Cluster's slots: what the throttling
//! service decides with) and `fleet` (the daemons' shared counts, members and
//! tallies, [`fleet`]). The daemon builds with `fleet` alone, the service
//! with `serve` alone.
//!
//! ```no_run
//! # async fn f() -> Result<(), ratelimit_redis::Error> {
//! use std::time::Duration;
//! use ratelimit_redis::{Limit, RedisLimiter, Store};
//!
//! let store = Store::connect("redis://127.0.0.1:6379").await?;
//! let api = RedisLimiter::new(store, "api:", Limit::gcra(100, Duration::from_secs(1), 20)?);
//! let grant = api.acquire("alice", 1).await?;
//! if grant.granted == 0 {
//!     println!("come back in {:?}", grant.retry_after);
//! }
//! # Ok(()) }
//! ```

pub mod clock;
#[cfg(feature = "fleet")]
pub mod fleet;
#[cfg(feature = "serve")]
mod grant;
mod lease;

use std::{fmt, sync::Arc, time::Duration};

use ratelimit_common::{ParamError, fixed_window, gcra, keyed::Algorithm, sliding_window};
use redis::{
    Script,
    aio::{ConnectionManager, ConnectionManagerConfig},
    cluster::ClusterClient,
    cluster_async::ClusterConnection,
};

#[cfg(feature = "serve")]
pub use grant::{Ask, Granted, MAX_BATCH, RefillOutcome, Refilled, Refunded, slot, tag_of_slot};
pub use lease::{Leases, bound as lease_bound};

/// The decision script (`limit.lua`), as Redis runs it: for tools that
/// measure against calling it directly (the service's benchmark).
pub const LIMIT_SCRIPT: &str = concat!(include_str!("gcra.lua"), include_str!("limit.lua"));

/// The largest value the script's arithmetic reaches: Lua's numbers are doubles,
/// exact for integers up to 2^53; one bit of headroom for sums.
const EXACT_MAX: u64 = 1 << 52;

/// Largest burst or window limit: that of the in-process algorithms.
const COUNT_MAX: u64 = 1 << 31;

/// What can go wrong. Whatever the error, a call that fails took nothing (see
/// the crate's documentation for the one exception: an answer lost after
/// Redis decided).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A parameter of a limit is out of range.
    #[error("{0}")]
    Param(ParamError),
    /// Redis answered with an error: it refused the call (out of memory, a
    /// read-only replica, writes stopped, not permitted, ...). Nothing changed.
    #[error("redis refused: {}", refusal(.0))]
    Refused(#[source] redis::RedisError),
    /// Redis could not be reached: the connection was refused, broken, or
    /// could not be made.
    #[error("redis unreachable: {0}")]
    Unreachable(#[source] redis::RedisError),
    /// Redis did not answer within [`RESPONSE_TIMEOUT`]. If it runs the call
    /// later, the call is past its deadline and changes nothing.
    #[error(
        "redis timed out: no answer within {} ms (a call it runs later is past its deadline and takes nothing)",
        RESPONSE_TIMEOUT.as_millis()
    )]
    TimedOut(#[source] redis::RedisError),
    /// Redis reached the call after its deadline ([`DEADLINE`] after it was
    /// sent) and changed nothing.
    #[error(
        "redis too slow: it reached the call {} ms after its {} ms deadline and took nothing",
        late.as_millis(),
        DEADLINE.as_millis()
    )]
    Late {
        /// How long after the deadline.
        late: Duration,
    },
    /// Any other failure of the client library (an answer it could not read).
    #[error("redis: {0}")]
    Redis(#[source] redis::RedisError),
    /// A URL that is not `redis://`, `rediss://` or `redis+cluster://`.
    #[error("{0}")]
    Url(String),
}

impl From<redis::RedisError> for Error {
    fn from(e: redis::RedisError) -> Self {
        use redis::ErrorKind;
        if e.is_timeout() {
            Self::TimedOut(e)
        } else if matches!(e.kind(), ErrorKind::Server(_) | ErrorKind::Extension) {
            Self::Refused(e)
        } else if e.is_io_error()
            || e.is_connection_refusal()
            || e.is_connection_dropped()
            || matches!(
                e.kind(),
                ErrorKind::ClusterConnectionNotFound | ErrorKind::AuthenticationFailed
            )
        {
            Self::Unreachable(e)
        } else {
            Self::Redis(e)
        }
    }
}

impl Error {
    /// Whether Redis answered with an error (as opposed to not answering).
    pub fn is_refusal(&self) -> bool {
        matches!(self, Self::Refused(_))
    }
}

/// What a refusal means, in words, then Redis's own: `out of memory (OOM
/// command not allowed when used memory > 'maxmemory'.)`.
fn refusal(e: &redis::RedisError) -> String {
    let code = e.code().unwrap_or_default();
    let what = match code {
        "OOM" => "out of memory",
        "READONLY" => "it is a read-only replica",
        "MISCONF" => "writes are stopped (it cannot save to disk)",
        "NOPERM" => "not permitted by its ACL",
        "NOAUTH" | "WRONGPASS" => "not authenticated",
        "BUSY" => "busy running a script",
        "LOADING" => "still loading its data",
        "CLUSTERDOWN" => "the cluster is down",
        "MASTERDOWN" => "its master is down",
        "TRYAGAIN" => "the key is being moved",
        _ => "an error",
    };
    match e.detail() {
        // Scripts' errors end with where in the script; that is ours, not
        // the caller's business.
        Some(detail) => {
            let detail = detail.split(" script: ").next().unwrap_or(detail);
            format!("{what} ({code} {detail})")
        }
        None => format!("{what} ({code})"),
    }
}

impl From<ParamError> for Error {
    fn from(e: ParamError) -> Self {
        Self::Param(e)
    }
}

/// A limit, as Redis keeps it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Limit {
    /// `count` per `per`, with a bucket of `burst` (token bucket, greedy refill).
    Gcra {
        /// Tokens per `per`.
        count: u64,
        /// The period, in whole microseconds.
        per: Duration,
        /// The bucket's size.
        burst: u64,
    },
    /// At most `limit` in each window of `window` (windows aligned to the epoch).
    FixedWindow {
        /// The window, in whole microseconds.
        window: Duration,
        /// Units per window.
        limit: u64,
    },
    /// At most `limit` in any window of `window`, the previous window weighted
    /// by how much of it is still inside.
    SlidingWindow {
        /// The window, in whole microseconds.
        window: Duration,
        /// Units per window.
        limit: u64,
    },
}

fn whole_micros(d: Duration, param: &'static str) -> Result<u64, ParamError> {
    let us = d.as_micros();
    if d.is_zero() || !d.as_nanos().is_multiple_of(1000) || us > u128::from(EXACT_MAX) {
        return Err(ParamError {
            param,
            accepted: "must be a whole number of microseconds, from 1µs to about 142 years",
        });
    }
    Ok(us as u64)
}

fn gcd(mut a: u64, mut b: u64) -> u64 {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}

impl Limit {
    /// `count` per `per` with a burst of `burst`, checked.
    pub fn gcra(count: u64, per: Duration, burst: u64) -> Result<Self, ParamError> {
        let l = Self::Gcra { count, per, burst };
        l.args()?;
        Ok(l)
    }

    /// A fixed window of `window` admitting `limit`, checked.
    pub fn fixed_window(window: Duration, limit: u64) -> Result<Self, ParamError> {
        let l = Self::FixedWindow { window, limit };
        l.args()?;
        Ok(l)
    }

    /// A sliding window of `window` admitting `limit`, checked.
    pub fn sliding_window(window: Duration, limit: u64) -> Result<Self, ParamError> {
        let l = Self::SlidingWindow { window, limit };
        l.args()?;
        Ok(l)
    }

    /// The most one request can be granted at once.
    pub fn capacity(&self) -> u64 {
        match *self {
            Self::Gcra { burst, .. } => burst,
            Self::FixedWindow { limit, .. } | Self::SlidingWindow { limit, .. } => limit,
        }
    }

    /// The sustained rate, units per second.
    pub fn rate_per_sec(&self) -> f64 {
        match *self {
            Self::Gcra { count, per, .. } => count as f64 / per.as_secs_f64(),
            Self::FixedWindow { window, limit } | Self::SlidingWindow { window, limit } => {
                limit as f64 / window.as_secs_f64()
            }
        }
    }

    /// The same limit for the in-process [`ratelimit_common::keyed::Limiter`].
    pub fn in_process(&self) -> Result<Algorithm, ParamError> {
        Ok(match *self {
            Self::Gcra { count, per, burst } => Algorithm::per(count, per, burst)?,
            Self::FixedWindow { window, limit } => {
                Algorithm::FixedWindow(fixed_window::Params::new(window.as_nanos() as u64, limit)?)
            }
            Self::SlidingWindow { window, limit } => Algorithm::SlidingWindow(
                sliding_window::Params::new(window.as_nanos() as u64, limit)?,
            ),
        })
    }

    /// The script's arguments: algorithm and three integers, checked to keep
    /// every intermediate value exact.
    fn args(&self) -> Result<(&'static str, u64, u64, u64), ParamError> {
        match *self {
            Self::Gcra { count, per, burst } => {
                let per = whole_micros(per, "per")?;
                if count == 0 {
                    return Err(ParamError {
                        param: "count",
                        accepted: "must be at least 1 (to admit nothing, deny the key)",
                    });
                }
                if burst == 0 || burst > gcra::CAPACITY_MAX {
                    return Err(ParamError {
                        param: "burst",
                        accepted: "must be 1 to 4294967296 (2^32)",
                    });
                }
                let g = gcd(count, per);
                let (s, p) = (count / g, per / g);
                if s > EXACT_MAX || u128::from(burst) * u128::from(p) > u128::from(EXACT_MAX) {
                    return Err(ParamError {
                        param: "burst",
                        accepted: "burst × per / count must be at most 2^52 µs/count (about 142 years of refill); lower the burst or raise the rate",
                    });
                }
                Ok(("gcra", s, p, burst))
            }
            Self::FixedWindow { window, limit } | Self::SlidingWindow { window, limit } => {
                let w = whole_micros(window, "window")?;
                if limit == 0 || limit > COUNT_MAX {
                    return Err(ParamError {
                        param: "limit",
                        accepted: "must be 1 to 2147483648 (2^31)",
                    });
                }
                if u128::from(limit) * u128::from(w) * 2 > u128::from(EXACT_MAX) {
                    return Err(ParamError {
                        param: "window",
                        accepted: "limit × window in µs must be at most 2^51; shorten the window or lower the limit",
                    });
                }
                let algo = if matches!(self, Self::FixedWindow { .. }) {
                    "fixed"
                } else {
                    "sliding"
                };
                Ok((algo, limit, w, 0))
            }
        }
    }
}

impl fmt::Display for Limit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Gcra { count, per, burst } => {
                write!(f, "gcra {count} per {per:?} burst {burst}")
            }
            Self::FixedWindow { window, limit } => write!(f, "fixed window {limit} per {window:?}"),
            Self::SlidingWindow { window, limit } => {
                write!(f, "sliding window {limit} per {window:?}")
            }
        }
    }
}

/// A connection to one Redis server (reconnecting by itself) or to a Redis
/// Cluster (following its slots). Cheap to clone; clones share the connection.
#[derive(Clone)]
pub struct Store {
    conn: Conn,
    script: Arc<Script>,
    clock: Arc<clock::Clock>,
}

#[derive(Clone)]
enum Conn {
    Single(ConnectionManager),
    Cluster(ClusterConnection),
}

/// How long one call to Redis may take before it fails (and is counted).
pub const RESPONSE_TIMEOUT: Duration = Duration::from_millis(500);

/// A script call that Redis reaches later than this after it was sent changes
/// nothing (it answers [`Error::Late`]). Shorter than [`RESPONSE_TIMEOUT`]: the
/// answer of a call decided in time has the difference to come back.
pub const DEADLINE: Duration = Duration::from_millis(200);

impl Store {
    /// Connects to `url`: `redis://HOST:PORT[/DB]` (or `rediss://`) for one
    /// server, `redis+cluster://HOST:PORT,HOST:PORT,…` for a cluster (any of
    /// its nodes; the rest are discovered).
    pub async fn connect(url: &str) -> Result<Self, Error> {
        let conn = if let Some(nodes) = url.strip_prefix("redis+cluster://") {
            let nodes: Vec<String> = nodes
                .split(',')
                .filter(|n| !n.is_empty())
                .map(|n| format!("redis://{n}"))
                .collect();
            if nodes.is_empty() {
                return Err(Error::Url(format!(
                    "{url}: name at least one node, like redis+cluster://127.0.0.1:7000"
                )));
            }
            let client = ClusterClient::builder(nodes)
                .response_timeout(RESPONSE_TIMEOUT)
                .connection_timeout(RESPONSE_TIMEOUT)
                .build()?;
            Conn::Cluster(client.get_async_connection().await?)
        } else if ["redis://", "rediss://", "redis+unix://", "unix://"]
            .iter()
            .any(|p| url.starts_with(p))
        {
            let client = redis::Client::open(url)?;
            let config = ConnectionManagerConfig::new()
                .set_response_timeout(Some(RESPONSE_TIMEOUT))
                .set_connection_timeout(Some(RESPONSE_TIMEOUT))
                .set_number_of_retries(2)
                .set_max_delay(Duration::from_millis(500));
            Conn::Single(ConnectionManager::new_with_config(client, config).await?)
        } else {
            return Err(Error::Url(format!(
                "{url}: not a Redis URL; write redis://HOST:PORT, redis+unix:///PATH or redis+cluster://HOST:PORT,HOST:PORT"
            )));
        };
        let store = Self {
            conn,
            script: Arc::new(Script::new(LIMIT_SCRIPT)),
            clock: Arc::default(),
        };
        // Redis's clock, for the first call's deadline; if Redis does not
        // answer now, the first call asks.
        let _ = store.time().await;
        Ok(store)
    }

    /// Redis's `TIME`, µs since the epoch; samples the clock's offset.
    async fn time(&self) -> Result<u64, Error> {
        let cmd = redis::cmd("TIME");
        let (s, us): (u64, u64) = match &self.conn {
            Conn::Single(c) => cmd.query_async(&mut c.clone()).await?,
            Conn::Cluster(c) => cmd.query_async(&mut c.clone()).await?,
        };
        let now = s * 1_000_000 + us;
        self.clock.sample(now, self.clock.now_us());
        Ok(now)
    }

    /// The deadline of a call sent now, on Redis's clock.
    async fn deadline(&self) -> Result<u64, Error> {
        if let Some(d) = self.clock.deadline(DEADLINE) {
            return Ok(d);
        }
        let sent = self.clock.now_us();
        self.time().await?;
        // Counted from before the TIME call: never later than meant.
        let spent = Duration::from_micros((self.clock.now_us() - sent).max(0) as u64);
        self.clock
            .deadline(DEADLINE.saturating_sub(spent))
            .ok_or(Error::Late { late: spent })
    }

    /// Runs the script once: `op` on `key` (the full Redis key) for `amount`.
    async fn call(
        &self,
        op: Op,
        key: &str,
        limit: Option<&Limit>,
        amount: u64,
    ) -> Result<Reply, Error> {
        let r = self.invoke(op, key, limit, amount).await?;
        Ok(Reply {
            allowed: r.0 == 1,
            granted: r.1.max(0) as u64,
            remaining: r.2.max(0) as u64,
            retry_after: (r.3 >= 0 && r.0 != 1).then(|| Duration::from_micros(r.3 as u64)),
            server_time_us: r.4.max(0) as u64,
        })
    }

    /// The script's raw answer (see limit.lua).
    async fn invoke(
        &self,
        op: Op,
        key: &str,
        limit: Option<&Limit>,
        amount: u64,
    ) -> Result<(i64, i64, i64, i64, i64), Error> {
        let (algo, x, y, z) = match limit {
            Some(l) => l.args()?,
            None => ("stored", 0, 0, 0),
        };
        let deadline = self.deadline().await?;
        let mut call = self.script.prepare_invoke();
        call.key(key)
            .arg(op.name())
            .arg(algo)
            .arg(x)
            .arg(y)
            .arg(z)
            .arg(amount.min(EXACT_MAX))
            .arg(deadline);
        let r: (i64, i64, i64, i64, i64) = match &self.conn {
            Conn::Single(c) => call.invoke_async(&mut c.clone()).await?,
            Conn::Cluster(c) => call.invoke_async(&mut c.clone()).await?,
        };
        self.clock.sample(r.4.max(0) as u64, self.clock.now_us());
        if r.0 == LATE {
            return Err(Error::Late {
                late: Duration::from_micros(r.3.max(0) as u64),
            });
        }
        Ok(r)
    }

    /// Whether Redis takes decisions now: runs the script as a decision does,
    /// with a write (a short-lived key `{prefix}healthz`, which no key of
    /// [`Store::key`] can be), so that a Redis that answers but refuses writes
    /// (out of memory, a read-only replica) fails it as it fails decisions.
    pub async fn probe(&self, prefix: &str) -> Result<(), Error> {
        self.invoke(Op::Probe, &format!("{prefix}healthz"), None, 1)
            .await
            .map(|_| ())
    }

    /// `PING`: whether Redis answers, for health checks.
    pub async fn ping(&self) -> Result<(), Error> {
        let cmd = redis::cmd("PING");
        match &self.conn {
            Conn::Single(c) => cmd.query_async::<()>(&mut c.clone()).await?,
            Conn::Cluster(c) => cmd.query_async::<()>(&mut c.clone()).await?,
        }
        Ok(())
    }

    /// Marks `member` present at `now_ms` in the sorted set `key`, drops those
    /// last seen before `stale_ms`, and says how many are present.
    pub async fn members(
        &self,
        key: &str,
        member: &str,
        now_ms: u64,
        stale_ms: u64,
    ) -> Result<u64, Error> {
        let mut pipe = redis::pipe();
        pipe.atomic()
            .zadd(key, member, now_ms)
            .ignore()
            .zrembyscore(key, "-inf", format!("({stale_ms}"))
            .ignore()
            .pexpire(key, 60_000)
            .ignore()
            .zcard(key);
        let (n,): (u64,) = match &self.conn {
            Conn::Single(c) => pipe.query_async(&mut c.clone()).await?,
            Conn::Cluster(c) => pipe.query_async(&mut c.clone()).await?,
        };
        Ok(n)
    }

    /// Adds `amount` to `member`'s score in the sorted set `key`, which
    /// vanishes `ttl` after its last write: a tally for monitoring.
    pub async fn tally(
        &self,
        key: &str,
        member: &str,
        amount: u64,
        ttl: Duration,
    ) -> Result<(), Error> {
        let mut pipe = redis::pipe();
        pipe.atomic()
            .zincr(key, member, amount)
            .ignore()
            .pexpire(key, ttl.as_millis() as i64)
            .ignore();
        match &self.conn {
            Conn::Single(c) => pipe.query_async::<()>(&mut c.clone()).await?,
            Conn::Cluster(c) => pipe.query_async::<()>(&mut c.clone()).await?,
        }
        Ok(())
    }

    /// The `n` members of the sorted set `key` with the highest scores.
    pub async fn top(&self, key: &str, n: usize) -> Result<Vec<(String, u64)>, Error> {
        let stop = n.saturating_sub(1) as isize;
        let cmd = redis::Cmd::zrevrange_withscores(key, 0, stop);
        let r: Vec<(String, f64)> = match &self.conn {
            Conn::Single(c) => cmd.query_async(&mut c.clone()).await?,
            Conn::Cluster(c) => cmd.query_async(&mut c.clone()).await?,
        };
        Ok(r.into_iter().map(|(m, s)| (m, s.max(0.0) as u64)).collect())
    }

    /// The full Redis key for `key` under `prefix`: `prefix{key}`.
    pub fn key(prefix: &str, key: &str) -> String {
        format!("{prefix}{{{key}}}")
    }

    /// Asks for `amount` of `key` under `limit`: all of it if there, else what
    /// is there (possibly nothing). `key` is the full Redis key ([`Store::key`]).
    pub async fn acquire(&self, key: &str, limit: &Limit, amount: u64) -> Result<Reply, Error> {
        self.call(Op::Partial, key, Some(limit), amount).await
    }

    /// Takes `amount` of `key` only if all of it is there.
    pub async fn take(&self, key: &str, limit: &Limit, amount: u64) -> Result<Reply, Error> {
        self.call(Op::Take, key, Some(limit), amount).await
    }

    /// Gives back `amount` of `key` (never above a full bucket or below an empty
    /// window); with no `limit`, under the limit the key was last written with.
    pub async fn refund(
        &self,
        key: &str,
        limit: Option<&Limit>,
        amount: u64,
    ) -> Result<Reply, Error> {
        self.call(Op::Refund, key, limit, amount).await
    }

    /// Takes `amount` of `key` whether or not it is there (for units admitted
    /// while Redis could not be asked): the bucket empties, never below empty.
    pub async fn charge(&self, key: &str, limit: &Limit, amount: u64) -> Result<Reply, Error> {
        self.call(Op::Charge, key, Some(limit), amount).await
    }

    /// Adds `amount` (possibly 0) admitted elsewhere to the gcra bucket of
    /// `key`, beyond empty if it comes to that (by at most a minute of refill),
    /// and returns the debt after it: how long the bucket takes to be full
    /// again. What the fleet's daemons report their keys' use with.
    pub async fn report(&self, key: &str, limit: &Limit, amount: u64) -> Result<Duration, Error> {
        if !matches!(limit, Limit::Gcra { .. }) {
            return Err(Error::Param(ParamError {
                param: "limit",
                accepted: "report takes a gcra limit",
            }));
        }
        let r = self.invoke(Op::Report, key, Some(limit), amount).await?;
        Ok(Duration::from_micros(r.3.max(0) as u64))
    }
}

#[derive(Clone, Copy)]
enum Op {
    Take,
    Partial,
    Refund,
    Charge,
    Report,
    Probe,
}

/// The script's first answer for a call reached after its deadline.
const LATE: i64 = -1;

impl Op {
    fn name(self) -> &'static str {
        match self {
            Op::Take => "take",
            Op::Partial => "partial",
            Op::Refund => "refund",
            Op::Charge => "charge",
            Op::Report => "report",
            Op::Probe => "probe",
        }
    }
}

/// Redis's answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Reply {
    /// Whether the whole amount was granted.
    pub allowed: bool,
    /// Units granted (all, some, or none).
    pub granted: u64,
    /// Whole units left after this call.
    pub remaining: u64,
    /// When not all was granted: how long until all would be, if nothing else
    /// came; `None` if it never can be at once (more than the capacity).
    pub retry_after: Option<Duration>,
    /// The server's clock when it decided, µs since the epoch.
    pub server_time_us: u64,
}

/// One limit for many keys, in Redis: acquiring units and refunding the
/// unused ones, with the meaning of the in-process limiter's.
#[derive(Clone)]
pub struct RedisLimiter {
    store: Store,
    prefix: String,
    limit: Limit,
}

impl RedisLimiter {
    /// Keys `PREFIX{key}` in `store`, each limited by `limit`.
    pub fn new(store: Store, prefix: &str, limit: Limit) -> Self {
        Self {
            store,
            prefix: prefix.to_string(),
            limit,
        }
    }

    /// The limit.
    pub fn limit(&self) -> &Limit {
        &self.limit
    }

    /// Asks for `amount` units of `key`: grants all if it can, else as many as
    /// there are now (possibly 0), and says when the whole request would be.
    pub async fn acquire(&self, key: &str, amount: u64) -> Result<Reply, Error> {
        self.store
            .acquire(&Store::key(&self.prefix, key), &self.limit, amount)
            .await
    }

    /// Decides one arrival of `amount`: all or nothing.
    pub async fn decide(&self, key: &str, amount: u64) -> Result<Reply, Error> {
        self.store
            .take(&Store::key(&self.prefix, key), &self.limit, amount)
            .await
    }

    /// Gives back `amount` units acquired and not used.
    pub async fn refund(&self, key: &str, amount: u64) -> Result<Reply, Error> {
        self.store
            .refund(&Store::key(&self.prefix, key), Some(&self.limit), amount)
            .await
    }

    /// The store, for [`Leases`].
    pub fn store(&self) -> &Store {
        &self.store
    }

    /// The full Redis key of `key`.
    pub fn redis_key(&self, key: &str) -> String {
        Store::key(&self.prefix, key)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Duration = Duration::from_secs(1);

    #[test]
    fn gcra_arguments_are_reduced_and_exact() {
        assert_eq!(
            Limit::gcra(100, S, 20).unwrap().args().unwrap(),
            ("gcra", 1, 10_000, 20)
        );
        assert_eq!(
            Limit::gcra(3, S, 5).unwrap().args().unwrap(),
            ("gcra", 3, 1_000_000, 5)
        );
        assert_eq!(
            Limit::gcra(10_000_000, S, 5).unwrap().args().unwrap(),
            ("gcra", 10, 1, 5)
        );
    }

    #[test]
    fn limits_out_of_range_name_their_parameter() {
        let e = Limit::gcra(0, S, 1).unwrap_err();
        assert_eq!(e.param, "count");
        let e = Limit::gcra(1, Duration::from_nanos(1500), 1).unwrap_err();
        assert_eq!(e.param, "per");
        let e = Limit::gcra(1, S, 0).unwrap_err();
        assert_eq!(e.param, "burst");
        let e = Limit::gcra(1, Duration::from_secs(86_400 * 365), 1 << 32).unwrap_err();
        assert_eq!(e.param, "burst");
        let e = Limit::fixed_window(Duration::ZERO, 1).unwrap_err();
        assert_eq!(e.param, "window");
        let e = Limit::sliding_window(S, 0).unwrap_err();
        assert_eq!(e.param, "limit");
    }

    #[test]
    fn keys_carry_a_hash_tag() {
        assert_eq!(Store::key("api:", "alice"), "api:{alice}");
    }
}
