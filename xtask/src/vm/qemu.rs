//! Running one command in a qemu guest: [`run_in_guest`].
//!
//! What enters: a [`Kernel`] from `kernels.rs`, the working directory, the
//! environment and the command, and a time limit. What leaves: a
//! [`GuestRun`], with the command's exit status (parsed from the guest's
//! `RATELIMIT-VM-EXIT=` line), the console's lines, and the times. Called by
//! `vm/mod.rs` (the kernel tier, the smoke check, a command given to
//! `cargo xtask vm`), for `cargo xtask vm` and `cargo xtask test`.
//!
//! The guest: `qemu-system-x86_64`, 2 GiB, 2 vCPUs, no display, no network
//! card (`-nic none`), no reboot, the kernel's console on ttyS0, which is
//! qemu's stdout; the host's `/` shared read-only over 9p (`-virtfs`, mount
//! tag `hostroot`), which the initramfs (`initramfs.rs`) mounts and chroots
//! into. So host binaries run in the guest as they are, at the same paths,
//! and what they write outside /tmp, /run and /var/tmp (tmpfs in the guest)
//! fails: the guest cannot change the host.
//!
//! Acceleration: KVM when `/dev/kvm` opens and qemu runs with it, else TCG
//! (`-cpu max` in both). A KVM guest that does not start (qemu exits at
//! once, as with nested KVM that cannot set the CPU's MSRs) or does not reach
//! `/init` within [`KVM_INIT_LIMIT`] is killed, and it and every later run of
//! this process use TCG. TCG runs single-threaded (`thread=single`: both
//! vCPUs on one host thread, taking turns): with qemu 7.2's multi-threaded
//! TCG, sid's kernel died about one boot in twenty with `Oops: int3` in code
//! a static key had just patched (text_poke_bp seeing a stale int3 on the
//! other vCPU), and the same patching happens at run time whenever a static
//! key flips (attaching XDP, BPF statistics). `RATELIMIT_VM_ACCEL` forces a
//! choice, with no fallback: `kvm`, `tcg`, or `tcg-multi` (multi-threaded
//! TCG, faster when both vCPUs are busy, with that risk).
//!
//! The qemu process is killed when the time limit passes, and when this
//! process panics or returns early ([`Qemu`]'s Drop).

use std::{
    fs,
    io::{BufRead as _, BufReader, Read},
    path::Path,
    process::{Child, Command, Stdio},
    sync::{
        atomic::{AtomicBool, AtomicU32, Ordering},
        mpsc,
    },
    thread,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};

use super::{
    initramfs::{self, ERROR_MARKER, EXIT_MARKER, INIT_MARKER},
    kernels::Kernel,
};

/// How one guest run went.
#[derive(Debug)]
pub(crate) struct GuestRun {
    /// The command's exit status in the guest (the shell's: 128+N when a
    /// signal N ended it, 127 when it was not found).
    pub exit_code: i32,
    /// The console's lines (kernel messages, the command's stdout and
    /// stderr), without the `\r`s and terminal escapes.
    pub console: Vec<String>,
    /// `kvm`, `tcg` (single-threaded) or `tcg-multi`.
    pub accel: &'static str,
    /// From qemu's start to the exit line: boot, the command, and all.
    pub elapsed: Duration,
    /// From qemu's start to `/init`'s first line.
    pub boot: Duration,
}

/// How long a KVM guest has to reach `/init` before it is taken as broken.
const KVM_INIT_LIMIT: Duration = Duration::from_secs(30);

/// Set when KVM failed once: the later runs of this process use TCG.
static KVM_BROKEN: AtomicBool = AtomicBool::new(false);

