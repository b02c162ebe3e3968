//! A key under one of the wide-state algorithms (interval refill, fixed window,
//! sliding log, sliding window, rolling quota): its state in `RL_WIDE`, a
//! lock word and the algorithm's state, decided under the lock with the
//! rule's aggregate.
//!
//! Enters: the frame's key (found again from the frame), the rule, the clock.
//! Leaves: the [`Reason`]. Called by the limit ([`super::limit`]) through the
//! global function [`rl_wide`]; the untracked path builds a new key's state
//! with [`apply`] and [`zero_wide`]. The algorithms themselves are
//! ratelimit-common's, behind its one dispatch ([`dispatch::wide`]).

use core::{
    intrinsics::{AtomicOrdering, atomic_xchg},
    ptr::read_volatile,
};

use aya_ebpf::{bindings::xdp_md, programs::XdpContext};
use ratelimit_common::{
    Decision, FlowKey, LOCK_RETRIES, Reason, Rule, WIDE_WORDS, WideState,
    dispatch::{self, Op},
};

use super::{
    aggregate::{aggregate, mark_refusal, rule_state, young},
    bucket::{Taken, cas, take},
    key::masked,
    maps::{RL_RULE_TABLE, RL_WIDE},
    parse::source_at,
};

/// A frame under a rule of a wide-state algorithm ([`limit_wide`]) whose key
/// has a state: the rule at `index` in the rule table, `packed` as for
/// [`super::levels::rl_levels`]. A global function, as
/// [`super::host::rl_host_connection`]: the five algorithms' decisions and
/// refunds are verified once, apart, and the limit path sees only a number
/// come back (at the price of looking the key's state up again here).
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn rl_wide(ctx: *mut xdp_md, l3: u64, packed: u64, index: u32, now: u64) -> u32 {
    let Some(rule) = RL_RULE_TABLE.get(index) else {
        return Reason::Passed as u32;
    };
    // See `rl_host_connection` on the mask.
    // SAFETY: a local.
    let l3 = (unsafe { read_volatile(&l3) } & 63) as usize;
    let fam = (packed & 0xff) as u8;
    // See `rl_limit` on a header that does not read again.
    let Ok(source) = source_at(&XdpContext::new(ctx), l3) else {
        return Reason::Unjudged as u32;
    };
    let key = FlowKey::of(&masked(rule, fam, &source), rule.id);
    match RL_WIDE.get_ptr_mut(key) {
        Some(wide) => limit_wide(wide, rule, packed >> 16, now) as u32,
        None => Reason::StateFailed as u32,
    }
}

/// Applies a wide-state algorithm to a key, under the state's lock word, with
/// the rule's aggregate. The key's own level decides first; if it admits and
/// the aggregate then refuses, the algorithm's `refund` undoes the admission
/// (exact: the lock is still held, so it is the last thing the state saw).
///
/// Nothing about the aggregate is computed before the algorithm decides: the
/// verifier then sees one state at the decision, whatever the rule, and
/// verifies the five algorithms once.
#[inline(always)]
pub(crate) fn limit_wide(wide: *mut WideState, rule: &'static Rule, len: u64, now: u64) -> Reason {
    // SAFETY: `wide` is a map value valid for this run; its lock word is only
    // touched atomically, its body only while the lock is held.
    unsafe {
        let lock = &raw mut (*wide).lock;
        let mut held = false;
        for _ in 0..LOCK_RETRIES {
            if cas(lock, 0, 1).1 {
                held = true;
                break;
            }
        }
        if !held {
            return Reason::Contended;
        }
        let mut reason = if apply(wide, rule.algorithm, Op::Decide, rule, now, 1).allowed {
            Reason::Passed
        } else {
            Reason::Limited
        };
        if reason == Reason::Passed {
            let shared = rule_state(rule);
            let agg = aggregate(rule, shared, len);
            if agg.is_some() {
                let young = young(rule, shared, read_volatile(&raw const (*wide).born), now);
                let keep = if young { rule.aggregate_reserve } else { 0 };
                reason = match take(agg.word, 0, agg.params, now, agg.cost, keep) {
                    Taken::Yes => Reason::Passed,
                    Taken::No => {
                        mark_refusal(rule, shared, now);
                        if young {
                            Reason::AggregateYoung
                        } else {
                            Reason::AggregateLimited
                        }
                    }
                    Taken::Contended => Reason::Contended,
                };
                if reason != Reason::Passed {
                    // The algorithm read again, not reused from the decision:
                    // a value the verifier knows per algorithm would make it
                    // verify everything after the decision five times.
                    let algorithm = read_volatile(&rule.algorithm);
                    apply(wide, algorithm, Op::Refund, rule, now, 1);
                }
            }
        }
        atomic_xchg::<u64, { AtomicOrdering::SeqCst }>(lock, 0);
        reason
    }
}

/// Runs `op` for `cost` units on the body of the wide state at `wide`, under
/// `algorithm` with `rule`'s parameters: ratelimit-common's one dispatch
/// ([`dispatch::wide`]), for the decision and the refund here and the charge
/// of a new key's state ([`super::untracked`]).
///
/// # Safety
/// `wide` is a map value valid for this run whose body is this CPU's: its
/// lock is held, or it is this CPU's own scratch value.
#[inline(always)]
pub(crate) unsafe fn apply(
    wide: *mut WideState,
    algorithm: u8,
    op: Op,
    rule: &Rule,
    now: u64,
    cost: u64,
) -> Decision {
    // SAFETY: the caller's contract: the body is ours, and every state fits
    // in it (size asserts in ratelimit-common).
    let body = unsafe { &mut (*wide).body };
    dispatch::wide(algorithm, op, body, &rule.params, now, cost)
}

/// Zeroes the scratch wide state again.
///
/// # Safety
/// `wide` is this CPU's scratch map value.
#[inline(always)]
pub(crate) unsafe fn zero_wide(wide: *mut WideState) {
    // SAFETY: the caller's contract; word by word (a memset call is not
    // available to BPF programs).
    unsafe {
        let body = &raw mut (*wide).body;
        let mut i = 0;
        while i < WIDE_WORDS {
            core::ptr::write_volatile(body.cast::<u64>().add(i), 0);
            i += 1;
        }
    }
}
