//! Where the daemon runs: under `ip netns exec`, one interface name in two
//! namespaces, an interface deleted and re-created under it.

use std::{process::Command, time::Duration};

use ratelimit_tests::{
    Daemon, TempDir,
    check::ip,
    fixture::Host,
    net::{Pair, pin_dirs},
    privileged, ratelimit_bin, unique_tag,
};

use super::{eventually, listed};

/// (Item 5) Run the way users test in namespaces, `ip netns exec`:
/// a SIGKILL leaves the program enforcing, the next start adopts it, and
/// `--keep-attached` keeps what it says.
#[test]
fn under_ip_netns_exec_a_sigkill_leaves_enforcing_and_a_restart_adopts() {
    privileged!("under_ip_netns_exec_a_sigkill_leaves_enforcing_and_a_restart_adopts");
    let h = Host::bare("netnsexec");
    let exec = |args: &[&str]| {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &h.pair.rx.name])
            .arg(ratelimit_bin())
            .args(args)
            .env("RATELIMIT_RUN_DIR", h.run_dir());
        c
    };
    let start = |extra: &[&str]| {
        let mut args = vec!["run", "--iface", h.pair.rx_if.as_str()];
        args.extend_from_slice(extra);
        h.spawn(exec(&args))
    };
    let d = start(&["--rate", "100/s", "--burst", "10"]);
    let out = exec(&["deny", "198.18.0.92/32", "--iface", &h.pair.rx_if])
        .output()
        .expect("cli");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let rules = listed(&d);
    d.stop(libc::SIGKILL);
    assert!(
        h.pair.rx_has_xdp(),
        "SIGKILL under ip netns exec took the program"
    );
    assert_eq!(
        pin_dirs(&h.pair.rx_if).len(),
        1,
        "no pins in the host's bpffs"
    );

    let (denied, limited) = (ip("198.18.0.92"), ip("198.18.0.93"));
    let got = h
        .pair
        .probe(&[(denied, 200), (limited, 500)], Duration::from_secs(1));
    assert_eq!(
        got.get(&denied).copied().unwrap_or(0),
        0,
        "denied source passed"
    );
    let n = got.get(&limited).copied().unwrap_or(0) as f64;
    assert!(
        (95.0..=10.0 + 100.0 * 1.0 * 1.05).contains(&n),
        "a 100/s burst 10 source at 500/s passed {n} in 1 s with the daemon killed"
    );

    let d = start(&[]);
    let status = d.json(&["status"]);
    assert_eq!(status["adopted"], true, "{status}");
    assert_eq!(status["took_over_link"], true, "{status}");
    assert_eq!(listed(&d), rules, "the restart lost rules");
    assert_eq!(d.stop(libc::SIGTERM).code(), Some(0));

    // After a clean stop nothing runs: the base is what this start gives, the
    // live deny comes back on top.
    let d = start(&["--rate", "100/s", "--burst", "10", "--keep-attached"]);
    assert_eq!(listed(&d), rules);
    assert_eq!(d.stop(libc::SIGTERM).code(), Some(0));
    assert!(
        h.pair.rx_has_xdp(),
        "--keep-attached said it keeps enforcing"
    );
    let got = h.pair.probe(&[(denied, 200)], Duration::from_millis(300));
    assert_eq!(got.get(&denied).copied().unwrap_or(0), 0);

    let d = start(&[]);
    assert_eq!(d.stop(libc::SIGTERM).code(), Some(0));
    assert!(!h.pair.rx_has_xdp());
    assert!(
        pin_dirs(&h.pair.rx_if).is_empty(),
        "pins left after a clean stop"
    );
}

