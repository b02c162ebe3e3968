//! The control socket: one JSON request per line from the CLI, one JSON response
//! per line from the daemon. Each daemon's socket is
//! `<run root>/<network namespace>/<iface>.sock`, mode 0600, in a directory only
//! root owns; the CLI checks the socket's owner and the peer's credentials
//! before it trusts an answer.

use std::{
    os::{fd::AsRawFd as _, unix::fs::MetadataExt as _},
    path::{Path, PathBuf},
    time::Duration,
};

use serde::{Deserialize, Serialize};
use tokio::{
    io::{AsyncBufReadExt, AsyncReadExt as _, AsyncWriteExt, BufReader},
    net::UnixStream,
};

use crate::{
    config::RawLimit,
    error::{Error, Result},
    host::identity::Identity,
    host::rundir,
};

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

/// A request from the CLI.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(tag = "cmd", rename_all = "kebab-case")]
pub enum Request {
    /// Set a limit on `target` (`default` or a CIDR).
    Set {
        /// `default` or a CIDR.
        target: String,
        /// What the CLI was given, alone: on a rule that is already a limit
        /// the rest is kept.
        limit: Box<RawLimit>,
        /// For this long, ms (`--for`); then what it replaced comes back.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        for_ms: Option<u64>,
        /// Take a byte burst below one full-size frame (`--force`).
        #[serde(default)]
        force: bool,
    },
    /// Exempt a CIDR.
    Allow {
        /// The CIDR.
        cidr: String,
        /// For this long, ms (`--for`); then what it replaced comes back.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        for_ms: Option<u64>,
    },
    /// Drop everything from a CIDR.
    Deny {
        /// The CIDR.
        cidr: String,
        /// For this long, ms (`--for`); then what it replaced comes back.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        for_ms: Option<u64>,
    },
    /// Remove the rule of a CIDR; a temporary one ends, and what it hid
    /// comes back.
    Unset {
        /// The CIDR.
        cidr: String,
        /// Only end a temporary rule; no change when the CIDR has none
        /// (`--only-temporary`: fail2ban's unban).
        #[serde(default)]
        only_temporary: bool,
    },
    /// Load a list whole, replacing the list of that name.
    LoadList {
        /// The list's name.
        name: String,
        /// Deny or allow.
        action: crate::model::lists::ListAction,
        /// Where the CLI read it (a path as typed, or `stdin`), for errors and
        /// `list`.
        source: String,
        /// The file's text, parsed by the daemon.
        text: String,
        /// For this long, ms (`--for`); then the list is removed.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        for_ms: Option<u64>,
    },
    /// Remove a list.
    UnsetList {
        /// The list's name.
        name: String,
    },
    /// Switch the mode.
    Mode {
        /// Normal or allowlist-only.
        mode: crate::model::rules::Mode,
    },
    /// Read the config file again (keeping live changes unless `replace`).
    Reload {
        /// Drop the live changes: the file alone.
        #[serde(default)]
        replace: bool,
    },
    /// The rules.
    List {
        /// With each rule's counters (`list --stats`).
        #[serde(default)]
        counters: bool,
    },
    /// What runs and how.
    Status,
    /// Counters by reason.
    Stats,
    /// Sources with the most drops (the CLI's connection task takes two
    /// snapshots of [`Request::Drops`] a little apart).
    Top {
        /// How many.
        n: usize,
    },
    /// Drop counts by source, now.
    Drops,
    /// The fleet's use of each key of the fleet-wide rules, from Redis (the
    /// connection task asks Redis; see [`Request::FleetRules`]).
    FleetTop {
        /// How many keys per rule.
        n: usize,
    },
    /// The fleet's Redis and the names of the fleet-wide rules.
    FleetRules,
}

impl Request {
    /// Whether it changes what is enforced.
    pub fn is_change(&self) -> bool {
        matches!(
            self,
            Request::Set { .. }
                | Request::Allow { .. }
                | Request::Deny { .. }
                | Request::Unset { .. }
                | Request::LoadList { .. }
                | Request::UnsetList { .. }
                | Request::Mode { .. }
                | Request::Reload { .. }
        )
    }
}

