//! The fleet's counts: what each key of a fleet-wide rule was admitted here,
//! in a set-associative table, so that counting a frame costs one line of
//! tags and one slot, never an LRU hash's walk or insert.
//!
//! # Layout
//! [`MAP_FLEET_USED`](crate::MAP_FLEET_USED) is an array of [`FleetSet`]s of
//! [`WAYS`] slots. A key lives in one set, picked by a hash of it under the
//! maps' secret seed ([`place`]); the set's first line holds its slots'
//! tags (the hash's high bits, never 0), each slot the key, its counts, when
//! it was taken (`born`) and when last counted.
//!
//! # Who is kept
//! A key keeps its slot while it is counted: a new key takes an empty slot,
//! or the one not counted for [`STALE_NS`] the longest, never one counted
//! since. The daemon reports every key at each sync (every 100 ms), so a slot
//! given up holds nothing unreported unless the daemon has been away for
//! [`STALE_NS`]. A key whose set holds only keys counted since is not
//! counted (the event [`Event::FleetFull`](crate::Event::FleetFull)): the
//! fleet does not see those frames, which errs toward admitting, so the
//! event is in `stats` and the metrics. At [`FLEET_CAPACITY`](crate::FLEET_CAPACITY)
//! slots, eight to a set: with 8 192 keys counted within [`STALE_NS`] of
//! each other, some set is full about once in 100 such loads; with 16 384,
//! about two sets are.
//!
//! # Races
//! A slot is taken by one compare-and-swap of its tag to [`LOCKED`]; its
//! key, counts and stamps are written, then its tag. The daemon skips a
//! locked slot and one whose key does not hash to its tag. Two CPUs counting
//! a key's first frame at once: one takes the slot, the other finds it
//! locked and its frame is not counted (the daemon's bound allows a frame
//! per key and sync).

use crate::{FleetSlot, FleetUsed, FlowKey, doorkeeper::mix, table::Cells};

pub use crate::maps::{FLEET_LOCKED as LOCKED, FLEET_SETS as SETS, FLEET_WAYS as WAYS, FleetSet};

/// A slot not counted for this long may be taken by another key: 100 of the
/// daemon's syncs.
pub const STALE_NS: u64 = 10_000_000_000;

/// What makes the set's and tag's hash seed from the maps' seed.
const SALT: u64 = 0x666c_6565_742d_7573;

/// (set, tag) of `key` under the maps' `seed`: the set from the hash's low
/// bits, the tag from its high bits (never 0, never [`LOCKED`]).
#[inline(always)]
pub fn place(key: &FlowKey, seed: u64) -> (u32, u64) {
    let h = crate::doorkeeper::hash(key, mix(seed ^ SALT));
    ((h as u32) & (SETS - 1), (h >> 1) | 1)
}

/// What [`count`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Counted {
    /// Added to the key's slot.
    Added,
    /// The key took slot `0`.
    Took(usize),
    /// Every slot of the set holds a key counted within [`STALE_NS`].
    Full,
    /// Another CPU was taking the slot chosen: this frame is not counted.
    Lost,
}

/// Counts a frame of `bytes` admitted to `key` (tag `tag`) at `now` in `set`
/// (module docs).
///
/// # Safety
/// `set` is a valid [`FleetSet`] for the call, shared with other CPUs and
/// the daemon only through `C`'s atomics and the plain writes of this
/// protocol.
#[inline(always)]
pub unsafe fn count<C: Cells>(
    set: *mut FleetSet,
    key: &FlowKey,
    tag: u64,
    bytes: u64,
    now: u64,
) -> Counted {
    // SAFETY: the caller's contract.
    let tags = unsafe { (&raw mut (*set).tags).cast::<u64>() };
    let slot = |i: usize| -> *mut FleetSlot {
        // SAFETY: the caller's contract; `i` is below WAYS.
        unsafe { (&raw mut (*set).slots).cast::<FleetSlot>().wrapping_add(i) }
    };
    let mut free = None;
    let mut oldest = u64::MAX;
    let mut i = 0;
    while i < WAYS {
        let t = C::load(tags.wrapping_add(i));
        let s = slot(i);
        if t == tag {
            // SAFETY: fields of a slot of the set.
            unsafe {
                C::add(&raw mut (*s).used.packets, 1);
                C::add(&raw mut (*s).used.bytes, bytes);
                C::store(&raw mut (*s).seen, now);
            }
            return Counted::Added;
        }
        if t != LOCKED {
            // An empty slot first, then the one idle the longest.
            let at = if t == 0 {
                0
            } else {
                // SAFETY: a field of a slot of the set.
                C::load(unsafe { &raw mut (*s).seen })
            };
            let idle = t == 0 || now.saturating_sub(at) >= STALE_NS;
            if idle && (free.is_none() || at < oldest) {
                free = Some((i, t));
                oldest = at;
            }
        }
        i += 1;
    }
    let Some((i, seen_tag)) = free else {
        return Counted::Full;
    };
    // Taken only as it was chosen: a slot another CPU took meanwhile keeps
    // its new key.
    if !C::cas(tags.wrapping_add(i), seen_tag, LOCKED).1 {
        return Counted::Lost;
    }
    let s = slot(i);
    // SAFETY: the slot is ours until its tag is written; its key is written
    // as words (5 of 4 bytes: the key's own alignment).
    unsafe {
        C::store(&raw mut (*s).used.packets, 1);
        C::store(&raw mut (*s).used.bytes, bytes);
        C::store(&raw mut (*s).used.born, now);
        C::store(&raw mut (*s).seen, now);
        core::ptr::write_volatile(&raw mut (*s).key, *key);
    }
    C::xchg(tags.wrapping_add(i), tag);
    Counted::Took(i)
}

/// Each slot of `set` that holds a key (not being taken, its key hashing to
/// its tag under `seed`), with what it was admitted.
pub fn held(set: &FleetSet, seed: u64) -> impl Iterator<Item = (FlowKey, FleetUsed)> + '_ {
    (0..WAYS).filter_map(move |i| {
        let (t, s) = (set.tags[i], &set.slots[i]);
        (t != 0 && t != LOCKED && place(&s.key, seed).1 == t).then_some((s.key, s.used))
    })
}

#[cfg(test)]
mod tests;
