//! `ratelimit serve` while Redis is down (issue 25, observation 9): answered
//! 503 at once by a breaker, without a Redis call, per Cluster master. What
//! is asserted is counted (the breaker's state and the Redis calls in the
//! metrics), never timed. Real `redis-server`s; no root needed.

use std::{
    thread::sleep,
    time::{Duration, Instant},
};

use ratelimit_tests::{
    redis::{RedisCluster, RedisServer},
    serve::{Service, Setup, post_as},
};
use serde_json::json;

const TOKEN: &str = "breaker-token-0123456789";

/// Waits (at most 10 s) until `metric` reads `want`.
fn until(s: &Service, metric: &str, want: f64) {
    let start = Instant::now();
    while s.metric(metric) != Some(want) {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "{metric} did not reach {want} within 10 s (it is {:?})",
            s.metric(metric)
        );
        sleep(Duration::from_millis(20));
    }
}

fn calls(s: &Service) -> f64 {
    s.metric("ratelimit_serve_redis_calls_total").unwrap_or(0.0)
}

fn rejected(s: &Service) -> f64 {
    s.metric("ratelimit_serve_breaker_rejected_total")
        .unwrap_or(0.0)
}

/// (Observation 9) With Redis down each request waited ~541 ms for its 503.
/// Now the first failure opens the breaker; every request after it is
/// answered 503 naming the cause, with the config's advice, and no Redis call
/// is made for it; a probe notices Redis's return and requests are served
/// again.
#[test]
fn redis_known_down_is_answered_without_asking_it() {
    let mut redis = RedisServer::start();
    let config = format!(
        r#"
[[tenant]]
name = "app"
token-file = "{dir}/token"

[[domain]]
name = "api"
tenants = ["app"]
failure-mode = "allow"

[[domain.limit]]
name = "per-user"
descriptor = [{{ key = "user" }}]
rate = "100/s"
"#,
        dir = "TOKEN_DIR"
    );
    let dir = ratelimit_tests::TempDir::new("breaker");
    std::fs::write(dir.0.join("token"), TOKEN).unwrap();
    let config = config.replace("TOKEN_DIR", &dir.0.display().to_string());
    let s = Service::start_with(
        &redis.url(),
        &Setup {
            config: Some(&config),
            ..Setup::default()
        },
    );
    let body = json!({"limit": "per-user", "key": "7"});
    let (status, r) = post_as(s.port, Some(TOKEN), "/v1/acquire", body.clone());
    assert_eq!(status, 200, "{r}");
    assert_eq!(
        s.metric("ratelimit_serve_breaker_open{node=\"redis\"}"),
        Some(0.0)
    );

    redis.stop();
    let (status, r) = post_as(s.port, Some(TOKEN), "/v1/acquire", body.clone());
    assert_eq!(status, 503, "{r}");
    assert!(
        r["error"]
            .as_str()
            .unwrap_or_default()
            .starts_with("redis unreachable: "),
        "{r}"
    );
    until(&s, "ratelimit_serve_breaker_open{node=\"redis\"}", 1.0);

    let (calls_before, rejected_before) = (calls(&s), rejected(&s));
    for _ in 0..50 {
        let (status, r) = post_as(s.port, Some(TOKEN), "/v1/acquire", body.clone());
        assert_eq!(status, 503, "{r}");
        let error = r["error"].as_str().unwrap_or_default();
        assert!(
            error.starts_with("redis unreachable: ") && error.contains("known down"),
            "the cause and that it is known: {r}"
        );
        assert_eq!(r["failure_mode"], "allow", "the config's advice: {r}");
    }
    assert_eq!(
        calls(&s),
        calls_before,
        "50 requests while Redis was known down made Redis calls"
    );
    assert_eq!(rejected(&s), rejected_before + 50.0);
    // (Issue 37, observation 4) /healthz asked Redis (0.58 s to its 503).
    // Now it answers from the open breaker, without a Redis call.
    let timed = || {
        s.metric("ratelimit_serve_redis_seconds_count")
            .unwrap_or(0.0)
    };
    let before = timed();
    assert!(before > 0.0, "the Redis calls' histogram counts them");
    for _ in 0..5 {
        let (status, text) =
            ratelimit_tests::serve::http(s.port, "GET", "/healthz", "").expect("GET /healthz");
        assert_eq!(status, 503, "{text}");
        assert!(text.contains("known down"), "{text}");
    }
    assert_eq!(
        timed(),
        before,
        "/healthz asked Redis while its breaker was open"
    );
    // The breaker probes Redis meanwhile.
    let start = Instant::now();
    while s
        .metric("ratelimit_serve_breaker_probes_total{outcome=\"failed\"}")
        .unwrap_or(0.0)
        < 1.0
    {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "no probe failed within 10 s"
        );
        sleep(Duration::from_millis(20));
    }
    assert_eq!(calls(&s), calls_before, "probes are not requests' calls");

    redis.restart();
    until(&s, "ratelimit_serve_breaker_open{node=\"redis\"}", 0.0);
    let (status, r) = post_as(s.port, Some(TOKEN), "/v1/acquire", body);
    assert_eq!(status, 200, "served again: {r}");
    assert!(s.log().contains("Redis answers again"), "{}", s.log());
}

