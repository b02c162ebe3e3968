//! A pull made into the change it asks of what the daemon holds, off the
//! daemon's loop: the decisions sorted into kept and ignored ([`sort`]),
//! then compared with the decisions the loop holds ([`of`]) so that the
//! loop is sent only what differs, in chunks it applies one at a time
//! between its other work ([`Change::chunks`]).
//!
//! A Local API may send its whole set as new at every pull: a re-sent
//! decision of the same ban and origin as the one held is no change, and
//! its end stays the one first seen, so a feed that sends a fixed time left
//! (or one past `--crowdsec-longest`) cannot keep a ban alive by sending it
//! again. Pure.

use std::collections::{BTreeSet, HashSet};

use super::{
    IgnoredCounts,
    decision::{Filter, Ignored, Kept, RawDecision},
};
use crate::model::decisions::{Decision, Decisions};

/// The most decisions the loop is asked to apply at once: a chunk costs the
/// loop a few milliseconds, and `status`, scrapes and changes are answered
/// between two.
pub const CHUNK: usize = 1_000;

/// A pull's decisions, sorted.
#[derive(Debug, Default)]
pub struct Sorted {
    /// Those applied.
    pub kept: Vec<Kept>,
    /// Those not, by why.
    pub ignored: IgnoredCounts,
    /// Kept ones whose duration was cut to `--crowdsec-longest`.
    pub clipped: u64,
    /// The first decision of each origin ignored as too broad or protected:
    /// why, origin, value (for the log, once per origin).
    pub firsts: Vec<(Ignored, String, String)>,
}

/// Sorts `raw` with `filter`, at `now_ms`.
pub fn sort(filter: &Filter, raw: Vec<RawDecision>, now_ms: u64) -> Sorted {
    let mut out = Sorted::default();
    let mut seen = HashSet::new();
    for r in raw {
        match filter.decide(&r, now_ms) {
            Ok(kept) => {
                out.clipped += u64::from(kept.clipped);
                out.kept.push(kept);
            }
            Err(why) => {
                out.ignored.count(why);
                if matches!(why, Ignored::TooBroad | Ignored::Protected)
                    && seen.insert((why, r.origin.clone()))
                {
                    out.firsts.push((why, r.origin, r.value));
                }
            }
        }
    }
    out
}

/// What the loop is asked to do.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Change {
    /// Decisions to add or replace, in id order.
    pub new: Vec<Decision>,
    /// Ids to let go.
    pub deleted: Vec<u64>,
    /// New decisions not applied: `--crowdsec-max-decisions` are held.
    pub over_cap: usize,
}

impl Change {
    /// Whether nothing changes.
    pub fn is_empty(&self) -> bool {
        self.new.is_empty() && self.deleted.is_empty()
    }

    /// The change in parts of at most [`CHUNK`] decisions: the deletions
    /// first (room for the additions), then the additions.
    pub fn chunks(self) -> Vec<(Vec<Decision>, Vec<u64>)> {
        let mut out: Vec<(Vec<Decision>, Vec<u64>)> = self
            .deleted
            .chunks(CHUNK)
            .map(|d| (Vec::new(), d.to_vec()))
            .collect();
        let mut new = self.new.into_iter().peekable();
        while new.peek().is_some() {
            out.push((new.by_ref().take(CHUNK).collect(), Vec::new()));
        }
        out
    }
}

/// Whether `new` says nothing `held` does not: the same ban of the same
/// origin. Its end is the one first seen: the Local API keeps an id's end
/// and gives the time left, which is read a little later at each pull; one
/// that sends a fixed time left at every pull (or a clipped one) cannot
/// keep a ban alive past its first end.
fn unchanged(held: &Decision, new: &Kept) -> bool {
    held.prefix == new.decision.prefix && held.origin == new.decision.origin
}

