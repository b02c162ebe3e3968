//! From what clap parsed ([`super::args`]) to what cannot be wrong: `run`'s
//! options and the requests of the change commands, each value parsed into the model's type with the flag it came from named
//! in its errors. What needs the rule a daemon has (a burst's unit, a
//! reserve's share) is left as typed, for the daemon to validate with it.

use super::args::{ChangeArgs, MatchArgs, RunArgs, SetArgs};
use crate::{
    config::{RawBurst, RawConfig, RawLimit},
    daemon::RunOptions,
    error::{Error, Result},
    kernel::LoadOptions,
    model::{
        matching::{Selector, flag_name, parse_proto},
        ports::Ports,
        prefix::Prefix,
        rate::{parse_duration, parse_rate},
        rules::MalformedPolicy,
    },
    protocol::{
        LevelPatch, LimitPatch, NewSourcesGiven, Request, SetTarget,
        flags::{self, nth},
    },
};

impl RunArgs {
    /// The command line's rule options as a config (only what was given).
    fn rules(&self) -> RawConfig {
        let mut default = RawLimit {
            rate: self.rate.clone(),
            burst: self.burst.clone().map(RawBurst::Text),
            per_v4: self.per_v4,
            per_v6: self.per_v6,
            new_sources: self.new_sources.clone(),
            ..Default::default()
        };
        let any_default = default != RawLimit::default();
        if any_default {
            default.action = None;
        }
        RawConfig {
            dry_run: self.dry_run.then_some(true),
            malformed: self.drop_malformed.then_some(MalformedPolicy::Drop),
            clock: self.clock,
            new_states: self.new_states.clone(),
            default: any_default.then_some(default),
            rules: Vec::new(),
            lists: Vec::new(),
            mode: None,
            unjudged: self.unjudged,
            fragments: self.fragments,
            drop_log: self.drop_log.clone(),
        }
    }

    /// The validated run options: the rule options are checked (alone, and
    /// against the config file) before anything else happens.
    pub fn options(&self) -> Result<RunOptions> {
        if let Some(d) = &self.drop_log {
            // Said here in the option's name; the config file's key is
            // checked with the file.
            crate::model::droplog::DropLog::parse("--drop-log", d)?;
        }
        if let Some(rate) = &self.rate
            && parse_rate("--rate", rate)?.tokens == 0
        {
            return Err(Error::invalid(
                "--rate",
                "0/s for the default rule would drop every source; to drop a network use `ratelimit deny CIDR`",
            ));
        }
        let most = ratelimit_common::state_sources(ratelimit_common::MAX_STATE_LINES);
        for (flag, n, fam) in [
            ("--max-sources", self.max_sources, "IPv4"),
            ("--max-sources-v6", self.max_sources_v6, "IPv6"),
        ] {
            if n > most {
                return Err(Error::invalid(
                    flag,
                    format!(
                        "{n} is more than the state table holds of {fam} sources: at most {most} (its lines would take {} GiB of kernel memory, 48 bytes a source)",
                        (u64::from(most) * 48) >> 30
                    ),
                ));
            }
        }
        if !self.doorkeeper_slots.is_power_of_two() || self.doorkeeper_slots < 1024 {
            return Err(Error::invalid(
                "--doorkeeper-slots",
                format!(
                    "{} is not a power of two of at least 1024, like 65536 or 1048576",
                    self.doorkeeper_slots
                ),
            ));
        }
        for (flag, n) in [
            ("--max-sources", self.max_sources),
            ("--max-sources-v6", self.max_sources_v6),
            ("--max-rules", self.max_rules),
            ("--max-list-entries", self.max_list_entries),
            ("--max-wide-sources", self.max_wide_sources),
        ] {
            if n == 0 {
                return Err(Error::invalid(flag, "must be at least 1"));
            }
        }
        // The options alone first, so that an error names the flag typed.
        let cli = self.rules();
        RawConfig::merge(RawConfig::default(), &cli, "")
            .and_then(|alone| alone.validate(&crate::model::rules::RuleSet::default()))
            .map_err(flags::flagged)?;
        let metrics = self
            .metrics
            .as_deref()
            .map(|m| {
                crate::host::listen::listen_addr(
                    "--metrics",
                    m,
                    crate::daemon::metrics::EXAMPLE_PORT,
                )
            })
            .transpose()?;
        let opts = RunOptions {
            iface: self.iface.clone(),
            config: self.config.clone(),
            cli,
            mode: self.mode,
            keep_attached: self.keep_attached,
            reset: self.reset,
            metrics,
            fleet: self.fleet.clone(),
            fleet_fallback: self.fleet_fallback,
            drop_fleet_rules: self.drop_fleet_rules,
            crowdsec: self.crowdsec.options()?,
            load: LoadOptions {
                state_capacity: self.max_sources,
                state_capacity_v6: self.max_sources_v6,
                rules_capacity: self.max_rules,
                list_capacity: self.max_list_entries,
                wide_capacity: self.max_wide_sources,
                seen_slots: self.doorkeeper_slots,
            },
        };
        // Checked now: a bad file or a conflicting option changes nothing.
        opts.given()?;
        Ok(opts)
    }
}

