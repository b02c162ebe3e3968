//! Which rule judges a frame, and why the others do not: `ratelimit explain`.
//!
//! Not a second reading of the precedence: the rule set is compiled exactly
//! as it is for the kernel ([`matching::compile`], the lists' entries of
//! [`ListPlan::build`]), and the lookup the program makes is walked over
//! that: the longest prefix of the source in the trie, then, where that
//! prefix has match groups, their entries in order. What the program would
//! pick is what this says. Pure: the daemon adds each rule's state from the
//! maps (`daemon/handlers/explain.rs`).

use std::{collections::BTreeMap, net::IpAddr};

use ratelimit_common::{GROUP_BIT, NO_RULE};

use super::plan::ListPlan;
use crate::{
    error::Result,
    model::{
        lists::ListAction,
        matching::{self, Match, Selector, contains, proto_name},
        prefix::Prefix,
        rules::{Action, Mode, RuleSet},
    },
};

/// A frame as `explain` is asked about it: its source, and what its rules
/// may match on (what is not given is not known).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Probe {
    /// The source address.
    pub source: Option<IpAddr>,
    /// The destination address (`--to`).
    pub dest: Option<IpAddr>,
    /// The transport protocol (`--proto`).
    pub proto: Option<u8>,
    /// The destination port (`--dport`).
    pub dport: Option<u16>,
    /// TCP with SYN and without ACK (`--syn`; without it, not such a SYN).
    pub syn: bool,
    /// The ICMP type (`--icmp-type`).
    pub icmp_type: Option<u8>,
}

/// What judges a frame.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Judge {
    /// A rule, by its selector.
    Rule(Selector),
    /// A list's entry (the list's name, its action, the entry).
    List(String, ListAction, Prefix),
    /// The default rule.
    Default,
}

/// The answer: who judges, whom it beat and why, and what was not given
/// that a rule on the way needed to tell.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Verdict {
    /// What judges the frame.
    pub judge: Judge,
    /// The judge's action as the program takes it (allowlist-only mode
    /// turns every limit and deny into a drop).
    pub action: Action,
    /// Every other rule or list entry whose source holds the frame's, and
    /// the default rule: each with why it does not judge the frame.
    pub beaten: Vec<(Judge, String)>,
    /// The flags (`--dport`, …) a rule on the way needed and the question
    /// did not give: the program would know them; the answer assumed the
    /// rule does not match.
    pub not_given: Vec<String>,
}

