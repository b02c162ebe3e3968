//! The sync's books, pure: for each key, what was accounted for (its report
//! cursor, which the pins keep), what this daemon owes the fleet, and the
//! fleet's debt as last known. From a snapshot of the counts, what to report
//! ([`Book::plan`]); from Redis's answers, or their absence, what to raise
//! ([`Book::answered`], [`Book::failed`]), and once a sync, what cursors to
//! write back ([`Book::take_writes`]).
//! No I/O and no clock: every time is given (CLOCK_MONOTONIC, ns), so the
//! tests drive it by hand.
//!
//! # What is reported, once
//! A key's cursor is what of the program's cumulative count has been
//! reported (pinned, so that it outlives the daemon). Each sync, what the
//! key admitted since the last sync (`delta`) is reported to its bucket in
//! Redis; when Redis cannot be asked, it is *owed* instead: kept as a
//! bucket of its own (`owed_until`, the time that bucket would be full
//! again, refilled at the key's rate: what those admissions still weigh),
//! and added, as the units that bucket still holds, to the next report
//! Redis answers. That report also tallies every unit past the cursor, and
//! the cursor moves past them. Units whose admission time is not known
//! (those a restarted daemon finds past the last daemon's cursor) are owed
//! the same way, at most a whole bucket: a daemon's own bucket never admits
//! more than that at once, so older ones are refilled already. A restart
//! thus never reports a key's history into its bucket again (the shut-out a
//! report of the whole history caused), nor forgets what the last bucket's
//! time admitted (a fresh burst).
//!
//! # Silent members
//! While `s` of the fleet's `N` members are silent (their leases run but
//! they do not renew: cut off from Redis, or dead with their programs left
//! attached), each report is weighted `N / (N − s)`: the members in step
//! leave the silent ones their share of each key, which they take under the
//! fallback (or their programs do, charging `N` times): the fleet stays at
//! its limit while their leases last.

use std::{
    collections::{BTreeMap, HashMap},
    time::Duration,
};

use ratelimit_common::{FleetCursor, FleetUsed, FlowKey, TICKS_PER_NS, gcra};
use ratelimit_redis::{Limit, fleet::group_of};

use super::{FOLLOW, Fallback, FleetRule, Raise, SLOW, Snapshot, key_name};

/// How often a key's use is tallied in Redis for `top --fleet` (its reports
/// go every sync; the tally, a write of its own, need not).
pub(super) const TALLY_EVERY: Duration = Duration::from_secs(1);

/// How often a key's report cursor is written to its map (at most): a
/// restart then finds at most this much of a key's units past the cursor,
/// which it charges as owed, at most a bucket, as it does what was admitted
/// while no daemon synced.
pub(super) const CURSOR_EVERY: Duration = Duration::from_secs(1);

/// How the fleet is seen now: its members, and the policy without Redis.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct View {
    /// Members counted (this daemon included), at least 1.
    pub members: u64,
    /// Of those, silent ones (never this daemon).
    pub silent: u64,
    /// What keys do while Redis cannot be asked.
    pub fallback: Fallback,
}

impl View {
    /// `units` weighted for the silent members: `units × N / (N − s)`,
    /// rounded up.
    pub(super) fn weighted(&self, units: u64) -> u64 {
        let live = self.members.saturating_sub(self.silent);
        if self.silent == 0 || live == 0 {
            return units;
        }
        let w = (u128::from(units) * u128::from(self.members)).div_ceil(u128::from(live));
        w.min(u128::from(u64::MAX)) as u64
    }

    /// How many times the fallback charges what this daemon admits.
    fn times(&self) -> u64 {
        match self.fallback {
            Fallback::Share => self.members.max(1),
            Fallback::Local => 1,
        }
    }
}

