//! `top`'s drop counts: a set-associative table of the busiest droppers, so
//! that a sampled drop costs one set of four slots, not an LRU hash's walk
//! and, for a source never seen, its insert.
//!
//! # Layout
//! [`MAP_DROPS`](crate::MAP_DROPS) is an array of [`TopSet`]s. A key (a
//! [`DropKey`]: a source, or a key level's network) lives in one set, picked
//! by a hash of it under the maps' secret seed ([`place`]); its slot holds a
//! tag of it (the hash's high bits, its level and prefix: never 0), its
//! count, when it was last sampled and its address.
//!
//! # Who is kept
//! A sampled drop of a key already in its set adds to its count. A key not
//! there takes an empty slot; in a full set, of the slots not sampled for
//! [`STALE_NS`] the one sampled the longest ago, else the one with the
//! smallest count (of equals, the one sampled the longest ago). So a source
//! that stopped dropping makes room within [`STALE_NS`], and a key keeps its
//! slot while it is not the least counted of its set: a flood of spoofed
//! sources, each sampled once, churns one slot of a set while a dropper
//! sampled twice keeps its own. A key that is the least counted of a full
//! set of busy ones is replaced by the next new key; until it is, its
//! count is within the bound of [`drop_sampled`](crate::drop_sampled).
//!
//! # Races
//! A slot is taken by one compare-and-swap of its tag to [`LOCKED`]; the
//! count, stamp and address are written, then the tag. A reader skips a
//! locked slot and one whose address does not hash to its tag. Two CPUs
//! taking slots for the same key at once leave it in two slots: the daemon
//! adds them. A CPU that matched a tag just before its slot was taken adds
//! its one sample to the new key. A lost compare-and-swap loses its sample.
//! Each costs one sample ([`DROP_SAMPLE`](crate::DROP_SAMPLE) drops) of a
//! ranking, never a count of a limit.

use crate::{Addr, DropKey, doorkeeper::mix, table::Cells, words};

pub use crate::maps::{TOP_LOCKED as LOCKED, TOP_SETS as SETS, TOP_WAYS as WAYS, TopSet};

/// A slot not sampled for this long is taken first by a key not in its set.
pub const STALE_NS: u64 = 10_000_000_000;

/// What makes the set's and tag's hash seed from the maps' seed.
const SALT: u64 = 0x746f_702d_7365_7473;

/// (set, tag) of `key` under the maps' `seed`: the set from the hash's low
/// bits, the tag its high bits with the key's level and prefix below.
#[inline(always)]
pub fn place(key: &DropKey, seed: u64) -> (u32, u64) {
    let which = (u32::from(key.level) << 8) | u32::from(key.prefix);
    let h = crate::doorkeeper::hash_words(&words(&key.addr), which, mix(seed ^ SALT));
    let tag = (h & !0xffff) | (u64::from(key.level & 3) << 8) | u64::from(key.prefix);
    ((h as u32) & (SETS - 1), tag)
}

/// The key a slot's `tag` and `addr` name, if the address hashes to the tag
/// under `seed` (not while the slot is being taken, or half written).
pub fn key_of(tag: u64, addr: Addr, seed: u64) -> Option<DropKey> {
    if tag == 0 || tag == LOCKED {
        return None;
    }
    let key = DropKey {
        addr,
        prefix: tag as u8,
        level: (tag >> 8) as u8 & 3,
        _pad: [0; 2],
    };
    (key.level != 0 && place(&key, seed).1 == tag).then_some(key)
}

/// What [`count`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Counted {
    /// Added to the key's slot.
    Added,
    /// The key took slot `0` (empty, stale or least counted before).
    Took(usize),
    /// Another CPU changed the slot chosen: the sample is lost.
    Lost,
}

/// Counts `weight` drops of the key of `tag` and address words `addr` at
/// `now` in `set` (module docs).
///
/// # Safety
/// `set` is a valid [`TopSet`] for the call, shared with other CPUs only
/// through `C`'s atomics and the plain writes of this protocol.
#[inline(always)]
pub unsafe fn count<C: Cells>(
    set: *mut TopSet,
    tag: u64,
    addr: &Addr,
    weight: u64,
    now: u64,
) -> Counted {
    // SAFETY: the caller's contract.
    let (tags, counts, seen) = unsafe {
        (
            (&raw mut (*set).tags).cast::<u64>(),
            (&raw mut (*set).counts).cast::<u64>(),
            (&raw mut (*set).seen).cast::<u64>(),
        )
    };
    // The slot to take, if none holds the key: (empty or stale, then the
    // stalest stamp or the least count, then the oldest stamp).
    let mut victim = None;
    let mut best = (false, 0, 0);
    let mut i = 0;
    while i < WAYS {
        let t = C::load(tags.wrapping_add(i));
        if t == tag {
            C::add(counts.wrapping_add(i), weight);
            C::store(seen.wrapping_add(i), now);
            return Counted::Added;
        }
        if t != LOCKED {
            let at = if t == 0 {
                0
            } else {
                C::load(seen.wrapping_add(i))
            };
            let stale = t == 0 || now.saturating_sub(at) >= STALE_NS;
            let rank = if stale {
                (true, at, at)
            } else {
                (false, C::load(counts.wrapping_add(i)), at)
            };
            if victim.is_none() || before(rank, best) {
                victim = Some((i, t));
                best = rank;
            }
        }
        i += 1;
    }
    // Every slot is being taken.
    let Some((victim, seen_tag)) = victim else {
        return Counted::Lost;
    };
    // Taken only as it was chosen: a slot another CPU took meanwhile keeps
    // its new key.
    if !C::cas(tags.wrapping_add(victim), seen_tag, LOCKED).1 {
        return Counted::Lost;
    }
    C::store(counts.wrapping_add(victim), weight);
    C::store(seen.wrapping_add(victim), now);
    // The address as two words (8-aligned: the set is 64-aligned, its
    // addresses 96 bytes in).
    // SAFETY: the caller's contract; the slot is ours until its tag is written.
    let a = unsafe { (&raw mut (*set).addrs).cast::<u64>() }.wrapping_add(2 * victim);
    let (lo, hi) = addr.split_at(8);
    C::store(a, u64::from_ne_bytes(lo.try_into().unwrap_or([0; 8])));
    C::store(
        a.wrapping_add(1),
        u64::from_ne_bytes(hi.try_into().unwrap_or([0; 8])),
    );
    C::xchg(tags.wrapping_add(victim), tag);
    Counted::Took(victim)
}

/// Each slot of `set` that names a key (see [`key_of`]), with its count.
pub fn held(set: &TopSet, seed: u64) -> impl Iterator<Item = (DropKey, u64)> + '_ {
    (0..WAYS)
        .filter_map(move |i| key_of(set.tags[i], set.addrs[i], seed).map(|k| (k, set.counts[i])))
}

/// Whether a slot ranked `a` is taken before one ranked `b` ([`count`]).
#[inline(always)]
fn before(a: (bool, u64, u64), b: (bool, u64, u64)) -> bool {
    match (a.0, b.0) {
        (true, false) => true,
        (false, true) => false,
        // Both stale (or empty): the one sampled the longest ago.
        (true, true) => a.1 < b.1,
        // Both busy: the least counted, then the one sampled the longest ago.
        (false, false) => a.1 < b.1 || (a.1 == b.1 && a.2 < b.2),
    }
}

#[cfg(test)]
mod tests;
