//! Token bucket with greedy (continuous) refill, kept in GCRA form: one theoretical
//! arrival time (TAT) per key, in wrapping ticks (see [`crate::clock`]).
//!
//! A bucket of capacity `C` refilled at one token per interval `I` is the same thing
//! as a meter that admits an arrival of cost `n` iff
//! `max(tat, now) + n·I − now ≤ C·I` (= `tau`), then sets `tat` to that sum.
//! A denial changes nothing; it reports how long until the same arrival would be
//! admitted. A new key starts with a full bucket (`tat = now`).
//!
//! This is also the seeds' one-integer "cooldown" score. Unlike the literal cooldown
//! code, which resets the score only once it has fallen behind `now` and so admits
//! one request too many after an idle period, the score here is `max(tat, now)`
//! before every arrival, which admits exactly `C` after any idle time.
//!
//! # The state word
//! One `u64`: the TAT in ticks, modulo 2^62, in the low 62 bits, exactly (never
//! rounded: a burst of `C` at one instant is always admitted whole), and the
//! *generation* of the rule that wrote it ([`Params::generation`], mod 4) in the
//! top two bits.
//!
//! # Rule changes
//! When a rule's rate or burst changes, the daemon bumps its generation and
//! records the previous interval and capacity. A state of the previous generation
//! is then converted on its next arrival: the tokens it had left (rounded down)
//! are kept, up to the new capacity. So a change is judged from the next packet,
//! never refills a bucket, and never holds a source back longer than the new limit
//! allows. That conversion is written back even on a denial (the one case where a
//! denial writes: what is stored changes, not what it means). A state two or more
//! generations old (a source silent through two quick changes) is read with the
//! current interval.
//!
//! # Wrapping
//! TATs wrap every 2^62 ticks (about 6.5 days). The distance `tat − now` is read
//! as a signed 62-bit number:
//! - `≤ 0`: the bucket is full;
//! - `(0, tau]`: `tat − now` ticks of refill are owed;
//! - `(tau, STALE_AHEAD]`: more than the rule allows: another CPU's clock reading
//!   was a little ahead of ours, or the state predates a rule change. Capped at
//!   `tau` (an empty bucket) for the decision, written back capped when it is far
//!   over; a wait it reports still counts from the state as it is, so that it is
//!   never early.
//! - above `STALE_AHEAD`: a state that was idle for days and wrapped around; it is
//!   read as a full bucket, which is what an idle key is owed.
//!
//! The one misreading: a key idle for more than about 4.9 days, whose idle time
//! modulo the 6.5-day range falls in the last `STALE_AHEAD` of it, is read as an
//! empty bucket (it gets the sustained rate, not its burst, once). The daemon's
//! hourly idle sweep deletes states idle for more than `TAU_MAX` long before that.

use crate::clock::{ns_to_ticks, ticks_to_ns_ceil};
pub use crate::decision::Decision;
#[cfg(test)]
use crate::decision::NEVER;

/// Bits of the state word that hold the TAT.
pub const TAT_BITS: u32 = 62;

/// The TAT part of the state word.
pub const TAT_MASK: u64 = (1 << TAT_BITS) - 1;

/// The generation's two bits, as a number (mod 4).
pub const GENERATION_MASK: u64 = 3;

/// The largest `tau` (capacity × interval) a rule may have: `2^60` ticks, about
/// 1.6 days of refill. Keeps `tat − now` well inside the signed 62-bit range.
pub const TAU_MAX: u64 = 1 << 60;

/// How far another CPU's clock may run ahead of ours before a state is taken as
/// stale: `2^40` ticks, about 134 ms, orders of magnitude above real skew.
pub const CLOCK_SKEW_MARGIN: u64 = 1 << 40;

/// States ahead of `now` by more than this are wrapped-around idle states.
pub const STALE_AHEAD: u64 = TAU_MAX + CLOCK_SKEW_MARGIN;

/// Largest burst a rule may have, in cost units (packets or bytes).
pub const CAPACITY_MAX: u64 = 1 << 32;

/// The per-key state: the theoretical arrival time in wrapping ticks (low 62
/// bits), with the rule generation in the top two bits.
///
/// Written by the XDP program (atomic compare-and-swap on the whole word), read by
/// the daemon for the idle sweep.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct State {
    /// generation (mod 4) << 62 | TAT ticks (mod 2^62).
    pub tat: u64,
}
const _: () = assert!(core::mem::size_of::<State>() == 8);

impl State {
    /// The state of a key seen for the first time at `now_ns` under `params`: a
    /// full bucket.
    #[inline(always)]
    pub const fn full(now_ns: u64, params: &Params) -> Self {
        Self {
            tat: stored(ns_to_ticks(now_ns), params.generation),
        }
    }
}

