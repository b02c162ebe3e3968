//! The daemon's life on an interface: attached, traffic through, detached on
//! SIGINT with nothing left behind.

use std::time::Duration;

use ratelimit_tests::{check::ip, fixture::Host, privileged};

use super::{PORT, stat};

#[test]
fn daemon_attaches_traffic_arrives_and_sigint_detaches() {
    privileged!("daemon_attaches_traffic_arrives_and_sigint_detaches");
    let (h, d) = Host::start("attach", &["--rate", "10k/s"]);
    assert!(
        h.pair.rx_has_xdp(),
        "no XDP program on {} after start",
        h.pair.rx_if
    );

    let rx = h.pair.receiver(PORT);
    let flows = [h.pair.flow(ip("198.18.0.1"), PORT, 500)];
    let sent = h.pair.send(&flows, Duration::from_millis(500));
    let got = rx.finish();
    assert_eq!(
        got.get(&ip("198.18.0.1")).copied().unwrap_or(0),
        sent[0].frames,
        "traffic within the limit must all arrive"
    );
    // The kernel's own IPv6 chatter (router and neighbour solicitations) passes
    // too. A source's first frame passes as a new source's.
    let passed = stat(&d, "passed") + stat(&d, "new_source");
    assert!(
        (sent[0].frames..sent[0].frames + 20).contains(&passed),
        "passed counter {passed}, sent {}",
        sent[0].frames
    );

    let pins = d.json(&["status"])["pins"]
        .as_str()
        .expect("status names the pins")
        .to_string();
    d.child.signal(libc::SIGINT);
    let out = d.child.wait(Duration::from_secs(10));
    assert!(
        out.status.success(),
        "daemon exit on SIGINT: {:?} {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        !h.pair.rx_has_xdp(),
        "the XDP program is still attached after SIGINT"
    );
    assert!(
        ratelimit_tests::net::pin_dirs(&h.pair.rx_if).is_empty(),
        "pins left behind after SIGINT"
    );
    // Nor the namespace's directory above them, left empty.
    let ns_dir = std::path::Path::new(&pins)
        .parent()
        .expect("a namespace directory");
    assert!(
        !ns_dir.exists(),
        "{} left behind after SIGINT",
        ns_dir.display()
    );
}
