//! The kernel side as the daemon sees it: loading the embedded object, attaching
//! and pinning, adopting what a previous daemon pinned, and reading and writing
//! the maps.

use std::{
    collections::BTreeMap,
    fmt, fs,
    path::{Path, PathBuf},
};

use aya::{
    Ebpf, EbpfLoader,
    maps::{Array, HashMap, LpmTrie, Map, MapData, PerCpuArray, lpm_trie::Key},
    programs::{
        Xdp, XdpMode,
        links::{FdLink, PinnedLink},
        xdp::XdpLink,
    },
};
use ratelimit_common::{
    self as common, Addr, Counter, EVENT_COUNT, Event, FlowKey, FlowKeyV4, GlobalState, MAP_CONFIG,
    MAP_DROPS, MAP_EVENTS, MAP_GLOBAL, MAP_RULE_STATE, MAP_RULE_TABLE, MAP_RULES, MAP_SEEN,
    MAP_STATE, MAP_STATE_V4, MAP_STATS, PROGRAM_NAME, REASON_COUNT, Reason, RuleAddr, RuleState,
    gcra,
};
use tracing::{info, warn};

use crate::{
    error::{Error, Result},
    rules::{Prefix, RuleSet},
};

/// Where a daemon pins the link and maps of `iface`.
pub fn pin_dir(iface: &str) -> PathBuf {
    Path::new("/sys/fs/bpf/ratelimit").join(iface)
}

const LINK_PIN: &str = "link";

/// How to attach.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, clap::ValueEnum)]
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
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Attached {
    /// In the driver.
    Native,
    /// In the kernel's generic path, after the skb is built.
    Generic,
}

impl fmt::Display for Attached {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Attached::Native => "native",
            Attached::Generic => "generic",
        })
    }
}

/// Load-time settings.
#[derive(Clone, Debug)]
pub struct LoadOptions {
    /// IPv4 sources tracked at once (gcra).
    pub state_capacity: u32,
    /// IPv6 sources tracked at once (gcra).
    pub state_capacity_v6: u32,
    /// Rules at most.
    pub rules_capacity: u32,
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
            wide_capacity: common::DEFAULT_WIDE_CAPACITY,
            seen_slots: common::DEFAULT_SEEN_SLOTS,
        }
    }
}

impl LoadOptions {
    /// Sets every map's size on `loader`.
    fn size(&self, loader: &mut EbpfLoader) {
        loader
            .map_max_entries(MAP_STATE_V4, self.state_capacity)
            .map_max_entries(MAP_STATE, self.state_capacity_v6)
            .map_max_entries(MAP_RULES, self.rules_capacity)
            .map_max_entries(MAP_RULE_TABLE, 2 * (self.rules_capacity + 1))
            .map_max_entries(MAP_RULE_STATE, self.rules_capacity + 1)
            .map_max_entries(common::MAP_WIDE, self.wide_capacity)
            .map_max_entries(MAP_SEEN, self.seen_slots);
    }

    /// A loader with every map sized.
    pub fn loader(&self) -> EbpfLoader<'static> {
        let mut loader = EbpfLoader::new();
        self.size(&mut loader);
        loader
    }
}

/// The typed maps.
pub struct Maps {
    rules: LpmTrie<MapData, RuleAddr, u32>,
    table: Array<MapData, common::Rule>,
    state: HashMap<MapData, FlowKey, gcra::State>,
    state_v4: HashMap<MapData, FlowKeyV4, gcra::State>,
    stats: PerCpuArray<MapData, Counter>,
    config: Array<MapData, common::Config>,
    drops: HashMap<MapData, Addr, u64>,
    wide: HashMap<MapData, FlowKey, common::WideState>,
    rule_state: Array<MapData, RuleState>,
    /// Held for the program; not read by the daemon.
    _global: Array<MapData, GlobalState>,
    events: PerCpuArray<MapData, u64>,
    /// Held for the program; not read by the daemon.
    _seen: Array<MapData, u64>,
    /// Doorkeeper slots.
    seen_slots: u32,
}

fn map_err(op: &'static str, map: &'static str) -> impl FnOnce(aya::maps::MapError) -> Error {
    move |source| Error::Map { op, map, source }
}

