//! Decide, then do: from a rule set and what the kernel holds now
//! ([`Current`]), everything a change writes ([`Plan`]): the rules' ids and
//! slots, the rule-table writes (copy on write), the match groups, the trie
//! entries, the shared buckets and counters that start afresh, and the new
//! config whose one write switches the program to the change.
//!
//! Pure: nothing here touches a map. [`super::Maps::apply`] reads a
//! [`Current`], calls [`plan`] and executes the [`Plan`] in its order; the
//! unit tests below run the planner against an in-memory kernel, without
//! root.

use std::{
    collections::{BTreeMap, BTreeSet, HashMap, HashSet},
    sync::Arc,
};

use ratelimit_common::{
    self as common, GROUP_BIT, GROUPS_CAPACITY, NO_RULE, RuleAddr, match_fields,
};

use crate::{
    error::{Error, Result},
    model::lists::{Allowed, ListAction},
    model::matching::{self, Match, Selector},
    model::rules::{Action, Fragments, Mode, Prefix, RuleSet, Unjudged},
};

/// A trie entry's key: (prefix length, family and address).
pub type TrieKey = (u32, RuleAddr);
/// A trie's entries: key → value (a table index, or [`GROUP_BIT`] and a
/// group index).
pub type TrieEntries = HashMap<TrieKey, u32>;

/// The trie entries of a set's lists (each pointing at its list's policy
/// rule), once the allow lists took what they cover from the deny lists and
/// each CIDR is counted once; computed when the lists change, not when a
/// rule does, and, when only deny lists' entries changed, from the last
/// plan at the cost of what changed ([`ListPlan::update`]).
#[derive(Debug)]
pub struct ListPlan {
    /// The lists it was made of: name, action, entries (the same `Arc` while
    /// a list is unchanged), the policy rule its entries point at.
    from: Vec<(String, ListAction, Arc<[Prefix]>, u32)>,
    /// What the allow lists cover.
    allowed: Arc<Allowed>,
    /// Key → policy rule index. Persistent: a plan made from the last one
    /// shares all it did not change, and two plans are compared at the cost
    /// of what differs ([`trie_writes`]).
    pub entries: ListEntryMap,
}

/// A plan's list entries: key → policy rule index.
pub type ListEntryMap = imbl::OrdMap<TrieKey, u32>;

/// The table index of each counted list's own policy rule, by list name.
pub type CountedIndexes = BTreeMap<String, u32>;

impl ListPlan {
    fn of(
        set: &RuleSet,
        policies: (u32, u32),
        counted: &CountedIndexes,
    ) -> Vec<(String, ListAction, Arc<[Prefix]>, u32)> {
        set.lists
            .iter()
            .map(|(n, l)| {
                let index = counted.get(n).copied().unwrap_or(match l.action {
                    ListAction::Deny => policies.0,
                    ListAction::Allow => policies.1,
                });
                (n.clone(), l.action, l.entries.clone(), index)
            })
            .collect()
    }

    /// Whether this plan was made of `set`'s lists as they are (the same
    /// entries, not equal ones: comparing a million entries would cost what
    /// the plan saves), pointing at the same policy rules.
    pub fn made_of(&self, set: &RuleSet, policies: (u32, u32), counted: &CountedIndexes) -> bool {
        let from = Self::of(set, policies, counted);
        self.from.len() == from.len()
            && self
                .from
                .iter()
                .zip(&from)
                .all(|(a, b)| a.0 == b.0 && a.1 == b.1 && Arc::ptr_eq(&a.2, &b.2) && a.3 == b.3)
    }