/// Precomputed parameters of one rule. Built and validated on the host
/// ([`Params::from_rate`]); the data path only adds, multiplies and compares.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Params {
    /// Ticks per unit of cost (one packet, or one byte). Rounded to the nearest tick.
    pub interval: u64,
    /// `capacity × interval`, ticks: how far ahead of now the TAT may run.
    pub tau: u64,
    /// Burst, in cost units. 0 means the rate is 0: nothing is ever admitted.
    pub capacity: u64,
    /// The rule's generation: bumped (mod 4) by the daemon when its limit changes.
    pub generation: u64,
    /// `interval` of the previous generation (0 if none, or if it was rate 0).
    pub prev_interval: u64,
    /// `capacity` of the previous generation.
    pub prev_capacity: u64,
}
const _: () = assert!(core::mem::size_of::<Params>() == 48);

/// Why a set of parameters was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ParamsError {
    /// Burst of 0: a bucket that can never hold a token. Use rate 0 to drop everything.
    BurstZero,
    /// Burst above [`CAPACITY_MAX`].
    BurstTooLarge,
    /// The period of the rate is 0 ns.
    PeriodZero,
    /// More than one unit of cost per tick (8192 per ns).
    RateTooHigh,
    /// `burst / rate` is longer than [`TAU_MAX`] (about 1.6 days of refill).
    BurstTooLong,
}

impl core::fmt::Display for ParamsError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(self.message())
    }
}

impl ParamsError {
    /// What is wrong and what is accepted, in words a library user reads.
    pub const fn message(self) -> &'static str {
        match self {
            Self::BurstZero => {
                "burst must be at least 1 (to drop everything, use rate 0 or a deny rule)"
            }
            Self::BurstTooLarge => "burst must be at most 4294967296 (2^32)",
            Self::PeriodZero => "the rate's period must be longer than 0",
            Self::RateTooHigh => "rate must be at most 8192 per nanosecond",
            Self::BurstTooLong => {
                "burst / rate must be at most 1.6 days (the bucket would take longer to refill); lower the burst or raise the rate"
            }
        }
    }
}

impl Params {
    /// A rule that admits nothing (rate 0).
    pub const DENY_ALL: Self = Self {
        interval: 0,
        tau: 0,
        capacity: 0,
        generation: 0,
        prev_interval: 0,
        prev_capacity: 0,
    };

    /// Parameters for `tokens` per `period_ns`, with a bucket of `burst` tokens,
    /// generation 0. `tokens == 0` is a rate of 0: nothing is admitted (the burst
    /// is still validated, so a later change of rate does not hit a surprise).
    #[cfg(not(target_arch = "bpf"))]
    pub fn from_rate(tokens: u64, period_ns: u64, burst: u64) -> Result<Self, ParamsError> {
        if burst == 0 {
            return Err(ParamsError::BurstZero);
        }
        if burst > CAPACITY_MAX {
            return Err(ParamsError::BurstTooLarge);
        }
        if period_ns == 0 {
            return Err(ParamsError::PeriodZero);
        }
        if tokens == 0 {
            return Ok(Self::DENY_ALL);
        }
        let ticks = u128::from(period_ns) << crate::clock::TICK_SHIFT;
        let tokens = u128::from(tokens);
        // Round to the nearest tick: the error is at most half a tick per token.
        let interval = (ticks + tokens / 2) / tokens;
        if interval == 0 {
            return Err(ParamsError::RateTooHigh);
        }
        let tau = interval * u128::from(burst);
        if tau > u128::from(TAU_MAX) {
            return Err(ParamsError::BurstTooLong);
        }
        Ok(Self {
            interval: interval as u64,
            tau: tau as u64,
            capacity: burst,
            ..Self::DENY_ALL
        })
    }

    /// These parameters as the next generation after `previous` (what the rule had
    /// until now), or unchanged if the limit itself is the same. After a rate of
    /// 0 (or no limit at all: zeroed parameters) there is no state worth
    /// converting: a denied arrival stores nothing, and a bucket that had no
    /// limit is a fresh one; the generation stays, so a zeroed state word reads
    /// as a full bucket.
    pub fn succeeding(mut self, previous: &Params) -> Self {
        if previous.is_deny_all() {
            self.generation = previous.generation;
            self.prev_interval = 0;
            self.prev_capacity = 0;
            return self;
        }
        let same_limit = self.interval == previous.interval
            && self.tau == previous.tau
            && self.capacity == previous.capacity;
        if same_limit {
            self.generation = previous.generation;
            self.prev_interval = previous.prev_interval;
            self.prev_capacity = previous.prev_capacity;
        } else {
            self.generation = (previous.generation + 1) & GENERATION_MASK;
            self.prev_interval = previous.interval;
            self.prev_capacity = previous.capacity;
        }
        self
    }

    /// Whether these parameters admit nothing (rate 0).
    #[inline(always)]
    pub const fn is_deny_all(&self) -> bool {
        self.capacity == 0
    }
}

