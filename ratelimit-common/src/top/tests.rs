extern crate std;

use std::{vec, vec::Vec};

use super::*;
use crate::{
    DROP_SAMPLE, map_v4,
    table::{
        HostCells,
        racing::{Racing, race_after},
    },
};

const SEED: u64 = 0x5eed_0f70_9000_0001;

fn source(n: u32) -> DropKey {
    DropKey {
        addr: map_v4((0xc612_0000 | (n & 0xffff)).to_be_bytes()),
        prefix: 0,
        level: 1,
        _pad: [0; 2],
    }
}

/// Sources whose keys fall in the same set as source 0's: `n` of them.
fn same_set(n: usize) -> Vec<DropKey> {
    let want = place(&source(0), SEED).0;
    (0..)
        .map(|i| DropKey {
            addr: map_v4((0xc612_0000u32.wrapping_add(i)).to_be_bytes()),
            ..source(0)
        })
        .filter(|k| place(k, SEED).0 == want)
        .take(n)
        .collect()
}

fn sample(set: &mut TopSet, key: &DropKey, now: u64) -> Counted {
    let (_, tag) = place(key, SEED);
    // SAFETY: a set of this test's own.
    unsafe { count::<HostCells>(set, tag, &key.addr, DROP_SAMPLE, now) }
}

fn counted(set: &TopSet, key: &DropKey) -> u64 {
    held(set, SEED)
        .filter(|(k, _)| k == key)
        .map(|(_, n)| n)
        .sum()
}

const S: u64 = 1_000_000_000;

#[test]
fn every_key_is_named_again_from_its_slot() {
    let mut keys = vec![source(7)];
    for (prefix, level) in [(24u8, 2u8), (16, 3), (64, 2), (0, 1)] {
        keys.push(DropKey {
            addr: [0x20, 0x01, 0x0d, 0xb8, 1, 2, 3, 4, 0, 0, 0, 0, 0, 0, 0, 9],
            prefix,
            level,
            _pad: [0; 2],
        });
    }
    for k in keys {
        let (_, tag) = place(&k, SEED);
        assert_eq!(key_of(tag, k.addr, SEED), Some(k));
        assert_eq!(key_of(tag, k.addr, SEED ^ 1), None, "another seed");
        let mut other = k.addr;
        other[15] ^= 1;
        assert_eq!(key_of(tag, other, SEED), None, "a half-written address");
    }
    assert_eq!(key_of(LOCKED, source(7).addr, SEED), None);
    assert_eq!(key_of(0, source(7).addr, SEED), None);
}

#[test]
fn a_key_counted_again_adds_to_its_own_slot() {
    let mut set = TopSet::default();
    let k = source(1);
    assert_eq!(sample(&mut set, &k, S), Counted::Took(0));
    for n in 0..9 {
        assert_eq!(sample(&mut set, &k, S + n), Counted::Added);
    }
    assert_eq!(counted(&set, &k), 10 * DROP_SAMPLE);
    assert_eq!(held(&set, SEED).count(), 1);
}

/// A full set of busy keys: a new key takes the least counted's slot; the
/// busiest keep theirs.
#[test]
fn a_new_key_takes_the_least_counted_busy_slot() {
    let keys = same_set(5);
    let mut set = TopSet::default();
    for (i, k) in keys[..4].iter().enumerate() {
        for _ in 0..=(3 - i) {
            sample(&mut set, k, S);
        }
    }
    // Counts 4, 3, 2, 1 samples: the last is the least.
    assert_eq!(sample(&mut set, &keys[4], S + 1), Counted::Took(3));
    assert_eq!(counted(&set, &keys[3]), 0);
    for (k, n) in keys[..3].iter().zip([4, 3, 2]) {
        assert_eq!(counted(&set, k), n * DROP_SAMPLE);
    }
    assert_eq!(counted(&set, &keys[4]), DROP_SAMPLE);
}

