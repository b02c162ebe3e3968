//! Levels: a frame under a limit rule passes only if every level admits it,
//! and consumes nothing at any level that did not.
//!
//! Enters: the frame's own level ([`Level`]: its key's bucket, or the
//! new-source budget) and the rule's shared levels ([`Levels`]: its further
//! key levels and its aggregate). Leaves: the [`Reason`]. Called by the limit
//! ([`super::limit`]); the shared levels are taken by the global functions
//! [`rl_levels`] and [`rl_level`].
//!
//! A frame under a rule with an aggregate passes only if both its own
//! bucket (or the new-source budget) and the aggregate allow it. The own level
//! is decided first without writing, the aggregate is then taken with
//! compare-and-swap, and the own level is committed last; if that commit finds
//! the own level empty after all (another CPU took the last token), the
//! aggregate's units are given back. So a frame denied at one level consumes
//! nothing at the other, and no level ever admits more than its own bucket.
//!
//! A rule's further key levels (its sources' /24 beside their own /32, say)
//! sit between the two: once the own level would admit the frame, each is
//! taken in turn with compare-and-swap ([`rl_levels`]); a level that refuses
//! makes the ones taken before it get their units back, and so does an
//! aggregate or an own commit that refuses after them.

use core::ptr::read_volatile;

use aya_ebpf::{bindings::xdp_md, programs::XdpContext};
use ratelimit_common::{
    CAS_RETRIES, Event, KeyLevel, Reason, Rule, Words, doorkeeper, gcra, level_flags, rule_flags,
    table,
};

use super::{
    aggregate::{aggregate, mark_refusal, rule_state},
    bucket::{Taken, cas, give_back, take},
    count::event,
    key::{Level, mask_source, reason_of},
    maps::{RL_CONFIG, RL_RULE_TABLE},
    parse::source_at,
    table::{BUSY, FULL, find, rl_claim_level, still_owned, word},
};

/// How the own level's commit ended.
pub(crate) enum Commit {
    Passed,
    Denied,
    Contended,
}

/// Decides a frame at its own level and the rule's shared levels (its key
/// levels and aggregate), committing all or none (module docs). A null own
/// word is no own level (a rule without a new-source budget): the shared
/// levels alone judge.
#[inline(always)]
pub(crate) fn two_levels(own: Level, shared: &Levels, now: u64) -> Reason {
    // SAFETY: `own.params` points into a rule value valid for this run.
    let params = unsafe { &*own.params };
    let unbounded = own.word.is_null();
    let (mut seen, mut next) = (0, gcra::State { tat: 0 });
    if !unbounded {
        // SAFETY: `own.word` points at an 8-byte, 8-aligned map value that
        // stays valid for the program's run (RCU); other CPUs change it only
        // through compare-and-swap.
        seen = unsafe { read_volatile(own.word) };
        if !still_owned(own.word, seen, own.owner) {
            // The key's slot was given to another key since it was found
            // (it was idle): this frame is not charged to the new one.
            return Reason::Contended;
        }
        next.tat = seen;
        if !gcra::admit(&mut next, params, now, own.cost) {
            if next.tat != seen {
                // A converted or capped debt (see gcra): stored even on a denial.
                cas(own.word, seen, next.tat);
            }
            return own.deny;
        }
    }
    if shared.on {
        let taken = shared.take();
        if taken != Reason::Passed {
            return taken;
        }
    }
    if unbounded {
        return own.pass;
    }
    // The own level, committed now: re-decided on what another CPU wrote.
    let mut end = Commit::Contended;
    for _ in 0..CAS_RETRIES {
        if next.tat == seen {
            end = Commit::Passed;
            break;
        }
        let (found, swapped) = cas(own.word, seen, next.tat);
        if swapped {
            end = Commit::Passed;
            break;
        }
        seen = found;
        if !still_owned(own.word, seen, own.owner) {
            break;
        }
        next = gcra::State { tat: seen };
        if !gcra::admit(&mut next, params, now, own.cost) {
            end = Commit::Denied;
            break;
        }
    }
    match end {
        Commit::Passed => own.pass,
        denied => {
            // The shared levels get their units back.
            shared.give_back();
            if matches!(denied, Commit::Denied) {
                own.deny
            } else {
                Reason::Contended
            }
        }
    }
}

