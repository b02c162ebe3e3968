//! The TOML config file and the `run` options, both turned into one validated
//! [`RuleSet`]. See `examples/ratelimit.toml` for every key.

pub mod check;

use std::collections::BTreeMap;

use serde::Deserialize;

use crate::model::lists::{List, ListAction, check_name};
use crate::model::matching::{Match, parse_ports, parse_proto, proto_name};
use crate::{
    error::{Error, Result},
    model::rate::{parse_burst, parse_duration, parse_rate},
    model::rules::{
        Action, Algo, Clock, DEFAULT_PER_V4, DEFAULT_PER_V6, Fragments, HostConnections, KeyLevel,
        Limit, MalformedPolicy, Mode, NewSources, Prefix, RuleSet, Selector, Shared, Unjudged,
        default_limit, default_new_sources,
    },
};
use ratelimit_common as common;

/// A protocol or a port as written: a number, or text (`"tcp"`, `"27015-27020"`).
#[derive(Clone, Debug, Deserialize, serde::Serialize, PartialEq)]
#[serde(untagged)]
pub enum RawNumberOrText {
    Number(u64),
    Text(String),
}

impl RawNumberOrText {
    fn text(&self) -> String {
        match self {
            RawNumberOrText::Number(n) => n.to_string(),
            RawNumberOrText::Text(t) => t.clone(),
        }
    }
}

/// A burst as written: a number or a string with a unit.
#[derive(Clone, Debug, serde::Serialize, PartialEq)]
#[serde(untagged)]
pub enum RawBurst {
    /// `burst = 100`
    Count(u64),
    /// `burst = "64KB"`
    Text(String),
}

/// What a burst may be, for the errors of a burst that is not a whole
/// number (`-1`, `1e300`, `1.5`).
const BURST_WHOLE: &str = "a burst is a whole number from 1 to 4294967296 (2^32), like 100, or for byte rates a size like \"64KB\"";

impl<'de> Deserialize<'de> for RawBurst {
    /// A whole number or a text; any other number is refused saying what a
    /// burst may be (serde's untagged enums only say that nothing matched).
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        use serde::de::Visitor;
        struct Burst;
        impl Visitor<'_> for Burst {
            type Value = RawBurst;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(BURST_WHOLE)
            }
            fn visit_u64<E: serde::de::Error>(self, v: u64) -> std::result::Result<RawBurst, E> {
                Ok(RawBurst::Count(v))
            }
            fn visit_i64<E: serde::de::Error>(self, v: i64) -> std::result::Result<RawBurst, E> {
                u64::try_from(v)
                    .map(RawBurst::Count)
                    .map_err(|_| E::custom(format!("invalid burst {v}: {BURST_WHOLE}")))
            }
            fn visit_f64<E: serde::de::Error>(self, v: f64) -> std::result::Result<RawBurst, E> {
                // 1e300, not three hundred digits.
                let shown = if v.abs() < 1e16 {
                    format!("{v}")
                } else {
                    format!("{v:e}")
                };
                Err(E::custom(format!("invalid burst {shown}: {BURST_WHOLE}")))
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> std::result::Result<RawBurst, E> {
                Ok(RawBurst::Text(v.to_string()))
            }
            fn visit_bool<E: serde::de::Error>(self, v: bool) -> std::result::Result<RawBurst, E> {
                Err(E::custom(format!("invalid burst {v}: {BURST_WHOLE}")))
            }
        }
        d.deserialize_any(Burst)
    }
}

/// A limit as written, before validation.
#[derive(Clone, Debug, Default, Deserialize, serde::Serialize, PartialEq)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct RawLimit {
    /// `limit` (default), `allow` or `deny`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub action: Option<String>,
    /// e.g. `"500/s"`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rate: Option<String>,
    /// e.g. `1000` or `"64KB"`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub burst: Option<RawBurst>,
    /// IPv4 key prefix length.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub per_v4: Option<u8>,
    /// IPv6 key prefix length.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub per_v6: Option<u8>,
    /// Key prefix length for a rule's own family.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub per: Option<u8>,
    /// Count would-drops instead of dropping.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dry_run: Option<bool>,
    /// `gcra` (default), `token-bucket-interval`, `fixed-window`, `sliding-log`,
    /// `sliding-window`, `rolling-quota`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub algorithm: Option<String>,
    /// Packets per window (windows).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub limit: Option<u64>,
    /// Window length, e.g. `"1min"` (windows, rolling quota).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub window: Option<String>,
    /// Refill period (interval refill).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub refill_every: Option<String>,
    /// Tokens per refill (interval refill).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub refill_amount: Option<u64>,
    /// Bucket size (interval refill).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub capacity: Option<u64>,
    /// Packets per window (rolling quota).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub quota: Option<u64>,
    /// Period length (rolling quota).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub period: Option<String>,
    /// Packets per period (rolling quota).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rate_cap: Option<u64>,
    /// Budget for frames from sources without state yet, e.g. `"10k/s"`, or
    /// `"unlimited"`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub new_sources: Option<String>,
    /// Burst of the new-source budget.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub new_sources_burst: Option<RawBurst>,
    /// Aggregate level: all the rule's sources together, e.g. `"100k/s"` or
    /// `"1Gbit/s"`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub aggregate: Option<String>,
    /// Burst of the aggregate level.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub aggregate_burst: Option<RawBurst>,
    /// The part of the aggregate's burst only established sources may take:
    /// a count (`5000`) or a share (`"50%"`, the default); 0 for one bucket
    /// shared alike.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub aggregate_reserve: Option<RawBurst>,
    /// The limit holds across the fleet (every daemon run with `--fleet`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fleet: Option<bool>,
    /// `pass` (default): frames of the host's own connections are never
    /// dropped by this limit; `limit`: they are limited like any frame.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub host_connections: Option<HostConnections>,
    /// Key levels beyond the rule's own (at most two), e.g.
    /// `levels = [{ rate = "1000/s", per = 24 }]`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub levels: Option<Vec<RawLevel>>,
}

