//! A key under one of the wide-state algorithms (interval refill, fixed window,
//! sliding log, sliding window, rolling quota): its state in `RL_WIDE`, a
//! lock word and the algorithm's state, decided under the lock with the
//! rule's aggregate.
//!
//! Enters: the frame's key (found again from the frame), the rule, the clock.
//! Leaves: the [`Reason`]. Called by the limit ([`super::limit`]) through the
//! global function [`rl_wide`]; the untracked path builds a new key's state
//! with [`charge_wide`] and [`zero_wide`].

use core::{
    intrinsics::{AtomicOrdering, atomic_xchg},
    ptr::read_volatile,
};

use aya_ebpf::{bindings::xdp_md, programs::XdpContext};
use ratelimit_common::{
    FlowKey, LOCK_RETRIES, Reason, Rule, WIDE_WORDS, WideState, algorithm, fixed_window, interval,
    rolling_quota, sliding_log, sliding_window,
};

use super::{
    aggregate::{aggregate, mark_refusal, rule_state, young},
    bucket::{Taken, cas, take},
    limit::masked,
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
        let mut reason = if decide_wide(wide, rule, now, 1) {
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
                reason = match take(agg.word, agg.params, now, agg.cost, keep) {
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
                    refund_wide(wide, rule, now, 1);
                }
            }
        }
        atomic_xchg::<u64, { AtomicOrdering::SeqCst }>(lock, 0);
        reason
    }
}

/// Decides `cost` against a wide state in place.
///
/// # Safety
/// `wide` is a map value valid for this run whose lock this CPU holds.
#[inline(always)]
pub(crate) unsafe fn decide_wide(wide: *mut WideState, rule: &Rule, now: u64, cost: u64) -> bool {
    // SAFETY: the caller's contract: the body is ours while the lock is held,
    // and every state fits in it (size asserts in ratelimit-common).
    unsafe {
        let body = (&raw mut (*wide).body).cast::<u8>();
        let params = &rule.params;
        match rule.algorithm {
            algorithm::INTERVAL => {
                interval::decide(&mut *body.cast(), &params.interval, now, cost).allowed
            }
            algorithm::FIXED_WINDOW => {
                fixed_window::decide(&mut *body.cast(), &params.fixed_window, now, cost).allowed
            }
            algorithm::SLIDING_LOG => {
                sliding_log::decide(&mut *body.cast(), &params.sliding_log, now, cost).allowed
            }
            algorithm::SLIDING_WINDOW => {
                sliding_window::decide(&mut *body.cast(), &params.sliding_window, now, cost).allowed
            }
            algorithm::ROLLING_QUOTA => {
                rolling_quota::decide(&mut *body.cast(), &params.rolling_quota, now, cost).allowed
            }
            // An algorithm this program does not know: fail open.
            _ => true,
        }
    }
}

/// Gives `cost` back to a wide state in place.
///
/// # Safety
/// `wide` is a map value valid for this run whose lock this CPU holds.
#[inline(always)]
pub(crate) unsafe fn refund_wide(wide: *mut WideState, rule: &Rule, now: u64, cost: u64) {
    // SAFETY: as in `decide_wide`.
    unsafe {
        let body = (&raw mut (*wide).body).cast::<u8>();
        let params = &rule.params;
        // Read again, not reused from `decide_wide`: a value the verifier knows
        // per algorithm would make it verify everything after the decision five
        // times.
        match read_volatile(&rule.algorithm) {
            algorithm::INTERVAL => interval::refund(&mut *body.cast(), &params.interval, now, cost),
            algorithm::FIXED_WINDOW => {
                fixed_window::refund(&mut *body.cast(), &params.fixed_window, now, cost)
            }
            algorithm::SLIDING_LOG => {
                sliding_log::refund(&mut *body.cast(), &params.sliding_log, now, cost)
            }
            algorithm::SLIDING_WINDOW => {
                sliding_window::refund(&mut *body.cast(), &params.sliding_window, now, cost)
            }
            algorithm::ROLLING_QUOTA => {
                rolling_quota::refund(&mut *body.cast(), &params.rolling_quota, now, cost)
            }
            _ => {}
        }
    }
}

/// Makes the fresh wide state at `wide` one that admitted `n` units at `now`.
///
/// # Safety
/// `wide` is this CPU's scratch map value, zeroed.
#[inline(always)]
pub(crate) unsafe fn charge_wide(wide: *mut WideState, rule: &Rule, now: u64, n: u64) {
    // SAFETY: the caller's contract; every state fits in the body.
    unsafe {
        let body = (&raw mut (*wide).body).cast::<u8>();
        let params = &rule.params;
        match rule.algorithm {
            algorithm::INTERVAL => interval::charged(&mut *body.cast(), &params.interval, now, n),
            algorithm::FIXED_WINDOW => {
                fixed_window::charged(&mut *body.cast(), &params.fixed_window, now, n)
            }
            algorithm::SLIDING_LOG => {
                sliding_log::charged(&mut *body.cast(), &params.sliding_log, now, n)
            }
            algorithm::SLIDING_WINDOW => {
                sliding_window::charged(&mut *body.cast(), &params.sliding_window, now, n)
            }
            algorithm::ROLLING_QUOTA => {
                rolling_quota::charged(&mut *body.cast(), &params.rolling_quota, now, n)
            }
            _ => {}
        }
    }
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
