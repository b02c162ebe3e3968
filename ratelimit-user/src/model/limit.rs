//! A limit: its algorithm and parameters, its rate and burst, the levels it
//! keys, its new-source budget and shared aggregate; and the global settings
//! (clock, mode) a rule set carries. Every value is checked here before any
//! map is touched.

use std::fmt;

use ratelimit_common::{
    self as common, AlgoParams, algorithm, fixed_window, gcra, interval, rolling_quota,
    sliding_log, sliding_window,
};

use crate::{
    error::{Error, Result},
    model::rate::{Rate, Unit},
};

/// The rate of GCRA parameters, exactly: `TICKS_PER_NS` tokens per `interval`
/// ns is one token per `interval` ticks, which `gcra::Params::from_rate` turns
/// back into the same interval.
pub(super) fn rate_of(p: &gcra::Params, unit: Unit) -> Rate {
    if p.is_deny_all() {
        return Rate {
            tokens: 0,
            period_ns: 1_000_000_000,
            unit,
        };
    }
    Rate {
        tokens: common::TICKS_PER_NS,
        period_ns: p.interval,
        unit,
    }
}

/// The algorithm of a limit, with the parameters that are not `rate`/`burst`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Algo {
    /// Token bucket with greedy refill (GCRA): `rate` and `burst`.
    #[default]
    Gcra,
    /// Token bucket with interval refill.
    Interval {
        /// Refill period, ns.
        every_ns: u64,
        /// Tokens per refill.
        amount: u64,
        /// Bucket size.
        capacity: u64,
    },
    /// Fixed window counter.
    FixedWindow {
        /// Window, ns.
        window_ns: u64,
        /// Packets per window.
        limit: u64,
    },
    /// Sliding window log.
    SlidingLog {
        /// Window, ns.
        window_ns: u64,
        /// Packets per window (at most 64).
        limit: u64,
    },
    /// Sliding window counter.
    SlidingWindow {
        /// Window, ns.
        window_ns: u64,
        /// Packets per window.
        limit: u64,
    },
    /// Rolling-window quota with a rate cap.
    RollingQuota {
        /// Window, ns.
        window_ns: u64,
        /// Period, ns.
        period_ns: u64,
        /// Packets per window.
        quota: u64,
        /// Packets per period.
        rate_cap: u64,
    },
}

impl Algo {
    /// The name used by `--algorithm` and the config file.
    pub const fn name(&self) -> &'static str {
        match self {
            Algo::Gcra => "gcra",
            Algo::Interval { .. } => "token-bucket-interval",
            Algo::FixedWindow { .. } => "fixed-window",
            Algo::SlidingLog { .. } => "sliding-log",
            Algo::SlidingWindow { .. } => "sliding-window",
            Algo::RollingQuota { .. } => "rolling-quota",
        }
    }

    /// Every name, for error messages.
    pub const NAMES: &'static str =
        "gcra, token-bucket-interval, fixed-window, sliding-log, sliding-window or rolling-quota";

    /// The kernel's algorithm code and parameters (not for GCRA).
    pub(super) fn kernel(&self) -> std::result::Result<(u8, AlgoParams), common::ParamError> {
        Ok(match *self {
            Algo::Gcra => unreachable!("GCRA parameters come from rate and burst"),
            Algo::Interval {
                every_ns,
                amount,
                capacity,
            } => (
                algorithm::INTERVAL,
                AlgoParams::from_interval(interval::Params::new(every_ns, amount, capacity)?),
            ),
            Algo::FixedWindow { window_ns, limit } => (
                algorithm::FIXED_WINDOW,
                AlgoParams::from_fixed_window(fixed_window::Params::new(window_ns, limit)?),
            ),
            Algo::SlidingLog { window_ns, limit } => (
                algorithm::SLIDING_LOG,
                AlgoParams::from_sliding_log(sliding_log::Params::new(window_ns, limit)?),
            ),
            Algo::SlidingWindow { window_ns, limit } => (
                algorithm::SLIDING_WINDOW,
                AlgoParams::from_sliding_window(sliding_window::Params::new(window_ns, limit)?),
            ),
            Algo::RollingQuota {
                window_ns,
                period_ns,
                quota,
                rate_cap,
            } => (
                algorithm::ROLLING_QUOTA,
                AlgoParams::from_rolling_quota(rolling_quota::Params::new(
                    window_ns, period_ns, quota, rate_cap,
                )?),
            ),
        })
    }
}

