//! Checking a config file the way each of its readers does: `ratelimit run
//! --config`, a reload (SIGHUP, `ratelimit reload`) and `ratelimit check`.
//!
//! What enters: the file's path (and, for `run`, the command line's rule
//! options, which the file must not repeat). What leaves: the validated
//! [`RuleSet`], or every error found, each with the line of the key or table it
//! is about ([`ConfigErrors`]). Nothing running is touched: no root, lock,
//! socket or map, so `ratelimit check` is this module and a report.
//!
//! Every error, not just the first: the TOML is parsed whole (a syntax error is
//! one error: past it nothing can be read reliably); then each top-level key,
//! each `[[rule]]` and each `[[list]]` is read into its type on its own, and
//! what could be read is validated part by part
//! ([`RawConfig::validate_parts`]). Lines come from the spans `toml_edit`
//! keeps: an error's field (`rule[3] (198.18.0.0/24).rate`) is a path of keys
//! into the document.

use std::{ops::Range, path::Path};

use serde::{Deserialize as _, de::IntoDeserializer as _};
use toml_edit::{ImDocument, InlineTable, Item, TableLike, Value};

use crate::{
    config::{RawConfig, RawLimit, RawList, RawRule},
    error::{ConfigErrors, Error, Problem, chain},
    model::rules::RuleSet,
};

/// Reads and validates the config file `path` (and the list files it names),
/// with `cli` on top: what `run`'s rule options set, which the file must not
/// set too (nothing, for `ratelimit check`).
pub fn file(path: &Path, cli: &RawConfig) -> Result<RuleSet, ConfigErrors> {
    let whole = |line, message: String| {
        ConfigErrors::of(
            path,
            vec![Problem {
                line,
                field: String::new(),
                message,
            }],
        )
    };
    let text = crate::host::input::read(path, crate::host::input::Kind::Config, "the config file")
        .map_err(|e| whole(None, e))?;
    let doc = ImDocument::parse(text.as_str()).map_err(|e| {
        let (line, message) = syntax_error(&text, &e);
        whole(line, message)
    })?;
    let file = Located {
        text: &text,
        doc: &doc,
    };
    let mut problems = Vec::new();
    let mut parts = file.parts(&mut problems);
    // A list's relative path is relative to the config file.
    let dir = path.parent().unwrap_or(Path::new("."));
    for (_, l) in &mut parts.lists {
        if l.path.is_relative() {
            l.path = dir.join(&l.path);
        }
    }
    let globals = match RawConfig::merge(parts.globals.clone(), cli, &path.display().to_string()) {
        Ok(merged) => merged,
        Err(e) => {
            problems.push(file.problem(e));
            parts.globals
        }
    };
    let set = globals
        .validate_parts(
            parts.rules.iter().map(|(i, r)| (*i, r)),
            parts.lists.iter().map(|(i, l)| (*i, l)),
            &RuleSet::default(),
        )
        .map_err(|errors| problems.extend(errors.into_iter().map(|e| file.problem(e))));
    match set {
        Ok(set) if problems.is_empty() => Ok(set),
        _ => Err(ConfigErrors::of(path, problems)),
    }
}

/// The line of a TOML syntax error and what it says, on one line (with the
/// column: the line alone may not show where).
fn syntax_error(text: &str, e: &toml_edit::TomlError) -> (Option<usize>, String) {
    let at = e.span().map(|s| s.start);
    let column = at
        .and_then(|at| text.get(..at))
        .map_or(String::new(), |before| {
            let line = before.rfind('\n').map_or(before, |n| &before[n + 1..]);
            format!(" at column {}", line.chars().count() + 1)
        });
    let why: Vec<&str> = e
        .message()
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect();
    (
        at.map(|at| line_at(text, at)),
        format!("not valid TOML{column}: {}", why.join("; ")),
    )
}

