//! An in-process limiter for applications' own keys (logins per user, API calls
//! per client): any hashable key, any of the algorithms, an injectable clock,
//! bounded memory, thread-safe. The same `decide` functions the XDP program runs.
//!
//! ```
//! use std::time::Duration;
//! use ratelimit_common::keyed::{Algorithm, FakeClock, Limiter};
//!
//! // 5 logins per user per minute (a burst of 5, refilled continuously).
//! let clock = FakeClock::default();
//! let logins: Limiter<&str, FakeClock> =
//!     Limiter::with_clock(Algorithm::per(5, Duration::from_secs(60), 5).unwrap(), 10_000, clock.clone());
//! for _ in 0..5 {
//!     assert!(logins.check(&"alice"));
//! }
//! assert!(!logins.check(&"alice"));
//! assert!(logins.check(&"bob"));
//! clock.advance(Duration::from_secs(12));
//! assert!(logins.check(&"alice"));
//! ```
//!
//! Exactness: each key's state is updated under its shard's lock, so any number
//! of threads on one key admit exactly what one serial run admits. Memory: at
//! most `max_keys` keys are kept; when a shard is full, its least recently used
//! keys are dropped (a dropped key starts again with a full bucket or an empty
//! window — choose `max_keys` above the number of keys active at once).

extern crate std;

use std::{
    boxed::Box,
    collections::HashMap,
    hash::{BuildHasher, Hash, RandomState},
    sync::{
        Arc, Mutex,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, Instant},
    vec::Vec,
};

use crate::{
    Decision, ParamError,
    dispatch::{self, Op, Ops as _},
    fixed_window, gcra, interval, rolling_quota, sliding_log, sliding_window,
};

/// A monotonic clock in ns.
pub trait Clock: Send + Sync {
    /// Nanoseconds since an arbitrary fixed point; never goes backwards.
    fn now_ns(&self) -> u64;
}

/// The process's monotonic clock.
#[derive(Clone, Debug)]
pub struct MonotonicClock(Instant);

impl Default for MonotonicClock {
    fn default() -> Self {
        Self(Instant::now())
    }
}

impl Clock for MonotonicClock {
    fn now_ns(&self) -> u64 {
        // Start at one second so that "now − window" never saturates at 0 early.
        1_000_000_000 + self.0.elapsed().as_nanos() as u64
    }
}

/// A clock advanced by hand, for tests and simulations. Clones share the time.
#[derive(Clone, Debug, Default)]
pub struct FakeClock(Arc<AtomicU64>);

impl FakeClock {
    /// Moves the clock forward.
    pub fn advance(&self, by: Duration) {
        self.0.fetch_add(by.as_nanos() as u64, Ordering::SeqCst);
    }

    /// Sets the clock.
    pub fn set(&self, ns: u64) {
        self.0.store(ns, Ordering::SeqCst);
    }
}

impl Clock for FakeClock {
    fn now_ns(&self) -> u64 {
        self.0.load(Ordering::SeqCst)
    }
}

/// An algorithm with its parameters.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Algorithm {
    /// Token bucket, greedy refill (GCRA).
    Gcra(gcra::Params),
    /// Token bucket, interval refill.
    Interval(interval::Params),
    /// Fixed window counter.
    FixedWindow(fixed_window::Params),
    /// Sliding window log.
    SlidingLog(sliding_log::Params),
    /// Sliding window counter.
    SlidingWindow(sliding_window::Params),
    /// Rolling-window quota with a rate cap.
    RollingQuota(rolling_quota::Params),
}

impl Algorithm {
    /// `count` per `per`, with a burst of `burst` (GCRA).
    pub fn per(count: u64, per: Duration, burst: u64) -> Result<Self, ParamError> {
        gcra::Params::from_rate(count, per.as_nanos() as u64, burst)
            .map(Self::Gcra)
            .map_err(|e| ParamError {
                param: match e {
                    gcra::ParamsError::PeriodZero => "per",
                    gcra::ParamsError::RateTooHigh => "count",
                    _ => "burst",
                },
                accepted: e.message(),
            })
    }

