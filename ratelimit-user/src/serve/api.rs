//! The service's HTTP interface: the routes, what each request may hold and
//! how each is answered, and the service's own metrics. Called by
//! [`super::conn`] for each request; calls Redis through [`Store`].
//!
//! A request's body is read here, within the body timeout and up to the body
//! limit (413 with the JSON error past it); a bad request is answered 400
//! naming the field; a Redis failure 503 naming its cause, and a 503 took
//! nothing (see [`ratelimit_redis::DEADLINE`]).

use std::{
    sync::Arc,
    time::{Duration, Instant},
};

use axum::{
    Json, Router,
    body::{Body, Bytes},
    extract::State,
    http::{HeaderMap, HeaderValue, StatusCode, header},
    response::{IntoResponse, Response},
    routing::{get, post},
};
use http_body_util::BodyExt as _;
use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{counter::Counter, family::Family, gauge::Gauge, histogram::Histogram},
    registry::Registry,
};
use ratelimit_redis::{Limit, Store};
use serde_json::{Value, json};

use super::conn::ConnMetrics;
use crate::{
    error::{Error, Result},
    model::rate::{Unit, parse_rate},
};

/// Longest key accepted, bytes.
pub const MAX_KEY: usize = 512;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Outcome {
    outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Cause {
    cause: &'static str,
}

/// The service's metrics (`GET /metrics`).
pub(super) struct Metrics {
    registry: Registry,
    decisions: Family<Outcome, Counter>,
    refunds: Counter,
    redis_latency: Histogram,
    redis_up: Gauge,
    redis_errors: Family<Cause, Counter>,
    /// The connections' own.
    pub conn: ConnMetrics,
}

impl Metrics {
    pub(super) fn new() -> Self {
        let mut registry = Registry::default();
        let decisions = Family::<Outcome, Counter>::default();
        registry.register(
            "ratelimit_serve_decisions",
            "Acquire requests by outcome: allowed (all granted), partial (some), denied (none), bad_request, redis_error",
            decisions.clone(),
        );
        let refunds = Counter::default();
        registry.register(
            "ratelimit_serve_refunded_units",
            "Units given back through /v1/refill",
            refunds.clone(),
        );
        // 50 µs to about 0.8 s.
        let redis_latency = Histogram::new(
            prometheus_client::metrics::histogram::exponential_buckets(0.000_05, 2.0, 15),
        );
        registry.register(
            "ratelimit_serve_redis_seconds",
            "Time one Redis call took, seconds",
            redis_latency.clone(),
        );
        let redis_up = Gauge::default();
        registry.register(
            "ratelimit_serve_redis_up",
            "1 while Redis takes decisions (the last call that had to write succeeded), 0 since a call failed: unreachable, timed out, or refused (out of memory, read-only, ...)",
            redis_up.clone(),
        );
        let redis_errors = Family::<Cause, Counter>::default();
        registry.register(
            "ratelimit_serve_redis_errors",
            "Failed Redis calls by cause: refused (Redis answered an error, such as out of memory), unreachable, timeout, late (reached after its deadline: took nothing), other",
            redis_errors.clone(),
        );
        let conn = ConnMetrics::new(&mut registry);
        Self {
            registry,
            decisions,
            refunds,
            redis_latency,
            redis_up,
            redis_errors,
            conn,
        }
    }

    fn count(&self, outcome: &'static str) {
        self.decisions.get_or_create(&Outcome { outcome }).inc();
    }

    /// A Redis call failed.
    fn failed(&self, e: &ratelimit_redis::Error) {
        use ratelimit_redis::Error as E;
        let cause = match e {
            E::Refused(_) => "refused",
            E::Unreachable(_) => "unreachable",
            E::TimedOut(_) => "timeout",
            E::Late { .. } => "late",
            _ => "other",
        };
        self.redis_errors.get_or_create(&Cause { cause }).inc();
        self.redis_up.set(0);
    }

    /// A Redis call that wrote succeeded: Redis takes decisions.
    fn wrote(&self) {
        self.redis_up.set(1);
    }
}

/// What the handlers share.
pub(super) struct App {
    pub store: Store,
    pub prefix: String,
    pub metrics: Metrics,
    /// Largest request body, bytes.
    pub max_body: usize,
    /// How long a request's body may take to arrive, from its headers.
    pub body_timeout: Duration,
}

/// The routes.
pub(super) fn router(app: Arc<App>) -> Router {
    Router::new()
        .route("/v1/acquire", post(acquire))
        .route("/v1/refill", post(refill))
        .route("/metrics", get(metrics))
        .route("/healthz", get(healthz))
        .with_state(app)
}

/// A JSON error: `{"error": …}`, with `"field"` when one is named.
fn error(status: StatusCode, message: String, field: Option<&str>) -> Response {
    let body = match field {
        Some(f) => json!({ "error": message, "field": f }),
        None => json!({ "error": message }),
    };
    (status, Json(body)).into_response()
}

/// Answered before the request is read to its end: the connection closes.
fn closing(mut r: Response) -> Response {
    r.headers_mut()
        .insert(header::CONNECTION, HeaderValue::from_static("close"));
    r
}

/// The answer when every connection is busy with a request (the cap is
/// `cap`): 503, and come back in a second.
pub(super) fn overloaded(cap: usize) -> Response {
    let mut r = closing(error(
        StatusCode::SERVICE_UNAVAILABLE,
        format!(
            "overloaded: all {cap} connections are busy with requests (--max-connections); try again shortly"
        ),
        None,
    ));
    r.headers_mut()
        .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
    r
}

fn too_large(max: usize) -> Response {
    closing(error(
        StatusCode::PAYLOAD_TOO_LARGE,
        format!("body: larger than {max} bytes"),
        Some("body"),
    ))
}

/// The body, read within the body timeout and up to the body limit.
async fn read_body(
    app: &App,
    headers: &HeaderMap,
    body: Body,
) -> std::result::Result<Bytes, Response> {
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > app.max_body as u64) {
        return Err(too_large(app.max_body));
    }
    let read = async {
        let mut body = body;
        let mut out = Vec::new();
        while let Some(frame) = body.frame().await {
            let frame = frame.map_err(|e| {
                closing(error(
                    StatusCode::BAD_REQUEST,
                    format!("body: could not be read: {e}"),
                    Some("body"),
                ))
            })?;
            if let Ok(data) = frame.into_data() {
                if out.len() + data.len() > app.max_body {
                    return Err(too_large(app.max_body));
                }
                out.extend_from_slice(&data);
            }
        }
        Ok(Bytes::from(out))
    };
    match tokio::time::timeout(app.body_timeout, read).await {
        Ok(r) => r,
        Err(_) => {
            app.metrics.conn.timed_out("body");
            Err(closing(error(
                StatusCode::REQUEST_TIMEOUT,
                format!(
                    "body: not complete within {} (--body-timeout)",
                    super::human(app.body_timeout)
                ),
                Some("body"),
            )))
        }
    }
}

