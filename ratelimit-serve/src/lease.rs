//! Hot keys decided in the service: a limit with `lease = N` in the
//! server's config takes, for a key asked for at least `N` units within a
//! [`LEASE_TIME`], a lease of `N` units from Redis (one acquire, recorded as
//! a grant of this process), and decides that key's next acquires from it
//! without asking Redis. What a lease did not use goes back when it ends,
//! through its grant's refill, so Redis's bucket gets it back as a refill of
//! any grant would.
//!
//! A lease Redis could not fill whole tells how long until it could: until
//! then, what the leases do not hold is denied here (with that retry
//! time), so a key over its limit costs Redis a call per lease time's
//! refill, not one per acquire.
//!
//! A key stays hot while it was asked for a lease's worth within this
//! window or the one before. The next lease of a hot key is taken when
//! what is held falls under half a lease, in a task beside the acquire
//! that saw it, so the acquires after it are decided without waiting for
//! Redis.
//!
//! Only acquires that ask for no grant are decided so (gRPC's, and HTTP's
//! with `"grant": false`): an acquire with a grant is decided in Redis as
//! before, so that its refill stays exact. An acquire that meets a lease
//! being taken while nothing is held waits for it (at most [`WAIT`]) and is
//! decided from it. An acquire larger than a lease, and every key once
//! [`MAX_KEYS`] are followed, go to Redis too.
//!
//! # The bound
//! A replica holds at most `2·N` units of a key at once (what is left of its
//! last lease, below the acquire that needed more or below half a lease
//! when it is taken ahead, and the new one). So with
//! `C` replicas leasing a key of rate `R` and burst `B`, over any window `t`
//! the replicas together admit at most `B + R·t + min(2·C·N, R·L)` (`L` =
//! [`LEASE_TIME`]: see `ratelimit_redis::lease_bound`), and never more than
//! `B + R·t` from a start with nothing held: leasing moves admissions
//! earlier, it adds none.

use std::{
    collections::{HashMap, VecDeque},
    sync::{Mutex, PoisonError},
    time::{Duration, Instant},
};

use ratelimit_redis::{Granted, Limit};

/// How long a lease's units may be used: then what is left goes back.
pub(super) const LEASE_TIME: Duration = Duration::from_secs(1);

/// How long an acquire waits for a lease being taken before it asks Redis
/// itself.
pub(super) const WAIT: Duration = Duration::from_millis(250);

/// Keys followed at most (each a few hundred bytes); past it, a new key is
/// decided in Redis until an idle one is forgotten.
pub(super) const MAX_KEYS: usize = 100_000;

/// What the leases decide for one acquire.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Local {
    /// Decided from a lease held.
    Decided(Granted),
    /// Decided from a lease held, which runs low: take the next lease of
    /// `size` units now, beside the answer ([`Leases::took`] with nothing
    /// to decide), so that the acquires after it find it held.
    DecidedTakeNext(Granted, u64),
    /// Take a lease of `size` units for the key under the grant `id`, then
    /// decide ([`Leases::took`]).
    Take { size: u64 },
    /// A lease of the key is being taken: wait for it ([`Leases::changed`]),
    /// then ask again.
    Wait,
    /// Decide in Redis as without leases.
    Redis,
}

/// A lease ended, to give back: its key, grant id and units not used.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct Ended {
    pub key: String,
    pub id: String,
    pub unused: u64,
}

struct Lease {
    id: String,
    left: u64,
    ends: Instant,
}

struct Key {
    limit: Limit,
    /// Units asked since `since` (a window of [`LEASE_TIME`]).
    asked: u64,
    since: Instant,
    /// Units asked in the window before (0 when it was not the last one).
    before: u64,
    /// Leases held, oldest first.
    leases: VecDeque<Lease>,
    /// A lease is being taken.
    taking: bool,
    /// Redis had less than a lease until then: what the leases do not hold
    /// is denied here until then, without asking again.
    short_until: Option<Instant>,
}

impl Key {
    fn new(limit: Limit, now: Instant) -> Self {
        Self {
            limit,
            asked: 0,
            since: now,
            before: 0,
            leases: VecDeque::new(),
            taking: false,
            short_until: None,
        }
    }

    /// Asked for at least a lease (`size`) within this window or the one
    /// before: a key that stays hot does not start over each window.
    fn hot(&self, size: u64) -> bool {
        self.asked >= size || self.before >= size
    }

    fn live(&self, now: Instant) -> u64 {
        self.leases
            .iter()
            .filter(|l| l.ends > now)
            .map(|l| l.left)
            .sum()
    }

