//! What the daemon's loop does besides requests, on its timers and for its
//! helpers: counter samples for `stats`' rates, the idle sweep, following the
//! interface and the pins, metrics snapshots, and the fleet sync's reads and
//! raises. Each runs on the loop (the one writer of the maps).

use std::time::{Duration, Instant};

use ratelimit_common::gcra;
use tracing::{error, info, warn};

use super::{Daemon, RATE_WINDOW, SAMPLES_KEPT, Sample, TRACKED_MAX_AGE, metrics};
use crate::{
    error::chain,
    kernel::{InterfaceState, monotonic_ns},
    model::rules::Action,
};

impl Daemon {
    /// Brings the rule trie the program does not read up to date with a
    /// list change.
    /// Checks the maps against what this daemon wrote and puts back what
    /// differs (the record wins: it holds only acknowledged changes);
    /// counted and logged.
    pub(super) fn check_drift(&mut self) {
        match self.enforcer.maps.check(super::DRIFT_WINDOW) {
            Ok(d) if d.any() => {
                let n = d.entries as u64 + u64::from(d.config);
                self.drift_repaired += n;
                warn!(
                    entries = d.entries,
                    config = d.config,
                    repaired = self.drift_repaired,
                    "the pinned maps differed from what this daemon wrote (edited by hand, or by a cleanup script): put back as the record holds them"
                );
            }
            Ok(_) => {}
            Err(e) => {
                warn!(error = %chain(&e), "checking the pinned maps against the record failed; tried again at the next check")
            }
        }
    }

    pub(super) fn settle(&mut self) {
        if let Err(e) = self.enforcer.maps.settle() {
            warn!(error = %chain(&e), "bringing the idle rule trie up to date failed; the next change does it");
        }
    }

    /// The sample rates are computed from (to now): the newest at least
    /// [`RATE_WINDOW`] old, else the oldest (a daemon started less than a
    /// second ago); `None` when there is none older than a tenth of a second.
    pub(super) fn rate_window(&self) -> Option<&Sample> {
        self.samples
            .iter()
            .rev()
            .find(|s| s.at.elapsed() >= RATE_WINDOW)
            .or_else(|| self.samples.front())
            .filter(|s| s.at.elapsed() >= Duration::from_millis(100))
    }

    pub(super) fn sample(&mut self) {
        match self.enforcer.maps.counters() {
            Ok(counters) => {
                let now = Sample {
                    at: Instant::now(),
                    counters,
                };
                if self.samples.len() == SAMPLES_KEPT {
                    self.samples.pop_front();
                }
                self.samples.push_back(now);
            }
            Err(e) => warn!(error = %chain(&e), "reading counters failed"),
        }
    }

    /// Deletes states idle for longer than any bucket takes to refill: they read
    /// as full buckets anyway, and deleting them keeps the tick wrap harmless.
    pub(super) fn sweep(&mut self) {
        let now = monotonic_ns();
        let limit_ns = gcra::TAU_MAX >> ratelimit_common::TICK_SHIFT;
        let idle: Vec<_> = self
            .enforcer
            .maps
            .held_states()
            .filter(|h| gcra::idle_for_ns(&h.state.gcra, now).is_some_and(|idle| idle > limit_ns))
            .collect();
        for held in &idle {
            if self.enforcer.maps.free_idle(held) {
                self.baseline.swept += 1;
            }
        }
        if !idle.is_empty() {
            info!(removed = idle.len(), "idle sweep");
        }
    }

    /// Follows the interface: when it is deleted, nothing is enforced (said
    /// once, and in `status`); when one of that name comes back, the program is
    /// attached to it again with its rules and buckets.
    pub(super) fn watch(&mut self) {
        match self.enforcer.check_pins() {
            Ok(false) => self.pins_failing = false,
            Ok(true) => {
                self.pins_failing = false;
                warn!(iface = %self.id, pins = %self.enforcer.pin_dir().display(), "the pins were removed under the daemon: pinned again from its own handles (a restart adopts them, --keep-attached keeps them)");
            }
            Err(e) => {
                if !self.pins_failing {
                    error!(iface = %self.id, error = %chain(&e), "the pins were removed under the daemon and pinning them again failed (tried every second): a restart will not adopt this program, and an exit detaches it");
                }
                self.pins_failing = true;
            }
        }
        let now = self.enforcer.check_interface();
        match (self.interface, now) {
            (_, InterfaceState::Recreated) => match self.enforcer.reattach() {
                Ok(()) => {
                    warn!(iface = %self.id, mode = %self.enforcer.mode(), "the interface was re-created: attached to it again, rules and buckets kept");
                    self.interface = InterfaceState::Attached;
                }
                Err(e) => {
                    if self.interface != InterfaceState::Recreated {
                        error!(iface = %self.id, error = %chain(&e), "the interface was re-created but attaching to it failed; nothing is enforced on it");
                    }
                    self.interface = InterfaceState::Recreated;
                }
            },
            (InterfaceState::Attached, InterfaceState::Gone) => {
                error!(iface = %self.id, "the interface is gone: nothing is enforced until it comes back");
                self.interface = InterfaceState::Gone;
            }
            (_, state) => self.interface = state,
        }
    }

