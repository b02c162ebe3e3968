//! The rules in the kernel's words: an action as the program's `Rule` value
//! and back, and a rule set's global `Config`. Reading back is what a daemon
//! falls back to when its own record of the rules is lost: the kernel's maps
//! are the truth.

use std::collections::BTreeMap;

use ratelimit_common::{self as common, AlgoParams, action, algorithm, gcra, rule_flags};

use crate::{
    error::{Error, Result},
    model::{limit::*, matching::Selector, rate::Unit, rules::*},
};

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
                // The union's reads: plain integers in every member; see
                // AlgoParams.
                let algo = match r.algorithm {
                    algorithm::INTERVAL => {
                        // SAFETY: plain integers, as every member of the union.
                        let i = unsafe { p.interval };
                        Algo::Interval {
                            every_ns: i.every_ns,
                            amount: i.amount,
                            capacity: i.capacity,
                        }
                    }
                    algorithm::FIXED_WINDOW => {
                        // SAFETY: plain integers, as every member of the union.
                        let w = unsafe { p.fixed_window };
                        Algo::FixedWindow {
                            window_ns: w.window_ns,
                            limit: w.limit,
                        }
                    }
                    algorithm::SLIDING_LOG => {
                        // SAFETY: plain integers, as every member of the union.
                        let w = unsafe { p.sliding_log };
                        Algo::SlidingLog {
                            window_ns: w.window_ns,
                            limit: w.limit,
                        }
                    }
                    algorithm::SLIDING_WINDOW => {
                        // SAFETY: plain integers, as every member of the union.
                        let w = unsafe { p.sliding_window };
                        Algo::SlidingWindow {
                            window_ns: w.window_ns,
                            limit: w.limit,
                        }
                    }
                    algorithm::ROLLING_QUOTA => {
                        // SAFETY: plain integers, as every member of the union.
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

impl RuleSet {
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
            drop_log: super::droplog::DropLog(config.drop_log_rate),
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
            drop_log_rate: self.drop_log.0,
            new_states: self.new_states.params("--new-states")?,
            ..Default::default()
        })
    }
}