/// A limit rule's shared levels: its key levels beyond the frame's own
/// ([`Rule::levels`]) and its aggregate, as [`rl_levels`] takes them (all
/// fields always set; see [`super::aggregate::Aggregate`]).
#[derive(Clone, Copy)]
pub(crate) struct Levels {
    /// The rule has such levels.
    pub(crate) on: bool,
    pub(crate) ctx: *mut xdp_md,
    pub(crate) l3: u64,
    /// The family, and the frame's length from bit 16 (see [`rl_levels`]).
    pub(crate) packed: u64,
    /// The rule's index in the rule table.
    pub(crate) index: u32,
    pub(crate) now: u64,
}

/// The shared levels of `rule` for this frame, from a young source or not
/// (see [`super::aggregate::young`]).
#[inline(always)]
pub(crate) fn shared_levels(
    ctx: &XdpContext,
    l3: usize,
    rule: &Rule,
    fam: u8,
    len: u64,
    now: u64,
    young: bool,
) -> Levels {
    Levels {
        on: rule.flags & (rule_flags::LEVELS | rule_flags::AGGREGATE) != 0,
        ctx: ctx.ctx,
        l3: l3 as u64,
        packed: u64::from(fam) | (len << 16) | if young { LEVELS_YOUNG } else { 0 },
        index: rule.index,
        now,
    }
}

/// [`rl_levels`]: take a unit at each level.
pub(crate) const LEVELS_TAKE: u64 = 0;
/// [`rl_levels`]: give each level its unit back.
pub(crate) const LEVELS_GIVE_BACK: u64 = 1 << 8;
/// [`rl_levels`]: the frame is from a young source ([`super::aggregate::young`]).
pub(crate) const LEVELS_YOUNG: u64 = 1 << 11;

impl Levels {
    /// Takes the frame's units at every level, or at none: the reason it was
    /// refused, else `Passed`.
    #[inline(always)]
    pub(crate) fn take(&self) -> Reason {
        reason_of(rl_levels(
            self.ctx,
            self.l3,
            self.packed | LEVELS_TAKE,
            self.index,
            self.now,
        ))
    }

    /// Gives back what [`Levels::take`] took, once a later level refused.
    #[inline(always)]
    pub(crate) fn give_back(&self) {
        if self.on {
            rl_levels(
                self.ctx,
                self.l3,
                self.packed | LEVELS_GIVE_BACK,
                self.index,
                self.now,
            );
        }
    }
}

/// The shared levels of the rule at `index` in the rule table (its key
/// levels, then its aggregate), for the frame whose IP header starts at `l3`:
/// `packed` holds the family (bits 0-7), the operation ([`LEVELS_TAKE`] or
/// [`LEVELS_GIVE_BACK`]) and the frame's length (from bit 16). Taking answers
/// `Reason::Passed` when every level admitted the frame (its units are then
/// taken at each), else the reason of the level that refused (those before
/// it got their units back).
///
/// A global function, as [`super::host::rl_host_connection`]: the verifier
/// checks it once and the limit path sees only a number come back. It calls
/// [`rl_level`] for each level, so that the verifier walks each level's
/// retries once, not every combination of them.
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn rl_levels(ctx: *mut xdp_md, l3: u64, packed: u64, index: u32, now: u64) -> u32 {
    let passed = Reason::Passed as u32;
    let Some(rule) = RL_RULE_TABLE.get(index) else {
        return passed;
    };
    let keyed = rule.flags & rule_flags::LEVELS != 0 && rule.levels[0].is_on();
    let second = keyed && rule.levels[1].is_on();
    let agg = rule.flags & rule_flags::AGGREGATE != 0;
    let level = |n: u64, op: u64| {
        let mut packed = packed | op | (n << LEVEL_SHIFT);
        if n != 0 {
            // The key's slot (claimed if it has none and units are taken),
            // found by a function of its own beside `rl_level` rather than
            // under it, and handed to it (see `rl_level_slot`).
            packed |= rl_level_slot(ctx, l3, packed, index, now) << LEVEL_POS_SHIFT;
        }
        rl_level(ctx, l3, packed, index, now)
    };
    let give_back_keyed = || {
        if keyed {
            level(1, LEVELS_GIVE_BACK);
        }
        if second {
            level(2, LEVELS_GIVE_BACK);
        }
    };
    if packed & LEVELS_GIVE_BACK != 0 {
        give_back_keyed();
        if agg {
            level(0, LEVELS_GIVE_BACK);
        }
        return passed;
    }
    if keyed {
        let r = level(1, LEVELS_TAKE);
        if r != passed {
            return r;
        }
    }
    if second {
        let r = level(2, LEVELS_TAKE);
        if r != passed {
            level(1, LEVELS_GIVE_BACK);
            return r;
        }
    }
    if agg {
        let r = level(0, LEVELS_TAKE);
        if r != passed {
            give_back_keyed();
            return r;
        }
    }
    passed
}

