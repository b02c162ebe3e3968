//! Faults and hostile conditions, run the way operators meet them: a run
//! directory someone else owns, damaged saved rules, changes and starts that do
//! not fit, `ip netns exec`, one interface name in two namespaces, live rules
//! across reloads and restarts, interface re-creation, idle clients, too few
//! file descriptors, a user who is not root.

use std::{
    collections::BTreeSet,
    io::{Read as _, Write as _},
    os::unix::fs::PermissionsExt as _,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    thread::sleep,
    time::{Duration, Instant},
};

use ratelimit_tests::{
    ChildGuard, Daemon, SharedBin, TempDir,
    check::ip,
    fixture::Host,
    net::{NetNs, Pair, pin_dirs},
    privileged, ratelimit_bin, unique_tag,
};

const NOBODY: u32 = 65534;

/// Runs `cmd`, which must refuse to start: returns what it wrote. A daemon that
/// starts anyway is killed and the test fails.
fn refused(mut cmd: Command, what: &str) -> String {
    let log = std::env::temp_dir().join(format!("ratelimit-refused-{}.log", unique_tag()));
    let file = std::fs::File::create(&log).expect("log");
    cmd.stdin(Stdio::null())
        .stdout(file.try_clone().expect("fd"))
        .stderr(file);
    let mut child = ChildGuard::spawn(cmd, what);
    let start = Instant::now();
    let status = loop {
        if let Some(s) = child.exited() {
            break s;
        }
        assert!(
            start.elapsed() < Duration::from_secs(15),
            "{what}: started (it should have refused); output: {}",
            std::fs::read_to_string(&log).unwrap_or_default()
        );
        sleep(Duration::from_millis(20));
    };
    let out = std::fs::read_to_string(&log).unwrap_or_default();
    let _ = std::fs::remove_file(&log);
    assert!(!status.success(), "{what}: exited 0; output: {out}");
    out
}

/// `ratelimit run --iface IFACE ARGS` in `ns` with `run_dir`, not yet started.
fn run_cmd(ns: &NetNs, iface: &str, run_dir: &Path, args: &[&str]) -> Command {
    let mut cmd = ns.command(ratelimit_bin());
    cmd.args(["run", "--iface", iface])
        .args(args)
        .env("RATELIMIT_RUN_DIR", run_dir);
    cmd
}

/// The one network namespace directory under a run directory.
fn ns_dir(run_dir: &Path) -> PathBuf {
    let dirs: Vec<PathBuf> = std::fs::read_dir(run_dir)
        .expect("run dir")
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.is_dir())
        .collect();
    assert_eq!(dirs.len(), 1, "namespace directories: {dirs:?}");
    dirs[0].clone()
}

/// The rules the daemon of `h` saved.
fn record(h: &Host) -> PathBuf {
    ns_dir(h.run_dir()).join(format!("{}.rules.json", h.pair.rx_if))
}

/// The rules as `list` shows them: the default, then `cidr rule` lines.
fn listed(d: &Daemon) -> BTreeSet<String> {
    let l = d.json(&["list"]);
    let mut out = BTreeSet::new();
    out.insert(format!(
        "default {}",
        l["default"]["text"].as_str().unwrap_or("?")
    ));
    for r in l["rules"].as_array().expect("rules") {
        out.insert(format!(
            "{} {}",
            r["cidr"].as_str().unwrap_or("?"),
            r["text"].as_str().unwrap_or("?")
        ));
    }
    out
}

/// The rules the kernel enforces on `iface` (read from its pinned maps), in the
/// form of [`listed`].
fn in_kernel(iface: &str) -> BTreeSet<String> {
    let dirs = pin_dirs(iface);
    assert_eq!(dirs.len(), 1, "pin directories of {iface}: {dirs:?}");
    let set = ratelimit_user::kernel::Maps::from_pins(&dirs[0])
        .expect("opening the pinned maps")
        .rule_set()
        .expect("reading the rules back");
    let mut out = BTreeSet::new();
    out.insert(format!("default {}", set.default));
    for (p, a) in &set.rules {
        out.insert(format!("{p} {}", a.text(Some(p.source.addr.is_ipv4()))));
    }
    out
}

fn chown(path: &Path, uid: u32) {
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).expect("path");
    // SAFETY: a C string; lchown never follows a link.
    let rc = unsafe { libc::lchown(c.as_ptr(), uid, uid) };
    assert_eq!(
        rc,
        0,
        "chown {}: {}",
        path.display(),
        std::io::Error::last_os_error()
    );
}

/// Waits up to `within` for `cond`.
fn eventually(within: Duration, what: &str, mut cond: impl FnMut() -> bool) {
    let start = Instant::now();
    while !cond() {
        assert!(start.elapsed() < within, "{what} (waited {within:?})");
        sleep(Duration::from_millis(50));
    }
}

/// A config: the default at `rate`, and `deny` rules for each CIDR.
fn denies(default_rate: &str, cidrs: &[String]) -> String {
    let mut s = format!("[default]\nrate = \"{default_rate}\"\n");
    for c in cidrs {
        s.push_str(&format!("[[rule]]\ncidr = \"{c}\"\naction = \"deny\"\n"));
    }
    s
}

