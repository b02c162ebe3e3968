//! `cargo xtask bench`: measurements, not tests. Prints tables and writes
//! `bench/results.md` and `bench/results.json`. Every figure is a median over
//! repeated runs with its min–max, beside the floor measured in the same run, so
//! ratios hold across machines.
//!
//! Sections: cost per packet (BPF_PROG_TEST_RUN), memory and scale, and the delay
//! from `ratelimit set` to enforcement.

use std::{
    fmt::Write as _,
    net::IpAddr,
    path::PathBuf,
    time::{Duration, Instant},
};

use aya::EbpfLoader;
use ratelimit_common::Reason;
use ratelimit_tests::{
    Daemon, TempDir,
    frames::{TPID_8021Q, Udp},
    net::{Flow, NetNs, Pair, Receiver, send_async},
    testrun::{Loaded, XDP_DROP, XDP_PASS, load_xdp, pin_to_cpu, test_run, test_run_live, unpin},
};
use ratelimit_user::{
    daemon::monotonic_ns,
    rate::parse_rate,
    rules::{Action, Limit, Prefix, RuleSet, default_limit},
};
use serde_json::{Value, json};

struct Opts {
    quick: bool,
    out: PathBuf,
    /// Run one section only (cost, throughput, memory, set).
    only: Option<String>,
}

impl Opts {
    fn runs(&self, section: &str) -> bool {
        self.only.as_deref().is_none_or(|o| o == section)
    }
}

fn main() {
    let mut opts = Opts {
        quick: false,
        out: PathBuf::from("bench"),
        only: None,
    };
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--quick" => opts.quick = true,
            "--out" => opts.out = PathBuf::from(args.next().expect("--out DIR")),
            "--only" => opts.only = Some(args.next().expect("--only SECTION")),
            other => panic!(
                "unknown argument {other:?}; expected --quick, --out DIR or --only cost|throughput|accuracy|memory|set"
            ),
        }
    }
    // SAFETY: no preconditions.
    assert!(
        unsafe { libc::geteuid() } == 0,
        "the benchmarks need root (BPF, namespaces)"
    );
    let mut report = Report::default();
    report.machine();
    // One CPU for the cost measurements; the traffic sections start threads of
    // their own.
    if opts.runs("cost") {
        pin_to_cpu(0);
        cost_per_packet(&opts, &mut report);
        unpin();
    }
    if opts.runs("throughput") {
        drop_throughput(&opts, &mut report);
    }
    if opts.runs("accuracy") {
        accuracy(&opts, &mut report);
    }
    if opts.runs("memory") {
        memory_and_scale(&opts, &mut report);
    }
    if opts.runs("set") {
        set_to_enforced(&opts, &mut report);
    }
    report.write(&opts.out);
}

#[derive(Default)]
struct Report {
    md: String,
    json: serde_json::Map<String, Value>,
}

impl Report {
    fn machine(&mut self) {
        let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
        let cpu = std::fs::read_to_string("/proc/cpuinfo")
            .unwrap_or_default()
            .lines()
            .find_map(|l| {
                l.strip_prefix("model name")
                    .map(|m| m.trim_start_matches([' ', '\t', ':']).to_string())
            })
            .unwrap_or_default();
        // SAFETY: no preconditions.
        let cpus = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) };
        let date = std::process::Command::new("date")
            .arg("-u")
            .arg("+%Y-%m-%d %H:%M UTC")
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
            .unwrap_or_default();
        let _ = writeln!(self.md, "# ratelimit benchmarks\n");
        let _ = writeln!(
            self.md,
            "Run {date} on {cpu} ({cpus} CPUs), kernel {}. Reproduce with `cargo xtask bench` (as root). \
             Figures drift ±20–30 % between runs on a shared machine: compare the ratios within one run.\n",
            kernel.trim()
        );
        self.json.insert(
            "machine".into(),
            json!({"kernel": kernel.trim(), "cpu": cpu, "cpus": cpus, "date": date}),
        );
    }

    fn section(&mut self, title: &str, intro: &str) {
        let _ = writeln!(self.md, "## {title}\n\n{intro}\n");
        println!("\n== {title}");
    }

    fn write(&self, dir: &std::path::Path) {
        std::fs::create_dir_all(dir).expect("creating the output directory");
        if let Some(svg) = self.chart() {
            std::fs::write(dir.join("throughput.svg"), svg).expect("writing throughput.svg");
            println!("wrote {}", dir.join("throughput.svg").display());
        }
        std::fs::write(dir.join("results.md"), &self.md).expect("writing results.md");
        std::fs::write(
            dir.join("results.json"),
            serde_json::to_string_pretty(&Value::Object(self.json.clone())).expect("json"),
        )
        .expect("writing results.json");
        println!(
            "\nwrote {} and {}",
            dir.join("results.md").display(),
            dir.join("results.json").display()
        );
    }
}

