//! `allow`, `deny` and `unset` of one rule, named by its selector (a CIDR
//! and its match), for good or `--for` a while.

use super::until;
use crate::{
    daemon::Daemon,
    error::{Error, Result},
    model::rules::{Action, Selector},
    protocol::answer::Changed,
};

impl Daemon {
    /// Exempts the selector's frames.
    pub(super) fn allow(&mut self, rule: Selector, for_ms: Option<u64>) -> Result<Changed> {
        let until = until(for_ms)?;
        self.change(|r| {
            r.set_live(rule, Some(Action::Allow), until);
            Ok(())
        })
    }

    /// Drops the selector's frames.
    pub(super) fn deny(&mut self, rule: Selector, for_ms: Option<u64>) -> Result<Changed> {
        let until = until(for_ms)?;
        self.change(|r| {
            r.set_live(rule, Some(Action::Deny { dry_run: false }), until);
            Ok(())
        })
    }

    /// Removes the selector's rule; a temporary one ends, and what it hid
    /// comes back (`only_temporary`: nothing else).
    pub(super) fn unset(&mut self, rule: Selector, only_temporary: bool) -> Result<Changed> {
        self.change(|r| {
            // A temporary rule ends as its time would: what it hid comes
            // back.
            if r.end_temporary(&rule) || only_temporary {
                return Ok(());
            }
            if !r.effective().rules.contains_key(&rule) {
                return Err(Error::invalid(
                    "CIDR",
                    format!("no rule for {rule}; `ratelimit list` shows the rules"),
                ));
            }
            if r.base.rules.contains_key(&rule) {
                // A rule of the config file: removed until reload --replace.
                r.set_live(rule, None, None);
            } else {
                r.clear_live(&rule);
            }
            Ok(())
        })
    }
}
