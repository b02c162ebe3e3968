//! The operator's day: the CLI finds the daemon of its own network namespace
//! and never a dead one; temporary rules end on time and survive a restart;
//! `set` changes only what it is given; commands print what changed; rules
//! as JSON objects; per-rule counters; `stats --watch --json` into a pipe;
//! read-only commands answer from the pins when no daemon runs. The bans
//! that end by themselves (temporary denies, fail2ban) are in `operator/bans.rs`.

use std::{
    io::{BufRead as _, BufReader},
    path::Path,
    process::{Output, Stdio},
    thread::sleep,
    time::{Duration, Instant},
};

use ratelimit_tests::{
    ChildGuard, Daemon, TempDir,
    check::{counter, ip},
    fixture::Host,
    net::{NetNs, Pair, pin_dirs},
    privileged, ratelimit_bin,
};
use serde_json::Value;

const PORT: u16 = 5003;

mod bans;
mod readme;

/// `ratelimit ARGS` in `ns`, as an operator types it there: no `--iface`.
fn bare(ns: &NetNs, run: &Path, args: &[&str]) -> Output {
    ns.command(ratelimit_bin())
        .args(args)
        .env("RATELIMIT_RUN_DIR", run)
        .stdin(Stdio::null())
        .output()
        .expect("running the ratelimit CLI")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn json_of(out: &Output, what: &str) -> Value {
    assert!(
        out.status.success(),
        "{what} failed: {}{}",
        text(&out.stdout),
        text(&out.stderr)
    );
    serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{what} printed bad JSON ({e}): {}", text(&out.stdout)))
}

/// The rule of `cidr` in a `list --json` answer.
fn rule<'a>(list: &'a Value, cidr: &str) -> Option<&'a Value> {
    list["rules"]
        .as_array()
        .expect("rules")
        .iter()
        .find(|r| r["cidr"] == cidr)
}

#[test]
fn each_namespace_finds_its_own_daemon_and_never_a_dead_one() {
    privileged!("each_namespace_finds_its_own_daemon_and_never_a_dead_one");
    // Two namespaces, each with an interface of one name (as two containers'
    // eth0; a name of the test's own, so that the pins cleaned up after it are
    // never a real eth0's) and its own daemon, under one run root.
    let name = format!("rlx{}", ratelimit_tests::unique_tag());
    let a = Pair::named(&format!("{name}a"), &name);
    let b = Pair::named(&format!("{name}b"), &name);
    let run = TempDir::new("twons");
    let da = Daemon::start(&a.rx, &name, &run.0, &["--rate", "100/s"]);
    let db = Daemon::start(&b.rx, &name, &run.0, &["--rate", "200/s"]);

    // The README's first change, typed in each namespace without --iface.
    let out = bare(&a.rx, &run.0, &["deny", "198.18.0.66/32"]);
    assert!(out.status.success(), "deny in A: {}", text(&out.stderr));
    let la = json_of(&bare(&a.rx, &run.0, &["list", "--json"]), "list in A");
    let lb = json_of(&bare(&b.rx, &run.0, &["list", "--json"]), "list in B");
    assert_eq!(la["default"]["rate"]["per_second"], 100, "{la}");
    assert_eq!(lb["default"]["rate"]["per_second"], 200, "{lb}");
    assert!(rule(&la, "198.18.0.66/32").is_some(), "{la}");
    assert!(
        rule(&lb, "198.18.0.66/32").is_none(),
        "B got A's deny: {lb}"
    );

    // SIGKILL A: its socket stays behind until a CLI meets it.
    let sockets = || -> usize {
        std::fs::read_dir(&run.0)
            .expect("run root")
            .flatten()
            .filter(|e| e.path().join(format!("{name}.sock")).exists())
            .count()
    };
    assert_eq!(sockets(), 2);
    da.stop(libc::SIGKILL);
    // Its program still enforces from its pins: status says so, never that
    // a daemon runs.
    let out = bare(&a.rx, &run.0, &["status", "--json"]);
    let st = json_of(&out, "status in A after SIGKILL");
    assert_eq!(st["daemon"], false, "{st}");
    assert_eq!(st["pid"], Value::Null, "{st}");
    let err = text(&out.stderr);
    assert!(err.contains(&format!("no daemon runs on {name}")), "{err}");
    assert_eq!(sockets(), 1, "the dead daemon's socket is still there");
    // A change is refused, with the way to adopt.
    let out = bare(&a.rx, &run.0, &["deny", "198.18.0.67/32"]);
    assert!(!out.status.success(), "a change with no daemon succeeded");
    let err = text(&out.stderr);
    assert!(
        err.contains("no ratelimit daemon runs in this network namespace")
            && err.contains(&format!("ratelimit run --iface {name}")),
        "{err}"
    );
    // B is untouched.
    let lb = json_of(&bare(&b.rx, &run.0, &["list", "--json"]), "list in B");
    assert_eq!(lb["default"]["rate"]["per_second"], 200, "{lb}");
    let st = json_of(&bare(&b.rx, &run.0, &["status", "--json"]), "status in B");
    assert_eq!(st["pid"], db.child.pid(), "{st}");
}

