//! Accuracy of every algorithm at the receiver against the same code on the
//! send times.

use std::{fmt::Write as _, net::IpAddr, time::Duration};

use ratelimit_tests::{fixture::Host, net::NetNs, testrun::pin_to_cpu};
use ratelimit_user::kernel::monotonic_ns;
use serde_json::json;

use crate::{Opts, in_ns, met, report::Report};

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
pub(crate) fn accuracy(opts: &Opts, report: &mut Report) {
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
    let (h, d) = Host::start("bench-acc", &[]);
    let pair = &h.pair;
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
            let rx = pair.receiver(7100);
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
