//! The config's reading and validation, from TOML text to a rule set and back.

use super::*;
use crate::{
    error::{Error, Result},
    model::rate::Unit,
    model::rules::{Action, Algo, MalformedPolicy, RuleSet, Selector},
};

fn parse(s: &str) -> Result<RuleSet> {
    toml::from_str::<RawConfig>(s)
        .map_err(|e| Error::invalid("t.toml", e.to_string()))?
        .validate(&RuleSet::default())
}

#[test]
fn the_example_file_is_valid() {
    let text = include_str!("../../../examples/ratelimit.toml");
    let set = parse(text).unwrap_or_else(|e| panic!("{e}"));
    assert!(!set.rules.is_empty());
}

#[test]
fn rules_and_defaults() {
    let set = parse(
        r#"
        dry-run = false
        malformed = "drop"
        [default]
        rate = "100/s"
        burst = 200
        per-v6 = 56
        [[rule]]
        cidr = "198.18.0.0/24"
        action = "allow"
        [[rule]]
        cidr = "2001:db8:bad::/48"
        action = "deny"
        [[rule]]
        cidr = "198.19.0.0/16"
        rate = "1Gbit/s"
        burst = "1MB"
        per = 24
        dry-run = true
        "#,
    )
    .unwrap();
    assert_eq!(set.malformed, MalformedPolicy::Drop);
    let Action::Limit(d) = set.default else {
        panic!("default not a limit")
    };
    assert_eq!((d.burst, d.per_v4, d.per_v6), (200, 32, 56));
    assert_eq!(set.rules.len(), 3);
    let p = Selector::parse("x", "198.19.0.0/16").unwrap();
    let Action::Limit(l) = set.rules[&p] else {
        panic!("not a limit")
    };
    assert_eq!(
        (l.burst, l.per_v4, l.dry_run, l.rate.unit),
        (1_000_000, 24, true, Unit::Bytes)
    );
}

#[test]
fn an_aggregate_reserve_is_a_count_or_a_share_below_its_burst() {
    let reserve = |extra: &str| {
        parse(&format!(
            "[default]\nrate = \"100/s\"\naggregate = \"10k/s\"\naggregate-burst = 2000\n{extra}"
        ))
        .map(|set| match set.default {
            Action::Limit(l) => l.aggregate_reserve,
            _ => panic!("not a limit"),
        })
    };
    assert_eq!(reserve("").unwrap(), None, "the default: half the burst");
    assert_eq!(reserve("aggregate-reserve = 500").unwrap(), Some(500));
    assert_eq!(reserve("aggregate-reserve = \"25%\"").unwrap(), Some(500));
    assert_eq!(reserve("aggregate-reserve = 0").unwrap(), Some(0));
    for bad in ["2000", "\"100%\"", "\"lots\"", "\"-1\""] {
        let e = reserve(&format!("aggregate-reserve = {bad}")).unwrap_err();
        assert!(
            e.to_string().contains("aggregate-reserve"),
            "{bad}: the error names the field: {e}"
        );
    }
    let e = parse("[default]\nrate = \"100/s\"\naggregate-reserve = 10\n").unwrap_err();
    assert!(e.to_string().contains("give the aggregate too"), "{e}");
    // Round trip through the kernel's rule: the reserve comes back.
    let set =
        parse("[default]\nrate = \"100/s\"\naggregate = \"10k/s\"\naggregate-reserve = 123\n")
            .unwrap();
    let k = set.default.to_kernel(0, "default").unwrap();
    assert_eq!(k.aggregate_reserve, 123 * k.aggregate.interval);
    assert_eq!(Action::from_kernel(&k), set.default);
}

#[test]
fn a_rule_set_round_trips_through_its_raw_form() {
    let set = parse(include_str!("../../../examples/ratelimit.toml")).unwrap();
    let text = toml::to_string(&RawConfig::from(&set)).unwrap();
    assert_eq!(parse(&text).unwrap(), set, "{text}");
}

#[test]
fn algorithms_and_their_parameters() {
    let set = parse(
        r#"
        [[rule]]
        cidr = "198.18.1.0/24"
        algorithm = "sliding-log"
        limit = 10
        window = "1s"
        [[rule]]
        cidr = "198.18.2.0/24"
        algorithm = "rolling-quota"
        quota = 10000
        window = "24h"
        period = "1h"
        rate-cap = 1000
        [[rule]]
        cidr = "198.18.3.0/24"
        algorithm = "token-bucket-interval"
        refill-every = "60s"
        refill-amount = 60
        capacity = 60
        "#,
    )
    .unwrap();
    let p = |s| Selector::parse("x", s).unwrap();
    let Action::Limit(l) = set.rules[&p("198.18.1.0/24")] else {
        panic!()
    };
    assert_eq!(
        l.algo,
        Algo::SlidingLog {
            window_ns: 1_000_000_000,
            limit: 10
        }
    );
    let Action::Limit(l) = set.rules[&p("198.18.2.0/24")] else {
        panic!()
    };
    assert!(matches!(
        l.algo,
        Algo::RollingQuota {
            quota: 10000,
            rate_cap: 1000,
            ..
        }
    ));
    assert_eq!(
        l.to_string(),
        "rolling-quota 10000 per 1d at most 1000 per 1h per /32 (IPv4) /64 (IPv6)"
    );
    // The saved form reads back to the same set.
    let text = toml::to_string(&RawConfig::from(&set)).unwrap();
    assert_eq!(parse(&text).unwrap(), set, "{text}");
    for (text, needle) in [
        (
            "algorithm = \"sliding-log\"\nlimit = 100\nwindow = \"1s\"",
            "use the sliding-window algorithm",
        ),
        (
            "algorithm = \"fixed-window\"\nlimit = 10",
            "fixed-window needs window",
        ),
        (
            "algorithm = \"fixed-window\"\nlimit = 10\nwindow = \"1s\"\nrate = \"5/s\"",
            "fixed-window takes no rate",
        ),
        ("algorithm = \"leaky\"", "unknown algorithm \"leaky\""),
        (
            "algorithm = \"rolling-quota\"\nquota = 5\nwindow = \"90min\"\nperiod = \"1h\"\nrate-cap = 2",
            "whole number of periods",
        ),
        (
            "algorithm = \"fixed-window\"\nlimit = 10\nwindow = \"10 fortnights\"",
            "invalid duration",
        ),
    ] {
        let file = format!("[[rule]]\ncidr = \"198.18.0.0/24\"\n{text}");
        let e = parse(&file).expect_err(text).to_string();
        assert!(e.contains(needle), "{text:?}: {e}");
    }
}

