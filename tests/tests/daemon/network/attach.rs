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

/// On a kernel without the network namespace's cookie (before 5.14; the
/// test switches the probe off), the daemon starts all the same: it names
/// what is missing and the kernel that has it in its start message and in
/// `status`, and enforces exactly as with the cookie.
#[test]
fn a_kernel_without_the_netns_cookie_is_named_and_still_enforced() {
    privileged!("a_kernel_without_the_netns_cookie_is_named_and_still_enforced");
    // The daemon and every CLI call after it, as on such a kernel; the
    // privileged tests run one at a time, so the process's environment is
    // this test's.
    let _without = WithoutCookie::set();
    let h = ratelimit_tests::fixture::Host::bare("nocookie");
    let cmd = h.daemon_command(&["--rate", "1/h", "--burst", "10"]);
    let d = ratelimit_tests::Daemon::spawn(cmd, &h.pair.rx, &h.pair.rx_if, h.run_dir());
    let said = "lacks the network namespace's cookie (SO_NETNS_COOKIE) (Linux 5.14)";
    assert!(
        d.output().contains(said),
        "the start message does not name the missing feature: {}",
        d.output()
    );
    let status = d.json(&["status"]);
    assert!(
        status["notes"].to_string().contains(said),
        "status does not name the missing feature: {status}"
    );
    // Named after the namespace's inode, never a cookie's directory.
    let pins = status["pins"].as_str().expect("status names the pins");
    assert!(pins.contains("/ns"), "pins at {pins}");
    let got = h
        .pair
        .probe_sent(&[ip("198.18.0.1")], 100, Duration::from_millis(500));
    assert!(got[0].0 > 10, "sent only {} frames", got[0].0);
    assert_eq!(
        got[0].1, 10,
        "a burst of 10 let {} of {} through",
        got[0].1, got[0].0
    );
    assert!(
        d.stop(libc::SIGINT).success(),
        "the daemon's exit on SIGINT"
    );
    assert!(!h.pair.rx_has_xdp(), "still attached after SIGINT");
}

/// `RATELIMIT_TEST_WITHOUT=netns-cookie` for the test's processes, removed
/// again even when the test fails.
struct WithoutCookie;

impl WithoutCookie {
    fn set() -> Self {
        // SAFETY: the privileged tests run one at a time (--test-threads=1):
        // no other thread reads the environment meanwhile.
        unsafe { std::env::set_var(ratelimit_user::host::kernel::TEST_WITHOUT, "netns-cookie") };
        Self
    }
}

impl Drop for WithoutCookie {
    fn drop(&mut self) {
        // SAFETY: as in `set`.
        unsafe { std::env::remove_var(ratelimit_user::host::kernel::TEST_WITHOUT) };
    }
}
