//! The heartbeat the program reads to know its daemon still syncs: written
//! once a sync has settled every key (its answer written, or charged as
//! under the fallback), stamped with the time its counts were read. The real
//! sync task against a real `redis-server`, the kernel stood in for by a
//! task that answers its jobs and notes them; no root needed.

use std::{
    collections::HashMap,
    time::{Duration, Instant},
};

use ratelimit_common::{FleetUsed, FlowKey, gcra, map_v4, words};
use ratelimit_redis::Limit;
use ratelimit_tests::redis::RedisServer;
use ratelimit_user::{
    fleet::{self, Fallback, FleetRule, Job, SLOW, Snapshot, Status},
    kernel::monotonic_ns,
};
use tokio::sync::{mpsc, watch};

/// What the stand-in saw, in order: a read (its time) or a beat (its
/// stamp), each with when it came (monotonic ns).
#[derive(Debug)]
enum Seen {
    Read { at: u64 },
    Write,
    Beat { at: u64, came: u64 },
}

/// Before, the heartbeat was written when the counts were read: a daemon
/// stalled between the read and the answer's write kept a fresh heartbeat
/// while the debt its program judged with aged. Now, with Redis stalled for
/// 1.5 s in the middle of 4 s of syncs: each read is followed by exactly one
/// heartbeat, stamped with that read's time; in
/// step it comes with the answers, before SLOW; the round the stall
/// caught settled its key only by charging it at SLOW (100 ms), and its
/// heartbeat came no sooner.
#[test]
fn the_heartbeat_waits_for_the_keys_to_settle_and_carries_the_reads_time() {
    let redis = RedisServer::start();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime");
    let seen = rt.block_on(async {
        let (jobs_tx, mut jobs) = mpsc::channel(64);
        let (status, _watch) = watch::channel(Status::default());
        let task = tokio::spawn(fleet::run(
            redis.url(),
            Fallback::Share,
            "beat/test".into(),
            jobs_tx,
            status,
            fleet::Metrics::default(),
        ));
        let rule = FleetRule {
            name: "198.18.0.0/15".into(),
            limit: Limit::gcra(100, Duration::from_secs(1), 20).expect("limit"),
            params: gcra::Params::from_rate(100, 1_000_000_000, 20).expect("params"),
            bytes: false,
            per: (32, 128),
        };
        let key = FlowKey::of(&words(&map_v4([198, 18, 0, 7])), 1);
        let start = Instant::now();
        let mut seen = Vec::new();
        let mut paused = false;
        let mut resumed = false;
        // Bounded: 4 s of syncs (about 40), then the task is stopped.
        while start.elapsed() < Duration::from_secs(4) {
            if !paused && start.elapsed() > Duration::from_millis(1500) {
                redis.pause();
                paused = true;
            }
            if paused && !resumed && start.elapsed() > Duration::from_millis(3000) {
                redis.resume();
                resumed = true;
            }
            let Ok(Some(job)) = tokio::time::timeout(Duration::from_millis(200), jobs.recv()).await
            else {
                continue;
            };
            match job {
                Job::Read { cursors, reply } => {
                    let n = (start.elapsed().as_secs_f64() * 30.0) as u64;
                    let at = monotonic_ns();
                    let _ = reply.send(Snapshot {
                        rules: HashMap::from([(1, rule.clone())]),
                        used: vec![(
                            key,
                            FleetUsed {
                                packets: n,
                                bytes: n * 64,
                                born: 1,
                            },
                        )],
                        cursors: cursors.then(Vec::new),
                        at,
                    });
                    seen.push(Seen::Read { at });
                }
                Job::Write { .. } => seen.push(Seen::Write),
                Job::Beat { at, .. } => seen.push(Seen::Beat {
                    at,
                    came: monotonic_ns(),
                }),
            }
        }
        if paused && !resumed {
            redis.resume();
        }
        task.abort();
        seen
    });

    let reads = seen
        .iter()
        .filter(|s| matches!(s, Seen::Read { .. }))
        .count();
    assert!(reads >= 20, "about 40 syncs in 4 s, {reads} seen: {seen:?}");
    let mut waits = Vec::new();
    let mut last_read: Option<u64> = None;
    let mut beaten = true;
    for (i, s) in seen.iter().enumerate() {
        match *s {
            Seen::Read { at } => {
                assert!(
                    beaten,
                    "a read before the last one's heartbeat, at {i}: {seen:?}"
                );
                last_read = Some(at);
                beaten = false;
            }
            Seen::Write => {}
            Seen::Beat { at, came } => {
                assert_eq!(
                    Some(at),
                    last_read,
                    "a heartbeat stamped with another time than its read's, at {i}"
                );
                assert!(!beaten, "two heartbeats for one read, at {i}");
                beaten = true;
                waits.push(Duration::from_nanos(came - at));
            }
        }
    }
    waits.sort();
    let slowest = *waits.last().expect("heartbeats");
    let median = waits[waits.len() / 2];
    eprintln!(
        "heartbeats: {} ; median {median:?} after the read, slowest {slowest:?}",
        waits.len()
    );
    assert!(
        median < SLOW,
        "in step, a heartbeat comes with the answers, before {SLOW:?}: median {median:?}"
    );
    assert!(
        slowest >= SLOW - Duration::from_millis(5),
        "the round the stall caught settled its key only by charging it at {SLOW:?}; its heartbeat came {slowest:?} after its read"
    );
}