impl Maps {
    /// Takes the maps out of a loaded object.
    pub fn from_ebpf(ebpf: &mut Ebpf) -> Result<Self> {
        let mut take = |name: &'static str| {
            ebpf.take_map(name).ok_or_else(|| Error::Map {
                op: "finding",
                map: name,
                source: aya::maps::MapError::InvalidName {
                    name: name.to_string(),
                },
            })
        };
        let rules = take(MAP_RULES)?;
        let table = take(MAP_RULE_TABLE)?;
        let state = take(MAP_STATE)?;
        let state_v4 = take(MAP_STATE_V4)?;
        let stats = take(MAP_STATS)?;
        let config = take(MAP_CONFIG)?;
        let drops = take(MAP_DROPS)?;
        let wide = take(common::MAP_WIDE)?;
        let seen = take(MAP_SEEN)?;
        let rule_state = take(MAP_RULE_STATE)?;
        let global = take(MAP_GLOBAL)?;
        let events = take(MAP_EVENTS)?;
        Self::from_maps([
            rules, table, state, state_v4, stats, config, drops, wide, seen, rule_state, global,
            events,
        ])
    }

    /// Opens the maps a daemon pinned for `iface`.
    pub fn from_pins(iface: &str) -> Result<Self> {
        let dir = pin_dir(iface);
        let open = |name: &'static str| -> Result<Map> {
            let data =
                MapData::from_pin(dir.join(name)).map_err(map_err("opening pinned", name))?;
            Map::from_map_data(data).map_err(map_err("opening pinned", name))
        };
        Self::from_maps([
            open(MAP_RULES)?,
            open(MAP_RULE_TABLE)?,
            open(MAP_STATE)?,
            open(MAP_STATE_V4)?,
            open(MAP_STATS)?,
            open(MAP_CONFIG)?,
            open(MAP_DROPS)?,
            open(common::MAP_WIDE)?,
            open(MAP_SEEN)?,
            open(MAP_RULE_STATE)?,
            open(MAP_GLOBAL)?,
            open(MAP_EVENTS)?,
        ])
    }

    fn from_maps(
        [
            rules,
            table,
            state,
            state_v4,
            stats,
            config,
            drops,
            wide,
            seen,
            rule_state,
            global,
            events,
        ]: [Map; 12],
    ) -> Result<Self> {
        let seen: Array<MapData, u64> =
            Array::try_from(seen).map_err(map_err("typing", MAP_SEEN))?;
        let seen_slots = seen.len();
        if !seen_slots.is_power_of_two() {
            return Err(Error::invalid(
                "--doorkeeper-slots",
                format!("{seen_slots} is not a power of two"),
            ));
        }
        Ok(Self {
            _seen: seen,
            seen_slots,
            rule_state: Array::try_from(rule_state).map_err(map_err("typing", MAP_RULE_STATE))?,
            _global: Array::try_from(global).map_err(map_err("typing", MAP_GLOBAL))?,
            events: PerCpuArray::try_from(events).map_err(map_err("typing", MAP_EVENTS))?,
            wide: HashMap::try_from(wide).map_err(map_err("typing", common::MAP_WIDE))?,
            drops: HashMap::try_from(drops).map_err(map_err("typing", MAP_DROPS))?,
            rules: LpmTrie::try_from(rules).map_err(map_err("typing", MAP_RULES))?,
            table: Array::try_from(table).map_err(map_err("typing", MAP_RULE_TABLE))?,
            state: HashMap::try_from(state).map_err(map_err("typing", MAP_STATE))?,
            state_v4: HashMap::try_from(state_v4).map_err(map_err("typing", MAP_STATE_V4))?,
            stats: PerCpuArray::try_from(stats).map_err(map_err("typing", MAP_STATS))?,
            config: Array::try_from(config).map_err(map_err("typing", MAP_CONFIG))?,
        })
    }

    /// Where each prefix's rule is in the rule table.
    fn rule_indexes(&self) -> Result<BTreeMap<Prefix, u32>> {
        let mut out = BTreeMap::new();
        for entry in self.rules.iter() {
            let (key, index) = entry.map_err(map_err("reading", MAP_RULES))?;
            out.insert(Prefix::from_lpm(key.prefix_len(), key.data()), index);
        }
        Ok(out)
    }

    fn table_rule(&self, index: u32) -> Result<common::Rule> {
        self.table
            .get(&index, 0)
            .map_err(map_err("reading", MAP_RULE_TABLE))
    }

    /// The rules in the kernel, by prefix.
    pub fn rules(&self) -> Result<BTreeMap<Prefix, common::Rule>> {
        self.rule_indexes()?
            .into_iter()
            .map(|(p, i)| Ok((p, self.table_rule(i)?)))
            .collect()
    }

    /// The default rule in the kernel.
    pub fn default_rule(&self) -> Result<common::Rule> {
        self.table_rule(self.config()?.default_rule)
    }

    /// The global config in the kernel.
    pub fn config(&self) -> Result<common::Config> {
        self.config
            .get(&0, 0)
            .map_err(map_err("reading", MAP_CONFIG))
    }

    /// Writes `set` whole: every value is computed and checked before the first
    /// write. Prefixes that stay keep their rule id and slot, so their buckets
    /// carry over.
    pub fn apply(&mut self, set: &RuleSet) -> Result<()> {
        let old_indexes = self.rule_indexes()?;
        let old: BTreeMap<Prefix, common::Rule> = old_indexes
            .iter()
            .map(|(p, i)| Ok((*p, self.table_rule(*i)?)))
            .collect::<Result<_>>()?;
        let old_config = self.config()?;
        let old_default = self.table_rule(old_config.default_rule)?;
        let mut next_id = old
            .values()
            .map(|r| r.id)
            .chain([old_default.id])
            .max()
            .unwrap_or(0);
        let mut fresh_id = || {
            next_id = next_id.checked_add(1).ok_or_else(|| {
                Error::invalid("rules", "rule ids exhausted; restart with --reset")
            })?;
            Ok::<u32, Error>(next_id)
        };
        // Slot 0 is the default rule's; a rule that stays keeps its slot; a new
        // one takes a slot no old rule had if there is one (a removed rule's
        // frames may still meet its slot while this change is written).
        let mut values = Vec::with_capacity(set.rules.len());
        let mut taken = std::collections::BTreeSet::from([0u32]);
        for (prefix, action) in &set.rules {
            let mut rule = action.to_kernel(0, &prefix.to_string())?;
            match old.get(prefix) {
                Some(previous) if carry_over(previous, &mut rule) => {
                    rule.id = previous.id;
                    rule.slot = previous.slot;
                    taken.insert(rule.slot);
                }
                _ => rule.id = fresh_id()?,
            }
            values.push((*prefix, rule));
        }
        let old_slots: std::collections::BTreeSet<u32> = old.values().map(|r| r.slot).collect();
        let slots = self.rule_state.len();
        for (prefix, rule) in values.iter_mut() {
            if old.get(prefix).is_some_and(|p| p.id == rule.id) {
                continue;
            }
            let pick = (1..slots)
                .find(|i| !taken.contains(i) && !old_slots.contains(i))
                .or_else(|| (1..slots).find(|i| !taken.contains(i)))
                .ok_or_else(|| {
                    Error::invalid(
                        "rules",
                        format!(
                            "{} rules do not fit in {}; restart the daemon with a larger --max-rules",
                            set.rules.len(),
                            slots - 1
                        ),
                    )
                })?;
            rule.slot = pick;
            taken.insert(pick);
        }
        let mut default = set.default.to_kernel(0, "default")?;
        default.id = if carry_over(&old_default, &mut default) {
            old_default.id
        } else {
            fresh_id()?
        };
        default.slot = 0;
        let mut config = set.kernel_config()?;
        config.new_states = config.new_states.succeeding(&old_config.new_states);
        config.hash_seed = if old_config.hash_seed != 0 {
            old_config.hash_seed
        } else {
            random_seed()
        };
        config.seen_mask = self.seen_slots - 1;

        // Copy on write: a rule that changes goes to a table index no rule uses
        // now; the trie (or the config, for the default) is switched to it
        // after, so the program reads either the old rule or the new one whole.
        let in_use: std::collections::BTreeSet<u32> = old_indexes
            .values()
            .copied()
            .chain([old_config.default_rule])
            .collect();
        let mut free = (0..self.table.len()).filter(|i| !in_use.contains(i));
        let mut place = |rule: &common::Rule, previous: Option<(u32, &common::Rule)>| match previous
        {
            Some((index, p)) if p == rule => Ok((index, false)),
            _ => free.next().map(|i| (i, true)).ok_or_else(|| {
                Error::invalid("rules", "the rule table is full; restart with --reset")
            }),
        };
        let mut writes = Vec::new();
        let mut switches = Vec::new();
        for (prefix, rule) in &values {
            let previous = old_indexes
                .get(prefix)
                .and_then(|i| old.get(prefix).map(|r| (*i, r)));
            let (index, write) = place(rule, previous)?;
            if write {
                writes.push((index, *rule));
            }
            if old_indexes.get(prefix) != Some(&index) {
                switches.push((*prefix, index));
            }
        }
        let (default_index, write) =
            place(&default, Some((old_config.default_rule, &old_default)))?;
        if write {
            writes.push((default_index, default));
        }
        config.default_rule = default_index;

        // Fresh shared buckets for new rules (and for levels a rule gains).
        for (prefix, rule) in &values {
            let previous = old.get(prefix).filter(|p| p.id == rule.id);
            self.reset_shared(rule, previous)?;
        }
        let previous_default = (old_default.id == default.id).then_some(&old_default);
        self.reset_shared(&default, previous_default)?;

        for (index, rule) in &writes {
            self.table
                .set(*index, rule, 0)
                .map_err(map_err("writing", MAP_RULE_TABLE))?;
        }
        // Keep the trie lookup on while rules change, then set the final config.
        let mut during = old_config;
        during.rule_count = config.rule_count.max(old.len() as u32);
        self.config
            .set(0, during, 0)
            .map_err(map_err("writing", MAP_CONFIG))?;
        for (prefix, index) in &switches {
            let (bits, key) = prefix.lpm();
            self.rules
                .insert(&Key::new(bits, key), index, 0)
                .map_err(map_err("writing", MAP_RULES))?;
        }
        for prefix in old.keys().filter(|p| !set.rules.contains_key(p)) {
            let (bits, key) = prefix.lpm();
            self.rules
                .remove(&Key::new(bits, key))
                .map_err(map_err("removing", MAP_RULES))?;
        }
        self.config
            .set(0, config, 0)
            .map_err(map_err("writing", MAP_CONFIG))?;
        Ok(())
    }

    /// Zeroes (fills) the shared buckets of `rule` that it does not carry over
    /// from `previous`: all of them for a new rule, a level the rule gains.
    fn reset_shared(&mut self, rule: &common::Rule, previous: Option<&common::Rule>) -> Result<()> {
        use common::rule_flags::{AGGREGATE, NEW_SOURCES_UNLIMITED};
        let had = |flag: u8, on: bool| previous.is_some_and(|p| (p.flags & flag != 0) == on);
        let keep_new = had(NEW_SOURCES_UNLIMITED, false) && rule.flags & NEW_SOURCES_UNLIMITED == 0;
        let keep_agg = had(AGGREGATE, true) && rule.flags & AGGREGATE != 0;
        if keep_new && keep_agg {
            return Ok(());
        }
        let mut state = self
            .rule_state
            .get(&rule.slot, 0)
            .map_err(map_err("reading", MAP_RULE_STATE))?;
        if !keep_new {
            state.new_sources = 0;
        }
        if !keep_agg {
            state.aggregate = 0;
        }
        self.rule_state
            .set(rule.slot, state, 0)
            .map_err(map_err("writing", MAP_RULE_STATE))
    }

    /// Counters of [`Event`]s, summed over CPUs.
    pub fn events(&self) -> Result<[u64; EVENT_COUNT as usize]> {
        let mut out = [0; EVENT_COUNT as usize];
        for e in Event::ALL {
            let per_cpu = self
                .events
                .get(&(e as u32), 0)
                .map_err(map_err("reading", MAP_EVENTS))?;
            out[e as usize] = per_cpu.iter().sum();
        }
        Ok(out)
    }

    /// How many keys have a state now: (gcra's IPv4 and IPv6 maps together, the
    /// wide-state map), counted with batched reads (a few syscalls per million
    /// keys).
    pub fn tracked(&self) -> Result<(usize, usize)> {
        let (v4, v6, wide) = self.tracked_by_map()?;
        Ok((v4 + v6, wide))
    }

    /// Keys with a state: (IPv4 gcra, IPv6 gcra, wide).
    pub fn tracked_by_map(&self) -> Result<(usize, usize, usize)> {
        use aya::maps::IterableMap as _;
        Ok((
            count_entries(self.state_v4.map(), MAP_STATE_V4)?,
            count_entries(self.state.map(), MAP_STATE)?,
            count_entries(self.wide.map(), common::MAP_WIDE)?,
        ))
    }

    /// Zeroes every counter (tests).
    pub fn clear_counters(&mut self) -> Result<()> {
        let cpus = aya::util::nr_cpus().map_err(|(_, e)| Error::Io {
            what: "counting CPUs".into(),
            source: e,
        })?;
        for reason in Reason::ALL {
            let zero = aya::maps::PerCpuValues::try_from(vec![Counter::default(); cpus])
                .map_err(Error::io("building per-CPU values"))?;
            self.stats
                .set(reason as u32, zero, 0)
                .map_err(map_err("writing", MAP_STATS))?;
        }
        Ok(())
    }

    /// Counters by reason, summed over CPUs.
    pub fn counters(&self) -> Result<[Counter; REASON_COUNT as usize]> {
        let mut out = [Counter::default(); REASON_COUNT as usize];
        for reason in Reason::ALL {
            let per_cpu = self
                .stats
                .get(&(reason as u32), 0)
                .map_err(map_err("reading", MAP_STATS))?;
            for c in per_cpu.iter() {
                out[reason as usize].packets += c.packets;
                out[reason as usize].bytes += c.bytes;
            }
        }
        Ok(out)
    }

    /// Every tracked gcra source and its state (IPv4 first).
    pub fn states(&self) -> impl Iterator<Item = Result<(FlowKey, gcra::State)>> + '_ {
        self.state_v4
            .iter()
            .map(|e| {
                e.map(|(k, v)| (k.widen(), v))
                    .map_err(map_err("reading", MAP_STATE_V4))
            })
            .chain(
                self.state
                    .iter()
                    .map(|e| e.map_err(map_err("reading", MAP_STATE))),
            )
    }

    /// Drop counts by source address.
    pub fn drops(&self) -> impl Iterator<Item = Result<(Addr, u64)>> + '_ {
        self.drops
            .iter()
            .map(|e| e.map_err(map_err("reading", MAP_DROPS)))
    }

    /// The state of one gcra key, if tracked.
    pub fn state(&self, key: &FlowKey) -> Option<gcra::State> {
        if common::is_v4_mapped(&key.addr) {
            self.state_v4.get(&key.v4(), 0).ok()
        } else {
            self.state.get(key, 0).ok()
        }
    }

    /// Deletes the wide state of `key` (tests).
    pub fn remove_wide_state(&mut self, key: &FlowKey) -> Result<()> {
        self.wide
            .remove(key)
            .map_err(map_err("removing", common::MAP_WIDE))
    }

    /// Deletes the gcra state of `key` (the idle sweep).
    pub fn remove_state(&mut self, key: &FlowKey) -> Result<()> {
        if common::is_v4_mapped(&key.addr) {
            self.state_v4
                .remove(&key.v4())
                .map_err(map_err("removing", MAP_STATE_V4))
        } else {
            self.state
                .remove(key)
                .map_err(map_err("removing", MAP_STATE))
        }
    }
}

