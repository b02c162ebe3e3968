//! The maps shared by the XDP program (reader of rules, writer of state and
//! counters) and the daemon (the one writer of rules and config, reader of state and
//! counters): their names, default capacities, keys and values.
//!
//! Addresses are kept as 16 bytes in network byte order. IPv4 addresses are stored
//! IPv4-mapped (`::ffff:a.b.c.d`), so one key type and one LPM trie serve both
//! families and an IPv4 prefix `/n` is the 128-bit prefix `/(96 + n)`.

mod config;
mod counters;
mod drop_log;
mod drops;
mod fleet;
mod keys;
mod rule;
mod state;

pub use config::*;
pub use counters::*;
pub use drop_log::*;
pub use drops::*;
pub use fleet::*;
pub use keys::*;
pub use rule::*;
pub use state::*;

/// Name of the XDP program in the object.
pub const PROGRAM_NAME: &str = "ratelimit";

/// `LpmTrie<RuleAddr, u32>`: source prefixes (family byte, then the address) →
/// the index of their rule in [`MAP_RULE_TABLE`]. One of two: the daemon writes a
/// whole new rule set into the one the program does not use
/// ([`Config::active_rules`]), then switches the config to it, so a change is
/// all or nothing. Written by the daemon.
pub const MAP_RULES: &str = "RL_RULES";
/// The second rule trie (see [`MAP_RULES`]).
pub const MAP_RULES_B: &str = "RL_RULES_B";
/// `Array<Rule>`: rule values, at the indexes [`MAP_RULES`] and
/// [`Config::default_rule`] hold. Written by the daemon, copy on write: a changed
/// rule goes to a free index and the trie entry (or the config) is switched to
/// it, so the program never reads a half-written rule. Twice the rule capacity
/// plus two entries, so that every rule can change at once.
pub const MAP_RULE_TABLE: &str = "RL_RULE_TABLE";
/// `Array<table::Line>` (mmapable): one bucket per (rule or key level, masked
/// source) under a gcra rule, in a set-associative table of 64-byte lines
/// ([`crate::table`]): the IPv4 keys' lines first, then the IPv6 keys'. Written by the program, and by the daemon under
/// fleet-wide rules; read by the daemon through a mapping of its memory.
pub const MAP_TABLE: &str = "RL_TABLE";
/// `Array<table::Born>` (mmapable), beside [`MAP_TABLE`]: when each slot's
/// key got its state.
pub const MAP_BORN: &str = "RL_BORN";
/// `PerCpuArray<Counter>` indexed by [`Reason`]. Written by the program.
pub const MAP_STATS: &str = "RL_STATS";
/// `Array<Config>` of one entry: global runtime settings. Written by the daemon.
pub const MAP_CONFIG: &str = "RL_CONFIG";
/// `Array<top::TopSet>` (mmapable): frames dropped per source address or key
/// level's network, for `ratelimit top`, sampled one in [`DROP_SAMPLE`], in a
/// set-associative table of the busiest droppers ([`crate::top`]). Written by
/// the program on the drop path only; read by the daemon through a mapping
/// of its memory.
pub const MAP_DROPS: &str = "RL_DROPS";

