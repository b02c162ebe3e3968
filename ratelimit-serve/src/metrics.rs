//! The service's metrics (`GET /metrics`, OpenMetrics): decisions, refunds,
//! Redis calls and their failures, the breakers, callers refused, and the
//! connections' own ([`super::conn::ConnMetrics`]).

use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{
        counter::Counter,
        family::Family,
        gauge::Gauge,
        histogram::{Histogram, exponential_buckets},
    },
    registry::Registry,
};

use super::conn::ConnMetrics;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct Outcome {
    pub outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct Cause {
    pub cause: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct Node {
    pub node: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct Shadow {
    pub limit: String,
    pub outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct Reason {
    pub reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct Code {
    pub code: &'static str,
}

/// Every metric of the service.
pub(super) struct Metrics {
    pub registry: Registry,
    /// Acquires (each key of a batch, each descriptor of a gRPC request) by
    /// outcome.
    pub decisions: Family<Outcome, Counter>,
    /// Units really given back.
    pub refunds: Counter,
    /// Refills by outcome.
    pub refills: Family<Outcome, Counter>,
    /// Shadow limits' decisions by limit and outcome.
    pub shadow: Family<Shadow, Counter>,
    pub redis_latency: Histogram,
    pub redis_up: Gauge,
    pub redis_errors: Family<Cause, Counter>,
    /// Calls that timed out while the service was starved (not Redis's).
    pub starved_calls: Counter,
    /// Script calls sent to Redis (probes apart).
    pub redis_calls: Counter,
    /// Keys per acquire call.
    pub batch_keys: Histogram,
    /// 1 while a node's breaker is open.
    pub breaker_open: Family<Node, Gauge>,
    /// Answers given by an open breaker, without asking Redis.
    pub breaker_rejected: Counter,
    /// Breaker probes by result.
    pub breaker_probes: Family<Outcome, Counter>,
    /// Callers refused by reason.
    pub auth_refused: Family<Reason, Counter>,
    /// gRPC `ShouldRateLimit` answers by code.
    pub grpc: Family<Code, Counter>,
    /// Leases of hot keys taken from Redis ([`super::lease`]).
    pub leases: Counter,
    /// Acquires decided from a lease, without asking Redis.
    pub leased_decisions: Counter,
    /// Units held in leases now.
    pub leased_units: Gauge,
    /// Units leases did not use, given back when they ended.
    pub lease_returned: Counter,
    /// The connections' own.
    pub conn: ConnMetrics,
}

/// The label of a failure's cause.
pub(super) fn cause(e: &ratelimit_redis::Error) -> &'static str {
    use ratelimit_redis::Error as E;
    match e {
        E::Refused(_) => "refused",
        E::Unreachable(_) => "unreachable",
        E::TimedOut(_) => "timeout",
        E::Late { .. } => "late",
        _ => "other",
    }
}

impl Metrics {
    pub(super) fn new() -> Self {
        let mut registry = Registry::default();
        let decisions = Family::<Outcome, Counter>::default();
        registry.register(
            "ratelimit_serve_decisions",
            "Acquires (each key of a batch, each descriptor of a gRPC request) by outcome: allowed (all granted), partial (some), denied (none), unlimited (no limit matched), bad_request, redis_error",
            decisions.clone(),
        );
        let refunds = Counter::default();
        registry.register(
            "ratelimit_serve_refunded_units",
            "Units really given back by /v1/refill (what the keys' remaining rose by)",
            refunds.clone(),
        );
        let refills = Family::<Outcome, Counter>::default();
        registry.register(
            "ratelimit_serve_refills",
            "Refills by outcome: refunded (gave some back), nothing (a retry, or the units were back already), unknown (no such grant: expired or never handed out), foreign (another tenant's grant), limit_changed, keyed (the open mode's refill by key), bad_request, redis_error",
            refills.clone(),
        );
        let shadow = Family::<Shadow, Counter>::default();
        registry.register(
            "ratelimit_serve_shadow_decisions",
            "Decisions of shadow limits (answered allowed whatever they decide), by limit and by what they decided: allowed, partial, denied",
            shadow.clone(),
        );
        // 50 µs to about 0.8 s.
        let redis_latency = Histogram::new(exponential_buckets(0.000_05, 2.0, 15));
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
            "Keys that Redis failed to decide, by cause (a call that decided many keys counts once per key; a key answered by an open breaker counts under the cause that opened it): refused (Redis answered an error, such as out of memory), unreachable, timeout, late (reached after its deadline: took nothing), other",
            redis_errors.clone(),
        );
        let starved_calls = Counter::default();
        registry.register(
            "ratelimit_serve_starved_calls",
            "Redis calls that timed out while the service itself was starved of CPU (its runtime woke 100 ms late or more during the call): answered 503, not counted as Redis's errors, the breaker left closed",
            starved_calls.clone(),
        );
        let redis_calls = Counter::default();
        registry.register(
            "ratelimit_serve_redis_calls",
            "Script calls sent to Redis for requests (an acquire call may carry many keys); the breakers' probes are not counted",
            redis_calls.clone(),
        );
        let batch_keys = Histogram::new(exponential_buckets(1.0, 2.0, 8));
        registry.register(
            "ratelimit_serve_batch_keys",
            "Keys decided by one acquire call (requests that arrive while calls are in flight share the next one)",
            batch_keys.clone(),
        );
        let breaker_open = Family::<Node, Gauge>::default();
        registry.register(
            "ratelimit_serve_breaker_open",
            "1 while the breaker of a Redis node (a Cluster master, or the one server) is open: its keys are answered 503 at once while a probe waits for it",
            breaker_open.clone(),
        );
        let breaker_rejected = Counter::default();
        registry.register(
            "ratelimit_serve_breaker_rejected",
            "Keys answered 503 by an open breaker, without a Redis call",
            breaker_rejected.clone(),
        );
        let breaker_probes = Family::<Outcome, Counter>::default();
        registry.register(
            "ratelimit_serve_breaker_probes",
            "Probes of a node whose breaker is open, by outcome: answered (the breaker closes), failed",
            breaker_probes.clone(),
        );
        let auth_refused = Family::<Reason, Counter>::default();
        registry.register(
            "ratelimit_serve_auth_refused",
            "Requests refused for who sent them: missing (no token), unknown (a token no tenant has), malformed, forbidden (a domain, limit or key not the tenant's)",
            auth_refused.clone(),
        );
        let grpc = Family::<Code, Counter>::default();
        registry.register(
            "ratelimit_serve_grpc_requests",
            "gRPC ShouldRateLimit answers by code: ok, over_limit, unavailable, unauthenticated, permission_denied, invalid_argument",
            grpc.clone(),
        );
        let leases = Counter::default();
        registry.register(
            "ratelimit_serve_leases",
            "Leases of hot keys taken from Redis (a limit's lease in the config)",
            leases.clone(),
        );
        let leased_decisions = Counter::default();
        registry.register(
            "ratelimit_serve_leased_decisions",
            "Acquires decided in this service from its leases, without asking Redis: allowed from a lease held, or denied while Redis is known short of one (also counted in ratelimit_serve_decisions)",
            leased_decisions.clone(),
        );
        let leased_units = Gauge::default();
        registry.register(
            "ratelimit_serve_leased_units",
            "Units this service holds in leases now, all keys together",
            leased_units.clone(),
        );
        let lease_returned = Counter::default();
        registry.register(
            "ratelimit_serve_lease_returned_units",
            "Units leases did not use, given back to Redis when they ended",
            lease_returned.clone(),
        );
        let conn = ConnMetrics::new(&mut registry);
        Self {
            registry,
            decisions,
            refunds,
            refills,
            shadow,
            redis_latency,
            redis_up,
            redis_errors,
            starved_calls,
            redis_calls,
            batch_keys,
            breaker_open,
            breaker_rejected,
            breaker_probes,
            auth_refused,
            grpc,
            leases,
            leased_decisions,
            leased_units,
            lease_returned,
            conn,
        }
    }

    pub(super) fn count(&self, outcome: &'static str) {
        self.decisions.get_or_create(&Outcome { outcome }).inc();
    }

    pub(super) fn refill(&self, outcome: &'static str) {
        self.refills.get_or_create(&Outcome { outcome }).inc();
    }

    pub(super) fn refused(&self, reason: &'static str) {
        self.auth_refused.get_or_create(&Reason { reason }).inc();
    }

    /// A Redis call that decided `keys` keys failed.
    pub(super) fn failed_keys(&self, e: &ratelimit_redis::Error, keys: u64) {
        self.redis_errors
            .get_or_create(&Cause { cause: cause(e) })
            .inc_by(keys);
        self.redis_up.set(0);
    }

    /// `keys` keys answered by an open breaker, opened by a failure of
    /// `cause`.
    pub(super) fn rejected(&self, cause: &'static str, keys: u64) {
        self.breaker_rejected.inc_by(keys);
        self.redis_errors
            .get_or_create(&Cause { cause })
            .inc_by(keys);
    }

    /// A Redis call that wrote succeeded: Redis takes decisions.
    pub(super) fn wrote(&self) {
        self.redis_up.set(1);
    }
}
