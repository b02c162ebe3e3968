//! The state table: each key's GCRA word in a set-associative table of
//! 64-byte lines, so that finding a source's state costs one cache line, not
//! a walk of a hash bucket's list.
//!
//! # Layout
//! [`MAP_TABLE`](crate::MAP_TABLE) is an array of [`Line`]s: four key words,
//! then their four state words. IPv4 keys have the first lines, IPv6 keys the
//! rest ([`region`]: each family's share is sized by its own flag). A key may
//! live in either of two lines of its region ([`lines`], from a keyed hash of
//! the key whose seed the daemon draws at load); a new key takes a free slot
//! of the emptier one. With two choices a table whose slots are half taken
//! refuses a new key about once in 30 000 tries ([`SLOTS_PER_SOURCE`]).
//! [`MAP_BORN`](crate::MAP_BORN) holds, at the same line and slot, when each
//! key got its state.
//!
//! # Key words
//! An IPv4 key (a 32-bit address and a key id) is its own key word
//! ([`key_word`]): exact. An IPv6 key (a 128-bit prefix and a key id) does not
//! fit in a word: its key word is a 64-bit hash of it under a second seed
//! drawn at load ([`key_word6`]), independent of the hash that picks its
//! lines. Two IPv6 keys share a state only if their key words are equal and
//! they share a line: about once in 2^63 comparisons, with no way to aim it
//! without the seed. A lookup compares eight slots, so at 25 M frames a
//! second for a year (2^50 lookups) the chance that any frame is judged
//! against another key's bucket is below 2^-10.
//!
//! # Exact
//! A slot may be given to another key only when it is *free*: empty, or its
//! bucket reads as full under any rule ([`reads_full`]). Reusing such a slot
//! forgets nothing: a key without a state starts with a full bucket. A key
//! whose two lines hold only busy slots gets no state: its frame is judged as a
//! new source's (counted as [`Event::StateFull`](crate::Event::StateFull)),
//! which errs toward limiting.
//!
//! # Claims and the old owner
//! A slot is claimed in three steps: its state word is swapped from the free
//! value seen to [`LOCKED`] (one compare-and-swap: two claimers cannot both
//! win), the new key is exchanged into the key word, and the new state is
//! stored, never equal to the value seen before the claim ([`fresh`]). After
//! the key is written, the claimer looks for the same key in the other slots
//! of both lines: if another CPU claimed one for it at the same moment, at
//! least one of the two sees the other (both exchanges are full barriers)
//! and gives its slot back, so a key never holds two buckets.
//!
//! A CPU that found the key before the claim (the old owner) holds the value
//! it read; its compare-and-swap expects that value, which the claim has
//! replaced, so it fails. After a failed compare-and-swap, and after reading
//! a state word, the reader checks the word is not [`LOCKED`] and the key word
//! is still its key ([`owned`]): the claim writes the key before the state,
//! so a state written by the new owner is never read as the old one's. A
//! frame of the old owner is thus never charged to the new one, and the new
//! owner never inherits the old one's debt.

use crate::{Words, gcra};

/// Slots in a line.
pub const WAYS: usize = 4;

/// Table slots per source the daemon sizes for: with two lines to choose
/// from, a table half full refuses about 0.003 % of new keys.
pub const SLOTS_PER_SOURCE: u32 = 2;

/// One line of [`MAP_TABLE`](crate::MAP_TABLE): 64 bytes, one cache line.
#[repr(C, align(64))]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Line {
    /// Each slot's key ([`key_word`]); 0 is an empty slot.
    pub keys: [u64; WAYS],
    /// Each slot's [`gcra::State`] word, or [`LOCKED`] during a claim.
    pub tats: [u64; WAYS],
}
const _: () = assert!(core::mem::size_of::<Line>() == 64);

/// When each slot's key got its state (the program's clock, ns): the value
/// of [`MAP_BORN`](crate::MAP_BORN) for a line.
pub type Born = [u64; WAYS];

/// A state word while its slot is being claimed. Never a state a bucket holds
/// in practice (generation 3 and the last tick of the 62-bit range).
pub const LOCKED: u64 = u64::MAX;

