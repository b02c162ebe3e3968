//! The decisions both APIs ask for ([`super::api`] over HTTP, [`super::grpc`]
//! over gRPC): acquires of many keys, refills by grant, keyed refunds; each
//! through the node's breaker ([`super::breaker`]), timed and counted.
//!
//! **Batching.** On one Redis server, acquires that arrive while
//! [`IN_FLIGHT`] calls are under way wait for the next call and share it: one
//! script call decides them all (each key atomically, in order), so Redis
//! runs one command where it would run many. Below that, each request is
//! sent at once: a lone client waits for nothing. On a Cluster,
//! the keys of one request are grouped by hash slot, one call per slot, the
//! slots at once.
//!
//! **Grants.** Each key acquired with a grant gets an id made here: 128 bits
//! of the OS's random source, written as 32 hex digits, so that one id tells
//! nothing of another. What the caller is given is the id and the key's
//! hash-tag text (base64url), so that a refill names nothing else
//! ([`grant_token`]). The grant's record holds its owner ([`owner_of`]): a
//! refill by another tenant gives nothing back.

use std::{
    collections::BTreeMap,
    sync::{Arc, Mutex, PoisonError},
    time::Instant,
};

use ratelimit_redis::{
    Ask, Error as RedisError, Granted, Limit, MAX_BATCH, Refilled, Refunded, Store,
};
use tokio::sync::oneshot;

use super::{
    breaker::{Breakers, Tripped},
    lag::Lag,
    lease::{Ended, Leases, Local},
    metrics::Metrics,
};

/// Calls in flight at once to one Redis server before acquires wait for the
/// next call and share it. Measured on 2 CPUs beside Redis (three rounds,
/// 8 and 32 clients): 1 spent the least of the service's CPU per request
/// (13 to 18 µs, against 15 to 21 with 4 and 16) and served the most at 32
/// clients; at 8 the rounds overlapped.
pub(super) const IN_FLIGHT: usize = 1;

/// Why a key was not decided.
#[derive(Clone, Debug)]
pub(super) enum Failed {
    /// Its node's breaker is open: answered at once.
    Down(Tripped),
    /// The call failed.
    Redis(Arc<RedisError>),
    /// The call timed out while the service itself was starved of CPU
    /// ([`super::lag`]): Redis may have answered in time, unread. Not
    /// Redis's error: its breaker stays closed.
    Starved {
        /// How late the service's runtime ran during the call.
        late: std::time::Duration,
        /// What the call met.
        error: Arc<RedisError>,
    },
}

impl std::fmt::Display for Failed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Down(t) => t.fmt(f),
            Self::Redis(e) => e.fmt(f),
            Self::Starved { late, error } => write!(
                f,
                "the service was too busy to hear Redis in time: its own workers ran {} ms late during the call (Redis is not blamed; its breaker stays closed): {error}",
                late.as_millis()
            ),
        }
    }
}

impl Failed {
    /// A limit out of range (a request's fault, not Redis's).
    pub(super) fn param(&self) -> Option<&ratelimit_common::ParamError> {
        match self {
            Self::Redis(e) => match e.as_ref() {
                RedisError::Param(p) => Some(p),
                _ => None,
            },
            Self::Down(_) | Self::Starved { .. } => None,
        }
    }
}

/// What both APIs decide with.
pub(super) struct Decider {
    store: Store,
    prefix: String,
    breakers: Arc<Breakers>,
    batcher: Option<Arc<Batcher>>,
    metrics: Arc<Metrics>,
    lag: Arc<Lag>,
    random: ring::rand::SystemRandom,
    /// This process's leases of hot keys.
    pub(super) leases: Leases,
}

/// The owner of the grants leases are taken under: their ids are never
/// handed out, so nobody else refills them.
const LEASE_OWNER: &str = "lease";

/// The acquire that takes a lease of `size` units of `ask`'s key, recorded
/// as the service's own grant `id`.
fn lease_of(ask: &Ask, size: u64, id: &str) -> Ask {
    Ask {
        key: ask.key.clone(),
        limit: ask.limit,
        amount: size,
        whole: false,
        grant: Some(id.to_string()),
        owner: LEASE_OWNER.to_string(),
    }
}