/// Formats ns as the shortest exact duration: `1h`, `1500ms`, `7ns`.
pub fn fmt_duration(ns: u64) -> String {
    for (unit, size) in [
        ("d", 86_400_000_000_000u64),
        ("h", 3_600_000_000_000),
        ("min", 60_000_000_000),
        ("s", 1_000_000_000),
        ("ms", 1_000_000),
        ("us", 1_000),
    ] {
        if ns >= size && ns.is_multiple_of(size) {
            return format!("{}{unit}", ns / size);
        }
    }
    format!("{ns}ns")
}

/// A bucket a rule's sources share: its new-source budget or its aggregate
/// level (a token bucket, GCRA in the kernel).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Shared {
    /// The sustained rate.
    pub rate: Rate,
    /// The bucket's capacity, in the rate's unit.
    pub burst: u64,
}

impl Shared {
    /// A bucket of `rate` with one second's worth of burst.
    pub fn of(rate: Rate) -> Self {
        Self {
            rate,
            burst: rate.default_burst(),
        }
    }

    /// The kernel's parameters; `field` names the option for errors.
    pub fn params(&self, field: &str) -> Result<gcra::Params> {
        gcra::Params::from_rate(self.rate.tokens, self.rate.period_ns, self.burst).map_err(|e| {
            Error::invalid(
                field,
                format!("rate {} with burst {}: {e}", self.rate, self.burst),
            )
        })
    }
}

impl fmt::Display for Shared {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.rate)?;
        if self.burst != self.rate.default_burst() {
            write!(f, " burst {}", self.burst)?;
            if self.rate.unit == Unit::Bytes {
                f.write_str(" bytes")?;
            }
        }
        Ok(())
    }
}

/// The default budget for frames from sources that have no state yet, per rule:
/// 10 000 frames/s with a burst of 10 000. A server rarely meets more than a few
/// hundred new client addresses per second, and each spends one or two frames
/// here before it has a bucket of its own; a spoofed flood gets no more than this.
pub fn default_new_sources() -> NewSources {
    NewSources::Budget(Shared::of(Rate {
        tokens: 10_000,
        period_ns: 1_000_000_000,
        unit: Unit::Packets,
    }))
}

/// The default reserve of an aggregate of `burst` units: half of it, what
/// only sources established before an episode of pressure may take (see
/// [`common::RuleState`]).
pub fn default_aggregate_reserve(burst: u64) -> u64 {
    burst / 2
}

/// The default cap on states created per second, all rules together: 100 000
/// (with a burst as large). Each costs an insert (about 0.5 µs) and, once the
/// state map is full, an eviction: the cap bounds what sources that each repeat
/// can cost, to about 5 % of one CPU.
pub fn default_new_states() -> Shared {
    Shared::of(Rate {
        tokens: 100_000,
        period_ns: 1_000_000_000,
        unit: Unit::Packets,
    })
}

/// What frames from sources without state may pass.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NewSources {
    /// At most this budget, all such sources of the rule together (packets).
    Budget(Shared),
    /// No budget: they pass (still counted as `new_source`).
    Unlimited,
}

impl fmt::Display for NewSources {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NewSources::Budget(b) => b.fmt(f),
            NewSources::Unlimited => f.write_str("unlimited"),
        }
    }
}

/// Which clock the program decides on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Clock {
    /// `bpf_ktime_get_ns` (the default).
    #[default]
    Precise,
    /// `bpf_ktime_get_coarse_ns`, the last tick's time (`--clock`'s help in
    /// `cli::values` says what it costs in exactness).
    Coarse,
}

impl Clock {
    /// The name used by `--clock` and the config file.
    pub const fn name(self) -> &'static str {
        match self {
            Clock::Precise => "precise",
            Clock::Coarse => "coarse",
        }
    }
}

/// The scheduler tick, ns: the resolution of `CLOCK_MONOTONIC_COARSE`, the
/// clock of `bpf_ktime_get_coarse_ns`.
pub fn tick_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid out pointer.
    if unsafe { libc::clock_getres(libc::CLOCK_MONOTONIC_COARSE, &mut ts) } != 0 {
        return 10_000_000;
    }
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// A validated limit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limit {
    /// The sustained rate (GCRA).
    pub rate: Rate,
    /// The bucket's capacity, in the rate's unit (GCRA).
    pub burst: u64,
    /// The algorithm; for all but GCRA, the parameters live here and the cost
    /// is one per packet.
    pub algo: Algo,
    /// Bits of an IPv4 source that make one key (32: per address).
    pub per_v4: u8,
    /// Bits of an IPv6 source that make one key (64: per /64).
    pub per_v6: u8,
    /// Count would-drops instead of dropping.
    pub dry_run: bool,
    /// The budget for frames from the rule's sources that have no state yet.
    pub new_sources: NewSources,
    /// The aggregate level: all the rule's sources together.
    pub aggregate: Option<Shared>,
    /// The aggregate's reserve for established sources, in its units
    /// (`None`: half its burst; 0: one bucket shared alike). See
    /// [`common::RuleState`] on established and young sources.
    pub aggregate_reserve: Option<u64>,
    /// Held across the fleet (gcra): every daemon run with `--fleet` keeps
    /// each key's bucket in step with what the fleet admitted
    /// ([`crate::fleet`]). The aggregate level stays per host.
    pub fleet: bool,
    /// What the limit does to frames of the host's own connections.
    pub host_connections: HostConnections,
    /// Key levels beyond the rule's own (gcra buckets per key of their own
    /// prefix length), in order; those in use first.
    pub levels: [Option<KeyLevel>; common::MAX_KEY_LEVELS - 1],
}

