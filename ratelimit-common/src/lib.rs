//! Everything the XDP program and userspace must agree on: map names and capacities,
//! the layout of every map key and value, reason codes, and the rate-limiting
//! algorithms as pure functions of `(state, params, now, cost)`.
//!
//! `#![no_std]`: the same code is compiled into the kernel program and into the host
//! crates, where it is tested against a fake clock.
//!
//! | module | algorithm | state per key |
//! |---|---|---|
//! | [`gcra`] | token bucket, greedy refill, as GCRA (the default) | 8 B |
//! | [`interval`] | token bucket, interval refill | 24 B |
//! | [`fixed_window`] | fixed window counter | 16 B |
//! | [`sliding_log`] | sliding window log | 8 B + 8 B per unit of the limit |
//! | [`sliding_window`] | sliding window counter | 16 B |
//! | [`rolling_quota`] | rolling-window quota with a rate cap | 8 B + 4 B per period |
//!
//! [`dispatch`] runs any of them by one [`dispatch::Op`] (decide, charge,
//! refund): the XDP program's one dispatch over the wide states, and the
//! keyed limiter's.
#![no_std]

/// Returns `Err(ParamError { param, accepted })` from the calling function
/// unless `ok`: one line per parameter check, usable in a `const fn` (where
/// `?` is not).
macro_rules! ensure {
    ($ok:expr, $param:expr, $accepted:expr) => {
        if !$ok {
            return Err($crate::ParamError {
                param: $param,
                accepted: $accepted,
            });
        }
    };
}

#[cfg(feature = "std")]
pub mod keyed;

pub mod clock;
pub mod decision;
pub mod dispatch;
pub mod doorkeeper;
pub mod episode;
pub mod fixed_window;
pub mod fleet_table;
pub mod gcra;
pub mod interval;
pub mod maps;
pub mod rolling_quota;
pub mod sliding_log;
pub mod sliding_window;
pub mod table;
pub mod top;

pub use clock::{TICK_SHIFT, TICKS_PER_NS, ns_to_ticks, ticks_to_ns_ceil};
pub use decision::{Decision, NEVER};
pub use maps::*;

/// Why a set of parameters was refused: which parameter, and what is accepted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ParamError {
    /// The parameter, as the CLI names it (`--window`, `--limit`, ...).
    pub param: &'static str,
    /// What is accepted.
    pub accepted: &'static str,
}

impl core::fmt::Display for ParamError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "{} {}", self.param, self.accepted)
    }
}

/// So that `?` takes it in a `fn main() -> Result<(), Box<dyn Error>>`.
#[cfg(feature = "std")]
impl core::error::Error for ParamError {}

impl ParamError {
    /// The checks every algorithm counted over a window makes: the window is
    /// longer than 0 and the limit from 1 to `max` (`limit_accepted` says so
    /// in the algorithm's words).
    pub(crate) const fn window_and_limit(
        window_ns: u64,
        limit: u64,
        max: u64,
        limit_accepted: &'static str,
    ) -> Result<(), ParamError> {
        ensure!(
            window_ns > 0,
            "window",
            "must be longer than 0, like 1s or 1min"
        );
        ensure!(limit > 0 && limit <= max, "limit", limit_accepted);
        Ok(())
    }
}

/// `a / b` without a panic path (the kernel program may have none): 0 when `b` is 0.
#[inline(always)]
pub(crate) fn div(a: u64, b: u64) -> u64 {
    a.checked_div(b).unwrap_or_default()
}
