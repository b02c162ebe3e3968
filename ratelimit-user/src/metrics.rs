//! Prometheus metrics over HTTP: hyper serves the connections, axum routes
//! `/metrics` (anything else is 404), and the official `prometheus-client`
//! encodes a snapshot the daemon's loop takes on each scrape.
//!
//! What a flood of idle or slow clients can cost is bounded: at most
//! [`MAX_CONNECTIONS`] are open at a time (past it, the oldest that has not
//! sent its request is closed for the newcomer: see [`crate::slots`]), one
//! request per connection, whose headers must arrive within [`HEADER_TIMEOUT`];
//! a connection lives at most [`CONNECTION_LIFETIME`], an accept error backs
//! off before the next accept, and a repeated error is logged once per
//! [`LOG_EVERY`] with the count of the ones not logged.

use std::{
    sync::Arc,
    time::{Duration, Instant},
};

use axum::{Router, extract::State, http::header, response::IntoResponse, routing::get};
use hyper_util::rt::{TokioIo, TokioTimer};
use prometheus_client::{
    collector::Collector,
    encoding::{DescriptorEncoder, EncodeMetric as _},
    metrics::{counter::ConstCounter, gauge::ConstGauge},
    registry::Registry,
};
use ratelimit_common::{Counter, EVENT_COUNT, Event, REASON_COUNT, Reason, RuleCounter};
use tokio::{
    net::TcpListener,
    sync::{mpsc, oneshot},
};

use crate::{
    kernel::Attached,
    slots::{AcceptBackoff, Slots},
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
/// A repeated error is logged at most this often.
pub const LOG_EVERY: Duration = Duration::from_secs(10);

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
    /// The fleet, when run with `--fleet`.
    pub fleet: Option<crate::fleet::Status>,
}