    /// The most one arrival can ever be granted at once.
    pub fn capacity(&self) -> u64 {
        match self {
            Algorithm::Gcra(p) => p.capacity,
            Algorithm::Interval(p) => p.capacity,
            Algorithm::FixedWindow(p) => p.limit,
            Algorithm::SlidingLog(p) => p.limit,
            Algorithm::SlidingWindow(p) => p.limit,
            Algorithm::RollingQuota(p) => p.rate_cap,
        }
    }
}

/// A key's state, for whichever algorithm.
#[derive(Clone, Debug)]
enum AnyState {
    Gcra(gcra::State),
    Interval(interval::State),
    FixedWindow(fixed_window::State),
    SlidingLog(Box<sliding_log::State>),
    SlidingWindow(sliding_window::State),
    RollingQuota(Box<rolling_quota::State>),
}

impl AnyState {
    fn new(a: &Algorithm, now: u64) -> Self {
        match a {
            Algorithm::Gcra(p) => Self::Gcra(gcra::State::full(now, p)),
            Algorithm::Interval(_) => Self::Interval(Default::default()),
            Algorithm::FixedWindow(_) => Self::FixedWindow(Default::default()),
            Algorithm::SlidingLog(_) => Self::SlidingLog(Box::default()),
            Algorithm::SlidingWindow(_) => Self::SlidingWindow(Default::default()),
            Algorithm::RollingQuota(_) => Self::RollingQuota(Box::default()),
        }
    }

    /// `op` on this state by the limiter's algorithm: the one dispatch of
    /// [`Limiter::decide`], [`Limiter::acquire`] and [`Limiter::refund`].
    fn apply(&mut self, a: &Algorithm, op: Op, now: u64, cost: u64) -> Decision {
        match (self, a) {
            (Self::Gcra(s), Algorithm::Gcra(p)) => dispatch::Gcra::apply(op, s, p, now, cost),
            (Self::Interval(s), Algorithm::Interval(p)) => {
                dispatch::Interval::apply(op, s, p, now, cost)
            }
            (Self::FixedWindow(s), Algorithm::FixedWindow(p)) => {
                dispatch::FixedWindow::apply(op, s, p, now, cost)
            }
            (Self::SlidingLog(s), Algorithm::SlidingLog(p)) => {
                dispatch::SlidingLog::apply(op, s, p, now, cost)
            }
            (Self::SlidingWindow(s), Algorithm::SlidingWindow(p)) => {
                dispatch::SlidingWindow::apply(op, s, p, now, cost)
            }
            (Self::RollingQuota(s), Algorithm::RollingQuota(p)) => {
                dispatch::RollingQuota::apply(op, s, p, now, cost)
            }
            _ => unreachable!("a key's state always matches the limiter's algorithm"),
        }
    }
}

/// What [`Limiter::acquire`] granted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Grant {
    /// Units granted now: from 0 up to what was asked.
    pub granted: u64,
    /// When more was asked than granted: how long until the whole request would
    /// be granted, if nothing else came. `None` when all was granted, or when the
    /// request can never be granted at once (more than the capacity).
    pub retry_after: Option<Duration>,
}

struct Entry {
    state: AnyState,
    used: u64,
}

struct Shard<K> {
    keys: HashMap<K, Entry>,
    tick: u64,
}

/// Shards: keys are spread over this many locks.
const SHARDS: usize = 16;

/// A keyed, thread-safe limiter with bounded memory.
pub struct Limiter<K, C: Clock = MonotonicClock> {
    algorithm: Algorithm,
    clock: C,
    shards: Vec<Mutex<Shard<K>>>,
    per_shard: usize,
    hasher: RandomState,
}

impl<K: Hash + Eq + Clone> Limiter<K, MonotonicClock> {
    /// A limiter on the process's monotonic clock, keeping at most `max_keys` keys.
    pub fn new(algorithm: Algorithm, max_keys: usize) -> Self {
        Self::with_clock(algorithm, max_keys, MonotonicClock::default())
    }
}

