//! The control socket: one JSON request per line from the CLI, one JSON response
//! per line from the daemon. The socket is `RUN_DIR/<iface>.sock`, mode 0600.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use tokio::{
    io::{AsyncBufReadExt, AsyncWriteExt, BufReader},
    net::UnixStream,
};

use crate::{
    config::RawLimit,
    error::{Error, Result},
};

/// Where daemons keep their lock, socket and state files. `RATELIMIT_RUN_DIR`
/// overrides it (tests).
pub fn run_dir() -> PathBuf {
    std::env::var_os("RATELIMIT_RUN_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/run/ratelimit"))
}

/// The control socket of the daemon on `iface`.
pub fn socket_path(iface: &str) -> PathBuf {
    run_dir().join(format!("{iface}.sock"))
}

/// A request from the CLI.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(tag = "cmd", rename_all = "kebab-case")]
pub enum Request {
    /// Set a limit on `target` (`default` or a CIDR).
    Set {
        /// `default` or a CIDR.
        target: String,
        /// The limit, as the CLI wrote it.
        limit: Box<RawLimit>,
    },
    /// Exempt a CIDR.
    Allow {
        /// The CIDR.
        cidr: String,
    },
    /// Drop everything from a CIDR.
    Deny {
        /// The CIDR.
        cidr: String,
    },
    /// Remove the rule of a CIDR.
    Unset {
        /// The CIDR.
        cidr: String,
    },
    /// The rules.
    List,
    /// What runs and how.
    Status,
    /// Counters by reason.
    Stats,
    /// Sources with the most drops.
    Top {
        /// How many.
        n: usize,
    },
}

/// The daemon's answer.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Response {
    /// Whether the request was carried out.
    pub ok: bool,
    /// Why not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// The answer.
    #[serde(default)]
    pub data: serde_json::Value,
}

/// Finds the interface of the only running daemon, for commands without `--iface`.
pub fn only_daemon() -> Result<String> {
    let dir = run_dir();
    let mut found = Vec::new();
    if let Ok(entries) = std::fs::read_dir(&dir) {
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if let Some(iface) = name.strip_suffix(".sock") {
                found.push(iface.to_string());
            }
        }
    }
    found.sort();
    match found.len() {
        0 => Err(Error::Refused(format!(
            "no ratelimit daemon is running (no socket in {}); start one with `ratelimit run --iface IFACE`",
            dir.display()
        ))),
        1 => Ok(found.remove(0)),
        _ => Err(Error::invalid(
            "--iface",
            format!(
                "daemons run on {}: say which with --iface",
                found.join(", ")
            ),
        )),
    }
}

/// Sends one request to the daemon on `iface` and returns its data, or its error.
pub async fn call(iface: &str, request: &Request) -> Result<serde_json::Value> {
    let path = socket_path(iface);
    let stream = UnixStream::connect(&path)
        .await
        .map_err(|_| Error::NoDaemon {
            iface: iface.to_string(),
            socket: path.clone(),
        })?;
    exchange(stream, &path, request).await
}

async fn exchange(stream: UnixStream, path: &Path, request: &Request) -> Result<serde_json::Value> {
    let (read, mut write) = stream.into_split();
    let mut line = serde_json::to_string(request).expect("requests serialize");
    line.push('\n');
    let ctx = || format!("talking to the daemon on {}", path.display());
    write
        .write_all(line.as_bytes())
        .await
        .map_err(Error::io(ctx()))?;
    let mut answer = String::new();
    BufReader::new(read)
        .read_line(&mut answer)
        .await
        .map_err(Error::io(ctx()))?;
    let response: Response = serde_json::from_str(&answer)
        .map_err(|e| Error::Refused(format!("the daemon sent a bad answer ({e}): {answer:?}")))?;
    if response.ok {
        Ok(response.data)
    } else {
        Err(Error::Refused(
            response.error.unwrap_or_else(|| "refused".into()),
        ))
    }
}
