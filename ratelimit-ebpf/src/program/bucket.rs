//! One GCRA bucket kept in a map word and shared by CPUs: peeked (nothing
//! written), taken or given back with compare-and-swap, the algorithm's math
//! from `ratelimit_common::gcra`.
//!
//! Enters: the word, its parameters, the clock and the cost. Leaves: whether
//! the bucket admitted. Called by the levels ([`super::levels`]), the
//! aggregate's users and the untracked path (whose doorkeeper slots use
//! [`cas`] too).

use core::{
    intrinsics::{AtomicOrdering, atomic_cxchg},
    ptr::read_volatile,
};

use ratelimit_common::{CAS_RETRIES, gcra};

use super::table::still_owned;

/// Retries of a compare-and-swap on a word few CPUs touch at once (a
/// doorkeeper slot, a unit given back): fewer paths for the verifier. Running
/// out errs toward limiting (a sighting not recorded, a unit not given back).
pub(crate) const SHORT_RETRIES: u32 = 4;

/// Whether the GCRA bucket at `word` would admit `cost` now (nothing written).
#[inline(always)]
pub(crate) fn peek(word: *mut u64, params: &gcra::Params, now: u64, cost: u64) -> bool {
    // SAFETY: as in `two_levels`.
    let mut next = gcra::State {
        tat: unsafe { read_volatile(word) },
    };
    gcra::admit(&mut next, params, now, cost)
}

/// Whether units were taken from a shared bucket.
pub(crate) enum Taken {
    Yes,
    No,
    Contended,
}

/// Takes `cost` units from the GCRA bucket at `word` if it has them, and
/// `keep` ticks more (a reserve the frame may not touch; see
/// [`gcra::admit_keeping`]). `owner`: the key word of the table slot the
/// word is in, 0 for a word of no table ([`still_owned`]); a slot no longer
/// the key's is `Contended`.
#[inline(always)]
pub(crate) fn take(
    word: *mut u64,
    owner: u64,
    params: &gcra::Params,
    now: u64,
    cost: u64,
    keep: u64,
) -> Taken {
    // SAFETY: as in `two_levels`.
    let mut seen = unsafe { read_volatile(word) };
    let mut taken = Taken::Contended;
    for _ in 0..CAS_RETRIES {
        if !still_owned(word, seen, owner) {
            break;
        }
        let mut next = gcra::State { tat: seen };
        let allowed = gcra::admit_keeping(&mut next, params, now, cost, keep);
        let (found, swapped) = if next.tat == seen {
            (seen, true)
        } else {
            cas(word, seen, next.tat)
        };
        if swapped {
            taken = if allowed { Taken::Yes } else { Taken::No };
            break;
        }
        seen = found;
    }
    taken
}

/// Gives `cost` units back to the GCRA bucket at `word` (never above its
/// capacity). Should the retries run out, the units stay taken: the bucket
/// errs toward limiting. `owner` as for [`take`]: units are never given to a
/// slot's next key.
#[inline(always)]
pub(crate) fn give_back(word: *mut u64, owner: u64, params: &gcra::Params, now: u64, cost: u64) {
    // SAFETY: as in `two_levels`.
    let mut seen = unsafe { read_volatile(word) };
    for _ in 0..SHORT_RETRIES {
        if !still_owned(word, seen, owner) {
            break;
        }
        let mut next = gcra::State { tat: seen };
        gcra::refund(&mut next, params, now, cost);
        let (found, swapped) = cas(word, seen, next.tat);
        if swapped {
            break;
        }
        seen = found;
    }
}

/// Compare-and-swap on a map value word: (the value found, whether it was
/// replaced).
#[inline(always)]
pub(crate) fn cas(word: *mut u64, old: u64, new: u64) -> (u64, bool) {
    // SAFETY: callers pass an 8-byte, 8-aligned word of a map value valid for
    // this run.
    unsafe {
        atomic_cxchg::<u64, { AtomicOrdering::SeqCst }, { AtomicOrdering::SeqCst }>(word, old, new)
    }
}
