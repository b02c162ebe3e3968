//! The ratelimit daemon and CLI as a library: loading and attaching the XDP
//! program ([`kernel`]), the validated rule model ([`rules`], [`rate`],
//! [`config`], [`lists`]), reading a config file with every error
//! ([`check`]), the daemon ([`daemon`]), its control socket ([`control`]) and
//! the files an operator names ([`input`]), the command line ([`cli`]: its examples in [`help`], its man pages and
//! completions in [`docs`], how a failure is reported in [`report`]).

pub mod check;
pub mod cli;
pub mod config;
pub mod control;
pub mod daemon;
pub mod describe;
pub mod docs;
pub mod error;
pub mod fleet;
pub mod help;
pub mod identity;
pub mod input;
pub mod kernel;
pub mod listen;
pub mod lists;
pub mod logs;
pub mod matching;
pub mod metrics;
pub mod rate;
pub mod report;
pub mod rules;
pub mod rundir;
pub mod serve;
pub mod slots;

pub use error::{Error, Result};

/// The compiled XDP program (ELF), built by `build.rs` and embedded here.
pub static EBPF_OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/ratelimit"));

/// Benchmark floors (an XDP_DROP-only program and an LRU lookup-and-update one),
/// for `cargo xtask bench`. Never attached by the daemon.
#[doc(hidden)]
pub static FLOORS_OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/floors"));
