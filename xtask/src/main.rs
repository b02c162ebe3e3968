//! `cargo xtask`: orchestration only.
//!
//! - `setup`: the dated nightly toolchain, its `rust-src`, and `bpf-linker`
//!   built against that nightly's own libLLVM, as `ratelimit-ebpf/toolchain.toml`
//!   names them. Idempotent; `run`, `test`, `bench` and `vm` call it.
//! - `run --iface IFACE [-- ARGS]`: build, then `ratelimit run --iface IFACE ARGS`
//!   as root.
//! - `test`: fmt, clippy (host and eBPF), unit tests, the privileged
//!   integration tests one at a time, then the kernel tier in VMs on Debian
//!   12's 6.1 and the newest sid kernel (`vm/`).
//! - `install [--prefix DIR]`: the release binary, its man pages and shell
//!   completions, and the systemd unit (see `install.rs`).
//! - `deb [--out DIR]`: the same, the example config and the fail2ban action
//!   as a Debian package, `target/deb/ratelimit_VERSION_ARCH.deb`; `--check`
//!   also installs it into a scratch root and checks it (see `deb.rs`).
//! - `vm [--kernel NAME]... [--all] [--refresh] [-- COMMAND...]`: a command,
//!   or a smoke check, in qemu guests booted on Debian's kernels, with the
//!   host's root shared read-only (see `vm/`).

mod deb;
#[cfg(test)]
mod docs;
mod install;
mod setup;
mod vm;

use std::{
    env,
    path::{Path, PathBuf},
    process::{Command, ExitCode, Stdio},
};

use anyhow::{Context as _, Result, bail, ensure};
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "xtask", about = "Build, run and test ratelimit")]
struct Cli {
    #[command(subcommand)]
    command: Task,
}

#[derive(Subcommand)]
enum Task {
    /// Install what the build needs: nightly, rust-src, bpf-linker.
    Setup,
    /// Build and run the daemon on an interface (as root, through sudo if needed).
    Run {
        /// The interface to attach to.
        #[arg(long)]
        iface: String,
        /// Build with optimizations (the eBPF program is always optimized).
        #[arg(long)]
        release: bool,
        /// More arguments for `ratelimit run`.
        #[arg(last = true)]
        args: Vec<String>,
    },
    /// fmt, clippy, cargo doc, unit tests, the privileged integration tests against the
    /// release binary, the Debian package's check, the kernel tier in VMs on
    /// Debian's 6.1 and sid, and the bench's smoke run.
    Test,
    /// Build a release and install the binaries (ratelimit, ratelimit-serve),
    /// their man pages, shell completions and the systemd units (as root,
    /// through sudo if needed).
    Install {
        /// Where the binaries (PREFIX/bin), the man pages (PREFIX/share/man/man8)
        /// and the completions (PREFIX/share/…) go.
        #[arg(long, default_value = "/usr/local")]
        prefix: PathBuf,
        /// Where the systemd units ratelimit@.service and
        /// ratelimit-serve.service go.
        #[arg(long, default_value = "/etc/systemd/system")]
        unit_dir: PathBuf,
        /// Install this binary (and the ratelimit-serve beside it) instead of
        /// building them.
        #[arg(long, value_name = "PATH")]
        binary: Option<PathBuf>,
    },
    /// Build a release and package it: target/deb/ratelimit_VERSION_ARCH.deb.
    Deb {
        /// Where the package goes (default: target/deb in the workspace).
        #[arg(long, value_name = "DIR")]
        out: Option<PathBuf>,
        /// Package this binary (and the ratelimit-serve beside it) instead of
        /// building them.
        #[arg(long, value_name = "PATH")]
        binary: Option<PathBuf>,
        /// Then install it into a scratch root with dpkg and check it, remove
        /// and purge it (as root; the step of `cargo xtask test`).
        #[arg(long, hide = true)]
        check: bool,
    },
    /// Benchmarks: write bench/results.md and bench/results.json (as root).
    Bench {
        /// Short runs, for a smoke check.
        #[arg(long)]
        quick: bool,
        /// One section only (cost, droplog, floods, accuracy, memory, set, serve, fleet),
        /// written to target/bench-only/ so bench/ keeps the full run.
        #[arg(long, value_name = "SECTION")]
        only: Option<String>,
    },
    /// The kernel tier (or a command, or a smoke check) in qemu guests
    /// booted on Debian's kernels, the host's root shared read-only.
    Vm {
        /// A kernel to boot (6.1, 6.12, sid; 5.10, below the minimum, to see
        /// it refused); repeat for several. Default: 6.1 and sid.
        #[arg(long = "kernel", value_name = "NAME")]
        kernels: Vec<String>,
        /// Every supported kernel of the table, and this machine's.
        #[arg(long, conflicts_with = "kernels")]
        all: bool,
        /// Ask Debian for newer kernel packages than the ones cached.
        #[arg(long)]
        refresh: bool,
        /// The time limit of each guest, in seconds.
        #[arg(long, value_name = "SECS", default_value_t = 900)]
        timeout: u64,
        /// The smoke check (the kernel boots, BTF, a veth pair) instead of
        /// the kernel tier.
        #[arg(long, conflicts_with = "command")]
        smoke: bool,
        /// Write each kernel's verifier figures into tests/kernels.txt.
        #[arg(long)]
        record: bool,
        /// The command to run in each guest, in the current directory
        /// (default: the kernel tier).
        #[arg(last = true)]
        command: Vec<String>,
    },
}

