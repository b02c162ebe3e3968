//! `ratelimit serve` for the tests: started against a test's Redis on a free
//! loopback port (with a config, gRPC and TLS when asked), its log in a file,
//! killed on drop; and a plain HTTP/1.1 client that shows what a client sees
//! (status, headers, body), over TLS too.

use std::{
    io::{ErrorKind, Read, Write},
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
    /// Its gRPC port, when asked for.
    pub grpc_port: Option<u16>,
    log: PathBuf,
    dir: TempDir,
}

/// How to start a service beyond its Redis.
#[derive(Default)]
pub struct Setup<'a> {
    /// The text of its `--config` file (written into its directory).
    pub config: Option<&'a str>,
    /// Serve gRPC too, on a free port.
    pub grpc: bool,
    /// `--tls-cert` and `--tls-key` (PEM text, written into its directory).
    pub tls: Option<(&'a str, &'a str)>,
    /// More arguments.
    pub args: &'a [&'a str],
    /// The command it runs under (e.g. `prlimit --nofile=1024:1024 --`).
    pub wrapper: &'a [&'a str],
    /// The binary to run instead of [`ratelimit_bin`] (a copy another user
    /// may execute).
    pub program: Option<&'a std::path::Path>,
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
        Self::launch(
            wrapper,
            &redis.url(),
            &Setup {
                args,
                ..Setup::default()
            },
        )
    }

    /// `ratelimit serve` against the Redis (or Cluster) at `url`, as `setup`
    /// says, once it serves.
    pub fn start_with(url: &str, setup: &Setup) -> Self {
        Self::launch(setup.wrapper, url, setup)
    }

    fn launch(wrapper: &[&str], url: &str, setup: &Setup) -> Self {
        let args = setup.args;
        let port = free_port();
        let dir = TempDir::new("serve");
        let mut extra: Vec<String> = Vec::new();
        if let Some(text) = setup.config {
            let path = dir.0.join("serve.toml");
            std::fs::write(&path, text).expect("writing the service's config");
            extra.extend(["--config".into(), path.display().to_string()]);
        }
        let grpc_port = setup.grpc.then(free_port);
        if let Some(g) = grpc_port {
            extra.extend(["--grpc-listen".into(), format!("127.0.0.1:{g}")]);
        }
        if let Some((cert, key)) = setup.tls {
            let (c, k) = (dir.0.join("cert.pem"), dir.0.join("key.pem"));
            std::fs::write(&c, cert).expect("writing the certificate");
            std::fs::write(&k, key).expect("writing the key");
            extra.extend([
                "--tls-cert".into(),
                c.display().to_string(),
                "--tls-key".into(),
                k.display().to_string(),
            ]);
        }
        let log = dir.0.join("serve.log");
        let file = std::fs::File::create(&log).expect("creating the service's log");
        let bin = setup
            .program
            .map_or_else(ratelimit_bin, std::path::Path::to_path_buf);
        let mut cmd = match wrapper.split_first() {
            Some((program, rest)) => {
                let mut c = Command::new(program);
                c.args(rest).arg(&bin);
                c
            }
            None => Command::new(&bin),
        };
        // `ratelimit serve`, or the service's own binary as its unit runs it.
        if bin.file_name().is_none_or(|n| n != "ratelimit-serve") {
            cmd.arg("serve");
        }
        cmd.args(["--listen", &format!("127.0.0.1:{port}"), "--redis"])
            .arg(url)
            .args(&extra)
            .args(args)
            .stdin(Stdio::null())
            .stdout(file.try_clone().expect("log fd"))
            .stderr(file);
        let mut child = ChildGuard::spawn(cmd, "ratelimit serve");
        let start = Instant::now();
        let serving = || {
            if setup.tls.is_some() {
                // No plain HTTP to ask: its log says when it serves.
                std::fs::read_to_string(&log).is_ok_and(|l| l.contains("serving /v1/acquire"))
            } else {
                matches!(http(port, "GET", "/healthz", ""), Ok((200, _)))
            }
        };
        while !serving() {
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
            grpc_port,
            log,
            dir,
        }
    }

    /// Its own directory (its config, log and certificates are there).
    pub fn dir(&self) -> &std::path::Path {
        &self.dir.0
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

/// `POST path` with a JSON body and `Authorization: Bearer TOKEN` (none when
/// `None`): (status, JSON answer).
pub fn post_as(port: u16, token: Option<&str>, path: &str, body: Value) -> (u16, Value) {
    let body = body.to_string();
    let auth = token.map_or(String::new(), |t| format!("Authorization: Bearer {t}\r\n"));
    let raw = format!(
        "POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n{auth}Content-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    let a = exchange(port, raw.as_bytes()).expect("http");
    let v = serde_json::from_str(&a.body).unwrap_or_else(|e| panic!("{a:?}: {e}"));
    (a.status, v)
}

/// Sends `raw` over TLS (trusting only the CA `ca_pem`, for the name
/// `localhost`) and reads the answer to its end.
pub fn exchange_tls(port: u16, ca_pem: &str, raw: &[u8]) -> std::io::Result<Answer> {
    use rustls::pki_types::{CertificateDer, ServerName, pem::PemObject as _};
    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
        roots
            .add(c.map_err(std::io::Error::other)?)
            .map_err(std::io::Error::other)?;
    }
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(std::io::Error::other)?
        .with_root_certificates(roots)
        .with_no_client_auth();
    let name = ServerName::try_from("localhost").map_err(std::io::Error::other)?;
    let conn = rustls::ClientConnection::new(std::sync::Arc::new(config), name)
        .map_err(std::io::Error::other)?;
    let tcp = TcpStream::connect(("127.0.0.1", port))?;
    tcp.set_read_timeout(Some(Duration::from_secs(5)))?;
    let mut tls = rustls::StreamOwned::new(conn, tcp);
    tls.write_all(raw)?;
    let mut out = Vec::new();
    match tls.read_to_end(&mut out) {
        Ok(_) => {}
        // A server that closes without close_notify: what came is the answer.
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof && !out.is_empty() => {}
        Err(e) => return Err(e),
    }
    Ok(Answer::parse(&String::from_utf8_lossy(&out)))
}

/// A test CA and a certificate it signed for `localhost` and 127.0.0.1:
/// (CA PEM, certificate PEM, key PEM).
pub fn test_ca() -> (String, String, String) {
    use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair};
    let ca_key = KeyPair::generate().expect("CA key");
    let mut ca = CertificateParams::new(Vec::<String>::new()).expect("CA params");
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.distinguished_name
        .push(DnType::CommonName, "ratelimit test CA");
    let ca_cert = ca.self_signed(&ca_key).expect("CA certificate");
    let issuer = Issuer::new(ca, ca_key);
    let key = KeyPair::generate().expect("server key");
    let params = CertificateParams::new(vec!["localhost".to_string(), "127.0.0.1".to_string()])
        .expect("server params");
    let cert = params.signed_by(&key, &issuer).expect("server certificate");
    (ca_cert.pem(), cert.pem(), key.serialize_pem())
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

/// Waits for the server to close `s`: `Some(after)` if it did within `wait`
/// (EOF or a reset), `None` if it is still open. What it sent is kept in
/// `got`.
pub fn closed_within(s: &mut TcpStream, wait: Duration, got: &mut Vec<u8>) -> Option<Duration> {
    let start = Instant::now();
    let mut buf = [0u8; 4096];
    while start.elapsed() < wait {
        s.set_read_timeout(Some(Duration::from_millis(100)))
            .expect("read timeout");
        match s.read(&mut buf) {
            Ok(0) => return Some(start.elapsed()),
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
            Err(_) => return Some(start.elapsed()),
        }
    }
    None
}
