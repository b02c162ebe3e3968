//! The drop log (`ratelimit log`) under a flood: a source far over its limit
//! and a denied one, through a veth pair, with the log's budget small. What
//! is logged names the source, the rule, the reason, the protocol and the
//! port; the records stay within the budget (rate × seconds × CPUs, plus one
//! window) while the drops are far more, and the skipped count accounts for
//! the rest; `--json` has every field; `--follow` prints new entries and ends
//! on SIGINT, or when its output is closed.

use std::{
    io::{BufRead as _, BufReader},
    process::Stdio,
    sync::mpsc,
    time::{Duration, Instant},
};

use ratelimit_tests::{ChildGuard, Daemon, check::ip, fixture::Host, privileged};
use serde_json::Value;

const LIMITED_PORT: u16 = 5001;
const DENIED_PORT: u16 = 53;
/// The log's budget, records a second per CPU.
const BUDGET: u64 = 20;

/// The reasons that drop (or would), as `stats` names them.
const DROPPING: [&str; 12] = [
    "limited",
    "denied",
    "contended",
    "new_source_limited",
    "aggregate_limited",
    "aggregate_young",
    "not_allowed",
    "level2_limited",
    "level3_limited",
    "unjudged",
    "tiny_fragment",
    "would_drop",
];

fn drops(d: &Daemon) -> u64 {
    let stats = d.json(&["stats"]);
    stats["reasons"]
        .as_array()
        .expect("reasons")
        .iter()
        .filter(|r| DROPPING.contains(&r["reason"].as_str().unwrap_or("")))
        .map(|r| r["packets"].as_u64().unwrap_or(0))
        .sum()
}

/// `log -n 4096 --json`: one object a line.
fn entries(d: &Daemon) -> Vec<Value> {
    d.cli_ok(&["log", "-n", "4096", "--json"])
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("bad JSON line ({e}): {l}")))
        .collect()
}

fn cpus() -> u64 {
    std::thread::available_parallelism().map_or(1, |n| n.get() as u64)
}

