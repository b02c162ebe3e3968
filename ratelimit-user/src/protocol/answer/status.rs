//! `ratelimit status`: what runs and how. One answer for a running daemon
//! and for a program read from its pins with no daemon; what only a running
//! daemon knows is [`Running`], absent from the pins' answer. Built by
//! `daemon::read::status_of`, printed by the CLI one field a line.

use serde::{Deserialize, Serialize};

use super::Offline;
use crate::{
    fleet,
    kernel::Attached,
    model::rules::{Clock, Mode},
};

/// What runs and how.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Status {
    /// The interface.
    pub iface: String,
    /// The network namespace's inode, as `ip netns identify` shows it.
    pub netns: u64,
    /// The network namespace's cookie.
    pub netns_cookie: u64,
    /// Whether the program is attached to the interface.
    pub interface: Interface,
    /// The daemon's process; null with no daemon.
    pub pid: Option<u32>,
    /// Sources with a state, every state map together.
    pub tracked_sources: usize,
    /// IPv4 sources with a state (gcra).
    pub ipv4_sources: usize,
    /// Room for them.
    pub ipv4_capacity: u32,
    /// IPv6 sources with a state (gcra).
    pub ipv6_sources: usize,
    /// Room for them.
    pub ipv6_capacity: u32,
    /// Sources with a state under the other algorithms.
    pub wide_sources: usize,
    /// Room for them.
    pub wide_capacity: u32,
    /// Room for rules.
    pub rules_capacity: u32,
    /// Rules in force.
    pub rules: usize,
    /// Lists in force.
    pub lists: usize,
    /// Dry run for everything.
    pub dry_run: bool,
    /// Normal or allowlist-only (`ratelimit mode`).
    pub mode: Mode,
    /// The pin directory, as the operator finds it.
    pub pins: String,
    /// What the operator should know, a sentence each.
    pub notes: Vec<String>,
    /// Pin directories of network namespaces that are gone, with the kernel
    /// memory they hold (`ratelimit gc` removes them). A fact of the host,
    /// not of one daemon: the CLI adds it, where it runs.
    #[serde(default)]
    pub orphaned_pins: Vec<crate::kernel::pins::Orphan>,
    /// What only a running daemon knows.
    #[serde(flatten)]
    pub daemon: Option<Running>,
    /// Read from the pins with no daemon.
    #[serde(flatten)]
    pub offline: Option<Offline>,
}

/// Whether the program is attached to its interface.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Interface {
    /// It is, and enforces.
    Attached,
    /// The interface is gone: nothing is enforced until it comes back.
    Gone,
    /// The interface was re-created and attaching to it failed.
    #[serde(rename = "not attached")]
    NotAttached,
}

/// What a running daemon adds to its status.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Running {
    /// How the program is attached: native (in the driver) or generic.
    pub attach: Attached,
    /// Whether it adopted a program's pinned maps (rules and buckets).
    pub adopted: bool,
    /// Whether it swapped its program into a pinned link.
    pub took_over_link: bool,
    /// Seconds since it started.
    pub uptime_s: u64,
    /// The clock decisions are made on.
    pub clock: Clock,
    /// Entries of every list together.
    pub list_entries: usize,
    /// Room for them.
    pub list_capacity: u32,
    /// Whether a state map is full (a new source evicts an old one, or, in
    /// the state table, gets no state).
    pub state_map_full: bool,
    /// The state table (both families): its slots, held and active, and the
    /// new sources it had no slot for. Named `ipv4_table` before v11.
    #[serde(default)]
    pub state_table: TableStatus,
    /// States created, ever (the maps' count).
    pub states_created: u64,
    /// States refused by the cap on creations per second.
    pub new_states_capped: u64,
    /// States evicted since it started, estimated.
    pub evicted_estimate: u64,
    /// Doorkeeper slots.
    pub doorkeeper_slots: u32,
    /// Whether the program stays when it exits.
    pub keep_attached: bool,
    /// The fleet as it sees it, when run with `--fleet`.
    pub fleet: Option<fleet::Status>,
    /// The CrowdSec bouncer, when run with `--crowdsec`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub crowdsec: Option<crate::crowdsec::Status>,
    /// The drop log (`ratelimit log`): its budget and counts.
    #[serde(default)]
    pub drop_log: super::DropLogStatus,
    /// Entries of the pinned maps found different from what it wrote (a
    /// hand's edit) and put back, since it started.
    #[serde(default)]
    pub drift_repaired: u64,
}

/// The state table in [`Running`]: a key keeps its slot until another
/// key needs it, so slots held include idle ones; only active slots (a
/// bucket not full) are never given away.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TableStatus {
    /// Slots in all (two per source of `--max-sources` and of
    /// `--max-sources-v6`).
    pub slots: u64,
    /// Slots holding a key.
    pub held: u64,
    /// Slots whose bucket is not full now.
    pub active: u64,
    /// New sources (and key levels) that found no free slot in their two
    /// lines, ever: judged as new sources (`state_full`).
    pub refused: u64,
}
