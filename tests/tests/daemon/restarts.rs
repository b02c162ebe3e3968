//! Restarts, lost changes and false "enforcing" (issue 23, items 3, 4, 5,
//! 11 and 12): a start with a changed config after `--keep-attached` and
//! after SIGKILL; a change the daemon cannot save; `ip netns exec … cargo
//! xtask run`; a change that times out under a large list; pins removed
//! under a running daemon. Each checks what the kernel does with traffic,
//! not what the daemon says.

use std::{
    net::IpAddr,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    thread::sleep,
    time::{Duration, Instant},
};

use ratelimit_tests::{
    ChildGuard, Daemon, TempDir,
    check::{ip, ipv6_list},
    fixture::Host,
    net::{Pair, pin_dirs, pin_dirs_of},
    privileged, ratelimit_bin,
};

/// A config of `deny` rules for each address.
fn denies(addrs: &[IpAddr]) -> String {
    addrs
        .iter()
        .map(|a| format!("[[rule]]\ncidr = \"{a}\"\naction = \"deny\"\n"))
        .collect()
}

fn write(dir: &Path, name: &str, text: &str) -> String {
    let p = dir.join(name);
    std::fs::write(&p, text).expect("writing a config");
    p.to_str().expect("utf-8").to_string()
}

/// Six addresses in 198.18.`third`.0/24.
fn six(third: u8) -> Vec<IpAddr> {
    (1..=6)
        .map(|i| ip(&format!("198.18.{third}.{i}")))
        .collect()
}

/// Of `sources`, those whose frames the receiver got none of (sent at
/// 200/s each for 300 ms).
fn dropped(pair: &Pair, sources: &[IpAddr]) -> Vec<IpAddr> {
    let flows: Vec<(IpAddr, u32)> = sources.iter().map(|s| (*s, 200)).collect();
    let got = pair.probe(&flows, Duration::from_millis(300));
    sources
        .iter()
        .filter(|s| got.get(s).copied().unwrap_or(0) == 0)
        .copied()
        .collect()
}

/// (Item 3) A start with a changed config enforces exactly what it
/// announces: after a `--keep-attached` stop (the shipped unit's restart) and
/// after a SIGKILL, the new file's denies drop and the old file's do not.
#[test]
fn a_start_with_a_changed_config_enforces_what_it_announces() {
    privileged!("a_start_with_a_changed_config_enforces_what_it_announces");
    let h = Host::bare("changed");
    let (a, b, c) = (six(10), six(20), six(30));
    let file_a = h.write("a.toml", &denies(&a));
    let file_b = h.write("b.toml", &denies(&b));
    let file_c = h.write("c.toml", &denies(&c));
    let all: Vec<IpAddr> = a.iter().chain(&b).chain(&c).copied().collect();

    let d = h.daemon(&["--keep-attached", "--config", &file_a]);
    assert_eq!(dropped(&h.pair, &all), a, "A's denies, before any restart");
    assert_eq!(d.stop(libc::SIGTERM).code(), Some(0));
    assert_eq!(
        dropped(&h.pair, &all),
        a,
        "--keep-attached keeps A enforcing"
    );

    // The unit's way: started again with the file, now B.
    let d = h.daemon(&["--keep-attached", "--config", &file_b]);
    assert!(
        d.output().contains("took over the running program"),
        "{}",
        d.output()
    );
    assert_eq!(
        dropped(&h.pair, &all),
        b,
        "after a --keep-attached restart with B, exactly B's denies must drop; the daemon said: {}",
        d.output()
    );
    d.stop(libc::SIGKILL);
    assert_eq!(dropped(&h.pair, &all), b, "a SIGKILL leaves B enforcing");

    let d = h.daemon(&["--config", &file_c]);
    assert_eq!(
        dropped(&h.pair, &all),
        c,
        "after a SIGKILL and a start with C, exactly C's denies must drop; the daemon said: {}",
        d.output()
    );
    assert_eq!(d.stop(libc::SIGTERM).code(), Some(0));
    assert!(!h.pair.rx_has_xdp(), "a plain stop detaches");
}

/// A restart whose `--rate` is overridden by an earlier live `set default`
/// said so only in general ("(live: …, the default rule among them)"). Its
/// announcement now names the overridden options, their value and what is
/// enforced instead.
#[test]
fn a_restart_names_the_default_a_live_change_overrides() {
    privileged!("a_restart_names_the_default_a_live_change_overrides");
    let h = Host::bare("overridden");
    let d = h.daemon(&["--rate", "100/s", "--burst", "100"]);
    d.cli_ok(&["set", "default", "--rate", "50/s", "--burst", "50"]);
    assert_eq!(d.stop(libc::SIGTERM).code(), Some(0));
    let d = h.daemon(&["--rate", "200/s", "--burst", "200"]);
    let out = d.output();
    let line = out
        .lines()
        .find(|l| l.contains("is overridden"))
        .unwrap_or_else(|| panic!("no line names the overridden default: {out}"));
    assert!(
        line.contains("--rate/--burst")
            && line.contains("200/s burst 200")
            && line.contains("set live before this start, limit 50/s burst 50"),
        "{line}"
    );
    let list = d.json(&["list"]);
    assert!(
        list["default"]["text"]
            .as_str()
            .unwrap_or("")
            .contains("50/s"),
        "the live default is not the one enforced: {list}"
    );
    d.cli_ok(&["reset", "--live"]);
    let list = d.json(&["list"]);
    assert!(
        list["default"]["text"]
            .as_str()
            .unwrap_or("")
            .contains("200/s"),
        "reset --live did not bring back --rate: {list}"
    );
    assert_eq!(d.stop(libc::SIGTERM).code(), Some(0));
}

