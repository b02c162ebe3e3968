//! The library's error type. aya's errors are kept as sources; the message says
//! what to do about it.

use std::path::PathBuf;

pub use ratelimit_host::{
    chain,
    config_file::{ConfigErrors, Problem},
};

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
    /// A config file with errors: every one of them, each with its line
    /// (`FILE:LINE: field: message`). Nothing of the file was applied.
    #[error("{0}")]
    Config(ConfigErrors),
    /// The interface does not exist.
    #[error("interface {0} not found: `ip link` lists the interfaces")]
    UnknownInterface(String),
    /// Another daemon holds the interface.
    #[error(
        "another ratelimit daemon already runs on {place} (it holds {}); stop it first, or change what it enforces through it: `ratelimit list --iface {iface}`, `ratelimit set default --rate 100/s --iface {iface}`",
        lock.display()
    )]
    AlreadyRunning {
        /// The interface's name, as a command takes it.
        iface: String,
        /// The interface and its network namespace, for people.
        place: String,
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
    /// A change found no daemon, and programs pinned here enforce on their
    /// own: one message says so, and how to adopt them.
    #[error(
        "no ratelimit daemon runs {where_}, so nothing was changed; the program pinned for {} enforces on its own with the rules it had: {} adopts it (rules and buckets kept), then changes can be made",
        ifaces.join(", "),
        ifaces.iter().map(|i| format!("`ratelimit run --iface {i}`")).collect::<Vec<_>>().join(" or ")
    )]
    NoDaemonPinned {
        /// "on eth0", or "in this network namespace".
        where_: String,
        /// The interfaces whose programs are pinned and enforcing.
        ifaces: Vec<String>,
    },
    /// No daemon runs in this network namespace (a command without `--iface`).
    #[error(
        "no ratelimit daemon runs in this network namespace (no socket in {}); start one with `ratelimit run --iface IFACE`",
        dir.display()
    )]
    NoDaemonHere {
        /// The namespace's run directory, where the sockets would be.
        dir: PathBuf,
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
    /// The daemon refused a control request, or a precondition failed (a run
    /// directory someone else owns, ...). Nothing was changed.
    #[error("{0}")]
    Refused(String),
    /// The daemon did not answer (in time, or at all): a change may have
    /// been applied, or not.
    #[error("{0}")]
    NoAnswer(String),
    /// A change the daemon could not save for a restart (a full disk): it
    /// refused it, and nothing was changed.
    #[error("the change cannot be saved for a restart ({0}); nothing was changed")]
    NotSaved(String),
    /// Something does not fit in a map whose size was fixed when it was created.
    #[error(
        "{wanted} {what} do not fit in {capacity}: nothing was changed; to make room, restart the daemon with --reset {option} N (N at least {wanted}); the rules are kept, buckets and counters start over"
    )]
    Capacity {
        /// What does not fit.
        what: String,
        /// How many were asked for.
        wanted: usize,
        /// How many fit.
        capacity: usize,
        /// The option that sizes the map.
        option: &'static str,
    },
    /// No permission (the CLI as a user other than root).
    #[error("permission denied: {0}")]
    Permission(String),
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

impl From<ratelimit_host::Invalid> for Error {
    fn from(e: ratelimit_host::Invalid) -> Self {
        Self::Invalid {
            field: e.field,
            message: e.message,
        }
    }
}

/// What kind of failure an error is, for scripts: each kind has its own exit
/// code and its name in the `--json` error object.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// Invalid input: a bad option, value, CIDR or config file (clap's usage
    /// errors too). Nothing was changed.
    Invalid,
    /// No daemon runs on the interface, or in the network namespace.
    NoDaemon,
    /// The daemon refused the request (or a precondition failed). Nothing was
    /// changed.
    Refused,
    /// Permission denied: not root.
    Permission,
    /// The daemon did not answer in time: a change may have been applied.
    NoAnswer,
    /// Anything else: the kernel, I/O, the runtime.
    Failed,
}

impl Kind {
    /// Every kind, in the order of its exit code.
    pub const ALL: [Kind; 6] = [
        Kind::Failed,
        Kind::Invalid,
        Kind::NoDaemon,
        Kind::Refused,
        Kind::Permission,
        Kind::NoAnswer,
    ];

