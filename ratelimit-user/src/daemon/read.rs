//! The read-only answers, built from the maps and the rules: `list`,
//! `status`, `stats` and `top`'s readings. One builder each, used by the
//! running daemon's handlers and by [`super::offline`] (a program read from
//! its pins with no daemon), so both answer alike.

use std::time::Duration;

use ratelimit_common::{Event, Reason, RuleCounter};

use super::Baseline;
use crate::{
    error::Result,
    host::clock::now_ms,
    host::identity::Identity,
    kernel::{Attached, InterfaceState, Maps},
    model::overlay::Layers,
    model::{
        describe,
        droplog::DropLog,
        lists::{Allowed, ListAction},
        rules::{Clock, RuleSet, Selector, fmt_duration, source_ip, tick_ns},
    },
    protocol::answer::{
        self, ActionView, DefaultView, DropLogStatus, Drops, ListView, Offline, ReasonCount,
        RuleView, Running, Stats, Status, Top, TopRow,
        rules::{Counters, Origin, expiry},
    },
};

/// The rules as `ratelimit list` shows them; with each rule's counters read
/// from `counters` now (`list --stats`).
pub(super) fn list_of(rules: &Layers, counters: Option<&Maps>) -> Result<answer::Rules> {
    let set = rules.effective();
    let kernel = counters.map(Maps::rules).transpose()?;
    let counters_of = |slot: u32| -> Result<Option<Counters>> {
        let Some(maps) = counters else {
            return Ok(None);
        };
        let c = maps.rule_counters(slot)?;
        Ok(Some(
            RuleCounter::ALL
                .iter()
                .zip(c)
                .map(|(k, c)| (k.name().to_string(), c.into()))
                .collect(),
        ))
    };
    // In precedence order: by source, and a source's rules in the order
    // they are tried (`order`, from 1).
    let mut order = 0;
    let mut last = None;
    let now = now_ms();
    let mut listed = Vec::with_capacity(set.rules.len());
    for (p, a) in &set.rules {
        order = if last == Some(p.source) { order + 1 } else { 1 };
        last = Some(p.source);
        let slot = kernel.as_ref().and_then(|k| k.get(p)).map(|r| r.slot);
        listed.push(RuleView {
            order: Some(order),
            origin: Some(Origin::of(rules.origin(p))),
            counters: match slot {
                Some(slot) => counters_of(slot)?,
                None => None,
            },
            ..RuleView::of(p, a, rules.expires(p), now)
        });
    }
    let clock = match set.clock {
        Clock::Precise => {
            "precise: each key admits at most burst + rate × T in any span T".to_string()
        }
        Clock::Coarse => format!(
            "coarse: each key admits at most burst + rate × (T + {}) in any span T (one scheduler tick)",
            fmt_duration(tick_ns())
        ),
    };
    Ok(answer::Rules {
        default: DefaultView {
            action: ActionView::of(&set.default, None),
            counters: counters_of(0)?,
        },
        dry_run: set.dry_run,
        mode: set.mode,
        unjudged: set.unjudged,
        fragments: set.fragments,
        malformed: set.malformed,
        clock,
        new_states: set.new_states.to_string(),
        rules: listed,
        lists: list_views(rules, &set, counters)?,
        live_changes: rules.live.rules.len()
            + usize::from(rules.live.default.is_some())
            + rules.live.lists.len(),
        pins: None,
        offline: None,
    })
}

/// Each list: its name, action, entries and source, and how many of its
/// entries are shadowed (they have exactly the CIDR of a rule without a
/// match, which wins, or, in a deny list, are equal to or inside an allow
/// list entry, which wins: see `kernel::Maps::apply`).
fn list_views(rules: &Layers, set: &RuleSet, counters: Option<&Maps>) -> Result<Vec<ListView>> {
    let allowed = Allowed::of(set.lists.values());
    let counted = counters.map(Maps::list_counters).transpose()?;
    Ok(set
        .lists
        .iter()
        .map(|(name, l)| {
            let shadowed = l
                .entries
                .iter()
                .filter(|p| {
                    set.rules.contains_key(&Selector::from(**p))
                        || (l.action == ListAction::Deny && allowed.covers(p))
                })
                .count();
            let (expires_at, expires_in_s) = expiry(rules.list_expires(name), now_ms());
            ListView {
                name: name.clone(),
                action: l.action,
                entries: l.entries.len(),
                shadowed,
                source: l.source.clone(),
                origin: Origin::of(rules.list_origin(name)),
                expires_at,
                expires_in_s,
                counters: counted
                    .as_ref()
                    .and_then(|c| c.get(name))
                    .map(|c| (*c).into()),
            }
        })
        .collect())
}

