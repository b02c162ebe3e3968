//! Login attempts per user: 5 per minute with a burst of 5 (GCRA). A user who
//! hammers the login form is told how long to wait; others are not affected.
//!
//! `cargo run -p ratelimit-common --features std --example logins`
use std::{error::Error, time::Duration};

use ratelimit_common::keyed::{Algorithm, FakeClock, Limiter};

fn main() -> Result<(), Box<dyn Error>> {
    let clock = FakeClock::default();
    // A refused limit is an error `?` takes, as in docs/concepts/algorithms.md.
    let per_minute = Algorithm::per(5, Duration::from_secs(60), 5)?;
    let logins: Limiter<String, FakeClock> =
        Limiter::with_clock(per_minute, 100_000, clock.clone());
    for attempt in 1..=7 {
        let d = logins.decide(&"mallory".to_string(), 1);
        if d.allowed {
            println!("mallory attempt {attempt}: checked ({} left)", d.remaining);
        } else {
            println!(
                "mallory attempt {attempt}: refused, retry in {:.0} s",
                Duration::from_nanos(d.retry_after_ns).as_secs_f64()
            );
        }
    }
    println!(
        "alice: {}",
        if logins.check(&"alice".to_string()) {
            "checked"
        } else {
            "refused"
        }
    );
    clock.advance(Duration::from_secs(12));
    println!(
        "mallory 12 s later: {}",
        if logins.check(&"mallory".to_string()) {
            "checked"
        } else {
            "refused"
        }
    );
    Ok(())
}
