//! `explain` against rule sets whose precedence surprised operators: a
//! narrower prefix taking a port rule's frames, matches that need what was
//! not given, lists and the rules that beat them, allowlist-only mode.

use std::net::IpAddr;

use super::*;
use crate::model::{
    lists::List,
    matching::{PROTO_TCP, PROTO_UDP},
    rules::default_limit,
};

fn sel(s: &str) -> Selector {
    Selector::parse("CIDR", s).expect("a test selector")
}

fn limit(per_second: u64) -> Action {
    let mut l = default_limit();
    l.rate.tokens = per_second;
    l.burst = per_second;
    Action::Limit(l)
}

fn probe(source: &str) -> Probe {
    Probe {
        source: Some(source.parse::<IpAddr>().expect("an address")),
        ..Probe::default()
    }
}

fn why<'a>(v: &'a Verdict, j: &Judge) -> &'a str {
    v.beaten
        .iter()
        .find(|(b, _)| b == j)
        .map(|(_, w)| w.as_str())
        .unwrap_or_else(|| panic!("{j:?} not among the beaten: {v:?}"))
}

/// The game server's port rule on a /24 and a /28 limit inside it: a source
/// of the /28 sending to the game port meets the /28's rule (the longest
/// prefix wins), and `explain` says so.
#[test]
fn a_longer_prefix_takes_a_port_rules_frames_and_explain_says_why() {
    let mut set = RuleSet::default();
    let game = sel("198.18.0.0/24 udp dport 27015");
    set.rules.insert(game, limit(50));
    set.rules.insert(sel("198.18.0.16/28"), limit(10));
    let mut p = probe("198.18.0.20");
    p.proto = Some(PROTO_UDP);
    p.dport = Some(27015);
    let v = explain(&set, &p).unwrap();
    assert_eq!(v.judge, Judge::Rule(sel("198.18.0.16/28")));
    assert!(
        why(&v, &Judge::Rule(game)).contains("longer prefix"),
        "{v:?}"
    );
    assert!(why(&v, &Judge::Default).contains("no rule"), "{v:?}");
    // Outside the /28, the port rule takes it.
    let mut q = p;
    q.source = Some("198.18.0.5".parse().unwrap());
    assert_eq!(explain(&set, &q).unwrap().judge, Judge::Rule(game));
    // Another port: the port rule does not match, and says why.
    q.dport = Some(80);
    let v = explain(&set, &q).unwrap();
    assert_eq!(v.judge, Judge::Default);
    assert!(why(&v, &Judge::Rule(game)).contains("not 80"), "{v:?}");
}

#[test]
fn a_match_that_needs_what_was_not_given_is_named() {
    let mut set = RuleSet::default();
    let dns = sel("198.18.0.0/24 udp dport 53");
    set.rules.insert(dns, limit(50));
    set.rules.insert(sel("198.18.0.0/24"), limit(10));
    let v = explain(&set, &probe("198.18.0.7")).unwrap();
    assert_eq!(v.judge, Judge::Rule(sel("198.18.0.0/24")));
    assert_eq!(v.not_given, ["--proto"]);
    assert!(why(&v, &Judge::Rule(dns)).contains("--proto"), "{v:?}");
    let mut p = probe("198.18.0.7");
    p.proto = Some(PROTO_UDP);
    p.dport = Some(53);
    let v = explain(&set, &p).unwrap();
    assert_eq!(v.judge, Judge::Rule(dns), "the more specific match first");
    assert!(
        why(&v, &Judge::Rule(sel("198.18.0.0/24"))).contains("more specific match"),
        "{v:?}"
    );
    p.proto = Some(PROTO_TCP);
    assert_eq!(
        explain(&set, &p).unwrap().judge,
        Judge::Rule(sel("198.18.0.0/24"))
    );
}

