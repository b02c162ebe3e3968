//! What each control request does. Changes edit the live layer of the rules
//! (see [`super::store`]) and are applied whole or not at all; reads answer
//! from the maps.

use std::collections::BTreeSet;

use ratelimit_common::{Event, Reason, RuleCounter};
use serde_json::{Value, json};
use tracing::{error, info};

use super::{
    Daemon,
    store::{Rules, now_ms},
};
use crate::{
    config::RawLimit,
    error::{Error, Result, chain},
    kernel::{InterfaceState, Maps},
    model::describe,
    model::lists::{Allowed, List, ListAction, check_name},
    model::rules::{Action, Clock, Limit, RuleSet, Selector, fmt_duration, source_ip, tick_ns},
    protocol::Request,
};

impl Daemon {
    /// Applies a change to the live layer; answers with the rules and what
    /// changed (`changes`: each rule, list, default or mode before and after).
    fn change(&mut self, edit: impl FnOnce(&mut Rules) -> Result<()>) -> Result<Value> {
        let mut next = self.rules.clone();
        edit(&mut next)?;
        let changes = changes(&self.rules, &next);
        self.apply(next)?;
        let mut data = self.list();
        data["changes"] = json!(changes);
        Ok(data)
    }

    /// Ends the temporary rules and lists whose time came; logs what ended.
    pub(super) fn expire(&mut self) {
        let now = now_ms();
        if !self.rules.has_due(now) {
            return;
        }
        let mut next = self.rules.clone();
        let ended = next.expire(now);
        match self.apply_expired(next) {
            Ok(()) => info!(ended = %ended.join(", "), "temporary rules ended"),
            Err(e) => {
                // Tried again in a minute; until then what was set stays.
                error!(ended = %ended.join(", "), error = %chain(&e), "ending temporary rules failed; they stay until the next try");
                self.rules.postpone_due(now, 60_000);
            }
        }
    }

