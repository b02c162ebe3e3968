//! Fail-open or fail-closed, decided here and only here:
//! - frames that are not IP (ARP, LLDP, …; the kernel does not deliver them as
//!   IP either): **pass**, counted `not_ip`.
//! - frames the kernel would deliver as IP but the program cannot judge (more
//!   than `MAX_VLAN_TAGS` VLAN tags, an IPv6 extension header chain longer than
//!   `MAX_EXT_HEADERS`, a tiny or overlapping first fragment): the `unjudged`
//!   policy, **drop** by default (`UNJUDGED_DROP`, counted `unjudged` and
//!   `tiny_fragment`); `next-rule` lets the rules that need nothing they hide
//!   judge them, `pass` passes them.
//! - a non-first fragment (no ports, no TCP flags) under a match that needs
//!   them: the `fragments` policy, the next rule of its source by default (its
//!   first fragment was judged whole, so its datagram cannot be completed past
//!   a rule), or drop (`FRAGMENTS_DROP`).
//! - truncated or malformed IP: **pass**, counted (the kernel drops it too);
//!   dropped instead when the daemon sets `DROP_MALFORMED`.
//! - a source without state is judged by its rule's **new-source budget** (drop
//!   when it is used up, counted as `new_source_limited`); it gets a state of
//!   its own only when the doorkeeper has seen it twice (see
//!   `ratelimit_common::doorkeeper`), and then only within the state-creation
//!   cap.
//! - a promoted source whose state cannot be stored: **pass**, counted as
//!   `state_failed` (an LRU map evicts rather than fail: not seen in practice).
//! - compare-and-swap retries exhausted on one key: **drop**, counted as
//!   `contended`; each failed retry means another CPU was admitted on that key in
//!   between, so it is being flooded.
//! - the default rule missing (cannot happen for an array map): **pass**.
//! - dry run (global or per rule): nothing is dropped for a limit or a deny rule;
//!   what would have been is counted as `would_drop`.
//!
//! Levels: a frame under a rule with an aggregate passes only if both its own
//! bucket (or the new-source budget) and the aggregate allow it. The own level
//! is decided first without writing, the aggregate is then taken with
//! compare-and-swap, and the own level is committed last; if that commit finds
//! the own level empty after all (another CPU took the last token), the
//! aggregate's units are given back. So a frame denied at one level consumes
//! nothing at the other, and no level ever admits more than its own bucket.
//!
//! An aggregate with a reserve ([`Rule::aggregate_reserve`]) tells young
//! sources (no state yet, or a state created during the current episode of
//! pressure) from established ones ([`RuleState`]): a young frame is taken
//! from the aggregate only if the reserve stays whole after it
//! ([`gcra::admit_keeping`]), and is refused as `AggregateYoung` otherwise;
//! the aggregate stays one word, so the classes never make it admit more.
//!
//! A rule's further key levels (its sources' /24 beside their own /32, say)
//! sit between the two: once the own level would admit the frame, each is
//! taken in turn with compare-and-swap ([`rl_levels`]); a level that refuses
//! makes the ones taken before it get their units back, and so does an
//! aggregate or an own commit that refuses after them.

use core::{
    intrinsics::{AtomicOrdering, atomic_cxchg, atomic_or, atomic_xadd, atomic_xchg},
    mem::size_of,
    ptr::{read_unaligned, read_volatile},
};

use aya_ebpf::{
    bindings::{
        BPF_NOEXIST, bpf_sock_tuple, bpf_sock_tuple__bindgen_ty_1__bindgen_ty_1,
        bpf_sock_tuple__bindgen_ty_1__bindgen_ty_2, xdp_action, xdp_md,
    },
    cty::c_void,
    helpers::{
        bpf_ktime_get_coarse_ns, bpf_ktime_get_ns, bpf_sk_lookup_tcp, bpf_sk_lookup_udp,
        bpf_sk_release,
    },
    macros::{map, xdp},
    maps::{Array, LpmTrie, LruHashMap, PerCpuArray, lpm_trie::Key},
    programs::XdpContext,
};
use aya_log_ebpf::warn;
use network_types::{
    eth::{EthHdr, EtherType},
    ip::{Ipv4Hdr, Ipv6Hdr},
    vlan::VlanHdr,
};
use ratelimit_common::{
    CAS_RETRIES, Config, Counter, DEFAULT_RULES_CAPACITY, DEFAULT_SEEN_SLOTS,
    DEFAULT_STATE_CAPACITY, DEFAULT_STATE_V6_CAPACITY, DEFAULT_WIDE_CAPACITY, DROP_SAMPLE,
    DROPS_CAPACITY, DropKey, EVENT_COUNT, Event, FAMILY_BITS, FLEET_CAPACITY, FlowKey, FlowKeyV4,
    GROUP_BIT, GROUPS_CAPACITY, GlobalState, KNOWN_WORDS, KeyLevel, LOCK_RETRIES, MAX_EXT_HEADERS,
    MAX_MATCHES, MAX_VLAN_TAGS, MatchEntry, MatchGroup, NO_RULE, REASON_COUNT, RULE_COUNTERS,
    Reason, Rule, RuleAddr, RuleCounter, RuleState, SourceState, V4_MAPPED_WORD, WIDE_WORDS,
    WideState, Words, action, addr_of, algorithm, config_flags, doorkeeper, episode, family,
    fixed_window, gcra, interval, known_bit, level_flags, match_fields, rolling_quota, rule_addr,
    rule_flags, rule_table_len, sliding_log, sliding_window,
};

// Map names must equal the `MAP_*` consts of ratelimit-common (a test checks).
#[map(name = "RL_RULES")]
static RL_RULES: LpmTrie<RuleAddr, u32> = LpmTrie::with_max_entries(DEFAULT_RULES_CAPACITY, 0);

#[map(name = "RL_RULES_B")]
static RL_RULES_B: LpmTrie<RuleAddr, u32> = LpmTrie::with_max_entries(DEFAULT_RULES_CAPACITY, 0);

// Every rule can change at once: twice the rules and the default rule, and
// the two rules of the unjudged-frame policies (allow, deny) last.
#[map(name = "RL_RULE_TABLE")]
static RL_RULE_TABLE: Array<Rule> =
    Array::with_max_entries(rule_table_len(DEFAULT_RULES_CAPACITY), 0);

#[map(name = "RL_GROUPS")]
static RL_GROUPS: Array<MatchGroup> = Array::with_max_entries(2 * GROUPS_CAPACITY, 0);

#[map(name = "RL_STATE")]
static RL_STATE: LruHashMap<FlowKey, SourceState> =
    LruHashMap::with_max_entries(DEFAULT_STATE_V6_CAPACITY, 0);

#[map(name = "RL_STATE4")]
static RL_STATE4: LruHashMap<FlowKeyV4, SourceState> =
    LruHashMap::with_max_entries(DEFAULT_STATE_CAPACITY, 0);

#[map(name = "RL_STATS")]
static RL_STATS: PerCpuArray<Counter> = PerCpuArray::with_max_entries(REASON_COUNT, 0);

#[map(name = "RL_CONFIG")]
static RL_CONFIG: Array<Config> = Array::with_max_entries(1, 0);

#[map(name = "RL_WIDE")]
static RL_WIDE: LruHashMap<FlowKey, WideState> =
    LruHashMap::with_max_entries(DEFAULT_WIDE_CAPACITY, 0);

#[map(name = "RL_WIDE_ZERO")]
static RL_WIDE_ZERO: PerCpuArray<WideState> = PerCpuArray::with_max_entries(1, 0);

#[map(name = "RL_DROPS")]
static RL_DROPS: LruHashMap<DropKey, u64> = LruHashMap::with_max_entries(DROPS_CAPACITY, 0);

#[map(name = "RL_SEEN")]
static RL_SEEN: Array<u64> = Array::with_max_entries(DEFAULT_SEEN_SLOTS, 0);

// One slot per rule plus the default rule's (slot 0).
#[map(name = "RL_RULE_STATE")]
static RL_RULE_STATE: Array<RuleState> = Array::with_max_entries(DEFAULT_RULES_CAPACITY + 1, 0);

#[map(name = "RL_RULE_STATS")]
static RL_RULE_STATS: PerCpuArray<Counter> =
    PerCpuArray::with_max_entries((DEFAULT_RULES_CAPACITY + 1) * RULE_COUNTERS, 0);

#[map(name = "RL_GLOBAL")]
static RL_GLOBAL: Array<GlobalState> = Array::with_max_entries(1, 0);

#[map(name = "RL_EVENTS")]
static RL_EVENTS: PerCpuArray<u64> = PerCpuArray::with_max_entries(EVENT_COUNT, 0);

#[map(name = "RL_KNOWN")]
static RL_KNOWN: Array<u64> = Array::with_max_entries(KNOWN_WORDS, 0);

#[map(name = "RL_FLEET_USED")]
static RL_FLEET_USED: LruHashMap<FlowKey, Counter> =
    LruHashMap::with_max_entries(FLEET_CAPACITY, 0);

const ETH_P_8021Q: u16 = EtherType::Ieee8021q as u16;
const ETH_P_8021AD: u16 = EtherType::Ieee8021ad as u16;
const ETH_P_IP: u16 = EtherType::Ipv4 as u16;
const ETH_P_IPV6: u16 = EtherType::Ipv6 as u16;
const EEXIST: i32 = 17;
/// Retries of a compare-and-swap on a word few CPUs touch at once (a
/// doorkeeper slot, a unit given back): fewer paths for the verifier. Running
/// out errs toward limiting (a sighting not recorded, a unit not given back).
const SHORT_RETRIES: u32 = 4;

/// What parsing found: the family rules see ([`family`], 0 when not IP;
/// IPv4 for an IPv6 frame from an IPv4-mapped source), the source address
/// words (IPv4-mapped for IPv4), where the IP header starts, and whether the
/// frame can be judged ([`JUDGED`], [`UNJUDGED`], [`TINY`]).
struct Parsed {
    family: u8,
    source: Words,
    l3: usize,
    judged: u32,
}

/// [`Parsed::judged`]: the frame can be judged.
const JUDGED: u32 = 0;
/// More VLAN tags than [`MAX_VLAN_TAGS`], or an IPv6 extension header chain
/// longer than [`MAX_EXT_HEADERS`].
const UNJUDGED: u32 = 1;
/// A first fragment too short for the transport header fields rules match
/// on, or a TCP fragment at offset 8 ([`Reason::TinyFragment`]).
const TINY: u32 = 2;

/// The verdict before dry run is applied.
struct Outcome {
    reason: Reason,
    /// The rule asked for dry run.
    dry_run: bool,
    /// What a drop is charged to in `top`: the frame's source address, or
    /// for a drop at a key level its key (zero when not IP).
    source: Words,
    /// The bits of `source` that count: 0 for all of them.
    prefix: u8,
    /// 1 for a source, 2 or 3 for a key level.
    level: u8,
    /// The rule's counters: its first slot in `RL_RULE_STATS` (`NO_SLOT`
    /// when no rule judged the frame).
    counters: u32,
}

/// No rule's counters.
const NO_SLOT: u32 = u32::MAX;

impl Outcome {
    const fn of(reason: Reason) -> Self {
        Self {
            reason,
            dry_run: false,
            source: [0; 4],
            prefix: 0,
            level: 1,
            counters: NO_SLOT,
        }
    }
}