#[test]
fn the_drop_log_under_a_flood_is_rate_limited_and_names_what_dropped() {
    privileged!("the_drop_log_under_a_flood_is_rate_limited_and_names_what_dropped");
    let (h, d) = Host::with_config(
        "droplog",
        r#"
drop-log = "20/s"

[[rule]]
cidr = "198.18.0.0/24"
rate = "100/s"
burst = 10

[[rule]]
cidr = "198.18.0.66/32"
action = "deny"
"#,
        &[],
    );
    let status = d.json(&["status"]);
    assert_eq!(status["drop_log"]["rate"], "20/s", "status: {status}");
    let flooder = ip("198.18.0.7");
    let denied = ip("198.18.0.66");
    let flows = [
        h.pair.flow(flooder, LIMITED_PORT, 5000),
        h.pair.flow(denied, DENIED_PORT, 200),
    ];
    let started = Instant::now();
    let sent = h.pair.send(&flows, Duration::from_secs(3));
    let span = started.elapsed().as_secs_f64();
    let offered: u64 = sent.iter().map(|s| s.frames).sum();

    // The reader drains the ring as it fills: wait until the daemon holds
    // what the program wrote.
    let deadline = Instant::now() + Duration::from_secs(5);
    let (logged, stats) = loop {
        let logged = entries(&d);
        let stats = d.json(&["stats"]);
        let written = stats["drop_log"]["written"].as_u64().expect("written");
        if logged.len() as u64 == written || Instant::now() > deadline {
            break (logged, stats);
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let log = &stats["drop_log"];
    let (written, skipped, lost) = (
        log["written"].as_u64().unwrap(),
        log["skipped"].as_u64().unwrap(),
        log["lost"].as_u64().unwrap(),
    );
    let dropped = drops(&d);
    eprintln!(
        "offered {offered} frames in {span:.1} s: {dropped} dropped, {written} logged, {skipped} skipped, {lost} lost; the daemon holds {}",
        logged.len()
    );
    assert_eq!(
        logged.len() as u64,
        written,
        "the daemon holds every record the program wrote"
    );
    // The budget: per CPU, at most BUDGET in each one-second window the
    // flood touched, plus the window it began in.
    let bound = BUDGET * cpus() * (span.ceil() as u64 + 1);
    assert!(
        written <= bound,
        "{written} records for {span:.1} s at {BUDGET}/s on {} CPUs: over {bound}",
        cpus()
    );
    assert!(
        written >= BUDGET * 2,
        "{written} records: the log wrote less than two seconds of its budget"
    );
    assert!(
        dropped > 10 * written,
        "{dropped} drops against {written} records: the flood was not far over the budget"
    );
    assert_eq!(
        written + skipped + lost,
        dropped,
        "every drop is logged, skipped or lost"
    );
    assert_eq!(lost, 0, "the daemon kept up with 20/s per CPU");

    // What the entries say.
    let of = |source: &str| -> Vec<&Value> {
        logged
            .iter()
            .filter(|e| e["source"] == source)
            .collect::<Vec<_>>()
    };
    let flooded = of("198.18.0.7");
    assert!(!flooded.is_empty(), "no entry for the flooder: {logged:?}");
    for e in &flooded {
        assert_eq!(e["rule"], "198.18.0.0/24", "{e}");
        assert_eq!(e["reason"], "limited", "{e}");
        assert_eq!(e["proto"], "udp", "{e}");
        assert_eq!(e["dport"], LIMITED_PORT, "{e}");
        assert_eq!(e["dry_run"], false, "{e}");
    }
    let denials = of("198.18.0.66");
    assert!(!denials.is_empty(), "no entry for the denied source");
    for e in &denials {
        assert_eq!(e["rule"], "198.18.0.66/32", "{e}");
        assert_eq!(e["reason"], "denied", "{e}");
        assert_eq!(e["dport"], DENIED_PORT, "{e}");
    }
    // Every field of --json, and the sequence in order.
    let e = flooded[0].as_object().expect("an object");
    let mut keys: Vec<&str> = e.keys().map(String::as_str).collect();
    keys.sort_unstable();
    assert_eq!(
        keys,
        [
            "dport", "dry_run", "len", "proto", "reason", "rule", "seq", "source", "time",
            "time_ms"
        ]
    );
    assert!(e["len"].as_u64().unwrap() >= 42, "{e:?}");
    assert!(e["time"].as_str().unwrap().ends_with('Z'), "{e:?}");
    let seqs: Vec<u64> = logged.iter().map(|e| e["seq"].as_u64().unwrap()).collect();
    assert!(seqs.windows(2).all(|w| w[1] == w[0] + 1), "{seqs:?}");

    // The text form: one line an entry, then the counts.
    let text = d.cli_ok(&["log", "-n", "3"]);
    eprintln!("$ ratelimit log -n 3\n{text}");
    let json = d.cli_ok(&["log", "-n", "2", "--json"]);
    eprintln!("$ ratelimit log -n 2 --json\n{json}");
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 4, "{text}");
    assert!(lines[3].starts_with("(drop log 20/s per CPU"), "{text}");
    assert!(lines[..3].iter().all(|l| l.contains("198.18.0.")), "{text}");

    // --follow: new entries only, until SIGINT.
    let mut cmd = d.cli_command(&["log", "--follow", "--json", "-n", "0"]);
    cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut follower = ChildGuard::spawn(cmd, "ratelimit log --follow");
    let out = follower.take_stdout().expect("stdout");
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(out).lines() {
            let Ok(line) = line else { return };
            if tx.send(line).is_err() {
                return;
            }
        }
    });
    std::thread::sleep(Duration::from_millis(500));
    let before = seqs.last().copied().unwrap_or(0);
    // A second of flood at a time until the follower prints (it may still be
    // starting on a slow machine), for 10 s at most.
    let mut followed = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(10);
    while followed.is_empty() && Instant::now() < deadline {
        h.pair.send(
            &[h.pair.flow(ip("198.18.0.8"), LIMITED_PORT, 2000)],
            Duration::from_secs(1),
        );
        while let Ok(line) = rx.recv_timeout(Duration::from_millis(600)) {
            followed.push(line);
        }
    }
    assert!(!followed.is_empty(), "--follow printed nothing new");
    for l in &followed {
        let e: Value = serde_json::from_str(l).unwrap_or_else(|err| panic!("{err}: {l}"));
        assert_eq!(
            e["source"], "198.18.0.8",
            "--follow printed an old entry: {e}"
        );
        assert!(e["seq"].as_u64().unwrap() > before, "{e}");
    }
    follower.signal(libc::SIGINT);
    let done = follower.wait(Duration::from_secs(5));
    assert!(
        done.status.success(),
        "--follow did not end cleanly on SIGINT: {:?} {}",
        done.status,
        String::from_utf8_lossy(&done.stderr)
    );

    // --follow ends when its reader goes, with nothing to write.
    let mut cmd = d.cli_command(&["log", "--follow", "-n", "0"]);
    cmd.stdout(Stdio::piped()).stderr(Stdio::null());
    let mut follower = ChildGuard::spawn(cmd, "ratelimit log --follow (output closed)");
    std::thread::sleep(Duration::from_millis(300));
    drop(follower.take_stdout());
    let deadline = Instant::now() + Duration::from_secs(3);
    while follower.exited().is_none() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(
        follower.exited().is_some_and(|s| s.success()),
        "--follow went on after its output was closed"
    );
}

#[test]
fn the_drop_log_off_writes_nothing_and_a_bad_rate_names_its_option() {
    privileged!("the_drop_log_off_writes_nothing_and_a_bad_rate_names_its_option");
    let h = Host::bare("droplog-off");
    let refused = h
        .daemon_command(&["--drop-log", "lots"])
        .output()
        .expect("running ratelimit run");
    assert!(!refused.status.success());
    let err = String::from_utf8_lossy(&refused.stderr);
    assert!(err.contains("--drop-log") && err.contains("100/s"), "{err}");

    let d = h.daemon(&["--drop-log", "off", "--rate", "10/s", "--burst", "5"]);
    h.pair.send(
        &[h.pair.flow(ip("198.18.0.9"), LIMITED_PORT, 1000)],
        Duration::from_secs(1),
    );
    let stats = d.json(&["stats"]);
    assert_eq!(stats["drop_log"]["rate"], "off", "{stats}");
    assert_eq!(stats["drop_log"]["written"], 0, "{stats}");
    assert_eq!(stats["drop_log"]["skipped"], 0, "{stats}");
    assert!(drops(&d) > 100, "the source was not limited");
    let out = d.cli(&["log"]);
    assert!(out.status.success());
    assert!(out.stdout.starts_with(b"(drop log off"), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("the drop log is off"),
        "{out:?}"
    );
}
