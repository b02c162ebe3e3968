//! The validated rule model: prefixes, actions, limits, and the whole rule set,
//! and their translation into the kernel's `Rule` values. Everything here is
//! checked before any map is touched.

use std::{collections::BTreeMap, fmt, net::IpAddr};

use ratelimit_common::{
    self as common, AlgoParams, V4_MAPPED_BITS, action, algorithm, fixed_window, gcra, interval,
    map_v4, rolling_quota, rule_flags, sliding_log, sliding_window,
};

pub use crate::matching::Selector;
use crate::{
    error::{Error, Result},
    lists::List,
    rate::{Rate, Unit},
};

/// A source prefix: an IPv4 or IPv6 network. Host bits are cleared on parsing.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Prefix {
    /// The network address.
    pub addr: IpAddr,
    /// Prefix length: 0..=32 for IPv4, 0..=128 for IPv6.
    pub len: u8,
}

/// Forms accepted for a prefix, for error messages.
pub const PREFIX_FORMS: &str = "an IPv4 or IPv6 address with an optional /length, like 198.18.0.0/15, 198.18.0.1 or 2001:db8::/32";

impl Prefix {
    /// Parses `198.18.0.0/15`, `2001:db8::/32`, or a bare address (a /32 or /128).
    pub fn parse(field: &str, s: &str) -> Result<Self> {
        let bad = |why: String| {
            Error::invalid(
                field,
                format!("invalid prefix {s:?}: {why}; expected {PREFIX_FORMS}"),
            )
        };
        let (addr, len) = match s.trim().split_once('/') {
            Some((a, l)) => (a, Some(l)),
            None => (s.trim(), None),
        };
        let addr: IpAddr = addr
            .parse()
            .map_err(|_| bad(format!("{addr:?} is not an IP address")))?;
        if let IpAddr::V6(v6) = addr
            && let Some(v4) = v6.to_ipv4_mapped()
        {
            let v4_len = len
                .and_then(|l| l.parse::<u8>().ok())
                .map_or(32, |l| l.saturating_sub(96).min(32));
            return Err(Error::invalid(
                field,
                format!(
                    "{s:?} is an IPv4-mapped IPv6 address: IPv4 sources are matched by IPv4 rules; write {v4}/{v4_len}"
                ),
            ));
        }
        let max = if addr.is_ipv4() { 32 } else { 128 };
        let len = match len {
            None => max,
            Some(l) => l
                .parse::<u8>()
                .ok()
                .filter(|&l| l <= max)
                .ok_or_else(|| bad(format!("the length must be 0 to {max}")))?,
        };
        let mut p = Self { addr, len };
        p.addr = p.network();
        Ok(p)
    }

    /// The prefix of `len` bits (at most this one's) that contains this one.
    pub fn widened(&self, len: u8) -> Self {
        let p = Self {
            addr: self.addr,
            len: len.min(self.len),
        };
        Self {
            addr: p.network(),
            ..p
        }
    }

    /// The address with host bits cleared.
    fn network(&self) -> IpAddr {
        let (mut bytes, bits) = match self.addr {
            IpAddr::V4(a) => (map_v4(a.octets()), V4_MAPPED_BITS + self.len),
            IpAddr::V6(a) => (a.octets(), self.len),
        };
        common::mask_addr(&mut bytes, bits);
        source_ip(&bytes)
    }

    /// The rule trie's key: (prefix length after the family word, family and
    /// address).
    pub fn lpm(&self) -> (u32, common::RuleAddr) {
        let (fam, addr) = match self.addr {
            IpAddr::V4(a) => (common::family::V4, map_v4(a.octets())),
            IpAddr::V6(a) => (common::family::V6, a.octets()),
        };
        (
            common::FAMILY_BITS + u32::from(self.len),
            common::rule_addr(fam, &common::words(&addr)),
        )
    }

