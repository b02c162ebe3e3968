//! `ratelimit top`: the sources dropped most, now; and `top --fleet`, the
//! fleet's use of each key of the fleet-wide rules. The daemon's loop
//! answers [`Drops`] (a reading of the drop counters) and [`FleetRules`];
//! its control server makes [`Top`] from two readings and [`FleetTop`] from
//! Redis, so the loop never waits.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::Offline;
use crate::fleet::RuleUse;

/// Drop counts by source now: a source's address, or a network (`ADDR/LEN`)
/// for a rule's key levels.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Drops {
    /// The interface.
    pub iface: String,
    /// Frames dropped (counted one in 16, ×16), by source.
    pub drops: BTreeMap<String, u64>,
    /// The key level of the sources that are not level 1 (2 or 3).
    pub levels: BTreeMap<String, u8>,
}

/// The sources dropped most, by their drop rate over a short window.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Top {
    /// The interface.
    pub iface: String,
    /// How long the drop counters were watched, s.
    pub window_s: f64,
    /// The sources, the most dropped first.
    pub top: Vec<TopRow>,
    /// Where the pins are, when read from them with no daemon.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pins: Option<String>,
    /// Read from the pins with no daemon.
    #[serde(flatten)]
    pub offline: Option<Offline>,
}

/// A source (or a network, at a key level) and its drops.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TopRow {
    /// The address, or `ADDR/LEN` for a network.
    pub source: String,
    /// 1: the source's own level (or a deny); 2 and 3: a rule's key levels.
    pub level: u8,
    /// Frames dropped, in all.
    pub dropped: u64,
    /// Frames dropped per second over the window.
    pub dropped_per_s: u64,
}

/// The fleet's Redis and the names of the fleet-wide rules.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct FleetRules {
    /// The Redis the fleet shares.
    pub redis: String,
    /// The fleet-wide rules: `default` or a selector.
    pub rules: Vec<String>,
}

/// `top --fleet`: each fleet-wide rule's keys, by what the fleet admitted.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct FleetTop {
    /// The Redis the fleet shares.
    pub redis: String,
    /// Each fleet-wide rule.
    pub rules: Vec<RuleUse>,
}