impl Collector for Snapshot {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let iface = ("iface", self.iface.clone());
        let counter = |encoder: &mut DescriptorEncoder,
                       name: &str,
                       help: &str,
                       rows: Vec<(Vec<(&'static str, String)>, u64)>|
         -> Result<(), std::fmt::Error> {
            let mut family = encoder.encode_descriptor(
                name,
                help,
                None,
                prometheus_client::metrics::MetricType::Counter,
            )?;
            for (labels, v) in rows {
                ConstCounter::new(v).encode(family.encode_family(&labels)?)?;
            }
            Ok(())
        };
        let gauge = |encoder: &mut DescriptorEncoder,
                     name: &str,
                     help: &str,
                     rows: Vec<(Vec<(&'static str, String)>, i64)>|
         -> Result<(), std::fmt::Error> {
            let mut family = encoder.encode_descriptor(
                name,
                help,
                None,
                prometheus_client::metrics::MetricType::Gauge,
            )?;
            for (labels, v) in rows {
                ConstGauge::new(v).encode(family.encode_family(&labels)?)?;
            }
            Ok(())
        };
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
            "Frames each rule judged, by what it did: passed, dropped at its own level (or denied), at key level 2 or 3, at the aggregate, by the new-source budget, or would have dropped (dry run).",
            by_rule(|c| c.packets),
        )?;
        counter(
            &mut encoder,
            "ratelimit_rule_bytes",
            "Bytes of those frames.",
            by_rule(|c| c.bytes),
        )?;
        counter(
            &mut encoder,
            "ratelimit_state_events",
            "States created for sources the doorkeeper saw twice, and promotions refused by the state-creation cap.",
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
            let one = |v: i64| vec![(vec![iface.clone()], v)];
            gauge(
                &mut encoder,
                "ratelimit_fleet_redis_up",
                "1 while the last sync reached the fleet's Redis, 0 while the fallback policy holds.",
                one(i64::from(f.redis_up)),
            )?;
            gauge(
                &mut encoder,
                "ratelimit_fleet_daemons",
                "Daemons of the fleet seen in the last 3 s (this one included).",
                one(f.daemons as i64),
            )?;
            gauge(
                &mut encoder,
                "ratelimit_fleet_keys",
                "Keys of fleet-wide rules this daemon follows (admitted something in the last 2 s).",
                one(f.keys as i64),
            )?;
            gauge(
                &mut encoder,
                "ratelimit_fleet_keys_over",
                "Of those, keys whose fleet-wide bucket is empty (the fleet holds them at their limit).",
                one(f.keys_over as i64),
            )?;
            counter(
                &mut encoder,
                "ratelimit_fleet_reported_units",
                "Units (packets, or bytes for byte rules) this daemon reported to the fleet.",
                vec![(vec![iface.clone()], f.reported)],
            )?;
            counter(
                &mut encoder,
                "ratelimit_fleet_fallback_syncs",
                "Syncs made under the fallback policy (Redis could not be reached).",
                vec![(vec![iface.clone()], f.fallback_syncs)],
            )?;
        }
        Ok(())
    }
}

/// Renders the exposition text (OpenMetrics).
pub fn render(s: &Snapshot) -> String {
    let mut registry = Registry::default();
    registry.register_collector(Box::new(s.clone()));
    let mut out = String::new();
    prometheus_client::encoding::text::encode(&mut out, &registry)
        .expect("writing to a String cannot fail");
    out
}

/// A request for a snapshot, answered by the daemon's loop.
pub type SnapshotRequest = oneshot::Sender<Snapshot>;

async fn scrape(State(tx): State<mpsc::Sender<SnapshotRequest>>) -> impl IntoResponse {
    let (reply, answer) = oneshot::channel();
    let snapshot = match tx.send(reply).await {
        Ok(()) => tokio::time::timeout(Duration::from_secs(5), answer).await,
        Err(_) => {
            return (axum::http::StatusCode::SERVICE_UNAVAILABLE, String::new()).into_response();
        }
    };
    match snapshot {
        Ok(Ok(s)) => (
            [(
                header::CONTENT_TYPE,
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
            )],
            render(&s),
        )
            .into_response(),
        _ => (axum::http::StatusCode::SERVICE_UNAVAILABLE, String::new()).into_response(),
    }
}

/// Logs an error at most once per [`LOG_EVERY`], with how many were not.
pub struct QuietLog {
    last: Option<Instant>,
    skipped: u64,
}

impl Default for QuietLog {
    fn default() -> Self {
        Self::new()
    }
}

impl QuietLog {
    /// A fresh one.
    pub const fn new() -> Self {
        Self {
            last: None,
            skipped: 0,
        }
    }

    /// Logs `what` unless one was logged less than [`LOG_EVERY`] ago.
    pub fn warn(&mut self, what: &str, error: &dyn std::fmt::Display) {
        if self.last.is_some_and(|t| t.elapsed() < LOG_EVERY) {
            self.skipped += 1;
            return;
        }
        tracing::warn!(error = %error, repeated = self.skipped, "{what}");
        self.last = Some(Instant::now());
        self.skipped = 0;
    }
}

/// Serves `/metrics` on `listener` until the task is dropped.
pub async fn serve(listener: TcpListener, snapshots: mpsc::Sender<SnapshotRequest>) {
    let app = Router::new()
        .route("/metrics", get(scrape))
        .with_state(snapshots);
    let slots = Slots::new(MAX_CONNECTIONS);
    let mut backoff = AcceptBackoff::default();
    loop {
        match listener.accept().await {
            Ok((stream, _)) => {
                backoff.accepted();
                let app = app.clone();
                slots.spawn(move |slot| async move {
                    // The slot turns busy when the request's headers are in.
                    let slot = Arc::new(slot);
                    let service = tower::service_fn(move |req| {
                        slot.busy();
                        let mut app = app.clone();
                        async move { tower::Service::call(&mut app, req).await }
                    });
                    let conn = hyper::server::conn::http1::Builder::new()
                        .timer(TokioTimer::new())
                        .header_read_timeout(HEADER_TIMEOUT)
                        .keep_alive(false)
                        .serve_connection(
                            TokioIo::new(stream),
                            hyper_util::service::TowerToHyperService::new(service),
                        );
                    let _ = tokio::time::timeout(CONNECTION_LIFETIME, conn).await;
                });
            }
            Err(e) => {
                backoff
                    .failed("metrics: accepting a connection failed; backing off", &e)
                    .await
            }
        }
    }
}
