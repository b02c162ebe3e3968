//! Rates and bursts as users write them: `500/s`, `30/min`, `1/hour`, `10k/s`,
//! `2.5M/s`, nftables' `10/second`; bytes as `100Mbit/s`, `1Gbit/s`, `10MB/s`,
//! `64KiB/s`; bursts as a count (`100`, `10k`) or a size (`64KB`).

use std::fmt;

use crate::{Invalid, Result};

/// What a rule's tokens count.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Unit {
    /// One token per packet.
    Packets,
    /// One token per byte of the frame.
    Bytes,
}

/// A rate: `tokens` per `period_ns`, exact (no floating point). Equal rates
/// compare equal whatever their form (`500/s` = `1/2ms`).
#[derive(Clone, Copy, Debug)]
pub struct Rate {
    /// Tokens per period. 0 is a rate of 0 (nothing admitted).
    pub tokens: u64,
    /// The period, ns.
    pub period_ns: u64,
    /// What a token is.
    pub unit: Unit,
}

impl PartialEq for Rate {
    fn eq(&self, other: &Self) -> bool {
        self.unit == other.unit
            && u128::from(self.tokens) * u128::from(other.period_ns)
                == u128::from(other.tokens) * u128::from(self.period_ns)
    }
}

impl Eq for Rate {}

/// Forms accepted for a rate, for error messages.
pub const RATE_FORMS: &str = "a count per period like 500/s, 30/min, 1/hour, 10k/s, 2.5M/s or 10/second, or a byte rate like 100Mbit/s, 1Gbit/s, 10MB/s or 64KiB/s";
/// Forms accepted for a burst, for error messages.
pub const BURST_FORMS: &str =
    "a count like 100 or 10k, or for byte rates a size like 1500B, 64KB or 1MiB";

const NS_PER_S: u64 = 1_000_000_000;

impl Rate {
    /// Tokens per second, as a float for display only.
    pub fn per_second(&self) -> f64 {
        self.tokens as f64 * NS_PER_S as f64 / self.period_ns as f64
    }

    /// The default burst for this rate: one second's worth, at least 1 (at least
    /// 64 KiB for byte rates, so a full-size frame always fits).
    pub fn default_burst(&self) -> u64 {
        let per_s = (u128::from(self.tokens) * u128::from(NS_PER_S) / u128::from(self.period_ns))
            .min(u128::from(ratelimit_common::gcra::CAPACITY_MAX)) as u64;
        match self.unit {
            Unit::Packets => per_s.max(1),
            Unit::Bytes => per_s.max(64 * 1024),
        }
    }
}

impl Rate {
    /// An exact textual form that [`parse_rate`] reads back to the same rate.
    pub fn exact(&self) -> String {
        let unit = match self.unit {
            Unit::Packets => "",
            Unit::Bytes => "B",
        };
        format!("{}{unit}/{}ns", self.tokens, self.period_ns)
    }
}

impl fmt::Display for Rate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let per_s = self.per_second();
        match self.unit {
            Unit::Packets => {
                if self.tokens == 0 {
                    f.write_str("0/s")
                } else if per_s >= 1.0 {
                    write!(f, "{}/s", trim(per_s))
                } else if per_s * 60.0 >= 1.0 {
                    write!(f, "{}/min", trim(per_s * 60.0))
                } else {
                    write!(f, "{}/hour", trim(per_s * 3600.0))
                }
            }
            Unit::Bytes => {
                // Bytes as the rule counts them, and bits as links are sold.
                let scaled = |v: f64, unit: &str| {
                    let (v, prefix) = if v >= 1e9 {
                        (v / 1e9, "G")
                    } else if v >= 1e6 {
                        (v / 1e6, "M")
                    } else if v >= 1e3 {
                        (v / 1e3, "k")
                    } else {
                        (v, "")
                    };
                    format!("{}{prefix}{unit}/s", trim(v))
                };
                write!(f, "{} ({})", scaled(per_s, "B"), scaled(per_s * 8.0, "bit"))
            }
        }
    }
}

fn trim(v: f64) -> String {
    let s = format!("{v:.3}");
    let s = s.trim_end_matches('0').trim_end_matches('.');
    s.to_string()
}

/// A decimal number as `mantissa / 10^scale`.
fn parse_decimal(s: &str) -> Option<(u64, u32)> {
    let (int, frac) = s.split_once('.').unwrap_or((s, ""));
    if int.is_empty() && frac.is_empty() {
        return None;
    }
    if !int.bytes().chain(frac.bytes()).all(|b| b.is_ascii_digit()) || frac.len() > 9 {
        return None;
    }
    let digits = format!("{int}{frac}");
    let mantissa: u64 = digits.parse().ok()?;
    Some((mantissa, frac.len() as u32))
}