fn slash32s(third: u8, n: u8) -> Vec<String> {
    (0..n)
        .map(|i| format!("198.18.{third}.{}/32", i + 1))
        .collect()
}

/// (Item 1) A run directory (or a file in it) that root does not own, or that is a
/// link, is refused with the reason, and nothing is written through it; the
/// CLI never trusts a socket that is not root's.
#[test]
fn a_run_directory_root_does_not_own_is_refused_and_nothing_is_written_through_it() {
    privileged!("a_run_directory_root_does_not_own_is_refused_and_nothing_is_written_through_it");
    let pair = Pair::new();
    let base = TempDir::new("hostile");
    let start_in = |run: &Path, what: &str| {
        refused(
            run_cmd(&pair.rx, &pair.rx_if, run, &["--rate", "100/s"]),
            what,
        )
    };

    // A user's directory, open to all.
    let theirs = base.0.join("theirs");
    std::fs::create_dir(&theirs).expect("mkdir");
    chown(&theirs, NOBODY);
    std::fs::set_permissions(&theirs, std::fs::Permissions::from_mode(0o777)).expect("chmod");
    let out = start_in(&theirs, "a run directory owned by nobody");
    assert!(out.contains("owned by uid 65534, not root"), "{out}");
    assert_eq!(
        std::fs::read_dir(&theirs).expect("dir").count(),
        0,
        "something was written in a directory root does not own"
    );
    assert!(!pair.rx_has_xdp(), "attached despite the refusal");

    // A link to it.
    let link = base.0.join("link");
    std::os::unix::fs::symlink(&theirs, &link).expect("symlink");
    let out = start_in(&link, "a run directory that is a link");
    assert!(out.contains("is a symbolic link"), "{out}");

    // Root's run directory, with a namespace directory a user owns.
    let run = base.0.join("run");
    let d = Daemon::start(&pair.rx, &pair.rx_if, &run, &["--rate", "100/s"]);
    assert_eq!(d.stop(libc::SIGTERM).code(), Some(0));
    let nsd = ns_dir(&run);
    chown(&nsd, NOBODY);
    let out = start_in(&run, "a namespace directory owned by nobody");
    assert!(out.contains("owned by uid 65534, not root"), "{out}");
    chown(&nsd, 0);

    // Each of the daemon's files as a link to one of root's files elsewhere.
    let victims = TempDir::new("victims");
    for suffix in ["lock", "rules.json", "mode", "sock"] {
        let victim = victims.0.join(format!("victim.{suffix}"));
        std::fs::write(&victim, b"root's own file\n").expect("victim");
        let planted = nsd.join(format!("{}.{suffix}", pair.rx_if));
        let _ = std::fs::remove_file(&planted);
        std::os::unix::fs::symlink(&victim, &planted).expect("symlink");
        let out = start_in(&run, &format!("{suffix} as a link"));
        assert!(out.contains("is a symbolic link"), "{suffix}: {out}");
        assert_eq!(
            std::fs::read(&victim).expect("victim"),
            b"root's own file\n",
            "{suffix}: written through a link"
        );
        std::fs::remove_file(&planted).expect("rm");
        // And as a file a user owns.
        std::fs::write(&planted, b"").expect("file");
        chown(&planted, NOBODY);
        let out = start_in(&run, &format!("{suffix} owned by nobody"));
        assert!(
            out.contains("owned by uid 65534, not root"),
            "{suffix}: {out}"
        );
        std::fs::remove_file(&planted).expect("rm");
    }
    assert!(!pair.rx_has_xdp());

    // A listener a user owns in the daemon's place: the CLI does not talk to it.
    let sock = nsd.join(format!("{}.sock", pair.rx_if));
    let listener = std::os::unix::net::UnixListener::bind(&sock).expect("bind");
    chown(&sock, NOBODY);
    listener.set_nonblocking(true).expect("nonblocking");
    let answered = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (a, s) = (answered.clone(), stop.clone());
    let impostor = std::thread::spawn(move || {
        while !s.load(std::sync::atomic::Ordering::Relaxed) {
            if let Ok((mut c, _)) = listener.accept() {
                let _ = c.set_nonblocking(false);
                let mut buf = [0u8; 4096];
                let _ = c.read(&mut buf);
                let _ = c.write_all(
                    b"{\"ok\":true,\"data\":{\"default\":\"deny\",\"rules\":[{\"cidr\":\"198.18.66.0/24\",\"rule\":\"deny\"}]}}\n",
                );
                a.store(true, std::sync::atomic::Ordering::Relaxed);
            }
            sleep(Duration::from_millis(10));
        }
    });
    let out = pair
        .rx
        .command(ratelimit_bin())
        .args(["deny", "198.18.66.0/24", "--iface", &pair.rx_if])
        .env("RATELIMIT_RUN_DIR", &run)
        .output()
        .expect("cli");
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    impostor.join().expect("impostor");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "the CLI trusted a user's socket");
    assert!(err.contains("is not root's socket"), "{err}");
    assert!(
        !answered.load(std::sync::atomic::Ordering::Relaxed),
        "the CLI sent its request to a user's socket"
    );
}