/// A random 64-bit seed from the kernel.
fn random_seed() -> u64 {
    let mut seed = [0u8; 8];
    // SAFETY: a valid buffer of that length.
    let n = unsafe { libc::getrandom(seed.as_mut_ptr().cast(), seed.len(), 0) };
    let seed = u64::from_ne_bytes(seed);
    if n == 8 && seed != 0 {
        seed
    } else {
        // Not reached on Linux ≥ 3.17; a seed from the clock still differs per host.
        crate::daemon::monotonic_ns() | 1
    }
}

/// `BPF_MAP_LOOKUP_BATCH`: the `batch` member of `union bpf_attr`.
#[repr(C)]
#[derive(Default)]
struct BatchAttr {
    in_batch: u64,
    out_batch: u64,
    keys: u64,
    values: u64,
    count: u32,
    map_fd: u32,
    elem_flags: u64,
    flags: u64,
}

const BPF_MAP_LOOKUP_BATCH: libc::c_long = 24;

/// Entries of a hash map, read in batches (two syscalls per entry with the
/// iterator; a few per million this way).
fn count_entries(map: &MapData, name: &'static str) -> Result<usize> {
    use std::os::fd::{AsFd as _, AsRawFd as _};
    let info = map.info().map_err(map_err("reading", name))?;
    let key_size = info.key_size() as usize;
    let value_size = (info.value_size() as usize).next_multiple_of(8);
    const BATCH: usize = 16 * 1024;
    let mut keys = vec![0u8; BATCH * key_size];
    let mut values = vec![0u8; BATCH * value_size];
    // The batch token is a bucket index (u32) for hash maps.
    let (mut token_in, mut token_out) = ([0u8; 8], [0u8; 8]);
    let mut first = true;
    let mut total = 0usize;
    loop {
        let mut attr = BatchAttr {
            in_batch: if first { 0 } else { token_in.as_ptr() as u64 },
            out_batch: token_out.as_mut_ptr() as u64,
            keys: keys.as_mut_ptr() as u64,
            values: values.as_mut_ptr() as u64,
            count: BATCH as u32,
            map_fd: map.fd().as_fd().as_raw_fd() as u32,
            ..Default::default()
        };
        // SAFETY: attr is a valid bpf_attr prefix whose buffers hold BATCH keys
        // and values and outlive the call.
        let rc = unsafe {
            libc::syscall(
                libc::SYS_bpf,
                BPF_MAP_LOOKUP_BATCH,
                &mut attr as *mut BatchAttr,
                std::mem::size_of::<BatchAttr>(),
            )
        };
        total += attr.count as usize;
        if rc != 0 {
            let e = std::io::Error::last_os_error();
            if e.raw_os_error() == Some(libc::ENOENT) {
                return Ok(total);
            }
            return Err(Error::Io {
                what: format!("counting the entries of map {name}"),
                source: e,
            });
        }
        token_in = token_out;
        first = false;
    }
}

