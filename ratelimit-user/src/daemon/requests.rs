//! What each control request does. Changes edit the live layer of the rules
//! (see [`super::store`]) and are applied whole or not at all; reads answer
//! from the maps.

use ratelimit_common::{Event, Reason};
use serde_json::{Value, json};

use super::{Daemon, store::Rules};
use crate::{
    control::Request,
    error::{Error, Result},
    kernel::InterfaceState,
    lists::{Allowed, List, ListAction, check_name},
    rules::{Action, Clock, Limit, RuleSet, Selector, fmt_duration, source_ip, tick_ns},
};

impl Daemon {
    /// Applies a change to the live layer; answers with the rules.
    fn change(&mut self, edit: impl FnOnce(&mut Rules) -> Result<()>) -> Result<Value> {
        let mut next = self.rules.clone();
        edit(&mut next)?;
        self.apply(next)?;
        Ok(self.list())
    }

    pub(super) fn handle(&mut self, request: Request) -> Result<Value> {
        match request {
            Request::Set { target, limit } => {
                if target == "default" {
                    // Keep the daemon's key prefixes unless the request sets them.
                    let mut limit = *limit;
                    if let Action::Limit(current) = self.rules.effective().default {
                        limit.per_v4 = limit.per_v4.or(Some(current.per_v4));
                        limit.per_v6 = limit.per_v6.or(Some(current.per_v6));
                    }
                    let action = limit.validate("default", None)?;
                    self.change(|r| {
                        r.live.default = Some(action);
                        Ok(())
                    })
                } else {
                    let prefix = Selector::parse("CIDR", &target)?;
                    let action =
                        limit.validate(&prefix.to_string(), Some(prefix.source.addr.is_ipv4()))?;
                    self.change(|r| {
                        r.live.rules.insert(prefix, Some(action));
                        Ok(())
                    })
                }
            }
            Request::Allow { cidr } => {
                let prefix = Selector::parse("CIDR", &cidr)?;
                self.change(|r| {
                    r.live.rules.insert(prefix, Some(Action::Allow));
                    Ok(())
                })
            }
            Request::Deny { cidr } => {
                let prefix = Selector::parse("CIDR", &cidr)?;
                self.change(|r| {
                    r.live
                        .rules
                        .insert(prefix, Some(Action::Deny { dry_run: false }));
                    Ok(())
                })
            }
            Request::Unset { cidr } => {
                let prefix = Selector::parse("CIDR", &cidr)?;
                self.change(|r| {
                    if !r.effective().rules.contains_key(&prefix) {
                        return Err(Error::invalid(
                            "CIDR",
                            format!("no rule for {prefix}; `ratelimit list` shows the rules"),
                        ));
                    }
                    if r.base.rules.contains_key(&prefix) {
                        // A rule of the config file: removed until reload --replace.
                        r.live.rules.insert(prefix, None);
                    } else {
                        r.live.rules.remove(&prefix);
                    }
                    Ok(())
                })
            }
            Request::LoadList {
                name,
                action,
                source,
                text,
            } => {
                let started = std::time::Instant::now();
                check_name("--name", &name)?;
                let (list, parsed) = List::parse("--from", action, &source, &text)?;
                let replaced = self.rules.effective().lists.get(&name).map(|l| l.action);
                let mut data = self.change(|r| {
                    r.live.lists.insert(name.clone(), Some(list));
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
                data["loaded"] = json!({
                    "name": name,
                    "action": action,
                    "source": source,
                    "lines": parsed.lines,
                    "entries": parsed.entries.len(),
                    "duplicates": parsed.duplicates,
                    "replaced": replaced.is_some(),
                    "applied_ms": ms as u64,
                    "summary": format!(
                        "{verb} {} entries from {source}{dups}; applied in {ms} ms",
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
                    r.live.lists.insert(name, None);
                } else {
                    r.live.lists.remove(&name);
                }
                Ok(())
            }),
            Request::Mode { mode } => self.change(|r| {
                r.live.mode = Some(mode);
                Ok(())
            }),
            Request::Reload { replace } => {
                self.reload(replace)?;
                Ok(self.list())
            }
            Request::List => Ok(self.list()),
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
        let set = self.rules.effective();
        // In precedence order: by source, and a source's rules in the order
        // they are tried (`order`, from 1).
        let mut order = 0;
        let mut last = None;
        let rules: Vec<Value> = set
            .rules
            .iter()
            .map(|(p, a)| {
                order = if last == Some(p.source) { order + 1 } else { 1 };
                last = Some(p.source);
                json!({
                    "cidr": p.to_string(),
                    "source": p.source.to_string(),
                    "match": p.matches.to_string(),
                    "order": order,
                    "rule": a.to_string(),
                    "origin": self.rules.origin(p),
                })
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
        let lists = self.list_summary(&set);
        json!({
            "default": set.default.to_string(),
            "dry_run": set.dry_run,
            "mode": set.mode.name(),
            "unjudged": set.unjudged,
            "malformed": set.malformed,
            "clock": clock,
            "new_states": set.new_states.to_string(),
            "rules": rules,
            "lists": lists,
            "live_changes": self.rules.live.rules.len() + usize::from(self.rules.live.default.is_some()) + self.rules.live.lists.len(),
        })
    }

    /// Each list: its name, action, entries and source, and how many of its
    /// entries are shadowed (they have exactly the CIDR of a rule without a
    /// match, which wins, or, in a deny list, are equal to or inside an allow
    /// list entry, which wins: see `kernel::Maps::apply`).
    fn list_summary(&self, set: &RuleSet) -> Vec<Value> {
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
                json!({
                    "name": name,
                    "action": l.action,
                    "entries": l.entries.len(),
                    "shadowed": shadowed,
                    "source": l.source,
                    "origin": self.rules.list_origin(name),
                })
            })
            .collect()
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

    /// Totals read now; per-second rates over the last sampling interval.
    fn stats(&self) -> Result<Value> {
        let totals = self.enforcer.maps.counters()?;
        let last = &self.last;
        let rate = |r: Reason| match &self.prev {
            Some(prev) => {
                let dt = last.at.duration_since(prev.at).as_secs_f64().max(1e-9);
                let (a, b) = (last.counters[r as usize], prev.counters[r as usize]);
                (
                    (a.packets - b.packets) as f64 / dt,
                    (a.bytes - b.bytes) as f64 / dt,
                )
            }
            None => (0.0, 0.0),
        };
        let by_reason: Vec<Value> = Reason::ALL
            .iter()
            .map(|r| {
                let c = totals[*r as usize];
                let (pps, bps) = rate(*r);
                json!({
                    "reason": r.name(),
                    "packets": c.packets,
                    "bytes": c.bytes,
                    "packets_per_s": pps,
                    "bytes_per_s": bps,
                })
            })
            .collect();
        let events = self.enforcer.maps.events()?;
        let events: serde_json::Map<String, Value> = Event::ALL
            .iter()
            .map(|e| (e.name().to_string(), json!(events[*e as usize])))
            .collect();
        Ok(json!({
            "iface": self.enforcer.iface(),
            "reasons": by_reason,
            "events": events,
        }))
    }

    /// Drop counts by source now (`top` reads this twice).
    fn drops(&self) -> Result<Value> {
        let mut drops = serde_json::Map::new();
        let mut levels = serde_json::Map::new();
        for entry in self.enforcer.maps.drops() {
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
        Ok(json!({"iface": self.enforcer.iface(), "drops": drops, "levels": levels}))
    }
}
