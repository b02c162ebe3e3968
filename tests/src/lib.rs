//! Harness for the privileged integration tests: root checks, network namespace
//! pairs joined by a veth (RAII, deleted on drop even on panic), the daemon as a
//! child process (killed on drop), the host most tests stand up (a pair and a
//! run directory, `fixture`), crafted frames, a paced sender and a counting
//! receiver on raw sockets, and BPF_PROG_TEST_RUN on the real object.
//!
//! Addresses: 198.18.0.0/15 and 2001:db8::/32 only.

pub mod check;
pub mod crowdsec;
pub mod envoy;
pub mod feed;
pub mod fixture;
pub mod fleet;
pub mod frames;
pub mod generator;
pub mod hold;
pub mod net;
pub mod redis;
pub mod serve;
pub mod testrun;
pub mod verifier;

/// The bench's XDP object (`bench/floors`: the cost floors and the traffic
/// generator), built by `build.rs`: for the flood tests' [`generator`] and
/// `cargo xtask bench`. The daemon's binary does not carry it.
pub static FLOORS_OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/floors"));

use std::{
    path::PathBuf,
    process::{Child, Command, Stdio},
    sync::atomic::{AtomicU32, Ordering},
    time::{Duration, Instant},
};

/// Whether this process is root. When not: prints a loud skip line naming the
/// test and returns false — or, under `CI`, panics: CI must not skip.
pub fn require_root(test: &str) -> bool {
    // SAFETY: no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        return true;
    }
    if std::env::var_os("CI").is_some() {
        panic!("{test}: needs root, and CI is set: privileged tests must not be skipped");
    }
    // Written to the real stderr, past the test harness's capture: a skip is
    // never silent.
    use std::io::Write as _;
    let _ = writeln!(std::io::stderr().lock(), "SKIPPED (needs root): {test}");
    false
}

/// Whether `tool` is on PATH. When not: prints a loud skip line naming the
/// test and the tool (`cargo xtask setup` installs it) and returns false — or,
/// under `CI`, panics: CI must not skip.
pub fn require_tool(test: &str, tool: &str) -> bool {
    let found = std::env::var_os("PATH")
        .is_some_and(|path| std::env::split_paths(&path).any(|dir| dir.join(tool).is_file()));
    if found {
        return true;
    }
    if std::env::var_os("CI").is_some() {
        panic!("{test}: needs {tool}, and CI is set: `cargo xtask setup` installs it");
    }
    use std::io::Write as _;
    let _ = writeln!(
        std::io::stderr().lock(),
        "SKIPPED (needs {tool}; `cargo xtask setup` installs it): {test}"
    );
    false
}

/// Skips the calling test when not root (see [`require_root`]).
#[macro_export]
macro_rules! privileged {
    ($name:expr) => {
        if !$crate::require_root($name) {
            return;
        }
    };
}

/// A short unique tag for names (interfaces are at most 15 bytes).
pub fn unique_tag() -> String {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    format!(
        "{}{}",
        std::process::id() % 10_000,
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

/// The `ratelimit` binary: `RATELIMIT_BIN` (set by `cargo xtask test`), else next
/// to this test executable's directory, where cargo puts binaries.
pub fn ratelimit_bin() -> PathBuf {
    if let Some(p) = std::env::var_os("RATELIMIT_BIN") {
        return PathBuf::from(p);
    }
    // The release build, as operators run it (`cargo xtask test` builds it):
    // the tests' figures (an answer within 100 ms under a flood of
    // decisions) are the release build's.
    let exe = std::env::current_exe().expect("current_exe");
    let target = exe
        .parent()
        .and_then(|d| d.parent())
        .and_then(|d| d.parent())
        .expect("test executable in target/<profile>/deps");
    let bin = target.join("release").join("ratelimit");
    assert!(
        bin.exists(),
        "{} not found: build it (`cargo build --release -p ratelimit-user --bin ratelimit`) or set RATELIMIT_BIN; `cargo xtask test` does both",
        bin.display()
    );
    bin
}

/// A child process killed (SIGKILL) and reaped on drop.
pub struct ChildGuard {
    child: Option<Child>,
    /// What it is, for messages.
    pub what: String,
}

impl ChildGuard {
    /// Spawns `cmd`.
    pub fn spawn(mut cmd: Command, what: &str) -> Self {
        let child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("starting {what}: {e}"));
        Self {
            child: Some(child),
            what: what.to_string(),
        }
    }

    /// The child's piped stdout, taken (once).
    pub fn take_stdout(&mut self) -> Option<std::process::ChildStdout> {
        self.child.as_mut().and_then(|c| c.stdout.take())
    }

    /// The process id.
    pub fn pid(&self) -> i32 {
        self.child.as_ref().expect("running").id() as i32
    }

    /// The exit status, if it has exited.
    pub fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.child
            .as_mut()
            .and_then(|c| c.try_wait().ok().flatten())
    }

    /// Whatever it wrote to stderr (after it exited).
    pub fn take_output(&mut self) -> Vec<u8> {
        let mut buf = Vec::new();
        if let Some(err) = self.child.as_mut().and_then(|c| c.stderr.as_mut()) {
            use std::io::Read as _;
            let _ = err.read_to_end(&mut buf);
        }
        buf
    }

    /// Sends `sig`.
    pub fn signal(&self, sig: i32) {
        // SAFETY: a pid we own.
        unsafe { libc::kill(self.pid(), sig) };
    }

    /// Waits up to `timeout` for exit; returns the exit status and output.
    pub fn wait(mut self, timeout: Duration) -> std::process::Output {
        let mut child = self.child.take().expect("running");
        let start = Instant::now();
        loop {
            match child.try_wait() {
                Ok(Some(_)) => return child.wait_with_output().expect("output"),
                Ok(None) if start.elapsed() < timeout => {
                    std::thread::sleep(Duration::from_millis(20))
                }
                _ => {
                    let _ = child.kill();
                    let out = child.wait_with_output().expect("output");
                    panic!(
                        "{} did not exit within {timeout:?}; stdout: {} stderr: {}",
                        self.what,
                        String::from_utf8_lossy(&out.stdout),
                        String::from_utf8_lossy(&out.stderr)
                    );
                }
            }
        }
    }
}

