//! Bans kept by CrowdSec rather than by the operator: the decisions of a
//! CrowdSec Local API that the daemon follows (`run --crowdsec URL`), each
//! with its id, the prefix it bans, its origin and its end.
//!
//! What enters: decisions already parsed and filtered by `crowdsec` (the new
//! ones of the stream, the ids it deleted, or the whole set on a resync), and
//! the time as an argument (Unix ms). What leaves: one **deny list per
//! origin**, named `crowdsec:ORIGIN` (a name no operator's list can have),
//! counted per list in the kernel, which `overlay::Layers::effective` lays
//! into the rule set beside the operator's lists. Pure.
//!
//! Why lists and not rules: CrowdSec's community blocklist alone is 10 to
//! 50 thousand addresses. Rules are capped (`--max-rules`, 16 384 by
//! default), each takes counters on every CPU and a place in the rule table;
//! list entries take one trie entry each (a million by default) and leave
//! the per-frame work at one trie lookup. A list per origin keeps what the
//! operator wants to see apart (the community's bans, their own scenarios',
//! `cscli`'s) and gives each its drop counter.

use std::{
    collections::{BTreeMap, BTreeSet},
    sync::Arc,
};

use imbl::{OrdMap, OrdSet, ordmap::DiffItem};

use crate::model::{
    lists::{List, ListAction},
    prefix::Prefix,
};

/// What every list of decisions is named with, before its origin. `:` is
/// not allowed in the operator's list names, so none can collide.
pub const LIST_PREFIX: &str = "crowdsec:";

/// Origins with a deny list of their own, at most: each list takes a rule,
/// and the origins are free text from the Local API. The decisions of every
/// origin past these share one list, [`OTHER_LIST`].
pub const MAX_ORIGINS: usize = 64;

/// The list of the origins past [`MAX_ORIGINS`].
pub const OTHER_LIST: &str = "crowdsec:other";

/// Ends are kept in whole seconds (rounded up): decisions that end within
/// the same second end together, with one change of the rules.
const END_GRANULE_MS: u64 = 1000;

/// One ban decision.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Decision {
    /// The Local API's id of the decision.
    pub id: u64,
    /// What it bans: an address (a /32 or /128) or a range.
    pub prefix: Prefix,
    /// Where it comes from (`crowdsec`, `cscli`, `CAPI`, `lists`, …).
    pub origin: Arc<str>,
    /// When it ends, Unix ms (rounded up to a whole second).
    pub until_ms: u64,
}

impl Decision {
    /// A decision ending `remaining_ms` after `now_ms`.
    pub fn new(id: u64, prefix: Prefix, origin: &str, now_ms: u64, remaining_ms: u64) -> Self {
        Self {
            id,
            prefix,
            origin: Arc::from(origin),
            until_ms: now_ms
                .saturating_add(remaining_ms)
                .div_ceil(END_GRANULE_MS)
                .saturating_mul(END_GRANULE_MS),
        }
    }
}

/// The decisions the daemon enforces, and their lists.
///
/// Every change costs what it changes, not what is held: the maps are
/// persistent (a copy shares everything with its original until one of
/// them changes, and a change copies only the path to what it changes), each
/// list keeps how many decisions ban each of its entries, and the next end
/// is found in an index of ends. A list is made anew (its entries copied
/// once) only when an entry comes or goes.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Decisions {
    /// By id.
    by_id: OrdMap<u64, Decision>,
    /// `(end, id)` of each decision.
    ends: OrdSet<(u64, u64)>,
    /// Each list's entries, with how many decisions ban each.
    held: BTreeMap<String, OrdMap<Prefix, u32>>,
    /// One deny list per origin seen, by list name (an origin whose last
    /// decision ended keeps its empty list, and its counter, while the
    /// daemon runs).
    lists: BTreeMap<String, List>,
    /// Each origin's list name: [`list_name`], with `-2`, `-3`, … after it
    /// when another origin has that name already (`a b` and `a_b`, or two
    /// origins alike in their first 48 characters), so that one origin's
    /// list never overwrites another's; [`OTHER_LIST`] for the origins past
    /// [`MAX_ORIGINS`].
    names: OrdMap<Arc<str>, String>,
    /// The origin of each list of its own, by list name.
    origins: BTreeMap<String, Arc<str>>,
    /// Origins whose decisions share [`OTHER_LIST`].
    merged: usize,
}