impl<K: Hash + Eq + Clone, C: Clock> Limiter<K, C> {
    /// A limiter on `clock`, keeping at most `max_keys` keys (at least 16).
    pub fn with_clock(algorithm: Algorithm, max_keys: usize, clock: C) -> Self {
        let per_shard = max_keys.div_ceil(SHARDS).max(1);
        Self {
            algorithm,
            clock,
            shards: (0..SHARDS)
                .map(|_| {
                    Mutex::new(Shard {
                        keys: HashMap::new(),
                        tick: 0,
                    })
                })
                .collect(),
            per_shard,
            hasher: RandomState::new(),
        }
    }

    /// The most keys kept at once.
    pub fn max_keys(&self) -> usize {
        self.per_shard * SHARDS
    }

    /// Keys kept now.
    pub fn len(&self) -> usize {
        self.shards
            .iter()
            .map(|s| s.lock().unwrap_or_else(|e| e.into_inner()).keys.len())
            .sum()
    }

    /// Whether no key is kept.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn with_state<R>(&self, key: &K, f: impl FnOnce(&mut AnyState, u64) -> R) -> R {
        let shard = &self.shards[(self.hasher.hash_one(key) as usize) % SHARDS];
        let mut shard = shard.lock().unwrap_or_else(|e| e.into_inner());
        let now = self.clock.now_ns();
        shard.tick += 1;
        let tick = shard.tick;
        if !shard.keys.contains_key(key) && shard.keys.len() >= self.per_shard {
            evict(&mut shard.keys, self.per_shard);
        }
        let algorithm = &self.algorithm;
        let entry = shard.keys.entry(key.clone()).or_insert_with(|| Entry {
            state: AnyState::new(algorithm, now),
            used: tick,
        });
        entry.used = tick;
        f(&mut entry.state, now)
    }

    /// Decides one arrival of `cost` for `key`.
    pub fn decide(&self, key: &K, cost: u64) -> Decision {
        let algorithm = self.algorithm;
        self.with_state(key, |s, now| s.apply(&algorithm, Op::Decide, now, cost))
    }

    /// Whether one more arrival of `key` is allowed now (and counts it if so).
    pub fn check(&self, key: &K) -> bool {
        self.decide(key, 1).allowed
    }

    /// Asks for `n` units before the work they pay for (a client asking a
    /// throttling service for tokens): grants all of them if it can, else as
    /// many as are available now (possibly 0), and says when the whole request
    /// would be granted.
    pub fn acquire(&self, key: &K, n: u64) -> Grant {
        let algorithm = self.algorithm;
        self.with_state(key, |s, now| {
            let whole = s.apply(&algorithm, Op::Decide, now, n);
            if whole.allowed {
                return Grant {
                    granted: n,
                    retry_after: None,
                };
            }
            let part = whole.remaining.min(n);
            let granted = if part > 0 && s.apply(&algorithm, Op::Decide, now, part).allowed {
                part
            } else {
                0
            };
            Grant {
                granted,
                retry_after: (whole.retry_after_ns != crate::NEVER)
                    .then(|| Duration::from_nanos(whole.retry_after_ns)),
            }
        })
    }

    /// Gives back `n` units acquired but not used (the work they were for
    /// turned out smaller, or did not happen).
    /// A bucket or window never ends up holding more than its capacity.
    pub fn refund(&self, key: &K, n: u64) {
        let algorithm = self.algorithm;
        self.with_state(key, |s, now| {
            s.apply(&algorithm, Op::Refund, now, n);
        });
    }
}

/// Drops the least recently used eighth of a full shard.
fn evict<K: Hash + Eq + Clone>(keys: &mut HashMap<K, Entry>, cap: usize) {
    let drop = (cap / 8).max(1);
    let mut ages: Vec<u64> = keys.values().map(|e| e.used).collect();
    let cut_at = drop.min(ages.len()) - 1;
    let (_, cut, _) = ages.select_nth_unstable(cut_at);
    let cut = *cut;
    keys.retain(|_, e| e.used > cut);
}

#[cfg(test)]
mod tests {
    use std::{sync::Arc, thread};

    use super::*;

    const S: Duration = Duration::from_secs(1);

