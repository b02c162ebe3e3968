//! `cargo xtask vm`: host binaries run under Debian's own kernels, in qemu.
//!
//! What enters: kernel names (`--kernel NAME`, repeated, or `--all`; by
//! default [`kernels::DEFAULT`]), `--refresh`, `--record`, `--smoke`, and a
//! command (after `--`). Without a command each guest runs the tests'
//! kernel tier ([`kernel_tier`]: every BPF_PROG_TEST_RUN test, the
//! verifier's budget and a veth check); `--all` runs it on the host's own
//! kernel too, and `--record` writes each kernel's verifier figures into
//! `tests/kernels.txt`.
//! What leaves: each guest's console on stderr (`[vm NAME] ` before each
//! line), one summary line per kernel (release, accelerator, boot and total
//! seconds, exit status), and an exit status: 0 when every guest's command
//! exited 0; with one kernel, the command's own status.
//!
//! For each kernel: `kernels.rs` downloads and extracts Debian's package
//! (cached under `target/vm/kernels/`), `initramfs.rs` builds the guest's
//! initramfs, `qemu.rs` boots it with the host's root shared read-only and
//! runs the command, one guest at a time. With `--smoke` each guest runs
//! [`smoke`]. Everything is kept under `target/vm/`.
//!
//! Called by `main.rs` (`cargo xtask vm`, and `cargo xtask test`, which runs
//! the kernel tier on [`kernels::DEFAULT`]).

mod initramfs;
mod kernels;
mod qemu;

use std::{
    path::{Path, PathBuf},
    process::ExitCode,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};

pub(crate) use kernels::{DEFAULT as DEFAULT_KERNELS, Kernel};
pub(crate) use qemu::{GuestRun, run_in_guest};

/// What `cargo xtask vm` was asked.
pub(crate) struct Args {
    /// `--kernel` names, in order.
    pub kernels: Vec<String>,
    /// `--all`: every kernel of the table.
    pub all: bool,
    /// `--refresh`: ask apt for newer kernel packages.
    pub refresh: bool,
    /// The time limit of each guest.
    pub timeout: Duration,
    /// The command; empty for the kernel tier (or the smoke check).
    pub command: Vec<String>,
    /// `--smoke`: the smoke check instead of the kernel tier.
    pub smoke: bool,
    /// `--record`: the kernel tier's figures written to `tests/kernels.txt`.
    pub record: bool,
}

/// Runs `cargo xtask vm`.
pub(crate) fn vm(args: &Args) -> Result<ExitCode> {
    tools()?;
    let names: Vec<&str> = if args.all {
        kernels::TABLE
            .iter()
            .filter(|s| s.supported)
            .map(|s| s.name)
            .collect()
    } else if args.kernels.is_empty() {
        kernels::DEFAULT.to_vec()
    } else {
        let mut names: Vec<&str> = Vec::new();
        for n in &args.kernels {
            if !names.contains(&n.as_str()) {
                names.push(n);
            }
        }
        names
    };
    for name in &names {
        kernels::spec(name)?;
    }
    // Every download first, so that a missing package fails before any boot.
    let kernels = names
        .iter()
        .map(|n| kernel(n, args.refresh))
        .collect::<Result<Vec<_>>>()?;
    let cwd = std::env::current_dir().context("the current directory")?;
    let tier = if args.command.is_empty() && !args.smoke {
        crate::setup::setup(false)?;
        Some(Tier::build()?)
    } else {
        None
    };
    let mut summary = Vec::new();
    let mut failed = false;
    let mut last_code = 0;
    let mut figures = Vec::new();
    for kernel in &kernels {
        let started = Instant::now();
        let run = match &tier {
            Some(tier) => kernel_tier(kernel, tier, args.timeout).map(|(run, f)| {
                figures.extend(f.clone());
                (run, f)
            }),
            None if args.command.is_empty() => smoke(kernel, args.timeout).map(|r| (r, None)),
            None => run_in_guest(kernel, &cwd, &[], &args.command, args.timeout).map(|r| (r, None)),
        };
        let line = match run {
            Ok((run, f)) => {
                failed |= run.exit_code != 0;
                last_code = run.exit_code;
                format!(
                    "{} ({}, {}): exit {}; /init after {:.1} s, exit line after {:.1} s ({:.1} s in all){}",
                    kernel.name,
                    kernel.release,
                    run.accel,
                    run.exit_code,
                    run.boot.as_secs_f64(),
                    run.elapsed.as_secs_f64(),
                    started.elapsed().as_secs_f64(),
                    f.map(|f| format!("; {f}")).unwrap_or_default(),
                )
            }
            Err(e) => {
                failed = true;
                format!("{} ({}): FAILED: {e:#}", kernel.name, kernel.release)
            }
        };
        eprintln!("xtask vm: {line}");
        summary.push(line);
    }
    // `--all`: the host's own kernel too, without a VM.
    if let (Some(tier), true) = (&tier, args.all) {
        let (code, f) = host_tier(tier)?;
        failed |= code != 0;
        last_code = code;
        let line = format!(
            "host ({}): exit {code}{}",
            release(),
            f.as_ref().map(|f| format!("; {f}")).unwrap_or_default()
        );
        figures.extend(f);
        eprintln!("xtask vm: {line}");
        summary.push(line);
    }
    if args.record {
        if tier.is_none() {
            bail!("--record records the kernel tier's figures: give no command and no --smoke");
        }
        for f in &figures {
            record(f)?;
        }
    }
    for line in &summary {
        println!("vm {line}");
    }
    // One guest: its command's status (1 when it did not get that far);
    // several: 1 when any failed.
    Ok(match (failed, kernels.len()) {
        (false, _) => ExitCode::SUCCESS,
        (true, 1) if last_code != 0 => ExitCode::from(last_code.clamp(1, 255) as u8),
        (true, _) => ExitCode::FAILURE,
    })
}