/// What a change did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Applied {
    /// Decisions added (or replaced by a decision of the same id).
    pub added: usize,
    /// Decisions removed.
    pub removed: usize,
    /// Decisions not held: past the cap ([`Decisions::trim`]).
    pub over_cap: usize,
}

/// The list name of `origin`: [`LIST_PREFIX`] and the origin, with any
/// character that is not a letter, digit, `.`, `_` or `-` written `_`.
pub fn list_name(origin: &str) -> String {
    let mut name = String::from(LIST_PREFIX);
    name.extend(origin.chars().take(48).map(|c| {
        if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') {
            c
        } else {
            '_'
        }
    }));
    name
}

/// Whether `name` is the name of a list of decisions.
pub fn is_decision_list(name: &str) -> bool {
    name.starts_with(LIST_PREFIX)
}

impl Decisions {
    /// The decisions of `all` (a record read back).
    pub fn of(all: impl IntoIterator<Item = Decision>) -> Self {
        let mut d = Self::default();
        d.resync(all);
        d
    }

    /// Adds `added` (a decision of a known id replaces it; one equal to the
    /// decision held is no change) and removes the decisions of the ids
    /// `deleted` (ids not held are ignored: the stream says a deletion more
    /// than once).
    pub fn apply(
        &mut self,
        added: impl IntoIterator<Item = Decision>,
        deleted: impl IntoIterator<Item = u64>,
    ) -> Applied {
        let mut out = Applied::default();
        let mut touched = BTreeSet::new();
        for id in deleted {
            if self.remove(id, &mut touched) {
                out.removed += 1;
            }
        }
        for d in added {
            if self.by_id.get(&d.id) == Some(&d) {
                continue;
            }
            // The new one held before the old one is let go: a replaced
            // decision of the same prefix leaves its list as it is.
            self.hold(&d, &mut touched);
            let end = (d.until_ms, d.id);
            if let Some(old) = self.by_id.insert(d.id, d) {
                self.ends.remove(&(old.until_ms, old.id));
                self.unhold(&old, &mut touched);
            }
            self.ends.insert(end);
            out.added += 1;
        }
        self.remake(touched);
        out
    }

    /// Makes `all` the decisions (a resync: the Local API's whole set).
    pub fn resync(&mut self, all: impl IntoIterator<Item = Decision>) -> Applied {
        let all: BTreeMap<u64, Decision> = all.into_iter().map(|d| (d.id, d)).collect();
        let gone: Vec<u64> = self
            .by_id
            .keys()
            .filter(|id| !all.contains_key(id))
            .copied()
            .collect();
        self.apply(all.into_values(), gone)
    }

    /// Keeps at most `max` decisions, the oldest (lowest ids: the Local API
    /// numbers them as it makes them); answers how many newer ones were
    /// let go.
    pub fn trim(&mut self, max: usize) -> usize {
        let excess = self.by_id.len().saturating_sub(max);
        if excess == 0 {
            return 0;
        }
        let newest: Vec<u64> = self.by_id.keys().rev().take(excess).copied().collect();
        self.apply([], newest).removed
    }

    /// Removes every decision and list.
    pub fn clear(&mut self) -> usize {
        let n = self.by_id.len();
        *self = Self::default();
        n
    }

    /// Removes what ends by `now_ms`; how many.
    pub fn expire(&mut self, now_ms: u64) -> usize {
        let due: Vec<u64> = self
            .ends
            .range(..=(now_ms, u64::MAX))
            .map(|(_, id)| *id)
            .collect();
        self.apply([], due).removed
    }

    /// When the next decision ends, Unix ms.
    pub fn next_end(&self) -> Option<u64> {
        self.ends.get_min().map(|(at, _)| *at)
    }

    /// Moves the ends due by `now_ms` to `by_ms` later (ending them failed).
    pub fn postpone_due(&mut self, now_ms: u64, by_ms: u64) {
        let due: Vec<Decision> = self
            .ends
            .range(..=(now_ms, u64::MAX))
            .filter_map(|(_, id)| self.by_id.get(id))
            .map(|d| Decision {
                until_ms: now_ms + by_ms,
                ..d.clone()
            })
            .collect();
        self.apply(due, []);
    }

    /// The deny list of each origin, by list name.
    pub fn lists(&self) -> &BTreeMap<String, List> {
        &self.lists
    }

