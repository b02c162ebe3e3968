//! The typed maps: rule sets written whole (into the idle trie, then switched),
//! counters, events and states read back, and the rule set the kernel enforces
//! read back when the daemon's own record is lost.

use std::{
    collections::{BTreeMap, HashMap as StdHashMap},
    path::Path,
    sync::Arc,
};

use aya::{
    Ebpf,
    maps::{Array, HashMap, IterableMap as _, LpmTrie, Map, MapData, PerCpuArray, lpm_trie::Key},
};
use ratelimit_common::{
    self as common, Counter, EVENT_COUNT, Event, FlowKey, FlowKeyV4, GROUP_BIT, GROUPS_CAPACITY,
    GlobalState, MAP_CONFIG, MAP_DROPS, MAP_EVENTS, MAP_GLOBAL, MAP_GROUPS, MAP_RULE_STATE,
    MAP_RULE_TABLE, MAP_RULES, MAP_RULES_B, MAP_SEEN, MAP_STATE, MAP_STATE_V4, MAP_STATS, NO_RULE,
    REASON_COUNT, Reason, RuleAddr, RuleState, gcra, match_fields,
};

use super::LoadOptions;
use crate::{
    error::{Error, Result},
    model::lists::{List, ListAction},
    model::matching::{self, Match, Selector},
    model::rules::{Action, Fragments, Mode, Prefix, RuleSet, Unjudged},
};

/// The typed maps.
pub struct Maps {
    /// The two rule tries; `Config::active_rules` says which the program reads.
    tries: [LpmTrie<MapData, RuleAddr, u32>; 2],
    table: Array<MapData, common::Rule>,
    state: HashMap<MapData, FlowKey, common::SourceState>,
    state_v4: HashMap<MapData, FlowKeyV4, common::SourceState>,
    stats: PerCpuArray<MapData, Counter>,
    config: Array<MapData, common::Config>,
    drops: HashMap<MapData, common::DropKey, u64>,
    wide: HashMap<MapData, FlowKey, common::WideState>,
    rule_state: Array<MapData, RuleState>,
    /// Held for the program; not read by the daemon.
    global: Array<MapData, GlobalState>,
    events: PerCpuArray<MapData, u64>,
    /// Held for the program; not read by the daemon.
    seen: Array<MapData, u64>,
    /// What keys of fleet-wide rules were admitted here.
    fleet_used: HashMap<MapData, FlowKey, Counter>,
    /// Match groups: a half for each trie.
    groups: Array<MapData, common::MatchGroup>,
    /// Each rule's verdicts, [`common::RULE_COUNTERS`] slots per rule slot.
    rule_stats: PerCpuArray<MapData, Counter>,
    /// The filter of keys with a state ([`common::MAP_KNOWN`]). Held for the
    /// program; the states the daemon inserts (fleet-wide rules) are looked
    /// up whatever it says.
    known: Array<MapData, u64>,
    /// What each trie holds, as this daemon (the one writer) last wrote it
    /// (`None`: not known yet, read from the kernel when needed). With a
    /// million list entries, a rule change then looks at the rules' entries
    /// only and writes what differs: a few system calls, not millions.
    held: [Option<TrieState>; 2],
    /// The list entries of the lists last written, reused while the lists
    /// stay the same.
    plan: Option<Arc<ListPlan>>,
}

/// A trie entry's key: (prefix length, family and address).
type TrieKey = (u32, RuleAddr);
/// A trie's entries: key → value.
type TrieEntries = StdHashMap<TrieKey, u32>;

/// What a trie holds: its lists' entries, with the rules' entries on top (a
/// rule at a list entry's CIDR takes its place).
struct TrieState {
    lists: Arc<ListPlan>,
    rules: TrieEntries,
}

impl TrieState {
    /// Every entry.
    fn entries(&self) -> TrieEntries {
        let mut all = self.lists.entries.clone();
        all.extend(self.rules.iter().map(|(k, v)| (*k, *v)));
        all
    }
}

