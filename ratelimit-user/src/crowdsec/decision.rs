//! A decision as the Local API's stream gives it, and what the daemon makes
//! of it: a ban of an `Ip` or a `Range` of a type the operator applies, from
//! an origin and scenario the filters let through, becomes a
//! [`model::decisions::Decision`](crate::model::decisions::Decision); any
//! other is counted as ignored, by why.
//!
//! Pure: the clock comes in as an argument.

use std::net::IpAddr;

use serde::Deserialize;

use crate::model::{decisions::Decision, matching::contains, prefix::Prefix};

/// One decision of `GET /v1/decisions/stream` (`new` or `deleted`).
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(default)]
pub struct RawDecision {
    /// Its id in the Local API.
    pub id: u64,
    /// `crowdsec`, `cscli`, `CAPI`, `lists`, …
    pub origin: String,
    /// The scenario that made it (`crowdsecurity/ssh-bf`, `manual 'ban' from …`).
    pub scenario: String,
    /// `Ip`, `Range`, `Country`, `AS`, … (case varies between versions).
    pub scope: String,
    /// `ban`, `captcha`, or a type of the operator's own.
    #[serde(rename = "type")]
    pub kind: String,
    /// The address, range, country, …
    pub value: String,
    /// Time left, a Go duration (`3h59m58.2s`; negative once ended).
    pub duration: String,
}

/// The stream's answer.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(default)]
pub struct Stream {
    /// Decisions since the last pull (or all of them, on `startup=true`).
    pub new: Option<Vec<RawDecision>>,
    /// Decisions deleted or ended since the last pull.
    pub deleted: Option<Vec<RawDecision>>,
}

/// Which decisions are applied (`run --crowdsec-*`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Filter {
    /// Decision types applied as bans (lower case); the others are ignored.
    pub types: Vec<String>,
    /// Only these origins (lower case), when not empty.
    pub origins: Vec<String>,
    /// Only scenarios that contain one of these (lower case), when not empty.
    pub scenarios: Vec<String>,
    /// No scenario that contains one of these (lower case).
    pub not_scenarios: Vec<String>,
    /// The widest IPv4 network a decision may ban (its prefix length; an
    /// IPv4-mapped range is judged as IPv4).
    pub widest_v4: u8,
    /// The widest IPv6 network a decision may ban.
    pub widest_v6: u8,
    /// Origins (lower case) whose decisions may be wider.
    pub broad_origins: Vec<String>,
    /// The longest a ban is held, ms: a longer one is held this long.
    pub longest_ms: u64,
    /// What must stay reachable: loopback, the host's own addresses and
    /// the Local API's (the bouncer sets them at each pull). A decision
    /// that covers one, or lies within one, is not applied.
    pub protected: Vec<Prefix>,
}

/// [`Filter::widest_v4`]'s default: no feed bans more than a /8.
pub const WIDEST_V4: u8 = 8;
/// [`Filter::widest_v6`]'s default: no feed bans more than a /32.
pub const WIDEST_V6: u8 = 32;
/// [`Filter::longest_ms`]'s default: 30 days.
pub const LONGEST_MS: u64 = 30 * 24 * 3600 * 1000;

impl Default for Filter {
    fn default() -> Self {
        Self {
            types: vec!["ban".into()],
            origins: Vec::new(),
            scenarios: Vec::new(),
            not_scenarios: Vec::new(),
            widest_v4: WIDEST_V4,
            widest_v6: WIDEST_V6,
            broad_origins: Vec::new(),
            longest_ms: LONGEST_MS,
            protected: loopback(),
        }
    }
}

/// Loopback, IPv4 and IPv6.
pub fn loopback() -> Vec<Prefix> {
    ["127.0.0.0/8", "::1/128"]
        .iter()
        .filter_map(|p| Prefix::parse("loopback", p).ok())
        .collect()
}

