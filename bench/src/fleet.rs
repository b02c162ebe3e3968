//! Fleet: what keeping fleet-wide keys in step costs Redis. Three daemons'
//! sync tasks run in this process against one real `redis-server`, each
//! with a stand-in for its kernel that counts `K` busy keys (every key
//! admitted 34/s on each daemon: a source at the limit spread over three
//! hosts): the real sync task (`ratelimit_user::fleet::run`), and main's
//! before it (53c93b4: an EVALSHA per followed key and a MULTI/ZINCRBY/
//! PEXPIRE/EXEC tally per key that admitted something, 64 in flight; its
//! calls kept verbatim below as the baseline). Redis's commands are counted
//! with `INFO commandstats` (every command, those run by scripts included)
//! and its CPU with `INFO cpu`; a sync's age is what each sync task reports.
//! Redis runs on a CPU of its own, the three daemons' syncs on the other
//! (on separate hosts they would each have one). "Within the bound": the
//! sync's age stays at most 100 ms (p99), what the fleet's bound assumes,
//! with no key in fallback; and what one Redis holds at 80 % of its CPU,
//! from the CPU each busy key costs it.

use std::{
    collections::HashMap,
    fmt::Write as _,
    time::{Duration, Instant},
};

use ratelimit_common::{FleetUsed, FlowKey, gcra, map_v4, words};
use ratelimit_redis::Limit;
use ratelimit_tests::{
    redis::RedisServer,
    testrun::{pin_to_cpu, unpin},
};
use ratelimit_user::{
    fleet::{self, Fallback, FleetRule, Job, Snapshot, Status},
    kernel::monotonic_ns,
};
use serde_json::json;
use tokio::sync::{mpsc, watch};

use crate::{Opts, report::Report};

/// Units each key admits a second on each daemon.
const PER_KEY: f64 = 34.0;
/// What the bound assumes of a sync's age.
const BOUND_MS: f64 = 100.0;

fn rule() -> FleetRule {
    FleetRule {
        name: "198.18.0.0/15".into(),
        limit: Limit::gcra(100, Duration::from_secs(1), 20).expect("limit"),
        params: gcra::Params::from_rate(100, 1_000_000_000, 20).expect("params"),
        bytes: false,
        per: (32, 128),
    }
}

fn keys(k: usize) -> Vec<FlowKey> {
    (0..k)
        .map(|i| {
            let a = map_v4([198, 18 + (i >> 16) as u8, (i >> 8) as u8, i as u8]);
            FlowKey::of(&words(&a), 1)
        })
        .collect()
}

/// A kernel's stand-in: answers reads with `keys` each admitted
/// [`PER_KEY`] a second since it started, and takes the writes.
async fn kernel(keys: Vec<FlowKey>, mut jobs: mpsc::Receiver<Job>) {
    let start = Instant::now();
    let rules = HashMap::from([(1, rule())]);
    while let Some(job) = jobs.recv().await {
        if let Job::Read { reply, cursors, .. } = job {
            let n = (start.elapsed().as_secs_f64() * PER_KEY) as u64;
            let used = keys
                .iter()
                .map(|k| {
                    (
                        *k,
                        FleetUsed {
                            packets: n,
                            bytes: n * 64,
                            born: 1,
                        },
                    )
                })
                .collect();
            let _ = reply.send(Snapshot {
                rules: rules.clone(),
                used,
                cursors: cursors.then(Vec::new),
                at: monotonic_ns(),
            });
        }
    }
}

/// Redis's counts: every command's calls, and its CPU seconds.
pub(crate) fn redis_counts(r: &RedisServer) -> (u64, f64) {
    let stats = r.cmd("INFO commandstats");
    let calls = stats
        .lines()
        .filter_map(|l| l.split("calls=").nth(1))
        .filter_map(|v| v.split(',').next()?.parse::<u64>().ok())
        .sum();
    let cpu = r.cmd("INFO cpu");
    let secs = ["used_cpu_sys:", "used_cpu_user:"]
        .iter()
        .filter_map(|f| cpu.lines().find_map(|l| l.strip_prefix(f)))
        .filter_map(|v| v.trim().parse::<f64>().ok())
        .sum();
    (calls, secs)
}

