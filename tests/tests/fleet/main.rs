//! Fleet-wide rules: three daemons on three namespace pairs share one limit
//! per source through one real `redis-server` (on a unix socket, which every
//! namespace reaches); Redis stopped and started under traffic. The faults
//! by subject in `fleet/` (Redis over TCP from a namespace of its own, see
//! `ratelimit_tests::fleet`): restarts of every kind, a daemon cut off, a
//! daemon dead, Redis slow, a Cluster master down and back.

mod beat;
mod cluster;
mod faults;
mod load;
mod restarts;
mod store;

use std::{
    net::IpAddr,
    thread::sleep,
    time::{Duration, Instant},
};

use ratelimit_tests::{Daemon, fixture::Host, net::Receiver, privileged, redis::RedisServer};

const PORT: u16 = 5999;
const RATE: f64 = 100.0;
const BURST: f64 = 20.0;

/// One daemon of the fleet on a host of its own. The daemon comes first, so
/// that it is killed before its host's namespaces go.
struct Member {
    daemon: Daemon,
    host: Host,
}

fn fleet(redis: &RedisServer, extra: &[&str]) -> Vec<Member> {
    (0..3)
        .map(|i| {
            let url = redis.unix_url();
            let mut args = vec!["--fleet", url.as_str()];
            args.extend_from_slice(extra);
            let (host, daemon) = Host::start(&format!("fleet{i}"), &args);
            daemon.cli_ok(&[
                "set",
                "198.18.0.0/24",
                "--rate",
                "100/s",
                "--burst",
                "20",
                "--fleet",
            ]);
            Member { daemon, host }
        })
        .collect()
}

/// One source sends `pps` to each host for `secs`; frames received per host.
fn flood(hosts: &[Member], src: IpAddr, pps: u32, dur: Duration) -> Vec<u64> {
    let receivers: Vec<Receiver> = hosts.iter().map(|h| h.host.pair.receiver(PORT)).collect();
    let senders: Vec<_> = hosts
        .iter()
        .map(|h| {
            let pair = &h.host.pair;
            let flow = pair.flow(src, PORT, pps);
            pair.send_async(&[flow], dur)
        })
        .collect();
    for s in senders {
        s.join().expect("sender");
    }
    receivers
        .into_iter()
        .map(|r| r.finish().get(&src).copied().unwrap_or(0))
        .collect()
}

