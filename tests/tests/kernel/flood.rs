//! The flood path under BPF_PROG_TEST_RUN: state is earned (a first sighting
//! inserts nothing), a promotion is charged with what the source got before,
//! the new-source budget and the aggregate level are exact on two CPUs and never
//! consume at one level what the other refused, the aggregate's reserve keeps
//! the sources established before a flood at their own limits, and the coarse
//! clock keeps its bound.

use std::{
    net::IpAddr,
    time::{Duration, Instant},
};

use ratelimit_common::{Event, Reason};
use ratelimit_tests::{
    frames::Udp,
    privileged,
    testrun::{Loaded, XDP_DROP, XDP_PASS, pin_to_cpu},
};
use ratelimit_user::{
    model::rate::parse_rate,
    model::rules::{Action, Clock, Limit, NewSources, RuleSet, Selector, Shared, default_limit},
};

fn limit(rate: &str, burst: u64) -> Limit {
    Limit {
        rate: parse_rate("rate", rate).expect("rate"),
        burst,
        ..default_limit()
    }
}

fn shared(rate: &str, burst: u64) -> Shared {
    Shared {
        rate: parse_rate("rate", rate).expect("rate"),
        burst,
    }
}

fn rules(default: Limit) -> RuleSet {
    RuleSet {
        default: Action::Limit(default),
        ..RuleSet::default()
    }
}

/// A frame from the `i`-th address of 198.18.0.0/15.
fn from(i: u32) -> Vec<u8> {
    let b = i.to_be_bytes();
    let src = IpAddr::from([198, 18 + (b[1] & 1), b[2], b[3]]);
    Udp::new(src, "198.18.0.2".parse().expect("addr")).build()
}

fn events(l: &Loaded) -> [u64; ratelimit_common::EVENT_COUNT as usize] {
    l.maps.events().expect("reading events")
}

fn tracked(l: &Loaded) -> usize {
    let (gcra, wide) = l.maps.tracked().expect("counting states");
    gcra + wide
}

/// A spoofed flood, each address seen once, creates no state: nothing is
/// inserted into the state map, nothing there is evicted. A second sighting
/// promotes, unless one of the 1 990 sources seen after it took its
/// doorkeeper slot (one mark a slot, under a seed drawn at load: about 2 %
/// of runs for one of the ten): then it is seen anew, and its third
/// sighting promotes. That errs toward limiting, never toward a state.
#[test]
fn a_first_sighting_inserts_nothing_and_a_second_promotes() {
    privileged!("a_first_sighting_inserts_nothing_and_a_second_promotes");
    let l = Loaded::new(&rules(limit("100/s", 100)));
    for i in 0..2000 {
        assert_eq!(l.verdict(&from(i)), XDP_PASS, "source {i}, first frame");
    }
    assert_eq!(
        tracked(&l),
        0,
        "2000 sources seen once: none may have a state"
    );
    assert_eq!(l.packets(Reason::NewSource), 2000);
    assert_eq!(events(&l)[Event::StateCreated as usize], 0);
    for i in 0..10 {
        assert_eq!(l.verdict(&from(i)), XDP_PASS, "source {i}, second frame");
    }
    let second = tracked(&l);
    assert!(
        second >= 8,
        "10 sources seen twice: {second} states (a lost mark is a collision in the doorkeeper: two in one run are about 1 in 5 000)"
    );
    assert_eq!(events(&l)[Event::StateCreated as usize], second as u64);
    assert_eq!(l.packets(Reason::Passed), second as u64);
    for i in 0..10 {
        assert_eq!(l.verdict(&from(i)), XDP_PASS, "source {i}, third frame");
    }
    assert_eq!(tracked(&l), 10, "10 sources seen three times: 10 states");
    assert_eq!(events(&l)[Event::StateCreated as usize], 10);
    assert_eq!(l.packets(Reason::Passed), second as u64 + 10);
    assert_eq!(l.packets(Reason::NewSource), 2000 + 10 - second as u64);
}