    pub(super) fn metrics(&mut self) -> metrics::Snapshot {
        if self
            .tracked
            .is_none_or(|(at, _)| at.elapsed() > TRACKED_MAX_AGE)
        {
            let (gcra_keys, wide_keys) = self.enforcer.maps.tracked().unwrap_or_default();
            self.tracked = Some((Instant::now(), gcra_keys + wide_keys));
        }
        metrics::Snapshot {
            iface: self.enforcer.iface().to_string(),
            mode: self.enforcer.mode(),
            attached: self.interface == InterfaceState::Attached,
            counters: self.enforcer.maps.counters().unwrap_or_default(),
            events: self.enforcer.maps.events().unwrap_or_default(),
            tracked: self.tracked.map_or(0, |(_, n)| n),
            rules: self.rules.effective().rules.len(),
            rule_counters: self.rule_counters(),
            list_counters: self.list_counters(),
            fleet: self.fleet.as_ref().map(|s| s.borrow().clone()),
            fleet_sync: self.fleet_metrics.as_ref().map(|m| m.sync.clone()),
            crowdsec: self.crowdsec_status(),
            drop_log: self.enforcer.maps.drop_log_counts().unwrap_or_default(),
            drift_repaired: self.drift_repaired,
        }
    }

    /// Each rule's counters, the default rule's first (a rule whose counters
    /// cannot be read is left out).
    fn rule_counters(
        &self,
    ) -> Vec<(
        String,
        [ratelimit_common::Counter; ratelimit_common::RuleCounter::ALL.len()],
    )> {
        let maps = &self.enforcer.maps;
        let mut out: Vec<_> = maps
            .rule_counters(0)
            .map(|c| ("default".to_string(), c))
            .into_iter()
            .collect();
        for (p, rule) in maps.rules().unwrap_or_default() {
            if let Ok(c) = maps.rule_counters(rule.slot) {
                out.push((p.to_string(), c));
            }
        }
        out
    }

    /// Each list's frames, with its action (a list whose counters cannot be
    /// read is left out).
    fn list_counters(
        &self,
    ) -> Vec<(
        String,
        crate::model::lists::ListAction,
        ratelimit_common::Counter,
    )> {
        let set = self.rules.effective();
        let counted = self.enforcer.maps.list_counters().unwrap_or_default();
        counted
            .into_iter()
            .filter_map(|(name, c)| {
                let action = set.lists.get(&name)?.action;
                Some((name, action, c))
            })
            .collect()
    }

    /// Answers the fleet sync task: reads what keys were admitted; raises
    /// buckets and writes report cursors; writes its heartbeat.
    pub(super) fn fleet_job(&mut self, job: crate::fleet::Job) {
        use crate::fleet::{FleetRule, Job, Snapshot};
        match job {
            Job::Beat { at, members } => {
                let beat = ratelimit_common::FleetBeat {
                    at,
                    members: members.min(u64::from(ratelimit_common::FLEET_MEMBERS_MAX)) as u32,
                    _pad: 0,
                };
                match self.enforcer.maps.write_fleet_beat(beat) {
                    Ok(()) => self.beat_failing = false,
                    Err(e) => {
                        // The program then charges fleet-wide keys as if the
                        // daemon were dead: errs toward limiting.
                        if !self.beat_failing {
                            error!(error = %chain(&e), "writing the fleet heartbeat failed: the program charges fleet-wide keys as if no daemon synced them");
                        }
                        self.beat_failing = true;
                    }
                }
            }
            Job::Read { cursors, reply } => {
                let set = self.rules.effective();
                let mut rules = std::collections::HashMap::new();
                let mut add =
                    |name: String, rule: &ratelimit_common::Rule, action: Option<&Action>| {
                        if let Some(r) = FleetRule::of(name, rule, action) {
                            rules.insert(rule.id, r);
                        }
                    };
                if let Ok(d) = self.enforcer.maps.default_rule() {
                    add("default".into(), &d, Some(&set.default));
                }
                if let Ok(kernel) = self.enforcer.maps.rules() {
                    for (prefix, rule) in &kernel {
                        add(prefix.to_string(), rule, set.rules.get(prefix));
                    }
                }
                let used = self.enforcer.maps.fleet_used();
                let cursors = cursors.then(|| self.enforcer.maps.fleet_cursors());
                let _ = reply.send(Snapshot {
                    rules,
                    used,
                    cursors,
                    at: monotonic_ns(),
                });
            }
            Job::Write { raises, cursors } => {
                let now = monotonic_ns();
                for r in raises {
                    let debt = r.debt_ns.saturating_sub(now.saturating_sub(r.at_ns));
                    self.enforcer.maps.raise(&r.key, &r.params, debt);
                }
                let failed = self.enforcer.maps.write_fleet_cursors(&cursors);
                if failed > 0 {
                    warn!(
                        failed,
                        "fleet: report cursors could not be written; a restart would report those keys' last sync again (at most a bucket each)"
                    );
                }
            }
        }
    }
}
