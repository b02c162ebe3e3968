//! `ratelimit check --config FILE`: every error of a config file with its
//! line, a summary when it is valid, JSON; and `run` and `reload` saying the
//! same errors of a bad file while the daemon keeps what it enforces.
//!
//! The `check` tests need no root (they drop it when they have it); the last
//! test runs a daemon in a namespace.

use std::{
    path::{Path, PathBuf},
    process::{Command, Output, Stdio},
    time::Duration,
};

use ratelimit_tests::{ChildGuard, SharedBin, TempDir, check::ip, fixture::Host, privileged};

/// `ratelimit check ARGS` as an unprivileged user (`nobody`, when this is
/// root), with a run directory that does not exist: `check` must need
/// neither root nor the run directory. What it reads must be where `nobody`
/// can read it (a [`TempDir`]), never in the checkout, and so is the binary
/// it runs ([`SharedBin`]): the checkout may be closed to others.
fn check(run: &TempDir, args: &[&str]) -> Output {
    // SAFETY: no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    let bin = SharedBin::new();
    let mut cmd = if root {
        let mut c = Command::new("setpriv");
        c.args(["--reuid=65534", "--regid=65534", "--clear-groups"])
            .arg(&bin.path);
        c
    } else {
        Command::new(&bin.path)
    };
    let run_dir = run.0.join("no-run-dir");
    cmd.arg("check")
        .args(args)
        .env("RATELIMIT_RUN_DIR", &run_dir)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    // A check that hangs (on a FIFO, say) is killed after 10 s, and fails.
    let out = ChildGuard::spawn(cmd, &format!("ratelimit check {}", args.join(" ")))
        .wait(Duration::from_secs(10));
    assert!(
        !run_dir.exists(),
        "`ratelimit check` created the run directory {}",
        run_dir.display()
    );
    out
}