#[test]
fn set_changes_only_what_it_is_given_and_says_what_changed() {
    privileged!("set_changes_only_what_it_is_given_and_says_what_changed");
    let (_h, d) = Host::start("setmerge", &[]);
    let out = d.cli_ok(&["set", "198.18.1.0/24", "--rate", "100/s", "--per", "24"]);
    assert!(
        out.starts_with("added ") && out.contains("limit 100/s burst 100 per /24"),
        "{out}"
    );
    // Only the rate: the prefix stays, the burst (one second's worth) follows.
    let out = d.cli_ok(&["set", "198.18.1.0/24", "--rate", "300/s"]);
    assert!(out.contains("limit 300/s burst 300 per /24"), "{out}");
    assert!(out.contains("(was limit 100/s burst 100 per /24)"), "{out}");
    // A burst given stays when the rate changes.
    d.cli_ok(&["set", "198.18.1.0/24", "--burst", "50"]);
    let out = d.cli_ok(&["set", "198.18.1.0/24", "--rate", "400/s"]);
    assert!(out.contains("limit 400/s burst 50 per /24"), "{out}");
    // The same again: nothing to change, and said so.
    let out = d.cli_ok(&["set", "198.18.1.0/24", "--rate", "400/s"]);
    assert!(out.starts_with("no change"), "{out}");
    // --quiet prints nothing; dry run on and off.
    assert_eq!(d.cli_ok(&["set", "198.18.1.0/24", "--dry-run", "-q"]), "");
    let l = d.json(&["list"]);
    assert_eq!(rule(&l, "198.18.1.0/24").expect("rule")["dry_run"], true);
    d.cli_ok(&["set", "198.18.1.0/24", "--dry-run", "false"]);
    let l = d.json(&["list"]);
    let r = rule(&l, "198.18.1.0/24").expect("rule");
    assert_eq!(r["dry_run"], false, "{r}");
    assert_eq!(r["per"], serde_json::json!({"ipv4": 24}), "{r}");

    // A change for good over a temporary one builds on the rule that lasts,
    // and ends the temporary one.
    d.cli_ok(&[
        "set",
        "198.18.1.0/24",
        "--rate",
        "10/s",
        "--for",
        "1h",
        "-q",
    ]);
    let out = d.cli_ok(&["set", "198.18.1.0/24", "--burst", "60"]);
    let now = out.lines().next().unwrap_or("");
    assert!(
        now.contains("limit 400/s burst 60 per /24") && !now.contains("ends in"),
        "{out}"
    );
    let l = d.json(&["list"]);

    // Errors name the flags typed, and change nothing.
    let fail = |args: &[&str], flag: &str, words: &str| {
        let out = d.cli(args);
        let err = text(&out.stderr);
        assert!(!out.status.success(), "{args:?} succeeded");
        assert!(
            err.contains(&format!("ratelimit: {flag}")) && err.contains(words),
            "{args:?}: {err}"
        );
        assert!(
            !err.contains("198.18.1.0/24."),
            "an internal field path: {err}"
        );
    };
    fail(&["set", "198.18.1.0/24", "--per", "33"], "--per", "0 to 32");
    fail(
        &[
            "set",
            "2001:db8::/32",
            "--rate",
            "1M/s",
            "--bytes",
            "--burst",
            "10",
        ],
        "--burst",
        "1514",
    );
    fail(
        &["set", "198.18.1.0/24", "--rate", "10/fortnight"],
        "--rate",
        "invalid rate",
    );
    assert_eq!(d.json(&["list"]), l, "a refused set changed the rules");
    // Forced, the small byte burst is taken; the IPv6 rule shows its own
    // family's key prefix, and the byte rate in bytes and bits.
    let out = d.cli_ok(&[
        "set",
        "2001:db8::/32",
        "--rate",
        "1M/s",
        "--bytes",
        "--burst",
        "10",
        "--force",
    ]);
    assert!(
        out.contains("limit 1MB/s (8Mbit/s) burst 10 bytes per /64"),
        "{out}"
    );
    assert!(!out.contains("IPv4"), "{out}");
}

