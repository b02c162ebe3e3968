//! A Redis Cluster master killed and restarted under three daemons: the
//! keys on the live masters stay in step (a source reaching one daemon gets
//! the fleet's whole limit there, not the fallback's third), the keys on
//! the dead master fall back, and the fleet is back in step within seconds
//! of the master's return.

use std::{
    net::IpAddr,
    thread::sleep,
    time::{Duration, Instant},
};

use ratelimit_redis::fleet::{bucket_key, members_key};
use ratelimit_tests::{fleet::Fleet, privileged};
use ratelimit_user::fleet::PREFIX;

use super::{BURST, DELTA, RATE, RULE, bound};

/// A source of 198.18.0.0/24 whose key is served by Cluster node `node`.
fn source_on(fleet: &mut Fleet, node: usize, not: &[IpAddr]) -> IpAddr {
    let cluster = fleet.redis.cluster();
    (10..250)
        .map(|last| format!("198.18.0.{last}").parse::<IpAddr>().unwrap())
        .filter(|a| !not.contains(a))
        .find(|a| cluster.owner(&bucket_key(PREFIX, &format!("198.18.0.0/24|{a}/32"))) == node)
        .unwrap_or_else(|| panic!("no source of 198.18.0.0/24 has its key on node {node}"))
}

#[test]
fn a_cluster_master_down_costs_its_own_keys_and_is_back_in_step_within_seconds() {
    privileged!("a_cluster_master_down_costs_its_own_keys_and_is_back_in_step_within_seconds");
    let mut fleet = Fleet::start(3, true, &[], &RULE);
    fleet.wait_in_step(3, Duration::from_secs(15));
    // The master to kill holds neither the members nor the live key.
    let members = fleet.redis.cluster().owner(&members_key(PREFIX));
    let dead = (members + 1) % 3;
    let live_src = source_on(&mut fleet, members, &[]);
    let dead_src = source_on(&mut fleet, dead, &[live_src]);
    eprintln!(
        "fleet, cluster: members on node {members}, killing node {dead}; {live_src} on a live master, {dead_src} on the dead one"
    );
    fleet.redis.cluster().nodes[dead].stop();
    sleep(Duration::from_secs(1));

    // Both sources to daemon 0 alone, twice the limit each, for 3 s.
    let secs = 3.0;
    let (live, dead_got, worst_fallback) = std::thread::scope(|s| {
        let watch = s.spawn(|| {
            // Never more than the dead master's key in fallback.
            let start = Instant::now();
            let mut worst = 0;
            while start.elapsed() < Duration::from_secs_f64(secs) {
                let f = fleet.members[0].fleet_status();
                worst = worst.max(f["keys_fallback"].as_u64().unwrap_or(0));
                sleep(Duration::from_millis(200));
            }
            worst
        });
        let a = s.spawn(|| fleet.flood(live_src, 200, &[0], Duration::from_secs_f64(secs))[0]);
        let b = s.spawn(|| fleet.flood(dead_src, 200, &[0], Duration::from_secs_f64(secs))[0]);
        (
            a.join().expect("flood"),
            b.join().expect("flood"),
            watch.join().expect("watch"),
        )
    });
    let f = fleet.members[0].fleet_status();
    eprintln!(
        "fleet, cluster master down: live key {live} admitted in {secs} s (limit {}), dead master's key {dead_got} (its share {:.0}); keys in fallback at most {worst_fallback}; {f}",
        BURST + RATE * secs,
        (BURST + RATE * secs) / 3.0
    );
    assert!(
        (live as f64) >= 0.85 * RATE * secs,
        "a key on a live master must stay in step while another master is down: {live} admitted in {secs} s (the fallback would give a third)"
    );
    assert!(
        (live as f64) <= bound(3.0, secs, DELTA),
        "{live} admitted for the live key in {secs} s"
    );
    assert!(
        (dead_got as f64) <= (BURST + RATE * secs) / 3.0 + BURST,
        "the dead master's key is charged as under the share fallback: {dead_got} in {secs} s"
    );
    assert!(
        worst_fallback <= 1,
        "only the dead master's key falls back: {worst_fallback} keys did"
    );
    assert!(f["groups_down"].as_u64().unwrap() >= 1, "{f}");

    // The master back: every daemon in step within seconds.
    fleet.redis.cluster().nodes[dead].restart();
    let back = Instant::now();
    let start = Instant::now();
    loop {
        let seen: Vec<_> = fleet.members.iter().map(|m| m.fleet_status()).collect();
        if seen
            .iter()
            .all(|f| f["redis_up"] == true && f["groups_down"] == 0)
        {
            break;
        }
        // Keys must be reported for their groups to be asked again.
        fleet.flood(dead_src, 50, &[0, 1, 2], Duration::from_millis(300));
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "not back in step within 10 s of the master's return: {seen:?}"
        );
    }
    let took = back.elapsed().as_secs_f64();
    eprintln!("fleet, cluster: back in step {took:.1} s after the master's return");
    assert!(
        took < 5.0,
        "back in step only {took:.1} s after the master's return"
    );
    // Its key in step again: a source reaching one daemon gets the limit.
    sleep(Duration::from_millis(500));
    let got = fleet.flood(dead_src, 200, &[0], Duration::from_secs_f64(secs))[0];
    eprintln!("fleet, cluster: the returned master's key {got} admitted in {secs} s");
    assert!(
        (got as f64) >= 0.85 * RATE * secs,
        "the returned master's key is not in step: {got} in {secs} s"
    );
    assert!((got as f64) <= bound(3.0, secs, DELTA), "{got}");
}
