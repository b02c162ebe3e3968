//! The rules as programs read them: `ratelimit list --json`, and the rules
//! before and after a change. Numbers are numbers with their unit beside
//! them (rates as an integer or with two decimals, see
//! [`describe::number`]), times are RFC 3339 in UTC; each rule also carries
//! its `text`, the line `ratelimit list` prints. Built from the model by the
//! daemon's handlers and its read-only path; read by the CLI's printers.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Number;

use super::Offline;
use crate::model::{
    describe::{self, rfc3339},
    lists::ListAction,
    rate::{Rate, Unit},
    rules::{
        Action, Algo, Fragments, HostConnections, Limit, MalformedPolicy, Mode, NewSources,
        Selector, Shared, Unjudged, default_aggregate_reserve,
    },
};

/// `ratelimit list`: the rules in force, in the order they are tried.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Rules {
    /// The default rule: what no rule takes.
    pub default: DefaultView,
    /// Dry run for everything.
    pub dry_run: bool,
    /// Normal or allowlist-only.
    pub mode: Mode,
    /// What the program does with IP it cannot judge.
    pub unjudged: Unjudged,
    /// What non-first fragments meet under a rule that matches ports or flags.
    pub fragments: Fragments,
    /// Whether malformed IP frames pass.
    pub malformed: MalformedPolicy,
    /// The clock decisions are made on, and what it means for a key.
    pub clock: String,
    /// The cap on states created per second, as people write it.
    pub new_states: String,
    /// By source, and a source's rules in the order they are tried.
    pub rules: Vec<RuleView>,
    /// The source lists.
    pub lists: Vec<ListView>,
    /// How many rules, lists and defaults the live changes set.
    pub live_changes: usize,
    /// Where the pins are, when read from them with no daemon.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pins: Option<String>,
    /// Read from the pins with no daemon.
    #[serde(flatten)]
    pub offline: Option<Offline>,
}

/// The default rule, with its counters under `list --stats`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct DefaultView {
    /// What it does.
    #[serde(flatten)]
    pub action: ActionView,
    /// Its counters (`list --stats`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub counters: Option<Counters>,
}

/// A rule: its selector, what it does, when it ends.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RuleView {
    /// Its selector: the source CIDR, then its match.
    pub cidr: String,
    /// The source CIDR.
    pub source: String,
    /// What it matches besides the source; empty for every frame.
    #[serde(rename = "match")]
    pub matches: String,
    /// The source's family.
    pub family: Family,
    /// What it does.
    #[serde(flatten)]
    pub action: ActionView,
    /// When it ends (temporary rules), RFC 3339 UTC.
    pub expires_at: Option<String>,
    /// In how many seconds it ends; 0 or less when its time is up.
    pub expires_in_s: Option<Number>,
    /// Its place among its source's rules, from 1 (`list`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub order: Option<usize>,
    /// Where it comes from (`list`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub origin: Option<Origin>,
    /// Its counters (`list --stats`; absent for a rule the kernel does not
    /// hold).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub counters: Option<Counters>,
}

/// A rule's counters (packets and bytes) by [`ratelimit_common::RuleCounter`]
/// name, read from the maps when asked.
pub type Counters = BTreeMap<String, Count>;

/// Frames counted and their bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Count {
    /// Frames.
    pub packets: u64,
    /// Their lengths from the Ethernet header on, bytes.
    pub bytes: u64,
}

impl From<ratelimit_common::Counter> for Count {
    fn from(c: ratelimit_common::Counter) -> Self {
        Self {
            packets: c.packets,
            bytes: c.bytes,
        }
    }
}

/// A source's family.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Family {
    /// IPv4.
    Ipv4,
    /// IPv6.
    Ipv6,
}

/// Where a rule or list comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Origin {
    /// The config file (or `run`'s options).
    Config,
    /// A live change.
    Live,
    /// CrowdSec's decisions (`run --crowdsec`).
    Crowdsec,
}

impl Origin {
    /// From the store's word.
    pub fn of(word: &str) -> Self {
        if word == "live" {
            Origin::Live
        } else if word == "crowdsec" {
            Origin::Crowdsec
        } else {
            Origin::Config
        }
    }
}

/// What a rule does: `action`, `dry_run`, `text`, and for a limit its
/// algorithm and parameters.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ActionView {
    /// Limit, allow or deny.
    pub action: ActionName,
    /// Never drops; counts would-drops.
    pub dry_run: bool,
    /// The line `ratelimit list` prints.
    pub text: String,
    /// A limit's algorithm and parameters.
    #[serde(flatten)]
    pub limit: Option<LimitView>,
}

