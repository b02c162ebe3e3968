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
mod tests;