/// The trie entries of a set's lists (each pointing at its list's policy
/// rule), once the allow lists took what they cover from the deny lists and
/// each CIDR is counted once; computed when the lists change, not when a
/// rule does.
pub struct ListPlan {
    /// The lists it was made of: name, action, entries (the same `Arc` while
    /// a list is unchanged).
    from: Vec<(String, ListAction, Arc<[Prefix]>)>,
    /// Key → policy rule index.
    entries: TrieEntries,
}

impl ListPlan {
    fn of(set: &RuleSet) -> Vec<(String, ListAction, Arc<[Prefix]>)> {
        set.lists
            .iter()
            .map(|(n, l)| (n.clone(), l.action, l.entries.clone()))
            .collect()
    }

    fn made_of(&self, from: &[(String, ListAction, Arc<[Prefix]>)]) -> bool {
        self.from.len() == from.len()
            && self
                .from
                .iter()
                .zip(from)
                .all(|(a, b)| a.0 == b.0 && a.1 == b.1 && Arc::ptr_eq(&a.2, &b.2))
    }
}

impl matching::ListEntries for ListPlan {
    fn at(&self, p: &Prefix) -> Option<u32> {
        self.entries.get(&p.lpm()).copied()
    }

    fn around(&self, p: &Prefix) -> Option<(Prefix, u32)> {
        (0..p.len).rev().find_map(|len| {
            let q = p.widened(len);
            self.entries.get(&q.lpm()).map(|i| (q, *i))
        })
    }
}

/// The name of the recovered list of `action` (list entries read back from
/// the pinned maps when the daemon's own record is lost).
pub const RECOVERED_LIST: [&str; 2] = ["recovered-deny", "recovered-allow"];

/// The maps' names, in the order [`Maps::from_maps`] takes them: the pinned
/// ones (the per-CPU scratch map stays inside the program).
const NAMES: [&str; 17] = common::PINNED_MAPS;

fn map_err(op: &'static str, map: &'static str) -> impl FnOnce(aya::maps::MapError) -> Error {
    move |source| Error::Map { op, map, source }
}

impl Maps {
    /// Takes the maps out of a loaded object.
    pub fn from_ebpf(ebpf: &mut Ebpf) -> Result<Self> {
        let mut maps = Vec::with_capacity(NAMES.len());
        for name in NAMES {
            maps.push(ebpf.take_map(name).ok_or_else(|| Error::Map {
                op: "finding",
                map: name,
                source: aya::maps::MapError::InvalidName {
                    name: name.to_string(),
                },
            })?);
        }
        Self::from_maps(maps)
    }

    /// Opens the maps pinned in `dir` (a daemon's pin directory).
    pub fn from_pins(dir: &Path) -> Result<Self> {
        let mut maps = Vec::with_capacity(NAMES.len());
        for name in NAMES {
            let data =
                MapData::from_pin(dir.join(name)).map_err(map_err("opening pinned", name))?;
            maps.push(Map::from_map_data(data).map_err(map_err("opening pinned", name))?);
        }
        Self::from_maps(maps)
    }

    fn from_maps(maps: Vec<Map>) -> Result<Self> {
        let mut it = maps.into_iter();
        let mut next = || it.next().expect("one map per name");
        let rules_a = next();
        let rules_b = next();
        let (table, state, state_v4, stats, config, drops, wide, seen, rule_state, global, events) = (
            next(),
            next(),
            next(),
            next(),
            next(),
            next(),
            next(),
            next(),
            next(),
            next(),
            next(),
        );
        let fleet_used = next();
        let groups = next();
        let rule_stats = next();
        let known = next();
        let seen: Array<MapData, u64> =
            Array::try_from(seen).map_err(map_err("typing", MAP_SEEN))?;
        if !seen.len().is_power_of_two() {
            return Err(Error::invalid(
                "--doorkeeper-slots",
                format!("{} is not a power of two", seen.len()),
            ));
        }
        Ok(Self {
            tries: [
                LpmTrie::try_from(rules_a).map_err(map_err("typing", MAP_RULES))?,
                LpmTrie::try_from(rules_b).map_err(map_err("typing", MAP_RULES_B))?,
            ],
            seen,
            rule_state: Array::try_from(rule_state).map_err(map_err("typing", MAP_RULE_STATE))?,
            global: Array::try_from(global).map_err(map_err("typing", MAP_GLOBAL))?,
            events: PerCpuArray::try_from(events).map_err(map_err("typing", MAP_EVENTS))?,
            wide: HashMap::try_from(wide).map_err(map_err("typing", common::MAP_WIDE))?,
            drops: HashMap::try_from(drops).map_err(map_err("typing", MAP_DROPS))?,
            table: Array::try_from(table).map_err(map_err("typing", MAP_RULE_TABLE))?,
            state: HashMap::try_from(state).map_err(map_err("typing", MAP_STATE))?,
            state_v4: HashMap::try_from(state_v4).map_err(map_err("typing", MAP_STATE_V4))?,
            stats: PerCpuArray::try_from(stats).map_err(map_err("typing", MAP_STATS))?,
            config: Array::try_from(config).map_err(map_err("typing", MAP_CONFIG))?,
            fleet_used: HashMap::try_from(fleet_used)
                .map_err(map_err("typing", common::MAP_FLEET_USED))?,
            groups: Array::try_from(groups).map_err(map_err("typing", common::MAP_GROUPS))?,
            rule_stats: PerCpuArray::try_from(rule_stats)
                .map_err(map_err("typing", common::MAP_RULE_STATS))?,
            known: Array::try_from(known).map_err(map_err("typing", common::MAP_KNOWN))?,
            held: [None, None],
            plan: None,
        })
    }