/// Why a decision was not applied.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Ignored {
    /// A type not in `--crowdsec-types` (`captcha`, by default).
    Type,
    /// A scope other than `Ip` and `Range` (`Country`, `AS`, `Username`, …),
    /// or a value that is not an address or a network.
    Scope,
    /// Left out by `--crowdsec-origins`, `--crowdsec-scenarios` or
    /// `--crowdsec-not-scenarios`.
    Filtered,
    /// Already ended.
    Ended,
    /// A network wider than `--crowdsec-widest` from an origin not in
    /// `--crowdsec-broad-origins`: a ban that would cut off most of the
    /// Internet (0.0.0.0/0, ::/0), never one source's.
    TooBroad,
    /// A duration that is not one (`1e3s`, `NaNs`, `.s`): not applied, and
    /// counted rather than taken for ended.
    Duration,
    /// Covers what must stay reachable ([`Filter::protected`]): loopback,
    /// the host's own addresses, the Local API's.
    Protected,
}

/// A decision the daemon applies.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Kept {
    /// The decision.
    pub decision: Decision,
    /// Its duration was longer than `--crowdsec-longest` and was cut to it.
    pub clipped: bool,
}

impl Filter {
    /// The decision `raw` as the daemon applies it (ending its time left
    /// after `now_ms`), or why not.
    pub fn decide(&self, raw: &RawDecision, now_ms: u64) -> Result<Kept, Ignored> {
        let lower = |s: &str| s.to_ascii_lowercase();
        if !self.types.contains(&lower(&raw.kind)) {
            return Err(Ignored::Type);
        }
        let scenario = lower(&raw.scenario);
        let origin_ok = self.origins.is_empty() || self.origins.contains(&lower(&raw.origin));
        let scenario_ok = self.scenarios.is_empty()
            || self.scenarios.iter().any(|s| scenario.contains(s.as_str()));
        let not_excluded = !self
            .not_scenarios
            .iter()
            .any(|s| scenario.contains(s.as_str()));
        if !(origin_ok && scenario_ok && not_excluded) {
            return Err(Ignored::Filtered);
        }
        let prefix = match lower(&raw.scope).as_str() {
            "ip" if !raw.value.contains('/') => prefix(&raw.value),
            "range" => prefix(&raw.value),
            _ => None,
        }
        .ok_or(Ignored::Scope)?;
        let widest = if prefix.addr.is_ipv4() {
            self.widest_v4
        } else {
            self.widest_v6
        };
        if prefix.len < widest && !self.broad_origins.contains(&lower(&raw.origin)) {
            return Err(Ignored::TooBroad);
        }
        if self
            .protected
            .iter()
            .any(|p| contains(&prefix, p) || contains(p, &prefix))
        {
            return Err(Ignored::Protected);
        }
        let left_ms = go_duration_ms(&raw.duration).ok_or(Ignored::Duration)?;
        if left_ms <= 0 {
            return Err(Ignored::Ended);
        }
        let clipped = left_ms as u64 > self.longest_ms;
        Ok(Kept {
            decision: Decision::new(
                raw.id,
                prefix,
                &raw.origin,
                now_ms,
                (left_ms as u64).min(self.longest_ms),
            ),
            clipped,
        })
    }
}

/// An address or network as a prefix; an IPv4-mapped IPv6 one as the IPv4
/// one (IPv4 sources are matched by IPv4 entries).
fn prefix(value: &str) -> Option<Prefix> {
    let (addr, len) = match value.trim().split_once('/') {
        Some((a, l)) => (a, Some(l.parse::<u8>().ok()?)),
        None => (value.trim(), None),
    };
    let addr: IpAddr = addr.parse().ok()?;
    let text = match addr {
        IpAddr::V6(v6) if v6.to_ipv4_mapped().is_some() => {
            let v4 = v6.to_ipv4_mapped()?;
            let len = len.map_or(32, |l| l.saturating_sub(96).min(32));
            format!("{v4}/{len}")
        }
        _ => match len {
            Some(l) => format!("{addr}/{l}"),
            None => addr.to_string(),
        },
    };
    Prefix::parse("value", &text).ok()
}

