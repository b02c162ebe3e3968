//! `ratelimit stats`: the program's counters by reason, with per-second
//! rates, and its events. Built by `daemon::read::stats_of` for a running
//! daemon and for the pins; printed by the CLI as a table.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Number;

use super::Offline;

/// Counters by reason, and events.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Stats {
    /// The interface.
    pub iface: String,
    /// One row per [`ratelimit_common::Reason`], in its order.
    pub reasons: Vec<ReasonCount>,
    /// Each [`ratelimit_common::Event`] by name: how many times.
    pub events: BTreeMap<String, u64>,
    /// CrowdSec's decisions by origin, with their drops (a daemon run with
    /// `--crowdsec`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub crowdsec: Vec<crate::crowdsec::OriginStatus>,
    /// The drop log (`ratelimit log`): its budget and counts.
    #[serde(default)]
    pub drop_log: super::DropLogStatus,
    /// Where the pins are, when read from them with no daemon.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pins: Option<String>,
    /// Read from the pins with no daemon.
    #[serde(flatten)]
    pub offline: Option<Offline>,
}

/// Frames counted under one reason since the maps were created.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ReasonCount {
    /// The reason's name.
    pub reason: String,
    /// Frames.
    pub packets: u64,
    /// Their bytes.
    pub bytes: u64,
    /// Frames per second lately; null when there is no reading to compare.
    pub packets_per_s: Option<Number>,
    /// Bytes per second lately.
    pub bytes_per_s: Option<Number>,
}