/// Counters by reason from `maps`; `rate` gives a reason's packets and
/// bytes per second.
pub(super) fn stats_of(
    maps: &Maps,
    iface: &str,
    rate: impl Fn(Reason) -> Option<(f64, f64)>,
) -> Result<Stats> {
    let totals = maps.counters()?;
    let reasons = Reason::ALL
        .iter()
        .map(|r| {
            let c = totals[*r as usize];
            let (pps, bps) = rate(*r).map_or((None, None), |(p, b)| {
                (describe::number(p), describe::number(b))
            });
            ReasonCount {
                reason: r.name().to_string(),
                packets: c.packets,
                bytes: c.bytes,
                packets_per_s: pps,
                bytes_per_s: bps,
            }
        })
        .collect();
    let events = maps.events()?;
    Ok(Stats {
        iface: iface.to_string(),
        reasons,
        events: Event::ALL
            .iter()
            .map(|e| (e.name().to_string(), events[*e as usize]))
            .collect(),
        crowdsec: Vec::new(),
        drop_log: drop_log_of(maps)?,
        pins: None,
        offline: None,
    })
}

/// The drop log's budget (as the kernel holds it) and counts.
fn drop_log_of(maps: &Maps) -> Result<DropLogStatus> {
    let c = maps.drop_log_counts()?;
    Ok(DropLogStatus {
        rate: DropLog(maps.config()?.drop_log_rate).to_string(),
        written: c.written,
        skipped: c.skipped,
        lost: c.lost,
    })
}

/// Drop counts by source now (`top` reads this twice).
pub(super) fn drops_of(maps: &Maps, iface: &str) -> Result<Drops> {
    let mut out = Drops {
        iface: iface.to_string(),
        drops: Default::default(),
        levels: Default::default(),
    };
    for (key, n) in maps.drops() {
        let ip = source_ip(&key.addr);
        let name = if key.prefix == 0 {
            ip.to_string()
        } else {
            format!("{ip}/{}", key.prefix)
        };
        if key.level > 1 {
            out.levels.insert(name.clone(), key.level);
        }
        *out.drops.entry(name).or_default() += n;
    }
    Ok(out)
}

/// `top`'s answer from two readings of the drop counters `window` apart: the
/// `n` sources and networks dropping the most now, each with its rate and
/// its total.
pub(super) fn top_of(first: &Drops, second: Drops, window: Duration, n: usize) -> Top {
    let mut rows: Vec<(String, u64, f64)> = second
        .drops
        .into_iter()
        .map(|(source, total)| {
            let was = first.drops.get(&source).copied().unwrap_or(0);
            let rate = total.saturating_sub(was) as f64 / window.as_secs_f64();
            (source, total, rate)
        })
        .collect();
    rows.sort_by(|a, b| b.2.total_cmp(&a.2).then(b.1.cmp(&a.1)));
    rows.truncate(n);
    Top {
        iface: second.iface,
        window_s: window.as_secs_f64(),
        top: rows
            .into_iter()
            .map(|(source, total, rate)| TopRow {
                // 1: the source's own level (or a deny); 2 and 3: a rule's
                // key levels, whose keys are networks.
                level: second.levels.get(&source).copied().unwrap_or(1),
                source,
                dropped: total,
                dropped_per_s: rate.round() as u64,
            })
            .collect(),
        pins: None,
        offline: None,
    }
}

/// Who answers `status`, and what it alone knows.
pub(super) enum Teller {
    /// The running daemon.
    Daemon(Box<DaemonFacts>),
    /// The pins, with no daemon.
    Pins {
        /// Whether an interface of the name exists.
        interface: answer::Interface,
        /// How the answer was made, and how to make changes.
        note: String,
        /// How the pins were read.
        offline: Offline,
    },
}

/// What a running daemon knows beyond its maps and rules.
pub(super) struct DaemonFacts {
    /// Native or generic.
    pub mode: Attached,
    /// It adopted pinned maps.
    pub adopted: bool,
    /// It swapped its program into a pinned link.
    pub took_over_link: bool,
    /// Since it started.
    pub uptime: Duration,
    /// The program stays when it exits.
    pub keep_attached: bool,
    /// The fleet as it sees it.
    pub fleet: Option<crate::fleet::Status>,
    /// The interface as last seen.
    pub interface: InterfaceState,
    /// What the maps held and had created when it started, and what its
    /// sweeps removed since: for the estimate of evictions.
    pub baseline: Baseline,
    /// Map entries found different from what it wrote, put back.
    pub drift_repaired: u64,
}

