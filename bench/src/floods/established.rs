//! (d) Established sources during the floods, under the flood's own rule: what
//! each got against burst + rate × T, and what the flood got against the
//! aggregate.

use std::{
    collections::HashMap,
    fmt::Write as _,
    net::IpAddr,
    time::{Duration, Instant},
};

use ratelimit_tests::{
    generator::Generator,
    net::Flow,
    testrun::{pin_to_cpu, unpin},
};
use serde_json::json;

use super::{
    AGGREGATE, BURST, CYCLING, RATE, SPOOFED, flood_frame,
    receivers::{Receiver_, Setup, cpu_ns},
};
use crate::{Opts, met, report::Report, stats};

/// The established sources of the last case.
const LEGIT: u32 = 100;
/// UDP port of the established sources' frames.
const LEGIT_PORT: u16 = 7200;

/// (d): 100 sources established before the flood, under the same default
/// rule as the flood (and so under its aggregate), each sending twice its
/// limit through (b) and through (c); what reached the receiver from each,
/// against burst + rate × T, and what the flood got, against the aggregate.
pub(super) fn established(
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
