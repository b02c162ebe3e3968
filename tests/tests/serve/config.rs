//! `ratelimit serve --config`: limits, tenants and tokens on the server's side,
//! shadow limits, and TLS (issue 25, observation 8), against a real
//! `redis-server`. No root needed.

use std::process::Command;

use ratelimit_tests::{
    redis::RedisServer,
    serve::{Service, Setup, exchange, exchange_tls, post_as, request, test_ca},
};
use serde_json::{Value, json};

const SHOP: &str = "shop-token-0123456789";
const OPS: &str = "ops-token-9876543210";

/// `sha256:HEX` of `token`, as an operator makes it (`sha256sum`).
fn digest(token: &str) -> String {
    let out = Command::new("sh")
        .args(["-c", "printf %s \"$1\" | sha256sum", "sh", token])
        .output()
        .expect("sha256sum");
    let text = String::from_utf8_lossy(&out.stdout);
    format!(
        "sha256:{}",
        text.split_whitespace().next().unwrap_or_default()
    )
}

/// Two tenants: shop (token in a file) uses the domain checkout; ops (token
/// by digest, inline limits allowed) uses internal.
fn config(dir_token_file: &str) -> String {
    format!(
        r#"
[[tenant]]
name = "shop"
token-file = "{dir_token_file}"

[[tenant]]
name = "ops"
tokens = ["{ops}"]
inline-limits = true

[[domain]]
name = "checkout"
tenants = ["shop"]
failure-mode = "deny"

[[domain.limit]]
name = "per-user"
descriptor = [{{ key = "user" }}]
rate = "5/hour"
burst = 5

[[domain.limit]]
name = "vip"
descriptor = [{{ key = "user", value = "42" }}]
rate = "1/hour"
burst = 1
shadow = true

[[domain]]
name = "internal"
tenants = ["ops"]

[[domain.limit]]
name = "jobs"
descriptor = [{{ key = "queue", value = "batch" }}]
rate = "2/hour"
burst = 2
"#,
        ops = digest(OPS)
    )
}

fn start(redis: &RedisServer) -> Service {
    let dir = ratelimit_tests::TempDir::new("tokens");
    let file = dir.0.join("shop.token");
    std::fs::write(&file, format!("# shop's token\n{SHOP}\n")).expect("token file");
    let text = config(&file.display().to_string());
    let s = Service::start_with(
        &redis.url(),
        &Setup {
            config: Some(&text),
            ..Setup::default()
        },
    );
    // The token file was read at start.
    drop(dir);
    s
}

fn got(r: &Value, field: &str) -> u64 {
    r[field]
        .as_u64()
        .unwrap_or_else(|| panic!("no {field} in {r}"))
}

/// (Observation 8) Any caller could name any limit and touch any key, with
/// no identity. Now a caller without a token, or with one no tenant has, is
/// refused 401; with its tenant's it names a limit, not its numbers.
#[test]
fn callers_are_known_by_their_tokens() {
    let redis = RedisServer::start();
    let s = start(&redis);
    let body = json!({"limit": "per-user", "key": "7"});
    let (status, r) = post_as(s.port, None, "/v1/acquire", body.clone());
    assert_eq!(
        (status, r["field"].as_str()),
        (401, Some("authorization")),
        "{r}"
    );
    let a = exchange(
        s.port,
        request("POST", "/v1/acquire", &body.to_string()).as_bytes(),
    )
    .expect("http");
    assert_eq!(a.header("www-authenticate"), Some("Bearer"), "{a:?}");
    let (status, r) = post_as(
        s.port,
        Some("not-a-token-of-anyone"),
        "/v1/acquire",
        body.clone(),
    );
    assert_eq!(status, 401, "{r}");
    let (status, r) = post_as(s.port, Some(SHOP), "/v1/acquire", body.clone());
    assert_eq!(
        (status, got(&r, "granted"), got(&r, "remaining")),
        (200, 1, 4),
        "{r}"
    );
    // The numbers are the server's: a caller may not name its own.
    let (status, r) = post_as(
        s.port,
        Some(SHOP),
        "/v1/acquire",
        json!({"key": "7", "limit": {"rate": "1000/s"}}),
    );
    assert_eq!((status, r["field"].as_str()), (403, Some("limit")), "{r}");
    let (status, r) = post_as(
        s.port,
        Some(SHOP),
        "/v1/acquire",
        json!({"limit": "nope", "key": "7"}),
    );
    assert_eq!((status, r["field"].as_str()), (400, Some("limit")), "{r}");
    // Without a grant, a refill names nothing a tenant may refill.
    let (status, r) = post_as(
        s.port,
        Some(SHOP),
        "/v1/refill",
        json!({"key": "7", "amount": 1}),
    );
    assert_eq!((status, r["field"].as_str()), (400, Some("grant")), "{r}");
    assert!(
        s.metric("ratelimit_serve_auth_refused_total{reason=\"missing\"}")
            .unwrap_or(0.0)
            >= 2.0
    );
    assert_eq!(
        s.metric("ratelimit_serve_auth_refused_total{reason=\"unknown\"}"),
        Some(1.0)
    );
}

