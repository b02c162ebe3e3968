//! Count: what happened to a frame, for the daemon. Per-CPU counters by
//! reason and by rule, events (states created, capped, frames unjudged),
//! and drops per source for `ratelimit top` (a fleet-wide rule's admitted
//! frames per key are [`super::fleet`]'s).
//!
//! Enters: the reason, the frame's length, the rule's counters. Leaves:
//! nothing but the counts (and this CPU's count of a reason, for sampling).
//! Called by the entry for every frame and by the stages for events.

use ratelimit_common::{DropKey, Event, Reason, RuleCounter, top};

use super::{
    NO_SLOT,
    clock::stamp,
    maps::{RL_DROPS, RL_EVENTS, RL_RULE_STATS, RL_STATS},
    table::Bpf,
};

/// Counts the frame under `reason`; returns this CPU's count for it.
#[inline(always)]
pub(crate) fn count(reason: Reason, len: u64) -> u64 {
    match RL_STATS.get_ptr_mut(reason as u32) {
        // SAFETY: a per-CPU slot, written only by this CPU.
        Some(counter) => unsafe {
            (*counter).packets += 1;
            (*counter).bytes += len;
            (*counter).packets
        },
        None => 0,
    }
}

/// Counts the frame against its rule (`first`: the rule's first counter),
/// under what the rule did with it.
#[inline(always)]
pub(crate) fn count_rule(first: u32, reason: Reason, len: u64) {
    if first == NO_SLOT {
        return;
    }
    let index = first.wrapping_add(RuleCounter::of(reason) as u32);
    if let Some(counter) = RL_RULE_STATS.get_ptr_mut(index) {
        // SAFETY: a per-CPU slot, written only by this CPU.
        unsafe {
            (*counter).packets += 1;
            (*counter).bytes += len;
        }
    }
}

/// Counts `event` on this CPU.
#[inline(always)]
pub(crate) fn event(event: Event) {
    if let Some(n) = RL_EVENTS.get_ptr_mut(event as u32) {
        // SAFETY: a per-CPU slot, written only by this CPU.
        unsafe { *n += 1 };
    }
}

/// Counts `weight` drops against their source (or key level's network) for
/// `ratelimit top`, in its set of `top`'s table under the maps' `seed`
/// ([`top`]). Only on the drop path, for the drop sampled.
#[inline(always)]
pub(crate) fn count_drop(key: &DropKey, weight: u64, seed: u64) {
    let (set, tag) = top::place(key, seed);
    if let Some(s) = RL_DROPS.get_ptr_mut(set) {
        // SAFETY: a map value valid for this run, shared only through `top`'s
        // protocol.
        unsafe { top::count::<Bpf>(s, tag, &key.addr, weight, stamp()) };
    }
}