impl Report {
    /// A horizontal bar chart of drop throughput by configuration, as SVG.
    fn chart(&self) -> Option<String> {
        let rows = self.json.get("drop_throughput")?.get("rows")?.as_array()?;
        let bars: Vec<(String, f64)> = rows
            .iter()
            .filter_map(|r| {
                Some((
                    format!("{} — {}", r["flood"].as_str()?, r["receiver"].as_str()?),
                    r["fps_median"].as_f64()?,
                ))
            })
            .collect();
        let max = bars.iter().map(|b| b.1).fold(1.0, f64::max);
        let (label_w, bar_w, row_h) = (430.0, 420.0, 26.0);
        let height = 60.0 + row_h * bars.len() as f64;
        let mut svg = format!(
            "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{}\" height=\"{height}\" font-family=\"sans-serif\" font-size=\"12\">\n\
             <text x=\"10\" y=\"22\" font-size=\"15\">Frames received and dropped per second at the receiver (veth, one run)</text>\n",
            label_w + bar_w + 110.0
        );
        for (i, (label, v)) in bars.iter().enumerate() {
            let y = 40.0 + row_h * i as f64;
            let w = bar_w * v / max;
            let colour = if label.contains("ratelimit") {
                "#2b7bb9"
            } else if label.contains("floor") {
                "#999999"
            } else {
                "#d9822b"
            };
            let _ = write!(
                svg,
                "<text x=\"{}\" y=\"{}\" text-anchor=\"end\">{}</text>\n\
                 <rect x=\"{}\" y=\"{}\" width=\"{w:.1}\" height=\"{}\" fill=\"{colour}\"/>\n\
                 <text x=\"{}\" y=\"{}\">{:.2} M/s</text>\n",
                label_w - 8.0,
                y + 15.0,
                label
                    .replace('&', "&amp;")
                    .replace('<', "&lt;")
                    .replace('>', "&gt;"),
                label_w,
                y + 3.0,
                row_h - 8.0,
                label_w + w + 6.0,
                y + 15.0,
                v / 1e6
            );
        }
        svg.push_str("</svg>\n");
        Some(svg)
    }
}

/// Median, min and max.
fn stats(mut v: Vec<f64>) -> (f64, f64, f64) {
    v.sort_by(f64::total_cmp);
    (v[v.len() / 2], v[0], v[v.len() - 1])
}

fn ip(s: &str) -> IpAddr {
    s.parse().expect("address")
}

fn v4(src: &str) -> Vec<u8> {
    Udp::new(ip(src), ip("198.18.0.2")).build()
}

fn limit(rate: &str, burst: u64) -> Limit {
    Limit {
        rate: parse_rate("rate", rate).expect("rate"),
        burst,
        ..default_limit()
    }
}

fn rules(l: Limit) -> RuleSet {
    RuleSet {
        default: Action::Limit(l),
        ..RuleSet::default()
    }
}

