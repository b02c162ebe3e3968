//! The limit itself: a source's burst, what makes a key (an IPv6 /64, an IPv4
//! rule prefix), rate zero, byte limits, rules changed under drained buckets,
//! and exactly the burst from two CPUs on one key.

use ratelimit_common::Reason;
use ratelimit_tests::{
    frames::TPID_8021Q,
    privileged,
    testrun::{Loaded, XDP_DROP, XDP_PASS, pin_to_cpu},
};
use ratelimit_user::model::rules::{Action, Limit, Selector};

use super::{expect, limit, rules, v4, v6};

#[test]
fn a_source_gets_its_burst_then_drops_and_others_are_separate() {
    privileged!("a_source_gets_its_burst_then_drops_and_others_are_separate");
    let l = Loaded::new(&rules(limit("1/hour", 3)));
    let a = v4("198.18.2.1").build();
    // The first frame of a source is judged by the new-source budget (and its
    // own burst); the second gives it a bucket, charged with the first.
    expect(&l, "A #0", &a, XDP_PASS, Reason::NewSource);
    for i in 1..3 {
        expect(&l, &format!("A #{i}"), &a, XDP_PASS, Reason::Passed);
    }
    expect(&l, "A over its burst", &a, XDP_DROP, Reason::Limited);
    expect(&l, "A again", &a, XDP_DROP, Reason::Limited);
    // Another address: its own bucket.
    expect(
        &l,
        "B",
        &v4("198.18.2.2").build(),
        XDP_PASS,
        Reason::NewSource,
    );
    // The same address tagged: the same bucket as A.
    let mut tagged = v4("198.18.2.1");
    tagged.vlans = vec![(TPID_8021Q, 7)];
    expect(&l, "A tagged", &tagged.build(), XDP_DROP, Reason::Limited);
    // Fragments count like any packet: a later fragment of A is limited too.
    let mut frag = v4("198.18.2.1").build();
    frag[20..22].copy_from_slice(&0x0010u16.to_be_bytes());
    expect(&l, "A fragment", &frag, XDP_DROP, Reason::Limited);
}

#[test]
fn ipv6_sources_are_keyed_by_their_64_and_ipv4_by_the_rule_prefix() {
    privileged!("ipv6_sources_are_keyed_by_their_64_and_ipv4_by_the_rule_prefix");
    let mut set = rules(limit("1/hour", 1));
    set.rules.insert(
        Selector::parse("cidr", "198.19.0.0/16").expect("prefix"),
        Action::Limit(Limit {
            per_v4: 24,
            ..limit("1/hour", 1)
        }),
    );
    let l = Loaded::new(&set);
    expect(
        &l,
        "2001:db8:a::1",
        &v6("2001:db8:a::1").build(),
        XDP_PASS,
        Reason::NewSource,
    );
    expect(
        &l,
        "same /64",
        &v6("2001:db8:a::ffff:1").build(),
        XDP_DROP,
        Reason::Limited,
    );
    expect(
        &l,
        "next /64",
        &v6("2001:db8:a:1::1").build(),
        XDP_PASS,
        Reason::NewSource,
    );
    // Addresses that differ only in low bits that a 32-bit fold would collide on
    // are separate keys: the 128 bits are kept whole.
    expect(
        &l,
        "2001:db8:b::1",
        &v6("2001:db8:b::1").build(),
        XDP_PASS,
        Reason::NewSource,
    );
    expect(
        &l,
        "198.19.5.1",
        &v4("198.19.5.1").build(),
        XDP_PASS,
        Reason::NewSource,
    );
    expect(
        &l,
        "same /24",
        &v4("198.19.5.200").build(),
        XDP_DROP,
        Reason::Limited,
    );
    expect(
        &l,
        "next /24",
        &v4("198.19.6.1").build(),
        XDP_PASS,
        Reason::NewSource,
    );
}

#[test]
fn rate_zero_drops_everything_from_the_key() {
    privileged!("rate_zero_drops_everything_from_the_key");
    let l = Loaded::new(&rules(limit("0/s", 10)));
    for i in 0..3 {
        expect(
            &l,
            &format!("#{i}"),
            &v4("198.18.3.1").build(),
            XDP_DROP,
            Reason::Limited,
        );
    }
}

#[test]
fn bytes_rules_charge_the_frame_length() {
    privileged!("bytes_rules_charge_the_frame_length");
    // A 128-byte frame: what a source got before it had a bucket is charged in
    // units of 64 bytes, so this one is charged exactly.
    let mut u = v4("198.18.4.1");
    u.payload = 128 - 42;
    let f = u.build();
    let len = f.len() as u64;
    assert_eq!(len, 128);
    // A burst of exactly three frames' bytes.
    let l = Loaded::new(&rules(limit("1B/min", 3 * len)));
    expect(&l, "#0", &f, XDP_PASS, Reason::NewSource);
    for i in 1..3 {
        expect(&l, &format!("#{i}"), &f, XDP_PASS, Reason::Passed);
    }
    expect(&l, "fourth", &f, XDP_DROP, Reason::Limited);
    // A 100-byte frame before promotion is charged as 128 bytes: a burst of
    // 300 bytes then leaves room for one more 100-byte frame, not two.
    let mut u = v4("198.18.4.2");
    u.payload = 100 - 42;
    let g = u.build();
    let l = Loaded::new(&rules(limit("1B/min", 300)));
    expect(&l, "100 B #0", &g, XDP_PASS, Reason::NewSource);
    expect(&l, "100 B #1", &g, XDP_PASS, Reason::Passed);
    expect(&l, "100 B #2", &g, XDP_DROP, Reason::Limited);
}