#[test]
fn list_json_gives_rules_as_objects_with_numbers_and_units() {
    privileged!("list_json_gives_rules_as_objects_with_numbers_and_units");
    let (_h, d) = Host::start("schema", &[]);
    d.cli_ok(&[
        "set",
        "198.18.0.0/16",
        "--per",
        "32",
        "--rate",
        "30/min",
        "--per",
        "24",
        "--rate",
        "1000/s",
        "--aggregate",
        "10Mbit/s",
    ]);
    d.cli_ok(&[
        "set",
        "2001:db8::/32",
        "--rate",
        "1M/s",
        "--bytes",
        "--per",
        "48",
    ]);
    d.cli_ok(&[
        "set",
        "198.19.0.0/16",
        "--algorithm",
        "fixed-window",
        "--limit",
        "100",
        "--window",
        "1min",
    ]);
    d.cli_ok(&["deny", "198.18.9.9", "--for", "1h"]);
    d.cli_ok(&["allow", "198.18.7.0/24", "--proto", "tcp", "--dport", "22"]);
    let l = d.json(&["list"]);

    // Every rule has these, of these types.
    for r in l["rules"].as_array().expect("rules") {
        for (key, is) in [
            ("cidr", Value::is_string as fn(&Value) -> bool),
            ("source", Value::is_string),
            ("match", Value::is_string),
            ("family", Value::is_string),
            ("action", Value::is_string),
            ("dry_run", Value::is_boolean),
            ("text", Value::is_string),
            ("order", Value::is_u64),
            ("origin", Value::is_string),
        ] {
            assert!(is(&r[key]), "{key} of {r}");
        }
        assert!(
            r["expires_at"].is_null() || r["expires_at"].is_string(),
            "{r}"
        );
    }
    let g = rule(&l, "198.18.0.0/16").expect("gcra rule");
    assert_eq!(g["action"], "limit");
    assert_eq!(g["algorithm"], "gcra");
    assert_eq!(g["rate"]["per_second"], 0.5, "two decimals at most: {g}");
    assert_eq!(g["rate"]["amount"], 30, "{g}");
    assert_eq!(g["rate"]["period_s"], 60, "{g}");
    assert_eq!(g["rate"]["unit"], "packets");
    assert_eq!(g["burst"]["amount"], 1, "{g}");
    assert_eq!(g["per"], serde_json::json!({"ipv4": 32}), "{g}");
    assert_eq!(g["levels"][0]["level"], 2, "{g}");
    assert_eq!(g["levels"][0]["rate"]["per_second"], 1000, "{g}");
    assert_eq!(g["levels"][0]["per"]["ipv4"], 24, "{g}");
    assert_eq!(g["aggregate"]["rate"]["per_second"], 1_250_000, "{g}");
    assert_eq!(g["aggregate"]["rate"]["unit"], "bytes", "{g}");
    assert_eq!(g["expires_at"], Value::Null);
    let v6 = rule(&l, "2001:db8::/32").expect("byte rule");
    assert_eq!(v6["family"], "ipv6");
    assert_eq!(v6["rate"]["unit"], "bytes");
    assert_eq!(v6["rate"]["per_second"], 1_000_000);
    assert_eq!(v6["per"], serde_json::json!({"ipv6": 48}), "{v6}");
    let fw = rule(&l, "198.19.0.0/16").expect("fixed-window rule");
    assert_eq!(fw["algorithm"], "fixed-window");
    assert_eq!(fw["params"]["limit"], 100, "{fw}");
    assert_eq!(fw["params"]["window_s"], 60, "{fw}");
    let deny = rule(&l, "198.18.9.9/32").expect("temporary deny");
    assert_eq!(deny["action"], "deny");
    let ends = deny["expires_at"].as_str().expect("an end");
    assert!(ends.ends_with('Z') && ends.len() == 20, "RFC 3339: {ends}");
    let left = deny["expires_in_s"].as_f64().expect("seconds left");
    assert!((3590.0..=3600.0).contains(&left), "{left}");
    let ssh = l["rules"]
        .as_array()
        .expect("rules")
        .iter()
        .find(|r| r["source"] == "198.18.7.0/24")
        .expect("allow with a match");
    assert_eq!(ssh["match"], "tcp dport 22", "{ssh}");
    assert_eq!(ssh["action"], "allow", "{ssh}");
    // The default rule covers both families.
    assert_eq!(
        l["default"]["per"],
        serde_json::json!({"ipv4": 32, "ipv6": 64})
    );
}

