//! The planner against an in-memory kernel: the rule table, both tries, the
//! groups and the config as plain collections, written the way
//! [`crate::kernel::Maps`] executes a plan. No root, no maps.

use std::sync::Arc;

use ratelimit_common::{self as common, GROUPS_CAPACITY};

use super::*;
use crate::{
    error::Error,
    model::lists::{List, ListAction},
    model::rules::{Action, RuleSet, default_limit},
};

/// The maps a plan touches, in memory, sized like a small daemon's.
struct Kernel {
    config: common::Config,
    table: Vec<common::Rule>,
    tries: [TrieEntries; 2],
    groups: Vec<common::MatchGroup>,
    slots: u32,
    list_capacity: usize,
    /// The plans executed, last last.
    executed: Vec<Plan>,
}

const SEED: u64 = 0x5eed;

impl Kernel {
    /// A freshly loaded object: every value zero.
    fn new(slots: u32, table_len: u32, list_capacity: usize) -> Self {
        Self {
            config: common::Config::default(),
            table: vec![common::Rule::default(); table_len as usize],
            tries: [TrieEntries::new(), TrieEntries::new()],
            groups: vec![common::MatchGroup::default(); 2 * GROUPS_CAPACITY as usize],
            slots,
            list_capacity,
            executed: Vec::new(),
        }
    }

    fn small() -> Self {
        Self::new(8, 2 * 8 + 2, 100)
    }

    fn current(&self) -> Current {
        let active = (self.config.active_rules & 1) as usize;
        let (deny, allow) = policy_indexes(self.table.len() as u32);
        // As a restarted daemon finds them: marked, without their names.
        let counted: std::collections::BTreeMap<String, (u32, common::Rule)> =
            match self.executed.last() {
                Some(p) => p.counted.clone(),
                None => Default::default(),
            };
        let counted_at: Vec<u32> = counted.values().map(|(i, _)| *i).collect();
        let rules = own_entries(self.tries[active].iter(), |i| Ok(self.groups[i as usize]))
            .expect("groups in memory")
            .into_iter()
            .filter(|(_, i)| *i != deny && *i != allow && !counted_at.contains(i))
            .map(|(s, i)| (s, (i, self.table[i as usize])))
            .collect();
        Current {
            config: self.config,
            default: self.table[self.config.default_rule as usize],
            rules,
            policies: (self.table[deny as usize], self.table[allow as usize]),
            counted,
            table_len: self.table.len() as u32,
            slots: self.slots,
            seen_slots: 1 << 10,
            state_lines: (1 << 10, 1 << 8),
            list_capacity: self.list_capacity,
        }
    }

    fn plan(&self, set: &RuleSet) -> crate::error::Result<Plan> {
        let now = self.current();
        plan(
            set,
            &now,
            self.executed.last().map(|p| p.lists.clone()),
            Host {
                fresh_seed: SEED,
                local_ports: 0,
            },
        )
    }

    /// Plans `set` and writes it as `Maps::apply` does.
    fn apply(&mut self, set: &RuleSet) -> &Plan {
        let plan = self.plan(set).expect("the plan");
        for (i, rule) in &plan.table {
            self.table[*i as usize] = *rule;
        }
        for (i, group) in &plan.groups {
            self.groups[*i as usize] = *group;
        }
        let rules: TrieEntries = plan.trie.iter().map(|(p, i)| (p.lpm(), *i)).collect();
        let before = Before::Read(self.tries[plan.idle].clone());
        for (key, value) in trie_writes(before, &plan.lists, &rules) {
            match value {
                Some(v) => self.tries[plan.idle].insert(key, v),
                None => self.tries[plan.idle].remove(&key),
            };
        }
        self.config = plan.config;
        self.executed.push(plan);
        self.executed.last().expect("just pushed")
    }

    /// The rule the program reads for `cidr`: (table index, rule).
    fn rule(&self, cidr: &str) -> (u32, common::Rule) {
        self.current().rules[&sel(cidr)]
    }
}

fn sel(cidr: &str) -> Selector {
    Selector::parse("CIDR", cidr).expect("a test CIDR")
}

fn limit(per_second: u64) -> Action {
    let mut l = default_limit();
    l.rate.tokens = per_second;
    l.burst = per_second;
    Action::Limit(l)
}

fn set_of(rules: &[(&str, Action)]) -> RuleSet {
    RuleSet {
        rules: rules.iter().map(|(c, a)| (sel(c), *a)).collect(),
        ..RuleSet::default()
    }
}

