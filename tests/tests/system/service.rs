//! The systemd units. `dist/ratelimit@.service`: it verifies, its exposure
//! (`systemd-analyze security`) stays at 4.0 or below, the daemon does its work
//! with exactly the capabilities the unit leaves it, and every system call it
//! makes is one the unit's filter allows. `dist/ratelimit-serve.service`: it
//! verifies, its exposure stays at 2.0 or below, and `ratelimit serve`
//! decides as a user of no account with no capability.

use std::{collections::BTreeSet, path::Path, process::Command, time::Duration};

use ratelimit_tests::{
    Daemon, TempDir,
    check::ip,
    fixture::Host,
    net::{Pair, pin_dirs},
    privileged, ratelimit_bin, require_tool,
};

/// The highest exposure level the unit may have (systemd's scale: 0 is
/// locked down, 10 is a service with no sandbox; "OK" ends at 4.9).
const MAX_EXPOSURE: f64 = 4.0;

/// The highest exposure level the service's unit may have: it keeps no
/// capability and runs as a user of its own.
const MAX_SERVE_EXPOSURE: f64 = 2.0;

/// The daemon's unit.
const DAEMON_UNIT: &str = "ratelimit@.service";
/// The service's unit.
const SERVE_UNIT: &str = "ratelimit-serve.service";

fn unit_text_of(unit: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../dist")
        .join(unit);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()))
}

/// Every value of `key=` in `unit`, in order (a key may be given several
/// times, as SystemCallFilter= is).
fn unit_values_of(unit: &str, key: &str) -> Vec<String> {
    let prefix = format!("{key}=");
    unit_text_of(unit)
        .lines()
        .filter_map(|l| l.trim().strip_prefix(&prefix).map(str::to_string))
        .collect()
}

fn unit_value_of(unit: &str, key: &str) -> String {
    let v = unit_values_of(unit, key);
    assert_eq!(v.len(), 1, "{key}= given {} times in {unit}", v.len());
    v[0].clone()
}

/// Every value of `key=` in the daemon's unit.
fn unit_values(key: &str) -> Vec<String> {
    unit_values_of(DAEMON_UNIT, key)
}

fn unit_value(key: &str) -> String {
    unit_value_of(DAEMON_UNIT, key)
}

/// The unit's capability bounding set, e.g. `["CAP_BPF", "CAP_NET_ADMIN", …]`.
fn unit_caps() -> Vec<String> {
    unit_value("CapabilityBoundingSet")
        .split_whitespace()
        .map(str::to_string)
        .collect()
}

/// The bit of a capability in /proc/PID/status masks (linux/capability.h).
fn cap_bit(name: &str) -> u32 {
    match name {
        "CAP_NET_ADMIN" => 12,
        "CAP_NET_RAW" => 13,
        "CAP_IPC_LOCK" => 14,
        "CAP_SYS_PTRACE" => 19,
        "CAP_SYS_ADMIN" => 21,
        "CAP_SYS_RESOURCE" => 24,
        "CAP_PERFMON" => 38,
        "CAP_BPF" => 39,
        other => panic!("the test does not know the bit of {other}: add it"),
    }
}

/// A hex mask of /proc/PID/status (`CapEff`, `CapBnd`, …).
fn proc_caps(pid: i32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("status");
    let hex = status
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{field}:")))
        .unwrap_or_else(|| panic!("no {field} in /proc/{pid}/status"));
    u64::from_str_radix(hex.trim(), 16).expect("hex mask")
}

#[test]
fn the_unit_verifies_and_its_exposure_is_at_most_4() {
    let name = "the_unit_verifies_and_its_exposure_is_at_most_4";
    if !require_tool(name, "systemd-analyze") {
        return;
    }
    // What the unit must keep doing.
    let exec = unit_value("ExecStart");
    assert!(
        exec.starts_with("/usr/local/bin/ratelimit run --iface %i")
            && exec.contains("--keep-attached"),
        "ExecStart={exec}"
    );
    assert_eq!(unit_value("ExecReload"), "/bin/kill -HUP $MAINPID");
    assert_eq!(unit_value("Restart"), "on-failure");
    assert_eq!(unit_value("LimitNOFILE"), "65536");
    // The CLI talks only to a control socket root owns.
    assert_eq!(unit_value("User"), "root");
    assert_eq!(unit_value("RuntimeDirectory"), "ratelimit");
    assert!(
        unit_value("Documentation").contains("man:ratelimit(8)"),
        "Documentation={}",
        unit_value("Documentation")
    );

    let (exposure, report) = verify_and_score(DAEMON_UNIT, "ratelimit@eth0.service");
    assert!(
        exposure <= MAX_EXPOSURE,
        "exposure {exposure}, at most {MAX_EXPOSURE} wanted:\n{report}"
    );
}