    /// Reads a prefix back from a rule trie key.
    pub fn from_lpm(bits: u32, key: common::RuleAddr) -> Self {
        let len = bits.saturating_sub(common::FAMILY_BITS) as u8;
        if key[0].to_ne_bytes()[0] == common::family::V4 {
            Self {
                addr: IpAddr::from(key[1].to_ne_bytes()),
                len,
            }
        } else {
            let w = [key[1], key[2], key[3], key[4]];
            Self {
                addr: IpAddr::from(common::addr_of(&w)),
                len,
            }
        }
    }
}

/// A source address as the maps keep it (IPv4-mapped for IPv4), as an `IpAddr`.
pub fn source_ip(addr: &common::Addr) -> IpAddr {
    if common::is_v4_mapped(addr) {
        IpAddr::from([addr[12], addr[13], addr[14], addr[15]])
    } else {
        IpAddr::from(*addr)
    }
}

impl fmt::Display for Prefix {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.len)
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
    fn kernel(&self) -> std::result::Result<(u8, AlgoParams), common::ParamError> {
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
#[derive(
    Clone,
    Copy,
    Debug,
    PartialEq,
    Eq,
    Default,
    serde::Serialize,
    serde::Deserialize,
    clap::ValueEnum,
)]
#[serde(rename_all = "lowercase")]
pub enum Clock {
    /// `bpf_ktime_get_ns`: decisions exact to the nanosecond.
    #[default]
    Precise,
    /// The time of the last scheduler tick (`bpf_ktime_get_coarse_ns`): cheaper;
    /// over any span T a key is admitted at most burst + rate × (T + one tick).
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
    fn to_kernel(self, field: &str) -> Result<common::KeyLevel> {
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
    fn from_kernel(l: &common::KeyLevel) -> Option<Self> {
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
#[derive(
    Clone,
    Copy,
    Debug,
    PartialEq,
    Eq,
    Default,
    serde::Serialize,
    serde::Deserialize,
    clap::ValueEnum,
)]
#[serde(rename_all = "kebab-case")]
pub enum HostConnections {
    /// Never dropped by the limit (the default): they are counted against
    /// their source while it has room, and pass as `host_connection` when it
    /// has none.
    #[default]
    Pass,
    /// Limited like every other frame.
    Limit,
}

/// Normal, or allowlist-only: everything not under an `allow` rule dropped.
#[derive(
    Clone,
    Copy,
    Debug,
    PartialEq,
    Eq,
    Default,
    serde::Serialize,
    serde::Deserialize,
    clap::ValueEnum,
)]
#[serde(rename_all = "kebab-case")]
pub enum Mode {
    /// Every rule does what it says.
    #[default]
    Normal,
    /// Only sources under an `allow` rule pass; every other frame is dropped
    /// (counted `not_allowed`). For the worst minutes of an attack.
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

/// What a rule does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
// A limit is a few hundred bytes, kept by value so that an action stays `Copy`.
#[allow(clippy::large_enum_variant)]
pub enum Action {
    /// Never limited.
    Allow,
    /// Always dropped (counted as would-drop when `dry_run`).
    Deny {
        /// Count instead of dropping.
        dry_run: bool,
    },
    /// Limited.
    Limit(Limit),
}

impl fmt::Display for Action {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text(None))
    }
}

impl Action {
    /// The action in words; a limit's key prefixes those of `family_v4` only
    /// (both for the default rule, `None`).
    pub fn text(&self, family_v4: Option<bool>) -> String {
        match self {
            Action::Allow => "allow".into(),
            Action::Deny { dry_run: false } => "deny".into(),
            Action::Deny { dry_run: true } => "deny [dry run]".into(),
            Action::Limit(l) => l.text(family_v4),
        }
    }

    /// The action's name: `allow`, `deny` or `limit`.
    pub const fn name(&self) -> &'static str {
        match self {
            Action::Allow => "allow",
            Action::Deny { .. } => "deny",
            Action::Limit(_) => "limit",
        }
    }
}

