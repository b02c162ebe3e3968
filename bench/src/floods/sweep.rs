//! The generator's configurations (frames a call, batch, pace) against the
//! XDP_DROP floor: whether the floor the floods measure is the receiver's own.

use std::{
    fmt::Write as _,
    time::{Duration, Instant},
};

use ratelimit_tests::generator::Generator;
use serde_json::json;

use super::{
    SPOOFED, flood_frame,
    receivers::{Receiver_, Setup, cpu_ns},
};
use crate::{Opts, report::Report};

/// The XDP_DROP floor under every configuration of the generator the bench
/// can choose (frames a call, batch, pace), IPv6 spoofed frames: whether the
/// floor the floods use is the receiver's own. Answers the cheapest receiving
/// CPU ns/frame among them.
pub(super) fn generator_sweep(opts: &Opts, report: &mut Report, generator: &mut Generator) -> f64 {
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
