//! Where the receiving CPU's time goes under a flood: `perf record` on CPU 1
//! during one more round, the symbols with their shares.

use std::fmt::Write as _;

use ratelimit_tests::generator::Generator;

use super::receivers::Setup;
use crate::report::Report;

/// Where the receiving CPU's time goes during one more round: `perf record`
/// on CPU 1 (cpu-clock samples: a VM has no hardware counters), the symbols
/// with their share of the samples (BPF programs by their JIT names). `None`
/// without perf.
pub(super) fn profile(
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
pub(super) type Profile<'a> = (&'a str, &'a str, Vec<(f64, String)>);

pub(super) fn write_profiles(report: &mut Report, profiles: &[Profile]) {
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
