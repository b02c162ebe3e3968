//! The kernel side as the daemon sees it: [`plan`] (what a rule change
//! writes, decided without touching the kernel), `maps` (the typed maps,
//! found by name: a plan executed, counters and states read back),
//! `enforcer` (loading the embedded object, attaching and pinning, adopting
//! what a previous daemon pinned, following the interface) and [`sys`] (the
//! raw `bpf(2)` commands aya does not wrap).

mod enforcer;
pub mod explain;
mod maps;
pub mod pins;
pub mod plan;
pub mod sys;

use std::fmt;

use aya::EbpfLoader;
use ratelimit_common::{
    self as common, MAP_RULE_STATE, MAP_RULE_TABLE, MAP_RULES, MAP_RULES_B, MAP_SEEN, MAP_TABLE,
};

pub use enforcer::{Enforcer, InterfaceState, Prepared, remove_pins};
pub use maps::{DropLogCounts, Maps};

/// The name of the link's pin in a daemon's pin directory.
/// The name of the pinned XDP link in a pin directory.
pub const LINK_PIN: &str = "link";

/// How to attach.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum AttachMode {
    /// Native (driver) mode, falling back to generic with a warning.
    #[default]
    Auto,
    /// Native (driver) mode only.
    Native,
    /// Generic (skb) mode only.
    Generic,
}

/// The mode a program runs in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Attached {
    /// In the driver.
    Native,
    /// In the kernel's generic path, after the skb is built.
    Generic,
}

impl Attached {
    /// Reads the name written by [`fmt::Display`].
    pub fn parse(s: &str) -> Option<Self> {
        match s.trim() {
            "native" => Some(Attached::Native),
            "generic" => Some(Attached::Generic),
            _ => None,
        }
    }
}

impl fmt::Display for Attached {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Attached::Native => "native",
            Attached::Generic => "generic",
        })
    }
}

/// Load-time settings: the sizes of the maps when they are created.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LoadOptions {
    /// IPv4 sources tracked at once (gcra).
    pub state_capacity: u32,
    /// IPv6 sources tracked at once (gcra).
    pub state_capacity_v6: u32,
    /// Rules at most.
    pub rules_capacity: u32,
    /// Blocklist and allowlist entries at most, all lists together: room in
    /// the rule tries beyond the rules (a trie allocates per entry, so room
    /// costs nothing until it is used; the rule table does not grow).
    pub list_capacity: u32,
    /// Sources tracked at once under the wide-state algorithms.
    pub wide_capacity: u32,
    /// Doorkeeper slots (a power of two).
    pub seen_slots: u32,
}

impl Default for LoadOptions {
    fn default() -> Self {
        Self {
            state_capacity: common::DEFAULT_STATE_CAPACITY,
            state_capacity_v6: common::DEFAULT_STATE_V6_CAPACITY,
            rules_capacity: common::DEFAULT_RULES_CAPACITY,
            list_capacity: common::DEFAULT_LIST_CAPACITY,
            wide_capacity: common::DEFAULT_WIDE_CAPACITY,
            seen_slots: common::DEFAULT_SEEN_SLOTS,
        }
    }
}

impl LoadOptions {
    /// Sets every map's size on `loader`.
    fn size(&self, loader: &mut EbpfLoader) {
        loader
            .map_max_entries(MAP_TABLE, self.table_lines())
            .map_max_entries(common::MAP_BORN, self.table_lines())
            .map_max_entries(MAP_RULES, self.trie_capacity())
            .map_max_entries(MAP_RULES_B, self.trie_capacity())
            .map_max_entries(MAP_RULE_TABLE, common::rule_table_len(self.rules_capacity))
            .map_max_entries(MAP_RULE_STATE, self.rules_capacity + 1)
            .map_max_entries(
                common::MAP_RULE_STATS,
                (self.rules_capacity + 1) * common::RULE_COUNTERS,
            )
            .map_max_entries(common::MAP_WIDE, self.wide_capacity)
            .map_max_entries(MAP_SEEN, self.seen_slots);
    }