/// An action's name.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ActionName {
    /// Limited.
    Limit,
    /// Never limited.
    Allow,
    /// Dropped.
    Deny,
}

/// A limit: its algorithm and its parameters, levels and shared buckets.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LimitView {
    /// The algorithm's name.
    pub algorithm: String,
    /// The rate (gcra).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate: Option<RateView>,
    /// The burst (gcra).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub burst: Option<Amount>,
    /// The other algorithms' parameters.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub params: Option<Params>,
    /// The key prefix of the rule's family (both for the default rule).
    pub per: Per,
    /// The key levels beyond the rule's own.
    pub levels: Vec<LevelView>,
    /// The aggregate: all the rule's sources together.
    pub aggregate: Option<AggregateView>,
    /// The budget for sources without state.
    pub new_sources: NewSourcesView,
    /// Held across the fleet.
    pub fleet: bool,
    /// What it does to the host's own connections.
    pub host_connections: HostConnections,
}

/// A rate: `amount` per `period_s` (in the shortest of 1 s, 1 min, 1 h and
/// 1 day that makes the amount whole), its per-second value and its unit.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RateView {
    /// Per second.
    pub per_second: Option<Number>,
    /// Per `period_s`.
    pub amount: Option<Number>,
    /// The period the rate is whole in, s.
    pub period_s: u64,
    /// Packets or bytes.
    pub unit: Unit,
    /// As people read it.
    pub text: String,
}

/// An amount of a unit: a burst, a reserve.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Amount {
    /// How many.
    pub amount: u64,
    /// Of what.
    pub unit: Unit,
}

/// A token bucket: its rate and its burst.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct BucketView {
    /// The rate.
    pub rate: RateView,
    /// The burst.
    pub burst: Amount,
}

/// Key prefixes: the rule's family's, or both for the default rule.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Per {
    /// IPv4's, bits.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ipv4: Option<u8>,
    /// IPv6's, bits.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ipv6: Option<u8>,
}

/// A key level beyond a rule's own.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LevelView {
    /// Its bucket per key.
    #[serde(flatten)]
    pub bucket: BucketView,
    /// 2 or 3.
    pub level: usize,
    /// Its keys' prefix.
    pub per: Per,
}

/// The aggregate level, with its reserve for established sources.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct AggregateView {
    /// The bucket all the rule's sources share.
    #[serde(flatten)]
    pub bucket: BucketView,
    /// What only sources established before a flood may take.
    pub reserve: Amount,
}

/// A budget for sources without state, or none.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum NewSourcesView {
    /// At most this, all such sources together.
    Budget(BucketView),
    /// `"unlimited"`.
    Unlimited(Unlimited),
}

/// The word `unlimited`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Unlimited {
    /// No budget.
    Unlimited,
}

/// The parameters of the algorithms other than gcra.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Params {
    /// rolling-quota.
    RollingQuota {
        /// Its window, s.
        window_s: Option<Number>,
        /// Packets per window.
        quota: u64,
        /// Its period, s.
        period_s: Option<Number>,
        /// Packets per period.
        rate_cap: u64,
    },
    /// token-bucket-interval.
    Interval {
        /// Refill period, s.
        refill_every_s: Option<Number>,
        /// Tokens per refill.
        refill_amount: u64,
        /// Bucket size.
        capacity: u64,
    },
    /// fixed-window, sliding-log and sliding-window.
    Window {
        /// The window, s.
        window_s: Option<Number>,
        /// Packets per window.
        limit: u64,
    },
}

/// A source list.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ListView {
    /// Its name.
    pub name: String,
    /// Deny or allow.
    pub action: ListAction,
    /// Its CIDRs.
    pub entries: usize,
    /// Entries that do nothing: a rule or an allow entry wins over them.
    pub shadowed: usize,
    /// The file it was read from (or `stdin`).
    pub source: String,
    /// Where it comes from.
    pub origin: Origin,
    /// When it ends (temporary lists), RFC 3339 UTC.
    pub expires_at: Option<String>,
    /// In how many seconds it ends.
    pub expires_in_s: Option<Number>,
    /// The frames it judged since it was loaded:
    /// dropped (a deny list, also in allowlist-only mode) or passed (an
    /// allow list) (`list --stats`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub counters: Option<Count>,
}

fn seconds(ns: u64) -> Option<Number> {
    describe::number(ns as f64 / 1e9)
}

