//! Changes and starts that do not fit the maps: a reload or a change past the
//! rule table, a state map the kernel cannot allocate, a restart into smaller
//! maps than the running program's.

use std::time::Duration;

use ratelimit_tests::{check::ip, fixture::Host, net::pin_dirs, privileged};

use super::{denies, eventually, in_kernel, listed, record, refused};

fn slash32s(third: u8, n: u8) -> Vec<String> {
    (0..n)
        .map(|i| format!("198.18.{third}.{}/32", i + 1))
        .collect()
}

/// (Item 3) A change that does not fit the rule table changes nothing, in the kernel
/// or in `list`, and says why; a change that fits still goes through.
#[test]
fn a_change_that_does_not_fit_changes_nothing_in_the_kernel_or_the_list() {
    privileged!("a_change_that_does_not_fit_changes_nothing_in_the_kernel_or_the_list");
    let (h, d) = Host::with_config(
        "nofit",
        &denies("1000/s", &["198.18.1.0/24".into(), "198.18.2.0/24".into()]),
        &["--max-rules", "10"],
    );
    let two = listed(&d);
    assert_eq!(two.len(), 3);
    let probe = ip("198.18.0.90");

    // Twelve rules, SIGHUP.
    let mut twelve = slash32s(0, 11);
    twelve[0] = "198.18.0.90/32".into();
    twelve.push("198.18.1.0/24".into());
    std::fs::write(h.config(), denies("1000/s", &twelve)).expect("write");
    d.child.signal(libc::SIGHUP);
    eventually(
        Duration::from_secs(5),
        "the refused reload is logged",
        || d.output().contains("reload refused"),
    );
    let out = d.output();
    assert!(out.contains("12 rules do not fit in 10"), "{out}");
    assert_eq!(listed(&d), two, "list changed by a refused reload");
    assert_eq!(
        in_kernel(&h.pair.rx_if),
        two,
        "kernel changed by a refused reload"
    );
    let got = h.pair.probe(&[(probe, 200)], Duration::from_millis(500));
    assert!(
        got.get(&probe).copied().unwrap_or(0) >= 90,
        "a rule of the refused reload is enforced: {got:?}"
    );

    // The same by `ratelimit reload`: the error names the cause and the fix.
    let out = d.cli(&["reload"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "reload of 12 rules into 10 succeeded"
    );
    assert!(
        err.contains("12 rules do not fit in 10") && err.contains("--reset --max-rules"),
        "{err}"
    );
    assert_eq!(in_kernel(&h.pair.rx_if), two);

    // Nine fit.
    std::fs::write(h.config(), denies("1000/s", &twelve[..9])).expect("write");
    d.cli_ok(&["reload"]);
    let nine = listed(&d);
    assert_eq!(nine.len(), 10);
    assert_eq!(in_kernel(&h.pair.rx_if), nine);
    let got = h.pair.probe(&[(probe, 200)], Duration::from_millis(300));
    assert_eq!(
        got.get(&probe).copied().unwrap_or(0),
        0,
        "the reloaded deny"
    );

    // The tenth by `set`; the eleventh is refused whole.
    d.cli_ok(&["set", "198.18.3.0/24", "--rate", "10/s"]);
    let ten = listed(&d);
    assert_eq!(ten.len(), 11);
    let out = d.cli(&["deny", "198.18.4.0/24"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "an eleventh rule in 10 was accepted");
    assert!(err.contains("11 rules do not fit in 10"), "{err}");
    assert_eq!(listed(&d), ten);
    assert_eq!(in_kernel(&h.pair.rx_if), ten);
}

/// A first start that fails after it made its pin directory (here the kernel
/// cannot allocate the wide-state map asked for) leaves no directory behind;
/// a state table past what the daemon allows is refused before anything.
#[test]
fn a_failed_first_start_leaves_no_pin_directory() {
    privileged!("a_failed_first_start_leaves_no_pin_directory");
    let h = Host::bare("nopins");
    let out = refused(
        h.daemon_command(&["--max-sources", "4000000000"]),
        "an IPv4 state table past the most",
    );
    assert!(
        out.contains("--max-sources") && out.contains("134217728"),
        "{out}"
    );
    let out = refused(
        h.daemon_command(&["--max-sources-v6", "4000000000"]),
        "an IPv6 share of the state table past the most",
    );
    assert!(
        out.contains("--max-sources-v6") && out.contains("134217728"),
        "{out}"
    );
    let out = refused(
        h.daemon_command(&["--max-wide-sources", "4000000000"]),
        "a state map the kernel cannot allocate",
    );
    assert!(out.contains("RL_WIDE") || out.contains("map"), "{out}");
    assert!(!h.pair.rx_has_xdp());
    assert!(
        pin_dirs(&h.pair.rx_if).is_empty(),
        "a failed start left {:?}",
        pin_dirs(&h.pair.rx_if)
    );
}

/// (Item 4) A start that does not fit the maps (smaller ones with --reset, or more
/// rules than the adopted maps hold) leaves the running program enforcing what
/// it did, with its pins and saved rules; the advice it gives works.
#[test]
fn a_start_that_does_not_fit_leaves_the_running_program_and_its_advice_works() {
    privileged!("a_start_that_does_not_fit_leaves_the_running_program_and_its_advice_works");
    let mut twelve = slash32s(0, 12);
    twelve[0] = "198.18.0.91/32".into();
    let (h, d) = Host::with_config(
        "adopt",
        &denies("1000/s", &twelve),
        &["--max-rules", "16", "--keep-attached"],
    );
    let enforced = listed(&d);
    assert_eq!(d.stop(libc::SIGTERM).code(), Some(0));
    assert!(h.pair.rx_has_xdp());
    let rec = record(&h);
    let saved = std::fs::read(&rec).expect("record");
    let denied = ip("198.18.0.91");
    let intact = |what: &str| {
        assert!(h.pair.rx_has_xdp(), "{what}: the program was detached");
        assert_eq!(pin_dirs(&h.pair.rx_if).len(), 1, "{what}: pins removed");
        assert_eq!(in_kernel(&h.pair.rx_if), enforced, "{what}: kernel changed");
        assert_eq!(
            std::fs::read(&rec).expect("record"),
            saved,
            "{what}: saved rules changed"
        );
        let got = h.pair.probe(&[(denied, 200)], Duration::from_millis(300));
        assert_eq!(
            got.get(&denied).copied().unwrap_or(0),
            0,
            "{what}: not enforcing"
        );
    };

    let out = refused(
        h.daemon_command(&["--reset", "--max-rules", "10"]),
        "--reset --max-rules 10 under 12 rules",
    );
    assert!(
        out.contains("12 rules do not fit in 10") && out.contains("--reset --max-rules N"),
        "{out}"
    );
    intact("--reset into a smaller table");

    let twenty = h.write("twenty.toml", &denies("1000/s", &slash32s(5, 20)));
    let out = refused(
        h.daemon_command(&["--config", &twenty]),
        "20 rules into adopted maps of 16",
    );
    assert!(out.contains("20 rules do not fit in 16"), "{out}");
    intact("a config larger than the adopted maps");

    // The advice: --reset with room. The rules are kept.
    let d = h.daemon(&["--reset", "--max-rules", "32"]);
    assert_eq!(listed(&d), enforced, "the advised restart lost the rules");
    assert_eq!(d.json(&["status"])["rules_capacity"], 32);
    let got = h.pair.probe(&[(denied, 200)], Duration::from_millis(300));
    assert_eq!(got.get(&denied).copied().unwrap_or(0), 0);
    assert_eq!(d.stop(libc::SIGTERM).code(), Some(0));
    assert!(!h.pair.rx_has_xdp());
}
