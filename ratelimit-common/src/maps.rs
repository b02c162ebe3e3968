//! The maps shared by the XDP program (reader of rules, writer of state and
//! counters) and the daemon (the one writer of rules and config, reader of state and
//! counters): their names, default capacities, keys and values.
//!
//! Addresses are kept as 16 bytes in network byte order. IPv4 addresses are stored
//! IPv4-mapped (`::ffff:a.b.c.d`), so one key type and one LPM trie serve both
//! families and an IPv4 prefix `/n` is the 128-bit prefix `/(96 + n)`.

use crate::{fixed_window, gcra, interval, rolling_quota, sliding_log, sliding_window};

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
/// `LruHash<FlowKey, SourceState>`: one bucket per (rule, masked IPv6 source)
/// under a gcra rule. Written by the program.
pub const MAP_STATE: &str = "RL_STATE";
/// `LruHash<FlowKeyV4, SourceState>`: one bucket per (rule, masked IPv4 source)
/// under a gcra rule: an 8-byte key hashes faster and takes 88 bytes of kernel
/// memory per source instead of 104. Written by the program.
pub const MAP_STATE_V4: &str = "RL_STATE4";
/// `PerCpuArray<Counter>` indexed by [`Reason`]. Written by the program.
pub const MAP_STATS: &str = "RL_STATS";
/// `Array<Config>` of one entry: global runtime settings. Written by the daemon.
pub const MAP_CONFIG: &str = "RL_CONFIG";
/// `LruHash<Addr, u64>`: frames dropped (or would-be dropped) per source address,
/// for `ratelimit top`, sampled one in [`DROP_SAMPLE`]. Written by the program on
/// the drop path only.
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
/// `LruHash<FlowKey, Counter>`: what each key of a fleet-wide rule was
/// admitted here (cumulative), for the daemon to report to the fleet.
/// Written by the program (atomic add).
pub const MAP_FLEET_USED: &str = "RL_FLEET_USED";
/// Keys of fleet-wide rules followed at once.
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

/// What a rule did with a frame: the slot of [`MAP_RULE_STATS`] it is
/// counted in.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RuleCounter {
    /// Passed (within the limits, allowed, a new source within budget, one
    /// of the host's own connections).
    Passed = 0,
    /// Dropped at the rule's own key level, or by a deny (or in
    /// allowlist-only mode).
    Dropped = 1,
    /// Dropped at the second key level.
    Level2Dropped = 2,
    /// Dropped at the third key level.
    Level3Dropped = 3,
    /// Dropped at the aggregate level.
    AggregateDropped = 4,
    /// Dropped by the new-source budget.
    NewSourceDropped = 5,
    /// Would have been dropped, passed under dry run.
    WouldDrop = 6,
    /// Dropped at the aggregate's reserve: a new or young source
    /// ([`Reason::AggregateYoung`]).
    AggregateYoungDropped = 7,
}

impl RuleCounter {
    /// Every slot in use, in index order.
    pub const ALL: [RuleCounter; 8] = [
        RuleCounter::Passed,
        RuleCounter::Dropped,
        RuleCounter::Level2Dropped,
        RuleCounter::Level3Dropped,
        RuleCounter::AggregateDropped,
        RuleCounter::NewSourceDropped,
        RuleCounter::WouldDrop,
        RuleCounter::AggregateYoungDropped,
    ];

    /// The slot a rule's frame counted under `reason` (dry run applied) goes to.
    pub const fn of(reason: Reason) -> Self {
        match reason {
            Reason::Limited
            | Reason::Denied
            | Reason::Contended
            | Reason::NotAllowed
            | Reason::Unjudged
            | Reason::TinyFragment => RuleCounter::Dropped,
            Reason::Level2Limited => RuleCounter::Level2Dropped,
            Reason::Level3Limited => RuleCounter::Level3Dropped,
            Reason::AggregateLimited => RuleCounter::AggregateDropped,
            Reason::AggregateYoung => RuleCounter::AggregateYoungDropped,
            Reason::NewSourceLimited => RuleCounter::NewSourceDropped,
            Reason::WouldDrop => RuleCounter::WouldDrop,
            _ => RuleCounter::Passed,
        }
    }

    /// Stable name, used in `list --stats`, JSON and metric labels.
    pub const fn name(self) -> &'static str {
        match self {
            RuleCounter::Passed => "passed",
            RuleCounter::Dropped => "dropped",
            RuleCounter::Level2Dropped => "level2_dropped",
            RuleCounter::Level3Dropped => "level3_dropped",
            RuleCounter::AggregateDropped => "aggregate_dropped",
            RuleCounter::NewSourceDropped => "new_source_dropped",
            RuleCounter::WouldDrop => "would_drop",
            RuleCounter::AggregateYoungDropped => "aggregate_young_dropped",
        }
    }
}

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
pub const ALL_MAPS: [&str; 18] = [
    MAP_RULES,
    MAP_RULES_B,
    MAP_RULE_TABLE,
    MAP_STATE,
    MAP_STATE_V4,
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
    MAP_GROUPS,
    MAP_RULE_STATS,
    MAP_KNOWN,
];