/// The workspace root (where `cargo xtask` is defined).
fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the tests crate is in the workspace")
        .to_path_buf()
}

/// `ratelimit ARGS --iface IFACE` on `h` run under `ip netns exec` (a mount
/// namespace of its own, as a user's shell there has).
fn exec_cli(h: &Host, args: &[&str]) -> std::process::Output {
    Command::new("ip")
        .args(["netns", "exec", &h.pair.rx.name])
        .arg(ratelimit_bin())
        .args(args)
        .args(["--iface", &h.pair.rx_if])
        .env("RATELIMIT_RUN_DIR", h.run_dir())
        .output()
        .expect("running the CLI under ip netns exec")
}

/// (Item 5) `ip netns exec NS cargo xtask run --iface IF -- --keep-attached`:
/// the daemon's parent (xtask) shares its private mount namespace, whose
/// /sys has no bpffs. Pins must still land in the system's bpffs: after
/// Ctrl-C (SIGINT to the process group) the program stays attached and
/// enforcing, as the daemon says; after a SIGKILL too; and the CLI, itself
/// under `ip netns exec`, reads the pins.
#[test]
fn ip_netns_exec_cargo_xtask_run_pins_where_pins_outlive_it() {
    use std::os::unix::process::CommandExt as _;
    privileged!("ip_netns_exec_cargo_xtask_run_pins_where_pins_outlive_it");
    // xtask builds the daemon before it starts it, without what `cargo test`
    // sets about its package (ring's build script reruns when CARGO_PKG_NAME,
    // CARGO_MANIFEST_DIR … differ): done here the same way beforehand, so the
    // start below is timed on starting, not on compiling.
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    for args in [
        &["build", "--package", "xtask"][..],
        &["build", "--package", "ratelimit-user", "--bin", "ratelimit"],
    ] {
        let mut build = Command::new(&cargo);
        for (var, _) in std::env::vars_os() {
            let v = var.to_string_lossy();
            if v.starts_with("CARGO_PKG_")
                || v.starts_with("CARGO_MANIFEST_")
                || v.starts_with("CARGO_BIN_")
                || ["OUT_DIR", "CARGO_CRATE_NAME", "CARGO_PRIMARY_PACKAGE"].contains(&v.as_ref())
            {
                build.env_remove(&var);
            }
        }
        let built = build
            .args(args)
            .current_dir(workspace())
            .output()
            .expect("running cargo build");
        let said = String::from_utf8_lossy(&built.stderr);
        let tail: Vec<&str> = said.lines().rev().take(60).collect();
        assert!(
            built.status.success(),
            "cargo {args:?}: {}; the end of what it said:\n{}",
            built.status,
            tail.into_iter().rev().collect::<Vec<_>>().join("\n")
        );
    }
    let h = Host::bare("xtask");
    let denied = ip("198.18.50.1");
    let cfg = h.write("deny.toml", &denies(&[denied]));
    let xtask = || {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &h.pair.rx.name])
            .arg(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
            .args(["xtask", "run", "--iface", &h.pair.rx_if, "--"])
            .args(["--keep-attached", "--config", &cfg])
            .current_dir(workspace())
            // A group of its own, as a terminal's foreground job.
            .process_group(0);
        c
    };
    let d = h.spawn(xtask());
    let _group = Group(d.child.pid());
    assert_eq!(
        pin_dirs(&h.pair.rx_if).len(),
        1,
        "no pins in the system's bpffs"
    );
    assert_eq!(dropped(&h.pair, &[denied]), [denied]);

    // Ctrl-C: SIGINT to the whole foreground group.
    // SAFETY: kill(2) on the group the test made.
    unsafe { libc::kill(-d.child.pid(), libc::SIGINT) };
    let out = d.child.wait(Duration::from_secs(20));
    assert!(out.status.success(), "xtask after Ctrl-C: {:?}", out.status);
    let log = std::fs::read_to_string(&d.log).unwrap_or_default();
    assert!(log.contains("keeps enforcing"), "{log}");
    assert!(
        h.pair.rx_has_xdp(),
        "the daemon said it keeps enforcing; nothing is attached"
    );
    assert_eq!(
        pin_dirs(&h.pair.rx_if).len(),
        1,
        "the pins went with the command"
    );
    let flows = [(denied, 2000u32)];
    let got = h.pair.probe(&flows, Duration::from_secs(1));
    assert_eq!(
        got.get(&denied).copied().unwrap_or(0),
        0,
        "a denied source passed after Ctrl-C"
    );
    let status = exec_cli(&h, &["status", "--json"]);
    let status: serde_json::Value =
        serde_json::from_slice(&status.stdout).expect("status --json from the pins");
    assert_eq!(
        (status["daemon"].clone(), status["rules"].clone()),
        (false.into(), 1.into()),
        "{status}"
    );

    // Started again the same way it adopts; a SIGKILL then leaves it enforcing.
    let d = h.spawn(xtask());
    let _group = Group(d.child.pid());
    let status = d.json(&["status"]);
    assert_eq!(status["took_over_link"], true, "{status}");
    let pid = status["pid"].as_i64().expect("the daemon's pid") as i32;
    // SAFETY: kill(2) on the daemon's pid.
    unsafe { libc::kill(pid, libc::SIGKILL) };
    let _ = d.child.wait(Duration::from_secs(20));
    assert!(h.pair.rx_has_xdp(), "a SIGKILL took the program");
    let got = h.pair.probe(&[(denied, 4000)], Duration::from_secs(1));
    assert_eq!(
        got.get(&denied).copied().unwrap_or(0),
        0,
        "a denied source passed after SIGKILL"
    );
    let out = exec_cli(&h, &["list"]);
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("198.18.50.1/32"),
        "the CLI under ip netns exec cannot read the pins: {}",
        String::from_utf8_lossy(&out.stderr)
    );

    // `kill -TERM` to the command alone (what `timeout` sends), not to its
    // group: xtask hands it to the daemon, which stops (keeping the program
    // attached, as asked) and xtask exits with it; no daemon is orphaned.
    let d = h.spawn(xtask());
    let _group = Group(d.child.pid());
    let pid = d.json(&["status"])["pid"]
        .as_i64()
        .expect("the daemon's pid") as i32;
    // SAFETY: kill(2) on the process the test started.
    unsafe { libc::kill(d.child.pid(), libc::SIGTERM) };
    let out = d.child.wait(Duration::from_secs(20));
    assert!(
        out.status.success(),
        "xtask after SIGTERM: {:?}",
        out.status
    );
    // SAFETY: kill(2) with signal 0 only asks whether the pid exists.
    let alive = unsafe { libc::kill(pid, 0) } == 0;
    assert!(!alive, "the daemon {pid} outlived xtask's SIGTERM");
    assert!(h.pair.rx_has_xdp(), "--keep-attached: still enforcing");
}