#[test]
fn a_syn_rule_takes_only_syns() {
    let mut set = RuleSet::default();
    let syn = sel("0.0.0.0/0 tcp syn");
    set.rules.insert(syn, limit(20));
    let mut p = probe("198.18.3.3");
    p.proto = Some(PROTO_TCP);
    assert_eq!(explain(&set, &p).unwrap().judge, Judge::Default);
    p.syn = true;
    assert_eq!(explain(&set, &p).unwrap().judge, Judge::Rule(syn));
}

#[test]
fn lists_rules_and_allow_lists_in_their_order() {
    let mut set = RuleSet::default();
    let list = |action, cidrs: &[&str]| List {
        action,
        source: "t".into(),
        entries: cidrs.iter().map(|c| sel(c).source).collect(),
        counted: false,
    };
    set.lists.insert(
        "bad".into(),
        list(ListAction::Deny, &["198.18.4.0/24", "198.18.5.0/24"]),
    );
    set.lists.insert(
        "friends".into(),
        list(ListAction::Allow, &["198.18.5.7/32"]),
    );
    set.rules.insert(sel("198.18.4.9/32"), Action::Allow);
    let bad4 = Judge::List("bad".into(), ListAction::Deny, sel("198.18.4.0/24").source);
    let v = explain(&set, &probe("198.18.4.1")).unwrap();
    assert_eq!(v.judge, bad4);
    assert_eq!(v.action, Action::Deny { dry_run: false });
    // A rule at a longer prefix beats the list.
    let v = explain(&set, &probe("198.18.4.9")).unwrap();
    assert_eq!(v.judge, Judge::Rule(sel("198.18.4.9/32")));
    assert!(why(&v, &bad4).contains("longer prefix"), "{v:?}");
    // An allow list entry inside a deny list entry.
    let v = explain(&set, &probe("198.18.5.7")).unwrap();
    assert_eq!(
        v.judge,
        Judge::List(
            "friends".into(),
            ListAction::Allow,
            sel("198.18.5.7/32").source
        )
    );
}

#[test]
fn allowlist_only_mode_drops_what_is_not_allowed() {
    let mut set = RuleSet::default();
    set.rules.insert(sel("198.18.6.0/24"), Action::Allow);
    set.mode = Mode::AllowlistOnly;
    assert_eq!(
        explain(&set, &probe("198.18.6.1")).unwrap().action,
        Action::Allow
    );
    let v = explain(&set, &probe("198.18.7.1")).unwrap();
    assert_eq!(v.judge, Judge::Default);
    assert_eq!(v.action, Action::Deny { dry_run: false });
}

#[test]
fn ipv6_sources_meet_ipv6_rules_only() {
    let mut set = RuleSet::default();
    set.rules.insert(sel("::/0"), limit(5));
    set.rules.insert(sel("2001:db8::/32"), limit(7));
    assert_eq!(
        explain(&set, &probe("2001:db8::1")).unwrap().judge,
        Judge::Rule(sel("2001:db8::/32"))
    );
    assert_eq!(
        explain(&set, &probe("198.18.0.1")).unwrap().judge,
        Judge::Default,
        "::/0 never covers an IPv4 source"
    );
}

/// CrowdSec's lists point at rules of their own (their drops counted per
/// origin): explain names the origin's list.
#[test]
fn a_counted_list_is_named_by_its_origin() {
    let mut set = RuleSet::default();
    set.lists.insert(
        "crowdsec:cscli".into(),
        List {
            action: ListAction::Deny,
            source: "crowdsec".into(),
            entries: vec![sel("198.18.8.0/24").source].into(),
            counted: true,
        },
    );
    set.lists.insert(
        "bad".into(),
        List {
            action: ListAction::Deny,
            source: "t".into(),
            entries: vec![sel("198.18.9.0/24").source].into(),
            counted: false,
        },
    );
    assert_eq!(
        explain(&set, &probe("198.18.8.1")).unwrap().judge,
        Judge::List(
            "crowdsec:cscli".into(),
            ListAction::Deny,
            sel("198.18.8.0/24").source
        )
    );
    assert_eq!(
        explain(&set, &probe("198.18.9.1")).unwrap().judge,
        Judge::List("bad".into(), ListAction::Deny, sel("198.18.9.0/24").source)
    );
}
