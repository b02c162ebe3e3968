//! The control socket: one JSON request per line from the CLI, one JSON response
//! per line from the daemon, typed on both ends. Each daemon's socket is
//! `<run root>/<network namespace>/<iface>.sock`, mode 0600, in a directory only
//! root owns; the CLI checks the socket's owner and the peer's credentials
//! before it trusts an answer.
//!
//! - [`request`]: what the CLI asks ([`Request`]), `set`'s options as a typed
//!   patch and rules named by their [`crate::model::matching::Selector`];
//! - [`response`]: the envelope of every answer ([`Response`]);
//! - [`answer`]: one struct per answer (the rules, a change, status, stats,
//!   top, the fleet's), built by the daemon and its read-only path, read by
//!   the CLI's printers;
//! - [`flags`]: which option of the command line a validated field is;
//! - [`socket`]: the CLI's side: the daemons of this network namespace, and
//!   one request to one of them.
//!
//! The daemon's side is [`crate::daemon::control`].

pub mod answer;
pub mod flags;
pub mod request;
pub mod response;
pub mod socket;

use std::path::PathBuf;

pub use answer::Answer;
pub use request::{LevelPatch, LimitPatch, NewSourcesGiven, Request, ResetScope, SetTarget};
pub use response::Response;
pub use socket::{Connection, call, connect, daemons_here, only_daemon};

use crate::host::{identity::Identity, rundir};

/// The longest request line a daemon reads, bytes: far more than any rule.
pub const MAX_REQUEST: usize = 64 << 10;
/// The longest [`Request::LoadList`] line, bytes: room for a list file of
/// [`crate::host::input::LIST_MAX_BYTES`] in JSON, where each line's end takes two
/// bytes (`\n`). Read by one connection at a time; the CLI refuses a longer
/// request before it sends it.
pub const MAX_LIST_REQUEST: usize = 2 * crate::host::input::LIST_MAX_BYTES as usize + MAX_REQUEST;

/// The control socket of `id`'s daemon.
pub fn socket_path(id: &Identity) -> PathBuf {
    rundir::file(id, "sock")
}
