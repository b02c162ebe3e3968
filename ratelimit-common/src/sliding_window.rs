//! Sliding window counter: counts of the previous and the current
//! aligned window; with `e` the time into the current window, an arrival of cost
//! `n` is admitted iff `prev·(W − e) + (cur + n)·W ≤ limit·W`, the previous window
//! weighted by how much of it the sliding window still covers.
//!
//! Times are compared in units of `unit_ns` (a power of two chosen on the host so
//! that `W / unit ≤ 2^31`), which keeps every product below 2^64 with limits up to
//! 2^31. Guarantee: at most `limit` per aligned window, and fewer than `2·limit`
//! in any span of `W` (the weighting assumes the previous window's arrivals were
//! spread evenly).

use crate::{Decision, NEVER, ParamError, div};

/// Parameters, validated on the host.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Params {
    /// Window length, ns (`--window`).
    pub window_ns: u64,
    /// Admitted cost per window (`--limit`).
    pub limit: u64,
    /// Time unit of the weighting, ns.
    pub unit_ns: u64,
    /// `window_ns / unit_ns`.
    pub window_units: u64,
}

/// Per-key state.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct State {
    /// Index of the current window (`now / window_ns`).
    pub window: u64,
    /// Cost admitted in the previous window.
    pub prev: u32,
    /// Cost admitted in the current window.
    pub cur: u32,
}

/// Largest limit.
pub const MAX_LIMIT: u64 = 1 << 31;

impl Params {
    /// Checks and builds parameters.
    pub const fn new(window_ns: u64, limit: u64) -> Result<Self, ParamError> {
        if let Err(e) =
            ParamError::window_and_limit(window_ns, limit, MAX_LIMIT, "must be 1 to 2^31")
        {
            return Err(e);
        }
        // The finest unit (1 ns when it fits) for which the weighted sums stay
        // in 64 bits: limit × window units ≤ 2^62.
        let mut unit_ns = 1;
        while (window_ns / unit_ns).saturating_mul(limit) > (1 << 62) {
            unit_ns *= 2;
        }
        Ok(Self {
            window_ns,
            limit,
            unit_ns,
            window_units: window_ns / unit_ns,
        })
    }
}

/// Decides one arrival of `cost` at `now_ns`; only an admission changes `state`.
#[inline(always)]
pub fn decide(state: &mut State, params: &Params, now_ns: u64, cost: u64) -> Decision {
    let index = div(now_ns, params.window_ns);
    let (prev, cur) = if index == state.window {
        (u64::from(state.prev), u64::from(state.cur))
    } else if index == state.window.wrapping_add(1) {
        (u64::from(state.cur), 0)
    } else if index > state.window {
        (0, 0)
    } else {
        // A clock behind the state's window: judge by the state as it is.
        (u64::from(state.prev), u64::from(state.cur))
    };
    let index = index.max(state.window);
    let into = div(
        now_ns.saturating_sub(index.wrapping_mul(params.window_ns)),
        params.unit_ns,
    );
    let into = into.min(params.window_units);
    let w = params.window_units;
    // prev, cur ≤ limit and limit × w ≤ 2^62: the sums below stay under 2^64.
    let weighted_prev = prev * (w - into);
    let budget = params.limit * w;
    let used = weighted_prev + cur * w;
    let room = div(budget.saturating_sub(used), w);
    if cost > params.limit {
        return Decision::deny(room, NEVER);
    }
    if used + cost * w <= budget {
        *state = State {
            window: index,
            prev: prev as u32,
            cur: (cur + cost) as u32,
        };
        return Decision::allow(room - cost);
    }
    // The first unit at which the arrival fits. In this window the previous
    // window's weight falls by `prev` per unit; if this window alone is too full,
    // in the next one, where this window's count is the previous one.
    let window_start = index.wrapping_mul(params.window_ns);
    let ready = if cur + cost <= params.limit {
        // need ≤ prev × (w − into), so prev > 0 and into + k ≤ w.
        let need = used + cost * w - budget;
        let k = div(need + prev - 1, prev);
        window_start.saturating_add((into + k).saturating_mul(params.unit_ns))
    } else {
        // cur ≥ 1 here (cost ≤ limit < cur + cost).
        let need = (cur + cost - params.limit) * w;
        let k = div(need + cur - 1, cur);
        (index + 1)
            .saturating_mul(params.window_ns)
            .saturating_add(k.saturating_mul(params.unit_ns))
    };
    Decision::deny(room, ready.saturating_sub(now_ns).max(1))
}

/// Makes a fresh `state` one that admitted `n` units at `now_ns` (at most the
/// limit): what [`decide`] leaves after admitting them, without the check.
#[inline(always)]
pub fn charged(state: &mut State, params: &Params, now_ns: u64, n: u64) {
    state.window = div(now_ns, params.window_ns);
    state.prev = 0;
    state.cur = if n < params.limit { n } else { params.limit } as u32;
}

/// Returns `cost` unused units to the current window's count.
#[inline(always)]
pub fn refund(state: &mut State, params: &Params, now_ns: u64, cost: u64) {
    if state.window == div(now_ns, params.window_ns) {
        state.cur = state
            .cur
            .saturating_sub(cost.min(u64::from(u32::MAX)) as u32);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: u64 = 1_000_000_000;

    #[test]
    fn issue_vector_prev42_cur18_15s_in() {
        let p = Params::new(60 * S, 50).unwrap();
        let mut s = State {
            window: 10,
            prev: 42,
            cur: 18,
        };
        let d = decide(&mut s, &p, 10 * 60 * S + 15 * S, 1);
        assert!(!d.allowed, "42·45 + 19·60 = 3030 > 3000");
        assert_eq!(
            s,
            State {
                window: 10,
                prev: 42,
                cur: 18
            }
        );
        // Later in the window the previous one weighs less.
        let d = decide(&mut s, &p, 10 * 60 * S + 17 * S, 1);
        assert!(d.allowed, "42·43 + 19·60 = 2946 ≤ 3000");
    }

    #[test]
    fn windows_roll_over() {
        let p = Params::new(S, 10).unwrap();
        let mut s = State::default();
        for _ in 0..10 {
            assert!(decide(&mut s, &p, 0, 1).allowed);
        }
        assert!(!decide(&mut s, &p, S / 2, 1).allowed);
        // At the start of window 1, the previous 10 weigh fully.
        assert!(!decide(&mut s, &p, S, 1).allowed);
        // Halfway through window 1 they weigh 5.
        let admitted = (0..10)
            .filter(|_| decide(&mut s, &p, S + S / 2, 1).allowed)
            .count();
        assert_eq!(admitted, 5);
        // Two windows on, nothing weighs.
        let admitted = (0..20)
            .filter(|_| decide(&mut s, &p, 3 * S, 1).allowed)
            .count();
        assert_eq!(admitted, 10);
    }

    #[test]
    fn long_windows_do_not_overflow() {
        let p = Params::new(86_400 * S, 1 << 31).unwrap();
        assert!(p.window_units <= 1 << 31);
        let mut s = State::default();
        assert!(decide(&mut s, &p, 5 * 86_400 * S, 1 << 31).allowed);
        assert!(!decide(&mut s, &p, 5 * 86_400 * S + 1, 1).allowed);
    }
}