/// How far TAT `tat` is ahead of `now_t` (ticks, both modulo 2^62; bits above
/// the TAT's are ignored): 0 when it is behind (a full bucket) or so far ahead
/// that it is a wrapped idle state.
#[inline(always)]
fn ahead_of(tat: u64, now_t: u64) -> u64 {
    // The distance modulo 2^62, as a signed number in the top 62 bits of a
    // word: the top half of the range is "behind".
    let d = tat.wrapping_sub(now_t) << (64 - TAT_BITS);
    if d as i64 <= 0 || d > STALE_AHEAD << (64 - TAT_BITS) {
        0
    } else {
        d >> (64 - TAT_BITS)
    }
}

/// How far `tat` is ahead of `now_t` (ticks), capped at `tau`, and whether it was
/// so far over `tau` that the capped form should be written back.
#[inline(always)]
fn owed(tat: u64, now_t: u64, tau: u64) -> (u64, bool) {
    let ahead = ahead_of(tat, now_t);
    if ahead > tau {
        (tau, ahead > tau + CLOCK_SKEW_MARGIN)
    } else {
        (ahead, false)
    }
}

/// The debt, under `params`, of a state written by the previous generation: the
/// tokens it had left (whole, rounded down) are kept, up to the new capacity.
#[inline(always)]
fn converted(tat: u64, now_t: u64, params: &Params) -> u64 {
    // Both were validated together (≤ TAU_MAX) when that generation was built.
    let prev_tau = params.prev_capacity.wrapping_mul(params.prev_interval);
    let (ahead, _) = owed(tat, now_t, prev_tau);
    let left = match (ahead + params.prev_interval).checked_sub(1) {
        // ceil(ahead / prev_interval) tokens owed; ahead ≤ TAU_MAX, so no overflow.
        Some(sum) => match sum.checked_div(params.prev_interval) {
            Some(owed_tokens) => params.prev_capacity.saturating_sub(owed_tokens),
            // Rate 0 before: no tokens to carry over.
            None => 0,
        },
        None => 0,
    };
    let left = if left < params.capacity {
        left
    } else {
        params.capacity
    };
    (params.capacity - left) * params.interval
}

/// Whether `state` reads as a full bucket at `now_ns` under any rule: its TAT is not
/// ahead of now. The daemon's idle sweep deletes such states once they are older
/// than [`TAU_MAX`], which loses nothing (a missing state is a full bucket).
#[inline(always)]
pub fn idle_for_ns(state: &State, now_ns: u64) -> Option<u64> {
    let behind = ns_to_ticks(now_ns).wrapping_sub(state.tat) & TAT_MASK;
    if behind < 1 << (TAT_BITS - 1) {
        Some(behind >> crate::clock::TICK_SHIFT)
    } else {
        None
    }
}

/// `ticks / interval`, without a panic path (the kernel program must have none,
/// and dead code is only removed when it cannot panic).
#[inline(always)]
fn whole_tokens(ticks: u64, interval: u64) -> u64 {
    ticks.checked_div(interval).unwrap_or_default()
}

/// The stored form of a TAT: its low 62 bits, with the generation on top.
#[inline(always)]
const fn stored(tat: u64, generation: u64) -> u64 {
    (tat & TAT_MASK) | ((generation & GENERATION_MASK) << TAT_BITS)
}

/// The generation a state word was written under.
#[inline(always)]
const fn generation_of(word: u64) -> u64 {
    word >> TAT_BITS
}

/// Decides one arrival of `cost` units at `now_ns` and, if it is admitted, advances
/// `state`. A denied arrival leaves `state` untouched, except to store a converted
/// or capped debt (module docs). Callers that share `state` across CPUs write it
/// back (compare-and-swap) whenever it changed.
#[inline(always)]
pub fn decide(state: &mut State, params: &Params, now_ns: u64, cost: u64) -> Decision {
    let before = *state;
    if admit(state, params, now_ns, cost) {
        return Decision {
            allowed: true,
            remaining: available(state, params, now_ns),
            retry_after_ns: 0,
        };
    }
    let remaining = available(&before, params, now_ns);
    if params.capacity == 0 || cost > params.capacity {
        // Never admitted at once; what is there now is still reported.
        return Decision {
            allowed: false,
            remaining,
            retry_after_ns: u64::MAX,
        };
    }
    let now_t = ns_to_ticks(now_ns);
    let (ahead, _) = owed_by(before.tat, now_t, params);
    // The wait counts from the state as stored when it runs ahead of this clock
    // (another CPU's later reading): never early.
    let real = if generation_of(before.tat) == params.generation & GENERATION_MASK {
        ahead_of(before.tat & TAT_MASK, now_t).max(ahead)
    } else {
        ahead
    };
    Decision {
        allowed: false,
        remaining,
        retry_after_ns: ticks_to_ns_ceil(real + cost * params.interval - params.tau),
    }
}

/// The decision alone, as [`decide`] makes it, and the new state: what the
/// kernel program calls (nothing it does not read is computed, and the verifier
/// walks fewer paths).
#[inline(always)]
pub fn admit(state: &mut State, params: &Params, now_ns: u64, cost: u64) -> bool {
    admit_keeping(state, params, now_ns, cost, 0)
}