/// Splits `10k` into (`10`, `k`).
fn split_number(s: &str) -> (&str, &str) {
    let end = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    (&s[..end], s[end..].trim())
}

/// What an amount suffix means: a multiplier, a divisor, and the unit.
fn amount_suffix(suffix: &str) -> Option<(u64, u64, Unit)> {
    Some(match suffix {
        "" | "p" | "pkt" | "pkts" | "packet" | "packets" => (1, 1, Unit::Packets),
        "k" | "K" => (1_000, 1, Unit::Packets),
        "M" => (1_000_000, 1, Unit::Packets),
        "G" => (1_000_000_000, 1, Unit::Packets),
        "B" | "byte" | "bytes" => (1, 1, Unit::Bytes),
        "kB" | "KB" => (1_000, 1, Unit::Bytes),
        "MB" => (1_000_000, 1, Unit::Bytes),
        "GB" => (1_000_000_000, 1, Unit::Bytes),
        "KiB" => (1 << 10, 1, Unit::Bytes),
        "MiB" => (1 << 20, 1, Unit::Bytes),
        "GiB" => (1 << 30, 1, Unit::Bytes),
        "bit" | "bits" => (1, 8, Unit::Bytes),
        "kbit" | "Kbit" => (1_000, 8, Unit::Bytes),
        "Mbit" => (1_000_000, 8, Unit::Bytes),
        "Gbit" => (1_000_000_000, 8, Unit::Bytes),
        _ => return None,
    })
}

/// A unit of time in ns, for durations and rates' periods (a week is 7 days,
/// a year 365).
fn period_ns(p: &str) -> Option<u64> {
    Some(match p {
        "ns" => 1,
        "us" | "µs" => 1_000,
        "ms" => 1_000_000,
        "s" | "sec" | "second" | "seconds" => NS_PER_S,
        "m" | "min" | "minute" | "minutes" => 60 * NS_PER_S,
        "h" | "hour" | "hours" => 3600 * NS_PER_S,
        "d" | "day" | "days" => 86_400 * NS_PER_S,
        "w" | "week" | "weeks" => 7 * 86_400 * NS_PER_S,
        "y" | "year" | "years" => 365 * 86_400 * NS_PER_S,
        _ => return None,
    })
}

/// Parses a rate. `field` names the option in errors.
pub fn parse_rate(field: &str, s: &str) -> Result<Rate> {
    let bad = |why: &str| {
        Invalid::new(
            field,
            format!("invalid rate {s:?}: {why}; expected {RATE_FORMS}"),
        )
    };
    let (amount, per) = s.trim().split_once('/').ok_or_else(|| bad("no /period"))?;
    let (number, suffix) = split_number(amount.trim());
    let (mantissa, scale) = parse_decimal(number).ok_or_else(|| bad("not a number"))?;
    let (mul, div, unit) = amount_suffix(suffix).ok_or_else(|| bad("unknown unit"))?;
    let per = per.trim();
    // Accept `/10s` style periods too.
    let (pnum, punit) = split_number(per);
    let pcount = if pnum.is_empty() {
        1
    } else {
        pnum.parse::<u64>()
            .ok()
            .filter(|&n| n > 0)
            .ok_or_else(|| bad("bad period"))?
    };
    let pns = period_ns(punit).ok_or_else(|| bad("unknown period"))?;
    // tokens / period = mantissa × mul / (10^scale × div × pcount × pns)
    let tokens = u128::from(mantissa) * u128::from(mul);
    let period =
        u128::from(10u64.pow(scale)) * u128::from(div) * u128::from(pcount) * u128::from(pns);
    let g = gcd(tokens, period);
    // g == 0 only when tokens == 0 and period == 0, which cannot happen (period ≥ 1).
    let (tokens, period) = match (tokens.checked_div(g), period.checked_div(g)) {
        (Some(t), Some(p)) => (t, p),
        _ => (0, period),
    };
    let tokens = u64::try_from(tokens).map_err(|_| bad("too large"))?;
    let period_ns = u64::try_from(period).map_err(|_| bad("period too long"))?;
    Ok(Rate {
        tokens,
        period_ns: if tokens == 0 { NS_PER_S } else { period_ns },
        unit,
    })
}

