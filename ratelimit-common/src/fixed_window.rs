//! Fixed window counter: windows are the multiples of `window_ns` on
//! the clock; an arrival is admitted iff `count + cost ≤ limit` in its window.
//! Denied arrivals are not counted.
//!
//! Guarantee: at most `limit` per aligned window, but up to `2·limit` in a span of
//! `window_ns` that straddles a boundary.

use crate::{Decision, NEVER, ParamError, div};

/// Parameters, validated on the host.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Params {
    /// Window length, ns (`--window`).
    pub window_ns: u64,
    /// Admitted cost per window (`--limit`).
    pub limit: u64,
}

/// Per-key state.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct State {
    /// Index of the window counted (`now / window_ns`).
    pub window: u64,
    /// Cost admitted in that window.
    pub count: u64,
}

impl Params {
    /// Checks and builds parameters.
    pub const fn new(window_ns: u64, limit: u64) -> Result<Self, ParamError> {
        if let Err(e) = ParamError::window_and_limit(
            window_ns,
            limit,
            u32::MAX as u64,
            "must be 1 to 4294967295",
        ) {
            return Err(e);
        }
        Ok(Self { window_ns, limit })
    }
}

/// Decides one arrival of `cost` at `now_ns`; only an admission changes `state`.
#[inline(always)]
pub fn decide(state: &mut State, params: &Params, now_ns: u64, cost: u64) -> Decision {
    let index = div(now_ns, params.window_ns);
    let count = if state.window == index {
        state.count
    } else {
        0
    };
    if cost > params.limit {
        return Decision::deny(params.limit - count, NEVER);
    }
    if count + cost <= params.limit {
        *state = State {
            window: index,
            count: count + cost,
        };
        return Decision::allow(params.limit - count - cost);
    }
    let next = (index + 1).saturating_mul(params.window_ns);
    Decision::deny(params.limit - count, next - now_ns)
}

/// Makes a fresh `state` one that admitted `n` units at `now_ns` (at most the
/// limit): what [`decide`] leaves after admitting them, without the check.
#[inline(always)]
pub fn charged(state: &mut State, params: &Params, now_ns: u64, n: u64) {
    state.window = div(now_ns, params.window_ns);
    state.count = if n < params.limit { n } else { params.limit };
}

/// Returns `cost` unused units to the current window's count.
#[inline(always)]
pub fn refund(state: &mut State, params: &Params, now_ns: u64, cost: u64) {
    if state.window == div(now_ns, params.window_ns) {
        state.count = state.count.saturating_sub(cost);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    #[test]
    fn issue_vector_w1000_l3() {
        let p = Params::new(1000 * MS, 3).unwrap();
        let mut s = State::default();
        let got = [100, 200, 300, 400, 1000].map(|t| decide(&mut s, &p, t * MS, 1).allowed);
        assert_eq!(got, [true, true, true, false, true]);
    }

    #[test]
    fn retry_after_is_the_next_window() {
        let p = Params::new(1000 * MS, 1).unwrap();
        let mut s = State::default();
        assert!(decide(&mut s, &p, 250 * MS, 1).allowed);
        let d = decide(&mut s, &p, 400 * MS, 1);
        assert_eq!((d.allowed, d.retry_after_ns), (false, 600 * MS));
        assert_eq!(decide(&mut s, &p, 0, 2).retry_after_ns, NEVER);
    }
}