/// Runs `command` (searched in the host's PATH, as a shell would) in a guest
/// booted on `kernel`, in `cwd`, with the host's PATH and `env` added to a
/// small environment (HOME=/root, TERM=dumb). The console goes to stderr as
/// it comes, each line after `[vm <name>] `, and is kept in the result.
///
/// Errors: qemu does not start or dies, the guest cannot mount the host or
/// load a module (`RATELIMIT-VM-ERROR=`), no exit line within `timeout`
/// (the guest is killed). A command that fails is not an error: its status
/// is in [`GuestRun::exit_code`].
pub(crate) fn run_in_guest(
    kernel: &Kernel,
    cwd: &Path,
    env: &[(String, String)],
    command: &[String],
    timeout: Duration,
) -> Result<GuestRun> {
    if command.is_empty() {
        bail!("no command to run in the guest");
    }
    if let Some((k, _)) = env.iter().find(|(k, _)| {
        k.is_empty()
            || k.starts_with(|c: char| c.is_ascii_digit())
            || !k.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
    }) {
        bail!("{k:?} is not a name sh can export");
    }
    let script = script(cwd, env, command);
    let archive = initramfs::build(kernel, &script, &kept(cwd, env, command))?;
    let dir = crate::workspace_root().join("target/vm/run");
    fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    static RUN: AtomicU32 = AtomicU32::new(0);
    let initrd = dir.join(format!(
        "{}-{}-{}.cpio",
        kernel.name,
        std::process::id(),
        RUN.fetch_add(1, Ordering::Relaxed)
    ));
    fs::write(&initrd, &archive).with_context(|| format!("writing {}", initrd.display()))?;
    let _remove = RemoveOnDrop(&initrd);

    let forced = std::env::var("RATELIMIT_VM_ACCEL")
        .ok()
        .filter(|a| !a.is_empty());
    let accel: &'static str = match forced.as_deref() {
        Some("kvm") => "kvm",
        Some("tcg") => "tcg",
        Some("tcg-multi") => "tcg-multi",
        Some(other) => bail!("RATELIMIT_VM_ACCEL={other}: kvm, tcg or tcg-multi"),
        None if !KVM_BROKEN.load(Ordering::Relaxed) && kvm_opens() => "kvm",
        None => "tcg",
    };
    match boot(kernel, &initrd, accel, timeout, forced.is_none()) {
        Err(Boot::KvmFailed(why)) => {
            eprintln!("xtask vm: qemu with KVM failed ({why}); using TCG from now on");
            KVM_BROKEN.store(true, Ordering::Relaxed);
            boot(kernel, &initrd, "tcg", timeout, false).map_err(Boot::into_error)
        }
        other => other.map_err(Boot::into_error),
    }
}

/// Why a boot failed.
enum Boot {
    /// KVM did not get the guest to `/init`: worth a try with TCG.
    KvmFailed(String),
    Other(anyhow::Error),
}

impl Boot {
    fn into_error(self) -> anyhow::Error {
        match self {
            Boot::KvmFailed(why) => anyhow::anyhow!("qemu with KVM failed: {why}"),
            Boot::Other(e) => e,
        }
    }
}

impl From<anyhow::Error> for Boot {
    fn from(e: anyhow::Error) -> Self {
        Boot::Other(e)
    }
}

/// Whether /dev/kvm exists and opens for reading and writing.
fn kvm_opens() -> bool {
    fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/kvm")
        .is_ok()
}

/// The script `/init` runs in the chroot with the host's /bin/sh.
fn script(cwd: &Path, env: &[(String, String)], command: &[String]) -> String {
    let mut s = String::from("# written by cargo xtask vm\n");
    let path = std::env::var("PATH").unwrap_or_else(|_| "/usr/sbin:/usr/bin:/sbin:/bin".into());
    s.push_str(&format!("export PATH={}\n", quote(&path)));
    s.push_str("export HOME=/root TERM=dumb\n");
    for (k, v) in env {
        s.push_str(&format!("export {k}={}\n", quote(v)));
    }
    s.push_str(&format!(
        "cd {} || exit 125\n",
        quote(&cwd.to_string_lossy())
    ));
    let words: Vec<String> = command.iter().map(|w| quote(w)).collect();
    s.push_str(&format!("exec {}\n", words.join(" ")));
    s
}