/// Makes `rule` the next generation of `previous` (same prefix) and returns
/// true, when the keys' states can carry over: both are limits with the same
/// algorithm. Otherwise returns false and the caller gives the rule a new id, so
/// its keys start fresh (another algorithm keeps its state in another form).
fn carry_over(previous: &common::Rule, rule: &mut common::Rule) -> bool {
    use common::action::LIMIT;
    if rule.action != LIMIT {
        // Allow and deny keep no state: the id may stay.
        return true;
    }
    if previous.action != LIMIT || previous.algorithm != rule.algorithm {
        return false;
    }
    if rule.algorithm == common::algorithm::GCRA {
        let gcra = rule.gcra().succeeding(&previous.gcra());
        rule.params = common::AlgoParams::from_gcra(gcra);
    }
    // The shared levels carry over their tokens too, where both rules have them
    // (see `Maps::reset_shared` for a level a rule gains).
    rule.new_sources = rule.new_sources.succeeding(&previous.new_sources);
    rule.aggregate = rule.aggregate.succeeding(&previous.aggregate);
    true
}

/// The program loaded, attached and pinned for one interface.
pub struct Enforcer {
    iface: String,
    mode: Attached,
    /// Present while the link is pinned; `None` once released.
    link: Option<PinnedLink>,
    /// Keeps the program's fd (and so the maps' fds) open.
    _ebpf: Ebpf,
    /// Reads the program's aya-log records (see [`crate::logs`]).
    logger: Option<aya_log::EbpfLogger<crate::logs::TracingLog>>,
    /// The maps.
    pub maps: Maps,
    /// Whether the program was adopted from a previous daemon's pins.
    pub adopted: bool,
}