/// As [`admit`], but admits only if `keep` ticks of the bucket (`keep ÷
/// interval` units) are still in it afterwards: a bucket with a reserve that
/// this frame may not touch. `keep` is at most `params.tau`; 0 is [`admit`].
/// A refusal writes only what [`admit`] would (a converted or capped debt),
/// never a debt bounded by the reserve: the bucket itself is not shrunk.
#[inline(always)]
pub fn admit_keeping(
    state: &mut State,
    params: &Params,
    now_ns: u64,
    cost: u64,
    keep: u64,
) -> bool {
    if params.capacity == 0 || cost > params.capacity {
        return false;
    }
    let now_t = ns_to_ticks(now_ns);
    let generation = params.generation & GENERATION_MASK;
    let (ahead, rewrite) = owed_by(state.tat, now_t, params);
    // cost ≤ capacity, so cost × interval ≤ tau ≤ TAU_MAX: no overflow, and
    // ahead + that ≤ 2·TAU_MAX < 2^62; keep ≤ tau too.
    let after = ahead + cost * params.interval;
    if after + keep <= params.tau {
        state.tat = stored(now_t.wrapping_add(after), generation);
        true
    } else {
        if rewrite {
            state.tat = stored(now_t.wrapping_add(ahead), generation);
        }
        false
    }
}

/// The debt of the state word `word` at `now_t` under `params` (capped at
/// `tau`, converted from the previous generation), and whether the capped or
/// converted form should be written back.
#[inline(always)]
fn owed_by(word: u64, now_t: u64, params: &Params) -> (u64, bool) {
    let generation = params.generation & GENERATION_MASK;
    // The generation bits fall out of the distance (see `ahead_of`): no mask,
    // which would only give the verifier ranges to tell paths apart by.
    let tat = word;
    let state_generation = generation_of(word);
    if state_generation == generation {
        owed(tat, now_t, params.tau)
    } else if state_generation == (generation + GENERATION_MASK) & GENERATION_MASK {
        (converted(tat, now_t, params), true)
    } else {
        (owed(tat, now_t, params.tau).0, true)
    }
}

/// How far beyond a whole bucket the daemon may set a key's debt
/// ([`with_debt`]): `3·2^38` ticks, about 100 ms. Below [`CLOCK_SKEW_MARGIN`],
/// so the program reads such a state as empty and leaves it as it is (it
/// rewrites a state only when it is further ahead than that margin).
pub const OVER_MAX: u64 = 3 << 38;

/// The debt of the state word `word` at `now_ns` under `params`, in ns: how
/// long until the bucket is full again; beyond a whole bucket when the daemon
/// set it so ([`with_debt`]).
pub fn debt_ns(word: u64, params: &Params, now_ns: u64) -> u64 {
    let now_t = ns_to_ticks(now_ns);
    let ahead = if generation_of(word) == params.generation & GENERATION_MASK {
        ahead_of(word, now_t).min(params.tau + OVER_MAX)
    } else {
        owed_by(word, now_t, params).0
    };
    ticks_to_ns_ceil(ahead)
}

/// The debt, in ns, that `units` of cost add under `params` (a whole bucket is
/// `units_ns(params, params.capacity)`).
pub fn units_ns(params: &Params, units: u64) -> u64 {
    ticks_to_ns_ceil(units.saturating_mul(params.interval).min(1 << 62))
}

/// The state word of a key under `params` whose debt at `now_ns` is `debt_ns`
/// (at most a whole bucket and [`OVER_MAX`]): what a daemon of a fleet writes
/// to keep a key's bucket in step with the fleet's.
pub fn with_debt(params: &Params, now_ns: u64, debt_ns: u64) -> u64 {
    let debt = ns_to_ticks(debt_ns.min(1 << 40)).min(params.tau + OVER_MAX);
    stored(ns_to_ticks(now_ns).wrapping_add(debt), params.generation)
}

/// Whole units the bucket holds at `now_ns`.
fn available(state: &State, params: &Params, now_ns: u64) -> u64 {
    if params.capacity == 0 {
        return 0;
    }
    let (ahead, _) = owed_by(state.tat, ns_to_ticks(now_ns), params);
    whole_tokens(params.tau - ahead, params.interval)
}

/// `cost` units in ticks, at most `tau` (a whole bucket). Without a 128-bit
/// multiplication, which the kernel program cannot have: `cost < capacity ≤ 2^32`
/// and `capacity × interval = tau ≤ 2^60`.
#[inline(always)]
fn units(cost: u64, params: &Params) -> u64 {
    if cost >= params.capacity {
        params.tau
    } else {
        cost * params.interval
    }
}

