//! The state table ([`ratelimit_common::table`]): a key's slot found in its
//! two lines, or claimed. Positions travel as one number ([`Pos`]), so
//! that the functions that find them return no pointer.
//!
//! Enters: the key's word and hash, its family's region of the table. Leaves: the slot's
//! position, its state word, when it was born. Called by the limit
//! ([`super::limit`]), the untracked path ([`super::untracked`]) and the key
//! levels ([`super::levels`]).

use core::{
    intrinsics::{AtomicOrdering, atomic_xadd, atomic_xchg},
    ptr::{read_volatile, write_volatile},
};

use ratelimit_common::table::{self, Cells, Choice, Line, Slot};

use super::{
    bucket::cas,
    maps::{RL_BORN, RL_TABLE},
};

/// The program's atomics for [`table`]'s protocol.
pub(crate) struct Bpf;

impl Cells for Bpf {
    #[inline(always)]
    fn load(p: *mut u64) -> u64 {
        // SAFETY: callers pass a word of a line valid for this run.
        unsafe { read_volatile(p) }
    }
    #[inline(always)]
    fn cas(p: *mut u64, old: u64, new: u64) -> (u64, bool) {
        cas(p, old, new)
    }
    #[inline(always)]
    fn xchg(p: *mut u64, new: u64) -> u64 {
        // SAFETY: as in `load`.
        unsafe { atomic_xchg::<u64, { AtomicOrdering::SeqCst }>(p, new) }
    }
    #[inline(always)]
    fn add(p: *mut u64, n: u64) {
        // SAFETY: as in `load`.
        unsafe { atomic_xadd::<u64, u64, { AtomicOrdering::Relaxed }>(p, n) };
    }
    #[inline(always)]
    fn store(p: *mut u64, v: u64) {
        // SAFETY: as in `load`.
        unsafe { write_volatile(p, v) }
    }
}

/// A slot's position: `(line << 2 | slot) + 1`; 0 is none.
pub(crate) type Pos = u64;

#[inline(always)]
fn line(n: u32) -> *mut Line {
    match RL_TABLE.get_ptr_mut(n) {
        Some(p) => p,
        None => core::ptr::null_mut(),
    }
}

#[inline(always)]
fn pos(line: u32, slot: u32) -> Pos {
    ((u64::from(line) << 2) | u64::from(slot & 3)) + 1
}

/// The position of key word `kw` (hash `h`) in the table's `region`
/// ([`table::region`]), or 0.
///
/// A global function: the caller sees an unknown number come back, and so
/// walks what follows once, not once for each slot a key may be found in.
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn rl_find(kw: u64, h: u64, region: u64) -> Pos {
    find(kw, h, region)
}

/// [`rl_find`], inlined in its caller.
#[inline(always)]
pub(crate) fn find(kw: u64, h: u64, region: u64) -> Pos {
    let (a, b) = table::region_lines(h, region);
    let la = line(a);
    if la.is_null() {
        return 0;
    }
    // SAFETY: a line of the table, valid for this run.
    if let Some(i) = unsafe { table::find_in::<Bpf>(la, kw) } {
        return pos(a, i);
    }
    let lb = line(b);
    if lb.is_null() {
        return 0;
    }
    // SAFETY: as above.
    match unsafe { table::find_in::<Bpf>(lb, kw) } {
        Some(i) => pos(b, i),
        None => 0,
    }
}

/// Claims a slot for key word `kw` (hash `h`, in the table's `region`) holding state word `state` (module docs of [`table`]); `now` is
/// its birth. Answers its position; [`FULL`] when both lines are full of
/// busy slots; the position of the key claimed at the same moment by another
/// CPU, or [`BUSY`] if it is not stored yet.
///
/// A global function: the verifier walks the claim's paths once, and the
/// caller sees one number come back.
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn rl_claim(kw: u64, h: u64, region: u64, state: u64, now: u64) -> u64 {
    claim::<true>(kw, h, region, state, now)
}

/// [`rl_claim`] for a key level's key: of the free slots, the first is
/// taken, not the one idle the longest ([`table::choose_first`]). Called
/// on the deepest chain of calls ([`super::levels::rl_level_slot`]), where
/// [`rl_choose`]'s frame does not fit.
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn rl_claim_level(kw: u64, h: u64, region: u64, state: u64, now: u64) -> u64 {
    claim::<false>(kw, h, region, state, now)
}

