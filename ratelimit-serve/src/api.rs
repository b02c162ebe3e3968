//! The service's HTTP interface: the routes, who may call them, and how each
//! request is answered. Called by [`super::conn`] for each request; what a
//! request asks is read by [`super::request`], decided by [`super::decide`].
//!
//! - `POST /v1/acquire`: one key (`{"key", "limit", "amount"}` and the other
//!   forms of [`super::request`]) or many (`{"acquire": [...]}`) →
//!   `{"allowed", "granted", "remaining", "retry_after_ms", "grant"}` (many:
//!   `{"results": [...]}`, each its own answer or `{"error", "status"}`).
//! - `POST /v1/refill`: `{"grant", "amount"}` → `{"refunded", "remaining",
//!   "taken", "unused"}`; the open mode also takes `{"key", "amount",
//!   "limit"?}` (a refund by key, not safe to retry).
//! - `GET /metrics`, `GET /healthz`.
//!
//! A request's body is read here, within the body timeout and up to the body
//! limit (413 with the JSON error past it); a bad request is answered 400
//! naming the field, one the caller may not make 401 or 403; a Redis failure
//! 503 naming its cause, and a 503 took nothing (see
//! [`ratelimit_redis::DEADLINE`]).

use std::{sync::Arc, time::Duration};

use axum::{
    Json, Router,
    body::{Body, Bytes},
    extract::State,
    http::{HeaderMap, HeaderValue, StatusCode, header},
    response::{IntoResponse, Response},
    routing::{get, post},
};
use http_body_util::BodyExt as _;
use ratelimit_redis::{Ask, Granted, RefillOutcome};
use serde_json::{Map, Value, json};

use super::{
    auth,
    decide::{Decider, Failed, grant_token, owner_of, parse_grant},
    metrics::{Metrics, Shadow},
    policy::{Denied, Policy, Tenant},
    request::{self, Item, MAX_ITEMS, Refusal, Target},
};
use crate::error::Error;

/// What the handlers share.
pub(super) struct App {
    pub decider: Arc<Decider>,
    /// The config (`None`: the open mode).
    pub policy: Option<Policy>,
    pub metrics: Arc<Metrics>,
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
async fn read_body(app: &App, headers: &HeaderMap, body: Body) -> Result<Bytes, Response> {
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
    refused(Refusal::from(e))
}

/// A 400 or 403 naming the field.
fn refused(r: Refusal) -> Response {
    let status = StatusCode::from_u16(r.status).unwrap_or(StatusCode::BAD_REQUEST);
    error(
        status,
        format!("{}: {}", r.field, r.message),
        Some(&r.field),
    )
}

/// The caller's tenant (`None` in the open mode), or the 401 to answer.
fn caller<'a>(app: &'a App, headers: &HeaderMap) -> Result<Option<&'a Tenant>, Box<Response>> {
    let Some(policy) = &app.policy else {
        return Ok(None);
    };
    let unauthorized = |reason: &'static str, message: &str| {
        app.metrics.refused(reason);
        let mut r = error(
            StatusCode::UNAUTHORIZED,
            format!("authorization: {message}"),
            Some("authorization"),
        );
        r.headers_mut()
            .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        Box::new(r)
    };
    let token =
        auth::bearer(headers.get(header::AUTHORIZATION).map(|v| v.as_bytes())).map_err(|why| {
            unauthorized(
                "malformed",
                &format!("{why}; send `Authorization: Bearer TOKEN`"),
            )
        })?;
    policy.tenant(token).map(Some).map_err(|d| match d {
        Denied::Missing => unauthorized(
            "missing",
            "missing; send `Authorization: Bearer TOKEN` with your tenant's token",
        ),
        Denied::Unknown => unauthorized("unknown", "not the token of any tenant"),
    })
}

fn ms_ceil(d: Duration) -> u64 {
    d.as_micros().div_ceil(1000) as u64
}

