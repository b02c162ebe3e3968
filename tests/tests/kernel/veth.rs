//! The daemon on a veth pair of this kernel, in both attach modes: attached
//! as asked, a per-source limit exact to the frame, a deny rule and a list
//! enforced, and a stop that detaches and unpins. What a new kernel of the
//! matrix must show beyond BPF_PROG_TEST_RUN.

use std::{process::Command, time::Duration};

use ratelimit_tests::{Daemon, check::counter, check::ip, fixture::Host, privileged};

/// The XDP attachment `ip link` shows on the receiving end: `xdp` (native),
/// `xdpgeneric`, or nothing.
fn attachment(h: &Host) -> String {
    let out = Command::new("ip")
        .args(["-n", &h.pair.rx.name, "-d", "link", "show", &h.pair.rx_if])
        .output()
        .expect("ip link show");
    let text = String::from_utf8_lossy(&out.stdout);
    if text.contains("xdpgeneric") {
        "xdpgeneric".into()
    } else if text.contains("prog/xdp") {
        "xdp".into()
    } else {
        String::new()
    }
}

fn stat(d: &Daemon, reason: &str) -> u64 {
    counter(&d.json(&["stats"]), reason)
}

fn check_mode(mode: &str, shown: &str) {
    let (h, d) = Host::start(
        &format!("veth-{mode}"),
        &["--mode", mode, "--rate", "1/h", "--burst", "10"],
    );
    assert_eq!(
        attachment(&h),
        shown,
        "--mode {mode}: `ip -d link` shows the wrong attachment"
    );
    let (limited, denied, listed, free) = (
        ip("198.18.0.1"),
        ip("198.18.0.5"),
        ip("198.18.0.9"),
        ip("198.18.0.13"),
    );
    d.cli_ok(&["deny", "198.18.0.5"]);
    let list = h.write("blocked.txt", "# one entry\n198.18.0.9\n");
    d.cli_ok(&["deny", "--from", &list]);
    d.cli_ok(&["allow", "198.18.0.13"]);
    // 1 per hour with a burst of 10: each source gets exactly 10 through,
    // whatever it sends; the denied and listed sources none; the allowed
    // one everything.
    let got = h.pair.probe_sent(
        &[limited, denied, listed, free],
        100,
        Duration::from_millis(600),
    );
    let [l, dn, ls, f] = [got[0], got[1], got[2], got[3]];
    assert!(l.0 > 10, "the limited source sent only {} frames", l.0);
    assert_eq!(
        l.1, 10,
        "--mode {mode}: a burst of 10 let {} of {} through",
        l.1, l.0
    );
    assert_eq!(
        dn.1, 0,
        "--mode {mode}: a denied source got {} of {} through",
        dn.1, dn.0
    );
    assert_eq!(
        ls.1, 0,
        "--mode {mode}: a listed source got {} of {} through",
        ls.1, ls.0
    );
    assert_eq!(f.1, f.0, "--mode {mode}: an allowed source lost frames");
    // The program's own counters agree with the receiver.
    assert_eq!(
        stat(&d, "limited"),
        l.0 - 10,
        "--mode {mode}: limited counted"
    );
    assert_eq!(
        stat(&d, "denied"),
        dn.0 + ls.0,
        "--mode {mode}: denied counted"
    );

    let status = d.stop(libc::SIGINT);
    assert!(
        status.success(),
        "--mode {mode}: the daemon's exit on SIGINT: {status:?}"
    );
    assert_eq!(
        attachment(&h),
        "",
        "--mode {mode}: still attached after SIGINT"
    );
    assert!(
        ratelimit_tests::net::pin_dirs(&h.pair.rx_if).is_empty(),
        "--mode {mode}: pins left behind after SIGINT"
    );
}

#[test]
fn native_attach_limits_denies_lists_and_detaches() {
    privileged!("native_attach_limits_denies_lists_and_detaches");
    check_mode("native", "xdp");
}

#[test]
fn generic_attach_limits_denies_lists_and_detaches() {
    privileged!("generic_attach_limits_denies_lists_and_detaches");
    check_mode("generic", "xdpgeneric");
}