impl Drop for ChildGuard {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// How long a daemon may take to answer after its start: the verifier's
/// walk alone takes up to two minutes in a VM under emulation (the kernel
/// tier's `cargo xtask vm`); a daemon on the host answers in a second.
pub const READY_WITHIN: Duration = Duration::from_secs(240);

/// A running daemon in a namespace, with its own run directory.
pub struct Daemon {
    /// The process.
    pub child: ChildGuard,
    /// The interface it runs on.
    pub iface: String,
    /// Its run directory (`RATELIMIT_RUN_DIR`).
    pub run_dir: PathBuf,
    /// The namespace it runs in.
    pub netns: String,
    /// Where its stdout and stderr go.
    pub log: PathBuf,
}

impl Daemon {
    /// Starts `ratelimit run --iface IFACE ARGS` in `netns` (entered with
    /// `nsenter --net`) and waits until its control socket answers.
    pub fn start(
        netns: &net::NetNs,
        iface: &str,
        run_dir: &std::path::Path,
        args: &[&str],
    ) -> Self {
        let mut cmd = netns.command(ratelimit_bin());
        cmd.args(["run", "--iface", iface]).args(args);
        Self::spawn(cmd, netns, iface, run_dir)
    }

    /// Starts `cmd` (a `ratelimit run` however wrapped: `ip netns exec`,
    /// `prlimit`, ...) as the daemon of `iface` in `netns`, its output in a log
    /// file of the run directory, and waits until its control socket answers.
    pub fn spawn(
        mut cmd: Command,
        netns: &net::NetNs,
        iface: &str,
        run_dir: &std::path::Path,
    ) -> Self {
        std::fs::create_dir_all(run_dir).expect("creating the run directory");
        let log = run_dir.join(format!("{iface}-{}.log", unique_tag()));
        let file = std::fs::File::create(&log).expect("creating the daemon's log");
        cmd.env("RATELIMIT_RUN_DIR", run_dir)
            .stdin(Stdio::null())
            .stdout(file.try_clone().expect("log fd"))
            .stderr(file);
        let child = ChildGuard::spawn(cmd, &format!("ratelimit run --iface {iface}"));
        let mut d = Self {
            child,
            iface: iface.to_string(),
            run_dir: run_dir.to_path_buf(),
            netns: netns.name.clone(),
            log,
        };
        d.wait_ready();
        d
    }