impl Decider {
    /// Decides in `store`, keys under `prefix`; a call that fails while
    /// `lag` saw the service starved is not blamed on Redis.
    pub(super) fn new(
        store: Store,
        prefix: &str,
        breakers: Arc<Breakers>,
        metrics: Arc<Metrics>,
        lag: Arc<Lag>,
    ) -> Self {
        let batcher = (!store.is_cluster()).then(|| {
            Arc::new(Batcher {
                store: store.clone(),
                breakers: breakers.clone(),
                metrics: metrics.clone(),
                lag: lag.clone(),
                queue: Mutex::new(Queue::default()),
            })
        });
        Self {
            store,
            prefix: prefix.to_string(),
            breakers,
            batcher,
            metrics,
            lag,
            random: ring::rand::SystemRandom::new(),
            leases: Leases::new(),
        }
    }

    /// The Redis key whose hash tag holds `content`.
    pub(super) fn key(&self, content: &str) -> String {
        Store::key(&self.prefix, content)
    }

    /// A new grant id: 128 bits of the OS's random source, as 32 hex
    /// digits, so that no id tells another; `None` when the source fails
    /// (the units are then granted without a grant: nobody can refill them).
    pub(super) fn grant_id(&self) -> Option<String> {
        use ring::rand::SecureRandom as _;
        let mut b = [0u8; 16];
        self.random.fill(&mut b).ok()?;
        Some(b.iter().map(|x| format!("{x:02x}")).collect())
    }

    /// Decides each of `asks`: those of a limit that leases (`Some(size)`)
    /// and ask for no grant from this process's leases where they can
    /// ([`super::lease`]), the others in Redis ([`Decider::acquire`], each
    /// lease taken there with them); answers in order.
    pub(super) async fn decide(
        self: &Arc<Self>,
        asks: Vec<(Ask, Option<u64>)>,
    ) -> Vec<Result<Granted, Failed>> {
        enum At {
            Plain(usize),
            Lease(usize, Ask, String),
        }
        if asks
            .iter()
            .all(|(a, lease)| lease.is_none() || a.grant.is_some())
        {
            // Nothing to lease: as without leases, and nothing more.
            return self
                .acquire(asks.into_iter().map(|(a, _)| a).collect())
                .await;
        }
        let now = Instant::now();
        let mut out: Vec<Option<Result<Granted, Failed>>> = Vec::with_capacity(asks.len());
        let (mut redis, mut at) = (Vec::new(), Vec::new());
        for (i, (ask, lease)) in asks.into_iter().enumerate() {
            out.push(None);
            let local = match lease {
                Some(size) if ask.grant.is_none() => self.leased(&ask, size).await,
                _ => Local::Redis,
            };
            match local {
                Local::Decided(g) => {
                    self.metrics.leased_decisions.inc();
                    out[i] = Some(Ok(g));
                }
                Local::DecidedTakeNext(g, size) => {
                    self.metrics.leased_decisions.inc();
                    out[i] = Some(Ok(g));
                    self.take_next(&ask, size);
                }
                Local::Take { size } => {
                    let id = self.grant_id();
                    let Some(id) = id else {
                        // No random id, no lease: decided in Redis.
                        self.leases
                            .took(&ask.key, ask.limit, "", None, 0, true, now);
                        redis.push(ask);
                        at.push(At::Plain(i));
                        continue;
                    };
                    redis.push(lease_of(&ask, size, &id));
                    at.push(At::Lease(i, ask, id));
                }
                Local::Redis | Local::Wait => {
                    redis.push(ask);
                    at.push(At::Plain(i));
                }
            }
        }
        if !redis.is_empty() {
            let decided = self.acquire(redis).await;
            let now = Instant::now();
            for (r, at) in decided.into_iter().zip(at) {
                match at {
                    At::Plain(i) => out[i] = Some(r),
                    At::Lease(i, ask, id) => {
                        let got = r.as_ref().ok().copied();
                        if got.is_some() {
                            self.metrics.leases.inc();
                        }
                        let d = self
                            .leases
                            .took(&ask.key, ask.limit, &id, got, ask.amount, ask.whole, now);
                        out[i] = Some(match (d, r) {
                            (Some(g), _) => {
                                self.metrics.leased_decisions.inc();
                                Ok(g)
                            }
                            (None, Err(e)) => Err(e),
                            (None, Ok(g)) => Ok(g),
                        });
                    }
                }
            }
        }
        self.metrics.leased_units.set(self.leases.held() as i64);
        out.into_iter()
            .map(|r| r.expect("every ask is answered"))
            .collect()
    }

