//! Envoy's rate limit service API (`envoy.service.ratelimit.v3.RateLimitService/
//! ShouldRateLimit`, the one Envoy's and Istio's rate limit filters call),
//! beside the HTTP API, on the same limits and keys: a descriptor of domain
//! `checkout` with the entry `user=42` counts in the same bucket over gRPC
//! as `{"domain": "checkout", "descriptor": [...]}` or `{"limit":
//! "per-user", "key": "42"}` over HTTP.
//!
//! As Envoy's own ratelimit service: each descriptor is looked up in the
//! request's domain (entry by entry, a key and value first, else the key
//! alone); one no limit matches is `OK` without a limit; each limited one
//! takes `hits_addend` (1 when 0) all or nothing; the request is
//! `OVER_LIMIT` when any descriptor is (those that were under their limit
//! keep what they took, as Envoy's service counts them). A shadow limit
//! answers `OK` and counts what it decided. A descriptor's `limit`
//! override is taken in the open mode and from tenants with
//! `inline-limits`.
//!
//! The caller's token comes in the `authorization` metadata (`Bearer
//! TOKEN`; Envoy's `grpc_service.initial_metadata`). While Redis cannot
//! decide: the domain's `failure-mode` (`allow`: `OK`, `deny`:
//! `OVER_LIMIT`), else `UNAVAILABLE` and Envoy's `failure_mode_deny`
//! chooses.

use std::{sync::Arc, time::Duration};

use envoy_types::pb::{
    envoy::{
        extensions::common::ratelimit::v3::{
            RateLimitDescriptor, rate_limit_descriptor::RateLimitOverride,
        },
        service::ratelimit::v3::{
            RateLimitRequest, RateLimitResponse,
            rate_limit_response::{Code, DescriptorStatus, RateLimit, rate_limit::Unit},
            rate_limit_service_server::{RateLimitService, RateLimitServiceServer},
        },
    },
    google::protobuf::Duration as PbDuration,
};
use ratelimit_redis::{Ask, Granted, Limit};
use tonic::{Request, Response, Status};

use super::{
    api::App,
    auth,
    decide::Failed,
    error::Error,
    metrics::{Code as CodeLabel, Shadow},
    policy::{self, Denied, Domain, FailureMode, Tenant},
    request::{MAX_ENTRIES, MAX_KEY},
};

/// The largest request read, bytes (tonic's 4 MiB let 2 000 000 empty
/// descriptors cost ~0.37 CPU-s each). Envoy's descriptors are tens of
/// bytes: 128 of them fit many times over.
pub(super) const MAX_MESSAGE: usize = 64 << 10;

/// A gRPC message's frame before it: a flag and its length.
const FRAME: usize = 5;

/// The service as the gRPC listener's router: each request's caller is
/// known by its metadata before a byte of its body is read ([`first`]).
pub(super) fn router(app: Arc<App>) -> axum::Router {
    let service = RateLimitServiceServer::new(Rls { app: app.clone() })
        .max_decoding_message_size(MAX_MESSAGE);
    tonic::service::Routes::new(service)
        .prepare()
        .into_axum_router()
        .layer(axum::middleware::from_fn_with_state(app, first))
}

/// What a request goes through before tonic decodes it: its token (a
/// request with none, or an unknown one, is refused without its body being
/// read), then its body, whole, within `--body-timeout` and
/// [`MAX_MESSAGE`]. Nothing of an unauthenticated request is decoded past
/// its header list.
async fn first(
    axum::extract::State(app): axum::extract::State<Arc<App>>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    let refuse = |code: &'static str, status: Status| {
        count(&app, code);
        status.into_http::<axum::body::Body>()
    };
    if let Err((code, status)) = tenant_of(&app, request.headers()) {
        return refuse(code, status);
    }
    let (parts, body) = request.into_parts();
    let read = axum::body::to_bytes(body, MAX_MESSAGE + FRAME);
    let body = match tokio::time::timeout(app.body_timeout, read).await {
        Ok(Ok(body)) => body,
        Ok(Err(_)) => {
            return refuse(
                "out_of_range",
                Status::out_of_range(format!(
                    "request: more than {} KiB, or cut short",
                    MAX_MESSAGE >> 10
                )),
            );
        }
        Err(_) => {
            app.metrics.conn.timed_out("body");
            return refuse(
                "deadline_exceeded",
                Status::deadline_exceeded(format!(
                    "request: its body did not arrive within {} (--body-timeout)",
                    super::human(app.body_timeout)
                )),
            );
        }
    };
    next.run(axum::extract::Request::from_parts(
        parts,
        axum::body::Body::from(body),
    ))
    .await
}

