//! `top`'s table ([`MAP_DROPS`](crate::MAP_DROPS)): its sets, as
//! [`crate::top`] reads and writes them.

/// Slots in a set.
pub const TOP_WAYS: usize = 4;

/// Sets of [`MAP_DROPS`](crate::MAP_DROPS): [`DROPS_CAPACITY`](crate::DROPS_CAPACITY) slots.
pub const TOP_SETS: u32 = crate::DROPS_CAPACITY / TOP_WAYS as u32;
const _: () = assert!(TOP_SETS.is_power_of_two());

/// A tag while its slot is being taken: never a key's (a key's level is at
/// most 3, and these bits of a tag are its level).
pub const TOP_LOCKED: u64 = u64::MAX;

/// One set of [`MAP_DROPS`](crate::MAP_DROPS): each slot's tag, count, last
/// sample and address, the tags and counts in the first cache line.
#[repr(C, align(64))]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct TopSet {
    /// Each slot's key's [`place`](crate::top::place) tag; 0 empty,
    /// [`TOP_LOCKED`] being taken.
    pub tags: [u64; TOP_WAYS],
    /// Drops counted for each slot's key (sampled: multiples of
    /// [`DROP_SAMPLE`](crate::DROP_SAMPLE)).
    pub counts: [u64; TOP_WAYS],
    /// When each slot's key was last sampled (the program's coarse clock, ns).
    pub seen: [u64; TOP_WAYS],
    /// Each slot's address (IPv4-mapped for IPv4), masked to its prefix.
    pub addrs: [crate::Addr; TOP_WAYS],
    /// Zero.
    pub _pad: [u64; 4],
}
const _: () = assert!(core::mem::size_of::<TopSet>() == 192);
