//! What the daemon reads and where it keeps its files, as operators meet
//! them: config and list paths that are not regular files (a FIFO,
//! `/dev/zero`) or are too large; a read that hangs (a slow file system)
//! while changes, stats and the end of a temporary ban go on; a run
//! directory shared with others; the run directories of namespaces that are
//! gone; the temporary file of a save cut short; a closed stdout.

use std::{
    io::BufRead as _,
    os::unix::fs::PermissionsExt as _,
    path::{Path, PathBuf},
    process::{Output, Stdio},
    thread::sleep,
    time::{Duration, Instant},
};

use ratelimit_tests::{
    ChildGuard, Daemon, TempDir, fixture::Host, hold::HeldOpens, net::Pair, privileged,
};

/// Makes a FIFO at `path`.
fn mkfifo(path: &Path) {
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).expect("path");
    // SAFETY: a C string.
    let rc = unsafe { libc::mkfifo(c.as_ptr(), 0o644) };
    assert_eq!(rc, 0, "mkfifo: {}", std::io::Error::last_os_error());
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// A config with one deny list read from `path`.
fn with_list(dir: &Path, path: &str) -> PathBuf {
    let config = dir.join("r.toml");
    std::fs::write(
        &config,
        format!(
            "[default]\nrate = \"1000/s\"\n\n[[rule]]\ncidr = \"198.18.1.0/24\"\naction = \"deny\"\n\n[[list]]\nname = \"bans\"\naction = \"deny\"\npath = \"{path}\"\n"
        ),
    )
    .expect("writing the config");
    config
}

/// Waits up to `within` for `cond`, checking every 50 ms.
fn eventually(within: Duration, what: &str, mut cond: impl FnMut() -> bool) {
    let start = Instant::now();
    while !cond() {
        assert!(start.elapsed() < within, "{what} (waited {within:?})");
        sleep(Duration::from_millis(50));
    }
}

/// Runs a CLI command and asserts it answered within 5 s (the daemon's loop
/// is not held up); returns its output.
fn answers(d: &Daemon, args: &[&str]) -> Output {
    let start = Instant::now();
    let out = d.cli(args);
    assert!(
        start.elapsed() < Duration::from_secs(5),
        "`ratelimit {}` took {:?}: the daemon's loop is held up",
        args.join(" "),
        start.elapsed()
    );
    out
}

