//! `ratelimit check --config FILE`: a config file checked as `run` and a
//! reload would read it ([`crate::config::check`]), and the report printed: a summary
//! line, every error with its line, or one JSON object.

use std::{fmt, path::Path};

use crate::{
    config::{
        RawConfig,
        check::{self, Summary},
    },
    error::ConfigErrors,
};

/// The summary line of a valid file.
struct Line<'a>(&'a Summary);

impl fmt::Display for Line<'_> {
    /// `12 rules, 2 lists (100000 entries), default 1000/s ...`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let plural =
            |n: usize, one: &str, many: &str| format!("{n} {}", if n == 1 { one } else { many });
        f.write_str(&plural(self.0.rules, "rule", "rules"))?;
        if !self.0.lists.is_empty() {
            write!(
                f,
                ", {} ({})",
                plural(self.0.lists.len(), "list", "lists"),
                plural(self.0.list_entries, "entry", "entries")
            )?;
        }
        write!(f, ", default {}", self.0.default)?;
        if self.0.dry_run {
            f.write_str(" (dry run: nothing is dropped)")?;
        }
        Ok(())
    }
}

/// Checks `path` as `run` and a reload would,
/// and whether it fits in maps of `max_rules` and `max_list_entries`; prints a
/// summary (stdout) or every error (stderr), or one JSON object (stdout) with
/// `json`. Returns whether the file is valid.
pub(super) fn command(path: &Path, json: bool, max_rules: u32, max_list_entries: u32) -> bool {
    let checked = check::file(path, &RawConfig::default()).and_then(|set| {
        match check::fits(&set, max_rules, max_list_entries) {
            problems if problems.is_empty() => Ok(set),
            problems => Err(ConfigErrors::of(path, problems)),
        }
    });
    let name = path.display().to_string();
    // Written, not printed: a reader that stops early (`| head`) is no
    // reason to panic.
    use std::io::Write as _;
    let _ = match (&checked, json) {
        (Ok(set), false) => writeln!(std::io::stdout(), "{name}: ok: {}", Line(&Summary::of(set))),
        (Err(errors), false) => writeln!(std::io::stderr(), "{errors}"),
        (_, true) => {
            let report = serde_json::json!({
                "file": name,
                "ok": checked.is_ok(),
                "errors": checked.as_ref().err().map_or(&[][..], |e| &e.problems[..]),
                "summary": checked.as_ref().ok().map(Summary::of),
            });
            let text = serde_json::to_string_pretty(&report).expect("serializes");
            writeln!(std::io::stdout(), "{text}")
        }
    };
    checked.is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_summary_line_counts_rules_lists_and_entries() {
        let summary = Summary {
            rules: 1,
            lists: vec![check::ListSummary {
                name: "bad".into(),
                action: "deny".into(),
                entries: 3,
                source: "bad.txt".into(),
            }],
            list_entries: 3,
            default: "limit 100/s burst 50".into(),
            dry_run: true,
        };
        assert_eq!(
            Line(&summary).to_string(),
            "1 rule, 1 list (3 entries), default limit 100/s burst 50 (dry run: nothing is dropped)"
        );
    }
}