    /// The process exit code (0 is success, which is no kind).
    pub fn exit_code(self) -> u8 {
        match self {
            Kind::Failed => 1,
            // clap's own usage errors exit 2 too.
            Kind::Invalid => 2,
            Kind::NoDaemon => 3,
            Kind::Refused => 4,
            Kind::Permission => 5,
            Kind::NoAnswer => 6,
        }
    }

    /// The name in the `--json` error object.
    pub fn name(self) -> &'static str {
        match self {
            Kind::Invalid => "invalid",
            Kind::NoDaemon => "no-daemon",
            Kind::Refused => "refused",
            Kind::Permission => "permission",
            Kind::NoAnswer => "no-answer",
            Kind::Failed => "failed",
        }
    }

    /// What it means, in a few words (for `--help`, the man page).
    pub fn meaning(self) -> &'static str {
        match self {
            Kind::Invalid => {
                "invalid input: a bad option, value, CIDR or config file; nothing was changed"
            }
            Kind::NoDaemon => {
                "no daemon runs on the interface (or, without --iface, in this network namespace)"
            }
            Kind::Refused => "the daemon refused the request; nothing was changed",
            Kind::Permission => "permission denied: the control sockets are root's",
            Kind::NoAnswer => {
                "the daemon did not answer in time: a change may have been applied (`ratelimit list` tells)"
            }
            Kind::Failed => "any other failure: the kernel, I/O, the runtime",
        }
    }
}

impl Error {
    /// What kind of failure this is.
    pub fn kind(&self) -> Kind {
        match self {
            Error::Invalid { .. } | Error::Config(_) => Kind::Invalid,
            Error::NoDaemon { .. } | Error::NoDaemonHere { .. } | Error::NoDaemonPinned { .. } => {
                Kind::NoDaemon
            }
            Error::Refused(_) | Error::NotSaved(_) => Kind::Refused,
            Error::Permission(_) => Kind::Permission,
            Error::NoAnswer(_) => Kind::NoAnswer,
            Error::UnknownInterface(_)
            | Error::AlreadyRunning { .. }
            | Error::Load(_)
            | Error::Attach { .. }
            | Error::Map { .. }
            | Error::Program { .. }
            | Error::Pin { .. }
            | Error::Link { .. }
            | Error::Io { .. }
            | Error::Capacity { .. } => Kind::Failed,
        }
    }

    /// The process exit code for this error (see [`Kind::exit_code`]).
    pub fn exit_code(&self) -> u8 {
        self.kind().exit_code()
    }
}

/// The library's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_kind_of_failure_has_its_own_exit_code() {
        let io = || Error::Io {
            what: "reading x".into(),
            source: std::io::Error::other("boom"),
        };
        let cases = [
            (Error::invalid("--rate", "bad"), 2, "invalid"),
            (
                Error::NoDaemon {
                    iface: "eth0".into(),
                    socket: "/run/ratelimit/host/eth0.sock".into(),
                },
                3,
                "no-daemon",
            ),
            (
                Error::NoDaemonHere {
                    dir: "/run/ratelimit/host".into(),
                },
                3,
                "no-daemon",
            ),
            (
                Error::Refused("no rule for 198.18.0.0/16".into()),
                4,
                "refused",
            ),
            (Error::NotSaved("no space left".into()), 4, "refused"),
            (Error::Permission("not root".into()), 5, "permission"),
            (
                Error::NoAnswer("no answer within 30 s".into()),
                6,
                "no-answer",
            ),
            (Error::UnknownInterface("eth9".into()), 1, "failed"),
            (io(), 1, "failed"),
        ];
        for (e, code, name) in cases {
            assert_eq!((e.exit_code(), e.kind().name()), (code, name), "{e}");
        }
        // Codes 1 to 6, each once: a script can tell every kind apart.
        let codes: Vec<u8> = Kind::ALL.iter().map(|k| k.exit_code()).collect();
        assert_eq!(codes, [1, 2, 3, 4, 5, 6]);
    }
}