    /// The trie entries of `set`'s lists, pointing at the policy rules
    /// `policies` (deny, allow), or, for a counted list, at its own
    /// (`counted`).
    ///
    /// A prefix in two lists of one action is entered once, for the first
    /// list in name order (its frames are counted there).
    ///
    /// Precedence: a rule without a match at exactly a list entry's CIDR wins
    /// over it (explicit beats bulk: the entry is *shadowed*: the rule's
    /// entry takes its place in the trie); a deny list entry equal to or
    /// inside an allow list entry is left out (shadowed too: a source the
    /// operator allowed is never dropped by a bulk list). Rules with matches
    /// at a list entry's CIDR are tried first; frames they do not match meet
    /// the list entry. Otherwise the longest prefix wins, as between rules (an
    /// allow list /32 inside a denied /16 passes; a deny list /32 inside an
    /// *allow rule's* /16 is dropped).
    pub fn build(set: &RuleSet, policies: (u32, u32), counted: &CountedIndexes) -> Self {
        let allowed = Allowed::of(set.lists.values());
        let mut entries = ListEntryMap::new();
        let from = Self::of(set, policies, counted);
        for action in [ListAction::Allow, ListAction::Deny] {
            for (name, _, _, index) in from.iter().filter(|l| l.1 == action) {
                for p in set.lists[name].entries.iter() {
                    if action == ListAction::Deny && allowed.covers(p) {
                        continue;
                    }
                    entries.entry(p.lpm()).or_insert(*index);
                }
            }
        }
        Self {
            from,
            allowed: Arc::new(allowed),
            entries,
        }
    }

    /// [`ListPlan::build`] from this plan, at the cost of what changed, when
    /// only deny lists' entries did (the same lists, actions and policy
    /// rules, the allow lists as they were); `None` otherwise.
    pub fn update(
        &self,
        set: &RuleSet,
        policies: (u32, u32),
        counted: &CountedIndexes,
    ) -> Option<Self> {
        let from = Self::of(set, policies, counted);
        let alike = self.from.len() == from.len()
            && self.from.iter().zip(&from).all(|(a, b)| {
                a.0 == b.0
                    && a.1 == b.1
                    && a.3 == b.3
                    && (a.1 == ListAction::Deny || Arc::ptr_eq(&a.2, &b.2))
            });
        if !alike {
            return None;
        }
        // Prefixes a deny list gained or lost.
        let mut touched = std::collections::BTreeSet::new();
        for (old, new) in self.from.iter().zip(&from) {
            if !Arc::ptr_eq(&old.2, &new.2) {
                sorted_difference(&old.2, &new.2, |p| {
                    touched.insert(*p);
                });
            }
        }
        let mut entries = self.entries.clone();
        let allow_owner = |p: &Prefix| {
            from.iter()
                .filter(|l| l.1 == ListAction::Allow)
                .find(|l| l.2.binary_search(p).is_ok())
                .map(|l| l.3)
        };
        for p in touched {
            // Who holds `p` now: the first allow list, else (unless allowed)
            // the first deny list, in name order.
            let owner = allow_owner(&p).or_else(|| {
                if self.allowed.covers(&p) {
                    return None;
                }
                from.iter()
                    .filter(|l| l.1 == ListAction::Deny)
                    .find(|l| l.2.binary_search(&p).is_ok())
                    .map(|l| l.3)
            });
            match owner {
                Some(index) => {
                    entries.insert(p.lpm(), index);
                }
                None => {
                    entries.remove(&p.lpm());
                }
            }
        }
        Some(Self {
            from,
            allowed: self.allowed.clone(),
            entries,
        })
    }
}