/// Cost per packet with BPF_PROG_TEST_RUN: mean ns per run over `repeat` runs,
/// repeated `rounds` times.
fn cost_per_packet(opts: &Opts, report: &mut Report) {
    let repeat: u32 = 1_000_000;
    let rounds = if opts.quick { 3 } else { 9 };
    report.section(
        "Cost per packet (BPF_PROG_TEST_RUN)",
        &format!(
            "Mean ns per frame over {repeat} runs of one frame, median of {rounds} rounds (min–max), one CPU. \
             The floors: a program that only returns XDP_DROP, and one that only looks the IPv4 source up in an LRU hash and bumps it in place."
        ),
    );
    let mut floors = EbpfLoader::new()
        .load(ratelimit_user::FLOORS_OBJECT)
        .expect("loading the floors");
    let drop_fd = load_xdp(&mut floors, "floor_drop");
    let lru_fd = load_xdp(&mut floors, "floor_lru");
    let clock_fd = load_xdp(&mut floors, "floor_lru_clock");
    let exact_fd = load_xdp(&mut floors, "floor_exact");
    let jiffies_fd = load_xdp(&mut floors, "floor_lru_jiffies");
    let coarse_fd = load_xdp(&mut floors, "floor_lru_coarse");

    // Within limit: 100 M/s with a large burst, so every run passes and writes.
    let fast = limit("100M/s", 1 << 32);
    let within = Loaded::with_capacity(&rules(fast), 1 << 20);
    // Over limit: one per second, burst 1; every run after the first is denied.
    let over = Loaded::with_capacity(&rules(limit("1/s", 1)), 1 << 20);
    // With 1000 prefix rules in the trie (the source matches none of them).
    let mut many = rules(fast);
    for i in 0..1000u32 {
        let p = Prefix::parse("bench", &format!("2001:db8:{:x}::/48", i + 1)).expect("prefix");
        many.rules.insert(p, Action::Allow);
    }
    let with_rules = Loaded::with_capacity(&many, 1 << 20);

    let frame4 = v4("198.18.7.1");
    let frame6 = Udp::new(ip("2001:db8:7::1"), ip("2001:db8::2")).build();
    let mut tagged = Udp::new(ip("198.18.7.2"), ip("198.18.0.2"));
    tagged.vlans = vec![(TPID_8021Q, 100)];
    let frame_vlan = tagged.build();

    let cases: Vec<(&str, i32, &[u8], u32)> = vec![
        ("floor: XDP_DROP only", drop_fd, &frame4, XDP_DROP),
        (
            "floor: LRU lookup + in-place update",
            lru_fd,
            &frame4,
            XDP_DROP,
        ),
        (
            "floor: the same + bpf_ktime_get_ns",
            clock_fd,
            &frame4,
            XDP_DROP,
        ),
        (
            "floor: exact (20-byte key, LRU lookup + compare-and-swap)",
            exact_fd,
            &frame4,
            XDP_DROP,
        ),
        ("floor: LRU + bpf_jiffies64", jiffies_fd, &frame4, XDP_DROP),
        (
            "floor: LRU + bpf_ktime_get_coarse_ns",
            coarse_fd,
            &frame4,
            XDP_DROP,
        ),
        (
            "ratelimit, IPv4, known source, within limit",
            within.prog_fd(),
            &frame4,
            XDP_PASS,
        ),
        (
            "ratelimit, IPv6, known source, within limit",
            within.prog_fd(),
            &frame6,
            XDP_PASS,
        ),
        (
            "ratelimit, VLAN IPv4, known source, within limit",
            within.prog_fd(),
            &frame_vlan,
            XDP_PASS,
        ),
        (
            "ratelimit, IPv4, known source, over limit (dropped)",
            over.prog_fd(),
            &frame4,
            XDP_DROP,
        ),
        (
            "ratelimit, IPv4, 1000 rules in the trie",
            with_rules.prog_fd(),
            &frame4,
            XDP_PASS,
        ),
    ];
    // Warm every key and cache, then measure round-robin so drift hits all alike.
    for (_, fd, frame, _) in &cases {
        let _ = test_run(*fd, frame, 1000);
    }
    let mut samples: Vec<Vec<f64>> = vec![Vec::new(); cases.len()];
    for _ in 0..rounds {
        for (i, (name, fd, frame, want)) in cases.iter().enumerate() {
            let (verdict, ns) = test_run(*fd, frame, repeat);
            assert_eq!(verdict, *want, "{name}: unexpected verdict while measuring");
            samples[i].push(f64::from(ns));
        }
    }
    let rows: Vec<(&str, (f64, f64, f64))> = cases
        .iter()
        .zip(samples)
        .map(|((name, ..), v)| (*name, stats(v)))
        .collect();
    let drop = rows[0].1;
    let lru = rows[1].1;
    // New sources: one run per distinct source (the kernel still times the run).
    let fresh = Loaded::with_capacity(&rules(fast), 1 << 20);
    let n_new = if opts.quick { 20_000u32 } else { 200_000 };
    let mut new_rounds = Vec::new();
    for round in 0..3u32 {
        let mut total = 0u64;
        for i in 0..n_new {
            let k = round * n_new + i;
            let src = IpAddr::from([198, 18 + (k >> 16) as u8 % 2, (k >> 8) as u8, k as u8]);
            let f = Udp::new(src, ip("198.18.0.2")).build();
            total += u64::from(test_run(fresh.prog_fd(), &f, 1).1);
        }
        new_rounds.push(total as f64 / f64::from(n_new));
    }
    let new = stats(new_rounds);

    let _ = writeln!(
        report.md,
        "| path | ns/frame (median) | min–max | × XDP_DROP | × LRU floor |\n|---|---:|---:|---:|---:|"
    );
    let mut json_rows = Vec::new();
    let mut push = |name: &str, (m, lo, hi): (f64, f64, f64), report: &mut Report| {
        let _ = writeln!(
            report.md,
            "| {name} | {m:.1} | {lo:.0}–{hi:.0} | {:.2} | {:.2} |",
            m / drop.0,
            m / lru.0
        );
        println!(
            "{name:55} {m:7.1} ns  ({lo:.0}–{hi:.0})  {:.2}× drop  {:.2}× lru",
            m / drop.0,
            m / lru.0
        );
        json_rows.push(
            json!({"path": name, "ns_median": m, "ns_min": lo, "ns_max": hi,
            "x_drop_floor": m / drop.0, "x_lru_floor": m / lru.0}),
        );
    };
    for (name, v) in &rows {
        push(name, *v, report);
    }
    push(
        &format!("ratelimit, IPv4, new source (1 run each, {n_new} sources)"),
        new,
        report,
    );

    let ipv4 = rows[6].1.0;
    let p1 = ipv4 / lru.0;
    let ipv6_x = rows[7].1.0 / ipv4;
    let vlan_x = rows[8].1.0 / ipv4;
    let (insns, xlated) = within.verifier_stats();
    let _ = writeln!(
        report.md,
        "\nTargets: P1 known-source IPv4 ≤ 1.3× the LRU floor: **{p1:.2}×, {}**; IPv6 within +10 % of IPv4: **{:+.1} %, {}**; VLAN within +10 %: **{:+.1} %, {}**.\n",
        met(p1 <= 1.3),
        (ipv6_x - 1.0) * 100.0,
        met(ipv6_x <= 1.1),
        (vlan_x - 1.0) * 100.0,
        met(vlan_x <= 1.1),
    );
    let _ = writeln!(
        report.md,
        "The verifier processed {} instructions; the program is {} instructions after translation.\n",
        insns.map_or("?".into(), |n| n.to_string()),
        xlated.map_or("?".into(), |n| n.to_string())
    );
    println!(
        "P1 {p1:.2}× lru floor ({}); IPv6 {:+.1} %; VLAN {:+.1} %; verifier {insns:?} insns, {xlated:?} xlated",
        met(p1 <= 1.3),
        (ipv6_x - 1.0) * 100.0,
        (vlan_x - 1.0) * 100.0
    );
    report.json.insert(
        "cost_per_packet".into(),
        json!({"repeat": repeat, "rounds": rounds, "rows": json_rows,
            "p1_x_lru": p1, "ipv6_vs_ipv4": ipv6_x, "vlan_vs_ipv4": vlan_x,
            "verified_insns": insns, "xlated_insns": xlated}),
    );
}

fn met(ok: bool) -> &'static str {
    if ok { "met" } else { "missed" }
}

