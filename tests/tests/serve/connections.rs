//! `ratelimit serve` against clients that hold connections (issue 23, item 7):
//! silent, trickling, idle and more than the cap. No root needed; a real
//! `redis-server` behind.

use std::{
    io::Write,
    net::{SocketAddr, TcpStream},
    time::{Duration, Instant},
};

use ratelimit_tests::{
    redis::RedisServer,
    serve::{Answer, Service, closed_within, exchange, request},
};
use serde_json::json;

fn acquire_body() -> String {
    json!({"key": "k", "amount": 1, "limit": {"rate": "1000/s"}}).to_string()
}

/// (Item 7) Under a limit of 1 024 open files, 1 100 silent connections from
/// one client made every request time out, with no 503 and no log line. Now
/// the cap keeps the service within its descriptors, the connection idle
/// longest makes room for each new one (logged once), a request among them is
/// answered at once, and the silent ones are closed by the header timeout.
#[test]
fn silent_connections_under_a_low_fd_limit_do_not_starve_requests() {
    let redis = RedisServer::start();
    let s = Service::start_under(
        &["prlimit", "--nofile=1024:1024", "--"],
        &redis,
        &["--header-timeout", "10s"],
    );
    let addr: SocketAddr = ([127, 0, 0, 1], s.port).into();
    let first_opened = Instant::now();
    let mut held = Vec::new();
    for i in 0..1100 {
        let c = TcpStream::connect_timeout(&addr, Duration::from_secs(3))
            .unwrap_or_else(|e| panic!("connection {i} of 1100: {e}"));
        held.push(c);
    }
    let last_opened = Instant::now();
    // Else the first ones would time out before the last came, and the cap
    // would not be reached.
    assert!(
        last_opened - first_opened < Duration::from_secs(8),
        "opening 1 100 connections took {:?}: the machine is too slow for this test",
        last_opened - first_opened
    );

    let asked = Instant::now();
    let a = exchange(
        s.port,
        request("POST", "/v1/acquire", &acquire_body()).as_bytes(),
    )
    .expect("an acquire among 1 100 silent connections");
    let took = asked.elapsed();
    assert_eq!(a.status, 200, "{a:?}");
    assert!(
        took < Duration::from_secs(2),
        "an acquire among 1 100 silent connections took {took:?}"
    );
    let log = s.log();
    let lines = |what: &str| log.lines().filter(|l| l.contains(what)).count();
    assert_eq!(
        lines("connection cap reached"),
        1,
        "the cap should be logged once: {log}"
    );
    assert_eq!(
        lines("accepting a connection failed"),
        0,
        "out of descriptors: {log}"
    );
    // 1024 open files leave 928 connections: the rest made room.
    let shed = s
        .metric("ratelimit_serve_connections_shed_total{how=\"closed_idle\"}")
        .unwrap_or(0.0);
    assert!(shed >= 172.0, "{shed} connections closed to make room");

    // Every silent one is closed: for room, or by the header timeout.
    let deadline = last_opened + Duration::from_secs(10 + 3);
    for (i, c) in held.iter_mut().enumerate() {
        let wait = deadline.saturating_duration_since(Instant::now());
        assert!(
            closed_within(c, wait, &mut Vec::new()).is_some(),
            "silent connection {i} still open 13 s after the last was opened (header timeout 10 s)"
        );
    }
    assert!(
        s.metric("ratelimit_serve_timeouts_total{phase=\"header\"}")
            .unwrap_or(0.0)
            >= 1.0
    );
}

