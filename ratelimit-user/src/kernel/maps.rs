//! The typed maps, found by name: rule sets written whole as [`plan`] decides
//! (into the idle trie, then switched), and the rule set the kernel enforces
//! read back when the daemon's own record is lost. Counters, events, the drop
//! log and the states are read in [`state`].

use std::{collections::BTreeMap, path::Path, sync::Arc};

use aya::{
    Ebpf,
    maps::{
        Array, HashMap, IterableMap as _, LpmTrie, Map, MapData, PerCpuArray, RingBuf,
        lpm_trie::Key,
    },
};
use ratelimit_common::{
    self as common, Counter, FlowKey, GlobalState, MAP_CONFIG, MAP_DROPS, MAP_EVENTS, MAP_GLOBAL,
    MAP_GROUPS, MAP_RULE_STATE, MAP_RULE_TABLE, MAP_RULES, MAP_RULES_B, MAP_SEEN, MAP_STATS,
    MAP_TABLE, RuleAddr, RuleState,
};

use super::{
    LoadOptions,
    plan::{self, ListPlan, TrieEntries, TrieKey, TrieState},
    sys,
};
use crate::{
    error::{Error, Result},
    model::lists::{List, ListAction},
    model::matching::Selector,
    model::rules::{Prefix, RuleSet},
};

mod state;
mod table;

/// The typed maps.
pub struct Maps {
    /// The two rule tries; `Config::active_rules` says which the program reads.
    tries: [LpmTrie<MapData, RuleAddr, u32>; 2],
    table: Array<MapData, common::Rule>,
    /// The state table, mapped into memory.
    state_table: table::StateTable,
    stats: PerCpuArray<MapData, Counter>,
    config: Array<MapData, common::Config>,
    /// `top`'s table, mapped into memory.
    drops: table::Sets<common::TopSet>,
    wide: HashMap<MapData, FlowKey, common::WideState>,
    rule_state: Array<MapData, RuleState>,
    /// Held for the program; not read by the daemon.
    global: Array<MapData, GlobalState>,
    events: PerCpuArray<MapData, u64>,
    /// Held for the program; not read by the daemon.
    seen: Array<MapData, u64>,
    /// What keys of fleet-wide rules were admitted here.
    fleet_used: table::Sets<common::FleetSet>,
    /// How much of that the daemon accounted for (its report cursor).
    fleet_reported: HashMap<MapData, FlowKey, common::FleetCursor>,
    /// The daemon's heartbeat, for the program.
    fleet_beat: Array<MapData, common::FleetBeat>,
    /// Match groups: a half for each trie.
    groups: Array<MapData, common::MatchGroup>,
    /// Each rule's verdicts, [`common::RULE_COUNTERS`] slots per rule slot.
    rule_stats: PerCpuArray<MapData, Counter>,
    /// The filter of keys with a state ([`common::MAP_KNOWN`]). Held for the
    /// program; the states the daemon inserts (fleet-wide rules) are looked
    /// up whatever it says.
    known: Array<MapData, u64>,
    /// The drop log's ring buffer: held for pinning; the daemon reads it
    /// through [`Maps::drop_log_reader`].
    drop_log: MapData,
    /// Each CPU's drop log budget and counts.
    drop_log_budget: PerCpuArray<MapData, common::DropLogBudget>,
    /// What each trie holds, as this daemon (the one writer) last wrote it
    /// (`None`: not known yet, read from the kernel when needed). With a
    /// million list entries, a rule change then looks at the rules' entries
    /// only and writes what differs: a few system calls, not millions.
    held: [Option<TrieState>; 2],
    /// The list entries of the lists last written, reused while the lists
    /// stay the same.
    lists: Option<Arc<ListPlan>>,
    /// The counted lists' policy rules the program reads, by list name, as
    /// this daemon last wrote them (`None`: not known yet; those in the
    /// kernel are read back, without their names).
    counted: Option<BTreeMap<String, (u32, common::Rule)>>,
    /// Each rule's name by its slot, with its id, for the drop log: built
    /// when first asked after a change ([`Maps::rule_names`]).
    names: Option<Arc<BTreeMap<u32, (u32, String)>>>,
    /// The config this daemon last wrote (`None`: none yet).
    written_config: Option<common::Config>,
    /// Where [`Maps::check`] goes on in each trie's list entries.
    check_cursor: [Option<TrieKey>; 2],
}