/// A process group (xtask and the daemon it started), killed on drop so a
/// failing test leaves no daemon behind; a negative number is one process.
struct Group(i32);

impl Drop for Group {
    fn drop(&mut self) {
        // SAFETY: kill(2) on a group (or process) the test made.
        unsafe { libc::kill(-self.0, libc::SIGKILL) };
    }
}

/// A tmpfs of `size` mounted on a fresh directory (mode 0700, root's),
/// unmounted and removed on drop.
struct Tmpfs(PathBuf);

impl Tmpfs {
    fn new(tag: &str, size: &str) -> Self {
        let dir = std::env::temp_dir().join(format!(
            "ratelimit-tmpfs-{tag}-{}",
            ratelimit_tests::unique_tag()
        ));
        std::fs::create_dir_all(&dir).expect("mkdir");
        let out = Command::new("mount")
            .args([
                "-t",
                "tmpfs",
                "-o",
                &format!("size={size},mode=0700"),
                "tmpfs",
            ])
            .arg(&dir)
            .output()
            .expect("mount");
        assert!(
            out.status.success(),
            "mount tmpfs: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Self(dir)
    }

    /// Fills it to the last byte; the filler file's path.
    fn fill(&self) -> PathBuf {
        use std::io::Write as _;
        let filler = self.0.join("filler");
        let mut f = std::fs::File::create(&filler).expect("filler");
        let block = vec![0u8; 4096];
        // Bounded by the tmpfs's size.
        while f.write_all(&block).is_ok() {}
        let one = [0u8; 1];
        while f.write_all(&one).is_ok() {}
        filler
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).output();
        let _ = std::fs::remove_dir(&self.0);
    }
}

