//! Rules as programs read them: `ratelimit list --json` and the changes a
//! command made. Numbers are numbers with their unit beside them (rates as an
//! integer or with two decimals), times are RFC 3339 in UTC; each rule also
//! carries its `text`, the line `ratelimit list` prints.

use serde_json::{Value, json};

use crate::{
    model::rate::{Rate, Unit},
    model::rules::{
        Action, Algo, HostConnections, Limit, NewSources, Selector, Shared,
        default_aggregate_reserve,
    },
};

/// A number as people want to read it in JSON: an integer when it is one,
/// else rounded to two decimals; below 1, to three significant digits (a
/// rate of 1/hour is 0.000278, not 0).
pub fn number(x: f64) -> Value {
    if !x.is_finite() {
        return Value::Null;
    }
    if x != 0.0 && x.abs() < 1.0 {
        let scale = 10f64.powi(2 - x.abs().log10().floor() as i32);
        return json!((x * scale).round() / scale);
    }
    let rounded = (x * 100.0).round() / 100.0;
    if rounded.fract() == 0.0 && rounded.abs() < 9.0e15 {
        json!(rounded as i64)
    } else {
        json!(rounded)
    }
}

fn unit_name(u: Unit) -> &'static str {
    match u {
        Unit::Packets => "packets",
        Unit::Bytes => "bytes",
    }
}

/// A rate: `amount` per `period_s` (in the shortest of 1 s, 1 min, 1 h and
/// 1 day that makes the amount whole), its per-second value and its unit.
pub fn rate(r: &Rate) -> Value {
    // The shortest whole period the rate is written in (1 s, 1 min, 1 h, …).
    let (amount, period_s) = [1u64, 60, 3600, 86_400]
        .into_iter()
        .map(|s| (r.per_second() * s as f64, s))
        .find(|(a, _)| *a >= 1.0 && (*a - a.round()).abs() < 1e-9)
        .unwrap_or((r.per_second(), 1));
    json!({
        "per_second": number(r.per_second()),
        "amount": number(amount),
        "period_s": period_s,
        "unit": unit_name(r.unit),
        "text": r.to_string(),
    })
}

fn bucket(s: &Shared) -> Value {
    json!({
        "rate": rate(&s.rate),
        "burst": {"amount": s.burst, "unit": unit_name(s.rate.unit)},
    })
}

fn seconds(ns: u64) -> Value {
    number(ns as f64 / 1e9)
}

/// Key prefixes: the family of the rule's own (`family_v4`), both for the
/// default rule.
fn per(v4: u8, v6: u8, family_v4: Option<bool>) -> Value {
    match family_v4 {
        Some(true) => json!({"ipv4": v4}),
        Some(false) => json!({"ipv6": v6}),
        None => json!({"ipv4": v4, "ipv6": v6}),
    }
}

fn limit(l: &Limit, family_v4: Option<bool>) -> serde_json::Map<String, Value> {
    let mut m = serde_json::Map::new();
    m.insert("algorithm".into(), json!(l.algo.name()));
    let params = match l.algo {
        Algo::Gcra => {
            m.insert("rate".into(), rate(&l.rate));
            m.insert(
                "burst".into(),
                json!({"amount": l.burst, "unit": unit_name(l.rate.unit)}),
            );
            Value::Null
        }
        Algo::Interval {
            every_ns,
            amount,
            capacity,
        } => {
            json!({"refill_every_s": seconds(every_ns), "refill_amount": amount, "capacity": capacity})
        }
        Algo::FixedWindow { window_ns, limit }
        | Algo::SlidingLog { window_ns, limit }
        | Algo::SlidingWindow { window_ns, limit } => {
            json!({"window_s": seconds(window_ns), "limit": limit})
        }
        Algo::RollingQuota {
            window_ns,
            period_ns,
            quota,
            rate_cap,
        } => json!({
            "window_s": seconds(window_ns),
            "quota": quota,
            "period_s": seconds(period_ns),
            "rate_cap": rate_cap,
        }),
    };
    if !params.is_null() {
        m.insert("params".into(), params);
    }
    m.insert("per".into(), per(l.per_v4, l.per_v6, family_v4));
    let levels: Vec<Value> = l
        .levels
        .iter()
        .flatten()
        .enumerate()
        .map(|(i, k)| {
            let mut v = bucket(&k.bucket);
            v["level"] = json!(i + 2);
            v["per"] = per(k.per_v4, k.per_v6, family_v4);
            v
        })
        .collect();
    m.insert("levels".into(), json!(levels));
    m.insert(
        "aggregate".into(),
        l.aggregate.as_ref().map_or(Value::Null, |a| {
            let mut v = bucket(a);
            let reserve = l
                .aggregate_reserve
                .unwrap_or(default_aggregate_reserve(a.burst));
            v["reserve"] = json!({"amount": reserve, "unit": unit_name(a.rate.unit)});
            v
        }),
    );
    m.insert(
        "new_sources".into(),
        match &l.new_sources {
            NewSources::Budget(b) => bucket(b),
            NewSources::Unlimited => json!("unlimited"),
        },
    );
    m.insert("fleet".into(), json!(l.fleet));
    m.insert(
        "host_connections".into(),
        json!(match l.host_connections {
            HostConnections::Pass => "pass",
            HostConnections::Limit => "limit",
        }),
    );
    m
}