/// The key word of an IPv4 key: the rule's key id and the masked address
/// word, inverted so that no key is 0 (a key id has at most 31 bits set below
/// its top bit: [`crate::MAX_RULE_ID`], two level bits).
#[inline(always)]
pub const fn key_word(addr: u32, key_id: u32) -> u64 {
    !(((key_id as u64) << 32) | addr as u64)
}

/// The (address word, key id) of a key word.
#[inline(always)]
pub const fn key_of(word: u64) -> (u32, u32) {
    let w = !word;
    (w as u32, (w >> 32) as u32)
}

/// The key word of `masked` words (an IPv4-mapped address) under `key_id`.
#[inline(always)]
pub const fn key_word_of(masked: &Words, key_id: u32) -> u64 {
    key_word(masked[3], key_id)
}

/// What makes [`key_word6`]'s seed from the table's: another seed, as secret.
pub const KEY6_SALT: u64 = 0x6b65_7936_2d73_616c;

/// The key word of an IPv6 key (`masked` words under `key_id`), with the
/// seed `seed` ([`Config::hash_seed`](crate::Config::hash_seed)): a hash of
/// it under a seed of its own, never 0 (module docs).
#[inline(always)]
pub fn key_word6(masked: &Words, key_id: u32, seed: u64) -> u64 {
    crate::doorkeeper::hash_words(masked, key_id, crate::doorkeeper::mix(seed ^ KEY6_SALT)) | 1
}

/// The key word of a key of family `fam` ([`key_word_of`], [`key_word6`]).
#[inline(always)]
pub fn key_word_for(fam: u8, masked: &Words, key_id: u32, seed: u64) -> u64 {
    if fam == crate::family::V4 {
        key_word_of(masked, key_id)
    } else {
        key_word6(masked, key_id, seed)
    }
}

/// A family's region of the table: its lines less one (`mask`, a power of
/// two less one) and its first line (`base`), as one number.
#[inline(always)]
pub const fn region(mask: u32, base: u32) -> u64 {
    mask as u64 | ((base as u64) << 32)
}

/// [`lines`] of hash `h` in `region` ([`region`]): the two lines' indices in
/// the whole table.
#[inline(always)]
pub const fn region_lines(h: u64, region: u64) -> (u32, u32) {
    let (a, b) = lines(h, region as u32);
    let base = (region >> 32) as u32;
    (base.wrapping_add(a), base.wrapping_add(b))
}

/// The two lines a key of hash `h` may live in, in a table of `mask + 1`
/// lines (a power of two). Distinct unless the table has one line.
#[inline(always)]
pub const fn lines(h: u64, mask: u32) -> (u32, u32) {
    let a = (h as u32) & mask;
    let b = (((h >> 32) as u32) ^ ((h >> 11) as u32)) & mask;
    if a == b { (a, (a ^ 1) & mask) } else { (a, b) }
}

/// Whether a slot holding `key` and state word `tat` may be given to another
/// key at `now_ns`: not being claimed, and empty or a bucket that reads as
/// full under any rule. (An empty slot being claimed is not free: two CPUs
/// would both own it.)
#[inline(always)]
pub fn free(key: u64, tat: u64, now_ns: u64) -> bool {
    tat != LOCKED && (key == 0 || reads_full(tat, now_ns))
}

/// Whether a state word reads as a full bucket at `now_ns` whatever the rule:
/// its TAT is not ahead of now, or so far ahead that it is an idle state
/// wrapped around (see [`gcra`]).
#[inline(always)]
pub fn reads_full(tat: u64, now_ns: u64) -> bool {
    let d = (tat.wrapping_sub(crate::ns_to_ticks(now_ns))) << (64 - gcra::TAT_BITS);
    d as i64 <= 0 || d > gcra::STALE_AHEAD << (64 - gcra::TAT_BITS)
}

/// The state a claim stores: `state`, unless it equals `seen` (the free value
/// the claim replaced), then the same full bucket one tick earlier. See the
/// module docs: an old owner's compare-and-swap must not succeed on it.
#[inline(always)]
pub const fn fresh(state: u64, seen: u64) -> u64 {
    if state == seen {
        (state & !gcra::TAT_MASK) | (state.wrapping_sub(1) & gcra::TAT_MASK)
    } else {
        state
    }
}