/// Before it has a state a source is never admitted beyond its own burst, and
/// when the state-creation cap refuses its promotion it stays judged as a new
/// source: the cap and the doorkeeper err only toward limiting.
#[test]
fn a_source_refused_a_state_never_gets_more_than_its_own_burst() {
    privileged!("a_source_refused_a_state_never_gets_more_than_its_own_burst");
    let mut set = rules(limit("1/hour", 3));
    // One state per hour, all rules together.
    set.new_states = shared("1/hour", 1);
    let l = Loaded::new(&set);
    let a = from(1);
    let got: String = (0..5)
        .map(|_| if l.verdict(&a) == XDP_PASS { 'A' } else { 'D' })
        .collect();
    assert_eq!(got, "AAADD", "A: promoted on its second frame, burst 3");
    let b = from(2);
    let got: String = (0..10)
        .map(|_| if l.verdict(&b) == XDP_PASS { 'A' } else { 'D' })
        .collect();
    assert_eq!(
        got, "AAADDDDDDD",
        "B: refused a state by the cap, judged as a new source, never beyond its burst of 3"
    );
    assert_eq!(tracked(&l), 1, "only A has a state");
    let e = events(&l);
    assert_eq!(e[Event::StateCreated as usize], 1);
    assert!(
        e[Event::NewStateCapped as usize] >= 9,
        "B's sightings after the first were capped: {e:?}"
    );
    assert_eq!(l.packets(Reason::NewSource), 1 + 3, "A's first, B's three");
}

/// `0/s` on the budget greylists: every new source's first frame is dropped,
/// its second (a retry) promotes it and passes on its own bucket.
#[test]
fn a_zero_budget_drops_first_frames_and_admits_retries() {
    privileged!("a_zero_budget_drops_first_frames_and_admits_retries");
    let mut l = limit("100/s", 100);
    l.new_sources = NewSources::Budget(shared("0/s", 1));
    let l = Loaded::new(&rules(l));
    for i in 0..50 {
        assert_eq!(l.verdict(&from(i)), XDP_DROP, "source {i}, first frame");
    }
    assert_eq!(l.packets(Reason::NewSourceLimited), 50);
    for i in 0..50 {
        assert_eq!(l.verdict(&from(i)), XDP_PASS, "source {i}, retry");
    }
    assert_eq!(l.packets(Reason::Passed), 50);
}

/// Runs `frames` on two threads pinned to the two CPUs at once.
fn on_two_cpus(l: &Loaded, frames: [&[Vec<u8>]; 2]) {
    std::thread::scope(|s| {
        for (cpu, list) in frames.into_iter().enumerate() {
            s.spawn(move || {
                pin_to_cpu(cpu);
                for f in list {
                    l.run(f, 1);
                }
            });
        }
    });
}

/// 4000 new sources, 2000 from each CPU at once, against a budget of 500:
/// exactly 500 pass, in every trial.
#[test]
fn the_new_source_budget_is_exact_on_two_cpus() {
    privileged!("the_new_source_budget_is_exact_on_two_cpus");
    for trial in 0..5u32 {
        let mut lim = limit("1/min", 100);
        lim.new_sources = NewSources::Budget(shared("1/min", 500));
        let l = Loaded::new(&rules(lim));
        let base = trial * 4000;
        let a: Vec<Vec<u8>> = (base..base + 2000).map(from).collect();
        let b: Vec<Vec<u8>> = (base + 2000..base + 4000).map(from).collect();
        on_two_cpus(&l, [&a, &b]);
        let passed = l.packets(Reason::NewSource);
        let dropped = l.packets(Reason::NewSourceLimited);
        let contended = l.packets(Reason::Contended);
        assert_eq!(
            passed, 500,
            "trial {trial}: {passed} new sources passed a budget of 500 ({dropped} dropped, {contended} contended)"
        );
        assert_eq!(passed + dropped + contended, 4000);
        assert_eq!(tracked(&l), 0, "no source was seen twice");
    }
}