    /// Takes `n` (at most what is live) from the oldest live leases.
    fn spend(&mut self, mut n: u64, now: Instant) {
        for l in self.leases.iter_mut().filter(|l| l.ends > now) {
            let t = n.min(l.left);
            l.left -= t;
            n -= t;
            if n == 0 {
                break;
            }
        }
    }
}

#[derive(Default)]
struct State {
    keys: HashMap<String, Key>,
    /// Units held in all (for the gauge).
    held: u64,
}

/// The leases of this process.
pub(super) struct Leases {
    state: Mutex<State>,
    /// Told when a lease taken was answered (or failed).
    changed: tokio::sync::Notify,
}

impl Leases {
    pub(super) fn new() -> Self {
        Self {
            state: Mutex::new(State::default()),
            changed: tokio::sync::Notify::new(),
        }
    }

    /// Told when a lease taken was answered: a [`Local::Wait`] waits on it
    /// (enabled before [`Leases::decide`], so no answer is missed).
    pub(super) fn changed(&self) -> &tokio::sync::Notify {
        &self.changed
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// An acquire of `amount` of `key` under `limit`, whose config leases
    /// `size` at a time, at `now`: decided here only if all of it is held
    /// (a partial grant waits for a lease, or for Redis).
    pub(super) fn decide(
        &self,
        key: &str,
        limit: Limit,
        size: u64,
        amount: u64,
        now: Instant,
    ) -> Local {
        let mut st = self.state();
        if !st.keys.contains_key(key) && st.keys.len() >= MAX_KEYS {
            return Local::Redis;
        }
        let k = st
            .keys
            .entry(key.to_string())
            .or_insert_with(|| Key::new(limit, now));
        if k.limit != limit {
            // Its limit changed: what the old leases hold ends now (given
            // back under the old limit's grant, which Redis then judges).
            k.limit = limit;
            for l in &mut k.leases {
                l.ends = now;
            }
        }
        let idle = now.duration_since(k.since);
        if idle >= LEASE_TIME {
            k.before = if idle < 2 * LEASE_TIME { k.asked } else { 0 };
            k.asked = 0;
            k.since = now;
        }
        k.asked = k.asked.saturating_add(amount);
        let live = k.live(now);
        let short = k.short_until.filter(|u| *u > now);
        if live >= amount {
            k.spend(amount, now);
            let g = Granted {
                allowed: true,
                granted: amount,
                remaining: live - amount,
                retry_after: None,
            };
            // Under half a lease left of a hot key: the next one is taken
            // now, while this one still decides. What is held then stays
            // under `1.5·size`.
            let next = 2 * (live - amount) < size && !k.taking && short.is_none() && k.hot(size);
            k.taking |= next;
            st.held -= amount;
            return if next {
                Local::DecidedTakeNext(g, size)
            } else {
                Local::Decided(g)
            };
        }
        if let Some(until) = short
            && amount <= size
        {
            // Redis had less than a lease a moment ago, and told how long it
            // needs to have one: asking before then would cost a call each.
            return Local::Decided(Granted {
                allowed: false,
                granted: 0,
                remaining: live,
                retry_after: Some(until - now),
            });
        }
        if k.taking && amount <= size {
            return Local::Wait;
        }
        if k.taking || amount > size || !k.hot(size) {
            return Local::Redis;
        }
        k.taking = true;
        Local::Take { size }
    }

    /// The lease of `key` taken under the grant `id` was answered `got` (or
    /// failed: `None`): its units held until [`LEASE_TIME`] from `now`, and
    /// the acquire that asked for it decided from them.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn took(
        &self,
        key: &str,
        limit: Limit,
        id: &str,
        got: Option<Granted>,
        amount: u64,
        whole: bool,
        now: Instant,
    ) -> Option<Granted> {
        let mut st = self.state();
        let k = st
            .keys
            .entry(key.to_string())
            .or_insert_with(|| Key::new(limit, now));
        k.taking = false;
        self.changed.notify_waiters();
        let g = got?;
        // Short of a lease: Redis says when it would have the rest.
        k.short_until = g.retry_after.map(|r| now + r);
        if g.granted > 0 {
            k.leases.push_back(Lease {
                id: id.to_string(),
                left: g.granted,
                ends: now + LEASE_TIME,
            });
        }
        let live = k.live(now);
        let take = if live >= amount {
            amount
        } else if whole {
            0
        } else {
            live
        };
        k.spend(take, now);
        st.held += g.granted;
        st.held -= take;
        Some(Granted {
            allowed: take == amount,
            granted: take,
            remaining: live - take,
            retry_after: if take == amount { None } else { g.retry_after },
        })
    }