impl RateView {
    /// A rate as programs read it.
    pub fn of(r: &Rate) -> Self {
        // The shortest whole period the rate is written in (1 s, 1 min, 1 h, …).
        let (amount, period_s) = [1u64, 60, 3600, 86_400]
            .into_iter()
            .map(|s| (r.per_second() * s as f64, s))
            .find(|(a, _)| *a >= 1.0 && (*a - a.round()).abs() < 1e-9)
            .unwrap_or((r.per_second(), 1));
        Self {
            per_second: describe::number(r.per_second()),
            amount: describe::number(amount),
            period_s,
            unit: r.unit,
            text: r.to_string(),
        }
    }
}

impl BucketView {
    fn of(s: &Shared) -> Self {
        Self {
            rate: RateView::of(&s.rate),
            burst: Amount {
                amount: s.burst,
                unit: s.rate.unit,
            },
        }
    }
}

impl Per {
    /// Key prefixes: the family of the rule's own (`family_v4`), both for the
    /// default rule.
    fn of(v4: u8, v6: u8, family_v4: Option<bool>) -> Self {
        Self {
            ipv4: (family_v4 != Some(false)).then_some(v4),
            ipv6: (family_v4 != Some(true)).then_some(v6),
        }
    }
}

impl LimitView {
    fn of(l: &Limit, family_v4: Option<bool>) -> Self {
        let gcra = l.algo == Algo::Gcra;
        let params = match l.algo {
            Algo::Gcra => None,
            Algo::Interval {
                every_ns,
                amount,
                capacity,
            } => Some(Params::Interval {
                refill_every_s: seconds(every_ns),
                refill_amount: amount,
                capacity,
            }),
            Algo::FixedWindow { window_ns, limit }
            | Algo::SlidingLog { window_ns, limit }
            | Algo::SlidingWindow { window_ns, limit } => Some(Params::Window {
                window_s: seconds(window_ns),
                limit,
            }),
            Algo::RollingQuota {
                window_ns,
                period_ns,
                quota,
                rate_cap,
            } => Some(Params::RollingQuota {
                window_s: seconds(window_ns),
                quota,
                period_s: seconds(period_ns),
                rate_cap,
            }),
        };
        Self {
            algorithm: l.algo.name().into(),
            rate: gcra.then(|| RateView::of(&l.rate)),
            burst: gcra.then_some(Amount {
                amount: l.burst,
                unit: l.rate.unit,
            }),
            params,
            per: Per::of(l.per_v4, l.per_v6, family_v4),
            levels: l
                .levels
                .iter()
                .flatten()
                .enumerate()
                .map(|(i, k)| LevelView {
                    bucket: BucketView::of(&k.bucket),
                    level: i + 2,
                    per: Per::of(k.per_v4, k.per_v6, family_v4),
                })
                .collect(),
            aggregate: l.aggregate.as_ref().map(|a| AggregateView {
                bucket: BucketView::of(a),
                reserve: Amount {
                    amount: l
                        .aggregate_reserve
                        .unwrap_or(default_aggregate_reserve(a.burst)),
                    unit: a.rate.unit,
                },
            }),
            new_sources: match &l.new_sources {
                NewSources::Budget(b) => NewSourcesView::Budget(BucketView::of(b)),
                NewSources::Unlimited => NewSourcesView::Unlimited(Unlimited::Unlimited),
            },
            fleet: l.fleet,
            host_connections: l.host_connections,
        }
    }
}

impl ActionView {
    /// An action as programs read it. `family_v4`: the rule's family (`None`
    /// for the default rule).
    pub fn of(a: &Action, family_v4: Option<bool>) -> Self {
        let (action, dry_run) = match a {
            Action::Allow => (ActionName::Allow, false),
            Action::Deny { dry_run } => (ActionName::Deny, *dry_run),
            Action::Limit(l) => (ActionName::Limit, l.dry_run),
        };
        Self {
            action,
            dry_run,
            text: a.text(family_v4),
            limit: match a {
                Action::Limit(l) => Some(LimitView::of(l, family_v4)),
                _ => None,
            },
        }
    }
}

/// When something temporary ends, as programs read it: RFC 3339 (UTC), and
/// in seconds from `now_ms`; both null for what does not end.
pub fn expiry(expires_at_ms: Option<u64>, now_ms: u64) -> (Option<String>, Option<Number>) {
    (
        expires_at_ms.map(rfc3339),
        expires_at_ms.and_then(|ms| describe::number(ms.saturating_sub(now_ms) as f64 / 1000.0)),
    )
}