/// Per-source burst 150 and an aggregate of 500 shared alike (no reserve),
/// both refilling once a minute.
fn two_levels() -> RuleSet {
    let mut lim = limit("1/min", 150);
    lim.aggregate = Some(shared("1/min", 500));
    lim.aggregate_reserve = Some(0);
    let mut set = rules(limit("1/min", 150));
    set.rules.insert(
        Selector::parse("cidr", "198.18.0.0/15").expect("prefix"),
        Action::Limit(lim),
    );
    set
}

/// Two sources, one per CPU, each asking for 2000 frames with a burst of 150
/// and an aggregate of 500 over both... then four: the aggregate admits
/// exactly 500 in all, no source more than 150, and a frame refused by the
/// aggregate took nothing from its source (after the aggregate is lifted, each
/// source gets exactly the rest of its burst).
#[test]
fn two_levels_on_two_cpus_never_over_admit_at_either_level() {
    privileged!("two_levels_on_two_cpus_never_over_admit_at_either_level");
    for trial in 0..5u32 {
        let mut l = Loaded::new(&two_levels());
        // Four sources: 0 and 1 on CPU 0, 2 and 3 on CPU 1, interleaved.
        let src = |k: u32| from(10_000 + trial * 10 + k);
        let a: Vec<Vec<u8>> = (0..1000).flat_map(|_| [src(0), src(1)]).collect();
        let b: Vec<Vec<u8>> = (0..1000).flat_map(|_| [src(2), src(3)]).collect();
        on_two_cpus(&l, [&a, &b]);
        let passed = l.packets(Reason::Passed) + l.packets(Reason::NewSource);
        let agg = l.packets(Reason::AggregateLimited);
        let own = l.packets(Reason::Limited);
        let contended = l.packets(Reason::Contended);
        assert_eq!(
            passed, 500,
            "trial {trial}: {passed} passed an aggregate of 500 (4 sources × burst 150 = 600 asked)"
        );
        assert_eq!(passed + agg + own + contended, 4000);
        // Each source's own bucket holds exactly what it did not get.
        let mut per = [0u64; 4];
        l.maps.clear_counters().expect("clear");
        let mut lifted = rules(limit("1/min", 150));
        lifted.rules.insert(
            Selector::parse("cidr", "198.18.0.0/15").expect("prefix"),
            Action::Limit(limit("1/min", 150)),
        );
        l.maps.apply(&lifted).expect("lifting the aggregate");
        for (k, more) in per.iter_mut().enumerate() {
            *more = (0..200)
                .filter(|_| l.verdict(&src(k as u32)) == XDP_PASS)
                .count() as u64;
        }
        let rest: u64 = per.iter().sum();
        assert_eq!(
            rest,
            600 - 500,
            "trial {trial}: after the aggregate is lifted the sources get {per:?}, {rest} in all: \
             a frame the aggregate refused must not have used its source's burst"
        );
    }
}

/// A source refused by its own level takes nothing from the aggregate: one
/// source asks for 1000 with a burst of 150; the aggregate of 500 then still
/// has 350 for another.
#[test]
fn a_frame_refused_by_its_source_takes_nothing_from_the_aggregate() {
    privileged!("a_frame_refused_by_its_source_takes_nothing_from_the_aggregate");
    let l = Loaded::new(&two_levels());
    let a = from(20_001);
    let got = (0..1000).filter(|_| l.verdict(&a) == XDP_PASS).count();
    assert_eq!(got, 150, "the source's own burst");
    let others: usize = (0..10)
        .map(|k| {
            let f = from(20_100 + k);
            (0..200).filter(|_| l.verdict(&f) == XDP_PASS).count()
        })
        .sum();
    assert_eq!(
        others, 350,
        "the aggregate's 500 less the first source's 150"
    );
    // The first source's 850, and 50 of each of the two that used their burst;
    // everything after the aggregate ran out was refused there.
    assert_eq!(l.packets(Reason::Limited), 850 + 2 * 50);
    assert_eq!(l.packets(Reason::AggregateLimited), 2000 - 350 - 2 * 50);
}