/// Whether a state word read for `key` (then the key word `found_key` read
/// after it) is still that key's.
#[inline(always)]
pub const fn owned(tat: u64, found_key: u64, key: u64) -> bool {
    tat != LOCKED && found_key == key
}

/// Word access the claim needs: the program's atomics, or the host's on the
/// table mapped into the daemon. Its methods are given only words of a live
/// table by this module's unsafe functions, whose callers vouch for them.
pub trait Cells {
    /// Reads a word.
    fn load(p: *mut u64) -> u64;
    /// Compare-and-swap: (the value found, whether it was replaced).
    fn cas(p: *mut u64, old: u64, new: u64) -> (u64, bool);
    /// Atomic exchange (a full barrier).
    fn xchg(p: *mut u64, new: u64) -> u64;
    /// Atomic add, no barrier (`top`'s counts: [`crate::top`]).
    fn add(p: *mut u64, n: u64);
    /// A plain write of a word no reader needs ordered (`top`'s stamps).
    fn store(p: *mut u64, v: u64);
}

/// [`Cells`] on the host: the table mapped into the daemon's memory, shared
/// with the program, through `AtomicU64` (sequentially consistent).
#[cfg(any(feature = "std", test))]
pub struct HostCells;

// The words are only ever those of a mapped table that the callers of the
// table's (unsafe) functions vouch for, as with the program's `Cells`.
#[cfg(any(feature = "std", test))]
#[allow(clippy::not_unsafe_ptr_arg_deref)]
impl Cells for HostCells {
    fn load(p: *mut u64) -> u64 {
        // SAFETY: callers pass an aligned word of a live mapping.
        unsafe { core::sync::atomic::AtomicU64::from_ptr(p) }
            .load(core::sync::atomic::Ordering::SeqCst)
    }
    fn cas(p: *mut u64, old: u64, new: u64) -> (u64, bool) {
        use core::sync::atomic::{AtomicU64, Ordering::SeqCst};
        // SAFETY: as in `load`.
        match unsafe { AtomicU64::from_ptr(p) }.compare_exchange(old, new, SeqCst, SeqCst) {
            Ok(v) => (v, true),
            Err(v) => (v, false),
        }
    }
    fn xchg(p: *mut u64, new: u64) -> u64 {
        // SAFETY: as in `load`.
        unsafe { core::sync::atomic::AtomicU64::from_ptr(p) }
            .swap(new, core::sync::atomic::Ordering::SeqCst)
    }
    fn add(p: *mut u64, n: u64) {
        // SAFETY: as in `load`.
        unsafe { core::sync::atomic::AtomicU64::from_ptr(p) }
            .fetch_add(n, core::sync::atomic::Ordering::Relaxed);
    }
    fn store(p: *mut u64, v: u64) {
        // SAFETY: as in `load`.
        unsafe { core::sync::atomic::AtomicU64::from_ptr(p) }
            .store(v, core::sync::atomic::Ordering::Relaxed);
    }
}

/// Where a key's state is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Slot {
    /// Line `0` (of the pair given), slot `1`.
    At(u32, u32),
    /// Being claimed by another CPU, or claimed twice at once: the caller
    /// judges the frame without a state this time.
    Busy,
    /// Both lines full of busy slots: no state.
    Full,
    /// The free slot chosen changed before it could be locked (its owner
    /// came back, or another key took it): the caller may try again.
    Raced,
}

/// Finds `key` in `line`: its slot, if there.
///
/// # Safety
/// `line` is a valid line of the table for the call.
#[inline(always)]
pub unsafe fn find_in<C: Cells>(line: *mut Line, key: u64) -> Option<u32> {
    // SAFETY: the caller's.
    let keys = unsafe { &raw mut (*line).keys };
    let mut i = 0;
    while i < WAYS {
        // SAFETY: in the line.
        if C::load(unsafe { (keys as *mut u64).add(i) }) == key {
            return Some(i as u32);
        }
        i += 1;
    }
    None
}