/// A key level of a limit: a token bucket (gcra) per key of its own prefix.
#[derive(Clone, Debug, Default, Deserialize, serde::Serialize, PartialEq)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct RawLevel {
    /// e.g. `"1000/s"`.
    pub rate: String,
    /// e.g. `2000`; one second's worth by default.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub burst: Option<RawBurst>,
    /// Key prefix length for a rule's own family.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub per: Option<u8>,
    /// IPv4 key prefix length.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub per_v4: Option<u8>,
    /// IPv6 key prefix length.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub per_v6: Option<u8>,
}

/// What each algorithm takes, for errors.
const ALGO_PARAMS: &str = "gcra takes rate and burst; token-bucket-interval takes refill-every, refill-amount and capacity; fixed-window, sliding-log and sliding-window take limit and window; rolling-quota takes quota, window, period and rate-cap";

/// A `[[rule]]` table.
#[derive(Clone, Debug, Deserialize, serde::Serialize, PartialEq)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct RawRule {
    /// The source prefix.
    pub cidr: String,
    /// The destination prefix.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub to: Option<String>,
    /// `tcp`, `udp`, `icmp`, `icmpv6` or a number.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub proto: Option<RawNumberOrText>,
    /// A destination port (`53`) or range (`"27015-27020"`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dport: Option<RawNumberOrText>,
    /// TCP with SYN and without ACK only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub syn: Option<bool>,
    /// The ICMP or ICMPv6 type.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub icmp_type: Option<u8>,
    /// The rest.
    #[serde(flatten)]
    pub limit: RawLimit,
}

/// The config file.
#[derive(Clone, Debug, Default, Deserialize, serde::Serialize, PartialEq)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct RawConfig {
    /// Dry run for everything.
    pub dry_run: Option<bool>,
    /// `pass` (default) or `drop`.
    pub malformed: Option<MalformedPolicy>,
    /// The default rule.
    pub default: Option<RawLimit>,
    /// `precise` (default) or `coarse`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub clock: Option<Clock>,
    /// The cap on states created per second, e.g. `"100k/s"`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub new_states: Option<String>,
    /// `normal` (default) or `allowlist-only`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<Mode>,
    /// Frames the program cannot judge: `drop` (default), `next-rule`, `pass`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unjudged: Option<Unjudged>,
    /// Non-first fragments under a match that needs their ports or flags:
    /// `next-rule` (default) or `drop`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fragments: Option<Fragments>,
    /// Prefix rules.
    #[serde(default, rename = "rule")]
    pub rules: Vec<RawRule>,
    /// Blocklists and allowlists read from files.
    #[serde(default, rename = "list", skip_serializing_if = "Vec::is_empty")]
    pub lists: Vec<RawList>,
}

/// A `[[list]]` table: a blocklist or allowlist file, read again on every
/// reload.
#[derive(Clone, Debug, Deserialize, serde::Serialize, PartialEq)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct RawList {
    /// The list's name, shown by `ratelimit list`.
    pub name: String,
    /// `deny` or `allow`.
    pub action: String,
    /// The file: one CIDR or address per line, FireHOL .netset, or `ipset
    /// save` output. A relative path is relative to the config file.
    pub path: std::path::PathBuf,
}

impl RawRule {
    /// The rule's match, checked against its `source`; errors name
    /// `{field}.proto` and the like.
    fn matches(&self, field: &str, source: &Prefix) -> Result<Match> {
        let name = |key: &str| format!("{field}.{key}");
        let m = Match {
            dest: self
                .to
                .as_deref()
                .map(|t| Prefix::parse(&name("to"), t))
                .transpose()?,
            proto: self
                .proto
                .as_ref()
                .map(|p| parse_proto(&name("proto"), &p.text()))
                .transpose()?,
            dports: self
                .dport
                .as_ref()
                .map(|p| parse_ports(&name("dport"), &p.text()))
                .transpose()?,
            syn: self.syn.unwrap_or(false),
            icmp_type: self.icmp_type,
        };
        m.validate(source, &name)?;
        Ok(m)
    }
}