/// Calls `each` with every prefix in one of the sorted `a` and `b` and not
/// in the other.
fn sorted_difference(a: &[Prefix], b: &[Prefix], mut each: impl FnMut(&Prefix)) {
    let (mut i, mut j) = (0, 0);
    while i < a.len() && j < b.len() {
        match a[i].cmp(&b[j]) {
            std::cmp::Ordering::Less => {
                each(&a[i]);
                i += 1;
            }
            std::cmp::Ordering::Greater => {
                each(&b[j]);
                j += 1;
            }
            std::cmp::Ordering::Equal => {
                i += 1;
                j += 1;
            }
        }
    }
    a[i..].iter().chain(&b[j..]).for_each(each);
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

/// What a trie holds: its lists' entries, with the rules' entries on top (a
/// rule at a list entry's CIDR takes its place).
pub struct TrieState {
    /// The lists' entries.
    pub lists: Arc<ListPlan>,
    /// The rules' entries.
    pub rules: TrieEntries,
}

impl TrieState {
    /// Every entry.
    pub fn entries(&self) -> TrieEntries {
        let mut all: TrieEntries = self.lists.entries.iter().map(|(k, v)| (*k, *v)).collect();
        all.extend(self.rules.iter().map(|(k, v)| (*k, *v)));
        all
    }
}

/// What the kernel holds now, as far as a change depends on it.
#[derive(Clone, Debug)]
pub struct Current {
    /// The config the program reads.
    pub config: common::Config,
    /// The default rule, at `config.default_rule` in the table.
    pub default: common::Rule,
    /// The rules the program reads: selector → (table index, rule). List
    /// entries are not rules.
    pub rules: BTreeMap<Selector, (u32, common::Rule)>,
    /// The unjudged-frame policies' table entries as they are: (deny, allow).
    pub policies: (common::Rule, common::Rule),
    /// The counted lists' own policy rules the program reads, by list name:
    /// (table index, rule). One read back from the kernel has no name: it
    /// is keyed `#INDEX`, which no list is named.
    pub counted: BTreeMap<String, (u32, common::Rule)>,
    /// Rule-table entries in all; the last two are the policies'.
    pub table_len: u32,
    /// Rule-state slots, the default rule's (0) included.
    pub slots: u32,
    /// Doorkeeper slots (a power of two).
    pub seen_slots: u32,
    /// Lines of the state table for (IPv4, IPv6) keys (powers of two).
    pub state_lines: (u32, u32),
    /// List entries at most (all lists together).
    pub list_capacity: usize,
}

impl Current {
    /// The table indexes of the unjudged-frame policies' rules: (deny, allow).
    pub fn policy_indexes(&self) -> (u32, u32) {
        policy_indexes(self.table_len)
    }

    /// Rules at most: a rule-state slot each, beside the default rule's.
    pub fn rules_capacity(&self) -> u32 {
        self.slots.saturating_sub(1)
    }
}

/// The table indexes of the unjudged-frame policies' rules in a table of
/// `table_len` entries: its last two (no rule of a set is put there).
pub fn policy_indexes(table_len: u32) -> (u32, u32) {
    (table_len - 2, table_len - 1)
}

/// What a plan takes from the host rather than from the kernel.
#[derive(Clone, Copy, Debug)]
pub struct Host {
    /// A random seed, used when the kernel has none yet (a fresh load).
    pub fresh_seed: u64,
    /// The namespace's ephemeral port range ([`common::Config::local_ports`]).
    pub local_ports: u32,
}

/// Shared buckets of a rule that start afresh (full) rather than carry over.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FreshShared {
    /// The rule's slot.
    pub slot: u32,
    /// Its new-source budget.
    pub new_sources: bool,
    /// Its aggregate.
    pub aggregate: bool,
}

/// A change, decided. [`super::Maps::apply`] writes it in the order of its
/// fields; only the last write, `config`, changes what the program does.
#[derive(Debug)]
pub struct Plan {
    /// Shared buckets to fill anew: of new rules, and levels a rule gains.
    pub fresh_shared: Vec<FreshShared>,
    /// Rule slots whose counters start at zero (a rule in a slot it did not
    /// have).
    pub fresh_counters: Vec<u32>,
    /// Rule-table writes (index, value): a rule that changes goes to an
    /// index no rule the program reads uses (copy on write).
    pub table: Vec<(u32, common::Rule)>,
    /// Match groups at their index in the groups map (the idle half).
    pub groups: Vec<(u32, common::MatchGroup)>,
    /// The trie the program does not read, which the change fills (0 or 1).
    pub idle: usize,
    /// That trie's rule entries, on top of `lists`' entries.
    pub trie: Vec<(Prefix, u32)>,
    /// That trie's list entries.
    pub lists: Arc<ListPlan>,
    /// The counted lists' own policy rules, by list name: (table index,
    /// rule).
    pub counted: BTreeMap<String, (u32, common::Rule)>,
    /// The config that switches the program to the idle trie.
    pub config: common::Config,
}