#[test]
fn a_rule_that_stays_keeps_its_id_slot_and_table_entry() {
    let mut k = Kernel::small();
    k.apply(&set_of(&[("198.18.1.0/24", limit(10))]));
    let before = k.rule("198.18.1.0/24");
    let plan = k.apply(&set_of(&[
        ("198.18.1.0/24", limit(10)),
        ("198.18.2.0/24", limit(20)),
    ]));
    assert!(
        plan.table.iter().all(|(i, _)| *i != before.0),
        "a rule that stays was written again: {:?}",
        plan.table
    );
    let after = k.rule("198.18.1.0/24");
    assert_eq!(
        (after.0, after.1.id, after.1.slot),
        (before.0, before.1.id, before.1.slot)
    );
    let new = k.rule("198.18.2.0/24");
    assert_ne!(new.1.id, before.1.id);
    assert_ne!(new.1.slot, before.1.slot);
    assert_ne!(new.1.slot, 0, "slot 0 is the default rule's");
}

#[test]
fn a_changed_rule_is_written_where_the_program_does_not_read() {
    let mut k = Kernel::small();
    k.apply(&set_of(&[
        ("198.18.1.0/24", limit(10)),
        ("198.18.2.0/24", limit(10)),
    ]));
    let reading = k.current();
    let in_use: Vec<u32> = reading
        .rules
        .values()
        .map(|(i, _)| *i)
        .chain([reading.config.default_rule])
        .collect();
    let plan = k
        .plan(&set_of(&[
            ("198.18.1.0/24", limit(20)),
            ("198.18.2.0/24", limit(10)),
        ]))
        .expect("the plan");
    let (deny, allow) = reading.policy_indexes();
    let rule_writes: Vec<u32> = plan
        .table
        .iter()
        .map(|(i, _)| *i)
        .filter(|i| *i != deny && *i != allow)
        .collect();
    assert_eq!(rule_writes.len(), 1, "one rule changed: {:?}", plan.table);
    assert!(
        !in_use.contains(&rule_writes[0]),
        "the change overwrote index {} the program reads ({in_use:?})",
        rule_writes[0]
    );
    assert_eq!(plan.idle, 1 - (reading.config.active_rules & 1) as usize);
    assert_eq!(plan.config.active_rules as usize, plan.idle, "the switch");
    // Same algorithm and levels: the keys' buckets carry over.
    let was = reading.rules[&sel("198.18.1.0/24")].1;
    k.apply(&set_of(&[
        ("198.18.1.0/24", limit(20)),
        ("198.18.2.0/24", limit(10)),
    ]));
    let now = k.rule("198.18.1.0/24").1;
    assert_eq!((now.id, now.slot), (was.id, was.slot));
}

#[test]
fn another_algorithm_or_action_starts_the_keys_afresh() {
    let mut k = Kernel::small();
    k.apply(&set_of(&[("198.18.1.0/24", limit(10))]));
    let was = k.rule("198.18.1.0/24").1;
    let mut sliding = default_limit();
    sliding.algo = crate::model::limit::Algo::FixedWindow {
        window_ns: 1_000_000_000,
        limit: 10,
    };
    k.apply(&set_of(&[("198.18.1.0/24", Action::Limit(sliding))]));
    let now = k.rule("198.18.1.0/24").1;
    assert_ne!(
        now.id, was.id,
        "a fixed window's keys would meet GCRA states"
    );
    assert_eq!(
        k.executed.last().expect("a plan").fresh_counters,
        vec![now.slot],
        "a new slot's counters start at zero"
    );
}

#[test]
fn a_new_rule_takes_a_slot_no_rule_had_before_a_released_one() {
    // Slots 1..=3 for rules.
    let mut k = Kernel::new(4, 2 * 4 + 2, 100);
    k.apply(&set_of(&[
        ("198.18.1.0/24", limit(10)),
        ("198.18.2.0/24", limit(10)),
    ]));
    let b = k.rule("198.18.2.0/24").1.slot;
    k.apply(&set_of(&[
        ("198.18.1.0/24", limit(10)),
        ("198.18.3.0/24", limit(10)),
    ]));
    let c = k.rule("198.18.3.0/24").1.slot;
    assert_ne!(c, b, "a removed rule's frames may still meet its slot");
    // Every slot is taken now but the released one: it is reused.
    k.apply(&set_of(&[
        ("198.18.1.0/24", limit(10)),
        ("198.18.3.0/24", limit(10)),
        ("198.18.4.0/24", limit(10)),
    ]));
    assert_eq!(k.rule("198.18.4.0/24").1.slot, b);
    // And once more, when only a slot just released is left.
    k.apply(&set_of(&[
        ("198.18.1.0/24", limit(10)),
        ("198.18.3.0/24", limit(10)),
        ("198.18.5.0/24", limit(10)),
    ]));
    assert_eq!(k.rule("198.18.5.0/24").1.slot, b);
}

