//! A fleet-wide rule's frames: counted for the daemon whatever they cost,
//! and charged the fleet's members times over once the daemon's heartbeat is
//! stale (a dead daemon's program errs toward limiting).

use ratelimit_common::{FLEET_STALE_NS, FleetBeat, Reason};
use ratelimit_tests::{
    privileged,
    testrun::{Loaded, XDP_PASS},
};
use ratelimit_user::{kernel::monotonic_ns, model::rules::Limit};

use super::{limit, rules, v4};

/// A default rule of 1/hour burst 20, fleet-wide (nothing refills during
/// the test).
fn fleet_rule() -> Loaded {
    Loaded::new(&rules(Limit {
        fleet: true,
        ..limit("1/hour", 20)
    }))
}

/// Frames of `src` passed out of 40.
fn passed(l: &Loaded, src: &str) -> u64 {
    let frame = v4(src).build();
    (0..40).filter(|_| l.verdict(&frame) == XDP_PASS).count() as u64
}

/// What the program counted for the daemon, all keys together.
fn counted(l: &Loaded) -> u64 {
    l.maps.fleet_used().iter().map(|(_, u)| u.packets).sum()
}

#[test]
fn a_stale_heartbeat_charges_every_member_of_the_fleet() {
    privileged!("a_stale_heartbeat_charges_every_member_of_the_fleet");
    let mut l = fleet_rule();
    let beat = |at, members| FleetBeat {
        at,
        members,
        _pad: 0,
    };
    // No daemon ever synced: the frame alone.
    assert_eq!(passed(&l, "198.18.3.1"), 20, "no heartbeat yet: the burst");
    // A daemon syncing, three members: the frame alone.
    l.maps
        .write_fleet_beat(beat(monotonic_ns(), 3))
        .expect("beat");
    assert_eq!(passed(&l, "198.18.3.2"), 20, "a fresh heartbeat: the burst");
    // Its heartbeat stale: each frame costs three.
    let stale = monotonic_ns() - FLEET_STALE_NS - 100_000_000;
    l.maps.write_fleet_beat(beat(stale, 3)).expect("beat");
    let got = passed(&l, "198.18.3.3");
    // The first frame is the new-source budget's and charged once when the
    // key gets its state; every one after costs three: 1 + 1 + 18/3.
    assert!(
        (6..=8).contains(&got),
        "a stale heartbeat with three members: {got} of 40 passed, expected about 20/3"
    );
    // The daemon's counts stay the frames' own.
    assert_eq!(counted(&l), 40 + got, "counted for the daemon");
    assert!(l.packets(Reason::Limited) > 0);
    // Alone in its fleet: nothing extra even when stale.
    l.maps.write_fleet_beat(beat(stale, 1)).expect("beat");
    assert_eq!(passed(&l, "198.18.3.4"), 20, "one member: the burst");
    // Fifty members and a burst of 20: a frame costs the whole bucket (never
    // more, so that one can pass on a full bucket): the first frames only.
    l.maps.write_fleet_beat(beat(stale, 50)).expect("beat");
    let got = passed(&l, "198.18.3.5");
    assert!(
        (1..=3).contains(&got),
        "fifty members, burst 20: {got} of 40 passed, expected the first frames only"
    );
}

/// Nine keys of one set of the fleet's count table (eight slots), each
/// counted within 10 s: the eight first keep their counts whole, the ninth
/// is not counted and says so (`fleet_full`), and nothing else is lost.
#[test]
fn a_full_set_of_the_fleets_counts_says_so_and_keeps_the_counts_it_has() {
    privileged!("a_full_set_of_the_fleets_counts_says_so_and_keeps_the_counts_it_has");
    use ratelimit_common::{Event, FlowKey, fleet_table, map_v4};
    let l = fleet_rule();
    let seed = l.maps.config().expect("config").hash_seed;
    let rule = l.maps.default_rule().expect("the default rule").id;
    let key = |i: u32| FlowKey {
        addr: map_v4([198, 18 + (i >> 16) as u8, (i >> 8) as u8, i as u8]),
        rule_id: rule,
    };
    // The set with the most of the 131 072 addresses of 198.18.0.0/15 (16
    // a set on average; the seed is drawn at load).
    let mut by_set = vec![Vec::new(); fleet_table::SETS as usize];
    for i in 1..(1u32 << 17) {
        by_set[fleet_table::place(&key(i), seed).0 as usize].push(i);
    }
    let mut same = by_set.into_iter().max_by_key(Vec::len).unwrap_or_default();
    same.truncate(fleet_table::WAYS + 1);
    assert_eq!(same.len(), fleet_table::WAYS + 1, "keys of one set");
    let full = || l.maps.events().expect("events")[Event::FleetFull as usize];
    for (n, i) in same.iter().enumerate() {
        let src = format!("198.{}.{}.{}", 18 + (i >> 16), (i >> 8) & 0xff, i & 0xff);
        let frame = v4(&src).build();
        for _ in 0..5 {
            assert_eq!(l.verdict(&frame), XDP_PASS);
        }
        let used = l.maps.fleet_used();
        let got = used
            .iter()
            .find(|(k, _)| *k == key(*i))
            .map(|(_, u)| u.packets);
        if n < fleet_table::WAYS {
            assert_eq!(got, Some(5), "key {n} of the set");
            assert_eq!(full(), 0);
        } else {
            assert_eq!(got, None, "the ninth key of a set of eight");
            assert_eq!(
                full(),
                5,
                "the ninth key's frames, each counted as an event"
            );
        }
    }
    assert_eq!(counted(&l), 5 * fleet_table::WAYS as u64);
}