#[xdp]
pub fn ratelimit(ctx: XdpContext) -> u32 {
    let len = (ctx.data_end() - ctx.data()) as u64;
    let Some(config) = RL_CONFIG.get(0) else {
        return xdp_action::XDP_PASS;
    };
    let mut dropper = None;
    let (reason, action) = match try_ratelimit(&ctx, len, config) {
        Ok(Outcome {
            reason,
            dry_run,
            source,
            prefix,
            level,
            counters,
        }) => {
            let dry = dry_run || config.flags & config_flags::DRY_RUN != 0;
            let (reason, action) = if reason.drops() {
                // `top` ranks sources and networks: a drop for a shared budget
                // says nothing about the source that happened to meet it.
                // A would-drop is no drop: `top` ranks what is dropped.
                if !dry
                    && matches!(
                        reason,
                        Reason::Limited
                            | Reason::Denied
                            | Reason::NotAllowed
                            | Reason::Level2Limited
                            | Reason::Level3Limited
                    )
                {
                    dropper = Some(DropKey {
                        addr: addr_of(&source),
                        prefix,
                        level,
                        _pad: [0; 2],
                    });
                }
                if dry {
                    (Reason::WouldDrop, xdp_action::XDP_PASS)
                } else {
                    (reason, xdp_action::XDP_DROP)
                }
            } else {
                (reason, xdp_action::XDP_PASS)
            };
            count_rule(counters, reason, len);
            (reason, action)
        }
        Err(Malformed) => {
            let drop = config.flags & config_flags::DROP_MALFORMED != 0
                && config.flags & config_flags::DRY_RUN == 0;
            let action = if drop {
                xdp_action::XDP_DROP
            } else {
                xdp_action::XDP_PASS
            };
            (Reason::Malformed, action)
        }
    };
    let n = count(reason, len);

    // `top` needs drops per source, but a hash update per dropped frame would
    // double the cost of the drop path: one drop in DROP_SAMPLE (per CPU) is
    // credited DROP_SAMPLE times to its source.
    if let Some(key) = dropper
        && n.is_multiple_of(DROP_SAMPLE)
    {
        count_drop(&key, DROP_SAMPLE);
    }
    if reason == Reason::StateFailed {
        warn!(&ctx, "storing a promoted source's state failed; passed");
    }
    action
}

/// A truncated or malformed IP frame.
struct Malformed;

#[inline(always)]
fn try_ratelimit(ctx: &XdpContext, len: u64, config: &Config) -> Result<Outcome, Malformed> {
    let Parsed {
        family,
        source,
        l3,
        judged,
    } = parse(ctx)?;
    if judged != JUDGED {
        // Judged here, once, by the policy; nothing below reads `judged`, so
        // the verifier walks the rest once for judged and unjudged frames.
        // Under `next-rule` and `pass` a frame with a source goes on: the
        // rules that need nothing it hides judge it, and a match that needs
        // what it hides counts it ([`rl_select`]).
        let drop = config.flags & config_flags::UNJUDGED_DROP != 0;
        if drop || family == 0 {
            event(Event::Unjudged);
            // Nothing to judge by (no source) is dropped under `next-rule`
            // too; passed only by `pass`, outside allowlist-only mode.
            let pass = !drop
                && config.flags & config_flags::UNJUDGED_PASS != 0
                && config.flags & config_flags::ALLOWLIST_ONLY == 0;
            return Ok(Outcome::of(if pass {
                Reason::Allowed
            } else if judged == TINY {
                Reason::TinyFragment
            } else {
                Reason::Unjudged
            }));
        }
    }
    if family == 0 {
        return Ok(Outcome::of(Reason::NotIp));
    }
    let Some(rule) = lookup_rule(ctx, l3, family, &source, config) else {
        return Ok(Outcome::of(Reason::Passed));
    };
    let mut reason = match rule.action {
        action::LIMIT => reason_of(rl_limit(
            ctx.ctx,
            l3 as u64,
            u64::from(family) | (len << 16),
            rule.index,
        )),
        action::DENY => Reason::Denied,
        action::ALLOW => Reason::Allowed,
        // Allowlist-only mode: the daemon marks every other rule so.
        _ => Reason::NotAllowed,
    };
    // A limit never drops the host's own connections; the check is made on
    // the drop path only, so frames within their limit pay nothing for it.
    if reason.drops()
        && reason != Reason::Denied
        && reason != Reason::NotAllowed
        && rule.flags & rule_flags::HOST_CONNECTIONS != 0
        && config.local_ports != 0
        && rl_host_connection(ctx.ctx, l3 as u64, config.local_ports) != 0
    {
        reason = Reason::HostConnection;
    }
    // A source is charged whole: prefix 0 stands for all its bits.
    let (mut charged, mut prefix, mut level) = (source, 0u8, 1u8);
    if matches!(reason, Reason::Level2Limited | Reason::Level3Limited) {
        let n = if reason == Reason::Level2Limited {
            0
        } else {
            1
        };
        let lv = &rule.levels[n];
        charged = level_masked(lv, family, &source);
        prefix = if family == family::V4 {
            lv.key_prefix_v4
        } else {
            lv.key_prefix_v6
        };
        level = n as u8 + 2;
    }
    Ok(Outcome {
        reason,
        dry_run: rule.flags & rule_flags::DRY_RUN != 0,
        source: charged,
        prefix,
        level,
        counters: rule.slot.wrapping_mul(RULE_COUNTERS),
    })
}

/// The clock the daemon chose: `bpf_ktime_get_ns`, or the cheaper time of the
/// last tick.
#[inline(always)]
fn clock(config: &Config) -> u64 {
    // SAFETY: helpers with no preconditions.
    unsafe {
        if config.flags & config_flags::COARSE_CLOCK != 0 {
            bpf_ktime_get_coarse_ns()
        } else {
            bpf_ktime_get_ns()
        }
    }
}

/// The aggregate level of a rule: its state word (null when the rule has
/// none), parameters and the frame's cost there.
///
/// Values the verifier sees are plain structs with every field set, never an
/// `Option` or an enum with a payload: LLVM leaves the unused payload of such
/// values undefined, and the verifier refuses to read an uninitialized register.
#[derive(Clone, Copy)]
struct Aggregate {
    word: *mut u64,
    params: &'static gcra::Params,
    cost: u64,
}

impl Aggregate {
    #[inline(always)]
    fn is_some(&self) -> bool {
        !self.word.is_null()
    }
}

#[inline(always)]
fn aggregate(rule: &'static Rule, shared: *mut RuleState, len: u64) -> Aggregate {
    let word = if rule.flags & rule_flags::AGGREGATE == 0 || shared.is_null() {
        core::ptr::null_mut()
    } else {
        // SAFETY: a field of a map value valid for this run.
        unsafe { &raw mut (*shared).aggregate }
    };
    Aggregate {
        word,
        params: &rule.aggregate,
        cost: if rule.flags & rule_flags::AGGREGATE_BYTES != 0 {
            len
        } else {
            1
        },
    }
}

/// What judges a frame under a limit rule (all fields always set; see
/// [`Aggregate`]).
struct Target {
    kind: Kind,
    /// For [`Kind::Gcra`]: the source's own bucket, or the new-source budget.
    level: Level,
    /// For [`Kind::Done`]: the verdict.
    reason: Reason,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Gcra,
    Wide,
    Done,
}

impl Target {
    #[inline(always)]
    fn gcra(level: Level) -> Self {
        Self {
            kind: Kind::Gcra,
            level,
            reason: Reason::Passed,
        }
    }

    #[inline(always)]
    /// The key has a wide state ([`rl_wide`] finds it again).
    fn wide(rule: &Rule) -> Self {
        Self {
            kind: Kind::Wide,
            level: Level::none(rule),
            reason: Reason::Passed,
        }
    }

    #[inline(always)]
    fn done(reason: Reason, rule: &Rule) -> Self {
        Self {
            kind: Kind::Done,
            level: Level::none(rule),
            reason,
        }
    }
}

/// A frame under the limit rule at `index` in the rule table, whose IP header
/// starts at `l3`; `packed` holds the family rules see (bits 0-7) and the
/// frame's length (from bit 16). Answers the [`Reason`].
///
/// A global function, as [`rl_host_connection`]: the parse's paths (VLAN
/// tags, families, extension headers, fragments) each reach the limit with
/// registers of their own, and inlined the verifier walked the whole limit
/// again for each; here it walks it once.
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn rl_limit(ctx: *mut xdp_md, l3: u64, packed: u64, index: u32) -> u32 {
    // A rule or config that cannot be read (never, with the daemon's own
    // indices) leaves the frame unjudged: dropped, never passed.
    let (Some(rule), Some(config)) = (RL_RULE_TABLE.get(index), RL_CONFIG.get(0)) else {
        return Reason::Unjudged as u32;
    };
    // See `rl_host_connection` on the mask.
    // SAFETY: a local.
    let l3 = (unsafe { read_volatile(&l3) } & 63) as usize;
    let xdp = XdpContext::new(ctx);
    // The parse read this very header; should it not read again, the frame
    // cannot be judged by its limit: dropped as unjudged, never passed.
    let Ok(source) = source_at(&xdp, l3) else {
        return Reason::Unjudged as u32;
    };
    limit(
        &xdp,
        l3,
        rule,
        (packed & 0xff) as u8,
        &source,
        packed >> 16,
        config,
    ) as u32
}

/// Applies a limit rule to the frame from `source`.
#[inline(always)]
fn limit(
    ctx: &XdpContext,
    l3: usize,
    rule: &'static Rule,
    fam: u8,
    source: &Words,
    len: u64,
    config: &Config,
) -> Reason {
    let masked = masked(rule, fam, source);
    let key = FlowKey::of(&masked, rule.id);
    let cost = if rule.flags & rule_flags::BYTES != 0 {
        len
    } else {
        1
    };
    let now = clock(config);
    let shared = match RL_RULE_STATE.get_ptr_mut(rule.slot) {
        Some(p) => p,
        None => core::ptr::null_mut(),
    };
    let agg = aggregate(rule, shared, len);
    if agg.is_some() && !peek(agg.word, agg.params, now, agg.cost) {
        // Refused at the aggregate whatever the source's own level and class
        // say: no need to find its state. Under a flood that empties even the
        // reserve, this is the whole cost of a frame.
        mark_refusal(rule, shared, now);
        return Reason::AggregateLimited;
    }
    let mut target = Target::done(Reason::Passed, rule);
    let mut tracked = false;
    // A source without a state, or one promoted now, is young.
    let mut born = u64::MAX;
    // A key the filter has never seen has no state: a spoofed source skips
    // the lookup, a miss in millions of buckets. Keys of fleet-wide rules are
    // looked up whatever it says (the daemon inserts states for them).
    let known = rl_known(
        doorkeeper::hash_words(&masked, rule.id, config.hash_seed),
        u64::from(rule.flags & rule_flags::FLEET),
    ) != 0;
    if rule.algorithm == algorithm::GCRA {
        let state = if fam == family::V4 {
            known_v4(&key, known)
        } else {
            known_v6(&key, known)
        };
        if !state.is_null() {
            target = Target::gcra(Level::own(state.cast::<u64>(), rule, cost));
            tracked = true;
            // SAFETY: a map value valid for this run; written once, at its
            // creation.
            born = unsafe { read_volatile(&raw const (*state).born) };
        }
    } else if known_wide(&key, known) {
        target = Target::wide(rule);
        tracked = true;
    }
    if !tracked {
        let found = rl_untracked(
            ctx.ctx,
            l3 as u64,
            u64::from(fam) | (len << 16),
            rule.index,
            now,
        );
        target = match found {
            UNTRACKED_PROMOTED => {
                let state = if fam == family::V4 {
                    state_v4(&key)
                } else {
                    state_v6(&key)
                };
                if state.is_null() {
                    Target::done(Reason::StateFailed, rule)
                } else {
                    Target::gcra(Level::own(state.cast::<u64>(), rule, cost))
                }
            }
            UNTRACKED_PROMOTED_WIDE => Target::wide(rule),
            UNTRACKED_BUDGET => new_source_level(rule),
            r => Target::done(reason_of(r), rule),
        };
    }
    let reason = match target.kind {
        Kind::Gcra => two_levels(
            target.level,
            &shared_levels(ctx, l3, rule, fam, len, now, young(rule, shared, born, now)),
            now,
        ),
        // The wide algorithms count packets (the daemon sets BYTES for gcra only).
        // Key levels are for gcra rules only (the daemon refuses others).
        Kind::Wide => reason_of(rl_wide(
            ctx.ctx,
            l3 as u64,
            u64::from(fam) | (len << 16),
            rule.index,
            now,
        )),
        Kind::Done => target.reason,
    };
    if matches!(reason, Reason::Passed | Reason::NewSource) {
        fleet_count(rule, &key, len);
    }
    reason
}

