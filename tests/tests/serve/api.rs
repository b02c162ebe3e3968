//! `ratelimit serve`: the throttling service, replicas sharing limits through a
//! real `redis-server`. No root needed.

use std::{
    thread::sleep,
    time::{Duration, Instant},
};

use ratelimit_tests::{
    redis::RedisServer,
    serve::{Service, exchange, http, post},
};
use serde_json::json;

fn serve(redis: &RedisServer) -> Service {
    Service::start(redis, &[])
}

#[test]
fn eight_clients_through_two_replicas_admit_exactly_one_limit() {
    let redis = RedisServer::start();
    let replicas = [serve(&redis), serve(&redis)];
    let ports: Vec<u16> = replicas.iter().map(|s| s.port).collect();
    // 50 an hour: nothing refills during the test.
    let limit = json!({"rate": "50/hour", "burst": 50});
    let handles: Vec<_> = (0..8)
        .map(|c| {
            let ports = ports.clone();
            let limit = limit.clone();
            std::thread::spawn(move || {
                let mut granted = 0;
                for i in 0..20 {
                    let port = ports[(c + i) % 2];
                    let (status, r) = post(
                        port,
                        "/v1/acquire",
                        json!({"key": "tenant-7", "amount": 1, "limit": limit}),
                    );
                    assert_eq!(status, 200, "{r}");
                    if r["allowed"] == true {
                        granted += r["granted"].as_u64().unwrap();
                    } else {
                        assert!(
                            r["retry_after_ms"].as_u64().unwrap() > 60_000,
                            "one token takes 72 s at 50/hour: {r}"
                        );
                    }
                }
                granted
            })
        })
        .collect();
    let total: u64 = handles.into_iter().map(|h| h.join().unwrap()).sum();
    assert_eq!(
        total, 50,
        "160 requests through two replicas, one limit of 50"
    );

    // A refill gives units back, never above the burst.
    let (status, r) = post(
        ports[0],
        "/v1/refill",
        json!({"key": "tenant-7", "amount": 3}),
    );
    assert_eq!((status, r["refunded"].as_u64()), (200, Some(3)), "{r}");
    let (_, r) = post(
        ports[1],
        "/v1/acquire",
        json!({"key": "tenant-7", "amount": 5, "limit": limit}),
    );
    assert_eq!(
        (
            r["allowed"].as_bool(),
            r["granted"].as_u64(),
            r["remaining"].as_u64()
        ),
        (Some(false), Some(3), Some(0)),
        "a partial grant of what was refilled: {r}"
    );
    // A refusal that took units hands out their grant: refilled, they are
    // back (not refilled, they would be gone until the key refills).
    let grant = r["grant"]
        .as_str()
        .unwrap_or_else(|| panic!("a refusal that took 3 units has no grant: {r}"))
        .to_string();
    let (status, r) = post(ports[0], "/v1/refill", json!({"grant": grant, "amount": 3}));
    assert_eq!(
        (status, r["refunded"].as_u64(), r["remaining"].as_u64()),
        (200, Some(3), Some(3)),
        "refilling the refusal's grant: {r}"
    );

    // Metrics: decisions by outcome, across what this replica answered.
    let (status, text) = http(ports[1], "GET", "/metrics", "").expect("metrics");
    assert_eq!(status, 200);
    let allowed: u64 = text
        .lines()
        .find(|l| l.starts_with("ratelimit_serve_decisions_total{outcome=\"allowed\"}"))
        .and_then(|l| l.split_whitespace().last())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no allowed count in:\n{text}"));
    assert!(allowed > 0 && allowed < 50, "{allowed}");
    assert!(
        text.contains("ratelimit_serve_redis_seconds_bucket"),
        "{text}"
    );
}

#[test]
fn bad_requests_are_answered_400_naming_the_field() {
    let redis = RedisServer::start();
    let s = serve(&redis);
    let limit = json!({"rate": "10/s"});
    for (body, field) in [
        (json!({"amount": 1, "limit": limit}), "key"),
        (json!({"key": "", "limit": limit}), "key"),
        (json!({"key": "a", "amount": 0, "limit": limit}), "amount"),
        (json!({"key": "a", "amount": "3", "limit": limit}), "amount"),
        (json!({"key": "a"}), "limit"),
        (json!({"key": "a", "limit": {"rate": "fast"}}), "limit.rate"),
        (
            json!({"key": "a", "limit": {"rate": "10/s", "burst": 0}}),
            "limit.burst",
        ),
        (
            json!({"key": "a", "limit": {"rate": "10/s", "algorithm": "x"}}),
            "limit.algorithm",
        ),
        (json!({"key": "a", "limit": limit, "user": "b"}), "user"),
    ] {
        let (status, r) = post(s.port, "/v1/acquire", body.clone());
        assert_eq!(status, 400, "{body} → {r}");
        assert_eq!(r["field"], field, "{body} → {r}");
    }
    let (status, text) = http(s.port, "POST", "/v1/acquire", "{not json").expect("http");
    assert_eq!(status, 400, "{text}");
    // Nothing was counted against the key.
    let (_, r) = post(
        s.port,
        "/v1/acquire",
        json!({"key": "a", "amount": 10, "limit": limit}),
    );
    assert_eq!(r["allowed"], true, "{r}");
}

