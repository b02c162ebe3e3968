//! Fleet-wide rules: one limit per key across every daemon run with
//! `--fleet REDIS_URL`. The kernel keeps deciding every frame locally, with
//! the key's own bucket; Redis is never on the packet path.
//!
//! # How
//! The program counts what each key of a fleet-wide rule is admitted
//! (`RL_FLEET_USED`). Every [`SYNC`], each daemon, for each key it admitted
//! something for in the last [`FOLLOW`]:
//! - reports what it admitted since the last sync to the key's bucket in Redis
//!   (gcra, the same limit), which answers with the fleet's debt for the key:
//!   how long until its bucket would be full again, counting every daemon's
//!   admissions; beyond a whole bucket when the fleet has admitted too much;
//! - raises the key's own bucket in the kernel to that debt (never lowers it),
//!   up to a whole bucket and [`gcra::OVER_MAX`] (about 100 ms) beyond it,
//!   which the program reads as an empty bucket and keeps as it is; a debt
//!   further beyond is set again at the next sync.
//!
//! So each key's bucket on every daemon holds what the whole fleet admitted,
//! at most one sync late.
//!
//! # The bound
//! With `N` daemons, a key of rate `R` and burst `B`, and `Δ` the time from a
//! frame's admission to every other daemon's bucket holding it (at most two
//! syncs and a Redis round trip, `2·SYNC + RTT`), the fleet admits over any
//! time `t` at most
//!
//! ```text
//! B + R·t  +  (N − 1)·(B + R·Δ)
//! ```
//!
//! The daemon that admits last admitted at most `B + R·t` counting what it
//! knew of the others; what it did not know is what the others admitted in
//! the last `Δ`, at most `B + R·Δ` each (their own buckets hold). The excess
//! does not grow with `t`: over a long run the fleet admits the rate.
//! Frames of a key on a daemon that has not seen it before (its first burst)
//! are in the `B` of that daemon's term.
//!
//! # When Redis cannot be reached
//! [`Fallback::Share`] (the default): each daemon charges a key's bucket,
//! besides what it admitted, `N − 1` times that (as if every other daemon
//! admitted as much), with `N` the daemons last seen: a key whose traffic is
//! spread evenly gets the fleet limit, one sent to a single daemon gets
//! `1/N` of it (errs toward limiting). [`Fallback::Local`]: each daemon
//! admits the whole limit (the fleet up to `N` times it). Either way it is
//! logged once when Redis goes and once when it returns, counted and shown in
//! `status` and the metrics. When Redis returns the daemons report afresh;
//! what was admitted during the outage was judged by the fallback and is not
//! charged again.
//!
//! The aggregate level of a fleet-wide rule stays per host.

use std::{
    collections::HashMap,
    net::{IpAddr, Ipv6Addr},
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use ratelimit_common::{Counter, FlowKey, addr_of, gcra, words};
use ratelimit_redis::{Limit, Store};
use serde::{Deserialize, Serialize};
use tokio::{
    sync::{mpsc, oneshot, watch},
    task::JoinSet,
};
use tracing::{info, warn};

use crate::{host::clock::now_ms, model::rules::Action};

/// How often a daemon reports to Redis and takes the fleet's debts back.
pub const SYNC: Duration = Duration::from_millis(100);
/// A key admitted nothing here for this long is no longer followed.
pub const FOLLOW: Duration = Duration::from_secs(2);
/// A daemon not heard from for this long no longer counts in the fleet.
pub const MEMBER_TIMEOUT: Duration = Duration::from_secs(3);
/// How long the per-minute tallies of `top --fleet` live.
const TALLY_TTL: Duration = Duration::from_secs(180);
/// How long one call to Redis may take in a sync before the sync counts as
/// failed (the fallback holds for it).
const CALL_TIMEOUT: Duration = Duration::from_millis(250);
/// Reports in flight at once.
const IN_FLIGHT: usize = 64;
/// The prefix of every fleet key in Redis.
pub const PREFIX: &str = "ratelimit:fleet:";

/// What fleet-wide rules do while Redis cannot be reached.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Fallback {
    /// Each daemon charges what it admits `N` times (`N` the daemons last
    /// seen): the fleet stays near the limit.
    Share,
    /// Each daemon admits the whole limit alone.
    Local,
}

