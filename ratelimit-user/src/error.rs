//! The library's error type. aya's errors are kept as sources; the message says
//! what to do about it.

use std::path::PathBuf;

/// Everything the library can fail with.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A value given by the user is not valid. Nothing was changed.
    #[error("{field}: {message}")]
    Invalid {
        /// The option, config key or argument, as the user wrote it.
        field: String,
        /// What was wrong and which forms are accepted.
        message: String,
    },
    /// The interface does not exist.
    #[error("interface {0} not found: `ip link` lists the interfaces")]
    UnknownInterface(String),
    /// Another daemon holds the interface.
    #[error(
        "another ratelimit daemon already runs on {iface} (it holds {}); stop it first, or use `ratelimit set --iface {iface}` to change its limits",
        lock.display()
    )]
    AlreadyRunning {
        /// The interface.
        iface: String,
        /// The lock file it holds.
        lock: PathBuf,
    },
    /// No daemon answers on the interface's control socket.
    #[error(
        "no ratelimit daemon runs on {iface} (no answer on {}); start one with `ratelimit run --iface {iface}`",
        socket.display()
    )]
    NoDaemon {
        /// The interface.
        iface: String,
        /// The socket that did not answer.
        socket: PathBuf,
    },
    /// Loading the object into the kernel failed.
    #[error(
        "loading the XDP program failed (is this root, or CAP_BPF + CAP_NET_ADMIN, on Linux 5.18+ with BTF?)"
    )]
    Load(#[source] aya::EbpfError),
    /// Attaching to the interface failed.
    #[error("attaching the XDP program to {iface} in {mode} mode failed")]
    Attach {
        /// The interface.
        iface: String,
        /// The attach mode tried.
        mode: &'static str,
        /// aya's error.
        #[source]
        source: aya::programs::ProgramError,
    },
    /// A map operation failed.
    #[error("{op} on map {map} failed")]
    Map {
        /// What was being done.
        op: &'static str,
        /// The map's name.
        map: &'static str,
        /// aya's error.
        #[source]
        source: aya::maps::MapError,
    },
    /// A program or link operation failed.
    #[error("{op} failed")]
    Program {
        /// What was being done.
        op: &'static str,
        /// aya's error.
        #[source]
        source: aya::programs::ProgramError,
    },
    /// Pinning to bpffs failed.
    #[error("pinning {} failed (is bpffs mounted at /sys/fs/bpf?)", path.display())]
    Pin {
        /// The pin path.
        path: PathBuf,
        /// aya's error.
        #[source]
        source: aya::pin::PinError,
    },
    /// A pinned link could not be opened.
    #[error("opening the pinned link {} failed; `ratelimit run --reset` starts fresh", path.display())]
    Link {
        /// The pin path.
        path: PathBuf,
        /// aya's error.
        #[source]
        source: aya::programs::links::LinkError,
    },
    /// An I/O error, with what was being done.
    #[error("{what}")]
    Io {
        /// What was being done.
        what: String,
        /// The error.
        #[source]
        source: std::io::Error,
    },
    /// The daemon refused a control request.
    #[error("{0}")]
    Refused(String),
}

impl Error {
    /// An [`Error::Invalid`].
    pub fn invalid(field: impl Into<String>, message: impl Into<String>) -> Self {
        Self::Invalid {
            field: field.into(),
            message: message.into(),
        }
    }

    /// An [`Error::Io`] saying what was being done.
    pub fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> Self {
        let what = what.into();
        move |source| Self::Io { what, source }
    }
}

/// The library's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;
