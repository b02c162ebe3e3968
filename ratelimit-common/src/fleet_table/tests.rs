extern crate std;

use std::vec::Vec;

use super::*;
use crate::{
    map_v4,
    table::{
        HostCells,
        racing::{Racing, race_after},
    },
};

const SEED: u64 = 0x5eed_f1ee_7000_0002;
const S: u64 = 1_000_000_000;

fn key(n: u32) -> FlowKey {
    FlowKey {
        addr: map_v4((0xc612_0000u32.wrapping_add(n)).to_be_bytes()),
        rule_id: 7,
    }
}

/// `n` keys of one set.
fn same_set(n: usize) -> Vec<FlowKey> {
    let want = place(&key(0), SEED).0;
    (0..)
        .map(key)
        .filter(|k| place(k, SEED).0 == want)
        .take(n)
        .collect()
}

fn admit(set: &mut FleetSet, k: &FlowKey, bytes: u64, now: u64) -> Counted {
    let (_, tag) = place(k, SEED);
    // SAFETY: a set of this test's own.
    unsafe { count::<HostCells>(set, k, tag, bytes, now) }
}

fn used(set: &FleetSet, k: &FlowKey) -> Option<FleetUsed> {
    held(set, SEED).find(|(h, _)| h == k).map(|(_, u)| u)
}

#[test]
fn a_key_counts_its_frames_and_bytes_from_its_birth() {
    let mut set = FleetSet::default();
    let k = key(1);
    assert_eq!(admit(&mut set, &k, 100, 5 * S), Counted::Took(0));
    for n in 1..10 {
        assert_eq!(admit(&mut set, &k, 100, 5 * S + n), Counted::Added);
    }
    assert_eq!(
        used(&set, &k),
        Some(FleetUsed {
            packets: 10,
            bytes: 1000,
            born: 5 * S
        })
    );
    // Another rule's key of the same address is another key.
    let other = FlowKey { rule_id: 8, ..k };
    assert_eq!(used(&set, &other), None);
}

/// A set full of keys counted within STALE_NS: a new key is not counted,
/// and none of theirs is lost; once one of them has been idle for
/// STALE_NS, the new key takes its slot and counts from its own birth.
#[test]
fn a_full_set_gives_up_only_a_slot_idle_for_stale_ns() {
    let keys = same_set(WAYS + 1);
    let mut set = FleetSet::default();
    for (i, k) in keys[..WAYS].iter().enumerate() {
        admit(&mut set, k, 1, S + i as u64);
    }
    let new = &keys[WAYS];
    assert_eq!(admit(&mut set, new, 1, S + STALE_NS - 1), Counted::Full);
    for k in &keys[..WAYS] {
        assert_eq!(used(&set, k).map(|u| u.packets), Some(1));
    }
    // Keys 1.. counted again; key 0 idle since S.
    for k in &keys[1..WAYS] {
        admit(&mut set, k, 1, S + STALE_NS - 1);
    }
    let late = S + STALE_NS;
    assert_eq!(admit(&mut set, new, 1, late), Counted::Took(0));
    assert_eq!(used(&set, &keys[0]), None);
    assert_eq!(
        used(&set, new),
        Some(FleetUsed {
            packets: 1,
            bytes: 1,
            born: late
        })
    );
    // The stale key comes back later: a new life, counted from its own.
    for k in &keys[1..=WAYS] {
        admit(&mut set, k, 1, late + STALE_NS - 1);
    }
    assert_eq!(
        admit(&mut set, &keys[0], 1, late + STALE_NS - 1),
        Counted::Full
    );
}

#[test]
fn a_slot_being_taken_is_neither_counted_nor_named() {
    let keys = same_set(2);
    let mut set = FleetSet::default();
    admit(&mut set, &keys[0], 1, S);
    set.tags[0] = LOCKED;
    assert_eq!(held(&set, SEED).count(), 0);
    // The key is not found (its slot is locked): it takes another.
    assert_eq!(admit(&mut set, &keys[0], 1, S), Counted::Took(1));
    set.tags = [LOCKED; WAYS];
    assert_eq!(admit(&mut set, &keys[1], 1, S), Counted::Full);
}

/// A slot whose key does not hash to its tag (half written, or written
/// under another seed) names nothing.
#[test]
fn a_slot_names_its_key_only_if_the_key_hashes_to_its_tag() {
    let mut set = FleetSet::default();
    admit(&mut set, &key(3), 1, S);
    assert_eq!(held(&set, SEED ^ 1).count(), 0);
    set.slots[0].key.addr[15] ^= 1;
    assert_eq!(held(&set, SEED).count(), 0);
}

/// Two keys' first frames on two CPUs, both choosing the first empty slot:
/// the other CPU takes it right after this one's scan of the tags, and this
/// one loses its count, never the other key's slot.
#[test]
fn a_slot_taken_meanwhile_by_another_cpu_keeps_its_key() {
    let keys = same_set(2);
    let mut set = FleetSet::default();
    let (_, other) = place(&keys[1], SEED);
    // The scan reads the eight tags (all 0); the next word touched is the
    // chosen slot's tag.
    race_after(WAYS as u32, other);
    let (_, tag) = place(&keys[0], SEED);
    // SAFETY: a set of this test's own.
    let got = unsafe { count::<Racing>(&mut set, &keys[0], tag, 1, S) };
    assert_eq!(got, Counted::Lost);
    assert_eq!(set.tags[0], other, "the other CPU's key kept its slot");
}