    /// The leases ended by `now`, taken out (to give back), and the keys idle
    /// for two lease times forgotten.
    pub(super) fn ended(&self, now: Instant) -> Vec<Ended> {
        let mut st = self.state();
        let mut out = Vec::new();
        let mut returned = 0;
        st.keys.retain(|key, k| {
            while k.leases.front().is_some_and(|l| l.ends <= now) {
                let l = k.leases.pop_front().expect("a lease");
                returned += l.left;
                out.push(Ended {
                    key: key.clone(),
                    id: l.id,
                    unused: l.left,
                });
            }
            // Leases end in the order they were taken but for a limit's
            // change, which ends them all at once: none is left behind.
            k.taking || !k.leases.is_empty() || now.duration_since(k.since) < 2 * LEASE_TIME
        });
        st.held -= returned;
        out
    }

    /// Every lease, ended now (at shutdown).
    pub(super) fn end_all(&self) -> Vec<Ended> {
        let far = Instant::now() + 4 * LEASE_TIME;
        self.ended(far)
    }

    /// Units held now, in all.
    pub(super) fn held(&self) -> u64 {
        self.state().held
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limit() -> Limit {
        Limit::gcra(10, Duration::from_secs(1), 100).expect("limit")
    }

    fn granted(n: u64) -> Option<Granted> {
        Some(Granted {
            allowed: true,
            granted: n,
            remaining: 0,
            retry_after: None,
        })
    }

    #[test]
    fn a_key_is_leased_only_once_asked_for_a_lease_in_a_lease_time() {
        let l = Leases::new();
        let t = Instant::now();
        for i in 0..49 {
            assert_eq!(l.decide("k", limit(), 50, 1, t), Local::Redis, "ask {i}");
        }
        assert_eq!(l.decide("k", limit(), 50, 1, t), Local::Take { size: 50 });
        // While it is taken, the others wait for it.
        assert_eq!(l.decide("k", limit(), 50, 1, t), Local::Wait);
        let g = l
            .took("k", limit(), "id1", granted(50), 1, false, t)
            .expect("decided");
        assert_eq!((g.allowed, g.granted, g.remaining), (true, 1, 49));
        assert_eq!(l.held(), 49);
        for _ in 0..49 {
            assert!(matches!(
                l.decide("k", limit(), 50, 1, t),
                Local::Decided(Granted { allowed: true, .. })
                    | Local::DecidedTakeNext(Granted { allowed: true, .. }, 50)
            ));
        }
        assert_eq!(l.held(), 0);
        // The lease taken ahead failed: nothing more held.
        l.took("k", limit(), "id2", None, 0, true, t);
        assert_eq!(l.held(), 0);
        // A key quiet for a whole window is not leased again: its asks are
        // counted anew.
        let later = t + 2 * LEASE_TIME;
        assert_eq!(l.decide("k", limit(), 50, 1, later), Local::Redis);
    }

    #[test]
    fn a_hot_key_takes_its_next_lease_before_the_last_runs_out() {
        let l = Leases::new();
        let t = Instant::now();
        for _ in 0..9 {
            l.decide("k", limit(), 10, 1, t);
        }
        assert_eq!(l.decide("k", limit(), 10, 1, t), Local::Take { size: 10 });
        l.took("k", limit(), "a", granted(10), 1, false, t);
        // 9 held: decided here until under half a lease is left; the
        // acquire that leaves 4 asks for the next lease beside its answer.
        for left in (5..9).rev() {
            let d = l.decide("k", limit(), 10, 1, t);
            assert!(
                matches!(d, Local::Decided(Granted { remaining, .. }) if remaining == left),
                "{d:?} with {left} left"
            );
        }
        let d = l.decide("k", limit(), 10, 1, t);
        assert!(
            matches!(
                d,
                Local::DecidedTakeNext(
                    Granted {
                        allowed: true,
                        remaining: 4,
                        ..
                    },
                    10
                )
            ),
            "{d:?}"
        );
        // Once: the others go on spending what is held while it is taken.
        for _ in 0..4 {
            assert!(matches!(
                l.decide("k", limit(), 10, 1, t),
                Local::Decided(_)
            ));
        }
        assert_eq!(l.decide("k", limit(), 10, 1, t), Local::Wait);
        // Taken ahead: nothing to decide with it, all of it held.
        l.took("k", limit(), "b", granted(10), 0, true, t);
        assert_eq!(l.held(), 10);
    }

    #[test]
    fn a_key_that_stays_hot_does_not_start_over_each_window() {
        let l = Leases::new();
        let t = Instant::now();
        for _ in 0..10 {
            l.decide("k", limit(), 10, 1, t);
        }
        l.took("k", limit(), "a", granted(10), 1, false, t);
        // The next window: its first ask may take a lease at once, as the
        // window before asked for one.
        let next = t + LEASE_TIME;
        l.ended(next);
        assert_eq!(
            l.decide("k", limit(), 10, 1, next),
            Local::Take { size: 10 }
        );
        l.took("k", limit(), "b", None, 1, false, next);
        // A window with no ask in between: cold again.
        let quiet = next + 2 * LEASE_TIME;
        assert_eq!(l.decide("k", limit(), 10, 1, quiet), Local::Redis);
    }

    #[test]
    fn what_a_lease_did_not_use_goes_back_when_it_ends() {
        let l = Leases::new();
        let t = Instant::now();
        assert_eq!(l.decide("k", limit(), 5, 5, t), Local::Take { size: 5 });
        let g = l
            .took("k", limit(), "a", granted(5), 5, true, t)
            .expect("decided");
        assert_eq!(g.granted, 5);
        assert_eq!(l.decide("k", limit(), 5, 5, t), Local::Take { size: 5 });
        l.took("k", limit(), "b", granted(5), 2, true, t);
        assert!(l.ended(t + LEASE_TIME / 2).is_empty());
        assert_eq!(
            l.ended(t + LEASE_TIME),
            vec![
                Ended {
                    key: "k".into(),
                    id: "a".into(),
                    unused: 0
                },
                Ended {
                    key: "k".into(),
                    id: "b".into(),
                    unused: 3
                }
            ]
        );
        assert_eq!(l.held(), 0);
        // An ended lease decides nothing.
        assert_ne!(
            l.decide("k", limit(), 5, 1, t + LEASE_TIME),
            Local::Decided(Granted {
                allowed: true,
                granted: 1,
                remaining: 2,
                retry_after: None
            })
        );
    }

    #[test]
    fn a_whole_acquire_past_what_is_left_takes_nothing_from_a_short_lease() {
        let l = Leases::new();
        let t = Instant::now();
        assert_eq!(l.decide("k", limit(), 4, 4, t), Local::Take { size: 4 });
        // Redis had 3 of the 4: the whole acquire of 4 is denied, the 3 held.
        let short = Some(Granted {
            allowed: false,
            granted: 3,
            remaining: 0,
            retry_after: Some(Duration::from_millis(100)),
        });
        let g = l
            .took("k", limit(), "a", short, 4, true, t)
            .expect("decided");
        assert_eq!((g.allowed, g.granted), (false, 0));
        assert_eq!(g.retry_after, Some(Duration::from_millis(100)));
        assert_eq!(l.held(), 3);
        // Until Redis could fill a lease, what the leases do not hold is
        // denied here; the 3 held still decide.
        let soon = t + Duration::from_millis(40);
        assert_eq!(
            l.decide("k", limit(), 4, 4, soon),
            Local::Decided(Granted {
                allowed: false,
                granted: 0,
                remaining: 3,
                retry_after: Some(Duration::from_millis(60)),
            })
        );
        assert!(matches!(
            l.decide("k", limit(), 4, 2, soon),
            Local::Decided(Granted {
                allowed: true,
                granted: 2,
                ..
            })
        ));
        let later = t + Duration::from_millis(100);
        assert_eq!(l.decide("k", limit(), 4, 4, later), Local::Take { size: 4 });
        // A failed lease decides nothing and holds nothing more.
        assert_eq!(l.took("k", limit(), "b", None, 1, true, later), None);
        assert_eq!(l.held(), 1);
    }

    #[test]
    fn a_changed_limit_ends_the_leases_of_the_old_one() {
        let l = Leases::new();
        let t = Instant::now();
        l.decide("k", limit(), 5, 5, t);
        l.took("k", limit(), "a", granted(5), 1, true, t);
        let other = Limit::gcra(20, Duration::from_secs(1), 100).expect("limit");
        assert_eq!(l.decide("k", other, 5, 1, t), Local::Take { size: 5 });
        let ended = l.ended(t);
        assert_eq!(ended.len(), 1);
        assert_eq!(ended[0].unused, 4);
    }
}