/// (Item 2) A damaged saved record (cut short, random bytes, empty, a value out of
/// range): the restart keeps exactly what the kernel enforces, says so loudly,
/// and writes the record again from the kernel.
#[test]
fn damaged_saved_rules_keep_what_the_kernel_enforces_and_say_so() {
    privileged!("damaged_saved_rules_keep_what_the_kernel_enforces_and_say_so");
    let (h, d) = Host::start("damaged", &["--rate", "5/s", "--burst", "5"]);
    d.cli_ok(&["deny", "198.18.0.77/32"]);
    let want = listed(&d);
    assert_eq!(in_kernel(&h.pair.rx_if), want, "kernel and list before");
    let rec = record(&h);
    let good = std::fs::read_to_string(&rec).expect("record");
    assert!(good.contains("\"burst\": 5"), "{good}");
    d.stop(libc::SIGKILL);

    let mut noise = Vec::with_capacity(512);
    let mut x: u32 = 0x9e37_79b9;
    for _ in 0..512 {
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        noise.push(x as u8);
    }
    let damages: [(&str, Vec<u8>); 4] = [
        ("cut short", good.as_bytes()[..good.len() / 2].to_vec()),
        ("random bytes", noise),
        ("empty", Vec::new()),
        (
            "a burst out of range",
            good.replacen("\"burst\": 5", "\"burst\": 0", 1)
                .into_bytes(),
        ),
    ];
    let (denied, limited) = (ip("198.18.0.77"), ip("198.18.0.78"));
    for (what, bytes) in damages {
        std::fs::write(&rec, &bytes).expect("damaging the record");
        let d = h.daemon(&[]);
        let out = d.output();
        assert!(
            out.contains("THE SAVED RULES CANNOT BE READ"),
            "{what}: no loud log line: {out}"
        );
        assert_eq!(listed(&d), want, "{what}: the rules changed");
        assert_eq!(in_kernel(&h.pair.rx_if), want, "{what}: the kernel changed");
        let got = h
            .pair
            .probe(&[(denied, 200), (limited, 200)], Duration::from_millis(500));
        assert_eq!(
            got.get(&denied).copied().unwrap_or(0),
            0,
            "{what}: denied source passed"
        );
        let n = got.get(&limited).copied().unwrap_or(0);
        assert!(
            n <= 5 + 3,
            "{what}: a 5/s burst 5 source passed {n} in 0.5 s"
        );
        let again = std::fs::read_to_string(&rec).expect("record");
        let v: serde_json::Value = serde_json::from_str(&again)
            .unwrap_or_else(|e| panic!("{what}: the record was not written again ({e}): {again}"));
        assert_eq!(v["version"], 3, "{what}: {again}");
        d.stop(libc::SIGKILL);
    }

    // Damaged, and no program to take the rules from: refused, not defaults.
    let d = h.daemon(&[]);
    assert_eq!(d.stop(libc::SIGTERM).code(), Some(0));
    std::fs::write(&rec, b"{\"version\": 2, \"ba").expect("damage");
    let out = refused(
        h.daemon_command(&[]),
        "a damaged record with nothing running",
    );
    assert!(
        out.contains("cannot be read") && out.contains("--config"),
        "{out}"
    );
}

/// (Item 2, torn writes) SIGKILL while changes are being saved on a large rule set
/// never leaves a record cut short: it is the old one or the new one, and the
/// restart enforces what the kernel did.
#[test]
fn sigkill_during_changes_never_leaves_a_torn_record() {
    privileged!("sigkill_during_changes_never_leaves_a_torn_record");
    let cidrs: Vec<String> = (0..20_000u32)
        .map(|i| format!("198.19.{}.{}/32", i / 250, i % 250 + 1))
        .collect();
    let (h, mut d) =
        Host::with_config("torn", &denies("1000/s", &cidrs), &["--max-rules", "32768"]);
    for trial in 0..6u32 {
        // A stream of changes, killed part-way.
        let mut changes = Vec::new();
        for k in 0..4u32 {
            let mut c = h.command(&[
                "set",
                &format!("198.18.{}.{}/32", 100 + trial, k + 1),
                "--rate",
                "10/s",
                "--iface",
                &h.pair.rx_if,
            ]);
            c.stdout(Stdio::null()).stderr(Stdio::null());
            changes.push(ChildGuard::spawn(c, "ratelimit set"));
        }
        sleep(Duration::from_millis(u64::from(trial) * 15));
        d.stop(libc::SIGKILL);
        drop(changes);
        let rec = record(&h);
        let text = std::fs::read_to_string(&rec).expect("record");
        let v: serde_json::Value = serde_json::from_str(&text)
            .unwrap_or_else(|e| panic!("trial {trial}: a torn record ({} bytes): {e}", text.len()));
        assert!(
            v["base"]["rule"].as_array().map_or(0, Vec::len) == 20_000,
            "trial {trial}: the record lost base rules"
        );
        d = h.daemon(&["--config", h.config()]);
        assert_eq!(
            listed(&d),
            in_kernel(&h.pair.rx_if),
            "trial {trial}: list and kernel disagree after the restart"
        );
    }
}

