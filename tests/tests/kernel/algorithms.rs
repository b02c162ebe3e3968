//! Every algorithm in the kernel through BPF_PROG_TEST_RUN: selected per rule,
//! its own vectors (on the kernel's clock, so windows are long or aligned to
//! the clock), and exactness from two CPUs on one key.

use std::{net::IpAddr, time::Duration};

use ratelimit_common::Reason;
use ratelimit_tests::{
    frames::Udp,
    privileged,
    testrun::{Loaded, XDP_DROP, XDP_PASS, pin_to_cpu},
};
use ratelimit_user::{
    kernel::monotonic_ns,
    model::rules::{Action, Algo, Limit, RuleSet, Selector, default_limit},
};

const S: u64 = 1_000_000_000;
const HOUR: u64 = 3600 * S;

fn with(algo: Algo) -> RuleSet {
    RuleSet {
        default: Action::Limit(Limit {
            algo,
            ..default_limit()
        }),
        ..RuleSet::default()
    }
}

fn frame(src: &str) -> Vec<u8> {
    let src: IpAddr = src.parse().expect("address");
    Udp::new(src, "198.18.0.2".parse().expect("address")).build()
}

/// Verdicts of `n` runs of `frame`, as "A"/"D".
fn run(l: &Loaded, frame: &[u8], n: usize) -> String {
    (0..n)
        .map(|_| match l.verdict(frame) {
            XDP_PASS => 'A',
            XDP_DROP => 'D',
            other => panic!("unexpected verdict {other}"),
        })
        .collect()
}

/// Sleeps until the kernel clock is `offset` past a multiple of `period`.
fn align(period: u64, offset: u64) {
    let now = monotonic_ns();
    let target = (now / period + 1) * period + offset;
    std::thread::sleep(Duration::from_nanos(target - now));
}

#[test]
fn every_algorithm_admits_its_limit_then_drops() {
    privileged!("every_algorithm_admits_its_limit_then_drops");
    for (algo, expect) in [
        (
            Algo::Interval {
                every_ns: HOUR,
                amount: 1,
                capacity: 2,
            },
            "AAD",
        ),
        (
            Algo::FixedWindow {
                window_ns: HOUR,
                limit: 3,
            },
            "AAAD",
        ),
        (
            Algo::SlidingLog {
                window_ns: HOUR,
                limit: 3,
            },
            "AAAD",
        ),
        (
            Algo::SlidingWindow {
                window_ns: HOUR,
                limit: 5,
            },
            "AAAAAD",
        ),
        (
            Algo::RollingQuota {
                window_ns: 4 * HOUR,
                period_ns: HOUR,
                quota: 5,
                rate_cap: 2,
            },
            "AAD",
        ),
    ] {
        let l = Loaded::new(&with(algo));
        assert_eq!(
            run(&l, &frame("198.18.1.1"), expect.len()),
            expect,
            "{}",
            algo.name()
        );
        // Another source has its own state.
        assert_eq!(&run(&l, &frame("198.18.1.2"), 1), "A", "{}", algo.name());
        assert_eq!(l.packets(Reason::Limited), 1, "{}", algo.name());
    }
}

#[test]
fn rules_select_their_algorithm_per_prefix() {
    privileged!("rules_select_their_algorithm_per_prefix");
    let mut set = with(Algo::FixedWindow {
        window_ns: HOUR,
        limit: 1,
    });
    set.rules.insert(
        Selector::parse("cidr", "198.18.9.0/24").expect("prefix"),
        Action::Limit(Limit {
            algo: Algo::SlidingLog {
                window_ns: HOUR,
                limit: 4,
            },
            ..default_limit()
        }),
    );
    let l = Loaded::new(&set);
    assert_eq!(run(&l, &frame("198.18.1.1"), 3), "ADD");
    assert_eq!(run(&l, &frame("198.18.9.1"), 6), "AAAADD");
}