#[test]
fn changing_a_rule_does_not_refill_existing_buckets() {
    privileged!("changing_a_rule_does_not_refill_existing_buckets");
    let mut l = Loaded::new(&rules(limit("1/min", 5)));
    let f = v4("198.18.5.1").build();
    for _ in 0..5 {
        assert_eq!(l.verdict(&f), XDP_PASS);
    }
    assert_eq!(l.verdict(&f), XDP_DROP);
    // Raise the burst to 50: the drained source keeps the tokens it had (none),
    // not a full bucket of 50.
    l.maps.apply(&rules(limit("1/min", 50))).expect("apply");
    let admitted = (0..60).filter(|_| l.verdict(&f) == XDP_PASS).count();
    assert_eq!(
        admitted, 0,
        "raising the burst from 5 to 50 refilled a drained bucket"
    );
    // Lower the rate sixtyfold (1/s → 1/min): a drained source stays empty.
    let g = v4("198.18.5.3").build();
    l.maps.apply(&rules(limit("1/s", 50))).expect("apply");
    while l.verdict(&g) == XDP_PASS {}
    l.maps.apply(&rules(limit("1/min", 50))).expect("apply");
    assert_eq!(
        l.verdict(&g),
        XDP_DROP,
        "lowering the rate refilled a drained bucket"
    );
    // Lower the burst to 2: a drained source is empty under the new limit.
    l.maps.apply(&rules(limit("1/min", 2))).expect("apply");
    assert_eq!(l.verdict(&f), XDP_DROP);
    // A new source gets the new burst.
    let g = v4("198.18.5.2").build();
    let admitted = (0..10).filter(|_| l.verdict(&g) == XDP_PASS).count();
    assert_eq!(admitted, 2);
}

/// Two threads pinned to the two CPUs hammer one key (rate 1/min, burst B):
/// exactly B frames pass in total, every trial.
#[test]
fn two_cpus_on_one_key_admit_exactly_the_burst() {
    privileged!("two_cpus_on_one_key_admit_exactly_the_burst");
    let cpus = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1);
    assert!(cpus >= 2, "this test needs two CPUs, found {cpus}");
    const PER_THREAD: u32 = 20_000;
    const TRIALS: usize = 20;
    // One per hour allows a burst of at most 39 (1.6 days of refill); one per
    // minute a larger one: neither refills during a trial of a few ms.
    for (rate, burst) in [("1/hour", 39u64), ("1/min", 2000)] {
        let mut l = Loaded::new(&rules(limit(rate, burst)));
        let mut contended = 0;
        for trial in 0..TRIALS {
            // A new source each trial: the doorkeeper remembers the last one.
            let frame = v4(&format!("198.18.6.{}", trial + 1)).build();
            l.maps.clear_counters().expect("clearing counters");
            let shared = &l;
            let frame = &frame;
            std::thread::scope(|s| {
                for cpu in 0..2 {
                    s.spawn(move || {
                        pin_to_cpu(cpu);
                        shared.run(frame, PER_THREAD);
                    });
                }
            });
            // The key's first frame (or two, when both CPUs meet it first) is
            // judged as a new source's and charged to its bucket at promotion.
            let passed = l.packets(Reason::Passed) + l.packets(Reason::NewSource);
            let limited = l.packets(Reason::Limited);
            contended += l.packets(Reason::Contended);
            assert_eq!(
                passed, burst,
                "{rate} trial {trial}: {passed} frames passed from two CPUs, expected exactly the burst of {burst}"
            );
            assert_eq!(
                passed + limited + l.packets(Reason::Contended),
                2 * u64::from(PER_THREAD)
            );
        }
        eprintln!(
            "{rate} burst {burst}: {TRIALS} trials, {contended} frames ran out of compare-and-swap retries"
        );
    }
}

/// Regression: 3/s with a burst of 3 admitted 2 at one instant (stored arrival
/// times were rounded up to 4 ticks). The whole burst, whatever the rate.
#[test]
fn a_burst_is_admitted_whole_at_any_rate() {
    privileged!("a_burst_is_admitted_whole_at_any_rate");
    for (rate, burst) in [("3/s", 3u64), ("7/s", 7), ("1000/3s", 5), ("333/min", 11)] {
        let l = Loaded::new(&rules(limit(rate, burst)));
        let f = v4("198.18.7.7").build();
        let admitted = (0..burst + 5).filter(|_| l.verdict(&f) == XDP_PASS).count() as u64;
        assert_eq!(admitted, burst, "{rate} burst {burst}");
    }
}

/// A prefix rule whose limit changes: a new source gets the new burst, and
/// the rule the daemon reads back from the kernel (what `get` and `explain`
/// show) is the new one, not the one before.
#[test]
fn a_changed_prefix_rule_is_read_back_and_enforced_as_changed() {
    privileged!("a_changed_prefix_rule_is_read_back_and_enforced_as_changed");
    let p = Selector::parse("cidr", "198.18.6.0/24").expect("prefix");
    let with = |burst| {
        let mut set = rules(limit("1000/s", 1000));
        set.rules.insert(p, Action::Limit(limit("1/min", burst)));
        set
    };
    let mut l = Loaded::new(&with(3));
    l.maps.apply(&with(7)).expect("changing the /24's burst");
    let read = l.maps.rules().expect("rules")[&p];
    assert_eq!(read.burst, 7, "the rule read back is the one before");
    let f = v4("198.18.6.9").build();
    let admitted = (0..20).filter(|_| l.verdict(&f) == XDP_PASS).count();
    assert_eq!(admitted, 7, "a new source under the changed rule");
    l.maps.apply(&with(5)).expect("changing it again");
    assert_eq!(l.maps.rules().expect("rules")[&p].burst, 5);
}