/// The rate of GCRA parameters, exactly: `TICKS_PER_NS` tokens per `interval`
/// ns is one token per `interval` ticks, which `gcra::Params::from_rate` turns
/// back into the same interval.
fn rate_of(p: &gcra::Params, unit: Unit) -> Rate {
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

impl Action {
    /// The action a kernel rule value enforces: what a daemon falls back to when
    /// its own record of the rules is lost or damaged. Rates come back exact
    /// (as ticks per token), not always in the form they were written.
    pub fn from_kernel(r: &common::Rule) -> Self {
        let r = &r.in_normal_mode();
        match r.action {
            action::ALLOW => Action::Allow,
            action::DENY => Action::Deny {
                dry_run: r.flags & rule_flags::DRY_RUN != 0,
            },
            _ => {
                let p = &r.params;
                // SAFETY (of the union reads): plain integers; see AlgoParams.
                let algo = match r.algorithm {
                    algorithm::INTERVAL => {
                        let i = unsafe { p.interval };
                        Algo::Interval {
                            every_ns: i.every_ns,
                            amount: i.amount,
                            capacity: i.capacity,
                        }
                    }
                    algorithm::FIXED_WINDOW => {
                        let w = unsafe { p.fixed_window };
                        Algo::FixedWindow {
                            window_ns: w.window_ns,
                            limit: w.limit,
                        }
                    }
                    algorithm::SLIDING_LOG => {
                        let w = unsafe { p.sliding_log };
                        Algo::SlidingLog {
                            window_ns: w.window_ns,
                            limit: w.limit,
                        }
                    }
                    algorithm::SLIDING_WINDOW => {
                        let w = unsafe { p.sliding_window };
                        Algo::SlidingWindow {
                            window_ns: w.window_ns,
                            limit: w.limit,
                        }
                    }
                    algorithm::ROLLING_QUOTA => {
                        let q = unsafe { p.rolling_quota };
                        Algo::RollingQuota {
                            window_ns: q.period_ns * q.periods,
                            period_ns: q.period_ns,
                            quota: q.quota,
                            rate_cap: q.rate_cap,
                        }
                    }
                    _ => Algo::Gcra,
                };
                let (rate, burst) = if algo == Algo::Gcra {
                    let unit = if r.flags & rule_flags::BYTES != 0 {
                        Unit::Bytes
                    } else {
                        Unit::Packets
                    };
                    let g = r.gcra();
                    (rate_of(&g, unit), g.capacity.max(1))
                } else {
                    (default_limit().rate, 1)
                };
                let new_sources = if r.flags & rule_flags::NEW_SOURCES_UNLIMITED != 0 {
                    NewSources::Unlimited
                } else {
                    NewSources::Budget(Shared {
                        rate: rate_of(&r.new_sources, Unit::Packets),
                        burst: r.new_sources.capacity.max(1),
                    })
                };
                let aggregate: Option<Shared> =
                    (r.flags & rule_flags::AGGREGATE != 0).then(|| Shared {
                        rate: rate_of(
                            &r.aggregate,
                            if r.flags & rule_flags::AGGREGATE_BYTES != 0 {
                                Unit::Bytes
                            } else {
                                Unit::Packets
                            },
                        ),
                        burst: r.aggregate.capacity.max(1),
                    });
                let aggregate_reserve = aggregate.and_then(|a| {
                    let units = r.aggregate_reserve / r.aggregate.interval.max(1);
                    (units != default_aggregate_reserve(a.burst)).then_some(units)
                });
                Action::Limit(Limit {
                    rate,
                    burst,
                    algo,
                    per_v4: r.key_prefix_v4,
                    per_v6: r.key_prefix_v6,
                    dry_run: r.flags & rule_flags::DRY_RUN != 0,
                    new_sources,
                    aggregate,
                    aggregate_reserve,
                    fleet: r.flags & rule_flags::FLEET != 0,
                    host_connections: if r.flags & rule_flags::HOST_CONNECTIONS != 0 {
                        HostConnections::Pass
                    } else {
                        HostConnections::Limit
                    },
                    levels: if r.flags & rule_flags::LEVELS != 0 {
                        [
                            KeyLevel::from_kernel(&r.levels[0]),
                            KeyLevel::from_kernel(&r.levels[1]),
                        ]
                    } else {
                        [None, None]
                    },
                })
            }
        }
    }

    /// The kernel's rule value, with identity `id`.
    pub fn to_kernel(&self, id: u32, field: &str) -> Result<common::Rule> {
        Ok(match self {
            Action::Allow => common::Rule {
                id,
                action: action::ALLOW,
                ..Default::default()
            },
            Action::Deny { dry_run } => common::Rule {
                id,
                action: action::DENY,
                flags: if *dry_run { rule_flags::DRY_RUN } else { 0 },
                ..Default::default()
            },
            Action::Limit(l) => {
                let mut flags = 0;
                if l.rate.unit == Unit::Bytes && l.algo == Algo::Gcra {
                    flags |= rule_flags::BYTES;
                }
                if l.dry_run {
                    flags |= rule_flags::DRY_RUN;
                }
                if l.fleet {
                    if l.algo != Algo::Gcra {
                        return Err(Error::invalid(
                            field,
                            format!(
                                "--fleet: only gcra limits can be fleet-wide, not {}",
                                l.algo.name()
                            ),
                        ));
                    }
                    flags |= rule_flags::FLEET;
                }
                if l.host_connections == HostConnections::Pass {
                    flags |= rule_flags::HOST_CONNECTIONS;
                }
                let gcra = l.params(field)?;
                let burst = match l.algo {
                    Algo::Gcra => gcra.capacity,
                    Algo::Interval { capacity, .. } => capacity,
                    Algo::FixedWindow { limit, .. }
                    | Algo::SlidingLog { limit, .. }
                    | Algo::SlidingWindow { limit, .. } => limit,
                    Algo::RollingQuota {
                        quota, rate_cap, ..
                    } => quota.min(rate_cap),
                };
                let new_sources = match &l.new_sources {
                    NewSources::Budget(b) => b.params(field)?,
                    NewSources::Unlimited => {
                        flags |= rule_flags::NEW_SOURCES_UNLIMITED;
                        gcra::Params::DENY_ALL
                    }
                };
                let (aggregate, aggregate_reserve) = match &l.aggregate {
                    Some(a) => {
                        flags |= rule_flags::AGGREGATE;
                        if a.rate.unit == Unit::Bytes {
                            flags |= rule_flags::AGGREGATE_BYTES;
                        }
                        let p = a.params(field)?;
                        // Below the burst (checked by `params`): fits in tau.
                        let units = l
                            .aggregate_reserve
                            .unwrap_or(default_aggregate_reserve(a.burst))
                            .min(p.capacity);
                        (p, units * p.interval)
                    }
                    None => (gcra::Params::DENY_ALL, 0),
                };
                let (algorithm, params) = match l.algo {
                    Algo::Gcra => (algorithm::GCRA, AlgoParams::from_gcra(gcra)),
                    other => other
                        .kernel()
                        .map_err(|e| Error::invalid(field, format!("{}: {e}", other.name())))?,
                };
                let mut rule = common::Rule {
                    id,
                    action: action::LIMIT,
                    flags,
                    key_prefix_v4: l.per_v4,
                    key_prefix_v6: l.per_v6,
                    algorithm,
                    burst,
                    params,
                    new_sources,
                    aggregate,
                    aggregate_reserve,
                    ..Default::default()
                };
                if l.levels.iter().any(Option::is_some) && l.algo != Algo::Gcra {
                    return Err(Error::invalid(
                        field,
                        format!(
                            "key levels (a second --rate and --per, or `levels`) need gcra, not {}",
                            l.algo.name()
                        ),
                    ));
                }
                for (i, l) in l.levels.iter().flatten().enumerate() {
                    rule.levels[i] = l.to_kernel(&format!("{field}.levels[{}]", i + 1))?;
                    rule.flags |= rule_flags::LEVELS;
                }
                rule.set_masks();
                rule
            }
        })
    }
}

/// Whether malformed IP frames pass or are dropped.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, serde::Deserialize, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum MalformedPolicy {
    /// Pass them (the default: the kernel's own checks see them next).
    #[default]
    Pass,
    /// Drop them.
    Drop,
}