#[test]
fn per_rule_counters_and_top_leave_would_drops_apart() {
    privileged!("per_rule_counters_and_top_leave_would_drops_apart");
    let (h, d) = Host::start("rulecount", &[]);
    d.cli_ok(&[
        "set",
        "198.18.0.0/24",
        "--rate",
        "100/s",
        "--burst",
        "10",
        "-q",
    ]);
    d.cli_ok(&[
        "set",
        "198.18.1.0/24",
        "--rate",
        "50/s",
        "--burst",
        "5",
        "--dry-run",
        "-q",
    ]);
    let limited = ip("198.18.0.10");
    let dry = ip("198.18.1.10");
    let flows = [limited, dry].map(|s| h.pair.flow(s, PORT, 500));
    let sent = h.pair.send(&flows, Duration::from_millis(1000));
    sleep(Duration::from_millis(100));
    let top = d.json(&["top"]);
    let l = d.json(&["list", "--stats"]);
    let c = |cidr: &str, k: &str| -> u64 {
        rule(&l, cidr).expect("rule")["counters"][k]["packets"]
            .as_u64()
            .unwrap_or_else(|| panic!("{cidr} {k}: {l}"))
    };
    // The limited rule: about its rate and burst passed, the rest dropped,
    // every frame counted once.
    let passed = c("198.18.0.0/24", "passed");
    assert!((100..=125).contains(&passed), "passed {passed}: {l}");
    assert_eq!(
        passed + c("198.18.0.0/24", "dropped"),
        sent[0].frames,
        "{l}"
    );
    assert_eq!(c("198.18.0.0/24", "would_drop"), 0);
    // The dry-run rule drops nothing: its excess is would-drops.
    assert_eq!(c("198.18.1.0/24", "dropped"), 0, "{l}");
    let would = c("198.18.1.0/24", "would_drop");
    assert_eq!(c("198.18.1.0/24", "passed") + would, sent[1].frames, "{l}");
    assert!(would > 400, "{would}");
    // The stats table shows the same.
    let table = d.cli_ok(&["list", "--stats"]);
    assert!(
        table.lines().any(|row| row.starts_with("198.18.1.0/24")
            && row.split_whitespace().last() == Some(&would.to_string())),
        "{table}"
    );
    // top ranks what was dropped, not what would have been.
    let sources: Vec<&str> = top["top"]
        .as_array()
        .expect("top")
        .iter()
        .filter_map(|r| r["source"].as_str())
        .collect();
    assert!(
        !sources.contains(&"198.18.1.10"),
        "would-drops in top: {top}"
    );
    assert!(
        sources.contains(&"198.18.0.10"),
        "the dropped source: {top}"
    );
}

