//! Prometheus metrics over HTTP: hyper serves the connections, axum routes
//! `/metrics` (anything else is 404), and the official `prometheus-client`
//! encodes a snapshot the daemon's loop takes on each scrape.
//!
//! What a flood of idle or slow clients can cost is bounded: at most
//! [`MAX_CONNECTIONS`] are open at a time (past it, the one idle longest is
//! closed for the newcomer: one that has not sent its request, or whose
//! reader does not take its answer; see [`crate::host::slots`]), one request per
//! connection, whose headers must arrive within [`HEADER_TIMEOUT`] and whose
//! answer must be taken within [`WRITE_TIMEOUT`] (else the connection is
//! reset); a connection lives at most [`CONNECTION_LIFETIME`], an accept
//! error backs off before the next accept, and a repeated error is logged
//! once per [`LOG_EVERY`](crate::host::logs::LOG_EVERY) with the count of the ones not logged.
//!
//! Memory too: scrapes within [`FRESH`] of each other share one rendering of
//! the exposition (megabytes with thousands of rules), answers hold it without
//! copies, and at most [`MAX_RENDERINGS`] are alive at once: past that, the
//! newest is served again, whatever its age, until slow answers let go.

use std::{
    os::fd::AsRawFd as _,
    sync::{
        Arc, Mutex, PoisonError,
        atomic::{AtomicUsize, Ordering},
    },
    time::{Duration, Instant},
};

use axum::{
    Router,
    body::Bytes,
    extract::State,
    http::{StatusCode, header},
    response::{IntoResponse, Response},
    routing::get,
};
use hyper_util::rt::{TokioIo, TokioTimer};
use prometheus_client::{
    collector::Collector,
    encoding::{DescriptorEncoder, EncodeMetric},
    metrics::{MetricType, counter::ConstCounter, gauge::ConstGauge, histogram::Histogram},
    registry::Registry,
};
use ratelimit_common::{Counter, EVENT_COUNT, Event, REASON_COUNT, Reason, RuleCounter};
use tokio::{
    net::TcpListener,
    sync::{mpsc, oneshot},
};

use crate::{
    host::slots::{AcceptBackoff, ResetOnClose, Slot, Slots},
    kernel::Attached,
    model::lists::ListAction,
};

/// The port the `--metrics` examples use (Prometheus' registry of exporter
/// ports has no entry for ratelimit; 9477 is free there).
pub const EXAMPLE_PORT: u16 = 9477;
/// Connections open at once.
pub const MAX_CONNECTIONS: usize = 64;
/// How long a client may take to send its request headers.
pub const HEADER_TIMEOUT: Duration = Duration::from_secs(5);
/// How long one connection may live, however busy.
pub const CONNECTION_LIFETIME: Duration = Duration::from_secs(60);
/// How long a scrape's answer may take to be written: a reader slower than
/// this (5 MB at 500 kB/s) is cut off, its connection reset so that the
/// kernel frees what it still held for it.
pub const WRITE_TIMEOUT: Duration = Duration::from_secs(10);
/// Scrapes this close together share one rendering (and one snapshot).
pub const FRESH: Duration = Duration::from_secs(1);
/// Renderings alive at once: the newest, and older ones still held by answers
/// being written. Past it, the newest is served again whatever its age.
pub const MAX_RENDERINGS: usize = 4;