    /// What the daemon wrote so far.
    pub fn output(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Waits until the control socket answers, at most [`READY_WITHIN`].
    fn wait_ready(&mut self) {
        let start = Instant::now();
        while start.elapsed() < READY_WITHIN {
            if let Some(status) = self.child.exited() {
                panic!(
                    "the daemon on {} exited ({status}) before answering; its output: {}",
                    self.iface,
                    self.output()
                );
            }
            // The daemon's own answer: with no daemon, the CLI answers from
            // a pinned program's maps (`"daemon": false`).
            let out = self.cli(&["status", "--json"]);
            if out.status.success()
                && serde_json::from_slice::<serde_json::Value>(&out.stdout)
                    .is_ok_and(|v| v["daemon"] != false)
            {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!(
            "the daemon on {} did not answer within {READY_WITHIN:?}; its output: {}",
            self.iface,
            self.output()
        );
    }

    /// Sends `sig` and waits up to 10 s for the exit; returns the exit status.
    pub fn stop(self, sig: i32) -> std::process::ExitStatus {
        self.child.signal(sig);
        self.child.wait(Duration::from_secs(10)).status
    }

    /// Asks the daemon `request` (a JSON line of the control protocol, like
    /// `{"cmd":"status"}`) on its control socket, as the CLI does but without
    /// starting a process: how long the answer took, and the answer.
    pub fn ask(&self, request: &str) -> (Duration, serde_json::Value) {
        use std::io::{BufRead as _, Write as _};
        // RUN_DIR/NETNS/IFACE.sock
        let sock = std::fs::read_dir(&self.run_dir)
            .expect("reading the run directory")
            .flatten()
            .map(|e| e.path().join(format!("{}.sock", self.iface)))
            .find(|p| p.exists())
            .unwrap_or_else(|| {
                panic!(
                    "no control socket of {} in {}",
                    self.iface,
                    self.run_dir.display()
                )
            });
        let t0 = Instant::now();
        let mut conn = std::os::unix::net::UnixStream::connect(&sock).expect("connecting");
        conn.set_read_timeout(Some(Duration::from_secs(60)))
            .expect("timeout");
        conn.write_all(format!("{request}\n").as_bytes())
            .expect("asking");
        let mut line = String::new();
        std::io::BufReader::new(conn)
            .read_line(&mut line)
            .expect("reading the answer");
        let took = t0.elapsed();
        let answer = serde_json::from_str(&line)
            .unwrap_or_else(|e| panic!("the daemon answered {line:?}: {e}"));
        (took, answer)
    }

    /// Runs a CLI command against this daemon (`--iface` is added).
    pub fn cli(&self, args: &[&str]) -> std::process::Output {
        self.cli_command(args)
            .output()
            .expect("running the ratelimit CLI")
    }

    /// The CLI command [`Daemon::cli`] runs, not started.
    pub fn cli_command(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new("nsenter");
        cmd.arg(format!("--net=/run/netns/{}", self.netns))
            .arg(ratelimit_bin())
            .args(args)
            .args(["--iface", &self.iface])
            .env("RATELIMIT_RUN_DIR", &self.run_dir);
        cmd
    }

    /// Runs a CLI command that must succeed; returns its stdout.
    pub fn cli_ok(&self, args: &[&str]) -> String {
        let out = self.cli(args);
        if !out.status.success() {
            // The daemon's last words, in case it is gone.
            let log = self.output();
            let mut from = log.len().saturating_sub(3000);
            while !log.is_char_boundary(from) {
                from += 1;
            }
            let tail = &log[from..];
            panic!(
                "`ratelimit {}` failed: {}\nthe daemon's output ends with:\n{tail}",
                args.join(" "),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// `--json` output of a read command.
    pub fn json(&self, args: &[&str]) -> serde_json::Value {
        let mut a = args.to_vec();
        a.push("--json");
        let out = self.cli_ok(&a);
        serde_json::from_str(&out)
            .unwrap_or_else(|e| panic!("`{}` printed bad JSON ({e}): {out}", a.join(" ")))
    }
}

/// A temporary directory removed on drop: under the system's temp
/// directory, mode 0755 whatever the umask, so a test that runs a command as
/// `nobody` can hand it what it writes there.
pub struct TempDir(pub PathBuf);

impl TempDir {
    /// Creates one.
    pub fn new(tag: &str) -> Self {
        use std::os::unix::fs::PermissionsExt as _;
        let p = std::env::temp_dir().join(format!("ratelimit-test-{tag}-{}", unique_tag()));
        std::fs::create_dir_all(&p).expect("creating temp dir");
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755))
            .expect("chmod temp dir");
        Self(p)
    }
}

/// The `ratelimit` binary where any user may run it, for the tests that run
/// it as `nobody`: the build's binary lives in the checkout, which may be in
/// a directory only its owner can enter (a clone in a home directory of mode
/// 0700). Linked (copied, across file systems) into a [`TempDir`]; removed
/// on drop.
pub struct SharedBin {
    _dir: TempDir,
    /// The binary.
    pub path: PathBuf,
}

impl SharedBin {
    /// Links (or copies) [`ratelimit_bin`] into a directory of its own.
    pub fn new() -> Self {
        let dir = TempDir::new("bin");
        let path = dir.0.join("ratelimit");
        let bin = ratelimit_bin();
        if std::fs::hard_link(&bin, &path).is_err() {
            std::fs::copy(&bin, &path)
                .unwrap_or_else(|e| panic!("copying {} to {}: {e}", bin.display(), path.display()));
        }
        Self { _dir: dir, path }
    }
}

impl Default for SharedBin {
    fn default() -> Self {
        Self::new()
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
