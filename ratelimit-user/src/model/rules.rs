//! The validated rule model: prefixes, actions, limits, and the whole rule set,
//! and their translation into the kernel's `Rule` values. Everything here is
//! checked before any map is touched.

use std::{collections::BTreeMap, fmt};

pub use crate::model::matching::Selector;
pub use crate::model::{limit::*, prefix::*};
use crate::{
    error::{Error, Result},
    model::lists::{Allowed, List, ListAction},
    model::rate::{Rate, Unit},
};

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
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, serde::Deserialize, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Unjudged {
    /// Dropped (the default). Each value's whole meaning is its help
    /// (`--unjudged`, in `cli::values`).
    #[default]
    Drop,
    /// Judged by the rules that need nothing it hides.
    NextRule,
    /// Passed.
    Pass,
}

/// What happens to a non-first fragment (it carries no ports and no TCP
/// flags) under a rule whose match needs them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, serde::Deserialize, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Fragments {
    /// The rules that need ports or flags are skipped (the default). Each
    /// value's whole meaning, and why this one is safe, is its help
    /// (`--fragments`, in `cli::values`).
    #[default]
    NextRule,
    /// Dropped.
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
    /// [`crate::model::matching`]).
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
    /// The drop log's budget (records a second per CPU, or off).
    pub drop_log: super::droplog::DropLog,
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
            drop_log: super::droplog::DEFAULT_DROP_LOG,
        }
    }
}

/// How many keys of its own a limit must have, at the least, for a flood
/// spread over them (spoofed sources) to pass each key's limit unbounded:
/// 2^16 (an IPv4 /16 per /32, the default rule per address).
pub const MANY_KEYS_BITS: u8 = 16;

impl RuleSet {
    /// The limits that face many sources with nothing bounding them all
    /// together: a per-source limit (not a dry run) over at least
    /// 2^[`MANY_KEYS_BITS`] keys of one family, with no aggregate. A flood
    /// from a pool that large passes each key's limit (key levels are per
    /// key too); only an aggregate bounds it. Their names, the default
    /// rule's as `default`.
    pub fn without_aggregate(&self) -> Vec<String> {
        let many = |l: &Limit, v4: Option<bool>, len: u8| {
            let bits = |per: u8| per.saturating_sub(len) >= MANY_KEYS_BITS;
            !l.dry_run
                && l.aggregate.is_none()
                && match v4 {
                    Some(true) => bits(l.per_v4),
                    Some(false) => bits(l.per_v6),
                    None => bits(l.per_v4) || bits(l.per_v6),
                }
        };
        let mut out = Vec::new();
        if let Action::Limit(l) = &self.default
            && many(l, None, 0)
        {
            out.push("default".to_string());
        }
        for (p, a) in &self.rules {
            if let Action::Limit(l) = a
                && many(l, Some(p.source.addr.is_ipv4()), p.source.len)
            {
                out.push(p.to_string());
            }
        }
        out
    }

    /// The entries of the set's lists that take a trie entry of their own (what
    /// `--max-list-entries` counts), each with its list's action: every list's
    /// entries but those with exactly the CIDR of a rule without a match
    /// (explicit beats bulk), those given twice, and deny entries equal to or
    /// inside an allow list entry (allow wins). See `kernel::Maps::apply` for the
    /// precedence in the kernel.
    pub fn trie_entries(&self) -> Vec<(Selector, ListAction)> {
        let set = self;
        let allowed = Allowed::of(set.lists.values());
        let mut taken = std::collections::BTreeSet::new();
        let mut out = Vec::new();
        for action in [ListAction::Allow, ListAction::Deny] {
            for list in set.lists.values().filter(|l| l.action == action) {
                for p in list.entries.iter() {
                    let selector = Selector::from(*p);
                    if (action == ListAction::Deny && allowed.covers(p))
                        || set.rules.contains_key(&selector)
                        || !taken.insert(selector)
                    {
                        continue;
                    }
                    out.push((selector, action));
                }
            }
        }
        out
    }

    /// Whether any rule (or the default) is fleet-wide.
    pub fn has_fleet(&self) -> bool {
        std::iter::once(&self.default)
            .chain(self.rules.values())
            .any(|a| matches!(a, Action::Limit(Limit { fleet: true, .. })))
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
        let policies = crate::model::matching::Policies {
            unjudged: 0,
            fragments: 0,
        };
        crate::model::matching::compile(
            &indexes,
            &crate::model::matching::NoLists,
            0,
            policies,
            0,
        )?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ratelimit_common as common;

    #[test]
    fn limits_over_many_sources_without_an_aggregate_are_named() {
        let Action::Limit(base) = RuleSet::default().default else {
            panic!("the default rule is a limit");
        };
        let limit = |per: u8, aggregate: bool| {
            let mut l = base;
            l.per_v4 = per;
            l.per_v6 = 64;
            l.aggregate = aggregate.then(|| Shared::of(base.rate));
            Action::Limit(l)
        };
        let mut set = RuleSet {
            default: limit(32, false),
            ..RuleSet::default()
        };
        let rule = |cidr: &str| Selector::from(Prefix::parse("cidr", cidr).unwrap());
        // A /15 per /32: 2^17 keys. A /24 per /32: 256. A /16 per /24: 256.
        set.rules.insert(rule("198.18.0.0/15"), limit(32, false));
        set.rules.insert(rule("198.19.0.0/24"), limit(32, false));
        set.rules.insert(rule("198.19.128.0/17"), limit(24, false));
        set.rules.insert(rule("2001:db8::/32"), limit(32, false));
        set.rules
            .insert(rule("198.19.64.0/18"), Action::Deny { dry_run: false });
        assert_eq!(
            set.without_aggregate(),
            ["default", "198.18.0.0/15", "2001:db8::/32"]
        );
        set.default = limit(32, true);
        set.rules.insert(rule("198.18.0.0/15"), limit(32, true));
        assert_eq!(set.without_aggregate(), ["2001:db8::/32"]);
    }

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
        l.rate = crate::model::rate::parse_rate("--rate", "1/hour").unwrap();
        l.burst = 1000;
        let e = Action::Limit(l)
            .to_kernel(1, "default")
            .unwrap_err()
            .to_string();
        assert!(e.contains("1.6 days"), "{e}");
    }
}