impl RawLimit {
    /// Validates into an action. `field` prefixes errors; `family` is the family a
    /// rule's prefix belongs to (`None` for the default rule).
    pub fn validate(&self, field: &str, family_v4: Option<bool>) -> Result<Action> {
        let action = self.action.as_deref().unwrap_or("limit");
        let only_action = |name: &str| -> Result<()> {
            if self.rate.is_some()
                || self.burst.is_some()
                || self.per.is_some()
                || self.per_v4.is_some()
                || self.per_v6.is_some()
                || self.algorithm.is_some()
                || self.limit.is_some()
                || self.window.is_some()
                || self.refill_every.is_some()
                || self.refill_amount.is_some()
                || self.capacity.is_some()
                || self.quota.is_some()
                || self.period.is_some()
                || self.rate_cap.is_some()
                || self.new_sources.is_some()
                || self.new_sources_burst.is_some()
                || self.aggregate.is_some()
                || self.aggregate_burst.is_some()
                || self.aggregate_reserve.is_some()
                || self.fleet.is_some()
                || self.host_connections.is_some()
                || self.levels.is_some()
            {
                return Err(Error::invalid(
                    field,
                    format!(
                        "an {name} rule takes no rate, burst, per, levels, algorithm, new-sources, aggregate, fleet or host-connections"
                    ),
                ));
            }
            Ok(())
        };
        match action {
            "allow" => {
                only_action("allow")?;
                if self.dry_run.is_some() {
                    return Err(Error::invalid(field, "an allow rule takes no dry-run"));
                }
                Ok(Action::Allow)
            }
            "deny" => {
                only_action("deny")?;
                Ok(Action::Deny {
                    dry_run: self.dry_run.unwrap_or(false),
                })
            }
            "limit" => {
                let (mut per_v4, mut per_v6) = (
                    self.per_v4.unwrap_or(DEFAULT_PER_V4),
                    self.per_v6.unwrap_or(DEFAULT_PER_V6),
                );
                if let Some(per) = self.per {
                    match family_v4 {
                        Some(true) => per_v4 = per,
                        Some(false) => per_v6 = per,
                        None => {
                            return Err(Error::invalid(
                                format!("{field}.per"),
                                "the default rule covers both families: use per-v4 and per-v6",
                            ));
                        }
                    }
                }
                let algo = self.algo(field)?;
                let (rate, burst) = if algo == Algo::Gcra {
                    self.rate_and_burst(field, family_v4)?
                } else {
                    (default_limit().rate, 1)
                };
                let limit = Limit {
                    algo,
                    rate,
                    burst,
                    per_v4,
                    per_v6,
                    dry_run: self.dry_run.unwrap_or(false),
                    new_sources: self.new_sources(field)?,
                    aggregate: self.aggregate(field)?,
                    aggregate_reserve: self.aggregate_reserve(field)?,
                    fleet: self.fleet.unwrap_or(false),
                    host_connections: self.host_connections.unwrap_or_default(),
                    levels: self.levels(field, family_v4, (per_v4, per_v6))?,
                };
                Action::Limit(limit).to_kernel(0, field)?;
                Ok(Action::Limit(limit))
            }
            other => Err(Error::invalid(
                format!("{field}.action"),
                format!("unknown action {other:?}; expected limit, allow or deny"),
            )),
        }
    }
}

/// A shared bucket as written: a rate and an optional burst (one second's worth
/// by default).
fn shared(field: &str, rate: &str, burst: Option<&RawBurst>) -> Result<Shared> {
    let rate = parse_rate(field, rate)?;
    let burst_field = format!("{field}-burst");
    let burst = match burst {
        None => rate.default_burst(),
        Some(RawBurst::Count(n)) => parse_burst(&burst_field, &n.to_string(), rate.unit)?,
        Some(RawBurst::Text(s)) => parse_burst(&burst_field, s, rate.unit)?,
    };
    Ok(Shared { rate, burst })
}

impl RawLimit {
    fn new_sources(&self, field: &str) -> Result<NewSources> {
        let name = format!("{field}.new-sources");
        match (self.new_sources.as_deref(), &self.new_sources_burst) {
            (None, None) => Ok(default_new_sources()),
            (Some("unlimited"), None) => Ok(NewSources::Unlimited),
            (Some("unlimited"), Some(_)) => Err(Error::invalid(
                format!("{name}-burst"),
                "an unlimited new-source budget takes no burst",
            )),
            (None, Some(_)) => Err(Error::invalid(
                format!("{name}-burst"),
                "give the budget's rate too, like new-sources = \"10k/s\"",
            )),
            (Some(rate), burst) => Ok(NewSources::Budget(shared(&name, rate, burst.as_ref())?)),
        }
    }

    /// The key levels beyond the rule's own: a family's key prefix not given
    /// is the rule's own for that family.
    fn levels(
        &self,
        field: &str,
        family_v4: Option<bool>,
        own: (u8, u8),
    ) -> Result<[Option<KeyLevel>; common::MAX_KEY_LEVELS - 1]> {
        let mut out = [None; common::MAX_KEY_LEVELS - 1];
        let Some(levels) = &self.levels else {
            return Ok(out);
        };
        if levels.len() > out.len() {
            return Err(Error::invalid(
                format!("{field}.levels"),
                format!(
                    "{} levels given; a rule has at most {} key levels, its own and {} more",
                    levels.len(),
                    common::MAX_KEY_LEVELS,
                    out.len()
                ),
            ));
        }
        for (i, raw) in levels.iter().enumerate() {
            let name = format!("{field}.levels[{}]", i + 1);
            let bucket = shared(&format!("{name}.rate"), &raw.rate, raw.burst.as_ref())?;
            let (mut per_v4, mut per_v6) =
                (raw.per_v4.unwrap_or(own.0), raw.per_v6.unwrap_or(own.1));
            if let Some(per) = raw.per {
                match family_v4 {
                    Some(true) => per_v4 = per,
                    Some(false) => per_v6 = per,
                    None => {
                        return Err(Error::invalid(
                            format!("{name}.per"),
                            "the default rule covers both families: use per-v4 and per-v6",
                        ));
                    }
                }
            }
            if per_v4 > 32 {
                return Err(Error::invalid(
                    format!("{name}.per-v4"),
                    format!("{per_v4} is not an IPv4 prefix length (0 to 32)"),
                ));
            }
            if per_v6 > 128 {
                return Err(Error::invalid(
                    format!("{name}.per-v6"),
                    format!("{per_v6} is not an IPv6 prefix length (0 to 128)"),
                ));
            }
            if bucket.rate.tokens == 0 {
                return Err(Error::invalid(
                    format!("{name}.rate"),
                    "0/s: a level that admits nothing; to drop a network use `ratelimit deny CIDR`",
                ));
            }
            out[i] = Some(KeyLevel {
                bucket,
                per_v4,
                per_v6,
            });
        }
        Ok(out)
    }

    fn aggregate(&self, field: &str) -> Result<Option<Shared>> {
        let name = format!("{field}.aggregate");
        match (self.aggregate.as_deref(), &self.aggregate_burst) {
            (None, None) => Ok(None),
            (None, Some(_)) => Err(Error::invalid(
                format!("{name}-burst"),
                "give the aggregate's rate too, like aggregate = \"100k/s\"",
            )),
            (Some(rate), burst) => Ok(Some(shared(&name, rate, burst.as_ref())?)),
        }
    }

