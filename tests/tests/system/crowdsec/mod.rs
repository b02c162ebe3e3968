//! The native CrowdSec bouncer against a real Local API (Debian's `crowdsec`,
//! see `ratelimit_tests::crowdsec`), decisions added and deleted with
//! `cscli`, frames counted at the receiver: bans of an address and of a
//! range land within the stream's interval and drop; a deletion lifts one;
//! a decision ends at its time with no Local API, across a daemon restart
//! too; a Local API restarted (or come back empty) is resynced; a rule made
//! by hand on a banned CIDR survives; drops are counted per origin (stats,
//! Prometheus); an `https://` Local API is followed with its CA, and a
//! certificate another CA signed is refused and said so.

use std::{
    net::IpAddr,
    thread::sleep,
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use ratelimit_tests::{check::ip, crowdsec::Lapi, fixture::Host, privileged, require_tool};

mod feed;

/// Time between two pulls in these tests (the default is 10 s).
const EVERY: &str = "1s";
/// How long a decision may take to land: an interval, the pull, the
/// change, and the CLI's look.
const LANDS_WITHIN: Duration = Duration::from_millis(2500);
/// Frames a second from each source in a probe.
const PPS: u32 = 200;
/// A probe's length.
const PROBE: Duration = Duration::from_millis(600);

/// Skips (or, under CI, fails) without Debian's crowdsec.
macro_rules! needs_crowdsec {
    ($name:expr) => {
        privileged!($name);
        if !require_tool($name, "crowdsec") || !require_tool($name, "cscli") {
            return;
        }
    };
}

/// Starts a host, a Local API in its receiving namespace, and a daemon
/// following it (with `extra` options).
fn start(tag: &str, extra: &[&str]) -> (Host, Lapi, ratelimit_tests::Daemon) {
    let h = Host::bare(tag);
    let lapi = Lapi::start(&h.pair.rx);
    let mut args: Vec<String> = lapi.run_args(EVERY);
    args.extend(extra.iter().map(|s| s.to_string()));
    let refs: Vec<&str> = args.iter().map(String::as_str).collect();
    let d = h.daemon(&refs);
    (h, lapi, d)
}

/// The entries of the list `name` (`None`: no such list).
fn entries(d: &ratelimit_tests::Daemon, name: &str) -> Option<u64> {
    let list = d.json(&["list"]);
    list["lists"]
        .as_array()
        .expect("lists")
        .iter()
        .find(|l| l["name"] == name)
        .map(|l| l["entries"].as_u64().expect("entries"))
}

/// `status --json` once its `crowdsec` part meets `ok`, within 10 s.
fn poll_status(
    d: &ratelimit_tests::Daemon,
    ok: impl Fn(&serde_json::Value) -> bool,
) -> serde_json::Value {
    let start = Instant::now();
    loop {
        let status = d.json(&["status"]);
        if ok(&status["crowdsec"]) {
            return status;
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "the bouncer's status did not come to what the test waits for: {status}"
        );
        sleep(Duration::from_millis(100));
    }
}

/// Waits until `entries(d, name)` is `want`; how long it took.
fn wait_entries(d: &ratelimit_tests::Daemon, name: &str, want: u64, within: Duration) -> Duration {
    let start = Instant::now();
    loop {
        let got = entries(d, name);
        if got == Some(want) {
            return start.elapsed();
        }
        assert!(
            start.elapsed() < within,
            "{name} did not hold {want} entries within {within:?} (it holds {got:?}); the daemon's output: {}",
            d.output()
        );
        sleep(Duration::from_millis(50));
    }
}

/// Sends from each source for [`PROBE`]: (sent, arrived) each.
fn probe(h: &Host, sources: &[IpAddr]) -> Vec<(u64, u64)> {
    h.pair.probe_sent(sources, PPS, PROBE)
}

/// Asserts that each of `sources` got nothing through and each of `open`
/// got everything.
fn assert_dropped(h: &Host, dropped: &[IpAddr], open: &[IpAddr]) -> u64 {
    let all: Vec<IpAddr> = dropped.iter().chain(open).copied().collect();
    let got = probe(h, &all);
    let mut sent_dropped = 0;
    for (src, (sent, arrived)) in all.iter().zip(&got) {
        assert!(*sent > 0, "nothing sent from {src}");
        if dropped.contains(src) {
            assert_eq!(
                *arrived, 0,
                "{src} is banned, yet {arrived} of {sent} frames arrived"
            );
            sent_dropped += sent;
        } else {
            assert_eq!(
                arrived, sent,
                "{src} is not banned, yet only {arrived} of {sent} frames arrived"
            );
        }
    }
    sent_dropped
}

/// The daemon's `stats --json` row of CrowdSec origin `origin`: (entries,
/// dropped packets).
fn origin_stats(d: &ratelimit_tests::Daemon, origin: &str) -> (u64, u64) {
    let stats = d.json(&["stats"]);
    let row = stats["crowdsec"]
        .as_array()
        .unwrap_or_else(|| panic!("no crowdsec in stats: {stats}"))
        .iter()
        .find(|o| o["origin"] == origin)
        .unwrap_or_else(|| panic!("no origin {origin} in stats: {stats}"))
        .clone();
    (
        row["entries"].as_u64().expect("entries"),
        row["dropped_packets"].as_u64().expect("dropped_packets"),
    )
}

#[test]
fn bans_of_an_address_and_a_range_drop_within_the_interval_and_a_deletion_lifts_one() {
    needs_crowdsec!(
        "bans_of_an_address_and_a_range_drop_within_the_interval_and_a_deletion_lifts_one"
    );
    let (h, lapi, d) = start("cs-ban", &[]);
    let (banned, in_range, other) = (ip("198.18.0.5"), ip("198.18.7.9"), ip("198.18.0.6"));
    // Nothing banned yet: everyone passes.
    assert_dropped(&h, &[], &[banned, in_range, other]);

    lapi.cscli_ok(&["decisions", "add", "--ip", "198.18.0.5", "--duration", "2m"]);
    lapi.cscli_ok(&[
        "decisions",
        "add",
        "--range",
        "198.18.7.0/24",
        "--duration",
        "2m",
    ]);
    // A captcha is not applied (the default types: ban only).
    lapi.cscli_ok(&[
        "decisions",
        "add",
        "--ip",
        "198.18.0.7",
        "--duration",
        "2m",
        "--type",
        "captcha",
    ]);
    let took = wait_entries(&d, "crowdsec:cscli", 2, LANDS_WITHIN);
    println!("the bans landed {took:?} after cscli returned");
    assert_dropped(&h, &[banned, in_range], &[other, ip("198.18.0.7")]);
    let status = d.json(&["status"]);
    let cs = &status["crowdsec"];
    assert_eq!(cs["lapi_up"], true, "{status}");
    assert_eq!(cs["ignored"]["by_type"], 1, "{status}");
    let list = d.json(&["list"]);
    let l = list["lists"]
        .as_array()
        .expect("lists")
        .iter()
        .find(|l| l["name"] == "crowdsec:cscli")
        .expect("the list");
    assert_eq!(
        (l["origin"].as_str(), l["action"].as_str()),
        (Some("crowdsec"), Some("deny")),
        "{l}"
    );

    lapi.cscli_ok(&["decisions", "delete", "--ip", "198.18.0.5"]);
    wait_entries(&d, "crowdsec:cscli", 1, LANDS_WITHIN);
    assert_dropped(&h, &[in_range], &[banned, other]);
    lapi.cscli_ok(&["decisions", "delete", "--range", "198.18.7.0/24"]);
    wait_entries(&d, "crowdsec:cscli", 0, LANDS_WITHIN);
    assert_dropped(&h, &[], &[banned, in_range, other]);
}

#[test]
fn drops_are_counted_per_origin_in_stats_and_prometheus() {
    needs_crowdsec!("drops_are_counted_per_origin_in_stats_and_prometheus");
    let (h, lapi, d) = start("cs-origin", &["--metrics", "127.0.0.1:9477"]);
    lapi.cscli_ok(&["decisions", "add", "--ip", "198.18.0.5", "--duration", "2m"]);
    let csv = lapi.dir.0.join("import.csv");
    std::fs::write(
        &csv,
        "value,duration,reason\n198.18.3.3,2m,test\n198.18.3.4,2m,test\n",
    )
    .expect("writing the import");
    lapi.cscli_ok(&["decisions", "import", "-i", &csv.display().to_string()]);
    wait_entries(&d, "crowdsec:cscli", 1, LANDS_WITHIN);
    wait_entries(&d, "crowdsec:cscli-import", 2, LANDS_WITHIN);
    let dropped_cscli = assert_dropped(&h, &[ip("198.18.0.5")], &[ip("198.18.0.6")]);
    let dropped_import = assert_dropped(&h, &[ip("198.18.3.3"), ip("198.18.3.4")], &[]);
    assert_eq!(origin_stats(&d, "cscli"), (1, dropped_cscli));
    assert_eq!(origin_stats(&d, "cscli-import"), (2, dropped_import));

    let text = h.pair.rx.scrape("127.0.0.1:9477");
    let iface = &d.iface;
    for line in [
        format!(
            "ratelimit_crowdsec_dropped_packets_total{{iface=\"{iface}\",origin=\"cscli\"}} {dropped_cscli}"
        ),
        format!(
            "ratelimit_crowdsec_dropped_packets_total{{iface=\"{iface}\",origin=\"cscli-import\"}} {dropped_import}"
        ),
        format!("ratelimit_crowdsec_decisions{{iface=\"{iface}\",origin=\"cscli-import\"}} 2"),
        format!("ratelimit_crowdsec_lapi_up{{iface=\"{iface}\"}} 1"),
    ] {
        assert!(
            text.lines().any(|l| l == line),
            "no `{line}` in the metrics:\n{text}"
        );
    }
    // Per origin, never per address.
    assert!(
        !text
            .lines()
            .any(|l| l.starts_with("ratelimit_crowdsec") && l.contains("198.18.")),
        "an address in a label:\n{text}"
    );
}

#[test]
fn a_decision_ends_at_its_time_with_no_local_api_across_a_restart_too() {
    needs_crowdsec!("a_decision_ends_at_its_time_with_no_local_api_across_a_restart_too");
    let (h, mut lapi, d) = start("cs-ttl", &[]);
    let banned = ip("198.18.0.5");
    lapi.cscli_ok(&["decisions", "add", "--ip", "198.18.0.8", "--duration", "1h"]);
    // The Local API stores the ban somewhere inside this `cscli` call and
    // keeps its end in whole seconds (the second it was stored + TTL): that
    // end is the daemon's, read as time left when it pulls. The TTL leaves
    // room for what comes before the end on a slow machine (cscli, a
    // restart).
    const TTL: u64 = 20;
    let asked = SystemTime::now();
    lapi.cscli_ok(&[
        "decisions",
        "add",
        "--ip",
        "198.18.0.5",
        "--duration",
        &format!("{TTL}s"),
    ]);
    let added = SystemTime::now();
    wait_entries(&d, "crowdsec:cscli", 2, LANDS_WITHIN);
    lapi.stop();
    // The Local API gone: what is held stays, and the daemon says so once,
    // however many pulls fail.
    let status = poll_status(&d, |c| c["failed_pulls"].as_u64() >= Some(2));
    assert_eq!(status["crowdsec"]["lapi_up"], false, "{status}");
    assert_dropped(&h, &[banned], &[ip("198.18.0.6")]);
    let out = d.output();
    assert_eq!(
        out.matches("the Local API cannot be reached").count(),
        1,
        "one line for the loss, however many pulls fail: {out}"
    );
    // A restart with no Local API: the saved decisions come back with their ends.
    d.stop(libc::SIGKILL);
    let d = h.daemon(
        &lapi
            .run_args(EVERY)
            .iter()
            .map(String::as_str)
            .collect::<Vec<_>>(),
    );
    assert_eq!(entries(&d, "crowdsec:cscli"), Some(2), "{}", d.output());
    assert_dropped(&h, &[banned], &[]);
    // Its end: never before it is due, and within the daemon's check of
    // ends (one `EVERY`) after it.
    let whole_second = |t: SystemTime| {
        UNIX_EPOCH
            + Duration::from_secs(t.duration_since(UNIX_EPOCH).expect("after 1970").as_secs())
    };
    let (earliest, latest) = (
        whole_second(asked) + Duration::from_secs(TTL),
        whole_second(added) + Duration::from_secs(TTL),
    );
    assert!(
        SystemTime::now() + Duration::from_secs(1) < earliest,
        "too slow to see the ban before its end"
    );
    // `seen` is when the look that found it ended began: it had ended by then.
    let mut seen = SystemTime::now();
    while seen < latest + Duration::from_millis(2500) && entries(&d, "crowdsec:cscli") != Some(1) {
        sleep(Duration::from_millis(50));
        seen = SystemTime::now();
    }
    assert_eq!(entries(&d, "crowdsec:cscli"), Some(1), "{}", d.output());
    assert!(
        seen >= earliest,
        "the ban had ended {:?} before its time",
        earliest.duration_since(seen).unwrap_or_default()
    );
    assert!(
        seen <= latest + Duration::from_millis(2000),
        "the ban ended {:?} after its time",
        seen.duration_since(latest).unwrap_or_default()
    );
    assert_dropped(&h, &[ip("198.18.0.8")], &[banned]);
}

#[test]
fn a_local_api_restarted_is_resynced_and_what_it_no_longer_has_ends() {
    needs_crowdsec!("a_local_api_restarted_is_resynced_and_what_it_no_longer_has_ends");
    let (h, mut lapi, d) = start("cs-resync", &[]);
    lapi.cscli_ok(&["decisions", "add", "--ip", "198.18.0.5", "--duration", "1h"]);
    wait_entries(&d, "crowdsec:cscli", 1, LANDS_WITHIN);
    lapi.stop();
    poll_status(&d, |c| c["lapi_up"] == false);
    assert_dropped(&h, &[ip("198.18.0.5")], &[]);
    // Back on the same database: nothing lost, and a new ban lands.
    lapi.restart();
    lapi.cscli_ok(&["decisions", "add", "--ip", "198.18.0.9", "--duration", "1h"]);
    wait_entries(&d, "crowdsec:cscli", 2, LANDS_WITHIN);
    assert_dropped(&h, &[ip("198.18.0.5"), ip("198.18.0.9")], &[]);
    let out = d.output();
    assert_eq!(
        out.matches("the Local API cannot be reached").count(),
        1,
        "{out}"
    );
    assert_eq!(
        out.matches("the Local API answers again").count(),
        1,
        "{out}"
    );

    // Back empty (a new database, the same bouncer key): the resync ends
    // what it no longer has; its one decision lands.
    drop(lapi);
    poll_status(&d, |c| c["lapi_up"] == false);
    let lapi = Lapi::start(&h.pair.rx);
    lapi.cscli_ok(&[
        "decisions",
        "add",
        "--range",
        "198.18.7.0/24",
        "--duration",
        "1h",
    ]);
    wait_entries(&d, "crowdsec:cscli", 1, Duration::from_secs(5));
    assert_dropped(
        &h,
        &[ip("198.18.7.1")],
        &[ip("198.18.0.5"), ip("198.18.0.9")],
    );
}

#[test]
fn a_rule_made_by_hand_on_a_banned_cidr_survives_deletions_and_resyncs() {
    needs_crowdsec!("a_rule_made_by_hand_on_a_banned_cidr_survives_deletions_and_resyncs");
    let (h, mut lapi, d) = start("cs-hand", &[]);
    // By hand: a deny of 198.18.0.5, an allow of 198.18.0.7 (the operator's
    // word beats CrowdSec's), and a list named as docs/guide/bans.md's piped recipe.
    d.cli_ok(&["deny", "198.18.0.5/32"]);
    d.cli_ok(&["allow", "198.18.0.7/32"]);
    let list = h.write("crowdsec.txt", "198.18.9.9\n");
    d.cli_ok(&["deny", "--from", &list, "--name", "crowdsec"]);
    for addr in ["198.18.0.5", "198.18.0.6", "198.18.0.7", "198.18.9.9"] {
        lapi.cscli_ok(&["decisions", "add", "--ip", addr, "--duration", "1h"]);
    }
    wait_entries(&d, "crowdsec:cscli", 4, LANDS_WITHIN);
    assert_dropped(
        &h,
        &[ip("198.18.0.5"), ip("198.18.0.6"), ip("198.18.9.9")],
        &[ip("198.18.0.7")],
    );
    // A resync (the Local API restarted) and every decision deleted.
    lapi.restart();
    sleep(Duration::from_millis(1500));
    for addr in ["198.18.0.5", "198.18.0.6", "198.18.0.7", "198.18.9.9"] {
        lapi.cscli_ok(&["decisions", "delete", "--ip", addr]);
    }
    wait_entries(&d, "crowdsec:cscli", 0, Duration::from_secs(5));
    // The hand-made rules and list are as they were.
    assert_dropped(
        &h,
        &[ip("198.18.0.5"), ip("198.18.9.9")],
        &[ip("198.18.0.6"), ip("198.18.0.7")],
    );
    let list = d.json(&["list"]);
    let rules: Vec<(&str, &str)> = list["rules"]
        .as_array()
        .expect("rules")
        .iter()
        .map(|r| {
            (
                r["cidr"].as_str().unwrap_or(""),
                r["action"].as_str().unwrap_or(""),
            )
        })
        .collect();
    assert!(rules.contains(&("198.18.0.5/32", "deny")), "{list}");
    assert!(rules.contains(&("198.18.0.7/32", "allow")), "{list}");
    assert_eq!(entries(&d, "crowdsec"), Some(1), "{list}");
    // CrowdSec's list is not the operator's to unset.
    let out = d.cli(&["unset", "--list", "crowdsec:cscli"]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("cscli decisions delete"),
        "{out:?}"
    );
}

/// An `https://` Local API (a certificate of the test's own CA): a daemon
/// given that CA (`--crowdsec-ca`) follows it and drops its bans; a daemon
/// given another CA pulls nothing, keeps what it held, and says that the
/// certificate is the reason and which option fixes it.
#[test]
fn an_https_local_api_is_followed_with_its_ca_and_refused_under_another() {
    needs_crowdsec!("an_https_local_api_is_followed_with_its_ca_and_refused_under_another");
    let (ca, cert, key) = ratelimit_tests::serve::test_ca();
    let (other_ca, _, _) = ratelimit_tests::serve::test_ca();
    let h = Host::bare("cs-tls");
    let lapi = Lapi::start_tls(&h.pair.rx, &cert, &key);
    assert!(lapi.url().starts_with("https://"), "{}", lapi.url());
    let ca_file = lapi.dir.0.join("ca.pem");
    let other_file = lapi.dir.0.join("other-ca.pem");
    std::fs::write(&ca_file, ca).unwrap();
    std::fs::write(&other_file, other_ca).unwrap();
    let args = |cas: &std::path::Path| {
        let mut a = lapi.run_args(EVERY);
        a.extend(["--crowdsec-ca".to_string(), cas.display().to_string()]);
        a
    };
    let run = |a: Vec<String>| h.daemon(&a.iter().map(String::as_str).collect::<Vec<_>>());

    let d = run(args(&ca_file));
    lapi.cscli_ok(&["decisions", "add", "--ip", "198.18.0.5", "--duration", "2m"]);
    wait_entries(&d, "crowdsec:cscli", 1, LANDS_WITHIN);
    assert_dropped(&h, &[ip("198.18.0.5")], &[ip("198.18.0.6")]);
    let status = d.json(&["status"]);
    assert_eq!(status["crowdsec"]["lapi_up"], true, "{status}");
    assert_eq!(status["crowdsec"]["lapi"], lapi.url(), "{status}");
    d.stop(libc::SIGTERM);

    // Another CA: the handshake fails on the certificate, every pull.
    let d = run(args(&other_file));
    lapi.cscli_ok(&["decisions", "add", "--ip", "198.18.0.7", "--duration", "2m"]);
    let status = poll_status(&d, |c| c["failed_pulls"].as_u64() >= Some(2));
    let crowdsec = &status["crowdsec"];
    assert_eq!(crowdsec["lapi_up"], false, "{status}");
    assert_eq!(crowdsec["pulls"], 0, "{status}");
    let error = crowdsec["error"].as_str().unwrap_or_default();
    assert!(
        error.contains("certificate") && error.contains("--crowdsec-ca"),
        "the reason does not name the certificate and the option: {status}"
    );
    // What it held from the saved decisions stays; nothing new lands.
    assert_dropped(&h, &[ip("198.18.0.5")], &[ip("198.18.0.7")]);
}

/// A Local API that bans the whole Internet (0.0.0.0/0, ::/0) does not cut
/// the host off: those decisions are not applied, counted as too_broad and
/// logged once with their origin, while a ban of one address lands.
#[test]
fn bans_of_the_whole_internet_are_refused_counted_and_named() {
    needs_crowdsec!("bans_of_the_whole_internet_are_refused_counted_and_named");
    let (h, lapi, d) = start("cs-broad", &[]);
    lapi.cscli_ok(&[
        "decisions",
        "add",
        "--range",
        "0.0.0.0/0",
        "--duration",
        "1h",
    ]);
    lapi.cscli_ok(&["decisions", "add", "--range", "::/0", "--duration", "1h"]);
    lapi.cscli_ok(&["decisions", "add", "--ip", "198.18.0.5", "--duration", "1h"]);
    wait_entries(&d, "crowdsec:cscli", 1, LANDS_WITHIN);
    let status = poll_status(&d, |c| c["ignored"]["too_broad"].as_u64() >= Some(2));
    assert_eq!(
        status["crowdsec"]["decisions"], 1,
        "only the ban of one address is held: {status}"
    );
    assert_dropped(
        &h,
        &[ip("198.18.0.5")],
        &[ip("198.18.0.6"), ip("198.18.0.1")],
    );
    let out = d.output();
    let said = out
        .lines()
        .filter(|l| l.contains("wider than --crowdsec-widest") && l.contains("cscli"))
        .count();
    assert_eq!(said, 1, "logged once for the origin cscli: {out}");
}

/// Bans of what must stay reachable, loopback and the host's own address
/// (the Local API's is loopback here), are not applied: counted as
/// protected and logged once with their origin.
#[test]
fn bans_of_loopback_and_the_hosts_own_address_are_refused() {
    needs_crowdsec!("bans_of_loopback_and_the_hosts_own_address_are_refused");
    let (h, lapi, d) = start("cs-own", &[]);
    let own = h.pair.rx_v4.to_string();
    lapi.cscli_ok(&["decisions", "add", "--ip", &own, "--duration", "1h"]);
    lapi.cscli_ok(&["decisions", "add", "--ip", "127.0.0.1", "--duration", "1h"]);
    lapi.cscli_ok(&["decisions", "add", "--ip", "198.18.0.5", "--duration", "1h"]);
    wait_entries(&d, "crowdsec:cscli", 1, LANDS_WITHIN);
    let status = poll_status(&d, |c| c["ignored"]["protected"].as_u64() >= Some(2));
    assert_eq!(
        status["crowdsec"]["decisions"], 1,
        "only the ban of another address is held: {status}"
    );
    assert_dropped(&h, &[ip("198.18.0.5")], &[ip("198.18.0.6")]);
    let out = d.output();
    let said = out
        .lines()
        .filter(|l| l.contains("covers loopback, an address of this host") && l.contains("cscli"))
        .count();
    assert_eq!(said, 1, "logged once for the origin cscli: {out}");
}

/// Past `--crowdsec-max-decisions` the newest decisions are not applied:
/// counted as over_cap, logged once, the oldest held and enforced.
#[test]
fn decisions_past_the_cap_are_counted_and_the_oldest_held() {
    needs_crowdsec!("decisions_past_the_cap_are_counted_and_the_oldest_held");
    let (h, lapi, d) = start("cs-cap", &["--crowdsec-max-decisions", "2"]);
    for a in ["198.18.0.5", "198.18.0.6", "198.18.0.7"] {
        lapi.cscli_ok(&["decisions", "add", "--ip", a, "--duration", "1h"]);
    }
    let status = poll_status(&d, |c| c["over_cap"].as_u64() >= Some(1));
    assert_eq!(status["crowdsec"]["decisions"], 2, "{status}");
    assert_dropped(
        &h,
        &[ip("198.18.0.5"), ip("198.18.0.6")],
        &[ip("198.18.0.7")],
    );
    let out = d.output();
    assert_eq!(
        out.matches("more decisions than --crowdsec-max-decisions")
            .count(),
        1,
        "logged once: {out}"
    );
}
