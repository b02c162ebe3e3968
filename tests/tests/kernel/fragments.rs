//! Fragments that hide or rewrite the TCP flags (RFC 1858's tiny and
//! overlapping fragments), IPv4 and IPv6, under each policy.

use ratelimit_common::Reason;
use ratelimit_tests::{
    frames::{Udp, padded, tcp},
    privileged,
    testrun::{Loaded, XDP_DROP, XDP_PASS},
};
use ratelimit_user::model::rules::{Fragments, Unjudged};

use super::{DENY, addr, expect, expect_unjudged, matching, v4};

/// A SYN in fragments: a first fragment too short for the TCP flags (8 or 16
/// bytes of TCP: RFC 1858's tiny fragment) is dropped by default
/// (`tiny_fragment`), padded to Ethernet's 60 bytes or not, against `--syn`
/// and `--dport` deny rules alike; so is a TCP fragment at offset 8 bytes
/// (the one that could rewrite the flags); a first fragment with the whole
/// header is judged by its rules; the non-first fragments of a source go to
/// its next rule (or are dropped under `fragments = drop`). The same for
/// IPv6. With `unjudged = next-rule` the tiny SYN is judged by the rule after
/// the `--syn` rule, which is how it walked past before.
#[test]
fn tiny_and_overlapping_fragments_are_dropped_by_default() {
    privileged!("tiny_and_overlapping_fragments_are_dropped_by_default");
    let mut set = matching(&[
        ("198.18.77.0/24 tcp syn", DENY),
        ("198.18.78.0/24 tcp dport 8080", DENY),
        ("2001:db8:77::/48 tcp syn", DENY),
    ]);
    let l = Loaded::new(&set);
    let syn = |src: &str, dport: u16| Udp {
        tcp: Some(tcp::SYN),
        dport,
        ..Udp::new(
            addr(src),
            addr(if src.contains(':') {
                "2001:db8::2"
            } else {
                "198.18.0.2"
            }),
        )
    };
    for (what, f) in [
        ("IPv4 SYN, --syn", syn("198.18.77.5", 80)),
        ("IPv4 SYN, --dport", syn("198.18.78.5", 8080)),
        ("IPv6 SYN, --syn", syn("2001:db8:77::5", 80)),
    ] {
        expect(
            &l,
            &format!("{what}, whole"),
            &f.build(),
            XDP_DROP,
            Reason::Denied,
        );
        for cut in [8, 16] {
            let [first, second] = f.fragments(cut);
            expect_unjudged(
                &l,
                &format!("{what}, first fragment of {cut} TCP bytes"),
                &first,
                XDP_DROP,
                Reason::TinyFragment,
                1,
            );
            expect_unjudged(
                &l,
                &format!("{what}, first fragment of {cut} TCP bytes, padded"),
                &padded(first),
                XDP_DROP,
                Reason::TinyFragment,
                1,
            );
            if cut == 8 {
                // The second fragment sits at offset 8: RFC 1858's overlap.
                expect_unjudged(
                    &l,
                    &format!("{what}, TCP fragment at offset 8"),
                    &second,
                    XDP_DROP,
                    Reason::TinyFragment,
                    1,
                );
            } else {
                // A non-first fragment: the next rule (the default) judges it.
                expect_unjudged(
                    &l,
                    &format!("{what}, second fragment"),
                    &second,
                    XDP_PASS,
                    Reason::NewSource,
                    1,
                );
            }
        }
    }
    // A first fragment with the whole TCP header is judged by its rules.
    let [first, _] = Udp {
        tcp_payload: 40,
        ..syn("198.18.77.6", 80)
    }
    .fragments(24);
    expect_unjudged(
        &l,
        "IPv4 SYN, first fragment with the whole header",
        &first,
        XDP_DROP,
        Reason::Denied,
        0,
    );
    // UDP's first fragment always holds its ports (8 bytes at least): judged.
    let udp = v4("198.18.78.9");
    let [first, _] = Udp { payload: 40, ..udp }.fragments(8);
    expect_unjudged(
        &l,
        "UDP first fragment",
        &first,
        XDP_PASS,
        Reason::NewSource,
        0,
    );

    // `fragments = drop`: the second fragment is dropped as denied.
    set.fragments = Fragments::Drop;
    let l = Loaded::new(&set);
    let [_, second] = syn("198.18.77.5", 80).fragments(16);
    expect_unjudged(
        &l,
        "second fragment, fragments = drop",
        &second,
        XDP_DROP,
        Reason::Denied,
        1,
    );

    // The policy set the other way: under `next-rule` the tiny SYN goes to
    // the default rule and passes; under `pass`, it passes.
    for policy in [Unjudged::NextRule, Unjudged::Pass] {
        set.unjudged = policy;
        set.fragments = Fragments::NextRule;
        let l = Loaded::new(&set);
        let [first, _] = syn("198.18.77.7", 80).fragments(8);
        let reason = if policy == Unjudged::Pass {
            Reason::Allowed
        } else {
            Reason::NewSource
        };
        expect_unjudged(
            &l,
            &format!("tiny SYN, {policy:?}"),
            &first,
            XDP_PASS,
            reason,
            1,
        );
    }
}
