//! What the CLI asks a daemon: one [`Request`] per connection, a JSON object
//! tagged by `cmd`. The CLI builds it from the command line, parsed into the
//! model's types where it can parse them alone; the daemon's control server
//! ([`crate::daemon::control`]) reads it and its handlers carry it out.
//!
//! `set` carries a [`LimitPatch`]: what the user gave and nothing else, for
//! the daemon to lay over the rule it has and validate whole. A burst stays
//! as typed: whether `1000` is packets or bytes depends on the rate, which may
//! be the rule's own.

use serde::{Deserialize, Serialize};

use crate::model::{
    lists::ListAction,
    matching::Selector,
    rate::{Rate, parse_rate},
    rules::{HostConnections, Mode},
};

/// A request from the CLI.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(tag = "cmd", rename_all = "kebab-case")]
pub enum Request {
    /// Set a limit on the default rule or a rule's selector.
    Set {
        /// Which rule.
        target: SetTarget,
        /// What the CLI was given, alone: on a rule that is already a limit
        /// the rest is kept.
        limit: Box<LimitPatch>,
        /// For this long, ms (`--for`); then what it replaced comes back.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        for_ms: Option<u64>,
        /// Take a byte burst below one full-size frame (`--force`).
        #[serde(default)]
        force: bool,
    },
    /// Exempt a CIDR (with its match).
    Allow {
        /// The rule's selector.
        #[serde(with = "selector_text")]
        rule: Selector,
        /// For this long, ms (`--for`); then what it replaced comes back.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        for_ms: Option<u64>,
    },
    /// Drop everything from a CIDR (with its match).
    Deny {
        /// The rule's selector.
        #[serde(with = "selector_text")]
        rule: Selector,
        /// For this long, ms (`--for`); then what it replaced comes back.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        for_ms: Option<u64>,
    },
    /// Remove the rule of a selector; a temporary one ends, and what it hid
    /// comes back.
    Unset {
        /// The rule's selector.
        #[serde(with = "selector_text")]
        rule: Selector,
        /// Only end a temporary rule; no change when the selector has none
        /// (`--only-temporary`: fail2ban's unban).
        #[serde(default)]
        only_temporary: bool,
    },
    /// Load a list whole, replacing the list of that name.
    LoadList {
        /// The list's name.
        name: String,
        /// Deny or allow.
        action: ListAction,
        /// Where the CLI read it (a path as typed, or `stdin`), for errors and
        /// `list`.
        source: String,
        /// The file's text, parsed by the daemon (the one writer checks what
        /// it writes; the CLI parsed it too, to say what is wrong sooner).
        text: String,
        /// For this long, ms (`--for`); then the list is removed.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        for_ms: Option<u64>,
    },
    /// Remove a list.
    UnsetList {
        /// The list's name.
        name: String,
    },
    /// Switch the mode.
    Mode {
        /// Normal or allowlist-only.
        mode: Mode,
    },
    /// A clean slate: remove rules and lists, leaving the default rule.
    Reset {
        /// Which layer.
        scope: ResetScope,
    },
    /// Read the config file again (keeping live changes unless `replace`).
    Reload {
        /// Drop the live changes: the file alone.
        #[serde(default)]
        replace: bool,
    },
    /// The rules.
    List {
        /// With each rule's counters (`list --stats`).
        #[serde(default)]
        counters: bool,
    },
    /// What runs and how.
    Status,
    /// Counters by reason.
    Stats,
    /// Sources with the most drops (the control server takes two snapshots
    /// of [`Request::Drops`] a little apart).
    Top {
        /// How many.
        n: usize,
    },
    /// Drop counts by source, now.
    Drops,
    /// The fleet's use of each key of the fleet-wide rules, from Redis (the
    /// control server asks Redis; see [`Request::FleetRules`]).
    FleetTop {
        /// How many keys per rule.
        n: usize,
    },
    /// Which rule judges a frame, and why.
    Explain {
        /// The frame.
        probe: crate::kernel::explain::Probe,
    },
    /// A source's state under every limit rule that may judge it.
    Get {
        /// The source.
        source: std::net::IpAddr,
    },
    /// The fleet's Redis and the names of the fleet-wide rules.
    FleetRules,
    /// The drop log: the entries after a cursor.
    Log {
        /// The first sequence number wanted; absent: the last `n` entries.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        after: Option<u64>,
        /// How many entries at most.
        n: usize,
    },
}

