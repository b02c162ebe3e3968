//! Source lists: `deny --from` and `allow --from` load one whole (parsed
//! here again: the one writer checks what it writes), `unset --list`
//! removes one.

use super::until;
use crate::{
    daemon::Daemon,
    error::{Error, Result},
    model::{
        describe,
        lists::{List, ListAction, check_name},
    },
    protocol::answer::{Changed, ListLoaded, Loaded},
};

impl Daemon {
    /// Loads the list `name` from `text` (read by the CLI from `source`),
    /// replacing the list of that name.
    pub(super) fn load_list(
        &mut self,
        name: String,
        action: ListAction,
        source: String,
        text: &str,
        for_ms: Option<u64>,
    ) -> Result<ListLoaded> {
        let started = std::time::Instant::now();
        let until = until(for_ms)?;
        check_name("--name", &name)?;
        let (list, parsed) = List::parse("--from", action, &source, text)?;
        let replaced = self.rules.effective().lists.get(&name).map(|l| l.action);
        let changed = self.change(|r| {
            r.set_live_list(name.clone(), Some(list), until);
            Ok(())
        })?;
        let ms = started.elapsed().as_millis() as u64;
        let dups = if parsed.duplicates > 0 {
            format!(", {} duplicate lines", parsed.duplicates)
        } else {
            String::new()
        };
        let verb = match replaced {
            Some(a) => format!("replaced the {a} list {name} with"),
            None => format!("loaded {action} list {name}:"),
        };
        let ends = until.map_or(String::new(), |at| {
            format!(
                "; ends in {} ({})",
                describe::span(for_ms.unwrap_or(0)),
                describe::rfc3339(at)
            )
        });
        let summary = format!(
            "{verb} {} entries from {source}{dups}; applied in {ms} ms{ends}",
            parsed.entries.len()
        );
        Ok(ListLoaded {
            changed,
            loaded: Loaded {
                name,
                action,
                source,
                lines: parsed.lines,
                entries: parsed.entries.len(),
                duplicates: parsed.duplicates,
                replaced: replaced.is_some(),
                applied_ms: ms,
                expires_at: until.map(describe::rfc3339),
                summary,
            },
        })
    }

    /// Removes the list `name` (a list of the config file: until `reload
    /// --replace`).
    pub(super) fn unset_list(&mut self, name: String) -> Result<Changed> {
        if crate::model::decisions::is_decision_list(&name) {
            return Err(Error::invalid(
                "--list",
                format!(
                    "the list {name} holds CrowdSec's decisions and follows its Local API: `cscli decisions delete --ip ADDRESS` ends one there (a rule of your own on its CIDR wins over it: `ratelimit allow CIDR`)"
                ),
            ));
        }
        self.change(|r| {
            if !r.effective().lists.contains_key(&name) {
                let names: Vec<String> = r.effective().lists.keys().cloned().collect();
                return Err(Error::invalid(
                    "--list",
                    if names.is_empty() {
                        format!("no list named {name:?}: no list is loaded")
                    } else {
                        format!("no list named {name:?}; the lists are {}", names.join(", "))
                    },
                ));
            }
            if r.base.lists.contains_key(&name) {
                // A list of the config file: removed until reload --replace.
                r.set_live_list(name, None, None);
            } else {
                r.clear_live_list(&name);
            }
            Ok(())
        })
    }
}