/// Kernel memory per tracked source, time to create 1 M sources, and the time
/// the daemon's reads take over them.
fn memory_and_scale(opts: &Opts, report: &mut Report) {
    let n: u32 = if opts.quick { 100_000 } else { 1 << 20 };
    report.section(
        "Memory and scale",
        &format!("{n} distinct sources (198.18.0.0/15's 131 072 IPv4 addresses, then IPv6 /64s) created through BPF_PROG_TEST_RUN (one run each), in a state map of {n} entries."),
    );
    let l = Loaded::with_capacity(&rules(limit("1000/s", 10)), n);
    let memlock = state_map_memlock();
    let start = Instant::now();
    for k in 0..n {
        let src = IpAddr::from([198, 18 + ((k >> 16) & 1) as u8, (k >> 8) as u8, k as u8]);
        // 198.18.0.0/15 holds 131 072 sources; past that, one IPv6 /64 each.
        let f = if k < (1 << 17) {
            Udp::new(src, ip("198.18.0.2"))
        } else {
            let b = k.to_be_bytes();
            Udp::new(
                IpAddr::from([
                    0x20, 0x01, 0x0d, 0xb8, b[0], b[1], b[2], b[3], 0, 0, 0, 0, 0, 0, 0, 1,
                ]),
                ip("2001:db8::2"),
            )
        }
        .build();
        let _ = test_run(l.prog_fd(), &f, 1);
    }
    let create = start.elapsed();
    let tracked = l.maps.states().count();
    let walk = {
        let t = Instant::now();
        let c = l.maps.states().count();
        assert_eq!(c, tracked);
        t.elapsed()
    };
    let counters = {
        let t = Instant::now();
        let _ = l.maps.counters().expect("counters");
        t.elapsed()
    };
    let per_source = memlock.map(|b| b as f64 / f64::from(n));
    let passed = l.packets(Reason::Passed);
    let _ = writeln!(report.md, "| measure | value | target |\n|---|---:|---|");
    let _ = writeln!(
        report.md,
        "| kernel memory per tracked source (state map's memlock ÷ capacity) | {} | ≤ 96 B: {} |",
        per_source.map_or("?".into(), |b| format!("{b:.1} B")),
        per_source.map_or("?", |b| met(b <= 96.0))
    );
    let _ = writeln!(
        report.md,
        "| sources tracked after {n} new ones | {tracked} | |"
    );
    let _ = writeln!(
        report.md,
        "| time to create them (syscall per frame included) | {:.2} s ({:.0} ns each) | |",
        create.as_secs_f64(),
        create.as_nanos() as f64 / f64::from(n)
    );
    let _ = writeln!(
        report.md,
        "| `status`: walk every tracked source | {:.3} s | ≤ 1 s: {} |",
        walk.as_secs_f64(),
        met(walk.as_secs_f64() <= 1.0)
    );
    let _ = writeln!(
        report.md,
        "| `stats`: read the counters | {:.3} ms | ≤ 1 s: {} |\n",
        counters.as_secs_f64() * 1e3,
        met(counters.as_secs_f64() <= 1.0)
    );
    println!(
        "memory/source {per_source:?} B; created {n} in {:.2} s; tracked {tracked}; passed {passed}; walk {:.3} s; counters {:.3} ms",
        create.as_secs_f64(),
        walk.as_secs_f64(),
        counters.as_secs_f64() * 1e3
    );
    report.json.insert(
        "memory_and_scale".into(),
        json!({"sources": n, "bytes_per_source": per_source, "create_s": create.as_secs_f64(),
            "tracked": tracked, "walk_s": walk.as_secs_f64(), "counters_s": counters.as_secs_f64()}),
    );
}

/// The state map's `memlock` from the kernel's own accounting (fdinfo).
fn state_map_memlock() -> Option<u64> {
    // The maps were taken by `Maps`; find the state map's fd through /proc.
    let dir = std::fs::read_dir("/proc/self/fdinfo").ok()?;
    let mut best = None;
    for e in dir.flatten() {
        let text = std::fs::read_to_string(e.path()).unwrap_or_default();
        if !text.contains("map_type:\t9") {
            continue; // BPF_MAP_TYPE_LRU_HASH
        }
        let field = |k: &str| {
            text.lines()
                .find_map(|line| line.strip_prefix(k))
                .and_then(|v| v.trim().parse::<u64>().ok())
        };
        if field("value_size:") == Some(8) && field("key_size:") == Some(20) {
            best = field("memlock:");
        }
    }
    best
}

