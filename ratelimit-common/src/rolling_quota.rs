//! Rolling-window quota with a rate cap: time is cut into periods of
//! `period_ns` (multiples of it on the clock) and a window is the last
//! `periods = window / period` of them, the current one included. An arrival of
//! cost `n` is admitted iff this period's count + n ≤ `rate_cap` and the window's
//! total + n ≤ `quota`. E.g. 10 000 per rolling day, at most 1 000 per hour.
//!
//! Guarantee: at most `rate_cap` per period and `quota` per aligned window of
//! `periods` periods; a span of `window` that is not aligned can hold up to
//! `quota + rate_cap`.

use crate::{Decision, NEVER, ParamError, div};

/// Most periods in a window.
pub const MAX_PERIODS: u64 = 64;

/// Parameters, validated on the host.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Params {
    /// Period, ns (`--period`).
    pub period_ns: u64,
    /// Periods per window (`--window` / `--period`).
    pub periods: u64,
    /// Cost admitted per window (`--quota`).
    pub quota: u64,
    /// Cost admitted per period (`--rate-cap`).
    pub rate_cap: u64,
}

/// Per-key state.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct State {
    /// Index of the newest period counted (`now / period_ns`).
    pub period: u64,
    /// Counts per period, a ring indexed by period modulo [`MAX_PERIODS`].
    pub counts: [u32; MAX_PERIODS as usize],
}

impl Default for State {
    fn default() -> Self {
        Self {
            period: 0,
            counts: [0; MAX_PERIODS as usize],
        }
    }
}

impl Params {
    /// Checks and builds parameters from the window and period lengths.
    pub const fn new(
        window_ns: u64,
        period_ns: u64,
        quota: u64,
        rate_cap: u64,
    ) -> Result<Self, ParamError> {
        ensure!(period_ns > 0, "period", "must be longer than 0, like 1h");
        ensure!(
            window_ns > 0 && window_ns.is_multiple_of(period_ns),
            "window",
            "must be a whole number of periods, like 24h for a period of 1h"
        );
        let periods = window_ns / period_ns;
        ensure!(
            periods <= MAX_PERIODS,
            "window",
            "must be at most 64 periods (make the period longer)"
        );
        ensure!(
            quota > 0 && quota <= u32::MAX as u64,
            "quota",
            "must be 1 to 4294967295"
        );
        ensure!(
            rate_cap > 0 && rate_cap <= quota,
            "rate_cap",
            "must be 1 to the quota"
        );
        Ok(Self {
            period_ns,
            periods,
            quota,
            rate_cap,
        })
    }
}

const MASK: u64 = MAX_PERIODS - 1;
const _: () = assert!(MAX_PERIODS.is_power_of_two());

/// All ones when `a < b`, else zero, for `a` and `b` below 2^63, without a
/// branch: the sign of `a - b`.
///
/// The loops below use it so that their bodies hold no branch and their trip
/// counts are constants: the verifier then walks each loop once, on one path.
/// With a branch in the body (a period in the window or not, the first
/// period that frees enough) it walked every iteration's outcomes apart, and
/// this algorithm alone cost it 613 k instructions on Linux 6.18 and 913 k on
/// 7.2, against 1 M for the whole program. Every value compared here is
/// below 2^63: periods ≤ 64, counts and the quota ≤ u32::MAX, period numbers
/// ≤ the clock's nanoseconds.
#[inline(always)]
const fn mask_lt(a: u64, b: u64) -> u64 {
    0u64.wrapping_sub(a.wrapping_sub(b) >> 63)
}

