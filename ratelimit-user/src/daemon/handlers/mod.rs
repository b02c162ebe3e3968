//! A handler per request: [`Daemon::handle`] only dispatches. Changes edit
//! the live layer of the rules (see [`super::store`]) and are applied whole
//! or not at all, answered with the rules and what changed ([`changes`]);
//! reads answer from the maps ([`reads`]). Called by the daemon's loop, one
//! request at a time (the one writer of the maps); `reload` and `top` are
//! not here: the loop reads a config file off itself, and the control server
//! takes `top`'s two readings.
//!
//! - `set` in [`set`] (a limit, laid over the rule there is);
//! - `allow`, `deny` and `unset` of a selector in [`rules`];
//! - `deny --from`, `allow --from` and `unset --list` in [`lists`];
//! - `mode` in [`mode`];
//! - `reset` in [`reset`];
//! - `list`, `status`, `stats`, `log`, the drop counters and the fleet's rules in
//!   [`reads`];
//! - `explain` and `get` in [`explain`].

mod changes;
mod explain;
mod lists;
mod mode;
mod reads;
mod reset;
mod rules;
mod set;

use super::Daemon;
use crate::{
    error::{Error, Result},
    host::clock::now_ms,
    model::overlay::Layers,
    protocol::{
        Request,
        answer::{Answer, Changed},
    },
};

impl Daemon {
    /// Carries out `request`; its answer, or why not.
    pub(super) fn handle(&mut self, request: Request) -> Result<Answer> {
        match request {
            Request::Set {
                target,
                limit,
                for_ms,
                force,
            } => self.set(target, &limit, for_ms, force).map(Answer::from),
            Request::Allow { rule, for_ms } => self.allow(rule, for_ms).map(Answer::from),
            Request::Deny { rule, for_ms } => self.deny(rule, for_ms).map(Answer::from),
            Request::Unset {
                rule,
                only_temporary,
            } => self.unset(rule, only_temporary).map(Answer::from),
            Request::LoadList {
                name,
                action,
                source,
                text,
                for_ms,
            } => self
                .load_list(name, action, source, &text, for_ms)
                .map(Answer::from),
            Request::UnsetList { name } => self.unset_list(name).map(Answer::from),
            Request::Mode { mode } => self.mode(mode).map(Answer::from),
            Request::Reset { scope } => self.reset(scope).map(Answer::from),
            Request::List { counters } => self.list(counters).map(Answer::from),
            Request::Status => self.status().map(Answer::from),
            Request::Stats => self.stats().map(Answer::from),
            Request::Drops => self.drops().map(Answer::from),
            Request::FleetRules => self.fleet_rules().map(Answer::from),
            Request::Explain { probe } => self.explain(probe).map(Answer::from),
            Request::Get { source } => self.get(source).map(Answer::from),
            Request::Log { after, n } => self.drop_log(after, n).map(Answer::from),
            Request::Reload { .. } => Err(Error::Refused(
                "reload is answered by the loop when its file is read, not here".into(),
            )),
            Request::Top { .. } | Request::FleetTop { .. } => Err(Error::Refused(
                "top is answered by the connection, not the loop".into(),
            )),
        }
    }

    /// Applies a change to the live layer; answers with the rules and what
    /// changed.
    fn change(&mut self, edit: impl FnOnce(&mut Layers) -> Result<()>) -> Result<Changed> {
        let mut next = self.rules.clone();
        edit(&mut next)?;
        let changes = changes::between(&self.rules, &next);
        self.apply(next)?;
        Ok(Changed {
            rules: super::read::list_of(&self.rules, None)?,
            changes,
        })
    }

    /// A reload's answer: the rules, and what changed since `before`.
    pub(super) fn reloaded(&self, before: &Layers) -> Result<Changed> {
        Ok(Changed {
            rules: super::read::list_of(&self.rules, None)?,
            changes: changes::between(before, &self.rules),
        })
    }
}

/// The longest `--for`: ten years (a longer ban is a permanent one).
const FOR_MAX_MS: u64 = 10 * 366 * 86_400_000;

/// When a change made `--for` this long ends, Unix ms.
fn until(for_ms: Option<u64>) -> Result<Option<u64>> {
    match for_ms {
        None => Ok(None),
        Some(0) => Err(Error::invalid(
            "--for",
            "must be longer than 0, e.g. 10m, 1h, 7d or 1y",
        )),
        Some(ms) if ms > FOR_MAX_MS => Err(Error::invalid(
            "--for",
            "at most ten years (10y, or 3660d); leave --for out for a rule that stays",
        )),
        Some(ms) => Ok(Some(now_ms() + ms)),
    }
}