/// `systemd-analyze verify` and `security` on a copy of `unit` named
/// `instance`, run by the binary under test (the installed path need not
/// exist here), with the man pages it refers to on MANPATH (verify checks
/// both): panics with what verify says, else the exposure level and
/// systemd's report.
fn verify_and_score(unit: &str, instance: &str) -> (f64, String) {
    let dir = TempDir::new("unit");
    let path = dir.0.join(instance);
    let bin = ratelimit_bin();
    std::fs::write(
        &path,
        unit_text_of(unit).replace(
            "/usr/local/bin/ratelimit",
            bin.to_str().expect("UTF-8 path"),
        ),
    )
    .expect("writing the unit copy");
    let man = dir.0.join("man");
    let out = Command::new(&bin)
        .arg("man")
        .arg("--out")
        .arg(man.join("man8"))
        .output()
        .expect("ratelimit man");
    assert!(
        out.status.success(),
        "ratelimit man --out: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = Command::new("systemd-analyze")
        .arg("verify")
        .arg(&path)
        .env("MANPATH", &man)
        .output()
        .expect("systemd-analyze verify");
    let complaints = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && complaints.trim().is_empty(),
        "systemd-analyze verify {instance} ({}): {complaints}",
        out.status
    );
    let out = Command::new("systemd-analyze")
        .args(["security", "--offline=true"])
        .arg(&path)
        .output()
        .expect("systemd-analyze security");
    let report = String::from_utf8_lossy(&out.stdout);
    let line = report
        .lines()
        .find(|l| l.contains(&format!("Overall exposure level for {instance}:")))
        .unwrap_or_else(|| {
            panic!(
                "no exposure level in: {report}{}",
                String::from_utf8_lossy(&out.stderr)
            )
        });
    let exposure = line
        .split(':')
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("unreadable exposure line: {line}"));
    (exposure, report.into_owned())
}

/// setpriv's form of the unit's capabilities: `-all,+bpf,+net_admin,…`.
fn setpriv_caps() -> String {
    let mut s = String::from("-all");
    for cap in unit_caps() {
        s.push_str(",+");
        s.push_str(&cap.trim_start_matches("CAP_").to_lowercase());
    }
    s
}

/// `setpriv` as uid 0 with exactly the unit's capabilities (bounding,
/// inheritable and ambient sets, as systemd sets them from
/// CapabilityBoundingSet= and AmbientCapabilities=), added to `cmd`.
fn confined(cmd: &mut Command) {
    let caps = setpriv_caps();
    cmd.arg("--reuid=0")
        .arg(format!("--bounding-set={caps}"))
        .arg(format!("--inh-caps={caps}"))
        .arg(format!("--ambient-caps={caps}"))
        .arg("--");
}

/// Where the confined daemon serves its metrics, inside its namespace.
const METRICS: &str = "127.0.0.1:19493";

/// `ratelimit run` on the host's receiving end under [`confined`], with its
/// metrics on [`METRICS`].
fn start_confined(h: &Host) -> Daemon {
    let mut cmd = h.pair.rx.command("setpriv");
    confined(&mut cmd);
    cmd.arg(ratelimit_bin()).args([
        "run",
        "--iface",
        &h.pair.rx_if,
        "--keep-attached",
        "--metrics",
        METRICS,
    ]);
    h.spawn(cmd)
}