fn main() -> ExitCode {
    match run(Cli::parse()) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("xtask: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(cli: Cli) -> Result<ExitCode> {
    match cli.command {
        Task::Setup => {
            setup::setup(true)?;
            Ok(ExitCode::SUCCESS)
        }
        Task::Run {
            iface,
            release,
            args,
        } => {
            setup::setup(false)?;
            let bin = build_bin(release, false)?;
            let mut cmd = as_root(&bin);
            cmd.args(["run", "--iface", &iface]).args(&args);
            // Ctrl-C reaches the daemon (same process group), which detaches and
            // exits; SIGINT, SIGTERM (what `timeout` and `kill` send) and SIGHUP
            // sent to this process alone are passed on to it. We wait for it and
            // pass its status on: the daemon is never left running alone.
            let mut child = cmd
                .spawn()
                .with_context(|| format!("starting {}", bin.display()))?;
            forward_signals(child.id());
            let status = child.wait().context("waiting for the daemon")?;
            Ok(exit_code(status))
        }
        Task::Test => test(),
        Task::Install {
            prefix,
            unit_dir,
            binary,
        } => install(&prefix, &unit_dir, binary),
        Task::Deb { out, binary, check } => {
            let bin = match binary {
                Some(b) => b,
                None => {
                    setup::setup(false)?;
                    build_bin(true, true)?
                }
            };
            let out = out.unwrap_or_else(|| workspace_root().join(deb::DEFAULT_OUT));
            if check {
                deb::check(&bin, &out)?;
            } else {
                let built = deb::build(&bin, &out)?;
                eprintln!(
                    "xtask: next, as root: dpkg -i {}, then copy /etc/ratelimit/ratelimit.toml to /etc/ratelimit/IFACE.toml and `systemctl enable --now ratelimit@IFACE`",
                    built.path.display()
                );
            }
            Ok(ExitCode::SUCCESS)
        }
        Task::Bench { quick, only } => bench(quick, only.as_deref()),
        Task::Vm {
            kernels,
            all,
            refresh,
            timeout,
            smoke,
            record,
            command,
        } => vm::vm(&vm::Args {
            kernels,
            all,
            refresh,
            timeout: std::time::Duration::from_secs(timeout),
            command,
            smoke,
            record,
        }),
    }
}

fn bench(quick: bool, only: Option<&str>) -> Result<ExitCode> {
    setup::setup(false)?;
    let bin = build_bin(true, true)?;
    let mut build = cargo();
    build.args([
        "build",
        "--release",
        "--package",
        "ratelimit-bench",
        "--bin",
        "bench",
        "--message-format=json-render-diagnostics",
    ]);
    eprintln!("xtask: building the benchmarks");
    let out = build
        .stdout(Stdio::piped())
        .output()
        .context("cargo build")?;
    if !out.status.success() {
        bail!("building the benchmarks failed ({})", out.status);
    }
    let bench = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .find(|m| m["reason"] == "compiler-artifact" && m["target"]["name"] == "bench")
        .and_then(|m| m["executable"].as_str().map(PathBuf::from))
        .context("cargo did not report the bench binary")?;
    let mut cmd = as_root(&bench);
    let out = match only {
        Some(section) => {
            cmd.args(["--only", section]);
            workspace_root().join("target/bench-only")
        }
        None => workspace_root().join("bench"),
    };
    cmd.arg("--out")
        .arg(out)
        .env("RATELIMIT_BIN", &bin)
        .current_dir(workspace_root());
    if quick {
        cmd.arg("--quick");
    }
    let status = cmd.status().context("running the benchmarks")?;
    Ok(exit_code(status))
}

fn install(prefix: &Path, unit_dir: &Path, binary: Option<PathBuf>) -> Result<ExitCode> {
    let bin = match binary {
        Some(b) => b,
        None => {
            setup::setup(false)?;
            build_bin(true, true)?
        }
    };
    if !is_root() {
        // Built as the user (so target/ stays theirs); copied as root.
        eprintln!("xtask: not root: installing through sudo -E");
        let exe = env::current_exe().context("finding the xtask binary")?;
        let mut cmd = as_root(&exe);
        cmd.arg("install")
            .arg("--prefix")
            .arg(prefix)
            .arg("--unit-dir")
            .arg(unit_dir)
            .arg("--binary")
            .arg(&bin);
        let status = cmd.status().context("running sudo")?;
        return Ok(exit_code(status));
    }
    let mut units = Vec::new();
    for shipped in install::UNITS {
        let src = workspace_root().join(shipped);
        let text =
            std::fs::read_to_string(&src).with_context(|| format!("reading {}", src.display()))?;
        let name = src
            .file_name()
            .and_then(|n| n.to_str())
            .context("a unit's file name")?
            .to_string();
        units.push((name, text));
    }
    let units: Vec<(&str, &str)> = units
        .iter()
        .map(|(n, t)| (n.as_str(), t.as_str()))
        .collect();
    for path in install::files(&bin, prefix, &units, unit_dir)? {
        eprintln!("xtask: installed {}", path.display());
    }
    if unit_dir == Path::new("/etc/systemd/system") && Path::new("/run/systemd/system").exists() {
        check(
            Command::new("systemctl").arg("daemon-reload"),
            "systemctl daemon-reload",
        )?;
    }
    eprintln!(
        "xtask: next: put the rules in /etc/ratelimit/IFACE.toml (see examples/ratelimit.toml), then `systemctl enable --now ratelimit@IFACE`"
    );
    eprintln!(
        "xtask: the throttling service: SERVE_ARGS=\"--redis redis://HOST:PORT ...\" in /etc/default/ratelimit-serve, then `systemctl enable --now ratelimit-serve`"
    );
    Ok(ExitCode::SUCCESS)
}

fn workspace_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask lives in the workspace")
        .to_path_buf()
}

