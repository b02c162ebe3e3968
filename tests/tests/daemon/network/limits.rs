//! Per-source limits at the receiver: IPv4, IPv6 and a VLAN-tagged source at
//! five times their limit, beside an allowed, a denied and a dry-run source.

use std::{collections::HashMap, net::IpAddr, time::Duration};

use ratelimit_tests::{
    check::{ip, within},
    fixture::Host,
    frames::TPID_8021Q,
    net::Flow,
    privileged,
};

use super::{PORT, expected, stat};

/// Three limited sources (IPv4, IPv6, IPv4 behind a VLAN tag) at 5× their limit,
/// an allowed one, a denied one and a dry-run one, all at once.
#[test]
fn per_source_limits_hold_at_the_receiver() {
    privileged!("per_source_limits_hold_at_the_receiver");
    let (h, d) = Host::with_config(
        "limits",
        r#"
[default]
rate = "200/s"
burst = 20

[[rule]]
cidr = "198.18.0.64/26"
action = "allow"

[[rule]]
cidr = "2001:db8:0:0:dead::/80"
action = "deny"

[[rule]]
cidr = "198.18.0.128/26"
rate = "100/s"
burst = 10
dry-run = true
"#,
        &[],
    );

    let limited_v4 = ip("198.18.0.10");
    let limited_v6 = ip("2001:db8::10");
    let tagged_v4 = ip("198.18.0.11");
    let allowed = ip("198.18.0.65");
    let denied = ip("2001:db8::dead:0:0:1");
    let dry = ip("198.18.0.129");
    let mut tagged = h.pair.udp(tagged_v4, PORT);
    tagged.vlans = vec![(TPID_8021Q, 100)];
    let flows = [
        h.pair.flow(limited_v4, PORT, 1000),
        h.pair.flow(limited_v6, PORT, 1000),
        Flow {
            frame: tagged.build(),
            pps: 1000,
        },
        h.pair.flow(allowed, PORT, 500),
        h.pair.flow(denied, PORT, 500),
        h.pair.flow(dry, PORT, 500),
    ];
    let rx = h.pair.receiver(PORT);
    let sent = h.pair.send(&flows, Duration::from_secs(3));
    let got: HashMap<IpAddr, u64> = rx.finish();
    let count = |a: &IpAddr| got.get(a).copied().unwrap_or(0);

    within(
        "IPv4 source at 5x",
        count(&limited_v4),
        expected(&sent[0], 200.0, 20.0),
        0.02,
    );
    within(
        "IPv6 source at 5x",
        count(&limited_v6),
        expected(&sent[1], 200.0, 20.0),
        0.02,
    );
    within(
        "VLAN-tagged IPv4 source at 5x",
        count(&tagged_v4),
        expected(&sent[2], 200.0, 20.0),
        0.02,
    );
    assert_eq!(
        count(&allowed),
        sent[3].frames,
        "an allowed source lost frames"
    );
    assert_eq!(count(&denied), 0, "a denied source got frames through");
    assert_eq!(count(&dry), sent[5].frames, "a dry-run rule dropped frames");
    let would = stat(&d, "would_drop") as f64;
    let want = sent[5].frames as f64 - expected(&sent[5], 100.0, 10.0);
    within(
        "would-drop count of the dry-run rule",
        would as u64,
        want,
        0.02,
    );
}