/// The CIDRs of the rules `list --json` shows.
fn rules(d: &Daemon) -> Vec<String> {
    let out = answers(d, &["list", "--json"]);
    assert!(out.status.success(), "list: {}", text(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("list JSON");
    v["rules"]
        .as_array()
        .expect("rules")
        .iter()
        .map(|r| r["cidr"].as_str().unwrap_or("?").to_string())
        .collect()
}

/// Asserts that the temporary ban of `cidr`, set at `set_at` for `for_s`
/// seconds, is listed until about its end and gone within 1.5 s after it.
fn ends_on_time(d: &Daemon, cidr: &str, set_at: Instant, for_s: u64) {
    let end = set_at + Duration::from_secs(for_s);
    let mut seen_before_end = false;
    loop {
        let now = Instant::now();
        let listed = rules(d).iter().any(|c| c == cidr);
        if now + Duration::from_millis(300) < end {
            assert!(listed, "{cidr} ended before its time");
            seen_before_end = true;
        }
        if !listed && now >= end {
            break;
        }
        assert!(
            now < end + Duration::from_millis(1500),
            "{cidr} was still listed {:?} after its end",
            now - end
        );
        sleep(Duration::from_millis(100));
    }
    assert!(seen_before_end, "{cidr} was never seen before its end");
}

/// `ratelimit run` on `h` with the run directory `run` that must refuse to
/// start: its output.
fn refused_start(h: &Host, run: &Path, args: &[&str], what: &str) -> String {
    let mut cmd = h.daemon_command(args);
    cmd.env("RATELIMIT_RUN_DIR", run)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    // A daemon that hangs or starts anyway is killed after 15 s, and fails.
    let out = ChildGuard::spawn(cmd, what).wait(Duration::from_secs(15));
    let all = format!("{}{}", text(&out.stdout), text(&out.stderr));
    assert!(!out.status.success(), "{what}: started; output: {all}");
    assert!(!h.pair.rx_has_xdp(), "{what}: attached despite the refusal");
    all
}

/// (Item 6) A `[[list]]` path that is a FIFO or `/dev/zero`: the daemon
/// refuses to start, at once, naming it (it used to hang on the FIFO and be
/// killed for its memory on `/dev/zero`).
#[test]
fn a_fifo_or_device_as_a_list_refuses_the_start_naming_it() {
    privileged!("a_fifo_or_device_as_a_list_refuses_the_start_naming_it");
    let h = Host::bare("fifo-start");
    let fifo = h.path("bans.fifo");
    mkfifo(&fifo);
    let config = with_list(h.run_dir(), "bans.fifo");
    let out = refused_start(
        &h,
        h.run_dir(),
        &["--config", config.to_str().expect("utf-8")],
        "a FIFO list",
    );
    assert!(
        out.contains(&format!(
            "list[0].path: the list {} is a FIFO (named pipe), not a regular file",
            fifo.display()
        )),
        "{out}"
    );
    let config = with_list(h.run_dir(), "/dev/zero");
    let out = refused_start(
        &h,
        h.run_dir(),
        &["--config", config.to_str().expect("utf-8")],
        "/dev/zero as a list",
    );
    assert!(
        out.contains("the list /dev/zero is a character device, not a regular file"),
        "{out}"
    );
}

/// (Item 6) A running daemon whose config now points at a FIFO refuses the
/// reload (SIGHUP and `ratelimit reload`), naming it, while it goes on
/// answering and ends a temporary ban on time (it used to hang: every
/// command failed after 30 s and a 6 s ban was still enforced at 36 s).
#[test]
fn a_reload_onto_a_fifo_is_refused_while_the_daemon_answers_and_ends_a_ban_on_time() {
    privileged!("a_reload_onto_a_fifo_is_refused_while_the_daemon_answers_and_ends_a_ban_on_time");
    let h = Host::bare("fifo-reload");
    h.write("bans.txt", "198.18.9.9\n");
    let config = with_list(h.run_dir(), "bans.txt");
    let d = h.daemon(&["--config", config.to_str().expect("utf-8")]);
    let before = d.json(&["list"]);
    let fifo = h.path("bans.fifo");
    mkfifo(&fifo);
    with_list(h.run_dir(), "bans.fifo");

    let set_at = Instant::now();
    d.cli_ok(&["deny", "198.18.0.77/32", "--for", "6s"]);
    d.child.signal(libc::SIGHUP);
    eventually(
        Duration::from_secs(5),
        "no refused reload in the log",
        || d.output().contains("reload refused"),
    );
    let log = d.output();
    assert!(
        log.contains(&format!(
            "the list {} is a FIFO (named pipe), not a regular file",
            fifo.display()
        )),
        "{log}"
    );
    let out = answers(&d, &["reload"]);
    let err = text(&out.stderr);
    assert!(
        !out.status.success() && err.contains(&format!("the list {} is a FIFO", fifo.display())),
        "reload onto a FIFO: {err}"
    );
    ends_on_time(&d, "198.18.0.77/32", set_at, 6);
    let mut after = d.json(&["list"]);
    after["live_changes"] = before["live_changes"].clone();
    assert_eq!(after, before, "a refused reload changed the rules");
}

/// (Item 6) A read that hangs (the list's open held, as on a hung file
/// system) holds up no change, stats or expiry: the daemon reads off its
/// loop, and applies the reload when the read ends, on top of the changes
/// made meanwhile.
#[test]
fn a_slow_read_holds_up_no_change_stats_or_expiry() {
    privileged!("a_slow_read_holds_up_no_change_stats_or_expiry");
    let h = Host::bare("slow-read");
    let list = h.path("bans.txt");
    std::fs::write(&list, "198.18.9.9\n").expect("list");
    let config = with_list(h.run_dir(), "bans.txt");
    let d = h.daemon(&["--config", config.to_str().expect("utf-8")]);
    std::fs::write(&list, "198.18.9.9\n198.18.9.10\n").expect("list");
    let hold = HeldOpens::new(&list);
    let set_at = Instant::now();
    d.cli_ok(&["deny", "198.18.0.78/32", "--for", "5s"]);
    d.child.signal(libc::SIGHUP);
    assert!(
        hold.wait_held(Duration::from_secs(5)),
        "the reload did not open the list"
    );
    // A reload asked for meanwhile waits its turn, answered when it is done.
    let reload = {
        let mut cmd = d.cli_command(&["reload"]);
        std::thread::spawn(move || cmd.output().expect("reload"))
    };
    // While the read hangs: stats, a change, the list, the end of the ban.
    let out = answers(&d, &["stats", "--json"]);
    assert!(out.status.success(), "stats: {}", text(&out.stderr));
    let out = answers(&d, &["deny", "198.18.0.79/32"]);
    assert!(out.status.success(), "deny: {}", text(&out.stderr));
    ends_on_time(&d, "198.18.0.78/32", set_at, 5);
    assert!(
        !reload.is_finished(),
        "the reload answered before its read ended"
    );
    assert!(
        !d.output().contains("reloaded"),
        "reloaded while the read hung"
    );
    hold.release();
    let out = reload.join().expect("reload thread");
    assert!(
        out.status.success(),
        "the reload waiting its turn: {}",
        text(&out.stderr)
    );
    eventually(Duration::from_secs(5), "no reload in the log", || {
        d.output().contains("reloaded")
    });
    let v = d.json(&["list"]);
    let rules: Vec<&str> = v["rules"]
        .as_array()
        .expect("rules")
        .iter()
        .filter_map(|r| r["cidr"].as_str())
        .collect();
    assert!(
        rules.contains(&"198.18.0.79/32") && !rules.contains(&"198.18.0.78/32"),
        "the reload did not keep the change made during its read: {rules:?}"
    );
    assert_eq!(v["lists"][0]["entries"], 2, "the list read again: {v}");
}

/// (Item 6) A list past the cap (a sparse 300 MiB file) is refused with the
/// cap, not "Broken pipe", and changes nothing.
#[test]
fn a_list_past_the_cap_is_refused_with_the_cap() {
    privileged!("a_list_past_the_cap_is_refused_with_the_cap");
    let (h, d) = Host::start("big-list", &[]);
    let before = d.json(&["list"]);
    let big = h.path("big.netset");
    std::fs::File::create(&big)
        .and_then(|f| f.set_len(300 << 20))
        .expect("a sparse file");
    let out = d.cli(&["deny", "--from", big.to_str().expect("utf-8")]);
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains(&format!(
            "--from: {} is 300 MiB (314572800 bytes): a list may be at most 256 MiB (268435456 bytes)",
            big.display()
        )) && !err.contains("Broken pipe"),
        "{err}"
    );
    assert_eq!(
        d.json(&["list"]),
        before,
        "a refused list changed the rules"
    );
}

/// (Item 10) `RATELIMIT_RUN_DIR` at a shared directory: one with the sticky
/// bit (like /tmp) keeps its mode and the daemon works in a directory of its
/// own inside it; one anybody may write in without it is refused, its mode
/// unchanged (both used to be chmodded to 0700, locking everybody out).
#[test]
fn a_shared_run_directory_keeps_its_mode() {
    privileged!("a_shared_run_directory_keeps_its_mode");
    let h = Host::bare("shared-run");
    let shared = h.run_dir();
    let set_mode = |p: &Path, mode| {
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).expect("chmod")
    };
    let mode = |p: &Path| std::fs::metadata(p).expect("stat").permissions().mode() & 0o7777;
    set_mode(shared, 0o1777);
    let d = h.daemon(&[]);
    assert_eq!(mode(shared), 0o1777, "the shared directory was changed");
    let own = shared.join("ratelimit");
    assert_eq!(mode(&own), 0o700, "the daemon's own directory");
    let cookie = d.json(&["status"])["netns_cookie"]
        .as_u64()
        .expect("cookie");
    let sock = own.join(format!("ns{cookie}/{}.sock", h.pair.rx_if));
    assert!(sock.exists(), "no socket at {}", sock.display());
    assert_eq!(d.stop(libc::SIGTERM).code(), Some(0));
    assert_eq!(mode(shared), 0o1777);

    let open = TempDir::new("open-run");
    set_mode(&open.0, 0o777);
    let out = refused_start(&h, &open.0, &[], "a run directory anybody may write in");
    assert!(
        out.contains(&format!(
            "{} is writable by others (mode 0777",
            open.0.display()
        )),
        "{out}"
    );
    assert_eq!(mode(&open.0), 0o777, "a refused directory was changed");
}

