//! The daemon's side of the CrowdSec bouncer (`crate::crowdsec`): its
//! updates laid into the rules' decisions and applied whole, like any
//! change (saved for a restart, or refused with nothing changed), and its
//! view with each origin's decisions and drops for `status`, `stats` and the
//! metrics.

use tracing::info;

use super::Daemon;
use crate::{
    crowdsec::{Job, OriginStatus, Status, Update},
    error::chain,
    model::decisions::Applied,
};

impl Daemon {
    /// Applies the bouncer's update; answers what it did, or why not.
    pub(super) fn crowdsec_job(&mut self, job: Job) {
        let mut next = self.rules.clone();
        let mut applied = match job.update {
            Update::Resync(all) => next.decisions.resync(all),
            Update::Delta { new, deleted } => next.decisions.apply(new, deleted),
        };
        applied.over_cap = next.decisions.trim(job.max);
        let result = if applied == Applied::default() {
            Ok(applied)
        } else {
            match self.apply(next) {
                Ok(()) => {
                    info!(
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
        let _ = job.reply.send(result);
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