fn cargo() -> Command {
    let mut cmd = Command::new(env::var_os("CARGO").unwrap_or_else(|| "cargo".into()));
    cmd.current_dir(workspace_root());
    for var in package_env() {
        cmd.env_remove(var);
    }
    cmd
}

/// What `cargo run` (which runs us) and `cargo test` set about their own
/// package: ring's build script reruns when one of them differs (it asks
/// for CARGO_MANIFEST_DIR, CARGO_PKG_NAME, OUT_DIR …), and with it rustls,
/// tonic and the daemon, a minute's rebuild whenever xtask is started from
/// another place (a test's `cargo xtask run`). Builds from here see what a
/// shell's `cargo build` sees.
fn package_env() -> Vec<std::ffi::OsString> {
    env::vars_os()
        .map(|(k, _)| k)
        .filter(|k| {
            let k = k.to_string_lossy();
            k.starts_with("CARGO_PKG_")
                || k.starts_with("CARGO_MANIFEST_")
                || k.starts_with("CARGO_BIN_")
                || ["OUT_DIR", "CARGO_CRATE_NAME", "CARGO_PRIMARY_PACKAGE"].contains(&k.as_ref())
        })
        .collect()
}

fn check(cmd: &mut Command, what: &str) -> Result<()> {
    eprintln!("xtask: {what}");
    let start = std::time::Instant::now();
    let status = cmd.status().with_context(|| format!("starting: {what}"))?;
    if !status.success() {
        bail!("{what} failed ({status})");
    }
    took(what, start);
    Ok(())
}

