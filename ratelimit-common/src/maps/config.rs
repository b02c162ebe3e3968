//! The global config the daemon writes last (the switch to a new rule
//! set) and the match groups a trie entry may point at.

use super::*;
use crate::gcra;

/// Bits of [`Config::flags`].
pub mod config_flags {
    /// Dry run for every rule: never drop, count would-drops.
    pub const DRY_RUN: u32 = 1 << 0;
    /// Drop malformed IP frames (default: pass them).
    pub const DROP_MALFORMED: u32 = 1 << 1;
    /// Decide on `bpf_ktime_get_coarse_ns` (the time of the last scheduler
    /// tick) instead of `bpf_ktime_get_ns`: cheaper, and over any span T a key
    /// is admitted at most burst + rate × (T + one tick).
    pub const COARSE_CLOCK: u32 = 1 << 2;
    /// Allowlist-only mode: every frame not under an `allow` rule is dropped
    /// ([`super::Reason::NotAllowed`]).
    pub const ALLOWLIST_ONLY: u32 = 1 << 3;
    /// A frame the program cannot judge is dropped: more VLAN tags than
    /// [`super::MAX_VLAN_TAGS`] or an IPv6 chain longer than
    /// [`super::MAX_EXT_HEADERS`] ([`super::Reason::Unjudged`]), a tiny first
    /// fragment ([`super::Reason::TinyFragment`]), and a frame whose transport
    /// header a match needs but cannot read (under the group's
    /// [`super::MatchGroup::unjudged`] rule, a deny). The daemon's default.
    /// Without this bit or [`UNJUDGED_PASS`] (`next-rule`), such frames are
    /// judged by the rules that need nothing they hide, and frames without a
    /// source to judge (too many tags) are dropped.
    pub const UNJUDGED_DROP: u32 = 1 << 4;
    /// A frame the program cannot judge is passed: a frame with too many tags
    /// (counted `allowed`) and, under a match that needs what it hides, any
    /// other (under an allow rule). Not in allowlist-only mode, where it acts
    /// as `next-rule`.
    pub const UNJUDGED_PASS: u32 = 1 << 5;
    /// A non-first fragment (no ports, no TCP flags) under a match that needs
    /// them is dropped (under the group's [`super::MatchGroup::fragments`]
    /// rule, a deny). Without it, the next rule of its source that needs
    /// neither judges it: safe, since its first fragment is judged whole.
    pub const FRAGMENTS_DROP: u32 = 1 << 6;
}

/// Bit of a [`MAP_RULES`] value: the rest is an index into [`MAP_GROUPS`], not
/// [`MAP_RULE_TABLE`] (the prefix has rules with matches).
pub const GROUP_BIT: u32 = 1 << 31;
/// Rules one source can meet in order: its prefix's own, then those of the
/// prefixes around it, down to a rule without matches.
pub const MAX_MATCHES: usize = 8;
/// Match groups per half of [`MAP_GROUPS`]: prefixes with rules that match
/// more than the source.
pub const GROUPS_CAPACITY: u32 = 1024;

/// Bits of [`MatchEntry::fields`]: what an entry matches besides the source.
pub mod match_fields {
    /// The destination: [`super::MatchEntry::dest`] under `dest_mask`.
    pub const DEST: u8 = 1 << 0;
    /// The transport protocol.
    pub const PROTO: u8 = 1 << 1;
    /// The destination ports (TCP or UDP): one of
    /// [`super::MatchEntry::ports`]' ranges.
    pub const PORTS: u8 = 1 << 2;
    /// TCP with SYN and without ACK (a connection's first frame).
    pub const SYN: u8 = 1 << 3;
    /// The ICMP (or ICMPv6) type.
    pub const ICMP_TYPE: u8 = 1 << 4;
    /// The entry is a rule of the group's own prefix, not inherited from a
    /// prefix around it (for reading rules back).
    pub const OWN: u8 = 1 << 7;
    /// Fields only the transport header shows.
    pub const NEEDS_HEADER: u8 = PORTS | SYN | ICMP_TYPE;
}

