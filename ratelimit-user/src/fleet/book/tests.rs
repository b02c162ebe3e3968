//! The books by hand: a fake clock (ns), snapshots made up, Redis's answers
//! given. Rule: 100/s burst 20 (10 ms a unit, 200 ms a bucket).

use std::{collections::HashMap, time::Duration};

use ratelimit_common::{FleetCursor, FleetUsed, FlowKey, gcra, map_v4, words};
use ratelimit_redis::Limit;

use super::*;
use crate::fleet::{Fallback, FleetRule, Snapshot};

const MS: u64 = 1_000_000;
const T0: u64 = 1_000_000 * MS;

fn rule() -> FleetRule {
    FleetRule {
        name: "198.18.0.0/24".into(),
        limit: Limit::gcra(100, Duration::from_secs(1), 20).unwrap(),
        params: gcra::Params::from_rate(100, 1_000_000_000, 20).unwrap(),
        bytes: false,
        per: (32, 128),
    }
}

fn key(last: u8) -> FlowKey {
    FlowKey::of(&words(&map_v4([198, 18, 0, last])), 7)
}

fn used(packets: u64, born: u64) -> FleetUsed {
    FleetUsed {
        packets,
        bytes: packets * 100,
        born,
    }
}

fn snap(
    used: Vec<(FlowKey, FleetUsed)>,
    cursors: Option<Vec<(FlowKey, FleetCursor)>>,
    at: u64,
) -> Snapshot {
    Snapshot {
        rules: HashMap::from([(7, rule())]),
        used,
        cursors,
        at,
    }
}

fn view(members: u64, silent: u64) -> View {
    View {
        members,
        silent,
        fallback: Fallback::Share,
    }
}

/// A book past its first snapshot (no cursors pinned, nothing counted).
fn started() -> Book {
    let mut b = Book::default();
    assert!(
        b.plan(&snap(vec![], Some(vec![]), T0), T0, &view(1, 0))
            .is_empty()
    );
    b
}

fn items(plan: Plan) -> Vec<Item> {
    plan.into_values().flatten().collect()
}

/// Every group of `plan` answered with `debt_ms`, and the sync's cursors.
fn answer(b: &mut Book, plan: Plan, debt_ms: u64, sent: u64, answered: u64, v: &View) -> Settled {
    let mut out = Settled::default();
    for (_, items) in plan {
        let debts = vec![Some(Duration::from_millis(debt_ms)); items.len()];
        out.merge(b.answered(items, &debts, sent, answered, v));
    }
    out.cursors.extend(b.take_writes(answered));
    out
}

/// `items` failed at `now`, and the sync's cursors.
fn fail(b: &mut Book, items: Vec<Item>, now: u64, v: &View) -> Settled {
    let mut out = b.failed(items, now, v);
    out.cursors.extend(b.take_writes(now));
    out
}

fn cursor_of(s: &Settled, k: FlowKey) -> Option<FleetCursor> {
    s.cursors
        .iter()
        .rev()
        .find(|(key, _)| *key == k)
        .and_then(|(_, c)| *c)
}

#[test]
fn a_restarted_daemon_reports_no_history_twice() {
    let mut b = Book::default();
    let k = key(60);
    // The last daemon accounted for 1 000 frames; 3 came while no daemon
    // synced.
    let pinned = FleetCursor {
        packets: 1_000,
        bytes: 100_000,
        born: 5,
        owed_until: 0,
    };
    let plan = b.plan(
        &snap(vec![(k, used(1_003, 5))], Some(vec![(k, pinned)]), T0),
        T0,
        &view(3, 0),
    );
    let i = items(plan);
    assert_eq!(i.len(), 1);
    assert_eq!(
        (i[0].delta, i[0].owed, i[0].amount, i[0].accounted),
        (0, 3, 3, 3),
        "{i:?}"
    );
}

#[test]
fn what_a_restart_finds_past_the_cursor_is_owed_at_most_a_bucket() {
    let k = key(60);
    let pinned = FleetCursor {
        packets: 1_000,
        bytes: 100_000,
        born: 5,
        owed_until: 0,
    };
    let mut b = Book::default();
    let plan = b.plan(
        &snap(vec![(k, used(6_000, 5))], Some(vec![(k, pinned)]), T0),
        T0,
        &view(1, 0),
    );
    let i = items(plan);
    assert_eq!(i[0].owed, 20, "a whole bucket, not 5 000");
    assert_eq!(i[0].accounted, 5_000, "every unit is accounted for");
    assert_eq!(i[0].tally, 5_000, "and tallied: the key's first");
    // Nothing pinned for a key the program counted: the same.
    let mut b = Book::default();
    let plan = b.plan(
        &snap(vec![(k, used(6_000, 5))], Some(vec![]), T0),
        T0,
        &view(1, 0),
    );
    assert_eq!(items(plan)[0].owed, 20);
}