impl RuleView {
    /// A rule: its selector, what it does, and when it ends (`expires_at_ms`,
    /// Unix ms, for a temporary rule).
    pub fn of(p: &Selector, a: &Action, expires_at_ms: Option<u64>, now_ms: u64) -> Self {
        let v4 = p.source.addr.is_ipv4();
        let (expires_at, expires_in_s) = expiry(expires_at_ms, now_ms);
        Self {
            cidr: p.to_string(),
            source: p.source.to_string(),
            matches: p.matches.to_string(),
            family: if v4 { Family::Ipv4 } else { Family::Ipv6 },
            action: ActionView::of(a, Some(v4)),
            expires_at,
            expires_in_s,
            order: None,
            origin: None,
            counters: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::model::rate::parse_rate;

    #[test]
    fn rates_keep_the_period_they_were_written_in() {
        assert_eq!(
            json!(RateView::of(&parse_rate("--rate", "30/min").unwrap())),
            json!({"per_second": 0.5, "amount": 30, "period_s": 60, "unit": "packets", "text": "30/min"})
        );
        assert_eq!(
            json!(RateView::of(&parse_rate("--rate", "10Mbit/s").unwrap())),
            json!({
                "per_second": 1_250_000,
                "amount": 1_250_000,
                "period_s": 1,
                "unit": "bytes",
                "text": "1.25MB/s (10Mbit/s)"
            })
        );
    }

    #[test]
    fn an_aggregate_shows_its_reserve_default_or_given() {
        let mut l = crate::model::rules::default_limit();
        l.aggregate = Some(Shared::of(parse_rate("--aggregate", "2000/s").unwrap()));
        let reserve = |l: &Limit| LimitView::of(l, None).aggregate.map(|a| a.reserve);
        let packets = |amount| Amount {
            amount,
            unit: Unit::Packets,
        };
        assert_eq!(reserve(&l), Some(packets(1000)), "half the burst");
        l.aggregate_reserve = Some(0);
        assert_eq!(reserve(&l), Some(packets(0)));
    }

    /// Every algorithm and option, as a rule and as the default rule: what
    /// the daemon writes, the CLI reads back and prints again the same.
    #[test]
    fn every_rule_reads_back_as_it_was_written() {
        let s = |text: &str| Selector::parse("CIDR", text).unwrap();
        let mut agg = crate::model::rules::default_limit();
        agg.aggregate = Some(Shared::of(parse_rate("--aggregate", "1Gbit/s").unwrap()));
        agg.new_sources = NewSources::Unlimited;
        agg.fleet = true;
        agg.host_connections = HostConnections::Limit;
        let mut levels = crate::model::rules::default_limit();
        levels.levels[0] = Some(crate::model::limit::KeyLevel {
            bucket: Shared::of(parse_rate("--rate", "1/hour").unwrap()),
            per_v4: 24,
            per_v6: 48,
        });
        let algos = [
            Algo::Interval {
                every_ns: 1_500_000_000,
                amount: 10,
                capacity: 20,
            },
            Algo::SlidingLog {
                window_ns: 60_000_000_000,
                limit: 5,
            },
            Algo::RollingQuota {
                window_ns: 3_600_000_000_000,
                period_ns: 60_000_000_000,
                quota: 1000,
                rate_cap: 100,
            },
        ];
        let mut actions = vec![
            Action::Allow,
            Action::Deny { dry_run: true },
            Action::Limit(agg),
            Action::Limit(levels),
        ];
        for algo in algos {
            let mut l = crate::model::rules::default_limit();
            l.algo = algo;
            actions.push(Action::Limit(l));
        }
        for a in &actions {
            for (sel, at) in [
                ("198.18.0.0/15 udp dport 53", None),
                ("2001:db8::/32", Some(90_000)),
            ] {
                let view = RuleView::of(&s(sel), a, at, 1_000);
                let written = serde_json::to_value(&view).unwrap();
                let read: RuleView = serde_json::from_value(written.clone()).unwrap();
                assert_eq!(read, view, "{written}");
                assert_eq!(serde_json::to_value(&read).unwrap(), written);
            }
            let view = ActionView::of(a, None);
            let written = serde_json::to_value(&view).unwrap();
            let read: ActionView = serde_json::from_value(written.clone()).unwrap();
            assert_eq!(serde_json::to_value(&read).unwrap(), written);
            assert!(written.get("cidr").is_none() && written.get("expires_at").is_none());
            if let Some(l) = &read.limit {
                // The default rule covers both families.
                assert!(l.per.ipv4.is_some() && l.per.ipv6.is_some(), "{written}");
            }
        }
    }
}