/// A fleet-wide rule, as the sync task needs it.
#[derive(Clone, Debug)]
pub struct FleetRule {
    /// Its name across the fleet: the CIDR, or `default`.
    pub name: String,
    /// Its limit, in Redis's terms.
    pub limit: Limit,
    /// Its parameters in the kernel.
    pub params: gcra::Params,
    /// Whether it counts bytes.
    pub bytes: bool,
    /// Its key sizes, for names: IPv4 and IPv6 prefix lengths.
    pub per: (u8, u8),
}

impl FleetRule {
    /// The fleet-wide rule that the kernel's `rule` (under the name `name`)
    /// and the daemon's `action` for it make; `None` when it is not fleet-wide
    /// or its limit has no form Redis can keep.
    pub fn of(
        name: String,
        rule: &ratelimit_common::Rule,
        action: Option<&Action>,
    ) -> Option<Self> {
        use ratelimit_common::rule_flags;
        if rule.flags & rule_flags::FLEET == 0 {
            return None;
        }
        let Some(Action::Limit(l)) = action else {
            return None;
        };
        let limit = Limit::gcra(
            l.rate.tokens,
            Duration::from_nanos(l.rate.period_ns),
            l.burst,
        )
        .ok()?;
        Some(FleetRule {
            name,
            limit,
            params: *rule.gcra_params(),
            bytes: rule.flags & rule_flags::BYTES != 0,
            per: (rule.key_prefix_v4, rule.key_prefix_v6),
        })
    }
}

/// What the daemon's loop (which owns the maps) reads for the sync task.
pub struct Snapshot {
    /// Fleet-wide rules by id.
    pub rules: HashMap<u32, FleetRule>,
    /// What each key was admitted here (cumulative).
    pub used: Vec<(FlowKey, Counter)>,
}

/// A change to one key's bucket.
#[derive(Clone, Copy, Debug)]
pub struct Raise {
    /// The key.
    pub key: FlowKey,
    /// Its rule's parameters.
    pub params: gcra::Params,
    /// The debt to raise it to (ns), as of `at`.
    pub debt_ns: u64,
    /// When `debt_ns` held; `None`: add `debt_ns` to the key's debt instead.
    pub at: Option<Instant>,
}

/// What the sync task asks of the daemon's loop.
pub enum Job {
    /// The fleet-wide rules and what their keys were admitted.
    Read(oneshot::Sender<Snapshot>),
    /// Raise these keys' buckets.
    Write(Vec<Raise>),
}

/// The fleet as this daemon sees it, for `status`, `top --fleet` and metrics.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Status {
    /// Where.
    pub redis: String,
    /// Whether the last sync reached Redis.
    pub redis_up: bool,
    /// The policy while Redis cannot be reached.
    pub fallback: Option<Fallback>,
    /// Daemons seen in the last few seconds (this one included).
    pub daemons: u64,
    /// Keys this daemon follows (admitted something in the last 2 s).
    pub keys: u64,
    /// Of those, keys the fleet holds over their limit (bucket empty).
    pub keys_over: u64,
    /// Units (packets or bytes) reported to Redis since start.
    pub reported: u64,
    /// Syncs made under the fallback policy since start.
    pub fallback_syncs: u64,
    /// The last sync's round trip to Redis, ms.
    pub redis_ms: f64,
}

struct Key {
    /// Units counted at the last sync.
    last: u64,
    /// When it last admitted something.
    active: Instant,
    /// The fleet's debt for the key as last known (from Redis, or kept here
    /// under the share fallback), ns, as of `debt_at`.
    debt_ns: u64,
    debt_at: Instant,
}

/// The name of a key across the fleet: `RULE|ADDRESS/BITS`.
pub fn key_name(rule: &FleetRule, key: &FlowKey) -> String {
    let v6 = Ipv6Addr::from(addr_of(&words(&key.addr)));
    match v6.to_ipv4_mapped() {
        Some(v4) => format!("{}|{}/{}", rule.name, IpAddr::V4(v4), rule.per.0),
        None => format!("{}|{}/{}", rule.name, IpAddr::V6(v6), rule.per.1),
    }
}

/// The per-minute tally of a rule's use across the fleet, for `top --fleet`.
pub fn tally_key(rule: &str, minute: u64) -> String {
    format!("{PREFIX}used:{{{rule}}}:{minute}")
}

/// The current minute since the epoch.
pub fn minute() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() / 60)
}

