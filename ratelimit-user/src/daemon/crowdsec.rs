//! The daemon's side of the CrowdSec bouncer (`crate::crowdsec`): its
//! updates laid into the rules' decisions and applied whole, like any
//! change (saved for a restart, or refused with nothing changed), and its
//! view with each origin's decisions and drops for `status`, `stats` and the
//! metrics.

use tracing::debug;

use super::Daemon;
use crate::{
    crowdsec::{Job, OriginStatus, Status},
    error::chain,
};

impl Daemon {
    /// Applies a part of the bouncer's change; answers what it did, or why
    /// not. Costs what it changes: the decisions held are shared with the
    /// copy it changes.
    pub(super) fn crowdsec_job(&mut self, job: Job) {
        let mut next = self.rules.clone();
        let mut applied = next.decisions.apply(job.new, job.deleted);
        // Held past the cap only when the cap was lowered by a restart.
        applied.over_cap = next.decisions.trim(job.max);
        let result = if next.decisions.same(&self.rules.decisions) {
            Ok(applied)
        } else {
            match self.apply(next) {
                Ok(()) => {
                    debug!(
                        added = applied.added,
                        removed = applied.removed,
                        held = self.rules.decisions.len(),
                        "crowdsec: decisions applied"
                    );
                    Ok(applied)
                }
                Err(e) => Err(chain(&e)),
            }
        };
        self.publish_decisions();
        let _ = job.reply.send(result);
    }

    /// Shows the bouncer the decisions held, when they changed.
    pub(super) fn publish_decisions(&self) {
        if let Some(held) = &self.crowdsec_held {
            held.send_if_modified(|d| {
                if d.same(&self.rules.decisions) {
                    return false;
                }
                *d = self.rules.decisions.clone();
                true
            });
        }
    }

    /// The bouncer's view, with each origin's entries and drops; `None`
    /// without `--crowdsec`.
    pub(super) fn crowdsec_status(&self) -> Option<Status> {
        let mut st = self.crowdsec.as_ref()?.borrow().clone();
        st.decisions = self.rules.decisions.len();
        let counted = self.enforcer.maps.list_counters().unwrap_or_default();
        st.origins = self
            .rules
            .decisions
            .lists()
            .iter()
            .map(|(name, list)| {
                let dropped = counted.get(name).copied().unwrap_or_default();
                OriginStatus {
                    origin: self.rules.decisions.origin_of(name),
                    list: name.clone(),
                    entries: list.entries.len(),
                    dropped_packets: dropped.packets,
                    dropped_bytes: dropped.bytes,
                }
            })
            .collect();
        Some(st)
    }
}
