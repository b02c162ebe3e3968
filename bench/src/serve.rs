//! `ratelimit serve`: the latency of one acquire, as a client on localhost
//! sees it, against one real `redis-server`.

use std::{
    fmt::Write as _,
    io::{BufRead, BufReader, Read, Write},
    net::{TcpListener, TcpStream},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use ratelimit_tests::{ChildGuard, ratelimit_bin, redis::RedisServer};
use serde_json::json;

use crate::{Opts, met, report::Report};

/// One keep-alive HTTP/1.1 connection to the service.
struct Client {
    reader: BufReader<TcpStream>,
    writer: TcpStream,
}

impl Client {
    fn connect(port: u16) -> std::io::Result<Self> {
        let s = TcpStream::connect(("127.0.0.1", port))?;
        s.set_nodelay(true)?;
        s.set_read_timeout(Some(Duration::from_secs(5)))?;
        Ok(Self {
            reader: BufReader::new(s.try_clone()?),
            writer: s,
        })
    }

    /// Sends one request, reads the whole answer; returns its status.
    fn request(&mut self, method: &str, path: &str, body: &str) -> std::io::Result<u16> {
        write!(
            self.writer,
            "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        )?;
        let mut line = String::new();
        self.reader.read_line(&mut line)?;
        let status = line
            .split_whitespace()
            .nth(1)
            .and_then(|c| c.parse().ok())
            .unwrap_or(0);
        let mut length = 0usize;
        loop {
            line.clear();
            self.reader.read_line(&mut line)?;
            if line == "\r\n" || line.is_empty() {
                break;
            }
            if let Some((name, value)) = line.split_once(':')
                && name.eq_ignore_ascii_case("content-length")
            {
                length = value.trim().parse().unwrap_or(0);
            }
        }
        let mut body = vec![0; length];
        self.reader.read_exact(&mut body)?;
        Ok(status)
    }
}

fn free_port() -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").expect("binding a free loopback port");
    l.local_addr().expect("local addr").port()
}

/// The p-th percentile (0–100) of sorted `v`.
fn pct(v: &[f64], p: f64) -> f64 {
    let i = ((v.len() as f64 - 1.0) * p / 100.0).round() as usize;
    v[i.min(v.len() - 1)]
}

/// Latencies in ms, sorted, of `n` calls of `f`.
fn timed(n: usize, mut f: impl FnMut(usize)) -> Vec<f64> {
    let mut v: Vec<f64> = (0..n)
        .map(|i| {
            let t = Instant::now();
            f(i);
            t.elapsed().as_secs_f64() * 1e3
        })
        .collect();
    v.sort_by(f64::total_cmp);
    v
}

pub(crate) fn serve_latency(opts: &Opts, report: &mut Report) {
    let n = if opts.quick { 2_000 } else { 20_000 };
    let keys = 1_000;
    report.section(
        "Throttling service: acquire latency",
        &format!(
            "`ratelimit serve` and one `redis-server` (persistence off) on localhost; one client on a keep-alive \
             connection sends {n} `POST /v1/acquire` one after another, over {keys} keys (gcra, 100/s burst 20: \
             allowed and denied both occur), after 500 to warm up; then eight clients at once, {n} in all. The time from writing the request to reading \
             the whole answer. The floor is a Redis `PING` on a connection of its own, measured in the same run."
        ),
    );
    let redis = RedisServer::start();
    let port = free_port();
    let mut cmd = Command::new(ratelimit_bin());
    cmd.args(["serve", "--listen", &format!("127.0.0.1:{port}"), "--redis"])
        .arg(redis.url())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    let _service = ChildGuard::spawn(cmd, "ratelimit serve");
    let start = Instant::now();
    let mut client = loop {
        if let Ok(mut c) = Client::connect(port)
            && c.request("GET", "/healthz", "").is_ok_and(|s| s == 200)
        {
            break c;
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "ratelimit serve did not answer /healthz within 10 s"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    let body = |i: usize| {
        json!({"key": format!("bench:{}", i % keys), "amount": 1,
               "limit": {"rate": "100/s", "burst": 20}})
        .to_string()
    };
    let bodies: Vec<String> = (0..keys).map(body).collect();
    let mut acquire = |i: usize| {
        let status = client
            .request("POST", "/v1/acquire", &bodies[i % keys])
            .expect("acquire");
        assert_eq!(status, 200, "acquire answered {status}");
    };
    timed(500, &mut acquire);
    let serve = timed(n, &mut acquire);
    // Eight clients at once, each on its own connection.
    let mut busy: Vec<f64> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..8)
            .map(|c| {
                let bodies = &bodies;
                s.spawn(move || {
                    let mut client = Client::connect(port).expect("connect");
                    timed(n / 8, |i| {
                        let status = client
                            .request("POST", "/v1/acquire", &bodies[(i * 8 + c) % keys])
                            .expect("acquire");
                        assert_eq!(status, 200, "acquire answered {status}");
                    })
                })
            })
            .collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().expect("client thread"))
            .collect()
    });
    busy.sort_by(f64::total_cmp);

    let mut ping = TcpStream::connect(("127.0.0.1", redis.port)).expect("redis");
    ping.set_nodelay(true).expect("nodelay");
    let mut buf = [0u8; 64];
    let floor = timed(n, |_| {
        ping.write_all(b"PING\r\n").expect("ping");
        let got = ping.read(&mut buf).expect("pong");
        assert!(
            buf[..got].starts_with(b"+PONG"),
            "redis answered {got} bytes"
        );
    });

    let (p50, p99, p999, max) = (
        pct(&serve, 50.0),
        pct(&serve, 99.0),
        pct(&serve, 99.9),
        pct(&serve, 100.0),
    );
    let (f50, f99) = (pct(&floor, 50.0), pct(&floor, 99.0));
    let _ = writeln!(
        report.md,
        "| | p50 | p99 | p99.9 | max |\n|---|---|---|---|---|\n\
         | `POST /v1/acquire` | {p50:.3} ms | **{p99:.3} ms** | {p999:.3} ms | {max:.3} ms |\n\
         | the same, 8 clients at once | {:.3} ms | {:.3} ms | {:.3} ms | {:.3} ms |\n\
         | floor: Redis `PING` | {f50:.3} ms | {f99:.3} ms | {:.3} ms | {:.3} ms |\n\n\
         Acquire p99 target ≤ 2 ms: **{}**.\n",
        pct(&busy, 50.0),
        pct(&busy, 99.0),
        pct(&busy, 99.9),
        pct(&busy, 100.0),
        pct(&floor, 99.9),
        pct(&floor, 100.0),
        met(p99 <= 2.0)
    );
    println!(
        "serve acquire: p50 {p50:.3} ms, p99 {p99:.3} ms, p99.9 {p999:.3} ms, max {max:.3} ms; \
         8 clients p50 {:.3} ms, p99 {:.3} ms; floor (redis PING) p50 {f50:.3} ms, p99 {f99:.3} ms",
        pct(&busy, 50.0),
        pct(&busy, 99.0)
    );
    report.json.insert(
        "serve_acquire_ms".into(),
        json!({"requests": n, "p50": p50, "p99": p99, "p999": p999, "max": max,
               "clients8_p50": pct(&busy, 50.0), "clients8_p99": pct(&busy, 99.0),
               "floor_ping_p50": f50, "floor_ping_p99": f99}),
    );
}