/// Takes `cost` units from the bucket whether or not they are there: the bucket
/// empties (never below empty). For what a key was admitted before it had this
/// state (see [`crate::doorkeeper`]): charged, never refused.
#[inline(always)]
pub fn charge(state: &mut State, params: &Params, now_ns: u64, cost: u64) {
    let generation = params.generation & GENERATION_MASK;
    let now_t = ns_to_ticks(now_ns);
    let (ahead, _) = owed(state.tat & TAT_MASK, now_t, params.tau);
    let ahead = ahead + units(cost, params);
    let ahead = if ahead > params.tau {
        params.tau
    } else {
        ahead
    };
    state.tat = stored(now_t.wrapping_add(ahead), generation);
}

/// Returns `cost` unused units to the bucket (a client that took more than it
/// used gives the rest back): the TAT moves
/// back by `cost` intervals, but never behind `now` — a bucket never holds more
/// than its capacity.
#[inline(always)]
pub fn refund(state: &mut State, params: &Params, now_ns: u64, cost: u64) {
    let generation = params.generation & GENERATION_MASK;
    if generation_of(state.tat) != generation {
        return;
    }
    let now_t = ns_to_ticks(now_ns);
    let (ahead, _) = owed(state.tat & TAT_MASK, now_t, params.tau);
    let ahead = ahead.saturating_sub(units(cost, params));
    state.tat = stored(now_t.wrapping_add(ahead), generation);
}

#[cfg(test)]
mod tests {
    extern crate std;
    use std::vec::Vec;

    use super::*;

    const MS: u64 = 1_000_000;

    /// Runs arrivals (ms, cost) against one state; returns "A"/"D" per arrival.
    fn run(params: &Params, start: State, arrivals: &[(u64, u64)]) -> std::string::String {
        let mut state = start;
        arrivals
            .iter()
            .map(|&(t, n)| {
                if decide(&mut state, params, t * MS, n).allowed {
                    'A'
                } else {
                    'D'
                }
            })
            .collect()
    }

    /// Interval `i_ms` between tokens, capacity `c`.
    fn params(i_ms: u64, c: u64) -> Params {
        Params::from_rate(1, i_ms * MS, c).expect("valid params")
    }

    /// A debt the daemon set beyond a whole bucket (a fleet over its limit)
    /// is read as empty, kept as it is by denials, and paid down in time.
    #[test]
    fn a_debt_beyond_the_bucket_holds_until_paid() {
        let p = params(10, 20);
        let now = 1_000 * MS;
        // Whole bucket (200 ms) and 80 ms more.
        let word = with_debt(&p, now, 280 * MS);
        assert_eq!(debt_ns(word, &p, now), 280 * MS);
        let mut s = State { tat: word };
        for t in [0, 40, 79] {
            assert!(!admit(&mut s, &p, now + t * MS, 1), "at +{t} ms");
            assert_eq!(s.tat, word, "a denial leaves the debt as set");
        }
        // 80 ms later the bucket is empty, 10 ms after that one token is back.
        assert!(!admit(&mut s, &p, now + 85 * MS, 1));
        assert!(admit(&mut s, &p, now + 90 * MS, 1));
        // The beyond-the-bucket part is capped at OVER_MAX.
        let capped = with_debt(&p, now, 10_000 * MS);
        assert_eq!(debt_ns(capped, &p, now), ticks_to_ns_ceil(p.tau + OVER_MAX));
    }

    #[test]
    fn interval_500_capacity_2() {
        let p = params(500, 2);
        let got = run(
            &p,
            State::full(0, &p),
            &[(0, 1), (1, 1), (2, 1), (1002, 1), (1003, 1), (1004, 1)],
        );
        assert_eq!(got, "AADAAD");
    }

    #[test]
    fn interval_200_capacity_5_six_at_once_twice() {
        let p = params(200, 5);
        let mut arrivals = Vec::new();
        arrivals.extend([(0, 1); 6]);
        arrivals.extend([(2000, 1); 6]);
        assert_eq!(run(&p, State::full(0, &p), &arrivals), "AAAAADAAAAAD");
    }

    #[test]
    fn clock_going_backwards_is_not_an_underflow() {
        let p = params(100, 2);
        let got = run(
            &p,
            State::full(1000 * MS, &p),
            &[(1000, 1), (1000, 1), (900, 1), (1100, 1)],
        );
        assert_eq!(got, "AADA");
    }

    #[test]
    fn cost_above_capacity_is_always_denied_without_overflow() {
        let p = params(200, 5);
        let mut s = State::full(0, &p);
        for n in [6, 7, 15, u64::from(u32::MAX), u64::MAX] {
            let d = decide(&mut s, &p, 0, n);
            assert!(!d.allowed, "cost {n} above capacity 5 was admitted");
            assert_eq!(d.retry_after_ns, u64::MAX);
        }
        assert_eq!(s, State::full(0, &p), "a denial changed the state");
        assert!(decide(&mut s, &p, 0, 5).allowed);
    }