/// What one key's decision is answered (and counted).
fn granted_answer(
    app: &App,
    item: &Item,
    target: &Target,
    g: Granted,
    grant: Option<String>,
) -> Value {
    let outcome = if g.allowed {
        "allowed"
    } else if g.granted > 0 {
        "partial"
    } else {
        "denied"
    };
    let grant = (g.granted > 0).then_some(grant).flatten();
    let retry = g.retry_after.map(ms_ceil);
    let Some(name) = &target.shadow else {
        app.metrics.count(outcome);
        return json!({
            "allowed": g.allowed,
            "granted": g.granted,
            "retry_after_ms": retry,
            "remaining": g.remaining,
            "grant": grant,
        });
    };
    // A shadow limit: decided and counted, never denied.
    app.metrics.count("allowed");
    app.metrics
        .shadow
        .get_or_create(&Shadow {
            limit: name.clone(),
            outcome,
        })
        .inc();
    json!({
        "allowed": true,
        "granted": item.amount,
        "retry_after_ms": null,
        "remaining": g.remaining,
        "grant": grant,
        "shadow": {"limit": name, "allowed": g.allowed, "granted": g.granted, "retry_after_ms": retry},
    })
}

/// A key whose decision failed: its status and answer.
fn failed_answer(app: &App, target: &Target, f: &Failed) -> (StatusCode, Value) {
    if let Some(p) = f.param() {
        app.metrics.count("bad_request");
        return (
            StatusCode::BAD_REQUEST,
            json!({"error": format!("limit: {}", p.accepted), "field": "limit"}),
        );
    }
    app.metrics.count("redis_error");
    let mut v = json!({ "error": f.to_string() });
    if let Some(mode) = target.failure_mode {
        v["failure_mode"] = json!(mode.name());
    }
    (StatusCode::SERVICE_UNAVAILABLE, v)
}

async fn acquire(State(app): State<Arc<App>>, headers: HeaderMap, body: Body) -> Response {
    let body = match read_body(&app, &headers, body).await {
        Ok(b) => b,
        Err(r) => {
            app.metrics.count("bad_request");
            return r;
        }
    };
    let tenant = match caller(&app, &headers) {
        Ok(t) => t,
        Err(r) => return *r,
    };
    let parsed = request::parse_body(&body)
        .map_err(Refusal::from)
        .and_then(|m| items(&m));
    let (items, many) = match parsed {
        Ok(p) => p,
        Err(r) => {
            app.metrics.count("bad_request");
            return refused(r);
        }
    };
    let mut targets = Vec::with_capacity(items.len());
    for (i, item) in items.iter().enumerate() {
        match request::resolve(item, app.policy.as_ref(), tenant) {
            Ok(t) => targets.push(t),
            Err(r) => {
                app.metrics.count("bad_request");
                if r.status == 403 {
                    app.metrics.refused("forbidden");
                }
                return refused(if many {
                    r.within(&format!("acquire[{i}]"))
                } else {
                    r
                });
            }
        }
    }
    let mut asks = Vec::new();
    let mut ids = Vec::new();
    for (item, t) in items.iter().zip(&targets) {
        if let Some(t) = t {
            let id = item.grant.then(|| app.decider.grant_id()).flatten();
            asks.push((
                Ask {
                    key: app.decider.key(&t.content),
                    limit: t.limit,
                    amount: item.amount,
                    whole: false,
                    grant: id.clone(),
                    owner: owner_of(tenant.map(|t| t.name.as_str())),
                },
                t.lease,
            ));
            ids.push(id);
        }
    }
    let mut decided = app.decider.decide(asks).await.into_iter().zip(ids);
    let mut answers = Vec::with_capacity(items.len());
    for (item, t) in items.iter().zip(&targets) {
        let Some(t) = t else {
            // No limit matches the descriptor: not limited.
            app.metrics.count("unlimited");
            answers.push((
                StatusCode::OK,
                json!({"allowed": true, "granted": item.amount, "retry_after_ms": null,
                       "remaining": null, "grant": null, "unlimited": true}),
            ));
            continue;
        };
        let (r, id) = decided.next().expect("an answer for every key asked");
        answers.push(match r {
            Ok(g) => (
                StatusCode::OK,
                granted_answer(&app, item, t, g, id.map(|id| grant_token(&id, &t.content))),
            ),
            Err(f) => failed_answer(&app, t, &f),
        });
    }
    if !many {
        let (status, v) = answers.pop().expect("one answer");
        return (status, Json(v)).into_response();
    }
    let results: Vec<Value> = answers
        .into_iter()
        .map(|(status, mut v)| {
            if status != StatusCode::OK {
                v["status"] = json!(status.as_u16());
            }
            v
        })
        .collect();
    Json(json!({ "results": results })).into_response()
}