/// One key's report in a sync.
#[derive(Clone, Debug)]
pub(super) struct Item {
    /// The key.
    pub key: FlowKey,
    /// Its rule's limit, in Redis's terms.
    pub limit: Limit,
    /// Its rule's parameters in the kernel.
    pub params: gcra::Params,
    /// Its name across the fleet (the sync hands it to the call).
    pub name: String,
    /// Units admitted since the last sync.
    pub delta: u64,
    /// Units owed from before (what admissions Redis was not told of still
    /// weigh).
    pub owed: u64,
    /// What to add to the fleet's debt: `delta + owed`, weighted for the
    /// silent members.
    pub amount: u64,
    /// Units past the cursor (never reported): accounted for when Redis
    /// answers.
    pub accounted: u64,
    /// Units to tally now (for `top --fleet`): what was accounted for since
    /// the key's last tally, about once a [`TALLY_EVERY`]; 0 otherwise.
    pub tally: u64,
    /// The counts read: the cursor once Redis answers.
    used: FleetUsed,
    /// Charged as under the fallback already (its answer was late).
    late: bool,
}

/// What to raise in the kernel and what cursors to write, after a sync (or
/// part of it).
#[derive(Debug, Default)]
pub(super) struct Settled {
    /// Buckets to raise.
    pub raises: Vec<Raise>,
    /// Cursors to write (`Some`) or remove (`None`).
    pub cursors: Vec<(FlowKey, Option<FleetCursor>)>,
    /// Units reported (really admitted, tallied: not weighted).
    pub reported: u64,
    /// Of the units charged, those owed from before (late reports).
    pub owed: u64,
    /// Keys whose answer came later than [`SLOW`].
    pub slow: u64,
}

impl Settled {
    /// Adds `other`.
    pub(super) fn merge(&mut self, other: Settled) {
        self.raises.extend(other.raises);
        self.cursors.extend(other.cursors);
        self.reported += other.reported;
        self.owed += other.owed;
        self.slow += other.slow;
    }

    /// Nothing to write.
    pub(super) fn is_empty(&self) -> bool {
        self.raises.is_empty() && self.cursors.is_empty()
    }
}

struct Key {
    /// Its name across the fleet, and the rule name it was made with.
    name: Option<(String, String)>,
    /// What was reported (pinned).
    cursor: FleetCursor,
    /// Units reported and not tallied yet, and when the key was last
    /// tallied.
    untallied: u64,
    tallied_at: u64,
    /// The counts the last sync read.
    seen: FleetUsed,
    /// The cursor changed since it was last written.
    dirty: bool,
    /// When it was last written.
    written_at: Option<u64>,
    /// In the book's `touched`.
    queued: bool,
    /// When it last admitted something here.
    active: Option<u64>,
    /// The fleet's debt as last known (from Redis, or kept here under the
    /// fallback), ns, as of `debt_at`.
    debt_ns: u64,
    debt_at: u64,
    /// When the last report Redis answered was sent.
    fresh_at: Option<u64>,
    /// When the key was first seen here.
    since: u64,
    /// In this sync's reports.
    wanted: bool,
    /// Judged by the fallback (or charged as under it) at its last sync.
    fallback: bool,
}

impl Key {
    fn new(cursor: FleetCursor, now: u64) -> Self {
        Self {
            name: None,
            cursor,
            written_at: None,
            queued: false,
            untallied: 0,
            tallied_at: 0,
            seen: FleetUsed {
                packets: cursor.packets,
                bytes: cursor.bytes,
                born: cursor.born,
            },
            dirty: false,
            active: None,
            debt_ns: 0,
            debt_at: now,
            fresh_at: None,
            since: now,
            wanted: false,
            fallback: false,
        }
    }

    /// The fleet's debt left at `now`.
    fn debt_left(&self, now: u64) -> u64 {
        self.debt_ns
            .saturating_sub(now.saturating_sub(self.debt_at))
    }

    /// Owes `units` more, admitted about now: the owed bucket fills by them,
    /// at most to a whole bucket.
    fn owe(&mut self, params: &gcra::Params, units: u64, now: u64) {
        if units == 0 {
            return;
        }
        let from = self.cursor.owed_until.max(now);
        let until = from
            .saturating_add(gcra::units_ns(params, units))
            .min(now.saturating_add(tau_ns(params)));
        self.cursor.owed_until = until;
        self.dirty = true;
    }