/// For `secs` seconds, every second: `status` says the interface is
/// attached, the metrics say so, and the daemon logged no error past its
/// first `from` lines of log. With the unit's three capabilities the
/// upkeep's check looked its own link up by id (which needs CAP_SYS_ADMIN)
/// and reported the working filter as dead within a second of every start.
fn stays_true(h: &Host, d: &Daemon, secs: u64, from: usize, when: &str) {
    for i in 0..secs {
        std::thread::sleep(Duration::from_secs(1));
        let status = d.json(&["status"]);
        assert_eq!(
            status["interface"],
            "attached",
            "{when}, {}s: status says {status}\nlog: {}",
            i + 1,
            d.output()
        );
        let body = h.pair.rx.scrape(METRICS);
        let attached = body
            .lines()
            .find(|l| l.starts_with("ratelimit_attached"))
            .unwrap_or_default();
        assert!(
            attached.ends_with(" 1"),
            "{when}, {}s: the metrics say `{attached}`",
            i + 1
        );
    }
    let log = d.output();
    let errors: Vec<&str> = log
        .lines()
        .skip(from)
        .filter(|l| l.contains("ERROR"))
        .collect();
    assert!(
        errors.is_empty(),
        "{when}: the daemon logged errors: {errors:#?}"
    );
}

/// Frames from a denied source and from one within the default limit, for
/// one second: the denied one must get nothing through.
fn assert_enforced(pair: &Pair, when: &str) {
    let (denied, fine) = (ip("198.18.0.66"), ip("198.18.0.10"));
    let got = pair.probe(&[(denied, 200), (fine, 200)], Duration::from_secs(1));
    let (d, f) = (
        got.get(&denied).copied().unwrap_or(0),
        got.get(&fine).copied().unwrap_or(0),
    );
    assert_eq!(d, 0, "{when}: {d} frames from the denied source arrived");
    assert!(
        f >= 150,
        "{when}: {f} of about 200 frames from a source within its limit arrived"
    );
}

#[test]
fn the_units_capabilities_are_enough_to_enforce_and_report_it_truly() {
    privileged!("the_units_capabilities_are_enough_to_enforce_and_report_it_truly");
    if !require_tool(
        "the_units_capabilities_are_enough_to_enforce_and_report_it_truly",
        "setpriv",
    ) {
        return;
    }
    let caps = unit_caps();
    let mut ambient: Vec<String> = unit_value("AmbientCapabilities")
        .split_whitespace()
        .map(str::to_string)
        .collect();
    ambient.sort();
    let mut bounding = caps.clone();
    bounding.sort();
    assert_eq!(
        ambient, bounding,
        "AmbientCapabilities= and CapabilityBoundingSet= differ"
    );
    let want: u64 = caps.iter().map(|c| 1u64 << cap_bit(c)).sum();

    let h = Host::bare("caps");
    let d = start_confined(&h);
    // The daemon itself (nsenter and setpriv exec it in place), with the
    // unit's capabilities and no others.
    let pid = d.child.pid();
    let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).expect("comm");
    assert_eq!(comm.trim(), "ratelimit");
    for field in ["CapEff", "CapPrm", "CapBnd"] {
        assert_eq!(
            proc_caps(pid, field),
            want,
            "{field} of the daemon: {:#x}, the unit's set {caps:?} is {want:#x}",
            proc_caps(pid, field)
        );
    }
    assert!(h.pair.rx_has_xdp(), "no XDP program on {}", h.pair.rx_if);
    d.cli_ok(&["deny", "198.18.0.66/32"]);
    assert_enforced(&h.pair, "first start");
    stays_true(&h, &d, 10, 0, "after the start");

    // The interface deleted and made again: attached to the new one, and
    // said so truly.
    let mut h = h;
    let del = Command::new("ip")
        .args(["-n", &h.pair.rx.name, "link", "del", &h.pair.rx_if])
        .status()
        .expect("ip link del");
    assert!(del.success());
    h.pair.relink();
    let start = std::time::Instant::now();
    while !(h.pair.rx_has_xdp() && d.json(&["status"])["interface"] == "attached") {
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "not attached to the re-created interface: {}\nlog: {}",
            d.json(&["status"]),
            d.output()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    // While the interface was gone the daemon may have said so (an ERROR,
    // and true: nothing was enforced on it); from its return on, nothing.
    let back = d.output().lines().count();
    assert_enforced(&h.pair, "after the interface was re-created");
    stays_true(&h, &d, 3, back, "after the interface was re-created");

    // SIGTERM with --keep-attached (as `systemctl stop`): still enforcing, pinned.
    let status = d.stop(libc::SIGTERM);
    assert!(status.success(), "exit on SIGTERM: {status:?}");
    assert!(
        h.pair.rx_has_xdp(),
        "SIGTERM under --keep-attached detached"
    );
    assert!(!pin_dirs(&h.pair.rx_if).is_empty(), "no pins after SIGTERM");

    // A second start, same capabilities, adopts the pinned program and maps.
    let d = start_confined(&h);
    let status = d.json(&["status"]);
    assert_eq!(
        status["adopted"], true,
        "the second start did not adopt: {status}"
    );
    let list = d.json(&["list"]);
    assert!(
        list.to_string().contains("198.18.0.66/32"),
        "the deny rule was lost across the restart: {list}"
    );
    assert_enforced(&h.pair, "after adopting");
    stays_true(&h, &d, 10, 0, "after adopting");
    let status = d.stop(libc::SIGTERM);
    assert!(status.success(), "second exit on SIGTERM: {status:?}");
}