    /// The sizes of the maps pinned in `dir`. A loader that adopts pins must be
    /// given them: aya checks indexes against the sizes it was told, not the
    /// pinned maps' own.
    pub fn from_pins(dir: &std::path::Path) -> crate::Result<Self> {
        let size = |name: &'static str| -> crate::Result<u32> {
            let map = aya::maps::MapData::from_pin(dir.join(name)).map_err(|source| {
                crate::Error::Map {
                    op: "opening pinned",
                    map: name,
                    source,
                }
            })?;
            map.info()
                .map(|i| i.max_entries())
                .map_err(|source| crate::Error::Map {
                    op: "reading the size of pinned",
                    map: name,
                    source,
                })
        };
        // The rule-state array has a slot per rule and the default's; the
        // tries hold the rules and the list entries.
        let rules_capacity = size(MAP_RULE_STATE)?.saturating_sub(1);
        // The state table's split between the families is the config's (written
        // before anything was pinned).
        let config = aya::maps::MapData::from_pin(dir.join(common::MAP_CONFIG))
            .map_err(|source| crate::Error::Map {
                op: "opening pinned",
                map: common::MAP_CONFIG,
                source,
            })
            .and_then(|data| {
                aya::maps::Array::<_, common::Config>::try_from(aya::maps::Map::Array(data))
                    .and_then(|a| a.get(&0, 0))
                    .map_err(|source| crate::Error::Map {
                        op: "reading pinned",
                        map: common::MAP_CONFIG,
                        source,
                    })
            })?;
        let v4_lines = config.state_mask.wrapping_add(1);
        let v6_lines = size(MAP_TABLE)?.wrapping_sub(v4_lines);
        Ok(Self {
            state_capacity: common::state_sources(v4_lines),
            state_capacity_v6: common::state_sources(v6_lines),
            rules_capacity,
            list_capacity: size(MAP_RULES)?.saturating_sub(rules_capacity),
            wide_capacity: size(common::MAP_WIDE)?,
            seen_slots: size(MAP_SEEN)?,
        })
    }

    /// These options as the maps they make read back ([`Maps::capacities`]):
    /// the state table holds a power of two of lines per family, so a
    /// capacity reads back as the sources those lines are sized for.
    pub fn as_created(&self) -> Self {
        let round = |n: u32| common::state_sources(common::state_lines(n));
        Self {
            state_capacity: round(self.state_capacity),
            state_capacity_v6: round(self.state_capacity_v6),
            ..self.clone()
        }
    }

    /// Lines of the state table: each family's ([`common::state_lines`]).
    pub fn table_lines(&self) -> u32 {
        common::state_lines(self.state_capacity) + common::state_lines(self.state_capacity_v6)
    }

    /// Entries of each rule trie: the rules and the list entries.
    pub fn trie_capacity(&self) -> u32 {
        self.rules_capacity.saturating_add(self.list_capacity)
    }

    /// A loader with every map sized.
    pub fn loader(&self) -> EbpfLoader<'static> {
        let mut loader = EbpfLoader::new();
        self.size(&mut loader);
        loader
    }
}

/// Now on the clock the program decides by: CLOCK_MONOTONIC
/// (`bpf_ktime_get_ns`), or its coarse form (`bpf_ktime_get_coarse_ns`).
pub fn program_clock_ns(clock: crate::model::rules::Clock) -> u64 {
    let id = match clock {
        crate::model::rules::Clock::Precise => libc::CLOCK_MONOTONIC,
        crate::model::rules::Clock::Coarse => libc::CLOCK_MONOTONIC_COARSE,
    };
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid out pointer.
    unsafe { libc::clock_gettime(id, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// CLOCK_MONOTONIC in ns: the clock of `bpf_ktime_get_ns`.
pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid out pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}