/// A window and its limit from a rate as written, for the window algorithms
/// (`30/min`: 30 per minute; `100/10s`: 100 per 10 s): the window is the
/// period as written, not the reduced fraction (`30/min` is not `1/2s`), and
/// the count must be a whole number of requests (`1.5/min` is refused: write
/// `3/2min`) that fits in 64 bits. Returns (window ns, limit). `field` names
/// the option in errors.
pub fn parse_window(field: &str, s: &str) -> Result<(u64, u64)> {
    let bad = |why: &str| {
        Invalid::new(
            field,
            format!(
                "invalid rate {s:?} for a window: {why}; a window's rate is a whole count of requests per window, like 100/min, 10k/hour or 3/2min"
            ),
        )
    };
    let (amount, per) = s.trim().split_once('/').ok_or_else(|| bad("no /period"))?;
    let (number, suffix) = split_number(amount.trim());
    let (mantissa, scale) = parse_decimal(number).ok_or_else(|| bad("not a number"))?;
    let (mul, div, unit) = amount_suffix(suffix).ok_or_else(|| bad("unknown unit"))?;
    if unit != Unit::Packets || div != 1 {
        return Err(bad("a window counts requests, not bytes"));
    }
    let (pnum, punit) = split_number(per.trim());
    let pcount = if pnum.is_empty() {
        1
    } else {
        pnum.parse::<u64>()
            .ok()
            .filter(|&n| n > 0)
            .ok_or_else(|| bad("bad period"))?
    };
    let pns = period_ns(punit).ok_or_else(|| bad("unknown period"))?;
    let window_ns = pcount
        .checked_mul(pns)
        .ok_or_else(|| bad("window too long"))?;
    // count = mantissa × mul / 10^scale, a whole number.
    let (num, den) = (u128::from(mantissa) * u128::from(mul), 10u128.pow(scale));
    if num % den != 0 {
        let g = gcd(num, den);
        let (p, q) = (num / g, den / g);
        let window = u128::from(pcount) * q;
        return Err(bad(&format!(
            "{} requests per window is not a whole number (write {p}/{window}{punit})",
            number
        )));
    }
    let limit = u64::try_from(num / den).map_err(|_| {
        bad(&format!(
            "the count is more than a window can hold ({})",
            u64::MAX
        ))
    })?;
    Ok((window_ns, limit))
}

fn gcd(mut a: u128, mut b: u128) -> u128 {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}

/// Forms accepted for a duration, for error messages.
pub const DURATION_FORMS: &str =
    "a number and a unit like 500ms, 1s, 1.5s, 10m, 30min, 1h, 7d, 2w or 1y";

/// Parses a duration (`500ms`, `1s`, `1.5s`, `30min`, `1h`, `1d`, `2w`, `1y`,
/// `250ns`) into ns. A year is 365 days.
pub fn parse_duration(field: &str, s: &str) -> Result<u64> {
    let bad = |why: &str| {
        Invalid::new(
            field,
            format!("invalid duration {s:?}: {why}; expected {DURATION_FORMS}"),
        )
    };
    let (number, unit) = split_number(s.trim());
    let (mantissa, scale) = parse_decimal(number).ok_or_else(|| bad("not a number"))?;
    let unit_ns: u64 = match unit {
        "" => return Err(bad("no unit")),
        _ => period_ns(unit).ok_or_else(|| bad("unknown unit"))?,
    };
    let ns = u128::from(mantissa) * u128::from(unit_ns);
    let den = u128::from(10u64.pow(scale));
    if ns % den != 0 {
        return Err(bad("not a whole number of nanoseconds"));
    }
    let ns = u64::try_from(ns / den).map_err(|_| bad("too long"))?;
    if ns == 0 {
        return Err(bad("must be longer than 0"));
    }
    Ok(ns)
}

/// Forms accepted for a size, for error messages.
pub const SIZE_FORMS: &str =
    "a number of bytes like 65536, or with a unit like 16KiB, 1MiB or 64kB";

/// Parses a size in bytes (`65536`, `16KiB`, `1MiB`, `64kB`, `100B`).
pub fn parse_size(field: &str, s: &str) -> Result<u64> {
    let bad = |why: &str| {
        Invalid::new(
            field,
            format!("invalid size {s:?}: {why}; expected {SIZE_FORMS}"),
        )
    };
    let (number, suffix) = split_number(s.trim());
    let (mantissa, scale) = parse_decimal(number).ok_or_else(|| bad("not a number"))?;
    let mul: u64 = match suffix {
        "" => 1,
        _ => match amount_suffix(suffix) {
            Some((mul, 1, Unit::Bytes)) => mul,
            _ => return Err(bad("unknown unit")),
        },
    };
    let bytes = u128::from(mantissa) * u128::from(mul);
    let den = u128::from(10u64.pow(scale));
    if bytes % den != 0 {
        return Err(bad("not a whole number of bytes"));
    }
    u64::try_from(bytes / den).map_err(|_| bad("too large"))
}