/// Counts a frame admitted under a fleet-wide `rule` for its key, for the
/// daemon to report to the fleet.
#[inline(always)]
fn fleet_count(rule: &Rule, key: &FlowKey, len: u64) {
    if rule.flags & rule_flags::FLEET == 0 {
        return;
    }
    match RL_FLEET_USED.get_ptr_mut(key) {
        // SAFETY: fields of a map value valid for this run; other CPUs change
        // them only by atomic add.
        Some(c) => unsafe {
            atomic_xadd::<u64, u64, { AtomicOrdering::Relaxed }>(&raw mut (*c).packets, 1);
            atomic_xadd::<u64, u64, { AtomicOrdering::Relaxed }>(&raw mut (*c).bytes, len);
        },
        None => {
            // Two CPUs counting a key's first frame at once lose one count
            // (the daemon's bound allows for a frame per key and sync).
            let first = Counter {
                packets: 1,
                bytes: len,
            };
            let _ = RL_FLEET_USED.insert(key, first, 0);
        }
    }
}

/// The bits of `source` that make its key under `rule`.
#[inline(always)]
fn masked(rule: &Rule, fam: u8, source: &Words) -> Words {
    mask_source(rule.mask_v4, &rule.mask_v6, fam, source)
}

/// `source` with only the bits of its family's mask kept.
#[inline(always)]
fn mask_source(mask_v4: u32, mask_v6: &Words, fam: u8, source: &Words) -> Words {
    if fam == family::V4 {
        [0, 0, V4_MAPPED_WORD, source[3] & mask_v4]
    } else {
        [
            source[0] & mask_v6[0],
            source[1] & mask_v6[1],
            source[2] & mask_v6[2],
            source[3] & mask_v6[3],
        ]
    }
}

/// The state of an IPv4 key, or null. Not inlined, nor is [`state_v6`]: with
/// both lookups in one function LLVM merges them into one call on either map,
/// and the verifier, which inlines a lookup only when its call site always
/// sees the same map, then leaves both to the slower generic helper.
#[inline(never)]
fn state_v4(key: &FlowKey) -> *mut SourceState {
    match RL_STATE4.get_ptr_mut(key.v4()) {
        Some(p) => p,
        None => core::ptr::null_mut(),
    }
}

/// The state of an IPv4 key the filter may know, or null. Apart from the
/// limit, as are [`known_v6`] and [`known_wide`]: a key the filter does not
/// know then comes back as a key without a state, and the verifier walks what
/// follows once for both.
#[inline(never)]
fn known_v4(key: &FlowKey, known: bool) -> *mut SourceState {
    if known {
        state_v4(key)
    } else {
        core::ptr::null_mut()
    }
}

/// The state of an IPv6 key the filter may know, or null. See [`known_v4`].
#[inline(never)]
fn known_v6(key: &FlowKey, known: bool) -> *mut SourceState {
    if known {
        state_v6(key)
    } else {
        core::ptr::null_mut()
    }
}

/// Whether a key the filter may know has a wide state. See [`known_v4`].
#[inline(never)]
fn known_wide(key: &FlowKey, known: bool) -> bool {
    known && RL_WIDE.get_ptr_mut(key).is_some()
}

/// The state of an IPv6 key, or null. See [`state_v4`].
#[inline(never)]
fn state_v6(key: &FlowKey) -> *mut SourceState {
    match RL_STATE.get_ptr_mut(*key) {
        Some(p) => p,
        None => core::ptr::null_mut(),
    }
}

/// One GCRA level: a state word, its parameters, the frame's cost there and
/// the reasons for its verdicts.
struct Level {
    word: *mut u64,
    params: *const gcra::Params,
    cost: u64,
    pass: Reason,
    deny: Reason,
}

impl Level {
    /// No level (a placeholder in a [`Target`] of another kind).
    #[inline(always)]
    fn none(rule: &Rule) -> Self {
        Self {
            word: core::ptr::null_mut(),
            params: rule.gcra_params(),
            cost: 0,
            pass: Reason::Passed,
            deny: Reason::Limited,
        }
    }

    /// A source's own bucket under `rule`.
    #[inline(always)]
    fn own(word: *mut u64, rule: &Rule, cost: u64) -> Self {
        Self {
            word,
            params: rule.gcra_params(),
            cost,
            pass: Reason::Passed,
            deny: Reason::Limited,
        }
    }
}

/// How the own level's commit ended.
enum Commit {
    Passed,
    Denied,
    Contended,
}

/// Decides a frame at its own level and the rule's shared levels (its key
/// levels and aggregate), committing all or none (module docs). A null own
/// word is no own level (a rule without a new-source budget): the shared
/// levels alone judge.
#[inline(always)]
fn two_levels(own: Level, shared: &Levels, now: u64) -> Reason {
    // SAFETY: `own.params` points into a rule value valid for this run.
    let params = unsafe { &*own.params };
    let unbounded = own.word.is_null();
    let (mut seen, mut next) = (0, gcra::State { tat: 0 });
    if !unbounded {
        // SAFETY: `own.word` points at an 8-byte, 8-aligned map value that
        // stays valid for the program's run (RCU); other CPUs change it only
        // through compare-and-swap.
        seen = unsafe { read_volatile(own.word) };
        next.tat = seen;
        if !gcra::admit(&mut next, params, now, own.cost) {
            if next.tat != seen {
                // A converted or capped debt (see gcra): stored even on a denial.
                cas(own.word, seen, next.tat);
            }
            return own.deny;
        }
    }
    if shared.on {
        let taken = shared.take();
        if taken != Reason::Passed {
            return taken;
        }
    }
    if unbounded {
        return own.pass;
    }
    // The own level, committed now: re-decided on what another CPU wrote.
    let mut end = Commit::Contended;
    for _ in 0..CAS_RETRIES {
        if next.tat == seen {
            end = Commit::Passed;
            break;
        }
        let (found, swapped) = cas(own.word, seen, next.tat);
        if swapped {
            end = Commit::Passed;
            break;
        }
        seen = found;
        next = gcra::State { tat: seen };
        if !gcra::admit(&mut next, params, now, own.cost) {
            end = Commit::Denied;
            break;
        }
    }
    match end {
        Commit::Passed => own.pass,
        denied => {
            // The shared levels get their units back.
            shared.give_back();
            if matches!(denied, Commit::Denied) {
                own.deny
            } else {
                Reason::Contended
            }
        }
    }
}

/// Whether the GCRA bucket at `word` would admit `cost` now (nothing written).
#[inline(always)]
fn peek(word: *mut u64, params: &gcra::Params, now: u64, cost: u64) -> bool {
    // SAFETY: as in `two_levels`.
    let mut next = gcra::State {
        tat: unsafe { read_volatile(word) },
    };
    gcra::admit(&mut next, params, now, cost)
}

/// Whether units were taken from a shared bucket.
enum Taken {
    Yes,
    No,
    Contended,
}

/// Takes `cost` units from the GCRA bucket at `word` if it has them, and
/// `keep` ticks more (a reserve the frame may not touch; see
/// [`gcra::admit_keeping`]).
#[inline(always)]
fn take(word: *mut u64, params: &gcra::Params, now: u64, cost: u64, keep: u64) -> Taken {
    // SAFETY: as in `two_levels`.
    let mut seen = unsafe { read_volatile(word) };
    let mut taken = Taken::Contended;
    for _ in 0..CAS_RETRIES {
        let mut next = gcra::State { tat: seen };
        let allowed = gcra::admit_keeping(&mut next, params, now, cost, keep);
        let (found, swapped) = if next.tat == seen {
            (seen, true)
        } else {
            cas(word, seen, next.tat)
        };
        if swapped {
            taken = if allowed { Taken::Yes } else { Taken::No };
            break;
        }
        seen = found;
    }
    taken
}

/// Gives `cost` units back to the GCRA bucket at `word` (never above its
/// capacity). Should the retries run out, the units stay taken: the bucket
/// errs toward limiting.
#[inline(always)]
fn give_back(word: *mut u64, params: &gcra::Params, now: u64, cost: u64) {
    // SAFETY: as in `two_levels`.
    let mut seen = unsafe { read_volatile(word) };
    for _ in 0..SHORT_RETRIES {
        let mut next = gcra::State { tat: seen };
        gcra::refund(&mut next, params, now, cost);
        let (found, swapped) = cas(word, seen, next.tat);
        if swapped {
            break;
        }
        seen = found;
    }
}

/// A limit rule's shared levels: its key levels beyond the frame's own
/// ([`Rule::levels`]) and its aggregate, as [`rl_levels`] takes them (all
/// fields always set; see [`Aggregate`]).
#[derive(Clone, Copy)]
struct Levels {
    /// The rule has such levels.
    on: bool,
    ctx: *mut xdp_md,
    l3: u64,
    /// The family, and the frame's length from bit 16 (see [`rl_levels`]).
    packed: u64,
    /// The rule's index in the rule table.
    index: u32,
    now: u64,
}

/// The reason a global function answered (`Contended` for a number that is
/// none: it errs toward limiting).
#[inline(always)]
fn reason_of(r: u32) -> Reason {
    if r < REASON_COUNT {
        // SAFETY: `Reason` is `repr(u32)` with every value below
        // `REASON_COUNT` a variant (`Reason::ALL` lists them in order).
        unsafe { core::mem::transmute::<u32, Reason>(r) }
    } else {
        Reason::Contended
    }
}

/// A frame under a rule of a wide-state algorithm ([`limit_wide`]) whose key
/// has a state: the rule at `index` in the rule table, `packed` as for
/// [`rl_levels`]. A global function, as [`rl_host_connection`]: the five
/// algorithms' decisions and refunds are verified once, apart, and the limit
/// path sees only a number come back (at the price of looking the key's
/// state up again here).
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn rl_wide(ctx: *mut xdp_md, l3: u64, packed: u64, index: u32, now: u64) -> u32 {
    let Some(rule) = RL_RULE_TABLE.get(index) else {
        return Reason::Passed as u32;
    };
    // See `rl_host_connection` on the mask.
    // SAFETY: a local.
    let l3 = (unsafe { read_volatile(&l3) } & 63) as usize;
    let fam = (packed & 0xff) as u8;
    // See `rl_limit` on a header that does not read again.
    let Ok(source) = source_at(&XdpContext::new(ctx), l3) else {
        return Reason::Unjudged as u32;
    };
    let key = FlowKey::of(&masked(rule, fam, &source), rule.id);
    match RL_WIDE.get_ptr_mut(key) {
        Some(wide) => limit_wide(wide, rule, packed >> 16, now) as u32,
        None => Reason::StateFailed as u32,
    }
}

/// The shared levels of `rule` for this frame, from a young source or not
/// (see [`young`]).
#[inline(always)]
fn shared_levels(
    ctx: &XdpContext,
    l3: usize,
    rule: &Rule,
    fam: u8,
    len: u64,
    now: u64,
    young: bool,
) -> Levels {
    Levels {
        on: rule.flags & (rule_flags::LEVELS | rule_flags::AGGREGATE) != 0,
        ctx: ctx.ctx,
        l3: l3 as u64,
        packed: u64::from(fam) | (len << 16) | if young { LEVELS_YOUNG } else { 0 },
        index: rule.index,
        now,
    }
}

/// [`rl_levels`]: take a unit at each level.
const LEVELS_TAKE: u64 = 0;
/// [`rl_levels`]: give each level its unit back.
const LEVELS_GIVE_BACK: u64 = 1 << 8;
/// [`rl_levels`]: the frame is from a young source ([`young`]).
const LEVELS_YOUNG: u64 = 1 << 11;

impl Levels {
    /// Takes the frame's units at every level, or at none: the reason it was
    /// refused, else `Passed`.
    #[inline(always)]
    fn take(&self) -> Reason {
        reason_of(rl_levels(
            self.ctx,
            self.l3,
            self.packed | LEVELS_TAKE,
            self.index,
            self.now,
        ))
    }

    /// Gives back what [`Levels::take`] took, once a later level refused.
    #[inline(always)]
    fn give_back(&self) {
        if self.on {
            rl_levels(
                self.ctx,
                self.l3,
                self.packed | LEVELS_GIVE_BACK,
                self.index,
                self.now,
            );
        }
    }
}