struct Point {
    keys: usize,
    commands_per_key: f64,
    /// Redis's CPU, the share of one.
    cpu: f64,
    p50_ms: f64,
    p99_ms: f64,
    fallback: f64,
}

impl Point {
    fn within(&self) -> bool {
        self.p99_ms <= BOUND_MS && self.fallback == 0.0
    }

    /// Redis's CPU per busy key, µs a second.
    fn cpu_per_key_us(&self) -> f64 {
        self.cpu * 1e6 / self.keys as f64
    }

    /// Busy keys at 80 % of Redis's CPU, at this cost per key.
    fn redis_holds(&self) -> f64 {
        0.8e6 / self.cpu_per_key_us()
    }
}

/// Three daemons' syncs of `k` busy keys for `window`; main's if `legacy`.
fn measure(redis: &RedisServer, k: usize, legacy: bool, window: Duration) -> Point {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let _ = redis.cmd("FLUSHALL");
    let url = redis.url();
    let (ages, fallback) = rt.block_on(async {
        let mut watches = Vec::new();
        for d in 0..3 {
            let (jobs_tx, jobs_rx) = mpsc::channel(4);
            let (st_tx, st_rx) = watch::channel(Status::default());
            let member = format!("bench/{d}");
            if legacy {
                let (ltx, lrx) = mpsc::channel(4);
                tokio::spawn(main_sync::kernel(keys(k), lrx));
                tokio::spawn(main_sync::run(url.clone(), member, ltx, st_tx));
                drop(jobs_rx);
                drop(jobs_tx);
            } else {
                tokio::spawn(kernel(keys(k), jobs_rx));
                tokio::spawn(fleet::run(
                    url.clone(),
                    Fallback::Share,
                    member,
                    jobs_tx,
                    st_tx,
                    fleet::Metrics::default(),
                ));
            }
            watches.push(st_rx);
        }
        // Warm up: every key known, the script loaded.
        tokio::time::sleep(Duration::from_secs(1)).await;
        let _ = redis.cmd("CONFIG RESETSTAT");
        let (_, cpu0) = redis_counts(redis);
        let start = Instant::now();
        let mut ages = Vec::new();
        let (mut syncs, mut fell) = (0u64, 0u64);
        let mut last: Vec<u64> = watches.iter().map(|w| w.borrow().fallback_syncs).collect();
        while start.elapsed() < window {
            tokio::time::sleep(Duration::from_millis(20)).await;
            for (i, w) in watches.iter_mut().enumerate() {
                if w.has_changed().unwrap_or(false) {
                    let st = w.borrow_and_update().clone();
                    ages.push(st.redis_ms);
                    syncs += 1;
                    fell += st.fallback_syncs.saturating_sub(last[i]);
                    last[i] = st.fallback_syncs;
                }
            }
        }
        let (calls, cpu1) = redis_counts(redis);
        let secs = start.elapsed().as_secs_f64();
        (
            (ages, calls as f64 / secs, (cpu1 - cpu0) / secs),
            fell as f64 / syncs.max(1) as f64,
        )
    });
    rt.shutdown_timeout(Duration::from_secs(1));
    let (mut ages, calls, cpu) = ages;
    ages.sort_by(f64::total_cmp);
    let pct = |p: f64| {
        if ages.is_empty() {
            f64::NAN
        } else {
            ages[((ages.len() - 1) as f64 * p / 100.0).round() as usize]
        }
    };
    Point {
        keys: k,
        commands_per_key: calls / k as f64,
        cpu,
        p50_ms: pct(50.0),
        p99_ms: pct(99.0),
        fallback,
    }
}

