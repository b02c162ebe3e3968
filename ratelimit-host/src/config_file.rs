//! A config file's errors, each at its line: how the daemon's `ratelimit.toml`
//! and the service's `ratelimit-serve.toml` are read and reported alike.
//!
//! What enters: a file's path. The text is read bounded ([`read_text`]),
//! parsed as TOML keeping spans ([`parse_toml`]); a reader's validation
//! errors name a field (`domain[0].limit[2].rate`), which [`line_of`] finds in
//! the document. What leaves: every error with its line ([`ConfigErrors`]),
//! `FILE:LINE: field: message`.

use std::{ops::Range, path::Path};

use toml_edit::{ImDocument, Item, TableLike, Value};

/// One error of a config file.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Problem {
    /// The line (from 1) of the key or table it is about; `None` when it is
    /// about the file as a whole (it cannot be read, it does not fit).
    pub line: Option<usize>,
    /// The key as the file names it (`rule[3] (198.18.0.0/24).rate`), or an
    /// option (`--max-rules`); empty when the file cannot be read as TOML.
    pub field: String,
    /// What is wrong, and which forms are accepted.
    pub message: String,
}

/// Every error of a config file. Nothing of the file was applied.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConfigErrors {
    /// The file, as the user named it.
    pub file: String,
    /// In the order of the file's lines; those about no line last.
    pub problems: Vec<Problem>,
}

impl ConfigErrors {
    /// The errors `problems` of `file`, in the order of their lines.
    pub fn of(file: &std::path::Path, mut problems: Vec<Problem>) -> Self {
        problems.sort_by_key(|p| (p.line.is_none(), p.line));
        Self {
            file: file.display().to_string(),
            problems,
        }
    }

    /// Each error as one line: `FILE:LINE: field: message`.
    pub fn lines(&self) -> impl Iterator<Item = String> + '_ {
        self.problems.iter().map(|p| {
            let at = match p.line {
                Some(line) => format!("{}:{line}", self.file),
                None => self.file.clone(),
            };
            if p.field.is_empty() {
                format!("{at}: {}", p.message)
            } else {
                format!("{at}: {}: {}", p.field, p.message)
            }
        })
    }

    /// `FILE: 3 errors; nothing was applied`.
    pub fn summary(&self) -> String {
        let n = self.problems.len();
        format!(
            "{}: {n} error{}; nothing was applied",
            self.file,
            if n == 1 { "" } else { "s" }
        )
    }
}

impl std::fmt::Display for ConfigErrors {
    /// Every error on its line, then the summary.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for line in self.lines() {
            writeln!(f, "{line}")?;
        }
        f.write_str(&self.summary())
    }
}

impl std::error::Error for ConfigErrors {}

/// An error of the file `path` as a whole, at `line` when known.
pub fn whole_file(path: &Path, line: Option<usize>, message: String) -> ConfigErrors {
    ConfigErrors::of(
        path,
        vec![Problem {
            line,
            field: String::new(),
            message,
        }],
    )
}

/// The text of the config file `path` (a regular file of bounded size).
pub fn read_text(path: &Path) -> Result<String, ConfigErrors> {
    crate::input::read(path, crate::input::Kind::Config, "the config file")
        .map_err(|e| whole_file(path, None, e))
}

/// `text` (of `path`) parsed as TOML, or its syntax error at its line.
pub fn parse_toml<'a>(path: &Path, text: &'a str) -> Result<ImDocument<&'a str>, ConfigErrors> {
    ImDocument::parse(text).map_err(|e| {
        let (line, message) = syntax_error(text, &e);
        whole_file(path, line, message)
    })
}

/// The line of a TOML syntax error and what it says, on one line (with the
/// column: the line alone may not show where).
pub fn syntax_error(text: &str, e: &toml_edit::TomlError) -> (Option<usize>, String) {
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

/// The line of the key or table `field` names (`domain[0].limit[2].rate`)
/// in `text`, parsed as `doc`: the deepest part of its path the file has.
/// For the other files read with located errors (`ratelimit serve --config`).
pub fn line_of(text: &str, doc: &ImDocument<&str>, field: &str) -> Option<usize> {
    let mut table: &dyn TableLike = doc.as_table();
    let mut line = None;
    for (name, index) in key_path(field) {
        let Some((key, item)) = table.get_key_value(&name) else {
            break;
        };
        line = key.span().map(|s| line_at(text, s.start)).or(line);
        let next: Option<(&dyn TableLike, Option<Range<usize>>)> = match (index, item) {
            (None, item) => item.as_table_like().map(|t| (t, None)),
            (Some(i), Item::ArrayOfTables(a)) => a.get(i).map(|t| (t as &dyn TableLike, t.span())),
            (Some(i), Item::Value(Value::Array(a))) => a
                .get(i)
                .and_then(|v| v.as_inline_table().map(|t| (t as &dyn TableLike, v.span()))),
            _ => None,
        };
        let Some((next, span)) = next else {
            break;
        };
        line = span.map(|s| line_at(text, s.start)).or(line);
        table = next;
    }
    line
}

/// The line (from 1) of byte `offset` of `text`.
pub fn line_at(text: &str, offset: usize) -> usize {
    let end = offset.min(text.len());
    text.as_bytes()[..end]
        .iter()
        .filter(|b| **b == b'\n')
        .count()
        + 1
}

/// The keys of an error's field: `rule[3] (198.18.0.0/24).levels[1].rate` is
/// `rule` 3, `levels` 0, `rate` (the part in parentheses names the rule's
/// selector; a level's index counts from 1 in errors, as `--rate` does on the
/// command line, the rule's own rate being the first).
pub fn key_path(field: &str) -> Vec<(String, Option<usize>)> {
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

/// The keys serde's derive reads a struct `T` with (renamed as written, the
/// list `deny_unknown_fields` checks against): what its `Deserialize` hands
/// to `deserialize_struct`. Panics for a type read otherwise (a flattened
/// struct is read as a map: its keys are not listed).
pub fn fields<T: serde::de::DeserializeOwned>() -> Vec<&'static str> {
    use serde::de::{Deserializer, Visitor};

    /// Why the probe stops: it only wants the list.
    #[derive(Debug)]
    struct Stop;
    impl std::fmt::Display for Stop {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("a probe of the keys")
        }
    }
    impl std::error::Error for Stop {}
    impl serde::de::Error for Stop {
        fn custom<M: std::fmt::Display>(_: M) -> Self {
            Stop
        }
    }

    /// A deserializer that keeps the fields a struct asks for, and fails.
    struct Probe<'a>(&'a mut Option<&'static [&'static str]>);
    impl<'de> Deserializer<'de> for Probe<'_> {
        type Error = Stop;
        fn deserialize_any<V: Visitor<'de>>(self, _: V) -> Result<V::Value, Stop> {
            Err(Stop)
        }
        fn deserialize_struct<V: Visitor<'de>>(
            self,
            _: &'static str,
            fields: &'static [&'static str],
            _: V,
        ) -> Result<V::Value, Stop> {
            *self.0 = Some(fields);
            Err(Stop)
        }
        serde::forward_to_deserialize_any! {
            bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string
            bytes byte_buf option unit unit_struct newtype_struct seq tuple
            tuple_struct map enum identifier ignored_any
        }
    }

    let mut fields = None;
    let _ = T::deserialize(Probe(&mut fields));
    fields
        .unwrap_or_else(|| {
            panic!(
                "{} is not read as a struct with a list of keys",
                std::any::type_name::<T>()
            )
        })
        .to_vec()
}

#[cfg(test)]
mod tests {
    use super::*;

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