/// The key word and state word of slot `i` of `line`.
///
/// # Safety
/// As [`find_in`]; `i < WAYS`.
#[inline(always)]
pub unsafe fn words_of(line: *mut Line, i: u32) -> (*mut u64, *mut u64) {
    let i = (i as usize) & (WAYS - 1);
    // SAFETY: the caller's.
    unsafe {
        (
            (&raw mut (*line).keys as *mut u64).add(i),
            (&raw mut (*line).tats as *mut u64).add(i),
        )
    }
}

/// Claims a free slot for `key` in `a` or `b` (its two lines) and stores
/// `state` there ([`fresh`] of it); writes `born` beside it if given. Answers
/// where, or why not. The caller has looked for the key and not found it.
///
/// The slot chosen is an empty one, in the emptier line, if either line has
/// one; else the free slot idle the longest ([`idle_age`]). So a source that
/// sends now and then, below its rate (its bucket refills between frames),
/// keeps its slot, and with it its birth (an established source stays
/// established), while a flood's keys that came once take each other's: the
/// eight slots a key may take are kept as a recency order would keep them,
/// and an active slot is still never given away.
///
/// # Safety
/// `a` and `b` are valid lines of the table, `born_a` and `born_b` their
/// entries in the born table or null.
#[inline(always)]
pub unsafe fn claim<C: Cells>(
    a: *mut Line,
    b: *mut Line,
    born_a: *mut Born,
    born_b: *mut Born,
    key: u64,
    state: u64,
    now_ns: u64,
) -> Slot {
    // SAFETY: the caller's.
    let (ca, cb) = unsafe { (choose::<C>(a, now_ns), choose::<C>(b, now_ns)) };
    // SAFETY: the caller's.
    unsafe { claim_with::<C>(a, b, born_a, born_b, ca, cb, key, state, now_ns) }
}

/// What a line offers a claim ([`choose`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Choice {
    /// Free slots.
    pub free: u32,
    /// The free slot idle the longest.
    pub slot: u32,
    /// How long, coarsely ([`idle_age`] ÷ 256: below 2^56).
    pub age: u64,
}

impl Choice {
    /// As one number (the program's global functions return one).
    #[inline(always)]
    pub const fn pack(self) -> u64 {
        (self.age << 5) | ((self.free as u64 & 7) << 2) | (self.slot as u64 & 3)
    }

    /// [`Choice::pack`] read back.
    #[inline(always)]
    pub const fn unpack(p: u64) -> Self {
        Self {
            free: ((p >> 2) & 7) as u32,
            slot: (p & 3) as u32,
            age: p >> 5,
        }
    }
}

/// [`claim`] with each line's [`Choice`] made (the program makes them in a
/// global function of their own: its paths are many).
///
/// # Safety
/// As [`claim`].
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub unsafe fn claim_with<C: Cells>(
    a: *mut Line,
    b: *mut Line,
    born_a: *mut Born,
    born_b: *mut Born,
    ca: Choice,
    cb: Choice,
    key: u64,
    state: u64,
    now_ns: u64,
) -> Slot {
    // The slot idle the longest (an empty one first); of two empty ones, the
    // emptier line's.
    let (line, born, which, i) = if ca.free == 0 && cb.free == 0 {
        return Slot::Full;
    } else if cb.free == 0 || ca.age > cb.age || (ca.age == cb.age && ca.free >= cb.free) {
        (a, born_a, 0, ca.slot)
    } else {
        (b, born_b, 1, cb.slot)
    };
    // Read again: still free, or another claim took it since.
    // SAFETY: the caller's; `i < WAYS`.
    let (kw, tw) = unsafe { words_of(line, i) };
    let seen = C::load(tw);
    if !free(C::load(kw), seen, now_ns) {
        return Slot::Raced;
    }
    if !C::cas(tw, seen, LOCKED).1 {
        return Slot::Raced;
    }
    C::xchg(kw, key);
    // Another slot claimed for the same key at the same moment, in either
    // line: give this one back (module docs).
    // SAFETY: the caller's.
    let twice = unsafe { holds_other::<C>(a, key, line, i) || holds_other::<C>(b, key, line, i) };
    if twice {
        C::xchg(kw, 0);
        C::xchg(tw, 0);
        return Slot::Busy;
    }
    if !born.is_null() {
        // SAFETY: the born table's entry of this line, `i < WAYS`.
        unsafe {
            (born as *mut u64)
                .add(i as usize & (WAYS - 1))
                .write_volatile(now_ns)
        };
    }
    C::xchg(tw, fresh(state, seen));
    Slot::At(which, i)
}

