//! A key without state under a limit rule. The known-keys filter
//! ([`rl_known`]) lets a spoofed source skip the state lookup; the doorkeeper
//! ([`ratelimit_common::doorkeeper`]) counts the key's sightings; a key seen
//! twice is promoted to a state of its own ([`promote`]) within the
//! state-creation cap, and until then its frames are judged by the rule's
//! new-source budget ([`new_source_level`]).
//!
//! Enters: the frame's key and the clock. Leaves: what judges the frame (its
//! new state, the budget, or a verdict already made). Called by the limit
//! ([`super::limit`]) through the global function [`rl_untracked`].

use core::{
    intrinsics::{AtomicOrdering, atomic_or},
    ptr::read_volatile,
};

use aya_ebpf::{
    bindings::{BPF_NOEXIST, xdp_md},
    programs::XdpContext,
};
use ratelimit_common::{
    Config, Event, FlowKey, Reason, Rule, Words, algorithm, dispatch::Op, doorkeeper, gcra,
    known_bit, rule_flags,
};

use super::{
    aggregate::rule_state,
    bucket::{SHORT_RETRIES, cas},
    count::event,
    key::{Kind, Level, Target, masked},
    maps::{RL_CONFIG, RL_GLOBAL, RL_KNOWN, RL_RULE_TABLE, RL_SEEN, RL_WIDE, RL_WIDE_ZERO},
    parse::source_at,
    wide::{self, zero_wide},
};

pub(crate) const EEXIST: i32 = 17;

/// [`rl_untracked`]: the key got a wide state now.
pub(crate) const UNTRACKED_PROMOTED_WIDE: u32 = 0x101;
/// [`rl_untracked`]: the frame is judged by the new-source budget.
pub(crate) const UNTRACKED_BUDGET: u32 = 0x102;
/// [`rl_untracked`]: a gcra key earned a state; the limit claims its
/// slot ([`super::table::rl_claim`]) charged with the units (frames, or
/// [`doorkeeper::BYTE_UNIT`]s) in bits 16-31, which the key got before. Not
/// claimed here: the claim's frame below this one's would make the chain of
/// calls too deep for the verifier.
pub(crate) const UNTRACKED_CLAIM: u32 = 0x103;

/// A frame from a key without state under the limit rule at `index` ([`untracked`];
/// arguments as for [`super::levels::rl_levels`]): answers [`UNTRACKED_CLAIM`],
/// [`UNTRACKED_PROMOTED_WIDE`], [`UNTRACKED_BUDGET`], or the [`Reason`] of a
/// verdict already made.
///
/// A global function: the doorkeeper's retries and the promotion into six
/// algorithms' states are verified once, apart from the limit's paths.
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn rl_untracked(
    ctx: *mut xdp_md,
    l3: u64,
    packed: u64,
    index: u32,
    now: u64,
) -> u32 {
    // A rule or config that cannot be read (never, with the daemon's own
    // indices) leaves the frame unjudged: dropped, never passed.
    let (Some(rule), Some(config)) = (RL_RULE_TABLE.get(index), RL_CONFIG.get(0)) else {
        return Reason::Unjudged as u32;
    };
    // See `rl_host_connection` on the mask.
    // SAFETY: a local.
    let l3 = (unsafe { read_volatile(&l3) } & 63) as usize;
    let fam = (packed & 0xff) as u8;
    // See `rl_limit` on a header that does not read again.
    let Ok(source) = source_at(&XdpContext::new(ctx), l3) else {
        return Reason::Unjudged as u32;
    };
    let masked = masked(rule, fam, &source);
    let key = FlowKey::of(&masked, rule.id);
    let cost = if rule.flags & rule_flags::BYTES != 0 {
        packed >> 16
    } else {
        1
    };
    let target = untracked(&key, &masked, rule, config, now, cost);
    match target.kind {
        // The units it got before: at most 2^16 - 1 (a doorkeeper slot's count).
        Kind::Claim => UNTRACKED_CLAIM | ((target.level.cost as u32) << 16),
        // A gcra key gets its state as a claim: its own level here is the
        // budget (which passes as `NewSource`).
        Kind::Gcra => UNTRACKED_BUDGET,
        Kind::Wide => UNTRACKED_PROMOTED_WIDE,
        Kind::Done => target.reason as u32,
    }
}