/// (Observation 9) Keys on a dead Cluster master waited 500 ms each. Now that
/// master's breaker opens alone: its keys are answered 503 without a call,
/// and the keys of the other masters are served all along.
#[test]
fn a_dead_cluster_master_fails_only_its_own_keys_and_at_once() {
    let mut cluster = RedisCluster::start_args(&["--cluster-require-full-coverage", "no"]);
    let s = Service::start_with(&cluster.url(), &Setup::default());
    let limit = json!({"rate": "100/hour", "burst": 100});
    // Keys until each master holds some.
    let mut on: Vec<Vec<String>> = vec![Vec::new(); cluster.nodes.len()];
    for i in 0..60 {
        let key = format!("k{i}");
        let (status, r) = s.post("/v1/acquire", json!({"key": key, "limit": limit}));
        assert_eq!(status, 200, "{r}");
        let holder = cluster
            .nodes
            .iter()
            .position(|n| n.cmd(&format!("EXISTS ratelimit:{{{key}}}")).trim() == ":1")
            .unwrap_or_else(|| panic!("no node holds {key}"));
        on[holder].push(key);
    }
    assert!(on.iter().all(|k| k.len() >= 3), "keys per master: {on:?}");
    let dead = format!("127.0.0.1:{}", cluster.nodes[0].port);
    let open = format!("ratelimit_serve_breaker_open{{node=\"{dead}\"}}");
    assert_eq!(s.metric(&open), Some(0.0), "a breaker per master");

    cluster.nodes[0].stop();
    let (status, r) = s.post("/v1/acquire", json!({"key": on[0][0], "limit": limit}));
    assert_eq!(status, 503, "{r}");
    until(&s, &open, 1.0);

    let (calls_before, rejected_before) = (calls(&s), rejected(&s));
    for key in &on[0] {
        for _ in 0..5 {
            let (status, r) = s.post("/v1/acquire", json!({"key": key, "limit": limit}));
            assert_eq!(status, 503, "{key}: {r}");
            assert!(
                r["error"]
                    .as_str()
                    .unwrap_or_default()
                    .contains("known down"),
                "{r}"
            );
        }
    }
    assert_eq!(
        calls(&s),
        calls_before,
        "requests for the dead master's keys made Redis calls"
    );
    assert_eq!(rejected(&s), rejected_before + 5.0 * on[0].len() as f64);
    // The other masters' keys: served, each by a call of its own.
    for key in on[1].iter().chain(&on[2]) {
        let (status, r) = s.post("/v1/acquire", json!({"key": key, "limit": limit}));
        assert_eq!(status, 200, "{key} lives on a master that is up: {r}");
    }
    for n in &cluster.nodes[1..] {
        assert_eq!(
            s.metric(&format!(
                "ratelimit_serve_breaker_open{{node=\"127.0.0.1:{}\"}}",
                n.port
            )),
            Some(0.0)
        );
    }
    // A batch over every master: the dead one's keys 503, the rest granted.
    let items: Vec<_> = on
        .iter()
        .flatten()
        .map(|k| json!({"key": k, "limit": limit}))
        .collect();
    let (status, r) = s.post("/v1/acquire", json!({"acquire": items}));
    assert_eq!(status, 200, "{r}");
    let results = r["results"].as_array().expect("results");
    let failed = results.iter().filter(|a| a["status"] == 503).count();
    assert_eq!(failed, on[0].len(), "{r}");
}