/// Counts a gRPC answer by its code.
fn count(app: &App, code: &'static str) {
    app.metrics.grpc.get_or_create(&CodeLabel { code }).inc();
}

/// The caller's tenant by the token in `headers` (`None` in the open mode),
/// or the refusal (counted as refused) with its code's name.
fn tenant_of<'a>(
    app: &'a App,
    headers: &axum::http::HeaderMap,
) -> Result<Option<&'a Tenant>, (&'static str, Status)> {
    let Some(p) = &app.policy else {
        return Ok(None);
    };
    let token = headers.get("authorization").map(|v| v.as_bytes());
    let unauth = |reason: &'static str, m: &str| {
        app.metrics.refused(reason);
        ("unauthenticated", Status::unauthenticated(m.to_string()))
    };
    let token = auth::bearer(token).map_err(|why| {
        unauth(
            "malformed",
            &format!("authorization: {why}; send `Bearer TOKEN`"),
        )
    })?;
    p.tenant(token).map(Some).map_err(|d| match d {
        Denied::Missing => unauth(
            "missing",
            "authorization: missing; send the metadata `authorization: Bearer TOKEN` (Envoy: grpc_service.initial_metadata)",
        ),
        Denied::Unknown => unauth("unknown", "authorization: not the token of any tenant"),
    })
}

/// `ShouldRateLimit` on the service's limits.
pub(super) struct Rls {
    app: Arc<App>,
}

/// A descriptor's entries: (key, value) pairs, in its order.
type Entries = Vec<(String, String)>;

/// An acquire, and its limit's lease ([`crate::lease`]).
type Leasable = (Ask, Option<u64>);

/// A descriptor's limit: its numbers, its name, whether it is a shadow.
struct Found {
    limit: Limit,
    name: String,
    shadow: bool,
    /// The config's `lease` ([`crate::lease`]).
    lease: Option<u64>,
}

impl Rls {
    fn refuse(&self, code: &'static str, status: Status) -> Status {
        count(&self.app, code);
        status
    }
}

#[tonic::async_trait]
impl RateLimitService for Rls {
    async fn should_rate_limit(
        &self,
        request: Request<RateLimitRequest>,
    ) -> Result<Response<RateLimitResponse>, Status> {
        let tenant = self.tenant(&request)?;
        let r = request.into_inner();
        self.check_sizes(&r)?;
        let domain = match (&self.app.policy, tenant) {
            (Some(p), Some(t)) => Some(p.domain_for(t, &r.domain).map_err(|m| {
                self.app.metrics.refused("forbidden");
                self.refuse("permission_denied", Status::permission_denied(m))
            })?),
            _ => None,
        };
        let (found, asks) = self.limits(&r, tenant, domain)?;
        let decided = self.app.decider.decide(asks).await;
        if let Some(fail) = decided.iter().find_map(|d| d.as_ref().err()) {
            for _ in 0..decided.len() {
                self.app.metrics.count("redis_error");
            }
            return self.undecided(domain, found.len(), fail);
        }
        Ok(Response::new(self.answer(&found, decided)))
    }
}

impl Rls {
    /// The caller's tenant by its token (`None` in the open mode), or the
    /// refusal ([`first`] refused a request without a known token already:
    /// this finds the tenant again for the decision).
    fn tenant<T>(&self, request: &Request<T>) -> Result<Option<&Tenant>, Status> {
        tenant_of(&self.app, request.metadata().as_ref()).map_err(|(code, status)| {
            count(&self.app, code);
            status
        })
    }

    fn invalid(&self, m: String) -> Status {
        self.refuse("invalid_argument", Status::invalid_argument(m))
    }

    /// A field of the request's part `at` that is wrong, answered with its
    /// error's gRPC code.
    fn wrong(&self, at: &str, e: Error) -> Status {
        self.refuse(
            "invalid_argument",
            Status::new(e.grpc_code(), format!("{at}.{e}")),
        )
    }

    /// The domain's and the descriptors' sizes.
    fn check_sizes(&self, r: &RateLimitRequest) -> Result<(), Status> {
        if r.domain.is_empty() || r.domain.len() > MAX_KEY {
            return Err(self.invalid(format!("domain: must be 1 to {MAX_KEY} bytes")));
        }
        if r.descriptors.is_empty() || r.descriptors.len() > super::request::MAX_ITEMS {
            return Err(self.invalid(format!(
                "descriptors: must hold 1 to {} descriptors",
                super::request::MAX_ITEMS
            )));
        }
        Ok(())
    }