    #[test]
    fn many_threads_on_one_key_admit_exactly_the_limit() {
        for algorithm in [
            Algorithm::per(1, S, 5000).unwrap(),
            Algorithm::Interval(interval::Params::new(3600 * 1_000_000_000, 1, 5000).unwrap()),
            Algorithm::FixedWindow(fixed_window::Params::new(3600 * 1_000_000_000, 5000).unwrap()),
            Algorithm::SlidingLog(sliding_log::Params::new(3600 * 1_000_000_000, 64).unwrap()),
            Algorithm::SlidingWindow(
                sliding_window::Params::new(3600 * 1_000_000_000, 5000).unwrap(),
            ),
            Algorithm::RollingQuota(
                rolling_quota::Params::new(3600 * 1_000_000_000, 60 * 1_000_000_000, 5000, 3000)
                    .unwrap(),
            ),
        ] {
            let clock = FakeClock::default();
            clock.set(1_000_000_000);
            let l: Arc<Limiter<&str, FakeClock>> =
                Arc::new(Limiter::with_clock(algorithm, 1000, clock));
            let admitted: u64 = (0..8)
                .map(|_| {
                    let l = l.clone();
                    thread::spawn(move || (0..2000).filter(|_| l.check(&"k")).count() as u64)
                })
                .collect::<Vec<_>>()
                .into_iter()
                .map(|h| h.join().unwrap())
                .sum();
            assert_eq!(admitted, algorithm.capacity(), "{algorithm:?}");
        }
    }

    #[test]
    fn acquire_grants_what_is_there_and_says_when_the_rest_comes() {
        let clock = FakeClock::default();
        let l: Limiter<&str, FakeClock> =
            Limiter::with_clock(Algorithm::per(10, S, 10).unwrap(), 100, clock.clone());
        assert_eq!(l.acquire(&"a", 6).granted, 6);
        let g = l.acquire(&"a", 6);
        assert_eq!(g.granted, 4);
        // All of 6 would be there after 6 intervals of 100 ms.
        assert_eq!(g.retry_after, Some(Duration::from_millis(200)));
        let g = l.acquire(&"a", 11);
        assert_eq!(
            (g.granted, g.retry_after),
            (0, None),
            "more than the capacity, never at once"
        );
    }

    #[test]
    fn refund_never_lifts_a_bucket_above_capacity() {
        let clock = FakeClock::default();
        for algorithm in [
            Algorithm::per(10, S, 10).unwrap(),
            Algorithm::Interval(interval::Params::new(1_000_000_000, 10, 10).unwrap()),
            Algorithm::FixedWindow(fixed_window::Params::new(1_000_000_000, 10).unwrap()),
            Algorithm::SlidingLog(sliding_log::Params::new(1_000_000_000, 10).unwrap()),
            Algorithm::SlidingWindow(sliding_window::Params::new(1_000_000_000, 10).unwrap()),
            Algorithm::RollingQuota(
                rolling_quota::Params::new(1_000_000_000, 1_000_000_000, 10, 10).unwrap(),
            ),
        ] {
            clock.set(5_000_000_000);
            let l: Limiter<&str, FakeClock> = Limiter::with_clock(algorithm, 100, clock.clone());
            assert_eq!(l.acquire(&"k", 4).granted, 4, "{algorithm:?}");
            l.refund(&"k", 100);
            let admitted = (0..20).filter(|_| l.check(&"k")).count();
            assert_eq!(
                admitted, 10,
                "{algorithm:?}: a refund lifted the bucket above its capacity"
            );
        }
    }

    #[test]
    fn memory_stays_bounded_over_a_million_keys() {
        let l: Limiter<u64, FakeClock> = Limiter::with_clock(
            Algorithm::per(1, S, 1).unwrap(),
            10_000,
            FakeClock::default(),
        );
        for k in 0..1_000_000u64 {
            l.decide(&k, 1);
        }
        assert!(
            l.len() <= l.max_keys(),
            "{} keys kept, at most {}",
            l.len(),
            l.max_keys()
        );
        assert!(l.len() >= l.max_keys() / 2);
        // The most recent keys are still there: their buckets are drained.
        assert!(!l.decide(&999_999, 1).allowed);
    }
}