/// One rule of a [`MatchGroup`]: what it matches and its rule's index in
/// [`MAP_RULE_TABLE`].
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct MatchEntry {
    /// The destination network (masked), as [`Words`].
    pub dest: Words,
    /// The destination mask.
    pub dest_mask: Words,
    /// Index in [`MAP_RULE_TABLE`].
    pub rule: u32,
    /// Bits of [`match_fields`].
    pub fields: u8,
    /// The transport protocol (IANA number).
    pub proto: u8,
    /// The ICMP type.
    pub icmp_type: u8,
    /// Ranges of [`MatchEntry::ports`] in use (1 ..= [`MAX_PORT_RANGES`]
    /// under [`match_fields::PORTS`]).
    pub port_ranges: u8,
    /// Destination port ranges, inclusive, host order, sorted and apart: a
    /// frame's port in any of the first [`MatchEntry::port_ranges`] matches.
    pub ports: [PortRange; MAX_PORT_RANGES],
}
const _: () = assert!(core::mem::size_of::<MatchEntry>() == 40 + 4 * MAX_PORT_RANGES);

/// Destination ports, inclusive, host order: `first == last` for one port.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, Hash, PartialOrd, Ord)]
pub struct PortRange {
    /// The first port.
    pub first: u16,
    /// The last port (inclusive).
    pub last: u16,
}

/// Ranges one rule's port set may have (`--dport 22,80,443,8000-8100` is
/// four): the program tries them in turn, so a frame pays for those before
/// its own.
pub const MAX_PORT_RANGES: usize = 16;

/// Value of [`MAP_GROUPS`]: the rules a source under one prefix can meet,
/// most specific first; the first that matches judges the frame. The last is
/// a rule without matches (the prefix's own, one around it, or the default).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct MatchGroup {
    /// Entries in use.
    pub count: u32,
    /// Index in [`MAP_RULE_TABLE`] of the rule for a frame a match cannot
    /// judge, or [`NO_RULE`] to go on to the next entry.
    pub unjudged: u32,
    /// Index in [`MAP_RULE_TABLE`] of the rule for a non-first fragment a
    /// match cannot judge, or [`NO_RULE`] to go on to the next entry.
    pub fragments: u32,
    /// Zero.
    pub _pad: u32,
    /// The rules, most specific first; `count` of them in use.
    pub entries: [MatchEntry; MAX_MATCHES],
}
const _: () =
    assert!(core::mem::size_of::<MatchGroup>() == 16 + (40 + 4 * MAX_PORT_RANGES) * MAX_MATCHES);

/// No rule: what a lookup returns when nothing matches.
pub const NO_RULE: u32 = u32::MAX;

/// Value of [`MAP_CONFIG`]: global runtime settings. Written by the daemon.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Config {
    /// Bits of [`config_flags`].
    pub flags: u32,
    /// Number of entries in the active rule trie; 0 lets the program skip the
    /// trie lookup.
    pub rule_count: u32,
    /// The doorkeeper's hash seed: random, picked by the daemon when it creates
    /// the maps, so that nobody can aim hash collisions at a source.
    pub hash_seed: u64,
    /// Doorkeeper slots − 1 (the slot count is a power of two).
    pub seen_mask: u32,
    /// Index in [`MAP_RULE_TABLE`] of the default rule: the rule for sources no
    /// prefix matches.
    pub default_rule: u32,
    /// The cap on states created per second, all rules together (packets =
    /// promotions): what a flood of sources that each repeat can cost in
    /// inserts and evictions. State in [`GlobalState::new_states`].
    pub new_states: gcra::Params,
    /// Which rule trie the program reads: 0 [`MAP_RULES`], 1 [`MAP_RULES_B`].
    pub active_rules: u32,
    /// The host's ephemeral port range (`net.ipv4.ip_local_port_range`),
    /// inclusive, as `first << 16 | last`, host order: where the host's own
    /// outgoing connections have their local port. 0: none (no frame is taken
    /// for a host connection).
    pub local_ports: u32,
    /// The drop log's budget: records per second per CPU at most
    /// ([`crate::admit`]); 0: off, dropped frames are not logged.
    pub drop_log_rate: u32,
    /// IPv4 lines of [`crate::MAP_TABLE`] less one (a power of two less
    /// one): the mask of [`crate::table::lines`] for IPv4 keys, whose lines
    /// come first.
    pub state_mask: u32,
    /// IPv6 lines of [`crate::MAP_TABLE`] less one, after the IPv4 lines.
    pub state6_mask: u32,
    /// Zero.
    pub _pad: u32,
}
const _: () = assert!(core::mem::size_of::<Config>() == 96);

impl Config {
    /// The table's region for keys of family `fam` ([`crate::table::region`]).
    #[inline(always)]
    pub const fn region(&self, fam: u8) -> u64 {
        if fam == crate::family::V4 {
            crate::table::region(self.state_mask, 0)
        } else {
            crate::table::region(self.state6_mask, self.state_mask.wrapping_add(1))
        }
    }
}