/// (Item 10) The run directory of a namespace that was deleted (its daemon
/// killed) goes at the next daemon's start; that of a namespace still there
/// stays.
#[test]
fn the_run_directory_of_a_deleted_namespace_goes_at_the_next_start() {
    privileged!("the_run_directory_of_a_deleted_namespace_goes_at_the_next_start");
    let run = TempDir::new("ns-sweep");
    let cookie_dir = |d: &Daemon| {
        let cookie = d.json(&["status"])["netns_cookie"]
            .as_u64()
            .expect("cookie");
        run.0.join(format!("ns{cookie}"))
    };
    let gone = Pair::new();
    let d = Daemon::start(&gone.rx, &gone.rx_if, &run.0, &[]);
    let gone_dir = cookie_dir(&d);
    drop(d); // SIGKILL: lock and socket stay.
    drop(gone);
    assert!(gone_dir.exists(), "removed before any start");

    let kept = Pair::new();
    let d = Daemon::start(&kept.rx, &kept.rx_if, &run.0, &[]);
    assert!(
        !gone_dir.exists(),
        "{} outlived its namespace; the daemon said: {}",
        gone_dir.display(),
        d.output()
    );
    assert!(
        d.output()
            .contains("removed the run directory of a network namespace that is gone"),
        "{}",
        d.output()
    );
    let kept_dir = cookie_dir(&d);
    assert_eq!(d.stop(libc::SIGTERM).code(), Some(0));

    // A namespace without a daemon, but there: its directory (its saved
    // rules) stays.
    let next = Pair::new();
    let d = Daemon::start(&next.rx, &next.rx_if, &run.0, &[]);
    assert!(
        kept_dir.exists(),
        "{} was removed, its namespace is there; the daemon said: {}",
        kept_dir.display(),
        d.output()
    );
}

