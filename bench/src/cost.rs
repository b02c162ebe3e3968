//! Cost per packet with BPF_PROG_TEST_RUN, against floors built beside it.

use std::{fmt::Write as _, net::IpAddr};

use aya::EbpfLoader;
use ratelimit_tests::{
    frames::{TPID_8021Q, Udp},
    testrun::{Loaded, XDP_DROP, XDP_PASS, load_xdp, test_run},
};
use ratelimit_user::model::rules::{Action, Selector};
use serde_json::json;

use crate::{Opts, ip, limit, met, report::Report, rules, stats, v4};

/// Cost per packet with BPF_PROG_TEST_RUN: mean ns per run over `repeat` runs,
/// repeated `rounds` times.
pub(crate) fn cost_per_packet(opts: &Opts, report: &mut Report) {
    let repeat: u32 = 1_000_000;
    let rounds = if opts.quick { 3 } else { 9 };
    report.section(
        "Cost per packet (BPF_PROG_TEST_RUN)",
        &format!(
            "Mean ns per frame over {repeat} runs of one frame, median of {rounds} rounds (min–max), one CPU. \
             The floors: a program that only returns XDP_DROP, and one that only looks the IPv4 source up in an LRU hash and bumps it in place."
        ),
    );
    let mut floors = EbpfLoader::new()
        .load(ratelimit_tests::FLOORS_OBJECT)
        .expect("loading the floors");
    let drop_fd = load_xdp(&mut floors, "floor_drop");
    let lru_fd = load_xdp(&mut floors, "floor_lru");
    let clock_fd = load_xdp(&mut floors, "floor_lru_clock");
    let exact_fd = load_xdp(&mut floors, "floor_exact");
    let table_fd = load_xdp(&mut floors, "floor_table");
    let jiffies_fd = load_xdp(&mut floors, "floor_lru_jiffies");
    let coarse_fd = load_xdp(&mut floors, "floor_lru_coarse");

    // Within limit: 100 M/s with a large burst, so every run passes and writes.
    let fast = limit("100M/s", 1 << 32);
    let within = Loaded::with_capacity(&rules(fast), 1 << 20);
    // Over limit: one per second, burst 1; every run after the first is denied.
    let over = Loaded::with_capacity(&rules(limit("1/s", 1)), 1 << 20);
    // With 1000 prefix rules in the trie (the source matches none of them).
    let mut many = rules(fast);
    for i in 0..1000u32 {
        let p = Selector::parse("bench", &format!("2001:db8:{:x}::/48", i + 1)).expect("prefix");
        many.rules.insert(p, Action::Allow);
    }
    let with_rules = Loaded::with_capacity(&many, 1 << 20);
    // Ten rules with matches, seven of them on the source's own prefix: the
    // frame (UDP to port 9) is tried against all seven, then its prefix's
    // rule without matches takes it (the longest chain one source can meet).
    let mut matched = rules(fast);
    for s in [
        "198.18.0.0/16",
        "198.18.0.0/16 tcp syn",
        "198.18.0.0/16 tcp dport 80",
        "198.18.0.0/16 udp dport 53",
        "198.18.0.0/16 udp dport 27015-27020",
        "198.18.0.0/16 udp dport 123",
        "198.18.0.0/16 icmp type 8",
        "198.18.0.0/16 to 198.18.0.99",
        "198.19.0.0/16 tcp syn",
        "2001:db8::/32 udp dport 53",
        "2001:db8::/32 icmpv6 type 128",
    ] {
        let action = if s == "198.18.0.0/16" {
            Action::Limit(fast)
        } else {
            Action::Deny { dry_run: false }
        };
        matched
            .rules
            .insert(Selector::parse("bench", s).expect("selector"), action);
    }
    let with_matches = Loaded::with_capacity(&matched, 1 << 20);
    // Port sets: a frame to port 5000 taken by a rule of that one port, and
    // by the largest set (16 ranges) with 5000 its last range.
    let by_ports = |dport: &str| {
        let mut set = rules(fast);
        set.rules.insert(
            Selector::parse("bench", &format!("198.18.0.0/16 udp dport {dport}"))
                .expect("selector"),
            Action::Limit(fast),
        );
        Loaded::with_capacity(&set, 1 << 20)
    };
    let one_port = by_ports("5000");
    let largest: Vec<String> = (0..15).map(|i| (1000 + 10 * i).to_string()).collect();
    let port_set = by_ports(&format!("{},5000", largest.join(",")));
    let mut to_5000 = Udp::new(ip("198.18.7.1"), ip("198.18.0.2"));
    to_5000.dport = 5000;
    let frame_5000 = to_5000.build();
    // Three key levels (per /32, /24 and /16), all within their limits: the
    // frame is taken at each, beside the one-level rule above.
    let bucket = |rate: &str| ratelimit_user::model::rules::Shared {
        rate: ratelimit_user::model::rate::parse_rate("bench", rate).expect("rate"),
        burst: 1 << 32,
    };
    let three = ratelimit_user::model::rules::Limit {
        levels: [
            Some(ratelimit_user::model::rules::KeyLevel {
                bucket: bucket("100M/s"),
                per_v4: 24,
                per_v6: 48,
            }),
            Some(ratelimit_user::model::rules::KeyLevel {
                bucket: bucket("100M/s"),
                per_v4: 16,
                per_v6: 32,
            }),
        ],
        ..fast
    };
    let three_levels = Loaded::with_capacity(&rules(three), 1 << 20);
    let aggregate = ratelimit_user::model::rules::Limit {
        aggregate: Some(bucket("100M/s")),
        ..fast
    };
    let with_aggregate = Loaded::with_capacity(&rules(aggregate), 1 << 20);

    let frame4 = v4("198.18.7.1");
    let frame6 = Udp::new(ip("2001:db8:7::1"), ip("2001:db8::2")).build();
    let mut tagged = Udp::new(ip("198.18.7.2"), ip("198.18.0.2"));
    tagged.vlans = vec![(TPID_8021Q, 100)];
    let frame_vlan = tagged.build();
    // The deeper parse (issue 23): more tags, extension headers, fragments.
    let mut deep = Udp::new(ip("198.18.7.3"), ip("198.18.0.2"));
    deep.vlans = vec![(TPID_8021Q, 0); 8];
    let frame_8_tags = deep.build();
    let mut chained = Udp::new(ip("2001:db8:7::2"), ip("2001:db8::2"));
    chained.ipv6_ext = vec![(0, 0), (60, 0), (60, 0)];
    let frame_ext = chained.build();
    let mut fragmented = Udp::new(ip("198.18.7.4"), ip("198.18.0.2"));
    fragmented.payload = 64;
    let [frame_fragment, _] = fragmented.fragments(40);
    let tiny = Udp {
        tcp: Some(ratelimit_tests::frames::tcp::SYN),
        ..Udp::new(ip("198.18.7.5"), ip("198.18.0.2"))
    };
    let [frame_tiny, _] = tiny.fragments(8);
    // A dropped frame to a local port in the ephemeral range pays a socket
    // lookup (is it one of the host's own connections?).
    let mut ephemeral = Udp::new(ip("198.18.7.1"), ip("198.18.0.2"));
    ephemeral.dport = 40_000;
    let frame_ephemeral = ephemeral.build();

    let cases: Vec<(&str, i32, &[u8], u32)> = vec![
        ("floor: XDP_DROP only", drop_fd, &frame4, XDP_DROP),
        (
            "floor: LRU lookup + in-place update",
            lru_fd,
            &frame4,
            XDP_DROP,
        ),
        (
            "floor: the same + bpf_ktime_get_ns",
            clock_fd,
            &frame4,
            XDP_DROP,
        ),
        (
            "floor: exact (20-byte key, LRU lookup + compare-and-swap)",
            exact_fd,
            &frame4,
            XDP_DROP,
        ),
        (
            "floor: exact, the state table (two 64-byte lines + compare-and-swap)",
            table_fd,
            &frame4,
            XDP_DROP,
        ),
        ("floor: LRU + bpf_jiffies64", jiffies_fd, &frame4, XDP_DROP),
        (
            "floor: LRU + bpf_ktime_get_coarse_ns",
            coarse_fd,
            &frame4,
            XDP_DROP,
        ),
        (
            "ratelimit, IPv4, known source, within limit",
            within.prog_fd(),
            &frame4,
            XDP_PASS,
        ),
        (
            "ratelimit, IPv6, known source, within limit",
            within.prog_fd(),
            &frame6,
            XDP_PASS,
        ),
        (
            "ratelimit, VLAN IPv4, known source, within limit",
            within.prog_fd(),
            &frame_vlan,
            XDP_PASS,
        ),
        (
            "ratelimit, 8 VLAN tags IPv4, known source, within limit",
            within.prog_fd(),
            &frame_8_tags,
            XDP_PASS,
        ),
        (
            "ratelimit, IPv6 behind 3 extension headers, known source, within limit",
            within.prog_fd(),
            &frame_ext,
            XDP_PASS,
        ),
        (
            "ratelimit, IPv4 first fragment (whole header), known source, within limit",
            within.prog_fd(),
            &frame_fragment,
            XDP_PASS,
        ),
        (
            "ratelimit, IPv4 tiny first fragment (8 bytes of TCP): dropped",
            within.prog_fd(),
            &frame_tiny,
            XDP_DROP,
        ),
        (
            "ratelimit, IPv4, known source, over limit (dropped)",
            over.prog_fd(),
            &frame4,
            XDP_DROP,
        ),
        (
            "ratelimit, IPv4, 1000 rules in the trie",
            with_rules.prog_fd(),
            &frame4,
            XDP_PASS,
        ),
        (
            "ratelimit, IPv4, one level and the rule's aggregate",
            with_aggregate.prog_fd(),
            &frame4,
            XDP_PASS,
        ),
        (
            "ratelimit, IPv4, three key levels (/32, /24, /16)",
            three_levels.prog_fd(),
            &frame4,
            XDP_PASS,
        ),
        (
            "ratelimit, IPv4, 10 rules with matches, 7 tried before the source's own",
            with_matches.prog_fd(),
            &frame4,
            XDP_PASS,
        ),
        (
            "ratelimit, IPv4, a rule of one port takes the frame",
            one_port.prog_fd(),
            &frame_5000,
            XDP_PASS,
        ),
        (
            "ratelimit, IPv4, a set of 16 port ranges takes the frame at its last",
            port_set.prog_fd(),
            &frame_5000,
            XDP_PASS,
        ),
        (
            "ratelimit, IPv4, over limit, to an ephemeral port (socket lookup, none found)",
            over.prog_fd(),
            &frame_ephemeral,
            XDP_DROP,
        ),
    ];
    // Warm every key and cache, then measure round-robin so drift hits all alike.
    for (_, fd, frame, _) in &cases {
        let _ = test_run(*fd, frame, 1000);
    }
    let mut samples: Vec<Vec<f64>> = vec![Vec::new(); cases.len()];
    for _ in 0..rounds {
        for (i, (name, fd, frame, want)) in cases.iter().enumerate() {
            let (verdict, ns) = test_run(*fd, frame, repeat);
            assert_eq!(verdict, *want, "{name}: unexpected verdict while measuring");
            samples[i].push(f64::from(ns));
        }
    }
    let rows: Vec<(&str, (f64, f64, f64))> = cases
        .iter()
        .zip(samples)
        .map(|((name, ..), v)| (*name, stats(v)))
        .collect();
    let drop = rows[0].1;
    let lru = rows[1].1;
    // New sources: one run per distinct source (the kernel still times the run).
    let fresh = Loaded::with_capacity(&rules(fast), 1 << 20);
    let n_new = if opts.quick { 20_000u32 } else { 200_000 };
    let mut new_rounds = Vec::new();
    for round in 0..3u32 {
        let mut total = 0u64;
        for i in 0..n_new {
            let k = round * n_new + i;
            let src = IpAddr::from([198, 18 + (k >> 16) as u8 % 2, (k >> 8) as u8, k as u8]);
            let f = Udp::new(src, ip("198.18.0.2")).build();
            total += u64::from(test_run(fresh.prog_fd(), &f, 1).1);
        }
        new_rounds.push(total as f64 / f64::from(n_new));
    }
    let new = stats(new_rounds);

    let _ = writeln!(
        report.md,
        "| path | ns/frame (median) | min–max | × XDP_DROP | × LRU floor |\n|---|---:|---:|---:|---:|"
    );
    let mut json_rows = Vec::new();
    let mut push = |name: &str, (m, lo, hi): (f64, f64, f64), report: &mut Report| {
        let _ = writeln!(
            report.md,
            "| {name} | {m:.1} | {lo:.0}–{hi:.0} | {:.2} | {:.2} |",
            m / drop.0,
            m / lru.0
        );
        println!(
            "{name:55} {m:7.1} ns  ({lo:.0}–{hi:.0})  {:.2}× drop  {:.2}× lru",
            m / drop.0,
            m / lru.0
        );
        json_rows.push(
            json!({"path": name, "ns_median": m, "ns_min": lo, "ns_max": hi,
            "x_drop_floor": m / drop.0, "x_lru_floor": m / lru.0}),
        );
    };
    for (name, v) in &rows {
        push(name, *v, report);
    }
    push(
        &format!("ratelimit, IPv4, new source (1 run each, {n_new} sources)"),
        new,
        report,
    );

    let ipv4 = rows[7].1.0;
    let p1 = ipv4 / lru.0;
    let table_x = ipv4 / rows[4].1.0;
    let ipv6_x = rows[8].1.0 / ipv4;
    let vlan_x = rows[9].1.0 / ipv4;
    let (insns, xlated) = within.verifier_stats();
    let _ = writeln!(
        report.md,
        "\nTargets: known-source IPv4 ≤ 1.5× the exact floor of the state table: **{table_x:.2}×, {}**; P1 known-source IPv4 ≤ 1.3× the LRU floor: **{p1:.2}×, {}**; IPv6 within +10 % of IPv4: **{:+.1} %, {}**; VLAN within +10 %: **{:+.1} %, {}**.\n",
        met(table_x <= 1.5),
        met(p1 <= 1.3),
        (ipv6_x - 1.0) * 100.0,
        met(ipv6_x <= 1.1),
        (vlan_x - 1.0) * 100.0,
        met(vlan_x <= 1.1),
    );
    let _ = writeln!(
        report.md,
        "The verifier processed {} instructions; the program is {} instructions after translation.\n",
        insns.map_or("?".into(), |n| n.to_string()),
        xlated.map_or("?".into(), |n| n.to_string())
    );
    verifier_by_kernel(report, insns);
    println!(
        "P1 {p1:.2}× lru floor ({}); IPv6 {:+.1} %; VLAN {:+.1} %; verifier {insns:?} insns, {xlated:?} xlated",
        met(p1 <= 1.3),
        (ipv6_x - 1.0) * 100.0,
        (vlan_x - 1.0) * 100.0
    );
    report.json.insert(
        "cost_per_packet".into(),
        json!({"repeat": repeat, "rounds": rounds, "rows": json_rows,
            "p1_x_lru": p1, "x_table_floor": table_x, "ipv6_vs_ipv4": ipv6_x, "vlan_vs_ipv4": vlan_x,
            "verified_insns": insns, "xlated_insns": xlated}),
    );
}