/// Where [`rl_level`] finds the level's number in `packed`: 0 for the
/// aggregate, 1 and 2 for [`Rule::levels`]` [0]` and `[1]`.
pub(crate) const LEVEL_SHIFT: u64 = 9;

/// One shared level of [`rl_levels`] (the level's number in `packed` at
/// [`LEVEL_SHIFT`]). A key level whose key has no state gets a full bucket
/// (only frames their own level admits come here, so a spoofed flood does not
/// create them); one whose state cannot be stored (both its lines full) does
/// not judge; one whose state another CPU is claiming refuses the frame
/// ([`LEVEL_BUSY`]).
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn rl_level(ctx: *mut xdp_md, l3: u64, packed: u64, index: u32, now: u64) -> u32 {
    let passed = Reason::Passed as u32;
    let Some(rule) = RL_RULE_TABLE.get(index) else {
        return passed;
    };
    let giving = packed & LEVELS_GIVE_BACK != 0;
    let n = (packed >> LEVEL_SHIFT) & 3;
    let len = (packed >> 16) & 0xffff;
    let young = packed & LEVELS_YOUNG != 0;
    let (word, owner, params, cost, refused) = if n == 0 {
        let agg = aggregate(rule, rule_state(rule), len);
        let refused = if young {
            Reason::AggregateYoung
        } else {
            Reason::AggregateLimited
        };
        (agg.word, 0, agg.params, agg.cost, refused)
    } else {
        if packed >> LEVEL_POS_SHIFT == LEVEL_BUSY {
            // Only a take claims, so only a take finds it busy.
            return Reason::Contended as u32;
        }
        let (lv, refused) = if n == 1 {
            (&rule.levels[0], Reason::Level2Limited)
        } else {
            (&rule.levels[1], Reason::Level3Limited)
        };
        // See `rl_host_connection` on the mask.
        // SAFETY: a local.
        let l3 = (unsafe { read_volatile(&l3) } & 63) as usize;
        let fam = (packed & 0xff) as u8;
        let Ok(source) = source_at(&XdpContext::new(ctx), l3) else {
            return passed;
        };
        let cost = if lv.flags & level_flags::BYTES != 0 {
            len
        } else {
            1
        };
        let (word, owner) = level_word(
            rule.id,
            n as u32,
            lv,
            fam,
            &source,
            packed >> LEVEL_POS_SHIFT,
        );
        (word, owner, &lv.params, cost, refused)
    };
    if word.is_null() {
        return passed;
    }
    if giving {
        give_back(word, owner, params, now, cost);
        return passed;
    }
    let keep = if n == 0 && young {
        rule.aggregate_reserve
    } else {
        0
    };
    match take(word, owner, params, now, cost, keep) {
        Taken::Yes => passed,
        Taken::No => {
            if n == 0 {
                mark_refusal(rule, rule_state(rule), now);
            }
            refused as u32
        }
        Taken::Contended => Reason::Contended as u32,
    }
}

/// Where [`rl_level`] finds a key level's slot in `packed` (a
/// position of [`super::table`], 0 for none): the bits above the length.
pub(crate) const LEVEL_POS_SHIFT: u64 = 32;