/// Whether `set` fits in a daemon's maps of `max_rules` rules and
/// `max_list_entries` list entries (its `--max-rules` and
/// `--max-list-entries`): what does not, as errors of the file as a whole.
pub fn fits(set: &RuleSet, max_rules: u32, max_list_entries: u32) -> Vec<Problem> {
    let mut out = Vec::new();
    let rules = set.rules.len();
    if rules > max_rules as usize {
        out.push(Problem {
            line: None,
            field: "--max-rules".into(),
            message: format!(
                "{rules} rules do not fit in {max_rules}: run the daemon (and this check) with --max-rules {rules} or more"
            ),
        });
    }
    let listed = set.trie_entries().len();
    if listed > max_list_entries as usize {
        out.push(Problem {
            line: None,
            field: "--max-list-entries".into(),
            message: format!(
                "the lists take {listed} entries (those a rule or an allow entry shadows left out), more than {max_list_entries}: run the daemon (and this check) with --max-list-entries {listed} or more"
            ),
        });
    }
    out
}

/// What a valid file holds, for `ratelimit check`.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Summary {
    /// Prefix rules.
    pub rules: usize,
    /// Lists, each with its entries.
    pub lists: Vec<ListSummary>,
    /// Entries of all lists together.
    pub list_entries: usize,
    /// The default rule, as `ratelimit list` shows it.
    pub default: String,
    /// Whether nothing is dropped (dry run).
    pub dry_run: bool,
}

/// A list of a valid file.
#[derive(Clone, Debug, serde::Serialize)]
pub struct ListSummary {
    /// Its name.
    pub name: String,
    /// `deny` or `allow`.
    pub action: String,
    /// Entries read (host bits cleared, each once).
    pub entries: usize,
    /// The file it was read from.
    pub source: String,
}

impl Summary {
    /// What `set` holds.
    pub fn of(set: &RuleSet) -> Self {
        let lists: Vec<ListSummary> = set
            .lists
            .iter()
            .map(|(name, l)| ListSummary {
                name: name.clone(),
                action: l.action.to_string(),
                entries: l.entries.len(),
                source: l.source.clone(),
            })
            .collect();
        Self {
            rules: set.rules.len(),
            list_entries: lists.iter().map(|l| l.entries).sum(),
            lists,
            default: set.default.to_string(),
            dry_run: set.dry_run,
        }
    }
}

/// The line (from 1) of byte `offset` of `text`.
fn line_at(text: &str, offset: usize) -> usize {
    let end = offset.min(text.len());
    text.as_bytes()[..end]
        .iter()
        .filter(|b| **b == b'\n')
        .count()
        + 1
}

/// What a file's parts read into, each rule and list with its index in the
/// file.
struct Parts {
    globals: RawConfig,
    rules: Vec<(usize, RawRule)>,
    lists: Vec<(usize, RawList)>,
}

/// A parsed file and its text, to find the line of a key.
struct Located<'a> {
    text: &'a str,
    doc: &'a ImDocument<&'a str>,
}

/// A rule's own keys, for an error about a key neither they nor the limit
/// keys are.
const RULE_KEYS_HINT: &str =
    "; a rule also takes its match keys `cidr`, `to`, `proto`, `dport`, `syn`, `icmp-type`";