/// The maps pinned for a restart to adopt: all but the per-CPU scratch.
pub const PINNED_MAPS: [&str; 17] = [
    MAP_RULES,
    MAP_RULES_B,
    MAP_RULE_TABLE,
    MAP_STATE,
    MAP_STATE_V4,
    MAP_STATS,
    MAP_CONFIG,
    MAP_DROPS,
    MAP_WIDE,
    MAP_SEEN,
    MAP_RULE_STATE,
    MAP_GLOBAL,
    MAP_EVENTS,
    MAP_FLEET_USED,
    MAP_GROUPS,
    MAP_RULE_STATS,
    MAP_KNOWN,
];

/// Default number of doorkeeper slots (8 bytes each: 8 MiB). A load-time setting.
pub const DEFAULT_SEEN_SLOTS: u32 = 1 << 20;

/// One dropped frame in this many (per CPU) is credited, this many times, to its
/// source in [`MAP_DROPS`]: `top` is an estimate, the drop path stays cheap.
pub const DROP_SAMPLE: u64 = 16;

/// Key of [`MAP_DROPS`]: what a drop is charged to. A source, or for a drop
/// at a rule's second or third key level the key of that level (a source's
/// network, e.g. its /24).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct DropKey {
    /// The address, masked to `prefix` (IPv4-mapped for IPv4).
    pub addr: Addr,
    /// The bits of `addr` that count, of its family (24 for an IPv4 /24),
    /// or 0 for a whole source address.
    pub prefix: u8,
    /// 1 for a source (its own level, a denial); 2 or 3 for a key level.
    pub level: u8,
    /// Zero.
    pub _pad: [u8; 2],
}
const _: () = assert!(core::mem::size_of::<DropKey>() == 20);

/// Capacity of [`MAP_DROPS`]: the busiest droppers are kept, the rest evicted.
pub const DROPS_CAPACITY: u32 = 65_536;

/// Default capacity of [`MAP_STATE_V4`]: IPv4 sources tracked at once. At 80
/// bytes of kernel memory each, 1 M sources cost 80 MiB. A load-time setting.
pub const DEFAULT_STATE_CAPACITY: u32 = 1 << 20;
/// Default capacity of [`MAP_STATE`]: IPv6 sources (per /64 by default) tracked
/// at once, 96 bytes each. A load-time setting.
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

/// An IPv6 address or an IPv4-mapped IPv4 address, network byte order.
pub type Addr = [u8; 16];

/// A source address as the program carries it: four 32-bit words holding the
/// 16 bytes of an [`Addr`] exactly as they are in memory (network byte order),
/// IPv4 as `::ffff:a.b.c.d`. Words, not bytes, so that the program masks and
/// copies an address in four operations, not sixteen.
pub type Words = [u32; 4];

/// The [`Words`] of an [`Addr`].
#[inline(always)]
pub const fn words(a: &Addr) -> Words {
    [
        u32::from_ne_bytes([a[0], a[1], a[2], a[3]]),
        u32::from_ne_bytes([a[4], a[5], a[6], a[7]]),
        u32::from_ne_bytes([a[8], a[9], a[10], a[11]]),
        u32::from_ne_bytes([a[12], a[13], a[14], a[15]]),
    ]
}

/// The [`Addr`] of [`Words`].
#[inline(always)]
pub const fn addr_of(w: &Words) -> Addr {
    // SAFETY: both are 16 bytes of plain integers.
    unsafe { core::mem::transmute::<Words, Addr>(*w) }
}

/// The third word of an IPv4-mapped address: `0, 0, 0xff, 0xff` in memory.
pub const V4_MAPPED_WORD: u32 = u32::from_ne_bytes([0, 0, 0xff, 0xff]);

/// The key data of [`MAP_RULES`]: the family ([`family`]) in the first byte of
/// the first word, zeros to the end of it, then the address (IPv4: one word,
/// then zeros). With the family first, an IPv6 rule never covers an IPv4
/// source (`::/0` is every IPv6 source, not every source), and an IPv4-mapped
/// IPv6 source never matches an IPv4 rule.
pub type RuleAddr = [u32; 5];

/// Bits in front of the address in a [`RuleAddr`]: a rule's prefix length in
/// the trie is this plus its own.
pub const FAMILY_BITS: u32 = 32;

/// The address families of [`RuleAddr`]'s first byte.
pub mod family {
    /// IPv4.
    pub const V4: u8 = 4;
    /// IPv6.
    pub const V6: u8 = 6;
}

/// The rule key of a source: `family` (from the frame's EtherType) and its
/// address words (IPv4-mapped for IPv4).
#[inline(always)]
pub const fn rule_addr(fam: u8, w: &Words) -> RuleAddr {
    let f = u32::from_ne_bytes([fam, 0, 0, 0]);
    if fam == family::V4 {
        [f, w[3], 0, 0, 0]
    } else {
        [f, w[0], w[1], w[2], w[3]]
    }
}

