//! Which rule a frame meets: address families apart, TCP flags, ports and
//! ranges, ICMP types, destinations, a prefix's rules falling through to the
//! prefix around, ports behind IPv6 extension headers.

use ratelimit_common::Reason;
use ratelimit_tests::{
    frames::{Udp, tcp},
    privileged,
    testrun::{Loaded, XDP_DROP, XDP_PASS},
};
use ratelimit_user::model::rules::{Action, Fragments, Mode, Selector, Unjudged};

use super::{DENY, DRY_DENY, addr, expect, expect_unjudged, limit, matching, rules, v4, v6};

/// An IPv6 rule never matches an IPv4 source, however short its prefix: `::/0`
/// and `0.0.0.0/0` are two rules, one per family.
#[test]
fn ipv6_rules_never_match_ipv4_sources() {
    privileged!("ipv6_rules_never_match_ipv4_sources");
    let p = |s| Selector::parse("cidr", s).expect("prefix");
    let mut set = rules(limit("1000/s", 1000));
    set.rules.insert(p("::/0"), Action::Deny { dry_run: false });
    set.rules.insert(p("198.18.60.0/24"), Action::Allow);
    let l = Loaded::new(&set);
    expect(
        &l,
        "IPv4 under ::/0",
        &v4("198.18.61.1").build(),
        XDP_PASS,
        Reason::NewSource,
    );
    expect(
        &l,
        "IPv4 allowed",
        &v4("198.18.60.1").build(),
        XDP_PASS,
        Reason::Allowed,
    );
    expect(
        &l,
        "IPv6 under ::/0",
        &v6("2001:db8:1::1").build(),
        XDP_DROP,
        Reason::Denied,
    );
    let mut set = rules(limit("1000/s", 1000));
    set.rules
        .insert(p("0.0.0.0/0"), Action::Deny { dry_run: false });
    set.rules.insert(p("::/0"), Action::Allow);
    let l = Loaded::new(&set);
    expect(
        &l,
        "IPv4 under 0.0.0.0/0",
        &v4("198.18.61.1").build(),
        XDP_DROP,
        Reason::Denied,
    );
    expect(
        &l,
        "IPv6 under ::/0",
        &v6("2001:db8:1::1").build(),
        XDP_PASS,
        Reason::Allowed,
    );
}

/// TCP flags: a SYN rule takes SYNs only; its read-back is the rule written.
#[test]
fn rules_match_tcp_syn_and_fragments_follow_the_policy() {
    privileged!("rules_match_tcp_syn_and_fragments_follow_the_policy");
    let mut set = matching(&[
        ("198.18.0.0/15", Action::Allow),
        ("198.18.0.0/15 tcp syn", DENY),
    ]);
    let l = Loaded::new(&set);
    assert_eq!(l.maps.rule_set().expect("read back").rules, set.rules);
    let tcp_ = |flags| Udp {
        tcp: Some(flags),
        ..v4("198.18.1.1")
    };
    expect(&l, "SYN", &tcp_(tcp::SYN).build(), XDP_DROP, Reason::Denied);
    for (what, flags) in [
        ("SYN-ACK", tcp::SYN | tcp::ACK),
        ("ACK", tcp::ACK),
        ("PSH-ACK", tcp::PSH | tcp::ACK),
    ] {
        expect(&l, what, &tcp_(flags).build(), XDP_PASS, Reason::Allowed);
    }
    expect(
        &l,
        "UDP",
        &v4("198.18.1.1").build(),
        XDP_PASS,
        Reason::Allowed,
    );
    // A non-first fragment of TCP shows no flags: next rule by default.
    let tcp_fragment = Udp {
        ipv4_frag_offset: 100,
        ..tcp_(tcp::SYN)
    };
    let udp_fragment = Udp {
        ipv4_frag_offset: 100,
        ..v4("198.18.1.1")
    };
    expect_unjudged(
        &l,
        "TCP fragment, next-rule",
        &tcp_fragment.build(),
        XDP_PASS,
        Reason::Allowed,
        1,
    );
    // A UDP fragment is no TCP: judged, not counted.
    expect_unjudged(
        &l,
        "UDP fragment",
        &udp_fragment.build(),
        XDP_PASS,
        Reason::Allowed,
        0,
    );

    set.fragments = Fragments::Drop;
    let l = Loaded::new(&set);
    assert_eq!(
        l.maps.rule_set().expect("read back").fragments,
        Fragments::Drop
    );
    expect_unjudged(
        &l,
        "TCP fragment, drop",
        &tcp_fragment.build(),
        XDP_DROP,
        Reason::Denied,
        1,
    );
    expect_unjudged(
        &l,
        "UDP fragment, drop",
        &udp_fragment.build(),
        XDP_PASS,
        Reason::Allowed,
        0,
    );
    expect(
        &l,
        "SYN, drop",
        &tcp_(tcp::SYN).build(),
        XDP_DROP,
        Reason::Denied,
    );

    // `unjudged = pass`: under a deny-all source rule, a SYN whose flags are
    // cut off (a tiny first fragment) passes its match.
    let mut set = matching(&[("198.18.0.0/15", DENY), ("198.18.0.0/15 tcp syn", DRY_DENY)]);
    set.unjudged = Unjudged::Pass;
    let l = Loaded::new(&set);
    let [tiny, _] = tcp_(tcp::SYN).fragments(8);
    expect_unjudged(&l, "tiny SYN, pass", &tiny, XDP_PASS, Reason::Allowed, 1);
    expect(
        &l,
        "SYN, pass",
        &tcp_(tcp::SYN).build(),
        XDP_PASS,
        Reason::WouldDrop,
    );
    expect(
        &l,
        "ACK, pass",
        &tcp_(tcp::ACK).build(),
        XDP_DROP,
        Reason::Denied,
    );
    // In allowlist-only mode, `pass` is `next-rule`: not allowed.
    set.mode = Mode::AllowlistOnly;
    let l = Loaded::new(&set);
    expect_unjudged(
        &l,
        "tiny SYN, allowlist-only",
        &tiny,
        XDP_DROP,
        Reason::NotAllowed,
        1,
    );
}