/// The shared levels of the rule at `index` in the rule table (its key
/// levels, then its aggregate), for the frame whose IP header starts at `l3`:
/// `packed` holds the family (bits 0-7), the operation ([`LEVELS_TAKE`] or
/// [`LEVELS_GIVE_BACK`]) and the frame's length (from bit 16). Taking answers
/// `Reason::Passed` when every level admitted the frame (its units are then
/// taken at each), else the reason of the level that refused (those before
/// it got their units back).
///
/// A global function, as [`rl_host_connection`]: the verifier checks it once
/// and the limit path sees only a number come back. It calls [`rl_level`] for
/// each level, so that the verifier walks each level's retries once, not
/// every combination of them.
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn rl_levels(ctx: *mut xdp_md, l3: u64, packed: u64, index: u32, now: u64) -> u32 {
    let passed = Reason::Passed as u32;
    let Some(rule) = RL_RULE_TABLE.get(index) else {
        return passed;
    };
    let keyed = rule.flags & rule_flags::LEVELS != 0 && rule.levels[0].is_on();
    let second = keyed && rule.levels[1].is_on();
    let agg = rule.flags & rule_flags::AGGREGATE != 0;
    let level = |n: u64, op: u64| rl_level(ctx, l3, packed | op | (n << LEVEL_SHIFT), index, now);
    let give_back_keyed = || {
        if keyed {
            level(1, LEVELS_GIVE_BACK);
        }
        if second {
            level(2, LEVELS_GIVE_BACK);
        }
    };
    if packed & LEVELS_GIVE_BACK != 0 {
        give_back_keyed();
        if agg {
            level(0, LEVELS_GIVE_BACK);
        }
        return passed;
    }
    if keyed {
        let r = level(1, LEVELS_TAKE);
        if r != passed {
            return r;
        }
    }
    if second {
        let r = level(2, LEVELS_TAKE);
        if r != passed {
            level(1, LEVELS_GIVE_BACK);
            return r;
        }
    }
    if agg {
        let r = level(0, LEVELS_TAKE);
        if r != passed {
            give_back_keyed();
            return r;
        }
    }
    passed
}

/// Where [`rl_level`] finds the level's number in `packed`: 0 for the
/// aggregate, 1 and 2 for [`Rule::levels`]` [0]` and `[1]`.
const LEVEL_SHIFT: u64 = 9;

/// One shared level of [`rl_levels`] (the level's number in `packed` at
/// [`LEVEL_SHIFT`]). A key level whose key has no state gets a full bucket
/// (only frames their own level admits come here, so a spoofed flood does not
/// create them); one whose state cannot be stored does not judge.
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn rl_level(ctx: *mut xdp_md, l3: u64, packed: u64, index: u32, now: u64) -> u32 {
    let passed = Reason::Passed as u32;
    let Some(rule) = RL_RULE_TABLE.get(index) else {
        return passed;
    };
    let giving = packed & LEVELS_GIVE_BACK != 0;
    let n = (packed >> LEVEL_SHIFT) & 3;
    let len = packed >> 16;
    let young = packed & LEVELS_YOUNG != 0;
    let (word, params, cost, refused) = if n == 0 {
        let agg = aggregate(rule, rule_state(rule), len);
        let refused = if young {
            Reason::AggregateYoung
        } else {
            Reason::AggregateLimited
        };
        (agg.word, agg.params, agg.cost, refused)
    } else {
        let (lv, refused) = if n == 1 {
            (&rule.levels[0], Reason::Level2Limited)
        } else {
            (&rule.levels[1], Reason::Level3Limited)
        };
        // See `rl_host_connection` on the mask.
        // SAFETY: a local.
        let l3 = (unsafe { read_volatile(&l3) } & 63) as usize;
        let fam = (packed & 0xff) as u8;
        let Ok(source) = source_at(&XdpContext::new(ctx), l3) else {
            return passed;
        };
        let cost = if lv.flags & level_flags::BYTES != 0 {
            len
        } else {
            1
        };
        let word = level_state(rule.id, n as u32, lv, fam, &source, now, !giving);
        (word, &lv.params, cost, refused)
    };
    if word.is_null() {
        return passed;
    }
    if giving {
        give_back(word, params, now, cost);
        return passed;
    }
    let keep = if n == 0 && young {
        rule.aggregate_reserve
    } else {
        0
    };
    match take(word, params, now, cost, keep) {
        Taken::Yes => passed,
        Taken::No => {
            if n == 0 {
                mark_refusal(rule, rule_state(rule), now);
            }
            refused as u32
        }
        Taken::Contended => Reason::Contended as u32,
    }
}

/// Whether a frame from a source whose state was created at `born`
/// (`u64::MAX` for none yet) is young at `rule`'s aggregate: a source without
/// a state, or, during an episode of pressure, one that got its state after
/// the episode began ([`RuleState`]).
#[inline(always)]
fn young(rule: &Rule, shared: *mut RuleState, born: u64, now: u64) -> bool {
    if rule.aggregate_reserve == 0 || shared.is_null() {
        return false;
    }
    // SAFETY: fields of a map value valid for this run; a torn view of two
    // words written apart only moves one frame between classes.
    let (episode_start, last) = unsafe {
        (
            read_volatile(&raw const (*shared).episode),
            read_volatile(&raw const (*shared).refused_at),
        )
    };
    episode::is_young(born, episode_start, last, now)
}

/// Notes a refusal at `rule`'s aggregate: it begins an episode of pressure
/// after a quiet one ([`RuleState`]). Written at most once per
/// [`ratelimit_common::REFUSAL_MARK_NS`], so that a flood's refusals read the line, not bounce it.
#[inline(always)]
fn mark_refusal(rule: &Rule, shared: *mut RuleState, now: u64) {
    if rule.aggregate_reserve == 0 || shared.is_null() {
        return;
    }
    // SAFETY: fields of a map value valid for this run; CPUs racing here all
    // write about the same time.
    unsafe {
        let last = read_volatile(&raw const (*shared).refused_at);
        let Some(begins) = episode::on_refusal(last, now) else {
            return;
        };
        if begins {
            core::ptr::write_volatile(&raw mut (*shared).episode, now);
        }
        core::ptr::write_volatile(&raw mut (*shared).refused_at, now);
    }
}

/// The bits of `source` that make its key at a key level.
#[inline(always)]
fn level_masked(lv: &KeyLevel, fam: u8, source: &Words) -> Words {
    mask_source(lv.mask_v4, &lv.mask_v6, fam, source)
}

/// The state word of `source`'s key at level `n` (1 or 2) of the rule
/// `rule_id`, created full if missing and `create`; null if there is none.
#[inline(always)]
fn level_state(
    rule_id: u32,
    n: u32,
    lv: &KeyLevel,
    fam: u8,
    source: &Words,
    now: u64,
    create: bool,
) -> *mut u64 {
    let key = FlowKey::of(&level_masked(lv, fam, source), KeyLevel::key_id(rule_id, n));
    // Looked up here, not through `state_v4` and `state_v6`: their frames
    // would make the deepest chain of calls (the program, `rl_limit`,
    // `rl_levels`, `rl_level`) too deep for the verifier's 512-byte stack.
    let fresh = SourceState {
        gcra: gcra::State::full(now, &lv.params),
        born: now,
    };
    let found = if fam == family::V4 {
        let key = key.v4();
        match RL_STATE4.get_ptr_mut(key) {
            Some(p) => Some(p),
            // Another CPU creating it at the same moment wins; this one then
            // takes from the winner's state.
            None if create => {
                let _ = RL_STATE4.insert(key, fresh, u64::from(BPF_NOEXIST));
                RL_STATE4.get_ptr_mut(key)
            }
            None => None,
        }
    } else {
        match RL_STATE.get_ptr_mut(key) {
            Some(p) => Some(p),
            None if create => {
                let _ = RL_STATE.insert(key, fresh, u64::from(BPF_NOEXIST));
                RL_STATE.get_ptr_mut(key)
            }
            None => None,
        }
    };
    match found {
        Some(p) => p.cast(),
        None => core::ptr::null_mut(),
    }
}

/// The source address words of the frame whose IP header starts at `l3`
/// (IPv4-mapped for IPv4), whichever family its rules see.
#[inline(always)]
fn source_at(ctx: &XdpContext, l3: usize) -> Result<Words, Malformed> {
    if version_at(ctx, l3)? == family::V4 {
        let ip: *const Ipv4Hdr = ptr_at(ctx, l3)?;
        // SAFETY: ptr_at checked the bounds; packet loads may be unaligned.
        let src = unsafe { read_unaligned((*ip).src_addr.as_ptr().cast::<u32>()) };
        Ok([0, 0, V4_MAPPED_WORD, src])
    } else {
        let ip: *const Ipv6Hdr = ptr_at(ctx, l3)?;
        // SAFETY: as above.
        Ok(unsafe { read_unaligned((*ip).src_addr.as_ptr().cast::<Words>()) })
    }
}

/// Compare-and-swap on a map value word: (the value found, whether it was
/// replaced).
#[inline(always)]
fn cas(word: *mut u64, old: u64, new: u64) -> (u64, bool) {
    // SAFETY: callers pass an 8-byte, 8-aligned word of a map value valid for
    // this run.
    unsafe {
        atomic_cxchg::<u64, { AtomicOrdering::SeqCst }, { AtomicOrdering::SeqCst }>(word, old, new)
    }
}

/// Counts `event` on this CPU.
#[inline(always)]
fn event(event: Event) {
    if let Some(n) = RL_EVENTS.get_ptr_mut(event as u32) {
        // SAFETY: a per-CPU slot, written only by this CPU.
        unsafe { *n += 1 };
    }
}

/// [`rl_untracked`]: the key got a gcra state now (the frame is judged
/// against it).
const UNTRACKED_PROMOTED: u32 = 0x100;
/// [`rl_untracked`]: the key got a wide state now.
const UNTRACKED_PROMOTED_WIDE: u32 = 0x101;
/// [`rl_untracked`]: the frame is judged by the new-source budget.
const UNTRACKED_BUDGET: u32 = 0x102;

/// A frame from a key without state under the limit rule at `index` ([`untracked`];
/// arguments as for [`rl_levels`]): answers [`UNTRACKED_PROMOTED`],
/// [`UNTRACKED_PROMOTED_WIDE`], [`UNTRACKED_BUDGET`], or the [`Reason`] of a
/// verdict already made.
///
/// A global function: the doorkeeper's retries and the promotion into six
/// algorithms' states are verified once, apart from the limit's paths.
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn rl_untracked(
    ctx: *mut xdp_md,
    l3: u64,
    packed: u64,
    index: u32,
    now: u64,
) -> u32 {
    // A rule or config that cannot be read (never, with the daemon's own
    // indices) leaves the frame unjudged: dropped, never passed.
    let (Some(rule), Some(config)) = (RL_RULE_TABLE.get(index), RL_CONFIG.get(0)) else {
        return Reason::Unjudged as u32;
    };
    // See `rl_host_connection` on the mask.
    // SAFETY: a local.
    let l3 = (unsafe { read_volatile(&l3) } & 63) as usize;
    let fam = (packed & 0xff) as u8;
    // See `rl_limit` on a header that does not read again.
    let Ok(source) = source_at(&XdpContext::new(ctx), l3) else {
        return Reason::Unjudged as u32;
    };
    let masked = masked(rule, fam, &source);
    let key = FlowKey::of(&masked, rule.id);
    let cost = if rule.flags & rule_flags::BYTES != 0 {
        packed >> 16
    } else {
        1
    };
    let target = untracked(&key, &masked, fam, rule, config, now, cost);
    match target.kind {
        // Its own bucket (the budget passes as `NewSource`).
        Kind::Gcra if target.level.pass == Reason::Passed => UNTRACKED_PROMOTED,
        Kind::Gcra => UNTRACKED_BUDGET,
        Kind::Wide => UNTRACKED_PROMOTED_WIDE,
        Kind::Done => target.reason as u32,
    }
}

/// The new-source budget of `rule` as a frame's own level (no own level when
/// the rule's new sources are unlimited: the aggregate alone judges them).
#[inline(always)]
fn new_source_level(rule: &'static Rule) -> Target {
    let shared = rule_state(rule);
    let word = if rule.flags & rule_flags::NEW_SOURCES_UNLIMITED != 0 || shared.is_null() {
        core::ptr::null_mut()
    } else {
        // SAFETY: a field of a map value valid for this run.
        unsafe { &raw mut (*shared).new_sources }
    };
    Target::gcra(Level {
        word,
        params: &rule.new_sources,
        cost: 1,
        pass: Reason::NewSource,
        deny: Reason::NewSourceLimited,
    })
}