    fn aggregate_reserve(&self, field: &str) -> Result<Option<u64>> {
        let name = format!("{field}.aggregate-reserve");
        let Some(raw) = &self.aggregate_reserve else {
            return Ok(None);
        };
        let Some(aggregate) = self.aggregate(field)? else {
            return Err(Error::invalid(
                name,
                "a reserve is part of an aggregate: give the aggregate too, like aggregate = \"100k/s\"",
            ));
        };
        let form = "a count of the aggregate's units below its burst (like 5000), or a share of its burst (like \"50%\"); 0 for one bucket shared alike";
        let units = match raw {
            RawBurst::Count(n) => *n,
            RawBurst::Text(t) => {
                let t = t.trim();
                if let Some(p) = t.strip_suffix('%') {
                    match p.trim().parse::<u64>() {
                        Ok(p) if p < 100 => aggregate.burst * p / 100,
                        _ => return Err(Error::invalid(name, format!("{t:?}: expected {form}"))),
                    }
                } else {
                    t.parse::<u64>()
                        .map_err(|_| Error::invalid(&name, format!("{t:?}: expected {form}")))?
                }
            }
        };
        Ok(Some(units))
    }

    fn rate_and_burst(
        &self,
        field: &str,
        family_v4: Option<bool>,
    ) -> Result<(crate::model::rate::Rate, u64)> {
        let rate_field = format!("{field}.rate");
        let rate = parse_rate(
            &rate_field,
            self.rate.as_deref().ok_or_else(|| {
                Error::invalid(&rate_field, "missing; a limit needs a rate like 500/s")
            })?,
        )?;
        let burst_field = format!("{field}.burst");
        let burst = match &self.burst {
            None => rate.default_burst(),
            Some(RawBurst::Count(n)) => parse_burst(&burst_field, &n.to_string(), rate.unit)?,
            Some(RawBurst::Text(s)) => parse_burst(&burst_field, s, rate.unit)?,
        };
        if rate.tokens == 0 && family_v4.is_none() {
            return Err(Error::invalid(
                rate_field,
                "0/s for the default rule would drop every source; to drop a network use `ratelimit deny CIDR` or rate 0/s on its CIDR",
            ));
        }
        Ok((rate, burst))
    }

    /// The algorithm and its parameters; every parameter it does not take is an
    /// error that lists what each algorithm takes.
    fn algo(&self, field: &str) -> Result<Algo> {
        let name = self.algorithm.as_deref().unwrap_or("gcra");
        let given: [(&str, bool); 11] = [
            ("rate", self.rate.is_some()),
            ("burst", self.burst.is_some()),
            ("limit", self.limit.is_some()),
            ("window", self.window.is_some()),
            ("refill-every", self.refill_every.is_some()),
            ("refill-amount", self.refill_amount.is_some()),
            ("capacity", self.capacity.is_some()),
            ("quota", self.quota.is_some()),
            ("period", self.period.is_some()),
            ("rate-cap", self.rate_cap.is_some()),
            ("(unused)", false),
        ];
        let takes: &[&str] = match name {
            "gcra" => &["rate", "burst"],
            "token-bucket-interval" => &["refill-every", "refill-amount", "capacity"],
            "fixed-window" | "sliding-log" | "sliding-window" => &["limit", "window"],
            "rolling-quota" => &["quota", "window", "period", "rate-cap"],
            other => {
                return Err(Error::invalid(
                    format!("{field}.algorithm"),
                    format!("unknown algorithm {other:?}; expected {}", Algo::NAMES),
                ));
            }
        };
        for (param, set) in given {
            if set && !takes.contains(&param) {
                return Err(Error::invalid(
                    format!("{field}.{param}"),
                    format!("{name} takes no {param}; {ALGO_PARAMS}"),
                ));
            }
        }
        for param in takes {
            let set = given.iter().any(|(p, s)| p == param && *s);
            let optional = name == "gcra" && *param == "burst";
            if !(set || optional) {
                return Err(Error::invalid(
                    format!("{field}.{param}"),
                    format!("{name} needs {param}; {ALGO_PARAMS}"),
                ));
            }
        }
        let dur = |param: &str, v: &Option<String>| -> Result<u64> {
            parse_duration(&format!("{field}.{param}"), v.as_deref().unwrap_or(""))
        };
        let n = |v: Option<u64>| v.unwrap_or(0);
        Ok(match name {
            "gcra" => Algo::Gcra,
            "token-bucket-interval" => Algo::Interval {
                every_ns: dur("refill-every", &self.refill_every)?,
                amount: n(self.refill_amount),
                capacity: n(self.capacity),
            },
            "fixed-window" => Algo::FixedWindow {
                window_ns: dur("window", &self.window)?,
                limit: n(self.limit),
            },
            "sliding-log" => Algo::SlidingLog {
                window_ns: dur("window", &self.window)?,
                limit: n(self.limit),
            },
            "sliding-window" => Algo::SlidingWindow {
                window_ns: dur("window", &self.window)?,
                limit: n(self.limit),
            },
            _ => Algo::RollingQuota {
                window_ns: dur("window", &self.window)?,
                period_ns: dur("period", &self.period)?,
                quota: n(self.quota),
                rate_cap: n(self.rate_cap),
            },
        })
    }
}

