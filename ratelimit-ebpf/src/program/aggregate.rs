//! A rule's aggregate: one GCRA word in its [`RuleState`] that every frame
//! under the rule takes from, and the episodes of pressure that tell young
//! sources from established ones.
//!
//! An aggregate with a reserve ([`Rule::aggregate_reserve`]) tells young
//! sources (no state yet, or a state created during the current episode of
//! pressure) from established ones ([`RuleState`]): a young frame is taken
//! from the aggregate only if the reserve stays whole after it
//! ([`gcra::admit_keeping`]), and is refused as `AggregateYoung` otherwise;
//! the aggregate stays one word, so the classes never make it admit more.
//!
//! Enters: the rule, its shared state, the clock. Leaves: the aggregate's word
//! and cost, whether a frame is young, a refusal noted. Called by the limit
//! (the aggregate peeked before the state lookup), the shared levels
//! ([`super::levels::rl_level`]) and the wide algorithms
//! ([`super::wide::limit_wide`]).

use core::ptr::read_volatile;

use ratelimit_common::{Rule, RuleState, episode, gcra, rule_flags};

use super::maps::RL_RULE_STATE;

/// The aggregate level of a rule: its state word (null when the rule has
/// none), parameters and the frame's cost there.
///
/// Values the verifier sees are plain structs with every field set, never an
/// `Option` or an enum with a payload: LLVM leaves the unused payload of such
/// values undefined, and the verifier refuses to read an uninitialized register.
#[derive(Clone, Copy)]
pub(crate) struct Aggregate {
    pub(crate) word: *mut u64,
    pub(crate) params: &'static gcra::Params,
    pub(crate) cost: u64,
}

impl Aggregate {
    #[inline(always)]
    pub(crate) fn is_some(&self) -> bool {
        !self.word.is_null()
    }
}

#[inline(always)]
pub(crate) fn aggregate(rule: &'static Rule, shared: *mut RuleState, len: u64) -> Aggregate {
    let word = if rule.flags & rule_flags::AGGREGATE == 0 || shared.is_null() {
        core::ptr::null_mut()
    } else {
        // SAFETY: a field of a map value valid for this run.
        unsafe { &raw mut (*shared).aggregate }
    };
    Aggregate {
        word,
        params: &rule.aggregate,
        cost: if rule.flags & rule_flags::AGGREGATE_BYTES != 0 {
            len
        } else {
            1
        },
    }
}

/// The rule's shared buckets (null if its slot is out of range: not written
/// by the daemon).
#[inline(always)]
pub(crate) fn rule_state(rule: &Rule) -> *mut RuleState {
    match RL_RULE_STATE.get_ptr_mut(rule.slot) {
        Some(p) => p,
        None => core::ptr::null_mut(),
    }
}

/// Whether a frame from a source whose state was created at `born`
/// (`u64::MAX` for none yet) is young at `rule`'s aggregate: a source without
/// a state, or, during an episode of pressure, one that got its state after
/// the episode began ([`RuleState`]).
#[inline(always)]
pub(crate) fn young(rule: &Rule, shared: *mut RuleState, born: u64, now: u64) -> bool {
    if rule.aggregate_reserve == 0 || shared.is_null() {
        return false;
    }
    // SAFETY: fields of a map value valid for this run; a torn view of two
    // words written apart only moves one frame between classes.
    let (episode_start, last) = unsafe {
        (
            read_volatile(&raw const (*shared).episode),
            read_volatile(&raw const (*shared).refused_at),
        )
    };
    episode::is_young(born, episode_start, last, now)
}

/// Notes a refusal at `rule`'s aggregate: it begins an episode of pressure
/// after a quiet one ([`RuleState`]). Written at most once per
/// [`ratelimit_common::REFUSAL_MARK_NS`], so that a flood's refusals read the line, not bounce it.
#[inline(always)]
pub(crate) fn mark_refusal(rule: &Rule, shared: *mut RuleState, now: u64) {
    if rule.aggregate_reserve == 0 || shared.is_null() {
        return;
    }
    // SAFETY: fields of a map value valid for this run; CPUs racing here all
    // write about the same time.
    unsafe {
        let last = read_volatile(&raw const (*shared).refused_at);
        let Some(begins) = episode::on_refusal(last, now) else {
            return;
        };
        if begins {
            core::ptr::write_volatile(&raw mut (*shared).episode, now);
        }
        core::ptr::write_volatile(&raw mut (*shared).refused_at, now);
    }
}