/// An aggregate of 1000 with its default reserve (half its burst: 500),
/// per-source burst 100, refilling once a minute. Four sources establish
/// themselves (a state each), then, from both CPUs at once, each asks for 200
/// more among 4000 spoofed new sources: the established get exactly the rest
/// of their own bursts (the aggregate refuses none of them), the new sources
/// only what lay above the reserve, and the aggregate never admits more than
/// 1000.
#[test]
fn established_sources_keep_their_limits_while_new_ones_exhaust_the_aggregate() {
    privileged!("established_sources_keep_their_limits_while_new_ones_exhaust_the_aggregate");
    for trial in 0..5u32 {
        let mut lim = limit("1/min", 100);
        lim.aggregate = Some(shared("1/min", 1000));
        let l = Loaded::new(&rules(lim));
        let old = |k: u32| from(30_000 + trial * 10 + k);
        for k in 0..4 {
            for n in ["first", "second"] {
                assert_eq!(
                    l.verdict(&old(k)),
                    XDP_PASS,
                    "trial {trial}: source {k}, {n} frame"
                );
            }
        }
        assert_eq!(tracked(&l), 4, "trial {trial}: four established sources");
        // Per CPU: two established sources, 200 frames each, among 2000 new ones.
        let flood = |cpu: u32| {
            let (a, b) = (old(2 * cpu), old(2 * cpu + 1));
            (0..2000u32)
                .flat_map(|i| {
                    let new = from(100_000 + trial * 4000 + cpu * 2000 + i);
                    if i % 10 == 0 {
                        vec![new, a.clone(), b.clone()]
                    } else {
                        vec![new]
                    }
                })
                .collect::<Vec<_>>()
        };
        let (a, b) = (flood(0), flood(1));
        on_two_cpus(&l, [&a, &b]);
        let passed = l.packets(Reason::Passed);
        let new_passed = l.packets(Reason::NewSource) - 4;
        let young_refused = l.packets(Reason::AggregateYoung);
        let own = l.packets(Reason::Limited);
        let whole = l.packets(Reason::AggregateLimited);
        let contended = l.packets(Reason::Contended);
        let detail = format!(
            "trial {trial}: established {passed} passed on their states, {own} refused by their own limits, \
             {whole} by the aggregate; new sources {new_passed} passed, {young_refused} refused at the reserve; \
             {contended} contended"
        );
        // Their promoting frames, then the 98 left of each own burst of 100.
        let expected = 4 + 4 * 98;
        if contended == 0 {
            assert_eq!(passed, expected, "{detail}");
            assert_eq!(own, 4 * (200 - 98), "{detail}");
        } else {
            assert!(
                passed <= expected && passed + contended >= expected,
                "{detail}"
            );
        }
        assert_eq!(
            whole, 0,
            "an established frame met an empty aggregate: {detail}"
        );
        assert!(
            (100..=492).contains(&new_passed),
            "at most what lay above the reserve (1000 − 8 − 500 = 492), \
             at least that less what the established took (392): {detail}"
        );
        assert!(
            passed + new_passed + 4 <= 1000,
            "the aggregate of 1000 over-admitted: {detail}"
        );
        assert_eq!(
            passed + own + new_passed + young_refused + contended,
            8 + 4 * 200 + 4000 - 4,
            "{detail}"
        );
        assert_eq!(
            tracked(&l),
            4,
            "the spoofed sources, seen once, got no state: {detail}"
        );
    }
}

/// With the reserve off (`aggregate_reserve = 0`) the aggregate is one bucket
/// shared alike: the same flood takes it from the established sources too.
#[test]
fn without_a_reserve_the_flood_takes_the_aggregate_from_everyone() {
    privileged!("without_a_reserve_the_flood_takes_the_aggregate_from_everyone");
    let mut lim = limit("1/min", 100);
    lim.aggregate = Some(shared("1/min", 1000));
    lim.aggregate_reserve = Some(0);
    let l = Loaded::new(&rules(lim));
    let old = from(40_000);
    assert_eq!(l.verdict(&old), XDP_PASS);
    assert_eq!(l.verdict(&old), XDP_PASS);
    let admitted = (0..2000)
        .filter(|i| l.verdict(&from(200_000 + i)) == XDP_PASS)
        .count();
    assert_eq!(
        admitted, 998,
        "the new sources took all the aggregate had left"
    );
    assert_eq!(
        l.verdict(&old),
        XDP_DROP,
        "and the established source is refused"
    );
    assert_eq!(l.packets(Reason::AggregateLimited), 2000 - 998 + 1);
    assert_eq!(l.packets(Reason::AggregateYoung), 0);
}