/// Words `w` with their first `bits` (0..=128) bits kept, the rest cleared.
#[inline(always)]
pub fn mask_words(w: &Words, bits: u32) -> Words {
    let mut out = [0u32; 4];
    let mut i = 0;
    while i < 4 {
        let keep = bits.saturating_sub(32 * i as u32);
        let mask = if keep >= 32 {
            u32::MAX
        } else if keep == 0 {
            0
        } else {
            u32::MAX << (32 - keep)
        };
        // The mask is built in host order and applied in network order.
        out[i] = w[i] & mask.to_be();
        i += 1;
    }
    out
}

/// The prefix `::ffff:0:0/96` under which IPv4 addresses are mapped.
pub const V4_MAPPED_PREFIX: [u8; 12] = [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff];
/// Length of [`V4_MAPPED_PREFIX`] in bits.
pub const V4_MAPPED_BITS: u8 = 96;

/// The IPv4-mapped form of an IPv4 address given as 4 bytes in network order.
#[inline(always)]
pub const fn map_v4(v4: [u8; 4]) -> Addr {
    [
        0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, v4[0], v4[1], v4[2], v4[3],
    ]
}

/// Whether `addr` is IPv4-mapped.
#[inline(always)]
pub fn is_v4_mapped(addr: &Addr) -> bool {
    addr[..12] == V4_MAPPED_PREFIX
}

/// Keeps the first `bits` bits of `addr` (0..=128) and clears the rest.
#[inline(always)]
pub fn mask_addr(addr: &mut Addr, bits: u8) {
    *addr = addr_of(&mask_words(&words(addr), u32::from(bits)));
}

/// Key of [`MAP_STATE`]: the rule a source fell under and its address masked to
/// that rule's key prefix. 128 bits kept whole: never hashed or folded.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct FlowKey {
    /// Masked source address (IPv4-mapped for IPv4), network byte order.
    pub addr: Addr,
    /// [`Rule::id`] of the rule that applied.
    pub rule_id: u32,
}
const _: () = assert!(core::mem::size_of::<FlowKey>() == 20);

/// Key of [`MAP_STATE_V4`]: a [`FlowKey`] of an IPv4 source, without the
/// IPv4-mapped prefix.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct FlowKeyV4 {
    /// Masked source address, network byte order.
    pub addr: [u8; 4],
    /// [`Rule::id`] of the rule that applied.
    pub rule_id: u32,
}
const _: () = assert!(core::mem::size_of::<FlowKeyV4>() == 8);

impl FlowKey {
    /// The key of `rule_id` for address words `w`.
    #[inline(always)]
    pub const fn of(w: &Words, rule_id: u32) -> Self {
        Self {
            addr: addr_of(w),
            rule_id,
        }
    }

    /// The IPv4 form of this key (its last four address bytes).
    #[inline(always)]
    pub const fn v4(&self) -> FlowKeyV4 {
        FlowKeyV4 {
            addr: [self.addr[12], self.addr[13], self.addr[14], self.addr[15]],
            rule_id: self.rule_id,
        }
    }
}

impl FlowKeyV4 {
    /// The [`FlowKey`] of this IPv4 key.
    pub const fn widen(&self) -> FlowKey {
        FlowKey {
            addr: map_v4(self.addr),
            rule_id: self.rule_id,
        }
    }
}

/// What a rule does with the sources under it. A zeroed [`Rule`] allows: a map
/// slot the daemon has not written yet never drops anything.
pub mod action {
    /// Exempt: always pass, never limited.
    pub const ALLOW: u8 = 0;
    /// Apply the rule's limit.
    pub const LIMIT: u8 = 1;
    /// Always drop.
    pub const DENY: u8 = 2;
    /// Allowlist-only mode: dropped as not allowed
    /// ([`super::Reason::NotAllowed`]). The daemon gives every rule but the
    /// `allow` rules this action, keeping what it does in normal mode in
    /// [`super::Rule::normal_action`].
    pub const NOT_ALLOWED: u8 = 3;
}

/// Bits of [`Rule::flags`].
pub mod rule_flags {
    /// Cost is the frame's length in bytes, not 1 per packet.
    pub const BYTES: u8 = 1 << 0;
    /// Never drop for this rule; count would-drops instead.
    pub const DRY_RUN: u8 = 1 << 1;
    /// The rule has an aggregate level ([`super::Rule::aggregate`]): all its
    /// sources together.
    pub const AGGREGATE: u8 = 1 << 2;
    /// The aggregate counts bytes (frame lengths), not packets.
    pub const AGGREGATE_BYTES: u8 = 1 << 3;
    /// Frames from sources without state pass unbudgeted (still counted as
    /// `new_source`); [`super::Rule::new_sources`] is not used.
    pub const NEW_SOURCES_UNLIMITED: u8 = 1 << 4;
    /// The rule holds across a fleet: what its keys are admitted is counted
    /// in [`super::MAP_FLEET_USED`], and the daemon keeps each key's own
    /// bucket (and the aggregate) in step with the fleet's debt.
    pub const FLEET: u8 = 1 << 5;
    /// Frames that belong to the host's own connections pass unlimited
    /// ([`super::Reason::HostConnection`]): an established TCP connection or a
    /// connected UDP socket whose local port is in the ephemeral range
    /// ([`super::Config::local_ports`]), found with the kernel's socket lookup.
    pub const HOST_CONNECTIONS: u8 = 1 << 6;
    /// The rule has key levels beyond its own ([`super::Rule::levels`]).
    pub const LEVELS: u8 = 1 << 7;
}