/// What [`Maps::check`] found different from what this daemon wrote, and
/// put back.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Drift {
    /// The config.
    pub config: bool,
    /// Trie entries (rules' and lists').
    pub entries: usize,
}

impl Drift {
    /// Whether anything differed.
    pub fn any(&self) -> bool {
        self.config || self.entries > 0
    }
}

/// The drop log's counts, all CPUs together (see [`common::DropLogBudget`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DropLogCounts {
    /// Records written.
    pub written: u64,
    /// Drops not logged: over the budget.
    pub skipped: u64,
    /// Records that found the ring full (the daemon was not reading).
    pub lost: u64,
}

impl DropLogCounts {
    /// The sum of each CPU's counts.
    pub fn sum<'a>(per_cpu: impl Iterator<Item = &'a common::DropLogBudget>) -> Self {
        per_cpu.fold(Self::default(), |a, b| Self {
            written: a.written + b.written,
            skipped: a.skipped + b.skipped,
            lost: a.lost + b.lost,
        })
    }
}

/// The name of the recovered list of `action` (list entries read back from
/// the pinned maps when the daemon's own record is lost).
pub(super) const RECOVERED_LIST: [&str; 2] = ["recovered-deny", "recovered-allow"];

fn map_err(op: &'static str, map: &'static str) -> impl FnOnce(aya::maps::MapError) -> Error {
    move |source| Error::Map { op, map, source }
}

/// The ring buffer `map` (named `name`) as its map alone: kept with the
/// descriptor the object was loaded with, which the program's relocations
/// name (a copy would leave that one closed).
fn ring_map(map: Map, name: &'static str) -> Result<MapData> {
    if let Map::RingBuf(data) = map {
        return Ok(data);
    }
    let why = RingBuf::try_from(&map)
        .err()
        .unwrap_or(aya::maps::MapError::InvalidName {
            name: name.to_string(),
        });
    Err(map_err("typing", name)(why))
}

/// The map behind `fd` (map `name`), on a descriptor of its own.
fn dup_map(fd: &impl std::os::fd::AsFd, name: &'static str) -> Result<MapData> {
    let fd = fd
        .as_fd()
        .try_clone_to_owned()
        .map_err(Error::io(format!("duplicating the descriptor of {name}")))?;
    MapData::from_fd(fd).map_err(map_err("opening", name))
}

