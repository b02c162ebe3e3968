//! From a `ratelimit` command to enforcement.

use std::{
    fmt::Write as _,
    time::{Duration, Instant},
};

use ratelimit_tests::{
    Daemon, TempDir,
    net::{Flow, Pair, Receiver, send_async},
};
use serde_json::json;

use crate::{Opts, ip, met, report::Report, stats};

/// From `ratelimit set` starting to the last frame the old limit let through.
pub fn set_to_enforced(opts: &Opts, report: &mut Report) {
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