    #[test]
    fn issue5_vector_costs_15_7_6_then_5() {
        let p = params(200, 5);
        let got = run(&p, State::full(0, &p), &[(0, 15), (0, 7), (0, 6), (0, 5)]);
        assert_eq!(got, "DDDA");
    }

    #[test]
    fn retry_after_is_exact_and_never_early() {
        let p = params(500, 2);
        let mut s = State::full(0, &p);
        assert!(decide(&mut s, &p, 0, 1).allowed);
        assert!(decide(&mut s, &p, 0, 1).allowed);
        let d = decide(&mut s, &p, 0, 1);
        assert!(!d.allowed);
        assert_eq!(d.retry_after_ns, 500 * MS);
        assert!(!decide(&mut s, &p, 500 * MS - 1, 1).allowed);
        assert!(decide(&mut s, &p, 500 * MS, 1).allowed);
    }

    #[test]
    fn remaining_counts_whole_tokens() {
        let p = params(100, 3);
        let mut s = State::full(0, &p);
        assert_eq!(decide(&mut s, &p, 0, 1).remaining, 2);
        assert_eq!(decide(&mut s, &p, 0, 1).remaining, 1);
        assert_eq!(decide(&mut s, &p, 50 * MS, 1).remaining, 0);
        assert_eq!(decide(&mut s, &p, 150 * MS, 1).remaining, 0);
    }

    #[test]
    fn rate_zero_admits_nothing() {
        let p = Params::from_rate(0, 1_000_000_000, 10).expect("rate 0 is valid");
        assert!(p.is_deny_all());
        let mut s = State::full(0, &p);
        for t in [0, 1, 1_000_000_000_000] {
            assert!(!decide(&mut s, &p, t, 1).allowed);
        }
    }

    #[test]
    fn refused_params() {
        assert_eq!(Params::from_rate(1, 1, 0), Err(ParamsError::BurstZero));
        assert_eq!(
            Params::from_rate(1, 1, CAPACITY_MAX + 1),
            Err(ParamsError::BurstTooLarge)
        );
        assert_eq!(Params::from_rate(1, 0, 1), Err(ParamsError::PeriodZero));
        assert_eq!(
            Params::from_rate(u64::MAX, 1, 1),
            Err(ParamsError::RateTooHigh)
        );
        // 1 per hour with a burst of 1000: 41.7 days to refill.
        assert_eq!(
            Params::from_rate(1, 3_600_000_000_000, 1000),
            Err(ParamsError::BurstTooLong)
        );
    }

    /// Charging takes tokens without asking, down to an empty bucket.
    #[test]
    fn charge_empties_but_never_below_empty() {
        let p = params(100, 5);
        let mut s = State::full(0, &p);
        charge(&mut s, &p, 0, 2);
        let admitted = (0..10).filter(|_| decide(&mut s, &p, 0, 1).allowed).count();
        assert_eq!(admitted, 3, "5 − 2 charged");
        let mut s = State::full(0, &p);
        charge(&mut s, &p, 0, 1000);
        assert!(
            !decide(&mut s, &p, 0, 1).allowed,
            "charged past the burst: empty"
        );
        assert!(
            decide(&mut s, &p, 100 * MS, 1).allowed,
            "one interval later: one token"
        );
    }

    /// Regression (3/s with a burst of 3 admitted 2 at one instant): every burst is
    /// admitted whole at one instant, whatever the interval between tokens.
    #[test]
    fn three_per_second_burst_three_at_one_instant() {
        let p = Params::from_rate(3, 1_000_000_000, 3).expect("valid");
        let mut s = State::full(77, &p);
        let got: std::string::String = (0..4)
            .map(|_| {
                if decide(&mut s, &p, 77, 1).allowed {
                    'A'
                } else {
                    'D'
                }
            })
            .collect();
        assert_eq!(got, "AAAD");
    }

    /// A cost above the capacity is never admitted, but what is there is still
    /// reported (an `acquire` grants it).
    #[test]
    fn cost_above_capacity_reports_what_is_there() {
        let p = params(100, 5);
        let mut s = State::full(0, &p);
        let d = decide(&mut s, &p, 0, 6);
        assert!(!d.allowed);
        assert_eq!((d.remaining, d.retry_after_ns), (5, NEVER));
        assert!(decide(&mut s, &p, 0, 2).allowed);
        assert_eq!(decide(&mut s, &p, 0, 9).remaining, 3);
    }

    /// A state written from a later clock (another CPU's, or a clock set back):
    /// the wait is counted from the state, never early.
    #[test]
    fn retry_after_a_clock_step_back_is_never_early() {
        let p = params(100, 2);
        let mut s = State::full(10_000 * MS, &p);
        assert!(decide(&mut s, &p, 10_000 * MS, 1).allowed);
        assert!(decide(&mut s, &p, 10_000 * MS, 1).allowed);
        // Now a clock 50 ms behind: the bucket refills from 10 000 ms + 200 ms.
        let d = decide(&mut s, &p, 9_950 * MS, 1);
        assert!(!d.allowed);
        let at = 9_950 * MS + d.retry_after_ns;
        assert!(!decide(&mut s.clone(), &p, at - 1, 1).allowed, "early");
        assert!(decide(&mut s.clone(), &p, at, 1).allowed, "late");
    }