    /// Each descriptor's limit (`None`: no limit matches it), and what to
    /// ask Redis for the limited ones, in their order.
    fn limits(
        &self,
        r: &RateLimitRequest,
        tenant: Option<&Tenant>,
        domain: Option<&Domain>,
    ) -> Result<(Vec<Option<Found>>, Vec<Leasable>), Status> {
        let mut found: Vec<Option<Found>> = Vec::with_capacity(r.descriptors.len());
        let mut asks = Vec::new();
        for (i, d) in r.descriptors.iter().enumerate() {
            let (entries, f) = self.descriptor_limit(i, d, tenant, domain)?;
            if let Some(f) = &f {
                let hits = d
                    .hits_addend
                    .as_ref()
                    .map(|h| h.value)
                    .or((r.hits_addend > 0).then_some(u64::from(r.hits_addend)))
                    .unwrap_or(1)
                    .max(1);
                asks.push((
                    Ask {
                        key: self
                            .app
                            .decider
                            .key(&policy::descriptor_key(&r.domain, &entries)),
                        limit: f.limit,
                        amount: hits,
                        whole: true,
                        grant: None,
                        owner: String::new(),
                    },
                    f.lease,
                ));
            }
            found.push(f);
        }
        Ok((found, asks))
    }

    /// Descriptor `i`'s entries, checked, and its limit: its own override
    /// (open mode, or a tenant with `inline-limits`), else the domain's.
    fn descriptor_limit(
        &self,
        i: usize,
        d: &RateLimitDescriptor,
        tenant: Option<&Tenant>,
        domain: Option<&Domain>,
    ) -> Result<(Entries, Option<Found>), Status> {
        if d.entries.is_empty() || d.entries.len() > MAX_ENTRIES {
            return Err(self.invalid(format!(
                "descriptors[{i}]: must hold 1 to {MAX_ENTRIES} entries"
            )));
        }
        let mut entries = Vec::with_capacity(d.entries.len());
        for (j, e) in d.entries.iter().enumerate() {
            if e.key.is_empty() || e.key.len() > MAX_KEY || e.value.len() > MAX_KEY {
                return Err(self.invalid(format!(
                    "descriptors[{i}].entries[{j}]: a key of 1 to {MAX_KEY} bytes and a value of at most {MAX_KEY}"
                )));
            }
            entries.push((e.key.clone(), e.value.clone()));
        }
        let f = match &d.limit {
            Some(o) => {
                if tenant.is_some_and(|t| !t.inline) {
                    self.app.metrics.refused("forbidden");
                    return Err(self.refuse(
                        "permission_denied",
                        Status::permission_denied(format!(
                            "descriptors[{i}].limit: tenant {:?} may not name a limit's numbers (inline-limits is off)",
                            tenant.map(|t| t.name.as_str()).unwrap_or_default()
                        )),
                    ));
                }
                Some(Found {
                    limit: override_limit(o)
                        .map_err(|e| self.wrong(&format!("descriptors[{i}]"), e))?,
                    name: String::new(),
                    shadow: false,
                    lease: None,
                })
            }
            None => domain.and_then(|dm| dm.find(&entries)).map(|def| Found {
                limit: def.limit,
                name: def.name.clone(),
                shadow: def.shadow,
                lease: def.lease,
            }),
        };
        Ok((entries, f))
    }