/// The host directories under the guest's tmpfs mounts (/tmp, /run,
/// /var/tmp) that the command needs: its working directory and the
/// directories of the absolute paths among its words and its environment's
/// values; none inside another.
fn kept(cwd: &Path, env: &[(String, String)], command: &[String]) -> Vec<String> {
    let covered = |p: &Path| {
        ["/tmp", "/run", "/var/tmp"]
            .iter()
            .any(|d| p.starts_with(d) && p != Path::new(d))
    };
    let mut dirs: Vec<std::path::PathBuf> = vec![cwd.to_path_buf()];
    for word in command.iter().chain(env.iter().map(|(_, v)| v)) {
        let p = Path::new(word);
        if p.is_absolute()
            && let Some(dir) = p.parent()
        {
            dirs.push(dir.to_path_buf());
        }
    }
    dirs.retain(|d| covered(d) && d.is_dir());
    dirs.sort();
    dirs.dedup();
    let all = dirs.clone();
    dirs.retain(|d| !all.iter().any(|o| o != d && d.starts_with(o)));
    dirs.iter().map(|d| d.display().to_string()).collect()
}

/// `word` in single quotes for sh.
fn quote(word: &str) -> String {
    format!("'{}'", word.replace('\'', r"'\''"))
}

/// The qemu process, killed when dropped.
struct Qemu(Child);

impl Drop for Qemu {
    fn drop(&mut self) {
        if let Ok(None) = self.0.try_wait() {
            let _ = self.0.kill();
        }
        let _ = self.0.wait();
    }
}

/// Removes the per-run initramfs.
struct RemoveOnDrop<'a>(&'a Path);

impl Drop for RemoveOnDrop<'_> {
    fn drop(&mut self) {
        let _ = fs::remove_file(self.0);
    }
}

/// What the reader threads send.
enum Event {
    /// A console line (qemu's stdout).
    Console(String),
    /// A line qemu itself wrote (its stderr).
    Qemu(String),
    /// qemu's stdout closed: it exited.
    Closed,
}

fn boot(
    kernel: &Kernel,
    initrd: &Path,
    accel: &'static str,
    timeout: Duration,
    may_fall_back: bool,
) -> Result<GuestRun, Boot> {
    let accel_arg = match accel {
        "kvm" => "kvm",
        "tcg-multi" => "tcg,thread=multi",
        _ => "tcg,thread=single",
    };
    let mut cmd = Command::new("qemu-system-x86_64");
    cmd.args([
        "-accel", accel_arg, "-cpu", "max", "-m", "2048", "-smp", "2",
    ])
    .args(["-nographic", "-nodefaults", "-no-user-config", "-no-reboot"])
    .args(["-serial", "stdio", "-nic", "none"])
    .arg("-kernel")
    .arg(&kernel.vmlinuz)
    .arg("-initrd")
    .arg(initrd)
    .args(["-append", "console=ttyS0 panic=-1 quiet"])
    .args([
        "-virtfs",
        "local,path=/,mount_tag=hostroot,security_model=none,readonly=on,multidevs=remap",
    ])
    // Not a terminal: qemu leaves the caller's terminal settings alone.
    .stdin(Stdio::null())
    .stdout(Stdio::piped())
    .stderr(Stdio::piped());
    eprintln!(
        "xtask vm: booting {} ({}) with {accel}",
        kernel.name, kernel.release
    );
    let start = Instant::now();
    let child = cmd
        .spawn()
        .context("starting qemu-system-x86_64 (package qemu-system-x86)")?;
    let mut qemu = Qemu(child);
    let (tx, rx) = mpsc::channel();
    let stdout = qemu.0.stdout.take().context("qemu's stdout")?;
    let stderr = qemu.0.stderr.take().context("qemu's stderr")?;
    let out_tx = tx.clone();
    thread::spawn(move || read_console(stdout, &out_tx));
    thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if tx.send(Event::Qemu(line)).is_err() {
                break;
            }
        }
    });

    let prefix = format!("[vm {}] ", kernel.name);
    let deadline = start + timeout;
    let mut console = Vec::new();
    let mut qemu_said = Vec::new();
    let mut boot = None;
    let mut exit: Option<(i32, Instant)> = None;
    loop {
        let now = Instant::now();
        let mut wait = deadline.saturating_duration_since(now);
        let kvm_watch = accel == "kvm" && may_fall_back && boot.is_none();
        if kvm_watch {
            wait = wait.min((start + KVM_INIT_LIMIT).saturating_duration_since(now));
        }
        // After the exit line, qemu has a few seconds to power off.
        if let Some((_, at)) = exit {
            wait = wait.min((at + Duration::from_secs(10)).saturating_duration_since(now));
        }
        match rx.recv_timeout(wait) {
            Ok(Event::Console(line)) => {
                eprintln!("{prefix}{line}");
                if boot.is_none() && line.contains(INIT_MARKER) {
                    boot = Some(start.elapsed());
                }
                if let Some(code) = line.trim().strip_prefix(EXIT_MARKER) {
                    let code = code
                        .trim()
                        .parse()
                        .with_context(|| format!("a bad exit line: {line:?}"))?;
                    exit = Some((code, Instant::now()));
                }
                if let Some(what) = line.trim().strip_prefix(ERROR_MARKER) {
                    return Err(Boot::Other(anyhow::anyhow!(
                        "the guest ({} {}) failed before the command: {what}",
                        kernel.name,
                        kernel.release
                    )));
                }
                console.push(line);
            }
            Ok(Event::Qemu(line)) => {
                eprintln!("{prefix}qemu: {line}");
                qemu_said.push(line);
            }
            Ok(Event::Closed) | Err(mpsc::RecvTimeoutError::Disconnected) => break,
            Err(mpsc::RecvTimeoutError::Timeout) => {
                if exit.is_some() {
                    eprintln!("xtask vm: the guest did not power off; killing qemu");
                    break;
                }
                if kvm_watch {
                    return Err(Boot::KvmFailed(format!(
                        "no /init after {} s",
                        KVM_INIT_LIMIT.as_secs()
                    )));
                }
                return Err(Boot::Other(anyhow::anyhow!(
                    "the guest ({} {}) did not finish within {} s: killed",
                    kernel.name,
                    kernel.release,
                    timeout.as_secs()
                )));
            }
        }
    }
    drop(qemu);
    let Some((exit_code, at)) = exit else {
        // qemu's own first complaint, when it made one (it was echoed above).
        let why = qemu_said
            .first()
            .map_or_else(|| "no exit line on the console".to_string(), Clone::clone);
        if accel == "kvm" && may_fall_back && boot.is_none() {
            return Err(Boot::KvmFailed(why));
        }
        return Err(Boot::Other(anyhow::anyhow!(
            "qemu ended before the guest ({} {}) printed its exit line: {why}",
            kernel.name,
            kernel.release
        )));
    };
    Ok(GuestRun {
        exit_code,
        console,
        accel,
        elapsed: at - start,
        boot: boot.unwrap_or_default(),
    })
}