/// `Array<u64>`: the doorkeeper's slots ([`crate::doorkeeper`]), a power of two
/// of them. Written by the program.
pub const MAP_SEEN: &str = "RL_SEEN";
/// `Array<RuleState>`: each rule's shared buckets (new sources, aggregate), at the
/// rule's [`Rule::slot`]. Written by the program; zeroed by the daemon when it
/// gives a slot to a new rule.
pub const MAP_RULE_STATE: &str = "RL_RULE_STATE";
/// `Array<GlobalState>` of one entry: buckets shared by every rule. Written by
/// the program.
pub const MAP_GLOBAL: &str = "RL_GLOBAL";
/// `PerCpuArray<u64>` indexed by [`Event`]: things that happen to state, not
/// verdicts. Written by the program.
pub const MAP_EVENTS: &str = "RL_EVENTS";
/// `Array<FleetSet>` (mmapable): what each key of a fleet-wide rule was
/// admitted here (cumulative), for the daemon to report to the fleet, in a
/// set-associative table ([`crate::fleet_table`]). Written by the program
/// (atomic add); read by the daemon through a mapping of its memory.
pub const MAP_FLEET_USED: &str = "RL_FLEET_USED";
/// `Hash<FlowKey, FleetCursor>`: how much of each key's
/// [`MAP_FLEET_USED`] count the daemon has accounted for (its report
/// cursor), pinned so that a daemon that starts again reports nothing twice.
/// Written by the daemon only; the program never reads it.
pub const MAP_FLEET_REPORTED: &str = "RL_FLEET_REPORTED";
/// `Array<FleetBeat>` of one entry: the daemon's heartbeat, and the daemons
/// of the fleet it counted. Written by the daemon at every sync; read by the
/// program under fleet-wide rules ([`fleet_cost`]).
pub const MAP_FLEET_BEAT: &str = "RL_FLEET_BEAT";
/// Keys of fleet-wide rules followed at once: slots of [`MAP_FLEET_USED`],
/// and at most as many report cursors.
pub const FLEET_CAPACITY: u32 = 65_536;
/// The match groups ([`MatchGroup`]): two halves of [`GROUPS_CAPACITY`], one
/// for each rule trie.
pub const MAP_GROUPS: &str = "RL_GROUPS";
/// `PerCpuArray<Counter>`: each rule's verdicts, [`RULE_COUNTERS`] slots at
/// [`Rule::slot`]` * RULE_COUNTERS` (see [`RuleCounter`]). Written by the
/// program; zeroed by the daemon when it gives a slot to a new rule. Sized
/// at load: (rules + 1) × [`RULE_COUNTERS`].
pub const MAP_RULE_STATS: &str = "RL_RULE_STATS";
/// Counter slots per rule in [`MAP_RULE_STATS`].
pub const RULE_COUNTERS: u32 = 8;
/// The [`Rule::slot`] of the constant rules list entries and unjudged
/// frames point at: counted nowhere per rule (its counters' index,
/// `u32::MAX * RULE_COUNTERS` wrapped, is past the end of [`MAP_RULE_STATS`]),
/// only by reason. Such rules are allow or deny: no shared bucket is read.
pub const UNCOUNTED_SLOT: u32 = u32::MAX;

/// `Array<u64>` of [`KNOWN_WORDS`]: a filter in front of the state maps, one
/// bit per hash of a key ([`known_bit`]), set by the program before it
/// inserts a key's state and never cleared while the maps live. (The daemon
/// inserts states only under fleet-wide rules, whose keys the program looks up
/// whatever the filter says.) A clear bit means the key has no state: the program
/// skips the state lookup, which for a spoofed source is a miss in a hash
/// table of millions of buckets (its costliest step). A set bit may be
/// another key's (or a removed state's): the lookup is then made as before.
pub const MAP_KNOWN: &str = "RL_KNOWN";
/// Words of [`MAP_KNOWN`]: 2^23 bits in 1 MiB. With a million states ~11 % of
/// the bits are set, and ~11 % of a spoofed flood's frames still look up.
pub const KNOWN_WORDS: u32 = 1 << 17;

/// The word of [`MAP_KNOWN`] and the bit in it for a key of doorkeeper hash
/// `h` ([`crate::doorkeeper::hash_words`]).
#[inline(always)]
pub const fn known_bit(h: u64) -> (u32, u64) {
    let bit = (h >> 32) as u32 & (KNOWN_WORDS * 64 - 1);
    (bit >> 6, 1 << (bit & 63))
}

/// Every map.
pub const ALL_MAPS: [&str; 22] = [
    MAP_RULES,
    MAP_RULES_B,
    MAP_RULE_TABLE,
    MAP_TABLE,
    MAP_BORN,
    MAP_STATS,
    MAP_CONFIG,
    MAP_DROPS,
    MAP_WIDE,
    MAP_WIDE_ZERO,
    MAP_SEEN,
    MAP_RULE_STATE,
    MAP_GLOBAL,
    MAP_EVENTS,
    MAP_FLEET_USED,
    MAP_FLEET_REPORTED,
    MAP_FLEET_BEAT,
    MAP_GROUPS,
    MAP_RULE_STATS,
    MAP_KNOWN,
    MAP_DROP_LOG,
    MAP_DROP_LOG_BUDGET,
];

