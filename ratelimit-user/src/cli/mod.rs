//! The command line, from the strings typed to what is printed:
//!
//! - [`args`]: clap parses the strings into [`Cli`], one struct per command;
//! - `lower`: those into validated options and typed requests;
//! - `run`: [`main`] runs each command: the daemon's loop, a request to a
//!   daemon, or a read from a program's pins when no daemon runs;
//! - `print`: the answers as lines, tables or `--json`;
//! - `check`: `ratelimit check`'s report of a config file;
//! - [`crowdsec`]: `run`'s CrowdSec flags, checked into the bouncer's options;
//! - [`serve`]: `ratelimit serve` handed on to the service's own binary;
//! - [`report`]: a failure as a message, an exit code, and JSON with `--json`;
//! - [`help`] and [`docs`]: examples, man pages and completions, from [`args`];
//! - `values`: the names and help of the lower floors' enums a flag takes
//!   (nothing below `cli` depends on clap).
//!
//! The binary's `main` parses [`Cli`] and calls [`main`].

pub mod args;
mod check;
pub mod crowdsec;
pub mod docs;
pub mod help;
mod lower;
mod print;
pub mod report;
mod run;
pub mod serve;
mod values;

pub use args::{Cli, Command};
pub use ratelimit_host::shutdown_signal;
pub use run::main;