/// (Item 3) A change that does not fit the rule table changes nothing, in the kernel
/// or in `list`, and says why; a change that fits still goes through.
#[test]
fn a_change_that_does_not_fit_changes_nothing_in_the_kernel_or_the_list() {
    privileged!("a_change_that_does_not_fit_changes_nothing_in_the_kernel_or_the_list");
    let (h, d) = Host::with_config(
        "nofit",
        &denies("1000/s", &["198.18.1.0/24".into(), "198.18.2.0/24".into()]),
        &["--max-rules", "10"],
    );
    let two = listed(&d);
    assert_eq!(two.len(), 3);
    let probe = ip("198.18.0.90");

    // Twelve rules, SIGHUP.
    let mut twelve = slash32s(0, 11);
    twelve[0] = "198.18.0.90/32".into();
    twelve.push("198.18.1.0/24".into());
    std::fs::write(h.config(), denies("1000/s", &twelve)).expect("write");
    d.child.signal(libc::SIGHUP);
    eventually(
        Duration::from_secs(5),
        "the refused reload is logged",
        || d.output().contains("reload refused"),
    );
    let out = d.output();
    assert!(out.contains("12 rules do not fit in 10"), "{out}");
    assert_eq!(listed(&d), two, "list changed by a refused reload");
    assert_eq!(
        in_kernel(&h.pair.rx_if),
        two,
        "kernel changed by a refused reload"
    );
    let got = h.pair.probe(&[(probe, 200)], Duration::from_millis(500));
    assert!(
        got.get(&probe).copied().unwrap_or(0) >= 90,
        "a rule of the refused reload is enforced: {got:?}"
    );

    // The same by `ratelimit reload`: the error names the cause and the fix.
    let out = d.cli(&["reload"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "reload of 12 rules into 10 succeeded"
    );
    assert!(
        err.contains("12 rules do not fit in 10") && err.contains("--reset --max-rules"),
        "{err}"
    );
    assert_eq!(in_kernel(&h.pair.rx_if), two);

    // Nine fit.
    std::fs::write(h.config(), denies("1000/s", &twelve[..9])).expect("write");
    d.cli_ok(&["reload"]);
    let nine = listed(&d);
    assert_eq!(nine.len(), 10);
    assert_eq!(in_kernel(&h.pair.rx_if), nine);
    let got = h.pair.probe(&[(probe, 200)], Duration::from_millis(300));
    assert_eq!(
        got.get(&probe).copied().unwrap_or(0),
        0,
        "the reloaded deny"
    );

    // The tenth by `set`; the eleventh is refused whole.
    d.cli_ok(&["set", "198.18.3.0/24", "--rate", "10/s"]);
    let ten = listed(&d);
    assert_eq!(ten.len(), 11);
    let out = d.cli(&["deny", "198.18.4.0/24"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "an eleventh rule in 10 was accepted");
    assert!(err.contains("11 rules do not fit in 10"), "{err}");
    assert_eq!(listed(&d), ten);
    assert_eq!(in_kernel(&h.pair.rx_if), ten);
}

/// A first start that fails after it made its pin directory (here the kernel
/// cannot allocate the state map asked for) leaves no directory behind.
#[test]
fn a_failed_first_start_leaves_no_pin_directory() {
    privileged!("a_failed_first_start_leaves_no_pin_directory");
    let h = Host::bare("nopins");
    let out = refused(
        h.daemon_command(&["--max-sources", "4000000000"]),
        "a state map the kernel cannot allocate",
    );
    assert!(out.contains("RL_STATE") || out.contains("map"), "{out}");
    assert!(!h.pair.rx_has_xdp());
    assert!(
        pin_dirs(&h.pair.rx_if).is_empty(),
        "a failed start left {:?}",
        pin_dirs(&h.pair.rx_if)
    );
}

/// (Item 4) A start that does not fit the maps (smaller ones with --reset, or more
/// rules than the adopted maps hold) leaves the running program enforcing what
/// it did, with its pins and saved rules; the advice it gives works.
#[test]
fn a_start_that_does_not_fit_leaves_the_running_program_and_its_advice_works() {
    privileged!("a_start_that_does_not_fit_leaves_the_running_program_and_its_advice_works");
    let mut twelve = slash32s(0, 12);
    twelve[0] = "198.18.0.91/32".into();
    let (h, d) = Host::with_config(
        "adopt",
        &denies("1000/s", &twelve),
        &["--max-rules", "16", "--keep-attached"],
    );
    let enforced = listed(&d);
    assert_eq!(d.stop(libc::SIGTERM).code(), Some(0));
    assert!(h.pair.rx_has_xdp());
    let rec = record(&h);
    let saved = std::fs::read(&rec).expect("record");
    let denied = ip("198.18.0.91");
    let intact = |what: &str| {
        assert!(h.pair.rx_has_xdp(), "{what}: the program was detached");
        assert_eq!(pin_dirs(&h.pair.rx_if).len(), 1, "{what}: pins removed");
        assert_eq!(in_kernel(&h.pair.rx_if), enforced, "{what}: kernel changed");
        assert_eq!(
            std::fs::read(&rec).expect("record"),
            saved,
            "{what}: saved rules changed"
        );
        let got = h.pair.probe(&[(denied, 200)], Duration::from_millis(300));
        assert_eq!(
            got.get(&denied).copied().unwrap_or(0),
            0,
            "{what}: not enforcing"
        );
    };

    let out = refused(
        h.daemon_command(&["--reset", "--max-rules", "10"]),
        "--reset --max-rules 10 under 12 rules",
    );
    assert!(
        out.contains("12 rules do not fit in 10") && out.contains("--reset --max-rules N"),
        "{out}"
    );
    intact("--reset into a smaller table");

    let twenty = h.write("twenty.toml", &denies("1000/s", &slash32s(5, 20)));
    let out = refused(
        h.daemon_command(&["--config", &twenty]),
        "20 rules into adopted maps of 16",
    );
    assert!(out.contains("20 rules do not fit in 16"), "{out}");
    intact("a config larger than the adopted maps");

    // The advice: --reset with room. The rules are kept.
    let d = h.daemon(&["--reset", "--max-rules", "32"]);
    assert_eq!(listed(&d), enforced, "the advised restart lost the rules");
    assert_eq!(d.json(&["status"])["rules_capacity"], 32);
    let got = h.pair.probe(&[(denied, 200)], Duration::from_millis(300));
    assert_eq!(got.get(&denied).copied().unwrap_or(0), 0);
    assert_eq!(d.stop(libc::SIGTERM).code(), Some(0));
    assert!(!h.pair.rx_has_xdp());
}

/// (Item 5) Run the way the README's users test in namespaces, `ip netns exec`:
/// a SIGKILL leaves the program enforcing, the next start adopts it, and
/// `--keep-attached` keeps what it says.
#[test]
fn under_ip_netns_exec_a_sigkill_leaves_enforcing_and_a_restart_adopts() {
    privileged!("under_ip_netns_exec_a_sigkill_leaves_enforcing_and_a_restart_adopts");
    let h = Host::bare("netnsexec");
    let exec = |args: &[&str]| {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &h.pair.rx.name])
            .arg(ratelimit_bin())
            .args(args)
            .env("RATELIMIT_RUN_DIR", h.run_dir());
        c
    };
    let start = |extra: &[&str]| {
        let mut args = vec!["run", "--iface", h.pair.rx_if.as_str()];
        args.extend_from_slice(extra);
        h.spawn(exec(&args))
    };
    let d = start(&["--rate", "100/s", "--burst", "10"]);
    let out = exec(&["deny", "198.18.0.92/32", "--iface", &h.pair.rx_if])
        .output()
        .expect("cli");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let rules = listed(&d);
    d.stop(libc::SIGKILL);
    assert!(
        h.pair.rx_has_xdp(),
        "SIGKILL under ip netns exec took the program"
    );
    assert_eq!(
        pin_dirs(&h.pair.rx_if).len(),
        1,
        "no pins in the host's bpffs"
    );

    let (denied, limited) = (ip("198.18.0.92"), ip("198.18.0.93"));
    let got = h
        .pair
        .probe(&[(denied, 200), (limited, 500)], Duration::from_secs(1));
    assert_eq!(
        got.get(&denied).copied().unwrap_or(0),
        0,
        "denied source passed"
    );
    let n = got.get(&limited).copied().unwrap_or(0) as f64;
    assert!(
        (95.0..=10.0 + 100.0 * 1.0 * 1.05).contains(&n),
        "a 100/s burst 10 source at 500/s passed {n} in 1 s with the daemon killed"
    );

    let d = start(&[]);
    let status = d.json(&["status"]);
    assert_eq!(status["adopted"], true, "{status}");
    assert_eq!(status["took_over_link"], true, "{status}");
    assert_eq!(listed(&d), rules, "the restart lost rules");
    assert_eq!(d.stop(libc::SIGTERM).code(), Some(0));

    // After a clean stop nothing runs: the base is what this start gives, the
    // live deny comes back on top.
    let d = start(&["--rate", "100/s", "--burst", "10", "--keep-attached"]);
    assert_eq!(listed(&d), rules);
    assert_eq!(d.stop(libc::SIGTERM).code(), Some(0));
    assert!(
        h.pair.rx_has_xdp(),
        "--keep-attached said it keeps enforcing"
    );
    let got = h.pair.probe(&[(denied, 200)], Duration::from_millis(300));
    assert_eq!(got.get(&denied).copied().unwrap_or(0), 0);

    let d = start(&[]);
    assert_eq!(d.stop(libc::SIGTERM).code(), Some(0));
    assert!(!h.pair.rx_has_xdp());
    assert!(
        pin_dirs(&h.pair.rx_if).is_empty(),
        "pins left after a clean stop"
    );
}