/// (Item 6) One interface name in two namespaces: two daemons, each with its own
/// lock, socket, rules and pins; neither ever adopts the other's program.
#[test]
fn same_named_interfaces_in_two_namespaces_are_two_daemons() {
    privileged!("same_named_interfaces_in_two_namespaces_are_two_daemons");
    let name = format!("rl{}s", unique_tag());
    let pair = Pair::named(&name, &name);
    let run = TempDir::new("samename");
    let a = Daemon::start(&pair.rx, &name, &run.0, &["--rate", "100/s"]);
    let b = Daemon::start(&pair.tx, &name, &run.0, &["--rate", "300/s"]);
    a.cli_ok(&["deny", "198.18.0.94/32"]);
    assert_eq!(listed(&a).len(), 2);
    assert_eq!(listed(&b).len(), 1, "a's rule reached b");
    assert!(listed(&b).iter().any(|l| l.contains("300/s")));
    assert_eq!(pin_dirs(&name).len(), 2, "one pin directory per namespace");

    a.stop(libc::SIGKILL);
    assert_eq!(b.stop(libc::SIGTERM).code(), Some(0));
    assert!(pair.rx_has_xdp(), "stopping b detached a's program");
    let tx_has_xdp = || {
        let out = Command::new("ip")
            .args(["-n", &pair.tx.name, "link", "show", &name])
            .output()
            .expect("ip");
        String::from_utf8_lossy(&out.stdout).contains("prog/xdp")
    };
    assert!(!tx_has_xdp());

    // b again: its own fresh program, not a's.
    let b = Daemon::start(&pair.tx, &name, &run.0, &[]);
    let status = b.json(&["status"]);
    assert_eq!(status["adopted"], false, "b adopted a's program: {status}");
    assert!(tx_has_xdp());
    let denied = ip("198.18.0.94");
    let got = pair.probe(&[(denied, 200)], Duration::from_millis(300));
    assert_eq!(
        got.get(&denied).copied().unwrap_or(0),
        0,
        "a's program stopped enforcing"
    );
    // a again: adopts its own.
    let a = Daemon::start(&pair.rx, &name, &run.0, &[]);
    let status = a.json(&["status"]);
    assert_eq!(status["adopted"], true, "{status}");
    assert!(listed(&a).contains("198.18.0.94/32 deny"));
    assert_eq!(a.stop(libc::SIGTERM).code(), Some(0));
    assert_eq!(b.stop(libc::SIGTERM).code(), Some(0));
    assert!(pin_dirs(&name).is_empty());
}

/// (Item 11) The interface deleted and re-created under the daemon: it says so while
/// nothing is enforced, then attaches to the new one with its rules.
#[test]
fn an_interface_deleted_and_recreated_is_followed() {
    privileged!("an_interface_deleted_and_recreated_is_followed");
    let (mut h, d) = Host::start("recreate", &["--rate", "100/s"]);
    d.cli_ok(&["deny", "198.18.0.96/32"]);
    let ip_cmd = |args: &[&str]| {
        let ok = Command::new("ip").args(args).status().expect("ip");
        assert!(ok.success(), "ip {args:?}");
    };
    ip_cmd(&["-n", &h.pair.rx.name, "link", "del", &h.pair.rx_if]);
    eventually(
        Duration::from_secs(5),
        "status reports the interface gone",
        || d.json(&["status"])["interface"] == "gone",
    );
    let status = d.json(&["status"]);
    assert!(
        status["notes"].to_string().contains("nothing is enforced"),
        "{status}"
    );
    let metrics_attached = d.output();
    assert!(
        metrics_attached.contains("the interface is gone"),
        "{metrics_attached}"
    );

    // The same pair again, same names.
    h.pair.relink();
    eventually(
        Duration::from_secs(5),
        "the daemon attaches to the new interface",
        || h.pair.rx_has_xdp() && d.json(&["status"])["interface"] == "attached",
    );
    assert!(d.output().contains("attached to it again"));
    let denied = ip("198.18.0.96");
    let got = h.pair.probe(&[(denied, 200)], Duration::from_millis(300));
    assert_eq!(
        got.get(&denied).copied().unwrap_or(0),
        0,
        "rules lost on re-creation"
    );

    // Killed, the interface re-created again, restarted: attached anew with the
    // pinned rules (the severed link is replaced, no --reset needed).
    d.stop(libc::SIGKILL);
    ip_cmd(&["-n", &h.pair.rx.name, "link", "del", &h.pair.rx_if]);
    h.pair.relink();
    let d = h.daemon(&[]);
    assert!(listed(&d).contains("198.18.0.96/32 deny"));
    let got = h.pair.probe(&[(denied, 200)], Duration::from_millis(300));
    assert_eq!(got.get(&denied).copied().unwrap_or(0), 0);
}