/// Bits of [`KeyLevel::flags`].
pub mod level_flags {
    /// The level is in use.
    pub const ON: u8 = 1 << 0;
    /// The level counts bytes (frame lengths), not packets.
    pub const BYTES: u8 = 1 << 1;
}

/// Key levels a limit rule may have in all, its own first: e.g. per /32, per
/// /24 and per /16 at once. The others are [`Rule::levels`].
pub const MAX_KEY_LEVELS: usize = 3;

/// A level's keys are its rule's id with the level's number (1 or 2 for
/// [`Rule::levels`]`[0]` and `[1]`) in the bits from here up: the daemon keeps
/// rule ids below [`MAX_RULE_ID`].
pub const LEVEL_ID_SHIFT: u32 = 30;

/// The largest rule id the daemon gives.
pub const MAX_RULE_ID: u32 = (1 << LEVEL_ID_SHIFT) - 1;

/// One more key level of a limit rule ([`Rule::levels`]): a GCRA bucket per
/// key of its own prefix length, e.g. per /24 beside the rule's per /32. A
/// frame passes only if its own level, every other level and the aggregate
/// admit it; one that any refuses consumes nothing at the others.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct KeyLevel {
    /// The bucket of each key.
    pub params: gcra::Params,
    /// [`KeyLevel::key_prefix_v6`] as a mask over the address words.
    pub mask_v6: Words,
    /// [`KeyLevel::key_prefix_v4`] as a mask over the IPv4 word.
    pub mask_v4: u32,
    /// Bits of an IPv4 source kept in the level's key.
    pub key_prefix_v4: u8,
    /// Bits of an IPv6 source kept in the level's key.
    pub key_prefix_v6: u8,
    /// Bits of [`level_flags`].
    pub flags: u8,
    /// Zero.
    pub _pad: u8,
}
const _: () = assert!(core::mem::size_of::<KeyLevel>() == 72);

impl KeyLevel {
    /// Whether the level is in use.
    pub const fn is_on(&self) -> bool {
        self.flags & level_flags::ON != 0
    }

    /// Sets the masks from the key prefixes.
    pub fn set_masks(&mut self) {
        self.mask_v6 = mask_words(&[u32::MAX; 4], u32::from(self.key_prefix_v6));
        self.mask_v4 = mask_words(&[0, 0, 0, u32::MAX], 96 + u32::from(self.key_prefix_v4))[3];
    }

    /// The id of the level's keys: level `n` (1 or 2) of the rule `rule_id`.
    pub const fn key_id(rule_id: u32, n: u32) -> u32 {
        rule_id | (n << LEVEL_ID_SHIFT)
    }
}

/// Which algorithm a limit rule uses: [`Rule::algorithm`].
pub mod algorithm {
    /// Token bucket, greedy refill, as GCRA ([`crate::gcra`]); state in
    /// [`super::MAP_STATE_V4`] and [`super::MAP_STATE`].
    pub const GCRA: u8 = 0;
    /// Token bucket, interval refill ([`crate::interval`]); state in [`super::MAP_WIDE`].
    pub const INTERVAL: u8 = 1;
    /// Fixed window counter ([`crate::fixed_window`]); state in [`super::MAP_WIDE`].
    pub const FIXED_WINDOW: u8 = 2;
    /// Sliding window log ([`crate::sliding_log`]); state in [`super::MAP_WIDE`].
    pub const SLIDING_LOG: u8 = 3;
    /// Sliding window counter ([`crate::sliding_window`]); state in [`super::MAP_WIDE`].
    pub const SLIDING_WINDOW: u8 = 4;
    /// Rolling-window quota with a rate cap ([`crate::rolling_quota`]); state in [`super::MAP_WIDE`].
    pub const ROLLING_QUOTA: u8 = 5;
}

/// The parameters of a rule's algorithm ([`Rule::algorithm`] says which member).
/// Every member is plain integers, so every bit pattern is valid for each.
#[repr(C)]
#[derive(Clone, Copy)]
pub union AlgoParams {
    /// [`algorithm::GCRA`].
    pub gcra: gcra::Params,
    /// [`algorithm::INTERVAL`].
    pub interval: interval::Params,
    /// [`algorithm::FIXED_WINDOW`].
    pub fixed_window: fixed_window::Params,
    /// [`algorithm::SLIDING_LOG`].
    pub sliding_log: sliding_log::Params,
    /// [`algorithm::SLIDING_WINDOW`].
    pub sliding_window: sliding_window::Params,
    /// [`algorithm::ROLLING_QUOTA`].
    pub rolling_quota: rolling_quota::Params,
    /// The raw words.
    pub raw: [u64; 6],
}
const _: () = assert!(core::mem::size_of::<AlgoParams>() == 48);

impl AlgoParams {
    /// The raw words.
    #[inline(always)]
    pub fn words(&self) -> [u64; 6] {
        // SAFETY: every member is plain integers filling at most these 48 bytes,
        // and values are built zeroed first (see the constructors).
        unsafe { self.raw }
    }