impl From<&Action> for RawLimit {
    fn from(a: &Action) -> Self {
        match a {
            Action::Allow => RawLimit {
                action: Some("allow".into()),
                ..Default::default()
            },
            Action::Deny { dry_run } => RawLimit {
                action: Some("deny".into()),
                dry_run: Some(*dry_run),
                ..Default::default()
            },
            Action::Limit(l) => {
                let ns = |v: u64| Some(format!("{v}ns"));
                let mut raw = RawLimit {
                    action: Some("limit".into()),
                    algorithm: Some(l.algo.name().into()),
                    per_v4: Some(l.per_v4),
                    per_v6: Some(l.per_v6),
                    dry_run: Some(l.dry_run),
                    fleet: l.fleet.then_some(true),
                    host_connections: (l.host_connections != HostConnections::default())
                        .then_some(l.host_connections),
                    ..Default::default()
                };
                match l.new_sources {
                    NewSources::Unlimited => raw.new_sources = Some("unlimited".into()),
                    NewSources::Budget(b) => {
                        raw.new_sources = Some(b.rate.exact());
                        raw.new_sources_burst = Some(RawBurst::Count(b.burst));
                    }
                }
                if let Some(a) = l.aggregate {
                    raw.aggregate = Some(a.rate.exact());
                    raw.aggregate_burst = Some(RawBurst::Count(a.burst));
                    raw.aggregate_reserve = l.aggregate_reserve.map(RawBurst::Count);
                }
                let levels: Vec<RawLevel> = l
                    .levels
                    .iter()
                    .flatten()
                    .map(|k| RawLevel {
                        rate: k.bucket.rate.exact(),
                        burst: Some(RawBurst::Count(k.bucket.burst)),
                        per: None,
                        per_v4: Some(k.per_v4),
                        per_v6: Some(k.per_v6),
                    })
                    .collect();
                raw.levels = (!levels.is_empty()).then_some(levels);
                match l.algo {
                    Algo::Gcra => {
                        raw.rate = Some(l.rate.exact());
                        raw.burst = Some(RawBurst::Count(l.burst));
                    }
                    Algo::Interval {
                        every_ns,
                        amount,
                        capacity,
                    } => {
                        raw.refill_every = ns(every_ns);
                        raw.refill_amount = Some(amount);
                        raw.capacity = Some(capacity);
                    }
                    Algo::FixedWindow { window_ns, limit }
                    | Algo::SlidingLog { window_ns, limit }
                    | Algo::SlidingWindow { window_ns, limit } => {
                        raw.window = ns(window_ns);
                        raw.limit = Some(limit);
                    }
                    Algo::RollingQuota {
                        window_ns,
                        period_ns,
                        quota,
                        rate_cap,
                    } => {
                        raw.window = ns(window_ns);
                        raw.period = ns(period_ns);
                        raw.quota = Some(quota);
                        raw.rate_cap = Some(rate_cap);
                    }
                }
                raw
            }
        }
    }
}

impl From<&RuleSet> for RawConfig {
    /// The exact config of a rule set: [`RawConfig::validate`] reads it back
    /// whole, but for its lists (their entries are not config: the saved
    /// record keeps them beside it).
    fn from(set: &RuleSet) -> Self {
        RawConfig {
            lists: Vec::new(),
            dry_run: Some(set.dry_run),
            malformed: Some(set.malformed),
            clock: Some(set.clock),
            new_states: Some(set.new_states.rate.exact()),
            mode: (set.mode != Mode::Normal).then_some(set.mode),
            unjudged: (set.unjudged != Unjudged::default()).then_some(set.unjudged),
            fragments: (set.fragments != Fragments::default()).then_some(set.fragments),
            default: Some(RawLimit::from(&set.default)),
            rules: set
                .rules
                .iter()
                .map(|(s, a)| {
                    let m = &s.matches;
                    RawRule {
                        cidr: s.source.to_string(),
                        to: m.dest.map(|d| d.to_string()),
                        proto: m
                            .proto
                            .map(|p| RawNumberOrText::Text(proto_name(p).replace("proto ", ""))),
                        dport: m.dports.map(|(a, b)| {
                            if a == b {
                                RawNumberOrText::Number(a.into())
                            } else {
                                RawNumberOrText::Text(format!("{a}-{b}"))
                            }
                        }),
                        syn: m.syn.then_some(true),
                        icmp_type: m.icmp_type,
                        limit: RawLimit::from(a),
                    }
                })
                .collect(),
        }
    }
}

impl RawConfig {
    /// Whether nothing is set.
    pub fn is_empty(&self) -> bool {
        *self == RawConfig::default()
    }

    /// The config file `file` with what the command line set (`cli`): setting
    /// one thing in both places is refused, naming both (the file's path is
    /// `path`).
    pub fn merge(mut file: RawConfig, cli: &RawConfig, path: &str) -> Result<RawConfig> {
        let conflict = |flag: &str, key: &str| {
            Error::invalid(
                flag,
                format!("{flag} conflicts with `{key}` in {path}: set it in one place"),
            )
        };
        macro_rules! one {
            ($field:ident, $flag:expr, $key:expr) => {
                if let Some(v) = &cli.$field {
                    if file.$field.is_some() {
                        return Err(conflict($flag, $key));
                    }
                    file.$field = Some(v.clone());
                }
            };
        }
        one!(dry_run, "--dry-run", "dry-run");
        one!(malformed, "--drop-malformed", "malformed");
        one!(clock, "--clock", "clock");
        one!(new_states, "--new-states", "new-states");
        one!(unjudged, "--unjudged", "unjudged");
        one!(fragments, "--fragments", "fragments");
        if let Some(c) = &cli.default {
            let d = file.default.get_or_insert_with(RawLimit::default);
            macro_rules! field {
                ($field:ident, $flag:expr, $key:expr) => {
                    if let Some(v) = &c.$field {
                        if d.$field.is_some() {
                            return Err(conflict($flag, $key));
                        }
                        d.$field = Some(v.clone());
                    }
                };
            }
            field!(rate, "--rate", "[default] rate");
            field!(burst, "--burst", "[default] burst");
            field!(per_v4, "--per-v4", "[default] per-v4");
            field!(per_v6, "--per-v6", "[default] per-v6");
            field!(new_sources, "--new-sources", "[default] new-sources");
            if d.rate.is_none()
                && d.action.as_deref().unwrap_or("limit") == "limit"
                && d.algorithm.is_none()
            {
                // A burst or key prefix alone keeps the default rate.
                d.rate = Some(default_limit().rate.to_string());
            }
        }
        Ok(file)
    }

