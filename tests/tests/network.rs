//! The daemon on one side of a veth pair, real traffic from the other, counted by
//! a receiver of our own (not the limiter's counters).
//!
//! One test binary (cargo links one per file directly in `tests/`): its tests
//! by subject in `network/`, what they share here. A test root looks for its
//! modules beside itself, hence the `#[path]`s.

#[path = "network/attach.rs"]
mod attach;
#[path = "network/connections.rs"]
mod connections;
#[path = "network/floods.rs"]
mod floods;
#[path = "network/limits.rs"]
mod limits;
#[path = "network/rules.rs"]
mod rules;
#[path = "network/wrapped.rs"]
mod wrapped;

use ratelimit_tests::{Daemon, check::counter, net::Sent};

const PORT: u16 = 5001;

/// Admitted by a bucket of `burst` at `rate`/s over what was sent.
fn expected(sent: &Sent, rate: f64, burst: f64) -> f64 {
    let span = sent.last.duration_since(sent.first).as_secs_f64();
    (burst + rate * span).min(sent.frames as f64)
}

fn stat(d: &Daemon, reason: &str) -> u64 {
    counter(&d.json(&["stats"]), reason)
}
