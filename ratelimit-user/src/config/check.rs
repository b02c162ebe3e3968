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

use ratelimit_host::config_file::{line_at, line_of, parse_toml, read_text};
use serde::{Deserialize as _, de::IntoDeserializer as _};
use toml_edit::{ImDocument, InlineTable, Item, Value};

use crate::{
    config::{RawConfig, RawLimit, RawList, RawRule},
    error::{ConfigErrors, Error, Problem, chain},
    model::rules::RuleSet,
};

/// Reads and validates the config file `path` (and the list files it names),
/// with `cli` on top: what `run`'s rule options set, which the file must not
/// set too (nothing, for `ratelimit check`).
pub fn file(path: &Path, cli: &RawConfig) -> Result<RuleSet, ConfigErrors> {
    let text = read_text(path)?;
    let doc = parse_toml(path, &text)?;
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

/// Whether `set` fits in a daemon's maps of `max_rules` rules and
/// `max_list_entries` list entries (its `--max-rules` and
/// `--max-list-entries`): what does not, as errors of the file as a whole.
pub fn fits(set: &RuleSet, max_rules: u32, max_list_entries: u32) -> Vec<Problem> {
    let mut out = Vec::new();
    let lists = set.lists.values().filter(|l| l.counted).count();
    let rules = set.rules.len() + lists;
    if rules > max_rules as usize {
        let n =
            |n: usize, one: &str, many: &str| format!("{n} {}", if n == 1 { one } else { many });
        let what = if lists == 0 {
            n(rules, "rule", "rules")
        } else {
            format!(
                "{} and {} (a list takes a rule for its counters)",
                n(set.rules.len(), "rule", "rules"),
                n(lists, "list", "lists")
            )
        };
        out.push(Problem {
            line: None,
            field: "--max-rules".into(),
            message: format!(
                "{what} {} not fit in {max_rules}: run the daemon (and this check) with --max-rules {rules} or more",
                if rules == 1 { "does" } else { "do" }
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
        line_of(self.text, self.doc, field)
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

#[cfg(test)]
mod tests;