fn if_exists(iface: &str) -> bool {
    let Ok(name) = std::ffi::CString::new(iface) else {
        return false;
    };
    // SAFETY: a valid C string.
    unsafe { libc::if_nametoindex(name.as_ptr()) != 0 }
}

impl Enforcer {
    /// Loads the program for `iface`, reusing pinned maps, and attaches it: to the
    /// pinned link if a previous daemon left one (atomic replacement, no moment
    /// without enforcement), else anew in `mode`.
    pub fn start(iface: &str, mode: AttachMode, opts: &LoadOptions, reset: bool) -> Result<Self> {
        if iface.is_empty()
            || iface.len() >= libc::IFNAMSIZ
            || iface.contains('/')
            || !if_exists(iface)
        {
            return Err(Error::UnknownInterface(iface.to_string()));
        }
        ensure_bpffs()?;
        let dir = pin_dir(iface);
        if reset && dir.exists() {
            info!(dir = %dir.display(), "--reset: removing pinned state");
            remove_pins(&dir)?;
        }
        fs::create_dir_all(&dir).map_err(Error::io(format!(
            "creating {} (is bpffs mounted at /sys/fs/bpf?)",
            dir.display()
        )))?;
        let map_paths: Vec<(&str, PathBuf)> = common::ALL_MAPS
            .iter()
            .map(|name| (*name, dir.join(name)))
            .collect();
        let mut loader = opts.loader();
        for (name, path) in &map_paths {
            loader.map_pin_path(name, path.as_path());
        }
        let mut ebpf = loader.load(crate::EBPF_OBJECT).map_err(Error::Load)?;
        let maps = Maps::from_ebpf(&mut ebpf)?;
        let logger = match aya_log::EbpfLogger::init_with_logger(&mut ebpf, crate::logs::TracingLog)
        {
            Ok(l) => Some(l),
            Err(e) => {
                warn!(error = %e, "the XDP program's log records will not be forwarded");
                None
            }
        };
        let program: &mut Xdp = ebpf
            .program_mut(PROGRAM_NAME)
            .ok_or_else(|| Error::Program {
                op: "finding the XDP program in the object",
                source: aya::programs::ProgramError::UnexpectedProgramType,
            })?
            .try_into()
            .map_err(|source| Error::Program {
                op: "typing the XDP program",
                source,
            })?;
        program.load().map_err(|source| Error::Program {
            op: "loading the XDP program (the verifier's log is in the source chain)",
            source,
        })?;

        let link_path = dir.join(LINK_PIN);
        let (link, mode, adopted) = if link_path.exists() {
            let pinned = PinnedLink::from_pin(&link_path).map_err(|source| Error::Link {
                path: link_path.clone(),
                source,
            })?;
            let fd_link: FdLink = pinned.into();
            let id = program
                .attach_to_link(XdpLink::try_from(fd_link).map_err(|source| Error::Link {
                    path: link_path.clone(),
                    source,
                })?)
                .map_err(|source| Error::Program {
                    op: "replacing the program in the pinned link",
                    source,
                })?;
            let mode = read_mode(iface);
            // Our fd now holds the link: replace the old pin with ours.
            let link = program.take_link(id).map_err(|source| Error::Program {
                op: "taking the XDP link",
                source,
            })?;
            fs::remove_file(&link_path)
                .map_err(Error::io(format!("replacing {}", link_path.display())))?;
            (pin_link(link, &link_path)?, mode, true)
        } else {
            let (id, mode) = attach(program, iface, mode)?;
            (take_and_pin(program, id, &link_path)?, mode, false)
        };
        let mode_file = mode_path(iface);
        fs::write(&mode_file, mode.to_string())
            .map_err(Error::io(format!("writing {}", mode_file.display())))?;
        Ok(Self {
            iface: iface.to_string(),
            mode,
            logger,
            link: Some(link),
            _ebpf: ebpf,
            maps,
            adopted,
        })
    }