#[test]
fn redis_down_is_a_503_and_its_return_is_served_again() {
    let mut redis = RedisServer::start();
    let s = serve(&redis);
    let body = json!({"key": "k", "limit": {"rate": "10/s"}});
    assert_eq!(post(s.port, "/v1/acquire", body.clone()).0, 200);
    redis.stop();
    let (status, r) = post(s.port, "/v1/acquire", body.clone());
    assert_eq!(status, 503, "{r}");
    assert!(
        r["error"]
            .as_str()
            .unwrap()
            .starts_with("redis unreachable: "),
        "{r}"
    );
    redis.restart();
    let start = Instant::now();
    while post(s.port, "/v1/acquire", body.clone()).0 != 200 {
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "not back within 5 s"
        );
        sleep(Duration::from_millis(100));
    }
}

/// (Issue 23, item 9) A Redis stall: acquires answered 503 while Redis was
/// stopped ran anyway once it resumed, and took 20 tokens. A call Redis
/// reaches after its deadline now takes nothing: the next caller gets the
/// whole burst.
#[test]
fn acquires_answered_503_during_a_redis_stall_take_no_tokens() {
    let redis = RedisServer::start();
    let s = serve(&redis);
    // 20 an hour: nothing refills during the test.
    let limit = json!({"rate": "20/hour", "burst": 20});
    // The script loaded, Redis's clock known.
    let (status, r) = s.post(
        "/v1/acquire",
        json!({"key": "warm", "amount": 1, "limit": limit}),
    );
    assert_eq!(status, 200, "{r}");

    redis.pause();
    let port = s.port;
    let asked = Instant::now();
    let answers: Vec<(u16, serde_json::Value, Duration)> = (0..20)
        .map(|_| {
            let limit = limit.clone();
            std::thread::spawn(move || {
                let sent = Instant::now();
                let (status, r) = post(
                    port,
                    "/v1/acquire",
                    json!({"key": "stalled", "amount": 1, "limit": limit}),
                );
                (status, r, sent.elapsed())
            })
        })
        .collect::<Vec<_>>()
        .into_iter()
        .map(|h| h.join().expect("client"))
        .collect();
    let stalled_for = asked.elapsed();
    // Redis runs the 20 queued calls now, each past its deadline.
    redis.resume();
    for (status, r, took) in &answers {
        assert_eq!(*status, 503, "an acquire during the stall: {r}");
        assert!(
            *took < Duration::from_secs(2),
            "a 503 took {took:?} during the stall"
        );
    }
    assert!(stalled_for < Duration::from_secs(5), "{stalled_for:?}");
    let state = redis.cmd("EXISTS ratelimit:{stalled}");
    assert_eq!(
        state.trim(),
        ":0",
        "the calls given up wrote the key once Redis resumed"
    );
    let (status, r) = s.post(
        "/v1/acquire",
        json!({"key": "stalled", "amount": 20, "limit": limit}),
    );
    assert_eq!(status, 200, "{r}");
    assert_eq!(
        (r["allowed"].as_bool(), r["granted"].as_u64()),
        (Some(true), Some(20)),
        "20 answers of 503 took tokens: {r}"
    );
    for (_, r, _) in &answers {
        let error = r["error"].as_str().unwrap_or_default();
        assert!(
            error.starts_with("redis timed out"),
            "the cause should be named: {r}"
        );
    }
    // The late calls are counted as such, not as successes.
    assert!(
        s.metric("ratelimit_serve_redis_errors_total{cause=\"timeout\"}")
            .unwrap_or(0.0)
            >= 20.0,
        "{}",
        http(port, "GET", "/metrics", "").expect("metrics").1
    );
}

