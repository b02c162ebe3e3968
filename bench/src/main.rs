//! `cargo xtask bench`: measurements, not tests. Prints tables and writes
//! `bench/results.md` and `bench/results.json`. Every figure is a median over
//! repeated runs with its min–max, beside the floor measured in the same run, so
//! ratios hold across machines.
//!
//! One module per measurement: [`cost`] (BPF_PROG_TEST_RUN), [`droplog`]
//! (what the drop log costs a dropped frame), [`floods`] (drop
//! throughput and floods on a veth, against netfilter), [`accuracy`],
//! [`memory`], [`set`] (from a command to enforcement), [`serve`] (the
//! throttling service's latency), [`serve_load`] (its throughput beside raw
//! EVALSHA, and its cost beside the [`minimal`] services) and [`fleet`] (what fleet-wide keys cost Redis); [`report`]
//! writes the results.

mod accuracy;
mod cost;
mod droplog;
mod fleet;
mod floods;
mod memory;
mod minimal;
mod report;
mod serve;
mod serve_load;
mod set;

use std::{net::IpAddr, path::PathBuf};

use ratelimit_tests::{
    frames::Udp,
    net::NetNs,
    testrun::{pin_to_cpu, unpin},
};
use ratelimit_user::{
    model::rate::parse_rate,
    model::rules::{Action, Limit, RuleSet, default_limit},
};
use report::Report;

/// The sections, in the order they run.
const SECTIONS: [&str; 8] = [
    "cost", "droplog", "floods", "accuracy", "memory", "set", "serve", "fleet",
];

/// What the run was asked to do.
pub struct Opts {
    /// Short runs, for a smoke check.
    pub quick: bool,
    out: PathBuf,
    /// Run one section only (cost, droplog, floods, accuracy, memory, set, serve, fleet).
    only: Option<String>,
}

impl Opts {
    fn runs(&self, section: &str) -> bool {
        self.only.as_deref().is_none_or(|o| o == section)
    }
}

fn main() {
    let mut opts = Opts {
        quick: false,
        out: PathBuf::from("bench"),
        only: None,
    };
    // The minimal services the throttling service is measured beside: a
    // process of their own, started by `serve_load`.
    let argv: Vec<String> = std::env::args().collect();
    if argv.get(1).map(String::as_str) == Some("--minimal-server") {
        let kind = argv.get(2).expect("--minimal-server KIND PORT [REDIS_URL]");
        let port = argv
            .get(3)
            .and_then(|p| p.parse().ok())
            .expect("--minimal-server KIND PORT [REDIS_URL]");
        minimal::run(kind, port, argv.get(4).map(String::as_str));
        return;
    }
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--quick" => opts.quick = true,
            "--out" => opts.out = PathBuf::from(args.next().expect("--out DIR")),
            "--only" => {
                let section = args.next().expect("--only SECTION");
                assert!(
                    SECTIONS.contains(&section.as_str()),
                    "--only {section:?}: expected one of {}",
                    SECTIONS.join(", ")
                );
                opts.only = Some(section);
            }
            other => panic!(
                "unknown argument {other:?}; expected --quick, --out DIR or --only cost|droplog|floods|accuracy|memory|set|serve|fleet"
            ),
        }
    }
    // SAFETY: no preconditions.
    let euid = unsafe { libc::geteuid() };
    assert!(euid == 0, "the benchmarks need root (BPF, namespaces)");
    let mut report = Report::default();
    report.machine();
    // One CPU for the cost measurements; the traffic sections start threads of
    // their own.
    if opts.runs("cost") {
        pin_to_cpu(0);
        cost::cost_per_packet(&opts, &mut report);
        unpin();
    }
    if opts.runs("droplog") {
        pin_to_cpu(0);
        droplog::drop_log_cost(&opts, &mut report);
        unpin();
    }
    if opts.runs("floods") {
        floods::floods(&opts, &mut report);
    }
    if opts.runs("accuracy") {
        accuracy::accuracy(&opts, &mut report);
    }
    if opts.runs("memory") {
        memory::memory_and_scale(&opts, &mut report);
    }
    if opts.runs("set") {
        set::set_to_enforced(&opts, &mut report);
        set::change_under_a_large_list(&opts, &mut report);
    }
    if opts.runs("serve") {
        serve::serve_latency(&opts, &mut report);
        serve_load::serve_load(&opts, &mut report);
    }
    if opts.runs("fleet") {
        fleet::fleet(&opts, &mut report);
    }
    report.write(&opts.out);
}

/// Median, min and max.
pub fn stats(mut v: Vec<f64>) -> (f64, f64, f64) {
    v.sort_by(f64::total_cmp);
    (v[v.len() / 2], v[0], v[v.len() - 1])
}

/// The address `s`.
pub fn ip(s: &str) -> IpAddr {
    s.parse().expect("address")
}

/// A UDP frame from `src` to the receiver.
pub fn v4(src: &str) -> Vec<u8> {
    Udp::new(ip(src), ip("198.18.0.2")).build()
}

/// The default limit with `rate` and `burst`.
pub fn limit(rate: &str, burst: u64) -> Limit {
    Limit {
        rate: parse_rate("rate", rate).expect("rate"),
        burst,
        ..default_limit()
    }
}

/// A rule set of the default rule `l` alone.
pub fn rules(l: Limit) -> RuleSet {
    RuleSet {
        default: Action::Limit(l),
        ..RuleSet::default()
    }
}

/// "met" or "missed".
pub fn met(ok: bool) -> &'static str {
    if ok { "met" } else { "missed" }
}

/// Runs `f` on a thread inside `ns`.
pub fn in_ns<T: Send>(ns: &NetNs, f: impl FnOnce() -> T + Send) -> T {
    std::thread::scope(|s| {
        s.spawn(move || {
            ns.enter();
            f()
        })
        .join()
        .expect("thread in a namespace")
    })
}

/// `sh -c CMD` in `ns`: its output; panics if it fails.
pub fn sh(ns: &NetNs, cmd: &str) -> String {
    let out = ns.command("sh").arg("-c").arg(cmd).output().expect("sh");
    assert!(
        out.status.success(),
        "`{cmd}` failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}
