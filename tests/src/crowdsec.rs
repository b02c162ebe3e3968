//! A real CrowdSec Local API for the tests: Debian's `crowdsec` (installed by
//! `cargo xtask setup` when missing), run alone (`crowdsec -no-cs`: the API
//! without the log-reading agent) inside a test's network namespace on its
//! loopback, from a copy of `/etc/crowdsec/config.yaml` with its own port,
//! database and logs and without the online API; killed on drop. Decisions
//! are added and deleted with `cscli`, as an operator does.
//!
//! In the daemon's namespace, the Local API is where it is on a server: on
//! the loopback beside the daemon (`http://127.0.0.1:8080` by default).

use std::{
    path::{Path, PathBuf},
    process::{Command, Stdio},
    thread::sleep,
    time::{Duration, Instant},
};

use crate::{ChildGuard, TempDir, net::NetNs};

/// The Local API's port inside the namespace (a fresh namespace: free).
pub const PORT: u16 = 8080;

/// The bouncer key the tests register (32 hex digits, as cscli makes them).
pub const KEY: &str = "5eed5eed5eed5eed5eed5eed5eed5eed";

/// A Local API in a namespace, killed on drop (its [`ChildGuard`]).
pub struct Lapi {
    child: Option<ChildGuard>,
    /// Where its config, database, logs and the bouncer key are.
    pub dir: TempDir,
    /// The namespace it listens in.
    ns: String,
    /// Whether it speaks TLS (`https://`).
    tls: bool,
}

/// The config the package installed, edited: its own port, database, logs and
/// credentials; no online API; no Prometheus listener; in the foreground.
/// With `tls`, it serves `lapi.crt` and `lapi.key` of `dir` (and cscli, its
/// client, does not check them).
fn config(dir: &Path, tls: bool) -> String {
    let text = std::fs::read_to_string("/etc/crowdsec/config.yaml")
        .expect("reading /etc/crowdsec/config.yaml (Debian's crowdsec package)");
    let mut out = String::new();
    let mut skip_under: Option<usize> = None;
    for line in text.lines() {
        let indent = line.len() - line.trim_start().len();
        if let Some(at) = skip_under {
            if indent > at || line.trim().is_empty() {
                continue;
            }
            skip_under = None;
        }
        let key = line.trim_start().split(':').next().unwrap_or("");
        let set = |value: String| format!("{}{key}: {value}", &line[..indent]);
        let edited = match key {
            "online_client" => {
                skip_under = Some(indent);
                continue;
            }
            "daemonize" => set("false".into()),
            "log_dir" => set(format!("{}/", dir.display())),
            "db_path" => set(dir.join("crowdsec.db").display().to_string()),
            "credentials_path" => set(dir.join("local_api_credentials.yaml").display().to_string()),
            "listen_uri" if tls => {
                let pad = &line[..indent];
                format!(
                    "{pad}listen_uri: 127.0.0.1:{PORT}\n{pad}tls:\n{pad}  cert_file: {}\n{pad}  key_file: {}",
                    dir.join("lapi.crt").display(),
                    dir.join("lapi.key").display()
                )
            }
            "listen_uri" => set(format!("127.0.0.1:{PORT}")),
            "insecure_skip_verify" => set(tls.to_string()),
            "enabled" if indent > 0 => set("false".into()),
            _ => line.to_string(),
        };
        out.push_str(&edited);
        out.push('\n');
    }
    out
}

impl Lapi {
    /// Starts one in `ns` with an empty database, registers a machine (for
    /// cscli) and the bouncer [`KEY`], and waits until it answers.
    pub fn start(ns: &NetNs) -> Self {
        Self::start_with(ns, None)
    }

    /// [`Lapi::start`] serving `https://` with this certificate and key
    /// (PEM).
    pub fn start_tls(ns: &NetNs, cert: &str, key: &str) -> Self {
        Self::start_with(ns, Some((cert, key)))
    }