    pub(super) fn handle(&mut self, request: Request) -> Result<Value> {
        match request {
            Request::Set {
                target,
                limit,
                for_ms,
                force,
            } => {
                let until = until(for_ms)?;
                let set = self.rules.effective();
                if target == "default" {
                    if until.is_some() {
                        return Err(Error::invalid(
                            "--for",
                            "the default rule is set for good; a temporary limit needs a CIDR, e.g. `ratelimit set 0.0.0.0/0 --rate 100/s --for 10m`",
                        ));
                    }
                    let raw = merged(Some(&set.default), *limit)?;
                    let action = as_typed(raw.validate(SET, None))?;
                    check_byte_bursts(&action, Some(&set.default), force)?;
                    self.change(|r| {
                        r.live.default = Some(action);
                        Ok(())
                    })
                } else {
                    let prefix = Selector::parse("CIDR", &target)?;
                    // A change for good builds on the rule that lasts, not on
                    // a temporary one (which it ends).
                    let current = match until {
                        Some(_) => set.rules.get(&prefix).copied(),
                        None => self.rules.lasting(&prefix),
                    };
                    let raw = merged(current.as_ref(), *limit)?;
                    let action = as_typed(raw.validate(SET, Some(prefix.source.addr.is_ipv4())))?;
                    check_byte_bursts(&action, current.as_ref(), force)?;
                    self.change(|r| {
                        r.set_live(prefix, Some(action), until);
                        Ok(())
                    })
                }
            }
            Request::Allow { cidr, for_ms } => {
                let until = until(for_ms)?;
                let prefix = Selector::parse("CIDR", &cidr)?;
                self.change(|r| {
                    r.set_live(prefix, Some(Action::Allow), until);
                    Ok(())
                })
            }
            Request::Deny { cidr, for_ms } => {
                let until = until(for_ms)?;
                let prefix = Selector::parse("CIDR", &cidr)?;
                self.change(|r| {
                    r.set_live(prefix, Some(Action::Deny { dry_run: false }), until);
                    Ok(())
                })
            }
            Request::Unset {
                cidr,
                only_temporary,
            } => {
                let prefix = Selector::parse("CIDR", &cidr)?;
                self.change(|r| {
                    // A temporary rule ends as its time would: what it hid
                    // comes back.
                    if r.end_temporary(&prefix) || only_temporary {
                        return Ok(());
                    }
                    if !r.effective().rules.contains_key(&prefix) {
                        return Err(Error::invalid(
                            "CIDR",
                            format!("no rule for {prefix}; `ratelimit list` shows the rules"),
                        ));
                    }
                    if r.base.rules.contains_key(&prefix) {
                        // A rule of the config file: removed until reload --replace.
                        r.set_live(prefix, None, None);
                    } else {
                        r.clear_live(&prefix);
                    }
                    Ok(())
                })
            }
            Request::LoadList {
                name,
                action,
                source,
                text,
                for_ms,
            } => {
                let started = std::time::Instant::now();
                let until = until(for_ms)?;
                check_name("--name", &name)?;
                let (list, parsed) = List::parse("--from", action, &source, &text)?;
                let replaced = self.rules.effective().lists.get(&name).map(|l| l.action);
                let mut data = self.change(|r| {
                    r.set_live_list(name.clone(), Some(list), until);
                    Ok(())
                })?;
                let ms = started.elapsed().as_millis();
                let dups = if parsed.duplicates > 0 {
                    format!(", {} duplicate lines", parsed.duplicates)
                } else {
                    String::new()
                };
                let verb = match replaced {
                    Some(a) => format!("replaced the {a} list {name} with"),
                    None => format!("loaded {action} list {name}:"),
                };
                let ends = until.map_or(String::new(), |at| {
                    format!(
                        "; ends in {} ({})",
                        describe::span(for_ms.unwrap_or(0)),
                        describe::rfc3339(at)
                    )
                });
                data["loaded"] = json!({
                    "name": name,
                    "action": action,
                    "source": source,
                    "lines": parsed.lines,
                    "entries": parsed.entries.len(),
                    "duplicates": parsed.duplicates,
                    "replaced": replaced.is_some(),
                    "applied_ms": ms as u64,
                    "expires_at": until.map(describe::rfc3339),
                    "summary": format!(
                        "{verb} {} entries from {source}{dups}; applied in {ms} ms{ends}",
                        parsed.entries.len()
                    ),
                });
                Ok(data)
            }
            Request::UnsetList { name } => self.change(|r| {
                if !r.effective().lists.contains_key(&name) {
                    let names: Vec<String> = r.effective().lists.keys().cloned().collect();
                    return Err(Error::invalid(
                        "--list",
                        if names.is_empty() {
                            format!("no list named {name:?}: no list is loaded")
                        } else {
                            format!("no list named {name:?}; the lists are {}", names.join(", "))
                        },
                    ));
                }
                if r.base.lists.contains_key(&name) {
                    // A list of the config file: removed until reload --replace.
                    r.set_live_list(name, None, None);
                } else {
                    r.clear_live_list(&name);
                }
                Ok(())
            }),
            Request::Mode { mode } => self.change(|r| {
                r.live.mode = Some(mode);
                Ok(())
            }),
            Request::Reload { .. } => Err(Error::Refused(
                "reload is answered by the loop when its file is read, not here".into(),
            )),
            Request::List { counters } => {
                let mut data = self.list();
                if counters {
                    add_counters(&self.enforcer.maps, &mut data)?;
                }
                Ok(data)
            }
            Request::Status => self.status(),
            Request::Stats => self.stats(),
            Request::Drops => self.drops(),
            Request::Top { .. } | Request::FleetTop { .. } => Err(Error::Refused(
                "top is answered by the connection, not the loop".into(),
            )),
            Request::FleetRules => {
                let Some(url) = &self.opts.fleet else {
                    return Err(Error::Refused(
                        "this daemon was not started with --fleet REDIS_URL: it has no fleet"
                            .into(),
                    ));
                };
                let set = self.rules.effective();
                let mut names = Vec::new();
                if matches!(set.default, Action::Limit(Limit { fleet: true, .. })) {
                    names.push("default".to_string());
                }
                for (p, a) in &set.rules {
                    if matches!(a, Action::Limit(Limit { fleet: true, .. })) {
                        names.push(p.to_string());
                    }
                }
                Ok(serde_json::json!({"redis": url, "rules": names}))
            }
        }
    }

    pub(super) fn list(&self) -> Value {
        list_of(&self.rules)
    }

    /// A reload's answer: the rules, and what changed since `before`.
    pub(super) fn reloaded(&self, before: &Rules) -> Value {
        let mut data = self.list();
        data["changes"] = json!(changes(before, &self.rules));
        data
    }

    /// States evicted since this daemon started, estimated: states created
    /// minus what the maps gained and what the sweep removed.
    fn evicted(&self, tracked: usize, created: u64) -> u64 {
        let b = &self.baseline;
        (created.saturating_sub(b.created) + b.tracked as u64)
            .saturating_sub(tracked as u64 + b.swept)
    }