    /// Takes the next lease of `ask`'s key (`size` units) in a task of its
    /// own, so that the acquire whose answer asked for it does not wait for
    /// Redis. One taken as the service stops may be held past
    /// [`Leases::end_all`]: its units then come back as the limit refills.
    fn take_next(self: &Arc<Self>, ask: &Ask, size: u64) {
        let Some(id) = self.grant_id() else {
            self.leases
                .took(&ask.key, ask.limit, "", None, 0, true, Instant::now());
            return;
        };
        let lease = lease_of(ask, size, &id);
        let me = self.clone();
        tokio::spawn(async move {
            let (key, limit) = (lease.key.clone(), lease.limit);
            let got = me.acquire(vec![lease]).await.pop().and_then(Result::ok);
            if got.is_some() {
                me.metrics.leases.inc();
            }
            me.leases
                .took(&key, limit, &id, got, 0, true, Instant::now());
            me.metrics.leased_units.set(me.leases.held() as i64);
        });
    }

    /// What the leases decide for `ask` (of a limit leased `size` at a
    /// time): an acquire that meets a lease being taken waits for it, once,
    /// at most [`super::lease::WAIT`], then asks again.
    async fn leased(&self, ask: &Ask, size: u64) -> Local {
        let changed = self.leases.changed().notified();
        tokio::pin!(changed);
        changed.as_mut().enable();
        let local = self
            .leases
            .decide(&ask.key, ask.limit, size, ask.amount, Instant::now());
        if local != Local::Wait {
            return local;
        }
        let _ = tokio::time::timeout(super::lease::WAIT, changed).await;
        match self
            .leases
            .decide(&ask.key, ask.limit, size, ask.amount, Instant::now())
        {
            Local::Wait => Local::Redis,
            other => other,
        }
    }

    /// Gives back what the leases ended by `now` did not use, each through
    /// its grant's refill (a failure leaves the units taken: toward
    /// limiting). Units given back.
    pub(super) async fn end_leases(&self, ended: Vec<Ended>) -> u64 {
        let mut back = 0;
        for e in ended {
            if e.unused == 0 {
                continue;
            }
            match self.refill(&e.key, &e.id, LEASE_OWNER, e.unused).await {
                Ok(r) => back += r.refunded,
                Err(e) => {
                    tracing::debug!(error = %e, "a lease's unused units could not be given back")
                }
            }
        }
        self.metrics.lease_returned.inc_by(back);
        self.metrics.leased_units.set(self.leases.held() as i64);
        back
    }

    /// Decides each of `asks` in Redis (keys in any slots); answers in order.
    pub(super) async fn acquire(&self, asks: Vec<Ask>) -> Vec<Result<Granted, Failed>> {
        if let Some(b) = &self.batcher {
            if let Err(t) = self.breakers.check(0) {
                self.metrics.rejected(t.label, asks.len() as u64);
                return asks.iter().map(|_| Err(Failed::Down(t.clone()))).collect();
            }
            return b.submit(asks).await;
        }
        // A Cluster: one call per slot, the slots at once.
        let mut by_slot: BTreeMap<u16, Vec<usize>> = BTreeMap::new();
        for (i, a) in asks.iter().enumerate() {
            by_slot
                .entry(ratelimit_redis::slot(&a.key))
                .or_default()
                .push(i);
        }
        let mut out: Vec<Option<Result<Granted, Failed>>> = vec![None; asks.len()];
        let mut calls = Vec::new();
        for (slot, idx) in by_slot {
            if let Err(t) = self.breakers.check(slot) {
                self.metrics.rejected(t.label, idx.len() as u64);
                for i in idx {
                    out[i] = Some(Err(Failed::Down(t.clone())));
                }
                continue;
            }
            for chunk in idx.chunks(MAX_BATCH) {
                let group: Vec<Ask> = chunk.iter().map(|&i| asks[i].clone()).collect();
                let chunk = chunk.to_vec();
                calls.push(async move {
                    let r = call(&self.store, &self.metrics, &self.lag, &group).await;
                    if let Err(Failed::Redis(e)) = &r {
                        self.breakers.failed(slot, e);
                    }
                    (chunk, r)
                });
            }
        }
        for (chunk, r) in futures_util::future::join_all(calls).await {
            match r {
                Ok(granted) => {
                    for (i, g) in chunk.into_iter().zip(granted) {
                        out[i] = Some(Ok(g));
                    }
                }
                Err(e) => {
                    for i in chunk {
                        out[i] = Some(Err(e.clone()));
                    }
                }
            }
        }
        out.into_iter()
            .map(|r| r.expect("every key is answered"))
            .collect()
    }