#[test]
fn stats_watch_json_into_a_pipe_is_one_object_per_line() {
    privileged!("stats_watch_json_into_a_pipe_is_one_object_per_line");
    let (h, d) = Host::start("watch", &[]);
    let mut cmd = h.command(&["stats", "--watch", "--json", "--iface", &d.iface]);
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null());
    let mut watch = ChildGuard::spawn(cmd, "ratelimit stats --watch --json");
    let stdout = watch.take_stdout().expect("piped stdout");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok).take(3) {
            let _ = tx.send(line);
        }
    });
    let mut lines = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(10);
    while lines.len() < 3 && Instant::now() < deadline {
        if let Ok(l) = rx.recv_timeout(Duration::from_millis(200)) {
            lines.push(l);
        }
    }
    watch.signal(libc::SIGTERM);
    assert_eq!(lines.len(), 3, "three readings within 10 s: {lines:?}");
    for l in &lines {
        assert!(!l.contains('\u{1b}'), "a terminal escape in a pipe: {l:?}");
        let v: Value = serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}"));
        assert!(v["reasons"].is_array(), "{v}");
    }
}

#[test]
fn read_only_commands_answer_from_the_pins_with_the_daemon_gone() {
    privileged!("read_only_commands_answer_from_the_pins_with_the_daemon_gone");
    let (h, d) = Host::start("nodaemon", &["--keep-attached", "--rate", "1000/s"]);
    d.cli_ok(&[
        "set",
        "198.18.0.0/24",
        "--rate",
        "50/s",
        "--burst",
        "5",
        "-q",
    ]);
    d.cli_ok(&["deny", "198.18.5.5", "--for", "10m", "-q"]);
    d.stop(libc::SIGKILL);
    // Still enforcing, with nobody to ask.
    let src = ip("198.18.0.20");
    let flows = [h.pair.flow(src, PORT, 400)];
    h.pair.send(&flows, Duration::from_millis(500));

    let read = |args: &[&str]| -> (Value, String) {
        let out = bare(&h.pair.rx, h.run_dir(), args);
        let v = json_of(&out, &args.join(" "));
        (v, text(&out.stderr))
    };
    let (l, note) = read(&["list", "--stats", "--json"]);
    assert!(note.contains("no daemon runs on"), "{note}");
    assert!(note.contains("ratelimit run --iface"), "{note}");
    assert_eq!(l["daemon"], false, "{l}");
    let r = rule(&l, "198.18.0.0/24").expect("the rule, from the pins");
    assert!(
        r["counters"]["dropped"]["packets"].as_u64().unwrap_or(0) > 100,
        "{r}"
    );
    let ban = rule(&l, "198.18.5.5/32").expect("the temporary ban");
    assert!(ban["expires_in_s"].as_f64().unwrap_or(0.0) > 500.0, "{ban}");
    let (s, _) = read(&["stats", "--json"]);
    assert!(counter(&s, "limited") > 100, "{s}");
    let (st, _) = read(&["status", "--json"]);
    assert_eq!(st["daemon"], false, "{st}");
    assert_eq!(st["rules"], 2, "{st}");
    let (t, _) = read(&["top", "--json"]);
    assert!(t["top"].is_array(), "{t}");

    // A change says, in one message, that nothing changed and how to adopt,
    // with --iface or without (it said "enforces without a daemon", then
    // "no daemon runs … start one with `ratelimit run --iface IFACE`").
    for args in [
        &["deny", "198.18.0.1"][..],
        &["deny", "198.18.0.1", "--iface", &h.pair.rx_if],
    ] {
        let out = bare(&h.pair.rx, h.run_dir(), args);
        assert_eq!(
            out.status.code(),
            Some(3),
            "{args:?}: no daemon's exit code"
        );
        let err = text(&out.stderr);
        assert!(
            err.contains("so nothing was changed")
                && err.contains(&format!(
                    "ratelimit run --iface {}` adopts it",
                    h.pair.rx_if
                )),
            "{args:?}: {err}"
        );
        assert_eq!(
            err.trim().lines().count(),
            1,
            "{args:?}: one message: {err}"
        );
    }

    // Adopted, then stopped for good: no pins left behind.
    let d = h.daemon(&[]);
    assert_eq!(d.json(&["status"])["adopted"], true);
    d.stop(libc::SIGTERM);
    assert!(pin_dirs(&h.pair.rx_if).is_empty(), "pins left behind");
}