/// Plans writing `set` whole over what the kernel holds (`now`); the list
/// entries are `lists` when they were made for `set`'s lists as they are
/// (the last plan's, reused), else made anew.
///
/// Prefixes that stay keep their rule id and slot, so their buckets carry
/// over; a rule that changes is written to a free place of the rule table
/// and the whole set into the trie the program does not read, so a failure
/// before the config's write leaves the kernel enforcing exactly what it
/// did. Every value is computed and checked here: what does not fit is an
/// error before anything is written.
pub fn plan(
    set: &RuleSet,
    now: &Current,
    lists: Option<Arc<ListPlan>>,
    host: Host,
) -> Result<Plan> {
    let idle = 1 - (now.config.active_rules & 1) as usize;
    let capacity = now.rules_capacity();
    let counted_lists = set.lists.values().filter(|l| l.counted).count();
    if set.rules.len() + counted_lists > capacity as usize {
        return Err(Error::Capacity {
            what: if counted_lists == 0 {
                "rules".into()
            } else {
                "rules and lists (a list takes a rule for its counters)".into()
            },
            wanted: set.rules.len() + counted_lists,
            capacity: capacity as usize,
            option: "--max-rules",
        });
    }
    let (rules, default, counted) = identities(set, now)?;
    let mut config = set.kernel_config()?;
    config.new_states = config.new_states.succeeding(&now.config.new_states);
    config.hash_seed = if now.config.hash_seed != 0 {
        now.config.hash_seed
    } else {
        host.fresh_seed
    };
    config.seen_mask = now.seen_slots - 1;
    config.state_mask = now.state_lines.0 - 1;
    config.state6_mask = now.state_lines.1 - 1;
    config.local_ports = host.local_ports;
    config.active_rules = idle as u32;
    let placed = place(set, now, &rules, &default, &counted)?;
    config.default_rule = placed.default_index;
    let indexes: CountedIndexes = placed
        .counted
        .iter()
        .map(|(n, (i, _))| (n.clone(), *i))
        .collect();
    let policy_indexes = now.policy_indexes();
    let lists = match lists {
        Some(l) if l.made_of(set, policy_indexes, &indexes) => l,
        Some(l) => Arc::new(
            l.update(set, policy_indexes, &indexes)
                .unwrap_or_else(|| ListPlan::build(set, policy_indexes, &indexes)),
        ),
        None => Arc::new(ListPlan::build(set, policy_indexes, &indexes)),
    };
    let group_base = idle as u32 * GROUPS_CAPACITY;
    let compiled = matching::compile(
        &placed.entries,
        &*lists,
        placed.default_index,
        policies(set, now),
        group_base,
    )?;
    // Entries of the trie, list entries included (0 lets the program skip
    // the lookup): a rule at a list entry's CIDR takes its place.
    let on_lists = compiled
        .trie
        .iter()
        .filter(|(p, _)| lists.entries.contains_key(&p.lpm()))
        .count();
    let list_entries = lists.entries.len() - on_lists;
    if list_entries > now.list_capacity {
        return Err(Error::Capacity {
            what: "list entries (all lists together)".into(),
            wanted: list_entries,
            capacity: now.list_capacity,
            option: "--max-list-entries",
        });
    }
    config.rule_count = (list_entries + compiled.trie.len()) as u32;

    // Fresh shared buckets for new rules (and for levels a rule gains);
    // fresh counters for a rule in a slot it did not have.
    let mut fresh_shared = Vec::new();
    let mut fresh_counters = Vec::new();
    for (selector, rule) in &rules {
        let was = now.rules.get(selector).map(|(_, r)| r);
        fresh_shared.extend(fresh(rule, was.filter(|p| p.id == rule.id)));
        if was.is_none_or(|p| p.slot != rule.slot) {
            fresh_counters.push(rule.slot);
        }
    }
    fresh_shared.extend(fresh(
        &default,
        (now.default.id == default.id).then_some(&now.default),
    ));
    for (name, (_, rule)) in &placed.counted {
        if now
            .counted
            .get(name)
            .is_none_or(|(_, r)| r.slot != rule.slot)
        {
            fresh_counters.push(rule.slot);
        }
    }
    let groups = compiled
        .groups
        .into_iter()
        .enumerate()
        .map(|(i, g)| (group_base + i as u32, g))
        .collect();
    Ok(Plan {
        fresh_shared,
        fresh_counters,
        table: placed.table,
        groups,
        idle,
        trie: compiled.trie,
        lists,
        counted: placed.counted,
        config,
    })
}

/// What [`identities`] gives: each rule with its selector, the default
/// rule, each counted list's policy rule with its list's name.
type Identified = (
    Vec<(Selector, common::Rule)>,
    common::Rule,
    Vec<(String, common::Rule)>,
);