/// Writes `text` to `name` in `dir`; returns the path as text.
fn write(dir: &Path, name: &str, text: &str) -> String {
    let path: PathBuf = dir.join(name);
    std::fs::write(&path, text).expect("writing a test file");
    path.to_str().expect("utf-8").to_string()
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// Asserts exit status 2 and that stderr holds each of `lines` (whole lines)
/// and ends with the count; returns stderr.
fn invalid(out: &Output, file: &str, lines: &[String]) -> String {
    let err = text(&out.stderr);
    assert_eq!(
        out.status.code(),
        Some(2),
        "expected exit status 2 (invalid); stdout: {} stderr: {err}",
        text(&out.stdout)
    );
    assert!(
        out.stdout.is_empty(),
        "an invalid file printed to stdout: {}",
        text(&out.stdout)
    );
    let got: Vec<&str> = err.lines().collect();
    for want in lines {
        assert!(
            got.iter().any(|l| l.starts_with(want.as_str())),
            "expected a line starting {want:?}; stderr:\n{err}"
        );
    }
    let summary = format!(
        "{file}: {} error{}; nothing was applied",
        lines.len(),
        if lines.len() == 1 { "" } else { "s" }
    );
    assert_eq!(
        got.last().copied(),
        Some(summary.as_str()),
        "stderr:\n{err}"
    );
    assert_eq!(
        got.len(),
        lines.len() + 1,
        "expected {} errors and the count; stderr:\n{err}",
        lines.len()
    );
    err
}

#[test]
fn a_valid_file_is_ok_with_a_summary() {
    let dir = TempDir::new("check-ok");
    write(
        &dir.0,
        "bans.txt",
        "# bans\n198.18.7.1\n198.18.8.0/24\n2001:db8:7::/48\n",
    );
    let file = write(
        &dir.0,
        "r.toml",
        r#"[default]
rate = "1000/s"

[[rule]]
cidr = "198.18.1.0/24"
action = "allow"

[[rule]]
cidr = "198.18.2.0/24"
rate = "50/s"
proto = "udp"
dport = 53

[[list]]
name = "bans"
action = "deny"
path = "bans.txt"
"#,
    );
    let out = check(&dir, &["--config", &file]);
    assert!(
        out.status.success(),
        "a valid file was refused: {}",
        text(&out.stderr)
    );
    assert_eq!(
        text(&out.stdout).trim_end(),
        format!(
            "{file}: ok: 2 rules, 1 list (3 entries), default limit 1000/s burst 1000 per /32 (IPv4) /64 (IPv6)"
        )
    );
    // The shipped example is valid (a copy: `nobody` may not enter the
    // checkout).
    let example = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/ratelimit.toml");
    let example = write(
        &dir.0,
        "example.toml",
        &std::fs::read_to_string(&example).expect("reading the example"),
    );
    let out = check(&dir, &["--config", &example]);
    assert!(
        out.status.success() && text(&out.stdout).contains(": ok: "),
        "the example was refused: {}",
        text(&out.stderr)
    );
}

#[test]
fn every_independent_error_is_said_with_its_line() {
    let dir = TempDir::new("check-bad");
    let file = write(
        &dir.0,
        "bad.toml",
        r#"mode = "allowlist-only"
new-states = "many"

[default]
rate = "100/s"
burst = 0

[[rule]]
cidr = "198.18.300.0/24"
action = "deny"

[[rule]]
cidr = "198.18.2.0/24"
action = "allow"

[[rule]]
cidr = "198.18.3.0/24"
rate = "5/fortnight"

[[rule]]
cidr = "198.18.4.0/24"
rate = "10/s"
colour = "red"

[[rule]]
cidr = "198.18.5.0/24"
proto = "tcp"
icmp-type = 8
action = "deny"
"#,
    );
    let err = invalid(
        &check(&dir, &["--config", &file]),
        &file,
        &[
            format!("{file}:2: new-states: invalid rate \"many\""),
            format!("{file}:6: default.burst: "),
            format!("{file}:9: rule[0].cidr: invalid prefix \"198.18.300.0/24\""),
            format!("{file}:18: rule[2] (198.18.3.0/24).rate: invalid rate \"5/fortnight\""),
            format!("{file}:23: rule[3].colour: unknown field `colour`"),
            format!("{file}:28: rule[4].icmp-type: "),
        ],
    );
    // Messages say what is accepted.
    assert!(err.contains("expected one of `action`, `rate`"), "{err}");
}

#[test]
fn a_half_valid_file_is_refused_whole() {
    let dir = TempDir::new("check-half");
    let file = write(
        &dir.0,
        "half.toml",
        "[[rule]]\ncidr = \"198.18.1.0/24\"\naction = \"deny\"\n\n[[rule]]\ncidr = \"198.18.2.0/24\"\nrate = \"10/s\"\n\n[[rule]]\ncidr = \"198.18.1.0/24\"\naction = \"allow\"\n",
    );
    invalid(
        &check(&dir, &["--config", &file]),
        &file,
        &[format!(
            "{file}:10: rule[2].cidr: 198.18.1.0/24 appears twice (first as rule[0])"
        )],
    );
}

#[test]
fn a_toml_syntax_error_is_one_error_with_its_line() {
    let dir = TempDir::new("check-syntax");
    let file = write(
        &dir.0,
        "syntax.toml",
        "[default]\nrate = \"100/s\"\n\n[[rule]]\ncidr = \"198.18.1.0/24\naction = \"deny\"\n",
    );
    invalid(
        &check(&dir, &["--config", &file]),
        &file,
        &[format!("{file}:5: not valid TOML at column ")],
    );
}

#[test]
fn a_missing_file_is_one_error() {
    let dir = TempDir::new("check-missing");
    let file = dir.0.join("nope.toml").to_str().expect("utf-8").to_string();
    invalid(
        &check(&dir, &["--config", &file]),
        &file,
        &[format!("{file}: cannot read the config file: No such file")],
    );
}

#[test]
fn a_list_file_with_bad_lines_is_named_with_its_lines() {
    let dir = TempDir::new("check-list");
    let list = write(
        &dir.0,
        "bans.txt",
        "198.18.7.1\n198.18.7.2/33\n# fine\nnot-an-address\n",
    );
    let file = write(
        &dir.0,
        "r.toml",
        "[[list]]\nname = \"bans\"\naction = \"deny\"\npath = \"bans.txt\"\n\n[[list]]\nname = \"more\"\naction = \"block\"\npath = \"nothing-here.txt\"\n",
    );
    let err = invalid(
        &check(&dir, &["--config", &file]),
        &file,
        &[
            format!("{file}:4: list[0].path: {list}:2: \"198.18.7.2/33\" is not a CIDR"),
            format!("{file}:8: list[1].action: \"block\" is not a list action"),
            format!("{file}:9: list[1].path: cannot read the list "),
        ],
    );
    assert!(
        err.contains(&format!("; {list}:4: \"not-an-address\"")),
        "{err}"
    );
}

/// A list path that is a FIFO, a device, or past the cap (a sparse 300 MiB
/// file), and a config file that is a FIFO: refused at once, naming the path
/// and what it is (`check` used to hang on the FIFO).
#[test]
fn what_is_not_a_regular_file_or_is_too_large_is_refused_at_once() {
    let dir = TempDir::new("check-fifo");
    let fifo = dir.0.join("bans.fifo");
    let c = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).expect("path");
    // SAFETY: a C string.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0, "mkfifo");
    let big = dir.0.join("big.netset");
    std::fs::File::create(&big)
        .and_then(|f| f.set_len(300 << 20))
        .expect("a sparse file");
    let file = write(
        &dir.0,
        "r.toml",
        "[[list]]\nname = \"fifo\"\naction = \"deny\"\npath = \"bans.fifo\"\n\n[[list]]\nname = \"zero\"\naction = \"deny\"\npath = \"/dev/zero\"\n\n[[list]]\nname = \"big\"\naction = \"deny\"\npath = \"big.netset\"\n",
    );
    invalid(
        &check(&dir, &["--config", &file]),
        &file,
        &[
            format!(
                "{file}:4: list[0].path: the list {} is a FIFO (named pipe), not a regular file: a list must be a regular file",
                fifo.display()
            ),
            format!(
                "{file}:9: list[1].path: the list /dev/zero is a character device, not a regular file"
            ),
            format!(
                "{file}:14: list[2].path: the list {} is 300 MiB (314572800 bytes): a list may be at most 256 MiB (268435456 bytes)",
                big.display()
            ),
        ],
    );
    let fifo = fifo.to_str().expect("utf-8");
    invalid(
        &check(&dir, &["--config", fifo]),
        fifo,
        &[format!(
            "{fifo}: the config file is a FIFO (named pipe), not a regular file: a config file must be a regular file"
        )],
    );
}