#[test]
fn lists_in_the_config_are_read_relative_to_it() {
    let dir = std::env::temp_dir().join(format!("rl-config-lists-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("bad.txt"), "198.18.0.1\nnot-an-address\n").unwrap();
    std::fs::write(dir.join("ok.netset"), "# ok\n198.18.0.0/24\n").unwrap();
    let toml = dir.join("r.toml");
    let read = |text: &str| {
        std::fs::write(&toml, text).unwrap();
        crate::config::check::file(&toml, &RawConfig::default())
    };
    let set = read("[[list]]\nname = \"ok\"\naction = \"deny\"\npath = \"ok.netset\"\n").unwrap();
    assert_eq!(set.lists["ok"].entries.len(), 1);
    let e = read("[[list]]\nname = \"bad\"\naction = \"deny\"\npath = \"bad.txt\"\n").unwrap_err();
    let p = &e.problems[0];
    assert!(
        p.field == "list[0].path" && p.line == Some(4) && p.message.contains("bad.txt:2:"),
        "{e}"
    );
    let e = read("[[list]]\nname = \"ok\"\naction = \"drop\"\npath = \"ok.netset\"\n").unwrap_err();
    assert_eq!(
        (e.problems[0].field.as_str(), e.problems[0].line),
        ("list[0].action", Some(3)),
        "{e}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_rules_own_keys_are_those_its_table_has_besides_the_limits() {
    let rule = RawRule {
        cidr: "198.18.0.0/24".into(),
        to: Some("198.18.1.0/24".into()),
        proto: Some(RawNumberOrText::Text("udp".into())),
        dport: Some(RawNumberOrText::Number(53)),
        syn: Some(false),
        icmp_type: Some(8),
        limit: RawLimit::default(),
    };
    let table = toml::Table::try_from(&rule).unwrap();
    let keys: Vec<&str> = table.keys().map(String::as_str).collect();
    let mut own = RawRule::OWN_KEYS.to_vec();
    own.sort_unstable();
    assert_eq!(keys, own);
}

#[test]
fn validate_all_says_every_independent_error() {
    let raw: RawConfig = toml::from_str(
        r#"
        new-states = "many"
        [default]
        rate = "0/s"
        [[rule]]
        cidr = "198.18.0.0/33"
        [[rule]]
        cidr = "198.18.1.0/24"
        proto = "tcp"
        icmp-type = 8
        action = "deny"
        [[rule]]
        cidr = "198.18.2.0/24"
        action = "allow"
        [[list]]
        name = "has space"
        action = "block"
        path = "/nonexistent/list.txt"
        "#,
    )
    .unwrap();
    let errors = raw.validate_all(&RuleSet::default()).unwrap_err();
    let fields: Vec<String> = errors
        .iter()
        .map(|e| match e {
            Error::Invalid { field, .. } => field.clone(),
            e => panic!("not an invalid-value error: {e}"),
        })
        .collect();
    assert_eq!(
        fields,
        [
            "new-states",
            "default.rate",
            "rule[0].cidr",
            "rule[0].rate",
            "rule[1].icmp-type",
            "list[0].name",
            "list[0].action",
            "list[0].path"
        ],
        "{errors:?}"
    );
}

#[test]
fn bad_files_say_why() {
    for (text, needle) in [
        ("colour = 1", "unknown field `colour`"),
        ("[default]\nrate = \"10/s\"\nburst = 0", "default.burst"),
        ("[default]\nrate = \"0/s\"", "would drop every source"),
        (
            "[[rule]]\ncidr = \"300.1.2.3/24\"\naction = \"deny\"",
            "rule[0].cidr",
        ),
        (
            "[[rule]]\ncidr = \"2001:db8::/129\"\naction = \"deny\"",
            "rule[0].cidr",
        ),
        (
            "[[rule]]\ncidr = \"198.18.0.0/24\"\naction = \"allow\"\nrate = \"5/s\"",
            "takes no rate",
        ),
        (
            "[[rule]]\ncidr = \"198.18.0.0/24\"\naction = \"block\"",
            "expected limit, allow or deny",
        ),
        (
            "[[rule]]\ncidr = \"198.18.0.0/24\"\nrate = \"5/fortnight\"",
            "rule[0] (198.18.0.0/24).rate",
        ),
        (
            "[[rule]]\ncidr = \"198.18.0.0/24\"\naction = \"deny\"\n[[rule]]\ncidr = \"198.18.0.0/24\"\naction = \"allow\"",
            "appears twice",
        ),
    ] {
        let e = parse(text).expect_err(text).to_string();
        assert!(e.contains(needle), "{text:?}: {e}");
    }
}