/// The items of an acquire body, and whether it is a batch.
fn items(m: &Map<String, Value>) -> Result<(Vec<Item>, bool), Refusal> {
    let Some(list) = m.get("acquire") else {
        return Ok((vec![request::item_of(m)?], false));
    };
    request::only(m, "", &["acquire"])?;
    let Value::Array(list) = list else {
        return Err(Error::invalid("acquire", "must be a list of acquires").into());
    };
    if list.is_empty() || list.len() > MAX_ITEMS {
        return Err(
            Error::invalid("acquire", format!("must hold 1 to {MAX_ITEMS} acquires")).into(),
        );
    }
    let items = list
        .iter()
        .enumerate()
        .map(|(i, v)| {
            let at = format!("acquire[{i}]");
            match v {
                Value::Object(o) => request::item_of(o).map_err(|e| Refusal::from(e).within(&at)),
                _ => Err(Refusal::from(Error::invalid(at, "must be an object"))),
            }
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok((items, true))
}

async fn refill(State(app): State<Arc<App>>, headers: HeaderMap, body: Body) -> Response {
    let body = match read_body(&app, &headers, body).await {
        Ok(b) => b,
        Err(r) => return r,
    };
    let tenant = match caller(&app, &headers) {
        Ok(t) => t,
        Err(r) => return *r,
    };
    let m = match request::parse_body(&body) {
        Ok(m) => m,
        Err(e) => {
            app.metrics.refill("bad_request");
            return bad(e);
        }
    };
    let r = if m.contains_key("grant") {
        refill_grant(&app, &m, tenant).await
    } else {
        refill_key(&app, &m).await
    };
    r.unwrap_or_else(|r| r)
}

/// `{"grant", "amount"}`: `amount` is what the grant did not use, in all.
async fn refill_grant(
    app: &App,
    m: &Map<String, Value>,
    tenant: Option<&Tenant>,
) -> Result<Response, Response> {
    let bad_request = |e: Error| {
        app.metrics.refill("bad_request");
        bad(e)
    };
    request::only(m, "", &["grant", "amount"]).map_err(|e| match e {
        Error::Invalid { field, .. } if field == "limit" || field == "key" => bad_request(Error::invalid(
            field,
            "a grant is refilled under its own key and limit: name only the grant and the amount",
        )),
        e => bad_request(e),
    })?;
    let (id, content) = match m.get("grant") {
        Some(Value::String(g)) => parse_grant(g).ok_or_else(|| {
            bad_request(Error::invalid(
                "grant",
                "not a grant this service handed out (an acquire answers one as \"grant\")",
            ))
        })?,
        _ => {
            return Err(bad_request(Error::invalid(
                "grant",
                "must be the string an acquire answered as \"grant\"",
            )));
        }
    };
    let unused = match m.get("amount") {
        Some(v) => v.as_u64().ok_or_else(|| {
            bad_request(Error::invalid(
                "amount",
                "must be a whole number: the units of the grant not used, in all",
            ))
        })?,
        None => {
            return Err(bad_request(Error::invalid(
                "amount",
                "missing; name the units of the grant not used, in all (a retry names the same)",
            )));
        }
    };
    if let (Some(policy), Some(tenant)) = (&app.policy, tenant)
        && !policy.owns(tenant, &content)
    {
        app.metrics.refused("forbidden");
        app.metrics.refill("forbidden");
        return Err(error(
            StatusCode::FORBIDDEN,
            format!(
                "grant: not a grant of a key tenant {:?} may use",
                tenant.name
            ),
            Some("grant"),
        ));
    }
    let key = app.decider.key(&content);
    let owner = owner_of(tenant.map(|t| t.name.as_str()));
    let r = match app.decider.refill(&key, id, &owner, unused).await {
        Ok(r) => r,
        Err(f) => {
            app.metrics.refill("redis_error");
            return Err(error(StatusCode::SERVICE_UNAVAILABLE, f.to_string(), None));
        }
    };
    app.metrics.refunds.inc_by(r.refunded);
    Ok(match r.outcome {
        RefillOutcome::Done => {
            app.metrics.refill(if r.refunded > 0 {
                "refunded"
            } else {
                "nothing"
            });
            Json(json!({
                "refunded": r.refunded,
                "remaining": r.remaining,
                "taken": r.taken,
                "unused": r.unused,
            }))
            .into_response()
        }
        RefillOutcome::Unknown => {
            app.metrics.refill("unknown");
            Json(json!({
                "refunded": 0,
                "remaining": null,
                "unknown": true,
            }))
            .into_response()
        }
        RefillOutcome::Foreign => {
            app.metrics.refused("forbidden");
            app.metrics.refill("foreign");
            error(
                StatusCode::FORBIDDEN,
                "grant: not a grant of this tenant's; nothing refunded".into(),
                Some("grant"),
            )
        }
        RefillOutcome::LimitChanged => {
            app.metrics.refill("limit_changed");
            (
                StatusCode::CONFLICT,
                Json(json!({
                    "error": "grant: the key's limit changed since the grant; nothing refunded",
                    "field": "grant",
                    "refunded": 0,
                    "remaining": r.remaining,
                })),
            )
                .into_response()
        }
    })
}

/// The open mode's refill by key: `{"key", "amount", "limit"?}`.
async fn refill_key(app: &App, m: &Map<String, Value>) -> Result<Response, Response> {
    let bad_request = |e: Error| {
        app.metrics.refill("bad_request");
        bad(e)
    };
    if app.policy.is_some() {
        return Err(bad_request(Error::invalid(
            "grant",
            "missing; a refill names the grant its acquire answered (this service runs with --config)",
        )));
    }
    request::only(m, "", &["key", "amount", "limit", "grant"]).map_err(bad_request)?;
    let key = request::key_of(m).map_err(bad_request)?;
    let amount = request::amount_of(m).map_err(bad_request)?;
    let limit = m
        .get("limit")
        .map(request::limit_of)
        .transpose()
        .map_err(bad_request)?;
    let redis_key = app.decider.key(&key);
    let r = match app
        .decider
        .refund_key(&redis_key, limit.as_ref(), amount)
        .await
    {
        Ok(r) => r,
        Err(f) => {
            app.metrics.refill("redis_error");
            if let Some(p) = f.param() {
                return Err(error(
                    StatusCode::BAD_REQUEST,
                    format!("limit: {}", p.accepted),
                    Some("limit"),
                ));
            }
            return Err(error(StatusCode::SERVICE_UNAVAILABLE, f.to_string(), None));
        }
    };
    if r.other_limit {
        app.metrics.refill("limit_changed");
        return Ok((
            StatusCode::CONFLICT,
            Json(json!({
                "error": "limit: the key was acquired under another limit; nothing refunded (leave limit out: a refill gives back under the key's own)",
                "field": "limit",
                "refunded": 0,
                "remaining": r.remaining,
            })),
        )
            .into_response());
    }
    app.metrics.refill("keyed");
    app.metrics.refunds.inc_by(r.refunded);
    Ok(Json(json!({ "refunded": r.refunded, "remaining": r.remaining })).into_response())
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

/// 200 `ok` while decisions succeed (the decision script's write, see
/// [`ratelimit_redis::Store::probe`]), else 503 naming the cause.
async fn healthz(State(app): State<Arc<App>>) -> Response {
    match app.decider.check().await {
        Ok(()) => (StatusCode::OK, "ok\n").into_response(),
        Err(e) => error(StatusCode::SERVICE_UNAVAILABLE, e.to_string(), None),
    }
}