/// One more key level of a limit: a token bucket (gcra) per key of its own
/// prefix length, e.g. 1000/s per /24 beside the rule's 100/s per /32. A
/// frame passes only if every level admits it; one a level refuses consumes
/// nothing at the others. Held per host (not across a fleet).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KeyLevel {
    /// The bucket of each key.
    pub bucket: Shared,
    /// Bits of an IPv4 source that make one key.
    pub per_v4: u8,
    /// Bits of an IPv6 source that make one key.
    pub per_v6: u8,
}

impl KeyLevel {
    /// The kernel's value; `field` names the level for errors.
    pub(super) fn to_kernel(self, field: &str) -> Result<common::KeyLevel> {
        let mut flags = common::level_flags::ON;
        if self.bucket.rate.unit == Unit::Bytes {
            flags |= common::level_flags::BYTES;
        }
        Ok(common::KeyLevel {
            params: self.bucket.params(field)?,
            key_prefix_v4: self.per_v4,
            key_prefix_v6: self.per_v6,
            flags,
            ..Default::default()
        })
    }

    /// The level a kernel value holds, if it is in use.
    pub(super) fn from_kernel(l: &common::KeyLevel) -> Option<Self> {
        let unit = if l.flags & common::level_flags::BYTES != 0 {
            Unit::Bytes
        } else {
            Unit::Packets
        };
        l.is_on().then(|| KeyLevel {
            bucket: Shared {
                rate: rate_of(&l.params, unit),
                burst: l.params.capacity.max(1),
            },
            per_v4: l.key_prefix_v4,
            per_v6: l.key_prefix_v6,
        })
    }
}

/// What a limit does to frames that belong to the host's own connections: an
/// established TCP connection or a connected UDP socket whose local port is
/// in the ephemeral range (`net.ipv4.ip_local_port_range`), as the kernel's
/// socket lookup finds them (replies to the host's downloads, its DNS
/// queries, its API calls).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum HostConnections {
    /// Never dropped by the limit (the default; `cli::values` says how).
    #[default]
    Pass,
    /// Limited like every other frame.
    Limit,
}

/// Normal, or allowlist-only: everything not under an `allow` rule dropped.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Mode {
    /// Every rule does what it says.
    #[default]
    Normal,
    /// Only sources under an `allow` rule pass.
    AllowlistOnly,
}

impl Mode {
    /// The name used by `ratelimit mode` and the config file.
    pub const fn name(self) -> &'static str {
        match self {
            Mode::Normal => "normal",
            Mode::AllowlistOnly => "allowlist-only",
        }
    }

    /// A kernel rule as this mode has it.
    pub const fn rule(self, rule: common::Rule) -> common::Rule {
        match self {
            Mode::Normal => rule.in_normal_mode(),
            Mode::AllowlistOnly => rule.in_allowlist_only_mode(),
        }
    }
}

/// Default bits of an IPv4 source that make one key.
pub const DEFAULT_PER_V4: u8 = 32;
/// Default bits of an IPv6 source that make one key: one host owns a /64.
pub const DEFAULT_PER_V6: u8 = 64;