/// Each rule of `set` in the kernel's form with its id and slot, and the
/// default rule's: a rule that carries over keeps both; a new one gets a
/// fresh id and a slot no old rule had if there is one (a removed rule's
/// frames may still meet its slot while the change is written), else a
/// released one. Slot 0 is the default rule's.
///
/// A counted list keeps its policy rule (id, slot and table entry: a
/// constant) while it keeps its name and action; a new one gets a fresh id
/// and a slot as a new rule does.
fn identities(set: &RuleSet, now: &Current) -> Result<Identified> {
    let old = &now.rules;
    let mut ids = Ids::after(
        old.values()
            .chain(now.counted.values())
            .map(|(_, r)| r.id)
            .chain([now.default.id]),
    );
    let mut rules = Vec::with_capacity(set.rules.len());
    let mut taken = BTreeSet::from([0u32]);
    for (selector, action) in &set.rules {
        let mut rule = action.to_kernel(0, &selector.to_string())?;
        match old.get(selector) {
            Some((_, previous)) if carry_over(&previous.in_normal_mode(), &mut rule) => {
                rule.id = previous.id;
                rule.slot = previous.slot;
                taken.insert(rule.slot);
            }
            _ => rule.id = ids.fresh()?,
        }
        rules.push((*selector, set.mode.rule(rule)));
    }
    let mut counted = Vec::new();
    for (name, list) in set.lists.iter().filter(|(_, l)| l.counted) {
        let mut rule = counted_list_rule(list.action)?;
        match now.counted.get(name) {
            Some((_, previous)) if previous.action == rule.action => {
                rule.id = previous.id;
                rule.slot = previous.slot;
                taken.insert(rule.slot);
            }
            _ => rule.id = ids.fresh()?,
        }
        counted.push((name.clone(), rule));
    }
    let old_slots: BTreeSet<u32> = old
        .values()
        .chain(now.counted.values())
        .map(|(_, r)| r.slot)
        .collect();
    // Slots no rule had first, then the removed rules' slots: two disjoint
    // ascending runs, each walked once.
    let mut unused = (1..now.slots).filter(|i| !taken.contains(i) && !old_slots.contains(i));
    let mut released = (1..now.slots).filter(|i| !taken.contains(i) && old_slots.contains(i));
    let wanted = set.rules.len() + counted.len();
    let mut next_slot = || {
        unused
            .next()
            .or_else(|| released.next())
            .ok_or(Error::Capacity {
                what: "rules".into(),
                wanted,
                capacity: now.slots as usize - 1,
                option: "--max-rules",
            })
    };
    for (selector, rule) in rules.iter_mut() {
        if old.get(selector).is_some_and(|(_, p)| p.id == rule.id) {
            continue;
        }
        rule.slot = next_slot()?;
    }
    for (name, rule) in counted.iter_mut() {
        if now.counted.get(name).is_some_and(|(_, p)| p.id == rule.id) {
            continue;
        }
        rule.slot = next_slot()?;
    }
    let mut default = set.default.to_kernel(0, "default")?;
    default.id = if carry_over(&now.default.in_normal_mode(), &mut default) {
        now.default.id
    } else {
        ids.fresh()?
    };
    default.slot = 0;
    Ok((rules, set.mode.rule(default), counted))
}

/// The policy rule of a counted list of `action` (its id and slot to be
/// given): a constant deny or allow, marked as a list's.
fn counted_list_rule(action: ListAction) -> Result<common::Rule> {
    let action = match action {
        ListAction::Deny => Action::Deny { dry_run: false },
        ListAction::Allow => Action::Allow,
    };
    Ok(common::Rule {
        counted_list: 1,
        ..action.to_kernel(0, "counted list")?
    })
}

/// Where a plan puts its rules in the rule table.
struct Placed {
    /// Writes (index, value).
    table: Vec<(u32, common::Rule)>,
    /// Each selector's table index.
    entries: BTreeMap<Selector, u32>,
    /// The default rule's.
    default_index: u32,
    /// The counted lists' policy rules: (table index, rule), by list name.
    counted: BTreeMap<String, (u32, common::Rule)>,
}