/// The slot of `source`'s key at key level `n` of the rule at `index` (both
/// in `packed`, as for [`rl_level`]) in the state table, claimed full if it
/// has none and the operation takes units (only frames their own level
/// admits come here, so a spoofed flood does not create them): its position,
/// 0 for none, or [`LEVEL_BUSY`].
///
/// A global function called by [`rl_levels`] beside [`rl_level`], not under
/// it: the claim's frame below `rl_level`'s would make the deepest chain of
/// calls too deep for the verifier, and `rl_level` sees an unknown number
/// come back, so it walks its retries once, not once for each slot a key may
/// be found in.
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn rl_level_slot(
    ctx: *mut xdp_md,
    l3: u64,
    packed: u64,
    index: u32,
    now: u64,
) -> u64 {
    let (Some(rule), Some(config)) = (RL_RULE_TABLE.get(index), RL_CONFIG.get(0)) else {
        return 0;
    };
    let n = ((packed >> LEVEL_SHIFT) & 3) as u32;
    let lv = if n == 1 {
        &rule.levels[0]
    } else {
        &rule.levels[1]
    };
    // See `rl_host_connection` on the mask.
    // SAFETY: a local.
    let l3 = (unsafe { read_volatile(&l3) } & 63) as usize;
    let Ok(source) = source_at(&XdpContext::new(ctx), l3) else {
        return 0;
    };
    let fam = (packed & 0xff) as u8;
    let (kw, h) = level_key(rule.id, n, lv, fam, &source, config.hash_seed);
    let region = config.region(fam);
    let at = find(kw, h, region);
    if at != 0 || packed & LEVELS_GIVE_BACK != 0 {
        return at;
    }
    let state = gcra::State::full(now, &lv.params).tat;
    match rl_claim_level(kw, h, region, state, now) {
        FULL => {
            event(Event::StateFull);
            0
        }
        // Another CPU is claiming the key at this instant: the frame is
        // refused (`contended`), as a source's own state is then, never
        // passed unjudged: the bucket the other CPU stores is full, and a
        // frame passed beside it would be one more than the level holds.
        BUSY => LEVEL_BUSY,
        p => p,
    }
}

/// [`rl_level_slot`]: the key's slot is being claimed by another CPU. No
/// slot has this position: both families have at most
/// [`ratelimit_common::MAX_STATE_LINES`] lines, so positions stay within 2^29.
pub(crate) const LEVEL_BUSY: u64 = u32::MAX as u64;

/// The table's key word and hash of `source`'s key (of family `fam`) at key
/// level `n` (1 or 2) of the rule `rule_id`.
#[inline(always)]
pub(crate) fn level_key(
    rule_id: u32,
    n: u32,
    lv: &KeyLevel,
    fam: u8,
    source: &Words,
    seed: u64,
) -> (u64, u64) {
    let masked = level_masked(lv, fam, source);
    let id = KeyLevel::key_id(rule_id, n);
    (
        table::key_word_for(fam, &masked, id, seed),
        doorkeeper::hash_words(&masked, id, seed),
    )
}

/// The bits of `source` that make its key at a key level.
#[inline(always)]
pub(crate) fn level_masked(lv: &KeyLevel, fam: u8, source: &Words) -> Words {
    mask_source(lv.mask_v4, &lv.mask_v6, fam, source)
}

/// The state word of the key of `source` (of family `fam`) at level `n` (1 or
/// 2) of the rule `rule_id`, in the table slot at `at` ([`rl_level_slot`]),
/// and the key word it must hold; null if there is none.
#[inline(always)]
pub(crate) fn level_word(
    rule_id: u32,
    n: u32,
    lv: &KeyLevel,
    fam: u8,
    source: &Words,
    at: u64,
) -> (*mut u64, u64) {
    if at == 0 {
        return (core::ptr::null_mut(), 0);
    }
    let Some(config) = RL_CONFIG.get(0) else {
        return (core::ptr::null_mut(), 0);
    };
    (
        word(at),
        level_key(rule_id, n, lv, fam, source, config.hash_seed).0,
    )
}
