//! A daemon's rules in two layers: the **base** (the config file with the
//! command line's options, or the command line alone) and the **live
//! changes** on top (`set`, `allow`, `deny`, `unset`, lists, the mode), some
//! of them for a while (`--for`). What is enforced is the base with the live
//! changes on top ([`Layers::effective`]), and beside them CrowdSec's
//! decisions (`run --crowdsec`), kept apart: they are CrowdSec's, not the
//! operator's, so a reload, even `--replace`, leaves them, and they never
//! touch a rule or list of the operator's.
//!
//! Pure: the daemon keeps the layers (`daemon::store` saves them), the
//! handlers edit them, and time comes in as an argument (Unix ms).

use std::collections::BTreeMap;

use crate::model::{
    decisions::Decisions,
    lists::List,
    rules::{Action, Mode, RuleSet, Selector},
};

/// Live changes on top of the base.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Overlay {
    /// The default rule, if set live.
    pub default: Option<Action>,
    /// Layers set live (`Some`) or unset live (`None`: a base rule removed).
    pub rules: BTreeMap<Selector, Option<Action>>,
    /// The mode, if set live (`ratelimit mode`).
    pub mode: Option<Mode>,
    /// Lists loaded live (`Some`) or removed live (`None`: a base list removed).
    pub lists: BTreeMap<String, Option<List>>,
    /// Layers set for a while (`--for`): when each ends, and what comes back.
    pub expiring: BTreeMap<Selector, Expiry>,
    /// Lists loaded for a while (`--for`): when each ends (Unix ms); the list
    /// is removed then (a config file's list of that name comes back).
    pub expiring_lists: BTreeMap<String, u64>,
}

/// When a temporary rule ends, and what it hides until then.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Expiry {
    /// Wall-clock time it ends, Unix ms (kept across restarts and reboots of
    /// the daemon; the daemon's loop removes it within a fraction of a second).
    pub at_ms: u64,
    /// The live change it replaced, which comes back when it ends: `None`
    /// when there was none (the config file's rule, if any, shows again).
    pub under: Option<Option<Action>>,
}

/// A daemon's rules in two layers: the base and the live changes on top.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Layers {
    /// From the config file and the command line.
    pub base: RuleSet,
    /// Made live, kept until unset.
    pub live: Overlay,
    /// CrowdSec's decisions: a deny list per origin, each entry ending by
    /// itself.
    pub decisions: Decisions,
}

impl Layers {
    /// Layers from a base alone.
    pub fn of(base: RuleSet) -> Self {
        Self {
            base,
            live: Overlay::default(),
            decisions: Decisions::default(),
        }
    }

    /// What is enforced: the base with the live changes on top.
    pub fn effective(&self) -> RuleSet {
        let mut set = self.base.clone();
        if let Some(d) = self.live.default {
            set.default = d;
        }
        if let Some(m) = self.live.mode {
            set.mode = m;
        }
        for (p, a) in &self.live.rules {
            match a {
                Some(a) => {
                    set.rules.insert(*p, *a);
                }
                None => {
                    set.rules.remove(p);
                }
            }
        }
        for (name, list) in &self.live.lists {
            match list {
                Some(l) => {
                    set.lists.insert(name.clone(), l.clone());
                }
                None => {
                    set.lists.remove(name);
                }
            }
        }
        for (name, list) in self.decisions.lists() {
            set.lists.insert(name.clone(), list.clone());
        }
        set
    }

    /// Makes `action` the live rule of `p` (`None`: removed), for good or, with
    /// `until` (Unix ms), until then: what it replaces comes back when it ends.
    /// A temporary rule replaced by another keeps what the first one hid.
    pub fn set_live(&mut self, p: Selector, action: Option<Action>, until: Option<u64>) {
        match until {
            Some(at_ms) => {
                let under = match self.live.expiring.get(&p) {
                    Some(e) => e.under,
                    None => self.live.rules.get(&p).copied(),
                };
                self.live.expiring.insert(p, Expiry { at_ms, under });
            }
            None => {
                self.live.expiring.remove(&p);
            }
        }
        self.live.rules.insert(p, action);
    }

    /// Removes the live change of `p` (the config file's rule shows again).
    pub fn clear_live(&mut self, p: &Selector) {
        self.live.expiring.remove(p);
        self.live.rules.remove(p);
    }

    /// Loads or removes a live list, for good or until `until` (Unix ms).
    pub fn set_live_list(&mut self, name: String, list: Option<List>, until: Option<u64>) {
        match until {
            Some(at) => self.live.expiring_lists.insert(name.clone(), at),
            None => self.live.expiring_lists.remove(&name),
        };
        self.live.lists.insert(name, list);
    }

    /// Removes the live list `name`.
    pub fn clear_live_list(&mut self, name: &str) {
        self.live.expiring_lists.remove(name);
        self.live.lists.remove(name);
    }