    /// Refills the grant `id` of the Redis key `key` (see
    /// [`Store::refill_grant`]).
    pub(super) async fn refill(
        &self,
        key: &str,
        id: &str,
        owner: &str,
        unused: u64,
    ) -> Result<Refilled, Failed> {
        let slot = ratelimit_redis::slot(key);
        self.down(slot)?;
        let start = Instant::now();
        let r = timed(
            &self.metrics,
            self.store.refill_grant(key, id, owner, unused),
        )
        .await;
        self.settle(slot, start, r)
    }

    /// Gives back `amount` of the Redis key `key` (see
    /// [`Store::refund_key`]).
    pub(super) async fn refund_key(
        &self,
        key: &str,
        limit: Option<&Limit>,
        amount: u64,
    ) -> Result<Refunded, Failed> {
        let slot = ratelimit_redis::slot(key);
        self.down(slot)?;
        let start = Instant::now();
        let r = timed(&self.metrics, self.store.refund_key(key, limit, amount)).await;
        self.settle(slot, start, r)
    }

    fn down(&self, slot: u16) -> Result<(), Failed> {
        self.breakers.check(slot).map_err(|t| {
            self.metrics.rejected(t.label, 1);
            Failed::Down(t)
        })
    }

    fn settle<T>(&self, slot: u16, start: Instant, r: Result<T, RedisError>) -> Result<T, Failed> {
        match r {
            Ok(v) => {
                self.metrics.wrote();
                Ok(v)
            }
            Err(e) => {
                let f = blame(&self.metrics, &self.lag, start, e, 1);
                if let Failed::Redis(e) = &f {
                    self.breakers.failed(slot, e);
                }
                Err(f)
            }
        }
    }

    /// Whether decisions succeed (for `/healthz`): while a breaker is open,
    /// what it knows, at once; otherwise the decision script's write,
    /// recorded in the metrics.
    pub(super) async fn check(&self) -> Result<(), Failed> {
        if let Some(t) = self.breakers.first_open() {
            return Err(Failed::Down(t));
        }
        let start = Instant::now();
        let r = self.store.probe(&self.prefix).await;
        self.metrics
            .redis_latency
            .observe(start.elapsed().as_secs_f64());
        match r {
            Ok(()) => {
                self.metrics.wrote();
                Ok(())
            }
            Err(e) => Err(blame(&self.metrics, &self.lag, start, e, 1)),
        }
    }
}

async fn timed<T>(
    metrics: &Metrics,
    call: impl Future<Output = Result<T, RedisError>>,
) -> Result<T, RedisError> {
    let start = Instant::now();
    metrics.redis_calls.inc();
    let r = call.await;
    metrics.redis_latency.observe(start.elapsed().as_secs_f64());
    r
}

/// Whose fault the failed call begun at `start` is, counted for its `keys`:
/// a timeout (or a call Redis reached past its deadline) while the service
/// was starved ([`Lag::starved_since`]) is the service's; anything else is
/// Redis's.
fn blame(metrics: &Metrics, lag: &Lag, start: Instant, e: RedisError, keys: u64) -> Failed {
    if matches!(e, RedisError::TimedOut(_) | RedisError::Late { .. })
        && let Some(late) = lag.starved_since(start)
    {
        metrics.starved_calls.inc();
        tracing::debug!(late_ms = late.as_millis() as u64, error = %e, "serve: a Redis call timed out while the service was starved: not blamed on Redis");
        return Failed::Starved {
            late,
            error: Arc::new(e),
        };
    }
    metrics.failed_keys(&e, keys);
    Failed::Redis(Arc::new(e))
}

