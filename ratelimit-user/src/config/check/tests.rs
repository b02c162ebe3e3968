//! Config files checked whole: every error with its line, lists, caps.

use super::*;

/// Checks `text` as a file; removes it after.
fn check(text: &str) -> Result<RuleSet, ConfigErrors> {
    check_with(text, &RawConfig::default())
}

fn check_with(text: &str, cli: &RawConfig) -> Result<RuleSet, ConfigErrors> {
    use std::sync::atomic::{AtomicU32, Ordering};
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let path = std::env::temp_dir().join(format!(
        "rl-check-{}-{}.toml",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::write(&path, text).unwrap();
    let out = file(&path, cli);
    let _ = std::fs::remove_file(&path);
    out
}

/// The (line, field) of each error, and the errors' text for messages.
fn at(e: &ConfigErrors) -> Vec<(Option<usize>, &str)> {
    e.problems
        .iter()
        .map(|p| (p.line, p.field.as_str()))
        .collect()
}

#[test]
fn every_independent_error_with_the_line_of_its_key() {
    let e = check(
        r#"new-states = "lots"
[default]
rate = "100/s"
per = 24

[[rule]]
cidr = "198.18.0.0/24"
action = "allow"

[[rule]]
cidr = "198.18.300.0/24"
action = "deny"

[[rule]]
cidr = "198.18.2.0/24"
rate = "5/fortnight"

[[rule]]
cidr = "198.18.3.0/24"
rate = "10/s"
levels = [
  { rate = "100/s", per = 24 },
  { rate = "0/s", per = 16 },
]
"#,
    )
    .unwrap_err();
    assert_eq!(
        at(&e),
        [
            (Some(1), "new-states"),
            (Some(4), "default.per"),
            (Some(11), "rule[1].cidr"),
            (Some(16), "rule[2] (198.18.2.0/24).rate"),
            (Some(23), "rule[3] (198.18.3.0/24).levels[2].rate"),
        ],
        "{e}"
    );
    let text = e.to_string();
    assert!(
        text.contains(":16: rule[2] (198.18.2.0/24).rate: invalid rate \"5/fortnight\"")
            && text.ends_with(": 5 errors; nothing was applied"),
        "{text}"
    );
}

#[test]
fn a_bad_cidr_does_not_hide_a_bad_limit_of_the_same_rule() {
    let e = check("[[rule]]\ncidr = \"2001:db8::/129\"\nrate = \"5/s\"\nburst = 0\n").unwrap_err();
    assert_eq!(
        at(&e),
        [(Some(2), "rule[0].cidr"), (Some(4), "rule[0].burst")],
        "{e}"
    );
}

#[test]
fn unknown_keys_and_wrong_types_in_several_rules() {
    let e = check(
        r#"colour = "red"
[[rule]]
cidr = "198.18.0.0/24"
rate = "5/s"
colour = "blue"
[[rule]]
cidr = "198.18.1.0/24"
per = "24"
[[rule]]
cidr = "198.18.2.0/24"
syn = "yes"
[[rule]]
action = "deny"
[[rule]]
cidr = "198.18.4.0/24"
rate = "5/fortnight"
"#,
    )
    .unwrap_err();
    assert_eq!(
        at(&e),
        [
            (Some(1), "colour"),
            (Some(5), "rule[0].colour"),
            (Some(8), "rule[1].per"),
            (Some(11), "rule[2].syn"),
            (Some(12), "rule[3]"),
            (Some(16), "rule[4] (198.18.4.0/24).rate"),
        ],
        "{e}"
    );
    let m = |i: usize| e.problems[i].message.as_str();
    assert!(m(0).contains("unknown field `colour`"), "{e}");
    assert!(
        m(1).contains("unknown field `colour`, expected one of")
            && m(1).contains("match keys `cidr`"),
        "{e}"
    );
    assert!(m(2).contains("expected u8"), "{e}");
    assert!(m(4).contains("missing field `cidr`"), "{e}");
}

#[test]
fn a_syntax_error_is_one_error_with_its_line() {
    let e = check("[default]\nrate = \"10/s\"\nburst = \n[[rule]]\n").unwrap_err();
    assert_eq!(e.problems.len(), 1, "{e}");
    assert_eq!(e.problems[0].line, Some(3), "{e}");
    assert!(e.problems[0].message.starts_with("not valid TOML"), "{e}");
    assert!(
        e.to_string()
            .contains(".toml:3: not valid TOML at column 9: invalid string; expected"),
        "{e}"
    );
}

#[test]
fn dependent_errors_are_said_once() {
    let e = check(
        "[[rule]]\ncidr = \"198.18.0.0/24\"\naction = \"deny\"\n[[rule]]\ncidr = \"198.18.0.0/24\"\naction = \"allow\"\n[[rule]]\ncidr = \"198.18.0.0/24\"\nrate = \"5/s\"\n",
    )
    .unwrap_err();
    assert_eq!(
        at(&e),
        [(Some(5), "rule[1].cidr"), (Some(8), "rule[2].cidr")],
        "{e}"
    );
    assert!(e.problems[0].message.contains("first as rule[0]"), "{e}");
    // Errors about the set as a whole come only when every part is valid,
    // and name the rule as the file does.
    let mut text = String::new();
    for port in 1..=9 {
        text.push_str(&format!(
            "[[rule]]\ncidr = \"198.18.0.0/24\"\nproto = \"udp\"\ndport = {port}\nrate = \"5/s\"\n"
        ));
    }
    let e = check(&text).unwrap_err();
    assert_eq!(e.problems.len(), 1, "{e}");
    assert!(e.problems[0].field.starts_with("rule["), "{e}");
    assert!(e.problems[0].line.is_some(), "{e}");
}

#[test]
fn inline_rule_tables_and_dotted_keys_have_lines_too() {
    let e = check(
        "rule = [\n  { cidr = \"198.18.0.0/24\", action = \"deny\" },\n  { cidr = \"198.18.1.0/24\", action = \"block\" },\n]\ndefault.rate = \"0/s\"\n",
    )
    .unwrap_err();
    assert_eq!(
        at(&e),
        [
            (Some(3), "rule[1] (198.18.1.0/24).action"),
            (Some(5), "default.rate")
        ],
        "{e}"
    );
}

#[test]
fn a_burst_that_is_not_a_whole_number_names_its_key_and_the_form() {
    // Regression: `data did not match any variant of untagged enum
    // RawBurst`, and for [default] no key at all.
    let e = check(
        "[default]\nrate = \"10/s\"\nburst = 1e300\n\n[[rule]]\ncidr = \"198.18.0.0/24\"\nrate = \"5/s\"\nburst = -1\n\n[[rule]]\ncidr = \"198.18.1.0/24\"\nrate = \"5/s\"\nburst = 1.5\n",
    )
    .unwrap_err();
    assert_eq!(
        at(&e),
        [
            (Some(3), "default.burst"),
            (Some(8), "rule[0].burst"),
            (Some(13), "rule[1].burst")
        ],
        "{e}"
    );
    for (p, value) in e.problems.iter().zip(["1e300", "-1", "1.5"]) {
        assert_eq!(
            p.message,
            format!(
                "invalid burst {value}: a burst is a whole number from 1 to 4294967296 (2^32), like 100, or for byte rates a size like \"64KB\""
            ),
            "{e}"
        );
    }
}

#[test]
fn a_missing_file_is_one_error_without_a_line() {
    let e = file(Path::new("/nonexistent/r.toml"), &RawConfig::default()).unwrap_err();
    assert_eq!(at(&e), [(None, "")], "{e}");
    assert!(
        e.to_string()
            .starts_with("/nonexistent/r.toml: cannot read the config file"),
        "{e}"
    );
}

#[test]
fn the_command_line_options_of_run_conflict_with_the_file() {
    let cli = RawConfig {
        default: Some(RawLimit {
            rate: Some("5/s".into()),
            ..RawLimit::default()
        }),
        ..RawConfig::default()
    };
    let e = check_with("[default]\nrate = \"10/s\"\n", &cli).unwrap_err();
    assert_eq!(e.problems[0].field, "--rate", "{e}");
    assert!(e.problems[0].message.contains("conflicts with"), "{e}");
    assert!(
        check_with(
            "[[rule]]\ncidr = \"198.18.0.0/24\"\naction = \"deny\"\n",
            &cli
        )
        .is_ok()
    );
}

#[test]
fn a_valid_file_reads_as_the_example_does() {
    let set = check(include_str!("../../../../examples/ratelimit.toml")).unwrap();
    let summary = Summary::of(&set);
    assert_eq!(summary.rules, set.rules.len());
    assert_eq!(summary.default, set.default.to_string());
    // The example teaches an aggregate on every limit that faces many
    // sources: `status` would name any without one.
    assert_eq!(set.without_aggregate(), Vec::<String>::new());
}

#[test]
fn what_does_not_fit_names_the_option() {
    let set = check(
        "[[rule]]\ncidr = \"198.18.0.0/24\"\naction = \"deny\"\n[[rule]]\ncidr = \"198.18.1.0/24\"\naction = \"deny\"\n",
    )
    .unwrap();
    assert!(fits(&set, 2, 1).is_empty());
    let over = fits(&set, 1, 1);
    assert_eq!(over.len(), 1);
    assert_eq!(over[0].field, "--max-rules");
    assert!(
        over[0].message.contains("--max-rules 2 or more"),
        "{over:?}"
    );
}

/// One rule and one list over a cap of one: said in the singular, not
/// "1 rules and 1 lists".
#[test]
fn what_does_not_fit_is_counted_in_words() {
    let mut set = check("[[rule]]\ncidr = \"198.18.0.0/24\"\naction = \"deny\"\n").unwrap();
    set.lists.insert(
        "bans".into(),
        crate::model::lists::List {
            action: crate::model::lists::ListAction::Deny,
            source: "bans.txt".into(),
            entries: std::sync::Arc::from(Vec::new()),
            counted: true,
        },
    );
    let over = fits(&set, 1, 1);
    assert_eq!(over.len(), 1, "{over:?}");
    assert!(
        over[0].message.starts_with(
            "1 rule and 1 list (a list takes a rule for its counters) do not fit in 1"
        ),
        "{over:?}"
    );
    let alone = check("[[rule]]\ncidr = \"198.18.0.0/24\"\naction = \"deny\"\n").unwrap();
    let over = fits(&alone, 0, 1);
    assert!(
        over[0].message.starts_with("1 rule does not fit in 0"),
        "{over:?}"
    );
}
