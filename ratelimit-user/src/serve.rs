//! `ratelimit serve`: seed 002's throttling service over HTTP and JSON, for
//! programs not written in Rust. Stateless: every decision is one atomic script
//! in Redis ([`ratelimit_redis`]), so any number of replicas behind any load
//! balancer share every limit.
//!
//! - `POST /v1/acquire {"key", "amount", "limit": {"rate", "burst", "algorithm"}}`
//!   → `{"allowed", "granted", "retry_after_ms", "remaining"}`
//! - `POST /v1/refill {"key", "amount", "limit"?}` → `{"refunded", "remaining"}`
//! - `GET /metrics` (OpenMetrics), `GET /healthz`
//!
//! A bad request is answered 400 with `{"error", "field"}`; Redis unreachable,
//! 503 with `{"error"}` (the caller decides whether to fail open or closed).

use std::{
    sync::Arc,
    time::{Duration, Instant},
};

use axum::{
    Json, Router,
    body::Bytes,
    extract::{DefaultBodyLimit, State},
    http::{StatusCode, header},
    response::{IntoResponse, Response},
    routing::{get, post},
};
use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{counter::Counter, family::Family, gauge::Gauge, histogram::Histogram},
    registry::Registry,
};
use ratelimit_redis::{Limit, Store};
use serde_json::{Value, json};

use crate::{
    error::{Error, Result},
    rate::{Unit, parse_rate},
};

/// Longest key accepted, bytes.
pub const MAX_KEY: usize = 512;
/// Largest request body, bytes.
pub const MAX_BODY: usize = 16 * 1024;
/// The port `--listen` defaults to (on 127.0.0.1).
pub const DEFAULT_PORT: u16 = 9478;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Outcome {
    outcome: &'static str,
}

struct Metrics {
    registry: Registry,
    decisions: Family<Outcome, Counter>,
    refunds: Counter,
    redis_latency: Histogram,
    redis_up: Gauge,
}

impl Metrics {
    fn new() -> Self {
        let mut registry = Registry::default();
        let decisions = Family::<Outcome, Counter>::default();
        registry.register(
            "ratelimit_serve_decisions",
            "Acquire requests by outcome: allowed (all granted), partial (some), denied (none), bad_request, redis_error.",
            decisions.clone(),
        );
        let refunds = Counter::default();
        registry.register(
            "ratelimit_serve_refunded_units",
            "Units given back through /v1/refill.",
            refunds.clone(),
        );
        // 50 µs to about 0.8 s.
        let redis_latency = Histogram::new(
            prometheus_client::metrics::histogram::exponential_buckets(0.000_05, 2.0, 15),
        );
        registry.register(
            "ratelimit_serve_redis_seconds",
            "Time one Redis call took, seconds.",
            redis_latency.clone(),
        );
        let redis_up = Gauge::default();
        registry.register(
            "ratelimit_serve_redis_up",
            "1 if the last Redis call succeeded, 0 if it failed.",
            redis_up.clone(),
        );
        Self {
            registry,
            decisions,
            refunds,
            redis_latency,
            redis_up,
        }
    }

    fn count(&self, outcome: &'static str) {
        self.decisions.get_or_create(&Outcome { outcome }).inc();
    }
}

struct App {
    store: Store,
    prefix: String,
    metrics: Metrics,
}

/// A 400 naming the field.
fn bad(e: Error) -> Response {
    let (field, message) = match &e {
        Error::Invalid { field, message } => (field.clone(), message.clone()),
        other => (String::new(), other.to_string()),
    };
    (
        StatusCode::BAD_REQUEST,
        Json(json!({ "error": format!("{field}: {message}"), "field": field })),
    )
        .into_response()
}

fn unavailable(e: &ratelimit_redis::Error) -> Response {
    (
        StatusCode::SERVICE_UNAVAILABLE,
        Json(json!({ "error": format!("redis unavailable: {e}") })),
    )
        .into_response()
}

fn parse_body(body: &Bytes) -> Result<serde_json::Map<String, Value>> {
    match serde_json::from_slice::<Value>(body) {
        Ok(Value::Object(m)) => Ok(m),
        Ok(_) => Err(Error::invalid("body", "must be a JSON object")),
        Err(e) => Err(Error::invalid("body", format!("not JSON: {e}"))),
    }
}

fn only(m: &serde_json::Map<String, Value>, path: &str, known: &[&str]) -> Result<()> {
    match m.keys().find(|k| !known.contains(&k.as_str())) {
        Some(k) => Err(Error::invalid(
            format!("{path}{k}"),
            format!("unknown field; expected {}", known.join(", ")),
        )),
        None => Ok(()),
    }
}

fn key_of(m: &serde_json::Map<String, Value>) -> Result<String> {
    match m.get("key") {
        Some(Value::String(k)) if !k.is_empty() && k.len() <= MAX_KEY => Ok(k.clone()),
        Some(Value::String(_)) => Err(Error::invalid(
            "key",
            format!("must be 1 to {MAX_KEY} bytes"),
        )),
        Some(_) => Err(Error::invalid("key", "must be a string, like \"user:42\"")),
        None => Err(Error::invalid(
            "key",
            "missing; name what is limited, like \"user:42\"",
        )),
    }
}