    fn status(&self) -> Result<Value> {
        let (v4_keys, v6_keys, wide_keys) = self.enforcer.maps.tracked_by_map()?;
        let gcra_keys = v4_keys + v6_keys;
        let events = self.enforcer.maps.events()?;
        let created = events[Event::StateCreated as usize];
        let sizes = self.enforcer.maps.capacities();
        // An LRU map starts evicting a little before it is full: each CPU keeps
        // a few free entries of its own.
        let full = |n: usize, cap: u32| n as u64 * 100 >= u64::from(cap) * 99;
        let mut notes = Vec::new();
        let mut state_full = false;
        for (what, n, cap, flag) in [
            (
                "IPv4 state map",
                v4_keys,
                sizes.state_capacity,
                "--max-sources",
            ),
            (
                "IPv6 state map",
                v6_keys,
                sizes.state_capacity_v6,
                "--max-sources-v6",
            ),
            (
                "wide-state map",
                wide_keys,
                sizes.wide_capacity,
                "--max-wide-sources",
            ),
        ] {
            if full(n, cap) {
                state_full = true;
                notes.push(format!(
                    "the {what} is full ({n} of {cap}): a source that earns a state now evicts the one seen least recently (busy sources stay); restart with --reset {flag} N to make room (rules are kept)"
                ));
            }
        }
        let interface = match self.interface {
            InterfaceState::Attached => "attached",
            InterfaceState::Gone => {
                notes.push(
                    "the interface is gone: nothing is enforced until an interface of its name comes back (the program is attached to it then)".into(),
                );
                "gone"
            }
            InterfaceState::Recreated => {
                notes.push(
                    "the interface was re-created and attaching to it failed: nothing is enforced on it (see the daemon's log)".into(),
                );
                "not attached"
            }
        };
        let set = self.rules.effective();
        Ok(json!({
            "iface": self.enforcer.iface(),
            "netns": self.id.netns_inode,
            "netns_cookie": self.id.netns,
            "interface": interface,
            "mode": self.enforcer.mode(),
            "adopted": self.enforcer.adopted,
            "took_over_link": self.enforcer.took_over_link,
            "pid": std::process::id(),
            "uptime_s": self.started.elapsed().as_secs(),
            "clock": set.clock.name(),
            "tracked_sources": gcra_keys + wide_keys,
            "ipv4_sources": v4_keys,
            "ipv4_capacity": sizes.state_capacity,
            "ipv6_sources": v6_keys,
            "ipv6_capacity": sizes.state_capacity_v6,
            "wide_sources": wide_keys,
            "wide_capacity": sizes.wide_capacity,
            "rules_capacity": sizes.rules_capacity,
            "lists": set.lists.len(),
            "list_entries": set.lists.values().map(|l| l.entries.len()).sum::<usize>(),
            "list_capacity": sizes.list_capacity,
            "state_map_full": state_full,
            "states_created": created,
            "new_states_capped": events[Event::NewStateCapped as usize],
            "evicted_estimate": self.evicted(gcra_keys + wide_keys, created),
            "doorkeeper_slots": sizes.seen_slots,
            "rules": set.rules.len(),
            "dry_run": set.dry_run,
            "keep_attached": self.opts.keep_attached,
            "pins": self.enforcer.pin_dir().display().to_string(),
            "fleet": self.fleet.as_ref().map(|s| s.borrow().clone()),
            "notes": notes,
        }))
    }

    /// Totals read now; per-second rates over the last second or so, up to
    /// now (see [`Daemon::rate_window`]).
    fn stats(&self) -> Result<Value> {
        let now = super::Sample {
            at: std::time::Instant::now(),
            counters: self.enforcer.maps.counters()?,
        };
        let base = self.rate_window();
        stats_of(&self.enforcer.maps, self.enforcer.iface(), |r| {
            let prev = base?;
            let dt = now.at.duration_since(prev.at).as_secs_f64().max(1e-3);
            let (a, b) = (now.counters[r as usize], prev.counters[r as usize]);
            Some((
                a.packets.saturating_sub(b.packets) as f64 / dt,
                a.bytes.saturating_sub(b.bytes) as f64 / dt,
            ))
        })
    }

    /// Drop counts by source now (`top` reads this twice).
    fn drops(&self) -> Result<Value> {
        drops_of(&self.enforcer.maps, self.enforcer.iface())
    }
}