#[test]
fn json_says_the_same() {
    let dir = TempDir::new("check-json");
    let file = write(
        &dir.0,
        "r.toml",
        "[default]\nrate = \"0/s\"\n\n[[rule]]\ncidr = \"198.18.1.0/24\"\naction = \"deny\"\n\n[[rule]]\ncidr = \"198.18.2.0/24\"\naction = \"deny\"\ndry-run = \"yes\"\n",
    );
    let out = check(&dir, &["--config", &file, "--json"]);
    assert_eq!(out.status.code(), Some(2), "stderr: {}", text(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("not one JSON object ({e}): {}", text(&out.stdout)));
    assert_eq!(v["file"], file.as_str());
    assert_eq!(v["ok"], false);
    assert!(v["summary"].is_null(), "{v}");
    let errors: Vec<(u64, &str)> = v["errors"]
        .as_array()
        .expect("errors")
        .iter()
        .map(|e| {
            assert!(e["message"].as_str().is_some_and(|m| !m.is_empty()), "{e}");
            (
                e["line"].as_u64().expect("line"),
                e["field"].as_str().expect("field"),
            )
        })
        .collect();
    assert_eq!(
        errors,
        [(2, "default.rate"), (11, "rule[1].dry-run")],
        "{v}"
    );

    let file = write(
        &dir.0,
        "ok.toml",
        "[[rule]]\ncidr = \"198.18.1.0/24\"\naction = \"deny\"\n",
    );
    let out = check(&dir, &["--config", &file, "--json"]);
    assert!(out.status.success(), "stderr: {}", text(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(v["ok"], true, "{v}");
    assert_eq!(v["errors"], serde_json::json!([]), "{v}");
    assert_eq!(v["summary"]["rules"], 1, "{v}");
}

#[test]
fn a_file_larger_than_the_daemons_maps_does_not_fit() {
    let dir = TempDir::new("check-fit");
    let file = write(
        &dir.0,
        "r.toml",
        "[[rule]]\ncidr = \"198.18.1.0/24\"\naction = \"deny\"\n[[rule]]\ncidr = \"198.18.2.0/24\"\naction = \"deny\"\n",
    );
    invalid(
        &check(&dir, &["--config", &file, "--max-rules", "1"]),
        &file,
        &[format!(
            "{file}: --max-rules: 2 rules do not fit in 1: run the daemon (and this check) with --max-rules 2 or more"
        )],
    );
    let out = check(&dir, &["--config", &file, "--max-rules", "2"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
}

#[test]
fn run_and_reload_with_a_bad_file_say_every_error_and_change_nothing() {
    privileged!("run_and_reload_with_a_bad_file_say_every_error_and_change_nothing");
    let (h, d) = Host::with_config(
        "check-daemon",
        "[default]\nrate = \"100/s\"\n\n[[rule]]\ncidr = \"198.18.1.0/24\"\naction = \"deny\"\n",
        &[],
    );
    let config = h.config();
    let before = d.json(&["list"]);
    let (denied, other) = (ip("198.18.1.5"), ip("198.18.3.5"));
    // The old rules enforce: 198.18.1.0/24 is denied, 198.18.3.0/24 is not.
    let enforcing = |what: &str| {
        let got = h
            .pair
            .probe(&[(denied, 200), (other, 200)], Duration::from_millis(400));
        assert_eq!(
            got.get(&denied).copied().unwrap_or(0),
            0,
            "{what}: {denied} passed"
        );
        let n = got.get(&other).copied().unwrap_or(0);
        assert!(
            n >= 70,
            "{what}: only {n} of ~80 frames from {other} arrived"
        );
    };
    enforcing("started");

    // A second `run` with a bad file: its errors, not "already running".
    let bad = h.write(
        "bad.toml",
        "[default]\nrate = \"100/s\"\nburst = 0\n\n[[rule]]\ncidr = \"198.18.1.0/33\"\naction = \"deny\"\n\n[[rule]]\ncidr = \"198.18.2.0/24\"\naction = \"block\"\n",
    );
    let second = |file: &str| {
        h.daemon_command(&["--config", file])
            .output()
            .expect("running ratelimit run")
    };
    let out = second(&bad);
    let err = text(&out.stderr);
    assert!(
        !out.status.success(),
        "a second run with a bad file started"
    );
    for want in [
        format!("{bad}:3: default.burst: "),
        format!("{bad}:6: rule[0].cidr: invalid prefix \"198.18.1.0/33\""),
        format!("{bad}:11: rule[1] (198.18.2.0/24).action: unknown action \"block\""),
        format!("{bad}: 3 errors; nothing was applied"),
    ] {
        assert!(err.contains(&want), "expected {want:?} in: {err}");
    }
    assert!(
        !err.contains("already runs"),
        "the lock was taken before the file was checked: {err}"
    );
    // With a valid file, the lock is what refuses it.
    let out = second(config);
    assert!(
        text(&out.stderr).contains("another ratelimit daemon already runs"),
        "{}",
        text(&out.stderr)
    );
    assert_eq!(d.json(&["list"]), before, "a refused run changed the rules");

    // `reload` of a half-valid file: refused whole, every error said.
    std::fs::write(
        config,
        "[default]\nrate = \"5/s\"\n\n[[rule]]\ncidr = \"198.18.3.0/24\"\naction = \"deny\"\n\n[[rule]]\ncidr = \"198.18.4.0/24\"\nrate = \"10/fortnight\"\n\n[[rule]]\ncidr = \"2001:db8::/129\"\naction = \"allow\"\n",
    )
    .expect("writing the config");
    let out = d.cli(&["reload"]);
    let err = text(&out.stderr);
    assert!(
        !out.status.success(),
        "a half-valid reload succeeded: {err}"
    );
    let expected = [
        format!("{config}:10: rule[1] (198.18.4.0/24).rate: invalid rate \"10/fortnight\""),
        format!("{config}:13: rule[2].cidr: invalid prefix \"2001:db8::/129\""),
        format!("{config}: 2 errors; nothing was applied"),
    ];
    for want in &expected {
        assert!(err.contains(want.as_str()), "expected {want:?} in: {err}");
    }
    assert_eq!(
        d.json(&["list"]),
        before,
        "a half-valid reload changed the rules"
    );
    let list = d.cli_ok(&["list"]);
    assert!(
        list.contains("198.18.1.0/24") && list.contains("100/s") && !list.contains("198.18.3.0/24"),
        "`ratelimit list` after a refused reload: {list}"
    );
    enforcing("after a refused reload");

    // SIGHUP: the same errors in the daemon's log, one a line.
    d.child.signal(libc::SIGHUP);
    let start = std::time::Instant::now();
    while !d.output().contains("reload refused") {
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "no refused reload in the log: {}",
            d.output()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let log = d.output();
    for want in &expected[..2] {
        assert!(
            log.contains(want.as_str()),
            "expected {want:?} in the log: {log}"
        );
    }
    assert_eq!(
        d.json(&["list"]),
        before,
        "SIGHUP applied a half-valid file"
    );
    enforcing("after a refused SIGHUP");
    // `check` says the same (of a copy: the daemon's run directory is
    // root's alone, and `check` runs as nobody).
    let elsewhere = TempDir::new("check-copy");
    let copy = write(
        &elsewhere.0,
        "r.toml",
        &std::fs::read_to_string(config).expect("reading the config"),
    );
    let out = check(&elsewhere, &["--config", &copy]);
    let same: Vec<String> = expected[..2]
        .iter()
        .map(|l| l.replace(config, &copy))
        .collect();
    invalid(&out, &copy, &same);
}