    fn zeroed() -> Self {
        Self { raw: [0; 6] }
    }

    /// Token bucket parameters.
    pub fn from_gcra(p: gcra::Params) -> Self {
        let mut v = Self::zeroed();
        v.gcra = p;
        v
    }

    /// Interval refill parameters.
    pub fn from_interval(p: interval::Params) -> Self {
        let mut v = Self::zeroed();
        v.interval = p;
        v
    }

    /// Fixed window parameters.
    pub fn from_fixed_window(p: fixed_window::Params) -> Self {
        let mut v = Self::zeroed();
        v.fixed_window = p;
        v
    }

    /// Sliding log parameters.
    pub fn from_sliding_log(p: sliding_log::Params) -> Self {
        let mut v = Self::zeroed();
        v.sliding_log = p;
        v
    }

    /// Sliding window counter parameters.
    pub fn from_sliding_window(p: sliding_window::Params) -> Self {
        let mut v = Self::zeroed();
        v.sliding_window = p;
        v
    }

    /// Rolling quota parameters.
    pub fn from_rolling_quota(p: rolling_quota::Params) -> Self {
        let mut v = Self::zeroed();
        v.rolling_quota = p;
        v
    }
}

impl Default for AlgoParams {
    fn default() -> Self {
        Self::zeroed()
    }
}

impl PartialEq for AlgoParams {
    fn eq(&self, other: &Self) -> bool {
        self.words() == other.words()
    }
}

impl Eq for AlgoParams {}

impl core::fmt::Debug for AlgoParams {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_tuple("AlgoParams").field(&self.words()).finish()
    }
}

/// Value of [`MAP_RULE_TABLE`]. Built and validated by the daemon.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Rule {
    /// The rule's identity in [`FlowKey`]. Kept when a rule's limit changes, so
    /// existing buckets carry over; new for a new prefix or a new algorithm. 0 is
    /// the default rule.
    pub id: u32,
    /// Index of the rule's shared buckets in [`MAP_RULE_STATE`]: 0 for the
    /// default rule, a free index for each other rule. Kept with the id.
    pub slot: u32,
    /// One of [`action`].
    pub action: u8,
    /// Bits of [`rule_flags`].
    pub flags: u8,
    /// Bits of an IPv4 source kept in the key (0..=32): 32 is per address, 24 per /24.
    pub key_prefix_v4: u8,
    /// Bits of an IPv6 source kept in the key (0..=128): 64 is per /64.
    pub key_prefix_v6: u8,
    /// One of [`algorithm`] (for [`action::LIMIT`]).
    pub algorithm: u8,
    /// Under [`action::NOT_ALLOWED`]: the rule's action in normal mode (its
    /// other fields are kept as they were). Otherwise zero.
    pub normal_action: u8,
    /// Zero.
    pub _pad: [u8; 2],
    /// What a fresh state of this rule admits at once, in cost units (gcra: the
    /// burst; the windows: the limit; interval refill: the capacity; rolling
    /// quota: the rate cap; 0 for a rate of 0). A source without state is never
    /// admitted more than this before it has a state (see
    /// [`crate::doorkeeper`]).
    pub burst: u64,
    /// [`Rule::key_prefix_v6`] as a mask over the address [`Words`], network
    /// order: computed by the daemon so that the program only ANDs.
    pub mask_v6: Words,
    /// [`Rule::key_prefix_v4`] as a mask over the IPv4 word, network order.
    pub mask_v4: u32,
    /// The rule's own index in [`MAP_RULE_TABLE`], set by the daemon where it
    /// places the rule: the program hands it to its global functions (a value
    /// read from a map keeps the verifier's view of every path alike).
    pub index: u32,
    /// The algorithm's parameters, per source key.
    pub params: AlgoParams,
    /// Budget for frames from sources that have no state yet (packets), unless
    /// [`rule_flags::NEW_SOURCES_UNLIMITED`]. State in [`RuleState::new_sources`].
    pub new_sources: gcra::Params,
    /// The aggregate level, if [`rule_flags::AGGREGATE`]: every frame under the
    /// rule together. State in [`RuleState::aggregate`].
    pub aggregate: gcra::Params,
    /// The aggregate's reserve, ticks of [`Rule::aggregate`] (reserved units
    /// × its interval, below its `tau`): what only established sources may
    /// take ([`RuleState::episode`]); 0 for one bucket shared alike.
    pub aggregate_reserve: u64,
    /// Key levels beyond the rule's own, if [`rule_flags::LEVELS`]: in order,
    /// those [`KeyLevel::is_on`] first.
    pub levels: [KeyLevel; MAX_KEY_LEVELS - 1],
}
const _: () = assert!(core::mem::size_of::<Rule>() == 344);

impl Rule {
    /// The rule as it is in normal mode (see [`action::NOT_ALLOWED`]).
    pub const fn in_normal_mode(mut self) -> Self {
        if self.action == action::NOT_ALLOWED {
            self.action = self.normal_action;
            self.normal_action = 0;
        }
        self
    }

