//! `ratelimit serve` for the tests: started against a test's Redis on a free
//! loopback port, its log in a file, killed on drop; and a plain HTTP/1.1
//! client that shows what a client sees (status, headers, body).

use std::{
    io::{Read, Write},
    net::{TcpListener, TcpStream},
    path::PathBuf,
    process::{Command, Stdio},
    thread::sleep,
    time::{Duration, Instant},
};

use serde_json::Value;

use crate::{ChildGuard, TempDir, ratelimit_bin, redis::RedisServer};

/// A running `ratelimit serve`.
pub struct Service {
    child: ChildGuard,
    /// Its port on 127.0.0.1.
    pub port: u16,
    log: PathBuf,
    _dir: TempDir,
}

/// A free port on 127.0.0.1.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("free port")
        .port()
}

impl Service {
    /// `ratelimit serve --listen 127.0.0.1:PORT --redis URL ARGS`, once its
    /// `/healthz` answers 200.
    pub fn start(redis: &RedisServer, args: &[&str]) -> Self {
        Self::start_under(&[], redis, args)
    }

    /// The same, run by `wrapper` (e.g. `prlimit --nofile=1024:1024 --`).
    pub fn start_under(wrapper: &[&str], redis: &RedisServer, args: &[&str]) -> Self {
        let port = free_port();
        let dir = TempDir::new("serve");
        let log = dir.0.join("serve.log");
        let file = std::fs::File::create(&log).expect("creating the service's log");
        let mut cmd = match wrapper.split_first() {
            Some((program, rest)) => {
                let mut c = Command::new(program);
                c.args(rest).arg(ratelimit_bin());
                c
            }
            None => Command::new(ratelimit_bin()),
        };
        cmd.args(["serve", "--listen", &format!("127.0.0.1:{port}"), "--redis"])
            .arg(redis.url())
            .args(args)
            .stdin(Stdio::null())
            .stdout(file.try_clone().expect("log fd"))
            .stderr(file);
        let mut child = ChildGuard::spawn(cmd, "ratelimit serve");
        let start = Instant::now();
        while !matches!(http(port, "GET", "/healthz", ""), Ok((200, _))) {
            if let Some(status) = child.exited() {
                panic!(
                    "ratelimit serve exited ({status}): {}",
                    std::fs::read_to_string(&log).unwrap_or_default()
                );
            }
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "ratelimit serve did not answer /healthz within 10 s: {}",
                std::fs::read_to_string(&log).unwrap_or_default()
            );
            sleep(Duration::from_millis(50));
        }
        Self {
            child,
            port,
            log,
            _dir: dir,
        }
    }

    /// What it logged so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Its process id.
    pub fn pid(&self) -> i32 {
        self.child.pid()
    }

    /// `POST path` with a JSON body: (status, JSON answer).
    pub fn post(&self, path: &str, body: Value) -> (u16, Value) {
        post(self.port, path, body)
    }

    /// `GET /metrics`, the value of the sample `name` (with its labels, as
    /// written), if there is one.
    pub fn metric(&self, name: &str) -> Option<f64> {
        let (status, text) = http(self.port, "GET", "/metrics", "").expect("GET /metrics");
        assert_eq!(status, 200, "GET /metrics: {text}");
        text.lines()
            .find(|l| l.split_whitespace().next() == Some(name))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse().ok())
    }
}

/// An answer as a client reads it.
#[derive(Debug)]
pub struct Answer {
    /// The status code.
    pub status: u16,
    /// The head (status line and headers).
    pub head: String,
    /// The body.
    pub body: String,
}

impl Answer {
    /// Parses a whole answer (head and body).
    pub fn parse(raw: &str) -> Self {
        let (head, body) = raw.split_once("\r\n\r\n").unwrap_or((raw, ""));
        Self {
            status: head
                .split_whitespace()
                .nth(1)
                .and_then(|c| c.parse().ok())
                .unwrap_or(0),
            head: head.to_string(),
            body: body.to_string(),
        }
    }

    /// The body as JSON; panics with the answer if it is not.
    pub fn json(&self) -> Value {
        serde_json::from_str(&self.body)
            .unwrap_or_else(|e| panic!("not a JSON answer ({e}): {self:?}"))
    }

    /// A header's value (name in any case).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.head.lines().find_map(|l| {
            let (n, v) = l.split_once(':')?;
            n.eq_ignore_ascii_case(name).then(|| v.trim())
        })
    }
}

/// Sends `raw` on a new connection and reads the answer to its end (the
/// request must ask `Connection: close`), for at most 5 s.
pub fn exchange(port: u16, raw: &[u8]) -> std::io::Result<Answer> {
    let mut s = TcpStream::connect(("127.0.0.1", port))?;
    s.set_read_timeout(Some(Duration::from_secs(5)))?;
    s.write_all(raw)?;
    let mut out = Vec::new();
    s.read_to_end(&mut out)?;
    Ok(Answer::parse(&String::from_utf8_lossy(&out)))
}

/// One HTTP/1.1 request; (status, body).
pub fn http(port: u16, method: &str, path: &str, body: &str) -> std::io::Result<(u16, String)> {
    let a = exchange(port, request(method, path, body).as_bytes())?;
    Ok((a.status, a.body))
}

/// The text of a request with `body` and `Connection: close`.
pub fn request(method: &str, path: &str, body: &str) -> String {
    format!(
        "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
}

/// `POST path` with a JSON body: (status, JSON answer).
pub fn post(port: u16, path: &str, body: Value) -> (u16, Value) {
    let (status, text) = http(port, "POST", path, &body.to_string()).expect("http");
    (
        status,
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("{status} {text:?}: {e}")),
    )
}
