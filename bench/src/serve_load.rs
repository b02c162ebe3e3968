//! `ratelimit serve` under load: requests per second at 1, 8 and 32 clients
//! over HTTP and gRPC, beside the floor measured in the same run, raw
//! `EVALSHA` of the decision script (what a client of Redis that decides by
//! itself pays), and beside the service of another build (`RATELIMIT_BEFORE`,
//! e.g. main's) when one is given.

use std::{
    fmt::Write as _,
    io::{BufRead, BufReader, Read, Write},
    net::TcpStream,
    process::{Command, Stdio},
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

use envoy_types::pb::envoy::{
    extensions::common::ratelimit::v3::{
        RateLimitDescriptor,
        rate_limit_descriptor::{Entry, RateLimitOverride},
    },
    service::ratelimit::v3::{RateLimitRequest, rate_limit_service_client::RateLimitServiceClient},
};
use ratelimit_tests::{ChildGuard, redis::RedisServer, serve::free_port};
use serde_json::json;

use crate::{Opts, report::Report};

/// Keys the clients cycle over: gcra 100/s burst 20, allowed and denied
/// both occur.
const KEYS: usize = 1000;
const CLIENTS: [usize; 3] = [1, 8, 32];

/// What one run measured.
struct Run {
    per_sec: f64,
    p50_ms: f64,
    p99_ms: f64,
    /// Requests answered.
    n: usize,
}

fn pct(v: &[f64], p: f64) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    let i = ((v.len() as f64 - 1.0) * p / 100.0).round() as usize;
    v[i.min(v.len() - 1)]
}

/// `clients` threads, each running `one` (made by `make`, per client) in a
/// loop for `secs`.
fn load<C: Send>(
    clients: usize,
    secs: Duration,
    make: impl Fn(usize) -> C + Sync,
    one: impl Fn(&mut C, usize) + Sync,
) -> Run {
    load_at(clients, secs, None, make, one)
}

/// [`load`], each client sending once every `pace` when one is given (an
/// open loop below the server's capacity: the latency is the server's, not
/// the queue's); each latency is taken from the send.
fn load_at<C: Send>(
    clients: usize,
    secs: Duration,
    pace: Option<Duration>,
    make: impl Fn(usize) -> C + Sync,
    one: impl Fn(&mut C, usize) + Sync,
) -> Run {
    let stop = AtomicBool::new(false);
    let lats: Vec<Vec<f64>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..clients)
            .map(|c| {
                let (make, one, stop) = (&make, &one, &stop);
                s.spawn(move || {
                    let mut client = make(c);
                    let mut lat = Vec::new();
                    let mut i = c * 7919;
                    // Paced clients start spread over one pace.
                    let mut at = Instant::now()
                        + pace.map_or(Duration::ZERO, |p| p.mul_f64(c as f64 / clients as f64));
                    while !stop.load(Ordering::Relaxed) {
                        if let Some(pace) = pace {
                            if let Some(wait) = at.checked_duration_since(Instant::now()) {
                                std::thread::sleep(wait);
                            }
                            at += pace;
                        }
                        let t = Instant::now();
                        one(&mut client, i);
                        lat.push(t.elapsed().as_secs_f64() * 1e3);
                        i += 1;
                    }
                    lat
                })
            })
            .collect();
        std::thread::sleep(secs);
        stop.store(true, Ordering::Relaxed);
        handles
            .into_iter()
            .map(|h| h.join().expect("client"))
            .collect()
    });
    let mut all: Vec<f64> = lats.into_iter().flatten().collect();
    all.sort_by(f64::total_cmp);
    Run {
        per_sec: all.len() as f64 / secs.as_secs_f64(),
        p50_ms: pct(&all, 50.0),
        p99_ms: pct(&all, 99.0),
        n: all.len(),
    }
}

/// A process's time on CPU so far, ns: the sum of its threads' (schedstat).
fn process_cpu_ns(pid: u32) -> u64 {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return 0;
    };
    tasks
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("schedstat")).ok())
        .filter_map(|s| s.split_whitespace().next()?.parse::<u64>().ok())
        .sum()
}

