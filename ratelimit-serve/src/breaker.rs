//! Fail fast: a breaker per Redis node (the one server, or each Cluster
//! master, found by `CLUSTER SLOTS`). A call that finds a node unreachable or
//! silent opens its breaker; while it is open, every key of its slots is
//! answered 503 at once, naming the cause, without a Redis call, and one
//! probe at a time asks the node (the decision script's write, on a key of
//! one of its slots) until it answers; then the breaker closes. Keys on
//! other masters are served all along.
//!
//! A node that answers with an error (out of memory, read-only, the cluster
//! down) answers quickly: that does not open the breaker, and its answer is
//! the 503's cause. A probe the node answers late (a stall that ended) closes
//! it too: the node answers again.
//!
//! Called by [`super::decide`] before and after each Redis call.

use std::{
    sync::{
        Arc, Mutex, PoisonError,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

use ratelimit_redis::{Error as RedisError, Store};

use super::metrics::{Metrics, Node, Outcome};

/// How long a probe that failed at once waits before the next; one that
/// waited for an answer goes again at once.
pub(super) const PROBE_EVERY: Duration = Duration::from_millis(100);

/// The slots of a Redis Cluster.
const SLOTS: usize = 16384;

/// Why a key was answered at once.
#[derive(Clone, Debug)]
pub(super) struct Tripped {
    /// What the call that opened the breaker met ("redis unreachable: ...").
    pub cause: String,
    /// Its label in the metrics (`unreachable`, `timeout`).
    pub label: &'static str,
    /// The node.
    pub node: String,
    /// How long it has been open.
    pub open_for: Duration,
}

impl std::fmt::Display for Tripped {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let who = if self.node == "redis" {
            "Redis".to_string()
        } else {
            format!("the Redis master {}", self.node)
        };
        write!(
            f,
            "{} ({who} is known down for {} ms: answered at once, without asking it; served again as soon as it answers a probe)",
            self.cause,
            self.open_for.as_millis()
        )
    }
}

struct NodeState {
    name: String,
    /// A slot it serves, for its probes.
    slot: u16,
    open: Option<(Instant, String, &'static str)>,
}

struct Inner {
    /// Slot → node; empty: every slot is node 0.
    slots: Vec<u16>,
    nodes: Vec<NodeState>,
}

/// The breakers of one store.
pub(super) struct Breakers {
    store: Store,
    prefix: String,
    any_open: AtomicBool,
    inner: Mutex<Inner>,
    metrics: Arc<Metrics>,
}

impl Breakers {
    /// Closed breakers for `store`; on a Cluster, one per master (see
    /// [`Breakers::refresh`]).
    pub(super) fn new(store: Store, prefix: &str, name: &str, metrics: Arc<Metrics>) -> Arc<Self> {
        metrics
            .breaker_open
            .get_or_create(&Node { node: name.into() })
            .set(0);
        Arc::new(Self {
            store,
            prefix: prefix.to_string(),
            any_open: AtomicBool::new(false),
            inner: Mutex::new(Inner {
                slots: Vec::new(),
                nodes: vec![NodeState {
                    name: name.to_string(),
                    slot: 0,
                    open: None,
                }],
            }),
            metrics,
        })
    }

    fn inner(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Learns which master serves which slots (a Cluster; nothing for one
    /// server). Breakers of masters that are still there keep their state.
    pub(super) async fn refresh(&self) {
        if !self.store.is_cluster() {
            return;
        }
        let Ok(ranges) = self.store.cluster_slots().await else {
            return;
        };
        if ranges.is_empty() {
            return;
        }
        let mut inner = self.inner();
        let mut nodes: Vec<NodeState> = Vec::new();
        let mut slots = vec![0u16; SLOTS];
        for (first, last, name) in ranges {
            let i = match nodes.iter().position(|n| n.name == name) {
                Some(i) => i,
                None => {
                    let open = inner
                        .nodes
                        .iter_mut()
                        .find(|n| n.name == name)
                        .and_then(|n| n.open.take());
                    nodes.push(NodeState {
                        name: name.clone(),
                        slot: first,
                        open,
                    });
                    nodes.len() - 1
                }
            };
            for s in first..=last.min(SLOTS as u16 - 1) {
                slots[s as usize] = i as u16;
            }
        }
        for n in &nodes {
            self.metrics
                .breaker_open
                .get_or_create(&Node {
                    node: n.name.clone(),
                })
                .set(i64::from(n.open.is_some()));
        }
        for gone in inner
            .nodes
            .iter()
            .filter(|o| !nodes.iter().any(|n| n.name == o.name))
        {
            self.metrics.breaker_open.remove(&Node {
                node: gone.name.clone(),
            });
        }
        self.any_open
            .store(nodes.iter().any(|n| n.open.is_some()), Ordering::Release);
        inner.nodes = nodes;
        inner.slots = slots;
    }

    fn node_of(inner: &Inner, slot: u16) -> usize {
        inner.slots.get(slot as usize).copied().unwrap_or(0) as usize
    }

    /// `Err` when the node of `slot` is known down: answer at once (the
    /// caller counts it).
    pub(super) fn check(&self, slot: u16) -> Result<(), Tripped> {
        if !self.any_open.load(Ordering::Acquire) {
            return Ok(());
        }
        let inner = self.inner();
        let n = &inner.nodes[Self::node_of(&inner, slot)];
        match &n.open {
            None => Ok(()),
            Some((since, cause, label)) => Err(Tripped {
                cause: cause.clone(),
                label,
                node: n.name.clone(),
                open_for: since.elapsed(),
            }),
        }
    }

    /// The first node known down, if any (`/healthz` answers from it
    /// without a call).
    pub(super) fn first_open(&self) -> Option<Tripped> {
        if !self.any_open.load(Ordering::Acquire) {
            return None;
        }
        let inner = self.inner();
        inner.nodes.iter().find_map(|n| {
            n.open.as_ref().map(|(since, cause, label)| Tripped {
                cause: cause.clone(),
                label,
                node: n.name.clone(),
                open_for: since.elapsed(),
            })
        })
    }

    /// A call for `slot` failed with `e`: opens the node's breaker if `e`
    /// says the node does not answer (and starts its probe).
    pub(super) fn failed(self: &Arc<Self>, slot: u16, e: &RedisError) {
        if !matches!(e, RedisError::Unreachable(_) | RedisError::TimedOut(_)) {
            return;
        }
        let node = {
            let mut inner = self.inner();
            let i = Self::node_of(&inner, slot);
            let n = &mut inner.nodes[i];
            if n.open.is_some() {
                return;
            }
            n.open = Some((Instant::now(), e.to_string(), super::metrics::cause(e)));
            if inner.slots.is_empty() {
                // No map of the Cluster: probe the slot that failed.
                inner.nodes[i].slot = slot;
            }
            self.any_open.store(true, Ordering::Release);
            i
        };
        let name = self.inner().nodes[node].name.clone();
        self.metrics
            .breaker_open
            .get_or_create(&Node { node: name.clone() })
            .set(1);
        tracing::warn!(node = %name, error = %e, "serve: Redis does not answer; its keys are answered 503 at once until it does");
        let me = self.clone();
        tokio::spawn(async move { me.probe(name).await });
    }

    /// Asks the node `name` until it answers, then closes its breaker.
    async fn probe(self: Arc<Self>, name: String) {
        let started = Instant::now();
        loop {
            let slot = {
                let inner = self.inner();
                match inner.nodes.iter().find(|n| n.name == name) {
                    Some(n) if n.open.is_some() => n.slot,
                    // Closed by another, or no longer a master.
                    _ => return,
                }
            };
            let asked = Instant::now();
            let r = if self.store.is_cluster() {
                self.store.probe_slot(&self.prefix, slot).await
            } else {
                self.store.probe(&self.prefix).await
            };
            match r {
                Err(RedisError::Unreachable(_) | RedisError::TimedOut(_)) => {
                    self.metrics
                        .breaker_probes
                        .get_or_create(&Outcome { outcome: "failed" })
                        .inc();
                    if asked.elapsed() < PROBE_EVERY {
                        tokio::time::sleep(PROBE_EVERY - asked.elapsed()).await;
                    }
                }
                _ => {
                    self.metrics
                        .breaker_probes
                        .get_or_create(&Outcome {
                            outcome: "answered",
                        })
                        .inc();
                    self.close(&name);
                    tracing::info!(node = %name, down_for_ms = started.elapsed().as_millis() as u64, "serve: Redis answers again; its keys are served");
                    self.refresh().await;
                    return;
                }
            }
        }
    }

    fn close(&self, name: &str) {
        let mut inner = self.inner();
        if let Some(n) = inner.nodes.iter_mut().find(|n| n.name == name) {
            n.open = None;
        }
        self.any_open.store(
            inner.nodes.iter().any(|n| n.open.is_some()),
            Ordering::Release,
        );
        self.metrics
            .breaker_open
            .get_or_create(&Node { node: name.into() })
            .set(0);
    }
}
