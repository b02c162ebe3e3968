//! Floods on a veth, against the real floor. A generator (an XDP program run
//! with BPF_PROG_RUN in live-frames mode, XDP_TX out of its veth) floods from
//! CPU 0; the receiving veth's NAPI runs threaded, pinned to CPU 1, so the
//! generator never steals the receiver's CPU. The headline is the receiving
//! CPU's time per frame (the NAPI thread's time on CPU ÷ frames it took in),
//! for the floor (XDP_DROP), ratelimit, nftables and iptables with the same
//! limits, in the same run.
//!
//! Limits, everywhere: 100 packets/s with a burst of 100 per source (IPv4
//! address, IPv6 /64), and 20 000 packets/s for all sources of the default
//! rule together, the established sources of the last case included.
//!
//! Each row also gives the frames the generator offered beside those the
//! receiver handled, and the receiving CPU's busy share: a floor is a floor
//! only when the generator saturates the receiver. And the program's own time
//! per run, from the kernel's BPF statistics (`kernel.bpf_stats_enabled`),
//! less what the statistics cost themselves (the XDP_DROP floor's figure:
//! its body is a few instructions).

use std::{
    collections::{BTreeSet, HashMap},
    fmt::Write as _,
    net::IpAddr,
    path::Path,
    time::{Duration, Instant},
};

use aya::{Ebpf, EbpfLoader};
use ratelimit_tests::{
    Daemon, TempDir,
    generator::Generator,
    net::{Flow, Pair},
    testrun::{pin_to_cpu, unpin},
};
use serde_json::{Value, json};

use crate::{Opts, in_ns, ip, met, report::Report, sh, stats};

/// The per-source limit of every receiver.
const RATE: u64 = 100;
/// Its burst.
const BURST: u64 = 100;
/// The default rule's aggregate: what the server takes from the unknown
/// internet at large.
const AGGREGATE: u64 = 20_000;
/// The established sources of the last case.
const LEGIT: u32 = 100;
/// UDP port of the generator's frames.
const FLOOD_PORT: u16 = 7000;
/// UDP port of the established sources' frames.
const LEGIT_PORT: u16 = 7200;

/// A flood.
#[derive(Clone, Copy)]
struct Flood {
    name: &'static str,
    /// IPv6 sources (the /64 from the generator's counter), else IPv4.
    v6: bool,
    /// The generator's source mask: sources − 1.
    mask: u64,
}

const ONE: Flood = Flood {
    name: "(a) one source at >100x its limit",
    v6: false,
    mask: 0,
};
const CYCLING: Flood = Flood {
    name: "(b) 1 M sources cycling",
    v6: true,
    mask: (1 << 20) - 1,
};
/// 2^32 sources: at the generator's ~14 Mpps, five minutes before the first
/// repeats.
const SPOOFED: Flood = Flood {
    name: "(c) 4 G spoofed IPv6 sources, none repeats",
    v6: true,
    mask: (1 << 32) - 1,
};
/// IPv4 cannot spoof without repeats inside 198.18.0.0/15: its 131 072
/// addresses cycle, each every ~10 ms at the generator's rate.
const SPOOFED_V4: Flood = Flood {
    name: "(c4) all 131 072 IPv4 sources of 198.18.0.0/15 cycling",
    v6: false,
    mask: (1 << 17) - 1,
};

/// What receives the flood.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
enum Receiver_ {
    Floor,
    /// The floor that reads the source address first.
    ParseFloor,
    /// The exact floor: the limiter's 20-byte key in an LRU hash, updated by
    /// compare-and-swap.
    ExactFloor,
    Ratelimit {
        generic: bool,
        coarse: bool,
    },
    Nft,
    Iptables,
}

impl Receiver_ {
    fn name(self) -> &'static str {
        match self {
            Receiver_::Floor => "XDP_DROP floor (counting)",
            Receiver_::ParseFloor => "floor that reads the source, then drops",
            Receiver_::ExactFloor => "exact floor (LRU lookup + compare-and-swap)",
            Receiver_::Ratelimit {
                generic: false,
                coarse: false,
            } => "ratelimit (native)",
            Receiver_::Ratelimit {
                generic: false,
                coarse: true,
            } => "ratelimit (native, --clock coarse)",
            Receiver_::Ratelimit { generic: true, .. } => "ratelimit (generic)",
            Receiver_::Nft => "nftables",
            Receiver_::Iptables => "iptables",
        }
    }
}

/// One receiver set up on a fresh pair, ready to count. Fields drop in
/// order: the daemon is killed and the floor detached before the pair's
/// namespaces go.
struct Setup {
    daemon: Option<Daemon>,
    floor: Option<Ebpf>,
    kind: Receiver_,
    /// The receiving NAPI thread.
    napi: Option<u32>,
    _run: TempDir,
    pair: Pair,
}