/// Says how long a step of a task took: where a run's time goes.
fn took(what: &str, start: std::time::Instant) {
    eprintln!("xtask: took {:.0} s: {what}", start.elapsed().as_secs_f64());
}

/// Builds the `ratelimit` binary (and, `with_service`, the service's
/// `ratelimit-serve` beside it, which `ratelimit serve` runs); returns the
/// first's path, as cargo reports it.
fn build_bin(release: bool, with_service: bool) -> Result<PathBuf> {
    let mut cmd = cargo();
    cmd.args([
        "build",
        "--package",
        "ratelimit-user",
        "--bin",
        "ratelimit",
        "--message-format=json-render-diagnostics",
    ]);
    if with_service {
        cmd.args(["--package", "ratelimit-serve", "--bin", "ratelimit-serve"]);
    }
    if release {
        cmd.arg("--release");
    }
    cmd.stdout(Stdio::piped());
    eprintln!("xtask: building ratelimit");
    let out = output_with_heartbeat(&mut cmd, "building ratelimit")?;
    if !out.status.success() {
        bail!("cargo build failed ({})", out.status);
    }
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let Ok(msg) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        if msg["reason"] == "compiler-artifact"
            && msg["target"]["name"] == "ratelimit"
            && let Some(exe) = msg["executable"].as_str()
        {
            let exe = PathBuf::from(exe);
            let serve = install::serve_bin(&exe);
            ensure!(
                !with_service || serve.is_file(),
                "cargo build did not leave the service's binary beside {}",
                exe.display()
            );
            return Ok(exe);
        }
    }
    bail!("cargo build did not report the ratelimit binary")
}

/// How often a long build says it is still going.
const HEARTBEAT: std::time::Duration = std::time::Duration::from_secs(30);

/// `cmd.output()`, saying every [`HEARTBEAT`] that it still runs: the
/// daemon's build script builds the XDP program (nightly, build-std) and
/// prints nothing until it ends, minutes after a change to the program,
/// which looked like a hang.
fn output_with_heartbeat(cmd: &mut Command, what: &str) -> Result<std::process::Output> {
    let start = std::time::Instant::now();
    let (done, wait) = std::sync::mpsc::channel::<()>();
    let what = what.to_string();
    let beat = std::thread::spawn(move || {
        while let Err(std::sync::mpsc::RecvTimeoutError::Timeout) = wait.recv_timeout(HEARTBEAT) {
            eprintln!(
                "xtask: still {what} ({} s; a first build, or one after a change to the XDP program, runs the build script that builds the program for minutes, printing nothing until it ends)",
                start.elapsed().as_secs()
            );
        }
    });
    let out = cmd.output().context("running cargo build");
    drop(done);
    let _ = beat.join();
    out
}

fn is_root() -> bool {
    // SAFETY: no preconditions.
    unsafe { libc::geteuid() == 0 }
}

fn as_root(bin: &std::path::Path) -> Command {
    if is_root() {
        Command::new(bin)
    } else {
        eprintln!("xtask: not root: running through sudo -E");
        let mut cmd = Command::new("sudo");
        cmd.arg("-E").arg(bin);
        cmd
    }
}

/// The daemon `cargo xtask run` started, for [`forward`].
static CHILD: std::sync::atomic::AtomicI32 = std::sync::atomic::AtomicI32::new(0);

/// Passes a signal on to the daemon (async-signal-safe: a load and kill(2)).
extern "C" fn forward(sig: libc::c_int) {
    let pid = CHILD.load(std::sync::atomic::Ordering::Relaxed);
    if pid > 0 {
        // SAFETY: kill(2) is async-signal-safe.
        unsafe { libc::kill(pid, sig) };
    }
}