/// (Issue 23, item 9) Redis at maxmemory with noeviction: every acquire was
/// 503 "redis unavailable: OOM" while /healthz said 200 and redis_up 1. Now
/// the cause is named, health and the gauge say Redis does not take
/// decisions, and both come back when it does.
#[test]
fn redis_out_of_memory_is_named_and_unhealthy() {
    let redis = RedisServer::start();
    let s = serve(&redis);
    let limit = json!({"rate": "100/s", "burst": 100});
    let (status, r) = s.post("/v1/acquire", json!({"key": "a", "limit": limit}));
    assert_eq!(status, 200, "{r}");
    assert_eq!(s.metric("ratelimit_serve_redis_up"), Some(1.0));

    let refusal = redis.fill_to_maxmemory();
    assert!(refusal.starts_with("-OOM"), "{refusal}");
    let (status, r) = s.post("/v1/acquire", json!({"key": "b", "limit": limit}));
    assert_eq!(status, 503, "{r}");
    let (health, body) = http(s.port, "GET", "/healthz", "").expect("healthz");
    assert_eq!(health, 503, "/healthz while Redis refuses writes: {body}");
    assert_eq!(s.metric("ratelimit_serve_redis_up"), Some(0.0));
    let error = r["error"].as_str().unwrap_or_default();
    assert!(
        error.starts_with("redis refused: out of memory (OOM "),
        "the cause should be named: {r}"
    );
    assert!(
        body.contains("redis refused: out of memory"),
        "/healthz: {body}"
    );
    assert!(
        s.metric("ratelimit_serve_redis_errors_total{cause=\"refused\"}")
            .unwrap_or(0.0)
            >= 2.0
    );

    // Room again: healthy again.
    assert!(redis.cmd("CONFIG SET maxmemory 0").starts_with("+OK"));
    let (status, body) = http(s.port, "GET", "/healthz", "").expect("healthz");
    assert_eq!((status, body.as_str()), (200, "ok\n"));
    assert_eq!(s.metric("ratelimit_serve_redis_up"), Some(1.0));
    let (status, r) = s.post("/v1/acquire", json!({"key": "b", "limit": limit}));
    assert_eq!((status, r["allowed"].as_bool()), (200, Some(true)), "{r}");
}

/// (Issue 23, item 13) A body over the limit was answered with a plain-text
/// 413; now with the JSON error naming the field, whether its length is
/// declared or it comes in chunks, and at the limit `--max-body` sets.
#[test]
fn a_body_over_the_limit_is_answered_413_in_json() {
    let redis = RedisServer::start();
    let s = serve(&redis);
    let big = format!(
        "{{\"key\": \"{}\", \"limit\": {{\"rate\": \"1/s\"}}}}",
        "k".repeat(16 * 1024)
    );
    let a = exchange(
        s.port,
        ratelimit_tests::serve::request("POST", "/v1/acquire", &big).as_bytes(),
    )
    .expect("http");
    assert_eq!(a.status, 413, "{a:?}");
    assert_eq!(
        a.json(),
        json!({"error": "body: larger than 16384 bytes", "field": "body"})
    );
    assert_eq!(a.header("content-type"), Some("application/json"));
    // Chunked: no length to refuse it by, refused as it comes.
    let chunk = "x".repeat(8 * 1024);
    let mut raw = String::from(
        "POST /v1/refill HTTP/1.1\r\nHost: 127.0.0.1\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n",
    );
    for _ in 0..3 {
        raw.push_str(&format!("{:x}\r\n{chunk}\r\n", chunk.len()));
    }
    raw.push_str("0\r\n\r\n");
    let a = exchange(s.port, raw.as_bytes()).expect("http");
    assert_eq!(a.status, 413, "{a:?}");
    assert_eq!(a.json()["field"], "body", "{a:?}");

    let small = Service::start(&redis, &["--max-body", "100"]);
    let body = json!({"key": "k", "limit": {"rate": "1/s"}}).to_string();
    assert!(body.len() < 100);
    let (status, r) = small.post("/v1/acquire", serde_json::from_str(&body).unwrap());
    assert_eq!(status, 200, "{r}");
    let padded = format!("{body:<101}");
    let (status, text) = http(small.port, "POST", "/v1/acquire", &padded).expect("http");
    assert_eq!(status, 413, "{text}");
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(&text).expect("JSON"),
        json!({"error": "body: larger than 100 bytes", "field": "body"})
    );
}

/// Bad values of the new flags are refused before anything starts, naming
/// the flag and what it takes.
#[test]
fn bad_limits_are_refused_naming_the_flag() {
    for (flag, value, says) in [
        ("--max-connections", "0", "from 1 to 1000000"),
        ("--max-connections", "lots", "like 1024"),
        ("--header-timeout", "0s", "500ms"),
        ("--idle-timeout", "soon", "500ms"),
        ("--body-timeout", "2h", "1ms to 1h"),
        ("--max-body", "2MiB", "1 byte to 1MiB"),
        ("--max-body", "16Kb", "16KiB"),
    ] {
        let out = std::process::Command::new(ratelimit_tests::ratelimit_bin())
            .args(["serve", "--redis", "redis://127.0.0.1:1", flag, value])
            .output()
            .expect("running ratelimit serve");
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{flag} {value}: {err}");
        assert!(
            err.contains(&format!("{flag}: ")) && err.contains(says),
            "{flag} {value}: {err}"
        );
    }
}
