//! A whole config validated into a [`RuleSet`]: its global keys, its
//! default, each `[[rule]]` and each `[[list]]`, every independent error in
//! the order of the file.

use std::collections::BTreeMap;

use super::*;
use crate::{
    error::{Error, Result},
    model::droplog::DropLog,
    model::lists::{List, ListAction, check_name},
    model::rate::parse_rate,
    model::rules::{Action, Prefix, RuleSet, Selector, Shared},
};

impl RawConfig {
    /// Validates everything into a rule set, on top of `base` (the CLI's
    /// default); the first error if there are several (see
    /// [`RawConfig::validate_all`]).
    pub fn validate(&self, base: &RuleSet) -> Result<RuleSet> {
        self.validate_all(base)
            .map_err(|errors| errors.into_iter().next().expect("at least one error"))
    }

    /// Validates everything into a rule set, on top of `base`; every error, in
    /// the order of the file (see [`RawConfig::validate_parts`]).
    pub fn validate_all(&self, base: &RuleSet) -> Result<RuleSet, Vec<Error>> {
        self.validate_parts(
            self.rules.iter().enumerate(),
            self.lists.iter().enumerate(),
            base,
        )
    }

    /// Validates this config's global keys and default with `rules` and
    /// `lists` (each with its index in the file: `rule[3]` is the file's
    /// fourth `[[rule]]` even when one before it could not be read at all), on
    /// top of `base`. `self.rules` and `self.lists` are not read.
    ///
    /// Every error is returned, not just the first: each global key, the
    /// default, each rule and each list are checked on their own (a rule's
    /// source, match and limit too, so a bad CIDR does not hide a bad rate).
    /// What depends on several of them (a rule or list name given twice, the
    /// chains of rules with matches) is checked once the parts are valid, and
    /// said once.
    pub fn validate_parts<'a>(
        &self,
        rules: impl IntoIterator<Item = (usize, &'a RawRule)>,
        lists: impl IntoIterator<Item = (usize, &'a RawList)>,
        base: &RuleSet,
    ) -> Result<RuleSet, Vec<Error>> {
        let mut errors = Vec::new();
        let mut set = base.clone();
        if let Some(d) = self.dry_run {
            set.dry_run = d;
        }
        if let Some(m) = self.malformed {
            set.malformed = m;
        }
        if let Some(c) = self.clock {
            set.clock = c;
        }
        if let Some(n) = &self.new_states {
            match parse_rate("new-states", n) {
                Ok(rate) => set.new_states = Shared::of(rate),
                Err(e) => errors.push(e.into()),
            }
        }
        if let Some(m) = self.mode {
            set.mode = m;
        }
        if let Some(d) = &self.drop_log {
            match DropLog::parse("drop-log", d) {
                Ok(d) => set.drop_log = d,
                Err(e) => errors.push(e),
            }
        }
        if let Some(u) = self.unjudged {
            set.unjudged = u;
        }
        if let Some(f) = self.fragments {
            set.fragments = f;
        }
        if let Some(d) = &self.default {
            match d.validate("default", None) {
                Ok(action) => set.default = action,
                Err(e) => errors.push(e),
            }
        }
        // The field that names each valid rule, to name it again in errors
        // about several rules.
        let mut names: BTreeMap<Selector, String> = BTreeMap::new();
        let mut rule_set = BTreeMap::new();
        for (i, r) in rules {
            let Some((selector, action)) = r.validate(i, &mut errors) else {
                continue;
            };
            let field = format!("rule[{i}]");
            if let Some(first) = names.get(&selector) {
                errors.push(Error::invalid(
                    format!("{field}.cidr"),
                    format!("{selector} appears twice (first as {first}): a CIDR with the same match has one rule"),
                ));
                continue;
            }
            names.insert(selector, field);
            rule_set.insert(selector, action);
        }
        set.rules = rule_set;
        let mut list_names: BTreeMap<&str, usize> = BTreeMap::new();
        for (i, l) in lists {
            let field = format!("list[{i}]");
            let name = check_name(&format!("{field}.name"), &l.name);
            let action = ListAction::parse(&format!("{field}.action"), &l.action);
            // The file is read even when the action is wrong, so its bad lines
            // are said too.
            let list = List::read(
                &format!("{field}.path"),
                *action.as_ref().unwrap_or(&ListAction::Deny),
                &l.path,
            );
            let (Ok(()), Ok(_), Ok(list)) = (
                name.map_err(|e| errors.push(e)),
                action.map_err(|e| errors.push(e)),
                list.map_err(|e| errors.push(e)),
            ) else {
                continue;
            };
            if let Some(first) = list_names.get(l.name.as_str()) {
                errors.push(Error::invalid(
                    format!("{field}.name"),
                    format!(
                        "a list named {:?} appears twice (first as list[{first}]): give each list its own name",
                        l.name
                    ),
                ));
                continue;
            }
            list_names.insert(&l.name, i);
            set.lists.insert(l.name.clone(), list);
        }
        if !errors.is_empty() {
            return Err(errors);
        }
        // What holds for the set as a whole; its errors name a rule by its
        // selector or its source prefix: named as the file names it.
        set.validate().map_err(|e| {
            vec![match e {
                Error::Invalid { field, message } => {
                    let named = names
                        .iter()
                        .find(|(s, _)| s.to_string() == field)
                        .or_else(|| names.iter().find(|(s, _)| s.source.to_string() == field))
                        .map(|(s, name)| format!("{name} ({s})"));
                    let field = match named {
                        Some(n) => n,
                        None if field == "--new-states" && self.new_states.is_some() => {
                            "new-states".into()
                        }
                        None => field,
                    };
                    Error::Invalid { field, message }
                }
                e => e,
            }]
        })?;
        Ok(set)
    }
}

impl RawRule {
    /// The keys of a `[[rule]]` table that are not its limit's: its source and
    /// match. (A rule's limit keys are [`RawLimit`]'s.)
    pub const OWN_KEYS: [&str; 6] = ["cidr", "to", "proto", "dport", "syn", "icmp-type"];

    /// Validates the `i`th rule of a file: its selector and action, or `None`
    /// with every error of its source, its match and its limit added to
    /// `errors` (a limit is checked even under a bad source, for the family
    /// its text names).
    fn validate(&self, i: usize, errors: &mut Vec<Error>) -> Option<(Selector, Action)> {
        let field = format!("rule[{i}]");
        let source = Prefix::parse(&format!("{field}.cidr"), &self.cidr);
        let (name, family_v4, selector) = match source {
            Ok(source) => match self.matches(&field, &source) {
                Ok(matches) => {
                    let selector = Selector { source, matches };
                    (
                        format!("{field} ({selector})"),
                        source.addr.is_ipv4(),
                        Some(selector),
                    )
                }
                Err(e) => {
                    errors.push(e);
                    (format!("{field} ({source})"), source.addr.is_ipv4(), None)
                }
            },
            Err(e) => {
                errors.push(e);
                (field, !self.cidr.contains(':'), None)
            }
        };
        let action = self
            .limit
            .validate(&name, Some(family_v4))
            .map_err(|e| errors.push(e))
            .ok();
        selector.zip(action)
    }
}
