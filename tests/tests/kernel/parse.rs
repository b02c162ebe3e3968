//! How the program reads a frame: IPv4 with and without options, IPv6, VLAN
//! and QinQ tags to any depth, ARP, frames cut at every header boundary or
//! with lengths that lie, and IPv4-mapped IPv6 sources.

use ratelimit_common::Reason;
use ratelimit_tests::{
    frames::{TPID_8021AD, TPID_8021Q, Udp, arp},
    privileged,
    testrun::{Loaded, XDP_DROP, XDP_PASS},
};
use ratelimit_user::model::rules::{Action, MalformedPolicy, Mode, Unjudged};

use super::{DENY, expect, expect_unjudged, limit, matching, rules, v4, v6};

#[test]
fn crafted_frames_get_the_right_verdict_and_counter() {
    privileged!("crafted_frames_get_the_right_verdict_and_counter");
    let l = Loaded::new(&rules(limit("1/min", 100)));

    expect(
        &l,
        "IPv4 IHL 5",
        &v4("198.18.1.1").build(),
        XDP_PASS,
        Reason::NewSource,
    );
    let mut opts = v4("198.18.1.2");
    opts.ipv4_options = 40;
    expect(
        &l,
        "IPv4 IHL 15",
        &opts.build(),
        XDP_PASS,
        Reason::NewSource,
    );
    expect(
        &l,
        "IPv4 IHL 15 again",
        &opts.build(),
        XDP_PASS,
        Reason::Passed,
    );
    expect(
        &l,
        "IPv6",
        &v6("2001:db8:1::1").build(),
        XDP_PASS,
        Reason::NewSource,
    );
    let mut tagged = v4("198.18.1.3");
    tagged.vlans = vec![(TPID_8021Q, 100)];
    expect(
        &l,
        "one VLAN tag",
        &tagged.build(),
        XDP_PASS,
        Reason::NewSource,
    );
    let mut qinq = v6("2001:db8:2::1");
    qinq.vlans = vec![(TPID_8021AD, 10), (TPID_8021Q, 20)];
    expect(&l, "QinQ", &qinq.build(), XDP_PASS, Reason::NewSource);
    expect(&l, "QinQ again", &qinq.build(), XDP_PASS, Reason::Passed);
    expect(&l, "ARP", &arp(), XDP_PASS, Reason::NotIp);
    let mut three = v4("198.18.1.4");
    three.vlans = vec![(TPID_8021AD, 1), (TPID_8021Q, 2), (TPID_8021Q, 3)];
    expect(
        &l,
        "three VLAN tags",
        &three.build(),
        XDP_PASS,
        Reason::NewSource,
    );

    // IHL below 5.
    let mut f = v4("198.18.1.5").build();
    f[14] = 0x44;
    expect(&l, "IHL 4", &f, XDP_PASS, Reason::Malformed);
    // Total length shorter than the header.
    let mut f = v4("198.18.1.5").build();
    f[16..18].copy_from_slice(&19u16.to_be_bytes());
    expect(&l, "total length < header", &f, XDP_PASS, Reason::Malformed);
    // Total length beyond the frame.
    let mut f = v4("198.18.1.5").build();
    f[16..18].copy_from_slice(&1400u16.to_be_bytes());
    expect(&l, "total length > frame", &f, XDP_PASS, Reason::Malformed);
    // Wrong IP version in an IPv4 EtherType.
    let mut f = v4("198.18.1.5").build();
    f[14] = 0x65;
    expect(
        &l,
        "version 6 under EtherType IPv4",
        &f,
        XDP_PASS,
        Reason::Malformed,
    );
    // IHL 15 with the options cut off.
    let mut f = opts.build();
    f.truncate(14 + 30);
    expect(
        &l,
        "IHL 15 truncated in the options",
        &f,
        XDP_PASS,
        Reason::Malformed,
    );

    // Truncated at every header boundary (XDP test runs need at least 14 bytes).
    let v4f = v4("198.18.1.6").build();
    for cut in [14, 15, 14 + 19] {
        expect(
            &l,
            &format!("IPv4 cut at {cut}"),
            &v4f[..cut],
            XDP_PASS,
            Reason::Malformed,
        );
    }
    let v6f = v6("2001:db8:1::6").build();
    for cut in [14, 14 + 39] {
        expect(
            &l,
            &format!("IPv6 cut at {cut}"),
            &v6f[..cut],
            XDP_PASS,
            Reason::Malformed,
        );
    }
    let qf = qinq.build();
    for cut in [14, 16, 18, 20, 22, 22 + 39] {
        expect(
            &l,
            &format!("QinQ cut at {cut}"),
            &qf[..cut],
            XDP_PASS,
            Reason::Malformed,
        );
    }
}

