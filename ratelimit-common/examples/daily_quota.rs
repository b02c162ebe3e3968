//! 10 000 requests per rolling day with at most 1 000 per hour (a rolling
//! window with a rate cap), with batches acquired and the unused part of each
//! refunded.
//!
//! `cargo run -p ratelimit-common --features std --example daily_quota`
use std::time::Duration;

use ratelimit_common::{
    keyed::{Algorithm, FakeClock, Limiter},
    rolling_quota,
};

fn main() {
    let clock = FakeClock::default();
    let hour: u64 = 3_600_000_000_000;
    let params = rolling_quota::Params::new(24 * hour, hour, 10_000, 1_000).expect("valid quota");
    let api: Limiter<&str, FakeClock> =
        Limiter::with_clock(Algorithm::RollingQuota(params), 100_000, clock.clone());
    let mut total = 0;
    for h in 0..30 {
        // Each hour the client asks for 1 200 in batches of 100 and uses 90 of each.
        let mut used = 0;
        for _ in 0..12 {
            let g = api.acquire(&"client-42", 100);
            let use_now = g.granted.min(90);
            api.refund(&"client-42", g.granted - use_now);
            used += use_now;
        }
        total += used;
        if h % 6 == 5 || h >= 24 {
            println!("hour {h:2}: used {used:4} this hour, {total:5} in all");
        }
        clock.advance(Duration::from_nanos(hour));
    }
}
