//! What the daemon, the service and the CLI take from the host, below any
//! rule: the wall clock ([`clock`]), its own addresses ([`addresses`]), who a daemon is ([`identity`]), its run directory ([`rundir`]), the
//! files an operator names ([`input`]), what the kernel has ([`kernel`]), the addresses to listen on
//! ([`listen`]), the connection slots of a listener ([`slots`]) and the logs
//! ([`logs`]).

pub mod addresses;
pub mod clock;
pub mod identity;
pub mod input;
pub mod kernel;
pub mod listen;
pub mod logs;
pub mod rundir;
pub mod slots;
