//! The real XDP object under BPF_PROG_TEST_RUN: verdicts and counters for crafted
//! frames, keys, rules, dry run, and exactness across two CPUs.
//!
//! One test binary (cargo links one per file directly in `tests/`): its tests
//! by subject in `prog_test_run/`, the frames and checks they share here. A test
//! root looks for its modules beside itself, hence the `#[path]`s.

#[path = "prog_test_run/actions.rs"]
mod actions;
#[path = "prog_test_run/fleet.rs"]
mod fleet;
#[path = "prog_test_run/fragments.rs"]
mod fragments;
#[path = "prog_test_run/host_connections.rs"]
mod host_connections;
#[path = "prog_test_run/limits.rs"]
mod limits;
#[path = "prog_test_run/matches.rs"]
mod matches;
#[path = "prog_test_run/object.rs"]
mod object;
#[path = "prog_test_run/parse.rs"]
mod parse;

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