/// A frame from a key with no state: the doorkeeper decides whether it earns
/// one (then the frame is judged against it); if not, the frame is judged by
/// the rule's new-source budget, and never admitted beyond what the key's own
/// fresh bucket would admit ([`Rule::burst`]).
///
/// Every frame that fits the key's own burst is counted in its doorkeeper slot
/// *before* the budget judges it, so a promotion on another CPU can never miss
/// a frame admitted at the same moment; a frame the budget then refuses stays
/// counted, which errs toward limiting.
#[inline(always)]
fn untracked(
    key: &FlowKey,
    masked: &Words,
    fam: u8,
    rule: &'static Rule,
    config: &Config,
    now: u64,
    cost: u64,
) -> Target {
    let h = doorkeeper::hash_words(masked, key.rule_id, config.hash_seed);
    let tag = doorkeeper::tag(h);
    let slot = match RL_SEEN.get_ptr_mut(doorkeeper::slot(h, config.seen_mask)) {
        Some(p) => p,
        None => core::ptr::null_mut(),
    };
    // What the slot counts per frame, and what a counted unit is charged as.
    let bytes = rule.flags & rule_flags::BYTES != 0;
    let units = doorkeeper::units(cost, bytes);
    let unit = if bytes { doorkeeper::BYTE_UNIT } else { 1 };
    let mut again = false;
    let mut admitted = 0u64;
    let mut fits = cost <= rule.burst;
    if !slot.is_null() {
        let epoch = doorkeeper::epoch(now);
        // SAFETY: an 8-byte array value, changed by other CPUs only through
        // compare-and-swap.
        let mut value = unsafe { read_volatile(slot) };
        for _ in 0..SHORT_RETRIES {
            let next = match doorkeeper::sight(value, tag, epoch) {
                doorkeeper::Sighting::Again { admitted: n } => {
                    again = true;
                    admitted = u64::from(n);
                    break;
                }
                doorkeeper::Sighting::First { record } => {
                    if fits {
                        record + units
                    } else {
                        record
                    }
                }
            };
            let (found, swapped) = cas(slot, value, next);
            if swapped {
                break;
            }
            value = found;
        }
    }
    if again {
        if take_new_state(config, now) {
            return promote(key, h, fam, rule, now, cost, admitted * unit);
        }
        event(Event::NewStateCapped);
        fits = admitted * unit + cost <= rule.burst;
        if fits {
            count_admitted(slot, tag, units);
        }
    }
    if !fits {
        return Target::done(Reason::Limited, rule);
    }
    new_source_level(rule)
}

/// Whether the key of doorkeeper hash `h` may have a state (see
/// [`ratelimit_common::MAP_KNOWN`]): its bit in the filter is set, or
/// `always` (a key of a fleet-wide rule). 1 or 0.
///
/// A global function: the limit sees one number come back, and so two paths
/// (known or not), not one per way of being known.
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn rl_known(h: u64, always: u64) -> u32 {
    if always != 0 {
        return 1;
    }
    let (word, bit) = known_bit(h);
    match RL_KNOWN.get_ptr(word) {
        // SAFETY: an 8-byte array value, changed only by atomic or.
        Some(w) => u32::from((unsafe { read_volatile(w) } & bit) != 0),
        None => 1,
    }
}

/// Sets the bit of the key of doorkeeper hash `h` in the filter of keys with
/// a state.
#[inline(always)]
fn mark_known(h: u64) {
    let (word, bit) = known_bit(h);
    if let Some(w) = RL_KNOWN.get_ptr_mut(word) {
        // SAFETY: an 8-byte, 8-aligned array value, changed only atomically.
        unsafe { atomic_or::<u64, u64, { AtomicOrdering::Relaxed }>(w, bit) };
    }
}

/// Counts a frame's units in the key's doorkeeper slot, to charge them when
/// the key is promoted.
#[inline(always)]
fn count_admitted(slot: *mut u64, tag: u32, units: u64) {
    if slot.is_null() {
        return;
    }
    // SAFETY: an 8-byte array value, changed only through compare-and-swap.
    let mut value = unsafe { read_volatile(slot) };
    for _ in 0..SHORT_RETRIES {
        let Some(more) = doorkeeper::count_more(value, tag, units) else {
            break;
        };
        let (found, swapped) = cas(slot, value, more);
        if swapped {
            break;
        }
        value = found;
    }
}

/// Takes one unit of the state-creation cap, retrying when another CPU took
/// one at the same moment: two CPUs promoting one key at once must both get
/// there (the loser of the insert then judges its frame against the winner's
/// state), or a frame counted in the doorkeeper after the winner read it would
/// pass uncharged. Retries run out as a refusal (the cap errs toward creating
/// fewer states, never more).
#[inline(always)]
fn take_new_state(config: &Config, now: u64) -> bool {
    let Some(global) = RL_GLOBAL.get_ptr_mut(0) else {
        return false;
    };
    // SAFETY: a field of a map value valid for this run.
    let word = unsafe { &raw mut (*global).new_states };
    // SAFETY: as in `two_levels`.
    let mut seen = unsafe { read_volatile(word) };
    for _ in 0..SHORT_RETRIES {
        let mut next = gcra::State { tat: seen };
        if !gcra::admit(&mut next, &config.new_states, now, 1) {
            return false;
        }
        let (found, swapped) = cas(word, seen, next.tat);
        if swapped {
            return true;
        }
        seen = found;
    }
    false
}

/// Gives `key` a state charged with the `admitted` units of cost (frames, or
/// bytes rounded up to 64 a frame) it got before; the frame is then judged
/// against it.
#[inline(always)]
fn promote(
    key: &FlowKey,
    h: u64,
    fam: u8,
    rule: &'static Rule,
    now: u64,
    cost: u64,
    admitted: u64,
) -> Target {
    // Before the insert: a CPU that finds the state must find the bit.
    mark_known(h);
    if rule.algorithm == algorithm::GCRA {
        let params = rule.gcra_params();
        let mut gcra = gcra::State::full(now, params);
        gcra::charge(&mut gcra, params, now, admitted);
        let fresh = SourceState { gcra, born: now };
        // Errors as plain numbers: see `Aggregate` on values with payloads.
        let code = |r: Result<(), i32>| match r {
            Ok(()) => 0,
            Err(e) => e,
        };
        let (inserted, state) = if fam == family::V4 {
            let key = key.v4();
            let inserted = code(RL_STATE4.insert(key, fresh, u64::from(BPF_NOEXIST)));
            (inserted, RL_STATE4.get_ptr_mut(key))
        } else {
            let inserted = code(RL_STATE.insert(key, fresh, u64::from(BPF_NOEXIST)));
            (inserted, RL_STATE.get_ptr_mut(key))
        };
        match inserted {
            0 => event(Event::StateCreated),
            // Another CPU promoted it first: its charge stands.
            e if e == -EEXIST => {}
            _ => return Target::done(Reason::StateFailed, rule),
        }
        return match state {
            Some(state) => Target::gcra(Level::own(state.cast::<u64>(), rule, cost)),
            None => Target::done(Reason::StateFailed, rule),
        };
    }
    let Some(fresh) = RL_WIDE_ZERO.get_ptr_mut(0) else {
        return Target::done(Reason::StateFailed, rule);
    };
    // Built in this CPU's scratch value (a state does not fit on the BPF stack),
    // charged with what the key got before, inserted, and the scratch zeroed.
    if admitted > 0 {
        // SAFETY: this CPU's own map value, zeroed.
        unsafe { charge_wide(fresh, rule, now, admitted) };
    }
    // SAFETY: as above.
    unsafe { (*fresh).born = now };
    // By reference: the value must not be copied onto the 512-byte stack.
    // SAFETY: a valid map value of the same type, read by the helper.
    #[allow(clippy::needless_borrows_for_generic_args)]
    let inserted = RL_WIDE.insert(key, unsafe { &*fresh }, u64::from(BPF_NOEXIST));
    // SAFETY: as above.
    unsafe { zero_wide(fresh) };
    match inserted {
        Ok(()) => event(Event::StateCreated),
        // Another CPU promoted it first: its charge stands.
        Err(e) if e == -EEXIST => {}
        Err(_) => return Target::done(Reason::StateFailed, rule),
    }
    match RL_WIDE.get_ptr_mut(key) {
        Some(_) => Target::wide(rule),
        None => Target::done(Reason::StateFailed, rule),
    }
}

/// Makes the fresh wide state at `wide` one that admitted `n` units at `now`.
///
/// # Safety
/// `wide` is this CPU's scratch map value, zeroed.
#[inline(always)]
unsafe fn charge_wide(wide: *mut WideState, rule: &Rule, now: u64, n: u64) {
    // SAFETY: the caller's contract; every state fits in the body.
    unsafe {
        let body = (&raw mut (*wide).body).cast::<u8>();
        let params = &rule.params;
        match rule.algorithm {
            algorithm::INTERVAL => interval::charged(&mut *body.cast(), &params.interval, now, n),
            algorithm::FIXED_WINDOW => {
                fixed_window::charged(&mut *body.cast(), &params.fixed_window, now, n)
            }
            algorithm::SLIDING_LOG => {
                sliding_log::charged(&mut *body.cast(), &params.sliding_log, now, n)
            }
            algorithm::SLIDING_WINDOW => {
                sliding_window::charged(&mut *body.cast(), &params.sliding_window, now, n)
            }
            algorithm::ROLLING_QUOTA => {
                rolling_quota::charged(&mut *body.cast(), &params.rolling_quota, now, n)
            }
            _ => {}
        }
    }
}

/// Zeroes the scratch wide state again.
///
/// # Safety
/// `wide` is this CPU's scratch map value.
#[inline(always)]
unsafe fn zero_wide(wide: *mut WideState) {
    // SAFETY: the caller's contract; word by word (a memset call is not
    // available to BPF programs).
    unsafe {
        let body = &raw mut (*wide).body;
        let mut i = 0;
        while i < WIDE_WORDS {
            core::ptr::write_volatile(body.cast::<u64>().add(i), 0);
            i += 1;
        }
    }
}

/// Decides `cost` against a wide state in place.
///
/// # Safety
/// `wide` is a map value valid for this run whose lock this CPU holds.
#[inline(always)]
unsafe fn decide_wide(wide: *mut WideState, rule: &Rule, now: u64, cost: u64) -> bool {
    // SAFETY: the caller's contract: the body is ours while the lock is held,
    // and every state fits in it (size asserts in ratelimit-common).
    unsafe {
        let body = (&raw mut (*wide).body).cast::<u8>();
        let params = &rule.params;
        match rule.algorithm {
            algorithm::INTERVAL => {
                interval::decide(&mut *body.cast(), &params.interval, now, cost).allowed
            }
            algorithm::FIXED_WINDOW => {
                fixed_window::decide(&mut *body.cast(), &params.fixed_window, now, cost).allowed
            }
            algorithm::SLIDING_LOG => {
                sliding_log::decide(&mut *body.cast(), &params.sliding_log, now, cost).allowed
            }
            algorithm::SLIDING_WINDOW => {
                sliding_window::decide(&mut *body.cast(), &params.sliding_window, now, cost).allowed
            }
            algorithm::ROLLING_QUOTA => {
                rolling_quota::decide(&mut *body.cast(), &params.rolling_quota, now, cost).allowed
            }
            // An algorithm this program does not know: fail open.
            _ => true,
        }
    }
}