    fn start_with(ns: &NetNs, tls: Option<(&str, &str)>) -> Self {
        let dir = TempDir::new("lapi");
        if let Some((cert, key)) = tls {
            std::fs::write(dir.0.join("lapi.crt"), cert).expect("writing the certificate");
            std::fs::write(dir.0.join("lapi.key"), key).expect("writing the key");
        }
        std::fs::write(dir.0.join("config.yaml"), config(&dir.0, tls.is_some()))
            .expect("writing the config");
        let mut lapi = Self {
            child: None,
            dir,
            ns: ns.name.clone(),
            tls: tls.is_some(),
        };
        lapi.spawn();
        lapi.cscli_ok(&[
            "machines",
            "add",
            "-a",
            "-f",
            &lapi
                .dir
                .0
                .join("local_api_credentials.yaml")
                .display()
                .to_string(),
            "--url",
            &lapi.url(),
        ]);
        lapi.cscli_ok(&["bouncers", "add", "ratelimit", "-k", KEY]);
        std::fs::write(lapi.key_file(), format!("{KEY}\n")).expect("writing the key file");
        lapi
    }

    fn spawn(&mut self) {
        let mut cmd = Command::new("nsenter");
        cmd.arg(format!("--net=/run/netns/{}", self.ns))
            .arg("crowdsec")
            .arg("-c")
            .arg(self.config())
            .arg("-no-cs")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        self.child = Some(ChildGuard::spawn(cmd, "crowdsec"));
        let start = Instant::now();
        while !self.answers() {
            assert!(
                start.elapsed() < Duration::from_secs(20),
                "the Local API did not answer within 20 s; its log: {}",
                std::fs::read_to_string(self.dir.0.join("crowdsec_api.log")).unwrap_or_default()
            );
            sleep(Duration::from_millis(50));
        }
    }

    /// Whether it answers on its port.
    fn answers(&self) -> bool {
        Command::new("nsenter")
            .arg(format!("--net=/run/netns/{}", self.ns))
            .args(["bash", "-c", &format!("exec 3<>/dev/tcp/127.0.0.1/{PORT}")])
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    }

    /// Its config file.
    pub fn config(&self) -> PathBuf {
        self.dir.0.join("config.yaml")
    }

    /// The file holding the bouncer key.
    pub fn key_file(&self) -> PathBuf {
        self.dir.0.join("bouncer.key")
    }

    /// `http://127.0.0.1:PORT` (`https://` with TLS).
    pub fn url(&self) -> String {
        let scheme = if self.tls { "https" } else { "http" };
        format!("{scheme}://127.0.0.1:{PORT}")
    }

    /// `run`'s options to follow it, pulling every `every`.
    pub fn run_args(&self, every: &str) -> Vec<String> {
        vec![
            "--crowdsec".into(),
            self.url(),
            "--crowdsec-key-file".into(),
            self.key_file().display().to_string(),
            "--crowdsec-every".into(),
            every.into(),
        ]
    }

    /// `cscli -c CONFIG ARGS` in its namespace.
    pub fn cscli(&self, args: &[&str]) -> std::process::Output {
        Command::new("nsenter")
            .arg(format!("--net=/run/netns/{}", self.ns))
            .arg("cscli")
            .arg("-c")
            .arg(self.config())
            .args(args)
            .output()
            .expect("running cscli")
    }

    /// [`Lapi::cscli`] that must succeed; its stdout.
    pub fn cscli_ok(&self, args: &[&str]) -> String {
        let out = self.cscli(args);
        assert!(
            out.status.success(),
            "`cscli {}` failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Stops it (SIGKILL): the daemon's pulls fail.
    pub fn stop(&mut self) {
        // The guard kills it and waits.
        self.child = None;
    }

    /// Starts it again, on the same port and database.
    pub fn restart(&mut self) {
        self.stop();
        self.spawn();
    }
}