/// An action as an object: `action`, `dry_run`, `text`, and for a limit its
/// algorithm and parameters. `family_v4`: the rule's family (`None` for the
/// default rule).
pub fn action(a: &Action, family_v4: Option<bool>) -> Value {
    let mut m = match a {
        Action::Limit(l) => limit(l, family_v4),
        _ => serde_json::Map::new(),
    };
    m.insert("action".into(), json!(a.name()));
    m.insert(
        "dry_run".into(),
        json!(match a {
            Action::Allow => false,
            Action::Deny { dry_run } => *dry_run,
            Action::Limit(l) => l.dry_run,
        }),
    );
    m.insert("text".into(), json!(a.text(family_v4)));
    Value::Object(m)
}

/// A rule: its selector, what it does, and when it ends (`expires_at_ms`, Unix
/// ms, for a temporary rule).
pub fn rule(p: &Selector, a: &Action, expires_at_ms: Option<u64>, now_ms: u64) -> Value {
    let family_v4 = Some(p.source.addr.is_ipv4());
    let mut v = action(a, family_v4);
    v["cidr"] = json!(p.to_string());
    v["source"] = json!(p.source.to_string());
    v["match"] = json!(p.matches.to_string());
    v["family"] = json!(if p.source.addr.is_ipv4() {
        "ipv4"
    } else {
        "ipv6"
    });
    expiry(&mut v, expires_at_ms, now_ms);
    v
}

/// Adds `expires_at` (RFC 3339, UTC) and `expires_in_s`, both null for what
/// does not end.
pub fn expiry(v: &mut Value, expires_at_ms: Option<u64>, now_ms: u64) {
    v["expires_at"] = expires_at_ms.map_or(Value::Null, |ms| json!(rfc3339(ms)));
    v["expires_in_s"] = expires_at_ms.map_or(Value::Null, |ms| {
        number(ms.saturating_sub(now_ms) as f64 / 1000.0)
    });
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
    use super::*;
    use crate::model::rate::parse_rate;

    #[test]
    fn numbers_are_integers_or_two_decimals() {
        assert_eq!(number(200.077_446_778_408_76), json!(200.08));
        assert_eq!(number(1000.0), json!(1000));
        assert_eq!(number(0.5), json!(0.5));
        assert_eq!(number(1.0 / 3600.0), json!(0.000278));
        assert_eq!(number(0.016_666_6), json!(0.0167));
        assert_eq!(number(f64::NAN), Value::Null);
    }

    #[test]
    fn rates_keep_the_period_they_were_written_in() {
        let r = rate(&parse_rate("--rate", "30/min").unwrap());
        assert_eq!(r["amount"], json!(30));
        assert_eq!(r["period_s"], json!(60));
        assert_eq!(r["per_second"], json!(0.5));
        let r = rate(&parse_rate("--rate", "10Mbit/s").unwrap());
        assert_eq!(r["per_second"], json!(1_250_000));
        assert_eq!(r["unit"], json!("bytes"));
    }

    #[test]
    fn an_aggregate_shows_its_reserve_default_or_given() {
        let mut l = crate::model::rules::default_limit();
        l.aggregate = Some(Shared::of(parse_rate("--aggregate", "2000/s").unwrap()));
        let reserve = |l: &Limit| limit(l, None)["aggregate"]["reserve"].clone();
        assert_eq!(
            reserve(&l),
            json!({"amount": 1000, "unit": "packets"}),
            "half the burst"
        );
        l.aggregate_reserve = Some(0);
        assert_eq!(reserve(&l), json!({"amount": 0, "unit": "packets"}));
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