/// Copy on write: a rule that changes goes to a table index no rule the
/// program can read uses; one that stays the same stays where it is. The
/// unjudged-frame policies' rules (constant values) are written where they
/// differ.
fn place(
    set: &RuleSet,
    now: &Current,
    rules: &[(Selector, common::Rule)],
    default: &common::Rule,
    counted: &[(String, common::Rule)],
) -> Result<Placed> {
    let in_use: BTreeSet<u32> = now
        .rules
        .values()
        .chain(now.counted.values())
        .map(|(i, _)| *i)
        .chain([now.config.default_rule])
        .collect();
    let (deny_index, allow_index) = now.policy_indexes();
    let mut free = (0..deny_index).filter(|i| !in_use.contains(i));
    let mut at = |rule: &common::Rule, previous: Option<(u32, &common::Rule)>| match previous {
        Some((index, p)) if *p == common::Rule { index, ..*rule } => Ok((index, false)),
        _ => free.next().map(|i| (i, true)).ok_or(Error::Capacity {
            what: "rule table entries".into(),
            wanted: set.rules.len() + 1,
            capacity: deny_index as usize / 2,
            option: "--max-rules",
        }),
    };
    let mut table = Vec::new();
    let mut entries = BTreeMap::new();
    for (selector, rule) in rules {
        let previous = now.rules.get(selector).map(|(i, r)| (*i, r));
        let (index, write) = at(rule, previous)?;
        if write {
            table.push((index, common::Rule { index, ..*rule }));
        }
        entries.insert(*selector, index);
    }
    let (default_index, write) = at(default, Some((now.config.default_rule, &now.default)))?;
    if write {
        table.push((
            default_index,
            common::Rule {
                index: default_index,
                ..*default
            },
        ));
    }
    let mut placed_counted = BTreeMap::new();
    for (name, rule) in counted {
        let previous = now.counted.get(name).map(|(i, r)| (*i, r));
        let (index, write) = at(rule, previous)?;
        let rule = common::Rule { index, ..*rule };
        if write {
            table.push((index, rule));
        }
        placed_counted.insert(name.clone(), (index, rule));
    }
    for (index, action, current) in [
        (deny_index, Action::Deny { dry_run: false }, &now.policies.0),
        (allow_index, Action::Allow, &now.policies.1),
    ] {
        let rule = common::Rule {
            index,
            // Counted by reason only: a list is not a rule with counters.
            slot: common::UNCOUNTED_SLOT,
            ..action.to_kernel(0, "unjudged")?
        };
        if *current != rule {
            table.push((index, rule));
        }
    }
    Ok(Placed {
        table,
        entries,
        default_index,
        counted: placed_counted,
    })
}

/// What judges a frame a match cannot judge, as `set` says.
fn policies(set: &RuleSet, now: &Current) -> matching::Policies {
    let (deny_index, allow_index) = now.policy_indexes();
    matching::Policies {
        unjudged: match (set.unjudged, set.mode) {
            (Unjudged::Drop, _) => deny_index,
            (Unjudged::Pass, Mode::Normal) => allow_index,
            _ => NO_RULE,
        },
        fragments: match set.fragments {
            Fragments::Drop => deny_index,
            Fragments::NextRule => NO_RULE,
        },
    }
}

/// Rule ids handed out by a plan: each above every id in use, up to
/// [`common::MAX_RULE_ID`].
struct Ids(u32);

impl Ids {
    fn after(in_use: impl Iterator<Item = u32>) -> Self {
        Self(in_use.max().unwrap_or(0))
    }

    fn fresh(&mut self) -> Result<u32> {
        self.0 = self
            .0
            .checked_add(1)
            .filter(|id| *id <= common::MAX_RULE_ID)
            .ok_or_else(|| Error::invalid("rules", "rule ids exhausted; restart with --reset"))?;
        Ok(self.0)
    }
}

