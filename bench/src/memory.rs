//! Memory per tracked source and the daemon's reads at scale.

use std::{fmt::Write as _, net::IpAddr, time::Instant};

use ratelimit_common::Reason;
use ratelimit_tests::{
    frames::Udp,
    testrun::{Loaded, test_run},
};
use serde_json::json;

use crate::{Opts, ip, limit, met, report::Report, rules};

/// Kernel memory per tracked source, time to create 1 M sources, and the time
/// the daemon's reads take over them.
pub(crate) fn memory_and_scale(opts: &Opts, report: &mut Report) {
    let n: u32 = if opts.quick { 100_000 } else { 1 << 20 };
    report.section(
        "Memory and scale",
        &format!("{n} distinct sources (198.18.0.0/15's 131 072 IPv4 addresses, then IPv6 /64s) created through BPF_PROG_TEST_RUN \
                  (two runs each: a source earns its state on its second frame), in a state table sized for {n} sources of each family (two slots each), with the state-creation cap lifted."),
    );
    let mut set = rules(limit("1000/s", 10));
    set.new_states = ratelimit_user::model::rules::Shared::of(
        ratelimit_user::model::rate::parse_rate("new-states", "100M/s").expect("rate"),
    );
    let l = Loaded::with_capacity(&set, n);
    // `Loaded` sizes the table for `n` sources of each family.
    let memlock = state_table_memlock(2 * ratelimit_common::state_lines(n));
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
        // Two runs of one frame each: a source earns its state on its second
        // frame. (Not one run with repeat 2: a repeated run installs the program
        // in the kernel's XDP dispatcher and waits for an RCU grace period.)
        let _ = test_run(l.prog_fd(), &f, 1);
        let _ = test_run(l.prog_fd(), &f, 1);
    }
    let create = start.elapsed();
    let tracked = l.maps.held_states().count();
    // What `status` does: count the states with batched reads.
    let walk = {
        let t = Instant::now();
        let (c, _) = l.maps.tracked().expect("counting states");
        assert_eq!(c, tracked);
        t.elapsed()
    };
    let counters = {
        let t = Instant::now();
        let _ = l.maps.counters().expect("counters");
        t.elapsed()
    };
    let per_source = memlock.map(|b| b as f64 / (2.0 * f64::from(n)));
    let passed = l.packets(Reason::Passed);
    let _ = writeln!(report.md, "| measure | value | target |\n|---|---:|---|");
    let _ = writeln!(
        report.md,
        "| kernel memory per source it is sized for (the state table's and its birth stamps' memlock ÷ (`--max-sources` + `--max-sources-v6`); was 88 B for IPv4 and about 96 B for IPv6 in LRU hashes) | {} | ≤ 64 B: {} |",
        per_source.map_or("?".into(), |b| format!("{b:.1} B")),
        per_source.map_or("?", |b| met(b <= 64.0))
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
        "| `status`: count every tracked source (batched reads) | {:.3} s | ≤ 1 s: {} |",
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

/// The state table's and its birth stamps' `memlock` together, from
/// the kernel's own accounting (fdinfo): the two arrays of `lines` entries,
/// 64 and 32 bytes each.
fn state_table_memlock(lines: u32) -> Option<u64> {
    // The maps were taken by `Maps`; find their fds through /proc.
    let dir = std::fs::read_dir("/proc/self/fdinfo").ok()?;
    let (mut table, mut born) = (None, None);
    for e in dir.flatten() {
        let text = std::fs::read_to_string(e.path()).unwrap_or_default();
        if !text.contains("map_type:\t2\n") {
            continue; // BPF_MAP_TYPE_ARRAY
        }
        let field = |k: &str| {
            text.lines()
                .find_map(|line| line.strip_prefix(k))
                .and_then(|v| v.trim().parse::<u64>().ok())
        };
        if field("max_entries:") != Some(u64::from(lines)) {
            continue;
        }
        match field("value_size:") {
            Some(64) => table = field("memlock:"),
            Some(32) => born = field("memlock:"),
            _ => {}
        }
    }
    Some(table? + born?)
}