/// A tenant touches only its keys: another tenant's domain, limit or grant
/// is refused 403; a tenant's inline keys are apart from everyone's.
#[test]
fn a_tenant_touches_only_its_own_keys() {
    let redis = RedisServer::start();
    let s = start(&redis);
    let (status, r) = post_as(
        s.port,
        Some(SHOP),
        "/v1/acquire",
        json!({"limit": "per-user", "key": "9", "amount": 3}),
    );
    assert_eq!(status, 200, "{r}");
    let grant = r["grant"].clone();
    // ops may not refill shop's grant, nor use its limits or domain.
    let (status, r) = post_as(
        s.port,
        Some(OPS),
        "/v1/refill",
        json!({"grant": grant, "amount": 3}),
    );
    assert_eq!((status, r["field"].as_str()), (403, Some("grant")), "{r}");
    let (status, r) = post_as(
        s.port,
        Some(OPS),
        "/v1/acquire",
        json!({"limit": "per-user", "key": "9"}),
    );
    assert_eq!((status, r["field"].as_str()), (403, Some("limit")), "{r}");
    let (status, r) = post_as(
        s.port,
        Some(OPS),
        "/v1/acquire",
        json!({"domain": "checkout", "descriptor": [{"key": "user", "value": "9"}]}),
    );
    assert_eq!((status, r["field"].as_str()), (403, Some("domain")), "{r}");
    // shop's own refill works; its grant named as ops's is not touched.
    let (status, r) = post_as(
        s.port,
        Some(SHOP),
        "/v1/refill",
        json!({"grant": grant, "amount": 3}),
    );
    assert_eq!(
        (status, got(&r, "refunded"), got(&r, "remaining")),
        (200, 3, 5),
        "{r}"
    );
    // ops names its own numbers (inline-limits): its key is its own.
    let (status, r) = post_as(
        s.port,
        Some(OPS),
        "/v1/acquire",
        json!({"key": "9", "limit": {"rate": "1/hour", "burst": 1}}),
    );
    assert_eq!((status, got(&r, "granted")), (200, 1), "{r}");
    assert_eq!(redis.cmd("EXISTS ratelimit:{t:ops/9}").trim(), ":1");
    assert_eq!(redis.cmd("EXISTS ratelimit:{9}").trim(), ":0");
    assert!(
        s.metric("ratelimit_serve_auth_refused_total{reason=\"forbidden\"}")
            .unwrap_or(0.0)
            >= 3.0
    );
}

/// A limit named over HTTP and the same descriptor count in one bucket; a
/// descriptor no limit matches is not limited (as Envoy's service answers).
#[test]
fn names_and_descriptors_share_a_bucket() {
    let redis = RedisServer::start();
    let s = start(&redis);
    let named = json!({"limit": "per-user", "key": "5", "amount": 3});
    let (status, r) = post_as(s.port, Some(SHOP), "/v1/acquire", named);
    assert_eq!((status, got(&r, "remaining")), (200, 2), "{r}");
    let described =
        json!({"domain": "checkout", "descriptor": [{"key": "user", "value": "5"}], "amount": 3});
    let (status, r) = post_as(s.port, Some(SHOP), "/v1/acquire", described);
    assert_eq!(
        (status, r["allowed"].as_bool(), got(&r, "granted")),
        (200, Some(false), 2),
        "{r}"
    );
    let (status, r) = post_as(
        s.port,
        Some(SHOP),
        "/v1/acquire",
        json!({"domain": "checkout", "descriptor": [{"key": "ip", "value": "x"}]}),
    );
    assert_eq!((status, r["unlimited"].as_bool()), (200, Some(true)), "{r}");
}

/// A shadow limit decides and counts, and never denies.
#[test]
fn a_shadow_limit_counts_and_never_denies() {
    let redis = RedisServer::start();
    let s = start(&redis);
    for i in 0..3 {
        let (status, r) = post_as(s.port, Some(SHOP), "/v1/acquire", json!({"limit": "vip"}));
        assert_eq!((status, r["allowed"].as_bool()), (200, Some(true)), "{r}");
        assert_eq!(r["shadow"]["allowed"].as_bool(), Some(i == 0), "{r}");
    }
    assert_eq!(
        s.metric("ratelimit_serve_shadow_decisions_total{limit=\"vip\",outcome=\"denied\"}"),
        Some(2.0)
    );
    assert_eq!(
        s.metric("ratelimit_serve_shadow_decisions_total{limit=\"vip\",outcome=\"allowed\"}"),
        Some(1.0)
    );
}

