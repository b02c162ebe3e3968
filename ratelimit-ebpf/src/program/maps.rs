//! Every map of the program, in one place: their names are the `MAP_*` consts
//! of ratelimit-common and their keys and values its types, so the daemon and
//! the tests find each by name. Read and written by every stage; nothing here
//! runs.

use aya_ebpf::{
    macros::map,
    maps::{Array, HashMap, LpmTrie, LruHashMap, PerCpuArray, RingBuf},
};
use ratelimit_common::{
    Config, Counter, DEFAULT_RULES_CAPACITY, DEFAULT_SEEN_SLOTS, DEFAULT_STATE_CAPACITY,
    DEFAULT_STATE_V6_CAPACITY, DEFAULT_WIDE_CAPACITY, DROP_LOG_BYTES, DropLogBudget, EVENT_COUNT,
    FLEET_CAPACITY, FLEET_SETS, FleetBeat, FleetCursor, FleetSet, FlowKey, GROUPS_CAPACITY,
    GlobalState, KNOWN_WORDS, MatchGroup, REASON_COUNT, RULE_COUNTERS, Rule, RuleAddr, RuleState,
    TOP_SETS, TopSet, WideState, rule_table_len, state_lines,
    table::{Born, Line},
};

/// `BPF_F_MMAPABLE`: the array may be mapped into a process's memory.
const BPF_F_MMAPABLE: u32 = 1 << 10;

// Map names must equal the `MAP_*` consts of ratelimit-common (a test checks).
#[map(name = "RL_RULES")]
pub(crate) static RL_RULES: LpmTrie<RuleAddr, u32> =
    LpmTrie::with_max_entries(DEFAULT_RULES_CAPACITY, 0);

#[map(name = "RL_RULES_B")]
pub(crate) static RL_RULES_B: LpmTrie<RuleAddr, u32> =
    LpmTrie::with_max_entries(DEFAULT_RULES_CAPACITY, 0);

// Every rule can change at once: twice the rules and the default rule, and
// the two rules of the unjudged-frame policies (allow, deny) last.
#[map(name = "RL_RULE_TABLE")]
pub(crate) static RL_RULE_TABLE: Array<Rule> =
    Array::with_max_entries(rule_table_len(DEFAULT_RULES_CAPACITY), 0);

#[map(name = "RL_GROUPS")]
pub(crate) static RL_GROUPS: Array<MatchGroup> = Array::with_max_entries(2 * GROUPS_CAPACITY, 0);

// Mapped into the daemon's memory (`BPF_F_MMAPABLE`), which reads and,
// under fleet-wide rules, claims slots with the same atomics.
#[map(name = "RL_TABLE")]
pub(crate) static RL_TABLE: Array<Line> = Array::with_max_entries(TABLE_LINES, BPF_F_MMAPABLE);

#[map(name = "RL_BORN")]
pub(crate) static RL_BORN: Array<Born> = Array::with_max_entries(TABLE_LINES, BPF_F_MMAPABLE);

/// The table's default lines: both families' (the daemon sizes it at load).
const TABLE_LINES: u32 =
    state_lines(DEFAULT_STATE_CAPACITY) + state_lines(DEFAULT_STATE_V6_CAPACITY);

#[map(name = "RL_STATS")]
pub(crate) static RL_STATS: PerCpuArray<Counter> = PerCpuArray::with_max_entries(REASON_COUNT, 0);

#[map(name = "RL_CONFIG")]
pub(crate) static RL_CONFIG: Array<Config> = Array::with_max_entries(1, 0);

#[map(name = "RL_WIDE")]
pub(crate) static RL_WIDE: LruHashMap<FlowKey, WideState> =
    LruHashMap::with_max_entries(DEFAULT_WIDE_CAPACITY, 0);

#[map(name = "RL_WIDE_ZERO")]
pub(crate) static RL_WIDE_ZERO: PerCpuArray<WideState> = PerCpuArray::with_max_entries(1, 0);

// Mapped into the daemon's memory, which reads `top`'s counts there.
#[map(name = "RL_DROPS")]
pub(crate) static RL_DROPS: Array<TopSet> = Array::with_max_entries(TOP_SETS, BPF_F_MMAPABLE);

#[map(name = "RL_SEEN")]
pub(crate) static RL_SEEN: Array<u64> = Array::with_max_entries(DEFAULT_SEEN_SLOTS, 0);

// One slot per rule plus the default rule's (slot 0).
#[map(name = "RL_RULE_STATE")]
pub(crate) static RL_RULE_STATE: Array<RuleState> =
    Array::with_max_entries(DEFAULT_RULES_CAPACITY + 1, 0);

#[map(name = "RL_RULE_STATS")]
pub(crate) static RL_RULE_STATS: PerCpuArray<Counter> =
    PerCpuArray::with_max_entries((DEFAULT_RULES_CAPACITY + 1) * RULE_COUNTERS, 0);

#[map(name = "RL_GLOBAL")]
pub(crate) static RL_GLOBAL: Array<GlobalState> = Array::with_max_entries(1, 0);

#[map(name = "RL_EVENTS")]
pub(crate) static RL_EVENTS: PerCpuArray<u64> = PerCpuArray::with_max_entries(EVENT_COUNT, 0);

#[map(name = "RL_KNOWN")]
pub(crate) static RL_KNOWN: Array<u64> = Array::with_max_entries(KNOWN_WORDS, 0);

// Mapped into the daemon's memory, which reads the counts there.
#[map(name = "RL_FLEET_USED")]
pub(crate) static RL_FLEET_USED: Array<FleetSet> =
    Array::with_max_entries(FLEET_SETS, BPF_F_MMAPABLE);

// The daemon's report cursor: in the object so that it is created, pinned
// and adopted with the rest; the program never reads it.
#[map(name = "RL_FLEET_REPORTED")]
pub(crate) static RL_FLEET_REPORTED: HashMap<FlowKey, FleetCursor> =
    HashMap::with_max_entries(FLEET_CAPACITY, 0);

#[map(name = "RL_FLEET_BEAT")]
pub(crate) static RL_FLEET_BEAT: Array<FleetBeat> = Array::with_max_entries(1, 0);

// The drop log (`droplog`): records for the daemon, and each CPU's budget.
#[map(name = "RL_DROP_LOG")]
pub(crate) static RL_DROP_LOG: RingBuf = RingBuf::with_byte_size(DROP_LOG_BYTES, 0);

#[map(name = "RL_DROP_LOG_BUDGET")]
pub(crate) static RL_DROP_LOG_BUDGET: PerCpuArray<DropLogBudget> =
    PerCpuArray::with_max_entries(1, 0);