    /// The rule as allowlist-only mode has it: dropped unless an `allow` rule.
    pub const fn in_allowlist_only_mode(mut self) -> Self {
        if self.action != action::ALLOW && self.action != action::NOT_ALLOWED {
            self.normal_action = self.action;
            self.action = action::NOT_ALLOWED;
        }
        self
    }

    /// Sets [`Rule::mask_v4`] and [`Rule::mask_v6`] from the key prefixes.
    pub fn set_masks(&mut self) {
        self.mask_v6 = mask_words(&[u32::MAX; 4], u32::from(self.key_prefix_v6));
        self.mask_v4 = mask_words(&[0, 0, 0, u32::MAX], 96 + u32::from(self.key_prefix_v4))[3];
        for level in &mut self.levels {
            level.set_masks();
        }
    }
}

/// Value of [`MAP_RULE_STATE`]: the buckets one rule's sources share, each a
/// [`gcra::State`] word updated with compare-and-swap, and the aggregate's
/// pressure episodes. A zeroed value is two full buckets and no episode. One
/// cache line per rule, so two busy rules never share one.
///
/// **Established and young sources.** Under a rule whose aggregate has a
/// reserve ([`Rule::aggregate_reserve`]), an *episode* of pressure begins when
/// the aggregate refuses a frame after [`EPISODE_QUIET_NS`] without a refusal,
/// and lasts until that long passes without one (it has no maximum length: a
/// trickle of refusals keeps it going). A source without a state is always
/// *young*, and so, during an episode, is one whose state was created after
/// the episode began; every other source with a state is *established*. An
/// established source may take the aggregate's last units, its reserve; a
/// young one is admitted at the aggregate only while the reserve stays whole
/// after it. The aggregate itself is
/// one bucket whatever the class: it never admits more than its rate and burst.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct RuleState {
    /// The new-source budget's state.
    pub new_sources: u64,
    /// The aggregate level's state.
    pub aggregate: u64,
    /// When the current (or last) episode began (the program's clock, ns);
    /// 0 before the first.
    pub episode: u64,
    /// The last refusal at the aggregate, to within [`REFUSAL_MARK_NS`]; 0
    /// before the first.
    pub refused_at: u64,
    /// Zero.
    pub _pad: [u64; 4],
}
const _: () = assert!(core::mem::size_of::<RuleState>() == 64);

/// How long an aggregate must refuse nothing for its episode of pressure to
/// end ([`RuleState`]): a flood that pauses for less comes back to the same
/// episode, so the sources it created stay young.
pub const EPISODE_QUIET_NS: u64 = 60_000_000_000;

/// [`RuleState::refused_at`] is written at most once in this long per CPU,
/// so a flood's refusals do not bounce its cache line between CPUs.
pub const REFUSAL_MARK_NS: u64 = 1_000_000;

/// Value of [`MAP_STATE`] and [`MAP_STATE_V4`]: a key's GCRA state (the only
/// word written with compare-and-swap) and when the key got it.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct SourceState {
    /// The bucket.
    pub gcra: gcra::State,
    /// When the key got its state (the program's clock, ns): see [`RuleState`]
    /// on established and young sources.
    pub born: u64,
}
const _: () = assert!(core::mem::size_of::<SourceState>() == 16);

/// Value of [`MAP_GLOBAL`].
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct GlobalState {
    /// The state-creation cap's state ([`Config::new_states`]).
    pub new_states: u64,
    /// Zero.
    pub _pad: [u64; 7],
}
const _: () = assert!(core::mem::size_of::<GlobalState>() == 64);

/// Things that happen to state, counted per CPU in [`MAP_EVENTS`].
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Event {
    /// A source was promoted by the doorkeeper and got a state of its own.
    StateCreated = 0,
    /// A source seen twice was refused a state: the state-creation cap
    /// ([`Config::new_states`]) was used up. Its frame was judged as a new
    /// source's.
    NewStateCapped = 1,
    /// A frame the program could not judge whole: more VLAN tags than it
    /// walks, an IPv6 extension header chain longer than it walks, a tiny or
    /// overlapping first fragment ([`Reason::TinyFragment`]), or a rule's match
    /// needed what the frame does not show (a transport header cut short; the
    /// ports or TCP flags of a non-first fragment). Counted whatever the
    /// policy ([`config_flags::UNJUDGED_DROP`], [`config_flags::UNJUDGED_PASS`],
    /// [`config_flags::FRAGMENTS_DROP`]) then did with it.
    Unjudged = 2,
}

/// Number of [`Event`]s: the size of [`MAP_EVENTS`].
pub const EVENT_COUNT: u32 = 3;

impl Event {
    /// Every event, in index order.
    pub const ALL: [Event; EVENT_COUNT as usize] =
        [Event::StateCreated, Event::NewStateCapped, Event::Unjudged];

    /// Stable name, used in stats output and metric labels.
    pub const fn name(self) -> &'static str {
        match self {
            Event::StateCreated => "states_created",
            Event::NewStateCapped => "new_states_capped",
            Event::Unjudged => "unjudged",
        }
    }
}

impl Rule {
    /// The token bucket parameters, for a [`algorithm::GCRA`] rule.
    #[inline(always)]
    pub fn gcra(&self) -> gcra::Params {
        *self.gcra_params()
    }