    /// Validates everything into a rule set, on top of `base` (the CLI's
    /// default); the first error if there are several (see
    /// [`RawConfig::validate_all`]).
    pub fn validate(&self, base: &RuleSet) -> Result<RuleSet> {
        self.validate_all(base)
            .map_err(|errors| errors.into_iter().next().expect("at least one error"))
    }

    /// Validates everything into a rule set, on top of `base`; every error, in
    /// the order of the file (see [`RawConfig::validate_parts`]).
    pub fn validate_all(&self, base: &RuleSet) -> Result<RuleSet, Vec<Error>> {
        self.validate_parts(
            self.rules.iter().enumerate(),
            self.lists.iter().enumerate(),
            base,
        )
    }

    /// Validates this config's global keys and default with `rules` and
    /// `lists` (each with its index in the file: `rule[3]` is the file's
    /// fourth `[[rule]]` even when one before it could not be read at all), on
    /// top of `base`. `self.rules` and `self.lists` are not read.
    ///
    /// Every error is returned, not just the first: each global key, the
    /// default, each rule and each list are checked on their own (a rule's
    /// source, match and limit too, so a bad CIDR does not hide a bad rate).
    /// What depends on several of them (a rule or list name given twice, the
    /// chains of rules with matches) is checked once the parts are valid, and
    /// said once.
    pub fn validate_parts<'a>(
        &self,
        rules: impl IntoIterator<Item = (usize, &'a RawRule)>,
        lists: impl IntoIterator<Item = (usize, &'a RawList)>,
        base: &RuleSet,
    ) -> Result<RuleSet, Vec<Error>> {
        let mut errors = Vec::new();
        let mut set = base.clone();
        if let Some(d) = self.dry_run {
            set.dry_run = d;
        }
        if let Some(m) = self.malformed {
            set.malformed = m;
        }
        if let Some(c) = self.clock {
            set.clock = c;
        }
        if let Some(n) = &self.new_states {
            match parse_rate("new-states", n) {
                Ok(rate) => set.new_states = Shared::of(rate),
                Err(e) => errors.push(e),
            }
        }
        if let Some(m) = self.mode {
            set.mode = m;
        }
        if let Some(u) = self.unjudged {
            set.unjudged = u;
        }
        if let Some(f) = self.fragments {
            set.fragments = f;
        }
        if let Some(d) = &self.default {
            match d.validate("default", None) {
                Ok(action) => set.default = action,
                Err(e) => errors.push(e),
            }
        }
        // The field that names each valid rule, to name it again in errors
        // about several rules.
        let mut names: BTreeMap<Selector, String> = BTreeMap::new();
        let mut rule_set = BTreeMap::new();
        for (i, r) in rules {
            let Some((selector, action)) = r.validate(i, &mut errors) else {
                continue;
            };
            let field = format!("rule[{i}]");
            if let Some(first) = names.get(&selector) {
                errors.push(Error::invalid(
                    format!("{field}.cidr"),
                    format!("{selector} appears twice (first as {first}): a CIDR with the same match has one rule"),
                ));
                continue;
            }
            names.insert(selector, field);
            rule_set.insert(selector, action);
        }
        set.rules = rule_set;
        let mut list_names: BTreeMap<&str, usize> = BTreeMap::new();
        for (i, l) in lists {
            let field = format!("list[{i}]");
            let name = check_name(&format!("{field}.name"), &l.name);
            let action = ListAction::parse(&format!("{field}.action"), &l.action);
            // The file is read even when the action is wrong, so its bad lines
            // are said too.
            let list = List::read(
                &format!("{field}.path"),
                *action.as_ref().unwrap_or(&ListAction::Deny),
                &l.path,
            );
            let (Ok(()), Ok(_), Ok(list)) = (
                name.map_err(|e| errors.push(e)),
                action.map_err(|e| errors.push(e)),
                list.map_err(|e| errors.push(e)),
            ) else {
                continue;
            };
            if let Some(first) = list_names.get(l.name.as_str()) {
                errors.push(Error::invalid(
                    format!("{field}.name"),
                    format!(
                        "a list named {:?} appears twice (first as list[{first}]): give each list its own name",
                        l.name
                    ),
                ));
                continue;
            }
            list_names.insert(&l.name, i);
            set.lists.insert(l.name.clone(), list);
        }
        if !errors.is_empty() {
            return Err(errors);
        }
        // What holds for the set as a whole; its errors name a rule by its
        // selector or its source prefix: named as the file names it.
        set.validate().map_err(|e| {
            vec![match e {
                Error::Invalid { field, message } => {
                    let named = names
                        .iter()
                        .find(|(s, _)| s.to_string() == field)
                        .or_else(|| names.iter().find(|(s, _)| s.source.to_string() == field))
                        .map(|(s, name)| format!("{name} ({s})"));
                    let field = match named {
                        Some(n) => n,
                        None if field == "--new-states" && self.new_states.is_some() => {
                            "new-states".into()
                        }
                        None => field,
                    };
                    Error::Invalid { field, message }
                }
                e => e,
            }]
        })?;
        Ok(set)
    }
}

impl RawRule {
    /// The keys of a `[[rule]]` table that are not its limit's: its source and
    /// match. (A rule's limit keys are [`RawLimit`]'s.)
    pub const OWN_KEYS: [&str; 6] = ["cidr", "to", "proto", "dport", "syn", "icmp-type"];