/// A clean slate: `reset --live` drops what was set with the CLI (the config
/// file's rules hold again), `reset` removes every rule but the default and
/// says what it removed, and a restart with the same file keeps the slate
/// clean until `reload --replace` reads the file again. Frames at the
/// receiver follow each step.
#[test]
fn reset_leaves_the_default_rule_and_says_what_it_removed() {
    privileged!("reset_leaves_the_default_rule_and_says_what_it_removed");
    let toml =
        "[default]\nrate = \"1000/s\"\n\n[[rule]]\ncidr = \"198.18.0.50/32\"\naction = \"deny\"\n";
    let (h, d) = Host::with_config("reset", toml, &[]);
    let (by_file, by_cli) = (ip("198.18.0.50"), ip("198.18.0.51"));
    d.cli_ok(&["deny", "198.18.0.51"]);
    d.cli_ok(&["set", "default", "--burst", "700"]);
    let passed = |src| {
        h.pair
            .probe(&[(src, 200)], Duration::from_millis(300))
            .get(&src)
            .copied()
            .unwrap_or(0)
    };
    assert_eq!((passed(by_file), passed(by_cli)), (0, 0), "both denied");

    let out = d.cli_ok(&["reset", "--live"]);
    assert!(out.contains("removed 198.18.0.51/32"), "{out}");
    assert!(
        out.contains("changed default") && out.contains("burst 1000"),
        "the live default goes too: {out}"
    );
    assert!(!out.contains("198.18.0.50"), "the file's rule stays: {out}");
    assert_eq!(passed(by_file), 0, "the file's deny holds");
    assert!(passed(by_cli) > 30, "the live deny is gone");

    d.cli_ok(&["deny", "198.18.0.51"]);
    let out = d.cli_ok(&["reset"]);
    assert!(
        out.contains("removed 198.18.0.50/32") && out.contains("removed 198.18.0.51/32"),
        "{out}"
    );
    let list = d.json(&["list"]);
    assert_eq!(list["rules"], serde_json::json!([]), "{list}");
    assert!(
        passed(by_file) > 30 && passed(by_cli) > 30,
        "nothing denied"
    );
    let out = d.cli_ok(&["reset"]);
    assert!(out.starts_with("no change"), "{out}");

    // A restart with the same file: the slate stays clean, and says why.
    assert_eq!(d.stop(libc::SIGTERM).code(), Some(0));
    let config = h.config().to_string();
    let d = h.daemon(&["--config", &config]);
    assert_eq!(
        d.json(&["list"])["rules"],
        serde_json::json!([]),
        "the reset came back undone"
    );
    d.cli_ok(&["reload", "--replace"]);
    assert_eq!(passed(by_file), 0, "reload --replace reads the file again");
    let err = d.cli(&["unset", "default"]);
    assert_eq!(err.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&err.stderr).contains("ratelimit reset"),
        "{err:?}"
    );
}

