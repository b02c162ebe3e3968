//! The ratelimit daemon and CLI as a library, in floors: each module uses only
//! the ones listed before it.
//!
//! - [`error`]: the errors every floor returns, with their exit codes.
//! - [`host`]: what the host gives: who a daemon is ([`host::identity`]), its
//!   run directory, the files an operator names, listening addresses,
//!   connection slots, the logs.
//! - [`model`]: the validated rules: prefixes, rates, matches, lists, rule
//!   sets, and how they are described.
//! - [`config`]: the TOML schema, and reading a file with every error located.
//! - [`kernel`]: the XDP program loaded, attached and pinned; its maps written
//!   and read.
//! - [`fleet`]: fleet-wide limits through Redis.
//! - [`crowdsec`]: the CrowdSec bouncer: a Local API's decision stream
//!   followed, its bans handed to the daemon's loop.
//! - [`protocol`]: the control socket's requests and answers, typed on both
//!   ends, and the CLI's side of the socket.
//! - [`daemon`]: the daemon's loop, its control server, a handler per
//!   request, metrics, persistence and the read-only path when no daemon
//!   runs.
//! - `ratelimit serve` is not here: it runs the service's own binary,
//!   `ratelimit-serve` (the `ratelimit-serve` crate), so that this one holds
//!   nothing of it ([`cli`] hands the arguments on).
//! - [`cli`]: the command line, its printers, man pages and help.

pub mod cli;
pub mod config;
pub mod crowdsec;
pub mod daemon;
pub mod error;
pub mod fleet;
pub mod host;
pub mod kernel;
pub mod model;
pub mod protocol;

pub use error::{Error, Result};

/// The compiled XDP program (ELF), built by `build.rs` and embedded here.
pub static EBPF_OBJECT: &[u8] =
    aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/ratelimit-xdp"));
