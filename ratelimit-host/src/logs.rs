//! The logs every program of the project writes: the `tracing` subscriber on
//! stderr ([`init`]), and a repeated error logged at most once per
//! [`LOG_EVERY`] ([`QuietLog`]).

use std::{
    io::IsTerminal as _,
    time::{Duration, Instant},
};

use tracing_subscriber::EnvFilter;

/// Logs to stderr, filtered by `RATELIMIT_LOG` (env-filter syntax, default
/// `info`); coloured only on a terminal, and never when `NO_COLOR` is set
/// (<https://no-color.org>), so journald and log files get plain text. A log
/// line that cannot be written (stderr closed: `ratelimit run 2>&1 | head`)
/// is dropped: the subscriber's own report of it would go to stderr too, and
/// panic there.
pub fn init() {
    tracing_subscriber::fmt()
        .with_env_filter(
            EnvFilter::try_from_env("RATELIMIT_LOG").unwrap_or_else(|_| EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .log_internal_errors(false)
        .with_ansi(colour(
            std::io::stderr().is_terminal(),
            std::env::var_os("NO_COLOR"),
        ))
        .init();
}

/// Whether to colour: on a terminal, unless `NO_COLOR` is set to anything
/// but the empty string.
fn colour(terminal: bool, no_color: Option<std::ffi::OsString>) -> bool {
    terminal && no_color.is_none_or(|v| v.is_empty())
}

/// A repeated error is logged at most this often.
pub const LOG_EVERY: Duration = Duration::from_secs(10);

/// Logs an error at most once per [`LOG_EVERY`], with how many were not.
pub struct QuietLog {
    last: Option<Instant>,
    skipped: u64,
}

impl Default for QuietLog {
    fn default() -> Self {
        Self::new()
    }
}

impl QuietLog {
    /// A fresh one.
    pub const fn new() -> Self {
        Self {
            last: None,
            skipped: 0,
        }
    }

    /// Logs `what` unless one was logged less than [`LOG_EVERY`] ago.
    pub fn warn(&mut self, what: &str, error: &dyn std::fmt::Display) {
        if self.last.is_some_and(|t| t.elapsed() < LOG_EVERY) {
            self.skipped += 1;
            return;
        }
        tracing::warn!(error = %error, repeated = self.skipped, "{what}");
        self.last = Some(Instant::now());
        self.skipped = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::colour;

    #[test]
    fn colour_only_on_a_terminal_and_without_no_color() {
        assert!(colour(true, None));
        assert!(!colour(false, None), "a pipe or journald got colour");
        assert!(!colour(true, Some("1".into())), "NO_COLOR=1 ignored");
        // no-color.org: an empty NO_COLOR does not count.
        assert!(colour(true, Some("".into())));
    }
}