#[test]
fn in_step_each_unit_is_reported_once() {
    let mut b = started();
    let k = key(60);
    let v = view(3, 0);
    let plan = b.plan(
        &snap(vec![(k, used(10, 5))], None, T0 + 100 * MS),
        T0 + 100 * MS,
        &v,
    );
    assert_eq!(items(plan.clone())[0].amount, 10);
    let s = answer(&mut b, plan, 50, T0 + 100 * MS, T0 + 101 * MS, &v);
    assert_eq!(s.reported, 10);
    assert_eq!(cursor_of(&s, k).map(|c| c.packets), Some(10));
    assert_eq!(s.raises.len(), 1);
    assert_eq!(s.raises[0].debt_ns, 50 * MS);
    let plan = b.plan(
        &snap(vec![(k, used(15, 5))], None, T0 + 200 * MS),
        T0 + 200 * MS,
        &v,
    );
    let i = items(plan);
    assert_eq!((i[0].delta, i[0].owed, i[0].amount), (5, 0, 5));
}

#[test]
fn what_redis_did_not_take_is_owed_and_reported_when_it_answers() {
    let mut b = started();
    let k = key(60);
    let v = view(3, 0);
    let at = T0 + 100 * MS;
    let plan = b.plan(&snap(vec![(k, used(10, 5))], None, at), at, &v);
    let s = fail(&mut b, items(plan), at, &v);
    // Share: charged three times here: 30 units, 300 ms.
    assert_eq!(s.raises[0].debt_ns, 300 * MS);
    // Not reported: the cursor stays; owed: 100 ms of refill.
    let c = cursor_of(&s, k).unwrap();
    assert_eq!((c.packets, c.owed_until), (0, at + 100 * MS));
    // 50 ms later, nothing new: half of it is still owed.
    let at = at + 50 * MS;
    let i = items(b.plan(&snap(vec![(k, used(10, 5))], None, at), at, &v));
    assert_eq!((i[0].delta, i[0].owed, i[0].accounted), (0, 5, 10));
    // Answered: everything since the cursor accounted for, what still weighs
    // charged, and nothing owed any more.
    let plan = b.plan(&snap(vec![(k, used(12, 5))], None, at), at, &v);
    assert_eq!(items(plan.clone())[0].amount, 7);
    let s = answer(&mut b, plan, 0, at, at + MS, &v);
    assert_eq!(s.reported, 12);
    // Its cursor was written 50 ms ago: the next write waits its second.
    assert_eq!(cursor_of(&s, k), None);
    let w = b.take_writes(at + 1_100 * MS);
    assert_eq!(w.len(), 1);
    let c = w[0].1.unwrap();
    assert_eq!((c.packets, c.owed_until), (12, 0));
    // Long after, nothing is owed at all.
    let mut b = started();
    let plan = b.plan(&snap(vec![(k, used(10, 5))], None, T0), T0, &v);
    b.failed(items(plan), T0, &v);
    let later = T0 + 300 * MS;
    let i = items(b.plan(&snap(vec![(k, used(10, 5))], None, later), later, &v));
    assert!(i.is_empty() || i[0].owed == 0, "{i:?}");
}

#[test]
fn an_entry_created_again_counts_from_zero() {
    let mut b = started();
    let k = key(60);
    let v = view(1, 0);
    let plan = b.plan(&snap(vec![(k, used(10, 5))], None, T0), T0, &v);
    answer(&mut b, plan, 0, T0, T0, &v);
    let i = items(b.plan(
        &snap(vec![(k, used(4, 9))], None, T0 + 100 * MS),
        T0 + 100 * MS,
        &v,
    ));
    assert_eq!(i[0].delta, 4);
}

#[test]
fn local_fallback_raises_nothing() {
    let mut b = started();
    let k = key(60);
    let v = View {
        fallback: Fallback::Local,
        ..view(3, 0)
    };
    let plan = b.plan(&snap(vec![(k, used(10, 5))], None, T0), T0, &v);
    let s = b.failed(items(plan), T0, &v);
    assert!(s.raises.is_empty());
}

#[test]
fn a_late_answer_is_charged_as_under_the_fallback_too() {
    let mut b = started();
    let k = key(60);
    let v = view(3, 0);
    let plan = b.plan(&snap(vec![(k, used(4, 5))], None, T0), T0, &v);
    let s = answer(&mut b, plan, 40, T0, T0 + 150 * MS, &v);
    assert_eq!(s.slow, 1);
    // Redis's 40 ms, and what this daemon admitted twice more (80 ms).
    assert_eq!(s.raises[0].debt_ns, 120 * MS);
    assert_eq!(s.reported, 4);
}

#[test]
fn silent_members_are_left_their_share() {
    assert_eq!(view(3, 1).weighted(10), 15);
    assert_eq!(view(3, 0).weighted(10), 10);
    assert_eq!(view(4, 1).weighted(1), 2);
    let mut b = started();
    let k = key(60);
    let i = items(b.plan(&snap(vec![(k, used(10, 5))], None, T0), T0, &view(3, 1)));
    assert_eq!((i[0].delta, i[0].amount), (10, 15));
}