/// Types the map `name` taken by `take`.
fn typed<T: TryFrom<Map, Error = aya::maps::MapError>>(
    take: &mut impl FnMut(&'static str) -> Result<Map>,
    name: &'static str,
) -> Result<T> {
    T::try_from(take(name)?).map_err(map_err("typing", name))
}

impl Maps {
    /// Takes the maps out of a loaded object, by name; the first `v4_lines`
    /// lines of its state table are IPv4 keys' (`None`: as its config says,
    /// for maps adopted from pins).
    pub fn from_ebpf(ebpf: &mut Ebpf, v4_lines: Option<u32>) -> Result<Self> {
        Self::from_maps(v4_lines, |name| {
            ebpf.take_map(name).ok_or_else(|| Error::Map {
                op: "finding",
                map: name,
                source: aya::maps::MapError::InvalidName {
                    name: name.to_string(),
                },
            })
        })
    }

    /// Opens the maps pinned in `dir` (a daemon's pin directory), by name.
    pub fn from_pins(dir: &Path) -> Result<Self> {
        Self::from_maps(None, |name| {
            let data =
                MapData::from_pin(dir.join(name)).map_err(map_err("opening pinned", name))?;
            Map::from_map_data(data).map_err(map_err("opening pinned", name))
        })
    }

    /// Types each map `take` gives for its name.
    fn from_maps(
        v4_lines: Option<u32>,
        mut take: impl FnMut(&'static str) -> Result<Map>,
    ) -> Result<Self> {
        let t = &mut take;
        let config: Array<MapData, common::Config> = typed(t, MAP_CONFIG)?;
        let v4_lines = match v4_lines {
            Some(n) => n,
            None => config
                .get(&0, 0)
                .map_err(map_err("reading", MAP_CONFIG))?
                .state_mask
                .wrapping_add(1),
        };
        let seen: Array<MapData, u64> = typed(t, MAP_SEEN)?;
        if !seen.len().is_power_of_two() {
            return Err(Error::invalid(
                "--doorkeeper-slots",
                format!("{} is not a power of two", seen.len()),
            ));
        }
        Ok(Self {
            tries: [typed(t, MAP_RULES)?, typed(t, MAP_RULES_B)?],
            table: typed(t, MAP_RULE_TABLE)?,
            state_table: table::StateTable::new(
                typed(t, MAP_TABLE)?,
                typed(t, common::MAP_BORN)?,
                v4_lines,
            )?,
            stats: typed(t, MAP_STATS)?,
            config,
            drops: table::Sets::new(typed(t, MAP_DROPS)?, MAP_DROPS)?,
            wide: typed(t, common::MAP_WIDE)?,
            seen,
            rule_state: typed(t, MAP_RULE_STATE)?,
            global: typed(t, MAP_GLOBAL)?,
            events: typed(t, MAP_EVENTS)?,
            fleet_used: table::Sets::new(
                typed(t, common::MAP_FLEET_USED)?,
                common::MAP_FLEET_USED,
            )?,
            fleet_reported: typed(t, common::MAP_FLEET_REPORTED)?,
            fleet_beat: typed(t, common::MAP_FLEET_BEAT)?,
            groups: typed(t, common::MAP_GROUPS)?,
            rule_stats: typed(t, common::MAP_RULE_STATS)?,
            known: typed(t, common::MAP_KNOWN)?,
            drop_log: ring_map(t(common::MAP_DROP_LOG)?, common::MAP_DROP_LOG)?,
            drop_log_budget: typed(t, common::MAP_DROP_LOG_BUDGET)?,
            held: [None, None],
            lists: None,
            counted: None,
            names: None,
            written_config: None,
            check_cursor: [None, None],
        })
    }

    /// The same maps opened again on descriptors of their own, with nothing
    /// of this view's record of what it wrote (as [`Maps::from_pins`] opens
    /// a daemon's pins): the kernel tier's tests share one loaded object and
    /// start each from its maps emptied, with a view of its own.
    pub fn reopen(&self) -> Result<Self> {
        Self::from_maps(Some(self.state_table.lines().0), |name| {
            let map = self.named(name).ok_or_else(|| Error::Map {
                op: "finding",
                map: name,
                source: aya::maps::MapError::InvalidName {
                    name: name.to_string(),
                },
            })?;
            let data = dup_map(map.fd(), name)?;
            Map::from_map_data(data).map_err(map_err("opening", name))
        })
    }

    /// Each map's descriptor, by name (every one of [`common::PINNED_MAPS`]).
    pub fn descriptors(&self) -> Vec<(&'static str, std::os::fd::BorrowedFd<'_>)> {
        use std::os::fd::AsFd as _;
        common::PINNED_MAPS
            .iter()
            .filter_map(|&name| self.named(name).map(|m| (name, m.fd().as_fd())))
            .collect()
    }

    /// The map named `name` (one of [`common::PINNED_MAPS`]).
    fn named(&self, name: &str) -> Option<&MapData> {
        Some(match name {
            MAP_RULES => self.tries[0].map(),
            MAP_RULES_B => self.tries[1].map(),
            MAP_RULE_TABLE => self.table.map(),
            MAP_TABLE => self.state_table.lines_map.map(),
            common::MAP_BORN => self.state_table.born_map.map(),
            MAP_STATS => self.stats.map(),
            MAP_CONFIG => self.config.map(),
            MAP_DROPS => self.drops.map.map(),
            common::MAP_WIDE => self.wide.map(),
            MAP_SEEN => self.seen.map(),
            MAP_RULE_STATE => self.rule_state.map(),
            MAP_GLOBAL => self.global.map(),
            MAP_EVENTS => self.events.map(),
            common::MAP_FLEET_USED => self.fleet_used.map.map(),
            common::MAP_FLEET_REPORTED => self.fleet_reported.map(),
            common::MAP_FLEET_BEAT => self.fleet_beat.map(),
            common::MAP_GROUPS => self.groups.map(),
            common::MAP_RULE_STATS => self.rule_stats.map(),
            common::MAP_KNOWN => self.known.map(),
            common::MAP_DROP_LOG => &self.drop_log,
            common::MAP_DROP_LOG_BUDGET => self.drop_log_budget.map(),
            _ => return None,
        })
    }

    /// Pins every map in `dir`, replacing what was pinned there.
    pub fn pin(&self, dir: &Path) -> Result<()> {
        for name in common::PINNED_MAPS {
            let map = self.named(name).expect("every pinned map is held");
            let path = dir.join(name);
            let _ = std::fs::remove_file(&path);
            map.pin(&path).map_err(|source| Error::Pin {
                path: path.clone(),
                source,
            })?;
        }
        Ok(())
    }

    /// The sizes the maps were created with.
    pub fn capacities(&self) -> LoadOptions {
        let max = |m: &MapData| m.info().map(|i| i.max_entries()).unwrap_or(0);
        let rules_capacity = self.rules_capacity();
        LoadOptions {
            state_capacity: common::state_sources(self.state_table.lines().0),
            state_capacity_v6: common::state_sources(self.state_table.lines().1),
            rules_capacity,
            list_capacity: max(self.tries[0].map()).saturating_sub(rules_capacity),
            wide_capacity: max(self.wide.map()),
            seen_slots: self.seen.len(),
        }
    }

    /// The active trie's index (0 or 1).
    fn active(&self) -> Result<usize> {
        Ok((self.config()?.active_rules & 1) as usize)
    }

    /// Rules at most: the rule-state array has a slot for each and the
    /// default rule's.
    fn rules_capacity(&self) -> u32 {
        self.rule_state.len().saturating_sub(1)
    }

    /// The entries of trie `which`, read from the kernel.
    fn read_trie(&self, which: usize) -> Result<TrieEntries> {
        let name = if which == 0 { MAP_RULES } else { MAP_RULES_B };
        self.tries[which]
            .iter()
            .map(|e| {
                e.map(|(k, v)| ((k.prefix_len(), k.data()), v))
                    .map_err(map_err("reading", name))
            })
            .collect()
    }

    /// Every entry of `entries` with the table index it points at (see
    /// [`plan::own_entries`]), the groups read from the kernel.
    fn own_entries<'a>(
        &self,
        entries: impl Iterator<Item = (&'a TrieKey, &'a u32)>,
    ) -> Result<Vec<(Selector, u32)>> {
        plan::own_entries(entries, |i| {
            self.groups
                .get(&i, 0)
                .map_err(map_err("reading", MAP_GROUPS))
        })
    }

    /// Where each rule is in the rule table, in trie `which` (and its groups).
    /// List entries (they point at the policy rules) are not rules.
    /// From what this daemon wrote when it knows it (the rules' entries
    /// alone), else from the kernel.
    fn rule_indexes(&self, which: usize) -> Result<BTreeMap<Selector, u32>> {
        let (deny_index, allow_index) = self.policy_indexes();
        let own = match &self.held[which] {
            Some(state) => self.own_entries(state.rules.iter())?,
            None => self.own_entries(self.read_trie(which)?.iter())?,
        };
        let counted = self.counted_rules(&own)?;
        Ok(own
            .into_iter()
            .filter(|(_, i)| *i != deny_index && *i != allow_index && !counted.contains_key(i))
            .collect())
    }

    /// The counted lists' policy rules among what `entries` point at, by
    /// table index: as this daemon wrote them, else read from the table
    /// (marked [`common::Rule::counted_list`]).
    fn counted_rules(&self, entries: &[(Selector, u32)]) -> Result<BTreeMap<u32, common::Rule>> {
        if let Some(counted) = &self.counted {
            return Ok(counted.values().copied().collect());
        }
        let (deny_index, allow_index) = self.policy_indexes();
        let indexes: std::collections::BTreeSet<u32> = entries
            .iter()
            .map(|(_, i)| *i)
            .filter(|i| *i != deny_index && *i != allow_index)
            .collect();
        let mut out = BTreeMap::new();
        for i in indexes {
            let rule = self.table_rule(i)?;
            if rule.counted_list != 0 {
                out.insert(i, rule);
            }
        }
        Ok(out)
    }

    /// Each counted list's frames by name (drops for a deny list, passes
    /// for an allow list), summed over CPUs, since its policy rule was
    /// written (the daemon's start, or the list's first load).
    pub fn list_counters(&self) -> Result<BTreeMap<String, Counter>> {
        let Some(counted) = &self.counted else {
            return Ok(BTreeMap::new());
        };
        counted
            .iter()
            .map(|(name, (_, rule))| {
                let c = self.rule_counters(rule.slot)?;
                let which = if rule.action == common::action::ALLOW {
                    common::RuleCounter::Passed
                } else {
                    common::RuleCounter::Dropped
                };
                let at = common::RuleCounter::ALL
                    .iter()
                    .position(|r| *r == which)
                    .unwrap_or(0);
                Ok((name.clone(), c[at]))
            })
            .collect()
    }

    /// The list entries the program reads now: (deny, allow), sorted. A list
    /// entry is a trie entry (or the own entry without a match of a group)
    /// that points at a policy rule.
    pub fn list_entries(&self) -> Result<(Vec<Prefix>, Vec<Prefix>)> {
        let (deny_index, allow_index) = self.policy_indexes();
        let (mut deny, mut allow) = (Vec::new(), Vec::new());
        let entries = self.read_trie(self.active()?)?;
        let own = self.own_entries(entries.iter())?;
        let counted = self.counted_rules(&own)?;
        for (selector, index) in own {
            if !selector.matches.is_any() {
                continue;
            }
            let counted_as = counted.get(&index).map(|r| r.action);
            if index == deny_index || counted_as == Some(common::action::DENY) {
                deny.push(selector.source);
            } else if index == allow_index || counted_as == Some(common::action::ALLOW) {
                allow.push(selector.source);
            }
        }
        deny.sort_unstable();
        allow.sort_unstable();
        Ok((deny, allow))
    }

    /// Table indexes of the rules of the unjudged-frame policies: a deny and
    /// an allow, the table's last two entries (no rule of a set is put there).
    fn policy_indexes(&self) -> (u32, u32) {
        plan::policy_indexes(self.table.len())
    }

    fn table_rule(&self, index: u32) -> Result<common::Rule> {
        self.table
            .get(&index, 0)
            .map_err(map_err("reading", MAP_RULE_TABLE))
    }

    /// The rules the program reads now, by selector.
    pub fn rules(&self) -> Result<BTreeMap<Selector, common::Rule>> {
        self.rule_indexes(self.active()?)?
            .into_iter()
            .map(|(p, i)| Ok((p, self.table_rule(i)?)))
            .collect()
    }

    /// The rule set the kernel enforces now, read back from the maps (see
    /// [`RuleSet::from_kernel`]).
    /// The list entries come back as two lists, [`RECOVERED_LIST`] (their
    /// names and files are not in the maps).
    pub fn rule_set(&self) -> Result<RuleSet> {
        let mut set = RuleSet::from_kernel(&self.config()?, &self.default_rule()?, &self.rules()?);
        let (deny, allow) = self.list_entries()?;
        for (action, entries) in [(ListAction::Deny, deny), (ListAction::Allow, allow)] {
            if !entries.is_empty() {
                set.lists.insert(
                    RECOVERED_LIST[action as usize].to_string(),
                    List {
                        action,
                        source: "read back from the pinned maps".into(),
                        entries: Arc::from(entries),
                        counted: false,
                    },
                );
            }
        }
        Ok(set)
    }

    /// Each rule's name (as `list` names it: `default`, the selector, a
    /// counted list's `list NAME`) by its slot, with its id: what the drop
    /// log names a record's rule by. Kept until the next change.
    pub fn rule_names(&mut self) -> Result<Arc<BTreeMap<u32, (u32, String)>>> {
        if let Some(n) = &self.names {
            return Ok(n.clone());
        }
        let mut names = BTreeMap::new();
        let default = self.default_rule()?;
        names.insert(default.slot, (default.id, "default".to_string()));
        for (selector, rule) in self.rules()? {
            names.insert(rule.slot, (rule.id, selector.to_string()));
        }
        for (name, (_, rule)) in self.counted.iter().flatten() {
            names.insert(rule.slot, (rule.id, format!("list {name}")));
        }
        let names = Arc::new(names);
        self.names = Some(names.clone());
        Ok(names)
    }

    /// The default rule in the kernel.
    pub fn default_rule(&self) -> Result<common::Rule> {
        self.table_rule(self.config()?.default_rule)
    }

    /// The seed the program hashes keys with (the config's; 0 before the
    /// first is written).
    pub(crate) fn seed(&self) -> u64 {
        self.config().map_or(0, |c| c.hash_seed)
    }

    /// The global config in the kernel.
    pub fn config(&self) -> Result<common::Config> {
        self.config
            .get(&0, 0)
            .map_err(map_err("reading", MAP_CONFIG))
    }

    /// What the kernel holds now, as the planner needs it.
    fn current(&self, set: &RuleSet) -> Result<plan::Current> {
        let config = self.config()?;
        let (deny_index, allow_index) = self.policy_indexes();
        let active = (config.active_rules & 1) as usize;
        let rules = self
            .rule_indexes(active)?
            .into_iter()
            .map(|(s, i)| Ok((s, (i, self.table_rule(i)?))))
            .collect::<Result<_>>()?;
        let counted = match &self.counted {
            Some(c) => c.clone(),
            None => self.counted_in_kernel(set, active)?,
        };
        Ok(plan::Current {
            default: self.table_rule(config.default_rule)?,
            config,
            rules,
            policies: (self.table_rule(deny_index)?, self.table_rule(allow_index)?),
            counted,
            table_len: self.table.len(),
            slots: self.rule_state.len(),
            seen_slots: self.seen.len(),
            state_lines: self.state_table.lines(),
            list_capacity: self.list_capacity(),
        })
    }

    /// The counted lists' policy rules the program reads, found again in the
    /// kernel (pins adopted, or read by the CLI with no daemon): a counted
    /// list's rule is known by the list whose entries point at it (so it
    /// keeps its id, slot and counters, and the drop log's records name it);
    /// one no list of `set` points at keeps a placeholder name.
    fn counted_in_kernel(
        &self,
        set: &RuleSet,
        active: usize,
    ) -> Result<BTreeMap<String, (u32, common::Rule)>> {
        let own = self.own_entries(self.read_trie(active)?.iter())?;
        let at: BTreeMap<Prefix, u32> = own
            .iter()
            .filter(|(s, _)| s.is_plain())
            .map(|(s, i)| (s.source, *i))
            .collect();
        let rules = self.counted_rules(&own)?;
        // The rule most of a list's entries point at, among those of
        // its action (an entry may be another list's: shadowed by an
        // allow entry, or in two lists).
        let mut by_index: BTreeMap<u32, &String> = BTreeMap::new();
        for (name, l) in set.lists.iter().filter(|(_, l)| l.counted) {
            let action = if l.action == ListAction::Allow {
                common::action::ALLOW
            } else {
                common::action::DENY
            };
            let mut votes: BTreeMap<u32, usize> = BTreeMap::new();
            for i in l.entries.iter().filter_map(|p| at.get(p)) {
                if rules.get(i).is_some_and(|r| r.action == action) {
                    *votes.entry(*i).or_default() += 1;
                }
            }
            if let Some((i, _)) = votes.into_iter().max_by_key(|(_, n)| *n) {
                by_index.entry(i).or_insert(name);
            }
        }
        Ok(rules
            .into_iter()
            .map(|(i, r)| {
                let name = by_index
                    .get(&i)
                    .map_or_else(|| format!("#{i}"), |n| (*n).clone());
                (name, (i, r))
            })
            .collect())
    }

    /// Finds the counted lists' rules of `set` in the kernel, for
    /// [`Maps::list_counters`], when this view did not write them (the CLI
    /// answering from the pins with no daemon).
    pub fn recover_counted(&mut self, set: &RuleSet) -> Result<()> {
        if self.counted.is_none() {
            let active = (self.config()?.active_rules & 1) as usize;
            self.counted = Some(self.counted_in_kernel(set, active)?);
        }
        Ok(())
    }

    /// Writes `set` whole, or nothing: [`plan::plan`] computes and checks
    /// every value from what the kernel holds; the rules that change are
    /// written to free places of the rule table and the whole set into the
    /// trie the program does not read; one write of the config then switches
    /// the program to it. A failure before that switch leaves the kernel
    /// enforcing exactly what it did. Prefixes that stay keep their rule id
    /// and slot, so their buckets carry over.
    pub fn apply(&mut self, set: &RuleSet) -> Result<()> {
        let current = self.current(set)?;
        let host = plan::Host {
            fresh_seed: random_seed(),
            local_ports: local_ports(),
        };
        let plan = plan::plan(set, &current, self.lists.clone(), host)?;
        // The list entries are kept for the next plan, which reuses them
        // while the lists stay the same.
        self.lists = Some(plan.lists.clone());
        let counted = plan.counted.clone();
        self.names = None;
        self.execute(plan)?;
        self.counted = Some(counted);
        Ok(())
    }

    /// Writes what `plan` decided, in its order; the config last.
    fn execute(&mut self, plan: plan::Plan) -> Result<()> {
        for fresh in &plan.fresh_shared {
            self.fill_shared(fresh)?;
        }
        for slot in &plan.fresh_counters {
            self.reset_rule_counters(*slot)?;
        }
        for (index, rule) in &plan.table {
            self.table
                .set(*index, rule, 0)
                .map_err(map_err("writing", MAP_RULE_TABLE))?;
        }
        for (index, group) in &plan.groups {
            self.groups
                .set(*index, group, 0)
                .map_err(map_err("writing", MAP_GROUPS))?;
        }
        self.fill_idle_trie(plan.idle, plan.lists, &plan.trie)?;
        // The switch: one value, read once per frame.
        self.config
            .set(0, plan.config, 0)
            .map_err(map_err("writing", MAP_CONFIG))?;
        self.written_config = Some(plan.config);
        Ok(())
    }

    /// Checks that the kernel holds what this daemon last wrote, and puts
    /// back what differs (the daemon is the maps' one writer: a difference
    /// is a hand's edit of the pinned maps, or a cleanup script's): the
    /// config, every rule's entry in both tries, and `window` list entries
    /// of each trie in turn (all of them over enough checks), a lookup
    /// each. What it knows nothing of yet (after an adoption, before the
    /// first change) is not checked.
    pub fn check(&mut self, window: usize) -> Result<Drift> {
        let mut drift = Drift::default();
        if let Some(want) = self.written_config
            && self.config()? != want
        {
            self.config
                .set(0, want, 0)
                .map_err(map_err("writing", MAP_CONFIG))?;
            drift.config = true;
        }
        for which in 0..2 {
            let Some(state) = &self.held[which] else {
                continue;
            };
            let name = if which == 0 { MAP_RULES } else { MAP_RULES_B };
            let trie = &self.tries[which];
            let wrong = |k: &TrieKey, v: u32| -> Result<bool> {
                match trie.get(&Key::new(k.0, k.1), 0) {
                    Ok(got) => Ok(got != v),
                    Err(aya::maps::MapError::KeyNotFound) => Ok(true),
                    Err(e) => Err(map_err("reading", name)(e)),
                }
            };
            let mut fix: Vec<(TrieKey, u32)> = Vec::new();
            for (k, v) in &state.rules {
                if wrong(k, *v)? {
                    fix.push((*k, *v));
                }
            }
            use std::ops::Bound;
            let from = match self.check_cursor[which] {
                Some(c) => Bound::Excluded(c),
                None => Bound::Unbounded,
            };
            let mut last = None;
            for (k, v) in state
                .lists
                .entries
                .range((from, Bound::Unbounded))
                .take(window)
            {
                last = Some(*k);
                if !state.rules.contains_key(k) && wrong(k, *v)? {
                    fix.push((*k, *v));
                }
            }
            // From the start again once the end is reached.
            self.check_cursor[which] = last.filter(|_| window > 0);
            let trie = &mut self.tries[which];
            for (k, v) in &fix {
                trie.insert(&Key::new(k.0, k.1), v, 0)
                    .map_err(map_err("writing", name))?;
            }
            drift.entries += fix.len();
        }
        Ok(drift)
    }

    /// Whether the trie the program does not read holds other lists than the
    /// one it reads (after a list was loaded or removed): [`Maps::settle`]
    /// then makes the next change cheap.
    pub fn unsettled(&self) -> bool {
        let Ok(active) = self.active() else {
            return false;
        };
        match (&self.held[active], &self.held[1 - active]) {
            (Some(a), Some(i)) => !Arc::ptr_eq(&a.lists, &i.lists),
            (Some(_), None) => true,
            _ => false,
        }
    }

    /// Writes the entries of the trie the program reads into the other one
    /// (which the program does not read: nothing it enforces changes), so
    /// that the next change writes only its rules' entries there instead of
    /// a whole list's. Called by the daemon when idle after a list changed.
    pub fn settle(&mut self) -> Result<()> {
        let active = self.active()?;
        let Some(state) = &self.held[active] else {
            return Ok(());
        };
        let lists = state.lists.clone();
        let rules: Vec<(Prefix, u32)> = state
            .rules
            .iter()
            .map(|((bits, key), v)| (Prefix::from_lpm(*bits, *key), *v))
            .collect();
        self.fill_idle_trie(1 - active, lists, &rules)
    }

    /// List entries at most: the trie's entries past the rules'.
    fn list_capacity(&self) -> usize {
        self.tries[0]
            .map()
            .info()
            .map(|i| i.max_entries())
            .unwrap_or(0)
            .saturating_sub(self.rules_capacity()) as usize
    }

    /// Makes trie `which` (the one the program does not read) hold exactly
    /// the entries of `lists` with `rules` on top ([`plan::trie_writes`]).
    fn fill_idle_trie(
        &mut self,
        which: usize,
        lists: Arc<ListPlan>,
        rules: &[(Prefix, u32)],
    ) -> Result<()> {
        let name = if which == 0 { MAP_RULES } else { MAP_RULES_B };
        let wanted: TrieEntries = rules.iter().map(|(p, i)| (p.lpm(), *i)).collect();
        // Until this completes the trie's content is not known (a failure
        // part way leaves it to be read again).
        let writes = match self.held[which].take() {
            Some(old) => plan::trie_writes(plan::Before::Written(&old), &lists, &wanted),
            None => plan::trie_writes(plan::Before::Read(self.read_trie(which)?), &lists, &wanted),
        };
        let trie = &mut self.tries[which];
        for (key, value) in writes {
            let k = Key::new(key.0, key.1);
            match value {
                Some(v) => trie.insert(&k, v, 0).map_err(map_err("writing", name))?,
                None => trie.remove(&k).map_err(map_err("removing", name))?,
            }
        }
        self.held[which] = Some(TrieState {
            lists,
            rules: wanted,
        });
        Ok(())
    }

    /// Fills the shared buckets `fresh` names (a zero word is a full bucket).
    fn fill_shared(&mut self, fresh: &plan::FreshShared) -> Result<()> {
        let mut state = self
            .rule_state
            .get(&fresh.slot, 0)
            .map_err(map_err("reading", MAP_RULE_STATE))?;
        if fresh.new_sources {
            state.new_sources = 0;
        }
        if fresh.aggregate {
            state.aggregate = 0;
        }
        self.rule_state
            .set(fresh.slot, state, 0)
            .map_err(map_err("writing", MAP_RULE_STATE))
    }

    /// Zeroes the counters of the rule in `slot`.
    fn reset_rule_counters(&mut self, slot: u32) -> Result<()> {
        let cpus = aya::util::nr_cpus().map_err(|(_, e)| Error::Io {
            what: "counting CPUs".into(),
            source: e,
        })?;
        for c in 0..common::RULE_COUNTERS {
            let zero = aya::maps::PerCpuValues::try_from(vec![Counter::default(); cpus])
                .map_err(Error::io("building per-CPU values"))?;
            self.rule_stats
                .set(slot * common::RULE_COUNTERS + c, zero, 0)
                .map_err(map_err("writing", common::MAP_RULE_STATS))?;
        }
        Ok(())
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
        super::monotonic_ns() | 1
    }
}

/// Entries of a hash map, read in batches ([`sys::count_entries`]).
fn count_entries(map: &MapData, name: &'static str) -> Result<usize> {
    use std::os::fd::AsFd as _;
    let info = map.info().map_err(map_err("reading", name))?;
    sys::count_entries(
        map.fd().as_fd(),
        info.key_size() as usize,
        info.value_size() as usize,
    )
    .map_err(|source| Error::Io {
        what: format!("counting the entries of map {name}"),
        source,
    })
}

/// The ephemeral port range of this network namespace
/// (`net.ipv4.ip_local_port_range`, which IPv6 shares) as
/// [`common::Config::local_ports`]; 0 when it cannot be read.
pub(super) fn local_ports() -> u32 {
    let text =
        std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range").unwrap_or_default();
    let mut ports = text.split_whitespace().map(|p| p.parse::<u16>().ok());
    match (ports.next().flatten(), ports.next().flatten()) {
        (Some(first), Some(last)) if first <= last => u32::from(first) << 16 | u32::from(last),
        _ => {
            tracing::warn!(
                "cannot read net.ipv4.ip_local_port_range: the host's own connections are limited like any traffic"
            );
            0
        }
    }
}