    /// Takes the program's log reader, to be polled by the daemon.
    pub fn take_logger(&mut self) -> Option<aya_log::EbpfLogger<crate::logs::TracingLog>> {
        self.logger.take()
    }

    /// The interface.
    pub fn iface(&self) -> &str {
        &self.iface
    }

    /// The attach mode.
    pub fn mode(&self) -> Attached {
        self.mode
    }

    /// Detaches the program and removes every pin of the interface.
    pub fn detach(mut self) -> Result<()> {
        if let Some(link) = self.link.take() {
            let link = link.unpin().map_err(Error::io("unpinning the XDP link"))?;
            drop(link);
        }
        let _ = fs::remove_file(mode_path(&self.iface));
        remove_pins(&pin_dir(&self.iface))
    }

    /// Leaves the program attached and pinned: it keeps enforcing after exit.
    pub fn keep(mut self) {
        drop(self.link.take());
    }
}

/// Where the attach mode of `iface` is recorded (bpffs holds no plain files).
fn mode_path(iface: &str) -> PathBuf {
    crate::control::run_dir().join(format!("{iface}.mode"))
}

fn read_mode(iface: &str) -> Attached {
    match fs::read_to_string(mode_path(iface)).as_deref() {
        Ok("generic") => Attached::Generic,
        _ => Attached::Native,
    }
}