impl Setup {
    fn new(kind: Receiver_) -> Self {
        let pair = Pair::new();
        let run = TempDir::new("bench-flood");
        let mut setup = Self {
            pair,
            _run: run,
            daemon: None,
            floor: None,
            kind,
            napi: None,
        };
        let (rx, rx_if) = (&setup.pair.rx, setup.pair.rx_if.clone());
        match kind {
            Receiver_::Floor | Receiver_::ParseFloor | Receiver_::ExactFloor => {
                let name = match kind {
                    Receiver_::Floor => "floor_count",
                    Receiver_::ParseFloor => "floor_parse",
                    _ => "floor_exact_count",
                };
                let mut obj = EbpfLoader::new()
                    .load(ratelimit_user::FLOORS_OBJECT)
                    .expect("floors");
                let prog: &mut aya::programs::Xdp = obj
                    .program_mut(name)
                    .expect("floor program")
                    .try_into()
                    .expect("xdp");
                prog.load().expect("load a floor");
                in_ns(rx, || {
                    prog.attach(&rx_if, aya::programs::XdpMode::Driver)
                        .expect("attach a floor")
                });
                setup.floor = Some(obj);
            }
            Receiver_::Ratelimit { generic, coarse } => {
                if generic {
                    // Without a native XDP program the veth takes frames by NAPI
                    // only with GRO on.
                    sh(rx, &format!("ethtool -K {rx_if} gro on >/dev/null"));
                }
                let config = setup._run.0.join("flood.toml");
                std::fs::write(&config, ratelimit_config(coarse)).expect("writing the config");
                let args = [
                    "--config",
                    config.to_str().expect("utf-8 path"),
                    "--mode",
                    if generic { "generic" } else { "native" },
                ];
                setup.daemon = Some(Daemon::start(rx, &rx_if, &setup._run.0, &args));
            }
            Receiver_::Nft => {
                sh(rx, &format!("ethtool -K {rx_if} gro on >/dev/null"));
                sh(rx, &format!("nft -f - <<'EOF'\n{}\nEOF", nft_rules()));
            }
            Receiver_::Iptables => {
                sh(rx, &format!("ethtool -K {rx_if} gro on >/dev/null"));
                for cmd in iptables_rules() {
                    sh(rx, &cmd);
                }
            }
        }
        setup.napi = threaded_napi(&setup.pair);
        setup
    }

    /// Frames the receiver took in so far.
    fn frames(&self) -> u64 {
        match self.kind {
            Receiver_::Floor | Receiver_::ParseFloor | Receiver_::ExactFloor => {
                let obj = self.floor.as_ref().expect("floor");
                let m: aya::maps::PerCpuArray<&aya::maps::MapData, u64> =
                    aya::maps::PerCpuArray::try_from(obj.map("FLOOR_COUNT").expect("map"))
                        .expect("percpu");
                m.get(&0, 0).expect("read").iter().sum()
            }
            Receiver_::Ratelimit { .. } => {
                let v = self.daemon.as_ref().expect("daemon").json(&["stats"]);
                v["reasons"]
                    .as_array()
                    .expect("reasons")
                    .iter()
                    .filter_map(|r| r["packets"].as_u64())
                    .sum()
            }
            // Netfilter: frames the receiving veth took in.
            Receiver_::Nft | Receiver_::Iptables => {
                let text = sh(
                    &self.pair.rx,
                    &format!("ip -s -j link show dev {}", self.pair.rx_if),
                );
                let v: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
                v[0]["stats64"]["rx"]["packets"].as_u64().unwrap_or(0)
            }
        }
    }

    /// The receiving program's (run time ns, runs) so far, from the kernel's
    /// BPF statistics (netfilter: none).
    fn prog_stats(&self) -> Option<(u64, u64)> {
        let name = match self.kind {
            Receiver_::Floor => "floor_count",
            Receiver_::ParseFloor => "floor_parse",
            Receiver_::ExactFloor => "floor_exact_count",
            Receiver_::Ratelimit { .. } => "ratelimit",
            Receiver_::Nft | Receiver_::Iptables => return None,
        };
        // The kernel keeps 15 bytes of a name.
        let name = &name.as_bytes()[..name.len().min(15)];
        let mut out = (0, 0);
        for info in aya::programs::loaded_programs().flatten() {
            if info.name() == name {
                out.0 += info.run_time().as_nanos() as u64;
                out.1 += info.run_count();
            }
        }
        Some(out)
    }

    /// Frames the receiver passed up the stack so far (ratelimit only).
    fn passed(&self) -> Option<u64> {
        let d = self.daemon.as_ref()?;
        let v = d.json(&["stats"]);
        let rows = v["reasons"].as_array()?;
        Some(
            rows.iter()
                .filter(|r| {
                    matches!(
                        r["reason"].as_str(),
                        Some("passed" | "new_source" | "allowed" | "not_ip" | "would_drop")
                    )
                })
                .filter_map(|r| r["packets"].as_u64())
                .sum(),
        )
    }
}

/// The ratelimit config of every case.
fn ratelimit_config(coarse: bool) -> String {
    format!(
        r#"clock = "{}"
[default]
rate = "{RATE}/s"
burst = {BURST}
aggregate = "{AGGREGATE}/s"
"#,
        if coarse { "coarse" } else { "precise" }
    )
}

/// The same limits in nftables: a meter per source, then the aggregate.
fn nft_rules() -> String {
    format!(
        "table inet rl {{
  chain pre {{
    type filter hook prerouting priority -300; policy accept;
    meter m4 size 1048576 {{ ip saddr limit rate over {RATE}/second burst {BURST} packets }} drop
    meter m6 size 1048576 {{ ip6 saddr limit rate over {RATE}/second burst {BURST} packets }} drop
    limit rate over {AGGREGATE}/second burst {AGGREGATE} packets drop
  }}
}}"
    )
}