/// The shared buckets of `rule` that do not carry over from `previous` (the
/// same rule's previous generation, or `None` for a new rule): all of them
/// for a new rule, a level the rule gains.
fn fresh(rule: &common::Rule, previous: Option<&common::Rule>) -> Option<FreshShared> {
    use common::rule_flags::{AGGREGATE, NEW_SOURCES_UNLIMITED};
    let had = |flag: u8, on: bool| previous.is_some_and(|p| (p.flags & flag != 0) == on);
    let keep_new = had(NEW_SOURCES_UNLIMITED, false) && rule.flags & NEW_SOURCES_UNLIMITED == 0;
    let keep_agg = had(AGGREGATE, true) && rule.flags & AGGREGATE != 0;
    (!(keep_new && keep_agg)).then_some(FreshShared {
        slot: rule.slot,
        new_sources: !keep_new,
        aggregate: !keep_agg,
    })
}

/// Makes `rule` the next generation of `previous` (same selector) and
/// returns true, when the keys' states can carry over: both are limits with
/// the same algorithm and the same key levels. Otherwise returns false and
/// the caller gives the rule a new id, so its keys start fresh (another
/// algorithm keeps its state in another form).
pub fn carry_over(previous: &common::Rule, rule: &mut common::Rule) -> bool {
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
    // (see `fresh` for a level a rule gains).
    rule.new_sources = rule.new_sources.succeeding(&previous.new_sources);
    rule.aggregate = rule.aggregate.succeeding(&previous.aggregate);
    for (level, was) in rule.levels.iter_mut().zip(&previous.levels) {
        if level.is_on() {
            level.params = level.params.succeeding(&was.params);
        }
    }
    true
}

/// Every entry of `entries` with the table index it points at: the trie's
/// own entries, and of each group (read with `group`) the entries its CIDR
/// owns (not those inherited from the CIDRs around it).
pub fn own_entries<'a>(
    entries: impl Iterator<Item = (&'a TrieKey, &'a u32)>,
    mut group: impl FnMut(u32) -> Result<common::MatchGroup>,
) -> Result<Vec<(Selector, u32)>> {
    let mut out = Vec::new();
    for (&(bits, key), &value) in entries {
        let source = Prefix::from_lpm(bits, key);
        if value & GROUP_BIT == 0 {
            out.push((Selector::from(source), value));
            continue;
        }
        let group = group(value & !GROUP_BIT)?;
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

/// What a trie holds before it is filled, as far as the filler knows it.
pub enum Before<'a> {
    /// What this daemon last wrote there.
    Written(&'a TrieState),
    /// Read back from the kernel.
    Read(TrieEntries),
}

/// The writes that make a trie hold exactly the entries of `lists` with
/// `rules` on top: a value, or `None` to remove the key; removals first, so
/// the trie never holds more than its capacity. When it already holds these
/// lists, only the keys of the rules it held and of `rules` are looked at
/// (a rule change under a million list entries writes a few keys);
/// otherwise what it holds and should not is removed and what is missing or
/// different is written. What is already there stays.
pub fn trie_writes(
    before: Before<'_>,
    lists: &Arc<ListPlan>,
    rules: &TrieEntries,
) -> Vec<(TrieKey, Option<u32>)> {
    let mut writes: Vec<(TrieKey, Option<u32>)> = Vec::new();
    match before {
        // The same lists, or lists made from the ones written: only the keys
        // of the rules and of the list entries that differ are looked at.
        Before::Written(old) => {
            let lists_differ: Vec<TrieKey> = if Arc::ptr_eq(&old.lists, lists) {
                Vec::new()
            } else {
                old.lists
                    .entries
                    .diff(&lists.entries)
                    .map(|item| match item {
                        imbl::ordmap::DiffItem::Add(k, _)
                        | imbl::ordmap::DiffItem::Remove(k, _)
                        | imbl::ordmap::DiffItem::Update { new: (k, _), .. } => *k,
                    })
                    .collect()
            };
            let keys: HashSet<TrieKey> = old
                .rules
                .keys()
                .chain(rules.keys())
                .chain(&lists_differ)
                .copied()
                .collect();
            for key in keys {
                let now = old.rules.get(&key).or_else(|| old.lists.entries.get(&key));
                let want = rules.get(&key).or_else(|| lists.entries.get(&key));
                if now != want {
                    writes.push((key, want.copied()));
                }
            }
        }
        Before::Read(now) => {
            let wanted = TrieState {
                lists: lists.clone(),
                rules: rules.clone(),
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
    writes.sort_by_key(|(_, v)| v.is_some());
    writes
}

#[cfg(test)]
mod tests;