fn take_and_pin(
    program: &mut Xdp,
    id: aya::programs::xdp::XdpLinkId,
    path: &Path,
) -> Result<PinnedLink> {
    let link = program.take_link(id).map_err(|source| Error::Program {
        op: "taking the XDP link",
        source,
    })?;
    pin_link(link, path)
}

fn pin_link(link: XdpLink, path: &Path) -> Result<PinnedLink> {
    let fd_link = FdLink::try_from(link).map_err(|source| Error::Link {
        path: path.to_path_buf(),
        source,
    })?;
    fd_link.pin(path).map_err(|source| Error::Pin {
        path: path.to_path_buf(),
        source,
    })
}

fn attach(
    program: &mut Xdp,
    iface: &str,
    mode: AttachMode,
) -> Result<(aya::programs::xdp::XdpLinkId, Attached)> {
    let native = |p: &mut Xdp| p.attach(iface, XdpMode::Driver);
    let generic = |p: &mut Xdp| p.attach(iface, XdpMode::Skb);
    let err = |mode: &'static str| {
        move |source| Error::Attach {
            iface: iface.to_string(),
            mode,
            source,
        }
    };
    match mode {
        AttachMode::Native => Ok((native(program).map_err(err("native"))?, Attached::Native)),
        AttachMode::Generic => Ok((generic(program).map_err(err("generic"))?, Attached::Generic)),
        AttachMode::Auto => match native(program) {
            Ok(id) => Ok((id, Attached::Native)),
            Err(e) => {
                warn!(iface, error = %e, "native XDP attach failed; falling back to generic (skb) mode, which runs later and costs more per packet");
                Ok((generic(program).map_err(err("generic"))?, Attached::Generic))
            }
        },
    }
}

