//! `ratelimit log`: dropped frames the program logged (sampled within its
//! budget per CPU), as the daemon keeps the last of them, after a cursor.
//! Built by the daemon's handler from its buffer (`daemon/droplog.rs`), read
//! by the CLI's printer; `--json` prints each [`DropEntry`] as a line.

use serde::{Deserialize, Serialize};

/// Entries after a cursor, and the log's counts.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DropLog {
    /// The interface.
    pub iface: String,
    /// The budget: `100/s` (records a second per CPU) or `off`.
    pub drop_log: String,
    /// The entries, oldest first.
    pub entries: Vec<DropEntry>,
    /// The cursor for the next request: the entries from this sequence
    /// number on are new.
    pub next: u64,
    /// Entries after the cursor asked for that the daemon no longer keeps
    /// (it keeps the last [`crate::daemon::droplog::KEPT`]).
    pub missed: u64,
    /// Records the program wrote since the maps were created, all CPUs.
    pub written: u64,
    /// Drops not logged: over the budget (counted, never written).
    pub skipped: u64,
    /// Records lost to a full ring buffer (the daemon did not read in time).
    pub lost: u64,
}

/// One dropped frame.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DropEntry {
    /// Its sequence number in this daemon's log, from 0.
    pub seq: u64,
    /// When it was dropped: RFC 3339, UTC, to the millisecond.
    pub time: String,
    /// When it was dropped, Unix ms.
    pub time_ms: u64,
    /// The source address (an IPv4-mapped IPv6 source as IPv4); absent when
    /// the frame showed none.
    pub source: Option<String>,
    /// The rule that judged it, as `list` names it (`default`, a CIDR and
    /// its match); `list` for a list's entry; `-` when no rule judged it
    /// (a frame that could not be judged); `(removed rule)` for a rule gone
    /// since.
    pub rule: String,
    /// The reason that dropped it, as the counters name it (`limited`,
    /// `denied`, `new_source_limited`, …).
    pub reason: String,
    /// Dry run: it was passed; `reason` would have dropped it.
    pub dry_run: bool,
    /// The transport protocol (`tcp`, `udp`, `icmp`, `icmpv6`, or its
    /// number), when the frame showed it.
    pub proto: Option<String>,
    /// The destination port (TCP, UDP), when the frame showed it.
    pub dport: Option<u16>,
    /// The frame's length from the Ethernet header on, bytes.
    pub len: u32,
}

/// The drop log in `status` and `stats`: its budget and counts.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DropLogStatus {
    /// `100/s` (records a second per CPU) or `off`.
    pub rate: String,
    /// Records the program wrote since the maps were created, all CPUs.
    pub written: u64,
    /// Drops not logged: over the budget.
    pub skipped: u64,
    /// Records lost to a full ring buffer.
    pub lost: u64,
}
