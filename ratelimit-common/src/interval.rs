//! Token bucket with interval refill: every `every_ns` add `amount`
//! tokens, up to `capacity`. A bucket starts full at the key's first admitted
//! arrival (a denied one stores nothing), and refills are counted lazily from
//! that arrival: at `first + k·every_ns`.
//!
//! Guarantee: in any span of time T, at most `capacity + amount·(⌊T / every_ns⌋ + 1)`
//! units are admitted. Unlike greedy refill, tokens arrive in steps, so a drained
//! source waits for the next step.

use crate::{Decision, NEVER, ParamError, div};

/// Parameters, validated on the host.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Params {
    /// Refill period, ns (`--refill-every`).
    pub every_ns: u64,
    /// Tokens added per period (`--refill-amount`).
    pub amount: u64,
    /// Bucket size (`--capacity`).
    pub capacity: u64,
}

/// Per-key state.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct State {
    /// Time of the last refill step counted, ns; 0 before the first arrival.
    pub anchor_ns: u64,
    /// Tokens in the bucket at `anchor_ns`.
    pub tokens: u64,
    /// 1 once the key has been seen.
    pub started: u64,
}

/// Largest capacity or amount.
pub const MAX: u64 = 1 << 32;

impl Params {
    /// Checks and builds parameters.
    pub const fn new(every_ns: u64, amount: u64, capacity: u64) -> Result<Self, ParamError> {
        ensure!(
            every_ns > 0,
            "refill_every",
            "must be longer than 0, like 1s or 200ms"
        );
        ensure!(
            amount > 0 && amount <= MAX,
            "refill_amount",
            "must be 1 to 2^32"
        );
        ensure!(
            capacity > 0 && capacity <= MAX,
            "capacity",
            "must be 1 to 2^32"
        );
        Ok(Self {
            every_ns,
            amount,
            capacity,
        })
    }
}

/// Decides one arrival of `cost` at `now_ns`; only an admission changes `state`.
#[inline(always)]
pub fn decide(state: &mut State, params: &Params, now_ns: u64, cost: u64) -> Decision {
    let (anchor, tokens) = if state.started == 0 {
        (now_ns, params.capacity)
    } else {
        // A clock slightly behind the anchor counts no step.
        let steps = div(now_ns.saturating_sub(state.anchor_ns), params.every_ns);
        // steps < capacity ≤ 2^32 and amount ≤ 2^32: no overflow (and no 128-bit
        // multiply, which the BPF target lacks).
        let added = if steps >= params.capacity {
            params.capacity
        } else {
            steps * params.amount
        };
        let tokens = state.tokens.saturating_add(added);
        let tokens = if tokens > params.capacity {
            params.capacity
        } else {
            tokens
        };
        (
            state
                .anchor_ns
                .wrapping_add(steps.wrapping_mul(params.every_ns)),
            tokens,
        )
    };
    if cost > params.capacity {
        return Decision::deny(tokens, NEVER);
    }
    if cost <= tokens {
        *state = State {
            anchor_ns: anchor,
            tokens: tokens - cost,
            started: 1,
        };
        return Decision::allow(tokens - cost);
    }
    // Steps needed to have `cost` tokens.
    let missing = cost - tokens;
    let steps = div(missing + params.amount - 1, params.amount);
    let ready = anchor.saturating_add(steps.saturating_mul(params.every_ns));
    Decision::deny(tokens, ready.saturating_sub(now_ns))
}

/// Makes a fresh `state` one that admitted `n` units at `now_ns` (at most the
/// capacity): what [`decide`] leaves after admitting them, without the check.
#[inline(always)]
pub fn charged(state: &mut State, params: &Params, now_ns: u64, n: u64) {
    state.anchor_ns = now_ns;
    state.tokens = params.capacity.saturating_sub(n);
    state.started = 1;
}

/// Returns `cost` unused tokens, never above capacity.
#[inline(always)]
pub fn refund(state: &mut State, params: &Params, _now_ns: u64, cost: u64) {
    if state.started != 0 {
        state.tokens = state.tokens.saturating_add(cost).min(params.capacity);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    #[test]
    fn issue_vector_f200_m2_p1() {
        let p = Params::new(200 * MS, 1, 2).unwrap();
        let mut s = State::default();
        let got: [bool; 5] = [0, 0, 0, 200, 200].map(|t| decide(&mut s, &p, t * MS, 1).allowed);
        assert_eq!(got, [true, true, false, true, false]);
    }

    #[test]
    fn refills_count_from_the_first_arrival_and_cap() {
        let p = Params::new(100 * MS, 2, 5).unwrap();
        let mut s = State::default();
        assert!(decide(&mut s, &p, 50 * MS, 5).allowed);
        // 149 ms: no step yet (first step at 150).
        let d = decide(&mut s, &p, 149 * MS, 1);
        assert!(!d.allowed);
        assert_eq!(d.retry_after_ns, MS);
        assert!(decide(&mut s, &p, 150 * MS, 2).allowed);
        // Long idle: capped at 5.
        assert!(decide(&mut s, &p, 10_000 * MS, 5).allowed);
        assert!(!decide(&mut s, &p, 10_000 * MS, 1).allowed);
    }

    #[test]
    fn cost_above_capacity_never_and_denial_changes_nothing() {
        let p = Params::new(MS, 1, 3).unwrap();
        let mut s = State::default();
        assert_eq!(decide(&mut s, &p, 0, 4).retry_after_ns, NEVER);
        assert_eq!(s, State::default());
    }

    #[test]
    fn refused_params() {
        assert_eq!(Params::new(0, 1, 1).unwrap_err().param, "refill_every");
        assert_eq!(Params::new(1, 0, 1).unwrap_err().param, "refill_amount");
        assert_eq!(Params::new(1, 1, 0).unwrap_err().param, "capacity");
    }
}
