//! Limit: a frame under a limit rule. Its key (the source masked to the
//! rule's key prefix), the aggregate peeked before any lookup, the key's state
//! found (a GCRA word, a wide state, or none: [`super::untracked`]), then the
//! levels ([`super::levels`]) or the wide algorithm ([`super::wide`]) judge
//! it → the [`Reason`].
//!
//! Called by the entry through the global function [`rl_limit`], with the
//! rule's index; the stages it calls answer through global functions too,
//! read back here with [`reason_of`].

use core::ptr::read_volatile;

use aya_ebpf::{bindings::xdp_md, programs::XdpContext};
use ratelimit_common::{
    Config, Event, FlowKey, Reason, Rule, Words, algorithm, doorkeeper, gcra, rule_flags, table,
};

use super::{
    aggregate::{aggregate, mark_refusal, young},
    bucket::peek,
    clock::clock,
    count::event,
    fleet::{rl_fleet_cost, rl_fleet_count},
    key::{Kind, Level, Target, masked, reason_of},
    levels::{shared_levels, two_levels},
    maps::{RL_CONFIG, RL_RULE_STATE, RL_RULE_TABLE, RL_WIDE},
    parse::source_at,
    table::{BUSY, FULL, Pos, born as born_at, rl_claim, rl_find, word},
    untracked::{
        UNTRACKED_BUDGET, UNTRACKED_CLAIM, UNTRACKED_PROMOTED_WIDE, new_source_level, rl_known,
        rl_untracked, without_slot,
    },
    wide::rl_wide,
};

/// A frame under the limit rule at `index` in the rule table, whose IP header
/// starts at `l3`; `packed` holds the family rules see (bits 0-7) and the
/// frame's length (from bit 16). Answers the [`Reason`].
///
/// A global function, as [`super::host::rl_host_connection`]: the parse's
/// paths (VLAN tags, families, extension headers, fragments) each reach the
/// limit with registers of their own, and inlined the verifier walked the
/// whole limit again for each; here it walks it once.
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn rl_limit(ctx: *mut xdp_md, l3: u64, packed: u64, index: u32) -> u32 {
    // A rule or config that cannot be read (never, with the daemon's own
    // indices) leaves the frame unjudged: dropped, never passed.
    let (Some(rule), Some(config)) = (RL_RULE_TABLE.get(index), RL_CONFIG.get(0)) else {
        return Reason::Unjudged as u32;
    };
    // See `rl_host_connection` on the mask.
    // SAFETY: a local.
    let l3 = (unsafe { read_volatile(&l3) } & 63) as usize;
    let xdp = XdpContext::new(ctx);
    // The parse read this very header; should it not read again, the frame
    // cannot be judged by its limit: dropped as unjudged, never passed.
    let Ok(source) = source_at(&xdp, l3) else {
        return Reason::Unjudged as u32;
    };
    limit(
        &xdp,
        l3,
        rule,
        (packed & 0xff) as u8,
        &source,
        packed >> 16,
        config,
    ) as u32
}