/// Port sets: `dport 22,80,443,8000-8100` takes each of its ports and ranges
/// and nothing between; the largest set (16 ranges) takes its last range; a
/// narrower set beats a wider one; IPv6 alike; the read-back is the set.
#[test]
fn rules_match_port_sets() {
    privileged!("rules_match_port_sets");
    let largest: Vec<String> = (0..16).map(|i| (1000 + 10 * i).to_string()).collect();
    let largest = format!("198.18.0.0/15 udp dport {}", largest.join(","));
    let set = matching(&[
        ("198.18.0.0/15", Action::Allow),
        ("198.18.0.0/15 tcp dport 22,80,443,8000-8100", DENY),
        ("198.18.0.0/15 tcp dport 80,81", DRY_DENY),
        (&largest, DENY),
        ("2001:db8::/32", Action::Allow),
        ("2001:db8::/32 udp dport 53,123,5000-5010", DENY),
    ]);
    let l = Loaded::new(&set);
    assert_eq!(l.maps.rule_set().expect("read back").rules, set.rules);
    let tcp_to = |port| Udp {
        dport: port,
        tcp: Some(tcp::SYN),
        ..v4("198.18.2.1")
    };
    for port in [22, 443, 8000, 8050, 8100] {
        expect(
            &l,
            "in the set",
            &tcp_to(port).build(),
            XDP_DROP,
            Reason::Denied,
        );
    }
    // 80 and 81 are in both sets: the narrower (two ports) judges them.
    for port in [80, 81] {
        expect(
            &l,
            "in both sets",
            &tcp_to(port).build(),
            XDP_PASS,
            Reason::WouldDrop,
        );
    }
    for port in [21, 23, 79, 82, 442, 444, 7999, 8101] {
        expect(
            &l,
            "between the set's ports",
            &tcp_to(port).build(),
            XDP_PASS,
            Reason::Allowed,
        );
    }
    let udp_to = |port, src| Udp {
        dport: port,
        ..v4(src)
    };
    for port in [1000, 1070, 1150] {
        expect(
            &l,
            "the largest set",
            &udp_to(port, "198.18.2.2").build(),
            XDP_DROP,
            Reason::Denied,
        );
    }
    for port in [999, 1001, 1151, 22] {
        expect(
            &l,
            "outside the largest set",
            &udp_to(port, "198.18.2.2").build(),
            XDP_PASS,
            Reason::Allowed,
        );
    }
    let udp6 = |port| Udp {
        dport: port,
        ..v6("2001:db8:5::1")
    };
    for port in [53, 123, 5000, 5010] {
        expect(
            &l,
            "IPv6 set",
            &udp6(port).build(),
            XDP_DROP,
            Reason::Denied,
        );
    }
    for port in [52, 124, 4999, 5011] {
        expect(
            &l,
            "IPv6 outside the set",
            &udp6(port).build(),
            XDP_PASS,
            Reason::Allowed,
        );
    }
}

