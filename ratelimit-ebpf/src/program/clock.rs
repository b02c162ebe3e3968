//! The clock: now, in ns, as the daemon chose it (`RL_CONFIG`'s flags). Read
//! once per frame by the limit ([`super::limit`]), which hands it to every
//! level and algorithm: the program supplies the clock, ratelimit-common
//! decides. And a stamp for the birth of a fleet-wide key's count
//! ([`stamp`]), read only when that count is created.

use aya_ebpf::helpers::{bpf_ktime_get_coarse_ns, bpf_ktime_get_ns};
use ratelimit_common::{Config, config_flags};

/// The clock the daemon chose: `bpf_ktime_get_ns`, or the cheaper time of the
/// last tick.
#[inline(always)]
pub(crate) fn clock(config: &Config) -> u64 {
    // SAFETY: helpers with no preconditions.
    unsafe {
        if config.flags & config_flags::COARSE_CLOCK != 0 {
            bpf_ktime_get_coarse_ns()
        } else {
            bpf_ktime_get_ns()
        }
    }
}

/// When a fleet-wide key's count is created: the time of the last tick
/// (the stamp only tells one life of the count from the next). Read where it
/// is needed rather than carried from the limit: the limit's frame on the
/// stack has no room left for it.
#[inline(always)]
pub(crate) fn stamp() -> u64 {
    // SAFETY: a helper with no preconditions.
    unsafe { bpf_ktime_get_coarse_ns() }
}
