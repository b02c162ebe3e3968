//! How the rules' numbers and times are written for people and scripts:
//! numbers as an integer or with two decimals ([`number`]), times as RFC 3339
//! in UTC ([`rfc3339`]) and spans as `9m58s` ([`span`]). The answers of the
//! control socket ([`crate::protocol::answer`]) and the CLI's lines use them.

use serde_json::Number;

/// A number as people want to read it in JSON: an integer when it is one,
/// else rounded to two decimals; below 1, to three significant digits (a
/// rate of 1/hour is 0.000278, not 0). `None` (null) for what is not finite.
pub fn number(x: f64) -> Option<Number> {
    if !x.is_finite() {
        return None;
    }
    if x != 0.0 && x.abs() < 1.0 {
        let scale = 10f64.powi(2 - x.abs().log10().floor() as i32);
        return Number::from_f64((x * scale).round() / scale);
    }
    let rounded = (x * 100.0).round() / 100.0;
    if rounded.fract() == 0.0 && rounded.abs() < 9.0e15 {
        Some(Number::from(rounded as i64))
    } else {
        Number::from_f64(rounded)
    }
}

/// Unix ms as RFC 3339 in UTC, to the second: `2026-11-23T10:00:00Z`.
pub fn rfc3339(ms: u64) -> String {
    let secs = ms / 1000;
    let (days, rem) = (secs / 86_400, secs % 86_400);
    // Days since 1970-01-01 to a civil date (H. Hinnant's algorithm).
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// Unix ms as RFC 3339 in UTC, to the millisecond: `2026-11-23T10:00:00.250Z`.
pub fn rfc3339_ms(ms: u64) -> String {
    let s = rfc3339(ms);
    format!("{}.{:03}Z", &s[..s.len() - 1], ms % 1000)
}

/// A span as people read it: `9m58s`, `2h`, `3d4h`, `0s`.
pub fn span(ms: u64) -> String {
    let s = ms.div_ceil(1000);
    let parts = [
        (s / 86_400, "d"),
        (s / 3600 % 24, "h"),
        (s / 60 % 60, "m"),
        (s % 60, "s"),
    ];
    let text: String = parts
        .iter()
        .skip_while(|(n, _)| *n == 0)
        .take(2)
        .filter(|(n, _)| *n > 0)
        .map(|(n, u)| format!("{n}{u}"))
        .collect();
    if text.is_empty() { "0s".into() } else { text }
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use super::*;

    #[test]
    fn numbers_are_integers_or_two_decimals() {
        let n = |x| json!(number(x));
        assert_eq!(n(200.077_446_778_408_76), json!(200.08));
        assert_eq!(n(1000.0), json!(1000));
        assert_eq!(n(0.5), json!(0.5));
        assert_eq!(n(1.0 / 3600.0), json!(0.000278));
        assert_eq!(n(0.016_666_6), json!(0.0167));
        assert_eq!(n(f64::NAN), Value::Null);
    }

    #[test]
    fn times_read_as_people_write_them() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339(1_795_392_000_000), "2026-11-23T00:00:00Z");
        assert_eq!(rfc3339(951_825_600_000), "2000-02-29T12:00:00Z");
        assert_eq!(span(598_200), "9m59s");
        assert_eq!(span(7_200_000), "2h");
        assert_eq!(span(90_061_000), "1d1h");
        assert_eq!(span(0), "0s");
    }
}