/// What one scrape reports.
#[derive(Clone, Debug)]
pub struct Snapshot {
    /// The interface.
    pub iface: String,
    /// The attach mode.
    pub mode: Attached,
    /// Whether the program is attached to the interface now.
    pub attached: bool,
    /// Counters by reason.
    pub counters: [Counter; REASON_COUNT as usize],
    /// Counters by event.
    pub events: [u64; EVENT_COUNT as usize],
    /// Tracked sources.
    pub tracked: usize,
    /// Rules.
    pub rules: usize,
    /// Each rule's counters (`default` and each rule's CIDR and match), by
    /// [`RuleCounter`].
    pub rule_counters: Vec<(String, [Counter; RuleCounter::ALL.len()])>,
    /// Each list's frames (dropped by a deny list, passed by an allow
    /// list), by name, with its action.
    pub list_counters: Vec<(String, ListAction, Counter)>,
    /// The fleet, when run with `--fleet`.
    pub fleet: Option<crate::fleet::Status>,
    /// The fleet sync's ages, when run with `--fleet`.
    pub fleet_sync: Option<Histogram>,
    /// The CrowdSec bouncer, when run with `--crowdsec`.
    pub crowdsec: Option<crate::crowdsec::Status>,
    /// The drop log's counts (records written, drops skipped, records lost).
    pub drop_log: crate::kernel::DropLogCounts,
    /// Map entries found different from what the daemon wrote, put back.
    pub drift_repaired: u64,
}

impl Collector for Snapshot {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let iface = ("iface", self.iface.clone());
        let by_reason = |f: fn(&Counter) -> u64| {
            Reason::ALL
                .iter()
                .map(|r| {
                    (
                        vec![iface.clone(), ("reason", r.name().to_string())],
                        f(&self.counters[*r as usize]),
                    )
                })
                .collect()
        };
        counter(
            &mut encoder,
            "ratelimit_packets",
            "Frames seen by the XDP program, by the reason of their verdict.",
            by_reason(|c| c.packets),
        )?;
        counter(
            &mut encoder,
            "ratelimit_bytes",
            "Bytes of those frames (whole frames from the Ethernet header).",
            by_reason(|c| c.bytes),
        )?;
        let by_rule = |f: fn(&Counter) -> u64| {
            self.rule_counters
                .iter()
                .flat_map(|(rule, counters)| {
                    RuleCounter::ALL.iter().zip(counters).map(|(k, c)| {
                        (
                            vec![
                                iface.clone(),
                                ("rule", rule.clone()),
                                ("verdict", k.name().to_string()),
                            ],
                            f(c),
                        )
                    })
                })
                .collect()
        };
        counter(
            &mut encoder,
            "ratelimit_rule_packets",
            "Frames each rule judged, by what it did: passed, dropped at its own level (or denied), at key level 2 or 3, at the aggregate (empty whatever the source), at the aggregate's reserve (a new or young source), by the new-source budget, or would have dropped (dry run).",
            by_rule(|c| c.packets),
        )?;
        counter(
            &mut encoder,
            "ratelimit_rule_bytes",
            "Bytes of those frames.",
            by_rule(|c| c.bytes),
        )?;
        let by_list = |f: fn(&Counter) -> u64| {
            self.list_counters
                .iter()
                .map(|(name, action, c)| {
                    (
                        vec![
                            iface.clone(),
                            ("list", name.clone()),
                            ("action", action.to_string()),
                        ],
                        f(c),
                    )
                })
                .collect()
        };
        counter(
            &mut encoder,
            "ratelimit_list_packets",
            "Frames each list judged since it was loaded: dropped by a deny list, passed by an allow list.",
            by_list(|c| c.packets),
        )?;
        counter(
            &mut encoder,
            "ratelimit_list_bytes",
            "Bytes of those frames.",
            by_list(|c| c.bytes),
        )?;
        counter(
            &mut encoder,
            "ratelimit_state_events",
            "States created for sources the doorkeeper saw twice (states_created), promotions refused by the state-creation cap (new_states_capped), frames judged without state (unjudged), keys the state table had no free slot for (state_full), and frames of fleet-wide keys the fleet's count table had no free slot for (fleet_full).",
            Event::ALL
                .iter()
                .map(|e| {
                    (
                        vec![iface.clone(), ("event", e.name().to_string())],
                        self.events[*e as usize],
                    )
                })
                .collect(),
        )?;
        counter(
            &mut encoder,
            "ratelimit_drop_log_records",
            "Drop log records the program wrote for `ratelimit log` (sampled drops, within the budget per CPU).",
            vec![(vec![iface.clone()], self.drop_log.written)],
        )?;
        counter(
            &mut encoder,
            "ratelimit_drop_log_skipped",
            "Drops the drop log did not record: over its budget per CPU (`skipped`), or the ring buffer was full (`ring_full`).",
            vec![
                (
                    vec![iface.clone(), ("why", "skipped".to_string())],
                    self.drop_log.skipped,
                ),
                (
                    vec![iface.clone(), ("why", "ring_full".to_string())],
                    self.drop_log.lost,
                ),
            ],
        )?;
        counter(
            &mut encoder,
            "ratelimit_drift_repaired",
            "Entries of the pinned maps found different from what the daemon wrote (edited by hand) and put back as the record holds them.",
            vec![(vec![iface.clone()], self.drift_repaired)],
        )?;
        gauge(
            &mut encoder,
            "ratelimit_tracked_sources",
            "Sources with a state of their own (refreshed every 10 s at most).",
            vec![(vec![iface.clone()], self.tracked as i64)],
        )?;
        gauge(
            &mut encoder,
            "ratelimit_rules",
            "Prefix rules, besides the default rule.",
            vec![(vec![iface.clone()], self.rules as i64)],
        )?;
        gauge(
            &mut encoder,
            "ratelimit_attached",
            "1 while the program is attached to the interface, 0 while the interface is gone.",
            vec![(vec![iface.clone()], i64::from(self.attached))],
        )?;
        gauge(
            &mut encoder,
            "ratelimit_attach_mode",
            "The XDP attach mode (1 for the mode in use).",
            [Attached::Native, Attached::Generic]
                .iter()
                .map(|m| {
                    (
                        vec![iface.clone(), ("mode", m.to_string())],
                        i64::from(*m == self.mode),
                    )
                })
                .collect(),
        )?;
        if let Some(f) = &self.fleet {
            fleet(&mut encoder, &iface, f)?;
        }
        if let Some(h) = &self.fleet_sync {
            family(
                &mut encoder,
                "ratelimit_fleet_sync_seconds",
                "Each fleet sync's age: from reading the counts to Redis's last answer used (what the fleet's bound calls its sync age; an answer past 100 ms is charged as under the fallback).",
                MetricType::Histogram,
                vec![(vec![iface.clone()], h.clone())],
            )?;
        }
        if let Some(c) = &self.crowdsec {
            crowdsec(&mut encoder, &iface, c)?;
        }
        Ok(())
    }
}