    /// 1 packet per hour: one per hour after the burst, not one a little early.
    #[test]
    fn one_per_hour() {
        const HOUR: u64 = 3_600_000_000_000;
        let p = Params::from_rate(1, HOUR, 3).expect("valid");
        let mut s = State::full(5 * HOUR, &p);
        let t0 = 5 * HOUR;
        for _ in 0..3 {
            assert!(decide(&mut s, &p, t0, 1).allowed);
        }
        assert!(!decide(&mut s, &p, t0 + HOUR - 1, 1).allowed);
        assert!(decide(&mut s, &p, t0 + HOUR, 1).allowed);
        assert!(!decide(&mut s, &p, t0 + 2 * HOUR - 1, 1).allowed);
        assert!(decide(&mut s, &p, t0 + 2 * HOUR, 1).allowed);
    }

    /// 100 M packets/s with a burst of 2^32: the burst is admitted whole, then 10 ns
    /// apart (checked by arithmetic, not by running 4 G arrivals).
    #[test]
    fn hundred_million_per_second_burst_2_pow_32() {
        let p = Params::from_rate(100_000_000, 1_000_000_000, CAPACITY_MAX).expect("valid");
        assert_eq!(p.interval, 10 * crate::TICKS_PER_NS);
        let mut s = State::full(0, &p);
        // Take all but one token in one arrival, then the last one, then nothing.
        assert!(decide(&mut s, &p, 0, CAPACITY_MAX - 1).allowed);
        assert!(decide(&mut s, &p, 0, 1).allowed);
        let d = decide(&mut s, &p, 0, 1);
        assert!(!d.allowed);
        assert_eq!(d.retry_after_ns, 10);
        assert!(decide(&mut s, &p, 10, 1).allowed);
        // Over one second of steady arrivals every 10 ns, all are admitted.
        let mut admitted = 0u64;
        for k in 2..=100_000_001u64 {
            admitted += u64::from(decide(&mut s, &p, k * 10, 1).allowed);
        }
        assert_eq!(admitted, 100_000_000);
    }

    /// 100 Gbit/s in bytes: 12.5 G bytes/s, 0.08 ns per byte, exact to 0.1 %.
    #[test]
    fn hundred_gigabit_bytes_rate_is_exact_to_a_tenth_of_a_percent() {
        let bytes_per_s = 100_000_000_000 / 8;
        let p = Params::from_rate(bytes_per_s, 1_000_000_000, 64 * 1024).expect("valid");
        // Offer 64-byte frames at twice the rate for 10 ms, count bytes admitted.
        let mut s = State::full(0, &p);
        let frame = 64u64;
        let dur_ns = 10 * MS;
        let step_ps = frame * 1000 * 1_000_000_000 / (2 * bytes_per_s); // ps between frames
        let mut admitted = 0u64;
        let mut t_ps = 0u64;
        while t_ps < dur_ns * 1000 {
            if decide(&mut s, &p, t_ps / 1000, frame).allowed {
                admitted += frame;
            }
            t_ps += step_ps;
        }
        let expected = 64 * 1024 + bytes_per_s * dur_ns / 1_000_000_000;
        let err = (admitted as f64 - expected as f64).abs() / expected as f64;
        assert!(
            err < 0.001,
            "admitted {admitted} bytes, expected {expected} (error {:.4} %)",
            err * 100.0
        );
    }

    /// Drains a bucket under `old`, changes the rule to `new` (the next arrival,
    /// at 0, is judged by it), and returns how many of `probe` arrivals at `at_ms`
    /// the new rule admits.
    fn drained_then(old: Params, new: Params, at_ms: u64, probe: usize) -> usize {
        let new = new.succeeding(&old);
        let mut s = State::full(0, &old);
        while decide(&mut s, &old, 0, 1).allowed {}
        let first = usize::from(decide(&mut s, &new, 0, 1).allowed);
        first
            + (0..probe)
                .filter(|_| decide(&mut s, &new, at_ms * MS, 1).allowed)
                .count()
    }

    /// A rule whose burst is lowered judges existing keys by the new burst at once:
    /// a key that had drained a big bucket waits at most one new interval.
    #[test]
    fn lowering_the_burst_never_holds_back_longer_than_the_new_limit() {
        let old = params(10, 1000);
        let new = params(10, 5).succeeding(&old);
        let mut s = State::full(0, &old);
        for _ in 0..1000 {
            assert!(decide(&mut s, &old, 0, 1).allowed);
        }
        // Under the new limit the bucket is empty, not 995 tokens in debt.
        let d = decide(&mut s, &new, 0, 1);
        assert!(!d.allowed);
        assert_eq!(d.retry_after_ns, 10 * MS);
        assert!(decide(&mut s, &new, 10 * MS, 1).allowed);
        assert!(!decide(&mut s, &new, 10 * MS, 1).allowed);
    }