/// A Go duration (`1h2m3.5s`, `-1.02s`, `300ms`, `0s`) in ms, rounded up;
/// `None` when it is not one.
pub fn go_duration_ms(s: &str) -> Option<i64> {
    let s = s.trim();
    let (negative, mut rest) = match s.strip_prefix('-') {
        Some(r) => (true, r),
        None => (false, s.strip_prefix('+').unwrap_or(s)),
    };
    if rest == "0" {
        return Some(0);
    }
    let mut ns: f64 = 0.0;
    let mut any = false;
    while !rest.is_empty() {
        let digits = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        // Digits and one dot only: `f64`'s parser also takes `1e3`, `NaN`
        // and `.`-less forms Go's does not.
        let text = &rest[..digits];
        if text.is_empty() || text == "." || text.matches('.').count() > 1 {
            return None;
        }
        let number: f64 = text.parse().ok()?;
        rest = &rest[digits..];
        let unit_len = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let unit = match &rest[..unit_len] {
            "ns" => 1.0,
            "us" | "µs" | "μs" => 1e3,
            "ms" => 1e6,
            "s" => 1e9,
            "m" => 60e9,
            "h" => 3600e9,
            _ => return None,
        };
        rest = &rest[unit_len..];
        ns += number * unit;
        any = true;
    }
    if !any {
        return None;
    }
    let ms = (ns / 1e6).ceil().min(i64::MAX as f64) as i64;
    Some(if negative { -ms } else { ms })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw(scope: &str, value: &str, kind: &str, duration: &str) -> RawDecision {
        RawDecision {
            id: 1,
            origin: "cscli".into(),
            scenario: "manual 'ban' from 'x'".into(),
            scope: scope.into(),
            kind: kind.into(),
            value: value.into(),
            duration: duration.into(),
        }
    }

    #[test]
    fn go_durations() {
        for (s, ms) in [
            ("1m59.219163043s", 119_220),
            ("59m59.21916095s", 3_599_220),
            ("167h59m59s", 604_799_000),
            ("-1.026146381s", -1_027),
            ("300ms", 300),
            ("1h", 3_600_000),
            ("0s", 0),
            ("0", 0),
            ("1.5µs", 1),
        ] {
            assert_eq!(go_duration_ms(s), Some(ms), "{s}");
        }
        for bad in ["", "1", "1d", "h", "1x", "--1s", "1e3s", ".s", "NaNs"] {
            assert_eq!(go_duration_ms(bad), None, "{bad}");
        }
    }

    #[test]
    fn bans_of_addresses_and_ranges_with_their_time_left() {
        let f = Filter::default();
        let d = f
            .decide(&raw("Ip", "198.18.0.5", "ban", "2m"), 1_000)
            .unwrap();
        assert_eq!(d.decision.prefix.to_string(), "198.18.0.5/32");
        assert_eq!(d.decision.until_ms, 121_000);
        assert!(!d.clipped);
        let d = f
            .decide(&raw("Range", "198.18.7.0/24", "ban", "1h"), 0)
            .unwrap();
        assert_eq!(d.decision.prefix.to_string(), "198.18.7.0/24");
        // Lower-case scopes (some versions), IPv6, IPv4-mapped.
        let d = f.decide(&raw("ip", "2001:db8::5", "ban", "1h"), 0).unwrap();
        assert_eq!(d.decision.prefix.to_string(), "2001:db8::5/128");
        let d = f
            .decide(&raw("range", "::ffff:198.18.9.0/120", "ban", "1h"), 0)
            .unwrap();
        assert_eq!(d.decision.prefix.to_string(), "198.18.9.0/24");
    }

    /// Bans too broad to be bans (the Internet, a /7) are refused unless
    /// their origin is trusted with them; IPv4-mapped ranges are judged as
    /// IPv4; a duration that is not one is counted, never taken for ended;
    /// one past the longest is held that long.
    #[test]
    fn guard_rails_too_broad_unreadable_and_endless() {
        let f = Filter::default();
        let why = |r: RawDecision| f.decide(&r, 0).unwrap_err();
        for (scope, value) in [
            ("Range", "0.0.0.0/0"),
            ("Range", "::/0"),
            ("Range", "::ffff:0.0.0.0/96"),
            ("Range", "198.0.0.0/7"),
            ("Range", "2001:d00::/24"),
        ] {
            assert_eq!(
                why(raw(scope, value, "ban", "4h")),
                Ignored::TooBroad,
                "{value}"
            );
        }
        for value in ["198.0.0.0/8", "2001:db8::/32", "198.18.0.0/15"] {
            assert!(
                f.decide(&raw("Range", value, "ban", "4h"), 0).is_ok(),
                "{value}"
            );
        }
        let trusted = Filter {
            broad_origins: vec!["cscli".into()],
            ..Filter::default()
        };
        assert!(
            trusted
                .decide(&raw("Range", "128.0.0.0/1", "ban", "4h"), 0)
                .is_ok()
        );
        // Trusted or not, nothing bans loopback.
        assert_eq!(
            trusted.decide(&raw("Range", "0.0.0.0/0", "ban", "4h"), 0),
            Err(Ignored::Protected)
        );
        for bad in ["1e3s", ".s", "NaNs", "infs", "1..2s", ""] {
            assert_eq!(
                why(raw("Ip", "198.18.0.5", "ban", bad)),
                Ignored::Duration,
                "{bad:?}"
            );
        }
        let mut guarded = Filter::default();
        guarded
            .protected
            .push(Prefix::parse("t", "198.18.0.2").unwrap());
        for value in [
            "127.0.0.1",
            "::1",
            "198.18.0.2",
            "198.18.0.0/24",
            "0.0.0.0/1",
        ] {
            let scope = if value.contains('/') { "Range" } else { "Ip" };
            let trusted = Filter {
                broad_origins: vec!["cscli".into()],
                ..guarded.clone()
            };
            assert_eq!(
                trusted.decide(&raw(scope, value, "ban", "4h"), 0),
                Err(Ignored::Protected),
                "{value}"
            );
        }
        assert!(
            guarded
                .decide(&raw("Ip", "198.18.0.3", "ban", "4h"), 0)
                .is_ok()
        );
        let d = f
            .decide(&raw("Ip", "198.18.0.5", "ban", "99999999999999999999h"), 0)
            .unwrap();
        assert!(d.clipped);
        assert_eq!(d.decision.until_ms, LONGEST_MS);
    }

    #[test]
    fn what_is_ignored_and_why() {
        let f = Filter::default();
        let why = |r: RawDecision| f.decide(&r, 0).unwrap_err();
        assert_eq!(why(raw("Ip", "198.18.0.5", "captcha", "1h")), Ignored::Type);
        assert_eq!(why(raw("Country", "FR", "ban", "1h")), Ignored::Scope);
        assert_eq!(why(raw("Ip", "198.18.0.0/24", "ban", "1h")), Ignored::Scope);
        assert_eq!(why(raw("Ip", "not-an-ip", "ban", "1h")), Ignored::Scope);
        assert_eq!(why(raw("Ip", "198.18.0.5", "ban", "-2s")), Ignored::Ended);
        let captcha = Filter {
            types: vec!["ban".into(), "captcha".into()],
            ..Filter::default()
        };
        assert!(
            captcha
                .decide(&raw("Ip", "198.18.0.5", "Captcha", "1h"), 0)
                .is_ok()
        );
    }

    #[test]
    fn origins_and_scenarios() {
        let mut r = raw("Ip", "198.18.0.5", "ban", "1h");
        r.origin = "CAPI".into();
        r.scenario = "crowdsecurity/ssh-bf".into();
        let only = |origins: &[&str], scenarios: &[&str], not: &[&str]| Filter {
            origins: origins.iter().map(|s| s.to_string()).collect(),
            scenarios: scenarios.iter().map(|s| s.to_string()).collect(),
            not_scenarios: not.iter().map(|s| s.to_string()).collect(),
            ..Filter::default()
        };
        assert!(only(&["capi"], &[], &[]).decide(&r, 0).is_ok());
        assert_eq!(
            only(&["cscli", "crowdsec"], &[], &[]).decide(&r, 0),
            Err(Ignored::Filtered)
        );
        assert!(only(&[], &["ssh"], &[]).decide(&r, 0).is_ok());
        assert_eq!(
            only(&[], &["http"], &[]).decide(&r, 0),
            Err(Ignored::Filtered)
        );
        assert_eq!(
            only(&[], &[], &["ssh-bf"]).decide(&r, 0),
            Err(Ignored::Filtered)
        );
    }

    #[test]
    fn the_streams_answer_reads_with_nulls() {
        let s: Stream = serde_json::from_str(r#"{"deleted":null,"new":[{"duration":"1m59.2s","id":1,"origin":"cscli","scenario":"manual 'ban' from 'x'","scope":"Ip","type":"ban","value":"198.18.0.5"}]}"#).unwrap();
        assert!(s.deleted.is_none());
        assert_eq!(s.new.unwrap()[0].value, "198.18.0.5");
        let s: Stream = serde_json::from_str(r#"{"deleted":null,"new":null}"#).unwrap();
        assert!(s.new.is_none());
    }
}