pub(crate) fn fleet(opts: &Opts, report: &mut Report) {
    report.section(
        "Fleet: Redis's work per busy key",
        "Three daemons' syncs in one process against one `redis-server` (the kernel stood in for: every key admitted 34/s on each daemon), main's sync (53c93b4) beside this one. Commands: every command Redis ran (`INFO commandstats`, those run inside scripts included) per second per busy key. Sync age: from reading the counts to Redis's last answer. Within the bound: sync age p99 ≤ 100 ms and no key in fallback.",
    );
    let redis = RedisServer::start();
    if let Some(pid) = redis.pid() {
        let _ = std::process::Command::new("taskset")
            .args(["-a", "-p", "-c", "1", &pid.to_string()])
            .output();
    }
    // The syncs' threads (the runtimes are made on this one) on the other.
    pin_to_cpu(0);
    let sizes: &[usize] = if opts.quick {
        &[100, 1000, 3000]
    } else {
        &[100, 500, 1000, 2000, 3000, 4000, 6000, 12000]
    };
    let window = Duration::from_secs(if opts.quick { 2 } else { 4 });
    let mut rows = Vec::new();
    let _ = writeln!(
        report.md,
        "| sync | busy keys | Redis commands/s per key | Redis CPU | its CPU per key | keys at 80 % of it | sync age p50 | p99 | syncs in fallback | within the bound |\n|---|---|---|---|---|---|---|---|---|---|"
    );
    for (legacy, name) in [(true, "main (53c93b4)"), (false, "this")] {
        let mut most = 0;
        for &k in sizes {
            let p = measure(&redis, k, legacy, window);
            println!(
                "fleet {name}: {k} keys: {:.2} commands/s per key, Redis CPU {:.0} % ({:.0} µs/s per key: {:.0} keys at 80 %), sync age p50 {:.1} ms p99 {:.1} ms, {:.0} % of syncs in fallback",
                p.commands_per_key,
                p.cpu * 100.0,
                p.cpu_per_key_us(),
                p.redis_holds(),
                p.p50_ms,
                p.p99_ms,
                p.fallback * 100.0
            );
            let _ = writeln!(
                report.md,
                "| {name} | {} | {:.2} | {:.0} % | {:.0} µs/s | {:.0} | {:.1} ms | {:.1} ms | {:.0} % | {} |",
                p.keys,
                p.commands_per_key,
                p.cpu * 100.0,
                p.cpu_per_key_us(),
                p.redis_holds(),
                p.p50_ms,
                p.p99_ms,
                p.fallback * 100.0,
                if p.within() { "yes" } else { "no" }
            );
            if p.within() {
                most = most.max(k);
            }
            rows.push(
                json!({"sync": name, "keys": p.keys, "commands_per_key_per_s": p.commands_per_key,
                "redis_cpu": p.cpu, "sync_age_p50_ms": p.p50_ms, "sync_age_p99_ms": p.p99_ms,
                "fallback_syncs": p.fallback, "within_bound": p.within()}),
            );
            if !p.within() && legacy {
                // Past its limit: larger ones only take longer.
                break;
            }
        }
        let _ = writeln!(
            report.md,
            "| {name} | **most busy keys within the bound: {most}** (of those tried) | | | | | | | | |"
        );
    }
    let _ = writeln!(report.md);
    unpin();
    report.json.insert("fleet".into(), json!({"rows": rows}));
}

/// main's sync (53c93b4), its Redis calls kept verbatim: the baseline.
mod main_sync {
    use std::{collections::HashMap, time::Duration, time::Instant};

    use ratelimit_common::{Counter, FlowKey};
    use ratelimit_redis::Store;
    use ratelimit_user::fleet::{FleetRule, PREFIX, Status, key_name};
    use tokio::{
        sync::{mpsc, oneshot, watch},
        task::JoinSet,
    };

    const SYNC: Duration = Duration::from_millis(100);
    const FOLLOW: Duration = Duration::from_secs(2);
    const MEMBER_TIMEOUT: Duration = Duration::from_secs(3);
    const TALLY_TTL: Duration = Duration::from_secs(180);
    const CALL_TIMEOUT: Duration = Duration::from_millis(250);
    const IN_FLIGHT: usize = 64;

    pub(super) struct Snapshot {
        pub rules: HashMap<u32, FleetRule>,
        pub used: Vec<(FlowKey, Counter)>,
    }

