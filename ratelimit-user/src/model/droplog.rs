//! The drop log's setting: how many dropped frames the program may write for
//! `ratelimit log`, records per second per CPU (`--drop-log`, the config
//! file's `drop-log`), or off.

use std::fmt;

use ratelimit_common::DROP_LOG_MAX_RATE;

use super::rate::{Unit, parse_rate};
use crate::error::{Error, Result};

/// The drop log's budget: records per second per CPU; 0 is off.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct DropLog(pub u32);

/// The default: on, 100 records a second per CPU (see
/// docs/reference/drop-log.md for what it costs a dropped frame).
pub const DEFAULT_DROP_LOG: DropLog = DropLog(100);

/// The forms `--drop-log` and `drop-log` accept, for errors.
pub const DROP_LOG_FORMS: &str =
    "`off` (or `0`), or records a second per CPU such as `100/s` or `1k/s` (1/s to 100k/s)";

impl Default for DropLog {
    fn default() -> Self {
        DEFAULT_DROP_LOG
    }
}

impl DropLog {
    /// Off: no drop is logged.
    pub const OFF: DropLog = DropLog(0);

    /// Whether drops are logged.
    pub const fn is_on(self) -> bool {
        self.0 != 0
    }

    /// Parses `text` (`off`, `0`, `100/s`, `6000/min`, `1k/s`): a whole number
    /// of records a second, from 1 to [`DROP_LOG_MAX_RATE`]; `field` names the
    /// option or key in errors.
    pub fn parse(field: &str, text: &str) -> Result<Self> {
        let t = text.trim();
        if t.eq_ignore_ascii_case("off") || t == "0" {
            return Ok(Self::OFF);
        }
        let bad = |why: &str| {
            Error::invalid(field, format!("{text:?}: {why}; expected {DROP_LOG_FORMS}"))
        };
        let rate = parse_rate(field, t).map_err(|_| bad("not a rate"))?;
        if rate.unit != Unit::Packets {
            return Err(bad("records are counted, not bytes"));
        }
        if rate.tokens == 0 {
            return Ok(Self::OFF);
        }
        let per_s = u128::from(rate.tokens) * 1_000_000_000;
        let period = u128::from(rate.period_ns);
        if per_s % period != 0 {
            return Err(bad("a whole number of records a second is needed"));
        }
        match u32::try_from(per_s / period) {
            Ok(n) if n <= DROP_LOG_MAX_RATE => Ok(Self(n)),
            _ => Err(bad("more than 100k/s")),
        }
    }
}

impl fmt::Display for DropLog {
    /// `off` or `100/s`, as [`DropLog::parse`] reads it back.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_on() {
            write!(f, "{}/s", self.0)
        } else {
            f.write_str("off")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_forms() {
        let p = |t| DropLog::parse("--drop-log", t);
        assert_eq!(p("off").unwrap(), DropLog::OFF);
        assert_eq!(p("OFF").unwrap(), DropLog::OFF);
        assert_eq!(p("0").unwrap(), DropLog::OFF);
        assert_eq!(p("0/s").unwrap(), DropLog::OFF);
        assert_eq!(p("100/s").unwrap(), DropLog(100));
        assert_eq!(p("1k/s").unwrap(), DropLog(1000));
        assert_eq!(p("6000/min").unwrap(), DropLog(100));
        assert_eq!(p("100k/s").unwrap(), DropLog(100_000));
        for s in ["off", "100/s", "7/s"] {
            assert_eq!(p(s).unwrap().to_string(), s);
        }
    }

    #[test]
    fn refuses_with_the_field_and_the_forms() {
        for bad in ["lots", "100", "1/min", "10MB/s", "101k/s", "-1/s"] {
            let e = DropLog::parse("drop-log", bad).unwrap_err().to_string();
            assert!(e.contains("drop-log"), "{bad}: {e}");
            assert!(e.contains("100/s"), "{bad}: {e}");
        }
    }
}
