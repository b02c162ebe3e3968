//! A rule as the program reads it from the rule table: its action,
//! algorithm and parameters, key levels, shared levels and flags, and the
//! counters it is counted in.

use super::*;
use crate::{fixed_window, gcra, interval, rolling_quota, sliding_log, sliding_window};

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
    /// [`super::MAP_TABLE`].
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
    /// 1 for the policy rule of a counted list (its entries point at it,
    /// its [`Rule::slot`] counts the list's frames), else 0. Written and
    /// read by the daemon only: it tells such a rule from a rule of a CIDR
    /// when the maps are read back.
    pub counted_list: u8,
    /// Zero.
    pub _pad: u8,
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