/// The daemon's answer.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Response {
    /// Whether the request was carried out.
    pub ok: bool,
    /// Why not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// When the request was refused for invalid input: the field (option,
    /// config key or argument) at fault. `error` then starts with `FIELD: `.
    /// The CLI exits with the invalid-input code rather than the refused one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub invalid: Option<String>,
    /// The answer.
    #[serde(default)]
    pub data: serde_json::Value,
}

impl Response {
    /// A refusal.
    pub fn refused(why: impl Into<String>) -> Self {
        Self {
            ok: false,
            error: Some(why.into()),
            invalid: None,
            data: serde_json::Value::Null,
        }
    }

    /// A refusal for `e`, its whole chain as the reason; invalid input keeps
    /// its field.
    pub fn refused_for(e: &Error) -> Self {
        Self {
            invalid: match e {
                Error::Invalid { field, .. } => Some(field.clone()),
                _ => None,
            },
            ..Self::refused(crate::error::chain(e))
        }
    }

    /// An answer with `data`.
    pub fn ok(data: serde_json::Value) -> Self {
        Self {
            ok: true,
            error: None,
            invalid: None,
            data,
        }
    }

    /// What the CLI makes of the answer: its data, or the error it carries.
    pub fn into_result(self) -> Result<serde_json::Value> {
        if self.ok {
            return Ok(self.data);
        }
        let why = self.error.unwrap_or_else(|| "refused".into());
        Err(match self.invalid {
            Some(field) => Error::Invalid {
                message: why
                    .strip_prefix(&format!("{field}: "))
                    .unwrap_or(&why)
                    .to_string(),
                field,
            },
            None => Error::Refused(why),
        })
    }
}

fn is_root() -> bool {
    // SAFETY: no preconditions.
    unsafe { libc::geteuid() == 0 }
}

fn not_root() -> Error {
    Error::Permission(
        "the daemons' control sockets are root's; run the command as root (for example with sudo)"
            .into(),
    )
}

/// The interfaces of the daemons running in the calling thread's network
/// namespace. A socket nobody answers on (its daemon was killed) is removed.
pub fn daemons_here() -> Result<Vec<String>> {
    if !is_root() {
        return Err(not_root());
    }
    let here = Identity::here("")?;
    let dir = rundir::netns_dir(&here);
    let mut found = Vec::new();
    let Ok(entries) = std::fs::read_dir(&dir) else {
        return Ok(found);
    };
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let Some(iface) = name.strip_suffix(".sock") else {
            continue;
        };
        let path = e.path();
        match std::os::unix::net::UnixStream::connect(&path) {
            Ok(_) => found.push(iface.to_string()),
            Err(err) if err.kind() == std::io::ErrorKind::ConnectionRefused => {
                // Nobody listens: a daemon killed before it could clean up.
                if owned_by_root(&path) {
                    rundir::remove(&path);
                }
            }
            Err(_) => {}
        }
    }
    found.sort();
    Ok(found)
}

fn owned_by_root(path: &Path) -> bool {
    std::fs::symlink_metadata(path)
        .map(|m| m.uid() == 0 && !m.file_type().is_symlink())
        .unwrap_or(false)
}

/// The interface of the only daemon of this network namespace, for commands
/// without `--iface`.
pub fn only_daemon() -> Result<String> {
    let mut found = daemons_here()?;
    let here = Identity::here("")?;
    match found.len() {
        0 => Err(Error::NoDaemonHere {
            dir: rundir::netns_dir(&here),
        }),
        1 => Ok(found.remove(0)),
        _ => Err(Error::invalid(
            "--iface",
            format!(
                "daemons run on {} in this network namespace: say which with --iface",
                found.join(", ")
            ),
        )),
    }
}