    /// The units the owed bucket still holds at `now` (rounded up); clears
    /// it once refilled.
    fn owed(&mut self, params: &gcra::Params, now: u64) -> u64 {
        if self.cursor.owed_until == 0 {
            return 0;
        }
        let left = self.cursor.owed_until.saturating_sub(now);
        if left == 0 {
            self.cursor.owed_until = 0;
            self.dirty = true;
            return 0;
        }
        units_in(params, left)
    }

    /// The cursor moves to `used`.
    fn advance(&mut self, used: &FleetUsed) {
        if self.cursor.packets != used.packets || self.cursor.bytes != used.bytes {
            self.cursor.packets = used.packets;
            self.cursor.bytes = used.bytes;
            self.dirty = true;
        }
    }
}

/// Queues `key` for [`Book::take_writes`] if its cursor changed and it is
/// not queued yet.
fn touch(touched: &mut Vec<FlowKey>, key: FlowKey, k: &mut Key) {
    if k.dirty && !k.queued {
        k.queued = true;
        touched.push(key);
    }
}

/// A whole bucket of `params`, ns.
fn tau_ns(params: &gcra::Params) -> u64 {
    gcra::units_ns(params, params.capacity)
}

/// The units `ns` of refill are worth under `params`, rounded up.
fn units_in(params: &gcra::Params, ns: u64) -> u64 {
    if params.interval == 0 {
        return 0;
    }
    let ticks = u128::from(ns) * u128::from(TICKS_PER_NS);
    ticks
        .div_ceil(u128::from(params.interval))
        .min(u128::from(u64::MAX)) as u64
}

/// The sync's books.
#[derive(Default)]
pub(super) struct Book {
    keys: HashMap<FlowKey, Key>,
    /// The pins' cursors were taken (the first snapshot).
    adopted: bool,
    /// Cursors to remove: keys the program no longer counts.
    gone: Vec<FlowKey>,
    /// Keys whose cursor may have changed since the last writes (a key's
    /// `dirty` says whether it did): so that writing them back costs what
    /// changed, not every key each time a group answers.
    touched: Vec<FlowKey>,
}

/// What a sync reports, by group.
pub(super) type Plan = BTreeMap<u32, Vec<Item>>;

/// The keys as [`Book::counts`] sees them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) struct Counts {
    /// Keys followed (admitted something here in the last [`FOLLOW`]).
    pub keys: u64,
    /// Of those, keys whose fleet bucket is empty.
    pub over: u64,
    /// Of those, keys judged by the fallback at their last sync.
    pub fallback: u64,
    /// The age of the oldest debt from Redis of a key reported in the last
    /// sync, ns (0 with none).
    pub lag_ns: u64,
}