#[test]
fn more_rules_than_slots_are_refused_naming_the_option() {
    let k = Kernel::new(3, 2 * 3 + 2, 100);
    let err = k
        .plan(&set_of(&[
            ("198.18.1.0/24", limit(10)),
            ("198.18.2.0/24", limit(10)),
            ("198.18.3.0/24", limit(10)),
        ]))
        .expect_err("3 rules in 2 slots");
    assert!(
        matches!(
            err,
            Error::Capacity {
                wanted: 3,
                capacity: 2,
                option: "--max-rules",
                ..
            }
        ),
        "{err:?}"
    );
}

#[test]
fn a_table_without_a_free_entry_for_the_change_is_refused() {
    // 6 entries: 4 for rules and the default, 2 for the policies. Two rules
    // and the default use 3; changing both needs 2 free ones.
    let mut k = Kernel::new(8, 6, 100);
    k.apply(&set_of(&[
        ("198.18.1.0/24", limit(10)),
        ("198.18.2.0/24", limit(10)),
    ]));
    let err = k
        .plan(&set_of(&[
            ("198.18.1.0/24", limit(20)),
            ("198.18.2.0/24", limit(20)),
        ]))
        .expect_err("no room to copy both");
    assert!(
        matches!(&err, Error::Capacity { what, option: "--max-rules", .. } if what == "rule table entries"),
        "{err:?}"
    );
}

#[test]
fn rule_ids_run_out_with_a_way_out() {
    let mut k = Kernel::small();
    k.apply(&set_of(&[]));
    let default = k.config.default_rule as usize;
    k.table[default].id = common::MAX_RULE_ID;
    let err = k
        .plan(&set_of(&[("198.18.1.0/24", limit(10))]))
        .expect_err("no id left");
    assert!(
        matches!(&err, Error::Invalid { field, message } if field == "rules" && message.contains("--reset")),
        "{err:?}"
    );
}

fn list(action: ListAction, cidrs: &[&str]) -> List {
    List {
        action,
        source: "test".into(),
        entries: cidrs.iter().map(|c| sel(c).source).collect(),
        counted: false,
    }
}

#[test]
fn list_entries_beyond_the_capacity_are_refused_naming_the_option() {
    let k = Kernel::new(8, 18, 2);
    let mut set = set_of(&[]);
    set.lists.insert(
        "bad".into(),
        list(
            ListAction::Deny,
            &["198.18.1.1/32", "198.18.1.2/32", "198.18.1.3/32"],
        ),
    );
    let err = k.plan(&set).expect_err("3 entries, room for 2");
    assert!(
        matches!(
            err,
            Error::Capacity {
                wanted: 3,
                capacity: 2,
                option: "--max-list-entries",
                ..
            }
        ),
        "{err:?}"
    );
    // A rule at a list entry's CIDR takes its place: it no longer counts.
    set.rules.insert(sel("198.18.1.3/32"), Action::Allow);
    k.plan(&set).expect("2 list entries and a rule fit");
}

#[test]
fn a_rule_change_under_lists_writes_only_the_rules_keys() {
    let mut k = Kernel::small();
    let mut set = set_of(&[("198.18.9.0/24", limit(10))]);
    let entries: Vec<String> = (1..=50).map(|i| format!("198.18.1.{i}/32")).collect();
    let cidrs: Vec<&str> = entries.iter().map(String::as_str).collect();
    set.lists
        .insert("bad".into(), list(ListAction::Deny, &cidrs));
    k.apply(&set);
    k.apply(&set); // both tries hold the lists now
    let lists = k.executed.last().expect("a plan").lists.clone();
    let state = TrieState {
        lists: lists.clone(),
        rules: k.executed[0]
            .trie
            .iter()
            .map(|(p, i)| (p.lpm(), *i))
            .collect(),
    };
    let mut wanted = state.rules.clone();
    let added = sel("198.18.8.0/24").source.lpm();
    wanted.insert(added, 3);
    let writes = trie_writes(Before::Written(&state), &lists, &wanted);
    assert_eq!(
        writes,
        vec![(added, Some(3))],
        "one rule added, one key written"
    );
    // Not known as written: the trie is read and compared whole.
    let read = state.entries();
    let writes = trie_writes(Before::Read(read), &lists, &wanted);
    assert_eq!(writes, vec![(added, Some(3))]);
}

