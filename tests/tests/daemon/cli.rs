//! The command line as scripts and operators meet it: an exit code per kind of
//! failure, failures as JSON under `--json`, `--metrics` in every documented
//! form, plain logs when stderr is not a terminal, and the generated help, man
//! page and completions.

use std::process::{Command, Output};

use ratelimit_tests::{SharedBin, fixture::Host, privileged, ratelimit_bin};
use serde_json::Value;

fn code(out: &Output) -> i32 {
    out.status.code().expect("exited, not killed")
}

/// The `{"error": …}` object a failed `--json` command printed on stdout.
fn json_error(out: &Output, what: &str) -> Value {
    let stdout = String::from_utf8_lossy(&out.stdout);
    let v: Value = serde_json::from_str(stdout.trim())
        .unwrap_or_else(|e| panic!("{what}: stdout is not one JSON object ({e}): {stdout:?}"));
    assert!(v["error"].is_object(), "{what}: {v}");
    assert_eq!(
        v["error"]["exit_code"].as_i64(),
        Some(i64::from(code(out))),
        "{what}: the JSON's exit_code is not the exit code: {v}"
    );
    v["error"].clone()
}

/// Asserts exit code `want` and that stderr has `needle` on a `ratelimit: ` line.
fn fails_with(out: &Output, want: i32, needle: &str, what: &str) {
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(code(out), want, "{what}: exit code; stderr: {err}");
    assert!(
        err.contains(needle),
        "{what}: expected {needle:?} on stderr: {err}"
    );
}

#[test]
fn each_kind_of_failure_has_its_exit_code_and_json_says_the_same() {
    privileged!("each_kind_of_failure_has_its_exit_code_and_json_says_the_same");
    let h = Host::bare("codes");
    let cli = |args: &[&str]| -> Output { h.command(args).output().expect("running ratelimit") };

    // 3: no daemon, on the interface or in the namespace.
    let out = cli(&["list", "--json", "--iface", &h.pair.rx_if]);
    fails_with(
        &out,
        3,
        "ratelimit: no ratelimit daemon runs on",
        "no daemon",
    );
    let e = json_error(&out, "no daemon");
    assert_eq!(e["kind"], "no-daemon");
    assert!(e.get("field").is_none(), "{e}");
    assert!(
        e["message"]
            .as_str()
            .is_some_and(|m| m.contains(&format!("no ratelimit daemon runs on {}", h.pair.rx_if))),
        "{e}"
    );
    // The hint is a command that runs as written, in a namespace too.
    let hint = format!("start one with `ratelimit run --iface {}`", h.pair.rx_if);
    assert!(
        e["message"].as_str().is_some_and(|m| m.contains(&hint)),
        "{e}"
    );
    let out = cli(&["status", "--json"]);
    fails_with(
        &out,
        3,
        "no ratelimit daemon runs in this network namespace",
        "no daemon here",
    );
    assert_eq!(json_error(&out, "no daemon here")["kind"], "no-daemon");

    // 2: a bad --metrics, before anything is attached.
    let out = cli(&["run", "--iface", &h.pair.rx_if, "--metrics", "9477"]);
    fails_with(
        &out,
        2,
        "--metrics: \"9477\" is not an address",
        "bad --metrics",
    );
    for form in ["127.0.0.1:9477", "[::1]:9477", "localhost:9477", ":9477"] {
        assert!(
            String::from_utf8_lossy(&out.stderr).contains(form),
            "the --metrics error does not show {form}"
        );
    }
    assert!(!h.pair.rx_has_xdp(), "a refused start attached the program");

    // 5: not root (the binary where `nobody` may run it: the checkout may
    // be closed to others).
    let shared = SharedBin::new();
    let out = h
        .command_as_nobody(&shared, &["list", "--json", "--iface", &h.pair.rx_if])
        .output()
        .expect("running ratelimit as nobody");
    fails_with(&out, 5, "ratelimit: permission denied", "not root");
    assert_eq!(json_error(&out, "not root")["kind"], "permission");

    let d = h.daemon(&[]);
    // 2: invalid input, with its field (the CIDR, parsed once a daemon is found).
    let out = d.cli(&["deny", "198.18.0.0/33"]);
    fails_with(&out, 2, "ratelimit: CIDR: invalid prefix", "bad CIDR");
    assert!(
        out.stdout.is_empty(),
        "no --json, yet stdout: {:?}",
        out.stdout
    );
    // 2: a usage error of clap's, as JSON too when --json is on the line.
    let out = d.cli(&["stats", "--json", "--colour"]);
    fails_with(&out, 2, "unexpected argument '--colour'", "usage error");
    let e = json_error(&out, "usage error");
    assert_eq!(
        (e["kind"].as_str(), e["field"].as_str()),
        (Some("invalid"), Some("--colour"))
    );
    let out = d.cli(&["top", "--json", "-n", "many"]);
    let e = json_error(&out, "bad -n");
    assert_eq!((code(&out), e["field"].as_str()), (2, Some("-n")), "{e}");
    // A CIDR without a rule is invalid input too.
    let out = d.cli(&["unset", "198.18.0.0/16"]);
    fails_with(
        &out,
        2,
        "CIDR: no rule for 198.18.0.0/16",
        "unset without a rule",
    );
    // 4: refused by the daemon.
    let out = d.cli(&["reload"]);
    fails_with(&out, 4, "started without --config", "refused");
    // 0, and no error object, when it works.
    let out = d.cli(&["list", "--json"]);
    assert_eq!(code(&out), 0);
    let v: Value = serde_json::from_slice(&out.stdout).expect("list --json");
    assert!(v.get("error").is_none() && v["default"].is_object(), "{v}");
}