/// The sync task: runs until the daemon's loop goes away.
pub async fn run(
    url: String,
    fallback: Fallback,
    member: String,
    jobs: mpsc::Sender<Job>,
    status: watch::Sender<Status>,
) {
    let members_key = format!("{PREFIX}{{members}}");
    let mut store: Option<Store> = None;
    let mut keys: HashMap<FlowKey, Key> = HashMap::new();
    let mut st = Status {
        redis: url.clone(),
        daemons: 1,
        fallback: Some(fallback),
        ..Default::default()
    };
    let mut tick = tokio::time::interval(SYNC);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // While Redis is down, syncs do not wait on it: a probe task says when
    // it answers again.
    let answers = Arc::new(AtomicBool::new(true));
    let mut down = false;
    let mut first = true;
    loop {
        tick.tick().await;
        let (reply, answer) = oneshot::channel();
        if jobs.send(Job::Read(reply)).await.is_err() {
            return;
        }
        let Ok(Snapshot { rules, used }) = answer.await else {
            return;
        };
        let started = Instant::now();
        let mut up = false;
        if answers.load(Ordering::Relaxed) {
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
        }
        // What each followed key admitted since the last sync.
        let now = Instant::now();
        let mut work = Vec::new();
        for (fk, c) in &used {
            let Some(rule) = rules.get(&fk.rule_id) else {
                continue;
            };
            let units = if rule.bytes { c.bytes } else { c.packets };
            let k = keys.entry(*fk).or_insert(Key {
                last: 0,
                active: now,
                debt_ns: 0,
                debt_at: now,
            });
            // Counted afresh after an eviction.
            let delta = units.checked_sub(k.last).unwrap_or(units);
            k.last = units;
            if delta > 0 {
                k.active = now;
            }
            if now.duration_since(k.active) <= FOLLOW {
                work.push((*fk, rule.clone(), delta));
            }
        }
        // Kept while the kernel counts them (their counts are cumulative).
        let counted: std::collections::HashSet<&FlowKey> = used.iter().map(|(k, _)| k).collect();
        keys.retain(|fk, _| counted.contains(fk));
        let mut raises = Vec::with_capacity(work.len());
        let mut failed = Vec::new();
        if up && let Some(s) = &store {
            let minute = minute();
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
                            let tally_key = tally_key(&rule.name, minute);
                            let tally = s.tally(&tally_key, member, delta, TALLY_TTL);
                            let _ = tokio::time::timeout(CALL_TIMEOUT, tally).await;
                        }
                        (fk, rule, delta, r, Instant::now())
                    });
                }
                let Some(done) = set.join_next().await else {
                    break;
                };
                let Ok((fk, rule, delta, r, at)) = done else {
                    continue;
                };
                match r {
                    Some(debt) => {
                        st.reported += delta;
                        let debt_ns = debt.as_nanos().min(u128::from(u64::MAX)) as u64;
                        if let Some(k) = keys.get_mut(&fk) {
                            k.debt_ns = debt_ns;
                            k.debt_at = at;
                        }
                        raises.push(Raise {
                            key: fk,
                            params: rule.params,
                            debt_ns,
                            at: Some(at),
                        });
                    }
                    None => failed.push((fk, rule, delta)),
                }
            }
            if !failed.is_empty() {
                up = false;
            }
        } else {
            failed = work;
        }
        if !up {
            st.fallback_syncs += 1;
            // The fleet's debt kept here: what it was, paid down since, plus
            // what this daemon admitted charged for the whole fleet.
            let times = match fallback {
                Fallback::Share => st.daemons.max(1),
                Fallback::Local => 1,
            };
            for (fk, rule, delta) in failed {
                let Some(k) = keys.get_mut(&fk) else { continue };
                let paid = now
                    .duration_since(k.debt_at)
                    .as_nanos()
                    .min(u128::from(u64::MAX)) as u64;
                k.debt_ns = k
                    .debt_ns
                    .saturating_sub(paid)
                    .saturating_add(gcra::units_ns(&rule.params, delta.saturating_mul(times)));
                k.debt_at = now;
                if fallback == Fallback::Share {
                    raises.push(Raise {
                        key: fk,
                        params: rule.params,
                        debt_ns: k.debt_ns,
                        at: Some(now),
                    });
                }
            }
        }
        st.redis_ms = started.elapsed().as_secs_f64() * 1e3;
        if up {
            if down {
                info!(redis = %url, "fleet: Redis answers again; fleet-wide rules are back in step");
                down = false;
            } else if first {
                info!(redis = %url, daemons = st.daemons, "fleet: in step through Redis");
            }
        } else if !down {
            down = true;
            match fallback {
                Fallback::Share => warn!(
                    redis = %url,
                    daemons = st.daemons,
                    "fleet: Redis cannot be reached; each fleet-wide key is charged {} times what this daemon admits until it returns (--fleet-fallback share)",
                    st.daemons
                ),
                Fallback::Local => warn!(
                    redis = %url,
                    "fleet: Redis cannot be reached; each daemon admits the whole of every fleet-wide limit until it returns (--fleet-fallback local): the fleet may admit up to {} times it",
                    st.daemons
                ),
            }
            answers.store(false, Ordering::Relaxed);
            store = None;
            tokio::spawn(probe(url.clone(), answers.clone()));
        }
        first = false;
        st.redis_up = up;
        st.keys = keys
            .values()
            .filter(|k| now.duration_since(k.active) <= FOLLOW)
            .count() as u64;
        st.keys_over = keys
            .iter()
            .filter(|(fk, k)| {
                now.duration_since(k.active) <= FOLLOW
                    && rules.get(&fk.rule_id).is_some_and(|r| {
                        let left = k.debt_ns.saturating_sub(
                            now.duration_since(k.debt_at)
                                .as_nanos()
                                .min(u128::from(u64::MAX)) as u64,
                        );
                        left >= gcra::units_ns(&r.params, r.params.capacity)
                    })
            })
            .count() as u64;
        let _ = status.send(st.clone());
        if !raises.is_empty() && jobs.send(Job::Write(raises)).await.is_err() {
            return;
        }
    }
}