const BPFFS: &str = "/sys/fs/bpf";
const BPF_FS_MAGIC: i64 = 0xcafe_4a11;

/// Mounts bpffs at /sys/fs/bpf unless it is there already (some containers and
/// minimal systems lack it).
fn ensure_bpffs() -> Result<()> {
    let path = std::ffi::CString::new(BPFFS).expect("no NUL");
    // SAFETY: a zeroed statfs is a valid out value; the path is a C string.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::statfs(path.as_ptr(), &mut st) } == 0 && st.f_type as i64 == BPF_FS_MAGIC {
        return Ok(());
    }
    let _ = fs::create_dir_all(BPFFS);
    let fstype = std::ffi::CString::new("bpf").expect("no NUL");
    // SAFETY: C strings; no data argument.
    let rc = unsafe {
        libc::mount(
            fstype.as_ptr(),
            path.as_ptr(),
            fstype.as_ptr(),
            0,
            std::ptr::null(),
        )
    };
    if rc != 0 {
        return Err(Error::Io {
            what: format!("{BPFFS} is not bpffs and mounting it failed (mount -t bpf bpf {BPFFS})"),
            source: std::io::Error::last_os_error(),
        });
    }
    info!("mounted bpffs at {BPFFS}");
    Ok(())
}

/// Removes a pin directory and everything in it.
pub fn remove_pins(dir: &Path) -> Result<()> {
    match fs::remove_dir_all(dir) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(Error::Io {
            what: format!("removing {}", dir.display()),
            source: e,
        }),
    }
}