    /// Every decision, by id.
    pub fn iter(&self) -> impl DoubleEndedIterator<Item = &Decision> {
        self.by_id.values()
    }

    /// The decision of `id`.
    pub fn get(&self, id: u64) -> Option<&Decision> {
        self.by_id.get(&id)
    }

    /// What differs from `before` to these: decisions added or replaced
    /// (`Ok`), ids removed (`Err`), in id order. Costs what differs: the
    /// parts the two share are not visited.
    pub fn changes_since<'a>(
        &'a self,
        before: &'a Self,
    ) -> impl Iterator<Item = std::result::Result<&'a Decision, u64>> + 'a {
        before.by_id.diff(&self.by_id).map(|item| match item {
            DiffItem::Add(_, d) | DiffItem::Update { new: (_, d), .. } => Ok(d),
            DiffItem::Remove(id, _) => Err(*id),
        })
    }

    /// Decisions held.
    pub fn len(&self) -> usize {
        self.by_id.len()
    }

    /// Whether none is held.
    pub fn is_empty(&self) -> bool {
        self.by_id.is_empty()
    }

    /// Whether `other` holds the very same decisions (not equal ones: the
    /// same shared map, unchanged since one was cloned from the other).
    pub fn same(&self, other: &Self) -> bool {
        self.by_id.ptr_eq(&other.by_id)
    }

    /// Counts `d` in its list; notes the list when its entries changed.
    fn hold(&mut self, d: &Decision, touched: &mut BTreeSet<String>) {
        let name = self.name_of(&d.origin);
        let count = self.held.entry(name.clone()).or_default();
        let n = count.entry(d.prefix).or_insert(0);
        *n += 1;
        if *n == 1 {
            touched.insert(name);
        }
    }

    /// Counts `d` out of its list; notes the list when its entries changed.
    fn unhold(&mut self, d: &Decision, touched: &mut BTreeSet<String>) {
        let Some(name) = self.names.get(&d.origin) else {
            return;
        };
        if let Some(count) = self.held.get_mut(name)
            && let Some(n) = count.get_mut(&d.prefix)
        {
            *n -= 1;
            if *n == 0 {
                count.remove(&d.prefix);
                touched.insert(name.clone());
            }
        }
    }

    /// Lets go of the decision of `id`; whether it was held.
    fn remove(&mut self, id: u64, touched: &mut BTreeSet<String>) -> bool {
        let Some(d) = self.by_id.remove(&id) else {
            return false;
        };
        self.ends.remove(&(d.until_ms, d.id));
        self.unhold(&d, touched);
        true
    }

    /// The list name of `origin`, given once and kept (see `names`); past
    /// [`MAX_ORIGINS`] origins, [`OTHER_LIST`].
    fn name_of(&mut self, origin: &Arc<str>) -> String {
        if let Some(name) = self.names.get(origin) {
            return name.clone();
        }
        if self.origins.len() >= MAX_ORIGINS {
            self.merged += 1;
            self.names.insert(origin.clone(), OTHER_LIST.to_string());
            return OTHER_LIST.to_string();
        }
        let base = list_name(origin);
        let mut name = base.clone();
        let mut n = 2;
        // The shared list's name is never an origin's own.
        while name == OTHER_LIST || self.origins.contains_key(&name) {
            name = format!("{base}-{n}");
            n += 1;
        }
        self.origins.insert(name.clone(), origin.clone());
        self.names.insert(origin.clone(), name.clone());
        name
    }

    /// Makes the lists `touched` anew from their entries.
    fn remake(&mut self, touched: BTreeSet<String>) {
        for name in touched {
            let entries: Vec<Prefix> = self
                .held
                .get(&name)
                .map(|count| count.keys().copied().collect())
                .unwrap_or_default();
            let source = match self.origins.get(&name) {
                Some(origin) => format!("CrowdSec, origin {origin}"),
                None => format!(
                    "CrowdSec, {} origins past the first {MAX_ORIGINS}",
                    self.merged
                ),
            };
            self.lists.insert(
                name,
                List {
                    action: ListAction::Deny,
                    source,
                    entries: entries.into(),
                    counted: true,
                },
            );
        }
    }

    /// The origin a list of decisions is named for, as `status` shows it
    /// (`other (N origins)` for [`OTHER_LIST`]).
    pub fn origin_of(&self, list: &str) -> String {
        if list == OTHER_LIST {
            return format!(
                "other ({} origins past the first {MAX_ORIGINS})",
                self.merged
            );
        }
        self.origins.get(list).map_or_else(
            || list.strip_prefix(LIST_PREFIX).unwrap_or(list).to_string(),
            ToString::to_string,
        )
    }

    /// Origins whose decisions share [`OTHER_LIST`].
    pub fn merged_origins(&self) -> usize {
        self.merged
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &str) -> Prefix {
        Prefix::parse("t", s).unwrap()
    }

    fn d(id: u64, cidr: &str, origin: &str, until_ms: u64) -> Decision {
        Decision::new(id, p(cidr), origin, 0, until_ms)
    }

    fn entries(ds: &Decisions, name: &str) -> Vec<String> {
        ds.lists()[name]
            .entries
            .iter()
            .map(ToString::to_string)
            .collect()
    }

    #[test]
    fn one_list_per_origin_and_deletions_by_id() {
        let mut ds = Decisions::default();
        let got = ds.apply(
            [
                d(1, "198.18.0.5", "cscli", 120_000),
                d(2, "198.18.7.0/24", "cscli", 3_600_000),
                d(3, "198.18.9.9", "CAPI", 7_200_000),
                // The same address twice in one origin: one entry.
                d(4, "198.18.0.5", "cscli", 60_000),
            ],
            [],
        );
        assert_eq!(
            got,
            Applied {
                added: 4,
                removed: 0,
                over_cap: 0,
            }
        );
        assert_eq!(
            ds.lists().keys().collect::<Vec<_>>(),
            ["crowdsec:CAPI", "crowdsec:cscli"]
        );
        assert_eq!(
            entries(&ds, "crowdsec:cscli"),
            ["198.18.0.5/32", "198.18.7.0/24"]
        );
        assert!(ds.lists()["crowdsec:cscli"].counted);
        // Deleting one of the two decisions of 198.18.0.5 keeps it banned;
        // an id deleted twice, or never held, changes nothing.
        assert_eq!(ds.apply([], [4, 4, 99]).removed, 1);
        assert_eq!(
            entries(&ds, "crowdsec:cscli"),
            ["198.18.0.5/32", "198.18.7.0/24"]
        );
        ds.apply([], [1, 2]);
        assert!(entries(&ds, "crowdsec:cscli").is_empty(), "kept, empty");
        assert_eq!(entries(&ds, "crowdsec:CAPI"), ["198.18.9.9/32"]);
    }

    #[test]
    fn ends_are_whole_seconds_and_expire_together() {
        let mut ds = Decisions::default();
        ds.apply(
            [
                Decision::new(1, p("198.18.0.1"), "cscli", 10_400, 1_000),
                Decision::new(2, p("198.18.0.2"), "cscli", 10_000, 1_300),
                Decision::new(3, p("198.18.0.3"), "cscli", 10_000, 5_000),
            ],
            [],
        );
        assert_eq!(ds.next_end(), Some(12_000));
        assert_eq!(ds.expire(11_999), 0);
        assert_eq!(ds.expire(12_000), 2);
        assert_eq!(entries(&ds, "crowdsec:cscli"), ["198.18.0.3/32"]);
        ds.postpone_due(20_000, 60_000);
        assert_eq!(ds.next_end(), Some(80_000));
    }

    #[test]
    fn a_resync_is_the_whole_set_and_says_what_differs() {
        let mut ds = Decisions::of([d(1, "198.18.0.1", "cscli", 1_000_000)]);
        let before = ds.clone();
        assert!(ds.same(&before));
        let got = ds.resync([
            d(1, "198.18.0.1", "cscli", 1_000_000),
            d(2, "198.18.0.2", "crowdsec", 1_000_000),
        ]);
        assert_eq!(
            got,
            Applied {
                added: 1,
                removed: 0,
                over_cap: 0,
            }
        );
        assert!(!ds.same(&before));
        let again = ds.clone();
        assert_eq!(ds.resync(again.iter().cloned()), Applied::default());
        assert!(ds.same(&again), "an unchanged resync keeps the same map");
        assert_eq!(
            ds.resync([]),
            Applied {
                added: 0,
                removed: 2,
                over_cap: 0,
            }
        );
        assert!(ds.is_empty());
    }

    #[test]
    fn origins_whose_names_collide_keep_a_list_each() {
        let long = "x".repeat(60);
        let longer = format!("{long}y");
        let all = Decisions::of([
            d(1, "198.18.0.1", "a b", 1_000),
            d(2, "198.18.0.2", "a_b", 1_000),
            d(3, "198.18.0.3", &long, 1_000),
            d(4, "198.18.0.4", &longer, 1_000),
        ]);
        let lists = all.lists();
        assert_eq!(lists.len(), 4, "{:?}", lists.keys().collect::<Vec<_>>());
        let held: usize = lists.values().map(|l| l.entries.len()).sum();
        assert_eq!(held, 4, "every decision in a list of its origin's");
        for (name, list) in lists {
            assert_eq!(list.entries.len(), 1, "{name}");
        }
        assert!(lists.contains_key("crowdsec:a_b") && lists.contains_key("crowdsec:a_b-2"));
    }

    #[test]
    fn origins_past_the_cap_share_one_list_and_every_decision_is_held() {
        let all = Decisions::of((0..100u64).map(|i| {
            d(
                i,
                &format!("198.18.{}.{}", i / 250, i % 250 + 1),
                &format!("origin {i:03}"),
                1_000,
            )
        }));
        let lists = all.lists();
        assert_eq!(
            lists.len(),
            MAX_ORIGINS + 1,
            "{:?}",
            lists.keys().collect::<Vec<_>>()
        );
        let held: usize = lists.values().map(|l| l.entries.len()).sum();
        assert_eq!(held, 100, "every decision in a list");
        assert_eq!(lists[OTHER_LIST].entries.len(), 100 - MAX_ORIGINS);
        assert_eq!(all.merged_origins(), 100 - MAX_ORIGINS);
        assert_eq!(all.origin_of("crowdsec:origin_000"), "origin 000");
        // An origin called other keeps a list of its own.
        let mine = Decisions::of([d(1, "198.18.0.1", "other", 1_000)]);
        assert!(
            mine.lists().contains_key("crowdsec:other-2"),
            "{:?}",
            mine.lists().keys()
        );
    }

    #[test]
    fn past_the_cap_the_newest_decisions_are_let_go() {
        let mut all =
            Decisions::of((1..=10u64).map(|i| d(i, &format!("198.18.0.{i}"), "cscli", 1_000)));
        assert_eq!(all.trim(10), 0);
        assert_eq!(all.trim(7), 3);
        assert_eq!(all.len(), 7);
        assert_eq!(
            all.iter().map(|d| d.id).max(),
            Some(7),
            "the oldest are kept"
        );
        assert_eq!(all.lists()["crowdsec:cscli"].entries.len(), 7);
    }

    #[test]
    fn a_replaced_decision_of_the_same_ban_keeps_its_list_and_its_end_is_the_new_one() {
        let mut ds = Decisions::of([
            d(1, "198.18.0.1", "cscli", 1_000),
            d(2, "198.18.0.2", "cscli", 5_000),
        ]);
        let list = ds.lists()["crowdsec:cscli"].entries.clone();
        let before = ds.clone();
        assert_eq!(
            ds.apply([d(1, "198.18.0.1", "cscli", 1_000)], []),
            Applied::default()
        );
        assert!(ds.same(&before), "an equal decision is no change");
        assert_eq!(ds.apply([d(1, "198.18.0.1", "cscli", 9_000)], []).added, 1);
        assert!(
            Arc::ptr_eq(&list, &ds.lists()["crowdsec:cscli"].entries),
            "the same entries: the list is not made anew"
        );
        assert_eq!(ds.next_end(), Some(5_000));
        assert_eq!(ds.expire(5_000), 1);
        assert_eq!(
            ds.next_end(),
            Some(9_000),
            "the replaced decision ends at its new time"
        );
        let changes: Vec<_> = ds.changes_since(&before).collect();
        assert_eq!(changes.len(), 2, "one replaced, one gone: {changes:?}");
    }

    #[test]
    fn list_names_are_never_an_operators() {
        assert_eq!(list_name("cscli"), "crowdsec:cscli");
        assert_eq!(list_name("lists:firehol x"), "crowdsec:lists_firehol_x");
        assert!(is_decision_list(&list_name("CAPI")));
        assert!(crate::model::lists::check_name("--name", &list_name("CAPI")).is_err());
    }
}