    /// Pins every map in `dir`, replacing what was pinned there.
    pub fn pin(&self, dir: &Path) -> Result<()> {
        let data: [(&'static str, &MapData); 17] = [
            (MAP_RULES, self.tries[0].map()),
            (MAP_RULES_B, self.tries[1].map()),
            (MAP_RULE_TABLE, self.table.map()),
            (MAP_STATE, self.state.map()),
            (MAP_STATE_V4, self.state_v4.map()),
            (MAP_STATS, self.stats.map()),
            (MAP_CONFIG, self.config.map()),
            (MAP_DROPS, self.drops.map()),
            (common::MAP_WIDE, self.wide.map()),
            (MAP_SEEN, self.seen.map()),
            (MAP_RULE_STATE, self.rule_state.map()),
            (MAP_GLOBAL, self.global.map()),
            (MAP_EVENTS, self.events.map()),
            (common::MAP_FLEET_USED, self.fleet_used.map()),
            (common::MAP_GROUPS, self.groups.map()),
            (common::MAP_RULE_STATS, self.rule_stats.map()),
            (common::MAP_KNOWN, self.known.map()),
        ];
        debug_assert!(data.iter().map(|(n, _)| *n).eq(common::PINNED_MAPS));
        for (name, map) in data {
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
            state_capacity: max(self.state_v4.map()),
            state_capacity_v6: max(self.state.map()),
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

    /// Every entry of `entries` with the table index it points at: the
    /// trie's own entries, and of each group the entries its CIDR owns (not
    /// those inherited from the CIDRs around it).
    fn own_entries<'a>(
        &self,
        entries: impl Iterator<Item = (&'a TrieKey, &'a u32)>,
    ) -> Result<Vec<(Selector, u32)>> {
        let mut out = Vec::new();
        for (&(bits, key), &value) in entries {
            let source = Prefix::from_lpm(bits, key);
            if value & GROUP_BIT == 0 {
                out.push((Selector::from(source), value));
                continue;
            }
            let group = self
                .groups
                .get(&(value & !GROUP_BIT), 0)
                .map_err(map_err("reading", MAP_GROUPS))?;
            let count = (group.count as usize).min(group.entries.len());
            for e in &group.entries[..count] {
                if e.fields & match_fields::OWN != 0 {
                    let matches = Match::from_entry(e);
                    out.push((Selector { source, matches }, e.rule));
                }
            }
        }
        Ok(out)
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
        Ok(own
            .into_iter()
            .filter(|(_, i)| *i != deny_index && *i != allow_index)
            .collect())
    }

    /// The list entries the program reads now: (deny, allow), sorted. A list
    /// entry is a trie entry (or the own entry without a match of a group)
    /// that points at a policy rule.
    pub fn list_entries(&self) -> Result<(Vec<Prefix>, Vec<Prefix>)> {
        let (deny_index, allow_index) = self.policy_indexes();
        let (mut deny, mut allow) = (Vec::new(), Vec::new());
        let entries = self.read_trie(self.active()?)?;
        for (selector, index) in self.own_entries(entries.iter())? {
            if !selector.matches.is_any() {
                continue;
            }
            if index == deny_index {
                deny.push(selector.source);
            } else if index == allow_index {
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
        let n = self.table.len();
        (n - 2, n - 1)
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
                    },
                );
            }
        }
        Ok(set)
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

    /// Writes `set` whole, or nothing: every value is computed and checked, the
    /// rules that change are written to free places of the rule table and the
    /// whole set into the trie the program does not read; one write of the
    /// config then switches the program to it. A failure before that switch
    /// leaves the kernel enforcing exactly what it did. Prefixes that stay keep
    /// their rule id and slot, so their buckets carry over.
    pub fn apply(&mut self, set: &RuleSet) -> Result<()> {
        let old_config = self.config()?;
        let active = (old_config.active_rules & 1) as usize;
        let idle = 1 - active;
        let capacity = self.rules_capacity();
        if set.rules.len() > capacity as usize {
            return Err(Error::Capacity {
                what: "rules".into(),
                wanted: set.rules.len(),
                capacity: capacity as usize,
                option: "--max-rules",
            });
        }
        let old_indexes = self.rule_indexes(active)?;
        let old: BTreeMap<Selector, common::Rule> = old_indexes
            .iter()
            .map(|(p, i)| Ok((*p, self.table_rule(*i)?)))
            .collect::<Result<_>>()?;
        let old_default = self.table_rule(old_config.default_rule)?;
        let mut next_id = old
            .values()
            .map(|r| r.id)
            .chain([old_default.id])
            .max()
            .unwrap_or(0);
        let mut fresh_id = || {
            next_id = next_id
                .checked_add(1)
                .filter(|id| *id <= common::MAX_RULE_ID)
                .ok_or_else(|| {
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
                Some(previous) if carry_over(&previous.in_normal_mode(), &mut rule) => {
                    rule.id = previous.id;
                    rule.slot = previous.slot;
                    taken.insert(rule.slot);
                }
                _ => rule.id = fresh_id()?,
            }
            values.push((*prefix, set.mode.rule(rule)));
        }
        let old_slots: std::collections::BTreeSet<u32> = old.values().map(|r| r.slot).collect();
        let slots = self.rule_state.len();
        // Slots no rule had first, then the removed rules' slots: two disjoint
        // ascending runs, each walked once.
        let mut unused = (1..slots).filter(|i| !taken.contains(i) && !old_slots.contains(i));
        let mut released = (1..slots).filter(|i| !taken.contains(i) && old_slots.contains(i));
        for (prefix, rule) in values.iter_mut() {
            if old.get(prefix).is_some_and(|p| p.id == rule.id) {
                continue;
            }
            let pick = unused
                .next()
                .or_else(|| released.next())
                .ok_or(Error::Capacity {
                    what: "rules".into(),
                    wanted: set.rules.len(),
                    capacity: slots as usize - 1,
                    option: "--max-rules",
                })?;
            rule.slot = pick;
        }
        let mut default = set.default.to_kernel(0, "default")?;
        default.id = if carry_over(&old_default.in_normal_mode(), &mut default) {
            old_default.id
        } else {
            fresh_id()?
        };
        default.slot = 0;
        let default = set.mode.rule(default);
        let mut config = set.kernel_config()?;
        config.new_states = config.new_states.succeeding(&old_config.new_states);
        config.hash_seed = if old_config.hash_seed != 0 {
            old_config.hash_seed
        } else {
            random_seed()
        };
        config.seen_mask = self.seen.len() - 1;
        config.local_ports = local_ports();
        config.active_rules = idle as u32;

        // Copy on write: a rule that changes goes to a table index no rule the
        // program can read uses.
        let in_use: std::collections::BTreeSet<u32> = old_indexes
            .values()
            .copied()
            .chain([old_config.default_rule])
            .collect();
        let (deny_index, allow_index) = self.policy_indexes();
        let mut free = (0..deny_index).filter(|i| !in_use.contains(i));
        let mut place = |rule: &common::Rule, previous: Option<(u32, &common::Rule)>| match previous
        {
            Some((index, p)) if *p == common::Rule { index, ..*rule } => Ok((index, false)),
            _ => free.next().map(|i| (i, true)).ok_or(Error::Capacity {
                what: "rule table entries".into(),
                wanted: set.rules.len() + 1,
                capacity: deny_index as usize / 2,
                option: "--max-rules",
            }),
        };
        let mut writes = Vec::new();
        let mut entries = BTreeMap::new();
        for (selector, rule) in &values {
            let previous = old_indexes
                .get(selector)
                .and_then(|i| old.get(selector).map(|r| (*i, r)));
            let (index, write) = place(rule, previous)?;
            if write {
                writes.push((index, common::Rule { index, ..*rule }));
            }
            entries.insert(*selector, index);
        }
        let (default_index, write) =
            place(&default, Some((old_config.default_rule, &old_default)))?;
        if write {
            writes.push((
                default_index,
                common::Rule {
                    index: default_index,
                    ..default
                },
            ));
        }
        config.default_rule = default_index;
        let plan = self.list_plan(set)?;

        // The rules of the unjudged-frame policies (constant values) and the
        // match groups, in the idle half.
        for (index, action) in [
            (deny_index, Action::Deny { dry_run: false }),
            (allow_index, Action::Allow),
        ] {
            let rule = common::Rule {
                index,
                // Counted by reason only: a list is not a rule with counters.
                slot: common::UNCOUNTED_SLOT,
                ..action.to_kernel(0, "unjudged")?
            };
            if self.table_rule(index)? != rule {
                writes.push((index, rule));
            }
        }
        let policies = matching::Policies {
            unjudged: match (set.unjudged, set.mode) {
                (Unjudged::Drop, _) => deny_index,
                (Unjudged::Pass, Mode::Normal) => allow_index,
                _ => NO_RULE,
            },
            fragments: match set.fragments {
                Fragments::Drop => deny_index,
                Fragments::NextRule => NO_RULE,
            },
        };
        let compiled = matching::compile(
            &entries,
            &*plan,
            default_index,
            policies,
            idle as u32 * GROUPS_CAPACITY,
        )?;
        // Entries of the trie, list entries included (0 lets the program skip
        // the lookup): a rule at a list entry's CIDR takes its place.
        let on_lists = compiled
            .trie
            .iter()
            .filter(|(p, _)| plan.entries.contains_key(&p.lpm()))
            .count();
        let capacity = self.list_capacity();
        if plan.entries.len() - on_lists > capacity {
            return Err(Error::Capacity {
                what: "list entries (all lists together)".into(),
                wanted: plan.entries.len() - on_lists,
                capacity,
                option: "--max-list-entries",
            });
        }
        config.rule_count = (plan.entries.len() + compiled.trie.len() - on_lists) as u32;

        // Fresh shared buckets for new rules (and for levels a rule gains);
        // fresh counters for a rule in a slot it did not have.
        for (prefix, rule) in &values {
            let previous = old.get(prefix).filter(|p| p.id == rule.id);
            self.reset_shared(rule, previous)?;
            if old.get(prefix).is_none_or(|p| p.slot != rule.slot) {
                self.reset_rule_counters(rule.slot)?;
            }
        }
        let previous_default = (old_default.id == default.id).then_some(&old_default);
        self.reset_shared(&default, previous_default)?;

        for (index, rule) in &writes {
            self.table
                .set(*index, rule, 0)
                .map_err(map_err("writing", MAP_RULE_TABLE))?;
        }
        for (i, group) in compiled.groups.iter().enumerate() {
            self.groups
                .set(idle as u32 * GROUPS_CAPACITY + i as u32, group, 0)
                .map_err(map_err("writing", MAP_GROUPS))?;
        }
        self.fill_idle_trie(idle, plan, &compiled.trie)?;
        // The switch: one value, read once per frame.
        self.config
            .set(0, config, 0)
            .map_err(map_err("writing", MAP_CONFIG))?;
        Ok(())
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

    /// The trie entries of `set`'s lists, pointing at the policy rules: the
    /// last ones made if the lists are the same, else made anew.
    /// Precedence: a rule without a match at exactly a list entry's CIDR wins
    /// over it (explicit beats bulk: the entry is *shadowed*: the rule's
    /// entry takes its place in the trie); a deny list entry equal to or
    /// inside an allow list entry is left out (shadowed too: a source the
    /// operator allowed is never dropped by a bulk list). Rules with matches
    /// at a list entry's CIDR are tried first; frames they do not match meet
    /// the list entry. Otherwise the longest prefix wins, as between rules (an
    /// allow list /32 inside a denied /16 passes; a deny list /32 inside an
    /// *allow rule's* /16 is dropped).
    fn list_plan(&mut self, set: &RuleSet) -> Result<Arc<ListPlan>> {
        let from = ListPlan::of(set);
        if let Some(plan) = &self.plan
            && plan.made_of(&from)
        {
            return Ok(plan.clone());
        }
        let (deny_index, allow_index) = self.policy_indexes();
        let allowed = crate::model::lists::Allowed::of(set.lists.values());
        let total: usize = set.lists.values().map(|l| l.entries.len()).sum();
        let mut entries = TrieEntries::with_capacity(total);
        for action in [ListAction::Allow, ListAction::Deny] {
            let index = match action {
                ListAction::Deny => deny_index,
                ListAction::Allow => allow_index,
            };
            for list in set.lists.values().filter(|l| l.action == action) {
                for p in list.entries.iter() {
                    if action == ListAction::Deny && allowed.covers(p) {
                        continue;
                    }
                    entries.entry(p.lpm()).or_insert(index);
                }
            }
        }
        let plan = Arc::new(ListPlan { from, entries });
        self.plan = Some(plan.clone());
        Ok(plan)
    }

    /// Makes trie `which` (the one the program does not read) hold exactly
    /// the entries of `lists` with `rules` on top: when it already holds
    /// these lists, only the keys of the rules it held and of `rules` are
    /// looked at; otherwise what it holds and should not is removed and what
    /// is missing or different is written. What is already there stays.
    fn fill_idle_trie(
        &mut self,
        which: usize,
        lists: Arc<ListPlan>,
        rules: &[(Prefix, u32)],
    ) -> Result<()> {
        let name = if which == 0 { MAP_RULES } else { MAP_RULES_B };
        let wanted_rules: TrieEntries = rules.iter().map(|(p, i)| (p.lpm(), *i)).collect();
        // Until this completes the trie's content is not known (a failure
        // part way leaves it to be read again).
        let held = self.held[which].take();
        // What to write: a value, or `None` to remove the key.
        let mut writes: Vec<(TrieKey, Option<u32>)> = Vec::new();
        match held {
            Some(old) if Arc::ptr_eq(&old.lists, &lists) => {
                let keys: std::collections::HashSet<TrieKey> = old
                    .rules
                    .keys()
                    .chain(wanted_rules.keys())
                    .copied()
                    .collect();
                for key in keys {
                    let now = old.rules.get(&key).or_else(|| lists.entries.get(&key));
                    let want = wanted_rules.get(&key).or_else(|| lists.entries.get(&key));
                    if now != want {
                        writes.push((key, want.copied()));
                    }
                }
            }
            other => {
                let now = match other {
                    Some(old) => old.entries(),
                    None => self.read_trie(which)?,
                };
                let wanted = TrieState {
                    lists: lists.clone(),
                    rules: wanted_rules.clone(),
                }
                .entries();
                writes.extend(
                    now.keys()
                        .filter(|k| !wanted.contains_key(k))
                        .map(|k| (*k, None)),
                );
                writes.extend(
                    wanted
                        .iter()
                        .filter(|(k, v)| now.get(k) != Some(v))
                        .map(|(k, v)| (*k, Some(*v))),
                );
            }
        }
        // Removals first: the trie never holds more than its capacity.
        writes.sort_by_key(|(_, v)| v.is_some());
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
            rules: wanted_rules,
        });
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

    /// The counters of the rule in `slot`, summed over CPUs, by
    /// [`common::RuleCounter`].
    pub fn rule_counters(&self, slot: u32) -> Result<[Counter; common::RuleCounter::ALL.len()]> {
        let mut out = [Counter::default(); common::RuleCounter::ALL.len()];
        for (i, c) in common::RuleCounter::ALL.iter().enumerate() {
            let per_cpu = self
                .rule_stats
                .get(&(slot * common::RULE_COUNTERS + *c as u32), 0)
                .map_err(map_err("reading", common::MAP_RULE_STATS))?;
            for v in per_cpu.iter() {
                out[i].packets += v.packets;
                out[i].bytes += v.bytes;
            }
        }
        Ok(out)
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
                e.map(|(k, v)| (k.widen(), v.gcra))
                    .map_err(map_err("reading", MAP_STATE_V4))
            })
            .chain(self.state.iter().map(|e| {
                e.map(|(k, v)| (k, v.gcra))
                    .map_err(map_err("reading", MAP_STATE))
            }))
    }