#[test]
fn metrics_listen_on_a_bare_port_and_on_a_host_name_and_logs_are_plain() {
    privileged!("metrics_listen_on_a_bare_port_and_on_a_host_name_and_logs_are_plain");
    // :PORT: every IPv4 address, so the veth's address answers too.
    let (h, d) = Host::start("metrics-forms", &["--metrics", ":19483"]);
    for addr in ["127.0.0.1:19483", "198.18.0.2:19483"] {
        let body = h.pair.rx.scrape(addr);
        assert!(body.contains("ratelimit_packets_total"), "{addr}: {body}");
    }
    // Its stderr is a file: no colour codes in the logs.
    let log = d.output();
    assert!(
        log.contains("serving Prometheus metrics"),
        "the metrics listener was not logged: {log}"
    );
    assert!(!log.contains('\x1b'), "escape codes in a log file: {log:?}");
    d.stop(libc::SIGINT);

    let d = h.daemon(&["--metrics", "localhost:19484"]);
    let body = h.pair.rx.scrape("localhost:19484");
    assert!(body.contains("ratelimit_attached"), "{body}");
    d.stop(libc::SIGINT);
}

#[test]
fn help_man_page_and_completions_come_from_the_binary() {
    let bin = ratelimit_bin();
    let run = |args: &[&str]| Command::new(&bin).args(args).output().expect("ratelimit");
    let out = run(&["--help"]);
    assert_eq!(code(&out), 0);
    let help = String::from_utf8_lossy(&out.stdout);
    for line in [
        "Exit status:",
        "  3  no daemon runs",
        "  5  permission denied",
    ] {
        assert!(help.contains(line), "--help lacks {line:?}: {help}");
    }
    let out = run(&["set", "--help"]);
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("Examples:\n  ratelimit set "),
        "set --help has no examples"
    );
    let out = run(&["man"]);
    assert_eq!(code(&out), 0);
    assert!(String::from_utf8_lossy(&out.stdout).contains(".TH ratelimit 8 "));
    let out = run(&["completions", "bash"]);
    assert_eq!(code(&out), 0);
    assert!(String::from_utf8_lossy(&out.stdout).contains("complete -F _ratelimit"));
    // A shell it does not know is a usage error, naming the shells it does.
    let out = run(&["completions", "tcsh"]);
    fails_with(&out, 2, "bash", "unknown shell");
}