    /// Raising a limit (rate, burst or both) does not refill a drained bucket, and
    /// lowering the rate of a drained bucket leaves it empty, not partly refilled.
    #[test]
    fn a_rule_change_keeps_the_tokens_left_not_the_time_owed() {
        // Burst raised 5 → 50: still empty.
        assert_eq!(drained_then(params(100, 5), params(100, 50), 0, 60), 0);
        // Rate raised 10/s → 100/s, same burst: empty, then 10 ms per token.
        assert_eq!(drained_then(params(100, 5), params(10, 5), 0, 10), 0);
        assert_eq!(drained_then(params(100, 5), params(10, 5), 30, 10), 3);
        // Rate lowered 1000/s → 1/s, same burst: a time-debt reading would see an
        // almost full bucket; the bucket is empty.
        assert_eq!(drained_then(params(1, 20), params(1000, 20), 0, 30), 0);
        // A half-full bucket keeps its tokens, up to the new capacity.
        let old = params(1000, 10);
        let new = params(1000, 4).succeeding(&old);
        let mut s = State::full(0, &old);
        for _ in 0..5 {
            assert!(decide(&mut s, &old, 0, 1).allowed);
        }
        let admitted = (0..10)
            .filter(|_| decide(&mut s, &new, 0, 1).allowed)
            .count();
        assert_eq!(admitted, 4, "5 left, capped at the new burst of 4");
    }

    /// The same limit written again is the same generation: nothing is converted.
    #[test]
    fn rewriting_the_same_limit_changes_nothing() {
        let p = params(100, 5);
        let again = params(100, 5).succeeding(&p);
        assert_eq!(again, p);
        let next = params(100, 6).succeeding(&p);
        assert_eq!(next.generation, 1);
        assert_eq!((next.prev_interval, next.prev_capacity), (p.interval, 5));
        assert_eq!(params(100, 6).succeeding(&next).generation, 1);
    }

    /// A state written from a clock reading slightly ahead of ours is a debt, not a
    /// wrapped idle state.
    #[test]
    fn state_slightly_ahead_of_now_is_not_taken_as_idle() {
        let p = params(100, 2);
        let mut s = State::full(1000 * MS, &p);
        assert!(decide(&mut s, &p, 1000 * MS, 1).allowed);
        assert!(decide(&mut s, &p, 1000 * MS, 1).allowed);
        // Another CPU reads a clock 1 µs behind: still empty.
        assert!(!decide(&mut s, &p, 1000 * MS - 1000, 1).allowed);
    }

    /// A state idle for longer than half the tick range reads as a full bucket.
    #[test]
    fn long_idle_state_reads_as_full() {
        let p = params(100, 2);
        let mut s = State::full(0, &p);
        assert!(decide(&mut s, &p, 0, 1).allowed);
        assert!(decide(&mut s, &p, 0, 1).allowed);
        // Up to 4.9 days, and past a wrap; the rest: see the module docs (the
        // idle sweep's job).
        for idle_hours in [24u64, 48, 72, 96, 117, 160] {
            let idle_days = idle_hours / 24;
            let mut t = s;
            let now = idle_hours * 3_600_000 * MS;
            assert!(decide(&mut t, &p, now, 1).allowed, "idle {idle_days} days");
            assert!(decide(&mut t, &p, now, 1).allowed, "idle {idle_days} days");
        }
    }

    /// A bucket of 10 with 4 kept: a frame that may not touch the reserve
    /// gets 6 from a full bucket, then only what the refill brings above the
    /// reserve; one that may gets the rest; nothing ever beyond the bucket.
    #[test]
    fn a_reserve_is_left_to_the_frames_that_may_use_it() {
        let p = params(10, 10);
        let keep = 4 * p.interval;
        let mut s = State::full(0, &p);
        let young = |s: &mut State, t: u64| admit_keeping(s, &p, t * MS, 1, keep);
        let old = |s: &mut State, t: u64| admit(s, &p, t * MS, 1);
        assert_eq!((0..6).filter(|_| young(&mut s, 0)).count(), 6);
        let before = s;
        assert!(
            !young(&mut s, 0),
            "the 7th young frame would eat the reserve"
        );
        assert_eq!(s, before, "a refusal at the reserve writes nothing");
        assert_eq!((0..10).filter(|_| old(&mut s, 0)).count(), 4);
        // 10 ms refill one token: it goes to the reserve first.
        assert!(!young(&mut s, 10));
        assert!(old(&mut s, 10));
        // 50 ms: 5 tokens back, 4 refill the reserve, 1 above it.
        assert!(young(&mut s, 60));
        assert!(!young(&mut s, 60));
        assert_eq!((0..10).filter(|_| old(&mut s, 60)).count(), 4);
        assert!(!old(&mut s, 60));
    }
}