    /// Drop counts by source address, or by key of a rule's key level.
    pub fn drops(&self) -> impl Iterator<Item = Result<(common::DropKey, u64)>> + '_ {
        self.drops
            .iter()
            .map(|e| e.map_err(map_err("reading", MAP_DROPS)))
    }

    /// The state of one gcra key, if tracked.
    pub fn state(&self, key: &FlowKey) -> Option<gcra::State> {
        self.source_state(key).map(|s| s.gcra)
    }

    /// The state of one gcra key with when it was created, if tracked.
    pub fn source_state(&self, key: &FlowKey) -> Option<common::SourceState> {
        if common::is_v4_mapped(&key.addr) {
            self.state_v4.get(&key.v4(), 0).ok()
        } else {
            self.state.get(key, 0).ok()
        }
    }

    /// Every key of a fleet-wide rule with what it was admitted.
    pub fn fleet_used(&self) -> Vec<(FlowKey, Counter)> {
        self.fleet_used.iter().filter_map(|e| e.ok()).collect()
    }

    /// Raises the gcra state of `key` (a key of a fleet-wide rule) to a debt
    /// of `debt_ns` now, or by `debt_ns` (`add`); never lowers it. A key
    /// without a state gets one. Not atomic with the program's
    /// compare-and-swap: a frame admitted between the read and the write is
    /// not in the written state (it is counted, and in the fleet's debt at the
    /// next sync).
    pub fn raise(&mut self, key: &FlowKey, params: &gcra::Params, debt_ns: u64, add: bool) {
        let now = super::monotonic_ns();
        let found = self.source_state(key);
        let current = found.map_or(0, |s| gcra::debt_ns(s.gcra.tat, params, now));
        let target = if add {
            current.saturating_add(debt_ns)
        } else {
            debt_ns
        };
        if target <= current {
            return;
        }
        let state = common::SourceState {
            gcra: gcra::State {
                tat: gcra::with_debt(params, now, target),
            },
            // A key the fleet made known here is as old as it is here.
            born: found.map_or(now, |s| s.born),
        };
        let _ = if common::is_v4_mapped(&key.addr) {
            self.state_v4.insert(key.v4(), state, 0)
        } else {
            self.state.insert(key, state, 0)
        };
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
        super::monotonic_ns() | 1
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
/// The ephemeral port range of this network namespace
/// (`net.ipv4.ip_local_port_range`, which IPv6 shares) as
/// [`common::Config::local_ports`]; 0 when it cannot be read.
pub fn local_ports() -> u32 {
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

fn carry_over(previous: &common::Rule, rule: &mut common::Rule) -> bool {
    use common::action::LIMIT;
    if rule.action != LIMIT {
        // Allow and deny keep no state: the id may stay.
        return true;
    }
    if previous.action != LIMIT || previous.algorithm != rule.algorithm {
        return false;
    }
    // A level added, removed or keyed anew gets a new id: its keys might
    // otherwise meet states an earlier level of the same number left.
    let layout = |r: &common::Rule| {
        r.levels
            .map(|l| (l.is_on(), l.key_prefix_v4, l.key_prefix_v6))
    };
    if layout(previous) != layout(rule) {
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
    for (level, was) in rule.levels.iter_mut().zip(&previous.levels) {
        if level.is_on() {
            level.params = level.params.succeeding(&was.params);
        }
    }
    true
}