/// (Item 6) One interface name in two namespaces: two daemons, each with its own
/// lock, socket, rules and pins; neither ever adopts the other's program.
#[test]
fn same_named_interfaces_in_two_namespaces_are_two_daemons() {
    privileged!("same_named_interfaces_in_two_namespaces_are_two_daemons");
    let name = format!("rl{}s", unique_tag());
    let pair = Pair::named(&name, &name);
    let run = TempDir::new("samename");
    let a = Daemon::start(&pair.rx, &name, &run.0, &["--rate", "100/s"]);
    let b = Daemon::start(&pair.tx, &name, &run.0, &["--rate", "300/s"]);
    a.cli_ok(&["deny", "198.18.0.94/32"]);
    assert_eq!(listed(&a).len(), 2);
    assert_eq!(listed(&b).len(), 1, "a's rule reached b");
    assert!(listed(&b).iter().any(|l| l.contains("300/s")));
    assert_eq!(pin_dirs(&name).len(), 2, "one pin directory per namespace");

    a.stop(libc::SIGKILL);
    assert_eq!(b.stop(libc::SIGTERM).code(), Some(0));
    assert!(pair.rx_has_xdp(), "stopping b detached a's program");
    let tx_has_xdp = || {
        let out = Command::new("ip")
            .args(["-n", &pair.tx.name, "link", "show", &name])
            .output()
            .expect("ip");
        String::from_utf8_lossy(&out.stdout).contains("prog/xdp")
    };
    assert!(!tx_has_xdp());

    // b again: its own fresh program, not a's.
    let b = Daemon::start(&pair.tx, &name, &run.0, &[]);
    let status = b.json(&["status"]);
    assert_eq!(status["adopted"], false, "b adopted a's program: {status}");
    assert!(tx_has_xdp());
    let denied = ip("198.18.0.94");
    let got = pair.probe(&[(denied, 200)], Duration::from_millis(300));
    assert_eq!(
        got.get(&denied).copied().unwrap_or(0),
        0,
        "a's program stopped enforcing"
    );
    // a again: adopts its own.
    let a = Daemon::start(&pair.rx, &name, &run.0, &[]);
    let status = a.json(&["status"]);
    assert_eq!(status["adopted"], true, "{status}");
    assert!(listed(&a).contains("198.18.0.94/32 deny"));
    assert_eq!(a.stop(libc::SIGTERM).code(), Some(0));
    assert_eq!(b.stop(libc::SIGTERM).code(), Some(0));
    assert!(pin_dirs(&name).is_empty());
}