/// One acquire call, timed and counted.
async fn call(
    store: &Store,
    metrics: &Metrics,
    lag: &Lag,
    asks: &[Ask],
) -> Result<Vec<Granted>, Failed> {
    metrics.batch_keys.observe(asks.len() as f64);
    let start = Instant::now();
    match timed(metrics, store.acquire_many(asks)).await {
        Ok(g) => {
            if g.iter().any(|g| g.granted > 0) {
                metrics.wrote();
            }
            Ok(g)
        }
        Err(e) => Err(blame(metrics, lag, start, e, asks.len() as u64)),
    }
}

struct Pending {
    ask: Ask,
    reply: oneshot::Sender<Result<Granted, Failed>>,
}

#[derive(Default)]
struct Queue {
    waiting: Vec<Pending>,
    in_flight: usize,
}

/// Acquires to one Redis server, sharing calls when calls are in flight.
struct Batcher {
    store: Store,
    breakers: Arc<Breakers>,
    metrics: Arc<Metrics>,
    lag: Arc<Lag>,
    queue: Mutex<Queue>,
}

impl Batcher {
    fn queue(&self) -> std::sync::MutexGuard<'_, Queue> {
        self.queue.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn take(q: &mut Queue) -> Vec<Pending> {
        let n = q.waiting.len().min(MAX_BATCH);
        q.waiting.drain(..n).collect()
    }

    async fn submit(self: &Arc<Self>, asks: Vec<Ask>) -> Vec<Result<Granted, Failed>> {
        let mut replies = Vec::with_capacity(asks.len());
        let lead = {
            let mut q = self.queue();
            for ask in asks {
                let (reply, rx) = oneshot::channel();
                q.waiting.push(Pending { ask, reply });
                replies.push(rx);
            }
            (q.in_flight < IN_FLIGHT).then(|| {
                q.in_flight += 1;
                Self::take(&mut q)
            })
        };
        if let Some(batch) = lead {
            self.run(batch).await;
            // What came meanwhile is sent by a task of its own: this
            // request's answer is ready.
            if let Some(next) = self.next() {
                let me = self.clone();
                tokio::spawn(async move { me.drain(next).await });
            }
        }
        let mut out = Vec::with_capacity(replies.len());
        for rx in replies {
            out.push(rx.await.unwrap_or_else(|_| {
                Err(Failed::Redis(Arc::new(RedisError::Url(
                    "the call deciding this key was dropped".into(),
                ))))
            }));
        }
        out
    }

    /// The next batch, or the end of this lead.
    fn next(&self) -> Option<Vec<Pending>> {
        let mut q = self.queue();
        if q.waiting.is_empty() {
            q.in_flight -= 1;
            None
        } else {
            Some(Self::take(&mut q))
        }
    }

    async fn drain(self: Arc<Self>, mut batch: Vec<Pending>) {
        loop {
            self.run(batch).await;
            match self.next() {
                Some(b) => batch = b,
                None => return,
            }
        }
    }

    async fn run(&self, batch: Vec<Pending>) {
        let (asks, replies): (Vec<Ask>, Vec<_>) =
            batch.into_iter().map(|p| (p.ask, p.reply)).unzip();
        if let Err(t) = self.breakers.check(0) {
            self.metrics.rejected(t.label, replies.len() as u64);
            for reply in replies {
                let _ = reply.send(Err(Failed::Down(t.clone())));
            }
            return;
        }
        match call(&self.store, &self.metrics, &self.lag, &asks).await {
            Ok(granted) => {
                for (reply, g) in replies.into_iter().zip(granted) {
                    let _ = reply.send(Ok(g));
                }
            }
            Err(f) => {
                if let Failed::Redis(e) = &f {
                    self.breakers.failed(0, e);
                }
                for reply in replies {
                    let _ = reply.send(Err(f.clone()));
                }
            }
        }
    }
}

/// The owner a grant's record holds for `tenant` (`None`: the open mode,
/// where anyone may refill): a digest of the tenant's name, one word.
pub(super) fn owner_of(tenant: Option<&str>) -> String {
    match tenant {
        None => "-".into(),
        Some(name) => {
            let d =
                ring::digest::digest(&ring::digest::SHA256, format!("tenant\0{name}").as_bytes());
            d.as_ref()[..12]
                .iter()
                .map(|x| format!("{x:02x}"))
                .collect()
        }
    }
}

