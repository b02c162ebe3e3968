//! The drop log: dropped frames (and dry run's would-drops) sampled by the
//! program into a ring buffer for `ratelimit log`, at most a rate of records
//! per second per CPU, the rest counted and never written.
//!
//! The program writes [`DropRecord`]s into [`MAP_DROP_LOG`] and keeps its
//! budget and counts per CPU in [`MAP_DROP_LOG_BUDGET`] ([`DropLogBudget`],
//! decided by [`admit`]); the daemon reads both. The rate is
//! [`Config::drop_log_rate`](crate::Config::drop_log_rate), written by the
//! daemon; 0 turns the log off (the program then pays one compare per drop).

use super::{Addr, Words, addr_of};

/// `RingBuf` of [`DROP_LOG_BYTES`]: [`DropRecord`]s, one per sampled drop.
/// Written by the program, read (consumed) by the daemon alone.
pub const MAP_DROP_LOG: &str = "RL_DROP_LOG";
/// `PerCpuArray<DropLogBudget>` of one entry: each CPU's budget of records
/// and its counts. Written by the program; read by the daemon.
pub const MAP_DROP_LOG_BUDGET: &str = "RL_DROP_LOG_BUDGET";

/// Bytes of [`MAP_DROP_LOG`] (a power of two, a multiple of the page): room
/// for 4 681 records of 56 bytes (the record and the ring's 8-byte header),
/// over 10 s of the default rate on 4 CPUs while the daemon does not read.
pub const DROP_LOG_BYTES: u32 = 256 << 10;

/// The budget's period, ns: [`Config::drop_log_rate`](crate::Config::drop_log_rate)
/// records per CPU in each, spaced (see [`admit`]).
pub const DROP_LOG_WINDOW_NS: u64 = 1_000_000_000;

/// Records a CPU may write at once, as a share of its rate: a tenth of a
/// second's worth (at least one); past it, one every 1/rate s.
pub const DROP_LOG_BURST_DIVISOR: u32 = 10;

/// The most records per second per CPU a daemon may ask for: at 100k/s one
/// CPU fills the ring in 47 ms, faster than a daemon reads.
pub const DROP_LOG_MAX_RATE: u32 = 100_000;

/// Bits of [`DropRecord::flags`].
pub mod drop_log_flags {
    /// Dry run: the frame was passed; [`super::DropRecord::reason`] is what
    /// would have dropped it.
    pub const DRY_RUN: u8 = 1 << 0;
    /// [`super::DropRecord::proto`] was read from the frame.
    pub const PROTO: u8 = 1 << 1;
    /// [`super::DropRecord::dport`] was read from the frame (TCP, UDP).
    pub const PORT: u8 = 1 << 2;
}

/// One record of [`MAP_DROP_LOG`]: a dropped frame. Written by the program,
/// decoded by the daemon.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct DropRecord {
    /// When, ns of CLOCK_MONOTONIC (`bpf_ktime_get_ns`).
    pub time_ns: u64,
    /// The source address as the IP header has it, network order (IPv4
    /// mapped, `::ffff:a.b.c.d`); zero when the frame showed none.
    pub source: Words,
    /// The judging rule's [`Rule::id`](crate::Rule::id), or
    /// [`NO_RULE`](crate::NO_RULE) when no rule of the table judged it.
    pub rule_id: u32,
    /// The judging rule's [`Rule::slot`](crate::Rule::slot) (its name, with
    /// its id, for the daemon), or [`NO_RULE`](crate::NO_RULE).
    pub rule_slot: u32,
    /// The frame's length from the Ethernet header on, bytes.
    pub len: u32,
    /// The destination port, host order, when [`drop_log_flags::PORT`]; else 0.
    pub dport: u16,
    /// The transport protocol (IANA number) when [`drop_log_flags::PROTO`]; else 0.
    pub proto: u8,
    /// The [`Reason`](crate::Reason) that dropped it (or would have, under dry run).
    pub reason: u8,
    /// [`family`](crate::family) of the IP header (IPv6 for an IPv4-mapped
    /// source), 0 without one.
    pub family: u8,
    /// Bits of [`drop_log_flags`].
    pub flags: u8,
    /// Zero.
    pub _pad: [u8; 6],
}
const _: () = assert!(core::mem::size_of::<DropRecord>() == 48);