#[test]
fn removals_come_before_insertions() {
    let lists = Arc::new(ListPlan::build(&set_of(&[]), (16, 17), &Default::default()));
    let old: TrieEntries = [(sel("198.18.1.0/24").source.lpm(), 1)].into();
    let wanted: TrieEntries = [(sel("198.18.2.0/24").source.lpm(), 2)].into();
    let writes = trie_writes(Before::Read(old), &lists, &wanted);
    assert_eq!(writes.len(), 2);
    assert_eq!(writes[0].1, None, "the removal first: {writes:?}");
}

#[test]
fn the_hash_seed_is_drawn_once_and_kept() {
    let mut k = Kernel::small();
    assert_eq!(k.apply(&set_of(&[])).config.hash_seed, SEED);
    k.config.hash_seed = 42;
    assert_eq!(
        k.apply(&set_of(&[])).config.hash_seed,
        42,
        "a new seed would move every key's doorkeeper slot"
    );
}

#[test]
fn the_unjudged_policies_are_written_once() {
    let mut k = Kernel::small();
    let first = k.apply(&set_of(&[])).table.len();
    assert!(
        first >= 2,
        "the policies' rules are written on a fresh table"
    );
    let second = k.apply(&set_of(&[])).table.clone();
    assert!(
        second.is_empty(),
        "nothing changed, nothing written: {second:?}"
    );
}

#[test]
fn a_new_aggregate_starts_full_and_a_kept_one_carries_over() {
    let mut k = Kernel::small();
    let mut with_aggregate = default_limit();
    with_aggregate.aggregate = Some(crate::model::limit::Shared {
        rate: with_aggregate.rate,
        burst: 100,
    });
    k.apply(&set_of(&[("198.18.1.0/24", Action::Limit(with_aggregate))]));
    let rule = k.rule("198.18.1.0/24").1;
    assert!(
        k.executed[0]
            .fresh_shared
            .iter()
            .any(|f| f.slot == rule.slot && f.aggregate && f.new_sources),
        "a new rule's shared buckets start full: {:?}",
        k.executed[0].fresh_shared
    );
    let plan = k.apply(&set_of(&[("198.18.1.0/24", Action::Limit(with_aggregate))]));
    assert!(
        plan.fresh_shared.iter().all(|f| f.slot != rule.slot),
        "an unchanged rule keeps its buckets: {:?}",
        plan.fresh_shared
    );
}

fn counted(cidrs: &[&str]) -> List {
    List {
        counted: true,
        ..list(ListAction::Deny, cidrs)
    }
}

#[test]
fn a_counted_list_points_at_a_deny_rule_of_its_own_that_stays_while_it_does() {
    let mut k = Kernel::small();
    let mut set = set_of(&[("198.18.1.0/24", limit(10))]);
    set.lists
        .insert("crowdsec:cscli".into(), counted(&["198.18.0.5/32"]));
    set.lists
        .insert("plain".into(), list(ListAction::Deny, &["198.18.0.6/32"]));
    let plan = k.apply(&set);
    let (index, rule) = plan.counted["crowdsec:cscli"];
    assert_eq!(
        (rule.action, rule.counted_list),
        (common::action::DENY, 1),
        "{rule:?}"
    );
    assert!(
        rule.slot != 0 && rule.slot != common::UNCOUNTED_SLOT,
        "{rule:?}"
    );
    assert!(
        plan.fresh_counters.contains(&rule.slot),
        "its counters start at 0"
    );
    assert!(plan.table.contains(&(index, rule)));
    let (deny, _) = policy_indexes(k.table.len() as u32);
    let active = (k.config.active_rules & 1) as usize;
    assert_eq!(
        k.tries[active].get(&sel("198.18.0.5/32").source.lpm()),
        Some(&index),
        "the counted list's entry points at its own rule"
    );
    assert_eq!(
        k.tries[active].get(&sel("198.18.0.6/32").source.lpm()),
        Some(&deny),
        "a plain list's at the shared one"
    );
    assert_ne!(k.rule("198.18.1.0/24").1.slot, rule.slot);
    assert!(
        !k.current().rules.contains_key(&sel("198.18.0.5/32")),
        "a counted list's entry is no rule"
    );

    // New entries, the same list: its rule stays where it is, counters and all.
    set.lists.insert(
        "crowdsec:cscli".into(),
        counted(&["198.18.0.5/32", "198.18.0.7/32"]),
    );
    let plan = k.apply(&set);
    assert_eq!(plan.counted["crowdsec:cscli"], (index, rule));
    assert!(!plan.fresh_counters.contains(&rule.slot));
    assert!(plan.table.iter().all(|(i, _)| *i != index));

    // A second counted list gets a rule and a slot of its own.
    set.lists
        .insert("crowdsec:CAPI".into(), counted(&["198.18.9.0/24"]));
    let plan = k.apply(&set);
    let (other_index, other) = plan.counted["crowdsec:CAPI"];
    assert_ne!(other_index, index);
    assert_ne!(other.slot, rule.slot);
}