    /// The kernel's stand-in, as in [`super::kernel`].
    pub(super) async fn kernel(
        keys: Vec<FlowKey>,
        mut jobs: mpsc::Receiver<oneshot::Sender<Snapshot>>,
    ) {
        let start = Instant::now();
        let rules = HashMap::from([(1, super::rule())]);
        while let Some(reply) = jobs.recv().await {
            let n = (start.elapsed().as_secs_f64() * super::PER_KEY) as u64;
            let used = keys
                .iter()
                .map(|k| {
                    (
                        *k,
                        Counter {
                            packets: n,
                            bytes: n * 64,
                        },
                    )
                })
                .collect();
            let _ = reply.send(Snapshot {
                rules: rules.clone(),
                used,
            });
        }
    }

    fn now_ms() -> u64 {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64)
    }

    pub(super) async fn run(
        url: String,
        member: String,
        jobs: mpsc::Sender<oneshot::Sender<Snapshot>>,
        status: watch::Sender<Status>,
    ) {
        let members_key = format!("{PREFIX}{{members}}");
        let mut store: Option<Store> = None;
        let mut last: HashMap<FlowKey, (u64, Instant)> = HashMap::new();
        let mut st = Status::default();
        let mut tick = tokio::time::interval(SYNC);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let (reply, answer) = oneshot::channel();
            if jobs.send(reply).await.is_err() {
                return;
            }
            let Ok(Snapshot { rules, used }) = answer.await else {
                return;
            };
            let started = Instant::now();
            let mut up = false;
            if store.is_none() {
                store = tokio::time::timeout(CALL_TIMEOUT, Store::connect(&url))
                    .await
                    .ok()
                    .and_then(Result::ok);
            }
            if let Some(s) = &store {
                let stale = now_ms().saturating_sub(MEMBER_TIMEOUT.as_millis() as u64);
                let call = s.members(&members_key, &member, now_ms(), stale);
                if let Ok(Ok(n)) = tokio::time::timeout(CALL_TIMEOUT, call).await {
                    st.daemons = n.max(1);
                    up = true;
                }
            }
            let now = Instant::now();
            let mut work = Vec::new();
            for (fk, c) in &used {
                let Some(rule) = rules.get(&fk.rule_id) else {
                    continue;
                };
                let units = if rule.bytes { c.bytes } else { c.packets };
                let k = last.entry(*fk).or_insert((0, now));
                let delta = units.checked_sub(k.0).unwrap_or(units);
                k.0 = units;
                if delta > 0 {
                    k.1 = now;
                }
                if now.duration_since(k.1) <= FOLLOW {
                    work.push((*fk, rule.clone(), delta));
                }
            }
            let mut failed = 0;
            if up && let Some(s) = &store {
                let minute = now_ms() / 60_000;
                let mut set = JoinSet::new();
                let mut pending = work.into_iter();
                loop {
                    while set.len() < IN_FLIGHT
                        && let Some((fk, rule, delta)) = pending.next()
                    {
                        let s = s.clone();
                        set.spawn(async move {
                            let name = key_name(&rule, &fk);
                            let redis_key = Store::key(PREFIX, &name);
                            let call = s.report(&redis_key, &rule.limit, delta);
                            let r = tokio::time::timeout(CALL_TIMEOUT, call).await;
                            let r = r.ok().and_then(Result::ok);
                            if r.is_some() && delta > 0 {
                                let member = name.split_once('|').map_or("", |(_, a)| a);
                                let tally_key = format!("{PREFIX}used:{{{}}}:{minute}", rule.name);
                                let tally = s.tally(&tally_key, member, delta, TALLY_TTL);
                                let _ = tokio::time::timeout(CALL_TIMEOUT, tally).await;
                            }
                            r.is_some()
                        });
                    }
                    let Some(done) = set.join_next().await else {
                        break;
                    };
                    if !matches!(done, Ok(true)) {
                        failed += 1;
                    }
                }
            } else {
                failed = work.len().max(1);
            }
            if failed > 0 {
                st.fallback_syncs += 1;
            }
            st.redis_up = failed == 0;
            st.redis_ms = started.elapsed().as_secs_f64() * 1e3;
            let _ = status.send(st.clone());
        }
    }
}