/// The coarse clock decides on the time of the last tick: over a run of T it
/// admits at most burst + rate × (T + one tick), however the frames fall. (It
/// may admit less than the precise clock would: on a CPU that idles between
/// frames the tick, and so the coarse clock, can lag by several ticks.)
#[test]
fn the_coarse_clock_keeps_its_bound() {
    privileged!("the_coarse_clock_keeps_its_bound");
    let tick = ratelimit_user::model::rules::tick_ns() as f64 / 1e9;
    let mut set = rules(limit("2000/s", 10));
    set.clock = Clock::Coarse;
    let l = Loaded::new(&set);
    let f = from(30_001);
    let start = Instant::now();
    let mut admitted = 0u64;
    // Bounded: at most 300 ms and 3 M runs.
    let mut runs = 0;
    while start.elapsed() < Duration::from_millis(300) && runs < 3_000 {
        admitted += u64::from(l.verdict(&f) == XDP_PASS);
        // Spread the frames so that some fall in every tick.
        std::thread::sleep(Duration::from_micros(50));
        runs += 1;
    }
    let t = start.elapsed().as_secs_f64();
    let most = 10.0 + 2000.0 * (t + tick);
    assert!(
        (admitted as f64) <= most,
        "coarse clock: {admitted} admitted in {t:.3} s at 2000/s burst 10 (tick {tick:.4} s): \
         expected at most {most:.0}"
    );
    assert!(
        admitted >= 300 && runs > admitted,
        "coarse clock: {admitted} of {runs} admitted in {t:.3} s at 2000/s: the bucket must refill and limit"
    );
}

/// A rule over 198.18.0.0/15 with three key levels, all refilling once a
/// minute: 40 per /32, 100 per /24 and `slash16` per /16.
fn three_levels(slash16: &str, burst16: u64) -> RuleSet {
    use ratelimit_user::model::rules::KeyLevel;
    let mut lim = limit("1/min", 40);
    lim.levels = [
        Some(KeyLevel {
            bucket: shared("1/min", 100),
            per_v4: 24,
            per_v6: 48,
        }),
        Some(KeyLevel {
            bucket: shared(slash16, burst16),
            per_v4: 16,
            per_v6: 32,
        }),
    ];
    lim.new_sources = NewSources::Unlimited;
    let mut set = rules(limit("1/min", 1000));
    set.rules.insert(
        Selector::parse("cidr", "198.18.0.0/15").expect("prefix"),
        Action::Limit(lim),
    );
    set
}

fn src(a: u8, b: u8) -> Vec<u8> {
    Udp::new(
        IpAddr::from([198, 18, a, b]),
        "198.18.0.2".parse().expect("addr"),
    )
    .build()
}

