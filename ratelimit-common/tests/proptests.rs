//! Every algorithm against a plain reference model over random arrival
//! sequences: identical decisions, and in every window the admitted cost stays
//! within the documented bound.

use std::collections::HashMap;

use proptest::prelude::*;
use ratelimit_common::{fixed_window, gcra, interval, rolling_quota, sliding_log, sliding_window};

/// Arrivals: non-decreasing times (ns) with costs 1..=3.
fn arrivals(max_gap: u64) -> impl Strategy<Value = Vec<(u64, u64)>> {
    prop::collection::vec((0..max_gap, 1u64..=3), 1..200).prop_map(|v| {
        let mut t = 0;
        v.into_iter()
            .map(|(gap, cost)| {
                t += gap;
                (t, cost)
            })
            .collect()
    })
}

/// The most cost admitted in any span `[t, t + span)` that starts at an admission.
fn max_in_any_window(admitted: &[(u64, u64)], span: u64) -> u64 {
    admitted
        .iter()
        .map(|&(start, _)| {
            admitted
                .iter()
                .filter(|&&(t, _)| t >= start && t < start + span)
                .map(|&(_, c)| c)
                .sum::<u64>()
        })
        .max()
        .unwrap_or(0)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    /// GCRA against a bucket holding `level` ticks of tokens, refilled one tick
    /// per tick up to `tau`.
    #[test]
    fn gcra_matches_a_token_bucket(seq in arrivals(3_000), interval_ns in 1u64..500, cap in 1u64..8) {
        let p = gcra::Params::from_rate(1, interval_ns, cap).unwrap();
        let mut s = gcra::State::full(seq[0].0, &p);
        let tau = i128::from(p.tau);
        let i = i128::from(p.interval);
        let mut level = tau;
        let mut last = i128::from(seq[0].0) * 8192;
        let mut admitted = Vec::new();
        for &(t, n) in &seq {
            let now = i128::from(t) * 8192;
            level = (level + (now - last)).min(tau);
            last = now;
            let want = n <= cap && i128::from(n) * i <= level;
            if want {
                level -= i128::from(n) * i;
            }
            let got = gcra::decide(&mut s, &p, t, n).allowed;
            prop_assert_eq!(got, want, "at {} cost {}", t, n);
            if got {
                admitted.push((t, n));
            }
        }
        // In any span of 10 intervals: at most the burst plus 10.
        prop_assert!(max_in_any_window(&admitted, 10 * interval_ns) <= cap + 10);
    }

    #[test]
    fn interval_refill_matches_explicit_refills(seq in arrivals(300), every in 1u64..400, amount in 1u64..4, cap in 1u64..8) {
        let p = interval::Params::new(every, amount, cap).unwrap();
        let mut s = interval::State::default();
        // Refills count from the first admitted arrival: a denied one stores nothing.
        let mut first: Option<u64> = None;
        let mut tokens = cap;
        let mut steps_done = 0u64;
        let mut admitted = Vec::new();
        for &(t, n) in &seq {
            if let Some(first) = first {
                let steps = (t - first) / every;
                tokens = (tokens + (steps - steps_done) * amount).min(cap);
                steps_done = steps;
            }
            let want = n <= tokens;
            if want {
                tokens -= n;
                first.get_or_insert(t);
            }
            let got = interval::decide(&mut s, &p, t, n).allowed;
            prop_assert_eq!(got, want, "at {} cost {}", t, n);
            if got {
                admitted.push((t, n));
            }
        }
        prop_assert!(max_in_any_window(&admitted, 5 * every) <= cap + amount * (5 + 1));
    }

    #[test]
    fn fixed_window_matches_a_count_per_window(seq in arrivals(300), window in 1u64..2_000, limit in 1u64..10) {
        let p = fixed_window::Params::new(window, limit).unwrap();
        let mut s = fixed_window::State::default();
        let mut counts: HashMap<u64, u64> = HashMap::new();
        let mut admitted = Vec::new();
        for &(t, n) in &seq {
            let c = counts.entry(t / window).or_default();
            let want = *c + n <= limit;
            if want {
                *c += n;
            }
            let got = fixed_window::decide(&mut s, &p, t, n).allowed;
            prop_assert_eq!(got, want, "at {} cost {}", t, n);
            if got {
                admitted.push((t, n));
            }
        }
        prop_assert!(counts.values().all(|&c| c <= limit));
        prop_assert!(max_in_any_window(&admitted, window) <= 2 * limit);
    }

    #[test]
    fn sliding_log_matches_a_full_log(seq in arrivals(300), window in 1u64..2_000, limit in 1u64..=64) {
        let p = sliding_log::Params::new(window, limit).unwrap();
        let mut s = sliding_log::State::default();
        let mut log: Vec<u64> = Vec::new();
        let mut admitted = Vec::new();
        for &(t, n) in &seq {
            let live = log.iter().filter(|&&x| t < window || x > t - window).count() as u64;
            let want = live + n <= limit;
            if want {
                log.extend(std::iter::repeat_n(t, n as usize));
            }
            let got = sliding_log::decide(&mut s, &p, t, n).allowed;
            prop_assert_eq!(got, want, "at {} cost {}", t, n);
            if got {
                admitted.push((t, n));
            }
        }
        // Exact: at most `limit` in every window.
        prop_assert!(max_in_any_window(&admitted, window) <= limit);
    }

    #[test]
    fn sliding_window_matches_the_weighted_formula(seq in arrivals(300), window in 1u64..2_000, limit in 1u64..10) {
        let p = sliding_window::Params::new(window, limit).unwrap();
        let mut s = sliding_window::State::default();
        let mut counts: HashMap<u64, u64> = HashMap::new();
        let mut admitted = Vec::new();
        for &(t, n) in &seq {
            let w = t / window;
            let e = t - w * window;
            let prev = if w == 0 { 0 } else { counts.get(&(w - 1)).copied().unwrap_or(0) };
            let cur = counts.get(&w).copied().unwrap_or(0);
            let want = u128::from(prev) * u128::from(window - e) + u128::from(cur + n) * u128::from(window)
                <= u128::from(limit) * u128::from(window);
            if want {
                *counts.entry(w).or_default() += n;
            }
            let got = sliding_window::decide(&mut s, &p, t, n).allowed;
            prop_assert_eq!(got, want, "at {} cost {}", t, n);
            if got {
                admitted.push((t, n));
            }
        }
        prop_assert!(counts.values().all(|&c| c <= limit));
        prop_assert!(max_in_any_window(&admitted, window) < 2 * limit);
    }

    #[test]
    fn rolling_quota_matches_counts_per_period(seq in arrivals(300), period in 1u64..300, periods in 1u64..8, quota in 1u64..12, cap_quarters in 1u64..=4) {
        let rate_cap = (quota * cap_quarters / 4).max(1);
        let p = rolling_quota::Params::new(period * periods, period, quota, rate_cap).unwrap();
        let mut s = rolling_quota::State::default();
        let mut counts: HashMap<u64, u64> = HashMap::new();
        let mut admitted = Vec::new();
        for &(t, n) in &seq {
            let q = t / period;
            let cur = counts.get(&q).copied().unwrap_or(0);
            let total: u64 = (0..periods)
                .filter(|i| *i <= q)
                .map(|i| counts.get(&(q - i)).copied().unwrap_or(0))
                .sum();
            let want = cur + n <= rate_cap && total + n <= quota;
            if want {
                *counts.entry(q).or_default() += n;
            }
            let got = rolling_quota::decide(&mut s, &p, t, n).allowed;
            prop_assert_eq!(got, want, "at {} cost {}", t, n);
            if got {
                admitted.push((t, n));
            }
        }
        prop_assert!(counts.values().all(|&c| c <= rate_cap));
        prop_assert!(max_in_any_window(&admitted, period * periods) <= quota + rate_cap);
    }
}