/// The new-source budget of `rule` as a frame's own level (no own level when
/// the rule's new sources are unlimited: the aggregate alone judges them).
#[inline(always)]
pub(crate) fn new_source_level(rule: &'static Rule) -> Target {
    let shared = rule_state(rule);
    let word = if rule.flags & rule_flags::NEW_SOURCES_UNLIMITED != 0 || shared.is_null() {
        core::ptr::null_mut()
    } else {
        // SAFETY: a field of a map value valid for this run.
        unsafe { &raw mut (*shared).new_sources }
    };
    Target::gcra(Level {
        word,
        owner: 0,
        params: &rule.new_sources,
        cost: 1,
        pass: Reason::NewSource,
        deny: Reason::NewSourceLimited,
    })
}

/// A frame from a key with no state: the doorkeeper decides whether it earns
/// one (then the frame is judged against it); if not, the frame is judged by
/// the rule's new-source budget, and never admitted beyond what the key's own
/// fresh bucket would admit ([`Rule::burst`]).
///
/// Every frame that fits the key's own burst is counted in its doorkeeper slot
/// *before* the budget judges it, so a promotion on another CPU can never miss
/// a frame admitted at the same moment; a frame the budget then refuses stays
/// counted, which errs toward limiting.
#[inline(always)]
pub(crate) fn untracked(
    key: &FlowKey,
    masked: &Words,
    rule: &'static Rule,
    config: &Config,
    now: u64,
    cost: u64,
) -> Target {
    let h = doorkeeper::hash_words(masked, key.rule_id, config.hash_seed);
    let tag = doorkeeper::tag(h);
    let slot = match RL_SEEN.get_ptr_mut(doorkeeper::slot(h, config.seen_mask)) {
        Some(p) => p,
        None => core::ptr::null_mut(),
    };
    // What the slot counts per frame, and what a counted unit is charged as.
    let bytes = rule.flags & rule_flags::BYTES != 0;
    let units = doorkeeper::units(cost, bytes);
    let unit = if bytes { doorkeeper::BYTE_UNIT } else { 1 };
    let mut again = false;
    let mut admitted = 0u64;
    let mut fits = cost <= rule.burst;
    if !slot.is_null() {
        let epoch = doorkeeper::epoch(now);
        // SAFETY: an 8-byte array value, changed by other CPUs only through
        // compare-and-swap.
        let mut value = unsafe { read_volatile(slot) };
        for _ in 0..SHORT_RETRIES {
            let next = match doorkeeper::sight(value, tag, epoch) {
                doorkeeper::Sighting::Again { admitted: n } => {
                    again = true;
                    admitted = u64::from(n);
                    break;
                }
                doorkeeper::Sighting::First { record } => {
                    if fits {
                        record + units
                    } else {
                        record
                    }
                }
            };
            let (found, swapped) = cas(slot, value, next);
            if swapped {
                break;
            }
            value = found;
        }
    }
    if again {
        if take_new_state(config, now) {
            return promote(key, h, rule, now, admitted, unit);
        }
        event(Event::NewStateCapped);
        fits = admitted * unit + cost <= rule.burst;
        if fits {
            count_admitted(slot, tag, units);
        }
    }
    if !fits {
        return Target::done(Reason::Limited, rule);
    }
    new_source_level(rule)
}

/// A key that earned a state but found no slot for it (the IPv4 table's two
/// lines full of busy slots): judged as a key whose promotion the cap refused
/// ([`untracked`]): never admitted beyond its own fresh bucket, its admitted
/// units counted in its doorkeeper slot, then the new-source budget.
#[inline(always)]
pub(crate) fn without_slot(
    rule: &'static Rule,
    h: u64,
    config: &Config,
    units_before: u64,
    cost: u64,
) -> Target {
    let bytes = rule.flags & rule_flags::BYTES != 0;
    let unit = if bytes { doorkeeper::BYTE_UNIT } else { 1 };
    if units_before * unit + cost > rule.burst {
        return Target::done(Reason::Limited, rule);
    }
    let slot = match RL_SEEN.get_ptr_mut(doorkeeper::slot(h, config.seen_mask)) {
        Some(p) => p,
        None => core::ptr::null_mut(),
    };
    count_admitted(slot, doorkeeper::tag(h), doorkeeper::units(cost, bytes));
    new_source_level(rule)
}

/// Whether the key of doorkeeper hash `h` may have a state (see
/// [`ratelimit_common::MAP_KNOWN`]): its bit in the filter is set, or
/// `always` (a key of a fleet-wide rule). 1 or 0.
///
/// A global function: the limit sees one number come back, and so two paths
/// (known or not), not one per way of being known.
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn rl_known(h: u64, always: u64) -> u32 {
    if always != 0 {
        return 1;
    }
    let (word, bit) = known_bit(h);
    match RL_KNOWN.get_ptr(word) {
        // SAFETY: an 8-byte array value, changed only by atomic or.
        Some(w) => u32::from((unsafe { read_volatile(w) } & bit) != 0),
        None => 1,
    }
}