/// (Item 4) A change that cannot be saved (the run directory is full) is
/// refused, exit 4, nothing changed; once there is room it is saved and
/// survives the unit's restart (`--keep-attached`, then a start with the
/// config). Never acknowledged and lost.
#[test]
fn a_change_that_cannot_be_saved_is_refused_not_acknowledged_and_lost() {
    privileged!("a_change_that_cannot_be_saved_is_refused_not_acknowledged_and_lost");
    let pair = Pair::new();
    let run = Tmpfs::new("full", "256k");
    let configs = TempDir::new("full-config");
    let cfg = write(&configs.0, "rules.toml", "[default]\nrate = \"1000/s\"\n");
    let start = || {
        Daemon::start(
            &pair.rx,
            &pair.rx_if,
            &run.0,
            &["--keep-attached", "--config", &cfg],
        )
    };
    let d = start();
    let filler = run.fill();
    let out = d.cli(&["deny", "198.18.51.0/24"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        out.status.code(),
        Some(4),
        "a change the daemon cannot save must be refused; it said: {stderr} {}",
        String::from_utf8_lossy(&out.stdout)
    );
    assert!(
        stderr.contains("cannot be saved") && stderr.contains("nothing was changed"),
        "{stderr}"
    );
    let source = ip("198.18.51.7");
    assert!(
        dropped(&pair, &[source]).is_empty(),
        "the refused deny is enforced"
    );
    assert!(!d.cli_ok(&["list"]).contains("198.18.51.0/24"));

    std::fs::remove_file(&filler).expect("freeing the tmpfs");
    d.cli_ok(&["deny", "198.18.51.0/24"]);
    assert_eq!(d.stop(libc::SIGTERM).code(), Some(0));
    let d = start();
    assert!(
        d.cli_ok(&["list"]).contains("198.18.51.0/24"),
        "the saved deny is gone after a restart"
    );
    assert_eq!(
        dropped(&pair, &[source]),
        [source],
        "the saved deny is not enforced after a restart"
    );
    // Its stale pieces are not left in the run directory either.
    let leftovers: Vec<String> = walk(&run.0)
        .into_iter()
        .filter(|n| n.ends_with(".tmp"))
        .collect();
    assert!(leftovers.is_empty(), "temporary files left: {leftovers:?}");
    d.stop(libc::SIGTERM);
}

/// Every file name under `dir`.
fn walk(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        if e.path().is_dir() {
            out.extend(walk(&e.path()));
        } else {
            out.push(e.file_name().to_string_lossy().into_owned());
        }
    }
    out
}

/// (Item 11) No answer is not a refusal: a command that times out (the
/// daemon stopped with SIGSTOP) exits 6 and says the change may have been
/// applied; once the daemon runs again the change it had queued is there.
/// Concurrent changes under a large list all answer, and all are applied.
#[test]
fn no_answer_is_not_a_refusal_and_changes_under_a_large_list_answer() {
    privileged!("no_answer_is_not_a_refusal_and_changes_under_a_large_list_answer");
    let (h, d) = Host::start("noanswer", &[]);
    d.child.signal(libc::SIGSTOP);
    let out = d
        .cli_command(&["deny", "198.18.52.0/24"])
        .env("RATELIMIT_TIMEOUT", "2")
        .stdin(Stdio::null())
        .output()
        .expect("cli");
    d.child.signal(libc::SIGCONT);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        out.status.code(),
        Some(6),
        "a command without an answer: {stderr}"
    );
    assert!(
        stderr.contains("may have been applied") && !stderr.contains("nothing was changed"),
        "{stderr}"
    );
    let start = Instant::now();
    while !d.cli_ok(&["list"]).contains("198.18.52.0/24") {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "the queued change was never applied"
        );
        sleep(Duration::from_millis(50));
    }

    // A list of 200 000 entries, then 20 changes at once: each answers, and
    // each is applied.
    let list = h.write("big.list", &ipv6_list(200_000));
    d.cli_ok(&["deny", "--from", &list, "--name", "big"]);
    let changes: Vec<_> = (0..20)
        .map(|i| {
            let mut c = d.cli_command(&["deny", &format!("198.18.60.{i}/32")]);
            c.stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped());
            ChildGuard::spawn(c, "ratelimit deny")
        })
        .collect();
    for c in changes {
        let out = c.wait(Duration::from_secs(40));
        assert!(
            out.status.success(),
            "a change under a large list: {:?} {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let listed = d.cli_ok(&["list"]);
    for i in 0..20 {
        assert!(
            listed.contains(&format!("198.18.60.{i}/32")),
            "change {i} is missing"
        );
    }
    d.stop(libc::SIGTERM);
}

/// (Item 12) The pin directory removed under a running `--keep-attached`
/// daemon: `status` still says attached (it asks the link, not its pin), the
/// daemon pins everything again within seconds, and a SIGKILL afterwards
/// leaves the program enforcing, for the next start to adopt.
#[test]
fn pins_removed_under_a_running_daemon_are_pinned_again() {
    privileged!("pins_removed_under_a_running_daemon_are_pinned_again");
    let (h, d) = Host::start("unpinned", &["--keep-attached"]);
    let denied = ip("198.18.53.1");
    d.cli_ok(&["deny", "198.18.53.1/32"]);
    let dirs = pin_dirs(&h.pair.rx_if);
    assert_eq!(dirs.len(), 1);
    std::fs::remove_dir_all(&dirs[0]).expect("rm -r of the pin directory");
    let status = d.json(&["status"]);
    assert_eq!(status["interface"], "attached", "{status}");
    let start = Instant::now();
    while !(dirs[0].join("link").exists() && dirs[0].join("RL_CONFIG").exists()) {
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "the daemon did not pin again: {}",
            d.output()
        );
        sleep(Duration::from_millis(100));
    }
    sleep(Duration::from_millis(1500));
    let status = d.json(&["status"]);
    assert_eq!(status["interface"], "attached", "{status}");
    assert!(d.output().contains("pinned again"), "{}", d.output());

    d.stop(libc::SIGKILL);
    assert!(h.pair.rx_has_xdp(), "the SIGKILL took the program");
    assert_eq!(
        dropped(&h.pair, &[denied]),
        [denied],
        "the deny went with the SIGKILL"
    );
    let d = h.daemon(&[]);
    let status = d.json(&["status"]);
    assert_eq!(status["took_over_link"], true, "{status}");
    assert_eq!(d.stop(libc::SIGTERM).code(), Some(0));
}