/// Applies a wide-state algorithm to a key, under the state's lock word, with
/// the rule's aggregate. The key's own level decides first; if it admits and
/// the aggregate then refuses, the algorithm's `refund` undoes the admission
/// (exact: the lock is still held, so it is the last thing the state saw).
///
/// Nothing about the aggregate is computed before the algorithm decides: the
/// verifier then sees one state at the decision, whatever the rule, and
/// verifies the five algorithms once.
#[inline(always)]
fn limit_wide(wide: *mut WideState, rule: &'static Rule, len: u64, now: u64) -> Reason {
    // SAFETY: `wide` is a map value valid for this run; its lock word is only
    // touched atomically, its body only while the lock is held.
    unsafe {
        let lock = &raw mut (*wide).lock;
        let mut held = false;
        for _ in 0..LOCK_RETRIES {
            if cas(lock, 0, 1).1 {
                held = true;
                break;
            }
        }
        if !held {
            return Reason::Contended;
        }
        let mut reason = if decide_wide(wide, rule, now, 1) {
            Reason::Passed
        } else {
            Reason::Limited
        };
        if reason == Reason::Passed {
            let shared = rule_state(rule);
            let agg = aggregate(rule, shared, len);
            if agg.is_some() {
                let young = young(rule, shared, read_volatile(&raw const (*wide).born), now);
                let keep = if young { rule.aggregate_reserve } else { 0 };
                reason = match take(agg.word, agg.params, now, agg.cost, keep) {
                    Taken::Yes => Reason::Passed,
                    Taken::No => {
                        mark_refusal(rule, shared, now);
                        if young {
                            Reason::AggregateYoung
                        } else {
                            Reason::AggregateLimited
                        }
                    }
                    Taken::Contended => Reason::Contended,
                };
                if reason != Reason::Passed {
                    refund_wide(wide, rule, now, 1);
                }
            }
        }
        atomic_xchg::<u64, { AtomicOrdering::SeqCst }>(lock, 0);
        reason
    }
}

/// Gives `cost` back to a wide state in place.
///
/// # Safety
/// `wide` is a map value valid for this run whose lock this CPU holds.
#[inline(always)]
unsafe fn refund_wide(wide: *mut WideState, rule: &Rule, now: u64, cost: u64) {
    // SAFETY: as in `decide_wide`.
    unsafe {
        let body = (&raw mut (*wide).body).cast::<u8>();
        let params = &rule.params;
        // Read again, not reused from `decide_wide`: a value the verifier knows
        // per algorithm would make it verify everything after the decision five
        // times.
        match read_volatile(&rule.algorithm) {
            algorithm::INTERVAL => interval::refund(&mut *body.cast(), &params.interval, now, cost),
            algorithm::FIXED_WINDOW => {
                fixed_window::refund(&mut *body.cast(), &params.fixed_window, now, cost)
            }
            algorithm::SLIDING_LOG => {
                sliding_log::refund(&mut *body.cast(), &params.sliding_log, now, cost)
            }
            algorithm::SLIDING_WINDOW => {
                sliding_window::refund(&mut *body.cast(), &params.sliding_window, now, cost)
            }
            algorithm::ROLLING_QUOTA => {
                rolling_quota::refund(&mut *body.cast(), &params.rolling_quota, now, cost)
            }
            _ => {}
        }
    }
}

/// The rule's shared buckets (null if its slot is out of range: not written
/// by the daemon).
#[inline(always)]
fn rule_state(rule: &Rule) -> *mut RuleState {
    match RL_RULE_STATE.get_ptr_mut(rule.slot) {
        Some(p) => p,
        None => core::ptr::null_mut(),
    }
}

/// Counts a drop against its source for `ratelimit top`. Only on the drop path.
#[inline(always)]
fn count_drop(key: &DropKey, weight: u64) {
    match RL_DROPS.get_ptr_mut(key) {
        // SAFETY: an 8-byte, 8-aligned map value; other CPUs add atomically too.
        Some(n) => unsafe {
            atomic_xadd::<u64, u64, { AtomicOrdering::Relaxed }>(n, weight);
        },
        None => {
            // A lost race with another CPU loses one count: fine for a ranking.
            let _ = RL_DROPS.insert(key, weight, 0);
        }
    }
}

/// The rule for a frame: the longest prefix matching its source, else the
/// default rule; where that prefix has rules with matches, the first of its
/// group that matches the frame ([`rl_select`]).
/// By reference into the rule table: a rule is 168 bytes, too many to copy per
/// frame, and one map for every rule gives the verifier one kind of pointer
/// (with two, it would verify everything after this twice).
#[inline(always)]
fn lookup_rule(
    ctx: &XdpContext,
    l3: usize,
    fam: u8,
    addr: &Words,
    config: &Config,
) -> Option<&'static Rule> {
    let mut index = config.default_rule;
    if config.rule_count != 0 {
        let key = Key::new(128 + FAMILY_BITS, rule_addr(fam, addr));
        let mut found = if config.active_rules == 0 {
            in_rules_a(&key)
        } else {
            in_rules_b(&key)
        };
        if found != NO_RULE && found & GROUP_BIT != 0 {
            found = rl_select(ctx.ctx, l3 as u64, found & !GROUP_BIT);
        }
        if found != NO_RULE {
            // Both ways here leave the same bounds on the index, so the
            // verifier walks what follows once.
            index = found & !GROUP_BIT;
        }
    }
    RL_RULE_TABLE.get(index)
}

/// The rule index of the longest prefix of `key` in the first trie. Not inlined,
/// nor is [`in_rules_b`]: see [`state_v4`].
#[inline(never)]
fn in_rules_a(key: &Key<RuleAddr>) -> u32 {
    match RL_RULES.get(key) {
        Some(i) => *i,
        None => NO_RULE,
    }
}

/// The rule index of the longest prefix of `key` in the second trie.
#[inline(never)]
fn in_rules_b(key: &Key<RuleAddr>) -> u32 {
    match RL_RULES_B.get(key) {
        Some(i) => *i,
        None => NO_RULE,
    }
}

/// Counts the frame against its rule (`first`: the rule's first counter),
/// under what the rule did with it.
#[inline(always)]
fn count_rule(first: u32, reason: Reason, len: u64) {
    if first == NO_SLOT {
        return;
    }
    let index = first.wrapping_add(RuleCounter::of(reason) as u32);
    if let Some(counter) = RL_RULE_STATS.get_ptr_mut(index) {
        // SAFETY: a per-CPU slot, written only by this CPU.
        unsafe {
            (*counter).packets += 1;
            (*counter).bytes += len;
        }
    }
}

/// Counts the frame under `reason`; returns this CPU's count for it.
#[inline(always)]
fn count(reason: Reason, len: u64) -> u64 {
    match RL_STATS.get_ptr_mut(reason as u32) {
        // SAFETY: a per-CPU slot, written only by this CPU.
        Some(counter) => unsafe {
            (*counter).packets += 1;
            (*counter).bytes += len;
            (*counter).packets
        },
        None => 0,
    }
}

/// A pointer to a `T` at `offset` bytes into the frame, if the frame is long enough.
#[inline(always)]
fn ptr_at<T>(ctx: &XdpContext, offset: usize) -> Result<*const T, Malformed> {
    let start = ctx.data();
    if start + offset + size_of::<T>() > ctx.data_end() {
        return Err(Malformed);
    }
    Ok((start + offset) as *const T)
}

/// Ethernet, up to [`MAX_VLAN_TAGS`] VLAN tags ([`rl_vlan`]), then the source
/// address of IPv4 or IPv6, and whether the frame can be judged: IPv4's
/// fragment fields are read here, an IPv6 extension header chain is walked
/// by [`rl_ipv6_chain`].
#[inline(always)]
fn parse(ctx: &XdpContext) -> Result<Parsed, Malformed> {
    let eth: *const EthHdr = ptr_at(ctx, 0)?;
    // SAFETY: ptr_at checked the bounds.
    let mut ether_type = unsafe { (*eth).ether_type };
    let mut offset = EthHdr::LEN as u64;
    if ether_type == ETH_P_8021Q || ether_type == ETH_P_8021AD {
        let found = rl_vlan(ctx.ctx);
        if found == VLAN_CUT_SHORT {
            return Err(Malformed);
        }
        if found == VLAN_TOO_DEEP {
            return Ok(Parsed {
                family: 0,
                source: [0; 4],
                l3: 0,
                judged: UNJUDGED,
            });
        }
        ether_type = found as u16;
        offset = u64::from(found >> 16);
    }
    // The IP header starts within 64 bytes (14 + 8 tags of 4). Masked after
    // a volatile read, as in `rl_host_connection`: the verifier must see the
    // bound on the very register the packet pointer is added to.
    // SAFETY: a local.
    let offset = (unsafe { read_volatile(&offset) } & 63) as usize;
    let frame_len = ctx.data_end() - ctx.data();
    if ether_type == ETH_P_IP {
        let ip: *const Ipv4Hdr = ptr_at(ctx, offset)?;
        // SAFETY: ptr_at checked the bounds.
        let ip = unsafe { &*ip };
        let header_len = usize::from(ip.ihl());
        let total_len = usize::from(u16::from_be_bytes(ip.tot_len));
        if ip.version() != 4
            || header_len < Ipv4Hdr::LEN
            || total_len < header_len
            || offset + total_len > frame_len
        {
            return Err(Malformed);
        }
        let frags = u16::from_be_bytes(ip.frags);
        let judged = if frags & (IPV4_MORE_FRAGMENTS | IPV4_OFFSET_MASK) != 0 {
            rl_ipv4_fragment(ctx.ctx, offset as u64)
        } else {
            JUDGED
        };
        // SAFETY: ptr_at checked the bounds; packet loads may be unaligned.
        let src = unsafe { core::ptr::read_unaligned(ip.src_addr.as_ptr().cast::<u32>()) };
        Ok(Parsed {
            family: family::V4,
            source: [0, 0, V4_MAPPED_WORD, src],
            l3: offset,
            judged,
        })
    } else if ether_type == ETH_P_IPV6 {
        let ip: *const Ipv6Hdr = ptr_at(ctx, offset)?;
        // SAFETY: ptr_at checked the bounds.
        let ip = unsafe { &*ip };
        let payload_len = usize::from(u16::from_be_bytes(ip.payload_len));
        if ip.version() != 6 || offset + Ipv6Hdr::LEN + payload_len > frame_len {
            return Err(Malformed);
        }
        let judged = if is_extension(ip.next_hdr) {
            rl_ipv6_chain(ctx.ctx, offset as u64)
        } else {
            JUDGED
        };
        // SAFETY: as above.
        let src = unsafe { core::ptr::read_unaligned(ip.src_addr.as_ptr().cast::<Words>()) };
        // An IPv4-mapped source (::ffff:a.b.c.d) is judged as the IPv4
        // address it maps: its words are already the IPv4 key's, and the
        // rules for that address (and its buckets) are the ones it meets.
        if src[0] == 0 && src[1] == 0 && src[2] == V4_MAPPED_WORD {
            // Built as the IPv4 branch builds it, so that the verifier finds
            // the two alike and walks what follows once.
            return Ok(Parsed {
                family: family::V4,
                source: [0, 0, V4_MAPPED_WORD, src[3]],
                l3: offset,
                judged,
            });
        }
        Ok(Parsed {
            family: family::V6,
            source: src,
            l3: offset,
            judged,
        })
    } else {
        Ok(Parsed {
            family: 0,
            source: [0; 4],
            l3: offset,
            judged: JUDGED,
        })
    }
}

/// Whether the IPv4 fragment whose header starts at `l3` can be judged:
/// [`JUDGED`] or [`TINY`] (see [`too_short`]).
///
/// A global function, as [`rl_vlan`]: the program goes on from one unknown
/// number, not from the ranges each comparison here would leave it with.
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn rl_ipv4_fragment(ctx: *mut xdp_md, l3: u64) -> u32 {
    // See `rl_host_connection` on the mask.
    // SAFETY: a local.
    let l3 = (unsafe { read_volatile(&l3) } & 63) as usize;
    let Ok(ip) = ptr_at::<Ipv4Hdr>(&XdpContext::new(ctx), l3) else {
        return JUDGED;
    };
    // SAFETY: ptr_at checked the bounds.
    let ip = unsafe { &*ip };
    let l4_len = usize::from(u16::from_be_bytes(ip.tot_len)).saturating_sub(usize::from(ip.ihl()));
    let offset = u16::from_be_bytes(ip.frags) & IPV4_OFFSET_MASK;
    if too_short(ip.proto, offset, l4_len) {
        TINY
    } else {
        JUDGED
    }
}

