//! The logs: the `tracing` subscriber every command writes to stderr with
//! ([`init`], shared with the service: [`ratelimit_host::logs`]), and the XDP
//! program's aya-log records (rare events only: nothing is logged per
//! packet), forwarded into it under the target `ratelimit::xdp`.

use aya_log::EbpfLogger;
use tokio::io::unix::AsyncFd;
use tracing::warn;

pub use ratelimit_host::logs::{LOG_EVERY, QuietLog, init};

/// A `log::Log` that re-emits records through `tracing`.
pub struct TracingLog;

impl log::Log for TracingLog {
    fn enabled(&self, _: &log::Metadata<'_>) -> bool {
        true
    }

    fn log(&self, record: &log::Record<'_>) {
        let msg = record.args();
        match record.level() {
            log::Level::Error => tracing::error!(target: "ratelimit::xdp", "{msg}"),
            log::Level::Warn => tracing::warn!(target: "ratelimit::xdp", "{msg}"),
            log::Level::Info => tracing::info!(target: "ratelimit::xdp", "{msg}"),
            log::Level::Debug => tracing::debug!(target: "ratelimit::xdp", "{msg}"),
            log::Level::Trace => tracing::trace!(target: "ratelimit::xdp", "{msg}"),
        }
    }

    fn flush(&self) {}
}

/// Polls the program's log ring buffer in the background for the daemon's life.
pub fn forward(logger: EbpfLogger<TracingLog>) {
    // SAFETY: the fd is the logger's ring buffer map, owned by the logger, which
    // the AsyncFd owns for as long as it is registered.
    match unsafe { AsyncFd::register_with_interest(logger, tokio::io::Interest::READABLE) } {
        Ok(mut fd) => {
            tokio::spawn(async move {
                loop {
                    let Ok(mut guard) = fd.readable_mut().await else {
                        return;
                    };
                    guard.get_inner_mut().flush();
                    guard.clear_ready();
                }
            });
        }
        Err(e) => warn!(error = %e, "cannot poll the XDP program's log records"),
    }
}