/// Sets the bit of the key of doorkeeper hash `h` in the filter of keys with
/// a state.
#[inline(always)]
pub(crate) fn mark_known(h: u64) {
    let (word, bit) = known_bit(h);
    if let Some(w) = RL_KNOWN.get_ptr_mut(word) {
        // SAFETY: an 8-byte, 8-aligned array value, changed only atomically.
        unsafe { atomic_or::<u64, u64, { AtomicOrdering::Relaxed }>(w, bit) };
    }
}

/// Counts a frame's units in the key's doorkeeper slot, to charge them when
/// the key is promoted.
#[inline(always)]
pub(crate) fn count_admitted(slot: *mut u64, tag: u32, units: u64) {
    if slot.is_null() {
        return;
    }
    // SAFETY: an 8-byte array value, changed only through compare-and-swap.
    let mut value = unsafe { read_volatile(slot) };
    for _ in 0..SHORT_RETRIES {
        let Some(more) = doorkeeper::count_more(value, tag, units) else {
            break;
        };
        let (found, swapped) = cas(slot, value, more);
        if swapped {
            break;
        }
        value = found;
    }
}

/// Takes one unit of the state-creation cap, retrying when another CPU took
/// one at the same moment: two CPUs promoting one key at once must both get
/// there (the loser of the insert then judges its frame against the winner's
/// state), or a frame counted in the doorkeeper after the winner read it would
/// pass uncharged. Retries run out as a refusal (the cap errs toward creating
/// fewer states, never more).
#[inline(always)]
pub(crate) fn take_new_state(config: &Config, now: u64) -> bool {
    let Some(global) = RL_GLOBAL.get_ptr_mut(0) else {
        return false;
    };
    // SAFETY: a field of a map value valid for this run.
    let word = unsafe { &raw mut (*global).new_states };
    // SAFETY: as in `two_levels`.
    let mut seen = unsafe { read_volatile(word) };
    for _ in 0..SHORT_RETRIES {
        let mut next = gcra::State { tat: seen };
        if !gcra::admit(&mut next, &config.new_states, now, 1) {
            return false;
        }
        let (found, swapped) = cas(word, seen, next.tat);
        if swapped {
            return true;
        }
        seen = found;
    }
    false
}

/// Gives `key` a state charged with the `admitted` units of cost (frames, or
/// bytes rounded up to 64 a frame) it got before; the frame is then judged
/// against it.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub(crate) fn promote(
    key: &FlowKey,
    h: u64,
    rule: &'static Rule,
    now: u64,
    admitted: u64,
    unit: u64,
) -> Target {
    // Before the insert: a CPU that finds the state must find the bit.
    mark_known(h);
    if rule.algorithm == algorithm::GCRA {
        return Target::claim(admitted);
    }
    let Some(fresh) = RL_WIDE_ZERO.get_ptr_mut(0) else {
        return Target::done(Reason::StateFailed, rule);
    };
    // Built in this CPU's scratch value (a state does not fit on the BPF stack),
    // charged with what the key got before, inserted, and the scratch zeroed.
    if admitted > 0 {
        // SAFETY: this CPU's own map value, zeroed.
        unsafe {
            wide::apply(
                fresh,
                rule.algorithm,
                Op::Charge,
                rule,
                now,
                admitted * unit,
            )
        };
    }
    // SAFETY: as above.
    unsafe { (*fresh).born = now };
    // By reference: the value must not be copied onto the 512-byte stack.
    // SAFETY: a valid map value of the same type, read by the helper.
    #[allow(clippy::needless_borrows_for_generic_args)]
    let inserted = RL_WIDE.insert(key, unsafe { &*fresh }, u64::from(BPF_NOEXIST));
    // SAFETY: as above.
    unsafe { zero_wide(fresh) };
    match inserted {
        Ok(()) => event(Event::StateCreated),
        // Another CPU promoted it first: its charge stands.
        Err(e) if e == -EEXIST => {}
        Err(_) => return Target::done(Reason::StateFailed, rule),
    }
    match RL_WIDE.get_ptr_mut(key) {
        Some(_) => Target::wide(rule),
        None => Target::done(Reason::StateFailed, rule),
    }
}