/// The kernel called `name` in the table (`6.1`, `6.12`, `sid`), downloaded
/// and extracted under `target/vm/kernels/<name>/` when it is not there yet;
/// `refresh` asks Debian for a newer one first.
pub(crate) fn kernel(name: &str, refresh: bool) -> Result<Kernel> {
    kernels::fetch(kernels::spec(name)?, refresh)
}

/// Installs what the guests need (setup.rs's package table: qemu-system-x86,
/// busybox-static, xz-utils, zstd) and checks it is there.
fn tools() -> Result<()> {
    crate::setup::packages()?;
    for (tool, package) in [
        ("qemu-system-x86_64", "qemu-system-x86"),
        ("busybox", "busybox-static"),
        ("apt-get", "apt"),
        ("dpkg", "dpkg"),
    ] {
        if which::which(tool).is_err() {
            bail!("{tool} is missing: install {package} (as root, `cargo xtask setup` does)");
        }
    }
    Ok(())
}

/// What [`smoke`] runs in the guest, with the host's /bin/sh.
const SMOKE: &str = r#"set -e
PATH="$PATH:/usr/sbin:/sbin"
echo "smoke: uname -r: $(uname -r)"
echo "smoke: cpus: $(nproc)"
echo "smoke: ls /sys/fs/bpf:"
ls -la /sys/fs/bpf
if [ -e /sys/kernel/btf/vmlinux ]; then
    echo "smoke: /sys/kernel/btf/vmlinux: present"
else
    echo "smoke: /sys/kernel/btf/vmlinux: MISSING"
    exit 1
fi
ip -br link
ip netns add t
ip -n t link add vm0 type veth peer name vm1
ip -n t link set vm0 up
ip -n t link set vm1 up
ip -n t -br link
ip netns del t
echo "smoke: veth in a netns: ok"
if command -v bpftool > /dev/null; then bpftool version; fi
echo "smoke: ok"
"#;

/// The smoke check: in a guest on `kernel`, prints `uname -r` (which must be
/// the kernel's release), the CPU count and `/sys/fs/bpf`, checks
/// `/sys/kernel/btf/vmlinux`, and makes a veth pair in a new network
/// namespace with the host's `ip` (which loads the veth module).
pub(crate) fn smoke(kernel: &Kernel, timeout: Duration) -> Result<GuestRun> {
    let command = ["/bin/sh".to_string(), "-c".to_string(), SMOKE.to_string()];
    let run = run_in_guest(kernel, Path::new("/"), &[], &command, timeout)?;
    if run.exit_code != 0 {
        return Ok(run);
    }
    let want = format!("smoke: uname -r: {}", kernel.release);
    if !run.console.iter().any(|l| l.trim() == want) {
        bail!(
            "the guest did not say {want:?}: it did not run kernel {}",
            kernel.release
        );
    }
    Ok(run)
}