/// Sends one request to the daemon on `iface` (in this network namespace) and
/// returns its data, or its error.
pub async fn call(iface: &str, request: &Request) -> Result<serde_json::Value> {
    if !is_root() {
        return Err(not_root());
    }
    let id = Identity::here(iface)?;
    let path = socket_path(&id);
    // The interface's name alone: the message's hint is a command to run,
    // and the socket's path names the namespace.
    let no_daemon = || Error::NoDaemon {
        iface: id.iface.clone(),
        socket: path.clone(),
    };
    // The socket must be root's, in a directory root owns: anybody else's
    // listener would be answering in the daemon's name.
    let meta = std::fs::symlink_metadata(&path).map_err(|_| no_daemon())?;
    if meta.file_type().is_symlink() || meta.uid() != 0 {
        return Err(Error::Refused(format!(
            "{} is not root's socket (uid {}): not talking to it; remove it and restart the daemon",
            path.display(),
            meta.uid()
        )));
    }
    rundir::secure(&id)?;
    let stream = UnixStream::connect(&path).await.map_err(|_| no_daemon())?;
    let peer = peer_uid(&stream);
    if peer != Some(0) {
        return Err(Error::Refused(format!(
            "the process listening on {} is not root's (uid {peer:?}): not talking to it",
            path.display()
        )));
    }
    exchange(stream, &path, request).await
}

/// The uid of the process at the other end of `stream` (SO_PEERCRED).
fn peer_uid(stream: &UnixStream) -> Option<u32> {
    let mut cred = libc::ucred {
        pid: 0,
        uid: u32::MAX,
        gid: u32::MAX,
    };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: a valid socket fd and an out buffer of `len` bytes.
    let rc = unsafe {
        libc::getsockopt(
            stream.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut cred as *mut libc::ucred).cast(),
            &mut len,
        )
    };
    (rc == 0).then_some(cred.uid)
}

/// How long the CLI waits for an answer, unless `RATELIMIT_TIMEOUT` (whole
/// seconds, 1 or more) says otherwise.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(30);

fn answer_timeout() -> Result<Duration> {
    match std::env::var("RATELIMIT_TIMEOUT") {
        Err(_) => Ok(ANSWER_TIMEOUT),
        Ok(v) => v
            .trim()
            .parse::<u64>()
            .ok()
            .filter(|s| *s > 0)
            .map(Duration::from_secs)
            .ok_or_else(|| {
                Error::invalid(
                    "RATELIMIT_TIMEOUT",
                    format!("{v:?} is not a number of seconds: give a whole number of 1 or more, like 30"),
                )
            }),
    }
}

async fn exchange(stream: UnixStream, path: &Path, request: &Request) -> Result<serde_json::Value> {
    let (read, mut write) = stream.into_split();
    let mut line = serde_json::to_string(request).expect("requests serialize");
    line.push('\n');
    if line.len() > MAX_LIST_REQUEST {
        // Said here, not as a broken pipe when the daemon stops reading.
        return Err(Error::invalid(
            "--from",
            format!(
                "the list takes {} bytes as a request, more than the daemon reads ({MAX_LIST_REQUEST}): remove its comments, or split it into several lists",
                line.len()
            ),
        ));
    }
    let timeout = answer_timeout()?;
    let ctx = || format!("talking to the daemon on {}", path.display());
    write
        .write_all(line.as_bytes())
        .await
        .map_err(Error::io(ctx()))?;
    let mut answer = String::new();
    let mut reader = BufReader::new(read).take(64 << 20);
    let read = reader.read_line(&mut answer);
    // Not a refusal: the daemon may have made the change and not yet
    // answered (a large list to write), or been killed after it.
    let outcome = if request.is_change() {
        "; the change may have been applied: `ratelimit list` shows what is enforced"
    } else {
        ""
    };
    match tokio::time::timeout(timeout, read).await {
        Ok(Ok(0)) => {
            return Err(Error::NoAnswer(format!(
                "the daemon on {} closed the connection without answering{outcome}",
                path.display()
            )));
        }
        Ok(r) => {
            r.map_err(Error::io(ctx()))?;
        }
        Err(_) => {
            return Err(Error::NoAnswer(format!(
                "no answer from the daemon on {} within {} s{outcome}",
                path.display(),
                timeout.as_secs()
            )));
        }
    }
    let response: Response = serde_json::from_str(&answer)
        .map_err(|e| Error::Refused(format!("the daemon sent a bad answer ({e}): {answer:?}")))?;
    response.into_result()
}