/// The longest `--for`: ten years (a longer ban is a permanent one).
const FOR_MAX_MS: u64 = 10 * 366 * 86_400_000;

/// When a change made `--for` this long ends, Unix ms.
fn until(for_ms: Option<u64>) -> Result<Option<u64>> {
    match for_ms {
        None => Ok(None),
        Some(0) => Err(Error::invalid(
            "--for",
            "must be longer than 0, e.g. 10m, 1h or 7d",
        )),
        Some(ms) if ms > FOR_MAX_MS => Err(Error::invalid(
            "--for",
            "at most ten years (3660d); leave --for out for a rule that stays",
        )),
        Some(ms) => Ok(Some(now_ms() + ms)),
    }
}

/// The field `set`'s limit is validated under: errors name the flags the
/// user typed instead (see [`as_typed`]).
const SET: &str = "set";

/// An error of `set`'s validation, with the flag the user typed: `set.rate`
/// is `--rate`, `set.levels[1].rate` the second `--rate`, `set.per-v4`
/// `--per`.
fn as_typed<T>(r: Result<T>) -> Result<T> {
    r.map_err(|e| match e {
        Error::Invalid { field, message } => {
            let path = field.strip_prefix(SET).unwrap_or(&field);
            let path = path.trim_start_matches('.');
            let (level, key) = match path.strip_prefix("levels[") {
                Some(rest) => {
                    let (n, key) = rest.split_once(']').unwrap_or((rest, ""));
                    (n.parse::<usize>().ok(), key.trim_start_matches('.'))
                }
                None => (None, path),
            };
            let flag = match key {
                "" | "rate" => "--rate",
                "rate-burst" | "burst" => "--burst",
                "per" | "per-v4" | "per-v6" => "--per",
                "new-sources" => "--new-sources",
                "new-sources-burst" => "--new-sources-burst",
                "aggregate" => "--aggregate",
                "aggregate-burst" => "--aggregate-burst",
                other => {
                    return Error::Invalid {
                        field: format!("--{}", other.split('.').next_back().unwrap_or(other)),
                        message,
                    };
                }
            };
            let field = match level {
                // The first --rate is the rule's own level.
                Some(n) => format!("{flag} (the {} one)", ordinal(n + 1)),
                None => flag.to_string(),
            };
            Error::Invalid { field, message }
        }
        e => e,
    })
}

fn ordinal(n: usize) -> &'static str {
    match n {
        1 => "first",
        2 => "second",
        3 => "third",
        _ => "next",
    }
}

/// What `set` makes of a rule that is already a limit: what was given
/// changes, the rest stays. A burst that was one second's worth of the old
/// rate follows a new rate; a new algorithm takes none of the old one's
/// parameters; a new `--per` replaces both families' key prefixes.
fn merged(current: Option<&Action>, given: RawLimit) -> Result<RawLimit> {
    let Some(Action::Limit(l)) = current else {
        return Ok(given);
    };
    let as_map = |r: &RawLimit| match serde_json::to_value(r) {
        Ok(Value::Object(m)) => m,
        _ => serde_json::Map::new(),
    };
    let mut base = as_map(&RawLimit::from(&Action::Limit(*l)));
    if given
        .algorithm
        .as_deref()
        .is_some_and(|a| a != l.algo.name())
    {
        for key in [
            "rate",
            "burst",
            "limit",
            "window",
            "refill-every",
            "refill-amount",
            "capacity",
            "quota",
            "period",
            "rate-cap",
            "levels",
        ] {
            base.remove(key);
        }
    }
    if given.rate.is_some() && l.burst == l.rate.default_burst() {
        base.remove("burst");
    }
    if given.aggregate.is_some()
        && l.aggregate
            .is_some_and(|a| a.burst == a.rate.default_burst())
    {
        base.remove("aggregate-burst");
    }
    if given.new_sources.is_some() {
        base.remove("new-sources-burst");
    }
    if given.per.is_some() || given.per_v4.is_some() || given.per_v6.is_some() {
        base.remove("per-v4");
        base.remove("per-v6");
    }
    base.extend(as_map(&given));
    serde_json::from_value(Value::Object(base))
        .map_err(|e| Error::Refused(format!("merging the rule's settings failed: {e}")))
}

/// The smallest byte burst that admits a full-size Ethernet frame (1500
/// bytes of IP and a 14-byte header).
const FULL_FRAME: u64 = 1514;

