//! The daemon tier: the real `ratelimit` binary (`RATELIMIT_BIN`) run as
//! operators run it, in network namespaces joined by veth pairs, with frames
//! counted at a receiver of the tests' own. Root; one test at a time.
//!
//! - [`network`]: traffic through a veth under limits, rules, floods;
//! - [`control`], [`cli`], [`check`]: the control socket, the command line's
//!   errors and exit codes, `ratelimit check`;
//! - [`restarts`], [`faults`], [`inputs`]: restarts of every kind, hostile
//!   conditions, what the daemon reads and keeps;
//! - [`operator`]: whole tasks as an operator types them (bans, the README's
//!   example);
//! - [`droplog`], [`metrics`]: the drop log under a flood, the metrics at
//!   scale.

mod check;
mod cli;
mod control;
mod droplog;
mod faults;
mod inputs;
mod metrics;
mod network;
mod operator;
mod restarts;