/// The pins of a namespace deleted under a `--keep-attached` program (its
/// interface went with it, its maps hold kernel memory) are removed when a
/// daemon starts, in any namespace.
#[test]
fn pins_of_a_deleted_namespace_are_removed_at_the_next_start() {
    privileged!("pins_of_a_deleted_namespace_are_removed_at_the_next_start");
    let a = Pair::new();
    let run = TempDir::new("stale-pins");
    let d = Daemon::start(&a.rx, &a.rx_if, &run.0, &["--keep-attached"]);
    assert_eq!(d.stop(libc::SIGTERM).code(), Some(0));
    let dirs = pin_dirs(&a.rx_if);
    assert_eq!(dirs.len(), 1, "--keep-attached left no pins");
    let out = Command::new("ip")
        .args(["netns", "del", &a.rx.name])
        .output()
        .expect("ip netns del");
    assert!(out.status.success());
    let b = Pair::new();
    let d = Daemon::start(&b.rx, &b.rx_if, &run.0, &[]);
    assert!(
        !dirs[0].exists(),
        "the pins of a deleted namespace are still there: {}",
        d.output()
    );
    assert!(d.output().contains("removed the pins"), "{}", d.output());
    assert_eq!(d.stop(libc::SIGTERM).code(), Some(0));
}

/// A daemon SIGKILLed in a namespace that is then deleted leaves pins no
/// daemon will ever adopt (the cookie is never reused): the next daemon's
/// start removes them; `status` lists them with the kernel memory their maps
/// hold, and `gc` removes them, saying what it freed; the next `gc` finds
/// nothing, and the pins of a namespace alive stay.
#[test]
fn status_lists_the_pins_of_a_deleted_namespace_and_gc_removes_them() {
    privileged!("status_lists_the_pins_of_a_deleted_namespace_and_gc_removes_them");
    let run = TempDir::new("gc-pins");
    // Killed, and its namespace deleted: the namespace's pin directory.
    let orphan_of = |pair: &Pair| {
        let d = Daemon::start(&pair.rx, &pair.rx_if, &run.0, &[]);
        assert!(d.stop(libc::SIGKILL).code().is_none(), "killed");
        let dir = pin_dirs(&pair.rx_if)
            .pop()
            .expect("a SIGKILLed daemon's pins")
            .parent()
            .expect("its namespace's directory")
            .to_path_buf();
        let out = Command::new("ip")
            .args(["netns", "del", &pair.rx.name])
            .output()
            .expect("ip netns del");
        assert!(out.status.success());
        dir
    };
    let gc = || {
        let out = Command::new(ratelimit_bin())
            .args(["gc", "--json"])
            .output()
            .expect("ratelimit gc");
        assert!(out.status.success(), "{out:?}");
        serde_json::from_slice::<serde_json::Value>(&out.stdout).expect("gc's JSON")
    };
    let a = Pair::new();
    let first = orphan_of(&a);
    let live = Pair::new();
    let d = Daemon::start(&live.rx, &live.rx_if, &run.0, &[]);
    assert!(
        !first.exists(),
        "a daemon's start left {}: {}",
        first.display(),
        d.output()
    );
    let e = Pair::new();
    let orphan = orphan_of(&e);
    let status = d.json(&["status"]);
    let listed = status["orphaned_pins"]
        .as_array()
        .unwrap_or_else(|| panic!("no orphaned_pins in {status}"));
    let entry = listed
        .iter()
        .find(|o| o["dir"] == orphan.display().to_string())
        .unwrap_or_else(|| panic!("{} not listed: {status}", orphan.display()));
    // The IPv4 state map alone holds 1 M entries of 16-byte values.
    assert!(
        entry["bytes"].as_u64().unwrap_or(0) > 16 << 20,
        "its maps' memory: {entry}"
    );
    assert!(
        status["notes"].to_string().contains("ratelimit gc"),
        "the note says the way out: {status}"
    );
    let removed = gc();
    assert!(
        removed["removed"]
            .as_array()
            .expect("removed")
            .iter()
            .any(|o| o["dir"] == orphan.display().to_string()),
        "gc did not say it removed {}: {removed}",
        orphan.display()
    );
    assert!(!orphan.exists(), "gc left {}", orphan.display());
    let again = gc();
    assert_eq!(again["removed"], serde_json::json!([]), "{again}");
    assert_eq!(
        pin_dirs(&live.rx_if).len(),
        1,
        "gc removed the pins of a namespace alive"
    );
    assert_eq!(d.stop(libc::SIGTERM).code(), Some(0));
}