impl ChangeArgs {
    /// `--for` in ms.
    pub(super) fn for_ms(&self) -> Result<Option<u64>> {
        self.for_
            .as_deref()
            .map(|d| {
                parse_duration("--for", d)
                    .map(|ns| ns.div_ceil(1_000_000))
                    .map_err(Error::from)
            })
            .transpose()
    }
}

impl MatchArgs {
    /// Whether any match was given.
    pub(super) fn any(&self) -> bool {
        self.proto.is_some()
            || self.dport.is_some()
            || self.syn
            || self.icmp_type.is_some()
            || self.to.is_some()
    }

    /// The selector of `cidr` (which may carry match words of its own, as
    /// `ratelimit list` writes a selector) with these matches: errors name
    /// `CIDR` and the match flags.
    pub(super) fn selector(&self, cidr: &str) -> Result<Selector> {
        if cidr.trim() == "default" {
            // `set default` is the one command where the word is a rule.
            return Err(Error::invalid(
                "CIDR",
                "the default rule is never removed, allowed or denied: change it with `ratelimit set default --rate …`; `ratelimit reset` removes every other rule",
            ));
        }
        let mut s = Selector::parse("CIDR", cidr)?;
        let m = &mut s.matches;
        if let Some(t) = &self.to {
            m.dest = Some(Prefix::parse("--to", t)?);
        }
        if let Some(p) = &self.proto {
            m.proto = Some(parse_proto("--proto", p)?);
        }
        if let Some(d) = &self.dport {
            m.dports = Some(Ports::parse("--dport", d)?);
        }
        if self.syn {
            m.syn = true;
        }
        if let Some(t) = self.icmp_type {
            m.icmp_type = Some(t);
        }
        m.validate(&s.source, &flag_name)?;
        Ok(s)
    }
}

impl SetArgs {
    /// Whether it sets the default rule.
    fn is_default(&self) -> bool {
        self.target == "default"
    }

    /// Each `--rate` as given; with `--bytes`, a plain count is bytes.
    fn rates(&self) -> Vec<String> {
        self.rate
            .iter()
            .map(|r| {
                if self.bytes && !r.contains('B') && !r.contains("bit") {
                    let (amount, per) = r.split_once('/').unwrap_or((r, "s"));
                    format!("{amount}B/{per}")
                } else {
                    r.clone()
                }
            })
            .collect()
    }

