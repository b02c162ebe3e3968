//! What a fleet-wide rule keeps beside its keys' buckets: what each key was
//! admitted here (the program counts), how much of that the daemon has
//! accounted for (its report cursor, which outlives the daemon in the
//! pins), and the daemon's heartbeat, by which the program knows whether a
//! daemon still keeps its keys in step with the fleet.

use crate::FlowKey;

/// What one key of a fleet-wide rule was admitted here since its slot of
/// [`MAP_FLEET_USED`](crate::MAP_FLEET_USED) was taken (cumulative). Written
/// by the program: the counts by atomic add, `born` once, when it takes the
/// slot.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct FleetUsed {
    /// Frames admitted.
    pub packets: u64,
    /// Their bytes (whole frames from the Ethernet header).
    pub bytes: u64,
    /// When the program took the slot (its clock, ns): a key whose slot was
    /// given up and taken again counts from zero, and the daemon tells the
    /// two apart by this.
    pub born: u64,
}
const _: () = assert!(core::mem::size_of::<FleetUsed>() == 24);

/// Slots in a set of [`MAP_FLEET_USED`](crate::MAP_FLEET_USED).
pub const FLEET_WAYS: usize = 8;

/// Sets of [`MAP_FLEET_USED`](crate::MAP_FLEET_USED): [`FLEET_CAPACITY`](crate::FLEET_CAPACITY) slots.
pub const FLEET_SETS: u32 = crate::FLEET_CAPACITY / FLEET_WAYS as u32;
const _: () = assert!(FLEET_SETS.is_power_of_two());

/// A tag while its slot is being taken: never a key's (a key's tag has its
/// top bit clear).
pub const FLEET_LOCKED: u64 = u64::MAX;

/// One slot of a [`FleetSet`]: a key of a fleet-wide rule and what it was
/// admitted here. One cache line.
#[repr(C, align(64))]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct FleetSlot {
    /// What the key was admitted since the slot was taken.
    pub used: FleetUsed,
    /// When the key was last counted (the program's coarse clock, ns).
    pub seen: u64,
    /// The key.
    pub key: FlowKey,
    /// Zero.
    pub _pad: [u32; 3],
}
const _: () = assert!(core::mem::size_of::<FleetSlot>() == 64);

/// Value of [`MAP_FLEET_USED`](crate::MAP_FLEET_USED): a set of the fleet's
/// counts ([`crate::fleet_table`]): its slots' tags in the first cache line,
/// then the slots.
#[repr(C, align(64))]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct FleetSet {
    /// Each slot's key's tag ([`crate::fleet_table::place`]); 0 empty,
    /// [`FLEET_LOCKED`] being taken.
    pub tags: [u64; FLEET_WAYS],
    /// The slots.
    pub slots: [FleetSlot; FLEET_WAYS],
}
const _: () = assert!(core::mem::size_of::<FleetSet>() == 576);

/// Value of [`MAP_FLEET_REPORTED`](crate::MAP_FLEET_REPORTED): how much of a
/// key's [`FleetUsed`] the daemon has accounted for, so that a daemon that
/// starts again (after `--keep-attached`, a SIGKILL) never reports a key's
/// history twice. Written by the daemon after each sync; read by the next
/// daemon when it starts. The program never reads it.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct FleetCursor {
    /// The [`FleetUsed::packets`] accounted for.
    pub packets: u64,
    /// The [`FleetUsed::bytes`] accounted for.
    pub bytes: u64,
    /// The [`FleetUsed::born`] of the entry these counts are of.
    pub born: u64,
    /// What this daemon admitted and could not report yet (Redis could not
    /// be reached), as a bucket of its own: the time (CLOCK_MONOTONIC, ns)
    /// at which that bucket would be full again. Reported as the units it
    /// still owes when Redis answers; 0 when nothing is owed.
    pub owed_until: u64,
}
const _: () = assert!(core::mem::size_of::<FleetCursor>() == 32);

