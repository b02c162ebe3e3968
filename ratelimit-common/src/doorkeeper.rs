//! The doorkeeper: how a source earns a bucket of its own.
//!
//! A frame from a source with no state does not create state. Its key is hashed
//! (with a secret seed the daemon picks at load, so nobody can aim collisions)
//! to one slot of a fixed-size array ([`crate::MAP_SEEN`]) that remembers a tag
//! of the last key seen there, the epoch it was seen in, and how many of its
//! frames were admitted since. A key seen again in the same or the next epoch
//! (its second sighting, [`EPOCH_NS`] to twice that apart at most) is
//! *promoted*: it gets a bucket, charged with the frames it was admitted before
//! (never a fresh burst on top of what it already had). Until then every frame
//! of the key is judged by its rule's budget for new sources.
//!
//! A spoofed flood, where each address is seen once, then costs a hash, one
//! array slot and one shared budget per frame, never an insert into the state
//! map, and never evicts the sources that are there.
//!
//! The array forgets: a slot holds one key at a time, so under a flood of `F`
//! frames/s a sighting lasts about `slots / F` seconds (2^20 slots at 3 M
//! frames/s: 0.35 s). A source whose second frame comes later than that is
//! judged by the new-source budget again. What a slot forgets can only delay a
//! promotion, never admit more: the frames a source got before promotion were
//! each admitted by the new-source budget.
//!
//! Slot value (`u64`): `tag << 32 | epoch << 16 | admitted`.

use crate::{FlowKey, Words};

/// log2 of an epoch's length in ns: 2^31 ns, about 2.1 s. A source is promoted
/// when its second sighting falls in the epoch of its first or the next one:
/// between 2.1 and 4.3 s after it, at most. TCP retransmits a lost SYN after 1 s
/// and DNS resolvers retry within 1–2 s, so a client whose first packet was
/// dropped is promoted by its retry.
pub const EPOCH_SHIFT: u32 = 31;

/// An epoch's length, ns.
pub const EPOCH_NS: u64 = 1 << EPOCH_SHIFT;

/// The most units a slot counts; more are charged as this many.
pub const COUNT_MAX: u16 = u16::MAX;

/// Under a byte rate, a slot counts bytes in units of this many, each frame
/// rounded up: what a source is charged at promotion is at most 63 bytes a
/// frame more than it got, never less.
pub const BYTE_UNIT: u64 = 64;

/// The units a frame of `cost` takes in a slot: 1 per packet, or its length in
/// [`BYTE_UNIT`]s rounded up.
#[inline(always)]
pub const fn units(cost: u64, bytes: bool) -> u64 {
    if bytes { cost.div_ceil(BYTE_UNIT) } else { 1 }
}

/// One round of the splitmix64 finalizer: every input bit reaches every output
/// bit. Two multiplications, no tables.
#[inline(always)]
pub const fn mix(x: u64) -> u64 {
    let x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    let x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// The seeded hash of a key: its slot from the low bits, its tag from the high.
#[inline(always)]
pub fn hash(key: &FlowKey, seed: u64) -> u64 {
    hash_words(&crate::words(&key.addr), key.rule_id, seed)
}

/// [`hash`] of a key given as its (masked) address words and rule id.
#[inline(always)]
pub fn hash_words(w: &Words, rule_id: u32, seed: u64) -> u64 {
    let hi = u64::from(w[0]) | (u64::from(w[1]) << 32);
    let lo = u64::from(w[2]) | (u64::from(w[3]) << 32);
    mix(mix(mix(seed ^ hi) ^ lo) ^ u64::from(rule_id))
}

/// The slot of hash `h` in an array of `mask + 1` slots (a power of two).
#[inline(always)]
pub const fn slot(h: u64, mask: u32) -> u32 {
    (h as u32) & mask
}

/// The tag of hash `h`: never 0, so an empty slot never matches.
#[inline(always)]
pub const fn tag(h: u64) -> u32 {
    ((h >> 32) as u32) | 1
}

/// The epoch of `now_ns`, wrapping (every 39 hours).
#[inline(always)]
pub const fn epoch(now_ns: u64) -> u16 {
    (now_ns >> EPOCH_SHIFT) as u16
}

/// A slot value.
#[inline(always)]
pub const fn pack(tag: u32, epoch: u16, admitted: u16) -> u64 {
    ((tag as u64) << 32) | ((epoch as u64) << 16) | admitted as u64
}

/// What a slot says about a key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Sighting {
    /// Not seen recently. `record` is the slot value that remembers this
    /// sighting (with no admitted frame yet).
    First {
        /// The value to store.
        record: u64,
    },
    /// Seen in this epoch or the previous one: promote it.
    Again {
        /// Frames of the key admitted since it was first seen.
        admitted: u16,
    },
}

/// Reads slot value `value` for a key with `tag`, seen at epoch `now`.
#[inline(always)]
pub const fn sight(value: u64, tag: u32, now: u16) -> Sighting {
    let seen_tag = (value >> 32) as u32;
    let seen_epoch = (value >> 16) as u16;
    if seen_tag == tag && now.wrapping_sub(seen_epoch) <= 1 {
        Sighting::Again {
            admitted: value as u16,
        }
    } else {
        Sighting::First {
            record: pack(tag, now, 0),
        }
    }
}