/// `charged(n)` on a fresh state is what `decide(n)` leaves on one, for every
/// wide algorithm and every `n` a fresh state admits at once: a source promoted
/// by the doorkeeper is charged exactly what it got before.
mod charged {
    use super::*;

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(200))]

        #[test]
        fn equals_deciding_on_a_fresh_state(now in 0u64..1_000_000_000_000, n in 1u64..=64, limit in 64u64..200) {
            let w = 1_000_000_000;
            let p = fixed_window::Params::new(w, limit).unwrap();
            let (mut a, mut b) = (fixed_window::State::default(), fixed_window::State::default());
            fixed_window::charged(&mut a, &p, now, n);
            prop_assert!(fixed_window::decide(&mut b, &p, now, n).allowed);
            prop_assert_eq!(a, b);

            let p = sliding_window::Params::new(w, limit).unwrap();
            let (mut a, mut b) = (sliding_window::State::default(), sliding_window::State::default());
            sliding_window::charged(&mut a, &p, now, n);
            prop_assert!(sliding_window::decide(&mut b, &p, now, n).allowed);
            prop_assert_eq!(a, b);

            let p = interval::Params::new(w, 3, limit).unwrap();
            let (mut a, mut b) = (interval::State::default(), interval::State::default());
            interval::charged(&mut a, &p, now, n);
            prop_assert!(interval::decide(&mut b, &p, now, n).allowed);
            prop_assert_eq!(a, b);

            let p = sliding_log::Params::new(w, 64).unwrap();
            let (mut a, mut b) = (sliding_log::State::default(), sliding_log::State::default());
            sliding_log::charged(&mut a, &p, now, n);
            prop_assert!(sliding_log::decide(&mut b, &p, now, n).allowed);
            prop_assert_eq!(a, b);

            let p = rolling_quota::Params::new(24 * w, w, 10 * limit, limit).unwrap();
            let (mut a, mut b) = (rolling_quota::State::default(), rolling_quota::State::default());
            rolling_quota::charged(&mut a, &p, now, n);
            prop_assert!(rolling_quota::decide(&mut b, &p, now, n).allowed);
            prop_assert_eq!(a, b);
        }
    }
}

