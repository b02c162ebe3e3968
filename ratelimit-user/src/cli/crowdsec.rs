//! `run`'s CrowdSec options as typed ([`Args`]), checked into the bouncer's
//! [`Options`] (the key file read): each refusal names its flag.

use std::{path::PathBuf, time::Duration};

use crate::{
    crowdsec::{
        DEFAULT_EVERY, DEFAULT_MAX_DECISIONS, Options,
        decision::{self, Filter},
        lapi::{self, Lapi},
    },
    error::{Error, Result},
};

/// `run`'s CrowdSec options, as typed.
#[derive(Clone, Debug, Default, clap::Args)]
pub struct Args {
    /// Follow this CrowdSec Local API's decisions and drop what it bans at
    /// the driver: http://HOST:PORT, like http://127.0.0.1:8080, or
    /// https://HOST:PORT.
    #[arg(long, value_name = "URL", help_heading = "CrowdSec")]
    pub crowdsec: Option<String>,
    /// For an https:// Local API: the CA certificate(s), PEM, that signed
    /// its certificate [default: the system's,
    /// /etc/ssl/certs/ca-certificates.crt].
    #[arg(long, value_name = "FILE", help_heading = "CrowdSec")]
    pub crowdsec_ca: Option<PathBuf>,
    /// The bouncer key (`cscli bouncers add NAME -o raw`), alone in this
    /// file.
    #[arg(long, value_name = "FILE", help_heading = "CrowdSec")]
    pub crowdsec_key_file: Option<PathBuf>,
    /// Time between two pulls of the decision stream [default: 10s].
    #[arg(long, value_name = "DURATION", help_heading = "CrowdSec")]
    pub crowdsec_every: Option<String>,
    /// Decision types applied as bans, comma-separated; the others (captcha,
    /// by default) are ignored [default: ban].
    #[arg(long, value_name = "TYPES", help_heading = "CrowdSec")]
    pub crowdsec_types: Option<String>,
    /// Only decisions of these origins, comma-separated (crowdsec, cscli,
    /// CAPI, lists, …) [default: all].
    #[arg(long, value_name = "ORIGINS", help_heading = "CrowdSec")]
    pub crowdsec_origins: Option<String>,
    /// Only decisions whose scenario contains one of these words,
    /// comma-separated [default: all].
    #[arg(long, value_name = "WORDS", help_heading = "CrowdSec")]
    pub crowdsec_scenarios: Option<String>,
    /// No decision whose scenario contains one of these words,
    /// comma-separated.
    #[arg(long, value_name = "WORDS", help_heading = "CrowdSec")]
    pub crowdsec_not_scenarios: Option<String>,
    /// The widest networks a decision may ban, IPv4 and IPv6 prefix
    /// lengths: a wider one (0.0.0.0/0, a /7) is not applied and is counted
    /// as too_broad [default: /8,/32].
    #[arg(long, value_name = "/V4,/V6", help_heading = "CrowdSec")]
    pub crowdsec_widest: Option<String>,
    /// Origins whose decisions may ban wider networks than
    /// --crowdsec-widest, comma-separated [default: none].
    #[arg(long, value_name = "ORIGINS", help_heading = "CrowdSec")]
    pub crowdsec_broad_origins: Option<String>,
    /// The longest a decision is held; a longer one is held this long and
    /// counted as clipped [default: 30d].
    #[arg(long, value_name = "DURATION", help_heading = "CrowdSec")]
    pub crowdsec_longest: Option<String>,
    /// The most decisions held; past it the newest are not applied and are
    /// counted as over_cap [default: 500000].
    #[arg(long, value_name = "N", help_heading = "CrowdSec")]
    pub crowdsec_max_decisions: Option<usize>,
}

/// `--crowdsec-widest`'s `/V4,/V6` (the slashes optional): prefix lengths
/// 0-32 and 0-128.
fn widest(s: &str) -> Result<(u8, u8)> {
    let bad = || {
        Error::invalid(
            "--crowdsec-widest",
            format!(
                "{s:?} is not two prefix lengths: IPv4's (0 to 32) and IPv6's (0 to 128), like /8,/32"
            ),
        )
    };
    let (v4, v6) = s.split_once(',').ok_or_else(bad)?;
    let len = |t: &str, max: u8| {
        t.trim()
            .trim_start_matches('/')
            .parse::<u8>()
            .ok()
            .filter(|l| *l <= max)
            .ok_or_else(bad)
    };
    Ok((len(v4, 32)?, len(v6, 128)?))
}

/// A comma-separated option: its words, lower case, without blanks.
fn words(s: &Option<String>) -> Vec<String> {
    s.as_deref()
        .unwrap_or("")
        .split(',')
        .map(|w| w.trim().to_ascii_lowercase())
        .filter(|w| !w.is_empty())
        .collect()
}