/// Says when Redis answers again (every second, in the background).
async fn probe(url: String, answers: Arc<AtomicBool>) {
    loop {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let ok = tokio::time::timeout(Duration::from_secs(1), async {
            match Store::connect(&url).await {
                Ok(s) => s.ping().await.is_ok(),
                Err(_) => false,
            }
        })
        .await
        .unwrap_or(false);
        if ok {
            answers.store(true, Ordering::Relaxed);
            return;
        }
    }
}

/// A fleet-wide rule's use of its keys, all daemons together, from Redis.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RuleUse {
    /// The rule: `default` or its selector.
    pub rule: String,
    /// Units admitted this minute, by the keys shown.
    pub this_minute: u64,
    /// Units admitted last minute, by the keys shown.
    pub last_minute: u64,
    /// The keys that admitted the most, this minute and the last together.
    pub keys: Vec<KeyUse>,
}

/// One key's use across the fleet.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeyUse {
    /// `RULE|ADDRESS/BITS`.
    pub key: String,
    /// Units admitted this minute.
    pub this_minute: u64,
    /// Units admitted last minute.
    pub last_minute: u64,
}

/// The fleet's use of each key of `rules` (by name) in this minute and the
/// last, busiest first, at most `n` per rule: what `top --fleet` shows.
pub async fn top(url: &str, rules: &[String], n: usize) -> Result<Vec<RuleUse>, String> {
    let store = Store::connect(url)
        .await
        .map_err(|e| format!("the fleet's Redis {url}: {e}"))?;
    let store = &store;
    let m = minute();
    let mut out = Vec::new();
    for rule in rules {
        let now = store
            .top(&tally_key(rule, m), n)
            .await
            .map_err(|e| e.to_string())?;
        let before = store
            .top(&tally_key(rule, m.saturating_sub(1)), n)
            .await
            .map_err(|e| e.to_string())?;
        let mut by: HashMap<String, (u64, u64)> = HashMap::new();
        for (k, v) in now {
            by.entry(k).or_default().0 = v;
        }
        for (k, v) in before {
            by.entry(k).or_default().1 = v;
        }
        let mut keys: Vec<_> = by.into_iter().collect();
        keys.sort_by(|a, b| (b.1.0 + b.1.1).cmp(&(a.1.0 + a.1.1)).then(a.0.cmp(&b.0)));
        keys.truncate(n);
        out.push(RuleUse {
            rule: rule.clone(),
            this_minute: keys.iter().map(|k| k.1.0).sum(),
            last_minute: keys.iter().map(|k| k.1.1).sum(),
            keys: keys
                .into_iter()
                .map(|(key, (this_minute, last_minute))| KeyUse {
                    key,
                    this_minute,
                    last_minute,
                })
                .collect(),
        });
    }
    Ok(out)
}