impl Located<'_> {
    fn line(&self, span: Option<Range<usize>>) -> Option<usize> {
        span.map(|s| line_at(self.text, s.start))
    }

    /// Reads each part on its own: a bad key or type in one rule leaves the
    /// others to be read (and validated).
    fn parts(&self, problems: &mut Vec<Problem>) -> Parts {
        let root = self.doc.as_table();
        let mut globals = InlineTable::new();
        let mut rules = Vec::new();
        let mut lists = Vec::new();
        for (name, item) in root.iter() {
            let Some((key, _)) = root.get_key_value(name) else {
                continue;
            };
            match (name, tables(item)) {
                ("rule", Some(tables)) => {
                    for (i, (table, span)) in tables.into_iter().enumerate() {
                        match read_rule(&table) {
                            Ok(r) => rules.push((i, r)),
                            Err(e) => problems.push(self.serde_problem(
                                &format!("rule[{i}]"),
                                &table,
                                self.line(span),
                                e,
                                RULE_KEYS_HINT,
                            )),
                        }
                    }
                }
                ("list", Some(tables)) => {
                    for (i, (table, span)) in tables.into_iter().enumerate() {
                        match RawList::deserialize(
                            Value::InlineTable(table.clone()).into_deserializer(),
                        ) {
                            Ok(l) => lists.push((i, l)),
                            Err(e) => problems.push(self.serde_problem(
                                &format!("list[{i}]"),
                                &table,
                                self.line(span),
                                e,
                                "",
                            )),
                        }
                    }
                }
                _ => {
                    let Ok(value) = item.clone().into_value() else {
                        continue;
                    };
                    let mut alone = InlineTable::new();
                    alone.insert_formatted(key, value.clone());
                    match RawConfig::deserialize(
                        Value::InlineTable(alone.clone()).into_deserializer(),
                    ) {
                        Ok(_) => {
                            globals.insert_formatted(key, value);
                        }
                        Err(e) => problems.push(self.serde_problem(
                            "",
                            &alone,
                            self.line(key.span()),
                            e,
                            "",
                        )),
                    }
                }
            }
        }
        // Each key was read alone: together they read too.
        let globals = RawConfig::deserialize(Value::InlineTable(globals).into_deserializer())
            .unwrap_or_else(|e| {
                problems.push(Problem {
                    line: self.line(e.span()),
                    field: String::new(),
                    message: e.message().to_string(),
                });
                RawConfig::default()
            });
        Parts {
            globals,
            rules,
            lists,
        }
    }

    /// A key or type error of the table `table`, named `field` (empty for the
    /// top level), whose line is `line` when the error has no span of its own.
    /// `hint` is added to an unknown key's error.
    fn serde_problem(
        &self,
        field: &str,
        table: &InlineTable,
        line: Option<usize>,
        e: toml_edit::de::Error,
        hint: &str,
    ) -> Problem {
        let join = |key: &str| {
            if field.is_empty() {
                key.to_string()
            } else {
                format!("{field}.{key}")
            }
        };
        let unknown = e
            .message()
            .strip_prefix("unknown field `")
            .and_then(|rest| rest.split_once('`'))
            .map(|(key, _)| key);
        // The key the error is about: the unknown one, or the one whose key
        // or value holds the error's span.
        let at = e.span().map(|s| s.start);
        let key = table
            .iter()
            .filter_map(|(k, _)| table.get_key_value(k))
            .find(|(k, v)| {
                Some(k.get()) == unknown
                    || at.is_some_and(|at| {
                        let within = |s: Option<Range<usize>>| s.is_some_and(|s| s.contains(&at));
                        within(k.span()) || within(v.span())
                    })
            });
        let message = match unknown {
            Some(_) => format!("{}{hint}", e.message()),
            None => e.message().to_string(),
        };
        // The key the error's span is in, within a table too
        // (`default.burst`).
        let path = match unknown {
            Some(_) => None,
            None => at.and_then(|at| key_at(table, at)),
        };
        Problem {
            line: self
                .line(e.span())
                .or_else(|| key.and_then(|(k, _)| self.line(k.span())))
                .or(line),
            field: match (path, key) {
                (Some(path), _) => join(&path),
                (None, Some((k, _))) => join(k.get()),
                (None, None) => field.to_string(),
            },
            message,
        }
    }

    /// An error of validation, at the line of the key its field names.
    fn problem(&self, e: Error) -> Problem {
        match e {
            Error::Invalid { field, message } => Problem {
                line: self.locate(&field),
                field,
                message,
            },
            e => Problem {
                line: None,
                field: String::new(),
                message: chain(&e),
            },
        }
    }

    /// The line of the key or table `field` names: the deepest of its path
    /// the file has (a missing key's table).
    fn locate(&self, field: &str) -> Option<usize> {
        let mut table: &dyn TableLike = self.doc.as_table();
        let mut line = None;
        for (name, index) in key_path(field) {
            let Some((key, item)) = table.get_key_value(&name) else {
                break;
            };
            line = self.line(key.span()).or(line);
            let next: Option<(&dyn TableLike, Option<Range<usize>>)> = match (index, item) {
                (None, item) => item.as_table_like().map(|t| (t, None)),
                (Some(i), Item::ArrayOfTables(a)) => {
                    a.get(i).map(|t| (t as &dyn TableLike, t.span()))
                }
                (Some(i), Item::Value(Value::Array(a))) => a
                    .get(i)
                    .and_then(|v| v.as_inline_table().map(|t| (t as &dyn TableLike, v.span()))),
                _ => None,
            };
            let Some((next, span)) = next else {
                break;
            };
            line = self.line(span).or(line);
            table = next;
        }
        line
    }
}