impl Args {
    /// The options checked (the key file read); `None` without `--crowdsec`.
    pub fn options(&self) -> Result<Option<Options>> {
        let Some(url) = &self.crowdsec else {
            for (flag, given) in [
                ("--crowdsec-key-file", self.crowdsec_key_file.is_some()),
                ("--crowdsec-ca", self.crowdsec_ca.is_some()),
                ("--crowdsec-every", self.crowdsec_every.is_some()),
                ("--crowdsec-types", self.crowdsec_types.is_some()),
                ("--crowdsec-origins", self.crowdsec_origins.is_some()),
                ("--crowdsec-scenarios", self.crowdsec_scenarios.is_some()),
                (
                    "--crowdsec-not-scenarios",
                    self.crowdsec_not_scenarios.is_some(),
                ),
                ("--crowdsec-widest", self.crowdsec_widest.is_some()),
                (
                    "--crowdsec-broad-origins",
                    self.crowdsec_broad_origins.is_some(),
                ),
                ("--crowdsec-longest", self.crowdsec_longest.is_some()),
                (
                    "--crowdsec-max-decisions",
                    self.crowdsec_max_decisions.is_some(),
                ),
            ] {
                if given {
                    return Err(Error::invalid(
                        flag,
                        "needs --crowdsec URL (the Local API to follow)",
                    ));
                }
            }
            return Ok(None);
        };
        let lapi = Lapi::parse(url).map_err(|e| Error::invalid("--crowdsec", e))?;
        let lapi = self.trusted(lapi)?;
        let key_file = self.crowdsec_key_file.clone().ok_or_else(|| {
            Error::invalid(
                "--crowdsec-key-file",
                "--crowdsec needs the bouncer key in a file: `cscli bouncers add ratelimit -o raw > /etc/ratelimit/crowdsec.key`, then --crowdsec-key-file /etc/ratelimit/crowdsec.key",
            )
        })?;
        let what = format!("the bouncer key file {}", key_file.display());
        let key = crate::host::input::read(&key_file, crate::host::input::Kind::Config, &what)
            .map_err(|e| Error::invalid("--crowdsec-key-file", e))?
            .trim()
            .to_string();
        if key.is_empty() || key.contains(char::is_whitespace) {
            return Err(Error::invalid(
                "--crowdsec-key-file",
                format!(
                    "{what} must hold the key alone on one line (`cscli bouncers add NAME -o raw` prints it)"
                ),
            ));
        }
        let every = match &self.crowdsec_every {
            None => DEFAULT_EVERY,
            Some(s) => {
                let ns = crate::model::rate::parse_duration("--crowdsec-every", s)?;
                let every = Duration::from_nanos(ns);
                if !(Duration::from_millis(100)..=Duration::from_secs(3600)).contains(&every) {
                    return Err(Error::invalid(
                        "--crowdsec-every",
                        format!("{s:?} is out of range: 100ms to 1h, like 10s"),
                    ));
                }
                every
            }
        };
        let (widest_v4, widest_v6) = match &self.crowdsec_widest {
            None => (decision::WIDEST_V4, decision::WIDEST_V6),
            Some(s) => widest(s)?,
        };
        let longest_ms = match &self.crowdsec_longest {
            None => decision::LONGEST_MS,
            Some(s) => {
                let ns = crate::model::rate::parse_duration("--crowdsec-longest", s)?;
                if ns < 1_000_000_000 {
                    return Err(Error::invalid(
                        "--crowdsec-longest",
                        format!("{s:?} is too short: at least 1s, like 30d or 12h"),
                    ));
                }
                ns / 1_000_000
            }
        };
        let mut filter = Filter {
            origins: words(&self.crowdsec_origins),
            scenarios: words(&self.crowdsec_scenarios),
            not_scenarios: words(&self.crowdsec_not_scenarios),
            widest_v4,
            widest_v6,
            broad_origins: words(&self.crowdsec_broad_origins),
            longest_ms,
            ..Filter::default()
        };
        if self.crowdsec_types.is_some() {
            filter.types = words(&self.crowdsec_types);
            if filter.types.is_empty() {
                return Err(Error::invalid(
                    "--crowdsec-types",
                    "give at least one decision type, like ban or ban,captcha",
                ));
            }
        }
        let max_decisions = match self.crowdsec_max_decisions {
            None => DEFAULT_MAX_DECISIONS,
            Some(n) if (1..=10_000_000).contains(&n) => n,
            Some(n) => {
                return Err(Error::invalid(
                    "--crowdsec-max-decisions",
                    format!("{n} is out of range: 1 to 10000000, like 500000"),
                ));
            }
        };
        Ok(Some(Options {
            lapi,
            key,
            key_file,
            every,
            filter,
            max_decisions,
        }))
    }
}

impl Args {
    /// An `https://` Local API with the CA certificates of `--crowdsec-ca`
    /// (or the system's); an `http://` one as it is.
    fn trusted(&self, lapi: Lapi) -> Result<Lapi> {
        let flag = "--crowdsec-ca";
        if !lapi.is_https() {
            return match &self.crowdsec_ca {
                Some(_) => Err(Error::invalid(
                    flag,
                    format!("is for an https:// Local API; {} is plain http", lapi.url),
                )),
                None => Ok(lapi),
            };
        }
        let cas = self
            .crowdsec_ca
            .clone()
            .unwrap_or_else(|| PathBuf::from(lapi::SYSTEM_CAS));
        let what = match &self.crowdsec_ca {
            Some(p) => format!("the CA certificates {}", p.display()),
            None => format!(
                "the system's CA certificates {} (give the CA that signed the Local API's certificate with --crowdsec-ca FILE)",
                cas.display()
            ),
        };
        let pem = crate::host::input::read(&cas, crate::host::input::Kind::Config, &what)
            .map_err(|e| Error::invalid(flag, e))?;
        lapi.trusting(&cas, pem.as_bytes())
            .map_err(|e| Error::invalid(flag, e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_widest_bans_are_read_and_a_bad_value_named() {
        assert_eq!(widest("/8,/32").unwrap(), (8, 32));
        assert_eq!(widest("16, 48").unwrap(), (16, 48));
        assert_eq!(widest("/0,/0").unwrap(), (0, 0));
        for bad in ["/8", "/33,/32", "/8,/129", "x,/32", ""] {
            let e = widest(bad).unwrap_err().to_string();
            assert!(e.starts_with("--crowdsec-widest:"), "{bad:?}: {e}");
            assert!(e.contains("like /8,/32"), "{bad:?}: {e}");
        }
    }
}