/// What happens to a frame the kernel would deliver as IP that the program
/// cannot judge: more than eight VLAN tags, an IPv6 extension header chain
/// longer than eight headers, a first fragment too short for the transport
/// header fields rules match on (or a TCP fragment at offset 8, RFC 1858),
/// or a transport header a rule's match needs cut short.
#[derive(
    Clone,
    Copy,
    Debug,
    PartialEq,
    Eq,
    Default,
    serde::Deserialize,
    serde::Serialize,
    clap::ValueEnum,
)]
#[serde(rename_all = "kebab-case")]
pub enum Unjudged {
    /// Dropped (counted `unjudged`, `tiny_fragment`, or `denied` under a
    /// match). The default: what cannot be judged cannot walk past a rule.
    #[default]
    Drop,
    /// Judged by the rules that need nothing it hides (a match that needs
    /// what it hides is skipped: the next rule of its source judges it); a
    /// frame with too many tags has no source to judge by and is dropped.
    /// Unsafe against a fragmenting attacker: a tiny fragment's SYN is then
    /// judged by the rule after a `--syn` rule.
    NextRule,
    /// Passed (counted `allowed`); in allowlist-only mode, as `next-rule`.
    Pass,
}

/// What happens to a non-first fragment (it carries no ports and no TCP
/// flags) under a rule whose match needs them.
#[derive(
    Clone,
    Copy,
    Debug,
    PartialEq,
    Eq,
    Default,
    serde::Deserialize,
    serde::Serialize,
    clap::ValueEnum,
)]
#[serde(rename_all = "kebab-case")]
pub enum Fragments {
    /// The rules that need ports or flags are skipped: the next rule of its
    /// source judges it (in the end its rule without matches, or the default
    /// rule). The default, and safe: the datagram's first fragment carries
    /// the transport header and is judged whole (a tiny one is dropped), so a
    /// datagram a rule refuses is never completed, and fragments are never
    /// unlimited.
    #[default]
    NextRule,
    /// Dropped (counted `denied`): also the fragments of datagrams a rule
    /// admits (large UDP answers, for one).
    Drop,
}