/// The byte buckets of a limit too small for a full-size frame: (the flag
/// that sets it, its burst).
fn small_byte_bursts(a: Option<&Action>) -> Vec<(&'static str, u64)> {
    let Some(Action::Limit(l)) = a else {
        return Vec::new();
    };
    let bytes = |u: crate::model::rate::Unit| u == crate::model::rate::Unit::Bytes;
    let mut small = Vec::new();
    if bytes(l.rate.unit) && l.algo == crate::model::rules::Algo::Gcra && l.burst < FULL_FRAME {
        small.push(("--burst", l.burst));
    }
    let level_flags = ["--burst (the second one)", "--burst (the third one)"];
    for (flag, k) in level_flags.iter().zip(l.levels.iter().flatten()) {
        if bytes(k.bucket.rate.unit) && k.bucket.burst < FULL_FRAME {
            small.push((*flag, k.bucket.burst));
        }
    }
    if let Some(agg) = &l.aggregate
        && bytes(agg.rate.unit)
        && agg.burst < FULL_FRAME
    {
        small.push(("--aggregate-burst", agg.burst));
    }
    small
}

/// Refuses a byte bucket too small for a full-size frame (such frames would
/// never pass), unless `force`, or it was so already (taken with `--force`
/// before: a change of something else does not ask again).
fn check_byte_bursts(a: &Action, previous: Option<&Action>, force: bool) -> Result<()> {
    if force {
        return Ok(());
    }
    let before = small_byte_bursts(previous);
    let small: Vec<_> = small_byte_bursts(Some(a))
        .into_iter()
        .filter(|s| !before.contains(s))
        .collect();
    match small.first() {
        None => Ok(()),
        Some((flag, burst)) => Err(Error::invalid(
            *flag,
            format!(
                "{burst} bytes is less than one full-size Ethernet frame ({FULL_FRAME} bytes): such frames would never pass; give at least {FULL_FRAME} (leave --burst out for one second's worth), or add --force to take it as it is"
            ),
        )),
    }
}

/// What differs between `before` and `after`: the default rule, the mode,
/// each rule and each list, before and after (null: absent).
fn changes(before: &Rules, after: &Rules) -> Vec<Value> {
    let now = now_ms();
    let (b, a) = (before.effective(), after.effective());
    let mut out = Vec::new();
    if b.default != a.default {
        out.push(json!({
            "cidr": "default",
            "before": describe::action(&b.default, None),
            "after": describe::action(&a.default, None),
        }));
    }
    if b.mode != a.mode {
        out.push(json!({"mode": {"before": b.mode.name(), "after": a.mode.name()}}));
    }
    let selectors: BTreeSet<&Selector> = b.rules.keys().chain(a.rules.keys()).collect();
    for p in selectors {
        let (x, y) = (b.rules.get(p), a.rules.get(p));
        let (ex, ey) = (before.expires(p), after.expires(p));
        if x != y || ex != ey {
            out.push(json!({
                "cidr": p.to_string(),
                "before": x.map(|r| describe::rule(p, r, ex, now)),
                "after": y.map(|r| describe::rule(p, r, ey, now)),
            }));
        }
    }
    let names: BTreeSet<&String> = b.lists.keys().chain(a.lists.keys()).collect();
    for name in names {
        let summary = |l: Option<&List>, at: Option<u64>| {
            l.map(|l| {
                let mut v = json!({
                    "action": l.action,
                    "entries": l.entries.len(),
                    "source": l.source,
                });
                describe::expiry(&mut v, at, now);
                v
            })
        };
        let (x, y) = (b.lists.get(name), a.lists.get(name));
        let (ex, ey) = (before.list_expires(name), after.list_expires(name));
        if x != y || ex != ey {
            out.push(json!({
                "list": name,
                "before": summary(x, ex),
                "after": summary(y, ey),
            }));
        }
    }
    out
}

