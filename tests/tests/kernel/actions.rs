//! What a rule does with the frames it matches: allow, deny and limit, each
//! with its dry run; the global dry run; allowlist-only mode and back.

use ratelimit_common::Reason;
use ratelimit_tests::{
    privileged,
    testrun::{Loaded, XDP_DROP, XDP_PASS},
};
use ratelimit_user::model::rules::{Action, Limit, Mode, Selector};

use super::{expect, limit, rules, v4, v6};

#[test]
fn allow_deny_and_dry_run_rules() {
    privileged!("allow_deny_and_dry_run_rules");
    let mut set = rules(limit("1/hour", 1));
    let p = |s| Selector::parse("cidr", s).expect("prefix");
    set.rules.insert(p("198.18.10.0/24"), Action::Allow);
    set.rules
        .insert(p("198.18.11.0/24"), Action::Deny { dry_run: false });
    set.rules
        .insert(p("2001:db8:dead::/48"), Action::Deny { dry_run: true });
    set.rules.insert(
        p("198.18.12.0/24"),
        Action::Limit(Limit {
            dry_run: true,
            ..limit("1/hour", 1)
        }),
    );
    // A longer prefix inside an allowed one still applies.
    set.rules
        .insert(p("198.18.10.128/25"), Action::Deny { dry_run: false });
    let l = Loaded::new(&set);
    for i in 0..5 {
        expect(
            &l,
            &format!("allowed #{i}"),
            &v4("198.18.10.1").build(),
            XDP_PASS,
            Reason::Allowed,
        );
        expect(
            &l,
            &format!("denied #{i}"),
            &v4("198.18.11.1").build(),
            XDP_DROP,
            Reason::Denied,
        );
        expect(
            &l,
            &format!("longest match #{i}"),
            &v4("198.18.10.200").build(),
            XDP_DROP,
            Reason::Denied,
        );
        expect(
            &l,
            &format!("deny dry run #{i}"),
            &v6("2001:db8:dead::1").build(),
            XDP_PASS,
            Reason::WouldDrop,
        );
    }
    expect(
        &l,
        "limit dry run, first",
        &v4("198.18.12.1").build(),
        XDP_PASS,
        Reason::NewSource,
    );
    for i in 0..3 {
        expect(
            &l,
            &format!("limit dry run #{i}"),
            &v4("198.18.12.1").build(),
            XDP_PASS,
            Reason::WouldDrop,
        );
    }
    expect(
        &l,
        "default, first",
        &v4("198.18.13.1").build(),
        XDP_PASS,
        Reason::NewSource,
    );
    expect(
        &l,
        "default, over",
        &v4("198.18.13.1").build(),
        XDP_DROP,
        Reason::Limited,
    );
}

#[test]
fn global_dry_run_never_drops() {
    privileged!("global_dry_run_never_drops");
    let mut set = rules(limit("1/hour", 1));
    set.dry_run = true;
    set.rules.insert(
        Selector::parse("c", "198.18.11.0/24").expect("p"),
        Action::Deny { dry_run: false },
    );
    let l = Loaded::new(&set);
    expect(
        &l,
        "first",
        &v4("198.18.1.1").build(),
        XDP_PASS,
        Reason::NewSource,
    );
    expect(
        &l,
        "over",
        &v4("198.18.1.1").build(),
        XDP_PASS,
        Reason::WouldDrop,
    );
    expect(
        &l,
        "denied",
        &v4("198.18.11.1").build(),
        XDP_PASS,
        Reason::WouldDrop,
    );
}

/// Allowlist-only mode: only the allow rules pass; every other rule and the
/// default drop, counted `not_allowed`; the kernel keeps each rule whole, so
/// reading the rules back gives what normal mode enforces, and `mode normal`
/// brings every rule back.
#[test]
fn allowlist_only_mode_drops_all_but_the_allow_rules() {
    privileged!("allowlist_only_mode_drops_all_but_the_allow_rules");
    let mut set = rules(limit("1000/s", 1000));
    let p = |s: &str| Selector::parse("cidr", s).expect("prefix");
    set.rules.insert(p("198.18.5.0/24"), Action::Allow);
    set.rules
        .insert(p("198.18.6.0/24"), Action::Deny { dry_run: false });
    set.rules
        .insert(p("198.18.7.0/24"), Action::Limit(limit("10/s", 10)));
    set.mode = Mode::AllowlistOnly;
    let mut l = Loaded::new(&set);
    let cases = [
        ("allowed /24", "198.18.5.9", XDP_PASS, Reason::Allowed),
        ("denied /24", "198.18.6.1", XDP_DROP, Reason::NotAllowed),
        ("limited /24", "198.18.7.1", XDP_DROP, Reason::NotAllowed),
        ("default rule", "198.18.9.9", XDP_DROP, Reason::NotAllowed),
    ];
    for (what, src, verdict, reason) in cases {
        expect(&l, what, &v4(src).build(), verdict, reason);
    }
    expect(
        &l,
        "IPv6 default",
        &v6("2001:db8::1").build(),
        XDP_DROP,
        Reason::NotAllowed,
    );
    let back = l.maps.rule_set().expect("reading the rules back");
    assert_eq!(back.mode, Mode::AllowlistOnly, "the mode read back");
    assert!(
        back.same_in_kernel(&set),
        "the rules read back in allowlist-only mode are not the rules written: {back:?}"
    );

    set.mode = Mode::Normal;
    l.maps.apply(&set).expect("back to normal");
    expect(
        &l,
        "denied /24, normal",
        &v4("198.18.6.1").build(),
        XDP_DROP,
        Reason::Denied,
    );
    expect(
        &l,
        "limited /24, normal",
        &v4("198.18.7.1").build(),
        XDP_PASS,
        Reason::NewSource,
    );
}