    /// What the CLI checks before it asks a daemon: how many of each
    /// level's options were given, what the default rule takes, `--for`.
    pub(super) fn check(&self) -> Result<CheckedSet<'_>> {
        let rates = self.rate.len();
        if rates > ratelimit_common::MAX_KEY_LEVELS {
            return Err(Error::invalid(
                "--rate",
                format!(
                    "{rates} given; a rule has at most {} key levels, e.g. --per 32 --rate 100/s --per 24 --rate 1000/s --per 16 --rate 10k/s",
                    ratelimit_common::MAX_KEY_LEVELS
                ),
            ));
        }
        if rates <= 1 {
            for (flag, n) in [("--per", self.per.len()), ("--burst", self.burst.len())] {
                if n > 1 {
                    return Err(Error::invalid(
                        flag,
                        format!(
                            "given {n} times for one --rate; several levels need a --rate each"
                        ),
                    ));
                }
            }
        } else if self.is_default() {
            return Err(Error::invalid(
                "--rate",
                "the default rule's key levels are set in the config file (`levels` under [default], with per-v4 and per-v6)",
            ));
        } else if self.per.len() != rates {
            return Err(Error::invalid(
                "--per",
                format!(
                    "{} given for {rates} --rate: with several levels give each its own --per, in the same order (--per 32 --rate 100/s --per 24 --rate 1000/s)",
                    self.per.len(),
                ),
            ));
        } else if !self.burst.is_empty() && self.burst.len() != rates {
            return Err(Error::invalid(
                "--burst",
                format!(
                    "{} given for {rates} --rate: give one per --rate, in the same order, or none for one second's worth each",
                    self.burst.len(),
                ),
            ));
        }
        if self.is_default() && !self.per.is_empty() {
            return Err(Error::invalid(
                "--per",
                "the default rule covers both families; restart the daemon with --per-v4/--per-v6",
            ));
        }
        if self.is_default() && self.matches.any() {
            return Err(Error::invalid(
                "default",
                "the default rule matches every frame no rule takes; for a rule with a match give a CIDR, e.g. `ratelimit set 0.0.0.0/0 --proto tcp --syn --rate 20/s`",
            ));
        }
        Ok(CheckedSet {
            args: self,
            for_ms: self.change.for_ms()?,
        })
    }
}

/// `set`'s options once checked alone: the daemon is found, then the request
/// made (the daemon's checks of the values always came after it was found).
#[derive(Clone, Copy)]
pub(super) struct CheckedSet<'a> {
    args: &'a SetArgs,
    /// `--for`, ms.
    for_ms: Option<u64>,
}

impl CheckedSet<'_> {
    /// The request: each value parsed into the model's type, its errors
    /// naming the flag typed.
    pub(super) fn request(&self) -> Result<Request> {
        let CheckedSet { args: a, for_ms } = *self;
        let target = if a.is_default() {
            SetTarget::Default
        } else {
            SetTarget::Rule(a.matches.selector(&a.target)?)
        };
        let rates = a.rates();
        let duration = |flag: &str, v: &Option<String>| {
            v.as_deref().map(|d| parse_duration(flag, d)).transpose()
        };
        let rate = |flag: &str, v: Option<&String>| v.map(|r| parse_rate(flag, r)).transpose();
        let levels = rates
            .iter()
            .enumerate()
            .skip(1)
            .map(|(i, r)| {
                Ok(LevelPatch {
                    rate: parse_rate(&nth("--rate", i), r)?,
                    burst: a.burst.get(i).cloned(),
                    per: a.per[i],
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let limit = LimitPatch {
            rate: rate("--rate", rates.first())?,
            burst: a.burst.first().cloned(),
            per: if a.is_default() {
                None
            } else {
                a.per.first().copied()
            },
            dry_run: a.dry_run,
            algorithm: a.algorithm.clone(),
            limit: a.limit,
            window_ns: duration("--window", &a.window)?,
            refill_every_ns: duration("--refill-every", &a.refill_every)?,
            refill_amount: a.refill_amount,
            capacity: a.capacity,
            quota: a.quota,
            period_ns: duration("--period", &a.period)?,
            rate_cap: a.rate_cap,
            new_sources: a
                .new_sources
                .as_deref()
                .map(|n| NewSourcesGiven::parse("--new-sources", n))
                .transpose()?,
            new_sources_burst: a.new_sources_burst.clone(),
            aggregate: rate("--aggregate", a.aggregate.as_ref())?,
            aggregate_burst: a.aggregate_burst.clone(),
            aggregate_reserve: a.aggregate_reserve.clone(),
            fleet: a.fleet.then_some(true),
            host_connections: a.host_connections,
            levels: (!levels.is_empty()).then_some(levels),
        };
        Ok(Request::Set {
            target,
            limit: Box::new(limit),
            for_ms,
            force: a.force,
        })
    }
}
