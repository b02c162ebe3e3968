//! What the daemon (`ratelimit-user`) and the throttling service
//! (`ratelimit-serve`) take from the host alike, and nothing of either: no
//! BPF, no Redis, no HTTP. A small crate so that the service's binary holds
//! nothing of the packet limiter and the daemon's nothing of the service.
//!
//! - [`input`]: the files an operator names, read bounded.
//! - [`config_file`]: a config file's errors, each at its line.
//! - [`rate`]: rates, bursts, durations and sizes as users write them.
//! - [`listen`]: addresses to listen on.
//! - [`slots`]: the connection slots of a listener, the open-file limit.
//! - [`logs`]: the log subscriber, and errors logged at most so often.
//! - [`serve_args`]: the service's command line, which both binaries parse.
//! - [`shutdown_signal`]: SIGINT or SIGTERM, for a graceful stop.
//!
//! A value that is not valid is an [`Invalid`]: the field as the user wrote
//! it, and what was wrong with the forms accepted.

pub mod config_file;
pub mod input;
pub mod listen;
pub mod logs;
pub mod rate;
pub mod serve_args;
pub mod slots;

/// A value given by the user is not valid: nothing was changed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {message}")]
pub struct Invalid {
    /// The option, config key or argument, as the user wrote it.
    pub field: String,
    /// What was wrong and which forms are accepted.
    pub message: String,
}

impl Invalid {
    /// The value of `field` is wrong: `message` says why and what is accepted.
    pub fn new(field: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            field: field.into(),
            message: message.into(),
        }
    }
}

/// An error and every error it came from, on one line: `a: b: c`. What the
/// daemon logs and the service reports, so that an errno is never lost
/// behind "writing map X failed".
pub fn chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let text = s.to_string();
        if !out.ends_with(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        source = s.source();
    }
    out
}

/// This crate's result type.
pub type Result<T, E = Invalid> = std::result::Result<T, E>;

/// Completes on SIGINT or SIGTERM.
pub async fn shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut int), Ok(mut term)) = (
        signal(SignalKind::interrupt()),
        signal(SignalKind::terminate()),
    ) else {
        // Without handlers the default action (exit) applies.
        return std::future::pending().await;
    };
    tokio::select! {
        _ = int.recv() => {}
        _ = term.recv() => {}
    }
}