/// The verifier's figures per kernel of the last matrix run
/// (`tests/kernels.txt`, written by `cargo xtask vm --record`) beside this
/// machine's, measured now.
fn verifier_by_kernel(report: &mut Report, host: Option<u32>) {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/kernels.txt");
    let recorded = std::fs::read_to_string(path)
        .map_err(|e| e.to_string())
        .and_then(|t| ratelimit_tests::verifier::parse_budget(&t));
    let stack = ratelimit_tests::verifier::stack_report(
        ratelimit_user::EBPF_OBJECT,
        ratelimit_common::PROGRAM_NAME,
    )
    .map(|r| (r.combined, r.chain_text()));
    let _ = writeln!(
        report.md,
        "Verifier figures per kernel (the last `cargo xtask vm --all --record`, in `tests/kernels.txt`), and this machine's now:\n\n| kernel | instructions processed | combined stack (32-byte frames) |\n|---|---:|---:|"
    );
    match &recorded {
        Ok(rows) => {
            for f in rows {
                let _ = writeln!(
                    report.md,
                    "| {} | {} | {} B |",
                    f.release, f.instructions, f.stack
                );
            }
        }
        Err(e) => {
            let _ = writeln!(report.md, "| ({path}: {e}) | | |");
        }
    }
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let _ = writeln!(
        report.md,
        "| this machine, now: {} | {} | {} |\n",
        release.trim(),
        host.map_or("?".into(), |n| n.to_string()),
        stack
            .as_ref()
            .map_or_else(|e| e.clone(), |(b, chain)| format!("{b} B ({chain})"))
    );
}