#[test]
fn malformed_frames_drop_when_the_policy_says_so() {
    privileged!("malformed_frames_drop_when_the_policy_says_so");
    let mut set = rules(limit("1/min", 100));
    set.malformed = MalformedPolicy::Drop;
    let l = Loaded::new(&set);
    let f = v4("198.18.1.1").build();
    expect(&l, "IPv4 cut at 20", &f[..20], XDP_DROP, Reason::Malformed);
    expect(
        &l,
        "ARP under drop-malformed",
        &arp(),
        XDP_PASS,
        Reason::NotIp,
    );
    expect(&l, "IPv4 intact", &f, XDP_PASS, Reason::NewSource);
}

/// Every depth of 802.1Q and 802.1ad tags the kernel strips (VID 0 priority
/// tags and others), around IPv4 and IPv6 from a denied, a limited and a
/// not-allowed source, is judged as the frame inside; past
/// `MAX_VLAN_TAGS` the frame is unjudged and dropped by default, passed
/// only under `unjudged = pass`. Non-IP frames behind tags still pass.
#[test]
fn frames_behind_any_depth_of_vlan_tags_are_judged() {
    privileged!("frames_behind_any_depth_of_vlan_tags_are_judged");
    let mut set = matching(&[
        ("198.18.66.0/24", DENY),
        ("2001:db8:66::/48", DENY),
        ("198.18.77.0/24", Action::Limit(limit("0/s", 10))),
        ("198.18.88.0/24", Action::Allow),
    ]);
    let l = Loaded::new(&set);
    let tags = |n: usize, vid0: bool| -> Vec<(u16, u16)> {
        (0..n)
            .map(|i| {
                let tpid = if i == 0 && n > 1 {
                    TPID_8021AD
                } else {
                    TPID_8021Q
                };
                (tpid, if vid0 { 0 } else { 100 + i as u16 })
            })
            .collect()
    };
    let tagged = |mut f: Udp, n: usize, vid0: bool| {
        f.vlans = tags(n, vid0);
        f.build()
    };
    for n in 0..=ratelimit_common::MAX_VLAN_TAGS {
        for vid0 in [true, false] {
            for (what, f, verdict, reason) in [
                ("denied IPv4", v4("198.18.66.5"), XDP_DROP, Reason::Denied),
                (
                    "denied IPv6",
                    v6("2001:db8:66::5"),
                    XDP_DROP,
                    Reason::Denied,
                ),
                ("limited IPv4", v4("198.18.77.5"), XDP_DROP, Reason::Limited),
                ("allowed IPv4", v4("198.18.88.5"), XDP_PASS, Reason::Allowed),
            ] {
                let what = format!("{what}, {n} tags (VID 0: {vid0})");
                expect(&l, &what, &tagged(f, n, vid0), verdict, reason);
            }
        }
    }
    // A tag chain deeper than the program walks: dropped (there is no source
    // to judge by), counted `unjudged`, whatever the source would have been.
    let deep = ratelimit_common::MAX_VLAN_TAGS + 1;
    for (what, f) in [
        ("allowed IPv4", v4("198.18.88.5")),
        ("IPv6", v6("2001:db8:1::5")),
    ] {
        for n in [deep, deep + 3] {
            expect_unjudged(
                &l,
                &format!("{what}, {n} tags"),
                &tagged(f.clone(), n, true),
                XDP_DROP,
                Reason::Unjudged,
                1,
            );
        }
    }
    // ARP behind tags is no IP: passed.
    let mut arp_tagged = arp();
    for _ in 0..3 {
        arp_tagged.splice(12..12, [0x81, 0x00, 0x00, 0x00]);
    }
    expect(&l, "ARP, three tags", &arp_tagged, XDP_PASS, Reason::NotIp);

    // In allowlist-only mode: judged as not allowed at every depth; past the
    // bound dropped (as unjudged) even under `pass`.
    set.mode = Mode::AllowlistOnly;
    set.unjudged = Unjudged::Pass;
    let l = Loaded::new(&set);
    for n in [0, 3, 8] {
        expect(
            &l,
            &format!("not allowed, {n} tags"),
            &tagged(v4("198.18.99.5"), n, true),
            XDP_DROP,
            Reason::NotAllowed,
        );
    }
    expect_unjudged(
        &l,
        "allowlist-only, pass, nine tags",
        &tagged(v4("198.18.88.5"), deep, true),
        XDP_DROP,
        Reason::Unjudged,
        1,
    );
    // The policy set the other way, in normal mode: passed (counted allowed).
    set.mode = Mode::Normal;
    let l = Loaded::new(&set);
    expect_unjudged(
        &l,
        "pass, nine tags",
        &tagged(v4("198.18.66.5"), deep, true),
        XDP_PASS,
        Reason::Allowed,
        1,
    );
    // `next-rule` has no rule to go to without a source: dropped.
    set.unjudged = Unjudged::NextRule;
    let l = Loaded::new(&set);
    expect_unjudged(
        &l,
        "next-rule, nine tags",
        &tagged(v4("198.18.88.5"), deep, true),
        XDP_DROP,
        Reason::Unjudged,
        1,
    );
}

