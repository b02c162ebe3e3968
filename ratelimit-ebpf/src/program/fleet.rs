//! The fleet: what a key of a fleet-wide rule costs its own bucket, and
//! what it was admitted, for the daemon to report to the fleet.
//!
//! Enters: the frame's cost and key, the daemon's heartbeat
//! (`RL_FLEET_BEAT`). Leaves: the cost to charge ([`rl_fleet_cost`]: the
//! frame's own while the daemon syncs, the fleet's members times it once its
//! heartbeat is stale, by ratelimit-common's `fleet_cost`), and the count in
//! `RL_FLEET_USED` ([`rl_fleet_count`], by ratelimit-common's `fleet_table`). Called by the limit
//! ([`super::limit`]).

use core::ptr::read_volatile;

use aya_ebpf::{bindings::xdp_md, programs::XdpContext};
use ratelimit_common::{
    Event, FlowKey, fleet_cost,
    fleet_table::{self, Counted},
    rule_flags,
};

use super::{
    clock::stamp,
    count::event,
    key::masked,
    maps::{RL_CONFIG, RL_FLEET_BEAT, RL_FLEET_USED, RL_RULE_TABLE},
    parse::source_at,
    table::Bpf,
};

/// What a frame of `cost` costs its key's own bucket at `now` under a
/// fleet-wide rule of burst `capacity`: `cost` while the daemon syncs, the
/// fleet's members times that once the daemon's heartbeat is stale (a
/// program whose daemon is dead errs toward limiting). Called for
/// fleet-wide rules only: the others pay nothing for it.
///
/// A global function, as `rl_known`: its reads and arithmetic stay out of
/// the limit's frame on the stack (which the verifier's 512-byte bound on
/// three frames leaves no room to grow), and the limit sees one number come
/// back.
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn rl_fleet_cost(cost: u64, now: u64, capacity: u64) -> u64 {
    match RL_FLEET_BEAT.get_ptr(0) {
        Some(beat) => {
            // SAFETY: a map value valid for this run; the daemon rewrites it
            // whole, and a torn read of its two fields errs by one sync.
            let (at, members) = unsafe {
                (
                    read_volatile(&raw const (*beat).at),
                    read_volatile(&raw const (*beat).members),
                )
            };
            fleet_cost(cost, at, members, now, capacity)
        }
        None => cost,
    }
}

/// Counts a frame admitted under the rule at `index` in the rule table, if
/// it is fleet-wide, for its key, for the daemon to report to the fleet. The
/// frame's IP header starts at `l3`; `packed` holds the family rules see
/// (bits 0-7) and the frame's length (from bit 16). Answers 0.
///
/// A global function, as [`super::levels::rl_levels`]: it finds the key
/// again from the frame, so that the limit's frame on the stack holds
/// neither the count nor the key until the end.
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn rl_fleet_count(ctx: *mut xdp_md, l3: u64, packed: u64, index: u32) -> u32 {
    let Some(rule) = RL_RULE_TABLE.get(index) else {
        return 0;
    };
    if rule.flags & rule_flags::FLEET == 0 {
        return 0;
    }
    // See `rl_host_connection` on the mask.
    // SAFETY: a local.
    let l3 = (unsafe { read_volatile(&l3) } & 63) as usize;
    let Ok(source) = source_at(&XdpContext::new(ctx), l3) else {
        return 0;
    };
    let key = FlowKey::of(&masked(rule, (packed & 0xff) as u8, &source), rule.id);
    let seed = RL_CONFIG.get(0).map_or(0, |c| c.hash_seed);
    let (set, tag) = fleet_table::place(&key, seed);
    if let Some(set) = RL_FLEET_USED.get_ptr_mut(set) {
        // SAFETY: a map value valid for this run, shared only through the
        // table's protocol.
        let counted = unsafe { fleet_table::count::<Bpf>(set, &key, tag, packed >> 16, stamp()) };
        if counted == Counted::Full {
            event(Event::FleetFull);
        }
    }
    0
}
