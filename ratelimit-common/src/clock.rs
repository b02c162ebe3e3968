//! The time unit of algorithm state: the *tick*, `2^-TICK_SHIFT` ns.
//!
//! States keep time in ticks rather than nanoseconds so that an interval between
//! tokens can carry a fraction of a nanosecond: at 100 Gbit/s a byte takes 0.08 ns,
//! which in ticks is 655.36 → 655, an error of 0.06 %. Per-packet rounding to whole
//! nanoseconds would admit up to 2 % too much at that rate.
//!
//! A `u64` of ticks spans `2^(64 - TICK_SHIFT)` ns (about 26 days), less than a
//! server's uptime, so tick values wrap: algorithms compare them only through
//! wrapping differences (see [`crate::gcra`]). The shift is global, not per rule,
//! so that changing a rule's rate never changes how an existing state is read.

/// log2 of ticks per nanosecond.
pub const TICK_SHIFT: u32 = 13;

/// Ticks per nanosecond (8192).
pub const TICKS_PER_NS: u64 = 1 << TICK_SHIFT;

/// Converts a monotonic clock reading in ns to ticks, wrapping.
#[inline(always)]
pub const fn ns_to_ticks(ns: u64) -> u64 {
    ns.wrapping_shl(TICK_SHIFT)
}

/// Converts a tick duration to ns, rounding up so that a "retry after" is never early.
#[inline(always)]
pub const fn ticks_to_ns_ceil(ticks: u64) -> u64 {
    (ticks >> TICK_SHIFT) + ((ticks & (TICKS_PER_NS - 1) != 0) as u64)
}
