//! What the program writes: each rule's shared buckets, each source's
//! state, the wide states of the algorithms wider than one word, the
//! global state and the events counted.

use crate::{fixed_window, gcra, interval, rolling_quota, sliding_log, sliding_window};

/// Value of [`MAP_RULE_STATE`](crate::MAP_RULE_STATE): the buckets one rule's sources share, each a
/// [`gcra::State`] word updated with compare-and-swap, and the aggregate's
/// pressure episodes. A zeroed value is two full buckets and no episode. One
/// cache line per rule, so two busy rules never share one.
///
/// **Established and young sources.** Under a rule whose aggregate has a
/// reserve ([`Rule::aggregate_reserve`](crate::Rule::aggregate_reserve)), an *episode* of pressure begins when
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

/// A key's GCRA state in [`MAP_TABLE`](crate::MAP_TABLE), as the daemon reads it: its GCRA state (the only
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

/// Value of [`MAP_GLOBAL`](crate::MAP_GLOBAL).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct GlobalState {
    /// The state-creation cap's state ([`Config::new_states`](crate::Config::new_states)).
    pub new_states: u64,
    /// Zero.
    pub _pad: [u64; 7],
}
const _: () = assert!(core::mem::size_of::<GlobalState>() == 64);

/// Things that happen to state, counted per CPU in [`MAP_EVENTS`](crate::MAP_EVENTS).
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Event {
    /// A source was promoted by the doorkeeper and got a state of its own.
    StateCreated = 0,
    /// A source seen twice was refused a state: the state-creation cap
    /// ([`Config::new_states`](crate::Config::new_states)) was used up. Its frame was judged as a new
    /// source's.
    NewStateCapped = 1,
    /// A frame the program could not judge whole: more VLAN tags than it
    /// walks, an IPv6 extension header chain longer than it walks, a tiny or
    /// overlapping first fragment ([`Reason::TinyFragment`](crate::Reason::TinyFragment)), or a rule's match
    /// needed what the frame does not show (a transport header cut short; the
    /// ports or TCP flags of a non-first fragment). Counted whatever the
    /// policy ([`config_flags::UNJUDGED_DROP`](crate::config_flags::UNJUDGED_DROP), [`config_flags::UNJUDGED_PASS`](crate::config_flags::UNJUDGED_PASS),
    /// [`config_flags::FRAGMENTS_DROP`](crate::config_flags::FRAGMENTS_DROP)) then did with it.
    Unjudged = 2,
    /// An IPv4 key found no free slot in its two lines of the state table
    /// ([`crate::table`]): it got no state, and its frame was judged as a new
    /// source's (a key level's: by its other levels).
    StateFull = 3,
    /// A key of a fleet-wide rule found its set of the fleet's counts
    /// ([`crate::fleet_table`]) full of keys counted within
    /// [`crate::fleet_table::STALE_NS`]: the frame it was admitted was not
    /// counted for the fleet (the other members do not see it).
    FleetFull = 4,
}

/// Number of [`Event`]s: the size of [`MAP_EVENTS`](crate::MAP_EVENTS).
pub const EVENT_COUNT: u32 = 5;

impl Event {
    /// Every event, in index order.
    pub const ALL: [Event; EVENT_COUNT as usize] = [
        Event::StateCreated,
        Event::NewStateCapped,
        Event::Unjudged,
        Event::StateFull,
        Event::FleetFull,
    ];

    /// Stable name, used in stats output and metric labels.
    pub const fn name(self) -> &'static str {
        match self {
            Event::StateCreated => "states_created",
            Event::NewStateCapped => "new_states_capped",
            Event::Unjudged => "unjudged",
            Event::StateFull => "state_full",
            Event::FleetFull => "fleet_full",
        }
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
