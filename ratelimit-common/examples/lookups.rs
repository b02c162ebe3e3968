//! A whois-like lookup service: 60 lookups per 60 s per client, as a token bucket
//! refilled with 60 tokens every 60 s (interval refill).
//!
//! `cargo run -p ratelimit-common --features std --example lookups`
use std::time::Duration;

use ratelimit_common::{
    interval,
    keyed::{Algorithm, FakeClock, Limiter},
};

fn main() {
    let clock = FakeClock::default();
    let minute = 60_000_000_000;
    let params = interval::Params::new(minute, 60, 60).expect("valid limit");
    let lookups: Limiter<&str, FakeClock> =
        Limiter::with_clock(Algorithm::Interval(params), 100_000, clock.clone());
    // A client asks for 100 lookups in a burst: 60 are served.
    let served = (0..100).filter(|_| lookups.check(&"198.18.0.7")).count();
    println!("burst of 100: {served} served");
    clock.advance(Duration::from_secs(59));
    println!(
        "59 s later: {}",
        if lookups.check(&"198.18.0.7") {
            "served"
        } else {
            "refused (refill at 60 s)"
        }
    );
    clock.advance(Duration::from_secs(1));
    let served = (0..100).filter(|_| lookups.check(&"198.18.0.7")).count();
    println!("60 s after the first: {served} served");
}
