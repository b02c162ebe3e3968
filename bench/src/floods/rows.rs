//! Each flood against each receiver: rounds of the generator's flood, a row
//! of medians per receiver (receiving CPU per frame, against the floor's), the
//! table and the targets it is held to.

use std::{
    fmt::Write as _,
    time::{Duration, Instant},
};

use ratelimit_tests::generator::Generator;
use serde_json::json;

use super::{
    CYCLING, ONE, SPOOFED, SPOOFED_V4, flood_frame,
    profile::{Profile, profile},
    receivers::{Receiver_, Setup, cpu_ns},
};
use crate::{Opts, met, report::Report, stats};

/// One measured row.
pub(super) struct Row {
    pub(super) flood: &'static str,
    pub(super) receiver: &'static str,
    /// Frames handled per second by the receiver.
    pub(super) fps: (f64, f64, f64),
    /// Frames offered per second by the generator (median).
    pub(super) offered: f64,
    /// The receiving CPU's busy share over the round (median).
    busy: f64,
    /// Receiving CPU ns per frame (median).
    pub(super) cpu_ns: f64,
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

/// Every flood against every receiver this run can set up: the rows, and the
/// profiles of the floor and of ratelimit.
pub(super) fn measure(
    opts: &Opts,
    generator: &mut Generator,
    netfilter: &Result<(), String>,
    secs: f64,
    rounds: usize,
) -> (Vec<Row>, Vec<Profile<'static>>) {
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
            Receiver_::TableFloor,
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
                .map(|_| round(&setup, generator, &frame, secs))
                .collect();
            // The program's own time in a round of its own: the statistics
            // read the clock twice a run, which on a VM's paravirtual clock
            // costs the receiving CPU as much as the floor's whole frame.
            let prog = {
                let _on = aya::sys::enable_stats(aya::sys::Stats::RunTime)
                    .expect("enabling BPF statistics");
                round(&setup, generator, &frame, secs.min(2.0)).prog
            };
            // The same receiver without the overrun: the generator paced
            // to ~1.2× what it handled.
            let paced = (!matches!(
                kind,
                Receiver_::Floor
                    | Receiver_::ParseFloor
                    | Receiver_::ExactFloor
                    | Receiver_::TableFloor
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
                let r = round(&setup, generator, &frame, secs.min(2.0));
                generator.set_pace(1);
                (
                    r.offered as f64 / r.secs,
                    r.handled as f64 / r.secs,
                    r.cpu_ns as f64 / r.handled.max(1) as f64,
                )
            })
            .filter(|_| setup.napi.is_some());
            if (matches!(kind, Receiver_::Floor) || kind == native)
                && let Some(p) = profile(&setup, generator, &frame, secs.min(3.0))
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
    (rows, profiles)
}

pub(super) fn write_rows(
    report: &mut Report,
    rows: &[Row],
    netfilter: &Result<(), String>,
    cheapest: f64,
) {
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
    // The targets of the state-table issue (36): × the floor, × cheaper than
    // netfilter (where it sets one), the program's own ns/run.
    for (flood, label, x_floor, x_netfilter, own_max) in [
        (ONE.name, "one source > 100×", 2.5, Some(5.0), Some(60.0)),
        (CYCLING.name, "(b) 1 M cycling", 5.0, None, Some(150.0)),
        (
            SPOOFED.name,
            "(c) distinct spoofed IPv6",
            3.0,
            Some(10.0),
            Some(60.0),
        ),
        (SPOOFED_V4.name, "(c4) IPv4 cycling", 4.0, None, None),
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
                "{label}, {name}: {:.2}× the floor's receiving CPU per frame (≤ {x_floor}: **{}**), {:.1}× cheaper than nftables and {:.1}× than iptables",
                c / f,
                met(c / f <= x_floor),
                nft / c,
                ipt / c,
            );
            if let Some(x) = x_netfilter {
                let _ = write!(t, " (≥ {x}: **{}**)", met(nft / c >= x && ipt / c >= x));
            }
            let _ = write!(t, "; the program's own {own_ns:.0} ns/run");
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
