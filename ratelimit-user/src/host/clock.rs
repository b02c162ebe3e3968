//! The wall clock, for what outlives a daemon: when a temporary rule ends
//! (kept across restarts), the fleet's membership stamps.

use std::time::{SystemTime, UNIX_EPOCH};

/// Now on the wall clock, Unix ms (0 before 1970).
pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}
