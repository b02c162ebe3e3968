//! Bans that end by themselves: a temporary deny ends on time and survives
//! a restart; fail2ban's action and a bulk ban from standard input end by
//! themselves, and an unban lifts at once.

use std::{
    path::Path,
    process::{Output, Stdio},
    thread::sleep,
    time::{Duration, Instant},
};

use ratelimit_tests::{check::ip, fixture::Host, privileged, ratelimit_bin};
use serde_json::Value;

use super::{rule, text};

#[test]
fn a_temporary_deny_ends_on_time_and_survives_a_restart() {
    privileged!("a_temporary_deny_ends_on_time_and_survives_a_restart");
    let (h, d) = Host::start("temp", &["--rate", "1000/s"]);
    let bad = ip("198.18.0.66");
    let good = ip("198.18.0.67");
    // A config rule under the ban comes back when it ends.
    d.cli_ok(&["allow", "198.18.0.66/32"]);
    // The ban starts inside this call: between `asked` and `set_at`. Its
    // 8 s leave room for a slow restart before its end.
    const BAN: f64 = 8.0;
    let asked = Instant::now();
    let out = d.cli_ok(&["deny", "198.18.0.66/32", "--for", "8s"]);
    let set_at = Instant::now();
    assert_eq!(
        out.lines().count(),
        2,
        "one change, before and after: {out}"
    );
    assert!(out.contains("ends in 8s"), "{out}");
    let got = h
        .pair
        .probe(&[(bad, 200), (good, 200)], Duration::from_millis(500));
    assert_eq!(
        got.get(&bad).copied().unwrap_or(0),
        0,
        "the ban let frames through"
    );
    assert!(got.get(&good).copied().unwrap_or(0) > 90, "{got:?}");

    // Killed and restarted: the ban is back with its time.
    let before = d.json(&["list"]);
    let ends_at = rule(&before, "198.18.0.66/32").expect("the ban")["expires_at"].clone();
    d.stop(libc::SIGKILL);
    sleep(Duration::from_millis(500));
    let d = h.daemon(&["--rate", "1000/s"]);
    let looked = Instant::now();
    let after = d.json(&["list"]);
    let answered = Instant::now();
    let r = rule(&after, "198.18.0.66/32").expect("the ban survived the restart");
    assert_eq!(r["action"], "deny", "{r}");
    assert_eq!(r["expires_at"], ends_at, "{r}");
    let left = r["expires_in_s"].as_f64().expect("a number");
    let (least, most) = (
        BAN - (answered - asked).as_secs_f64() - 0.5,
        BAN - (looked - set_at).as_secs_f64() + 0.5,
    );
    assert!(
        (least..=most).contains(&left),
        "{left} s left after the restart, {least:.2}..{most:.2} s expected"
    );

    // It ends on time (never before; within the daemon's check of ends and a
    // look after), and what it hid is back.
    let (seen_at, seen_by) = loop {
        let look = Instant::now();
        let l = d.json(&["list"]);
        let r = rule(&l, "198.18.0.66/32").expect("the allow stays");
        if r["action"] == "allow" {
            assert_eq!(r["expires_at"], Value::Null, "{r}");
            break (look, Instant::now());
        }
        assert!(
            set_at.elapsed() < Duration::from_secs(12),
            "never ended: {l}"
        );
        sleep(Duration::from_millis(50));
    };
    let (by, from) = (
        (seen_by - asked).as_secs_f64(),
        (seen_at - set_at).as_secs_f64(),
    );
    assert!(
        by >= BAN - 0.1 && from <= BAN + 1.5,
        "ended {by:.2} s (seen at most) / {from:.2} s (looked from) after an {BAN} s ban"
    );
    let got = h.pair.probe(&[(bad, 200)], Duration::from_millis(500));
    assert!(
        got.get(&bad).copied().unwrap_or(0) > 90,
        "frames still dropped after the ban ended: {got:?}"
    );
    assert!(
        d.output().contains("temporary rules ended"),
        "{}",
        d.output()
    );
}

/// The value of `key` in an ini section of fail2ban's kind: its first line
/// and the indented lines that continue it.
fn ini_value(text: &str, key: &str) -> String {
    let mut lines = text
        .lines()
        .skip_while(|l| !l.starts_with(&format!("{key} =")));
    let first = lines
        .next()
        .unwrap_or_else(|| panic!("no {key} in the action file"));
    let mut value = first
        .split_once('=')
        .map_or("", |(_, v)| v)
        .trim()
        .to_string();
    for l in lines.take_while(|l| l.starts_with(' ') || l.starts_with('\t')) {
        value.push('\n');
        value.push_str(l.trim());
    }
    value
}