/// Everything the daemon enforces: global settings, the default rule, the rules.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RuleSet {
    /// Dry run for everything.
    pub dry_run: bool,
    /// What to do with malformed IP frames.
    pub malformed: MalformedPolicy,
    /// The rule for sources no prefix matches.
    pub default: Action,
    /// Rules by source prefix and match; the longest source prefix with a
    /// matching rule wins, then the most specific match (see
    /// [`crate::matching`]).
    pub rules: BTreeMap<Selector, Action>,
    /// Frames the program cannot judge.
    pub unjudged: Unjudged,
    /// Non-first fragments under a match that needs their ports or flags.
    pub fragments: Fragments,
    /// The clock decisions are made on.
    pub clock: Clock,
    /// The cap on states created per second, all rules together.
    pub new_states: Shared,
    /// Normal or allowlist-only.
    pub mode: Mode,
    /// Blocklists and allowlists by name: their entries go into the rule
    /// trie beside the rules (see `kernel::Maps::apply` for the precedence).
    pub lists: BTreeMap<String, List>,
}

/// The default limit when nothing is configured: 1000 packets/s per IPv4 address
/// and per IPv6 /64, with a burst of one second's worth.
pub fn default_limit() -> Limit {
    Limit {
        rate: Rate {
            tokens: 1000,
            period_ns: 1_000_000_000,
            unit: Unit::Packets,
        },
        burst: 1000,
        algo: Algo::Gcra,
        per_v4: DEFAULT_PER_V4,
        per_v6: DEFAULT_PER_V6,
        dry_run: false,
        new_sources: default_new_sources(),
        aggregate: None,
        aggregate_reserve: None,
        fleet: false,
        host_connections: HostConnections::Pass,
        levels: [None, None],
    }
}

impl Default for RuleSet {
    fn default() -> Self {
        Self {
            dry_run: false,
            malformed: MalformedPolicy::Pass,
            default: Action::Limit(default_limit()),
            rules: BTreeMap::new(),
            unjudged: Unjudged::Drop,
            fragments: Fragments::NextRule,
            clock: Clock::Precise,
            new_states: default_new_states(),
            mode: Mode::Normal,
            lists: BTreeMap::new(),
        }
    }
}