/// The rules as `ratelimit list` shows them.
pub(crate) fn list_of(rules: &Rules) -> Value {
    let set = rules.effective();
    // In precedence order: by source, and a source's rules in the order
    // they are tried (`order`, from 1).
    let mut order = 0;
    let mut last = None;
    let now = now_ms();
    let listed: Vec<Value> = set
        .rules
        .iter()
        .map(|(p, a)| {
            order = if last == Some(p.source) { order + 1 } else { 1 };
            last = Some(p.source);
            let mut v = describe::rule(p, a, rules.expires(p), now);
            v["order"] = json!(order);
            v["origin"] = json!(rules.origin(p));
            v
        })
        .collect();
    let clock = match set.clock {
        Clock::Precise => {
            "precise: each key admits at most burst + rate × T in any span T".to_string()
        }
        Clock::Coarse => format!(
            "coarse: each key admits at most burst + rate × (T + {}) in any span T (one scheduler tick)",
            fmt_duration(tick_ns())
        ),
    };
    json!({
        "default": describe::action(&set.default, None),
        "dry_run": set.dry_run,
        "mode": set.mode.name(),
        "unjudged": set.unjudged,
        "fragments": set.fragments,
        "malformed": set.malformed,
        "clock": clock,
        "new_states": set.new_states.to_string(),
        "rules": listed,
        "lists": list_summary(rules, &set),
        "live_changes": rules.live.rules.len() + usize::from(rules.live.default.is_some()) + rules.live.lists.len(),
    })
}

/// Each list: its name, action, entries and source, and how many of its
/// entries are shadowed (they have exactly the CIDR of a rule without a
/// match, which wins, or, in a deny list, are equal to or inside an allow
/// list entry, which wins: see `kernel::Maps::apply`).
fn list_summary(rules: &Rules, set: &RuleSet) -> Vec<Value> {
    let allowed = Allowed::of(set.lists.values());
    set.lists
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
            let mut v = json!({
                "name": name,
                "action": l.action,
                "entries": l.entries.len(),
                "shadowed": shadowed,
                "source": l.source,
                "origin": rules.list_origin(name),
            });
            describe::expiry(&mut v, rules.list_expires(name), now_ms());
            v
        })
        .collect()
}

/// Adds each rule's counters (and the default rule's) to a [`list_of`]
/// answer, read from the maps now: `counters.passed.packets`, … by
/// [`RuleCounter`].
pub(crate) fn add_counters(maps: &Maps, data: &mut Value) -> Result<()> {
    let kernel = maps.rules()?;
    let counters = |slot: u32| -> Result<Value> {
        let c = maps.rule_counters(slot)?;
        Ok(Value::Object(
            RuleCounter::ALL
                .iter()
                .zip(c)
                .map(|(k, c)| {
                    (
                        k.name().to_string(),
                        json!({"packets": c.packets, "bytes": c.bytes}),
                    )
                })
                .collect(),
        ))
    };
    data["default"]["counters"] = counters(0)?;
    for r in data["rules"].as_array_mut().into_iter().flatten() {
        let selector = r["cidr"]
            .as_str()
            .and_then(|c| Selector::parse("cidr", c).ok());
        if let Some(rule) = selector.and_then(|p| kernel.get(&p)) {
            r["counters"] = counters(rule.slot)?;
        }
    }
    Ok(())
}

/// Counters by reason from `maps`; `rate` gives a reason's packets and
/// bytes per second.
pub(crate) fn stats_of(
    maps: &Maps,
    iface: &str,
    rate: impl Fn(Reason) -> Option<(f64, f64)>,
) -> Result<Value> {
    let totals = maps.counters()?;
    let by_reason: Vec<Value> = Reason::ALL
        .iter()
        .map(|r| {
            let c = totals[*r as usize];
            let (pps, bps) = rate(*r).map_or((Value::Null, Value::Null), |(p, b)| {
                (describe::number(p), describe::number(b))
            });
            json!({
                "reason": r.name(),
                "packets": c.packets,
                "bytes": c.bytes,
                "packets_per_s": pps,
                "bytes_per_s": bps,
            })
        })
        .collect();
    let events = maps.events()?;
    let events: serde_json::Map<String, Value> = Event::ALL
        .iter()
        .map(|e| (e.name().to_string(), json!(events[*e as usize])))
        .collect();
    Ok(json!({
        "iface": iface,
        "reasons": by_reason,
        "events": events,
    }))
}

/// Drop counts by source now (`top` reads this twice).
pub(crate) fn drops_of(maps: &Maps, iface: &str) -> Result<Value> {
    let mut drops = serde_json::Map::new();
    let mut levels = serde_json::Map::new();
    for entry in maps.drops() {
        let (key, n) = entry?;
        let ip = source_ip(&key.addr);
        let name = if key.prefix == 0 {
            ip.to_string()
        } else {
            format!("{ip}/{}", key.prefix)
        };
        if key.level > 1 {
            levels.insert(name.clone(), json!(key.level));
        }
        let sum = drops.get(&name).and_then(Value::as_u64).unwrap_or(0) + n;
        drops.insert(name, json!(sum));
    }
    Ok(json!({"iface": iface, "drops": drops, "levels": levels}))
}