impl Book {
    /// What to report of `snap` at `now`: each counted key's units since its
    /// cursor and what it owes, for the keys followed. The first snapshot
    /// carries the cursors the pins held: what past them the program counted
    /// was admitted while no daemon synced, at times not known, and is owed.
    pub(super) fn plan(&mut self, snap: &Snapshot, now: u64, view: &View) -> Plan {
        let adopting = !self.adopted;
        if let Some(cursors) = &snap.cursors {
            for (key, c) in cursors {
                self.keys.insert(*key, Key::new(*c, now));
            }
            self.adopted = true;
        }
        // Keys the program no longer counts (evicted, or their rule gone):
        // forgotten, cursors too.
        let counted: std::collections::HashSet<&FlowKey> =
            snap.used.iter().map(|(k, _)| k).collect();
        let gone = &mut self.gone;
        self.keys.retain(|k, _| {
            let keep = counted.contains(k);
            if !keep {
                gone.push(*k);
            }
            keep
        });
        let mut plan = Plan::new();
        for (fk, used) in &snap.used {
            let Some(rule) = snap.rules.get(&fk.rule_id) else {
                continue;
            };
            let k = self.keys.entry(*fk).or_insert_with(|| {
                Key::new(
                    FleetCursor {
                        born: used.born,
                        ..FleetCursor::default()
                    },
                    now,
                )
            });
            k.wanted = false;
            if k.cursor.born != used.born {
                // The entry was created again: it counts from zero.
                k.cursor = FleetCursor {
                    born: used.born,
                    owed_until: k.cursor.owed_until,
                    ..FleetCursor::default()
                };
                k.dirty = true;
            }
            if k.seen.born != used.born {
                k.seen = FleetUsed {
                    born: used.born,
                    ..FleetUsed::default()
                };
            }
            let units = |u: &FleetUsed| if rule.bytes { u.bytes } else { u.packets };
            let mut delta = units(used).saturating_sub(units(&k.seen));
            let reported = if rule.bytes {
                k.cursor.bytes
            } else {
                k.cursor.packets
            };
            let accounted = units(used).saturating_sub(reported);
            if delta > 0 {
                k.active = Some(now);
            }
            if adopting {
                // Admitted while no daemon synced: owed, at most a bucket.
                k.owe(&rule.params, accounted, now);
                delta = 0;
            }
            k.seen = *used;
            let owed = k.owed(&rule.params, now);
            touch(&mut self.touched, *fk, k);
            let followed = k
                .active
                .is_some_and(|a| now.saturating_sub(a) <= FOLLOW.as_nanos() as u64);
            let tally_due = now.saturating_sub(k.tallied_at) >= TALLY_EVERY.as_nanos() as u64;
            let tally = if tally_due {
                k.untallied + accounted
            } else {
                0
            };
            if !(delta > 0
                || owed > 0
                || accounted > 0
                || tally > 0
                || (followed && k.debt_left(now) > 0))
            {
                continue;
            }
            k.wanted = true;
            let name = match &k.name {
                Some((of, name)) if *of == rule.name => name.clone(),
                _ => {
                    let name = key_name(rule, fk);
                    k.name = Some((rule.name.clone(), name.clone()));
                    name
                }
            };
            plan.entry(group_of(&name)).or_default().push(Item {
                key: *fk,
                limit: rule.limit,
                params: rule.params,
                name,
                delta,
                owed,
                amount: view.weighted(delta + owed),
                accounted,
                tally,
                used: *used,
                late: false,
            });
        }
        plan
    }

    /// Redis answered `items` (one group's), sent at `sent` and answered at
    /// `answered`, with each key's debt (`None`: not a bucket, judged by the
    /// fallback).
    pub(super) fn answered(
        &mut self,
        items: Vec<Item>,
        debts: &[Option<Duration>],
        sent: u64,
        answered: u64,
        view: &View,
    ) -> Settled {
        let slow = answered.saturating_sub(sent) > SLOW.as_nanos() as u64;
        let mut out = Settled::default();
        let mut failed = Vec::new();
        for (item, debt) in items.into_iter().zip(debts) {
            let Some(debt) = debt else {
                failed.push(item);
                continue;
            };
            let Some(k) = self.keys.get_mut(&item.key) else {
                continue;
            };
            let params = &item.params;
            k.advance(&item.used);
            if k.cursor.owed_until != 0 {
                k.cursor.owed_until = 0;
                k.dirty = true;
            }
            out.reported += item.accounted;
            if item.tally > 0 {
                k.untallied = 0;
                k.tallied_at = answered;
            } else {
                k.untallied += item.accounted;
            }
            out.owed += item.owed;
            let debt = debt.as_nanos().min(u128::from(u64::MAX)) as u64;
            k.fresh_at = Some(sent);
            k.fallback = false;
            if item.late || slow {
                // An answer later than the bound assumes: what this daemon
                // admitted meanwhile was (or is now) charged as under the
                // fallback; the fleet's debt counts beside it.
                out.slow += 1;
                k.fallback = true;
                if !item.late {
                    Self::charge(k, &item, answered, view, &mut out);
                }
                k.debt_ns = k.debt_left(answered).max(debt);
            } else {
                k.debt_ns = debt;
            }
            k.debt_at = answered;
            touch(&mut self.touched, item.key, k);
            out.raises.push(Raise {
                key: item.key,
                params: *params,
                debt_ns: k.debt_ns,
                at_ns: k.debt_at,
            });
        }
        out.merge(self.failed(failed, answered, view));
        out
    }