/// [`rl_vlan`]: the frame ends inside a tag.
const VLAN_CUT_SHORT: u32 = 0;
/// [`rl_vlan`]: more than [`MAX_VLAN_TAGS`] tags.
const VLAN_TOO_DEEP: u32 = 1;

/// The EtherType after the VLAN tags of a frame whose Ethernet header names
/// one (low 16 bits, as on the wire) and where it ends (from bit 16: at least
/// 18), or [`VLAN_CUT_SHORT`] or [`VLAN_TOO_DEEP`]. Every 802.1Q and 802.1ad
/// tag counts, VID 0 (priority tags) as any other: the kernel strips them all
/// and delivers what is inside.
///
/// A global function: the verifier walks the tags once, apart, and the
/// program goes on from one unknown offset instead of one path per depth.
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn rl_vlan(ctx: *mut xdp_md) -> u32 {
    let xdp = XdpContext::new(ctx);
    let mut offset = EthHdr::LEN;
    let mut i = 0;
    while i < MAX_VLAN_TAGS {
        let Ok(vlan) = ptr_at::<VlanHdr>(&xdp, offset) else {
            return VLAN_CUT_SHORT;
        };
        // SAFETY: ptr_at checked the bounds.
        let ether_type = unsafe { (*vlan).ether_type };
        offset += VlanHdr::LEN;
        if ether_type != ETH_P_8021Q && ether_type != ETH_P_8021AD {
            return ((offset as u32) << 16) | u32::from(ether_type);
        }
        i += 1;
    }
    VLAN_TOO_DEEP
}

/// Whether a first fragment (`offset` 0, in 8-octet units) with `l4_len`
/// bytes after its IP headers is too short for the transport header fields a
/// rule can match on, or a non-first one could overwrite them: RFC 1858's
/// tiny fragment (a TCP header cut before its flags, or before its ports
/// for UDP) and its overlapping fragment (TCP at offset 8 bytes, which the
/// flags of the fragment before it could be rewritten by). RFC 3128: drop
/// both; no sender fragments so.
#[inline(always)]
fn too_short(proto: u8, offset: u16, l4_len: usize) -> bool {
    match proto {
        IPPROTO_TCP => (offset == 0 && l4_len < TCP_MIN_HEADER) || offset == 1,
        IPPROTO_UDP | IPPROTO_ICMP | IPPROTO_ICMPV6 => offset == 0 && l4_len < SHORT_L4_HEADER,
        _ => false,
    }
}

/// Whether an IPv6 next-header value names an extension header the program
/// walks.
#[inline(always)]
fn is_extension(next: u8) -> bool {
    matches!(
        next,
        IPV6_HOP_BY_HOP | IPV6_ROUTING | IPV6_FRAGMENT | IPV6_AUTH | IPV6_DEST_OPTIONS
    )
}

/// Where an IPv6 extension header chain ends.
struct Chain {
    /// The transport protocol (the next-header value after the chain).
    proto: u8,
    /// Where its header starts.
    offset: usize,
    /// Where the IP payload ends.
    end: usize,
    /// One of the `CHAIN_*` consts.
    status: u8,
}

/// [`Chain::status`]: the transport header's place is known.
const CHAIN_WHOLE: u8 = 0;
/// A non-first fragment: no transport header in it.
const CHAIN_FRAGMENT: u8 = 1;
/// A first fragment (more follow) too short for its transport header, or cut
/// inside its chain (RFC 7112 wants the whole chain in the first fragment),
/// or a TCP fragment at offset 8: see [`too_short`].
const CHAIN_TINY: u8 = 2;
/// Longer than [`MAX_EXT_HEADERS`].
const CHAIN_TOO_LONG: u8 = 3;
/// Cut short in a frame that is not a fragment (the kernel drops it).
const CHAIN_CUT_SHORT: u8 = 4;

/// Walks the IPv6 extension headers of the frame whose IPv6 header starts at
/// `l3`: hop-by-hop, routing, fragment, destination options, AH.
#[inline(always)]
fn walk(ctx: &XdpContext, l3: usize) -> Result<Chain, Malformed> {
    let ip: *const Ipv6Hdr = ptr_at(ctx, l3)?;
    // SAFETY: ptr_at checked the bounds.
    let (mut next, payload) = unsafe { ((*ip).next_hdr, (*ip).payload_len) };
    let end = l3 + Ipv6Hdr::LEN + usize::from(u16::from_be_bytes(payload));
    let mut offset = l3 + Ipv6Hdr::LEN;
    let mut first_fragment = false;
    let chain = |proto, offset, status| Chain {
        proto,
        offset,
        end,
        status,
    };
    let mut walked = 0;
    while walked < MAX_EXT_HEADERS {
        if !is_extension(next) {
            break;
        }
        let cut = if first_fragment {
            CHAIN_TINY
        } else {
            CHAIN_CUT_SHORT
        };
        if offset + IPV6_EXT_MIN > end {
            return Ok(chain(next, offset, cut));
        }
        let Ok(ext) = ptr_at::<[u8; 4]>(ctx, offset) else {
            return Ok(chain(next, offset, cut));
        };
        // SAFETY: ptr_at checked the bounds.
        let ext = unsafe { *ext };
        match next {
            // Lengths in 8-octet units, not counting the first.
            IPV6_HOP_BY_HOP | IPV6_ROUTING | IPV6_DEST_OPTIONS => {
                offset += (usize::from(ext[1]) + 1) * 8
            }
            // In 4-octet units, not counting the first two.
            IPV6_AUTH => offset += (usize::from(ext[1]) + 2) * 4,
            // IPV6_FRAGMENT
            _ => {
                let word = u16::from_be_bytes([ext[2], ext[3]]);
                let units = (word & IPV6_OFFSET_MASK) >> 3;
                if units != 0 {
                    // A non-first fragment has no transport header.
                    let status = if ext[0] == IPPROTO_TCP && units == 1 {
                        CHAIN_TINY
                    } else {
                        CHAIN_FRAGMENT
                    };
                    return Ok(chain(ext[0], offset, status));
                }
                first_fragment = word & IPV6_MORE_FRAGMENTS != 0;
                offset += IPV6_EXT_MIN;
            }
        }
        next = ext[0];
        walked += 1;
    }
    if is_extension(next) {
        // Still an extension header: the chain is longer than we walk.
        return Ok(chain(next, offset, CHAIN_TOO_LONG));
    }
    let status = if first_fragment && (offset > end || too_short(next, 0, end - offset)) {
        CHAIN_TINY
    } else {
        CHAIN_WHOLE
    };
    Ok(chain(next, offset, status))
}

/// [`walk`] as one number: the status (bits 0-7), the protocol (8-15), where
/// its header starts (16-31) and where the payload ends (32-63);
/// [`CHAIN_CUT_SHORT`] when not even the IPv6 header is there.
///
/// A global function, as [`rl_vlan`]: its parser, called from the program,
/// [`rl_select`] and [`rl_host_connection`], is verified once.
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn rl_walk_ipv6(ctx: *mut xdp_md, l3: u64) -> u64 {
    // See `rl_host_connection` on the mask.
    // SAFETY: a local.
    let l3 = (unsafe { read_volatile(&l3) } & 63) as usize;
    match walk(&XdpContext::new(ctx), l3) {
        Ok(c) => {
            u64::from(c.status)
                | u64::from(c.proto) << 8
                | (c.offset as u64 & 0xffff) << 16
                | (c.end as u64) << 32
        }
        Err(Malformed) => u64::from(CHAIN_CUT_SHORT),
    }
}

/// [`rl_walk_ipv6`]'s answer for the frame whose IPv6 header starts at `l3`,
/// unpacked; offsets bounded for the verifier (an offset past 32 KiB is past
/// any frame).
#[inline(always)]
fn walk_ipv6(ctx: &XdpContext, l3: usize) -> Chain {
    let packed = rl_walk_ipv6(ctx.ctx, l3 as u64);
    let offset = (packed >> 16) & 0xffff;
    // SAFETY: a local.
    let offset = (unsafe { read_volatile(&offset) } & 0x7fff) as usize;
    Chain {
        status: packed as u8,
        proto: (packed >> 8) as u8,
        offset,
        end: (packed >> 32) as usize,
    }
}

/// Whether the IPv6 frame whose header starts at `l3`, with an extension
/// header after it, can be judged: [`JUDGED`], [`UNJUDGED`] (a chain longer
/// than [`MAX_EXT_HEADERS`]) or [`TINY`].
///
/// A global function, as [`rl_vlan`]: the walk is verified once.
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn rl_ipv6_chain(ctx: *mut xdp_md, l3: u64) -> u32 {
    match rl_walk_ipv6(ctx, l3) as u8 {
        CHAIN_TOO_LONG => UNJUDGED,
        CHAIN_TINY => TINY,
        _ => JUDGED,
    }
}

/// What a frame's transport header says.
struct Flow {
    /// Source and destination addresses, network order (IPv4-mapped for IPv4).
    source: Words,
    dest: Words,
    /// Ports as on the wire (network order); zero without ports.
    sport: u16,
    dport: u16,
    /// The transport protocol (after any IPv6 extension headers).
    proto: u8,
    /// TCP's flags byte (CWR … FIN).
    tcp_flags: u8,
    /// The ICMP or ICMPv6 type.
    icmp_type: u8,
    /// One of the `L4_*` consts.
    status: u8,
    /// [`family`] of the header (IPv6 for an IPv4-mapped source).
    family: u8,
}

impl Flow {
    /// Nothing read yet.
    #[inline(always)]
    fn unread() -> Self {
        Self {
            source: [0; 4],
            dest: [0; 4],
            sport: 0,
            dport: 0,
            proto: 0,
            tcp_flags: 0,
            icmp_type: 0,
            status: L4_NONE,
            family: 0,
        }
    }
}

/// [`Flow::status`]: the transport header was read (TCP's or UDP's ports and
/// TCP's flags, ICMP's type).
const L4_HEADER: u8 = 0;
/// The protocol is known, not its header: a header cut short (a tiny first
/// fragment), or a protocol whose header we do not read.
const L4_PROTO: u8 = 1;
/// Not even the protocol: an IPv6 extension header chain longer than
/// [`MAX_EXT_HEADERS`], or cut short.
const L4_NONE: u8 = 2;
/// The protocol is known, and the frame is a non-first fragment: it has no
/// transport header (the `fragments` policy judges it).
const L4_FRAGMENT: u8 = 3;
/// The shortest TCP header: flags and ports are all within it.
const TCP_MIN_HEADER: usize = 20;
/// The UDP header, and ICMP's (type, code, checksum and the rest word): a
/// first fragment shorter than this cannot be one of theirs.
const SHORT_L4_HEADER: usize = 8;
/// The transport header's first word, read at once: TCP's and UDP's ports,
/// ICMP's type, code and checksum.
const L4_WORD: usize = 4;
/// The shortest IPv6 extension header (and the fragment header's length).
const IPV6_EXT_MIN: usize = 8;
const IPPROTO_ICMP: u8 = 1;
const IPPROTO_TCP: u8 = 6;
const IPPROTO_UDP: u8 = 17;
const IPPROTO_ICMPV6: u8 = 58;
const TCP_SYN: u8 = 0x02;
const TCP_ACK: u8 = 0x10;
/// Where TCP's flags byte is in its header.
const TCP_FLAGS_AT: usize = 13;
/// IPv6 extension headers, by the next-header value that names them.
const IPV6_HOP_BY_HOP: u8 = 0;
const IPV6_ROUTING: u8 = 43;
const IPV6_FRAGMENT: u8 = 44;
const IPV6_AUTH: u8 = 51;
const IPV6_DEST_OPTIONS: u8 = 60;
/// The fragment offset's bits: of IPv4's flags-and-offset word (in 8-octet
/// units), and of the IPv6 fragment header's offset word (shifted by 3).
const IPV4_OFFSET_MASK: u16 = 0x1fff;
const IPV6_OFFSET_MASK: u16 = 0xfff8;
/// The more-fragments bits of the same words.
const IPV4_MORE_FRAGMENTS: u16 = 0x2000;
const IPV6_MORE_FRAGMENTS: u16 = 0x0001;
/// `TCP_ESTABLISHED` of the kernel's socket states (also a connected UDP socket's).
const TCP_ESTABLISHED: u32 = 1;

