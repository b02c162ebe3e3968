//! What the daemon and the CLI take from the host, below any rule: the wall
//! clock ([`clock`]), its own addresses ([`addresses`]), who a daemon is
//! ([`identity`]), its run directory ([`rundir`]), what the kernel has
//! ([`kernel`]) and the logs ([`logs`]). What the service uses too lives in
//! the `ratelimit-host` crate and is re-exported here: the files an operator
//! names ([`input`]), the addresses to listen on ([`listen`]) and the
//! connection slots of a listener ([`slots`]).

pub mod addresses;
pub mod clock;
pub mod identity;
pub mod kernel;
pub mod logs;
pub mod rundir;

pub use ratelimit_host::{input, listen, slots};