/// Applies a limit rule to the frame from `source`.
#[inline(always)]
pub(crate) fn limit(
    ctx: &XdpContext,
    l3: usize,
    rule: &'static Rule,
    fam: u8,
    source: &Words,
    len: u64,
    config: &Config,
) -> Reason {
    let masked = masked(rule, fam, source);
    let key = FlowKey::of(&masked, rule.id);
    let cost = if rule.flags & rule_flags::BYTES != 0 {
        len
    } else {
        1
    };
    let now = clock(config);
    // What the key's own bucket is charged; the fleet's count below stays
    // the frame's own.
    let charged = if rule.flags & rule_flags::FLEET != 0 {
        rl_fleet_cost(cost, now, rule.gcra_params().capacity)
    } else {
        cost
    };
    let shared = match RL_RULE_STATE.get_ptr_mut(rule.slot) {
        Some(p) => p,
        None => core::ptr::null_mut(),
    };
    let agg = aggregate(rule, shared, len);
    if agg.is_some() && !peek(agg.word, agg.params, now, agg.cost) {
        // Refused at the aggregate whatever the source's own level and class
        // say: no need to find its state. Under a flood that empties even the
        // reserve, this is the whole cost of a frame.
        mark_refusal(rule, shared, now);
        return Reason::AggregateLimited;
    }
    let mut target = Target::done(Reason::Passed, rule);
    let mut tracked = false;
    // A source without a state, or one promoted now, is young.
    let mut born = u64::MAX;
    // A key the filter has never seen has no state: a spoofed source skips
    // the lookup, a miss in millions of buckets. Keys of fleet-wide rules are
    // looked up whatever it says (the daemon inserts states for them).
    let h = doorkeeper::hash_words(&masked, rule.id, config.hash_seed);
    let known = rl_known(h, u64::from(rule.flags & rule_flags::FLEET)) != 0;
    // The key's word in the state table (made only for a key that may have
    // a state or is given one now: IPv6's costs a hash), and its family's
    // region there.
    let kw_of = || table::key_word_for(fam, &masked, rule.id, config.hash_seed);
    let region = config.region(fam);
    let kw = if rule.algorithm == algorithm::GCRA && known {
        kw_of()
    } else {
        0
    };
    if rule.algorithm == algorithm::GCRA {
        let at = known_at(kw, h, region, known);
        let word = if at == 0 {
            core::ptr::null_mut()
        } else {
            word(at)
        };
        if !word.is_null() {
            target = Target::gcra(Level::own(word, kw, rule, charged));
            tracked = true;
            // Read only where it matters (the reserve's classes).
            if rule.aggregate_reserve != 0 {
                born = born_at(at);
            }
        }
    } else if known_wide(&key, known) {
        target = Target::wide(rule);
        tracked = true;
    }
    if !tracked {
        let found = rl_untracked(
            ctx.ctx,
            l3 as u64,
            u64::from(fam) | (len << 16),
            rule.index,
            now,
        );
        target = match found {
            r if r & 0xffff == UNTRACKED_CLAIM => claimed(
                rule,
                kw_of(),
                h,
                region,
                config,
                now,
                r >> 16,
                cost,
                charged,
            ),
            UNTRACKED_PROMOTED_WIDE => Target::wide(rule),
            UNTRACKED_BUDGET => new_source_level(rule),
            r => Target::done(reason_of(r), rule),
        };
    }
    let reason = match target.kind {
        Kind::Gcra => two_levels(
            target.level,
            &shared_levels(ctx, l3, rule, fam, len, now, young(rule, shared, born, now)),
            now,
        ),
        // The wide algorithms count packets (the daemon sets BYTES for gcra only).
        // Key levels are for gcra rules only (the daemon refuses others).
        Kind::Wide => reason_of(rl_wide(
            ctx.ctx,
            l3 as u64,
            u64::from(fam) | (len << 16),
            rule.index,
            now,
        )),
        Kind::Done => target.reason,
        // Made a `Gcra` or `Done` target above.
        Kind::Claim => Reason::Contended,
    };
    if matches!(reason, Reason::Passed | Reason::NewSource) && rule.flags & rule_flags::FLEET != 0 {
        rl_fleet_count(ctx.ctx, l3 as u64, u64::from(fam) | (len << 16), rule.index);
    }
    reason
}

/// The target of a gcra key that earned a state ([`UNTRACKED_CLAIM`]):
/// a slot of the table claimed ([`rl_claim`]) charged with the `units` (frames,
/// or [`doorkeeper::BYTE_UNIT`]s) it got before, its frame judged against
/// it; with no free slot, the new-source budget.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn claimed(
    rule: &'static Rule,
    kw: u64,
    h: u64,
    region: u64,
    config: &Config,
    now: u64,
    units: u32,
    cost: u64,
    charged: u64,
) -> Target {
    let params = rule.gcra_params();
    let unit = if rule.flags & rule_flags::BYTES != 0 {
        doorkeeper::BYTE_UNIT
    } else {
        1
    };
    let mut state = gcra::State::full(now, params);
    gcra::charge(&mut state, params, now, u64::from(units) * unit);
    match rl_claim(kw, h, region, state.tat, now) {
        FULL => {
            // No free slot in its two lines: judged as a new source's.
            event(Event::StateFull);
            without_slot(rule, h, config, u64::from(units), cost)
        }
        // Claimed by another CPU at this moment and not stored yet.
        BUSY => Target::done(Reason::Contended, rule),
        at => {
            event(Event::StateCreated);
            let w = word(at);
            if w.is_null() {
                Target::done(Reason::StateFailed, rule)
            } else {
                Target::gcra(Level::own(w, kw, rule, charged))
            }
        }
    }
}

/// The table position of a gcra key the filter may know, or 0. Apart from
/// the limit, as is [`known_wide`]: a key the filter does not know then comes
/// back as a key without a state, and the verifier walks what follows once
/// for both.
#[inline(never)]
pub(crate) fn known_at(kw: u64, h: u64, region: u64, known: bool) -> Pos {
    if known { rl_find(kw, h, region) } else { 0 }
}

/// Whether a key the filter may know has a wide state. See [`known_at`].
#[inline(never)]
pub(crate) fn known_wide(key: &FlowKey, known: bool) -> bool {
    known && RL_WIDE.get_ptr_mut(key).is_some()
}