impl RuleSet {
    /// Whether any rule (or the default) is fleet-wide.
    pub fn has_fleet(&self) -> bool {
        std::iter::once(&self.default)
            .chain(self.rules.values())
            .any(|a| matches!(a, Action::Limit(Limit { fleet: true, .. })))
    }

    /// The rule set kernel values enforce (see [`Action::from_kernel`]).
    pub fn from_kernel(
        config: &common::Config,
        default: &common::Rule,
        rules: &BTreeMap<Selector, common::Rule>,
    ) -> Self {
        use common::config_flags::{
            ALLOWLIST_ONLY, COARSE_CLOCK, DROP_MALFORMED, DRY_RUN, FRAGMENTS_DROP, UNJUDGED_DROP,
            UNJUDGED_PASS,
        };
        RuleSet {
            dry_run: config.flags & DRY_RUN != 0,
            malformed: if config.flags & DROP_MALFORMED != 0 {
                MalformedPolicy::Drop
            } else {
                MalformedPolicy::Pass
            },
            unjudged: if config.flags & UNJUDGED_DROP != 0 {
                Unjudged::Drop
            } else if config.flags & UNJUDGED_PASS != 0 {
                Unjudged::Pass
            } else {
                Unjudged::NextRule
            },
            fragments: if config.flags & FRAGMENTS_DROP != 0 {
                Fragments::Drop
            } else {
                Fragments::NextRule
            },
            clock: if config.flags & COARSE_CLOCK != 0 {
                Clock::Coarse
            } else {
                Clock::Precise
            },
            new_states: Shared {
                rate: rate_of(&config.new_states, Unit::Packets),
                burst: config.new_states.capacity.max(1),
            },
            mode: if config.flags & ALLOWLIST_ONLY != 0 {
                Mode::AllowlistOnly
            } else {
                Mode::Normal
            },
            default: Action::from_kernel(default),
            rules: rules
                .iter()
                .map(|(p, r)| (*p, Action::from_kernel(r)))
                .collect(),
            lists: BTreeMap::new(),
        }
    }

    /// Whether `self` and `other` put the same values in the kernel (whatever
    /// forms their rates were written in): what tells a saved record that is
    /// still true from one that is not.
    pub fn same_in_kernel(&self, other: &RuleSet) -> bool {
        fn strip(mut r: common::Rule) -> common::Rule {
            r.id = 0;
            r.slot = 0;
            let mut g = r.gcra();
            if r.algorithm == algorithm::GCRA {
                g.generation = 0;
                g.prev_interval = 0;
                g.prev_capacity = 0;
                r.params = AlgoParams::from_gcra(g);
            }
            for p in [&mut r.new_sources, &mut r.aggregate] {
                p.generation = 0;
                p.prev_interval = 0;
                p.prev_capacity = 0;
            }
            r
        }
        let kernel = |set: &RuleSet| -> Option<(common::Config, Vec<common::Rule>)> {
            let mut config = set.kernel_config().ok()?;
            config.new_states.generation = 0;
            config.new_states.prev_interval = 0;
            config.new_states.prev_capacity = 0;
            let mut rules = vec![strip(set.default.to_kernel(0, "default").ok()?)];
            for (p, a) in &set.rules {
                rules.push(strip(a.to_kernel(0, &p.to_string()).ok()?));
            }
            Some((config, rules))
        };
        self.rules.keys().eq(other.rules.keys()) && kernel(self) == kernel(other)
    }

    /// Checks every rule, returning the kernel values (default first). Nothing is
    /// written anywhere; ids are assigned by the caller.
    pub fn validate(&self) -> Result<()> {
        if self.new_states.rate.unit != Unit::Packets || self.new_states.rate.tokens == 0 {
            return Err(Error::invalid(
                "--new-states",
                format!(
                    "{} is not a count of states per period above 0; give a rate like 100k/s",
                    self.new_states.rate
                ),
            ));
        }
        self.new_states.params("--new-states")?;
        self.default.to_kernel(0, "default")?;
        for (p, a) in &self.rules {
            a.to_kernel(0, &p.to_string())?;
        }
        // The chains of rules with matches fit (indexes do not matter here).
        let indexes = self.rules.keys().map(|s| (*s, 0)).collect();
        let policies = crate::matching::Policies {
            unjudged: 0,
            fragments: 0,
        };
        crate::matching::compile(&indexes, &crate::matching::NoLists, 0, policies, 0)?;
        Ok(())
    }