/// Sends qemu's stdout line by line, without `\r` and escape sequences
/// (SeaBIOS clears the screen).
fn read_console(stdout: impl Read, tx: &mpsc::Sender<Event>) {
    let mut reader = BufReader::new(stdout);
    let mut buf = Vec::new();
    loop {
        buf.clear();
        match reader.read_until(b'\n', &mut buf) {
            Ok(0) | Err(_) => break,
            Ok(_) => {
                if tx.send(Event::Console(clean(&buf))).is_err() {
                    return;
                }
            }
        }
    }
    let _ = tx.send(Event::Closed);
}

/// A console line as text: escape sequences and control characters dropped.
fn clean(raw: &[u8]) -> String {
    let text = String::from_utf8_lossy(raw);
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '\x1b' {
            // CSI: ESC [ params final-byte; other escapes: ESC and one char.
            if chars.peek() == Some(&'[') {
                chars.next();
                for c in chars.by_ref() {
                    if ('\x40'..='\x7e').contains(&c) {
                        break;
                    }
                }
            } else {
                chars.next();
            }
        } else if c == '\t' || !c.is_control() {
            out.push(c);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::{clean, quote, script};

    #[test]
    fn drops_escapes_and_carriage_returns() {
        assert_eq!(clean(b"\x1bc\x1b[?7l\x1b[2JSeaBIOS\r\n"), "SeaBIOS");
        assert_eq!(clean(b"RATELIMIT-VM-EXIT=0\r\n"), "RATELIMIT-VM-EXIT=0");
    }

    #[test]
    fn quotes_for_sh() {
        assert_eq!(quote("it's"), r"'it'\''s'");
        let s = script(
            Path::new("/work"),
            &[("A".into(), "b c".into())],
            &["echo".into(), "x y".into()],
        );
        assert!(s.contains("export A='b c'\n"));
        assert!(s.contains("cd '/work' || exit 125\n"));
        assert!(s.ends_with("exec 'echo' 'x y'\n"));
    }
}