/// (Item 5) A daemon started in the background under `ip netns exec` from a
/// shell that is gone at once (its parent is then PID 1, which this process
/// may not be able to look at): its pins still land in the system's bpffs,
/// and `--keep-attached` keeps enforcing after it exits.
#[test]
fn a_background_daemon_under_ip_netns_exec_pins_where_pins_outlive_it() {
    privileged!("a_background_daemon_under_ip_netns_exec_pins_where_pins_outlive_it");
    let h = Host::bare("orphan");
    let log = h.path("daemon.log");
    let script = format!(
        "{} run --iface {} --keep-attached >{} 2>&1 &",
        ratelimit_bin().display(),
        h.pair.rx_if,
        log.display()
    );
    let out = Command::new("ip")
        .args(["netns", "exec", &h.pair.rx.name, "sh", "-c", &script])
        .env("RATELIMIT_RUN_DIR", h.run_dir())
        .output()
        .expect("starting in the background");
    assert!(out.status.success());
    let cli = |args: &[&str]| {
        h.command(args)
            .args(["--iface", &h.pair.rx_if])
            .output()
            .expect("cli")
    };
    let start = Instant::now();
    let pid = loop {
        let out = cli(&["status", "--json"]);
        if let Ok(v) = serde_json::from_slice::<serde_json::Value>(&out.stdout)
            && let Some(pid) = v["pid"].as_i64()
        {
            break pid as i32;
        }
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "the background daemon did not answer: {}",
            std::fs::read_to_string(&log).unwrap_or_default()
        );
        sleep(Duration::from_millis(100));
    };
    let kill = Group(-pid);
    assert_eq!(
        pin_dirs(&h.pair.rx_if).len(),
        1,
        "no pins in the system's bpffs: {}",
        std::fs::read_to_string(&log).unwrap_or_default()
    );
    // SAFETY: kill(2) on the daemon's pid.
    unsafe { libc::kill(pid, libc::SIGTERM) };
    sleep(Duration::from_secs(1));
    drop(kill);
    assert!(
        h.pair.rx_has_xdp(),
        "--keep-attached said it keeps enforcing"
    );
    assert_eq!(
        pin_dirs(&h.pair.rx_if).len(),
        1,
        "the pins went with the daemon"
    );
}

/// `ratelimit detach` stops a program left enforcing without a daemon: it is
/// refused while a daemon runs (stopping the daemon detaches), then the
/// program leaves the interface (a denied source passes again) and its pins
/// go; with nothing pinned it says so.
#[test]
fn detach_stops_a_program_left_without_a_daemon() {
    privileged!("detach_stops_a_program_left_without_a_daemon");
    let (h, d) = Host::start("detach", &["--keep-attached"]);
    let denied = ip("198.18.0.77");
    d.cli_ok(&["deny", "198.18.0.77"]);
    let passed = || {
        h.pair
            .probe(&[(denied, 200)], Duration::from_millis(300))
            .get(&denied)
            .copied()
            .unwrap_or(0)
    };
    let out = h.command(&["detach"]).output().expect("ratelimit detach");
    assert_eq!(
        out.status.code(),
        Some(4),
        "refused while a daemon runs: {out:?}"
    );
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("a daemon runs"),
        "{out:?}"
    );
    assert_eq!(d.stop(libc::SIGTERM).code(), Some(0));
    assert_eq!(passed(), 0, "--keep-attached keeps enforcing");
    let out = h.command(&["detach"]).output().expect("ratelimit detach");
    assert!(out.status.success(), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("detached from"),
        "{out:?}"
    );
    assert!(pin_dirs(&h.pair.rx_if).is_empty(), "the pins stayed");
    assert!(!h.pair.rx_has_xdp(), "the program stayed attached");
    assert!(passed() > 30, "the deny still holds after detach");
    // Again, with nothing left: nothing to do, and no error (a cleanup
    // script's second detach; it exited 4, "refused").
    for args in [&["detach"][..], &["detach", "--iface", &h.pair.rx_if]] {
        let out = h.command(args).output().expect("ratelimit detach");
        assert!(out.status.success(), "{args:?}: {out:?}");
        assert!(
            String::from_utf8_lossy(&out.stdout).contains("nothing to detach"),
            "{args:?}: {out:?}"
        );
    }
}