/// `value` with `n` more units counted (saturating at [`COUNT_MAX`]), if it
/// still holds `tag`; `None` if another key took the slot meanwhile.
#[inline(always)]
pub const fn count_more(value: u64, tag: u32, n: u64) -> Option<u64> {
    if (value >> 32) as u32 != tag {
        return None;
    }
    let have = value as u16 as u64;
    let room = COUNT_MAX as u64 - have;
    let add = if n < room { n } else { room };
    Some(value + add)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::map_v4;

    fn key(last: u8, rule_id: u32) -> FlowKey {
        FlowKey {
            addr: map_v4([198, 18, 0, last]),
            rule_id,
        }
    }

    #[test]
    fn a_key_is_promoted_on_its_second_sighting_in_the_same_or_next_epoch() {
        let h = hash(&key(1, 0), 42);
        let t = tag(h);
        let Sighting::First { record } = sight(0, t, 7) else {
            panic!("an empty slot must be a first sighting");
        };
        assert_eq!(sight(record, t, 7), Sighting::Again { admitted: 0 });
        assert_eq!(sight(record, t, 8), Sighting::Again { admitted: 0 });
        assert!(
            matches!(sight(record, t, 9), Sighting::First { .. }),
            "two epochs later the sighting is forgotten"
        );
        // Epochs wrap: 0xffff then 0 is the next epoch.
        let old = pack(t, u16::MAX, 3);
        assert_eq!(sight(old, t, 0), Sighting::Again { admitted: 3 });
    }

    #[test]
    fn another_key_in_the_slot_is_a_first_sighting() {
        let (a, b) = (hash(&key(1, 0), 42), hash(&key(2, 0), 42));
        let record = pack(tag(a), 5, 1);
        assert!(matches!(sight(record, tag(b), 5), Sighting::First { .. }));
        assert_eq!(count_more(record, tag(b), 1), None);
        assert_eq!(count_more(record, tag(a), 1), Some(pack(tag(a), 5, 2)));
        assert_eq!(count_more(record, tag(a), 7), Some(pack(tag(a), 5, 8)));
        let full = pack(tag(a), 5, COUNT_MAX);
        assert_eq!(count_more(full, tag(a), 1), Some(full));
        let near = pack(tag(a), 5, COUNT_MAX - 2);
        assert_eq!(count_more(near, tag(a), 10), Some(full));
        assert_eq!(units(64, true), 1);
        assert_eq!(units(65, true), 2);
        assert_eq!(units(1514, false), 1);
    }

    #[test]
    fn the_seed_and_every_part_of_the_key_change_the_hash() {
        let base = hash(&key(1, 0), 42);
        assert_ne!(base, hash(&key(1, 0), 43), "seed");
        assert_ne!(base, hash(&key(2, 0), 42), "address");
        assert_ne!(base, hash(&key(1, 1), 42), "rule");
        let mut v6 = key(1, 0);
        v6.addr[0] = 0x20;
        assert_ne!(base, hash(&v6, 42), "high half of the address");
        assert_ne!(tag(base), 0);
    }

    /// 100 000 keys of one /15 spread over 2^16 slots without clumping: no slot
    /// holds more than a few times the mean.
    #[test]
    fn slots_are_spread() {
        let mask = (1u32 << 16) - 1;
        let mut load = [0u16; 1 << 16];
        for i in 0..100_000u32 {
            let b = i.to_be_bytes();
            let k = FlowKey {
                addr: map_v4([198, 18 + (b[1] & 1), b[2], b[3]]),
                rule_id: 3,
            };
            load[slot(hash(&k, 0x1234_5678), mask) as usize] += 1;
        }
        let max = load.iter().copied().max().unwrap_or(0);
        assert!(max <= 12, "a slot got {max} keys (mean 1.5)");
    }

    /// The drop sample of `top` (`crate::drop_sampled`): sources whose drops
    /// arrive in a fixed rotation (each every fourth frame of its CPU), the
    /// order that made a fixed stride show 0 for some and 4× for others, each
    /// get a count within the stated bound of what they dropped.
    #[test]
    fn drops_are_sampled_alike_whatever_their_order() {
        const SOURCES: u64 = 4;
        const DROPS: u64 = 1970;
        for seed in [0u64, 1, 0x5eed, u64::MAX] {
            let mut counted = [0u64; SOURCES as usize];
            for n in 0..SOURCES * DROPS {
                if crate::drop_sampled(n, seed) {
                    counted[(n % SOURCES) as usize] += crate::DROP_SAMPLE;
                }
            }
            // Mean DROPS, standard deviation √(15·DROPS) ≈ 172: three of them.
            let bound = 3 * (15 * DROPS).isqrt();
            for (i, &c) in counted.iter().enumerate() {
                assert!(
                    c.abs_diff(DROPS) <= bound,
                    "seed {seed:#x}: source {i} counted {c} for {DROPS} drops (bound ±{bound})"
                );
            }
        }
    }
}
