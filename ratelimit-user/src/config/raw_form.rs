//! The raw form of a validated rule set: what [`super::RawConfig::validate`]
//! reads back to the same rules. The daemon saves its live changes in this
//! form (see `daemon::store`).

use super::*;
use crate::{
    model::droplog::DropLog,
    model::matching::proto_name,
    model::rules::{Action, Algo, Fragments, HostConnections, Mode, NewSources, RuleSet, Unjudged},
};

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
            drop_log: (set.drop_log != DropLog::default()).then(|| set.drop_log.to_string()),
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
                        dport: m.dports.map(|p| match p.single() {
                            Some((a, b)) if a == b => RawNumberOrText::Number(a.into()),
                            _ => RawNumberOrText::Text(p.to_string()),
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