/// A fleet-wide rule saved as a live change does not lock a host out of a
/// restart without `--fleet`: the refusal names the rules and the way out,
/// and `--drop-fleet-rules` starts without them (a config file's fleet-wide
/// default becomes this host's own limit).
#[test]
fn a_fleet_rule_without_fleet_names_the_rules_and_the_way_out() {
    privileged!("a_fleet_rule_without_fleet_names_the_rules_and_the_way_out");
    let toml = "[default]\nrate = \"100/s\"\nfleet = true\n";
    // A Redis nobody listens on: the fleet runs in its fallback.
    let (h, d) = Host::with_config("nofleet", toml, &["--fleet", "redis://127.0.0.1:1"]);
    d.cli_ok(&["set", "198.18.7.0/24", "--rate", "50/s", "--fleet"]);
    d.cli_ok(&["deny", "198.18.0.9"]);
    assert_eq!(d.stop(libc::SIGTERM).code(), Some(0));
    let config = h.config().to_string();
    let out = h
        .daemon_command(&["--config", &config])
        .output()
        .expect("ratelimit run");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("default")
            && err.contains("198.18.7.0/24")
            && err.contains("--drop-fleet-rules"),
        "the refusal names the rules and the way out: {err}"
    );
    let d = h.daemon(&["--config", &config, "--drop-fleet-rules"]);
    let list = d.json(&["list"]);
    let rules = list["rules"].as_array().expect("rules");
    assert_eq!(rules.len(), 1, "only the deny stays: {list}");
    assert_eq!(rules[0]["cidr"], "198.18.0.9/32", "{list}");
    assert_eq!(list["default"]["fleet"], false, "{list}");
    assert_eq!(list["default"]["rate"]["per_second"], 100, "{list}");
}

/// `explain` says which rule judges a frame and why the others do not, the
/// case that surprised an operator first: a /28's limit takes the game
/// port's frames from its sources (the longest prefix wins). Under a flood,
/// the source's state shows: tracked, nothing left, the next admission
/// within one token's time. `get` gives the state under every rule.
/// A source no frame has met yet shows a full bucket of its rule as the rule
/// is now: after the rule's rate and burst change, the new burst (it showed
/// the old one, read as a state of the rule's earlier generation).
#[test]
fn get_shows_the_changed_rules_burst_for_a_source_not_yet_tracked() {
    privileged!("get_shows_the_changed_rules_burst_for_a_source_not_yet_tracked");
    let (_h, d) = Host::start("getburst", &[]);
    let left = |d: &ratelimit_tests::Daemon| {
        let got = d.json(&["get", "198.18.0.5"]);
        let state = got["states"]
            .as_array()
            .and_then(|s| s.iter().find(|s| s["rule"] == "198.18.0.0/24"))
            .cloned()
            .unwrap_or_else(|| panic!("no state under the /24: {got}"));
        assert_eq!(state["tracked"], false, "{got}");
        state["remaining"].as_u64().expect("remaining")
    };
    d.cli_ok(&["set", "198.18.0.0/24", "--rate", "30/s", "--burst", "30"]);
    assert_eq!(left(&d), 29);
    d.cli_ok(&["set", "198.18.0.0/24", "--rate", "40/s", "--burst", "40"]);
    assert_eq!(left(&d), 39, "the burst before the change");
    d.cli_ok(&["set", "198.18.0.0/24", "--rate", "10/s", "--burst", "5"]);
    assert_eq!(left(&d), 4);
}