    /// Redis has not answered `items` within [`SLOW`] at `now`: what they
    /// admitted is charged as under the fallback at once, rather than judged
    /// on debts older than the bound assumes. Their answer, when it comes,
    /// counts beside it ([`Book::answered`]).
    pub(super) fn late(&mut self, items: &mut [Item], now: u64, view: &View) -> Settled {
        let mut out = Settled::default();
        for item in items.iter_mut().filter(|i| !i.late) {
            item.late = true;
            if let Some(k) = self.keys.get_mut(&item.key) {
                k.fallback = true;
                Self::charge(k, item, now, view, &mut out);
            }
        }
        out
    }

    /// Redis could not be asked about `items` at `now` (or did not answer):
    /// what they admitted is owed, and charged by the fallback.
    pub(super) fn failed(&mut self, items: Vec<Item>, now: u64, view: &View) -> Settled {
        let mut out = Settled::default();
        for item in items {
            let Some(k) = self.keys.get_mut(&item.key) else {
                continue;
            };
            k.owe(&item.params, item.delta, now);
            k.fallback = true;
            touch(&mut self.touched, item.key, k);
            if !item.late {
                Self::charge(k, &item, now, view, &mut out);
            }
        }
        out
    }

    /// The fallback's charge for what `item` admitted here, at `now`: the
    /// fleet's debt kept here (what it was, paid down since) plus, under
    /// `share`, what this daemon admitted charged for the whole fleet.
    fn charge(k: &mut Key, item: &Item, now: u64, view: &View, out: &mut Settled) {
        let left = k.debt_left(now);
        k.debt_at = now;
        match view.fallback {
            Fallback::Share => {
                let charged = item.delta.saturating_mul(view.times());
                k.debt_ns = left.saturating_add(gcra::units_ns(&item.params, charged));
                out.raises.push(Raise {
                    key: item.key,
                    params: item.params,
                    debt_ns: k.debt_ns,
                    at_ns: now,
                });
            }
            Fallback::Local => k.debt_ns = left,
        }
    }

    /// Cursors to write or remove since the last call.
    /// Cursors to write (each at most once a [`CURSOR_EVERY`]; those held
    /// back are written later) or remove, at `now`.
    pub(super) fn take_writes(&mut self, now: u64) -> Vec<(FlowKey, Option<FleetCursor>)> {
        let every = CURSOR_EVERY.as_nanos() as u64;
        let mut out: Vec<_> = self.gone.drain(..).map(|k| (k, None)).collect();
        let mut later = Vec::new();
        for key in self.touched.drain(..) {
            let Some(k) = self.keys.get_mut(&key) else {
                continue;
            };
            if !k.dirty {
                k.queued = false;
                continue;
            }
            if k.written_at
                .is_some_and(|at| now.saturating_sub(at) < every)
            {
                later.push(key);
                continue;
            }
            k.queued = false;
            k.dirty = false;
            k.written_at = Some(now);
            out.push((key, Some(k.cursor)));
        }
        self.touched = later;
        out
    }

    /// The keys as they stand at `now`, for `status` and the metrics.
    pub(super) fn counts(&self, rules: &HashMap<u32, FleetRule>, now: u64) -> Counts {
        let follow = FOLLOW.as_nanos() as u64;
        let mut c = Counts::default();
        for (fk, k) in &self.keys {
            if k.wanted {
                let fresh = k.fresh_at.unwrap_or(k.since);
                c.lag_ns = c.lag_ns.max(now.saturating_sub(fresh));
            }
            if k.active.is_none_or(|a| now.saturating_sub(a) > follow) {
                continue;
            }
            c.keys += 1;
            c.fallback += u64::from(k.fallback);
            if rules
                .get(&fk.rule_id)
                .is_some_and(|r| k.debt_left(now) >= tau_ns(&r.params))
            {
                c.over += 1;
            }
        }
        c
    }
}

#[cfg(test)]
mod tests;