/// The same limits in iptables: hashlimit per source, then for all sources.
fn iptables_rules() -> Vec<String> {
    let mut out = Vec::new();
    for (ipt, mask) in [("iptables", 32), ("ip6tables", 64)] {
        out.push(format!(
            "{ipt} -t raw -A PREROUTING -m hashlimit --hashlimit-above {RATE}/sec --hashlimit-burst {BURST} \
             --hashlimit-mode srcip --hashlimit-srcmask {mask} --hashlimit-name src{mask} \
             --hashlimit-htable-size 1048576 --hashlimit-htable-max 1048576 -j DROP"
        ));
        out.push(format!(
            "{ipt} -t raw -A PREROUTING -m hashlimit --hashlimit-above {}/sec --hashlimit-burst {AGGREGATE} \
             --hashlimit-name all{mask} -j DROP",
            AGGREGATE
        ));
    }
    out
}

/// Makes the receiving veth's NAPI threaded and pins its thread to CPU 1;
/// returns the thread's pid.
fn threaded_napi(pair: &Pair) -> Option<u32> {
    let before = napi_threads();
    // `ip netns exec` mounts the namespace's own sysfs, where its devices are.
    let out = std::process::Command::new("ip")
        .args(["netns", "exec", &pair.rx.name, "sh", "-c"])
        .arg(format!("echo 1 > /sys/class/net/{}/threaded", pair.rx_if))
        .output()
        .expect("ip netns exec");
    assert!(
        out.status.success(),
        "making the NAPI of {} threaded failed: {}",
        pair.rx_if,
        String::from_utf8_lossy(&out.stderr)
    );
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(2) {
        let after = napi_threads();
        if let Some(pid) = after.difference(&before).next() {
            let ok = std::process::Command::new("taskset")
                .args(["-pc", "1", &pid.to_string()])
                .output()
                .map(|o| o.status.success())
                .unwrap_or(false);
            assert!(ok, "pinning the NAPI thread {pid} to CPU 1 failed");
            return Some(*pid);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    None
}

fn napi_threads() -> BTreeSet<u32> {
    let mut out = BTreeSet::new();
    for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let comm = std::fs::read_to_string(e.path().join("comm")).unwrap_or_default();
        if comm.starts_with("napi/") {
            out.insert(pid);
        }
    }
    out
}

/// A thread's time on CPU so far, ns (schedstat).
fn cpu_ns(pid: u32) -> u64 {
    std::fs::read_to_string(Path::new("/proc").join(pid.to_string()).join("schedstat"))
        .ok()
        .and_then(|s| s.split_whitespace().next().and_then(|v| v.parse().ok()))
        .unwrap_or(0)
}

fn flood_frame(pair: &Pair, flood: Flood) -> Vec<u8> {
    if flood.v6 {
        pair.udp(ip("2001:db8::1"), FLOOD_PORT).build()
    } else {
        pair.udp(ip("198.18.0.1"), FLOOD_PORT).build()
    }
}

/// Where the receiving CPU's time goes during one more round: `perf record`
/// on CPU 1 (cpu-clock samples: a VM has no hardware counters), the symbols
/// with their share of the samples (BPF programs by their JIT names). `None`
/// without perf.
fn profile(
    setup: &Setup,
    generator: &Generator,
    frame: &[u8],
    secs: f64,
) -> Option<Vec<(f64, String)>> {
    let data =
        std::env::temp_dir().join(format!("ratelimit-bench-perf-{}.data", std::process::id()));
    let mut rec = std::process::Command::new("perf")
        .args([
            "record",
            "-q",
            "-e",
            "cpu-clock",
            "-F",
            "4999",
            "-C",
            "1",
            "-o",
        ])
        .arg(&data)
        .args(["--", "sleep", &format!("{secs}")])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .ok()?;
    generator.flood(&setup.pair, frame, secs, 0);
    rec.wait().ok()?;
    let out = std::process::Command::new("perf")
        .args([
            "report",
            "-q",
            "--stdio",
            "--no-children",
            "--sort",
            "symbol",
            "--percent-limit",
            "1",
            "-i",
        ])
        .arg(&data)
        .output()
        .ok()?;
    let _ = std::fs::remove_file(&data);
    let text = String::from_utf8_lossy(&out.stdout);
    let rows: Vec<(f64, String)> = text
        .lines()
        .filter_map(|l| {
            let l = l.trim();
            let (pct, rest) = l.split_once('%')?;
            let pct: f64 = pct.trim().parse().ok()?;
            // "[k] symbol" or "[.] symbol"
            let sym = rest
                .trim()
                .split_once(']')
                .map_or(rest.trim(), |(_, s)| s.trim());
            // The name, without the columns perf may print after it.
            let sym = sym.split_whitespace().next().unwrap_or(sym);
            Some((pct, sym.to_string()))
        })
        .take(14)
        .collect();
    (!rows.is_empty()).then_some(rows)
}

/// A profile: (flood, receiver, its symbols with their shares).
type Profile<'a> = (&'a str, &'a str, Vec<(f64, String)>);

fn write_profiles(report: &mut Report, profiles: &[Profile]) {
    if profiles.is_empty() {
        return;
    }
    let _ = writeln!(
        report.md,
        "### Where the receiving CPU's time goes\n\n`perf record -e cpu-clock -C 1` during one more round of the flood (a VM has no hardware counters, \
         so there are no cache-miss counts); the symbols with at least 1 % of the samples. `bpf_prog_…_ratelimit` is the program's body, \
         `bpf_prog_…_rl_*` its global functions; `lookup_nulls_elem_raw` and `htab_lru_*` the LRU hash; `pvclock`/`read_tsc` the clock; \
         `veth_*`, `page_pool_*`, `xdp_*` the driver's own work per frame, present for the floor too.\n"
    );
    for (flood, receiver, rows) in profiles {
        let _ = writeln!(
            report.md,
            "**{flood}, {receiver}**\n\n| share | symbol |\n|---:|---|"
        );
        for (pct, sym) in rows {
            let _ = writeln!(report.md, "| {pct:.1} % | `{sym}` |");
        }
        let _ = writeln!(report.md);
    }
}

/// One measured row.
struct Row {
    flood: &'static str,
    receiver: &'static str,
    /// Frames handled per second by the receiver.
    fps: (f64, f64, f64),
    /// Frames offered per second by the generator (median).
    offered: f64,
    /// The receiving CPU's busy share over the round (median).
    busy: f64,
    /// Receiving CPU ns per frame (median).
    cpu_ns: f64,
    /// The program's ns per run by the kernel's statistics (median), before
    /// their own cost is taken off.
    prog_ns: Option<f64>,
    /// Share of frames passed up the stack (ratelimit).
    passed: Option<f64>,
    /// One more round paced to ~1.2× what the receiver handled: (offered,
    /// handled, receiving CPU ns/frame); the cost per frame without the
    /// generator's overrun.
    paced: Option<(f64, f64, f64)>,
}

/// One round of a flood against a receiver: what it measured.
struct Round {
    offered: u64,
    handled: u64,
    secs: f64,
    cpu_ns: u64,
    prog: Option<(u64, u64)>,
    passed: Option<u64>,
}

fn round(setup: &Setup, generator: &Generator, frame: &[u8], secs: f64) -> Round {
    let (f0, c0, p0, s0) = (
        setup.frames(),
        setup.napi.map_or(0, cpu_ns),
        setup.passed(),
        setup.prog_stats(),
    );
    let t0 = Instant::now();
    let offered = generator.flood(&setup.pair, frame, secs, 0);
    let elapsed = t0.elapsed().as_secs_f64();
    std::thread::sleep(Duration::from_millis(100));
    let (f1, c1, p1, s1) = (
        setup.frames(),
        setup.napi.map_or(0, cpu_ns),
        setup.passed(),
        setup.prog_stats(),
    );
    Round {
        offered,
        handled: f1.saturating_sub(f0),
        secs: elapsed,
        cpu_ns: c1.saturating_sub(c0),
        prog: s0
            .zip(s1)
            .map(|(a, b)| (b.0.saturating_sub(a.0), b.1.saturating_sub(a.1))),
        passed: p0.zip(p1).map(|(a, b)| b.saturating_sub(a)),
    }
}

pub fn floods(opts: &Opts, report: &mut Report) {
    let secs: f64 = if opts.quick { 1.0 } else { 3.0 };
    let rounds = if opts.quick { 1 } else { 3 };
    report.section(
        "Floods on a veth",
        &format!(
            "A generator (an XDP program run with BPF_PROG_RUN in live-frames mode, {} frames a call in batches of 256, XDP_TX out of its veth, \
             the source rewritten in the generator program) floods from CPU 0 for {secs} s a round, median of {rounds} rounds; the receiving veth's \
             NAPI is threaded and pinned to CPU 1. *Offered*: the generator's frames per second; *handled*: the frames the receiver took in \
             (its own counters; for netfilter, the veth's); *busy*: the NAPI thread's time on CPU ÷ the round's time. \
             Receiving CPU per frame = the NAPI thread's time on CPU ÷ the frames handled: the headline, as a ratio to the XDP_DROP floor of the same flood. \
             *Program ns/run*: the kernel's BPF statistics (run time ÷ runs) in one more round with them on (they read the clock twice a run, which costs the receiving CPU much on a VM, so the other figures are taken with them off), less the XDP_DROP floor's own figure, which is what those two clock reads cost. \
             Limits everywhere: {RATE}/s burst {BURST} per source (IPv4 address, IPv6 /64) and {AGGREGATE}/s for all sources of the default rule together \
             (ratelimit: its reserve at the default, half the burst); ratelimit also has its defaults: a new-source budget of 10 000/s per rule and a cap of 100 000 new states/s.",
            ratelimit_tests::generator::FRAMES_PER_CALL
        ),
    );
    let netfilter = ensure_netfilter_tools();
    let mut generator = Generator::new();
    let cheapest = generator_sweep(opts, report, &mut generator);
    let mut rows: Vec<Row> = Vec::new();
    let mut profiles = Vec::new();
    let native = Receiver_::Ratelimit {
        generic: false,
        coarse: false,
    };
    for flood in [ONE, CYCLING, SPOOFED, SPOOFED_V4] {
        let mut receivers = vec![
            Receiver_::Floor,
            Receiver_::ParseFloor,
            Receiver_::ExactFloor,
            native,
        ];
        if !opts.quick {
            receivers.push(Receiver_::Ratelimit {
                generic: false,
                coarse: true,
            });
            if flood.mask == 0 {
                receivers.push(Receiver_::Ratelimit {
                    generic: true,
                    coarse: false,
                });
            }
        }
        if netfilter.is_ok() {
            receivers.extend([Receiver_::Nft, Receiver_::Iptables]);
        }
        generator.set_mask(flood.mask);
        for kind in receivers {
            let setup = Setup::new(kind);
            let frame = flood_frame(&setup.pair, flood);
            // Warm up: the first second fills maps and caches.
            generator.flood(&setup.pair, &frame, secs.min(1.0), 0);
            let rounds: Vec<Round> = (0..rounds)
                .map(|_| round(&setup, &generator, &frame, secs))
                .collect();
            // The program's own time in a round of its own: the statistics
            // read the clock twice a run, which on a VM's paravirtual clock
            // costs the receiving CPU as much as the floor's whole frame.
            let prog = {
                let _on = aya::sys::enable_stats(aya::sys::Stats::RunTime)
                    .expect("enabling BPF statistics");
                round(&setup, &generator, &frame, secs.min(2.0)).prog
            };
            // The same receiver without the overrun: the generator paced
            // to ~1.2× what it handled.
            let paced = (!matches!(
                kind,
                Receiver_::Floor | Receiver_::ParseFloor | Receiver_::ExactFloor
            ))
            .then(|| {
                let offered = rounds
                    .iter()
                    .map(|r| r.offered as f64 / r.secs)
                    .sum::<f64>();
                let handled = rounds
                    .iter()
                    .map(|r| r.handled as f64 / r.secs)
                    .sum::<f64>();
                let every = (offered / (1.2 * handled.max(1.0))).round().max(1.0) as u64;
                generator.set_pace(every);
                let r = round(&setup, &generator, &frame, secs.min(2.0));
                generator.set_pace(1);
                (
                    r.offered as f64 / r.secs,
                    r.handled as f64 / r.secs,
                    r.cpu_ns as f64 / r.handled.max(1) as f64,
                )
            })
            .filter(|_| setup.napi.is_some());
            if (matches!(kind, Receiver_::Floor) || kind == native)
                && let Some(p) = profile(&setup, &generator, &frame, secs.min(3.0))
            {
                profiles.push((flood.name, kind.name(), p));
            }
            let med = |f: &dyn Fn(&Round) -> f64| stats(rounds.iter().map(f).collect()).0;
            let row = Row {
                flood: flood.name,
                receiver: kind.name(),
                fps: stats(rounds.iter().map(|r| r.handled as f64 / r.secs).collect()),
                offered: med(&|r| r.offered as f64 / r.secs),
                busy: med(&|r| r.cpu_ns as f64 / 1e9 / r.secs),
                cpu_ns: med(&|r| {
                    if r.handled > 0 && setup.napi.is_some() {
                        r.cpu_ns as f64 / r.handled as f64
                    } else {
                        f64::NAN
                    }
                }),
                prog_ns: prog.map(|(t, n)| t as f64 / n.max(1) as f64),
                passed: rounds[0]
                    .passed
                    .is_some()
                    .then(|| med(&|r| r.passed.unwrap_or(0) as f64 / r.handled.max(1) as f64)),
                paced,
            };
            println!(
                "{:50} {:36} offered {:>10.0}/s handled {:>10.0}/s busy {:>4.0} %  {:>6.0} ns/frame on the receiving CPU{}{}{}",
                row.flood,
                row.receiver,
                row.offered,
                row.fps.0,
                row.busy * 100.0,
                row.cpu_ns,
                row.prog_ns.map_or(String::new(), |p| format!(
                    "  program {p:.0} ns/run (stats)"
                )),
                row.passed
                    .map_or(String::new(), |p| format!("  passed {:.2} %", p * 100.0)),
                row.paced.map_or(String::new(), |(o, h, c)| format!(
                    "  paced: offered {o:.0}/s handled {h:.0}/s {c:.0} ns/frame"
                ))
            );
            rows.push(row);
        }
    }
    write_rows(report, &rows, &netfilter, cheapest);
    write_profiles(report, &profiles);
    let floors: HashMap<&str, f64> = rows
        .iter()
        .filter(|r| r.receiver == Receiver_::Floor.name())
        .map(|r| (r.flood, r.cpu_ns))
        .collect();
    let native = Receiver_::Ratelimit {
        generic: false,
        coarse: false,
    }
    .name();
    let capacity: HashMap<&str, (f64, f64)> = rows
        .iter()
        .filter(|r| r.receiver == native)
        .map(|r| (r.flood, (r.offered, r.fps.0)))
        .collect();
    established(opts, report, &mut generator, &floors, &capacity);
    generator.set_pace(1);
}

/// The XDP_DROP floor under every configuration of the generator the bench
/// can choose (frames a call, batch, pace), IPv6 spoofed frames: whether the
/// floor the floods use is the receiver's own. Answers the cheapest receiving
/// CPU ns/frame among them.
fn generator_sweep(opts: &Opts, report: &mut Report, generator: &mut Generator) -> f64 {
    let (calls, batches, paces, secs): (&[u32], &[u32], &[u64], f64) = if opts.quick {
        (&[1 << 14, 1 << 16], &[64, 256], &[1], 0.5)
    } else {
        (
            &[1 << 12, 1 << 14, 1 << 16, 1 << 18, 1 << 20],
            &[16, 64, 256],
            &[1, 2],
            1.0,
        )
    };
    let setup = Setup::new(Receiver_::Floor);
    let frame = flood_frame(&setup.pair, SPOOFED);
    generator.set_mask(SPOOFED.mask);
    let _ = writeln!(
        report.md,
        "The generator's configurations against the XDP_DROP floor (flood {}, {secs} s each): the floor of the rows below must be within 1.2× of the cheapest.\n\n| frames a call | batch | pace (1 run in) | offered /s | handled /s | busy | receiving CPU ns/frame |\n|---:|---:|---:|---:|---:|---:|---:|",
        SPOOFED.name
    );
    let mut cheapest = f64::INFINITY;
    let mut json_rows = Vec::new();
    for &pace in paces {
        generator.set_pace(pace);
        for &frames in calls {
            for &batch in batches {
                let (f0, c0) = (setup.frames(), setup.napi.map_or(0, cpu_ns));
                let t0 = Instant::now();
                let offered = generator.flood_with(&setup.pair, &frame, secs, 0, frames, batch);
                let el = t0.elapsed().as_secs_f64();
                std::thread::sleep(Duration::from_millis(50));
                let (handled, cpu) = (
                    setup.frames().saturating_sub(f0),
                    setup.napi.map_or(0, cpu_ns).saturating_sub(c0),
                );
                let ns = if setup.napi.is_some() && handled > 0 {
                    cpu as f64 / handled as f64
                } else {
                    f64::NAN
                };
                if ns < cheapest {
                    cheapest = ns;
                }
                let _ = writeln!(
                    report.md,
                    "| {frames} | {batch} | {pace} | {:.0} | {:.0} | {:.0} % | {ns:.0} |",
                    offered as f64 / el,
                    handled as f64 / el,
                    cpu as f64 / 1e9 / el * 100.0
                );
                println!(
                    "generator {frames:>7} a call, batch {batch:>3}, pace {pace}: offered {:>10.0}/s handled {:>10.0}/s busy {:>4.0} % {ns:>5.0} ns/frame",
                    offered as f64 / el,
                    handled as f64 / el,
                    cpu as f64 / 1e9 / el * 100.0
                );
                json_rows.push(
                    json!({"frames_per_call": frames, "batch": batch, "pace": pace,
                    "offered_per_s": offered as f64 / el, "handled_per_s": handled as f64 / el,
                    "busy_share": cpu as f64 / 1e9 / el, "cpu_ns_per_frame": ns}),
                );
            }
        }
    }
    generator.set_pace(1);
    let _ = writeln!(report.md);
    report.json.insert(
        "generator_sweep".into(),
        json!({"rows": json_rows, "cheapest_ns": cheapest}),
    );
    cheapest
}

fn write_rows(report: &mut Report, rows: &[Row], netfilter: &Result<(), String>, cheapest: f64) {
    let _ = writeln!(
        report.md,
        "| flood | receiver | offered /s | handled /s (median) | min–max | busy | receiving CPU ns/frame | × floor's | paced to ~1.2× its capacity: offered, handled /s, ns/frame | program ns/run | passed up the stack |\n|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
    );
    let find = |flood: &str, receiver: &str| {
        rows.iter()
            .find(|r| r.flood == flood && r.receiver == receiver)
    };
    let cpu = |flood: &str, receiver: &str| find(flood, receiver).map_or(f64::NAN, |r| r.cpu_ns);
    // What the statistics cost per run: the XDP_DROP floor's whole figure.
    let overhead = |flood: &str| {
        find(flood, Receiver_::Floor.name())
            .and_then(|r| r.prog_ns)
            .unwrap_or(f64::NAN)
    };
    let own = |r: &Row| r.prog_ns.map(|p| (p - overhead(r.flood)).max(0.0));
    let mut json_rows = Vec::new();
    for r in rows {
        let f = cpu(r.flood, Receiver_::Floor.name());
        let (m, lo, hi) = r.fps;
        let _ = writeln!(
            report.md,
            "| {} | {} | {:.0} | {m:.0} | {lo:.0}–{hi:.0} | {:.0} % | {:.0} | {:.2} | {} | {} | {} |",
            r.flood,
            r.receiver,
            r.offered,
            r.busy * 100.0,
            r.cpu_ns,
            r.cpu_ns / f,
            r.paced
                .map_or(String::new(), |(o, h, c)| format!("{o:.0}, {h:.0}, {c:.0}")),
            match (r.receiver == Receiver_::Floor.name(), own(r)) {
                (true, _) => format!(
                    "({:.0}: the statistics' cost)",
                    r.prog_ns.unwrap_or(f64::NAN)
                ),
                (false, Some(p)) => format!("{p:.0}"),
                (false, None) => String::new(),
            },
            r.passed
                .map_or("".into(), |p| format!("{:.2} %", p * 100.0))
        );
        json_rows.push(json!({"flood": r.flood, "receiver": r.receiver, "offered_per_s": r.offered,
            "fps_median": m, "fps_min": lo, "fps_max": hi, "busy_share": r.busy,
            "cpu_ns_per_frame": r.cpu_ns, "x_floor_cpu": r.cpu_ns / f,
            "prog_ns_per_run_stats": r.prog_ns, "prog_ns_per_run_own": own(r), "passed_share": r.passed,
            "paced": r.paced.map(|(o, h, c)| json!({"offered_per_s": o, "handled_per_s": h, "cpu_ns_per_frame": c}))}));
    }
    let rl = Receiver_::Ratelimit {
        generic: false,
        coarse: false,
    }
    .name();
    let coarse = Receiver_::Ratelimit {
        generic: false,
        coarse: true,
    }
    .name();
    let mut targets = Vec::new();
    let mut summary = serde_json::Map::new();
    if let Some(floor) = find(SPOOFED.name, Receiver_::Floor.name()) {
        let ok = floor.offered >= 20e6;
        let worst = rows
            .iter()
            .filter(|r| r.receiver == Receiver_::Floor.name())
            .map(|r| r.cpu_ns)
            .fold(0.0, f64::max);
        targets.push(format!(
            "Real floor: the generator offered {:.1} Mpps against the XDP_DROP floor, which handled {:.1} Mpps at {:.0} % busy \
             (≥ 20 Mpps offered: **{}**); the floods' floors cost {:.0} ns/frame at most, {:.2}× the cheapest any configuration of the generator reached ({cheapest:.0}; ≤ 1.2: **{}**){}",
            floor.offered / 1e6,
            floor.fps.0 / 1e6,
            floor.busy * 100.0,
            met(ok),
            worst,
            worst / cheapest,
            met(worst / cheapest <= 1.2),
            if floor.busy >= 0.9 || floor.offered > floor.fps.0 * 1.05 {
                "; the receiver is saturated (busy ≥ 90 %, or it handles less than is offered): the floor is its own"
            } else {
                "; the receiver keeps up with time to spare: the floor is generator-bound"
            }
        ));
        summary.insert(
            "floor".into(),
            json!({"offered": floor.offered, "handled": floor.fps.0, "busy": floor.busy,
                "worst_floor_ns": worst, "cheapest_ns": cheapest}),
        );
    }
    for (flood, label, x_floor, x_netfilter, own_max) in [
        (ONE.name, "one source > 100×", 2.0, 5.0, None),
        (CYCLING.name, "(b) 1 M cycling", 4.0, 10.0, None),
        (
            SPOOFED.name,
            "(c) distinct spoofed IPv6",
            4.0,
            10.0,
            Some(100.0),
        ),
        (SPOOFED_V4.name, "(c4) IPv4 cycling", 4.0, 10.0, Some(100.0)),
    ] {
        let f = cpu(flood, Receiver_::Floor.name());
        let nft = cpu(flood, Receiver_::Nft.name());
        let ipt = cpu(flood, Receiver_::Iptables.name());
        for (name, r) in [("precise clock", rl), ("coarse clock", coarse)] {
            let Some(row) = find(flood, r) else {
                continue;
            };
            let c = row.cpu_ns;
            let own_ns = own(row).unwrap_or(f64::NAN);
            let mut t = format!(
                "{label}, {name}: {:.2}× the floor's receiving CPU per frame (≤ {x_floor}: **{}**), {:.1}× cheaper than nftables and {:.1}× than iptables (≥ {x_netfilter}: **{}**); the program's own {own_ns:.0} ns/run",
                c / f,
                met(c / f <= x_floor),
                nft / c,
                ipt / c,
                met(nft / c >= x_netfilter && ipt / c >= x_netfilter),
            );
            if let Some(max) = own_max {
                let _ = write!(t, " (≤ {max}: **{}**)", met(own_ns <= max));
            }
            targets.push(t);
            summary.insert(
                format!("{label} {name}"),
                json!({"x_floor": c / f, "x_nft": nft / c, "x_iptables": ipt / c, "prog_own_ns": own_ns}),
            );
        }
    }
    let _ = writeln!(report.md, "\nTargets:\n");
    for t in &targets {
        let _ = writeln!(report.md, "- {t}");
        println!("{t}");
    }
    if let Err(e) = netfilter {
        let _ = writeln!(report.md, "\nnftables and iptables were not measured: {e}.");
    }
    let _ = writeln!(report.md);
    report.json.insert(
        "floods".into(),
        json!({"rows": json_rows, "targets": summary}),
    );
}

/// (d): 100 sources established before the flood, under the same default
/// rule as the flood (and so under its aggregate), each sending twice its
/// limit through (b) and through (c); what reached the receiver from each,
/// against burst + rate × T, and what the flood got, against the aggregate.
fn established(
    opts: &Opts,
    report: &mut Report,
    generator: &mut Generator,
    floors: &HashMap<&str, f64>,
    capacity: &HashMap<&str, (f64, f64)>,
) {
    let secs = if opts.quick { 2.0 } else { 6.0 };
    let _ = writeln!(
        report.md,
        "### (d) Established sources during the floods, under the flood's own rule\n\n\
         {LEGIT} sources of 198.18.1.0/24 under the default rule, the flood's (its aggregate of {AGGREGATE}/s included, with the default reserve), \
         each sending {} packets/s (twice its limit of {RATE}/s, burst {BURST}) from 1 s before the flood to its end \
         ({secs} s of flood); frames counted at the receiver by a raw socket of the bench's own. Expected per source: burst + rate × T of its own sending span. \
         A source that lost its state during the flood would have got a fresh burst: {BURST} more. The flood's admitted frames: \
         what ratelimit passed less what the established sources got, against the aggregate's bound (burst + rate × T, less what the established took).\n\n\
         The generator is paced to half of what ratelimit handled of the same flood above, so that no frame is lost in the veth's queue.\n\n\
         | flood | offered /s | handled /s | sources within ±2 % | worst source | admitted ÷ expected (min–max) | fresh bursts | flood admitted | aggregate's bound for it | receiving CPU ns/frame | × floor's |\n|---|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|",
        2 * RATE
    );
    let mut json_rows = Vec::new();
    for flood in [CYCLING, SPOOFED] {
        generator.set_mask(flood.mask);
        // Paced to half of what ratelimit handled of this flood: offered
        // beyond it, frames are lost in the veth's queue before any program
        // sees them, the established sources' with the rest, which would
        // measure the queue, not the policy.
        // The bench's own threads (and the daemon, a child) run on CPU 0 with
        // the generator: on CPU 1 they would preempt the receiving NAPI
        // thread, and the veth's queue would overflow meanwhile.
        pin_to_cpu(0);
        // A paced run's rate is not the unpaced one ÷ the pace (a run not
        // sent is cheaper): one trial, then the pace corrected; against a
        // floor, so that the daemon sees no flood before its sources.
        let target = capacity
            .get(flood.name)
            .map_or(f64::INFINITY, |(_, handled)| 0.5 * handled);
        let mut every = 1u64;
        {
            let trial = Setup::new(Receiver_::Floor);
            let frame = flood_frame(&trial.pair, flood);
            for _ in 0..2 {
                generator.set_pace(every);
                let rate = generator.flood(&trial.pair, &frame, 0.5, 0) as f64 / 0.5;
                every = ((every as f64) * rate / target).ceil().max(1.0) as u64;
            }
        }
        generator.set_pace(every);
        let setup = Setup::new(Receiver_::Ratelimit {
            generic: false,
            coarse: false,
        });
        let pair = &setup.pair;
        let frame = flood_frame(pair, flood);
        let rx = pair.receiver(LEGIT_PORT);
        let flows: Vec<Flow> = (1..=LEGIT)
            .map(|i| Flow {
                frame: pair
                    .udp(IpAddr::from([198, 18, 1, i as u8]), LEGIT_PORT)
                    .build(),
                pps: (2 * RATE) as u32,
            })
            .collect();
        let total = Duration::from_secs_f64(secs + 1.0);
        let p0 = setup.passed().unwrap_or(0);
        let t0 = Instant::now();
        let sender = pair.send_async(&flows, total);
        std::thread::sleep(Duration::from_secs(1));
        let c0 = setup.napi.map_or(0, cpu_ns);
        let h0 = setup.frames();
        let offered = generator.flood(pair, &frame, secs, 0) as f64 / secs;
        let (c1, h1) = (setup.napi.map_or(0, cpu_ns), setup.frames());
        let sent = sender.join().expect("sender");
        let got = rx.finish_timed();
        std::thread::sleep(Duration::from_millis(100));
        let (span_all, p1) = (t0.elapsed().as_secs_f64(), setup.passed().unwrap_or(0));
        let handled = h1.saturating_sub(h0) as f64 / secs;
        let cpu = c1.saturating_sub(c0) as f64 / h1.saturating_sub(h0).max(1) as f64;
        let mut ratios = Vec::new();
        let mut fresh = 0;
        let mut legit_got = 0u64;
        for (i, s) in sent.iter().enumerate() {
            let src = IpAddr::from([198, 18, 1, (i + 1) as u8]);
            let span = s.last.duration_since(s.first).as_secs_f64();
            let expected = (BURST as f64 + RATE as f64 * span).min(s.frames as f64);
            let admitted = got.count(&src) as f64;
            legit_got += got.count(&src);
            if admitted > expected + BURST as f64 / 2.0 {
                fresh += 1;
            }
            ratios.push(admitted / expected);
        }
        let flood_admitted = p1.saturating_sub(p0).saturating_sub(legit_got);
        let bound = (AGGREGATE as f64 * (1.0 + span_all) + AGGREGATE as f64) as u64;
        let bound = bound.saturating_sub(legit_got);
        let within = ratios.iter().filter(|r| (**r - 1.0).abs() <= 0.02).count();
        let worst = ratios
            .iter()
            .copied()
            .max_by(|a, b| (a - 1.0).abs().total_cmp(&(b - 1.0).abs()))
            .unwrap_or(f64::NAN);
        let (_, lo, hi) = stats(ratios.clone());
        let floor = floors.get(flood.name).copied().unwrap_or(f64::NAN);
        let ok =
            within == ratios.len() && fresh == 0 && flood_admitted <= bound && cpu / floor <= 4.0;
        let _ = writeln!(
            report.md,
            "| {} | {offered:.0} | {handled:.0} | {within} of {} | {worst:.4} | {lo:.4}–{hi:.4} | {fresh} | {flood_admitted} | ≤ {bound} | {cpu:.0} | {:.2} |",
            flood.name,
            ratios.len(),
            cpu / floor,
        );
        println!(
            "(d) during {}: {within} of {} established sources within ±2 % (worst {worst:.4}, {lo:.4}–{hi:.4}), {fresh} fresh bursts, \
             flood admitted {flood_admitted} (bound {bound}), {cpu:.0} ns/frame ({:.2}× floor): {}",
            flood.name,
            ratios.len(),
            cpu / floor,
            met(ok)
        );
        drop(setup);
        unpin();
        json_rows.push(
            json!({"flood": flood.name, "offered_per_s": offered, "handled_per_s": handled, "sources": ratios.len(), "within_2pct": within,
            "worst": worst, "min": lo, "max": hi, "fresh_bursts": fresh, "flood_admitted": flood_admitted,
            "flood_bound": bound, "cpu_ns_per_frame": cpu, "x_floor": cpu / floor, "met": ok}),
        );
    }
    let _ = writeln!(report.md);
    report
        .json
        .insert("established_during_floods".into(), json!(json_rows));
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
    if have("nft") && have("iptables") && have("ip6tables") && have("ethtool") && have("taskset") {
        return Ok(());
    }
    println!("installing nftables, iptables and ethtool from the distribution's packages");
    let ok = std::process::Command::new("sh")
        .arg("-c")
        .arg("apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nftables iptables ethtool util-linux")
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    if ok {
        Ok(())
    } else {
        Err("could not install nftables, iptables and ethtool with apt-get".into())
    }
}