    /// The answer while Redis cannot decide: the domain's failure mode for
    /// each of the `descriptors`, else `UNAVAILABLE`.
    fn undecided(
        &self,
        domain: Option<&Domain>,
        descriptors: usize,
        fail: &Failed,
    ) -> Result<Response<RateLimitResponse>, Status> {
        let Some(mode) = domain.and_then(|d| d.failure_mode) else {
            return Err(self.refuse("unavailable", Status::unavailable(fail.to_string())));
        };
        let code = if mode == FailureMode::Allow {
            count(&self.app, "ok");
            Code::Ok
        } else {
            count(&self.app, "over_limit");
            Code::OverLimit
        };
        Ok(Response::new(RateLimitResponse {
            overall_code: code as i32,
            statuses: (0..descriptors)
                .map(|_| DescriptorStatus {
                    code: code as i32,
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        }))
    }

    /// The answer from Redis's decisions, one for each limited descriptor
    /// of `found` in order: a shadow limit answers `OK` and counts what it
    /// decided; the request is `OVER_LIMIT` when any descriptor is.
    fn answer(
        &self,
        found: &[Option<Found>],
        decided: Vec<Result<Granted, Failed>>,
    ) -> RateLimitResponse {
        let app = &self.app;
        let mut decided = decided.into_iter();
        let mut over = false;
        let statuses = found
            .iter()
            .map(|f| {
                let Some(f) = f else {
                    app.metrics.count("unlimited");
                    return DescriptorStatus {
                        code: Code::Ok as i32,
                        ..Default::default()
                    };
                };
                let g = decided
                    .next()
                    .expect("an answer for each limited descriptor")
                    .expect("failures answered before");
                let outcome = if g.allowed { "allowed" } else { "denied" };
                let code = if f.shadow {
                    app.metrics
                        .shadow
                        .get_or_create(&Shadow {
                            limit: f.name.clone(),
                            outcome,
                        })
                        .inc();
                    app.metrics.count("allowed");
                    Code::Ok
                } else {
                    app.metrics.count(outcome);
                    if g.allowed { Code::Ok } else { Code::OverLimit }
                };
                over |= code == Code::OverLimit;
                let (requests_per_unit, unit) = per_unit(&f.limit);
                DescriptorStatus {
                    code: code as i32,
                    current_limit: Some(RateLimit {
                        name: f.name.clone(),
                        requests_per_unit,
                        unit: unit as i32,
                    }),
                    limit_remaining: g.remaining.min(u64::from(u32::MAX)) as u32,
                    duration_until_reset: g.retry_after.filter(|_| !g.allowed).map(pb_duration),
                    ..Default::default()
                }
            })
            .collect();
        count(&self.app, if over { "over_limit" } else { "ok" });
        RateLimitResponse {
            overall_code: if over { Code::OverLimit } else { Code::Ok } as i32,
            statuses,
            ..Default::default()
        }
    }
}

fn pb_duration(d: Duration) -> PbDuration {
    PbDuration {
        seconds: d.as_secs() as i64,
        nanos: d.subsec_nanos() as i32,
    }
}

/// The units of Envoy's `RateLimit`, in seconds.
const UNITS: [(Unit, u64); 4] = [
    (Unit::Second, 1),
    (Unit::Minute, 60),
    (Unit::Hour, 3600),
    (Unit::Day, 86_400),
];

/// A limit as Envoy's `requests_per_unit` and `unit`: the shortest unit in
/// which the rate is a whole number, else per day rounded down.
fn per_unit(limit: &Limit) -> (u32, Unit) {
    let (count, per) = match *limit {
        Limit::Gcra { count, per, .. } => (count, per),
        Limit::FixedWindow { window, limit } | Limit::SlidingWindow { window, limit } => {
            (limit, window)
        }
    };
    let per_us = per.as_micros().max(1);
    for (unit, secs) in UNITS {
        let scaled = u128::from(count) * u128::from(secs) * 1_000_000;
        if scaled % per_us == 0 {
            return ((scaled / per_us).min(u128::from(u32::MAX)) as u32, unit);
        }
    }
    let per_day = u128::from(count) * 86_400 * 1_000_000 / per_us;
    (per_day.clamp(1, u128::from(u32::MAX)) as u32, Unit::Day)
}

/// A descriptor's `limit` override: `requests_per_unit` per `unit`, a burst
/// of one unit's worth (gcra).
fn override_limit(o: &RateLimitOverride) -> Result<Limit, Error> {
    let bad = |m: String| Error::invalid("limit", m);
    // envoy.type.v3.RateLimitUnit: SECOND 1, MINUTE 2, HOUR 3, DAY 4,
    // MONTH 5, YEAR 6, WEEK 7.
    let secs: u64 = match o.unit {
        1 => 1,
        2 => 60,
        3 => 3600,
        4 => 86_400,
        7 => 7 * 86_400,
        5 => 30 * 86_400,
        6 => 365 * 86_400,
        other => return Err(bad(format!("unit {other} is not a unit of time"))),
    };
    if o.requests_per_unit == 0 {
        return Err(bad("requests_per_unit must be at least 1".into()));
    }
    let n = u64::from(o.requests_per_unit);
    Limit::gcra(n, Duration::from_secs(secs), n).map_err(|e| bad(e.accepted.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_read_in_envoy_units() {
        let g = |count, per_ms, burst| {
            Limit::gcra(count, Duration::from_millis(per_ms), burst).unwrap()
        };
        assert_eq!(per_unit(&g(100, 1000, 20)), (100, Unit::Second));
        assert_eq!(per_unit(&g(50, 3_600_000, 50)), (50, Unit::Hour));
        assert_eq!(per_unit(&g(1, 60_000, 1)), (1, Unit::Minute));
        // 1 per 7 s: no unit holds it whole before a day.
        assert_eq!(per_unit(&g(1, 7000, 1)), (12_342, Unit::Day));
        let w = Limit::fixed_window(Duration::from_secs(60), 30).unwrap();
        assert_eq!(per_unit(&w), (30, Unit::Minute));
    }
}