/// The change that makes `held` follow a pull: `kept`, and either the ids
/// the stream deleted (`Some`) or, for a resync (`None`), every held id the
/// pull did not keep. At most `max` decisions are held after it: past that
/// the newest new decisions are left out and counted.
pub fn of(held: &Decisions, kept: Vec<Kept>, deleted: Option<Vec<u64>>, max: usize) -> Change {
    let sent: BTreeSet<u64> = kept.iter().map(|k| k.decision.id).collect();
    let mut out = Change::default();
    let mut fresh = Vec::new();
    for k in kept {
        match held.get(k.decision.id) {
            Some(h) if unchanged(h, &k) => {}
            Some(_) => out.new.push(k.decision),
            None => fresh.push(k.decision),
        }
    }
    out.deleted = match deleted {
        Some(ids) => {
            let ids: BTreeSet<u64> = ids
                .into_iter()
                .filter(|id| held.get(*id).is_some() && !sent.contains(id))
                .collect();
            ids.into_iter().collect()
        }
        None => held
            .iter()
            .map(|d| d.id)
            .filter(|id| !sent.contains(id))
            .collect(),
    };
    // A decision sent twice in one pull: the last one.
    fresh.reverse();
    fresh.sort_by_key(|d| d.id);
    fresh.dedup_by_key(|d| d.id);
    let room = max.saturating_sub(held.len() - out.deleted.len());
    if fresh.len() > room {
        out.over_cap = fresh.len() - room;
        fresh.truncate(room);
    }
    out.new.extend(fresh);
    out.new.sort_by_key(|d| d.id);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::prefix::Prefix;

    fn kept(id: u64, cidr: &str, now: u64, left: u64, clipped: bool) -> Kept {
        Kept {
            decision: Decision::new(id, Prefix::parse("t", cidr).unwrap(), "feed", now, left),
            clipped,
        }
    }

    fn held(all: &[Kept]) -> Decisions {
        Decisions::of(all.iter().map(|k| k.decision.clone()))
    }

    #[test]
    fn a_resent_set_is_no_change() {
        let first: Vec<Kept> = (1..=100)
            .map(|i| kept(i, &format!("198.18.0.{i}"), 0, 3_600_000, false))
            .collect();
        let h = held(&first);
        // A pull later, the time left read a little later.
        let again: Vec<Kept> = (1..=100)
            .map(|i| kept(i, &format!("198.18.0.{i}"), 1_400, 3_598_700, false))
            .collect();
        assert!(of(&h, again.clone(), Some(vec![]), 1_000).is_empty());
        assert!(of(&h, again, None, 1_000).is_empty(), "as a resync too");
    }

    #[test]
    fn what_differs_is_sent_and_a_resync_ends_what_was_not_resent() {
        let h = held(&[
            kept(1, "198.18.0.1", 0, 3_600_000, false),
            kept(2, "198.18.0.2", 0, 3_600_000, false),
            kept(3, "198.18.0.3", 0, 3_600_000, false),
        ]);
        let pull = vec![
            // Another ban under the same id: replaced.
            kept(1, "198.18.0.11", 0, 3_600_000, false),
            kept(2, "198.18.0.2", 0, 3_600_000, false),
            kept(4, "198.18.0.4", 0, 3_600_000, false),
        ];
        let c = of(&h, pull.clone(), None, 1_000);
        assert_eq!(c.new.iter().map(|d| d.id).collect::<Vec<_>>(), [1, 4]);
        assert_eq!(c.deleted, [3]);
        // A delta deletes only what it names, and only what is held.
        let c = of(&h, pull, Some(vec![2, 9]), 1_000);
        assert_eq!(c.new.iter().map(|d| d.id).collect::<Vec<_>>(), [1, 4]);
        assert_eq!(
            c.deleted,
            Vec::<u64>::new(),
            "2 is re-sent in the same pull"
        );
    }

    #[test]
    fn a_ban_sent_again_with_the_same_time_left_never_lasts_longer() {
        let h = held(&[kept(1, "198.18.0.1", 0, 1_000_000, true)]);
        let later = kept(1, "198.18.0.1", 60_000, 1_000_000, true);
        assert!(of(&h, vec![later], Some(vec![]), 10).is_empty());
        let later = kept(1, "198.18.0.1", 60_000, 1_000_000, false);
        assert!(of(&h, vec![later], None, 10).is_empty());
    }

    #[test]
    fn past_the_cap_the_newest_new_decisions_are_left_out() {
        let h = held(&[
            kept(1, "198.18.0.1", 0, 3_600_000, false),
            kept(2, "198.18.0.2", 0, 3_600_000, false),
        ]);
        let pull: Vec<Kept> = [5, 3, 4]
            .iter()
            .map(|i| kept(*i, &format!("198.18.0.{i}"), 0, 3_600_000, false))
            .collect();
        let c = of(&h, pull, Some(vec![1]), 3);
        assert_eq!(c.deleted, [1]);
        assert_eq!(c.new.iter().map(|d| d.id).collect::<Vec<_>>(), [3, 4]);
        assert_eq!(c.over_cap, 1);
    }

    #[test]
    fn chunks_delete_first_and_hold_at_most_a_chunk() {
        let c = Change {
            new: (0..(CHUNK as u64 + 1))
                .map(|i| kept(i, "198.18.0.1", 0, 1_000, false).decision)
                .collect(),
            deleted: vec![7, 8],
            over_cap: 0,
        };
        let parts = c.chunks();
        assert_eq!(parts.len(), 3);
        assert_eq!(parts[0], (vec![], vec![7, 8]));
        assert_eq!(parts[1].0.len(), CHUNK);
        assert_eq!(parts[2].0.len(), 1);
    }
}