/// Value of [`MAP_FLEET_BEAT`](crate::MAP_FLEET_BEAT) (one entry): the
/// daemon's heartbeat. Written by the daemon at every sync, once every key
/// of the sync is settled; read by the program for every frame under a
/// fleet-wide rule (see [`fleet_cost`]). A zeroed value (no daemon ever
/// synced) charges nothing extra.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct FleetBeat {
    /// When the counts of the daemon's last settled sync were read
    /// (CLOCK_MONOTONIC, ns: the program's clock): the debt the program
    /// judges with is no older than this.
    pub at: u64,
    /// The daemons of the fleet the daemon counted then, itself included;
    /// at most [`FLEET_MEMBERS_MAX`].
    pub members: u32,
    /// Zero.
    pub _pad: u32,
}
const _: () = assert!(core::mem::size_of::<FleetBeat>() == 16);

/// A heartbeat older than this is a daemon that no longer syncs (killed,
/// stuck): five syncs of 100 ms. From then on the program charges each frame
/// of a fleet-wide key [`FleetBeat::members`] times ([`fleet_cost`]).
pub const FLEET_STALE_NS: u64 = 500_000_000;

/// The most daemons a heartbeat counts: keeps `cost × members` far from
/// overflowing (a frame is at most 2^16 bytes).
pub const FLEET_MEMBERS_MAX: u32 = 1 << 16;

/// What a frame of `cost` units costs the bucket of a fleet-wide key whose
/// rule's burst is `capacity`, at `now_ns` (the program's clock), with the
/// daemon's heartbeat `at` and `members` (a [`FleetBeat`]'s fields, passed
/// apart so that the program keeps them in registers): `cost` while the
/// daemon syncs; once its heartbeat is older than [`FLEET_STALE_NS`],
/// `members` times `cost` (as if every other daemon admitted as much: the
/// `share` fallback, kept by the program itself when no daemon keeps it),
/// at most the whole bucket so that a frame can still pass when the bucket
/// is full.
#[inline(always)]
pub fn fleet_cost(cost: u64, at: u64, members: u32, now_ns: u64, capacity: u64) -> u64 {
    let members = members as u64;
    if members <= 1 || now_ns.saturating_sub(at) <= FLEET_STALE_NS {
        return cost;
    }
    let members = if members > FLEET_MEMBERS_MAX as u64 {
        FLEET_MEMBERS_MAX as u64
    } else {
        members
    };
    let charged = cost.wrapping_mul(members);
    if charged <= capacity {
        charged
    } else if cost <= capacity {
        capacity
    } else {
        cost
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: u64 = 1_000_000_000;

    fn beat(at: u64, members: u32) -> FleetBeat {
        FleetBeat {
            at,
            members,
            _pad: 0,
        }
    }

    fn cost(cost: u64, b: &FleetBeat, now: u64, capacity: u64) -> u64 {
        fleet_cost(cost, b.at, b.members, now, capacity)
    }

    #[test]
    fn a_fresh_heartbeat_charges_the_frame_alone() {
        assert_eq!(cost(1, &beat(10 * S, 3), 10 * S + FLEET_STALE_NS, 20), 1);
        // A reading a little behind the daemon's (a coarse clock).
        assert_eq!(cost(1, &beat(10 * S, 3), 10 * S - 1, 20), 1);
    }

    #[test]
    fn a_stale_heartbeat_charges_every_member() {
        let b = beat(10 * S, 3);
        assert_eq!(cost(1, &b, 10 * S + FLEET_STALE_NS + 1, 20), 3);
        assert_eq!(cost(100, &b, 20 * S, 1_000), 300);
    }

    #[test]
    fn never_more_than_the_bucket_and_never_less_than_the_frame() {
        let b = beat(0, 50);
        assert_eq!(cost(1, &b, 10 * S, 20), 20);
        // A frame larger than the bucket stays what it is (never admitted).
        assert_eq!(cost(30, &b, 10 * S, 20), 30);
    }

    #[test]
    fn no_daemon_or_one_alone_charges_nothing_extra() {
        assert_eq!(cost(1, &FleetBeat::default(), 10 * S, 20), 1);
        assert_eq!(cost(1, &beat(0, 1), 10 * S, 20), 1);
    }

    #[test]
    fn members_are_capped() {
        let b = beat(0, u32::MAX);
        assert_eq!(cost(1, &b, 10 * S, u64::MAX), FLEET_MEMBERS_MAX as u64);
    }
}