/// Decides one arrival of `cost` at `now_ns`; only an admission changes `state`
/// (periods that left the window are cleared then).
///
/// A slot `j` of the ring holds the newest period `p ≤ state.period` with
/// `p ≡ j (mod 64)`, `d = (state.period − j) mod 64` periods before the newest;
/// it counts in the window when `d < w`, the number of periods from the
/// newest back that are still in the window (and not before period 0).
#[inline(always)]
pub fn decide(state: &mut State, params: &Params, now_ns: u64, cost: u64) -> Decision {
    // A clock behind the state's newest period is judged in that period.
    let now_period = div(now_ns, params.period_ns).max(state.period);
    let newest = state.period;
    // Periods from the newest to now (0: now is the newest).
    let gap = now_period - newest;
    let w = params.periods.saturating_sub(gap).min(newest + 1);
    let mut total = 0u64;
    let mut j = 0;
    while j < MAX_PERIODS {
        let d = newest.wrapping_sub(j) & MASK;
        total += u64::from(state.counts[j as usize]) & mask_lt(d, w);
        j += 1;
    }
    let current = if gap == 0 {
        u64::from(state.counts[(newest & MASK) as usize])
    } else {
        0
    };
    let room = params
        .quota
        .saturating_sub(total)
        .min(params.rate_cap.saturating_sub(current));
    if cost > params.rate_cap {
        return Decision::deny(room, NEVER);
    }
    if current + cost <= params.rate_cap && total + cost <= params.quota {
        // Clear the ring slots of the periods after the state's newest, up
        // to now: slot `j` is `a = (j − newest − 1) mod 64` periods past it.
        let ahead = gap.min(MAX_PERIODS);
        let mut j = 0;
        while j < MAX_PERIODS {
            let a = j.wrapping_sub(newest + 1) & MASK;
            state.counts[j as usize] &= !(mask_lt(a, ahead) as u32);
            j += 1;
        }
        state.period = now_period;
        state.counts[(now_period & MASK) as usize] = (current + cost) as u32;
        return Decision::allow(room - cost);
    }
    // From the next period on the period cap is free (cost ≤ rate_cap); the
    // quota frees as old periods leave the window, one per period: `k`
    // periods from now, period `now + k − periods` has left. The first `k`
    // (1 to periods − 1) after which enough has left, else `periods`.
    let periods = params.periods;
    let mut remaining = total;
    let mut found = 0u64;
    let mut first = 0u64;
    let mut k = 1;
    while k < MAX_PERIODS {
        // Distance of the leaving period from the newest: in the ring when
        // 0 ≤ dist < w (periods + k ≥ gap, and it is not before period 0).
        let back = periods.wrapping_sub(k);
        let dist = back.wrapping_sub(gap);
        let in_window = mask_lt(k, periods) & !mask_lt(back, gap) & mask_lt(dist, w);
        let leaving_slot = (newest.wrapping_sub(dist) & MASK) as usize;
        let leaving = u64::from(state.counts[leaving_slot]) & in_window;
        // Never below zero (a count is in the total it leaves): the smaller
        // of the two is taken off.
        remaining -= remaining ^ ((leaving ^ remaining) & mask_lt(leaving, remaining));
        let fits = !mask_lt(params.quota, remaining + cost);
        let now_found = fits & mask_lt(k, periods) & !found;
        first |= k & now_found;
        found |= now_found;
        k += 1;
    }
    let k = (first & found) | (periods.clamp(1, MAX_PERIODS) & !found);
    let ready = (now_period + k).saturating_mul(params.period_ns);
    Decision::deny(room, ready.saturating_sub(now_ns))
}

/// Makes a fresh `state` one that admitted `n` units at `now_ns` (at most the
/// rate cap): what [`decide`] leaves after admitting them, without the check.
#[inline(always)]
pub fn charged(state: &mut State, params: &Params, now_ns: u64, n: u64) {
    let period = div(now_ns, params.period_ns);
    state.period = period;
    state.counts[(period & MASK) as usize] = if n < params.rate_cap {
        n
    } else {
        params.rate_cap
    } as u32;
}