    /// Ends the temporary rule of `p` now, as its time would: what it hid
    /// comes back. Whether there was one.
    pub fn end_temporary(&mut self, p: &Selector) -> bool {
        let Some(e) = self.live.expiring.remove(p) else {
            return false;
        };
        match e.under {
            Some(a) => self.live.rules.insert(*p, a),
            None => self.live.rules.remove(p),
        };
        true
    }

    /// The rule of `p` that lasts: the one a temporary rule hides (what
    /// comes back when it ends), else the one enforced; `None` for none.
    pub fn lasting(&self, p: &Selector) -> Option<Action> {
        let live = match self.live.expiring.get(p) {
            Some(e) => e.under,
            None => self.live.rules.get(p).copied(),
        };
        match live {
            Some(a) => a,
            None => self.base.rules.get(p).copied(),
        }
    }

    /// Ends what expired by `now_ms`; returns what ended (CIDRs and list
    /// names), empty when nothing did.
    pub fn expire(&mut self, now_ms: u64) -> Vec<String> {
        let mut ended = Vec::new();
        let due: Vec<Selector> = self
            .live
            .expiring
            .iter()
            .filter(|(_, e)| e.at_ms <= now_ms)
            .map(|(p, _)| *p)
            .collect();
        for p in due {
            self.end_temporary(&p);
            ended.push(p.to_string());
        }
        let due: Vec<String> = self
            .live
            .expiring_lists
            .iter()
            .filter(|(_, at)| **at <= now_ms)
            .map(|(n, _)| n.clone())
            .collect();
        for name in due {
            self.clear_live_list(&name);
            ended.push(format!("list {name}"));
        }
        match self.decisions.expire(now_ms) {
            0 => {}
            n => ended.push(format!("{n} CrowdSec decision(s)")),
        }
        ended
    }

    /// Whether something ends by `now_ms`.
    pub fn has_due(&self, now_ms: u64) -> bool {
        self.live.expiring.values().any(|e| e.at_ms <= now_ms)
            || self.live.expiring_lists.values().any(|at| *at <= now_ms)
            || self.decisions.next_end().is_some_and(|at| at <= now_ms)
    }

    /// Moves what ends by `now_ms` to `by_ms` later (ending it failed).
    pub fn postpone_due(&mut self, now_ms: u64, by_ms: u64) {
        for e in self.live.expiring.values_mut() {
            if e.at_ms <= now_ms {
                e.at_ms = now_ms + by_ms;
            }
        }
        for at in self.live.expiring_lists.values_mut() {
            if *at <= now_ms {
                *at = now_ms + by_ms;
            }
        }
        self.decisions.postpone_due(now_ms, by_ms);
    }

    /// When the rule of `p` ends, Unix ms, if it is temporary.
    pub fn expires(&self, p: &Selector) -> Option<u64> {
        self.live.expiring.get(p).map(|e| e.at_ms)
    }

    /// When the list `name` ends, Unix ms, if it is temporary.
    pub fn list_expires(&self, name: &str) -> Option<u64> {
        self.live.expiring_lists.get(name).copied()
    }

    /// The rules held across a fleet, by name (`default`, a selector).
    pub fn fleet_rules(&self) -> Vec<String> {
        let set = self.effective();
        let fleet = |a: &Action| matches!(a, Action::Limit(l) if l.fleet);
        fleet(&set.default)
            .then(|| "default".to_string())
            .into_iter()
            .chain(
                set.rules
                    .iter()
                    .filter(|(_, a)| fleet(a))
                    .map(|(p, _)| p.to_string()),
            )
            .collect()
    }

    /// Removes the rules held across a fleet, as live changes (a config
    /// file's until `reload --replace`); a fleet-wide default rule becomes
    /// the same limit held by this host alone.
    pub fn drop_fleet(&mut self) {
        let set = self.effective();
        if let Action::Limit(l) = set.default
            && l.fleet
        {
            self.live.default = Some(Action::Limit(crate::model::limit::Limit {
                fleet: false,
                ..l
            }));
        }
        for (p, a) in &set.rules {
            if !matches!(a, Action::Limit(l) if l.fleet) {
                continue;
            }
            if self.base.rules.contains_key(p) {
                self.set_live(*p, None, None);
            } else {
                self.clear_live(p);
            }
        }
    }

    /// Where the list `name` comes from: `crowdsec`, `live` or `config`.
    pub fn list_origin(&self, name: &str) -> &'static str {
        if self.decisions.lists().contains_key(name) {
            "crowdsec"
        } else if self.live.lists.contains_key(name) {
            "live"
        } else {
            "config"
        }
    }

    /// Where the rule of `p` comes from: `live` or `config`.
    pub fn origin(&self, p: &Selector) -> &'static str {
        if self.live.rules.contains_key(p) {
            "live"
        } else {
            "config"
        }
    }
}