/// Whether a match takes a frame.
enum Takes {
    Yes,
    No(String),
    /// It needs this flag, not given.
    Unknown(&'static str),
}

/// Judges `probe` by `m`, in the program's order: the destination, then the
/// protocol, then what needs the transport header.
fn takes(m: &Match, p: &Probe) -> Takes {
    if let Some(d) = m.dest {
        match p.dest {
            None => return Takes::Unknown("--to"),
            Some(to) if !contains(&d, &host(to)) => {
                return Takes::No(format!("its destination {d} does not hold {to}"));
            }
            Some(_) => {}
        }
    }
    if let Some(proto) = m.proto {
        match p.proto {
            None => return Takes::Unknown("--proto"),
            Some(q) if q != proto => {
                return Takes::No(format!(
                    "it takes {}, not {}",
                    proto_name(proto),
                    proto_name(q)
                ));
            }
            Some(_) => {}
        }
    }
    if let Some(ports) = m.dports {
        match p.dport {
            None => return Takes::Unknown("--dport"),
            Some(port) if !ports.contains(port) => {
                let ports = match ports.single() {
                    Some((first, last)) if first == last => format!("port {first}"),
                    _ => format!("ports {ports}"),
                };
                return Takes::No(format!("it takes {ports}, not {port}"));
            }
            Some(_) => {}
        }
    }
    if m.syn && !p.syn {
        return Takes::No("it takes only a TCP SYN (--syn)".into());
    }
    if let Some(t) = m.icmp_type {
        match p.icmp_type {
            None => return Takes::Unknown("--icmp-type"),
            Some(u) if u != t => return Takes::No(format!("it takes ICMP type {t}, not {u}")),
            Some(_) => {}
        }
    }
    Takes::Yes
}

/// The host prefix of an address.
fn host(a: IpAddr) -> Prefix {
    Prefix {
        addr: a,
        len: if a.is_ipv4() { 32 } else { 128 },
    }
}

/// Which rule of `set` judges `probe` (its source given), and why.
pub fn explain(set: &RuleSet, probe: &Probe) -> Result<Verdict> {
    let source = probe.source.expect("a probe asked about has its source");
    let frame = host(source);
    // The indexes the program would see, made up here: the rules in their
    // order, then the default, then the lists' policy rules.
    let selectors: Vec<Selector> = set.rules.keys().copied().collect();
    let n = selectors.len() as u32;
    let (default, deny, allow) = (n, n + 1, n + 2);
    let entries: BTreeMap<Selector, u32> = selectors
        .iter()
        .enumerate()
        .map(|(i, s)| (*s, i as u32))
        .collect();
    // A counted list (every list but a test's) points at a rule of its own.
    let counted: std::collections::BTreeMap<String, u32> = set
        .lists
        .iter()
        .filter(|(_, l)| l.counted)
        .enumerate()
        .map(|(k, (name, _))| (name.clone(), n + 3 + k as u32))
        .collect();
    let lists = ListPlan::build(set, (deny, allow), &counted);
    // A frame a match cannot judge goes on to the next entry: explain is
    // asked about whole frames.
    let policies = matching::Policies {
        unjudged: NO_RULE,
        fragments: NO_RULE,
    };
    let compiled = matching::compile(&entries, &lists, default, policies, 0)?;

    // The longest prefix of the source in the trie: the rules' entries on
    // top of the lists' (a rule at a list entry's CIDR takes its place).
    let mut trie: BTreeMap<(u32, ratelimit_common::RuleAddr), (Prefix, u32)> = lists
        .entries
        .keys()
        .map(|k| (*k, (Prefix::from_lpm(k.0, k.1), lists.entries[k])))
        .collect();
    for (p, v) in &compiled.trie {
        trie.insert(p.lpm(), (*p, *v));
    }
    let hit = trie
        .values()
        .filter(|(p, _)| contains(p, &frame))
        .max_by_key(|(p, _)| p.len)
        .copied();
    let mut not_given = Vec::new();
    let index = match hit {
        None => default,
        Some((_, v)) if v & GROUP_BIT == 0 => v,
        Some((_, v)) => {
            let group = &compiled.groups[(v & !GROUP_BIT) as usize];
            let count = (group.count as usize).min(group.entries.len());
            group.entries[..count]
                .iter()
                .find_map(|e| match takes(&Match::from_entry(e), probe) {
                    Takes::Yes => Some(e.rule),
                    Takes::No(_) => None,
                    Takes::Unknown(flag) => {
                        not_given.push(flag.to_string());
                        None
                    }
                })
                .unwrap_or(default)
        }
    };
    let judge = match index {
        i if i < n => Judge::Rule(selectors[i as usize]),
        i if i == deny || i == allow => {
            let action = if i == deny {
                ListAction::Deny
            } else {
                ListAction::Allow
            };
            list_entry(set, action, &frame, None).unwrap_or(Judge::Default)
        }
        i if i > allow => {
            let name = counted.iter().find(|(_, at)| **at == i).map(|(n, _)| n);
            let action = name
                .and_then(|n| set.lists.get(n))
                .map_or(ListAction::Deny, |l| l.action);
            list_entry(set, action, &frame, name).unwrap_or(Judge::Default)
        }
        _ => Judge::Default,
    };
    let judged_by = |j: &Judge| match j {
        Judge::Rule(s) => set.rules[s],
        Judge::List(_, ListAction::Deny, _) => Action::Deny { dry_run: false },
        Judge::List(_, ListAction::Allow, _) => Action::Allow,
        Judge::Default => set.default,
    };
    let action = judged_by(&judge);
    let action = match (set.mode, action) {
        (Mode::AllowlistOnly, Action::Allow) | (Mode::Normal, _) => action,
        (Mode::AllowlistOnly, _) => Action::Deny { dry_run: false },
    };
    let judge_len = match &judge {
        Judge::Rule(s) => Some(s.source.len),
        Judge::List(_, _, p) => Some(p.len),
        Judge::Default => None,
    };
    let mut beaten = Vec::new();
    for s in selectors.iter().filter(|s| contains(&s.source, &frame)) {
        if judge == Judge::Rule(*s) {
            continue;
        }
        let why = match takes(&s.matches, probe) {
            Takes::No(why) => format!("does not take the frame: {why}"),
            Takes::Unknown(flag) => {
                format!("needs {flag} to tell, not given: taken as not matching")
            }
            Takes::Yes => match judge_len {
                Some(len) if len > s.source.len => {
                    "a longer prefix takes the frame (the longest prefix wins)".to_string()
                }
                Some(len) if len == s.source.len => {
                    "the same prefix's more specific match is tried first".to_string()
                }
                _ => "a longer prefix takes the frame (the longest prefix wins)".to_string(),
            },
        };
        beaten.push((Judge::Rule(*s), why));
    }
    for (name, list) in &set.lists {
        for entry in list.entries.iter().filter(|e| contains(e, &frame)) {
            let j = Judge::List(name.clone(), list.action, *entry);
            if j == judge {
                continue;
            }
            let shadowed = list.action == ListAction::Deny
                && crate::model::lists::Allowed::of(set.lists.values()).covers(entry);
            let why = if shadowed {
                "shadowed: an allow list holds the entry (a source the operator allowed is never dropped by a list)".to_string()
            } else if set
                .rules
                .keys()
                .any(|s| s.source == *entry && s.matches.is_any())
            {
                "a rule at the same CIDR takes its place (a rule beats a list entry)".to_string()
            } else {
                "a longer prefix, or a rule of the same one with a match, takes the frame"
                    .to_string()
            };
            beaten.push((j, why));
        }
    }
    if judge != Judge::Default {
        beaten.push((
            Judge::Default,
            "judges only frames no rule or list takes".to_string(),
        ));
    }
    not_given.sort();
    not_given.dedup();
    Ok(Verdict {
        judge,
        action,
        beaten,
        not_given,
    })
}

/// The longest entry holding `frame` of the lists of `action` (of the list
/// `only`, when given; not shadowed by an allow list, for a deny).
fn list_entry(
    set: &RuleSet,
    action: ListAction,
    frame: &Prefix,
    only: Option<&String>,
) -> Option<Judge> {
    let allowed = crate::model::lists::Allowed::of(set.lists.values());
    set.lists
        .iter()
        .filter(|(_, l)| l.action == action)
        .filter(|(name, l)| only.map_or(!l.counted, |o| o == *name))
        .flat_map(|(name, l)| l.entries.iter().map(move |e| (name, e)))
        .filter(|(_, e)| contains(e, frame))
        .filter(|(_, e)| action == ListAction::Allow || !allowed.covers(e))
        .max_by_key(|(_, e)| e.len)
        .map(|(name, e)| Judge::List(name.clone(), action, *e))
}

#[cfg(test)]
mod tests;
