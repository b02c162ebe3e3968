//! The kernel tier: everything that asks the kernel itself, in one test
//! binary that `cargo xtask vm` (and `cargo xtask test`, on Debian 12's 6.1
//! and the newest sid kernel) also runs inside a VM per kernel. The real XDP
//! object under BPF_PROG_TEST_RUN (verdicts and counters for crafted frames,
//! keys, rules, dry run, every algorithm, the flood path, exactness across
//! two CPUs), the verifier's figures against the budget in
//! `tests/kernels.txt`, and a daemon attached to a veth pair.
//!
//! The tests share one loaded object ([`Loaded::new`] empties its maps
//! between them): under emulation a load takes up to a minute.
//!
//! Its tests by subject beside this file, the frames and checks they share here.

mod actions;
mod algorithms;
mod budget;
mod fleet;
mod flood;
mod fragments;
mod host_connections;
mod limits;
mod matches;
mod object;
mod parse;
mod table;
mod top;
mod veth;

use std::net::IpAddr;

use ratelimit_common::{Event, Reason};
use ratelimit_tests::{frames::Udp, testrun::Loaded};
use ratelimit_user::{
    model::rate::parse_rate,
    model::rules::{Action, Limit, RuleSet, Selector, default_limit},
};

fn addr(s: &str) -> IpAddr {
    s.parse().expect("address")
}

fn limit(rate: &str, burst: u64) -> Limit {
    Limit {
        rate: parse_rate("rate", rate).expect("rate"),
        burst,
        ..default_limit()
    }
}

fn rules(default: Limit) -> RuleSet {
    RuleSet {
        default: Action::Limit(default),
        ..RuleSet::default()
    }
}

fn v4(src: &str) -> Udp {
    Udp::new(addr(src), addr("198.18.0.2"))
}

fn v6(src: &str) -> Udp {
    Udp::new(addr(src), addr("2001:db8::2"))
}

/// Runs `frame` once and checks the verdict and that exactly one frame was
/// counted, under `reason`.
fn expect(l: &Loaded, what: &str, frame: &[u8], verdict: u32, reason: Reason) {
    let before = l.counters();
    let got = l.verdict(frame);
    let after = l.counters();
    assert_eq!(got, verdict, "{what}: verdict {got}, expected {verdict}");
    for r in Reason::ALL {
        let d = after[r as usize].packets - before[r as usize].packets;
        let want = u64::from(r == reason);
        assert_eq!(
            d,
            want,
            "{what}: counter {} moved by {d}, expected {want}",
            r.name()
        );
    }
    let bytes = after[reason as usize].bytes - before[reason as usize].bytes;
    assert_eq!(bytes, frame.len() as u64, "{what}: bytes counted");
}

/// A rule set of `(selector, action)` on a default limit of 1000/s.
fn matching(rules_: &[(&str, Action)]) -> RuleSet {
    let mut set = rules(limit("1000/s", 1000));
    for (s, a) in rules_ {
        set.rules
            .insert(Selector::parse("cidr", s).expect("selector"), *a);
    }
    set
}

const DENY: Action = Action::Deny { dry_run: false };
/// Told apart from DENY by its counter (`would_drop`).
const DRY_DENY: Action = Action::Deny { dry_run: true };

/// `expect`, and that the unjudged-frame event moved by `unjudged`.
fn expect_unjudged(
    l: &Loaded,
    what: &str,
    frame: &[u8],
    verdict: u32,
    reason: Reason,
    unjudged: u64,
) {
    let before = l.maps.events().expect("events")[Event::Unjudged as usize];
    expect(l, what, frame, verdict, reason);
    let after = l.maps.events().expect("events")[Event::Unjudged as usize];
    assert_eq!(after - before, unjudged, "{what}: unjudged frames counted");
}
