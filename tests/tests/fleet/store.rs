//! The fleet's calls against a real `redis-server` and a real three-master
//! Cluster (no namespaces): a group's reports in one call, decided as the
//! per-key report decides them; a key that is not a bucket fails alone;
//! members by leases on Redis's clock; and what the `redis` crate's Cluster
//! connection does when a master dies and comes back.

use std::{
    thread::sleep,
    time::{Duration, Instant},
};

use ratelimit_redis::{
    Limit, Store,
    fleet::{GROUPS, Report, bucket_key, group_of, members_key},
};
use ratelimit_tests::redis::{RedisCluster, RedisServer};
use ratelimit_user::fleet::PREFIX;

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime")
}

fn limit() -> Limit {
    Limit::gcra(100, Duration::from_secs(1), 20).unwrap()
}

/// `n` key names of one group.
fn names_of_group(group: u32, n: usize) -> Vec<String> {
    (0..)
        .map(|i| format!("default|198.18.{}.{}/32", i / 256, i % 256))
        .filter(|name| group_of(name) == group)
        .take(n)
        .collect()
}

fn report(name: &str, amount: u64) -> Report {
    Report {
        name: name.to_string(),
        limit: limit(),
        amount,
        tallied: amount,
    }
}

#[test]
fn a_groups_reports_are_decided_in_one_call_as_each_alone() {
    let redis = RedisServer::start();
    rt().block_on(async {
        let store = Store::connect(&redis.url()).await.expect("connect");
        let names = names_of_group(5, 4);
        // The same amounts, one call for the group and one call per key (the
        // per-key report of limit.lua) under another prefix.
        let amounts = [0, 1, 20, 500];
        let reports: Vec<Report> = names
            .iter()
            .zip(amounts)
            .map(|(n, a)| report(n, a))
            .collect();
        let batch = store.fleet_sync(PREFIX, 5, &reports).await.expect("sync");
        for (name, (a, debt)) in names.iter().zip(amounts.iter().zip(&batch)) {
            let alone = store
                .report(&Store::key("alone:", name), &limit(), *a)
                .await
                .expect("report");
            let debt = debt.expect("a bucket");
            assert!(
                debt.abs_diff(alone) <= Duration::from_millis(2),
                "{name} +{a}: {debt:?} in the group's call, {alone:?} alone"
            );
        }
        // An idle key's read writes nothing.
        let key = bucket_key(PREFIX, &names[0]);
        assert!(redis.cmd(&format!("EXISTS {key}")).starts_with(":0"));
        // Units tallied under the group's tally for this minute.
        let tallies = store.fleet_tallies(PREFIX, 0).await.expect("tallies");
        let total: u64 = tallies.iter().map(|(_, u)| u).sum();
        assert_eq!(total, 521, "{tallies:?}");
    });
}

#[test]
fn a_key_that_is_not_a_bucket_fails_alone() {
    let redis = RedisServer::start();
    rt().block_on(async {
        let store = Store::connect(&redis.url()).await.expect("connect");
        let names = names_of_group(9, 2);
        redis.cmd(&format!(
            "SET {} something-else",
            bucket_key(PREFIX, &names[0])
        ));
        let r = [report(&names[0], 1), report(&names[1], 1)];
        let debts = store.fleet_sync(PREFIX, 9, &r).await.expect("sync");
        assert_eq!(debts[0], None, "another program's key: left alone, failed");
        assert_eq!(debts[1], Some(Duration::from_millis(10)));
        assert_eq!(
            redis.cmd(&format!("GET {}", bucket_key(PREFIX, &names[0]))),
            "$14\r\nsomething-else\r\n"
        );
    });
}