    /// The token bucket parameters by reference (the kernel program copies
    /// nothing it can read in place).
    #[inline(always)]
    pub fn gcra_params(&self) -> &gcra::Params {
        // SAFETY: plain integers; see AlgoParams.
        unsafe { &self.params.gcra }
    }
}

/// `LruHash<FlowKey, WideState>`: the state of keys under the algorithms whose
/// state is wider than one word. Written by the program under [`WideState::lock`].
pub const MAP_WIDE: &str = "RL_WIDE";
/// Default capacity of [`MAP_WIDE`] (about 540 bytes each: 8.8 MiB).
pub const DEFAULT_WIDE_CAPACITY: u32 = 16 * 1024;

/// Words of [`WideState::body`]: room for the largest state (the sliding log).
pub const WIDE_WORDS: usize = 66;

/// Value of [`MAP_WIDE`]: a lock word and the algorithm's state. `bpf_spin_lock`
/// is refused in LRU maps, so the program takes `lock` with compare-and-swap
/// (0 → 1, bounded retries) and releases it with an atomic exchange; every
/// decision on a key is thus serialized across CPUs: exact.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WideState {
    /// 0 free, 1 held.
    pub lock: u64,
    /// When the key got its state (see [`SourceState::born`]).
    pub born: u64,
    /// The algorithm's `State`, from the first byte.
    pub body: [u64; WIDE_WORDS],
}
const _: () = assert!(core::mem::size_of::<sliding_log::State>() <= WIDE_WORDS * 8);
const _: () = assert!(core::mem::size_of::<rolling_quota::State>() <= WIDE_WORDS * 8);
const _: () = assert!(core::mem::size_of::<interval::State>() <= WIDE_WORDS * 8);
const _: () = assert!(core::mem::size_of::<sliding_window::State>() <= WIDE_WORDS * 8);
const _: () = assert!(core::mem::size_of::<fixed_window::State>() <= WIDE_WORDS * 8);

impl Default for WideState {
    fn default() -> Self {
        Self {
            lock: 0,
            born: 0,
            body: [0; WIDE_WORDS],
        }
    }
}

/// `PerCpuArray<WideState>` of one entry: where the program builds a new wide
/// state (too big for the BPF stack) before it inserts it, and zeroes it again
/// after.
pub const MAP_WIDE_ZERO: &str = "RL_WIDE_ZERO";

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
    /// The destination port range (TCP or UDP).
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
    /// Destination ports, inclusive, host order.
    pub dport_first: u16,
    pub dport_last: u16,
    /// Bits of [`match_fields`].
    pub fields: u8,
    /// The transport protocol (IANA number).
    pub proto: u8,
    /// The ICMP type.
    pub icmp_type: u8,
    pub _pad: [u8; 5],
}
const _: () = assert!(core::mem::size_of::<MatchEntry>() == 48);

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
    pub entries: [MatchEntry; MAX_MATCHES],
}
const _: () = assert!(core::mem::size_of::<MatchGroup>() == 16 + 48 * MAX_MATCHES);

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
}
const _: () = assert!(core::mem::size_of::<Config>() == 80);

/// One counter of [`MAP_STATS`]: packets and bytes (whole frame lengths).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Counter {
    /// Frames counted.
    pub packets: u64,
    /// Sum of their lengths from the Ethernet header on, bytes.
    pub bytes: u64,
}
const _: () = assert!(core::mem::size_of::<Counter>() == 16);

/// Why a frame got its verdict: the index into [`MAP_STATS`].
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Reason {
    /// Within its limit: passed.
    Passed = 0,
    /// Over its limit: dropped.
    Limited = 1,
    /// Under an `allow` rule: passed without a limit.
    Allowed = 2,
    /// Under a `deny` rule: dropped.
    Denied = 3,
    /// Not IPv4 or IPv6 (ARP, LLDP, ...): passed.
    NotIp = 4,
    /// Truncated or malformed IP: passed or dropped by [`config_flags::DROP_MALFORMED`].
    Malformed = 5,
    /// Over its limit or denied under dry run: passed.
    WouldDrop = 6,
    /// New source whose state could not be stored (map full and not evictable):
    /// passed, as a new source's first packet always would be.
    StateFailed = 7,
    /// Compare-and-swap retries ran out: the key is hammered from several CPUs at
    /// once, so it is over its limit; dropped.
    Contended = 8,
    /// From a source without state, within its rule's new-source budget: passed.
    NewSource = 9,
    /// From a source without state, over its rule's new-source budget: dropped.
    NewSourceLimited = 10,
    /// Over its rule's aggregate level (all the rule's sources together): dropped.
    AggregateLimited = 11,
    /// Belongs to one of the host's own connections (see
    /// [`rule_flags::HOST_CONNECTIONS`]): passed without a limit.
    HostConnection = 12,
    /// Allowlist-only mode and not under an `allow` rule: dropped.
    NotAllowed = 13,
    /// Over the second key level of its rule ([`Rule::levels`]`[0]`): dropped.
    Level2Limited = 14,
    /// Over the third key level of its rule ([`Rule::levels`]`[1]`): dropped.
    Level3Limited = 15,
    /// A frame the kernel would deliver as IP that the program cannot judge
    /// (more VLAN tags than [`MAX_VLAN_TAGS`], an IPv6 extension header chain
    /// longer than [`MAX_EXT_HEADERS`]): dropped by the `unjudged` policy
    /// ([`config_flags::UNJUDGED_DROP`]).
    Unjudged = 16,
    /// A first fragment too short to hold the transport header fields a rule
    /// can match on (TCP: 20 bytes; UDP, ICMP: 8), or a TCP fragment at offset
    /// 8 bytes, which could rewrite the flags of the one before (RFC 1858,
    /// RFC 3128): dropped by the `unjudged` policy.
    TinyFragment = 17,
    /// From a new or young source, refused by its rule's aggregate because
    /// what is left of it is the reserve for established sources
    /// ([`RuleState`]): dropped. [`Reason::AggregateLimited`] is the
    /// aggregate refusing whatever the class.
    AggregateYoung = 18,
}