/// [`rl_claim`] (`OLDEST`: the free slot idle the longest is taken) or
/// [`rl_claim_level`], inlined in its caller.
#[inline(always)]
pub(crate) fn claim<const OLDEST: bool>(kw: u64, h: u64, region: u64, state: u64, now: u64) -> u64 {
    let (a, b) = table::region_lines(h, region);
    let (la, lb) = (line(a), line(b));
    if la.is_null() || lb.is_null() {
        return BUSY;
    }
    let born = |n: u32| match RL_BORN.get_ptr_mut(n) {
        Some(p) => p,
        None => core::ptr::null_mut(),
    };
    let mut got = Slot::Raced;
    // A slot that changed under the claim is chosen again, a few times.
    for _ in 0..CLAIM_TRIES {
        let (ca, cb) = if OLDEST {
            (
                Choice::unpack(rl_choose(u64::from(a), now)),
                Choice::unpack(rl_choose(u64::from(b), now)),
            )
        } else {
            // SAFETY: two lines of the table, valid for this run.
            unsafe {
                (
                    table::choose_first::<Bpf>(la, now),
                    table::choose_first::<Bpf>(lb, now),
                )
            }
        };
        // SAFETY: two lines of the table and their birth stamps (or null),
        // valid for this run.
        got = unsafe { table::claim_with::<Bpf>(la, lb, born(a), born(b), ca, cb, kw, state, now) };
        if got != Slot::Raced {
            break;
        }
    }
    match got {
        Slot::At(0, i) => pos(a, i),
        Slot::At(_, i) => pos(b, i),
        Slot::Full => FULL,
        Slot::Busy | Slot::Raced => match find(kw, h, region) {
            0 => BUSY,
            p => p,
        },
    }
}

/// What line `n` offers a claim at `now` ([`table::choose`], packed; a line
/// that cannot be read offers nothing).
///
/// A global function: choosing the slot idle the longest has many paths,
/// which the verifier walks once here, not for each line and try.
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn rl_choose(n: u64, now: u64) -> u64 {
    let l = line(n as u32);
    if l.is_null() {
        return 0;
    }
    // SAFETY: a line of the table, valid for this run.
    unsafe { table::choose::<Bpf>(l, now) }.pack()
}

/// Tries of a claim whose chosen slot changed before it was locked.
const CLAIM_TRIES: u32 = 3;

/// [`claim`]: both lines are full of busy slots.
pub(crate) const FULL: u64 = u64::MAX;
/// [`claim`]: another CPU is claiming the key.
pub(crate) const BUSY: u64 = u64::MAX - 1;

/// The state word at `p` (a position [`find`] or [`claim`] gave), or null.
#[inline(always)]
pub(crate) fn word(p: Pos) -> *mut u64 {
    let p = p.wrapping_sub(1);
    let l = line((p >> 2) as u32);
    if l.is_null() {
        return core::ptr::null_mut();
    }
    // Read again after the check, so that LLVM cannot move the offset's
    // addition above it (the verifier refuses arithmetic on a pointer that
    // may be null).
    // SAFETY: a local.
    let slot = unsafe { read_volatile(&p) } & 3;
    // SAFETY: a line of the table; the slot is masked below WAYS.
    unsafe { table::words_of(l, slot as u32).1 }
}

/// When the key at `p` got its state (0 if it cannot be read).
#[inline(always)]
pub(crate) fn born(p: Pos) -> u64 {
    let p = p.wrapping_sub(1);
    match RL_BORN.get((p >> 2) as u32) {
        Some(b) => b[(p & 3) as usize],
        None => 0,
    }
}

/// Whether the state word `word` (of a slot whose key word sits
/// [`KEY_OFFSET`] words before it) read as `seen` is still the state of
/// key word `owner`: see [`table`] on the old owner. `owner` 0: a word of
/// no table (a rule's shared bucket), always its own.
#[inline(always)]
pub(crate) fn still_owned(word: *mut u64, seen: u64, owner: u64) -> bool {
    if owner == 0 {
        return true;
    }
    // SAFETY: `word` is a state word of a line valid for this run; its key
    // word is `WAYS` words before it (`Line`'s layout).
    let key = unsafe { read_volatile(word.wrapping_sub(table::WAYS)) };
    table::owned(seen, key, owner)
}