/// (Item 8) Where rules come from: the file is the base, live changes sit on top and
/// stay across reloads and restarts until unset or `reload --replace`; a flag
/// that sets what the file sets is refused.
#[test]
fn live_rules_stay_across_reloads_and_restarts_and_conflicting_flags_are_refused() {
    privileged!("live_rules_stay_across_reloads_and_restarts_and_conflicting_flags_are_refused");
    let h = Host::bare("live");
    let cfg = h.write(
        "r.toml",
        "[default]\nrate = \"100/s\"\n[[rule]]\ncidr = \"198.18.1.0/24\"\naction = \"allow\"\n",
    );
    let cfg_s = cfg.as_str();
    let out = refused(
        h.daemon_command(&["--config", cfg_s, "--rate", "50/s"]),
        "--rate against the file's rate",
    );
    assert!(
        out.contains("--rate conflicts with `[default] rate`") && out.contains("r.toml"),
        "{out}"
    );

    // A flag the file leaves alone is merged.
    let d = h.daemon(&["--config", cfg_s, "--clock", "coarse"]);
    assert!(
        d.json(&["list"])["clock"]
            .as_str()
            .unwrap_or("")
            .starts_with("coarse")
    );
    d.cli_ok(&["deny", "198.18.9.0/24"]);
    let has = |d: &Daemon, rule: &str| listed(d).contains(rule);
    d.child.signal(libc::SIGHUP);
    sleep(Duration::from_millis(500));
    assert!(has(&d, "198.18.9.0/24 deny"), "SIGHUP dropped a live rule");
    assert!(has(&d, "198.18.1.0/24 allow"));
    std::fs::write(
        &cfg,
        "[default]\nrate = \"100/s\"\n[[rule]]\ncidr = \"198.18.1.0/24\"\naction = \"allow\"\n[[rule]]\ncidr = \"198.18.3.0/24\"\naction = \"deny\"\n",
    )
    .expect("write");
    d.cli_ok(&["reload"]);
    assert!(has(&d, "198.18.9.0/24 deny"), "reload dropped a live rule");
    assert!(
        has(&d, "198.18.3.0/24 deny"),
        "reload did not read the file"
    );
    let origins = d.json(&["list"]);
    let origin = |cidr: &str| {
        origins["rules"]
            .as_array()
            .expect("rules")
            .iter()
            .find(|r| r["cidr"] == cidr)
            .map(|r| r["origin"].as_str().unwrap_or("").to_string())
    };
    assert_eq!(origin("198.18.9.0/24").as_deref(), Some("live"));
    assert_eq!(origin("198.18.3.0/24").as_deref(), Some("config"));
    // A file rule unset live stays unset across a reload.
    d.cli_ok(&["unset", "198.18.1.0/24"]);
    d.cli_ok(&["reload"]);
    assert!(
        !has(&d, "198.18.1.0/24 allow"),
        "an unset came back on reload"
    );

    // A clean restart with the same file: the live changes come back.
    assert_eq!(d.stop(libc::SIGTERM).code(), Some(0));
    let d = h.daemon(&["--config", cfg_s]);
    assert!(
        has(&d, "198.18.9.0/24 deny"),
        "a restart dropped a live rule"
    );
    assert!(!has(&d, "198.18.1.0/24 allow"), "a restart undid an unset");
    assert_eq!(listed(&d), in_kernel(&h.pair.rx_if));
    let denied = ip("198.18.9.9");
    let got = h.pair.probe(&[(denied, 200)], Duration::from_millis(300));
    assert_eq!(got.get(&denied).copied().unwrap_or(0), 0);

    // --replace: the file alone.
    d.cli_ok(&["reload", "--replace"]);
    assert!(!has(&d, "198.18.9.0/24 deny"));
    assert!(has(&d, "198.18.1.0/24 allow"));
    assert_eq!(d.json(&["list"])["live_changes"], 0);
    assert_eq!(listed(&d), in_kernel(&h.pair.rx_if));
}