    /// The kernel's global config value, but for what belongs to the maps (the
    /// doorkeeper's seed and size: see `kernel::Maps::apply`).
    pub fn kernel_config(&self) -> Result<common::Config> {
        let mut flags = 0;
        if self.dry_run {
            flags |= common::config_flags::DRY_RUN;
        }
        if self.malformed == MalformedPolicy::Drop {
            flags |= common::config_flags::DROP_MALFORMED;
        }
        if self.clock == Clock::Coarse {
            flags |= common::config_flags::COARSE_CLOCK;
        }
        if self.mode == Mode::AllowlistOnly {
            flags |= common::config_flags::ALLOWLIST_ONLY;
        }
        match self.unjudged {
            Unjudged::NextRule => {}
            Unjudged::Drop => flags |= common::config_flags::UNJUDGED_DROP,
            Unjudged::Pass => flags |= common::config_flags::UNJUDGED_PASS,
        }
        if self.fragments == Fragments::Drop {
            flags |= common::config_flags::FRAGMENTS_DROP;
        }
        Ok(common::Config {
            flags,
            rule_count: self.rules.len() as u32,
            new_states: self.new_states.params("--new-states")?,
            ..Default::default()
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefixes() {
        let p = Prefix::parse("cidr", "198.18.7.9/24").unwrap();
        assert_eq!(p.to_string(), "198.18.7.0/24");
        assert_eq!(p.lpm().0, 56);
        // An IPv6 rule's key never covers an IPv4 one: the family comes first.
        let (bits, key) = Prefix::parse("cidr", "::/0").unwrap().lpm();
        assert_eq!((bits, key[0].to_ne_bytes()[0]), (32, common::family::V6));
        let v6 = Prefix::parse("cidr", "2001:db8:7::/48").unwrap();
        let (bits, key) = v6.lpm();
        assert_eq!(Prefix::from_lpm(bits, key), v6);
        let e = Prefix::parse("cidr", "::ffff:198.18.50.0/120")
            .unwrap_err()
            .to_string();
        assert!(e.contains("write 198.18.50.0/24"), "{e}");
        let p = Prefix::parse("cidr", "2001:db8::1/32").unwrap();
        assert_eq!(p.to_string(), "2001:db8::/32");
        assert_eq!(Prefix::parse("cidr", "198.18.0.1").unwrap().len, 32);
        let (bits, addr) = Prefix::parse("cidr", "198.19.0.0/16").unwrap().lpm();
        assert_eq!(Prefix::from_lpm(bits, addr).to_string(), "198.19.0.0/16");
        for bad in [
            "300.1.2.3/24",
            "2001:db8::/129",
            "198.18.0.0/33",
            "x",
            "198.18.0.0/-1",
            "",
        ] {
            let e = Prefix::parse("cidr", bad).expect_err(bad).to_string();
            assert!(e.starts_with("cidr: invalid prefix"), "{e}");
            assert!(e.contains("198.18.0.0/15"), "{e}");
        }
    }

    #[test]
    fn limits_are_validated_with_the_field_named() {
        let mut l = default_limit();
        l.per_v4 = 33;
        let e = Action::Limit(l)
            .to_kernel(1, "198.18.0.0/24")
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("198.18.0.0/24.per-v4: "), "{e}");
        let mut l = default_limit();
        l.rate = crate::rate::parse_rate("--rate", "1/hour").unwrap();
        l.burst = 1000;
        let e = Action::Limit(l)
            .to_kernel(1, "default")
            .unwrap_err()
            .to_string();
        assert!(e.contains("1.6 days"), "{e}");
    }
}
