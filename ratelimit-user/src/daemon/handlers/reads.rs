//! The reads the loop answers: `list`, `status`, `stats`, a reading of the
//! drop counters (`top` takes two), and the fleet-wide rules (`top --fleet`
//! asks Redis with them). Built by [`crate::daemon::read`], as the read-only
//! path builds them from the pins.

use crate::{
    daemon::{
        Daemon, Sample, droplog,
        read::{self, DaemonFacts, Teller},
    },
    error::{Error, Result},
    model::rules::{Action, Limit},
    protocol::answer::{DropLog, Drops, FleetRules, Rules, Stats, Status},
};

impl Daemon {
    /// The rules; with their counters (`list --stats`).
    pub(super) fn list(&self, counters: bool) -> Result<Rules> {
        read::list_of(&self.rules, counters.then_some(&self.enforcer.maps))
    }

    /// What runs and how.
    pub(super) fn status(&self) -> Result<Status> {
        let e = &self.enforcer;
        let facts = DaemonFacts {
            mode: e.mode(),
            adopted: e.adopted,
            took_over_link: e.took_over_link,
            uptime: self.started.elapsed(),
            keep_attached: self.opts.keep_attached,
            fleet: self.fleet.as_ref().map(|s| s.borrow().clone()),
            interface: self.interface,
            baseline: self.baseline,
            drift_repaired: self.drift_repaired,
        };
        let mut status = read::status_of(
            &e.maps,
            &self.rules.effective(),
            &self.id,
            e.pin_dir().display().to_string(),
            Teller::Daemon(Box::new(facts)),
        )?;
        if let Some(running) = &mut status.daemon {
            running.crowdsec = self.crowdsec_status();
        }
        Ok(status)
    }

    /// Totals read now; per-second rates over the last second or so, up to
    /// now (see [`Daemon::rate_window`]).
    pub(super) fn stats(&self) -> Result<Stats> {
        let now = Sample {
            at: std::time::Instant::now(),
            counters: self.enforcer.maps.counters()?,
        };
        let base = self.rate_window();
        let mut stats = read::stats_of(&self.enforcer.maps, self.enforcer.iface(), |r| {
            let prev = base?;
            let dt = now.at.duration_since(prev.at).as_secs_f64().max(1e-3);
            let (a, b) = (now.counters[r as usize], prev.counters[r as usize]);
            Some((
                a.packets.saturating_sub(b.packets) as f64 / dt,
                a.bytes.saturating_sub(b.bytes) as f64 / dt,
            ))
        })?;
        if let Some(c) = self.crowdsec_status() {
            stats.crowdsec = c.origins;
        }
        Ok(stats)
    }

    /// The drop log: up to `n` entries from sequence number `after` on (the
    /// last `n` without it), each rule named as the rules stand now (a rule
    /// removed since is said to be).
    pub(super) fn drop_log(&mut self, after: Option<u64>, n: usize) -> Result<DropLog> {
        let found = self
            .drop_log
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .after(after, n);
        let names = if found.entries.is_empty() {
            Default::default()
        } else {
            self.enforcer.maps.rule_names()?
        };
        let counts = self.enforcer.maps.drop_log_counts()?;
        Ok(DropLog {
            iface: self.enforcer.iface().to_string(),
            drop_log: self.rules.effective().drop_log.to_string(),
            entries: found
                .entries
                .iter()
                .map(|l| droplog::entry_of(l, &names))
                .collect(),
            next: found.next,
            missed: found.missed,
            written: counts.written,
            skipped: counts.skipped,
            lost: counts.lost,
        })
    }

    /// Drop counts by source now (`top` reads this twice).
    pub(super) fn drops(&self) -> Result<Drops> {
        read::drops_of(&self.enforcer.maps, self.enforcer.iface())
    }

    /// The fleet's Redis and the names of the fleet-wide rules.
    pub(super) fn fleet_rules(&self) -> Result<FleetRules> {
        let Some(url) = &self.opts.fleet else {
            return Err(Error::Refused(
                "this daemon was not started with --fleet REDIS_URL: it has no fleet".into(),
            ));
        };
        let set = self.rules.effective();
        let mut rules = Vec::new();
        if matches!(set.default, Action::Limit(Limit { fleet: true, .. })) {
            rules.push("default".to_string());
        }
        for (p, a) in &set.rules {
            if matches!(a, Action::Limit(Limit { fleet: true, .. })) {
                rules.push(p.to_string());
            }
        }
        Ok(FleetRules {
            redis: url.clone(),
            rules,
        })
    }
}