/// From `ratelimit set` starting to the last frame the old limit let through.
fn set_to_enforced(opts: &Opts, report: &mut Report) {
    let trials = if opts.quick { 3 } else { 10 };
    report.section(
        "Set to enforced",
        &format!(
            "A daemon on a veth, a source sending 20 000 frames/s within a limit of 100 k/s; `ratelimit deny` on its /32; \
             the time from starting the command to the last frame that arrived. Median of {trials} (min–max)."
        ),
    );
    let pair = Pair::new();
    let run = TempDir::new("bench-set");
    let d = Daemon::start(&pair.rx, &pair.rx_if, &run.0, &["--rate", "100k/s"]);
    let src = ip("198.18.0.90");
    let mut delays = Vec::new();
    for _ in 0..trials {
        let rx = Receiver::start(&pair.rx, &pair.rx_if, 6000);
        let flows = [Flow {
            frame: pair.udp(src, 6000).build(),
            pps: 20_000,
        }];
        let sender = send_async(&pair.tx, &pair.tx_if, &flows, Duration::from_millis(800));
        std::thread::sleep(Duration::from_millis(300));
        let t0 = Instant::now();
        d.cli_ok(&["deny", "198.18.0.90/32"]);
        let _ = sender.join();
        let got = rx.finish_timed();
        let last = got
            .0
            .get(&src)
            .and_then(|v| v.iter().max().copied())
            .unwrap_or(t0);
        delays.push(last.saturating_duration_since(t0).as_secs_f64() * 1e3);
        d.cli_ok(&["unset", "198.18.0.90/32"]);
    }
    let (m, lo, hi) = stats(delays);
    let _ = writeln!(
        report.md,
        "Set to enforced: **{m:.1} ms** (min {lo:.1}, max {hi:.1}); target ≤ 100 ms: **{}**.\n",
        met(m <= 100.0)
    );
    println!("set to enforced: {m:.1} ms ({lo:.1}–{hi:.1})");
    report.json.insert(
        "set_to_enforced_ms".into(),
        json!({"median": m, "min": lo, "max": hi}),
    );
}

/// Runs `f` on a thread inside `ns`.
fn in_ns<T: Send>(ns: &NetNs, f: impl FnOnce() -> T + Send) -> T {
    std::thread::scope(|s| {
        s.spawn(move || {
            ns.enter();
            f()
        })
        .join()
        .expect("thread in a namespace")
    })
}