/// The path of keys of `table` to the one whose key or value holds byte
/// `at` of the file, through the tables it is in (`default.burst`).
fn key_at(table: &InlineTable, at: usize) -> Option<String> {
    let within = |s: Option<Range<usize>>| s.is_some_and(|s| s.contains(&at));
    table
        .iter()
        .filter_map(|(k, _)| table.get_key_value(k))
        .find_map(|(k, v)| {
            let inner = v.as_inline_table().and_then(|t| key_at(t, at));
            match inner {
                Some(inner) => Some(format!("{}.{inner}", k.get())),
                None if within(k.span()) || within(v.span()) => Some(k.get().to_string()),
                None => None,
            }
        })
}

/// The tables of `[[rule]]` (or `rule = [{ ... }]`), each with its span;
/// `None` if `item` is anything else (then reading it says what is wrong).
fn tables(item: &Item) -> Option<Vec<(InlineTable, Option<Range<usize>>)>> {
    match item {
        Item::ArrayOfTables(a) => Some(
            a.iter()
                .map(|t| (t.clone().into_inline_table(), t.span()))
                .collect(),
        ),
        Item::Value(Value::Array(a)) => a
            .iter()
            .map(|v| v.as_inline_table().map(|t| (t.clone(), v.span())))
            .collect(),
        _ => None,
    }
}

/// A `[[rule]]` table. Its limit keys are read first on their own: a
/// flattened struct's errors carry no span and no list of the keys expected.
fn read_rule(table: &InlineTable) -> Result<RawRule, toml_edit::de::Error> {
    let mut limit = table.clone();
    for key in RawRule::OWN_KEYS {
        limit.remove(key);
    }
    RawLimit::deserialize(Value::InlineTable(limit).into_deserializer())?;
    RawRule::deserialize(Value::InlineTable(table.clone()).into_deserializer())
}

/// The keys of an error's field: `rule[3] (198.18.0.0/24).levels[1].rate` is
/// `rule` 3, `levels` 0, `rate` (the part in parentheses names the rule's
/// selector; a level's index counts from 1 in errors, as `--rate` does on the
/// command line, the rule's own rate being the first).
fn key_path(field: &str) -> Vec<(String, Option<usize>)> {
    let field = match (field.find(" ("), field.find(')')) {
        (Some(open), Some(close)) if open < close => {
            format!("{}{}", &field[..open], &field[close + 1..])
        }
        _ => field.to_string(),
    };
    field
        .split('.')
        .map(|segment| match segment.split_once('[') {
            Some((name, index)) => {
                let index: Option<usize> = index.trim_end_matches(']').parse().ok();
                let index = if name == "levels" {
                    index.and_then(|i| i.checked_sub(1))
                } else {
                    index
                };
                (name.to_string(), index)
            }
            None => (segment.to_string(), None),
        })
        .collect()
}

#[cfg(test)]
mod tests {
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
        let e =
            check("[[rule]]\ncidr = \"2001:db8::/129\"\nrate = \"5/s\"\nburst = 0\n").unwrap_err();
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
        let set = check(include_str!("../../../examples/ratelimit.toml")).unwrap();
        let summary = Summary::of(&set);
        assert_eq!(summary.rules, set.rules.len());
        assert_eq!(summary.default, set.default.to_string());
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

    #[test]
    fn key_paths_leave_out_the_selector_and_count_levels_from_one() {
        assert_eq!(
            key_path("rule[3] (198.18.0.0/24 proto tcp).levels[1].rate"),
            [
                ("rule".to_string(), Some(3)),
                ("levels".to_string(), Some(0)),
                ("rate".to_string(), None)
            ]
        );
        assert_eq!(key_path("new-states"), [("new-states".to_string(), None)]);
    }
}