/// A rule deleted from the pinned maps by hand while no daemon runs
/// (`bpftool map delete pinned …`) comes back with the next daemon that
/// adopts the pins: the saved record holds the acknowledged rule, and it
/// wins over the tampered kernel.
#[test]
fn a_rule_deleted_from_the_pins_by_hand_comes_back_with_the_adoption() {
    privileged!("a_rule_deleted_from_the_pins_by_hand_comes_back_with_the_adoption");
    let (h, d) = Host::start("tamper", &["--keep-attached"]);
    let banned = ip("198.18.0.5");
    d.cli_ok(&["deny", "198.18.0.5", "-q"]);
    let pins = PathBuf::from(
        d.json(&["status"])["pins"]
            .as_str()
            .expect("status names the pins"),
    );
    assert!(d.stop(libc::SIGTERM).success(), "a clean stop");
    // The hand: the rule's entry deleted from the trie the program reads.
    delete_from_active_trie(&pins, "198.18.0.5");
    let got = h
        .pair
        .probe_sent(&[banned], 100, Duration::from_millis(400))[0];
    assert!(
        got.0 > 0 && got.1 == got.0,
        "tampered: the deny no longer drops: {got:?}"
    );
    let d = h.daemon(&[]);
    let got = h
        .pair
        .probe_sent(&[banned], 100, Duration::from_millis(400))[0];
    assert!(
        got.0 > 0 && got.1 == 0,
        "adopted: the deny is back: {got:?}"
    );
    assert!(
        d.output().contains("the saved rules are put back"),
        "the adoption says so: {}",
        d.output()
    );
    assert!(
        d.json(&["list"]).to_string().contains("198.18.0.5/32"),
        "the acknowledged deny is listed"
    );
}

/// What `bpftool map delete pinned …/RL_RULES key …` does: `cidr`'s entry
/// deleted from the trie the program reads.
fn delete_from_active_trie(pins: &std::path::Path, cidr: &str) {
    let maps = ratelimit_user::kernel::Maps::from_pins(pins).expect("the pinned maps");
    let active = maps.config().expect("config").active_rules & 1;
    let name = if active == 0 {
        ratelimit_common::MAP_RULES
    } else {
        ratelimit_common::MAP_RULES_B
    };
    let data = aya::maps::MapData::from_pin(pins.join(name)).expect("the pinned trie");
    let mut trie: aya::maps::LpmTrie<_, ratelimit_common::RuleAddr, u32> =
        aya::maps::LpmTrie::try_from(aya::maps::Map::LpmTrie(data)).expect("an LPM trie");
    let (bits, addr) = ratelimit_user::model::prefix::Prefix::parse("t", cidr)
        .expect("prefix")
        .lpm();
    trie.remove(&aya::maps::lpm_trie::Key::new(bits, addr))
        .expect("deleting the entry");
}

