//! From a `ratelimit` command to enforcement.

use std::{
    fmt::Write as _,
    time::{Duration, Instant},
};

use ratelimit_tests::{check::ipv6_list, fixture::Host};
use serde_json::json;

use crate::{Opts, ip, met, report::Report, stats};

/// From `ratelimit set` starting to the last frame the old limit let through.
pub(crate) fn set_to_enforced(opts: &Opts, report: &mut Report) {
    let trials = if opts.quick { 3 } else { 10 };
    report.section(
        "Set to enforced",
        &format!(
            "A daemon on a veth, a source sending 20 000 frames/s within a limit of 100 k/s; `ratelimit deny` on its /32; \
             the time from starting the command to the last frame that arrived. Median of {trials} (min–max)."
        ),
    );
    let (h, d) = Host::start("bench-set", &["--rate", "100k/s"]);
    let pair = &h.pair;
    let src = ip("198.18.0.90");
    let mut delays = Vec::new();
    for _ in 0..trials {
        let rx = pair.receiver(6000);
        let flows = [pair.flow(src, 6000, 20_000)];
        let sender = pair.send_async(&flows, Duration::from_millis(800));
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

/// One change, and twenty at once, with a blocklist of a million entries
/// loaded: a change must not rewrite what it does not touch.
pub(crate) fn change_under_a_large_list(opts: &Opts, report: &mut Report) {
    let entries: u32 = if opts.quick { 100_000 } else { 1_000_000 };
    let trials = if opts.quick { 5 } else { 20 };
    report.section(
        "A change under a large list",
        &format!(
            "A daemon on a veth with a deny list of {entries} entries (IPv6 /64s); the wall time of one `ratelimit deny` \
             (the CLI's start included), median of {trials} (min–max), and of twenty at once."
        ),
    );
    let (h, d) = Host::start("bench-list", &[]);
    let list = h.write("big.list", &ipv6_list(entries));
    let t0 = Instant::now();
    d.cli_ok(&["deny", "--from", &list, "--name", "big"]);
    let load = t0.elapsed().as_secs_f64();
    // The trie the program does not read catches up while the daemon idles.
    std::thread::sleep(Duration::from_secs(if opts.quick { 2 } else { 8 }));
    let mut one = Vec::new();
    for i in 0..trials {
        let t = Instant::now();
        d.cli_ok(&["deny", &format!("198.18.70.{i}/32")]);
        one.push(t.elapsed().as_secs_f64() * 1e3);
    }
    let t = Instant::now();
    let handles: Vec<_> = (0..20)
        .map(|i| {
            let mut cmd = d.cli_command(&["deny", &format!("198.18.71.{i}/32")]);
            std::thread::spawn(move || cmd.output().is_ok_and(|o| o.status.success()))
        })
        .collect();
    let ok = handles
        .into_iter()
        .map(|h| h.join().unwrap_or(false))
        .filter(|ok| *ok)
        .count();
    let twenty = t.elapsed().as_secs_f64() * 1e3;
    let (m, lo, hi) = stats(one);
    let _ = writeln!(
        report.md,
        "Loading the list: {load:.1} s. One change: **{m:.0} ms** (min {lo:.0}, max {hi:.0}); twenty at once: **{twenty:.0} ms** for all, {ok} of 20 answered; target one change well under 1 s: **{}**.\n",
        met(m < 200.0)
    );
    println!(
        "change under {entries} list entries: {m:.0} ms ({lo:.0}–{hi:.0}); twenty at once {twenty:.0} ms ({ok}/20)"
    );
    report.json.insert(
        "change_under_large_list".into(),
        json!({"entries": entries, "load_s": load, "one_ms": {"median": m, "min": lo, "max": hi},
            "twenty_at_once_ms": twenty, "twenty_answered": ok}),
    );
}