#[test]
fn the_fail2ban_action_and_a_bulk_ban_from_stdin_end_by_themselves() {
    privileged!("the_fail2ban_action_and_a_bulk_ban_from_stdin_end_by_themselves");
    let (h, d) = Host::start("f2b", &[]);
    let action = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../dist/fail2ban/ratelimit.conf"),
    )
    .expect("dist/fail2ban/ratelimit.conf");
    // What fail2ban runs: its tags filled in, through a shell, in the
    // daemon's namespace.
    let fail2ban = |key: &str, addr: &str, bantime: &str| -> Output {
        let cmd = ini_value(&action, key)
            .replace("<ratelimit>", &ratelimit_bin().display().to_string())
            .replace("<iface_opt>", &format!("--iface {}", h.pair.rx_if))
            .replace("<ip>", addr)
            .replace("<bantime>", bantime);
        let out = h
            .pair
            .rx
            .command("sh")
            .args(["-c", &cmd])
            .env("RATELIMIT_RUN_DIR", h.run_dir())
            .output()
            .expect("sh");
        assert!(out.status.success(), "{key}: {cmd}: {}", text(&out.stderr));
        assert_eq!(text(&out.stdout), "", "{key} printed");
        out
    };
    fail2ban("actioncheck", "", "");
    // Short bans, yet long enough to be seen in force on a slow machine.
    fail2ban("actionban", "198.18.0.66", "5");
    fail2ban("actionban", "2001:db8::66", "-1");
    fail2ban("actionban", "198.18.0.67", "600");
    let l = d.json(&["list"]);
    let ban = rule(&l, "198.18.0.66/32").expect("the 5 s ban");
    assert!(ban["expires_in_s"].as_f64().unwrap_or(0.0) <= 5.0, "{ban}");
    let forever = rule(&l, "2001:db8::66/128").expect("the permanent ban");
    assert!(
        forever["expires_in_s"].as_f64().unwrap_or(0.0) > 300_000_000.0,
        "a permanent ban is one of ten years: {forever}"
    );
    let got = h
        .pair
        .probe(&[(ip("198.18.0.66"), 200)], Duration::from_millis(300));
    assert_eq!(got.get(&ip("198.18.0.66")).copied().unwrap_or(0), 0);
    // An unban ends a ban at once, and what it hid comes back.
    d.cli_ok(&["allow", "198.18.0.68/32", "-q"]);
    fail2ban("actionban", "198.18.0.68", "600");
    fail2ban("actionunban", "198.18.0.67", "");
    fail2ban("actionunban", "198.18.0.68", "");
    let l = d.json(&["list"]);
    assert_eq!(
        rule(&l, "198.18.0.68/32").expect("the allow under the ban")["action"],
        "allow",
        "{l}"
    );

    // CrowdSec's way: decisions piped in, banned for a while as one list.
    let mut bulk = h.command(&[
        "deny", "--from", "-", "--name", "crowdsec", "--for", "5s", "--iface", &d.iface,
    ]);
    bulk.stdin(Stdio::piped()).stdout(Stdio::piped());
    let mut child = bulk.spawn().expect("deny --from -");
    {
        use std::io::Write as _;
        let mut stdin = child.stdin.take().expect("stdin");
        stdin
            .write_all(b"198.18.3.1\n198.18.3.2\n2001:db8:3::/48\n")
            .expect("writing the decisions");
    }
    let out = child.wait_with_output().expect("deny --from -");
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).contains("3 entries"),
        "{}",
        text(&out.stdout)
    );
    let lists = d.json(&["list"])["lists"].clone();
    assert_eq!(lists[0]["name"], "crowdsec", "{lists}");
    assert!(lists[0]["expires_at"].is_string(), "{lists}");

    // Both ended (the list's 5 s came last; a second more for the daemon's
    // check of ends).
    sleep(Duration::from_millis(6200));
    let l = d.json(&["list"]);
    assert!(
        rule(&l, "198.18.0.66/32").is_none(),
        "the 5 s ban stayed: {l}"
    );
    assert!(rule(&l, "198.18.0.67/32").is_none(), "unbanned stayed: {l}");
    assert!(
        rule(&l, "2001:db8::66/128").is_some(),
        "the permanent ban ended"
    );
    assert_eq!(
        l["lists"],
        serde_json::json!([]),
        "the 5 s list stayed: {l}"
    );
    // fail2ban's unban after the ban ended by itself: no change, no error,
    // and an allow set since stays.
    d.cli_ok(&["allow", "198.18.0.66/32", "-q"]);
    fail2ban("actionunban", "198.18.0.66", "");
    assert_eq!(
        rule(&d.json(&["list"]), "198.18.0.66/32").expect("allow")["action"],
        "allow"
    );
    let got = h
        .pair
        .probe(&[(ip("198.18.0.66"), 200)], Duration::from_millis(300));
    assert!(
        got.get(&ip("198.18.0.66")).copied().unwrap_or(0) > 30,
        "{got:?}"
    );
}