/// An IPv6 frame from an IPv4-mapped source (::ffff:a.b.c.d) is judged as
/// the IPv4 address it maps: a deny of the IPv4 network drops it, and it
/// shares that address's bucket.
#[test]
fn ipv4_mapped_ipv6_sources_are_judged_as_ipv4() {
    privileged!("ipv4_mapped_ipv6_sources_are_judged_as_ipv4");
    let set = matching(&[
        ("198.18.66.0/24", DENY),
        ("198.18.67.0/24", Action::Limit(limit("1/min", 2))),
    ]);
    let l = Loaded::new(&set);
    expect(
        &l,
        "mapped, denied network",
        &v6("::ffff:198.18.66.5").build(),
        XDP_DROP,
        Reason::Denied,
    );
    // Two of the burst of 2 as IPv4, the third as mapped IPv6: limited.
    expect(
        &l,
        "IPv4 #1",
        &v4("198.18.67.5").build(),
        XDP_PASS,
        Reason::NewSource,
    );
    expect(
        &l,
        "IPv4 #2",
        &v4("198.18.67.5").build(),
        XDP_PASS,
        Reason::Passed,
    );
    expect(
        &l,
        "mapped #3, the same bucket",
        &v6("::ffff:198.18.67.5").build(),
        XDP_DROP,
        Reason::Limited,
    );
    // A mapped source behind a UDP match rule: its ports are read from the
    // IPv6 header's payload.
    let set = matching(&[("198.18.66.0/24 udp dport 9", DENY)]);
    let l = Loaded::new(&set);
    expect(
        &l,
        "mapped, UDP dport 9 denied",
        &v6("::ffff:198.18.66.5").build(),
        XDP_DROP,
        Reason::Denied,
    );
}
