//! The daemon on one side of a veth pair, real traffic from the other, counted by
//! a receiver of our own (not the limiter's counters).
//!
//! Its tests by subject beside this file, what they share here.

mod attach;
mod connections;
mod floods;
mod limits;
mod rules;
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