/// What runs and how (see [`Teller`]): from the maps, the rules, and what the
/// teller knows.
pub(super) fn status_of(
    maps: &Maps,
    set: &RuleSet,
    id: &Identity,
    pins: String,
    teller: Teller,
) -> Result<Status> {
    // One pass over the state table for both families and the active slots.
    let census = maps.table_census();
    let (v4_keys, v6_keys) = (census.v4 as usize, census.v6 as usize);
    let wide_keys = maps.wide_count()?;
    let tracked = v4_keys + v6_keys + wide_keys;
    let sizes = maps.capacities();
    let mut notes: Vec<String> = crate::host::kernel::missing()
        .iter()
        .map(ToString::to_string)
        .collect();
    let open = set.without_aggregate();
    if !open.is_empty() {
        notes.push(format!(
            "{} limit{} each source but not all {} sources together: a flood spread over many (spoofed) sources passes each one's limit; give {} an aggregate (`ratelimit set … --aggregate RATE`, or `aggregate = \"RATE\"` in the config; see docs/concepts/floods.md)",
            open.join(", "),
            if open.len() == 1 { "s" } else { "" },
            if open.len() == 1 { "its" } else { "their" },
            if open.len() == 1 { "it" } else { "each" },
        ));
    }
    let (interface, daemon, offline) = match teller {
        Teller::Pins {
            interface,
            note,
            offline,
        } => {
            notes.push(note);
            (interface, None, Some(offline))
        }
        Teller::Daemon(facts) => {
            let events = maps.events()?;
            let created = events[Event::StateCreated as usize];
            // An LRU map starts evicting a little before it is full: each CPU
            // keeps a few free entries of its own.
            let full = |n: usize, cap: u32| n as u64 * 100 >= u64::from(cap) * 99;
            let mut state_map_full = false;
            let (slots, held, active) = (maps.table_slots(), census.v4 + census.v6, census.active);
            let state_table = answer::TableStatus {
                slots,
                held,
                active,
                refused: events[Event::StateFull as usize],
            };
            if state_table.refused > 0 {
                state_map_full = true;
                notes.push(format!(
                    "the state table had no free slot for {} new sources ({active} of its {slots} slots active now): their frames were judged by the new-source budget (a table never evicts an active source); restart with --reset --max-sources N (IPv4) or --max-sources-v6 N to make room (rules are kept)",
                    state_table.refused
                ));
            }
            let fleet_full = events[Event::FleetFull as usize];
            if fleet_full > 0 {
                notes.push(format!(
                    "{fleet_full} frames admitted to keys of fleet-wide rules found no free slot in the fleet's count table ({} slots, eight to a set, a slot free once its key is not counted for 10 s): the other members did not see them; fewer keys under fleet-wide rules (a shorter key prefix) make room",
                    ratelimit_common::FLEET_CAPACITY
                ));
            }
            if full(wide_keys, sizes.wide_capacity) {
                state_map_full = true;
                notes.push(format!(
                    "the wide-state map is full ({wide_keys} of {}): a source that earns a state now evicts the one seen least recently (busy sources stay); restart with --reset --max-wide-sources N to make room (rules are kept)",
                    sizes.wide_capacity
                ));
            }
            let interface = match facts.interface {
                InterfaceState::Attached => answer::Interface::Attached,
                InterfaceState::Gone => {
                    notes.push(
                        "the interface is gone: nothing is enforced until an interface of its name comes back (the program is attached to it then)".into(),
                    );
                    answer::Interface::Gone
                }
                InterfaceState::Recreated => {
                    notes.push(
                        "the interface was re-created and attaching to it failed: nothing is enforced on it (see the daemon's log)".into(),
                    );
                    answer::Interface::NotAttached
                }
            };
            let b = facts.baseline;
            let running = Running {
                attach: facts.mode,
                adopted: facts.adopted,
                took_over_link: facts.took_over_link,
                uptime_s: facts.uptime.as_secs(),
                clock: set.clock,
                list_entries: set.lists.values().map(|l| l.entries.len()).sum(),
                list_capacity: sizes.list_capacity,
                state_map_full,
                state_table,
                states_created: created,
                new_states_capped: events[Event::NewStateCapped as usize],
                // States created since the start, less what the maps gained
                // and what the sweeps removed.
                evicted_estimate: (created.saturating_sub(b.created) + b.tracked as u64)
                    .saturating_sub(tracked as u64 + b.swept),
                doorkeeper_slots: sizes.seen_slots,
                keep_attached: facts.keep_attached,
                fleet: facts.fleet,
                crowdsec: None,
                drop_log: drop_log_of(maps)?,
                drift_repaired: facts.drift_repaired,
            };
            (interface, Some(running), None)
        }
    };
    Ok(Status {
        iface: id.iface.clone(),
        netns: id.netns_inode,
        netns_cookie: id.netns,
        interface,
        pid: daemon.is_some().then(std::process::id),
        tracked_sources: tracked,
        ipv4_sources: v4_keys,
        ipv4_capacity: sizes.state_capacity,
        ipv6_sources: v6_keys,
        ipv6_capacity: sizes.state_capacity_v6,
        wide_sources: wide_keys,
        wide_capacity: sizes.wide_capacity,
        rules_capacity: sizes.rules_capacity,
        rules: set.rules.len(),
        lists: set.lists.len(),
        dry_run: set.dry_run,
        mode: set.mode,
        pins,
        notes,
        orphaned_pins: Vec::new(),
        daemon,
        offline,
    })
}