/// From now on SIGINT, SIGTERM and SIGHUP go to `pid` instead of ending us.
fn forward_signals(pid: u32) {
    CHILD.store(pid as i32, std::sync::atomic::Ordering::Relaxed);
    for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
        // SAFETY: installing a handler that only calls async-signal-safe code.
        unsafe { libc::signal(sig, forward as *const () as libc::sighandler_t) };
    }
}

fn exit_code(status: std::process::ExitStatus) -> ExitCode {
    match status.code() {
        Some(0) => ExitCode::SUCCESS,
        Some(c) => ExitCode::from(c.clamp(1, 255) as u8),
        None => ExitCode::FAILURE,
    }
}

fn test() -> Result<ExitCode> {
    let start = std::time::Instant::now();
    setup::setup(false)?;
    check(
        cargo().args(["fmt", "--all", "--check"]),
        "cargo fmt --check",
    )?;
    check(
        cargo().args([
            "clippy",
            "--workspace",
            "--exclude",
            "ratelimit-ebpf",
            "--exclude",
            "ratelimit-floors",
            "--all-targets",
            "--",
            "-D",
            "warnings",
        ]),
        "clippy (host crates; the workspace's lints, warnings denied)",
    )?;
    // ratelimit-common is built four ways: in the XDP program (no feature),
    // in applications (`std`), in the daemon (`user`), and all at once.
    for features in [
        &["--no-default-features"][..],
        &["--features", "std"],
        &["--features", "user"],
        &["--all-features"],
    ] {
        check(
            cargo()
                .args(["clippy", "--package", "ratelimit-common", "--lib"])
                .args(features)
                .args(["--", "-D", "warnings"]),
            &format!("ratelimit-common with {}", features.join(" ")),
        )?;
    }
    // ratelimit-redis as each program builds it: the service with `serve`
    // alone, the daemon with `fleet` alone.
    for feature in ["serve", "fleet"] {
        check(
            cargo()
                .args(["clippy", "--package", "ratelimit-redis", "--lib"])
                .args(["--no-default-features", "--features", feature])
                .args(["--", "-D", "warnings"]),
            &format!("ratelimit-redis with {feature} alone"),
        )?;
    }
    rust_version_gate()?;
    check(
        Command::new("rustup")
            .current_dir(workspace_root())
            .args([
                "run",
                &setup::pin()?.nightly,
                "cargo",
                "clippy",
                "--package",
                "ratelimit-ebpf",
                "--package",
                "ratelimit-floors",
                "--release",
                "--target",
                "bpfel-unknown-none",
                "-Z",
                "build-std=core",
                "--",
                "-D",
                "warnings",
            ])
            // The outer (stable) cargo's settings must not leak into nightly's.
            .env_remove("CARGO")
            .env_remove("RUSTC")
            .env_remove("RUSTC_WORKSPACE_WRAPPER")
            .env_remove("RUSTUP_TOOLCHAIN")
            .env(
                "CARGO_TARGET_DIR",
                workspace_root().join("target/ebpf-clippy"),
            ),
        "clippy (the eBPF crates: the program and the bench's floors)",
    )?;
    // Every intra-doc link resolves (the module docs link the code they
    // describe; private items are documented: this is an application).
    check(
        cargo()
            .args([
                "doc",
                "--no-deps",
                "--workspace",
                "--exclude",
                "ratelimit-ebpf",
                "--exclude",
                "ratelimit-floors",
                "--document-private-items",
            ])
            .env(
                "RUSTDOCFLAGS",
                "-D warnings -A rustdoc::private_intra_doc_links",
            ),
        "cargo doc (warnings denied)",
    )?;
    let mut tally = Tally::default();
    tally.run(
        cargo().args([
            "test",
            "--workspace",
            "--exclude",
            "ratelimit-tests",
            "--exclude",
            "ratelimit-ebpf",
            "--exclude",
            "ratelimit-floors",
        ]),
        "unit tests",
    )?;

    // The integration tests run the real daemon binary, built as operators
    // build it.
    let built = std::time::Instant::now();
    let bin = build_bin(true, true)?;
    took("building ratelimit (release)", built);
    if !is_root() {
        let out = cargo()
            .args([
                "test",
                "--package",
                "ratelimit-tests",
                "--",
                "--list",
                "--format=terse",
            ])
            .output()
            .context("listing the privileged tests")?;
        let names: Vec<String> = String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter_map(|l| l.strip_suffix(": test").map(str::to_string))
            .collect();
        for name in &names {
            eprintln!("xtask: SKIPPED (needs root): {name}");
        }
        eprintln!("xtask: SKIPPED (needs root): the .deb check (dpkg -i into a scratch root)");
        if env::var_os("CI").is_some() {
            bail!(
                "CI is set but this is not root: the {} privileged tests must run",
                names.len()
            );
        }
        eprintln!(
            "xtask: {} privileged tests SKIPPED: not root (run as root to run them)",
            names.len()
        );
        println!(
            "summary: {} passed, {} failed, {} skipped",
            tally.passed,
            tally.failed,
            names.len()
        );
        return Ok(ExitCode::SUCCESS);
    }
    tally.run(
        cargo()
            .args([
                "test",
                "--package",
                "ratelimit-tests",
                "--",
                "--test-threads=1",
            ])
            .env("RATELIMIT_BIN", &bin),
        "privileged integration tests (one at a time)",
    )?;
    // The Debian package of that same binary (no rebuild): installed into a
    // scratch root, checked, removed, purged.
    let deb = std::time::Instant::now();
    deb::check(&bin, &workspace_root().join(deb::DEFAULT_OUT))?;
    took("the .deb check", deb);
    // The kernel tier again on the kernels operators run: Debian 12's
    // 6.1 and the newest sid kernel, booted in qemu.
    let tier = vm::Tier::build()?;
    for name in vm::DEFAULT_KERNELS {
        let kernel = vm::kernel(name, false)?;
        eprintln!(
            "xtask: the kernel tier on {name} ({}), in a VM",
            kernel.release
        );
        let (run, figures) = vm::kernel_tier(&kernel, &tier, VM_TIMEOUT)?;
        tally.add(&run.console);
        if run.exit_code != 0 {
            tally.print();
            bail!(
                "the kernel tier failed on {name} ({}): exit {}",
                kernel.release,
                run.exit_code
            );
        }
        eprintln!(
            "xtask: the kernel tier passed on {name} ({}) in {:.0} s{}",
            kernel.release,
            run.elapsed.as_secs_f64(),
            figures.map(|f| format!(": {f}")).unwrap_or_default()
        );
    }
    let smoke = std::time::Instant::now();
    bench_smoke(&bin)?;
    took("bench --quick", smoke);
    tally.print();
    took("cargo xtask test, in all", start);
    Ok(ExitCode::SUCCESS)
}