/// A rule and a list entry deleted from the pinned trie by hand while the
/// daemon runs are put back within the check's period (5 s), counted in
/// `status` and the metrics, and logged.
#[test]
fn a_rule_deleted_from_the_pins_by_hand_is_put_back_while_the_daemon_runs() {
    privileged!("a_rule_deleted_from_the_pins_by_hand_is_put_back_while_the_daemon_runs");
    let metrics = "127.0.0.1:9571";
    let (h, d) = Host::start("drift", &["--metrics", metrics]);
    let (rule, listed) = (ip("198.18.0.5"), ip("198.18.0.9"));
    d.cli_ok(&["deny", "198.18.0.5", "-q"]);
    let dir = ratelimit_tests::TempDir::new("drift-list");
    let list = dir.0.join("bad.txt");
    std::fs::write(&list, "198.18.0.9\n198.18.0.10\n").expect("writing the list");
    d.cli_ok(&[
        "deny",
        "--from",
        list.to_str().unwrap(),
        "--name",
        "bad",
        "-q",
    ]);
    // Settled: both tries hold the list.
    std::thread::sleep(Duration::from_millis(500));
    let pins = PathBuf::from(
        d.json(&["status"])["pins"]
            .as_str()
            .expect("status names the pins"),
    );
    delete_from_active_trie(&pins, "198.18.0.5");
    delete_from_active_trie(&pins, "198.18.0.9");
    let t0 = Instant::now();
    let got = h
        .pair
        .probe_sent(&[rule, listed], 100, Duration::from_millis(300));
    assert!(
        got.iter()
            .any(|(sent, arrived)| *sent > 0 && arrived == sent),
        "tampered: something passes at once: {got:?}"
    );
    // Back within the check's period.
    loop {
        let status = d.json(&["status"]);
        if status["drift_repaired"].as_u64() >= Some(2) {
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(8),
            "not put back within 8 s: {status}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let got = h
        .pair
        .probe_sent(&[rule, listed], 100, Duration::from_millis(400));
    for (src, (sent, arrived)) in [rule, listed].iter().zip(&got) {
        assert!(
            *sent > 0 && *arrived == 0,
            "{src} is dropped again: {got:?}"
        );
    }
    let scraped = h.pair.rx.scrape(metrics);
    assert!(
        scraped
            .lines()
            .any(|l| l.starts_with("ratelimit_drift_repaired_total{") && l.ends_with(" 2")),
        "{scraped}"
    );
    assert!(
        d.output()
            .contains("the pinned maps differed from what this daemon wrote"),
        "{}",
        d.output()
    );
}

/// An upgrade with `--keep-attached` (issue 36): the earlier version's
/// program (here this build pinning under the earlier layout, through the
/// test switch) is replaced in its link by the next daemon, which pins under
/// the new layout and removes the earlier pins. Frames are counted at the
/// receiver across the switch: a denied source never passes (a moment
/// without a program would let it through), a limited one gets its rate and
/// at most its burst once more (buckets start anew). A start of the earlier
/// version after it is refused, and the program keeps enforcing.
#[test]
fn an_upgrade_swaps_the_earlier_versions_program_in_its_link_without_a_gap() {
    privileged!("an_upgrade_swaps_the_earlier_versions_program_in_its_link_without_a_gap");
    use ratelimit_user::host::identity::TEST_PIN_LAYOUT;
    let older = ratelimit_user::host::identity::OLDER_LAYOUTS[0];
    let h = Host::bare("upgrade");
    let args = ["--rate", "50/s", "--burst", "10", "--keep-attached"];
    let mut cmd = h.daemon_command(&args);
    cmd.env(TEST_PIN_LAYOUT, older);
    let d = h.spawn(cmd);
    let (denied, limited) = (ip("198.18.0.88"), ip("198.18.0.89"));
    d.cli_ok(&["deny", "198.18.0.88"]);
    assert_eq!(d.stop(libc::SIGTERM).code(), Some(0));
    assert_eq!(
        pin_dirs_of(&h.pair.rx_if, older).len(),
        1,
        "the earlier pins: {}",
        String::from_utf8_lossy(
            &Command::new("find")
                .args(["/sys/fs/bpf/ratelimit", "-maxdepth", "3"])
                .output()
                .expect("find")
                .stdout
        )
    );
    assert!(pin_dirs(&h.pair.rx_if).is_empty());

    const PORT: u16 = 5998;
    let rx = h.pair.receiver(PORT);
    let flows = [
        h.pair.flow(limited, PORT, 2000),
        h.pair.flow(denied, PORT, 2000),
    ];
    let start = Instant::now();
    let sender = h.pair.send_async(&flows, Duration::from_secs(3));
    sleep(Duration::from_millis(800));
    let d = h.daemon(&args);
    let sent = sender.join().expect("the sender");
    let secs = start.elapsed().as_secs_f64();
    let got = rx.finish();
    let status = d.json(&["status"]);
    assert_eq!(
        (status["took_over_link"].clone(), status["adopted"].clone()),
        (true.into(), false.into()),
        "{status}"
    );
    assert!(
        pin_dirs_of(&h.pair.rx_if, older).is_empty(),
        "the earlier version's pins stayed"
    );
    assert_eq!(
        pin_dirs(&h.pair.rx_if).len(),
        1,
        "pinned under the new layout"
    );
    assert!(
        sent.iter().all(|s| s.frames > 1000),
        "the sender sent {sent:?}"
    );
    assert_eq!(
        got.get(&denied).copied().unwrap_or(0),
        0,
        "the denied source passed across the upgrade"
    );
    let passed = got.get(&limited).copied().unwrap_or(0);
    // Its rate over the time, its burst at the first start and once more
    // at the upgrade (buckets start anew).
    let most = (50.0 * secs).ceil() as u64 + 2 * 10;
    assert!(
        passed <= most && passed >= (50.0 * secs * 0.5) as u64,
        "{passed} passed from a source limited to 50/s burst 10 in {secs:.1} s (at most {most})"
    );

    // The earlier version started after it finds the link taken: refused,
    // and the program enforces on.
    assert_eq!(d.stop(libc::SIGTERM).code(), Some(0));
    let mut cmd = h.daemon_command(&args);
    cmd.env(TEST_PIN_LAYOUT, older);
    let out = cmd.output().expect("the earlier version's start");
    assert!(
        !out.status.success(),
        "the earlier version started: {out:?}"
    );
    assert!(
        h.pair.rx_has_xdp(),
        "the program went with the refused start"
    );
    let got = h.pair.probe(&[(denied, 2000)], Duration::from_millis(500));
    assert_eq!(got.get(&denied).copied().unwrap_or(0), 0, "the deny went");
    let out = h.command(&["detach"]).output().expect("ratelimit detach");
    assert!(out.status.success(), "{out:?}");
}