/// (Item 9) Out of file descriptors: idle connections to the metrics port cost a
/// bounded number of descriptors, little CPU and little log, and scrapes are
/// still answered.
#[test]
fn idle_metrics_connections_under_a_low_fd_limit_cost_little() {
    privileged!("idle_metrics_connections_under_a_low_fd_limit_cost_little");
    let h = Host::bare("fds");
    let mut cmd = h.pair.rx.command("prlimit");
    cmd.args(["--nofile=1024:1024", "--"])
        .arg(ratelimit_bin())
        .args([
            "run",
            "--iface",
            &h.pair.rx_if,
            "--metrics",
            "127.0.0.1:9477",
        ]);
    let d = h.spawn(cmd);
    let pid = d.child.pid();
    let cpu = || -> f64 {
        // utime + stime of every thread, in clock ticks.
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("stat");
        let after = &stat[stat.rfind(')').expect("comm") + 2..];
        let f: Vec<&str> = after.split_whitespace().collect();
        let ticks: u64 =
            f[11].parse::<u64>().expect("utime") + f[12].parse::<u64>().expect("stime");
        ticks as f64 / 100.0
    };
    let log_before = d.output().len();

    let ns = h.pair.rx.name.clone();
    let (opened_tx, opened_rx) = std::sync::mpsc::channel();
    let (release_tx, release_rx) = std::sync::mpsc::channel::<()>();
    let holder = std::thread::spawn(move || {
        ratelimit_tests::net::enter(&ns);
        let mut held = Vec::new();
        for _ in 0..1100 {
            match std::net::TcpStream::connect_timeout(
                &"127.0.0.1:9477".parse().expect("addr"),
                Duration::from_secs(3),
            ) {
                Ok(s) => held.push(s),
                Err(_) => break,
            }
        }
        let _ = opened_tx.send(held.len());
        let _ = release_rx.recv_timeout(Duration::from_secs(30));
        drop(held);
    });
    let opened = opened_rx
        .recv_timeout(Duration::from_secs(60))
        .expect("connections");
    let cpu0 = cpu();
    let t0 = Instant::now();
    // The control socket answers while they are held, and so does /metrics.
    let asked = Instant::now();
    d.cli_ok(&["stats"]);
    assert!(
        asked.elapsed() < Duration::from_secs(1),
        "stats took {:?} with {opened} idle metrics connections",
        asked.elapsed()
    );
    sleep(Duration::from_secs(2));
    let out = h.pair
        .rx
        .command("python3")
        .args([
            "-c",
            "import urllib.request;print(urllib.request.urlopen('http://127.0.0.1:9477/metrics', timeout=5).read().decode(),end='')",
        ])
        .output()
        .expect("scraping");
    let spent = cpu() - cpu0;
    let secs = t0.elapsed().as_secs_f64();
    let _ = release_tx.send(());
    holder.join().expect("holder");
    let logged = d.output().len() - log_before;
    assert!(opened >= 1000, "only {opened} connections were made");
    assert!(
        spent < 0.3 * secs,
        "{spent:.2} CPU-s in {secs:.1} s with {opened} idle connections"
    );
    assert!(
        logged < 16 << 10,
        "{logged} bytes of log with {opened} idle connections: {}",
        d.output()
    );
    let body = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && body.contains("ratelimit_packets_total"),
        "the scrape among idle connections failed: {} {body}",
        String::from_utf8_lossy(&out.stderr)
    );
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .expect("fds")
        .count();
    assert!(fds < 400, "{fds} file descriptors open");
}