/// A bad config is refused before anything starts, each error at its line.
#[test]
fn a_bad_config_names_each_error_at_its_line() {
    let dir = ratelimit_tests::TempDir::new("serve-config");
    let path = dir.0.join("serve.toml");
    std::fs::write(
        &path,
        "[[tenant]]\nname = \"a\"\ntokens = [\"abc\"]\n\n[[domain]]\nname = \"d\"\ntenants = [\"b\"]\n\n[[domain.limit]]\ndescriptor = [{ key = \"user\" }]\nrate = \"fast\"\n",
    )
    .unwrap();
    let out = Command::new(ratelimit_tests::ratelimit_bin())
        .args(["serve", "--redis", "redis://127.0.0.1:1", "--config"])
        .arg(&path)
        .output()
        .expect("ratelimit serve");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    let p = path.display().to_string();
    for want in [
        format!("{p}:3: tenant[0].tokens[0]: must be \"sha256:\""),
        format!("{p}:7: domain[0].tenants[0]: no [[tenant]] is named \"b\""),
        format!("{p}:11: domain[0].limit[0].rate: invalid rate \"fast\""),
    ] {
        assert!(err.contains(&want), "expected {want:?} in:\n{err}");
    }
}

/// (Observation 8) No TLS. Now with a certificate a CA made for the test: a
/// client trusting the CA is served, one speaking plain HTTP is not, and one
/// trusting another CA refuses the server.
#[test]
fn tls_serves_clients_that_trust_its_ca() {
    let redis = RedisServer::start();
    let (ca, cert, key) = test_ca();
    let s = Service::start_with(
        &redis.url(),
        &Setup {
            tls: Some((&cert, &key)),
            ..Setup::default()
        },
    );
    let body = json!({"key": "k", "limit": {"rate": "10/hour", "burst": 10}}).to_string();
    let raw = request("POST", "/v1/acquire", &body);
    let a = exchange_tls(s.port, &ca, raw.as_bytes()).expect("TLS exchange");
    assert_eq!(a.status, 200, "{a:?}");
    assert_eq!(a.json()["remaining"], 9, "{a:?}");
    let plain = exchange(s.port, raw.as_bytes());
    assert!(
        plain.as_ref().map_or(true, |a| a.status == 0),
        "plain HTTP to a TLS listener was answered: {plain:?}"
    );
    let (other_ca, _, _) = test_ca();
    assert!(
        exchange_tls(s.port, &other_ca, raw.as_bytes()).is_err(),
        "a client trusting another CA accepted the server"
    );
    assert_eq!(redis.cmd("EXISTS ratelimit:{k}").trim(), ":1");
}

/// (Issue 37, observation 1) A second tenant of the same domain refilled
/// another tenant's real grant. Now the grant's record holds its tenant: a
/// refill by another answers 403 and gives nothing back, counted as
/// `foreign`, and the owner's own refill still does.
#[test]
fn a_tenant_cannot_refill_another_tenants_grant() {
    let redis = RedisServer::start();
    let text = format!(
        r#"
[[tenant]]
name = "shop"
tokens = ["{shop}"]

[[tenant]]
name = "shop-eu"
tokens = ["{ops}"]

[[domain]]
name = "checkout"
tenants = ["shop", "shop-eu"]

[[domain.limit]]
name = "per-user"
descriptor = [{{ key = "user" }}]
rate = "10/hour"
burst = 10
"#,
        shop = digest(SHOP),
        ops = digest(OPS)
    );
    let s = Service::start_with(
        &redis.url(),
        &Setup {
            config: Some(&text),
            ..Setup::default()
        },
    );
    let ask = json!({"limit": "per-user", "key": "7", "amount": 10});
    let (status, r) = post_as(s.port, Some(SHOP), "/v1/acquire", ask.clone());
    assert_eq!((status, got(&r, "granted")), (200, 10), "{r}");
    let grant = r["grant"].clone();
    assert!(grant.is_string(), "{r}");
    let (status, r) = post_as(
        s.port,
        Some(OPS),
        "/v1/refill",
        json!({"grant": grant, "amount": 10}),
    );
    assert_eq!((status, r["field"].as_str()), (403, Some("grant")), "{r}");
    let (status, r) = post_as(s.port, Some(OPS), "/v1/acquire", ask);
    assert_eq!(
        (status, got(&r, "granted")),
        (200, 0),
        "nothing came back: {r}"
    );
    let (status, r) = post_as(
        s.port,
        Some(SHOP),
        "/v1/refill",
        json!({"grant": grant, "amount": 10}),
    );
    assert_eq!(
        (status, got(&r, "refunded")),
        (200, 10),
        "the owner's own: {r}"
    );
    let (_, metrics) =
        ratelimit_tests::serve::http(s.port, "GET", "/metrics", "").expect("metrics");
    assert!(
        metrics
            .lines()
            .any(|l| l.starts_with("ratelimit_serve_refills_total{outcome=\"foreign\"} 1")),
        "{metrics}"
    );
}