/// A 400 naming the field.
fn bad(e: Error) -> Response {
    let (field, message) = match &e {
        Error::Invalid { field, message } => (field.clone(), message.clone()),
        other => (String::new(), other.to_string()),
    };
    error(
        StatusCode::BAD_REQUEST,
        format!("{field}: {message}"),
        Some(&field),
    )
}

/// A Redis failure: 503 naming its cause ("redis refused: out of memory
/// (OOM …)", "redis unreachable: …", "redis timed out: …"), counted.
fn redis_failed(app: &App, e: &ratelimit_redis::Error) -> Response {
    app.metrics.failed(e);
    if let ratelimit_redis::Error::Param(p) = e {
        return error(
            StatusCode::BAD_REQUEST,
            format!("limit: {}", p.accepted),
            Some("limit"),
        );
    }
    error(StatusCode::SERVICE_UNAVAILABLE, e.to_string(), None)
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
            let (window_ns, limit) = crate::model::rate::parse_window("limit.rate", text)?;
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
    r
}

async fn acquire(State(app): State<Arc<App>>, headers: HeaderMap, body: Body) -> Response {
    let body = match read_body(&app, &headers, body).await {
        Ok(b) => b,
        Err(r) => {
            app.metrics.count("bad_request");
            return r;
        }
    };
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
            // A denial writes nothing: it says nothing of whether Redis would
            // take a write.
            if r.granted > 0 {
                app.metrics.wrote();
            }
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
            redis_failed(&app, &e)
        }
    }
}

async fn refill(State(app): State<Arc<App>>, headers: HeaderMap, body: Body) -> Response {
    let body = match read_body(&app, &headers, body).await {
        Ok(b) => b,
        Err(r) => return r,
    };
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
            app.metrics.wrote();
            app.metrics.refunds.inc_by(r.granted);
            Json(json!({ "refunded": r.granted, "remaining": r.remaining })).into_response()
        }
        Err(e) => redis_failed(&app, &e),
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

/// Whether decisions succeed: the decision script run with a write (see
/// [`Store::probe`]), so that a Redis that answers but refuses writes counts
/// as failing, as it fails decisions. Recorded in the metrics.
pub(super) async fn check(app: &App) -> std::result::Result<(), ratelimit_redis::Error> {
    let r = timed(app, app.store.probe(&app.prefix)).await;
    match &r {
        Ok(()) => app.metrics.wrote(),
        Err(e) => app.metrics.failed(e),
    }
    r
}

/// 200 `ok` while decisions succeed ([`check`]), else 503 naming the cause.
async fn healthz(State(app): State<Arc<App>>) -> Response {
    match check(&app).await {
        Ok(()) => (StatusCode::OK, "ok\n").into_response(),
        Err(e) => error(StatusCode::SERVICE_UNAVAILABLE, e.to_string(), None),
    }
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
