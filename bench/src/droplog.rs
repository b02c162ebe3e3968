//! What the drop log costs a dropped frame, with BPF_PROG_TEST_RUN: the same
//! dropped frame with the log off, on and over its budget (what a flood
//! pays: one per-CPU lookup, the coarse clock, a compare), and on within
//! its budget (the record written: the rule read, the headers read again,
//! the ring's copy), its ring drained as a daemon would.

use std::fmt::Write as _;

use ratelimit_tests::testrun::{Loaded, XDP_DROP, test_run};
use ratelimit_user::model::{droplog::DropLog, rules::RuleSet};
use serde_json::json;

use crate::{Opts, limit, report::Report, rules, stats, v4};

/// The program with the default rule at 1/hour (burst 1: every run after the
/// first is dropped) and the drop log at `log`.
fn over_limit(log: DropLog) -> Loaded {
    let set = RuleSet {
        drop_log: log,
        ..rules(limit("1/hour", 1))
    };
    Loaded::with_capacity(&set, 1 << 16)
}

/// Mean ns of one run each, `n` runs (the ring drained every 1000).
fn one_run_each(l: &Loaded, frame: &[u8], n: u32) -> f64 {
    let mut ring = l.maps.drop_log_reader().expect("the drop log's ring");
    let mut total = 0u64;
    for i in 0..n {
        let (verdict, ns) = test_run(l.prog_fd(), frame, 1);
        assert_eq!(verdict, XDP_DROP, "over its limit: dropped");
        total += u64::from(ns);
        if i % 1000 == 999 {
            while ring.next().is_some() {}
        }
    }
    total as f64 / f64::from(n)
}

/// The cost per dropped frame with the drop log off and on.
pub(crate) fn drop_log_cost(opts: &Opts, report: &mut Report) {
    let repeat: u32 = 1_000_000;
    let rounds = if opts.quick { 3 } else { 9 };
    let single = if opts.quick { 5_000 } else { 20_000 };
    report.section(
        "Drop log: cost per dropped frame (BPF_PROG_TEST_RUN)",
        &format!(
            "One IPv4 source over its limit (1/hour, burst 1), one CPU. Over the budget: mean ns per frame over {repeat} runs, median of {rounds} rounds (min–max). \
             Within the budget: {single} runs of one frame each (the kernel times each), median of {rounds} rounds, the ring drained every 1000; the same for the log off beside it."
        ),
    );
    let frame = v4("198.18.7.1");
    let off = over_limit(DropLog::OFF);
    let on = over_limit(DropLog(100));
    let max = over_limit(DropLog(ratelimit_common::DROP_LOG_MAX_RATE));
    for l in [&off, &on, &max] {
        let _ = test_run(l.prog_fd(), &frame, 1000);
    }
    let mut s = vec![Vec::new(); 4];
    for _ in 0..rounds {
        for (i, l) in [&off, &on].iter().enumerate() {
            let (verdict, ns) = test_run(l.prog_fd(), &frame, repeat);
            assert_eq!(verdict, XDP_DROP);
            s[i].push(f64::from(ns));
        }
        s[2].push(one_run_each(&off, &frame, single));
        s[3].push(one_run_each(&max, &frame, single));
    }
    let written = max.maps.drop_log_counts().expect("counts");
    assert!(
        written.written >= u64::from(single) * rounds as u64 / 2,
        "within the budget most runs write a record: {written:?}"
    );
    let [off_r, on_r, off_1, on_1]: [(f64, f64, f64); 4] = s
        .into_iter()
        .map(stats)
        .collect::<Vec<_>>()
        .try_into()
        .expect("four rows");
    let rows = [
        ("log off, dropped", off_r),
        ("log on (100/s), over its budget, dropped", on_r),
        ("log off, dropped (one run each)", off_1),
        (
            "log on, within its budget: a record written (one run each)",
            on_1,
        ),
    ];
    let _ = writeln!(
        report.md,
        "| path | ns/frame (median) | min–max |\n|---|---:|---:|"
    );
    let mut json_rows = Vec::new();
    for (name, (m, lo, hi)) in rows {
        let _ = writeln!(report.md, "| {name} | {m:.1} | {lo:.0}–{hi:.0} |");
        println!("{name:60} {m:7.1} ns  ({lo:.0}–{hi:.0})");
        json_rows.push(json!({"path": name, "ns_median": m, "ns_min": lo, "ns_max": hi}));
    }
    let over = on_r.0 - off_r.0;
    let within = on_1.0 - off_1.0;
    let _ = writeln!(
        report.md,
        "\nThe log costs a drop over its budget **{over:+.1} ns**, and a drop it records **{within:+.1} ns**.\n"
    );
    println!(
        "drop log: {over:+.1} ns per drop over the budget, {within:+.1} ns per record written"
    );
    report.json.insert(
        "drop_log_cost".into(),
        json!({"repeat": repeat, "rounds": rounds, "single_runs": single, "rows": json_rows,
            "ns_over_budget": over, "ns_per_record": within}),
    );
}