#[test]
fn three_daemons_hold_one_limit_and_fall_back_when_redis_stops() {
    privileged!("three_daemons_hold_one_limit_and_fall_back_when_redis_stops");
    let mut redis = RedisServer::start_unix();
    let hosts = fleet(&redis, &[]);
    let src: IpAddr = "198.18.0.60".parse().unwrap();
    // Every daemon sees the others before traffic starts.
    let start = Instant::now();
    while hosts
        .iter()
        .any(|h| h.daemon.json(&["status"])["fleet"]["daemons"] != 3)
    {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "daemons never saw each other"
        );
        sleep(Duration::from_millis(100));
    }

    // 2× the fleet limit in total: 67/s to each of three hosts for 3 s.
    let secs = 3.0;
    let got = flood(&hosts, src, 67, Duration::from_secs_f64(secs));
    let total: u64 = got.iter().sum();
    let exact = BURST + RATE * secs;
    // B + R·t + (N − 1)·(B + R·Δ) with Δ = two syncs and a round trip (the
    // fleet module's bound), Δ taken as 0.3 s.
    let bound = exact + 2.0 * (BURST + RATE * 0.3);
    eprintln!(
        "fleet: {got:?} = {total} admitted of {} sent; exact {exact}, bound {bound}",
        67.0 * 3.0 * secs
    );
    assert!(
        (total as f64) <= bound,
        "{total} admitted across the fleet ({got:?}), bound {bound}"
    );
    assert!(
        (total as f64) >= 0.8 * RATE * secs,
        "{total} admitted ({got:?}): the fleet must not starve a source below its limit"
    );
    assert!(
        (total as f64) >= 0.85 * RATE * secs,
        "{total} admitted ({got:?}): the fleet must not starve a source below its limit"
    );
    // Each host alone would have admitted ~201: the limit held fleet-wide.
    assert!(got.iter().all(|n| *n < 180), "{got:?}");
    for h in &hosts {
        let st = h.daemon.json(&["status"]);
        assert_eq!(st["fleet"]["redis_up"], true, "{st}");
        assert!(st["fleet"]["reported"].as_u64().unwrap() > 0, "{st}");
    }

    // From any daemon: the fleet's use of the key, all daemons together
    // (after a last sync).
    // The usage is written to Redis once a second: looked at until then.
    let looking = Instant::now();
    loop {
        let top = hosts[0].daemon.json(&["top", "--fleet"]);
        let key = &top["rules"][0]["keys"][0];
        assert_eq!(key["key"], "198.18.0.60/32", "{top}");
        let seen = key["this_minute"].as_u64().unwrap() + key["last_minute"].as_u64().unwrap();
        if seen >= total {
            break;
        }
        assert!(
            looking.elapsed() < Duration::from_secs(3),
            "top --fleet shows {seen} for the key, {total} were admitted: {top}"
        );
        sleep(Duration::from_millis(200));
    }

    // Redis stops: each daemon falls back to 1/3 of the limit, says so.
    redis.stop();
    sleep(Duration::from_millis(1500));
    let got = flood(&hosts, src, 67, Duration::from_secs_f64(secs));
    let total: u64 = got.iter().sum();
    eprintln!("fleet, Redis down: {got:?} = {total}");
    for h in &hosts {
        let st = h.daemon.json(&["status"]);
        assert_eq!(st["fleet"]["redis_up"], false, "{st}");
        assert!(st["fleet"]["fallback_syncs"].as_u64().unwrap() > 0, "{st}");
        assert!(
            h.daemon.output().contains("Redis cannot be reached"),
            "the fallback is logged"
        );
    }
    assert!(
        (total as f64) <= RATE * secs + 3.0 * BURST + 10.0,
        "the share fallback keeps the fleet near its limit: {total} ({got:?})"
    );
    assert!((total as f64) >= 0.6 * RATE * secs, "{total} ({got:?})");

    // Redis back (empty): in step again.
    redis.restart();
    let start = Instant::now();
    while hosts
        .iter()
        .any(|h| h.daemon.json(&["status"])["fleet"]["redis_up"] != true)
    {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "not back in step"
        );
        sleep(Duration::from_millis(100));
    }
    let got = flood(&hosts, src, 67, Duration::from_secs_f64(secs));
    let total: u64 = got.iter().sum();
    eprintln!("fleet, Redis back: {got:?} = {total}");
    assert!(
        (total as f64) <= bound,
        "{total} admitted across the fleet ({got:?}), bound {bound}"
    );
    assert!(h_logged(&hosts, "back in step"));
}

/// The rule the fault tests set: 100/s burst 20 per /32, fleet-wide.
const RULE: [&str; 6] = [
    "198.18.0.0/24",
    "--rate",
    "100/s",
    "--burst",
    "20",
    "--fleet",
];

/// The fleet's bound over `secs` with `n` daemons and debts `delta` s old:
/// `B + R·t + (N − 1)·(B + R·Δ)` (the fleet module's).
fn bound(n: f64, secs: f64, delta: f64) -> f64 {
    BURST + RATE * secs + (n - 1.0) * (BURST + RATE * delta)
}

/// The sync age the bound assumes: two syncs and an answer within 100 ms
/// (later answers are charged as under the fallback).
const DELTA: f64 = 0.3;

fn h_logged(hosts: &[Member], what: &str) -> bool {
    hosts.iter().all(|h| h.daemon.output().contains(what))
}

#[test]
fn a_fleet_rule_needs_a_fleet_daemon() {
    privileged!("a_fleet_rule_needs_a_fleet_daemon");
    let (_h, d) = Host::start("nofleet", &[]);
    let out = d.cli(&["set", "198.18.0.0/24", "--rate", "100/s", "--fleet"]);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("--fleet"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