impl Limit {
    /// Checks the limit and builds the kernel's parameters. `field` names where
    /// the limit came from, for errors.
    pub fn params(&self, field: &str) -> Result<gcra::Params> {
        if self.per_v4 > 32 {
            return Err(Error::invalid(
                format!("{field}.per-v4"),
                format!(
                    "an IPv4 key prefix is 0 to 32 bits (32: each address), not {}",
                    self.per_v4
                ),
            ));
        }
        if self.per_v6 > 128 {
            return Err(Error::invalid(
                format!("{field}.per-v6"),
                format!(
                    "an IPv6 key prefix is 0 to 128 bits (64: each /64), not {}",
                    self.per_v6
                ),
            ));
        }
        if let NewSources::Budget(b) = &self.new_sources {
            if b.rate.unit != Unit::Packets {
                return Err(Error::invalid(
                    field,
                    format!(
                        "new sources: {} is a byte rate; the new-source budget counts frames: give a rate like 10k/s",
                        b.rate
                    ),
                ));
            }
            b.params(&format!("{field} new sources"))?;
        }
        if let Some(a) = &self.aggregate {
            a.params(&format!("{field} aggregate"))?;
        }
        match (&self.aggregate, self.aggregate_reserve) {
            (None, Some(_)) => {
                return Err(Error::invalid(
                    format!("{field}.aggregate-reserve"),
                    "a reserve is part of an aggregate: give the aggregate too, like aggregate = \"100k/s\"",
                ));
            }
            (Some(a), Some(r)) if r >= a.burst => {
                return Err(Error::invalid(
                    format!("{field}.aggregate-reserve"),
                    format!(
                        "{r} is not below the aggregate's burst of {}: new sources would never be admitted; give a count below it, a share like \"50%\", or 0 for one bucket shared alike",
                        a.burst
                    ),
                ));
            }
            _ => {}
        }
        if self.algo != Algo::Gcra {
            return Ok(gcra::Params::DENY_ALL);
        }
        gcra::Params::from_rate(self.rate.tokens, self.rate.period_ns, self.burst).map_err(|e| {
            Error::invalid(
                field,
                format!("rate {} with burst {}: {e}", self.rate, self.burst),
            )
        })
    }
}

impl fmt::Display for Limit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.write(f, None)
    }
}

/// The key prefixes of a limit as people read them: `/24` for a rule of one
/// family (`family_v4`), both for the default rule.
fn fmt_per(per_v4: u8, per_v6: u8, family_v4: Option<bool>) -> String {
    match family_v4 {
        Some(true) => format!("/{per_v4}"),
        Some(false) => format!("/{per_v6}"),
        None => format!("/{per_v4} (IPv4) /{per_v6} (IPv6)"),
    }
}

impl Limit {
    /// The limit in words, with the key prefixes of `family_v4` only (both
    /// for the default rule, `None`).
    pub fn text(&self, family_v4: Option<bool>) -> String {
        struct Text<'a>(&'a Limit, Option<bool>);
        impl fmt::Display for Text<'_> {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                self.0.write(f, self.1)
            }
        }
        Text(self, family_v4).to_string()
    }

    fn write(&self, f: &mut fmt::Formatter<'_>, family_v4: Option<bool>) -> fmt::Result {
        let unit = match self.rate.unit {
            Unit::Packets => "",
            Unit::Bytes => " bytes",
        };
        let d = fmt_duration;
        match self.algo {
            Algo::Gcra => write!(f, "limit {} burst {}{unit}", self.rate, self.burst)?,
            Algo::Interval {
                every_ns,
                amount,
                capacity,
            } => write!(
                f,
                "token-bucket-interval +{amount} every {} capacity {capacity}",
                d(every_ns)
            )?,
            Algo::FixedWindow { window_ns, limit } => {
                write!(f, "fixed-window {limit} per {}", d(window_ns))?
            }
            Algo::SlidingLog { window_ns, limit } => {
                write!(f, "sliding-log {limit} per {}", d(window_ns))?
            }
            Algo::SlidingWindow { window_ns, limit } => {
                write!(f, "sliding-window {limit} per {}", d(window_ns))?
            }
            Algo::RollingQuota {
                window_ns,
                period_ns,
                quota,
                rate_cap,
            } => write!(
                f,
                "rolling-quota {quota} per {} at most {rate_cap} per {}",
                d(window_ns),
                d(period_ns)
            )?,
        }
        write!(f, " per {}", fmt_per(self.per_v4, self.per_v6, family_v4))?;
        for (n, l) in self.levels.iter().flatten().enumerate() {
            write!(
                f,
                ", level {} {} burst {}{unit} per {}",
                n + 2,
                l.bucket.rate,
                l.bucket.burst,
                fmt_per(l.per_v4, l.per_v6, family_v4)
            )?;
        }
        if let Some(a) = &self.aggregate {
            write!(f, ", aggregate {a}")?;
            if let Some(r) = self.aggregate_reserve {
                write!(f, " reserve {r}")?;
            }
        }
        if self.fleet {
            f.write_str(", fleet-wide")?;
        }
        if self.host_connections == HostConnections::Limit {
            f.write_str(", host connections limited")?;
        }
        if self.new_sources != default_new_sources() {
            write!(f, ", new sources {}", self.new_sources)?;
        }
        if self.dry_run {
            f.write_str(" [dry run]")?;
        }
        Ok(())
    }
}