impl DropRecord {
    /// The source's 16 bytes.
    pub const fn source_addr(&self) -> Addr {
        addr_of(&self.source)
    }

    /// The record in `bytes` (as the ring hands it over), or `None` if
    /// they are not one.
    pub fn decode(bytes: &[u8]) -> Option<Self> {
        if bytes.len() != core::mem::size_of::<Self>() {
            return None;
        }
        // SAFETY: the length is checked; every bit pattern is a valid
        // `DropRecord` (plain integers); the read is unaligned.
        Some(unsafe { core::ptr::read_unaligned(bytes.as_ptr().cast::<Self>()) })
    }
}

/// Value of [`MAP_DROP_LOG_BUDGET`]: one CPU's budget of records and its
/// counts since the maps were created.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct DropLogBudget {
    /// When the budget is next full, ns of the coarse clock (GCRA's
    /// theoretical arrival time).
    pub tat: u64,
    /// The tick (jiffies) of the last refusal by [`admit_in_tick`]: the
    /// coarse clock moves only with the tick, so until it does every drop is
    /// refused again without reading the clock. 0: none yet.
    pub refused_tick: u64,
    /// Records written (cumulative).
    pub written: u64,
    /// Drops not logged: over the budget (cumulative).
    pub skipped: u64,
    /// Drops within the budget whose record found the ring full: the daemon
    /// is not reading (cumulative).
    pub lost: u64,
}
const _: () = assert!(core::mem::size_of::<DropLogBudget>() == 40);

/// Whether one more record fits `b`'s budget of `rate` records per
/// [`DROP_LOG_WINDOW_NS`] at `now` (ns); takes it if so. A token bucket per
/// CPU (GCRA): up to a tenth of a second's worth at once
/// ([`DROP_LOG_BURST_DIVISOR`]), then one every 1/`rate` s, so a flood's
/// records are spread over each second rather than the first drops of it.
/// Over any span T, a CPU writes at most `rate / 10` (at least 1) +
/// `rate` × T. Counts nothing: the caller counts written, skipped and lost.
#[inline(always)]
pub fn admit(b: &mut DropLogBudget, now: u64, rate: u32) -> bool {
    if rate == 0 {
        return false;
    }
    let interval = DROP_LOG_WINDOW_NS / u64::from(rate);
    let burst = u64::from((rate / DROP_LOG_BURST_DIVISOR).max(1));
    // The budget is full once `tat` is behind `now`.
    let tat = if b.tat > now { b.tat } else { now };
    if tat - now > interval * (burst - 1) {
        return false;
    }
    b.tat = tat + interval;
    true
}

/// [`admit`] on the coarse clock read by `coarse` only when the tick has
/// moved since this CPU's last refusal: a refusal holds for the rest of its
/// tick (the coarse clock is the time of the last tick, and the budget's
/// `tat` only grows on an admission), so a flood over the budget pays a
/// compare per drop instead of the clock. `tick` is jiffies.
#[inline(always)]
pub fn admit_in_tick(
    b: &mut DropLogBudget,
    tick: u64,
    coarse: impl FnOnce() -> u64,
    rate: u32,
) -> bool {
    if b.refused_tick == tick && tick != 0 {
        return false;
    }
    if admit(b, coarse(), rate) {
        return true;
    }
    b.refused_tick = tick;
    false
}

#[cfg(test)]
mod tests {
    extern crate std;
    use std::vec::Vec;

    use super::*;

    const S: u64 = DROP_LOG_WINDOW_NS;

    #[test]
    fn admits_a_tenth_of_the_rate_at_once_then_spaced() {
        let mut b = DropLogBudget::default();
        let t0 = 5 * S;
        // 100/s: 10 at once, then one every 10 ms.
        let taken = (0..1000).filter(|i| admit(&mut b, t0 + i, 100)).count();
        assert_eq!(taken, 10);
        assert!(!admit(&mut b, t0 + 9 * S / 1000, 100), "before 10 ms");
        assert!(admit(&mut b, t0 + 10 * S / 1000, 100), "at 10 ms");
        assert!(!admit(&mut b, t0 + 11 * S / 1000, 100));
        // Idle for a second: full again, 10 at once.
        let later = t0 + 2 * S;
        assert_eq!(
            (0..100).filter(|i| admit(&mut b, later + i, 100)).count(),
            10
        );
        // A rate under 10/s: one at once.
        let mut b = DropLogBudget::default();
        assert_eq!((0..100).filter(|i| admit(&mut b, t0 + i, 5)).count(), 1);
    }