/// Whether the frame whose IP header starts at `l3` belongs to one of the
/// host's own connections (1) or not (0): TCP with ACK and without SYN, or
/// UDP, to a local port in `local_ports` (the ephemeral range, where the
/// host's outgoing connections live), whose 4-tuple the kernel's socket
/// lookup finds as an established TCP connection or a connected UDP socket.
/// Nothing here trusts a flag alone: an ACK bit without a socket that has
/// this exact 4-tuple proves nothing.
///
/// A global function: the verifier checks it once, apart, and the program
/// sees only a number come back. Inlined, its many exits (and the IPv6
/// extension headers' paths) each carried a state of their own into the
/// limit, and the verifier walked the limit again for each: 910 k
/// instructions instead of 520 k.
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn rl_host_connection(ctx: *mut xdp_md, l3: u64, local_ports: u32) -> u32 {
    // Masked after a volatile read, not only checked: LLVM would drop a mask
    // it can prove redundant, and the verifier must see the offset's bound
    // on the very register it adds. The IP header starts within 64 bytes
    // (Ethernet and eight VLAN tags).
    // SAFETY: a local.
    let l3 = (unsafe { read_volatile(&l3) } & 63) as usize;
    let mut flow = Flow::unread();
    let xdp = XdpContext::new(ctx);
    if transport(&xdp, l3, &mut flow).is_err() || flow.status != L4_HEADER {
        return 0;
    }
    let port = u32::from(u16::from_be(flow.dport));
    if port < local_ports >> 16 || port > local_ports & 0xffff {
        return 0;
    }
    let candidate = match flow.proto {
        IPPROTO_TCP => flow.tcp_flags & (TCP_SYN | TCP_ACK) == TCP_ACK,
        IPPROTO_UDP => true,
        _ => false,
    };
    u32::from(candidate && host_socket(ctx, &flow))
}

/// The IP version of the header at `l3`: [`family::V4`] or [`family::V6`]
/// (the families are numbered as the versions). Functions that read the
/// header again take its family from the header itself, for the family rules
/// see may differ (an IPv6 frame from an IPv4-mapped source is judged as
/// IPv4).
#[inline(always)]
fn version_at(ctx: &XdpContext, l3: usize) -> Result<u8, Malformed> {
    // Four bytes, not one: LLVM turns a one-byte check into `p >= end`,
    // from which the verifier learns no readable range.
    let first: *const [u8; 4] = ptr_at(ctx, l3)?;
    // SAFETY: ptr_at checked the bounds.
    Ok(unsafe { (*first)[0] } >> 4)
}

/// Reads the addresses, protocol, ports and TCP flags (or ICMP type) of the
/// frame whose IP header starts at `l3` into `out`; its status says how far
/// that got. Nothing is read past the IP payload's end (a short frame is
/// padded to 60 bytes on Ethernet: padding is no header).
#[inline(always)]
fn transport(ctx: &XdpContext, l3: usize, out: &mut Flow) -> Result<(), Malformed> {
    let (next, offset, end);
    if version_at(ctx, l3)? == family::V4 {
        out.family = family::V4;
        let ip: *const Ipv4Hdr = ptr_at(ctx, l3)?;
        // SAFETY: ptr_at checked the bounds; packet loads may be unaligned.
        unsafe {
            out.source = [
                0,
                0,
                V4_MAPPED_WORD,
                read_unaligned((*ip).src_addr.as_ptr().cast()),
            ];
            out.dest = [
                0,
                0,
                V4_MAPPED_WORD,
                read_unaligned((*ip).dst_addr.as_ptr().cast()),
            ];
            next = (*ip).proto;
            if u16::from_be_bytes((*ip).frags) & IPV4_OFFSET_MASK != 0 {
                // A non-first fragment: no transport header.
                out.proto = next;
                out.status = L4_FRAGMENT;
                return Ok(());
            }
            offset = l3 + usize::from((*ip).vihl & 0x0f) * 4;
            end = l3 + usize::from(u16::from_be_bytes((*ip).tot_len));
        }
    } else {
        out.family = family::V6;
        let ip: *const Ipv6Hdr = ptr_at(ctx, l3)?;
        // SAFETY: as above.
        unsafe {
            out.source = read_unaligned((*ip).src_addr.as_ptr().cast());
            out.dest = read_unaligned((*ip).dst_addr.as_ptr().cast());
        }
        let chain = walk_ipv6(ctx, l3);
        match chain.status {
            CHAIN_WHOLE => {}
            CHAIN_FRAGMENT => {
                out.proto = chain.proto;
                out.status = L4_FRAGMENT;
                return Ok(());
            }
            CHAIN_TINY => {
                out.proto = chain.proto;
                out.status = L4_PROTO;
                return Ok(());
            }
            // Too long, or cut short: not even the protocol is known.
            _ => return Ok(()),
        }
        (next, offset, end) = (chain.proto, chain.offset, chain.end);
    }
    out.proto = next;
    out.status = L4_PROTO;
    if next == IPPROTO_ICMP || next == IPPROTO_ICMPV6 {
        // Type, code and checksum: read as one, for a one-byte read at a
        // variable offset is checked in a form the verifier cannot follow.
        if offset + L4_WORD > end {
            return Ok(());
        }
        let icmp: *const [u8; L4_WORD] = ptr_at(ctx, offset)?;
        // SAFETY: ptr_at checked the bounds.
        out.icmp_type = unsafe { (*icmp)[0] };
        out.status = L4_HEADER;
        return Ok(());
    }
    if next != IPPROTO_TCP && next != IPPROTO_UDP {
        return Ok(());
    }
    if offset + L4_WORD > end {
        return Ok(());
    }
    let ports: *const [u8; L4_WORD] = ptr_at(ctx, offset)?;
    // SAFETY: ptr_at checked the bounds.
    let ports = unsafe { *ports };
    out.sport = u16::from_ne_bytes([ports[0], ports[1]]);
    out.dport = u16::from_ne_bytes([ports[2], ports[3]]);
    if next == IPPROTO_TCP {
        if offset + TCP_FLAGS_AT + 1 > end {
            return Ok(());
        }
        let flags: *const u8 = ptr_at(ctx, offset + TCP_FLAGS_AT)?;
        // SAFETY: ptr_at checked the bounds.
        out.tcp_flags = unsafe { *flags };
    }
    out.status = L4_HEADER;
    Ok(())
}

/// The rule index (in [`RL_RULE_TABLE`]) for the frame whose IP header starts
/// at `l3`, from match group `group`: the first entry that matches it; when
/// an entry needs what the frame does not show, the group's `fragments` rule
/// for a non-first fragment, its `unjudged` rule for any other, unless the
/// policy is to go on ([`NO_RULE`]; [`Event::Unjudged`] counted once a
/// frame); [`NO_RULE`] if none matches (the daemon ends every group with an
/// entry that matches everything, so only a group it never wrote).
///
/// A global function, as [`rl_host_connection`] and for the same reason: the
/// verifier checks it once, and the program sees only a number come back.
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn rl_select(ctx: *mut xdp_md, l3: u64, group: u32) -> u32 {
    // See `rl_host_connection` on the mask.
    // SAFETY: a local.
    let l3 = (unsafe { read_volatile(&l3) } & 63) as usize;
    let Some(g) = RL_GROUPS.get(group) else {
        return NO_RULE;
    };
    let mut flow = Flow::unread();
    let xdp = XdpContext::new(ctx);
    // A transport header cut short leaves the status at what was read before
    // it (`L4_HEADER` is set only once the header is read): the error itself
    // says nothing more.
    let _ = transport(&xdp, l3, &mut flow);
    let policy = if flow.status == L4_FRAGMENT {
        g.fragments
    } else {
        g.unjudged
    };
    let mut counted = false;
    let mut i = 0;
    while i < MAX_MATCHES {
        if i as u32 >= g.count {
            break;
        }
        let e = &g.entries[i];
        match judge(e, &flow) {
            Judged::Yes => return e.rule,
            Judged::No => {}
            Judged::Unknown => {
                if !counted {
                    event(Event::Unjudged);
                    counted = true;
                }
                if policy != NO_RULE {
                    return policy;
                }
            }
        }
        i += 1;
    }
    NO_RULE
}

/// Whether a [`MatchEntry`] matches a frame.
enum Judged {
    Yes,
    No,
    /// It needs what the frame does not show.
    Unknown,
}

/// Judges `flow` by `e`: a field the frame shows that differs is a no, even
/// when another the frame does not show is unknown.
#[inline(always)]
fn judge(e: &MatchEntry, flow: &Flow) -> Judged {
    let fields = e.fields;
    if fields & match_fields::DEST != 0 {
        let mut k = 0;
        while k < 4 {
            if flow.dest[k] & e.dest_mask[k] != e.dest[k] {
                return Judged::No;
            }
            k += 1;
        }
    }
    if fields & (match_fields::PROTO | match_fields::NEEDS_HEADER) == 0 {
        return Judged::Yes;
    }
    if flow.status == L4_NONE {
        return Judged::Unknown;
    }
    if flow.proto != e.proto {
        return Judged::No;
    }
    if fields & match_fields::NEEDS_HEADER == 0 {
        return Judged::Yes;
    }
    if flow.status != L4_HEADER {
        return Judged::Unknown;
    }
    if fields & match_fields::PORTS != 0 {
        let port = u16::from_be(flow.dport);
        if port < e.dport_first || port > e.dport_last {
            return Judged::No;
        }
    }
    if fields & match_fields::SYN != 0 && flow.tcp_flags & (TCP_SYN | TCP_ACK) != TCP_SYN {
        return Judged::No;
    }
    if fields & match_fields::ICMP_TYPE != 0 && flow.icmp_type != e.icmp_type {
        return Judged::No;
    }
    Judged::Yes
}

/// Whether the kernel has an established TCP connection or a connected UDP
/// socket for `f`'s 4-tuple (from the frame's point of view), in the network
/// namespace of the interface.
#[inline(always)]
fn host_socket(ctx: *mut xdp_md, f: &Flow) -> bool {
    // SAFETY: a plain C struct; all zeroes is valid.
    let mut tuple: bpf_sock_tuple = unsafe { core::mem::zeroed() };
    let ctx = ctx.cast::<c_void>();
    // BPF_F_CURRENT_NETNS: the namespace of the interface.
    let netns = u64::MAX;
    // SAFETY: helpers given a tuple of the size they are told; every socket
    // they return is released below.
    let sk = unsafe {
        if f.family == family::V4 {
            tuple.__bindgen_anon_1.ipv4 = bpf_sock_tuple__bindgen_ty_1__bindgen_ty_1 {
                saddr: f.source[3],
                daddr: f.dest[3],
                sport: f.sport,
                dport: f.dport,
            };
            let size = size_of::<bpf_sock_tuple__bindgen_ty_1__bindgen_ty_1>() as u32;
            if f.proto == IPPROTO_TCP {
                bpf_sk_lookup_tcp(ctx, &mut tuple, size, netns, 0)
            } else {
                bpf_sk_lookup_udp(ctx, &mut tuple, size, netns, 0)
            }
        } else {
            tuple.__bindgen_anon_1.ipv6 = bpf_sock_tuple__bindgen_ty_1__bindgen_ty_2 {
                saddr: f.source,
                daddr: f.dest,
                sport: f.sport,
                dport: f.dport,
            };
            let size = size_of::<bpf_sock_tuple__bindgen_ty_1__bindgen_ty_2>() as u32;
            if f.proto == IPPROTO_TCP {
                bpf_sk_lookup_tcp(ctx, &mut tuple, size, netns, 0)
            } else {
                bpf_sk_lookup_udp(ctx, &mut tuple, size, netns, 0)
            }
        }
    };
    if sk.is_null() {
        return false;
    }
    // SAFETY: a socket the helper returned, read before it is released.
    let state = unsafe { (*sk).state };
    // SAFETY: released once.
    unsafe { bpf_sk_release(sk.cast()) };
    state == TCP_ESTABLISHED
}

#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    // The verifier rejects any reachable panic path, so this is never called.
    loop {}
}

#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 13] = *b"Dual MIT/GPL\0";
