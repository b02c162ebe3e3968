//! Sliding window log: an arrival of cost `n` at `now` is admitted iff
//! the cost admitted in `(now − window, now]` plus `n` is at most `limit`. Only
//! admitted arrivals are logged, one entry per unit of cost, so memory is
//! O(limit): limits above [`MAX_LIMIT`] are refused (use the sliding window
//! counter for those).
//!
//! Guarantee: at most `limit` in every span of `window_ns`, exactly.

use crate::{Decision, NEVER, ParamError};

/// Largest limit: the log holds one 8-byte timestamp per unit.
pub const MAX_LIMIT: u64 = 64;

/// Parameters, validated on the host.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Params {
    /// Window length, ns (`--window`).
    pub window_ns: u64,
    /// Admitted cost per window (`--limit`), at most [`MAX_LIMIT`].
    pub limit: u64,
}

/// Per-key state: a ring of admission times, oldest first from `head`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct State {
    /// Index of the oldest entry.
    pub head: u32,
    /// Number of entries.
    pub len: u32,
    /// Admission times, ns.
    pub times: [u64; MAX_LIMIT as usize],
}

impl Default for State {
    fn default() -> Self {
        Self {
            head: 0,
            len: 0,
            times: [0; MAX_LIMIT as usize],
        }
    }
}

impl Params {
    /// Checks and builds parameters.
    pub const fn new(window_ns: u64, limit: u64) -> Result<Self, ParamError> {
        if let Err(e) = ParamError::window_and_limit(
            window_ns,
            limit,
            MAX_LIMIT,
            "must be 1 to 64 for the sliding window log (one timestamp per unit is kept); use the sliding-window algorithm for larger limits",
        ) {
            return Err(e);
        }
        Ok(Self { window_ns, limit })
    }
}

const MASK: u32 = MAX_LIMIT as u32 - 1;
const _: () = assert!(MAX_LIMIT.is_power_of_two());

/// Decides one arrival of `cost` at `now_ns`; only an admission changes `state`
/// (expired entries are dropped from the log then).
#[inline(always)]
pub fn decide(state: &mut State, params: &Params, now_ns: u64, cost: u64) -> Decision {
    // Entries at or before now − window have expired. Times are in order; a
    // clock slightly behind keeps every entry (conservative).
    let horizon = now_ns.saturating_sub(params.window_ns);
    let mut head = state.head & MASK;
    let mut len = state.len.min(MAX_LIMIT as u32);
    let mut i = 0;
    while i < MAX_LIMIT as u32 && len > 0 {
        if now_ns >= params.window_ns && state.times[(head & MASK) as usize] <= horizon {
            head = (head + 1) & MASK;
            len -= 1;
        } else {
            break;
        }
        i += 1;
    }
    let live = u64::from(len);
    if cost > params.limit {
        return Decision::deny(params.limit.saturating_sub(live), NEVER);
    }
    if live + cost <= params.limit {
        let mut k = 0;
        while k < MAX_LIMIT && k < cost {
            state.times[((head + len) & MASK) as usize] = now_ns;
            len += 1;
            k += 1;
        }
        state.head = head;
        state.len = len;
        return Decision::allow(params.limit - live - cost);
    }
    // Wait until enough of the oldest entries expire.
    let expire = live + cost - params.limit; // ≥ 1
    let oldest_needed = state.times[((head + expire as u32 - 1) & MASK) as usize];
    let ready = oldest_needed.saturating_add(params.window_ns);
    Decision::deny(params.limit - live, ready.saturating_sub(now_ns).max(1))
}

/// Makes a fresh `state` one that admitted `n` units at `now_ns` (at most the
/// limit): what [`decide`] leaves after admitting them, without the check.
#[inline(always)]
pub fn charged(state: &mut State, params: &Params, now_ns: u64, n: u64) {
    let n = if n < params.limit { n } else { params.limit };
    let mut k = 0;
    while k < MAX_LIMIT && k < n {
        state.times[k as usize] = now_ns;
        k += 1;
    }
    state.head = 0;
    state.len = k as u32;
}

/// Returns `cost` unused units: the newest entries are removed from the log.
#[inline(always)]
pub fn refund(state: &mut State, _params: &Params, _now_ns: u64, cost: u64) {
    let n = cost.min(u64::from(state.len)) as u32;
    state.len -= n;
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    #[test]
    fn issue_vector_w1000_l3() {
        let p = Params::new(1000 * MS, 3).unwrap();
        let mut s = State::default();
        let got = [0, 200, 400, 600, 1000, 1100, 1200, 1300]
            .map(|t| decide(&mut s, &p, t * MS, 1).allowed);
        assert_eq!(got, [true, true, true, false, true, false, true, false]);
    }

    #[test]
    fn retry_after_points_at_the_expiry_that_makes_room() {
        let p = Params::new(1000 * MS, 3).unwrap();
        let mut s = State::default();
        for t in [100, 200, 300] {
            assert!(decide(&mut s, &p, t * MS, 1).allowed);
        }
        let d = decide(&mut s, &p, 500 * MS, 2);
        assert!(!d.allowed);
        // Two entries must expire: the second oldest (200) at 1200.
        assert_eq!(d.retry_after_ns, 700 * MS);
        assert!(!decide(&mut s, &p, 1200 * MS - 1, 2).allowed);
        assert!(decide(&mut s, &p, 1200 * MS, 2).allowed);
    }

    #[test]
    fn limits_above_the_maximum_point_to_the_counter() {
        let e = Params::new(MS, 65).unwrap_err();
        assert!(e.accepted.contains("sliding-window"));
    }
}
