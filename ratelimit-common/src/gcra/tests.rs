//! GCRA against a fake clock: admissions, retry-after, generations, refunds
//! and the debt helpers the fleet uses.

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