/// Number of [`Reason`]s: the size of [`MAP_STATS`].
pub const REASON_COUNT: u32 = 19;

/// 802.1Q and 802.1ad tags the program walks before the IP header: as many as
/// any real network stacks (the kernel strips every tag it meets, VID 0 ones
/// without a VLAN device too). A frame with more is unjudged
/// ([`Reason::Unjudged`]).
pub const MAX_VLAN_TAGS: usize = 8;

/// IPv6 extension headers the program walks before the transport header. A
/// frame whose chain is longer is unjudged ([`Reason::Unjudged`]).
pub const MAX_EXT_HEADERS: usize = 8;

impl Reason {
    /// Every reason, in index order.
    pub const ALL: [Reason; REASON_COUNT as usize] = [
        Reason::Passed,
        Reason::Limited,
        Reason::Allowed,
        Reason::Denied,
        Reason::NotIp,
        Reason::Malformed,
        Reason::WouldDrop,
        Reason::StateFailed,
        Reason::Contended,
        Reason::NewSource,
        Reason::NewSourceLimited,
        Reason::AggregateLimited,
        Reason::HostConnection,
        Reason::NotAllowed,
        Reason::Level2Limited,
        Reason::Level3Limited,
        Reason::Unjudged,
        Reason::TinyFragment,
        Reason::AggregateYoung,
    ];

    /// Stable name, used in stats output and metric labels.
    pub const fn name(self) -> &'static str {
        match self {
            Reason::Passed => "passed",
            Reason::Limited => "limited",
            Reason::Allowed => "allowed",
            Reason::Denied => "denied",
            Reason::NotIp => "not_ip",
            Reason::Malformed => "malformed",
            Reason::WouldDrop => "would_drop",
            Reason::StateFailed => "state_failed",
            Reason::Contended => "contended",
            Reason::NewSource => "new_source",
            Reason::NewSourceLimited => "new_source_limited",
            Reason::AggregateLimited => "aggregate_limited",
            Reason::HostConnection => "host_connection",
            Reason::NotAllowed => "not_allowed",
            Reason::Level2Limited => "level2_limited",
            Reason::Level3Limited => "level3_limited",
            Reason::Unjudged => "unjudged",
            Reason::TinyFragment => "tiny_fragment",
            Reason::AggregateYoung => "aggregate_young",
        }
    }

    /// Whether frames counted under this reason were dropped (dry run aside).
    pub const fn drops(self) -> bool {
        matches!(
            self,
            Reason::Limited
                | Reason::Denied
                | Reason::Contended
                | Reason::NewSourceLimited
                | Reason::AggregateLimited
                | Reason::AggregateYoung
                | Reason::NotAllowed
                | Reason::Level2Limited
                | Reason::Level3Limited
                | Reason::Unjudged
                | Reason::TinyFragment
        )
    }
}

/// How many times the program retries a compare-and-swap on a contended state
/// before giving up ([`Reason::Contended`]). Each failed attempt means another CPU
/// updated the same key in between. Every retry is a path the verifier walks,
/// for every level: 8 keeps the program well inside its limit.
pub const CAS_RETRIES: u32 = 8;

/// How many times the program tries to take a wide state's lock word before
/// giving up ([`Reason::Contended`]). The holder runs with preemption off and
/// releases within a microsecond or so.
pub const LOCK_RETRIES: u32 = 128;

#[cfg(feature = "user")]
mod pod {
    // SAFETY: all are `#[repr(C)]`, `Copy`, and have no padding (sizes asserted above).
    unsafe impl aya::Pod for super::FlowKey {}
    unsafe impl aya::Pod for super::FlowKeyV4 {}
    unsafe impl aya::Pod for super::DropKey {}
    unsafe impl aya::Pod for super::Rule {}
    unsafe impl aya::Pod for super::Config {}
    unsafe impl aya::Pod for super::Counter {}
    unsafe impl aya::Pod for crate::gcra::State {}
    unsafe impl aya::Pod for super::WideState {}
    unsafe impl aya::Pod for super::SourceState {}
    unsafe impl aya::Pod for super::RuleState {}
    unsafe impl aya::Pod for super::GlobalState {}
    unsafe impl aya::Pod for super::MatchGroup {}
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