#[test]
fn a_counted_list_takes_a_rules_room() {
    let k = Kernel::small();
    let rules: Vec<(String, Action)> = (1..=7)
        .map(|i| (format!("198.18.{i}.0/24"), limit(10)))
        .collect();
    let refs: Vec<(&str, Action)> = rules.iter().map(|(c, a)| (c.as_str(), *a)).collect();
    let mut set = set_of(&refs);
    k.plan(&set).expect("7 rules fit in 7");
    set.lists
        .insert("crowdsec:cscli".into(), counted(&["198.18.0.5/32"]));
    let err = k.plan(&set).expect_err("7 rules and a counted list do not");
    assert!(
        matches!(
            err,
            Error::Capacity {
                wanted: 8,
                capacity: 7,
                option: "--max-rules",
                ..
            }
        ),
        "{err:?}"
    );
}

/// A list plan made from the last one when deny lists change is the plan
/// made whole: the first deny list in name order holds a prefix two hold,
/// an allow list's prefix stays allowed, a prefix no list holds goes.
#[test]
fn a_list_plan_updated_from_the_last_is_the_plan_made_whole() {
    let mut set = set_of(&[]);
    set.lists.insert(
        "a-allow".into(),
        list(ListAction::Allow, &["198.18.5.0/24", "198.18.9.9/32"]),
    );
    set.lists.insert(
        "b-deny".into(),
        list(
            ListAction::Deny,
            &["198.18.1.1/32", "198.18.1.2/32", "198.18.5.5/32"],
        ),
    );
    set.lists.insert(
        "c-deny".into(),
        list(ListAction::Deny, &["198.18.1.2/32", "198.18.1.3/32"]),
    );
    let counted: CountedIndexes = [("b-deny".to_string(), 3), ("c-deny".to_string(), 4)].into();
    let policies = (16, 17);
    let mut plan = ListPlan::build(&set, policies, &counted);
    let steps: [(&str, &[&str]); 4] = [
        // b lets go of the shared .2: c holds it now.
        ("b-deny", &["198.18.1.1/32", "198.18.5.5/32"]),
        // c gains an allowed address and one b has; b's stays b's.
        (
            "c-deny",
            &[
                "198.18.1.1/32",
                "198.18.1.2/32",
                "198.18.1.4/32",
                "198.18.9.9/32",
            ],
        ),
        // b gains .2 back: it is first in name order.
        ("b-deny", &["198.18.1.1/32", "198.18.1.2/32"]),
        // Everything goes (lists are sorted: the plan relies on it).
        ("c-deny", &[]),
    ];
    for (name, cidrs) in steps {
        set.lists.insert(name.into(), list(ListAction::Deny, cidrs));
        let updated = plan
            .update(&set, policies, &counted)
            .expect("only deny lists changed");
        let whole = ListPlan::build(&set, policies, &counted);
        assert_eq!(updated.entries, whole.entries, "after {name} = {cidrs:?}");
        plan = updated;
    }
    // A changed allow list is not an update.
    set.lists.insert(
        "a-allow".into(),
        list(ListAction::Allow, &["198.18.1.1/32"]),
    );
    assert!(plan.update(&set, policies, &counted).is_none());
}