/// What `line` offers a claim at `now_ns`: its free slots and the one idle
/// the longest.
///
/// # Safety
/// As [`find_in`].
#[inline(always)]
pub unsafe fn choose<C: Cells>(line: *mut Line, now_ns: u64) -> Choice {
    let mut c = Choice {
        free: 0,
        slot: 0,
        age: 0,
    };
    let now = crate::ns_to_ticks(now_ns);
    let mut i = 0u32;
    while (i as usize) < WAYS {
        // SAFETY: the caller's.
        let (kw, tw) = unsafe { words_of(line, i) };
        let (k, t) = (C::load(kw), C::load(tw));
        if free(k, t, now_ns) {
            let a = idle_age(k, t, now) >> 8;
            if c.free == 0 || a > c.age {
                c.slot = i;
                c.age = a;
            }
            c.free += 1;
        }
        i += 1;
    }
    c
}

/// What `line` offers a claim at `now_ns` when which idle slot goes does
/// not matter: its free slots and the first (its age left 0, so that of two
/// lines the emptier is chosen). The program's key levels claim so: their
/// frame is on its deepest chain of calls, where [`choose`]'s does not fit.
///
/// # Safety
/// As [`find_in`].
#[inline(always)]
pub unsafe fn choose_first<C: Cells>(line: *mut Line, now_ns: u64) -> Choice {
    let mut c = Choice {
        free: 0,
        slot: 0,
        age: 0,
    };
    let mut i = 0u32;
    while (i as usize) < WAYS {
        // SAFETY: the caller's.
        let (kw, tw) = unsafe { words_of(line, i) };
        if free(C::load(kw), C::load(tw), now_ns) {
            if c.free == 0 {
                c.slot = i;
            }
            c.free += 1;
        }
        i += 1;
    }
    c
}

/// How long a free slot (key word `key`, state word `tat`) has been idle at
/// `now` (ticks), as a number that only orders slots: an empty slot is the
/// oldest ([`u64::MAX`]), then a state wrapped around (idle for days), then
/// the longer its bucket has been full.
#[inline(always)]
pub const fn idle_age(key: u64, tat: u64, now: u64) -> u64 {
    if key == 0 {
        return u64::MAX;
    }
    let d = tat.wrapping_sub(now) << (64 - gcra::TAT_BITS);
    if d as i64 <= 0 {
        // Behind now by this much (shifted): full since then.
        (d as i64).unsigned_abs() >> 1
    } else {
        // Ahead by more than any rule allows: wrapped around.
        u64::MAX - 1
    }
}

/// Whether a slot of `line` other than slot `i` of `mine` holds `key`.
///
/// # Safety
/// As [`find_in`].
#[inline(always)]
unsafe fn holds_other<C: Cells>(line: *mut Line, key: u64, mine: *mut Line, i: u32) -> bool {
    let mut j = 0u32;
    while (j as usize) < WAYS {
        // SAFETY: the caller's.
        let (kw, _) = unsafe { words_of(line, j) };
        if C::load(kw) == key && !(line == mine && j == i) {
            return true;
        }
        j += 1;
    }
    false
}

/// Frees slot `i` of `line` if it still holds `key` with a bucket that reads
/// as full at `now_ns` (the daemon's idle sweep): locked, emptied, unlocked.
/// Whether it was freed.
///
/// # Safety
/// As [`find_in`].
pub unsafe fn sweep_slot<C: Cells>(line: *mut Line, i: u32, key: u64, now_ns: u64) -> bool {
    // SAFETY: the caller's.
    let (kw, tw) = unsafe { words_of(line, i) };
    let t = C::load(tw);
    if C::load(kw) != key || t == LOCKED || !reads_full(t, now_ns) {
        return false;
    }
    if !C::cas(tw, t, LOCKED).1 {
        return false;
    }
    C::xchg(kw, 0);
    C::xchg(tw, 0);
    true
}

#[cfg(test)]
pub(crate) mod racing;
#[cfg(test)]
mod tests;