    #[test]
    fn a_refusal_holds_for_its_tick_without_the_clock_and_the_next_tick_reads_it() {
        // A tick of 4 ms (HZ=250), the coarse clock the time of the last
        // tick, drops every 100 µs at 100/s for 1 s.
        let tick_ns = 4 * S / 1000;
        let t0 = 5 * S;
        let (mut b, mut reads, mut taken) = (DropLogBudget::default(), 0u32, 0u32);
        let mut plain = DropLogBudget::default();
        let mut plain_taken = 0u32;
        for i in 0..10_000u64 {
            let now = t0 + i * S / 10_000;
            let tick = 1000 + now / tick_ns;
            let coarse = (now / tick_ns) * tick_ns;
            let clock = || {
                reads += 1;
                coarse
            };
            taken += u32::from(admit_in_tick(&mut b, tick, clock, 100));
            plain_taken += u32::from(admit(&mut plain, coarse, 100));
        }
        // What the budget takes is what it takes reading the clock each time.
        assert_eq!(taken, plain_taken);
        assert_eq!(
            taken,
            10 + 99,
            "a tenth of the rate at once, then one each 10 ms"
        );
        // The clock is read once a tick (250 in 1 s), and once more for each
        // admission; not once a drop (10 000).
        assert!(reads <= 250 + taken + 1, "{reads} reads of the clock");
        assert!(reads >= 250, "{reads} reads: each tick reads it again");
    }

    #[test]
    fn zero_rate_admits_nothing() {
        let mut b = DropLogBudget::default();
        assert!((0..10).all(|i| !admit(&mut b, 10 * S + i * S, 0)));
    }

    #[test]
    fn bound_over_any_span_and_spread_over_each_second() {
        // One drop every 10 µs for 10 s at 50/s: at most 5 + 50 × 10.
        let mut b = DropLogBudget::default();
        let rate = 50;
        let mut times = Vec::new();
        let start = 3 * S + 123;
        let mut t = start;
        while t < start + 10 * S {
            if admit(&mut b, t, rate) {
                times.push(t);
            }
            t += 10_000;
        }
        assert!(times.len() <= 5 + 50 * 10, "{} records", times.len());
        assert!(times.len() >= 50 * 10, "{} records", times.len());
        // Any one-second span holds at most the burst and a second's worth.
        for (i, &a) in times.iter().enumerate() {
            let n = times[i..].iter().take_while(|&&x| x < a + S).count();
            assert!(n <= 5 + rate as usize, "{n} records within 1 s of {a}");
        }
        // Spread: past the first burst, records are 20 ms apart.
        for w in times[5..].windows(2) {
            assert!(w[1] - w[0] >= 20 * S / 1000 - 10_000, "{w:?}");
        }
    }

    #[test]
    fn a_clock_that_starts_near_zero_is_a_full_budget() {
        let mut b = DropLogBudget::default();
        assert!(admit(&mut b, 1, 1));
        assert!(!admit(&mut b, 2, 1));
        assert!(admit(&mut b, 1 + S, 1));
    }

    #[test]
    fn record_decodes_from_its_bytes() {
        let r = DropRecord {
            time_ns: 42,
            source: super::super::words(&super::super::map_v4([198, 18, 0, 7])),
            rule_id: 3,
            rule_slot: 2,
            len: 60,
            dport: 5353,
            proto: 17,
            reason: 1,
            family: 4,
            flags: drop_log_flags::PROTO | drop_log_flags::PORT,
            _pad: [0; 6],
        };
        // SAFETY: a plain struct without padding, read as bytes.
        let bytes: [u8; 48] = unsafe { core::mem::transmute(r) };
        assert_eq!(DropRecord::decode(&bytes), Some(r));
        assert_eq!(DropRecord::decode(&bytes[..47]), None);
        assert_eq!(r.source_addr(), super::super::map_v4([198, 18, 0, 7]));
    }
}
