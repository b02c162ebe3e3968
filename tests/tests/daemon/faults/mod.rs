//! Faults and hostile conditions, run the way operators meet them: a run
//! directory someone else owns, damaged saved rules, changes and starts that do
//! not fit, `ip netns exec`, one interface name in two namespaces, live rules
//! across reloads and restarts, interface re-creation, idle clients, too few
//! file descriptors, a user who is not root.
//!
//! Its tests by subject beside this file, what they share here.

mod capacity;
mod idle_clients;
mod interfaces;
mod ownership;
mod saved_rules;

use std::{
    collections::BTreeSet,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    thread::sleep,
    time::{Duration, Instant},
};

use ratelimit_tests::{ChildGuard, Daemon, fixture::Host, net::pin_dirs, unique_tag};

/// Runs `cmd`, which must refuse to start: returns what it wrote. A daemon that
/// starts anyway is killed and the test fails.
fn refused(mut cmd: Command, what: &str) -> String {
    let log = std::env::temp_dir().join(format!("ratelimit-refused-{}.log", unique_tag()));
    let file = std::fs::File::create(&log).expect("log");
    cmd.stdin(Stdio::null())
        .stdout(file.try_clone().expect("fd"))
        .stderr(file);
    let mut child = ChildGuard::spawn(cmd, what);
    let start = Instant::now();
    let status = loop {
        if let Some(s) = child.exited() {
            break s;
        }
        assert!(
            start.elapsed() < Duration::from_secs(15),
            "{what}: started (it should have refused); output: {}",
            std::fs::read_to_string(&log).unwrap_or_default()
        );
        sleep(Duration::from_millis(20));
    };
    let out = std::fs::read_to_string(&log).unwrap_or_default();
    let _ = std::fs::remove_file(&log);
    assert!(!status.success(), "{what}: exited 0; output: {out}");
    out
}

/// The one network namespace directory under a run directory.
fn ns_dir(run_dir: &Path) -> PathBuf {
    let dirs: Vec<PathBuf> = std::fs::read_dir(run_dir)
        .expect("run dir")
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.is_dir())
        .collect();
    assert_eq!(dirs.len(), 1, "namespace directories: {dirs:?}");
    dirs[0].clone()
}

/// The rules the daemon of `h` saved.
fn record(h: &Host) -> PathBuf {
    ns_dir(h.run_dir()).join(format!("{}.rules.json", h.pair.rx_if))
}

/// The rules as `list` shows them: the default, then `cidr rule` lines.
fn listed(d: &Daemon) -> BTreeSet<String> {
    let l = d.json(&["list"]);
    let mut out = BTreeSet::new();
    out.insert(format!(
        "default {}",
        l["default"]["text"].as_str().unwrap_or("?")
    ));
    for r in l["rules"].as_array().expect("rules") {
        out.insert(format!(
            "{} {}",
            r["cidr"].as_str().unwrap_or("?"),
            r["text"].as_str().unwrap_or("?")
        ));
    }
    out
}

/// The rules the kernel enforces on `iface` (read from its pinned maps), in the
/// form of [`listed`].
fn in_kernel(iface: &str) -> BTreeSet<String> {
    let dirs = pin_dirs(iface);
    assert_eq!(dirs.len(), 1, "pin directories of {iface}: {dirs:?}");
    let set = ratelimit_user::kernel::Maps::from_pins(&dirs[0])
        .expect("opening the pinned maps")
        .rule_set()
        .expect("reading the rules back");
    let mut out = BTreeSet::new();
    out.insert(format!("default {}", set.default));
    for (p, a) in &set.rules {
        out.insert(format!("{p} {}", a.text(Some(p.source.addr.is_ipv4()))));
    }
    out
}

/// Waits up to `within` for `cond`.
fn eventually(within: Duration, what: &str, mut cond: impl FnMut() -> bool) {
    let start = Instant::now();
    while !cond() {
        assert!(start.elapsed() < within, "{what} (waited {within:?})");
        sleep(Duration::from_millis(50));
    }
}

/// A config: the default at `rate`, and `deny` rules for each CIDR.
fn denies(default_rate: &str, cidrs: &[String]) -> String {
    let mut s = format!("[default]\nrate = \"{default_rate}\"\n");
    for c in cidrs {
        s.push_str(&format!("[[rule]]\ncidr = \"{c}\"\naction = \"deny\"\n"));
    }
    s
}