/// Parses a burst for a rate counting `unit`. `field` names the option in errors.
pub fn parse_burst(field: &str, s: &str, unit: Unit) -> Result<u64> {
    let bad = |why: &str| {
        Invalid::new(
            field,
            format!("invalid burst {s:?}: {why}; expected {BURST_FORMS}"),
        )
    };
    let (number, suffix) = split_number(s.trim());
    let (mantissa, scale) = parse_decimal(number).ok_or_else(|| bad("not a number"))?;
    let (mul, div, sunit) = amount_suffix(suffix).ok_or_else(|| bad("unknown unit"))?;
    if div != 1 {
        return Err(bad("a burst is a count or a size in bytes, not bits"));
    }
    let is_plain = matches!(suffix, "" | "k" | "K" | "M" | "G");
    if sunit == Unit::Bytes && unit == Unit::Packets {
        return Err(bad(
            "a size is a burst for byte rates; this rate counts packets",
        ));
    }
    if sunit == Unit::Packets && unit == Unit::Bytes && !is_plain {
        return Err(bad("this rate counts bytes"));
    }
    let value = u128::from(mantissa) * u128::from(mul);
    let denom = u128::from(10u64.pow(scale));
    if value % denom != 0 {
        return Err(bad("not a whole number"));
    }
    let value = value / denom;
    if value == 0 {
        return Err(bad(
            "must be at least 1 (a bucket that holds nothing admits nothing; use a rate of 0/s or `ratelimit deny` to drop everything)",
        ));
    }
    let max = ratelimit_common::gcra::CAPACITY_MAX;
    if value > u128::from(max) {
        return Err(bad(&format!("must be at most {max} (2^32)")));
    }
    Ok(value as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rate(s: &str) -> Rate {
        parse_rate("--rate", s).unwrap_or_else(|e| panic!("{s}: {e}"))
    }

    #[test]
    fn forms_users_know() {
        // Rates are kept exact and reduced: 500/s is one per 2 ms.
        let r = rate("500/s");
        assert_eq!(
            (r.tokens, r.period_ns, r.unit),
            (1, 2_000_000, Unit::Packets)
        );
        let r = rate("30/min");
        assert_eq!((r.tokens, r.period_ns), (1, 2 * NS_PER_S));
        let r = rate("1/hour");
        assert_eq!((r.tokens, r.period_ns), (1, 3600 * NS_PER_S));
        assert_eq!(rate("10k/s").per_second(), 10_000.0);
        let r = rate("2.5M/s");
        assert_eq!((r.tokens, r.period_ns), (1, 400));
        assert_eq!(rate("10/second").per_second(), 10.0);
        let r = rate("100Mbit/s");
        assert_eq!(r.unit, Unit::Bytes);
        assert_eq!(r.per_second(), 12_500_000.0);
        assert_eq!(rate("1Gbit/s").per_second(), 125_000_000.0);
        assert_eq!(rate("10MB/s").per_second(), 10_000_000.0);
        assert_eq!(rate("64KiB/s").per_second(), 65536.0);
        assert_eq!(rate("0/s").tokens, 0);
        assert_eq!(rate("100/10s").per_second(), 10.0);
    }

    #[test]
    fn display_round_trips_through_parse() {
        for s in [
            "500/s",
            "30/min",
            "1/hour",
            "2.5M/s",
            "100Mbit/s",
            "1Gbit/s",
        ] {
            let r = rate(s);
            // A byte rate shows its bits in parentheses: either form reads back.
            let text = r.to_string();
            for form in text.trim_end_matches(')').split(" (") {
                assert_eq!(r.per_second(), rate(form).per_second(), "{s} → {r}");
            }
        }
    }

    #[test]
    fn exact_form_round_trips() {
        for s in [
            "500/s",
            "1/hour",
            "2.5M/s",
            "100Mbit/s",
            "64KiB/s",
            "7/3s",
            "0/s",
        ] {
            let r = rate(s);
            assert_eq!(rate(&r.exact()), r, "{s}");
        }
    }

    #[test]
    fn errors_name_field_value_and_forms() {
        for bad in ["", "500", "x/s", "5/fortnight", "5zz/s", "1.2.3/s", "-5/s"] {
            let e = parse_rate("--rate", bad).expect_err(bad).to_string();
            assert!(e.starts_with("--rate: invalid rate"), "{e}");
            assert!(e.contains(&format!("{bad:?}")), "{e}");
            assert!(e.contains("500/s"), "{e}");
        }
    }

    #[test]
    fn windows_are_the_period_as_written_with_a_whole_count() {
        let w = |s| parse_window("limit.rate", s).unwrap_or_else(|e| panic!("{s}: {e}"));
        assert_eq!(w("30/min"), (60 * NS_PER_S, 30));
        assert_eq!(w("100/10s"), (10 * NS_PER_S, 100));
        assert_eq!(w("10k/hour"), (3600 * NS_PER_S, 10_000));
        assert_eq!(w("1.5k/min"), (60 * NS_PER_S, 1500));
        assert_eq!(w("3/2min"), (120 * NS_PER_S, 3));
        let e = |s| parse_window("limit.rate", s).expect_err(s).to_string();
        // Regression: 1.5/min became a window of 1 per minute.
        let m = e("1.5/min");
        assert!(
            m.starts_with("limit.rate: invalid rate \"1.5/min\"") && m.contains("write 3/2min"),
            "{m}"
        );
        assert!(e("0.25/10s").contains("write 1/40s"), "{}", e("0.25/10s"));
        // Regression: 18446744074G/s wrapped to a limit of 290 448 384.
        let m = e("18446744074G/s");
        assert!(m.contains("more than a window can hold"), "{m}");
        assert_eq!(w("18446744073G/s").1, 18_446_744_073_000_000_000);
        assert!(e("10MB/s").contains("not bytes"));
        assert!(e("5/fortnight").contains("unknown period"));
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_size("--max-body", "65536").unwrap(), 65_536);
        assert_eq!(parse_size("--max-body", "16KiB").unwrap(), 16_384);
        assert_eq!(parse_size("--max-body", "1.5KiB").unwrap(), 1_536);
        assert_eq!(parse_size("--max-body", "64kB").unwrap(), 64_000);
        for bad in ["", "big", "16Kib", "1.5", "10/s", "1kbit"] {
            match parse_size("--max-body", bad) {
                Err(Invalid { field, message }) => {
                    assert_eq!(field, "--max-body");
                    assert!(message.contains("16KiB"), "{bad:?}: {message}");
                }
                other => panic!("{bad:?}: {other:?}"),
            }
        }
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("w", "500ms").unwrap(), 500_000_000);
        assert_eq!(parse_duration("w", "1.5s").unwrap(), 1_500_000_000);
        assert_eq!(parse_duration("w", "24h").unwrap(), 86_400 * NS_PER_S);
        assert_eq!(parse_duration("w", "30min").unwrap(), 1800 * NS_PER_S);
        assert_eq!(parse_duration("w", "7ns").unwrap(), 7);
        // `--for 10y` as docs/guide/bans.md's bans read: a year is 365 days.
        assert_eq!(parse_duration("w", "2w").unwrap(), 14 * 86_400 * NS_PER_S);
        assert_eq!(
            parse_duration("w", "10y").unwrap(),
            3650 * 86_400 * NS_PER_S
        );
        for bad in ["", "5", "0s", "1fortnight", "x"] {
            let e = parse_duration("--window", bad).expect_err(bad).to_string();
            assert!(e.starts_with("--window: invalid duration"), "{e}");
        }
    }

    #[test]
    fn bursts() {
        assert_eq!(parse_burst("--burst", "100", Unit::Packets).unwrap(), 100);
        assert_eq!(
            parse_burst("--burst", "10k", Unit::Packets).unwrap(),
            10_000
        );
        assert_eq!(parse_burst("--burst", "64KB", Unit::Bytes).unwrap(), 64_000);
        assert_eq!(
            parse_burst("--burst", "64KiB", Unit::Bytes).unwrap(),
            65_536
        );
        assert_eq!(parse_burst("--burst", "1500", Unit::Bytes).unwrap(), 1500);
        assert_eq!(
            parse_burst("--burst", "4294967296", Unit::Packets).unwrap(),
            1 << 32
        );
        for (bad, unit) in [
            ("0", Unit::Packets),
            ("64KB", Unit::Packets),
            ("4294967297", Unit::Packets),
            ("1.5", Unit::Packets),
            ("ten", Unit::Packets),
            ("8Mbit", Unit::Bytes),
        ] {
            let e = parse_burst("--burst", bad, unit)
                .expect_err(bad)
                .to_string();
            assert!(e.starts_with("--burst: invalid burst"), "{e}");
        }
    }

    #[test]
    fn default_burst_is_one_second() {
        assert_eq!(rate("1000/s").default_burst(), 1000);
        assert_eq!(rate("1/hour").default_burst(), 1);
        assert_eq!(rate("1Gbit/s").default_burst(), 125_000_000);
        assert_eq!(rate("8kbit/s").default_burst(), 65_536);
    }
}