/// Spoofed sources, each sampled once, churn a set where two busy droppers
/// and a real one sampled twice hold slots: the churn takes the fourth slot
/// each time, never theirs, and no sample of theirs is lost through 1 000
/// of them. (A key keeps its slot while it is not the least counted of its
/// set, or while another slot is stale.)
#[test]
fn a_flood_of_sources_sampled_once_does_not_evict_a_real_dropper() {
    let keys = same_set(1003);
    let mut set = TopSet::default();
    for k in &keys[..2] {
        for _ in 0..50 {
            sample(&mut set, k, S);
        }
    }
    let real = &keys[2];
    sample(&mut set, real, S);
    sample(&mut set, real, S);
    for (i, k) in keys[3..].iter().enumerate() {
        assert_eq!(sample(&mut set, k, S + 1 + i as u64), Counted::Took(3));
        if i % 100 == 0 {
            sample(&mut set, real, S + 1 + i as u64);
        }
    }
    for k in &keys[..2] {
        assert_eq!(counted(&set, k), 50 * DROP_SAMPLE);
    }
    assert_eq!(counted(&set, real), 12 * DROP_SAMPLE);
    assert_eq!(counted(&set, &keys[1002]), DROP_SAMPLE);
}

/// Four sources that dropped a lot and stopped: a new one takes the slot
/// not sampled the longest once it is stale, whatever its count, and never
/// before.
#[test]
fn a_source_that_stopped_dropping_makes_room() {
    let keys = same_set(6);
    let mut set = TopSet::default();
    for (i, k) in keys[..4].iter().enumerate() {
        for _ in 0..1000 {
            sample(&mut set, k, S + i as u64);
        }
    }
    // Within STALE_NS: the least counted goes, of equals the oldest.
    let soon = S + STALE_NS - 1;
    assert_eq!(sample(&mut set, &keys[4], soon), Counted::Took(0));
    assert_eq!(counted(&set, &keys[0]), 0);
    // Past it: the stalest of the heavy ones goes, not the new light one.
    let late = S + 2 * STALE_NS;
    sample(&mut set, &keys[4], late);
    assert_eq!(sample(&mut set, &keys[5], late), Counted::Took(1));
    assert_eq!(counted(&set, &keys[1]), 0);
    assert_eq!(counted(&set, &keys[4]), 2 * DROP_SAMPLE);
    assert_eq!(counted(&set, &keys[5]), DROP_SAMPLE);
}

/// A slot being taken by another CPU is neither matched nor taken: with
/// every slot locked the sample is lost, and nothing is named.
#[test]
fn a_slot_being_taken_is_skipped() {
    let keys = same_set(2);
    let mut set = TopSet::default();
    sample(&mut set, &keys[0], S);
    set.tags = [LOCKED; WAYS];
    assert_eq!(sample(&mut set, &keys[1], S), Counted::Lost);
    assert_eq!(held(&set, SEED).count(), 0);
    set.tags[2] = 0;
    assert_eq!(sample(&mut set, &keys[1], S), Counted::Took(2));
    assert_eq!(counted(&set, &keys[1]), DROP_SAMPLE);
}

/// Another CPU takes the slot chosen right after this one's scan of the
/// tags: its key keeps the slot, this sample is lost.
#[test]
fn a_slot_taken_meanwhile_by_another_cpu_keeps_its_key() {
    let keys = same_set(2);
    let mut set = TopSet::default();
    let other = place(&keys[1], SEED).1;
    // The scan reads the four tags (all 0); the next word touched is the
    // chosen slot's tag.
    race_after(WAYS as u32, other);
    let (_, tag) = place(&keys[0], SEED);
    // SAFETY: a set of this test's own.
    let got = unsafe { count::<Racing>(&mut set, tag, &keys[0].addr, DROP_SAMPLE, S) };
    assert_eq!(got, Counted::Lost);
    assert_eq!(set.tags[0], other, "the other CPU's key kept its slot");
}
