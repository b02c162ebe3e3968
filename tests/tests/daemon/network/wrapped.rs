//! Frames from a denied source however they are wrapped (VLAN tags, an
//! IPv4-mapped source, a SYN in tiny fragments or behind IPv6 extension
//! headers) never reach a socket of the receiving host.

use std::net::IpAddr;

use ratelimit_tests::{
    check::ip,
    fixture::Host,
    frames::{TPID_8021Q, Udp},
    privileged,
};

use super::{PORT, stat};

/// Issue 23, items 1 and 2, through a real receiving host: frames behind up
/// to eight VID-0 tags (which the kernel strips and delivers), from an
/// IPv4-mapped IPv6 source, a SYN split into tiny fragments, a SYN behind a
/// long IPv6 extension header chain. Nothing from a denied source reaches a
/// socket and no split SYN gets a SYN-ACK; the same frames from a source no
/// rule names are delivered and answered (so the kernel would deliver them),
/// and with `--unjudged next-rule` the split SYN gets its SYN-ACK (the hole
/// the default closes).
#[test]
fn nothing_from_a_denied_source_reaches_the_host_however_it_is_wrapped() {
    use ratelimit_tests::{
        frames::{TPID_8021AD, tcp},
        net::{Capture, Delivered, syn_acks_to},
    };
    privileged!("nothing_from_a_denied_source_reaches_the_host_however_it_is_wrapped");
    let (h, d) = Host::with_config(
        "wrapped",
        r#"
[[rule]]
cidr = "198.18.66.0/24"
action = "deny"

[[rule]]
cidr = "2001:db8::66:0/112"
action = "deny"

[[rule]]
cidr = "198.18.77.0/24"
proto = "tcp"
syn = true
action = "deny"

[[rule]]
cidr = "2001:db8::77:0/112"
proto = "tcp"
syn = true
action = "deny"
"#,
        &[],
    );
    let (denied4, denied6, open4, open6) = (
        ip("198.18.66.5"),
        ip("2001:db8::66:5"),
        ip("198.18.99.5"),
        ip("2001:db8::99:5"),
    );
    h.pair.answer(&[]);

    // UDP behind 0 to 8 priority tags (802.1ad outside, 802.1Q inside), and
    // behind 9, which the program does not walk: unjudged, dropped.
    let tagged = |src, n: usize| {
        let mut f = h.pair.udp(src, PORT);
        f.vlans = (0..n)
            .map(|i| {
                (
                    if i == 0 && n > 1 {
                        TPID_8021AD
                    } else {
                        TPID_8021Q
                    },
                    0,
                )
            })
            .collect();
        f.build()
    };
    let depths = [0, 1, 2, 3, 6, 8];
    let mut frames = Vec::new();
    for src in [denied4, denied6, open4, open6] {
        for n in depths {
            frames.push(tagged(src, n));
        }
    }
    let deep = ip("198.18.98.5");
    frames.push(tagged(deep, 9));
    // An IPv6 frame from an IPv4-mapped source is the IPv4 address's.
    let (mapped_denied, mapped_open) = (ip("::ffff:198.18.66.6"), ip("::ffff:198.18.99.6"));
    frames.push(h.pair.udp(mapped_denied, PORT).build());
    frames.push(h.pair.udp(mapped_open, PORT).build());
    let delivered = Delivered::start(&h.pair.rx, PORT);
    h.pair.send_each(&frames);
    let got = delivered.finish();
    let n = |a: IpAddr| got.get(&a).copied().unwrap_or(0);
    assert_eq!(
        (n(open4), n(open6)),
        (depths.len() as u64, depths.len() as u64),
        "frames behind tags from sources no rule names must all be delivered: {got:?}"
    );
    assert_eq!(
        (n(denied4), n(denied6)),
        (0, 0),
        "frames from a denied source reached a socket: {got:?}"
    );
    assert_eq!(
        n(deep),
        0,
        "a frame behind nine tags was delivered: {got:?}"
    );
    assert_eq!(
        (n(ip("198.18.66.6")), n(ip("198.18.99.6"))),
        (0, 1),
        "IPv4-mapped sources: the denied one must not arrive, the other must: {got:?}"
    );
    assert!(
        stat(&d, "unjudged") >= 1,
        "the nine-tag frame was not counted"
    );

    // SYNs to a listening port: whole, split after 8 or 16 bytes of TCP,
    // and over IPv6 behind 7 and 9 destination options headers.
    let syn = |src: IpAddr| Udp {
        tcp: Some(tcp::SYN),
        dport: 8080,
        ..h.pair.udp(src, 8080)
    };
    let chain = |src: IpAddr, n: usize| {
        let mut f = syn(src);
        f.ipv6_ext = vec![(60, 0); n];
        f.build()
    };
    let (syn_whole, syn_8, syn_16, syn_open) = (
        ip("198.18.77.5"),
        ip("198.18.77.6"),
        ip("198.18.77.7"),
        ip("198.18.99.7"),
    );
    let (syn6_7, syn6_9, syn6_open) = (
        ip("2001:db8::77:5"),
        ip("2001:db8::77:6"),
        ip("2001:db8::99:7"),
    );
    h.pair.answer(&[
        syn_whole, syn_8, syn_16, syn_open, syn6_7, syn6_9, syn6_open,
    ]);
    let listeners = listen_in(&h.pair.rx, 8080);
    let split = |src, cut| syn(src).fragments(cut).to_vec();
    let mut frames = vec![syn(syn_whole).build(), syn(syn_open).build()];
    frames.extend(split(syn_8, 8));
    frames.extend(split(syn_16, 16));
    frames.push(chain(syn6_7, 7));
    frames.push(chain(syn6_9, 9));
    frames.push(chain(syn6_open, 7));
    let capture = Capture::start(&h.pair.tx, &h.pair.tx_if);
    h.pair.send_each(&frames);
    let answered = syn_acks_to(&capture.finish());
    for open in [syn_open, syn6_open] {
        assert!(
            answered.contains(&open),
            "no SYN-ACK to {open}, whose SYN no rule names: the receiver does not answer ({answered:?})"
        );
    }
    for closed in [syn_whole, syn_8, syn_16, syn6_7, syn6_9] {
        assert!(
            !answered.contains(&closed),
            "{closed} got a SYN-ACK through a --syn deny: {answered:?}"
        );
    }
    assert!(stat(&d, "tiny_fragment") >= 2, "tiny fragments not counted");

    // The policy set the other way: the split SYN is judged by the rule
    // after the --syn deny (the default rule) and walks past it.
    assert!(d.stop(libc::SIGTERM).success());
    let _d = h.daemon(&["--config", h.config(), "--unjudged", "next-rule"]);
    let capture = Capture::start(&h.pair.tx, &h.pair.tx_if);
    h.pair.send_each(&split(syn_8, 8));
    let answered = syn_acks_to(&capture.finish());
    assert!(
        answered.contains(&syn_8),
        "under --unjudged next-rule the split SYN should get its SYN-ACK (the test's control): {answered:?}"
    );
    drop(listeners);
}

/// TCP listeners on the receiver's two addresses, port `port`, in `ns`; kept
/// while the value lives.
fn listen_in(ns: &ratelimit_tests::net::NetNs, port: u16) -> Vec<std::net::TcpListener> {
    let name = ns.name.clone();
    std::thread::spawn(move || {
        ratelimit_tests::net::enter(&name);
        ["198.18.0.2", "2001:db8::2"]
            .iter()
            .map(|a| std::net::TcpListener::bind((ip(a), port)).expect("listening"))
            .collect()
    })
    .join()
    .expect("listener thread")
}