/// The edges: a burst is admitted whole at one instant for any rate (not only
/// whole-nanosecond intervals), and a reported wait is never early, even when
/// the clock steps back.
mod edges {
    use super::*;
    use ratelimit_common::{Decision, NEVER};

    /// Arrivals whose clock sometimes steps back (another CPU's reading, a
    /// test clock set back): times in ns from a large start.
    fn wobbly(max_gap: u64) -> impl Strategy<Value = Vec<(u64, u64)>> {
        prop::collection::vec((0..max_gap, 1u64..=3, 0u8..10), 1..150).prop_map(move |v| {
            let mut t = 1_000_000_000u64;
            v.into_iter()
                .map(|(gap, cost, back)| {
                    if back == 0 {
                        t = t.saturating_sub(gap / 2 + 1);
                    } else {
                        t += gap;
                    }
                    (t, cost)
                })
                .collect()
        })
    }

    /// After each denial with a finite wait `r` at `t`: the same arrival on a
    /// copy of the state is still denied at `t + r − 1` (never early) and, where
    /// `exact`, admitted at `t + r`.
    fn check<S: Clone>(
        seq: &[(u64, u64)],
        mut state: S,
        exact: bool,
        mut decide: impl FnMut(&mut S, u64, u64) -> Decision,
    ) -> Result<(), TestCaseError> {
        for &(t, n) in seq {
            let d = decide(&mut state, t, n);
            if d.allowed || d.retry_after_ns == NEVER {
                continue;
            }
            let r = d.retry_after_ns;
            prop_assert!(r >= 1, "a denial at {} with a wait of 0", t);
            prop_assert!(
                !decide(&mut state.clone(), t + r - 1, n).allowed,
                "denied at {} (cost {}) with a wait of {} ns, but admitted at {}",
                t,
                n,
                r,
                t + r - 1
            );
            if exact {
                prop_assert!(
                    decide(&mut state.clone(), t + r, n).allowed,
                    "denied at {} (cost {}) with a wait of {} ns, still denied then",
                    t,
                    n,
                    r
                );
            }
        }
        Ok(())
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(300))]

        #[test]
        fn gcra_admits_the_whole_burst_at_one_instant(tokens in 1u64..1_000_000, period in 1u64..100_000_000_000, burst in 1u64..=64, now in 0u64..1_000_000_000_000_000) {
            let Ok(p) = gcra::Params::from_rate(tokens, period, burst) else {
                return Ok(());
            };
            let mut s = gcra::State::full(now, &p);
            for k in 0..burst {
                let d = gcra::decide(&mut s, &p, now, 1);
                prop_assert!(d.allowed, "{}/{} ns burst {}: only {} of the burst at one instant", tokens, period, burst, k);
                prop_assert_eq!(d.remaining, burst - k - 1);
            }
            prop_assert!(!gcra::decide(&mut s, &p, now, 1).allowed);
        }

        #[test]
        fn gcra_waits_are_never_early_and_exact(wob in wobbly(3_000), seq in arrivals(3_000), tokens in 1u64..10, period in 1u64..3_000, cap in 1u64..8) {
            let p = gcra::Params::from_rate(tokens, period, cap).unwrap();
            check(&wob, gcra::State::full(wob[0].0, &p), false, |s, t, n| gcra::decide(s, &p, t, n))?;
            check(&seq, gcra::State::full(seq[0].0, &p), true, |s, t, n| gcra::decide(s, &p, t, n))?;
        }

        #[test]
        fn fixed_window_waits_are_never_early_and_exact(wob in wobbly(3_000), seq in arrivals(3_000), window in 1u64..2_000, limit in 1u64..10) {
            let p = fixed_window::Params::new(window, limit).unwrap();
            check(&wob, fixed_window::State::default(), false, |s, t, n| fixed_window::decide(s, &p, t, n))?;
            check(&seq, fixed_window::State::default(), true, |s, t, n| fixed_window::decide(s, &p, t, n))?;
        }

        #[test]
        fn interval_waits_are_never_early_and_exact(wob in wobbly(300), seq in arrivals(300), every in 1u64..400, amount in 1u64..4, cap in 1u64..8) {
            let p = interval::Params::new(every, amount, cap).unwrap();
            check(&wob, interval::State::default(), false, |s, t, n| interval::decide(s, &p, t, n))?;
            check(&seq, interval::State::default(), true, |s, t, n| interval::decide(s, &p, t, n))?;
        }

        #[test]
        fn sliding_log_waits_are_never_early_and_exact(wob in wobbly(3_000), seq in arrivals(3_000), window in 1u64..2_000, limit in 1u64..=64) {
            let p = sliding_log::Params::new(window, limit).unwrap();
            check(&wob, sliding_log::State::default(), false, |s, t, n| sliding_log::decide(s, &p, t, n))?;
            check(&seq, sliding_log::State::default(), true, |s, t, n| sliding_log::decide(s, &p, t, n))?;
        }

        #[test]
        fn sliding_window_waits_are_never_early_and_exact(wob in wobbly(3_000), seq in arrivals(3_000), window in 1u64..2_000, limit in 1u64..10) {
            let p = sliding_window::Params::new(window, limit).unwrap();
            check(&wob, sliding_window::State::default(), false, |s, t, n| sliding_window::decide(s, &p, t, n))?;
            check(&seq, sliding_window::State::default(), true, |s, t, n| sliding_window::decide(s, &p, t, n))?;
        }

        /// Regression: a 60 s window kept time in units of 32 ns, and its waits
        /// were late by up to a unit.
        #[test]
        fn sliding_window_over_a_minute_waits_to_the_nanosecond(seq in arrivals(60_000_000_000), limit in 1u64..1_000) {
            let p = sliding_window::Params::new(60_000_000_000, limit).unwrap();
            check(&seq, sliding_window::State::default(), true, |s, t, n| sliding_window::decide(s, &p, t, n))?;
        }

        #[test]
        fn rolling_quota_waits_are_never_early_and_exact(wob in wobbly(300), seq in arrivals(300), period in 1u64..300, periods in 1u64..8, quota in 1u64..12) {
            let p = rolling_quota::Params::new(period * periods, period, quota, quota.div_ceil(2)).unwrap();
            check(&wob, rolling_quota::State::default(), false, |s, t, n| rolling_quota::decide(s, &p, t, n))?;
            check(&seq, rolling_quota::State::default(), true, |s, t, n| rolling_quota::decide(s, &p, t, n))?;
        }
    }
}