/// A service starved of CPU is not Redis being down. The service is
/// stopped (SIGSTOP) for a second, eight times, while 8 clients acquire: a
/// call in flight then times out although Redis answered it at once. Before,
/// that opened the breaker ("Redis is known down"), counted a Redis timeout
/// and answered every caller 503 until a probe. Now such a call is answered
/// 503 naming the service's own lateness, counted as starved, and the
/// breaker stays closed: no probe ever runs.
#[test]
fn a_starved_service_does_not_blame_redis() {
    use std::sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
    };
    let redis = RedisServer::start();
    let s = Service::start(&redis, &[]);
    let stop = Arc::new(AtomicBool::new(false));
    let errors = Arc::new(Mutex::new(Vec::new()));
    let clients: Vec<_> = (0..8)
        .map(|i| {
            let (stop, errors, port) = (stop.clone(), errors.clone(), s.port);
            std::thread::spawn(move || {
                let body = json!({"key": format!("starved-{i}"), "limit": {"rate": "100000/s", "burst": 100000}});
                let mut ok = 0u32;
                let start = Instant::now();
                // Bounded: the main thread stops it after ~13 s; 60 s at most.
                while !stop.load(Ordering::Relaxed) && start.elapsed() < Duration::from_secs(60) {
                    let (status, r) = ratelimit_tests::serve::post(port, "/v1/acquire", body.clone());
                    if status == 200 {
                        ok += 1;
                    } else {
                        errors.lock().unwrap().push(r.to_string());
                    }
                }
                ok
            })
        })
        .collect();
    sleep(Duration::from_millis(500));
    for _ in 0..8 {
        // SAFETY: kill(2) on the service's own pid, a child of this test.
        assert_eq!(unsafe { libc::kill(s.pid(), libc::SIGSTOP) }, 0);
        sleep(Duration::from_secs(1));
        // SAFETY: as above.
        assert_eq!(unsafe { libc::kill(s.pid(), libc::SIGCONT) }, 0);
        sleep(Duration::from_millis(600));
    }
    stop.store(true, Ordering::Relaxed);
    let ok: u32 = clients.into_iter().map(|c| c.join().unwrap()).sum();
    let errors = errors.lock().unwrap();
    let starved = s
        .metric("ratelimit_serve_starved_calls_total")
        .unwrap_or(0.0);
    eprintln!(
        "{ok} acquires answered 200, {} answered otherwise; {starved} starved calls",
        errors.len()
    );
    assert!(ok > 100, "the clients were served: {ok}");
    for e in errors.iter() {
        assert!(
            e.contains("the service was too busy to hear Redis in time"),
            "a 503 while Redis was up must name the service's lateness: {e}"
        );
    }
    for probe in ["answered", "failed"] {
        let name = format!("ratelimit_serve_breaker_probes_total{{outcome=\"{probe}\"}}");
        assert_eq!(
            s.metric(&name).unwrap_or(0.0),
            0.0,
            "the breaker opened for a Redis that was up: {name}\n{}",
            s.log()
        );
    }
    assert_eq!(rejected(&s), 0.0, "keys answered by an open breaker");
    assert_eq!(
        s.metric("ratelimit_serve_redis_errors_total{cause=\"timeout\"}")
            .unwrap_or(0.0),
        0.0,
        "timeouts counted as Redis's"
    );
}