/// The declared `rust-version` builds the host crates: when the toolchain
/// running this is another one, the declared one (installed by rustup if
/// missing) checks them; when it is that one, everything above was built
/// with it already.
fn rust_version_gate() -> Result<()> {
    let manifest = std::fs::read_to_string(workspace_root().join("Cargo.toml"))
        .context("reading Cargo.toml")?;
    let declared = manifest
        .lines()
        .find_map(|l| {
            let (k, v) = l.split_once('=')?;
            (k.trim() == "rust-version").then(|| v.trim().trim_matches('"').to_string())
        })
        .context("Cargo.toml declares no rust-version")?;
    let out = Command::new(env::var_os("RUSTC").unwrap_or_else(|| "rustc".into()))
        .arg("--version")
        .output()
        .context("rustc --version")?;
    let running = String::from_utf8_lossy(&out.stdout).into_owned();
    let same = running
        .split_whitespace()
        .nth(1)
        .is_some_and(|v| v == declared || v.starts_with(&format!("{declared}.")));
    if same {
        eprintln!(
            "xtask: rust-version {declared}: the toolchain of this run ({}) is the declared one",
            running.trim()
        );
        return Ok(());
    }
    check(
        Command::new("rustup")
            .current_dir(workspace_root())
            .args(["run", &declared, "cargo", "check", "--workspace"])
            .args([
                "--exclude",
                "ratelimit-ebpf",
                "--exclude",
                "ratelimit-floors",
            ])
            .arg("--all-targets")
            .env_remove("CARGO")
            .env_remove("RUSTC")
            .env_remove("RUSTUP_TOOLCHAIN"),
        &format!("the host crates with the declared rust-version {declared}"),
    )
}