#[test]
fn idle_keys_cost_nothing() {
    let mut b = started();
    let k = key(60);
    let v = view(3, 0);
    let plan = b.plan(&snap(vec![(k, used(10, 5))], None, T0), T0, &v);
    answer(&mut b, plan, 0, T0, T0, &v);
    // Nothing admitted, and the fleet holds nothing against it: no report.
    let at = T0 + 100 * MS;
    assert!(
        b.plan(&snap(vec![(k, used(10, 5))], None, at), at, &v)
            .is_empty()
    );
    // The fleet holds it (others admit): read while it is followed.
    let mut b = started();
    let plan = b.plan(&snap(vec![(k, used(10, 5))], None, T0), T0, &v);
    answer(&mut b, plan, 500, T0, T0, &v);
    let i = items(b.plan(&snap(vec![(k, used(10, 5))], None, at), at, &v));
    assert_eq!((i.len(), i[0].amount), (1, 0));
    // ... and no longer once it admitted nothing here for 2 s.
    let late = T0 + 2_100 * MS;
    let plan = b.plan(&snap(vec![(k, used(10, 5))], None, late), late, &v);
    assert!(plan.is_empty());
}

#[test]
fn cursors_of_keys_gone_are_removed() {
    let mut b = started();
    let (k, j) = (key(60), key(61));
    let v = view(1, 0);
    let plan = b.plan(
        &snap(vec![(k, used(1, 5)), (j, used(1, 5))], None, T0),
        T0,
        &v,
    );
    answer(&mut b, plan, 0, T0, T0, &v);
    b.plan(
        &snap(vec![(k, used(1, 5))], None, T0 + 100 * MS),
        T0 + 100 * MS,
        &v,
    );
    let w = b.take_writes(T0 + 100 * MS);
    assert_eq!(w, vec![(j, None)]);
}

#[test]
fn counts_show_the_worst_lag_and_the_keys_in_fallback() {
    let mut b = started();
    let (k, j) = (key(60), key(61));
    let v = view(3, 0);
    let plan = b.plan(
        &snap(vec![(k, used(1, 5)), (j, used(1, 5))], None, T0),
        T0,
        &v,
    );
    let mut all = items(plan);
    let jj = all.pop().unwrap();
    let kk = all.pop().unwrap();
    b.answered(
        vec![kk],
        &[Some(Duration::from_millis(250))],
        T0,
        T0 + 2 * MS,
        &v,
    );
    b.failed(vec![jj], T0 + 2 * MS, &v);
    let c = b.counts(&HashMap::from([(7, rule())]), T0 + 5 * MS);
    assert_eq!((c.keys, c.over, c.fallback), (2, 1, 1));
    // The key in fallback was never answered: its lag runs from its first
    // sight.
    assert_eq!(c.lag_ns, 5 * MS);
}

#[test]
fn a_key_is_tallied_about_once_a_second() {
    let mut b = started();
    let k = key(60);
    let v = view(1, 0);
    let mut tallied = 0;
    for n in 1..=25u64 {
        let at = T0 + n * 100 * MS;
        let plan = b.plan(&snap(vec![(k, used(n * 3, 5))], None, at), at, &v);
        let i = items(plan.clone());
        assert_eq!(i[0].delta, 3, "reported every sync");
        tallied += i[0].tally;
        answer(&mut b, plan, 0, at, at, &v);
    }
    // 75 units in 2.5 s: the first sync's and two more, each with what came
    // since the last.
    assert_eq!(tallied, 3 + 30 + 30);
    // Idle: what is left is tallied when it is due.
    let at = T0 + 3_600 * MS;
    let i = items(b.plan(&snap(vec![(k, used(75, 5))], None, at), at, &v));
    assert_eq!((i[0].amount, i[0].tally), (0, 12));
}

#[test]
fn an_answer_not_come_within_100_ms_is_charged_as_the_fallback_at_once() {
    let mut b = started();
    let k = key(60);
    let v = view(3, 0);
    let plan = b.plan(&snap(vec![(k, used(4, 5))], None, T0), T0, &v);
    let mut i = items(plan);
    // 100 ms and no answer: this daemon's 4 units charged three times now.
    let s = b.late(&mut i, T0 + 100 * MS, &v);
    assert_eq!(s.raises[0].debt_ns, 120 * MS);
    // The answer at 150 ms: the fleet's 200 ms counts beside it (not on top).
    let s = b.answered(
        i.clone(),
        &[Some(Duration::from_millis(200))],
        T0,
        T0 + 150 * MS,
        &v,
    );
    assert_eq!((s.slow, s.raises[0].debt_ns), (1, 200 * MS));
    // No answer at all: owed, and not charged a second time.
    let at = T0 + 200 * MS;
    let plan = b.plan(&snap(vec![(k, used(8, 5))], None, at), at, &v);
    let mut i = items(plan);
    let late = b.late(&mut i, at + 100 * MS, &v);
    let s = b.failed(i, at + 260 * MS, &v);
    assert_eq!(late.raises.len(), 1);
    assert!(s.raises.is_empty(), "charged once: {s:?}");
}