/// Eight sources, four in each of two /24s of one /16, one /24 per CPU, each
/// asking for 500 at once, against 40 per /32, 100 per /24 and 150 per /16:
/// exactly 150 pass in every trial, no /24 more than 100 and no source more
/// than 40. Then the /16 is lifted: the /24s have exactly the 50 they did not
/// use left, so a frame refused at one level took nothing at the others.
/// Every trial starts with no state, so both CPUs claim the /16's key at the
/// same instant: a frame that meets the other CPU's claim is refused
/// (`contended`), never passed unjudged (one in 15 runs of 5 trials passed
/// 151 before).
#[test]
fn three_key_levels_on_two_cpus_never_over_admit_at_any_level() {
    privileged!("three_key_levels_on_two_cpus_never_over_admit_at_any_level");
    for trial in 0..20u8 {
        let mut l = Loaded::new(&three_levels("1/min", 150));
        let per_cpu: Vec<Vec<u64>> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..2u8)
                .map(|cpu| {
                    let l = &l;
                    s.spawn(move || {
                        pin_to_cpu(cpu as usize);
                        let frames: Vec<Vec<u8>> =
                            (0..4u8).map(|k| src(1 + cpu, 10 * trial + k + 1)).collect();
                        let mut got = vec![0u64; 4];
                        for _ in 0..500 {
                            for (k, f) in frames.iter().enumerate() {
                                got[k] += u64::from(l.verdict(f) == XDP_PASS);
                            }
                        }
                        got
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().expect("thread"))
                .collect()
        });
        let total: u64 = per_cpu.iter().flatten().sum();
        let contended = l.packets(Reason::Contended);
        assert_eq!(
            total, 150,
            "trial {trial}: {total} passed a /16 level of 150 ({per_cpu:?} per source, {contended} contended)"
        );
        for (cpu, got) in per_cpu.iter().enumerate() {
            let net: u64 = got.iter().sum();
            assert!(
                net <= 100,
                "trial {trial}: the /24 of CPU {cpu} got {net} of 100"
            );
            assert!(
                got.iter().all(|g| *g <= 40),
                "trial {trial}: a source got more than its 40: {got:?}"
            );
        }
        let refused = l.packets(Reason::Limited)
            + l.packets(Reason::Level2Limited)
            + l.packets(Reason::Level3Limited)
            + contended;
        assert_eq!(total + refused, 8 * 500);
        assert!(
            l.packets(Reason::Level3Limited) > 0,
            "the /16 level refused frames"
        );

        // The /16 lifted (same levels, a limit far above): what is left is
        // the /24s' 200 less the 150 admitted.
        l.maps.clear_counters().expect("clear");
        l.maps
            .apply(&three_levels("100M/s", 1 << 30))
            .expect("lifting the /16 level");
        let mut more = 0;
        for net in 1..=2u8 {
            for k in 0..4u8 {
                let f = src(net, 10 * trial + k + 1);
                more += (0..100).filter(|_| l.verdict(&f) == XDP_PASS).count();
            }
        }
        assert_eq!(
            more, 50,
            "trial {trial}: after the /16 is lifted the /24s admit {more}: a frame refused at one \
             level must not have used another's units"
        );
        assert!(
            l.packets(Reason::Level2Limited) > 0,
            "the /24 level limits now"
        );
    }
}

/// A frame refused at a key level is charged, in `top`'s counts, to the key
/// of that level (the /24), with the level's number.
#[test]
fn drops_at_a_key_level_are_charged_to_its_network() {
    privileged!("drops_at_a_key_level_are_charged_to_its_network");
    let l = Loaded::new(&three_levels("1/min", 1000));
    // 40 sources of one /24, 10 frames each: the /24's 100 pass, 300 refused
    // there (one in 16 sampled at random, counted 16 times).
    for k in 0..40u8 {
        let f = src(7, k + 1);
        for _ in 0..10 {
            l.verdict(&f);
        }
    }
    assert_eq!(
        l.packets(Reason::Passed) + l.packets(Reason::NewSource),
        100
    );
    assert_eq!(l.packets(Reason::Level2Limited), 300);
    let drops = l.maps.drops();
    let net = drops
        .iter()
        .find(|(k, _)| k.level == 2)
        .expect("a drop charged to level 2");
    assert_eq!(net.0.prefix, 24);
    assert_eq!(&net.0.addr[12..], &[198, 18, 7, 0]);
    // top's stated bound, five standard deviations (√(15·n) each): a count
    // near 300 is at most 300 + 5·√4500 ≈ 635 (a stride of one in 16 would
    // have charged it all its drops or none of them).
    assert!(
        net.1 % 16 == 0 && net.1 <= 300 + 5 * (15 * 300u64).isqrt(),
        "charged {} of 300",
        net.1
    );
}