/// Checks that `cargo xtask bench --quick` still runs start to finish (a debug
/// build, short durations, output under target/; no figure is asserted).
fn bench_smoke(ratelimit: &std::path::Path) -> Result<()> {
    eprintln!("xtask: bench --quick (smoke run: it must run, its figures are not checked)");
    let bench = build_artifact(
        cargo().args(["build", "--package", "ratelimit-bench", "--bin", "bench"]),
        "bench",
    )?;
    let status = Command::new(&bench)
        .args(["--quick", "--out"])
        .arg(workspace_root().join("target/bench-smoke"))
        .env("RATELIMIT_BIN", ratelimit)
        .current_dir(workspace_root())
        .status()
        .context("running the benchmarks")?;
    if !status.success() {
        bail!("bench --quick failed ({status})");
    }
    Ok(())
}

/// Runs a `cargo build` and returns the path of the executable `name` it reports.
fn build_artifact(cmd: &mut Command, name: &str) -> Result<PathBuf> {
    let out = cmd
        .arg("--message-format=json-render-diagnostics")
        .stdout(Stdio::piped())
        .output()
        .context("running cargo build")?;
    if !out.status.success() {
        bail!("cargo build of {name} failed ({})", out.status);
    }
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .find(|m| m["reason"] == "compiler-artifact" && m["target"]["name"] == name)
        .and_then(|m| m["executable"].as_str().map(PathBuf::from))
        .with_context(|| format!("cargo did not report the {name} executable"))
}

/// The time limit of one guest of `cargo xtask test`'s kernel tier (it
/// takes 3 to 4 minutes under TCG).
const VM_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(1200);

/// Test counts over several `cargo test` runs, for one closing line.
#[derive(Default)]
struct Tally {
    passed: u64,
    failed: u64,
}

impl Tally {
    /// Runs `cmd`, echoing its output, and adds up its `test result:` lines.
    fn run(&mut self, cmd: &mut Command, what: &str) -> Result<()> {
        use std::io::{BufRead as _, BufReader};
        eprintln!("xtask: {what}");
        let start = std::time::Instant::now();
        let mut child = cmd
            .stdout(Stdio::piped())
            .spawn()
            .with_context(|| format!("starting: {what}"))?;
        let stdout = child.stdout.take().context("piped stdout")?;
        for line in BufReader::new(stdout).lines() {
            let line = line.context("reading test output")?;
            println!("{line}");
            if let Some(rest) = line.strip_prefix("test result: ") {
                self.passed += count_before(rest, " passed");
                self.failed += count_before(rest, " failed");
            }
        }
        let status = child.wait().context("waiting for cargo test")?;
        if !status.success() {
            self.print();
            bail!("{what} failed ({status})");
        }
        took(what, start);
        Ok(())
    }

    /// Adds up the `test result:` lines of a guest's console.
    fn add(&mut self, console: &[String]) {
        for line in console {
            if let Some(i) = line.find("test result: ") {
                let rest = &line[i + "test result: ".len()..];
                self.passed += count_before(rest, " passed");
                self.failed += count_before(rest, " failed");
            }
        }
    }

    fn print(&self) {
        println!("summary: {} passed, {} failed", self.passed, self.failed);
    }
}

/// The number just before `word` in a `test result:` line
/// ("ok. 12 passed; 0 failed; ...").
fn count_before(text: &str, word: &str) -> u64 {
    text.split(';')
        .map(|part| {
            part.trim()
                .trim_start_matches("ok. ")
                .trim_start_matches("FAILED. ")
        })
        .find_map(|part| part.strip_suffix(word))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::count_before;

    #[test]
    fn reads_cargo_test_result_lines() {
        let ok =
            "ok. 12 passed; 0 failed; 1 ignored; 0 measured; 0 filtered out; finished in 0.01s";
        assert_eq!(
            (count_before(ok, " passed"), count_before(ok, " failed")),
            (12, 0)
        );
        let bad = "FAILED. 7 passed; 2 failed; 0 ignored; 0 measured; 0 filtered out";
        assert_eq!(
            (count_before(bad, " passed"), count_before(bad, " failed")),
            (7, 2)
        );
    }
}
