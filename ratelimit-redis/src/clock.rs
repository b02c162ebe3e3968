//! Deadlines on Redis's clock, so that a call Redis reaches too late changes
//! nothing.
//!
//! A command Redis has not read yet when its caller gives up still runs when
//! Redis gets to it (after a stall, a slow log rewrite, a paused process): the
//! caller answered "failed", yet the tokens are gone. So every script call
//! carries a deadline, and the script does nothing when Redis's `TIME` is past
//! it. The deadline is on Redis's clock, which is not ours: each reply tells
//! the time Redis read while running the call, and since it read it before we
//! received the reply, `server_time − our_time_at_reply` is a lower bound of
//! the offset between the two clocks. The largest such bound seen recently is
//! the estimate; a deadline computed from it is never later, on Redis's clock,
//! than the moment we meant (up to the clocks' drift over [`WINDOW`]). A
//! reply delayed on its way back only gives a lower bound that is not the
//! largest, and changes nothing.

use std::{
    sync::{Mutex, PoisonError},
    time::{Duration, Instant},
};

/// Bounds older than this are forgotten (in two halves), so that a Redis whose
/// clock was set back is followed after at most this long; until then its
/// deadlines are later than meant, never earlier.
pub const WINDOW: Duration = Duration::from_secs(60);

/// The offset between Redis's clock and ours, as lower bounds.
pub struct Clock {
    base: Instant,
    bounds: Mutex<Bounds>,
}

#[derive(Default)]
struct Bounds {
    /// The largest bound of the current half window, and of the previous one,
    /// µs (Redis's clock minus ours).
    current: Option<i64>,
    previous: Option<i64>,
    /// When the current half began, µs on our clock.
    since: i64,
}

impl Default for Clock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock {
    /// No bound yet.
    pub fn new() -> Self {
        Self {
            base: Instant::now(),
            bounds: Mutex::default(),
        }
    }

    /// Our clock: µs since this clock was made.
    pub fn now_us(&self) -> i64 {
        self.base.elapsed().as_micros() as i64
    }

    /// Redis read `server_us` (µs since the epoch) before we received its
    /// reply at `received_us` (from [`Clock::now_us`]).
    pub fn sample(&self, server_us: u64, received_us: i64) {
        let bound = server_us as i64 - received_us;
        let mut b = self.bounds.lock().unwrap_or_else(PoisonError::into_inner);
        let half = WINDOW.as_micros() as i64 / 2;
        if received_us - b.since >= half {
            b.previous = if received_us - b.since >= 2 * half {
                None
            } else {
                b.current
            };
            b.current = None;
            b.since = received_us;
        }
        b.current = Some(b.current.map_or(bound, |c| c.max(bound)));
    }

    /// Redis's time (µs since the epoch) `after` from now on our clock, or
    /// `None` before any sample.
    pub fn deadline(&self, after: Duration) -> Option<u64> {
        let offset = {
            let b = self.bounds.lock().unwrap_or_else(PoisonError::into_inner);
            match (b.current, b.previous) {
                (Some(c), Some(p)) => c.max(p),
                (Some(c), None) => c,
                (None, Some(p)) => p,
                (None, None) => return None,
            }
        };
        let at = self.now_us() + offset + after.as_micros() as i64;
        Some(at.max(1) as u64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_largest_lower_bound_is_the_estimate() {
        let c = Clock::new();
        assert_eq!(c.deadline(Duration::from_millis(1)), None);
        // Redis is 1 000 000 µs ahead; one reply came back at once, one 3 s
        // late (a stall on the way back).
        c.sample(1_000_100, 100);
        c.sample(1_000_200, 3_000_200);
        let d = c.deadline(Duration::ZERO).unwrap() as i64;
        let ours = c.now_us();
        assert!(
            (1_000_000 + ours - d).abs() <= 1_000,
            "deadline {d} for our {ours}: the late reply pulled the estimate"
        );
    }

    #[test]
    fn a_clock_set_back_is_followed_within_the_window() {
        let c = Clock::new();
        let half = WINDOW.as_micros() as i64 / 2;
        c.sample(5_000_000, 0);
        // Redis's clock went back by 4 s: the old bound holds for a while...
        c.sample(1_000_000 + half as u64, half);
        {
            let b = c.bounds.lock().unwrap();
            assert_eq!(b.current.max(b.previous), Some(5_000_000));
        }
        // ... and is forgotten two halves later.
        c.sample(1_000_000 + 2 * half as u64, 2 * half);
        let b = c.bounds.lock().unwrap();
        assert_eq!(b.current.max(b.previous), Some(1_000_000));
    }
}