impl Request {
    /// Whether it changes what is enforced.
    pub fn is_change(&self) -> bool {
        matches!(
            self,
            Request::Set { .. }
                | Request::Allow { .. }
                | Request::Deny { .. }
                | Request::Unset { .. }
                | Request::LoadList { .. }
                | Request::UnsetList { .. }
                | Request::Mode { .. }
                | Request::Reset { .. }
                | Request::Reload { .. }
        )
    }
}

/// What `ratelimit reset` removes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ResetScope {
    /// Every rule and list, live or of the config file, and the mode back to
    /// normal: only the default rule is left.
    All,
    /// The live changes only (temporary ones too): what the config file
    /// says is enforced again.
    Live,
    /// The config file's rules and lists only (removed until
    /// `reload --replace`); the live changes stay.
    Config,
}

/// The rule `set` changes.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "kebab-case")]
pub enum SetTarget {
    /// The default rule: frames no rule takes.
    Default,
    /// The rule of a selector (a CIDR and its match).
    Rule(#[serde(with = "selector_text")] Selector),
}

/// What `set` was given, each option parsed into the model's type where it
/// can be alone; absent: not given (the rule's own, or the default, stays).
/// Named after the options; durations in ns.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct LimitPatch {
    /// `--rate` (the first): the rule's own level (gcra).
    #[serde(default, skip_serializing_if = "Option::is_none", with = "rate_text")]
    pub rate: Option<Rate>,
    /// `--burst` (the first), as typed: a count, or a size for byte rates.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub burst: Option<String>,
    /// `--per` (the first): the key prefix of the rule's family.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub per: Option<u8>,
    /// `--dry-run`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dry_run: Option<bool>,
    /// `--algorithm`, by name (the model has no algorithm without its
    /// parameters: the daemon reads the name with those of the rule).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub algorithm: Option<String>,
    /// `--limit`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<u64>,
    /// `--window`, ns.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub window_ns: Option<u64>,
    /// `--refill-every`, ns.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refill_every_ns: Option<u64>,
    /// `--refill-amount`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refill_amount: Option<u64>,
    /// `--capacity`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capacity: Option<u64>,
    /// `--quota`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quota: Option<u64>,
    /// `--period`, ns.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub period_ns: Option<u64>,
    /// `--rate-cap`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate_cap: Option<u64>,
    /// `--new-sources`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub new_sources: Option<NewSourcesGiven>,
    /// `--new-sources-burst`, as typed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub new_sources_burst: Option<String>,
    /// `--aggregate`.
    #[serde(default, skip_serializing_if = "Option::is_none", with = "rate_text")]
    pub aggregate: Option<Rate>,
    /// `--aggregate-burst`, as typed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub aggregate_burst: Option<String>,
    /// `--aggregate-reserve`, as typed: a count or a share of the
    /// aggregate's burst (`50%`), which may be the rule's own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub aggregate_reserve: Option<String>,
    /// `--fleet`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fleet: Option<bool>,
    /// `--host-connections`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_connections: Option<HostConnections>,
    /// The second and third `--rate`, each with its `--per` and `--burst`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub levels: Option<Vec<LevelPatch>>,
}

/// A key level beyond the rule's own, as `set` was given it.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct LevelPatch {
    /// Its `--rate`.
    #[serde(with = "rate_text")]
    pub rate: Rate,
    /// Its `--burst`, as typed; one second's worth when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub burst: Option<String>,
    /// Its `--per`: the key prefix of the rule's family.
    pub per: u8,
}

/// `--new-sources`: a budget's rate, or none.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NewSourcesGiven {
    /// `unlimited`.
    Unlimited,
    /// A rate like `10k/s`.
    Rate(Rate),
}

impl NewSourcesGiven {
    /// The word for no budget.
    pub const UNLIMITED: &str = "unlimited";

    /// Parses `unlimited` or a rate; errors name `field`.
    pub fn parse(field: &str, s: &str) -> crate::Result<Self> {
        if s == Self::UNLIMITED {
            return Ok(Self::Unlimited);
        }
        parse_rate(field, s).map(Self::Rate).map_err(Into::into)
    }

    /// The form [`NewSourcesGiven::parse`] reads back the same.
    pub fn text(&self) -> String {
        match self {
            Self::Unlimited => Self::UNLIMITED.into(),
            Self::Rate(r) => r.exact(),
        }
    }
}

impl Serialize for NewSourcesGiven {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.text())
    }
}

