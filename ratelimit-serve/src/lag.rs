//! How late the service's own runtime runs: a task that wakes every
//! [`TICK`] and notes how late each wake-up came. A Redis call that timed out
//! while the runtime was late by [`STARVED`] or more may have had its answer
//! waiting in the socket, unread: its failure is the service's (starved of
//! CPU: a flood of requests to decode, a loaded host, the process stopped),
//! not Redis's. [`super::decide`] asks [`Lag::starved_since`] before it
//! blames Redis: such a call is answered 503 all the same, but it is counted
//! as `ratelimit_serve_starved_calls`, not as Redis's error, and it does not
//! open Redis's breaker (which would answer everyone 503 for a Redis that is
//! up).

use std::{
    sync::{
        Arc, Mutex, PoisonError,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

/// How often the watch wakes. 100 wake-ups a second cost nothing measurable.
pub(super) const TICK: Duration = Duration::from_millis(10);

/// A wake-up this late means the runtime was starved: a fifth of
/// [`ratelimit_redis::RESPONSE_TIMEOUT`], far above the timer's millisecond
/// and the scheduler's usual delays.
pub(super) const STARVED: Duration = Duration::from_millis(100);

/// What the watch saw.
pub(super) struct Lag {
    origin: Instant,
    /// The watch's last wake-up, µs since `origin`.
    last: AtomicU64,
    /// The last starved stretch: when it ended and how long it lasted.
    stall: Mutex<Option<(Instant, Duration)>>,
}

impl Lag {
    /// A watch that notes nothing yet (see [`Lag::watch`]).
    pub(super) fn new() -> Arc<Self> {
        Arc::new(Self {
            origin: Instant::now(),
            last: AtomicU64::new(0),
            stall: Mutex::new(None),
        })
    }

    /// Starts the watch on the current runtime; it ends with the runtime.
    pub(super) fn watch(self: &Arc<Self>) {
        let me = self.clone();
        tokio::spawn(async move {
            loop {
                let before = Instant::now();
                tokio::time::sleep(TICK).await;
                me.woke(before.elapsed().saturating_sub(TICK));
            }
        });
    }

    fn stall(&self) -> std::sync::MutexGuard<'_, Option<(Instant, Duration)>> {
        self.stall.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A wake-up `late` after it was due (the watch's; tests call it too).
    pub(super) fn woke(&self, late: Duration) {
        let now = Instant::now();
        self.last.store(
            now.duration_since(self.origin).as_micros() as u64,
            Ordering::Release,
        );
        if late >= STARVED {
            *self.stall() = Some((now, late));
        }
    }

    /// How late the runtime ran since `start` (a Redis call's), if it was
    /// starved since: a late wake-up that ended after `start`, or a watch
    /// that has not woken for [`STARVED`] (the runtime is starved now).
    pub(super) fn starved_since(&self, start: Instant) -> Option<Duration> {
        let now = Instant::now();
        let last = self.origin + Duration::from_micros(self.last.load(Ordering::Acquire));
        // The watch sleeps a tick between wake-ups.
        let silent = now.saturating_duration_since(last).saturating_sub(TICK);
        let stalled = match *self.stall() {
            Some((end, late)) if end >= start => late,
            _ => Duration::ZERO,
        };
        let late = silent.max(stalled);
        (late >= STARVED).then_some(late)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A runtime whose one thread is kept busy is starved, during the call
    /// and after; a call that begins once the watch has woken on time is
    /// not. (No assertion waits on the machine being idle: each bound is
    /// the busy stretch itself, or a wake-up the test makes.)
    #[test]
    fn a_busy_runtime_is_seen_starved_and_a_later_call_is_not() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
        rt.block_on(async {
            let lag = Lag::new();
            lag.watch();
            tokio::time::sleep(Duration::from_millis(50)).await;
            let start = Instant::now();
            // The one thread busy for 300 ms: nothing else runs, the watch
            // included.
            std::thread::sleep(Duration::from_millis(300));
            let now = lag.starved_since(start).expect("starved right now");
            assert!(now >= Duration::from_millis(250), "{now:?}");
            // Once the watch has woken, the stall is remembered for calls
            // that began before it ended.
            tokio::time::sleep(Duration::from_millis(50)).await;
            let then = lag.starved_since(start).expect("starved during the call");
            assert!(then >= Duration::from_millis(250), "{then:?}");
            // A call that begins after a wake-up on time is not starved.
            lag.woke(Duration::ZERO);
            assert_eq!(lag.starved_since(Instant::now()), None, "a later call");
        });
    }
}
