//! The config file's schema: what serde reads a TOML file (and `run`'s rule
//! options, and the saved live changes) into, before anything is validated.
//! Every field is optional or a string as written, so that an error can name
//! the key and say what it holds; [`super::limit`] and [`super::set`] turn
//! them into the model's types.

use serde::Deserialize;

use crate::model::rules::{Clock, Fragments, HostConnections, MalformedPolicy, Mode, Unjudged};

/// A protocol or a port as written: a number, or text (`"tcp"`, `"27015-27020"`).
#[derive(Clone, Debug, Deserialize, serde::Serialize, PartialEq)]
#[serde(untagged)]
pub enum RawNumberOrText {
    /// A number (`6`, `443`).
    Number(u64),
    /// Text (`"tcp"`, `"27015-27020"`).
    Text(String),
}

impl RawNumberOrText {
    pub(super) fn text(&self) -> String {
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
pub(super) const ALGO_PARAMS: &str = "gcra takes rate and burst; token-bucket-interval takes refill-every, refill-amount and capacity; fixed-window, sliding-log and sliding-window take limit and window; rolling-quota takes quota, window, period and rate-cap";

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
    /// The drop log: records a second per CPU (`"100/s"`) or `"off"`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub drop_log: Option<String>,
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

/// The keys each table of the file takes, as serde reads them: the table as
/// `ratelimit.toml(5)` names it (`""` for the top level), and its keys. For
/// the page's test: a key added here and not there fails it.
#[cfg(test)]
pub(crate) fn tables() -> Vec<(&'static str, Vec<&'static str>)> {
    use ratelimit_host::config_file::fields;
    // A rule's limit is flattened (serde then lists no keys): its own keys,
    // which `check` reads it by, and the limit's.
    let rule = RawRule::OWN_KEYS
        .into_iter()
        .chain(fields::<RawLimit>())
        .collect();
    vec![
        ("", fields::<RawConfig>()),
        ("[default]", fields::<RawLimit>()),
        ("[[rule]]", rule),
        ("levels", fields::<RawLevel>()),
        ("[[list]]", fields::<RawList>()),
    ]
}