/// (Item 7) Silent, trickled-header, idle keep-alive and trickled-body
/// connections were all still open at 75 s. Each is now closed by its own
/// timeout (the body's answered 408 in JSON).
#[test]
fn slow_connections_are_closed_by_their_timeouts() {
    let redis = RedisServer::start();
    let s = Service::start(
        &redis,
        &[
            "--header-timeout",
            "1s",
            "--idle-timeout",
            "2s",
            "--body-timeout",
            "1s",
        ],
    );
    let port = s.port;
    let connect = move || {
        let c = TcpStream::connect(("127.0.0.1", port)).expect("connect");
        c.set_nodelay(true).expect("nodelay");
        c
    };
    // Each sends a piece every 200 ms, at most 25 (5 s), until closed.
    let trickle = move |head: &'static str, piece: &'static str| {
        move || {
            let mut c = connect();
            let start = Instant::now();
            let mut got = Vec::new();
            let _ = c.write_all(head.as_bytes());
            for _ in 0..25 {
                if closed_within(&mut c, Duration::from_millis(200), &mut got).is_some() {
                    return (Some(start.elapsed()), got);
                }
                let _ = c.write_all(piece.as_bytes());
            }
            (None, got)
        }
    };
    let silent = std::thread::spawn(move || {
        let mut c = connect();
        let mut got = Vec::new();
        (closed_within(&mut c, Duration::from_secs(5), &mut got), got)
    });
    let header = std::thread::spawn(trickle(
        "POST /v1/acquire HTTP/1.1\r\nHost: 127.0.0.1\r\n",
        "X-Trickle: 1\r\n",
    ));
    let body = std::thread::spawn(trickle(
        "POST /v1/acquire HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n",
        " ",
    ));
    let idle = std::thread::spawn(move || {
        let mut c = connect();
        let body = acquire_body();
        write!(
            c,
            "POST /v1/acquire HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        )
        .expect("request");
        // The answer, then nothing.
        let mut got = Vec::new();
        let start = Instant::now();
        while !String::from_utf8_lossy(&got).contains("\"allowed\"") {
            assert!(
                start.elapsed() < Duration::from_secs(5),
                "no answer: {got:?}"
            );
            assert!(
                closed_within(&mut c, Duration::from_millis(100), &mut got).is_none(),
                "closed before answering: {:?}",
                String::from_utf8_lossy(&got)
            );
        }
        (closed_within(&mut c, Duration::from_secs(5), &mut got), got)
    });

    let within = |what: &str, closed: Option<Duration>, from: f64, to: f64| {
        let t = closed.unwrap_or_else(|| panic!("the {what} connection was still open after 5 s"));
        assert!(
            t.as_secs_f64() >= from && t.as_secs_f64() <= to,
            "the {what} connection was closed after {t:?}, not between {from} and {to} s"
        );
    };
    let (t, _) = silent.join().expect("silent");
    within("silent", t, 0.9, 3.5);
    let (t, got) = header.join().expect("trickled header");
    within("trickled-header", t, 0.9, 3.5);
    assert!(got.is_empty(), "{:?}", String::from_utf8_lossy(&got));
    let (t, got) = idle.join().expect("idle");
    // The idle timeout (2 s), not the header timeout (1 s).
    within("idle keep-alive", t, 1.8, 4.5);
    let (t, got_body) = body.join().expect("trickled body");
    within("trickled-body", t, 0.9, 3.5);
    let a = Answer::parse(&String::from_utf8_lossy(&got_body));
    assert_eq!(a.status, 408, "{a:?}");
    assert_eq!(
        a.json(),
        json!({"error": "body: not complete within 1 s (--body-timeout)", "field": "body"})
    );
    assert!(
        String::from_utf8_lossy(&got).contains("200 OK"),
        "{:?}",
        String::from_utf8_lossy(&got)
    );
    for (phase, least) in [("header", 2.0), ("idle", 1.0), ("body", 1.0)] {
        let n = s
            .metric(&format!(
                "ratelimit_serve_timeouts_total{{phase=\"{phase}\"}}"
            ))
            .unwrap_or(0.0);
        assert!(n >= least, "{n} {phase} timeouts counted");
    }
}

/// (Item 7) When every connection is busy with a request, a new one is
/// answered 503 at once, with the JSON error and a Retry-After, and the
/// overload is logged once; the busy requests are answered as usual.
#[test]
fn a_new_connection_while_all_are_busy_is_answered_503_at_once() {
    let redis = RedisServer::start();
    let s = Service::start(&redis, &["--max-connections", "4", "--body-timeout", "20s"]);
    let body = acquire_body();
    // Four requests whose bodies wait for "100 Continue": busy, certainly,
    // once it came.
    let mut busy: Vec<TcpStream> = (0..4)
        .map(|i| {
            let mut c = TcpStream::connect(("127.0.0.1", s.port)).expect("connect");
            write!(
                c,
                "POST /v1/acquire HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: {}\r\nExpect: 100-continue\r\nConnection: close\r\n\r\n",
                body.len()
            )
            .expect("head");
            let mut got = Vec::new();
            let start = Instant::now();
            while !String::from_utf8_lossy(&got).contains("100 Continue") {
                assert!(
                    start.elapsed() < Duration::from_secs(5),
                    "request {i}: no 100 Continue: {:?}",
                    String::from_utf8_lossy(&got)
                );
                assert!(
                    closed_within(&mut c, Duration::from_millis(100), &mut got).is_none(),
                    "request {i} closed: {:?}",
                    String::from_utf8_lossy(&got)
                );
            }
            c
        })
        .collect();

    for _ in 0..3 {
        let asked = Instant::now();
        let a = exchange(s.port, request("POST", "/v1/acquire", &body).as_bytes())
            .expect("a request past the cap");
        let took = asked.elapsed();
        assert_eq!(a.status, 503, "{a:?}");
        assert!(took < Duration::from_secs(2), "the 503 took {took:?}");
        assert_eq!(
            a.json(),
            json!({"error": "overloaded: all 4 connections are busy with requests (--max-connections); try again shortly"})
        );
        assert_eq!(a.header("retry-after"), Some("1"), "{a:?}");
    }
    let log = s.log();
    assert_eq!(
        log.lines().filter(|l| l.contains("overloaded")).count(),
        1,
        "the overload should be logged once: {log}"
    );

    for c in &mut busy {
        c.write_all(body.as_bytes()).expect("body");
    }
    for (i, c) in busy.iter_mut().enumerate() {
        let mut got = Vec::new();
        assert!(
            closed_within(c, Duration::from_secs(5), &mut got).is_some(),
            "request {i} not answered"
        );
        let text = String::from_utf8_lossy(&got);
        let answer = text.rsplit("HTTP/1.1 ").next().unwrap_or_default();
        assert!(answer.starts_with("200 OK"), "request {i}: {text}");
    }
    assert!(
        s.metric("ratelimit_serve_connections_shed_total{how=\"refused\"}")
            .unwrap_or(0.0)
            >= 3.0
    );
}