#[test]
fn members_are_counted_by_leases_on_redis_clock() {
    let redis = RedisServer::start();
    rt().block_on(async {
        let store = Store::connect(&redis.url()).await.expect("connect");
        let key = members_key(PREFIX);
        let (lease, silence, grace) = (
            Duration::from_millis(1500),
            Duration::from_millis(300),
            Duration::from_millis(3000),
        );
        for m in ["a", "b", "c"] {
            store
                .fleet_members(&key, m, lease, silence, grace)
                .await
                .unwrap();
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
        // Only a renews: b and c are silent while their leases run...
        let m = store
            .fleet_members(&key, "a", lease, silence, grace)
            .await
            .unwrap();
        assert_eq!((m.members, m.silent, m.past_lease), (3, 2, 0));
        // ... c leaves for good: gone at once.
        store.fleet_leave(&key, "c", lease, grace).await.unwrap();
        let m = store
            .fleet_members(&key, "a", lease, silence, grace)
            .await
            .unwrap();
        assert_eq!((m.members, m.silent, m.past_lease), (2, 1, 0));
        // b, which never left, is still counted past its lease (its program
        // may still enforce its share), and said to be past it...
        tokio::time::sleep(Duration::from_millis(1200)).await;
        let m = store
            .fleet_members(&key, "a", lease, silence, grace)
            .await
            .unwrap();
        assert_eq!((m.members, m.silent, m.past_lease), (2, 1, 1));
        // ... until the grace ends.
        tokio::time::sleep(Duration::from_millis(1500)).await;
        let m = store
            .fleet_members(&key, "a", lease, silence, grace)
            .await
            .unwrap();
        assert_eq!((m.members, m.silent, m.past_lease), (1, 0, 0));
    });
}

/// How long `store` takes to reach the keys of `group` again (`None`: not
/// within `within`).
async fn reaches(store: &Store, group: u32, within: Duration) -> Option<Duration> {
    let reports = [report(&names_of_group(group, 1)[0], 1)];
    let start = Instant::now();
    while start.elapsed() < within {
        let call = store.fleet_sync(PREFIX, group, &reports);
        if let Ok(Ok(_)) = tokio::time::timeout(Duration::from_millis(250), call).await {
            return Some(start.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    None
}

/// The `redis` crate's Cluster connection (1.8) reconnects to a master's
/// address by itself and reads the slot map again on `MOVED`: a master that
/// comes back is reached by the connection that saw it die as soon as by a
/// new one (both wait for the Cluster itself, about 2 s here). With the
/// fleet's script calls, one command each, nothing is left stuck (main's
/// atomic pipelines got `MOVED` forever).
#[test]
fn a_cluster_master_that_comes_back_is_reached_again_by_the_same_connection() {
    let mut cluster = RedisCluster::start();
    let rt = rt();
    let store = rt
        .block_on(Store::connect(&cluster.url()))
        .expect("connect");
    // A group on each master.
    let owner = |g: u32| cluster.owner(&bucket_key(PREFIX, &names_of_group(g, 1)[0]));
    let mut on = [None; 3];
    for g in 0..GROUPS {
        on[owner(g)].get_or_insert(g);
    }
    let on = on.map(|g| g.expect("a group on every master"));
    rt.block_on(async {
        for g in on {
            assert!(reaches(&store, g, Duration::from_secs(2)).await.is_some());
        }
    });
    cluster.nodes[2].stop();
    rt.block_on(async {
        // The other masters' groups still answer; the dead one's fail.
        for g in &on[..2] {
            let t = reaches(&store, *g, Duration::from_secs(2)).await;
            assert!(t.is_some(), "a live master's group while another is down");
        }
        assert!(
            reaches(&store, on[2], Duration::from_millis(600))
                .await
                .is_none(),
            "the dead master's group answered"
        );
    });
    cluster.nodes[2].restart();
    sleep(Duration::from_millis(200));
    rt.block_on(async {
        let fresh = Store::connect(&cluster.url()).await.expect("a new connection");
        let (new, old) = tokio::join!(
            reaches(&fresh, on[2], Duration::from_secs(5)),
            reaches(&store, on[2], Duration::from_secs(5))
        );
        eprintln!(
            "a restarted master reached by a new connection after {new:?}, by the connection that saw it die after {old:?}"
        );
        let soon = |t: Option<Duration>| t.is_some_and(|t| t < Duration::from_secs(4));
        assert!(soon(new), "a new connection reaches the restarted master: {new:?}");
        assert!(
            soon(old),
            "the connection that saw the master die reaches it again: {old:?}"
        );
    });
}