/// What a run cost per request: the service's CPU (µs), Redis's commands
/// and Redis's CPU (µs).
struct Cost {
    cpu_us: f64,
    redis_calls: f64,
    redis_cpu_us: f64,
}

/// `run` against the service `pid`, with what it cost per request.
fn costed(pid: u32, redis: &RedisServer, run: impl FnOnce() -> Run) -> (Run, Cost) {
    let (cpu0, (calls0, rcpu0)) = (process_cpu_ns(pid), crate::fleet::redis_counts(redis));
    let r = run();
    let (cpu1, (calls1, rcpu1)) = (process_cpu_ns(pid), crate::fleet::redis_counts(redis));
    let n = r.n.max(1) as f64;
    let cost = Cost {
        cpu_us: (cpu1 - cpu0) as f64 / 1e3 / n,
        redis_calls: (calls1 - calls0) as f64 / n,
        redis_cpu_us: (rcpu1 - rcpu0) * 1e6 / n,
    };
    (r, cost)
}

/// One of the minimal services ([`crate::minimal`]), started from this
/// binary, once it answers.
fn minimal(kind: &str, redis: &RedisServer) -> (ChildGuard, u16) {
    let port = free_port();
    let mut cmd = Command::new(std::env::current_exe().expect("the bench's binary"));
    cmd.args(["--minimal-server", kind, &port.to_string(), &redis.url()])
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    let child = ChildGuard::spawn(cmd, "a minimal service");
    let start = Instant::now();
    loop {
        if TcpStream::connect(("127.0.0.1", port)).is_ok() {
            let mut c = Http::connect(port);
            if c.post("/v1/acquire", r#"{"key":"warm"}"#) == 200 {
                break;
            }
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "the minimal {kind} service did not answer within 10 s"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    (child, port)
}

/// A keep-alive HTTP/1.1 client.
struct Http {
    reader: BufReader<TcpStream>,
    writer: TcpStream,
    line: String,
}

impl Http {
    fn connect(port: u16) -> Self {
        let s = TcpStream::connect(("127.0.0.1", port)).expect("connect");
        s.set_nodelay(true).expect("nodelay");
        s.set_read_timeout(Some(Duration::from_secs(5)))
            .expect("timeout");
        Self {
            reader: BufReader::new(s.try_clone().expect("clone")),
            writer: s,
            line: String::new(),
        }
    }

    fn post(&mut self, path: &str, body: &str) -> u16 {
        write!(
            self.writer,
            "POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        )
        .expect("write");
        self.line.clear();
        self.reader.read_line(&mut self.line).expect("status line");
        let status = self
            .line
            .split_whitespace()
            .nth(1)
            .and_then(|c| c.parse().ok())
            .unwrap_or(0);
        let mut length = 0usize;
        loop {
            self.line.clear();
            self.reader.read_line(&mut self.line).expect("header");
            if self.line == "\r\n" || self.line.is_empty() {
                break;
            }
            if let Some((name, value)) = self.line.split_once(':')
                && name.eq_ignore_ascii_case("content-length")
            {
                length = value.trim().parse().unwrap_or(0);
            }
        }
        let mut body = vec![0; length];
        self.reader.read_exact(&mut body).expect("body");
        status
    }
}

/// A raw Redis connection sending `EVALSHA` of the decision script.
struct Raw {
    reader: BufReader<TcpStream>,
    writer: TcpStream,
    line: String,
}

impl Raw {
    fn connect(port: u16) -> Self {
        let s = TcpStream::connect(("127.0.0.1", port)).expect("redis");
        s.set_nodelay(true).expect("nodelay");
        Self {
            reader: BufReader::new(s.try_clone().expect("clone")),
            writer: s,
            line: String::new(),
        }
    }

    fn command(&mut self, args: &[&str]) {
        let mut out = format!("*{}\r\n", args.len());
        for a in args {
            let _ = write!(out, "${}\r\n{a}\r\n", a.len());
        }
        self.writer.write_all(out.as_bytes()).expect("write");
        self.skip_reply();
    }

    fn read_line(&mut self) -> String {
        self.line.clear();
        self.reader.read_line(&mut self.line).expect("reply");
        self.line.trim_end().to_string()
    }

    fn skip_reply(&mut self) {
        let l = self.read_line();
        match l.as_bytes().first() {
            Some(b'*') => {
                let n: i64 = l[1..].parse().unwrap_or(0);
                for _ in 0..n.max(0) {
                    self.skip_reply();
                }
            }
            Some(b'$') => {
                let n: i64 = l[1..].parse().unwrap_or(-1);
                if n >= 0 {
                    let mut b = vec![0; n as usize + 2];
                    self.reader.read_exact(&mut b).expect("bulk");
                }
            }
            Some(b'-') => panic!("redis answered {l}"),
            _ => {}
        }
    }
}

/// `ratelimit serve` from `bin` on free ports (gRPC too when `grpc`), once
/// `/healthz` answers.
fn service(
    bin: &std::path::Path,
    redis: &RedisServer,
    grpc: bool,
    extra: &[&str],
) -> (ChildGuard, u16, Option<u16>) {
    let port = free_port();
    let grpc_port = grpc.then(free_port);
    let mut cmd = Command::new(bin);
    cmd.args(["serve", "--listen", &format!("127.0.0.1:{port}"), "--redis"])
        .arg(redis.url())
        .args(extra)
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    if let Some(g) = grpc_port {
        cmd.args(["--grpc-listen", &format!("127.0.0.1:{g}")]);
    }
    let child = ChildGuard::spawn(cmd, "ratelimit serve");
    let start = Instant::now();
    loop {
        if let Ok(s) = TcpStream::connect(("127.0.0.1", port)) {
            drop(s);
            let mut c = Http::connect(port);
            let body = json!({"key": "warm", "limit": {"rate": "100/s"}}).to_string();
            if c.post("/v1/acquire", &body) == 200 {
                break;
            }
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "ratelimit serve did not answer within 10 s"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    (child, port, grpc_port)
}

fn http_run(port: u16, clients: usize, secs: Duration, bodies: &[String]) -> Run {
    http_run_at(port, clients, secs, None, bodies)
}

/// [`http_run`], each client sending once every `pace` when one is given.
fn http_run_at(
    port: u16,
    clients: usize,
    secs: Duration,
    pace: Option<Duration>,
    bodies: &[String],
) -> Run {
    load_at(
        clients,
        secs,
        pace,
        |_| Http::connect(port),
        |c, i| {
            let status = c.post("/v1/acquire", &bodies[i % bodies.len()]);
            assert_eq!(status, 200, "acquire answered {status}");
        },
    )
}

/// [`http_run`] at `per_sec` requests a second in all, spread evenly over
/// the clients.
fn paced_http_run(
    port: u16,
    clients: usize,
    secs: Duration,
    per_sec: f64,
    bodies: &[String],
) -> Run {
    let pace = Duration::from_secs_f64(clients as f64 / per_sec);
    http_run_at(port, clients, secs, Some(pace), bodies)
}

fn grpc_run(port: u16, clients: usize, secs: Duration) -> Run {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("runtime");
    let rt = Arc::new(rt);
    load(
        clients,
        secs,
        |_| {
            rt.block_on(RateLimitServiceClient::connect(format!(
                "http://127.0.0.1:{port}"
            )))
            .expect("gRPC connect")
        },
        |c, i| {
            let req = RateLimitRequest {
                domain: "bench".into(),
                descriptors: vec![RateLimitDescriptor {
                    entries: vec![Entry {
                        key: "key".into(),
                        value: format!("{}", i % KEYS),
                    }],
                    limit: Some(RateLimitOverride {
                        requests_per_unit: 100,
                        unit: 1,
                    }),
                    ..Default::default()
                }],
                hits_addend: 1,
            };
            rt.block_on(c.should_rate_limit(req))
                .expect("ShouldRateLimit");
        },
    )
}

fn raw_run(redis: &RedisServer, sha: &str, clients: usize, secs: Duration) -> Run {
    load(
        clients,
        secs,
        |_| Raw::connect(redis.port),
        |c, i| {
            let key = format!("raw:{{bench:{}}}", i % KEYS);
            c.command(&[
                "EVALSHA", sha, "1", &key, "partial", "gcra", "1", "10000", "20", "1", "0",
            ]);
        },
    )
}

pub(crate) fn serve_load(opts: &Opts, report: &mut Report) {
    let secs = Duration::from_millis(if opts.quick { 600 } else { 4000 });
    let before = std::env::var_os("RATELIMIT_BEFORE").map(std::path::PathBuf::from);
    report.section(
        "Throttling service: throughput",
        &format!(
            "One `redis-server` (persistence off) and `ratelimit serve` on localhost; 1, 8 and 32 clients, each \
             on a keep-alive connection of its own, send acquires one after another for {:.1} s over {KEYS} keys \
             (gcra 100/s burst 20: allowed and denied both occur). The floor, in the same run: as many raw \
             clients of Redis sending `EVALSHA` of the decision script (limit.lua, one key a call) on \
             connections of their own. gRPC: `ShouldRateLimit` with one descriptor, through tonic's client. \
             {}",
            secs.as_secs_f64(),
            if before.is_some() {
                "\"before\" is the service built from main, run the same way against the same Redis."
            } else {
                "(Set RATELIMIT_BEFORE to another build's binary to measure it beside.)"
            }
        ),
    );
    let redis = RedisServer::start();
    let mut raw = Raw::connect(redis.port);
    let script = ratelimit_redis::LIMIT_SCRIPT;
    let load_cmd = format!(
        "*3\r\n$6\r\nSCRIPT\r\n$4\r\nLOAD\r\n${}\r\n{script}\r\n",
        script.len()
    );
    raw.writer
        .write_all(load_cmd.as_bytes())
        .expect("SCRIPT LOAD");
    let _len = raw.read_line();
    let sha = raw.read_line();
    assert_eq!(sha.len(), 40, "SCRIPT LOAD answered {sha:?}");

    let bin = ratelimit_tests::ratelimit_bin();
    let (svc, port, grpc_port) = service(&bin, &redis, true, &[]);
    // `ratelimit serve` became `ratelimit-serve`: the same process.
    let svc_pid = u32::try_from(svc.pid()).expect("a pid");
    let old = before.as_ref().map(|b| service(b, &redis, false, &[]));
    let bodies: Vec<String> = (0..KEYS)
        .map(|i| {
            json!({"key": format!("bench:{i}"), "amount": 1, "limit": {"rate": "100/s", "burst": 20}})
                .to_string()
        })
        .collect();
    // The same acquires from a caller that never refills (`"grant": false`):
    // Redis keeps no grant record, so it does per key what raw EVALSHA does.
    let bare: Vec<String> = (0..KEYS)
        .map(|i| {
            json!({"key": format!("bench:{i}"), "amount": 1, "grant": false, "limit": {"rate": "100/s", "burst": 20}})
                .to_string()
        })
        .collect();
    let _ = writeln!(
        report.md,
        "| clients | raw EVALSHA req/s (p50, p99 ms) | HTTP req/s (p50, p99 ms) | HTTP ÷ raw | HTTP, no grant (÷ raw) | gRPC req/s (p50, p99 ms) | gRPC ÷ raw |{}\n|---|---|---|---|---|---|---|{}",
        if old.is_some() {
            " before: HTTP req/s (p50, p99 ms) | before ÷ raw |"
        } else {
            ""
        },
        if old.is_some() { "---|---|" } else { "" },
    );
    let mut rows = Vec::new();
    for clients in CLIENTS {
        // Each measured beside the floor right before and after it.
        let raw1 = raw_run(&redis, &sha, clients, secs);
        let http = http_run(port, clients, secs, &bodies);
        let no_grant = http_run(port, clients, secs, &bare);
        let grpc = grpc_run(grpc_port.expect("gRPC port"), clients, secs);
        let was = old
            .as_ref()
            .map(|(_, p, _)| http_run(*p, clients, secs, &bodies));
        let raw2 = raw_run(&redis, &sha, clients, secs);
        let floor = Run {
            per_sec: (raw1.per_sec + raw2.per_sec) / 2.0,
            p50_ms: (raw1.p50_ms + raw2.p50_ms) / 2.0,
            p99_ms: (raw1.p99_ms + raw2.p99_ms) / 2.0,
            n: raw1.n + raw2.n,
        };
        let cell = |r: &Run| format!("{:.0} ({:.2}, {:.2})", r.per_sec, r.p50_ms, r.p99_ms);
        let ratio = |r: &Run| r.per_sec / floor.per_sec;
        let _ = writeln!(
            report.md,
            "| {clients} | {} | {} | **{:.0} %** | {:.0} ({:.0} %) | {} | {:.0} % |{}",
            cell(&floor),
            cell(&http),
            ratio(&http) * 100.0,
            no_grant.per_sec,
            ratio(&no_grant) * 100.0,
            cell(&grpc),
            ratio(&grpc) * 100.0,
            was.as_ref().map_or(String::new(), |w| format!(
                " {} | {:.0} % |",
                cell(w),
                ratio(w) * 100.0
            )),
        );
        println!(
            "serve load, {clients} clients: raw EVALSHA {:.0}/s, HTTP {:.0}/s ({:.0} %), no grant {:.0}/s ({:.0} %), gRPC {:.0}/s ({:.0} %){}",
            floor.per_sec,
            http.per_sec,
            ratio(&http) * 100.0,
            no_grant.per_sec,
            ratio(&no_grant) * 100.0,
            grpc.per_sec,
            ratio(&grpc) * 100.0,
            was.as_ref().map_or(String::new(), |w| format!(
                "; before: HTTP {:.0}/s ({:.0} %)",
                w.per_sec,
                ratio(w) * 100.0
            ))
        );
        rows.push(json!({
            "clients": clients,
            "raw_evalsha": {"per_sec": floor.per_sec, "p50_ms": floor.p50_ms, "p99_ms": floor.p99_ms},
            "http": {"per_sec": http.per_sec, "p50_ms": http.p50_ms, "p99_ms": http.p99_ms, "of_raw": ratio(&http)},
            "http_no_grant": {"per_sec": no_grant.per_sec, "p50_ms": no_grant.p50_ms, "p99_ms": no_grant.p99_ms, "of_raw": ratio(&no_grant)},
            "grpc": {"per_sec": grpc.per_sec, "p50_ms": grpc.p50_ms, "p99_ms": grpc.p99_ms, "of_raw": ratio(&grpc)},
            "before_http": was.as_ref().map(|w| json!({"per_sec": w.per_sec, "p50_ms": w.p50_ms, "p99_ms": w.p99_ms, "of_raw": ratio(w)})),
        }));
    }
    let _ = writeln!(
        report.md,
        "\nTarget: HTTP ≥ 80 % of raw EVALSHA at 8 and 32 clients.\n"
    );
    report.json.insert("serve_load".into(), json!(rows));
    beside_minimal(&redis, svc_pid, port, secs, &bodies, &bare, report);
    leased_hot_key(&redis, &bin, secs, report);
}

/// A server's config for [`leased_hot_key`]: one hot key's limit leased 50
/// at a time, the same leased 200 at a time, and the same without a lease;
/// callers need no token.
const LEASE_CONFIG: &str = r#"
[[tenant]]
name = "bench"
anonymous = true
inline-limits = true

[[domain]]
name = "bench"
tenants = ["bench"]

[[domain.limit]]
name = "hot"
descriptor = [{ key = "route" }]
rate = "1000000/s"
burst = 100000
lease = 50

[[domain.limit]]
name = "hot-200"
descriptor = [{ key = "host" }]
rate = "1000000/s"
burst = 100000
lease = 200

[[domain.limit]]
name = "hot-unleased"
descriptor = [{ key = "path" }]
rate = "1000000/s"
burst = 100000
"#;

/// How long [`leased_hot_key`] asks before it measures: a key is leased
/// once asked for a lease's worth within a second.
const WARM_UP: Duration = Duration::from_millis(300);

/// The rate of [`leased_hot_key`]'s paced runs, requests a second in all:
/// below what the echo and the leased service each answer with one client.
const PACED: f64 = 4000.0;

/// One hot key decided with and without a lease (`lease = 50` and `200`,
/// issue 37's item 6), beside a minimal axum echo: per decision, the
/// service's CPU, Redis's script calls and Redis's CPU, and the latency,
/// with clients as fast as they go and at [`PACED`] requests a second. Its
/// limit is far above what the clients ask, so every decision is allowed.
fn leased_hot_key(redis: &RedisServer, bin: &std::path::Path, secs: Duration, report: &mut Report) {
    let dir = ratelimit_tests::TempDir::new("bench-lease");
    let config = dir.0.join("serve.toml");
    std::fs::write(&config, LEASE_CONFIG).expect("writing the lease config");
    let config = config.display().to_string();
    let (svc, port, _) = service(bin, redis, false, &["--config", &config]);
    let pid = u32::try_from(svc.pid()).expect("a pid");
    let (echo, echo_port) = minimal("echo", redis);
    let echo_pid = u32::try_from(echo.pid()).expect("a pid");
    let ask = |limit: &str| vec![json!({"limit": limit, "key": "k", "grant": false}).to_string()];
    let (leased, leased_200, unleased) = (ask("hot"), ask("hot-200"), ask("hot-unleased"));
    let _ = writeln!(
        report.md,
        "\nOne hot key (a config limit of 1 000 000/s, burst 100 000: every acquire allowed), \
         asked with `\"grant\": false` by every client, decided in Redis and from leases of 50 \
         (`lease = 50`) and of 200; beside a minimal axum echo. Each run follows 0.3 s of the same \
         asks, so the key is hot when it starts. Clients as fast as they go; per decision: the \
         process's CPU, Redis's script calls (`EVALSHA`) and Redis's CPU. In Redis, the service \
         already puts the acquires that meet in one call (\"calls/req\" below 1).\n\n\
         | clients | echo: req/s (p50, p99 ms), CPU µs/req | hot key in Redis: req/s (p50, p99 ms), CPU µs/req, Redis calls/req, Redis µs/req | leased 50: same | decisions per Redis call, leased 50 | Redis CPU per decision, leased 50 ÷ in Redis | leased 50 p99 − echo p99, ms | leased 200: decisions per Redis call, Redis CPU ÷ in Redis |\n\
         |---|---|---|---|---:|---:|---:|---:|"
    );
    let mut rows = Vec::new();
    let mut paced = Vec::new();
    for clients in CLIENTS {
        let with_calls = |pid: u32, bodies: &[String], port: u16| {
            // Warmed up first: the key is hot, as the targets are for.
            http_run(port, clients, WARM_UP, bodies);
            let c0 = redis.script_calls();
            let (r, c) = costed(pid, redis, || http_run(port, clients, secs, bodies));
            let calls = (redis.script_calls() - c0) as f64 / r.n.max(1) as f64;
            (r, c, calls)
        };
        let (e, ec, _) = with_calls(echo_pid, &leased, echo_port);
        let (u, uc, ucalls) = with_calls(pid, &unleased, port);
        let (l, lc, lcalls) = with_calls(pid, &leased, port);
        let (_, lc2, lcalls2) = with_calls(pid, &leased_200, port);
        let cell = |r: &Run, c: &Cost, calls: f64| {
            format!(
                "{:.0} ({:.2}, {:.2}), {:.1} µs, {calls:.3}, {:.2} µs",
                r.per_sec, r.p50_ms, r.p99_ms, c.cpu_us, c.redis_cpu_us
            )
        };
        let per_call = 1.0 / lcalls.max(1e-9);
        let redis_share = lc.redis_cpu_us / uc.redis_cpu_us.max(1e-9);
        let (per_call_200, redis_share_200) = (
            1.0 / lcalls2.max(1e-9),
            lc2.redis_cpu_us / uc.redis_cpu_us.max(1e-9),
        );
        let p99_over = l.p99_ms - e.p99_ms;
        let _ = writeln!(
            report.md,
            "| {clients} | {:.0} ({:.2}, {:.2}), {:.1} µs | {} | {} | **{per_call:.0}** | **{redis_share:.3}** | **{p99_over:+.2}** | {per_call_200:.0}, **{redis_share_200:.3}** |",
            e.per_sec,
            e.p50_ms,
            e.p99_ms,
            ec.cpu_us,
            cell(&u, &uc, ucalls),
            cell(&l, &lc, lcalls),
        );
        println!(
            "serve leased hot key, {clients} clients: {per_call:.0} decisions per Redis call, Redis CPU/decision {redis_share:.3}× unleased (lease 200: {per_call_200:.0}, {redis_share_200:.3}×), p99 {:.2} ms (echo {:.2} ms), service {:.1} µs/req (unleased {:.1})",
            l.p99_ms, e.p99_ms, lc.cpu_us, uc.cpu_us
        );
        let j = |r: &Run, c: &Cost, calls: f64| json!({"per_sec": r.per_sec, "p50_ms": r.p50_ms, "p99_ms": r.p99_ms, "cpu_us_per_req": c.cpu_us, "redis_calls_per_req": calls, "redis_cpu_us_per_req": c.redis_cpu_us});
        rows.push(json!({
            "clients": clients,
            "echo": j(&e, &ec, 0.0),
            "unleased": j(&u, &uc, ucalls),
            "leased": j(&l, &lc, lcalls),
            "decisions_per_redis_call": per_call,
            "redis_cpu_leased_over_unleased": redis_share,
            "leased_p99_over_echo_ms": p99_over,
            "lease_200": {"decisions_per_redis_call": per_call_200, "redis_cpu_leased_over_unleased": redis_share_200, "redis_cpu_us_per_req": lc2.redis_cpu_us},
        }));
        // The same asks at a rate both answer with room to spare.
        let at = |bodies: &[String], port: u16| {
            paced_http_run(port, clients, WARM_UP, PACED, bodies);
            paced_http_run(port, clients, secs, PACED, bodies)
        };
        let (pe, pl, pl2) = (
            at(&leased, echo_port),
            at(&leased, port),
            at(&leased_200, port),
        );
        paced.push((clients, pe, pl, pl2));
    }
    let _ = writeln!(
        report.md,
        "\nThe same, paced: {PACED:.0} requests a second in all, spread evenly over the clients \
         (each latency from its send), so that neither server has a queue.\n\n\
         | clients | echo: req/s (p50, p99 ms) | leased 50: req/s (p50, p99 ms) | leased 50 p99 − echo p99, ms | leased 200: req/s (p50, p99 ms) | leased 200 p99 − echo p99, ms |\n\
         |---|---|---|---:|---|---:|"
    );
    let mut paced_json = Vec::new();
    for (clients, e, l, l2) in &paced {
        let (over, over2) = (l.p99_ms - e.p99_ms, l2.p99_ms - e.p99_ms);
        let _ = writeln!(
            report.md,
            "| {clients} | {:.0} ({:.2}, {:.2}) | {:.0} ({:.2}, {:.2}) | **{over:+.2}** | {:.0} ({:.2}, {:.2}) | **{over2:+.2}** |",
            e.per_sec,
            e.p50_ms,
            e.p99_ms,
            l.per_sec,
            l.p50_ms,
            l.p99_ms,
            l2.per_sec,
            l2.p50_ms,
            l2.p99_ms
        );
        println!(
            "serve leased hot key paced at {PACED:.0}/s, {clients} clients: p99 {:.2} ms, lease 200 {:.2} ms (echo {:.2} ms); p50 {:.2} ms (echo {:.2} ms)",
            l.p99_ms, l2.p99_ms, e.p99_ms, l.p50_ms, e.p50_ms
        );
        let j = |r: &Run| json!({"p50_ms": r.p50_ms, "p99_ms": r.p99_ms, "per_sec": r.per_sec});
        paced_json.push(json!({"clients": clients, "per_sec": PACED,
            "echo": j(e), "leased": j(l), "lease_200": j(l2),
            "leased_p99_over_echo_ms": over, "lease_200_p99_over_echo_ms": over2}));
    }
    let _ = writeln!(
        report.md,
        "\nTargets (issue 37, item 6): leased, at least 50 decisions per Redis call and Redis's CPU per \
         decision at most 1/20 of the key's in Redis; a leased decision's p99 within 0.1 ms of the \
         echo's.\n"
    );
    report
        .json
        .insert("serve_leased_hot_key".into(), json!(rows));
    report
        .json
        .insert("serve_leased_hot_key_paced".into(), json!(paced_json));
}

/// The service beside the two minimal ones ([`crate::minimal`]), per
/// request: the CPU of each process (all its threads), and Redis's commands
/// and CPU. What the issue holds the service to: its own CPU per request
/// without grants at most 1.3× the axum + redis-rs service's.
fn beside_minimal(
    redis: &RedisServer,
    svc_pid: u32,
    port: u16,
    secs: Duration,
    bodies: &[String],
    bare: &[String],
    report: &mut Report,
) {
    let (echo, echo_port) = minimal("echo", redis);
    let (evalsha, evalsha_port) = minimal("evalsha", redis);
    let echo_pid = u32::try_from(echo.pid()).expect("a pid");
    let evalsha_pid = u32::try_from(evalsha.pid()).expect("a pid");
    let _ = writeln!(
        report.md,
        "\nBeside two minimal services on axum, each a process of its own with as many worker threads \
         as the service (half the CPUs): **echo** answers every acquire with a fixed body; **axum + \
         redis-rs** parses the body and sends one `EVALSHA` of the same script per request (a \
         `ConnectionManager`, no grant, no bounds). Per request: the process's CPU (every thread's, \
         from `/proc/PID/task/*/schedstat`), Redis's commands (`INFO commandstats`, those run by \
         scripts included) and Redis's CPU (`INFO cpu`). The service without grants (`\"grant\": \
         false`) does per key what the minimal one does; with grants it also writes the grant's \
         record.\n\n\
         | clients | echo: req/s (p50, p99 ms), CPU µs/req | axum + redis-rs: req/s (p50, p99 ms), CPU µs/req, Redis cmds/req, Redis µs/req | serve, no grant: same | serve ÷ axum + redis-rs, CPU/req | serve, grants: same |\n\
         |---|---|---|---|---:|---|"
    );
    let mut rows = Vec::new();
    for clients in CLIENTS {
        let (e, ec) = costed(echo_pid, redis, || {
            http_run(echo_port, clients, secs, bodies)
        });
        let (m, mc) = costed(evalsha_pid, redis, || {
            http_run(evalsha_port, clients, secs, bodies)
        });
        let (b, bc) = costed(svc_pid, redis, || http_run(port, clients, secs, bare));
        let (g, gc) = costed(svc_pid, redis, || http_run(port, clients, secs, bodies));
        let full = |r: &Run, c: &Cost| {
            format!(
                "{:.0} ({:.2}, {:.2}), {:.1} µs, {:.2} cmds, {:.1} µs",
                r.per_sec, r.p50_ms, r.p99_ms, c.cpu_us, c.redis_calls, c.redis_cpu_us
            )
        };
        let over = bc.cpu_us / mc.cpu_us;
        let _ = writeln!(
            report.md,
            "| {clients} | {:.0} ({:.2}, {:.2}), {:.1} µs | {} | {} | **{over:.2}×** | {} |",
            e.per_sec,
            e.p50_ms,
            e.p99_ms,
            ec.cpu_us,
            full(&m, &mc),
            full(&b, &bc),
            full(&g, &gc),
        );
        println!(
            "serve beside minimal, {clients} clients: echo {:.1} µs/req; axum + redis-rs {:.1} µs/req; serve no grant {:.1} µs/req ({over:.2}×), grants {:.1} µs/req",
            ec.cpu_us, mc.cpu_us, bc.cpu_us, gc.cpu_us
        );
        let cell = |r: &Run, c: &Cost| json!({"per_sec": r.per_sec, "p50_ms": r.p50_ms, "p99_ms": r.p99_ms, "cpu_us_per_req": c.cpu_us, "redis_cmds_per_req": c.redis_calls, "redis_cpu_us_per_req": c.redis_cpu_us});
        rows.push(json!({
            "clients": clients,
            "echo": cell(&e, &ec),
            "axum_redis_rs": cell(&m, &mc),
            "serve_no_grant": cell(&b, &bc),
            "serve_grants": cell(&g, &gc),
            "serve_cpu_over_minimal": over,
        }));
    }
    let _ = writeln!(
        report.md,
        "\nTarget: the service's CPU per request without grants ≤ 1.3× the axum + redis-rs service's.\n"
    );
    report
        .json
        .insert("serve_beside_minimal".into(), json!(rows));
}
