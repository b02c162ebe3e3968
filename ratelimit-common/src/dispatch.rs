//! One dispatch over the algorithms, for the three things their users ask of
//! them ([`Op`]): decide an arrival, charge a fresh state with what its key
//! was admitted before it had one, give back units not used.
//!
//! [`Ops`] is each algorithm's answer to the three, and [`Ops::apply`] picks
//! one by the [`Op`]. On top of it:
//! - [`wide`], the XDP program's one dispatch: a wide state's body
//!   ([`crate::WideState::body`]) by the rule's [`algorithm`] id. The program's
//!   decision (under the state's lock), its refund (when the aggregate then
//!   refuses) and its promotion of a new key (the charge) all call it; the
//!   program supplies the clock, the state and the cost, this decides.
//! - the keyed limiter ([`crate::keyed`], `std`), which keeps its states
//!   typed and dispatches over them with the same [`Ops::apply`].
//!
//! Everything is `#[inline(always)]`: each use in the program passes its
//! [`Op`] as a constant, so it gets only its own operation's code, and the
//! verifier walks no operation a use does not ask for.

use crate::{
    AlgoParams, Decision, WIDE_WORDS, algorithm, fixed_window, gcra, interval, rolling_quota,
    sliding_log, sliding_window,
};

/// What a use asks of an algorithm.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    /// Decide an arrival of `cost`: the algorithm's `decide`.
    Decide,
    /// Make a fresh state one that admitted `cost` units: the algorithm's
    /// `charged` (for what a key got before it had a state; see
    /// [`crate::doorkeeper`]).
    Charge,
    /// Give back `cost` units admitted but not used: the algorithm's `refund`
    /// (never above the capacity).
    Refund,
}

/// What [`Op::Charge`] and [`Op::Refund`] answer: they decide nothing.
pub const DONE: Decision = Decision::allow(0);

/// One algorithm's answer to each [`Op`]: its state, its parameters and its
/// three functions.
pub trait Ops {
    /// The per-key state.
    type State;
    /// The parameters, built and validated on the host.
    type Params;

    /// Decides one arrival of `cost` at `now_ns`.
    fn decide(state: &mut Self::State, params: &Self::Params, now_ns: u64, cost: u64) -> Decision;

    /// Makes a fresh `state` one that admitted `n` units at `now_ns`.
    fn charged(state: &mut Self::State, params: &Self::Params, now_ns: u64, n: u64);

    /// Gives back `cost` unused units.
    fn refund(state: &mut Self::State, params: &Self::Params, now_ns: u64, cost: u64);

    /// `op` for `cost` units: the decision for [`Op::Decide`], [`DONE`] for
    /// the others.
    #[inline(always)]
    fn apply(
        op: Op,
        state: &mut Self::State,
        params: &Self::Params,
        now_ns: u64,
        cost: u64,
    ) -> Decision {
        match op {
            Op::Decide => Self::decide(state, params, now_ns, cost),
            Op::Charge => {
                Self::charged(state, params, now_ns, cost);
                DONE
            }
            Op::Refund => {
                Self::refund(state, params, now_ns, cost);
                DONE
            }
        }
    }
}