/// The CrowdSec bouncer's families: per origin, never per address.
fn crowdsec(
    encoder: &mut DescriptorEncoder,
    iface: &(&'static str, String),
    c: &crate::crowdsec::Status,
) -> Result<(), std::fmt::Error> {
    let by_origin = |f: &dyn Fn(&crate::crowdsec::OriginStatus) -> u64| {
        c.origins
            .iter()
            .map(|o| (vec![iface.clone(), ("origin", o.origin.clone())], f(o)))
            .collect::<Vec<_>>()
    };
    gauge(
        encoder,
        "ratelimit_crowdsec_lapi_up",
        "1 while the last pull of the CrowdSec Local API's decisions was answered and applied.",
        vec![(vec![iface.clone()], i64::from(c.lapi_up))],
    )?;
    gauge(
        encoder,
        "ratelimit_crowdsec_decisions",
        "Addresses and ranges banned by CrowdSec's decisions, by origin.",
        by_origin(&|o| o.entries as u64)
            .into_iter()
            .map(|(l, v)| (l, v as i64))
            .collect(),
    )?;
    counter(
        encoder,
        "ratelimit_crowdsec_dropped_packets",
        "Frames dropped by CrowdSec's decisions, by origin, since the daemon started.",
        by_origin(&|o| o.dropped_packets),
    )?;
    counter(
        encoder,
        "ratelimit_crowdsec_dropped_bytes",
        "Bytes of those frames.",
        by_origin(&|o| o.dropped_bytes),
    )?;
    counter(
        encoder,
        "ratelimit_crowdsec_pulls",
        "Pulls of the decision stream, by result: ok (answered and applied) or failed.",
        vec![
            (vec![iface.clone(), ("result", "ok".into())], c.pulls),
            (
                vec![iface.clone(), ("result", "failed".into())],
                c.failed_pulls,
            ),
        ],
    )?;
    counter(
        encoder,
        "ratelimit_crowdsec_ignored",
        "Decisions not applied, by why: type (not in --crowdsec-types), scope (not Ip or Range), filtered (origin or scenario), too_broad (wider than --crowdsec-widest), bad_duration (a duration that cannot be read), protected (covers loopback, the host's addresses or the Local API's).",
        vec![
            (
                vec![iface.clone(), ("why", "type".into())],
                c.ignored.by_type,
            ),
            (
                vec![iface.clone(), ("why", "scope".into())],
                c.ignored.by_scope,
            ),
            (
                vec![iface.clone(), ("why", "filtered".into())],
                c.ignored.filtered,
            ),
            (
                vec![iface.clone(), ("why", "too_broad".into())],
                c.ignored.too_broad,
            ),
            (
                vec![iface.clone(), ("why", "bad_duration".into())],
                c.ignored.bad_duration,
            ),
            (
                vec![iface.clone(), ("why", "protected".into())],
                c.ignored.protected,
            ),
        ],
    )?;
    counter(
        encoder,
        "ratelimit_crowdsec_clipped",
        "Decisions held for --crowdsec-longest instead of their longer duration.",
        vec![(vec![iface.clone()], c.clipped)],
    )?;
    counter(
        encoder,
        "ratelimit_crowdsec_over_cap",
        "Decisions not applied because --crowdsec-max-decisions were held (counted at each pull that sends them).",
        vec![(vec![iface.clone()], c.over_cap)],
    )
}

/// The fleet's gauges and counters.
fn fleet(
    encoder: &mut DescriptorEncoder,
    iface: &(&'static str, String),
    f: &crate::fleet::Status,
) -> Result<(), std::fmt::Error> {
    let one = |v: i64| vec![(vec![iface.clone()], v)];
    let count = |v: u64| vec![(vec![iface.clone()], v)];
    gauge(
        encoder,
        "ratelimit_fleet_redis_up",
        "1 while the last sync reached the fleet's Redis for every key (and the members), 0 while some keys are judged by the fallback.",
        one(i64::from(f.redis_up)),
    )?;
    gauge(
        encoder,
        "ratelimit_fleet_daemons",
        "Daemons of the fleet counted by their leases on Redis's clock (this one included).",
        one(f.daemons as i64),
    )?;
    gauge(
        encoder,
        "ratelimit_fleet_silent_daemons",
        "Of those, daemons that stopped renewing (cut off from Redis, or dead): their share of each key is left to them.",
        one(f.silent_daemons as i64),
    )?;
    gauge(
        encoder,
        "ratelimit_fleet_silent_attached_daemons",
        "Of the silent ones, daemons past their 10 s lease that never left (dead or cut off, their programs perhaps still enforcing their shares): counted for 10 minutes after their last renewal. A daemon that stopped for good left and is not counted.",
        one(f.past_lease_daemons as i64),
    )?;
    gauge(
        encoder,
        "ratelimit_fleet_keys",
        "Keys of fleet-wide rules this daemon follows (admitted something in the last 2 s).",
        one(f.keys as i64),
    )?;
    gauge(
        encoder,
        "ratelimit_fleet_keys_over",
        "Of those, keys whose fleet-wide bucket is empty (the fleet holds them at their limit).",
        one(f.keys_over as i64),
    )?;
    gauge(
        encoder,
        "ratelimit_fleet_keys_fallback",
        "Of those, keys judged by the fallback at their last sync (their Redis, or Cluster master, could not be asked or answered too late).",
        one(f.keys_fallback as i64),
    )?;
    gauge(
        encoder,
        "ratelimit_fleet_groups_down",
        "Key groups whose Redis could not be asked (each is asked again every second).",
        one(f.groups_down as i64),
    )?;
    family(
        encoder,
        "ratelimit_fleet_lag_seconds",
        "The age of the oldest fleet debt a key was judged with at the last sync (the worst key's lag).",
        MetricType::Gauge,
        vec![(vec![iface.clone()], ConstGauge::new(f.lag_ms / 1e3))],
    )?;
    counter(
        encoder,
        "ratelimit_fleet_reported_units",
        "Units (packets, or bytes for byte rules) this daemon reported to the fleet.",
        count(f.reported),
    )?;
    counter(
        encoder,
        "ratelimit_fleet_fallback_syncs",
        "Syncs with keys judged by the fallback policy (Redis, or their Cluster master, could not be reached).",
        count(f.fallback_syncs),
    )?;
    counter(
        encoder,
        "ratelimit_fleet_slow_syncs",
        "Syncs with an answer later than the fleet's bound assumes (100 ms): its keys were charged as under the fallback too.",
        count(f.slow_syncs),
    )
}

/// A metric's labels: (name, value) pairs.
type Labels = Vec<(&'static str, String)>;

/// One metric family: its descriptor, then each row's value with its labels.
fn family<M: EncodeMetric>(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    kind: MetricType,
    rows: impl IntoIterator<Item = (Labels, M)>,
) -> Result<(), std::fmt::Error> {
    let mut family = encoder.encode_descriptor(name, help, None, kind)?;
    for (labels, metric) in rows {
        metric.encode(family.encode_family(&labels)?)?;
    }
    Ok(())
}

/// A counter family.
fn counter(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    rows: Vec<(Labels, u64)>,
) -> Result<(), std::fmt::Error> {
    let rows = rows.into_iter().map(|(l, v)| (l, ConstCounter::new(v)));
    family(encoder, name, help, MetricType::Counter, rows)
}

/// A gauge family.
fn gauge(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    rows: Vec<(Labels, i64)>,
) -> Result<(), std::fmt::Error> {
    let rows = rows.into_iter().map(|(l, v)| (l, ConstGauge::new(v)));
    family(encoder, name, help, MetricType::Gauge, rows)
}

/// Renders the exposition text (OpenMetrics).
pub fn render(s: &Snapshot) -> String {
    render_with(s, 0)
}

/// Renders into a string of `capacity` to begin with (the last rendering's
/// length: a growing string would hold up to twice the text).
fn render_with(s: &Snapshot, capacity: usize) -> String {
    let mut registry = Registry::default();
    registry.register_collector(Box::new(s.clone()));
    let mut out = String::with_capacity(capacity);
    prometheus_client::encoding::text::encode(&mut out, &registry)
        .expect("writing to a String cannot fail");
    out
}

/// A request for a snapshot, answered by the daemon's loop.
pub type SnapshotRequest = oneshot::Sender<Snapshot>;

/// What the scrapes share.
struct Exposer {
    snapshots: mpsc::Sender<SnapshotRequest>,
    /// The newest rendering and when it was made; locked while one is made,
    /// so that scrapes arriving meanwhile wait for it rather than make theirs.
    latest: tokio::sync::Mutex<Option<(Instant, Bytes)>>,
    /// Renderings alive (held by `latest` or by answers being written).
    live: Arc<AtomicUsize>,
}

/// One rendering's text, counted alive until its last holder lets go.
struct Rendering {
    text: Vec<u8>,
    live: Arc<AtomicUsize>,
}

impl AsRef<[u8]> for Rendering {
    fn as_ref(&self) -> &[u8] {
        &self.text
    }
}

impl Drop for Rendering {
    fn drop(&mut self) {
        self.live.fetch_sub(1, Ordering::Relaxed);
    }
}

impl Exposer {
    /// The exposition to answer with: the newest rendering if it is fresh (or
    /// if [`MAX_RENDERINGS`] are alive), else a new one.
    async fn exposition(&self) -> Option<Bytes> {
        let mut latest = self.latest.lock().await;
        if let Some((at, text)) = &*latest
            && (at.elapsed() < FRESH || self.live.load(Ordering::Relaxed) >= MAX_RENDERINGS)
        {
            return Some(text.clone());
        }
        let (reply, answer) = oneshot::channel();
        self.snapshots.send(reply).await.ok()?;
        let snapshot = tokio::time::timeout(Duration::from_secs(5), answer)
            .await
            .ok()?
            .ok()?;
        let capacity = latest.as_ref().map_or(0, |(_, t)| t.len() + t.len() / 8);
        // Megabytes of text with thousands of rules: off the async threads.
        let text = tokio::task::spawn_blocking(move || render_with(&snapshot, capacity))
            .await
            .ok()?;
        self.live.fetch_add(1, Ordering::Relaxed);
        let text = Bytes::from_owner(Rendering {
            text: text.into_bytes(),
            live: self.live.clone(),
        });
        *latest = Some((Instant::now(), text.clone()));
        Some(text)
    }
}

async fn scrape(State(exposer): State<Arc<Exposer>>) -> Response {
    match exposer.exposition().await {
        Some(text) => (
            [(
                header::CONTENT_TYPE,
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
            )],
            text,
        )
            .into_response(),
        None => (StatusCode::SERVICE_UNAVAILABLE, String::new()).into_response(),
    }
}

/// Serves `/metrics` on `listener` until the task is dropped.
pub async fn serve(listener: TcpListener, snapshots: mpsc::Sender<SnapshotRequest>) {
    let exposer = Arc::new(Exposer {
        snapshots,
        latest: tokio::sync::Mutex::new(None),
        live: Arc::default(),
    });
    let app = Router::new()
        .route("/metrics", get(scrape))
        .with_state(exposer);
    let slots = Slots::new(MAX_CONNECTIONS);
    let mut backoff = AcceptBackoff::default();
    loop {
        match listener.accept().await {
            Ok((stream, _)) => {
                backoff.accepted();
                let app = app.clone();
                // Full: every connection is working on a scrape; this one is
                // dropped (closed).
                let _ = slots.spawn(move |slot| connection(stream, slot, app));
            }
            Err(e) => {
                backoff
                    .failed("metrics: accepting a connection failed; backing off", &e)
                    .await
            }
        }
    }
}

/// One scrape: its headers within [`HEADER_TIMEOUT`], its answer taken within
/// [`WRITE_TIMEOUT`]; its slot idle again (so that it may be closed for a
/// newcomer) once the answer is made.
async fn connection(stream: tokio::net::TcpStream, slot: Slot, app: Router) {
    let fd = stream.as_raw_fd();
    let slot = Arc::new(slot);
    let (answered, is_answered) = oneshot::channel::<()>();
    let answered = Arc::new(Mutex::new(Some(answered)));
    let service = tower::service_fn(move |req| {
        slot.busy();
        let mut app = app.clone();
        let slot = slot.clone();
        let answered = answered.clone();
        async move {
            let response = tower::Service::call(&mut app, req).await;
            slot.idle();
            let tx = answered
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .take();
            if let Some(tx) = tx {
                let _ = tx.send(());
            }
            response
        }
    });
    let conn = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(HEADER_TIMEOUT)
        .keep_alive(false)
        .serve_connection(
            TokioIo::new(stream),
            hyper_util::service::TowerToHyperService::new(service),
        );
    tokio::pin!(conn);
    // Reset if cut off here, or closed for room (the task aborted).
    let mut reset = ResetOnClose::new(fd);
    let cut_off = async {
        match is_answered.await {
            Ok(()) => tokio::time::sleep(WRITE_TIMEOUT).await,
            Err(_) => std::future::pending().await,
        }
    };
    let done = tokio::time::timeout(CONNECTION_LIFETIME, async {
        tokio::select! {
            _ = &mut conn => true,
            () = cut_off => false,
        }
    })
    .await;
    if matches!(done, Ok(true)) {
        reset.disarm();
    }
}