/// What a caller is given for a grant: `ID.TEXT`, the id and the key's
/// hash-tag text in base64url (no padding).
pub(super) fn grant_token(id: &str, content: &str) -> String {
    format!("{id}.{}", base64url(content.as_bytes()))
}

/// A grant token's id and hash-tag text; `None` if it is not one (an id
/// of 32 hex digits; 16, those of versions before ids were random, is
/// still taken while such grants last).
pub(super) fn parse_grant(token: &str) -> Option<(&str, String)> {
    let (id, text) = token.split_once('.')?;
    if !matches!(id.len(), 16 | 32) || !id.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    String::from_utf8(unbase64url(text)?).ok().map(|c| (id, c))
}

const B64: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";

fn base64url(data: &[u8]) -> String {
    let mut out = String::with_capacity(data.len().div_ceil(3) * 4);
    for chunk in data.chunks(3) {
        let b = [
            chunk[0],
            chunk.get(1).copied().unwrap_or(0),
            chunk.get(2).copied().unwrap_or(0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..=chunk.len() {
            out.push(B64[(n >> (18 - 6 * i) & 63) as usize] as char);
        }
    }
    out
}

fn unbase64url(text: &str) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(text.len() * 3 / 4);
    let (mut acc, mut bits) = (0u32, 0u32);
    for c in text.bytes() {
        let v = B64.iter().position(|&b| b == c)? as u32;
        acc = (acc << 6) | v;
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
            acc &= (1 << bits) - 1;
        }
    }
    // Leftover bits must be the padding's zeros.
    (acc == 0 && bits < 6).then_some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn count(m: &Metrics, cause: &'static str) -> u64 {
        m.redis_errors
            .get_or_create(&super::super::metrics::Cause { cause })
            .get()
    }

    /// A call that timed out while the service was starved is the
    /// service's: not counted as Redis's error, not a cause to open the
    /// breaker; the same call on time is Redis's. Errors that are not
    /// timeouts are Redis's whatever the service's state.
    #[test]
    fn a_timeout_is_blamed_on_redis_only_when_the_service_ran_on_time() {
        let m = Metrics::new();
        let late = || RedisError::Late {
            late: std::time::Duration::from_millis(5),
        };
        let lag = Lag::new();
        // Never woken since it was made, 150 ms ago: starved now.
        std::thread::sleep(std::time::Duration::from_millis(150));
        let start = Instant::now();
        let f = blame(&m, &lag, start, late(), 3);
        assert!(matches!(f, Failed::Starved { .. }), "{f}");
        assert!(f.to_string().contains("too busy to hear Redis"), "{f}");
        assert_eq!(m.starved_calls.get(), 1);
        assert_eq!(count(&m, "late"), 0, "not Redis's error");
        let f = blame(&m, &lag, start, RedisError::Url("broken".into()), 2);
        assert!(matches!(f, Failed::Redis(_)), "not a timeout: {f}");
        assert_eq!(count(&m, "other"), 2);

        // On time: the watch has just woken, without delay.
        lag.woke(std::time::Duration::ZERO);
        let f = blame(&m, &lag, Instant::now(), late(), 3);
        assert!(matches!(f, Failed::Redis(_)), "{f}");
        assert_eq!(count(&m, "late"), 3, "Redis's error, once per key");
        assert_eq!(m.starved_calls.get(), 1);
    }

    #[test]
    fn grant_tokens_round_trip() {
        for text in [
            "",
            "a",
            "ab",
            "abc",
            "d:shop/user=42",
            "t:x/\u{e9}\u{1f600}",
        ] {
            let t = grant_token("0123456789abcdef", text);
            assert_eq!(
                parse_grant(&t),
                Some(("0123456789abcdef", text.to_string())),
                "{t}"
            );
        }
        assert_eq!(base64url(b"hello"), "aGVsbG8");
        assert_eq!(
            parse_grant("0123456789abcdef.aGVsbG9"),
            None,
            "bad leftover bits"
        );
        assert_eq!(parse_grant("xyz.aGVsbG8"), None);
        assert_eq!(parse_grant("0123456789abcdef.a+b"), None);
    }
}