/// The maps pinned for a restart to adopt: all but the per-CPU scratch.
pub const PINNED_MAPS: [&str; 21] = [
    MAP_RULES,
    MAP_RULES_B,
    MAP_RULE_TABLE,
    MAP_TABLE,
    MAP_BORN,
    MAP_STATS,
    MAP_CONFIG,
    MAP_DROPS,
    MAP_WIDE,
    MAP_SEEN,
    MAP_RULE_STATE,
    MAP_GLOBAL,
    MAP_EVENTS,
    MAP_FLEET_USED,
    MAP_FLEET_REPORTED,
    MAP_FLEET_BEAT,
    MAP_GROUPS,
    MAP_RULE_STATS,
    MAP_KNOWN,
    MAP_DROP_LOG,
    MAP_DROP_LOG_BUDGET,
];

/// Default number of doorkeeper slots (8 bytes each: 8 MiB). A load-time setting.
pub const DEFAULT_SEEN_SLOTS: u32 = 1 << 20;

/// One dropped frame in this many, picked at random ([`drop_sampled`]), is
/// credited this many times to its source in [`MAP_DROPS`]: `top` is an
/// estimate, the drop path stays cheap.
pub const DROP_SAMPLE: u64 = 16;

/// Whether the drop that is its CPU's `n`-th frame of its reason is one
/// [`MAP_DROPS`] counts: a hash of `n` under the maps' secret `seed`, so that
/// each drop is picked with probability 1/[`DROP_SAMPLE`] whatever the order
/// frames arrive in. A fixed stride (every 16th) aliased with the order of
/// arrival: four sources of 1 970 drops each were shown as 0, 384, 0 and
/// 7 488. Picked at random, a source's count C of n drops has a mean of n and
/// a standard deviation of √(15·n): within ±2√(15·n) of n in 19 cases of 20.
#[inline(always)]
pub const fn drop_sampled(n: u64, seed: u64) -> bool {
    crate::doorkeeper::mix(n ^ seed).is_multiple_of(DROP_SAMPLE)
}

/// Slots of [`MAP_DROPS`]: the busiest droppers are kept ([`crate::top`]).
pub const DROPS_CAPACITY: u32 = 65_536;

/// Default number of IPv4 sources [`MAP_TABLE`] holds at once: its IPv4
/// lines are [`state_lines`] of it. At 48 bytes of kernel memory each (the table
/// and its birth stamps), 1 M sources cost 48 MiB. A load-time setting.
pub const DEFAULT_STATE_CAPACITY: u32 = 1 << 20;

/// The most lines each family may have in [`MAP_TABLE`]: 4 GiB, and 2 GiB
/// of birth stamps beside it, for 134 217 728 sources ([`state_sources`]);
/// the daemon refuses a `--max-sources` or `--max-sources-v6` past it. (A
/// slot's position must fit in 32 bits, as the program hands it between
/// functions: it does up to 2^29 lines, both families together.)
pub const MAX_STATE_LINES: u32 = 1 << 26;

/// Lines of [`MAP_TABLE`] for `sources` sources of one family: [`crate::table::SLOTS_PER_SOURCE`]
/// slots each, rounded up to a power of two of lines.
pub const fn state_lines(sources: u32) -> u32 {
    let slots = sources as u64 * crate::table::SLOTS_PER_SOURCE as u64;
    let lines = slots.div_ceil(crate::table::WAYS as u64);
    let lines = if lines < 1 { 1 } else { lines };
    let p = lines.next_power_of_two();
    if p > MAX_STATE_LINES as u64 {
        MAX_STATE_LINES
    } else {
        p as u32
    }
}

