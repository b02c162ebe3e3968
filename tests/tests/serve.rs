//! `ratelimit serve`: the throttling service, replicas sharing limits through a
//! real `redis-server`. No root needed.

use std::{
    io::{Read, Write},
    net::{TcpListener, TcpStream},
    process::{Command, Stdio},
    thread::sleep,
    time::{Duration, Instant},
};

use ratelimit_tests::{ChildGuard, ratelimit_bin, redis::RedisServer};
use serde_json::{Value, json};

/// One HTTP/1.1 request; (status, body).
fn http(port: u16, method: &str, path: &str, body: &str) -> std::io::Result<(u16, String)> {
    let mut s = TcpStream::connect(("127.0.0.1", port))?;
    s.set_read_timeout(Some(Duration::from_secs(5)))?;
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )?;
    let mut out = String::new();
    s.read_to_string(&mut out)?;
    let status = out
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = out
        .split_once("\r\n\r\n")
        .map_or("", |(_, b)| b)
        .to_string();
    Ok((status, body))
}

fn post(port: u16, path: &str, body: Value) -> (u16, Value) {
    let (status, text) = http(port, "POST", path, &body.to_string()).expect("http");
    (
        status,
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("{text:?}: {e}")),
    )
}

struct Service {
    _child: ChildGuard,
    port: u16,
}

fn serve(redis: &RedisServer) -> Service {
    let port = TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("free port")
        .port();
    let mut cmd = Command::new(ratelimit_bin());
    cmd.args(["serve", "--listen", &format!("127.0.0.1:{port}"), "--redis"])
        .arg(redis.url())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    let child = ChildGuard::spawn(cmd, "ratelimit serve");
    let start = Instant::now();
    while !matches!(http(port, "GET", "/healthz", ""), Ok((200, _))) {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "ratelimit serve did not answer /healthz within 10 s"
        );
        sleep(Duration::from_millis(50));
    }
    Service {
        _child: child,
        port,
    }
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
    assert!(r["error"].as_str().unwrap().contains("redis"), "{r}");
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