/// (Item 10) Idle control clients hold up nobody; an endless line is cut off.
#[test]
fn idle_control_connections_do_not_stall_the_daemon() {
    privileged!("idle_control_connections_do_not_stall_the_daemon");
    let (h, d) = Host::start("idle", &[]);
    let sock = ns_dir(h.run_dir()).join(format!("{}.sock", h.pair.rx_if));
    let idle: Vec<_> = (0..500)
        .map(|_| std::os::unix::net::UnixStream::connect(&sock).expect("connect"))
        .collect();
    for _ in 0..3 {
        let asked = Instant::now();
        d.cli_ok(&["stats"]);
        assert!(
            asked.elapsed() < Duration::from_secs(1),
            "stats took {:?} with 500 idle connections",
            asked.elapsed()
        );
    }
    // A change goes through too, and is serialised with the others.
    d.cli_ok(&["deny", "198.18.0.95/32"]);
    drop(idle);

    // A line without end: refused once past the cap, memory bounded.
    let rss = |pid: i32| -> u64 {
        let s = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("status");
        s.lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.trim().trim_end_matches(" kB").trim().parse().ok())
            .expect("VmRSS")
    };
    let pid = d.child.pid();
    let before = rss(pid);
    let mut s = std::os::unix::net::UnixStream::connect(&sock).expect("connect");
    s.set_write_timeout(Some(Duration::from_secs(5)))
        .expect("timeout");
    let chunk = vec![b'x'; 1 << 20];
    let mut sent = 0usize;
    for _ in 0..64 {
        match s.write_all(&chunk) {
            Ok(()) => sent += chunk.len(),
            Err(_) => break,
        }
    }
    let mut answer = String::new();
    s.set_read_timeout(Some(Duration::from_secs(5)))
        .expect("timeout");
    let _ = s.read_to_string(&mut answer);
    assert!(
        sent < 64 << 20 || answer.contains("longer than"),
        "64 MiB without a newline were taken whole; answer: {answer:?}"
    );
    let grown = rss(pid).saturating_sub(before);
    assert!(grown < 16 << 10, "RSS grew by {grown} kB on one long line");
    assert!(listed(&d).contains("198.18.0.95/32 deny"));
}

/// (Item 11) The interface deleted and re-created under the daemon: it says so while
/// nothing is enforced, then attaches to the new one with its rules.
#[test]
fn an_interface_deleted_and_recreated_is_followed() {
    privileged!("an_interface_deleted_and_recreated_is_followed");
    let (mut h, d) = Host::start("recreate", &["--rate", "100/s"]);
    d.cli_ok(&["deny", "198.18.0.96/32"]);
    let ip_cmd = |args: &[&str]| {
        let ok = Command::new("ip").args(args).status().expect("ip");
        assert!(ok.success(), "ip {args:?}");
    };
    ip_cmd(&["-n", &h.pair.rx.name, "link", "del", &h.pair.rx_if]);
    eventually(
        Duration::from_secs(5),
        "status reports the interface gone",
        || d.json(&["status"])["interface"] == "gone",
    );
    let status = d.json(&["status"]);
    assert!(
        status["notes"].to_string().contains("nothing is enforced"),
        "{status}"
    );
    let metrics_attached = d.output();
    assert!(
        metrics_attached.contains("the interface is gone"),
        "{metrics_attached}"
    );

    // The same pair again, same names.
    h.pair.relink();
    eventually(
        Duration::from_secs(5),
        "the daemon attaches to the new interface",
        || h.pair.rx_has_xdp() && d.json(&["status"])["interface"] == "attached",
    );
    assert!(d.output().contains("attached to it again"));
    let denied = ip("198.18.0.96");
    let got = h.pair.probe(&[(denied, 200)], Duration::from_millis(300));
    assert_eq!(
        got.get(&denied).copied().unwrap_or(0),
        0,
        "rules lost on re-creation"
    );

    // Killed, the interface re-created again, restarted: attached anew with the
    // pinned rules (the severed link is replaced, no --reset needed).
    d.stop(libc::SIGKILL);
    ip_cmd(&["-n", &h.pair.rx.name, "link", "del", &h.pair.rx_if]);
    h.pair.relink();
    let d = h.daemon(&[]);
    assert!(listed(&d).contains("198.18.0.96/32 deny"));
    let got = h.pair.probe(&[(denied, 200)], Duration::from_millis(300));
    assert_eq!(got.get(&denied).copied().unwrap_or(0), 0);
}

/// (Item 12) A user who is not root is told so, not that no daemon runs.
#[test]
fn a_user_who_is_not_root_is_told_it_is_roots() {
    privileged!("a_user_who_is_not_root_is_told_it_is_roots");
    let (h, d) = Host::start("nonroot", &[]);
    // Where `nobody` may run it: the checkout may be closed to others.
    let shared = SharedBin::new();
    for args in [
        vec!["status"],
        vec!["status", "--iface", h.pair.rx_if.as_str()],
        vec!["deny", "198.18.0.97/32", "--iface", h.pair.rx_if.as_str()],
    ] {
        let out = h
            .command_as_nobody(&shared, &args)
            .output()
            .expect("setpriv");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?} as nobody succeeded");
        assert!(
            err.contains("permission denied") && err.contains("root"),
            "{args:?}: {err}"
        );
        assert!(!err.contains("no ratelimit daemon"), "{args:?}: {err}");
    }
    assert!(!listed(&d).iter().any(|l| l.contains("198.18.0.97")));
}