fn amount_of(m: &serde_json::Map<String, Value>) -> Result<u64> {
    match m.get("amount") {
        None => Ok(1),
        Some(v) => match v.as_u64() {
            Some(n) if n >= 1 => Ok(n),
            _ => Err(Error::invalid(
                "amount",
                "must be a whole number of at least 1",
            )),
        },
    }
}

/// `limit`: `{"rate": "100/s", "burst": 20, "algorithm": "gcra"}`; for windows,
/// the rate's period is the window (`"100/min"` with `"fixed-window"`).
pub fn limit_of(v: &Value) -> Result<Limit> {
    let Value::Object(m) = v else {
        return Err(Error::invalid(
            "limit",
            "must be an object like {\"rate\": \"100/s\", \"burst\": 20}",
        ));
    };
    only(m, "limit.", &["rate", "burst", "algorithm"])?;
    let rate = match m.get("rate") {
        Some(Value::String(s)) => parse_rate("limit.rate", s)?,
        _ => {
            return Err(Error::invalid(
                "limit.rate",
                "missing or not a string; write a count per period like \"100/s\" or \"30/min\"",
            ));
        }
    };
    if rate.unit != Unit::Packets {
        return Err(Error::invalid(
            "limit.rate",
            "must count requests or units, like \"100/s\", not bytes",
        ));
    }
    let per = Duration::from_nanos(rate.period_ns);
    let algorithm = match m.get("algorithm") {
        None => "gcra",
        Some(Value::String(a)) => a.as_str(),
        Some(_) => return Err(Error::invalid("limit.algorithm", "must be a string")),
    };
    let burst = match m.get("burst") {
        None => None,
        Some(v) => match v.as_u64() {
            Some(b) => Some(b),
            None => {
                return Err(Error::invalid(
                    "limit.burst",
                    "must be a whole number, like 20",
                ));
            }
        },
    };
    let field = |e: ratelimit_common::ParamError| {
        let name = match e.param {
            "count" | "per" => "limit.rate",
            "window" | "limit" => "limit.rate",
            other => {
                if other == "burst" {
                    "limit.burst"
                } else {
                    "limit"
                }
            }
        };
        Error::invalid(name, e.accepted)
    };
    match algorithm {
        "gcra" => {
            let burst = burst.unwrap_or_else(|| rate.default_burst());
            Limit::gcra(rate.tokens, per, burst).map_err(field)
        }
        "fixed-window" | "sliding-window" => {
            if burst.is_some() {
                return Err(Error::invalid(
                    "limit.burst",
                    "windows have no burst: the rate's count is the window's limit",
                ));
            }
            // The window is the period as written ("30/min": 30 per minute),
            // not the reduced fraction ("1/2s"), and its count is whole.
            let text = m["rate"].as_str().unwrap_or_default();
            let (window_ns, limit) = crate::rate::parse_window("limit.rate", text)?;
            let window = Duration::from_nanos(window_ns);
            if algorithm == "fixed-window" {
                Limit::fixed_window(window, limit).map_err(field)
            } else {
                Limit::sliding_window(window, limit).map_err(field)
            }
        }
        _ => Err(Error::invalid(
            "limit.algorithm",
            "must be gcra, fixed-window or sliding-window",
        )),
    }
}

fn ms_ceil(d: Duration) -> u64 {
    d.as_micros().div_ceil(1000) as u64
}

async fn timed<T>(
    app: &App,
    call: impl Future<Output = std::result::Result<T, ratelimit_redis::Error>>,
) -> std::result::Result<T, ratelimit_redis::Error> {
    let start = Instant::now();
    let r = call.await;
    app.metrics
        .redis_latency
        .observe(start.elapsed().as_secs_f64());
    app.metrics.redis_up.set(i64::from(r.is_ok()));
    r
}

async fn acquire(State(app): State<Arc<App>>, body: Bytes) -> Response {
    let parsed = parse_body(&body).and_then(|m| {
        only(&m, "", &["key", "amount", "limit"])?;
        let key = key_of(&m)?;
        let amount = amount_of(&m)?;
        let limit = limit_of(m.get("limit").unwrap_or(&Value::Null)).map_err(|e| match e {
            Error::Invalid { field, message } if field == "limit" && !m.contains_key("limit") => {
                Error::invalid(field, format!("missing; {message}"))
            }
            e => e,
        })?;
        Ok((key, amount, limit))
    });
    let (key, amount, limit) = match parsed {
        Ok(p) => p,
        Err(e) => {
            app.metrics.count("bad_request");
            return bad(e);
        }
    };
    let redis_key = Store::key(&app.prefix, &key);
    match timed(&app, app.store.acquire(&redis_key, &limit, amount)).await {
        Ok(r) => {
            app.metrics.count(if r.allowed {
                "allowed"
            } else if r.granted > 0 {
                "partial"
            } else {
                "denied"
            });
            Json(json!({
                "allowed": r.allowed,
                "granted": r.granted,
                "retry_after_ms": r.retry_after.map(ms_ceil),
                "remaining": r.remaining,
            }))
            .into_response()
        }
        Err(e) => {
            app.metrics.count("redis_error");
            unavailable(&e)
        }
    }
}