/// Under `ip netns exec` (a mount namespace of its own, with a fresh /sys
/// and no bpffs) with the unit's capabilities, the host's bpffs cannot be
/// reached: mounting needs CAP_SYS_ADMIN, and an ancestor's namespace is
/// closed to a process with fewer capabilities than it. The daemon refuses
/// to start, naming the ways that work, and attaches nothing. (Decided: not
/// a start without pins, which would lose rules and buckets at the next
/// restart without a word.)
#[test]
fn under_ip_netns_exec_with_the_units_capabilities_the_refusal_names_what_works() {
    privileged!("under_ip_netns_exec_with_the_units_capabilities_the_refusal_names_what_works");
    if !require_tool(
        "under_ip_netns_exec_with_the_units_capabilities_the_refusal_names_what_works",
        "setpriv",
    ) {
        return;
    }
    let h = Host::bare("caps-netns-exec");
    let mut cmd = Command::new("ip");
    cmd.args(["netns", "exec", &h.pair.rx.name, "setpriv"]);
    confined(&mut cmd);
    cmd.arg(ratelimit_bin())
        .args(["run", "--iface", &h.pair.rx_if])
        .env("RATELIMIT_RUN_DIR", h.run_dir())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    let mut child = cmd.spawn().expect("ip netns exec … ratelimit run");
    let start = std::time::Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait") {
            break status;
        }
        if start.elapsed() > Duration::from_secs(20) {
            let _ = child.kill();
            let _ = child.wait();
            panic!("the daemon under ip netns exec with the unit's capabilities ran on");
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().expect("stderr"), &mut stderr)
        .expect("stderr");
    assert!(!status.success(), "started: {stderr}");
    assert!(
        stderr.contains("nsenter --net=/run/netns/") && stderr.contains("NetworkNamespacePath="),
        "the refusal does not name what works: {stderr}"
    );
    assert!(
        !h.pair.rx_has_xdp(),
        "a refused start left a program on {}",
        h.pair.rx_if
    );
}

/// The system calls a filter of the unit allows: each `@group` expanded by
/// `systemd-analyze syscall-filter` (groups nest), single names as given.
fn allowed_syscalls() -> BTreeSet<String> {
    fn expand(item: &str, into: &mut BTreeSet<String>) {
        if !item.starts_with('@') {
            into.insert(item.to_string());
            return;
        }
        let out = Command::new("systemd-analyze")
            .args(["syscall-filter", item])
            .output()
            .expect("systemd-analyze syscall-filter");
        assert!(out.status.success(), "unknown syscall group {item}");
        for line in String::from_utf8_lossy(&out.stdout).lines().skip(1) {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            expand(line, into);
        }
    }
    let mut allowed = BTreeSet::new();
    for value in unit_values("SystemCallFilter") {
        assert!(
            !value.starts_with('~'),
            "the test reads only allow lists; SystemCallFilter={value}"
        );
        for item in value.split_whitespace() {
            expand(item, &mut allowed);
        }
    }
    allowed
}

/// The threads of `pid`'s children (strace's tracee).
fn child_of(pid: i32) -> i32 {
    let children = std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"))
        .expect("children of strace");
    children
        .split_whitespace()
        .next()
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("strace ({pid}) has no child"))
}