#[test]
fn explain_names_the_judging_rule_and_get_the_sources_state() {
    privileged!("explain_names_the_judging_rule_and_get_the_sources_state");
    let toml = "[default]\nrate = \"100/s\"\nburst = 50\n\n[[rule]]\ncidr = \"198.18.0.0/24\"\nproto = \"udp\"\ndport = \"27015\"\nrate = \"50/s\"\n\n[[rule]]\ncidr = \"198.18.0.16/28\"\nrate = \"10/s\"\nburst = 5\n";
    let (h, d) = Host::with_config("explain", toml, &[]);
    let src = ip("198.18.0.20");
    let game = ["--proto", "udp", "--dport", "27015"];
    let mut args = vec!["explain", "198.18.0.20"];
    args.extend_from_slice(&game);
    let before = d.json(&args);
    assert_eq!(before["judged_by"]["kind"], "rule", "{before}");
    assert_eq!(before["judged_by"]["name"], "198.18.0.16/28", "{before}");
    assert_eq!(before["action"], "limit 10/s burst 5 per /32", "{before}");
    let beaten = before["beaten"].as_array().expect("beaten");
    let port_rule = beaten
        .iter()
        .find(|b| b["name"] == "198.18.0.0/24 udp dport 27015")
        .unwrap_or_else(|| panic!("the port rule is not among the beaten: {before}"));
    assert!(
        port_rule["why"]
            .as_str()
            .unwrap_or("")
            .contains("longer prefix"),
        "{port_rule}"
    );
    assert!(beaten.iter().any(|b| b["kind"] == "default"), "{before}");
    assert_eq!(before["state"]["tracked"], false, "{before}");
    assert_eq!(
        before["state"]["remaining"], 4,
        "a full bucket of 5: {before}"
    );
    // Outside the /28 the port rule judges.
    let other = d.json(&[
        "explain",
        "198.18.0.5",
        "--proto",
        "udp",
        "--dport",
        "27015",
    ]);
    assert_eq!(
        other["judged_by"]["name"], "198.18.0.0/24 udp dport 27015",
        "{other}"
    );

    let rx = h.pair.receiver(27015);
    let sender = h
        .pair
        .send_async(&[h.pair.flow(src, 27015, 200)], Duration::from_millis(2500));
    sleep(Duration::from_millis(1200));
    let during = d.json(&args);
    let got = d.json(&["get", "198.18.0.20"]);
    sender.join().expect("sender");
    drop(rx);
    let state = &during["state"];
    assert_eq!(state["tracked"], true, "{during}");
    assert_eq!(state["key"], "198.18.0.20/32", "{during}");
    assert_eq!(state["algorithm"], "gcra", "{during}");
    assert_eq!(state["remaining"], 0, "flooded at 20x: {during}");
    let next = state["next_admission_in_s"]
        .as_f64()
        .expect("a next admission");
    assert!(
        (0.0..=0.1).contains(&next),
        "one token takes 0.1 s: {during}"
    );
    assert!(state["age_s"].as_f64().unwrap_or(0.0) > 0.0, "{during}");
    let states = got["states"].as_array().expect("states");
    let rules: Vec<&str> = states.iter().filter_map(|s| s["rule"].as_str()).collect();
    assert_eq!(
        rules,
        ["198.18.0.16/28", "198.18.0.0/24 udp dport 27015", "default"],
        "every limit rule holding the source, the most specific first: {got}"
    );
    assert_eq!(states[0]["tracked"], true, "{got}");
    assert_eq!(
        states[2]["tracked"], false,
        "no frame met the default: {got}"
    );
    let bad = d.cli(&["explain", "not-an-address"]);
    assert_eq!(bad.status.code(), Some(2), "{bad:?}");
    assert!(
        String::from_utf8_lossy(&bad.stderr).contains("SOURCE"),
        "{bad:?}"
    );
}