/// Ports and ranges, ICMP types, and a prefix's rules tried most specific
/// first.
#[test]
fn rules_match_ports_and_icmp_types() {
    privileged!("rules_match_ports_and_icmp_types");
    let set = matching(&[
        ("198.18.0.0/15", Action::Allow),
        ("198.18.0.0/15 udp dport 53", DENY),
        ("198.18.0.0/15 udp dport 27015-27020", DRY_DENY),
        ("198.18.0.0/15 udp", Action::Limit(limit("1000/s", 1000))),
        ("198.18.0.0/15 icmp type 8", DENY),
        ("2001:db8::/32", Action::Allow),
        ("2001:db8::/32 icmpv6 type 128", DENY),
    ]);
    let l = Loaded::new(&set);
    assert_eq!(l.maps.rule_set().expect("read back").rules, set.rules);
    let udp = |port| Udp {
        dport: port,
        ..v4("198.18.2.1")
    };
    expect(&l, "udp 53", &udp(53).build(), XDP_DROP, Reason::Denied);
    for port in [27015, 27018, 27020] {
        expect(
            &l,
            "in the range",
            &udp(port).build(),
            XDP_PASS,
            Reason::WouldDrop,
        );
    }
    // Other UDP ports: the `udp` rule, not the plain one (a source's first
    // frame under a limit is a new source's).
    for (i, port) in [52, 54, 27014, 27021].into_iter().enumerate() {
        expect(
            &l,
            "udp, out of range",
            &Udp {
                dport: port,
                ..v4(&format!("198.18.3.{i}"))
            }
            .build(),
            XDP_PASS,
            Reason::NewSource,
        );
    }
    let tcp53 = Udp {
        tcp: Some(tcp::SYN),
        ..udp(53)
    };
    expect(&l, "tcp 53", &tcp53.build(), XDP_PASS, Reason::Allowed);
    let icmp = |kind| Udp {
        icmp: Some(kind),
        ..v4("198.18.2.1")
    };
    expect(
        &l,
        "echo request",
        &icmp(8).build(),
        XDP_DROP,
        Reason::Denied,
    );
    expect(
        &l,
        "echo reply",
        &icmp(0).build(),
        XDP_PASS,
        Reason::Allowed,
    );
    let icmp6 = |kind| Udp {
        icmp: Some(kind),
        ..v6("2001:db8:5::1")
    };
    expect(
        &l,
        "ICMPv6 echo request",
        &icmp6(128).build(),
        XDP_DROP,
        Reason::Denied,
    );
    expect(
        &l,
        "ICMPv6 echo reply",
        &icmp6(129).build(),
        XDP_PASS,
        Reason::Allowed,
    );
    expect(
        &l,
        "IPv6 UDP 53",
        &Udp {
            dport: 53,
            ..v6("2001:db8:5::1")
        }
        .build(),
        XDP_PASS,
        Reason::Allowed,
    );
}

/// Destinations; a prefix whose rules all have matches hands the rest of
/// its frames to the prefix around it, and in the end to the default rule.
#[test]
fn rules_match_destinations_and_fall_through_to_the_prefix_around() {
    privileged!("rules_match_destinations_and_fall_through_to_the_prefix_around");
    let set = matching(&[
        ("0.0.0.0/0 to 198.18.0.99", DENY),
        ("198.18.5.0/24", Action::Allow),
        ("198.19.0.0/16 tcp syn", DENY),
        ("198.19.0.0/16", DRY_DENY),
        ("198.19.5.0/24 udp dport 53", Action::Allow),
        ("2001:db8::/32 to 2001:db8:1::/48", DENY),
    ]);
    let l = Loaded::new(&set);
    assert_eq!(l.maps.rule_set().expect("read back").rules, set.rules);
    let to = |src: &str, dst: &str| Udp::new(addr(src), addr(dst));
    expect(
        &l,
        "to .99",
        &to("198.18.7.1", "198.18.0.99").build(),
        XDP_DROP,
        Reason::Denied,
    );
    expect(
        &l,
        "to .2: default rule",
        &to("198.18.7.1", "198.18.0.2").build(),
        XDP_PASS,
        Reason::NewSource,
    );
    // A longer source prefix wins over the destination rule.
    expect(
        &l,
        "from the allowed /24",
        &to("198.18.5.1", "198.18.0.99").build(),
        XDP_PASS,
        Reason::Allowed,
    );
    let from_5 = |flags: Option<u8>, port| Udp {
        tcp: flags,
        dport: port,
        ..v4("198.19.5.1")
    };
    expect(
        &l,
        "udp 53 in the /24",
        &from_5(None, 53).build(),
        XDP_PASS,
        Reason::Allowed,
    );
    expect(
        &l,
        "SYN in the /24: the /16's syn rule",
        &from_5(Some(tcp::SYN), 80).build(),
        XDP_DROP,
        Reason::Denied,
    );
    expect(
        &l,
        "udp 54 in the /24: the /16's rule",
        &from_5(None, 54).build(),
        XDP_PASS,
        Reason::WouldDrop,
    );
    expect(
        &l,
        "IPv6 to the /48",
        &to("2001:db8:9::1", "2001:db8:1::5").build(),
        XDP_DROP,
        Reason::Denied,
    );
    expect(
        &l,
        "IPv6 elsewhere",
        &to("2001:db8:9::1", "2001:db8:2::5").build(),
        XDP_PASS,
        Reason::NewSource,
    );
}