#[test]
fn every_system_call_the_daemon_makes_is_in_the_units_filter() {
    let name = "every_system_call_the_daemon_makes_is_in_the_units_filter";
    privileged!(name);
    if !require_tool(name, "strace") || !require_tool(name, "systemd-analyze") {
        return;
    }
    let allowed = allowed_syscalls();
    assert!(allowed.contains("bpf") && allowed.contains("read"));

    let h = Host::bare("syscalls");
    let config = h.write("rules.toml", "[default]\nrate = \"500/s\"\n");
    let trace = h.path("strace.txt");
    let metrics = "127.0.0.1:19481";
    // Everything the daemon does in a day: start with a config and metrics,
    // take changes, answer reads, be scraped, reload on SIGHUP, stop.
    let mut cmd = h.pair.rx.command("strace");
    cmd.args(["-f", "-c", "-o"])
        .arg(&trace)
        .arg("--")
        .arg(ratelimit_bin())
        .args(["run", "--iface", &h.pair.rx_if, "--keep-attached"])
        .arg("--config")
        .arg(&config)
        .args(["--metrics", metrics]);
    let d = h.spawn(cmd);
    d.cli_ok(&["deny", "198.18.0.66/32"]);
    d.cli_ok(&["set", "198.18.0.0/24", "--rate", "100/s", "--per", "24"]);
    let _ = h
        .pair
        .probe(&[(ip("198.18.0.66"), 100)], Duration::from_millis(300));
    for read in [&["stats"][..], &["status"], &["list"]] {
        d.json(read);
    }
    d.cli_ok(&["top"]);
    let scrape = h
        .pair
        .rx
        .command("python3")
        .args([
            "-c",
            &format!(
                "import urllib.request;urllib.request.urlopen('http://{metrics}/metrics').read()"
            ),
        ])
        .status()
        .expect("scraping");
    assert!(scrape.success(), "the metrics scrape failed");
    let daemon = child_of(d.child.pid());
    // SAFETY: signalling the daemon this test started.
    unsafe { libc::kill(daemon, libc::SIGHUP) };
    d.cli_ok(&["reload"]);
    // SAFETY: signalling the daemon this test started.
    unsafe { libc::kill(daemon, libc::SIGTERM) };
    // strace exits with its tracee, after writing the summary.
    let out = d.child.wait(Duration::from_secs(20));
    assert!(out.status.success(), "exit under strace: {:?}", out.status);

    let summary = std::fs::read_to_string(&trace).expect("strace summary");
    // `% time  seconds  usecs/call  calls  [errors]  syscall`: the name is
    // the last column of each row between the rule lines.
    let used: BTreeSet<String> = summary
        .lines()
        .skip_while(|l| !l.starts_with("------"))
        .skip(1)
        .take_while(|l| !l.starts_with("------"))
        .filter_map(|l| l.split_whitespace().last().map(str::to_string))
        .collect();
    assert!(
        used.contains("bpf") && used.len() > 20,
        "strace saw too little: {summary}"
    );
    let refused: Vec<&String> = used.difference(&allowed).collect();
    assert!(
        refused.is_empty(),
        "the daemon makes system calls the unit's SystemCallFilter= refuses (EPERM): {refused:?}\n{summary}"
    );
}