/// The sources `lines` lines of the table are sized for ([`state_lines`]).
pub const fn state_sources(lines: u32) -> u32 {
    let s = lines as u64 * crate::table::WAYS as u64 / crate::table::SLOTS_PER_SOURCE as u64;
    if s > u32::MAX as u64 {
        u32::MAX
    } else {
        s as u32
    }
}
/// Default number of IPv6 sources (per /64 by default) [`MAP_TABLE`] holds at
/// once: its IPv6 lines are [`state_lines`] of it, 48 bytes a source as for
/// IPv4. A load-time setting.
pub const DEFAULT_STATE_V6_CAPACITY: u32 = 1 << 18;
/// Default number of rules (the rule table holds twice as many, see
/// [`rule_table_len`]). A load-time setting.
pub const DEFAULT_RULES_CAPACITY: u32 = 16 * 1024;
/// Default number of blocklist and allowlist entries, all lists together.
/// They share [`MAP_RULES`] with the rules (which has room for both) and point
/// at the rule table's two constant policy rules, so the table does not grow;
/// an LPM trie allocates per entry, so unused room costs nothing. A load-time
/// setting.
pub const DEFAULT_LIST_CAPACITY: u32 = 1 << 20;

/// Entries of [`MAP_RULE_TABLE`] for `rules` rules: every rule can change at
/// once (twice the rules and the default rule), and the two rules of the
/// unjudged-frame policies (a deny, an allow) last.
pub const fn rule_table_len(rules: u32) -> u32 {
    2 * (rules + 1) + 2
}

#[cfg(feature = "user")]
// One SAFETY comment for every impl of the module.
#[allow(clippy::undocumented_unsafe_blocks)]
mod pod {
    // SAFETY: all are `#[repr(C)]`, `Copy`, and have no padding (sizes asserted above).
    unsafe impl aya::Pod for super::FlowKey {}
    unsafe impl aya::Pod for super::FlowKeyV4 {}
    unsafe impl aya::Pod for super::DropKey {}
    unsafe impl aya::Pod for super::Rule {}
    unsafe impl aya::Pod for super::Config {}
    unsafe impl aya::Pod for crate::table::Line {}
    unsafe impl aya::Pod for super::TopSet {}
    unsafe impl aya::Pod for super::FleetSet {}
    unsafe impl aya::Pod for super::Counter {}
    unsafe impl aya::Pod for crate::gcra::State {}
    unsafe impl aya::Pod for super::WideState {}
    unsafe impl aya::Pod for super::SourceState {}
    unsafe impl aya::Pod for super::RuleState {}
    unsafe impl aya::Pod for super::GlobalState {}
    unsafe impl aya::Pod for super::MatchGroup {}
    unsafe impl aya::Pod for super::FleetUsed {}
    unsafe impl aya::Pod for super::FleetCursor {}
    unsafe impl aya::Pod for super::FleetBeat {}
    unsafe impl aya::Pod for super::DropLogBudget {}
    unsafe impl aya::Pod for super::DropRecord {}
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn masking() {
        let mut a = [0xffu8; 16];
        mask_addr(&mut a, 64);
        assert_eq!(
            a,
            [
                0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0, 0, 0, 0, 0
            ]
        );
        let mut b = map_v4([198, 18, 7, 200]);
        mask_addr(&mut b, V4_MAPPED_BITS + 24);
        assert_eq!(b, map_v4([198, 18, 7, 0]));
        let mut c = map_v4([198, 19, 255, 255]);
        mask_addr(&mut c, V4_MAPPED_BITS + 15);
        assert_eq!(c, map_v4([198, 18, 0, 0]));
        let mut d = [0xabu8; 16];
        mask_addr(&mut d, 128);
        assert_eq!(d, [0xab; 16]);
        mask_addr(&mut d, 0);
        assert_eq!(d, [0; 16]);
        let mut e = [0xffu8; 16];
        mask_addr(&mut e, 71);
        assert_eq!(
            &e[..9],
            &[0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xfe]
        );
        assert_eq!(&e[9..], &[0; 7]);
        let w = words(&map_v4([198, 19, 255, 255]));
        assert_eq!(w[2], V4_MAPPED_WORD);
        assert_eq!(addr_of(&mask_words(&w, 96 + 15)), map_v4([198, 18, 0, 0]));
        assert_eq!(
            rule_addr(family::V4, &w),
            [u32::from_ne_bytes([4, 0, 0, 0]), w[3], 0, 0, 0]
        );
    }

    #[test]
    fn reasons_and_events_index_in_order() {
        for (i, r) in Reason::ALL.iter().enumerate() {
            assert_eq!(*r as usize, i);
        }
        for (i, e) in Event::ALL.iter().enumerate() {
            assert_eq!(*e as usize, i);
        }
    }
}
