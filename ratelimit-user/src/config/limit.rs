//! A rule's keys validated: its match (`to`, `proto`, `dport`, `syn`,
//! `icmp-type`) and its limit ([`RawLimit::validate`]: the action, the
//! algorithm and its parameters, the key levels, the new-source budget, the
//! aggregate), each error naming the key it is about.

use super::schema::ALGO_PARAMS;
use super::*;
use crate::{
    error::{Error, Result},
    model::rate::{parse_burst, parse_duration, parse_rate},
    model::rules::{
        Action, Algo, DEFAULT_PER_V4, DEFAULT_PER_V6, KeyLevel, Limit, NewSources, Prefix, Shared,
        default_limit, default_new_sources,
    },
    model::{
        matching::{Match, parse_proto},
        ports::Ports,
    },
};
use ratelimit_common as common;

impl RawRule {
    /// The rule's match, checked against its `source`; errors name
    /// `{field}.proto` and the like.
    pub(super) fn matches(&self, field: &str, source: &Prefix) -> Result<Match> {
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
                .map(|p| Ports::parse(&name("dport"), &p.text()))
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
                .map_err(Into::into)
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