/// The service's unit keeps no capability and runs as a user systemd makes
/// up (no root, no account), with an exposure of at most 2.0; and
/// `ratelimit-serve`, which it starts, decides as such a user: uid 65534, no
/// capability in any set, no new privileges, against a real Redis.
#[test]
fn the_service_unit_keeps_no_privilege_and_serves_without_any() {
    let name = "the_service_unit_keeps_no_privilege_and_serves_without_any";
    if !require_tool(name, "systemd-analyze") {
        return;
    }
    let exec = unit_value_of(SERVE_UNIT, "ExecStart");
    assert_eq!(exec, "/usr/local/bin/ratelimit-serve $SERVE_ARGS");
    assert_eq!(unit_value_of(SERVE_UNIT, "DynamicUser"), "yes");
    assert_eq!(unit_value_of(SERVE_UNIT, "CapabilityBoundingSet"), "");
    assert_eq!(unit_value_of(SERVE_UNIT, "AmbientCapabilities"), "");
    assert!(
        unit_values_of(SERVE_UNIT, "User").is_empty(),
        "no User=: DynamicUser= makes one"
    );
    let (exposure, report) = verify_and_score(SERVE_UNIT, SERVE_UNIT);
    assert!(
        exposure <= MAX_SERVE_EXPOSURE,
        "exposure {exposure}, at most {MAX_SERVE_EXPOSURE} wanted:\n{report}"
    );

    privileged!(name);
    // A copy nobody may run, wherever the build is.
    use std::os::unix::fs::PermissionsExt as _;
    let dir = TempDir::new("serve-bin");
    let bin = dir.0.join("ratelimit-serve");
    std::fs::copy(ratelimit_bin().with_file_name("ratelimit-serve"), &bin)
        .expect("copying the service's binary");
    std::fs::set_permissions(&bin, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let redis = ratelimit_tests::redis::RedisServer::start();
    let s = ratelimit_tests::serve::Service::start_with(
        &redis.url(),
        &ratelimit_tests::serve::Setup {
            wrapper: &[
                "setpriv",
                "--reuid=65534",
                "--regid=65534",
                "--clear-groups",
                "--bounding-set=-all",
                "--inh-caps=-all",
                "--no-new-privs",
                "--",
            ],
            program: Some(&bin),
            ..Default::default()
        },
    );
    let status = std::fs::read_to_string(format!("/proc/{}/status", s.pid())).expect("status");
    let uid = status
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .expect("Uid:");
    assert!(
        uid.split_whitespace().all(|u| u == "65534"),
        "the service runs as uid 65534: Uid:{uid}"
    );
    for set in ["CapEff", "CapPrm", "CapBnd", "CapAmb"] {
        assert_eq!(proc_caps(s.pid(), set), 0, "{set} of the service");
    }
    let (code, r) = s.post(
        "/v1/acquire",
        serde_json::json!({"key": "unit", "limit": {"rate": "10/s", "burst": 2}}),
    );
    assert_eq!(code, 200, "{r}");
    assert_eq!(r["allowed"], true, "{r}");
}

/// The service is a program of its own: the daemon's binary (root, CAP_BPF)
/// holds none of its code (no gRPC, no Envoy types: their sources' paths
/// and the gRPC service's path are absent), `ratelimit-serve` beside it
/// holds them, and `ratelimit serve` is still the command, answered by it.
#[test]
fn the_daemons_binary_holds_nothing_of_the_service() {
    let daemon = ratelimit_bin();
    let service = daemon.with_file_name("ratelimit-serve");
    let holds = |bin: &Path, what: &str| {
        let bytes = std::fs::read(bin).unwrap_or_else(|e| panic!("reading {}: {e}", bin.display()));
        bytes.windows(what.len()).any(|w| w == what.as_bytes())
    };
    // The gRPC service's path (the help text names its package, so not that
    // alone), and the sources of tonic and Envoy's types (in panic messages).
    for what in [
        "envoy.service.ratelimit.v3.RateLimitService",
        "/tonic-0.",
        "/envoy-types-0.",
    ] {
        assert!(!holds(&daemon, what), "{} holds {what:?}", daemon.display());
        assert!(
            holds(&service, what),
            "{} does not hold {what:?}",
            service.display()
        );
    }
    // The command stays: `ratelimit serve` is answered by the service's
    // binary (its name in the usage line, its own exit code for bad input).
    let out = Command::new(&daemon)
        .args(["serve", "--redis", "redis://127.0.0.1:1", "--threads", "0"])
        .output()
        .expect("ratelimit serve");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("ratelimit serve: --threads: \"0\" is not a number of threads"),
        "{err}"
    );
    // A `ratelimit` copied alone says what is missing, and fails.
    let dir = ratelimit_tests::TempDir::new("alone");
    let alone = dir.0.join("ratelimit");
    std::fs::copy(&daemon, &alone).expect("copying the binary");
    let out = Command::new(&alone)
        .args(["serve", "--redis", "redis://127.0.0.1:1"])
        .env("PATH", &dir.0)
        .output()
        .expect("ratelimit serve, alone");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("runs the service's own binary, ratelimit-serve, which could not be started"),
        "{err}"
    );
}