fn sh(ns: &NetNs, cmd: &str) -> String {
    let out = ns.command("sh").arg("-c").arg(cmd).output().expect("sh");
    assert!(
        out.status.success(),
        "`{cmd}` failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// rx packets from `ip -s -j link show` output.
fn rx_packets(json_text: &str) -> u64 {
    let v: Value = serde_json::from_str(json_text).unwrap_or(Value::Null);
    v[0]["stats64"]["rx"]["packets"].as_u64().unwrap_or(0)
}

/// Softirq time of all CPUs, ns (from /proc/stat, in clock ticks).
fn softirq_ns() -> u64 {
    let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let cpu = stat.lines().next().unwrap_or_default();
    // cpu user nice system idle iowait irq softirq
    let ticks: u64 = cpu
        .split_whitespace()
        .nth(7)
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    // SAFETY: no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as u64;
    ticks * 1_000_000_000 / hz
}

fn ensure_netfilter_tools() -> Result<(), String> {
    let have = |t: &str| {
        std::process::Command::new("sh")
            .arg("-c")
            .arg(format!("command -v {t}"))
            .output()
            .map(|o| o.status.success())
            .unwrap_or(false)
    };
    if have("nft") && have("iptables") && have("ip6tables") && have("ethtool") {
        return Ok(());
    }
    println!("installing nftables, iptables and ethtool from the distribution's packages");
    let ok = std::process::Command::new("sh")
        .arg("-c")
        .arg("apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nftables iptables ethtool")
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    if ok {
        Ok(())
    } else {
        Err("could not install nftables, iptables and ethtool with apt-get".into())
    }
}

/// What receives the flood.
#[derive(Clone, Copy, PartialEq)]
enum Receiver_ {
    Floor,
    Ratelimit { generic: bool },
    Nft,
    Iptables,
}

impl Receiver_ {
    fn name(self) -> &'static str {
        match self {
            Receiver_::Floor => "XDP_DROP floor (counting)",
            Receiver_::Ratelimit { generic: false } => "ratelimit (native)",
            Receiver_::Ratelimit { generic: true } => "ratelimit (generic)",
            Receiver_::Nft => "nftables meter",
            Receiver_::Iptables => "iptables hashlimit",
        }
    }
}

/// Drop throughput on a veth: a generator (BPF_PROG_RUN, live frames, XDP_TX)
/// floods the receiving side; each receiver counts what reached it.
fn drop_throughput(opts: &Opts, report: &mut Report) {
    let secs = if opts.quick { 1.0 } else { 4.0 };
    let rounds = if opts.quick { 1 } else { 3 };
    report.section(
        "Drop throughput on a veth",
        &format!(
            "A generator in one namespace (an XDP program run with BPF_PROG_RUN in live-frames mode, XDP_TX out of its veth, \
             a new source per frame where asked) floods the other for {secs} s; frames received and dropped per second at the receiver, \
             counted by the receiver itself (the floor's and ratelimit's counters; for nftables and iptables, the frames the receiving veth took in), \
             median of {rounds}; and softirq CPU time per frame on the machine. Limit: 1000/s per source, burst 1000 (netfilter: the same rate and burst)."
        ),
    );
    let netfilter = ensure_netfilter_tools();
    let mut gen_obj = EbpfLoader::new()
        .load(ratelimit_user::FLOORS_OBJECT)
        .expect("floors object");
    let gen_fd = load_xdp(&mut gen_obj, "gen_tx");
    let mut rows = Vec::new();
    let mut by = std::collections::HashMap::new();
    for (scenario, sources_log2, v6) in [
        ("one source at >100x its limit", 0u32, false),
        ("1 M spoofed IPv6 sources", 20, true),
    ] {
        let mut receivers = vec![
            Receiver_::Floor,
            Receiver_::Ratelimit { generic: false },
            Receiver_::Ratelimit { generic: true },
        ];
        if netfilter.is_ok() {
            receivers.extend([Receiver_::Nft, Receiver_::Iptables]);
        }
        for recv in receivers {
            let pair = Pair::new();
            let run = TempDir::new("bench-tput");
            // The receiver.
            let mut floor_obj = None;
            let mut daemon = None;
            match recv {
                Receiver_::Floor => {
                    let mut obj = EbpfLoader::new()
                        .load(ratelimit_user::FLOORS_OBJECT)
                        .expect("floors");
                    let prog: &mut aya::programs::Xdp = obj
                        .program_mut("floor_count")
                        .expect("floor_count")
                        .try_into()
                        .expect("xdp");
                    prog.load().expect("load floor_count");
                    let rx_if = pair.rx_if.clone();
                    in_ns(&pair.rx, || {
                        prog.attach(&rx_if, aya::programs::XdpMode::Driver)
                            .expect("attach floor_count")
                    });
                    floor_obj = Some(obj);
                }
                Receiver_::Ratelimit { generic } => {
                    if generic {
                        // Without a native XDP program the veth takes frames only with GRO on.
                        sh(
                            &pair.rx,
                            &format!("ethtool -K {} gro on >/dev/null", pair.rx_if),
                        );
                    }
                    let mut args = vec![
                        "--rate",
                        "1000/s",
                        "--burst",
                        "1000",
                        "--mode",
                        if generic { "generic" } else { "native" },
                    ];
                    if v6 {
                        args.extend(["--max-sources", "1048576"]);
                    }
                    daemon = Some(Daemon::start(&pair.rx, &pair.rx_if, &run.0, &args));
                }
                Receiver_::Nft => {
                    sh(
                        &pair.rx,
                        &format!("ethtool -K {} gro on >/dev/null", pair.rx_if),
                    );
                    let (fam, addr) = if v6 {
                        ("ip6", "ip6 saddr")
                    } else {
                        ("ip", "ip saddr")
                    };
                    sh(
                        &pair.rx,
                        &format!(
                            "nft add table {fam} rl && \
                         nft add chain {fam} rl pre '{{ type filter hook prerouting priority -300; policy accept; }}' && \
                         nft add rule {fam} rl pre meter m size 1048576 '{{ {addr} limit rate over 1000/second burst 1000 packets }}' drop"
                        ),
                    );
                }
                Receiver_::Iptables => {
                    sh(
                        &pair.rx,
                        &format!("ethtool -K {} gro on >/dev/null", pair.rx_if),
                    );
                    let ipt = if v6 { "ip6tables" } else { "iptables" };
                    sh(
                        &pair.rx,
                        &format!(
                            "{ipt} -t raw -A PREROUTING && {ipt} -t raw -A PREROUTING -m hashlimit --hashlimit-above 1000/sec --hashlimit-burst 1000 \
                         --hashlimit-mode srcip --hashlimit-name rl --hashlimit-htable-size 1048576 --hashlimit-htable-max 1048576 -j DROP"
                        ),
                    );
                }
            }
            let frame = if v6 {
                pair.udp(ip("2001:db8::1"), 7000).build()
            } else {
                pair.udp(ip("198.18.0.1"), 7000).build()
            };
            let count = |pair: &Pair| -> u64 {
                match recv {
                    Receiver_::Floor => {
                        let obj = floor_obj.as_ref().expect("floor");
                        let m: aya::maps::PerCpuArray<&aya::maps::MapData, u64> =
                            aya::maps::PerCpuArray::try_from(obj.map("FLOOR_COUNT").expect("map"))
                                .expect("percpu");
                        m.get(&0, 0).expect("read").iter().sum()
                    }
                    Receiver_::Ratelimit { .. } => {
                        let v = daemon.as_ref().expect("daemon").json(&["stats"]);
                        v["reasons"]
                            .as_array()
                            .expect("reasons")
                            .iter()
                            .filter_map(|r| r["packets"].as_u64())
                            .sum()
                    }
                    // Netfilter: frames the receiving veth took in (asking nft for its
                    // counter would dump the meter's million entries).
                    Receiver_::Nft | Receiver_::Iptables => rx_packets(&sh(
                        &pair.rx,
                        &format!("ip -s -j link show dev {}", pair.rx_if),
                    )),
                }
            };
            let mask = (1u64 << sources_log2) - 1;
            {
                let map = gen_obj.map_mut("GEN_CFG").expect("GEN_CFG");
                let mut cfg: aya::maps::Array<&mut aya::maps::MapData, u64> =
                    aya::maps::Array::try_from(map).expect("array");
                cfg.set(0, mask, 0).expect("set GEN_CFG");
            }
            let tx_if = pair.tx_if.clone();
            let mut rates = Vec::new();
            let mut cpu = Vec::new();
            for _ in 0..rounds {
                let before = count(&pair);
                let sirq = softirq_ns();
                let t0 = Instant::now();
                in_ns(&pair.tx, || {
                    pin_to_cpu(0);
                    let c = std::ffi::CString::new(tx_if.as_str()).expect("name");
                    // SAFETY: a valid C string.
                    let ifindex = unsafe { libc::if_nametoindex(c.as_ptr()) };
                    assert!(ifindex != 0, "no {tx_if} in the sending namespace");
                    while t0.elapsed().as_secs_f64() < secs {
                        test_run_live(gen_fd, &frame, ifindex, 200_000);
                    }
                });
                let elapsed = t0.elapsed().as_secs_f64();
                std::thread::sleep(Duration::from_millis(100));
                let got = count(&pair) - before;
                let sirq = softirq_ns() - sirq;
                rates.push(got as f64 / elapsed);
                cpu.push(if got > 0 {
                    sirq as f64 / got as f64
                } else {
                    f64::NAN
                });
            }
            let (m, lo, hi) = stats(rates);
            let (c, _, _) = stats(cpu);
            println!(
                "{scenario:32} {:24} {:>10.0} frames/s ({lo:.0}–{hi:.0})  {c:.0} ns softirq/frame",
                recv.name(),
                m
            );
            by.insert((scenario, recv.name()), m);
            rows.push((scenario, recv.name(), m, lo, hi, c));
            // The tables and rules go with the receiving namespace.
            drop(daemon);
            drop(floor_obj);
        }
    }
    let _ = writeln!(
        report.md,
        "| flood | receiver | frames/s (median) | min–max | × floor | softirq ns/frame |\n|---|---|---:|---:|---:|---:|"
    );
    let mut json_rows = Vec::new();
    for (scenario, name, m, lo, hi, c) in &rows {
        let floor = by
            .get(&(*scenario, "XDP_DROP floor (counting)"))
            .copied()
            .unwrap_or(f64::NAN);
        let _ = writeln!(
            report.md,
            "| {scenario} | {name} | {m:.0} | {lo:.0}–{hi:.0} | {:.2} | {c:.0} |",
            m / floor
        );
        json_rows.push(json!({"flood": scenario, "receiver": name, "fps_median": m, "fps_min": lo, "fps_max": hi, "x_floor": m / floor, "softirq_ns_per_frame": c}));
    }
    let get = |s: &str, r: &str| by.get(&(s, r)).copied().unwrap_or(f64::NAN);
    let one = "one source at >100x its limit";
    let many = "1 M spoofed IPv6 sources";
    let rl1 = get(one, "ratelimit (native)");
    let p2_floor = rl1 / get(one, "XDP_DROP floor (counting)");
    let p2_nft = rl1 / get(one, "nftables meter");
    let p2_ipt = rl1 / get(one, "iptables hashlimit");
    let rl2 = get(many, "ratelimit (native)");
    let p3_nft = rl2 / get(many, "nftables meter");
    let p3_ipt = rl2 / get(many, "iptables hashlimit");
    let _ = writeln!(
        report.md,
        "\nTargets: P2 one source: ≥ 0.8× the floor: **{p2_floor:.2}×, {}**; ≥ 5× nftables: **{p2_nft:.1}×, {}**; ≥ 5× iptables: **{p2_ipt:.1}×, {}**. \
         P3 1 M spoofed sources: ≥ 3× nftables: **{p3_nft:.1}×, {}**; ≥ 3× iptables: **{p3_ipt:.1}×, {}**.{}\n",
        met(p2_floor >= 0.8),
        met(p2_nft >= 5.0),
        met(p2_ipt >= 5.0),
        met(p3_nft >= 3.0),
        met(p3_ipt >= 3.0),
        match &netfilter {
            Ok(()) => String::new(),
            Err(e) => format!(" nftables and iptables were not measured: {e}."),
        }
    );
    report.json.insert("drop_throughput".into(), json!({"seconds": secs, "rounds": rounds, "rows": json_rows,
        "p2_x_floor": p2_floor, "p2_x_nft": p2_nft, "p2_x_iptables": p2_ipt, "p3_x_nft": p3_nft, "p3_x_iptables": p3_ipt}));
}

/// Sends `frame` from `ns`/`ifname` at `pps` for `duration`, on CPU `cpu`;
/// returns the CLOCK_MONOTONIC time of every frame sent.
fn paced_send(
    ns: &NetNs,
    ifname: &str,
    frame: &[u8],
    pps: f64,
    duration: Duration,
    cpu: usize,
) -> Vec<u64> {
    in_ns(ns, || {
        pin_to_cpu(cpu);
        let fd = ratelimit_tests::net::packet_socket(ifname);
        let gap = 1e9 / pps;
        let start = monotonic_ns();
        let end = start + duration.as_nanos() as u64;
        let mut times = Vec::with_capacity((pps * duration.as_secs_f64()) as usize + 1);
        let mut k = 0u64;
        loop {
            let due = start + (k as f64 * gap) as u64;
            if due >= end {
                break;
            }
            while monotonic_ns() < due {
                std::hint::spin_loop();
            }
            // SAFETY: a valid buffer and socket.
            let n = unsafe { libc::send(fd, frame.as_ptr().cast(), frame.len(), 0) };
            if n == frame.len() as isize {
                times.push(monotonic_ns());
            }
            k += 1;
        }
        // SAFETY: our socket.
        unsafe { libc::close(fd) };
        times
    })
}

/// Accuracy: a source offered 1.1×, 2×, 10× and 100× its limit from both CPUs
/// at once; what arrives at the receiver against what the algorithm admits for
/// those very send times (the same code, run on the host).
fn accuracy(opts: &Opts, report: &mut Report) {
    use ratelimit_common::keyed::{Algorithm, FakeClock, Limiter};
    let secs = if opts.quick { 1.0 } else { 10.0 };
    report.section(
        "Accuracy",
        &format!(
            "One source offered 1.1×, 2×, 10× and 100× a limit of 1000 packets/s from two sender threads pinned to the two CPUs, for {secs} s each. \
             Admitted = frames that reached the receiver (its own raw socket); expected = what the algorithm admits for the exact send times \
             (the same code run on the host, and for gcra also burst + rate × duration). Ratio = admitted ÷ expected."
        ),
    );
    let pair = Pair::new();
    let run = TempDir::new("bench-acc");
    let d = Daemon::start(&pair.rx, &pair.rx_if, &run.0, &[]);
    let ms = 1_000_000u64;
    let configs: Vec<(&str, Vec<&str>, Algorithm, f64)> = vec![
        (
            "gcra 1000/s burst 100",
            vec!["--rate", "1000/s", "--burst", "100"],
            Algorithm::per(1000, Duration::from_secs(1), 100).expect("valid"),
            0.005,
        ),
        (
            "token-bucket-interval +100 every 100ms, capacity 100",
            vec![
                "--algorithm",
                "token-bucket-interval",
                "--refill-every",
                "100ms",
                "--refill-amount",
                "100",
                "--capacity",
                "100",
            ],
            Algorithm::Interval(
                ratelimit_common::interval::Params::new(100 * ms, 100, 100).expect("valid"),
            ),
            0.005,
        ),
        (
            "fixed-window 1000 per 1s",
            vec![
                "--algorithm",
                "fixed-window",
                "--limit",
                "1000",
                "--window",
                "1s",
            ],
            Algorithm::FixedWindow(
                ratelimit_common::fixed_window::Params::new(1000 * ms, 1000).expect("valid"),
            ),
            0.02,
        ),
        (
            "sliding-log 64 per 64ms",
            vec![
                "--algorithm",
                "sliding-log",
                "--limit",
                "64",
                "--window",
                "64ms",
            ],
            Algorithm::SlidingLog(
                ratelimit_common::sliding_log::Params::new(64 * ms, 64).expect("valid"),
            ),
            0.02,
        ),
        (
            "sliding-window 1000 per 1s",
            vec![
                "--algorithm",
                "sliding-window",
                "--limit",
                "1000",
                "--window",
                "1s",
            ],
            Algorithm::SlidingWindow(
                ratelimit_common::sliding_window::Params::new(1000 * ms, 1000).expect("valid"),
            ),
            0.02,
        ),
        (
            "rolling-quota 1000 per 1s, at most 300 per 250ms",
            vec![
                "--algorithm",
                "rolling-quota",
                "--quota",
                "1000",
                "--window",
                "1s",
                "--period",
                "250ms",
                "--rate-cap",
                "300",
            ],
            Algorithm::RollingQuota(
                ratelimit_common::rolling_quota::Params::new(1000 * ms, 250 * ms, 1000, 300)
                    .expect("valid"),
            ),
            0.02,
        ),
    ];
    let _ = writeln!(
        report.md,
        "| algorithm | offered | sent | admitted | expected (same code) | ratio | bound | gcra: burst + rate × T |\n|---|---:|---:|---:|---:|---:|---|---:|"
    );
    let mut json_rows = Vec::new();
    let mut n = 0u32;
    for (name, args, algorithm, tolerance) in &configs {
        let mut set = vec!["set", "default"];
        set.extend(args.iter().copied());
        d.cli_ok(&set);
        for factor in [1.1f64, 2.0, 10.0, 100.0] {
            n += 1;
            let src = IpAddr::from([198, 18, 100, n as u8]);
            let frame = pair.udp(src, 7100).build();
            let rx = Receiver::start(&pair.rx, &pair.rx_if, 7100);
            let pps = 1000.0 * factor / 2.0;
            let dur = Duration::from_secs_f64(secs);
            let (a, b) = std::thread::scope(|s| {
                let h0 = s.spawn(|| paced_send(&pair.tx, &pair.tx_if, &frame, pps, dur, 0));
                let h1 = s.spawn(|| paced_send(&pair.tx, &pair.tx_if, &frame, pps, dur, 1));
                (h0.join().expect("sender 0"), h1.join().expect("sender 1"))
            });
            let admitted = rx.finish().get(&src).copied().unwrap_or(0);
            let mut times: Vec<u64> = a.into_iter().chain(b).collect();
            times.sort_unstable();
            let clock = FakeClock::default();
            let sim: Limiter<u8, FakeClock> = Limiter::with_clock(*algorithm, 16, clock.clone());
            let expected = times
                .iter()
                .filter(|t| {
                    clock.set(**t);
                    sim.check(&0)
                })
                .count() as u64;
            let ratio = admitted as f64 / expected as f64;
            let gcra_formula = if name.starts_with("gcra") {
                let span = (times.last().copied().unwrap_or(0)
                    - times.first().copied().unwrap_or(0)) as f64
                    / 1e9;
                format!("{:.0}", 100.0 + 1000.0 * span)
            } else {
                "".into()
            };
            let ok = (ratio - 1.0).abs() <= *tolerance;
            let _ = writeln!(
                report.md,
                "| {name} | {factor}× | {} | {admitted} | {expected} | {ratio:.4} | ±{:.1} %: {} | {gcra_formula} |",
                times.len(),
                tolerance * 100.0,
                met(ok)
            );
            println!(
                "{name:52} {factor:>5}×  sent {:>7}  admitted {admitted:>6}  expected {expected:>6}  ratio {ratio:.4} ({})",
                times.len(),
                met(ok)
            );
            json_rows.push(json!({"algorithm": name, "factor": factor, "sent": times.len(), "admitted": admitted,
                "expected": expected, "ratio": ratio, "tolerance": tolerance, "met": ok}));
        }
    }
    let _ = writeln!(report.md);
    report.json.insert(
        "accuracy".into(),
        json!({"seconds": secs, "rows": json_rows}),
    );
}
