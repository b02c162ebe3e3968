//! The state table: a source (IPv4 or IPv6) never loses an active bucket to
//! a new one, a full table sends new sources to the new-source budget (counted),
//! and a slot given to a new source while its old owner is still sending
//! never mixes their buckets, on two CPUs.

use std::{
    sync::atomic::{AtomicBool, Ordering},
    time::{Duration, Instant},
};

use ratelimit_common::{Event, Reason};
use ratelimit_tests::{
    privileged,
    testrun::{Loaded, XDP_PASS, pin_to_cpu},
};
use ratelimit_user::model::rules::{Action, NewSources, Selector};

use super::{limit, rules, v4, v6};

/// Sources the test object is sized for: one line of four slots.
const ONE_LINE: u32 = 2;

fn events(l: &Loaded) -> [u64; ratelimit_common::EVENT_COUNT as usize] {
    l.maps.events().expect("reading events")
}

/// Frames of `frame` admitted out of `n`, each run alone.
fn admitted(l: &Loaded, frame: &[u8], n: u32) -> u32 {
    (0..n).filter(|_| l.verdict(frame) == XDP_PASS).count() as u32
}

#[test]
fn a_full_table_never_takes_an_active_sources_bucket() {
    privileged!("a_full_table_never_takes_an_active_sources_bucket");
    full_table(|i| v4(&format!("198.18.40.{i}")).build());
}

/// IPv6 keys have lines of their own, as full and as exact.
#[test]
fn a_full_ipv6_table_never_takes_an_active_sources_bucket() {
    privileged!("a_full_ipv6_table_never_takes_an_active_sources_bucket");
    // Each its own /64 (the rule's key prefix).
    full_table(|i| v6(&format!("2001:db8:40:{i}::1")).build());
}

/// Four sources fill the one line of their family (`frame(1..=4)`); a fifth
/// gets no state and none of the four loses its bucket.
fn full_table(frame: impl Fn(u32) -> Vec<u8>) {
    let l = Loaded::with_capacity(&rules(limit("1/hour", 3)), ONE_LINE);
    let held = |l: &Loaded| {
        let (v4, v6, _) = l.maps.tracked_by_map().expect("tracked");
        v4 + v6
    };
    // Four sources take the four slots and use their bursts: active for an hour.
    for i in 1..=4 {
        assert_eq!(
            admitted(&l, &frame(i), 6),
            3,
            "source {i}: its burst, then nothing"
        );
    }
    assert_eq!(held(&l), 4);
    // A fifth finds no free slot: no state, judged as a new source, counted.
    let full_before = events(&l)[Event::StateFull as usize];
    let got = admitted(&l, &frame(5), 6);
    assert!(
        got <= 3,
        "the fifth source got {got}, more than its own burst of 3"
    );
    assert!(
        events(&l)[Event::StateFull as usize] > full_before,
        "the refusal is counted as state_full"
    );
    // The four active sources kept their empty buckets: nothing more passes.
    for i in 1..=4 {
        assert_eq!(
            admitted(&l, &frame(i), 3),
            0,
            "source {i} was given a fresh burst while active"
        );
    }
    assert_eq!(held(&l), 4);
}

/// One CPU sends from an old owner whose bucket refills between its frames
/// (its slot is free to claim most of the time); the other brings new
/// sources into the same four slots, one after another. Each new source must
/// get its burst, and no more than what came back while its frames ran:
/// fewer would mean the old owner's frames were charged to its bucket (or it
/// inherited the old owner's state), more that it was given two buckets or a
/// second fresh one.
#[test]
fn a_reclaimed_slot_never_mixes_the_old_owners_frames_with_the_new_ones() {
    privileged!("a_reclaimed_slot_never_mixes_the_old_owners_frames_with_the_new_ones");
    let cpus = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1);
    assert!(cpus >= 2, "this test needs two CPUs, found {cpus}");
    let mut set = rules(limit("1/hour", 1));
    let p = |s| Selector::parse("cidr", s).expect("prefix");
    // The old owner: one frame per 100 ns, a burst of 1, so its bucket reads
    // as full again between its frames.
    set.rules
        .insert(p("198.18.41.0/24"), Action::Limit(limit("10000000/s", 1)));
    // New sources: a burst of 3 that comes back in 300 µs, so that their
    // slots are free again soon. A token comes back every 100 µs: over the
    // time its five frames take, a source may get that many more.
    // No new-source budget: a source that finds no free slot is held to its
    // own burst by its doorkeeper count alone.
    let mut fresh = limit("10000/s", 3);
    fresh.new_sources = NewSources::Unlimited;
    set.rules.insert(p("198.19.0.0/16"), Action::Limit(fresh));
    let l = Loaded::with_capacity(&set, ONE_LINE);
    let old = v4("198.18.41.1").build();
    let rule_id = l.maps.rules().expect("rules")[&p("198.19.0.0/16")].id;
    let done = AtomicBool::new(false);
    let (l, old, done) = (&l, &old, &done);
    let deadline = Instant::now() + Duration::from_secs(3);
    let mut wrong = Vec::new();
    let (mut checked, mut with_slot) = (0u32, 0u32);
    std::thread::scope(|s| {
        s.spawn(move || {
            pin_to_cpu(0);
            // Bounded: stops when the other thread is done, or at the deadline.
            while !done.load(Ordering::Relaxed) && Instant::now() < deadline {
                l.run(old, 2_000);
            }
        });
        pin_to_cpu(1);
        for n in 0..65_536u32 {
            if Instant::now() >= deadline {
                break;
            }
            let b = n.to_be_bytes();
            // Each once: a source seen again within seconds is a known one.
            let f = v4(&format!("198.19.{}.{}", b[2], b[3])).build();
            let start = Instant::now();
            let got = admitted(l, &f, 5);
            let refilled = (start.elapsed().as_micros() / 100) as u32 + 1;
            checked += 1;
            let key = ratelimit_common::FlowKey::of(
                &ratelimit_common::words(&ratelimit_common::map_v4([198, 19, b[2], b[3]])),
                rule_id,
            );
            with_slot += u32::from(l.maps.state(&key).is_some());
            if got < 3 || got > 3 + refilled {
                wrong.push((n, got, refilled));
            }
        }
        done.store(true, Ordering::Relaxed);
    });
    let e = events(l);
    eprintln!(
        "{checked} new sources ({with_slot} held a slot after their frames), {} states created, {} refused a slot, {} contended",
        e[Event::StateCreated as usize],
        e[Event::StateFull as usize],
        l.packets(Reason::Contended)
    );
    assert!(checked >= 100, "only {checked} new sources were tried");
    assert!(
        with_slot >= 100,
        "{with_slot} new sources held a slot: the race was hardly run"
    );
    assert!(
        wrong.is_empty(),
        "new sources admitted other than their burst of 3 (source, admitted, tokens back meanwhile): {:?}",
        &wrong[..wrong.len().min(20)]
    );
}