/// The kernel tier's test binary and the daemon its veth check starts,
/// built on the host (debug, as `cargo xtask test` builds them).
pub(crate) struct Tier {
    /// `tests/tests/kernel/main.rs`'s binary.
    pub binary: PathBuf,
    /// `ratelimit`.
    pub daemon: PathBuf,
}

impl Tier {
    /// Builds both.
    pub(crate) fn build() -> Result<Self> {
        // The same build as `cargo xtask test`'s (the service's binary too):
        // another set of packages would unify features otherwise and build
        // the dependencies again.
        let daemon = crate::build_bin(true, true)?;
        eprintln!("xtask vm: building the kernel tier");
        let binary = crate::build_artifact(
            crate::cargo().args([
                "test",
                "--no-run",
                "--package",
                "ratelimit-tests",
                "--test",
                "kernel",
            ]),
            "kernel",
        )?;
        Ok(Self { binary, daemon })
    }
}

/// The line the kernel tier prints with its verifier figures
/// (`tests/src/verifier.rs`, `Figures::line`).
const FIGURES: &str = "ratelimit-kernel-figures ";

/// The kernel tier on `kernel`, in a guest: every test of the binary, one at
/// a time, as root, with `CI` set (a privileged test that would skip fails
/// instead). Answers the run and the figures line the tier printed.
pub(crate) fn kernel_tier(
    kernel: &Kernel,
    tier: &Tier,
    timeout: Duration,
) -> Result<(GuestRun, Option<String>)> {
    let env = [
        (
            "RATELIMIT_BIN".to_string(),
            tier.daemon.display().to_string(),
        ),
        ("CI".to_string(), "true".to_string()),
        ("RUST_BACKTRACE".to_string(), "1".to_string()),
    ];
    let command = [
        tier.binary.display().to_string(),
        "--test-threads=1".to_string(),
    ];
    let run = run_in_guest(kernel, &crate::workspace_root(), &env, &command, timeout)?;
    let figures = figures_in(&run.console);
    Ok((run, figures))
}

/// The kernel tier on the host's own kernel (no VM).
pub(crate) fn host_tier(tier: &Tier) -> Result<(i32, Option<String>)> {
    eprintln!("xtask vm: the kernel tier on this machine's kernel");
    let out = std::process::Command::new(&tier.binary)
        .arg("--test-threads=1")
        .env("RATELIMIT_BIN", &tier.daemon)
        .current_dir(crate::workspace_root())
        .stderr(std::process::Stdio::inherit())
        .output()
        .context("running the kernel tier")?;
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    print!("{text}");
    let lines: Vec<String> = text.lines().map(str::to_string).collect();
    Ok((out.status.code().unwrap_or(1), figures_in(&lines)))
}

/// The host's kernel release.
fn release() -> String {
    std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "unknown".into())
}

/// The figures line in `console`, from its marker on.
fn figures_in(console: &[String]) -> Option<String> {
    console
        .iter()
        .find_map(|l| l.find(FIGURES).map(|i| l[i..].trim().to_string()))
}

/// Writes the figures of `line` (`ratelimit-kernel-figures release=R
/// instructions=N stack=S`) into `tests/kernels.txt`, replacing its
/// kernel's line or adding one, dated today.
pub(crate) fn record(line: &str) -> Result<()> {
    let field = |key: &str| {
        line.split_whitespace()
            .find_map(|w| w.strip_prefix(key))
            .map(str::to_string)
            .with_context(|| format!("no {key} in {line:?}"))
    };
    let (release, instructions, stack) = (
        field("release=")?,
        field("instructions=")?,
        field("stack=")?,
    );
    let path = crate::workspace_root().join("tests/kernels.txt");
    let text =
        std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    let today = today()?;
    let new = format!("{release:<30} {instructions:<13} {stack:<6} {today}");
    let mut lines: Vec<String> = text
        .lines()
        .filter(|l| l.split_whitespace().next() != Some(release.as_str()))
        .map(str::to_string)
        .collect();
    lines.push(new);
    std::fs::write(&path, lines.join("\n") + "\n")
        .with_context(|| format!("writing {}", path.display()))?;
    eprintln!("xtask vm: recorded {release}: {instructions} instructions, {stack} bytes of stack");
    Ok(())
}

/// Today's date, `YYYY-MM-DD` (UTC), from `date`.
fn today() -> Result<String> {
    let out = std::process::Command::new("date")
        .args(["-u", "+%Y-%m-%d"])
        .output()
        .context("running date")?;
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}