    /// Validates the `i`th rule of a file: its selector and action, or `None`
    /// with every error of its source, its match and its limit added to
    /// `errors` (a limit is checked even under a bad source, for the family
    /// its text names).
    fn validate(&self, i: usize, errors: &mut Vec<Error>) -> Option<(Selector, Action)> {
        let field = format!("rule[{i}]");
        let source = Prefix::parse(&format!("{field}.cidr"), &self.cidr);
        let (name, family_v4, selector) = match source {
            Ok(source) => match self.matches(&field, &source) {
                Ok(matches) => {
                    let selector = Selector { source, matches };
                    (
                        format!("{field} ({selector})"),
                        source.addr.is_ipv4(),
                        Some(selector),
                    )
                }
                Err(e) => {
                    errors.push(e);
                    (format!("{field} ({source})"), source.addr.is_ipv4(), None)
                }
            },
            Err(e) => {
                errors.push(e);
                (field, !self.cidr.contains(':'), None)
            }
        };
        let action = self
            .limit
            .validate(&name, Some(family_v4))
            .map_err(|e| errors.push(e))
            .ok();
        selector.zip(action)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{model::rate::Unit, model::rules::Algo};

    fn parse(s: &str) -> Result<RuleSet> {
        toml::from_str::<RawConfig>(s)
            .map_err(|e| Error::invalid("t.toml", e.to_string()))?
            .validate(&RuleSet::default())
    }

    #[test]
    fn the_example_file_is_valid() {
        let text = include_str!("../../../examples/ratelimit.toml");
        let set = parse(text).unwrap_or_else(|e| panic!("{e}"));
        assert!(!set.rules.is_empty());
    }

    #[test]
    fn rules_and_defaults() {
        let set = parse(
            r#"
            dry-run = false
            malformed = "drop"
            [default]
            rate = "100/s"
            burst = 200
            per-v6 = 56
            [[rule]]
            cidr = "198.18.0.0/24"
            action = "allow"
            [[rule]]
            cidr = "2001:db8:bad::/48"
            action = "deny"
            [[rule]]
            cidr = "198.19.0.0/16"
            rate = "1Gbit/s"
            burst = "1MB"
            per = 24
            dry-run = true
            "#,
        )
        .unwrap();
        assert_eq!(set.malformed, MalformedPolicy::Drop);
        let Action::Limit(d) = set.default else {
            panic!("default not a limit")
        };
        assert_eq!((d.burst, d.per_v4, d.per_v6), (200, 32, 56));
        assert_eq!(set.rules.len(), 3);
        let p = Selector::parse("x", "198.19.0.0/16").unwrap();
        let Action::Limit(l) = set.rules[&p] else {
            panic!("not a limit")
        };
        assert_eq!(
            (l.burst, l.per_v4, l.dry_run, l.rate.unit),
            (1_000_000, 24, true, Unit::Bytes)
        );
    }

    #[test]
    fn an_aggregate_reserve_is_a_count_or_a_share_below_its_burst() {
        let reserve = |extra: &str| {
            parse(&format!(
                "[default]\nrate = \"100/s\"\naggregate = \"10k/s\"\naggregate-burst = 2000\n{extra}"
            ))
            .map(|set| match set.default {
                Action::Limit(l) => l.aggregate_reserve,
                _ => panic!("not a limit"),
            })
        };
        assert_eq!(reserve("").unwrap(), None, "the default: half the burst");
        assert_eq!(reserve("aggregate-reserve = 500").unwrap(), Some(500));
        assert_eq!(reserve("aggregate-reserve = \"25%\"").unwrap(), Some(500));
        assert_eq!(reserve("aggregate-reserve = 0").unwrap(), Some(0));
        for bad in ["2000", "\"100%\"", "\"lots\"", "\"-1\""] {
            let e = reserve(&format!("aggregate-reserve = {bad}")).unwrap_err();
            assert!(
                e.to_string().contains("aggregate-reserve"),
                "{bad}: the error names the field: {e}"
            );
        }
        let e = parse("[default]\nrate = \"100/s\"\naggregate-reserve = 10\n").unwrap_err();
        assert!(e.to_string().contains("give the aggregate too"), "{e}");
        // Round trip through the kernel's rule: the reserve comes back.
        let set =
            parse("[default]\nrate = \"100/s\"\naggregate = \"10k/s\"\naggregate-reserve = 123\n")
                .unwrap();
        let k = set.default.to_kernel(0, "default").unwrap();
        assert_eq!(k.aggregate_reserve, 123 * k.aggregate.interval);
        assert_eq!(Action::from_kernel(&k), set.default);
    }

    #[test]
    fn a_rule_set_round_trips_through_its_raw_form() {
        let set = parse(include_str!("../../../examples/ratelimit.toml")).unwrap();
        let text = toml::to_string(&RawConfig::from(&set)).unwrap();
        assert_eq!(parse(&text).unwrap(), set, "{text}");
    }

    #[test]
    fn algorithms_and_their_parameters() {
        let set = parse(
            r#"
            [[rule]]
            cidr = "198.18.1.0/24"
            algorithm = "sliding-log"
            limit = 10
            window = "1s"
            [[rule]]
            cidr = "198.18.2.0/24"
            algorithm = "rolling-quota"
            quota = 10000
            window = "24h"
            period = "1h"
            rate-cap = 1000
            [[rule]]
            cidr = "198.18.3.0/24"
            algorithm = "token-bucket-interval"
            refill-every = "60s"
            refill-amount = 60
            capacity = 60
            "#,
        )
        .unwrap();
        let p = |s| Selector::parse("x", s).unwrap();
        let Action::Limit(l) = set.rules[&p("198.18.1.0/24")] else {
            panic!()
        };
        assert_eq!(
            l.algo,
            Algo::SlidingLog {
                window_ns: 1_000_000_000,
                limit: 10
            }
        );
        let Action::Limit(l) = set.rules[&p("198.18.2.0/24")] else {
            panic!()
        };
        assert!(matches!(
            l.algo,
            Algo::RollingQuota {
                quota: 10000,
                rate_cap: 1000,
                ..
            }
        ));
        assert_eq!(
            l.to_string(),
            "rolling-quota 10000 per 1d at most 1000 per 1h per /32 (IPv4) /64 (IPv6)"
        );
        // The saved form reads back to the same set.
        let text = toml::to_string(&RawConfig::from(&set)).unwrap();
        assert_eq!(parse(&text).unwrap(), set, "{text}");
        for (text, needle) in [
            (
                "algorithm = \"sliding-log\"\nlimit = 100\nwindow = \"1s\"",
                "use the sliding-window algorithm",
            ),
            (
                "algorithm = \"fixed-window\"\nlimit = 10",
                "fixed-window needs window",
            ),
            (
                "algorithm = \"fixed-window\"\nlimit = 10\nwindow = \"1s\"\nrate = \"5/s\"",
                "fixed-window takes no rate",
            ),
            ("algorithm = \"leaky\"", "unknown algorithm \"leaky\""),
            (
                "algorithm = \"rolling-quota\"\nquota = 5\nwindow = \"90min\"\nperiod = \"1h\"\nrate-cap = 2",
                "whole number of periods",
            ),
            (
                "algorithm = \"fixed-window\"\nlimit = 10\nwindow = \"10 fortnights\"",
                "invalid duration",
            ),
        ] {
            let file = format!("[[rule]]\ncidr = \"198.18.0.0/24\"\n{text}");
            let e = parse(&file).expect_err(text).to_string();
            assert!(e.contains(needle), "{text:?}: {e}");
        }
    }

    #[test]
    fn lists_in_the_config_are_read_relative_to_it() {
        let dir = std::env::temp_dir().join(format!("rl-config-lists-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("bad.txt"), "198.18.0.1\nnot-an-address\n").unwrap();
        std::fs::write(dir.join("ok.netset"), "# ok\n198.18.0.0/24\n").unwrap();
        let toml = dir.join("r.toml");
        let read = |text: &str| {
            std::fs::write(&toml, text).unwrap();
            crate::config::check::file(&toml, &RawConfig::default())
        };
        let set =
            read("[[list]]\nname = \"ok\"\naction = \"deny\"\npath = \"ok.netset\"\n").unwrap();
        assert_eq!(set.lists["ok"].entries.len(), 1);
        let e =
            read("[[list]]\nname = \"bad\"\naction = \"deny\"\npath = \"bad.txt\"\n").unwrap_err();
        let p = &e.problems[0];
        assert!(
            p.field == "list[0].path" && p.line == Some(4) && p.message.contains("bad.txt:2:"),
            "{e}"
        );
        let e =
            read("[[list]]\nname = \"ok\"\naction = \"drop\"\npath = \"ok.netset\"\n").unwrap_err();
        assert_eq!(
            (e.problems[0].field.as_str(), e.problems[0].line),
            ("list[0].action", Some(3)),
            "{e}"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_rules_own_keys_are_those_its_table_has_besides_the_limits() {
        let rule = RawRule {
            cidr: "198.18.0.0/24".into(),
            to: Some("198.18.1.0/24".into()),
            proto: Some(RawNumberOrText::Text("udp".into())),
            dport: Some(RawNumberOrText::Number(53)),
            syn: Some(false),
            icmp_type: Some(8),
            limit: RawLimit::default(),
        };
        let table = toml::Table::try_from(&rule).unwrap();
        let keys: Vec<&str> = table.keys().map(String::as_str).collect();
        let mut own = RawRule::OWN_KEYS.to_vec();
        own.sort_unstable();
        assert_eq!(keys, own);
    }

    #[test]
    fn validate_all_says_every_independent_error() {
        let raw: RawConfig = toml::from_str(
            r#"
            new-states = "many"
            [default]
            rate = "0/s"
            [[rule]]
            cidr = "198.18.0.0/33"
            [[rule]]
            cidr = "198.18.1.0/24"
            proto = "tcp"
            icmp-type = 8
            action = "deny"
            [[rule]]
            cidr = "198.18.2.0/24"
            action = "allow"
            [[list]]
            name = "has space"
            action = "block"
            path = "/nonexistent/list.txt"
            "#,
        )
        .unwrap();
        let errors = raw.validate_all(&RuleSet::default()).unwrap_err();
        let fields: Vec<String> = errors
            .iter()
            .map(|e| match e {
                Error::Invalid { field, .. } => field.clone(),
                e => panic!("not an invalid-value error: {e}"),
            })
            .collect();
        assert_eq!(
            fields,
            [
                "new-states",
                "default.rate",
                "rule[0].cidr",
                "rule[0].rate",
                "rule[1].icmp-type",
                "list[0].name",
                "list[0].action",
                "list[0].path"
            ],
            "{errors:?}"
        );
    }

    #[test]
    fn bad_files_say_why() {
        for (text, needle) in [
            ("colour = 1", "unknown field `colour`"),
            ("[default]\nrate = \"10/s\"\nburst = 0", "default.burst"),
            ("[default]\nrate = \"0/s\"", "would drop every source"),
            (
                "[[rule]]\ncidr = \"300.1.2.3/24\"\naction = \"deny\"",
                "rule[0].cidr",
            ),
            (
                "[[rule]]\ncidr = \"2001:db8::/129\"\naction = \"deny\"",
                "rule[0].cidr",
            ),
            (
                "[[rule]]\ncidr = \"198.18.0.0/24\"\naction = \"allow\"\nrate = \"5/s\"",
                "takes no rate",
            ),
            (
                "[[rule]]\ncidr = \"198.18.0.0/24\"\naction = \"block\"",
                "expected limit, allow or deny",
            ),
            (
                "[[rule]]\ncidr = \"198.18.0.0/24\"\nrate = \"5/fortnight\"",
                "rule[0] (198.18.0.0/24).rate",
            ),
            (
                "[[rule]]\ncidr = \"198.18.0.0/24\"\naction = \"deny\"\n[[rule]]\ncidr = \"198.18.0.0/24\"\naction = \"allow\"",
                "appears twice",
            ),
        ] {
            let e = parse(text).expect_err(text).to_string();
            assert!(e.contains(needle), "{text:?}: {e}");
        }
    }
}