/// The fixed-window vector on the kernel's clock: W=1000 ms, L=3:
/// 100, 200, 300, 400 → A A A D, and 1000 (the next window) → A.
#[test]
fn fixed_window_vector_on_the_kernel_clock() {
    privileged!("fixed_window_vector_on_the_kernel_clock");
    let w = S;
    let l = Loaded::new(&with(Algo::FixedWindow {
        window_ns: w,
        limit: 3,
    }));
    let f = frame("198.18.2.1");
    align(w, 100_000_000);
    let mut got = String::new();
    for _ in 0..4 {
        got += &run(&l, &f, 1);
        std::thread::sleep(Duration::from_millis(100));
    }
    align(w, 10_000_000);
    got += &run(&l, &f, 1);
    assert_eq!(got, "AAADA");
}

/// The sliding-log vector on the kernel's clock (in units of 100 ms):
/// W=1000, L=3: 0, 200, 400, 600, 1000, 1100, 1200, 1300 → A A A D A D A D for
/// a source that has a state. A new source's first frame is judged before it
/// has one and charged when it gets one, at its second frame (200 ms): it
/// counts in the log from then on, so the frames at 1000 and 1100 still see
/// three entries and the first room comes at 1200 — later than the exact log,
/// never earlier.
#[test]
fn sliding_log_vector_on_the_kernel_clock() {
    privileged!("sliding_log_vector_on_the_kernel_clock");
    let l = Loaded::new(&with(Algo::SlidingLog {
        window_ns: S,
        limit: 3,
    }));
    let f = frame("198.18.3.1");
    let start = monotonic_ns();
    let mut got = String::new();
    // 1250 and 1350 rather than 1200 and 1300: 50 ms of room for a sleep
    // that wakes late (the frames at 200 must be out of the window at 1250).
    for at_ms in [0u64, 200, 400, 600, 1010, 1100, 1250, 1350] {
        let at = start + at_ms * 1_000_000;
        let now = monotonic_ns();
        if at > now {
            std::thread::sleep(Duration::from_nanos(at - now));
        }
        got += &run(&l, &f, 1);
    }
    assert_eq!(got, "AAADDDAA");
}

/// Two threads pinned to two CPUs on one key: exactly the limit passes, every
/// trial, for every algorithm (the wide states are serialized by their lock).
#[test]
fn two_cpus_on_one_key_admit_exactly_the_limit_for_every_algorithm() {
    privileged!("two_cpus_on_one_key_admit_exactly_the_limit_for_every_algorithm");
    const PER_THREAD: u32 = 10_000;
    for (algo, limit) in [
        (
            Algo::Interval {
                every_ns: HOUR,
                amount: 1,
                capacity: 3000,
            },
            3000u64,
        ),
        (
            Algo::FixedWindow {
                window_ns: 24 * HOUR,
                limit: 3000,
            },
            3000,
        ),
        (
            Algo::SlidingLog {
                window_ns: HOUR,
                limit: 64,
            },
            64,
        ),
        (
            Algo::SlidingWindow {
                window_ns: HOUR,
                limit: 3000,
            },
            3000,
        ),
        (
            Algo::RollingQuota {
                window_ns: 48 * HOUR,
                period_ns: 24 * HOUR,
                quota: 5000,
                rate_cap: 3000,
            },
            3000,
        ),
    ] {
        let mut l = Loaded::new(&with(algo));
        let mut contended = 0;
        for trial in 0..10 {
            // A new source each trial: the doorkeeper remembers the last one.
            let f = frame(&format!("198.18.6.{}", trial + 1));
            l.maps.clear_counters().expect("clear");
            let shared = &l;
            std::thread::scope(|s| {
                for cpu in 0..2 {
                    let f = &f;
                    s.spawn(move || {
                        pin_to_cpu(cpu);
                        shared.run(f, PER_THREAD);
                    });
                }
            });
            // Its first frame (or two) passed as a new source's, charged at
            // promotion.
            let passed = l.packets(Reason::Passed) + l.packets(Reason::NewSource);
            contended += l.packets(Reason::Contended);
            assert_eq!(
                passed,
                limit,
                "{} trial {trial}: {passed} passed, expected exactly {limit}",
                algo.name()
            );
        }
        eprintln!(
            "{}: {contended} frames found the state locked after all retries",
            algo.name()
        );
    }
}
