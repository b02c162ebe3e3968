//! A Local API of the tests' own, for what the real one cannot be made to
//! say: thousands of origins, origin names that collide once sanitised,
//! durations no Go program prints, the whole set re-sent as new at every
//! pull. It answers `GET /v1/decisions/stream` on the loopback of a
//! namespace with the bodies it was given (one for `startup=true`, one for
//! the pulls after it) and counts the pulls; anything else gets a 404.
//! Stopped on drop.
//!
//! Where the real Local API can say it (bans of a range, of the host's own
//! address, deletions), the tests use the real one (`crate::crowdsec`).

use std::{
    io::{Read as _, Write as _},
    net::{TcpListener, TcpStream},
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    thread::JoinHandle,
    time::{Duration, Instant},
};

use crate::{TempDir, net::NetNs};

/// Its port inside the namespace.
pub const PORT: u16 = 8081;

/// The answers it gives.
#[derive(Default)]
struct Bodies {
    startup: Arc<Vec<u8>>,
    delta: Arc<Vec<u8>>,
}

/// A fake Local API in a namespace, stopped on drop.
pub struct Feed {
    bodies: Arc<Mutex<Bodies>>,
    pulls: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
    dir: TempDir,
}

/// One decision of a stream, as the Local API writes it.
pub fn decision(id: u64, origin: &str, scope: &str, value: &str, duration: &str) -> String {
    serde_json::json!({
        "id": id,
        "origin": origin,
        "scenario": "test/feed",
        "scope": scope,
        "type": "ban",
        "value": value,
        "duration": duration,
    })
    .to_string()
}

/// A stream's body: `new` decisions (each from [`decision`]) and deleted ids.
pub fn stream(new: &[String], deleted: &[u64]) -> Vec<u8> {
    let mut s = String::with_capacity(new.iter().map(|d| d.len() + 1).sum::<usize>() + 64);
    s.push_str("{\"new\":[");
    s.push_str(&new.join(","));
    s.push_str("],\"deleted\":[");
    let del: Vec<String> = deleted
        .iter()
        .map(|id| {
            format!(
                "{{\"id\":{id},\"origin\":\"x\",\"scope\":\"Ip\",\"type\":\"ban\",\"value\":\"198.18.0.1\",\"duration\":\"-1s\"}}"
            )
        })
        .collect();
    s.push_str(&del.join(","));
    s.push_str("]}");
    s.into_bytes()
}

impl Feed {
    /// Starts one on `ns`'s loopback, answering empty streams.
    pub fn start(ns: &NetNs) -> Self {
        let bodies = Arc::new(Mutex::new(Bodies {
            startup: Arc::new(stream(&[], &[])),
            delta: Arc::new(stream(&[], &[])),
        }));
        let pulls = Arc::new(AtomicU64::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let thread = {
            let (bodies, pulls, stop) = (bodies.clone(), pulls.clone(), stop.clone());
            let ns = NetNs {
                name: ns.name.clone(),
            };
            std::thread::spawn(move || {
                ns.enter();
                // Not ours to delete: the caller's namespace.
                std::mem::forget(ns);
                let listener =
                    TcpListener::bind(("127.0.0.1", PORT)).expect("binding the fake Local API");
                listener.set_nonblocking(true).expect("nonblocking");
                ready_tx.send(()).expect("ready");
                while !stop.load(Ordering::Relaxed) {
                    match listener.accept() {
                        Ok((conn, _)) => answer(conn, &bodies, &pulls),
                        Err(_) => std::thread::sleep(Duration::from_millis(20)),
                    }
                }
            })
        };
        ready_rx
            .recv_timeout(Duration::from_secs(10))
            .expect("the fake Local API did not start");
        let dir = TempDir::new("feed");
        std::fs::write(
            dir.0.join("bouncer.key"),
            format!("{}\n", crate::crowdsec::KEY),
        )
        .expect("writing the key");
        Self {
            bodies,
            pulls,
            stop,
            thread: Some(thread),
            dir,
        }
    }

    /// Answers `startup` to `startup=true` pulls and `delta` to the others.
    pub fn set(&self, startup: Vec<u8>, delta: Vec<u8>) {
        let mut b = self.bodies.lock().expect("bodies");
        b.startup = Arc::new(startup);
        b.delta = Arc::new(delta);
    }

    /// Pulls answered so far.
    pub fn pulls(&self) -> u64 {
        self.pulls.load(Ordering::Relaxed)
    }

    /// Waits until `n` more pulls were answered (panics after `within`).
    pub fn wait_pulls(&self, n: u64, within: Duration) {
        let want = self.pulls() + n;
        let t0 = Instant::now();
        while self.pulls() < want {
            assert!(
                t0.elapsed() < within,
                "the daemon pulled {} times in {within:?}, not {want}",
                self.pulls()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// `run`'s options to follow it, pulling every `every`.
    pub fn run_args(&self, every: &str) -> Vec<String> {
        vec![
            "--crowdsec".into(),
            format!("http://127.0.0.1:{PORT}"),
            "--crowdsec-key-file".into(),
            self.dir.0.join("bouncer.key").display().to_string(),
            "--crowdsec-every".into(),
            every.into(),
        ]
    }
}

/// Reads one request from `conn` and answers it (the connection closed
/// after).
fn answer(mut conn: TcpStream, bodies: &Mutex<Bodies>, pulls: &AtomicU64) {
    let _ = conn.set_nonblocking(false);
    let _ = conn.set_read_timeout(Some(Duration::from_secs(5)));
    let _ = conn.set_write_timeout(Some(Duration::from_secs(30)));
    let mut head = Vec::new();
    let mut buf = [0u8; 4096];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < 65536 {
        match conn.read(&mut buf) {
            Ok(0) | Err(_) => return,
            Ok(n) => head.extend_from_slice(&buf[..n]),
        }
    }
    let head = String::from_utf8_lossy(&head);
    let line = head.lines().next().unwrap_or("");
    let keyed = head.lines().any(|l| {
        l.to_ascii_lowercase().starts_with("x-api-key:") && l.contains(crate::crowdsec::KEY)
    });
    let (status, body) = if !line.starts_with("GET ") || !line.contains("/v1/decisions/stream") {
        ("404 Not Found", Arc::new(b"{}".to_vec()))
    } else if !keyed {
        (
            "403 Forbidden",
            Arc::new(b"{\"message\":\"access forbidden\"}".to_vec()),
        )
    } else {
        let b = bodies.lock().expect("bodies");
        let body = if line.contains("startup=true") {
            b.startup.clone()
        } else {
            b.delta.clone()
        };
        ("200 OK", body)
    };
    let head = format!(
        "HTTP/1.1 {status}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
        body.len()
    );
    if conn.write_all(head.as_bytes()).is_ok()
        && conn.write_all(&body).is_ok()
        && status.starts_with("200")
    {
        pulls.fetch_add(1, Ordering::Relaxed);
    }
}

impl Drop for Feed {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