/// (Item 13) The temporary file of a save cut short (SIGKILL between its
/// write and its rename) is removed at the next start; another interface's
/// is left alone.
#[test]
fn a_temporary_file_of_a_save_cut_short_is_removed_at_the_next_start() {
    privileged!("a_temporary_file_of_a_save_cut_short_is_removed_at_the_next_start");
    let (h, d) = Host::start("stale-tmp", &[]);
    let cookie = d.json(&["status"])["netns_cookie"]
        .as_u64()
        .expect("cookie");
    assert_eq!(d.stop(libc::SIGTERM).code(), Some(0));
    let ns = h.path(&format!("ns{cookie}"));
    let stale = [
        ns.join(format!(".{}.rules.json.99999.tmp", h.pair.rx_if)),
        ns.join(format!(".{}.mode.99998.tmp", h.pair.rx_if)),
    ];
    let other = ns.join(format!(".{}.100.rules.json.99997.tmp", h.pair.rx_if));
    for f in stale.iter().chain([&other]) {
        std::fs::write(f, b"{\"half\":").expect("planting a temporary file");
    }
    let d = h.daemon(&[]);
    for f in &stale {
        assert!(!f.exists(), "{} is still there", f.display());
    }
    assert!(other.exists(), "another interface's file was removed");
    drop(d);
}

/// (Item 13) The daemon's stdout closed (`ratelimit run … | head -1`): it
/// goes on enforcing and answering, prints nothing it cannot, and exits
/// cleanly, without a panic.
#[test]
fn a_closed_stdout_neither_stops_nor_panics_the_daemon() {
    privileged!("a_closed_stdout_neither_stops_nor_panics_the_daemon");
    let h = Host::bare("closed-stdout");
    let config = h.write(
        "r.toml",
        "[[rule]]\ncidr = \"198.18.1.0/24\"\naction = \"deny\"\n[[rule]]\ncidr = \"198.18.2.0/24\"\nrate = \"10/s\"\n",
    );
    let log = h.path("stderr.log");
    let mut cmd = h.daemon_command(&["--config", &config]);
    cmd.env("RUST_BACKTRACE", "1")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(&log).expect("log"));
    let mut child = ChildGuard::spawn(cmd, "ratelimit run | head -1");
    // `head -1`: the first line, then the pipe is closed.
    let stdout = child.take_stdout().expect("stdout");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut line = String::new();
        let _ = std::io::BufReader::new(stdout).read_line(&mut line);
        let _ = tx.send(line);
    });
    let first = rx
        .recv_timeout(Duration::from_secs(20))
        .expect("no first line within 20 s");
    assert!(first.starts_with("ratelimit: enforcing on"), "{first:?}");
    let cli = |args: &[&str]| {
        h.command(args)
            .args(["--iface", &h.pair.rx_if])
            .output()
            .expect("cli")
    };
    // A reload prints the rules again, into the closed pipe.
    let out = cli(&["reload"]);
    assert!(out.status.success(), "reload: {}", text(&out.stderr));
    let out = cli(&["deny", "198.18.3.0/24"]);
    assert!(out.status.success(), "deny: {}", text(&out.stderr));
    assert!(child.exited().is_none(), "the daemon exited");
    let stderr = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(!stderr.contains("panicked"), "{stderr}");
    child.signal(libc::SIGTERM);
    let out = child.wait(Duration::from_secs(10));
    let stderr = std::fs::read_to_string(&log).unwrap_or_default();
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert!(!h.pair.rx_has_xdp(), "still attached after SIGTERM");
}