async fn refill(State(app): State<Arc<App>>, body: Bytes) -> Response {
    let parsed = parse_body(&body).and_then(|m| {
        only(&m, "", &["key", "amount", "limit"])?;
        let key = key_of(&m)?;
        let amount = amount_of(&m)?;
        let limit = m.get("limit").map(limit_of).transpose()?;
        Ok((key, amount, limit))
    });
    let (key, amount, limit) = match parsed {
        Ok(p) => p,
        Err(e) => return bad(e),
    };
    let redis_key = Store::key(&app.prefix, &key);
    match timed(&app, app.store.refund(&redis_key, limit.as_ref(), amount)).await {
        Ok(r) => {
            app.metrics.refunds.inc_by(r.granted);
            Json(json!({ "refunded": r.granted, "remaining": r.remaining })).into_response()
        }
        Err(e) => unavailable(&e),
    }
}

async fn metrics(State(app): State<Arc<App>>) -> Response {
    let mut out = String::new();
    if prometheus_client::encoding::text::encode(&mut out, &app.metrics.registry).is_err() {
        return StatusCode::INTERNAL_SERVER_ERROR.into_response();
    }
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        out,
    )
        .into_response()
}

async fn healthz(State(app): State<Arc<App>>) -> Response {
    match timed(&app, app.store.ping()).await {
        Ok(()) => (StatusCode::OK, "ok\n").into_response(),
        Err(e) => unavailable(&e),
    }
}

/// Runs the service until SIGINT or SIGTERM.
pub async fn serve(listen: &str, redis_url: &str, prefix: &str) -> Result<()> {
    let addr = crate::listen::listen_addr("--listen", listen, DEFAULT_PORT)?;
    let store = Store::connect(redis_url)
        .await
        .map_err(|e| Error::invalid("--redis", e.to_string()))?;
    if let Err(e) = store.ping().await {
        tracing::warn!(error = %e, "redis does not answer yet; requests get 503 until it does");
    }
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|e| Error::invalid("--listen", format!("cannot listen on {addr}: {e}")))?;
    let app = Arc::new(App {
        store,
        prefix: prefix.to_string(),
        metrics: Metrics::new(),
    });
    let router = Router::new()
        .route("/v1/acquire", post(acquire))
        .route("/v1/refill", post(refill))
        .route("/metrics", get(metrics))
        .route("/healthz", get(healthz))
        .layer(DefaultBodyLimit::max(MAX_BODY))
        .with_state(app);
    tracing::info!(%addr, redis = %redis_url, prefix, "serving /v1/acquire and /v1/refill");
    axum::serve(listener, router)
        .with_graceful_shutdown(async {
            let mut term =
                tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).ok();
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = async { match term.as_mut() { Some(t) => { t.recv().await; } None => std::future::pending().await } } => {}
            }
        })
        .await
        .map_err(|e| Error::invalid("--listen", e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn field(v: Value) -> String {
        match limit_of(&v) {
            Err(Error::Invalid { field, .. }) => field,
            other => panic!("{v}: {other:?}"),
        }
    }

    #[test]
    fn limits_parse_and_bad_ones_name_their_field() {
        assert_eq!(
            limit_of(&json!({"rate": "100/s", "burst": 20})).unwrap(),
            // The same rate, reduced.
            Limit::gcra(1, Duration::from_millis(10), 20).unwrap()
        );
        assert_eq!(
            limit_of(&json!({"rate": "10k/hour", "algorithm": "fixed-window"})).unwrap(),
            Limit::fixed_window(Duration::from_secs(3600), 10_000).unwrap()
        );
        assert_eq!(
            limit_of(&json!({"rate": "30/min", "algorithm": "sliding-window"})).unwrap(),
            Limit::sliding_window(Duration::from_secs(60), 30).unwrap()
        );
        assert_eq!(field(json!({"rate": "fast"})), "limit.rate");
        assert_eq!(field(json!({"rate": "1Mbit/s"})), "limit.rate");
        assert_eq!(field(json!({"rate": "10/s", "burst": -1})), "limit.burst");
        assert_eq!(field(json!({"rate": "10/s", "burst": 0})), "limit.burst");
        assert_eq!(
            field(json!({"rate": "10/s", "algorithm": "magic"})),
            "limit.algorithm"
        );
        assert_eq!(field(json!({"rate": "10/s", "brust": 3})), "limit.brust");
        assert_eq!(field(json!("10/s")), "limit");
    }
}
