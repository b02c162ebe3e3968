//! Floods on a veth, against the real floor. A generator (an XDP program run
//! with BPF_PROG_RUN in live-frames mode, XDP_TX out of its veth) floods from
//! CPU 0; the receiving veth's NAPI runs threaded, pinned to CPU 1, so the
//! generator never steals the receiver's CPU. The headline is the receiving
//! CPU's time per frame (the NAPI thread's time on CPU ÷ frames it took in),
//! for the floor (XDP_DROP), ratelimit, nftables and iptables with the same
//! limits, in the same run.
//!
//! Limits, everywhere: 100 packets/s with a burst of 100 per source (IPv4
//! address, IPv6 /64), and 20 000 packets/s for all sources of the default
//! rule together, the established sources of the last case included.
//!
//! Each row also gives the frames the generator offered beside those the
//! receiver handled, and the receiving CPU's busy share: a floor is a floor
//! only when the generator saturates the receiver. And the program's own time
//! per run, from the kernel's BPF statistics (`kernel.bpf_stats_enabled`),
//! less what the statistics cost themselves (the XDP_DROP floor's figure:
//! its body is a few instructions).
//!
//! One file per measurement: [`sweep`] (the generator's configurations
//! against the floor), [`rows`] (each flood against each receiver, the table
//! and its targets), [`profile`] (where the receiving CPU's time goes) and
//! [`established`](mod@established) (established sources during the floods); [`receivers`]
//! sets up what receives a flood and counts what it took in.

mod established;
mod profile;
mod receivers;
mod rows;
mod sweep;

use std::collections::HashMap;

use ratelimit_tests::{generator::Generator, net::Pair};

use self::{
    established::established,
    profile::write_profiles,
    receivers::{Receiver_, ensure_netfilter_tools},
    rows::write_rows,
    sweep::generator_sweep,
};
use crate::{Opts, ip, report::Report};

/// The per-source limit of every receiver.
const RATE: u64 = 100;
/// Its burst.
const BURST: u64 = 100;
/// The default rule's aggregate: what the server takes from the unknown
/// internet at large.
const AGGREGATE: u64 = 20_000;
/// UDP port of the generator's frames.
const FLOOD_PORT: u16 = 7000;

/// A flood.
#[derive(Clone, Copy)]
struct Flood {
    name: &'static str,
    /// IPv6 sources (the /64 from the generator's counter), else IPv4.
    v6: bool,
    /// The generator's source mask: sources − 1.
    mask: u64,
}

const ONE: Flood = Flood {
    name: "(a) one source at >100x its limit",
    v6: false,
    mask: 0,
};
const CYCLING: Flood = Flood {
    name: "(b) 1 M sources cycling",
    v6: true,
    mask: (1 << 20) - 1,
};
/// 2^32 sources: at the generator's ~14 Mpps, five minutes before the first
/// repeats.
const SPOOFED: Flood = Flood {
    name: "(c) 4 G spoofed IPv6 sources, none repeats",
    v6: true,
    mask: (1 << 32) - 1,
};
/// IPv4 cannot spoof without repeats inside 198.18.0.0/15: its 131 072
/// addresses cycle, each every ~10 ms at the generator's rate.
const SPOOFED_V4: Flood = Flood {
    name: "(c4) all 131 072 IPv4 sources of 198.18.0.0/15 cycling",
    v6: false,
    mask: (1 << 17) - 1,
};

fn flood_frame(pair: &Pair, flood: Flood) -> Vec<u8> {
    if flood.v6 {
        pair.udp(ip("2001:db8::1"), FLOOD_PORT).build()
    } else {
        pair.udp(ip("198.18.0.1"), FLOOD_PORT).build()
    }
}

pub(crate) fn floods(opts: &Opts, report: &mut Report) {
    let secs: f64 = if opts.quick { 1.0 } else { 3.0 };
    let rounds = if opts.quick { 1 } else { 3 };
    report.section(
        "Floods on a veth",
        &format!(
            "A generator (an XDP program run with BPF_PROG_RUN in live-frames mode, {} frames a call in batches of 256, XDP_TX out of its veth, \
             the source rewritten in the generator program) floods from CPU 0 for {secs} s a round, median of {rounds} rounds; the receiving veth's \
             NAPI is threaded and pinned to CPU 1. *Offered*: the generator's frames per second; *handled*: the frames the receiver took in \
             (its own counters; for netfilter, the veth's); *busy*: the NAPI thread's time on CPU ÷ the round's time. \
             Receiving CPU per frame = the NAPI thread's time on CPU ÷ the frames handled: the headline, as a ratio to the XDP_DROP floor of the same flood. \
             *Program ns/run*: the kernel's BPF statistics (run time ÷ runs) in one more round with them on (they read the clock twice a run, which costs the receiving CPU much on a VM, so the other figures are taken with them off), less the XDP_DROP floor's own figure, which is what those two clock reads cost. \
             Limits everywhere: {RATE}/s burst {BURST} per source (IPv4 address, IPv6 /64) and {AGGREGATE}/s for all sources of the default rule together \
             (ratelimit: its reserve at the default, half the burst); ratelimit also has its defaults: a new-source budget of 10 000/s per rule and a cap of 100 000 new states/s.",
            ratelimit_tests::generator::FRAMES_PER_CALL
        ),
    );
    let netfilter = ensure_netfilter_tools();
    let mut generator = Generator::new();
    let cheapest = generator_sweep(opts, report, &mut generator);
    let (rows, profiles) = rows::measure(opts, &mut generator, &netfilter, secs, rounds);
    write_rows(report, &rows, &netfilter, cheapest);
    write_profiles(report, &profiles);
    let floors: HashMap<&str, f64> = rows
        .iter()
        .filter(|r| r.receiver == Receiver_::Floor.name())
        .map(|r| (r.flood, r.cpu_ns))
        .collect();
    let native = Receiver_::Ratelimit {
        generic: false,
        coarse: false,
    }
    .name();
    let capacity: HashMap<&str, (f64, f64)> = rows
        .iter()
        .filter(|r| r.receiver == native)
        .map(|r| (r.flood, (r.offered, r.fps.0)))
        .collect();
    established(opts, report, &mut generator, &floors, &capacity);
    generator.set_pace(1);
}
