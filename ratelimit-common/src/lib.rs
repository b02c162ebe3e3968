//! Everything the XDP program and userspace must agree on: map names and capacities,
//! the layout of every map key and value, reason codes, and the rate-limiting
//! algorithms as pure functions of `(state, params, now, cost)`.
//!
//! `#![no_std]`: the same code is compiled into the kernel program and into the host
//! crates, where it is tested against a fake clock.
#![no_std]

pub mod clock;
pub mod gcra;
pub mod maps;

pub use clock::{TICK_SHIFT, TICKS_PER_NS, ns_to_ticks, ticks_to_ns_ceil};
pub use gcra::Decision;
pub use maps::*;