impl<'de> Deserialize<'de> for NewSourcesGiven {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        Self::parse("new-sources", &s).map_err(serde::de::Error::custom)
    }
}

/// A rate on the wire: its exact form (`100/1000000000ns`), which
/// [`parse_rate`] reads back to the same rate.
mod rate_text {
    use serde::{Deserialize as _, Deserializer, Serializer};

    use super::{Rate, parse_rate};

    pub(super) trait Wire: Sized {
        fn put<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error>;
        fn take<'de, D: Deserializer<'de>>(d: D) -> Result<Self, D::Error>;
    }

    fn read<'de, D: Deserializer<'de>>(d: D) -> Result<Rate, D::Error> {
        let s = String::deserialize(d)?;
        parse_rate("rate", &s).map_err(serde::de::Error::custom)
    }

    impl Wire for Rate {
        fn put<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
            s.serialize_str(&self.exact())
        }
        fn take<'de, D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
            read(d)
        }
    }

    impl Wire for Option<Rate> {
        fn put<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
            match self {
                Some(r) => s.serialize_some(&r.exact()),
                None => s.serialize_none(),
            }
        }
        fn take<'de, D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
            Option::<String>::deserialize(d)?
                .map(|s| parse_rate("rate", &s).map_err(serde::de::Error::custom))
                .transpose()
        }
    }

    pub(super) fn serialize<T: Wire, S: Serializer>(v: &T, s: S) -> Result<S::Ok, S::Error> {
        v.put(s)
    }

    pub(super) fn deserialize<'de, T: Wire, D: Deserializer<'de>>(d: D) -> Result<T, D::Error> {
        T::take(d)
    }
}

/// A selector on the wire: its text form (`198.18.0.0/15 udp dport 53`),
/// read back with [`Selector::parse`], which checks it.
mod selector_text {
    use serde::{Deserialize as _, Deserializer, Serializer};

    use super::Selector;

    pub(super) fn serialize<S: Serializer>(v: &Selector, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(v)
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Selector, D::Error> {
        let s = String::deserialize(d)?;
        Selector::parse("CIDR", &s).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn round_trip(r: &Request) -> Request {
        let line = serde_json::to_string(r).unwrap();
        serde_json::from_str(&line).unwrap_or_else(|e| panic!("{line}: {e}"))
    }

    #[test]
    fn a_set_keeps_its_types_on_the_wire() {
        let r = Request::Set {
            target: SetTarget::Rule(Selector::parse("CIDR", "198.18.0.0/15 udp dport 53").unwrap()),
            limit: Box::new(LimitPatch {
                rate: Some(parse_rate("--rate", "30/min").unwrap()),
                burst: Some("64KB".into()),
                new_sources: Some(NewSourcesGiven::Unlimited),
                aggregate: Some(parse_rate("--aggregate", "1Gbit/s").unwrap()),
                window_ns: Some(60_000_000_000),
                levels: Some(vec![LevelPatch {
                    rate: parse_rate("--rate", "1000/s").unwrap(),
                    burst: None,
                    per: 24,
                }]),
                ..Default::default()
            }),
            for_ms: Some(600_000),
            force: false,
        };
        assert_eq!(round_trip(&r), r);
        let default = Request::Set {
            target: SetTarget::Default,
            limit: Box::default(),
            for_ms: None,
            force: true,
        };
        assert_eq!(round_trip(&default), default);
    }

    #[test]
    fn a_list_request_starts_with_its_tag() {
        // The control server reads a long line only for a list, known by
        // its first bytes.
        let r = Request::LoadList {
            name: "bans".into(),
            action: ListAction::Deny,
            source: "stdin".into(),
            text: "198.18.0.1\n".into(),
            for_ms: None,
        };
        let line = serde_json::to_string(&r).unwrap();
        assert!(line.starts_with(r#"{"cmd":"load-list""#), "{line}");
    }

    #[test]
    fn a_selector_the_daemon_cannot_read_is_a_bad_request() {
        let bad = r#"{"cmd":"deny","rule":"198.18.0.0/33"}"#;
        let e = serde_json::from_str::<Request>(bad)
            .unwrap_err()
            .to_string();
        assert!(e.contains("invalid prefix"), "{e}");
        let ok = r#"{"cmd":"allow","rule":"198.18.0.0/15 tcp dport 80"}"#;
        assert!(matches!(
            serde_json::from_str::<Request>(ok),
            Ok(Request::Allow { for_ms: None, .. })
        ));
    }
}