/// Returns `cost` unused units to the current period's count (and so the window's).
#[inline(always)]
pub fn refund(state: &mut State, params: &Params, now_ns: u64, cost: u64) {
    let now_period = div(now_ns, params.period_ns);
    if now_period == state.period {
        let slot = &mut state.counts[(now_period & MASK) as usize];
        *slot = slot.saturating_sub(cost.min(u64::from(u32::MAX)) as u32);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // The decision as it was written before the loops lost their branches
    // (one period at a time, stopping at the first that frees enough): the
    // reference the branch-free one must equal, decision and state alike.
    /// The count of period `q` in `state`: kept for the last `periods` periods up to
    /// the state's newest, zero before that.
    fn reference_count(state: &State, params: &Params, q: u64) -> u64 {
        if q <= state.period && state.period - q < params.periods {
            u64::from(state.counts[(q & MASK) as usize])
        } else {
            0
        }
    }

    /// Decides one arrival of `cost` at `now_ns`; only an admission changes `state`
    /// (periods that left the window are cleared then).
    fn reference_decide(state: &mut State, params: &Params, now_ns: u64, cost: u64) -> Decision {
        // A clock behind the state's newest period is judged in that period.
        let now_period = div(now_ns, params.period_ns).max(state.period);
        let current = reference_count(state, params, now_period);
        let mut total = 0u64;
        let mut i = 0;
        while i < MAX_PERIODS && i < params.periods && i <= now_period {
            total += reference_count(state, params, now_period - i);
            i += 1;
        }
        let room = params
            .quota
            .saturating_sub(total)
            .min(params.rate_cap.saturating_sub(current));
        if cost > params.rate_cap {
            return Decision::deny(room, NEVER);
        }
        if current + cost <= params.rate_cap && total + cost <= params.quota {
            // Clear the ring slots of the periods after the state's newest.
            let mut q = state.period + 1;
            let mut n = 0;
            while n < MAX_PERIODS && q <= now_period {
                state.counts[(q & MASK) as usize] = 0;
                q += 1;
                n += 1;
            }
            state.period = now_period;
            state.counts[(now_period & MASK) as usize] = (current + cost) as u32;
            return Decision::allow(room - cost);
        }
        // From the next period on the period cap is free (cost ≤ rate_cap); the
        // quota frees as old periods leave the window, one per period.
        let mut remaining = total;
        let mut k = 1;
        while k < MAX_PERIODS && k < params.periods {
            let leaving = now_period + k;
            if leaving >= params.periods {
                remaining -=
                    reference_count(state, params, leaving - params.periods).min(remaining);
            }
            if remaining + cost <= params.quota {
                break;
            }
            k += 1;
        }
        let ready = (now_period + k).saturating_mul(params.period_ns);
        Decision::deny(room, ready.saturating_sub(now_ns))
    }

    /// A small deterministic generator (no dependency for one test).
    fn next(x: &mut u64) -> u64 {
        *x ^= *x << 13;
        *x ^= *x >> 7;
        *x ^= *x << 17;
        *x
    }

    #[test]
    fn equals_the_period_by_period_reference() {
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        for _ in 0..3000 {
            let periods = 1 + next(&mut x) % MAX_PERIODS;
            let period = 1 + next(&mut x) % 1000;
            let quota = 1 + next(&mut x) % 40;
            let rate_cap = 1 + next(&mut x) % quota;
            let p = Params::new(period * periods, period, quota, rate_cap).unwrap();
            let (mut a, mut b) = (State::default(), State::default());
            let mut t = next(&mut x) % (period * 200);
            for _ in 0..60 {
                // Mostly small steps, sometimes a jump past the window, and
                // sometimes a clock behind the newest period.
                t = match next(&mut x) % 10 {
                    0 => t + period * (next(&mut x) % 140),
                    1 => t.saturating_sub(next(&mut x) % (2 * period)),
                    _ => t + next(&mut x) % period,
                };
                let cost = 1 + next(&mut x) % (rate_cap + 1);
                let got = decide(&mut a, &p, t, cost);
                let want = reference_decide(&mut b, &p, t, cost);
                assert_eq!(got, want, "{p:?} at {t} cost {cost}");
                assert_eq!(a, b, "{p:?} at {t} cost {cost}");
            }
        }
    }

    const MS: u64 = 1_000_000;

    #[test]
    fn issue_vector_q5_per_4s_p1s_r2() {
        let p = Params::new(4000 * MS, 1000 * MS, 5, 2).unwrap();
        let mut s = State::default();
        let got = [0, 100, 200, 1000, 1500, 2000, 2100, 3500, 4000]
            .map(|t| decide(&mut s, &p, t * MS, 1).allowed);
        assert_eq!(
            got,
            [true, true, false, true, true, true, false, false, true]
        );
    }

    #[test]
    fn retry_after_waits_for_the_quota_to_roll() {
        let p = Params::new(4000 * MS, 1000 * MS, 5, 2).unwrap();
        let mut s = State::default();
        for t in [0, 0, 1000, 1000, 2000] {
            assert!(decide(&mut s, &p, t * MS, 1).allowed);
        }
        // Quota full at 2100: the two from period 0 leave at 4000.
        let d = decide(&mut s, &p, 2100 * MS, 1);
        assert_eq!((d.allowed, d.retry_after_ns), (false, 1900 * MS));
        assert!(!decide(&mut s, &p, 3999 * MS, 1).allowed);
        assert!(decide(&mut s, &p, 4000 * MS, 1).allowed);
    }

    #[test]
    fn refused_params() {
        assert_eq!(
            Params::new(3500 * MS, 1000 * MS, 5, 2).unwrap_err().param,
            "window"
        );
        assert_eq!(Params::new(65 * MS, MS, 5, 2).unwrap_err().param, "window");
        assert_eq!(Params::new(4 * MS, MS, 5, 6).unwrap_err().param, "rate_cap");
    }
}