/// Ports behind IPv6 extension headers; a chain longer than the bound and a
/// non-first fragment cannot be judged.
#[test]
fn rules_find_ports_behind_ipv6_extension_headers() {
    privileged!("rules_find_ports_behind_ipv6_extension_headers");
    let set = matching(&[
        ("2001:db8::/32", Action::Allow),
        ("2001:db8::/32 tcp dport 80 syn", DENY),
    ]);
    let l = Loaded::new(&set);
    let syn = |ext: Vec<(u8, u16)>| Udp {
        tcp: Some(tcp::SYN),
        dport: 80,
        ipv6_ext: ext,
        ..v6("2001:db8:5::1")
    };
    expect(&l, "plain", &syn(vec![]).build(), XDP_DROP, Reason::Denied);
    for (what, ext) in [
        ("hop-by-hop", vec![(0, 0)]),
        ("routing", vec![(43, 0)]),
        ("destination options", vec![(60, 0)]),
        ("an atomic fragment (offset 0, no more)", vec![(44, 0)]),
        (
            "hop-by-hop, routing, fragment, destination options",
            vec![(0, 0), (43, 0), (44, 0), (60, 0)],
        ),
        ("six headers", chain(6)),
        ("seven headers", chain(7)),
        ("eight headers (the bound)", chain(8)),
    ] {
        expect_unjudged(&l, what, &syn(ext).build(), XDP_DROP, Reason::Denied, 0);
    }
    expect_unjudged(
        &l,
        "non-first fragment",
        &syn(vec![(44, 100)]).build(),
        XDP_PASS,
        Reason::Allowed,
        1,
    );
    // Past the bound: unjudged, dropped by default whatever the rules.
    expect_unjudged(
        &l,
        "nine headers",
        &syn(chain(9)).build(),
        XDP_DROP,
        Reason::Unjudged,
        1,
    );
    let mut ten_udp = v6("2001:db8:5::1");
    ten_udp.ipv6_ext = chain(10);
    expect_unjudged(
        &l,
        "ten headers, UDP",
        &ten_udp.build(),
        XDP_DROP,
        Reason::Unjudged,
        1,
    );

    // The policy set the other way: `next-rule` skips the rule that needs the
    // transport header (the source's allow judges); `pass` passes.
    for (policy, reason) in [
        (Unjudged::NextRule, Reason::Allowed),
        (Unjudged::Pass, Reason::Allowed),
    ] {
        let mut set = set.clone();
        set.unjudged = policy;
        let l = Loaded::new(&set);
        expect_unjudged(
            &l,
            &format!("nine headers, {policy:?}"),
            &syn(chain(9)).build(),
            XDP_PASS,
            reason,
            1,
        );
        expect_unjudged(
            &l,
            &format!("eight headers, {policy:?}"),
            &syn(chain(8)).build(),
            XDP_DROP,
            Reason::Denied,
            0,
        );
    }
}

/// A chain of `n` IPv6 extension headers (hop-by-hop first, then routing and
/// destination options headers), none a fragment header.
fn chain(n: usize) -> Vec<(u8, u16)> {
    (0..n)
        .map(|i| match i {
            0 => (0, 0),
            i if i % 2 == 1 => (60, 0),
            _ => (43, 0),
        })
        .collect()
}