/// Implements [`Ops`] for `$name` with the functions of module `$m`.
macro_rules! ops {
    ($(#[$doc:meta])* $name:ident, $m:ident) => {
        $(#[$doc])*
        #[derive(Clone, Copy, Debug)]
        pub struct $name;

        impl Ops for $name {
            type State = $m::State;
            type Params = $m::Params;

            #[inline(always)]
            fn decide(state: &mut $m::State, params: &$m::Params, now_ns: u64, cost: u64) -> Decision {
                $m::decide(state, params, now_ns, cost)
            }

            #[inline(always)]
            fn charged(state: &mut $m::State, params: &$m::Params, now_ns: u64, n: u64) {
                $m::charged(state, params, now_ns, n)
            }

            #[inline(always)]
            fn refund(state: &mut $m::State, params: &$m::Params, now_ns: u64, cost: u64) {
                $m::refund(state, params, now_ns, cost)
            }
        }
    };
}

ops!(
    /// Token bucket, interval refill ([`interval`]).
    Interval,
    interval
);
ops!(
    /// Fixed window counter ([`fixed_window`]).
    FixedWindow,
    fixed_window
);
ops!(
    /// Sliding window log ([`sliding_log`]).
    SlidingLog,
    sliding_log
);
ops!(
    /// Sliding window counter ([`sliding_window`]).
    SlidingWindow,
    sliding_window
);
ops!(
    /// Rolling-window quota with a rate cap ([`rolling_quota`]).
    RollingQuota,
    rolling_quota
);

/// Token bucket, greedy refill, as GCRA ([`gcra`]). Its `charged` is a full
/// bucket charged with [`gcra::charge`].
#[derive(Clone, Copy, Debug)]
pub struct Gcra;

impl Ops for Gcra {
    type State = gcra::State;
    type Params = gcra::Params;

    #[inline(always)]
    fn decide(state: &mut gcra::State, params: &gcra::Params, now_ns: u64, cost: u64) -> Decision {
        gcra::decide(state, params, now_ns, cost)
    }

    #[inline(always)]
    fn charged(state: &mut gcra::State, params: &gcra::Params, now_ns: u64, n: u64) {
        *state = gcra::State::full(now_ns, params);
        gcra::charge(state, params, now_ns, n);
    }

    #[inline(always)]
    fn refund(state: &mut gcra::State, params: &gcra::Params, now_ns: u64, cost: u64) {
        gcra::refund(state, params, now_ns, cost)
    }
}

/// Runs `op` for `cost` units on a wide state's body under `algorithm` (one
/// of [`algorithm`], GCRA aside: its state is one word, kept apart), with the
/// rule's `params`. An algorithm this code does not know decides `allowed`
/// and changes nothing.
#[inline(always)]
pub fn wide(
    algorithm: u8,
    op: Op,
    body: &mut [u64; WIDE_WORDS],
    params: &AlgoParams,
    now_ns: u64,
    cost: u64,
) -> Decision {
    // SAFETY: the `params` members are plain integers; see `AlgoParams`.
    unsafe {
        match algorithm {
            algorithm::INTERVAL => {
                Interval::apply(op, state_in(body), &params.interval, now_ns, cost)
            }
            algorithm::FIXED_WINDOW => {
                FixedWindow::apply(op, state_in(body), &params.fixed_window, now_ns, cost)
            }
            algorithm::SLIDING_LOG => {
                SlidingLog::apply(op, state_in(body), &params.sliding_log, now_ns, cost)
            }
            algorithm::SLIDING_WINDOW => {
                SlidingWindow::apply(op, state_in(body), &params.sliding_window, now_ns, cost)
            }
            algorithm::ROLLING_QUOTA => {
                RollingQuota::apply(op, state_in(body), &params.rolling_quota, now_ns, cost)
            }
            // An algorithm this program does not know: fail open.
            _ => DONE,
        }
    }
}

/// A wide state's body as the state of one algorithm.
///
/// # Safety
/// `S` is one of the wide algorithms' `State`s: plain integers, so any bytes
/// are one (the body of a fresh key is zeroes, its algorithm's empty state).
#[inline(always)]
unsafe fn state_in<S>(body: &mut [u64; WIDE_WORDS]) -> &mut S {
    const {
        assert!(core::mem::size_of::<S>() <= core::mem::size_of::<[u64; WIDE_WORDS]>());
        assert!(core::mem::align_of::<S>() <= core::mem::align_of::<u64>());
    }
    // SAFETY: fits and is aligned (asserted above); valid for any bytes (the
    // caller's contract); borrowed from `body` for as long as it is.
    unsafe { &mut *body.as_mut_ptr().cast::<S>() }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: u64 = 1_000_000_000;

    /// Each wide algorithm's rule parameters, as the daemon writes them.
    fn rules() -> [(u8, AlgoParams); 5] {
        [
            (
                algorithm::INTERVAL,
                AlgoParams::from_interval(interval::Params::new(S, 2, 5).unwrap()),
            ),
            (
                algorithm::FIXED_WINDOW,
                AlgoParams::from_fixed_window(fixed_window::Params::new(S, 5).unwrap()),
            ),
            (
                algorithm::SLIDING_LOG,
                AlgoParams::from_sliding_log(sliding_log::Params::new(S, 5).unwrap()),
            ),
            (
                algorithm::SLIDING_WINDOW,
                AlgoParams::from_sliding_window(sliding_window::Params::new(S, 5).unwrap()),
            ),
            (
                algorithm::ROLLING_QUOTA,
                AlgoParams::from_rolling_quota(
                    rolling_quota::Params::new(10 * S, S, 20, 5).unwrap(),
                ),
            ),
        ]
    }

    #[test]
    fn a_charged_body_admits_what_is_left_and_a_refund_gives_it_back() {
        for (algorithm, params) in rules() {
            let now = 7 * S;
            let mut body = [0; WIDE_WORDS];
            wide(algorithm, Op::Charge, &mut body, &params, now, 3);
            let admitted = (0..10)
                .filter(|_| wide(algorithm, Op::Decide, &mut body, &params, now, 1).allowed)
                .count();
            assert_eq!(admitted, 2, "algorithm {algorithm}: 5 less the 3 charged");
            wide(algorithm, Op::Refund, &mut body, &params, now, 1);
            assert!(
                wide(algorithm, Op::Decide, &mut body, &params, now, 1).allowed,
                "algorithm {algorithm}: the unit given back is there again"
            );
        }
    }

    #[test]
    fn the_body_holds_what_the_algorithm_alone_leaves() {
        let now = 3 * S;
        let [(_, iv), (_, fw), ..] = rules();
        let mut body = [0; WIDE_WORDS];
        let mut alone = interval::State::default();
        // SAFETY: interval's parameters, as the rule says.
        let p = unsafe { &iv.interval };
        assert_eq!(
            wide(algorithm::INTERVAL, Op::Decide, &mut body, &iv, now, 4),
            interval::decide(&mut alone, p, now, 4)
        );
        wide(algorithm::INTERVAL, Op::Refund, &mut body, &iv, now, 1);
        interval::refund(&mut alone, p, now, 1);
        assert_eq!(&body[..3], &[alone.anchor_ns, alone.tokens, alone.started]);

        let mut body = [0; WIDE_WORDS];
        let mut alone = fixed_window::State::default();
        // SAFETY: as above.
        let p = unsafe { &fw.fixed_window };
        wide(algorithm::FIXED_WINDOW, Op::Charge, &mut body, &fw, now, 2);
        fixed_window::charged(&mut alone, p, now, 2);
        assert_eq!(&body[..2], &[alone.window, alone.count]);
    }

    #[test]
    fn an_unknown_algorithm_fails_open_and_changes_nothing() {
        let (_, params) = rules()[0];
        let mut body = [0; WIDE_WORDS];
        for op in [Op::Decide, Op::Charge, Op::Refund] {
            assert!(wide(200, op, &mut body, &params, S, 1).allowed);
        }
        assert_eq!(body, [0; WIDE_WORDS]);
    }

    #[test]
    fn gcra_charged_is_a_full_bucket_charged() {
        let p = gcra::Params::from_rate(10, S, 10).unwrap();
        let mut s = gcra::State { tat: 12345 };
        Gcra::apply(Op::Charge, &mut s, &p, 5 * S, 4);
        let admitted = (0..20)
            .filter(|_| Gcra::apply(Op::Decide, &mut s, &p, 5 * S, 1).allowed)
            .count();
        assert_eq!(admitted, 6);
    }
}
