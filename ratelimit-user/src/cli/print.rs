//! The daemon's answers as the CLI prints them: a line per change, the rules
//! and their counters, the stats table, status one field a line, top, and
//! `--json`, the answer itself. Called by [`super::run`]'s commands with the
//! answer of the request each sent.

use ratelimit_common::RuleCounter;
use serde::Serialize;
use serde_json::Value;

use crate::{
    model::{
        describe,
        rules::{Fragments, Mode, Unjudged},
    },
    protocol::answer::{
        Change, Explained, FleetTop, JudgeKind, Judged, KeyState, ListChange, RuleView, Rules,
        States, Stats, Status, Top,
        rules::{Counters, Origin},
    },
};

/// An answer as JSON, its fields sorted by name (as a JSON object's).
fn value(answer: &impl Serialize) -> Value {
    serde_json::to_value(answer).expect("answers serialize")
}

/// `--json`: the answer, indented.
pub(super) fn json(answer: &impl Serialize) {
    println!(
        "{}",
        serde_json::to_string_pretty(&value(answer)).expect("serializes")
    );
}

/// `--json` into a pipe, one answer a line.
pub(super) fn json_line(answer: &impl Serialize) {
    println!("{}", value(answer));
}

/// ` (ends in 9m58s)` for something temporary, else nothing.
fn ends(expires_in_s: Option<&serde_json::Number>) -> String {
    match expires_in_s.and_then(serde_json::Number::as_f64) {
        // Read from the pins with no daemon to end it.
        Some(s) if s <= 0.0 => {
            "  (its time is up: enforced until a daemon adopts the program and ends it)".into()
        }
        Some(s) => format!("  (ends in {})", describe::span((s * 1000.0) as u64)),
        None => String::new(),
    }
}

/// What a change command changed, one line each (nothing with `quiet`).
pub(super) fn changes(changes: &[Change], quiet: bool) {
    if quiet {
        return;
    }
    if changes.is_empty() {
        println!("no change (`ratelimit list` shows the rules)");
        return;
    }
    let width = changes
        .iter()
        .filter_map(|c| match c {
            Change::Rule { cidr, .. } | Change::Default { cidr, .. } => Some(cidr.len()),
            Change::List { list, .. } => Some(list.len()),
            Change::Mode { .. } => None,
        })
        .max()
        .unwrap_or(0)
        + 5;
    let list = |l: &ListChange| {
        format!(
            "({}, {} {} from {}{})",
            l.action,
            l.entries,
            if l.entries == 1 { "entry" } else { "entries" },
            l.source,
            ends(l.expires_in_s.as_ref())
        )
    };
    let rule = |r: &RuleView| format!("{}{}", r.action.text, ends(r.expires_in_s.as_ref()));
    for c in changes {
        let (name, before, after) = match c {
            Change::Mode { mode } => {
                println!("mode    {} → {}", mode.before.name(), mode.after.name());
                continue;
            }
            Change::List {
                list: name,
                before,
                after,
            } => (
                format!("list {name}"),
                before.as_ref().map(list),
                after.as_ref().map(list),
            ),
            Change::Rule {
                cidr,
                before,
                after,
            } => (
                cidr.clone(),
                before.as_deref().map(rule),
                after.as_deref().map(rule),
            ),
            Change::Default {
                cidr,
                before,
                after,
            } => (
                cidr.clone(),
                Some(before.text.clone()),
                Some(after.text.clone()),
            ),
        };
        match (before, after) {
            (None, Some(after)) => println!("added   {name:<width$} {after}"),
            (Some(before), None) => println!("removed {name:<width$} {before}"),
            (Some(before), Some(after)) => {
                println!("changed {name:<width$} {after}");
                println!("        {:<width$} (was {before})", "");
            }
            (None, None) => {}
        }
    }
}

/// `ratelimit list`.
pub(super) fn list(data: &Rules) {
    let width = data
        .rules
        .iter()
        .map(|r| r.cidr.len())
        .max()
        .unwrap_or(0)
        .max(18);
    println!("{:<width$} {}", "default", data.default.action.text);
    for r in &data.rules {
        println!(
            "{:<width$} {}{}",
            r.cidr,
            r.action.text,
            ends(r.expires_in_s.as_ref())
        );
    }
    if data.rules.iter().any(|r| !r.matches.is_empty()) {
        println!(
            "(a source's rule: its longest CIDR with a rule that matches the frame; one CIDR's rules are tried top to bottom)"
        );
        let fragments = match data.fragments {
            Fragments::Drop => "dropped",
            Fragments::NextRule => "judged by the next rule",
        };
        println!("(non-first fragments, which show no ports or flags: {fragments})");
    }
    if !data.lists.is_empty() {
        println!();
        let width = data
            .lists
            .iter()
            .map(|l| l.name.len())
            .max()
            .unwrap_or(0)
            .max(20);
        let stats = data.lists.iter().any(|l| l.counters.is_some());
        let frames = |l: &crate::protocol::answer::ListView| match (stats, l.counters) {
            (false, _) => String::new(),
            (true, None) => format!(" {:>12} {:>14}", "-", "-"),
            (true, Some(c)) => format!(" {:>12} {:>14}", c.packets, c.bytes),
        };
        println!(
            "{:<width$} {:<6} {:>9} {:>9}{}  source",
            "list",
            "action",
            "entries",
            "shadowed",
            if stats {
                format!(" {:>12} {:>14}", "frames", "bytes")
            } else {
                String::new()
            }
        );
        for l in &data.lists {
            println!(
                "{:<width$} {:<6} {:>9} {:>9}{}  {}{}{}",
                l.name,
                l.action.to_string(),
                l.entries,
                l.shadowed,
                frames(l),
                l.source,
                if l.origin == Origin::Config {
                    " (config)"
                } else {
                    ""
                },
                ends(l.expires_in_s.as_ref())
            );
        }
        if stats {
            println!(
                "(frames: what each list judged since it was loaded: dropped by a deny list, passed by an allow list)"
            );
        }
        if data.lists.iter().any(|l| l.shadowed > 0) {
            println!(
                "(shadowed: entries with exactly the CIDR of a rule, which wins, and deny entries equal to or inside an allow list entry, which wins)"
            );
        }
    }
    if data.dry_run {
        println!("(dry run: nothing is dropped)");
    }
    if data.mode == Mode::AllowlistOnly {
        println!(
            "(mode allowlist-only: only the allow rules pass, every other frame is dropped; `ratelimit mode normal` ends it)"
        );
    }
    if data.clock.starts_with("coarse") {
        println!("(clock {})", data.clock);
    }
    match data.unjudged {
        Unjudged::NextRule => println!(
            "(unjudged next-rule: IP the program cannot judge, like a SYN in tiny fragments, is judged by the rules that need nothing it hides; the default, drop, is safe against fragmenting attackers)"
        ),
        Unjudged::Pass => println!(
            "(unjudged pass: IP the program cannot judge, like a SYN in tiny fragments, passes; the default, drop, is safe against fragmenting attackers)"
        ),
        Unjudged::Drop => {}
    }
}

/// Each rule's counters (packets), the default rule's first (`list --stats`).
pub(super) fn rule_counters(data: &Rules) {
    let rows: Vec<(&str, Option<&Counters>)> =
        std::iter::once(("default", data.default.counters.as_ref()))
            .chain(
                data.rules
                    .iter()
                    .map(|r| (r.cidr.as_str(), r.counters.as_ref())),
            )
            .collect();
    let width = rows
        .iter()
        .map(|(name, _)| name.len())
        .max()
        .unwrap_or(0)
        .max(18);
    println!();
    println!(
        "{:<width$} {:>12} {:>12} {:>10} {:>10} {:>10} {:>10} {:>10} {:>12}",
        "packets",
        "passed",
        "dropped",
        "level 2",
        "level 3",
        "aggregate",
        "young",
        "new src",
        "would drop"
    );
    for (name, counters) in rows {
        let c = |k: RuleCounter| {
            counters
                .and_then(|c| c.get(k.name()))
                .map_or(0, |c| c.packets)
        };
        println!(
            "{:<width$} {:>12} {:>12} {:>10} {:>10} {:>10} {:>10} {:>10} {:>12}",
            name,
            c(RuleCounter::Passed),
            c(RuleCounter::Dropped),
            c(RuleCounter::Level2Dropped),
            c(RuleCounter::Level3Dropped),
            c(RuleCounter::AggregateDropped),
            c(RuleCounter::AggregateYoungDropped),
            c(RuleCounter::NewSourceDropped),
            c(RuleCounter::WouldDrop),
        );
    }
    println!(
        "(dropped: at the rule's own key level, or by a deny; a source without state dropped by the budget for new sources counts under new src; aggregate: the aggregate was empty, whatever the source; young: a new or young source refused at the aggregate's reserve)"
    );
}

/// `ratelimit stats`.
pub(super) fn stats(data: &Stats) {
    let per_s = |n: &Option<serde_json::Number>| n.as_ref().and_then(|n| n.as_f64()).unwrap_or(0.0);
    println!(
        "{:<18} {:>12} {:>18} {:>14} {:>16}",
        "reason", "packets", "bytes", "packets/s", "bytes/s"
    );
    for r in &data.reasons {
        println!(
            "{:<18} {:>12} {:>18} {:>14.0} {:>16.0}",
            r.reason,
            r.packets,
            r.bytes,
            per_s(&r.packets_per_s),
            per_s(&r.bytes_per_s),
        );
    }
    println!();
    println!("{:<18} {:>12}", "event", "count");
    for (name, n) in &data.events {
        println!("{:<18} {:>12}", name, n);
    }
    let d = &data.drop_log;
    println!();
    println!(
        "{:<18} {:>12} {:>12} {:>12}",
        "drop log", "written", "skipped", "lost"
    );
    let rate = if d.rate == "off" {
        "off".to_string()
    } else {
        format!("{} per CPU", d.rate)
    };
    println!(
        "{:<18} {:>12} {:>12} {:>12}",
        rate, d.written, d.skipped, d.lost
    );
    if !data.crowdsec.is_empty() {
        println!();
        println!(
            "{:<18} {:>12} {:>12} {:>18}",
            "crowdsec origin", "entries", "dropped", "dropped bytes"
        );
        for o in &data.crowdsec {
            println!(
                "{:<18} {:>12} {:>12} {:>18}",
                o.origin, o.entries, o.dropped_packets, o.dropped_bytes
            );
        }
    }
}

/// `bytes` for people: `88.0 MiB`.
pub(super) fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / f64::from(1 << 20))
}

/// `ratelimit status`: one field a line, by name, its value as JSON.
pub(super) fn status(data: &Status) {
    if let Value::Object(fields) = value(data) {
        for (k, v) in fields {
            println!("{k:16} {v}");
        }
    }
}

/// `ratelimit explain`.
pub(super) fn explained(e: &Explained) {
    println!("{}", e.frame);
    println!(
        "  judged by {}: {}",
        judge_name(&e.judged_by),
        e.judged_by.rule
    );
    if e.mode != crate::model::rules::Mode::Normal {
        println!("  does: {} (mode {})", e.action, e.mode.name());
    }
    if let Some(s) = &e.state {
        println!("  {}", state_line(s));
    }
    for b in &e.beaten {
        println!(
            "  not by {} ({}): {}",
            judge_name(&b.judge),
            b.judge.rule,
            b.why
        );
    }
    if !e.not_given.is_empty() {
        println!(
            "  (not given: {}; a rule that needs them was taken as not matching)",
            e.not_given.join(", ")
        );
    }
}

/// `ratelimit get`.
pub(super) fn states(s: &States) {
    if s.states.is_empty() {
        println!("{}: no limit rule holds it", s.source);
    }
    for k in &s.states {
        println!("{}\n  {}", k.rule, state_line(k));
    }
}

/// `rule 198.18.0.0/24`, `list bad 198.18.4.0/24`, `the default rule`.
fn judge_name(j: &Judged) -> String {
    match j.kind {
        JudgeKind::Rule => format!("rule {}", j.name),
        JudgeKind::List => format!("list {}", j.name),
        JudgeKind::Default => "the default rule".into(),
    }
}

/// `key 198.18.0.0/24 (gcra): tracked 12 s, 3 left now` and the like.
fn state_line(k: &KeyState) -> String {
    let tracked = match (k.tracked, k.age_s) {
        (true, Some(age)) => format!(
            "tracked {}",
            crate::model::describe::span((age * 1e3) as u64)
        ),
        (true, None) => "tracked".into(),
        (false, _) => "not tracked (its frames meet the new-source budget; a full bucket)".into(),
    };
    let next = match (k.admitted_now, k.next_admission_in_s) {
        (true, _) => format!("a frame passes now, {} left after it", k.remaining),
        (false, Some(s)) => format!(
            "a frame is dropped now; the next passes in {}",
            crate::model::describe::span((s * 1e3).ceil() as u64)
        ),
        (false, None) => "a frame is dropped now and never passes (a rate of 0)".into(),
    };
    format!("key {} ({}): {tracked}; {next}", k.key, k.algorithm)
}

/// `ratelimit top`.
pub(super) fn top(data: &Top) {
    println!(
        "{:<40} {:>5} {:>14} {:>14}",
        "source", "level", "dropped", "dropped/s"
    );
    for row in &data.top {
        println!(
            "{:<40} {:>5} {:>14} {:>14.0}",
            row.source, row.level, row.dropped, row.dropped_per_s as f64
        );
    }
    if data.top.is_empty() {
        println!(
            "(no drops in the last {:.1} s: every source within its limits)",
            data.window_s
        );
    } else {
        println!(
            "(an estimate: one drop in {s}, picked at random, is counted {s} times; a count near n is within ±2·√(15·n) of the drops in 19 cases of 20)",
            s = ratelimit_common::DROP_SAMPLE
        );
    }
}

/// `ratelimit top --fleet`.
pub(super) fn fleet_top(data: &FleetTop) {
    println!("fleet-wide use, all daemons (from {}):", data.redis);
    println!(
        "{:<24} {:<44} {:>12} {:>12}",
        "rule", "key", "this minute", "last minute"
    );
    for rule in &data.rules {
        println!(
            "{:<24} {:<44} {:>12} {:>12}",
            rule.rule, "(all keys shown)", rule.this_minute, rule.last_minute
        );
        for k in &rule.keys {
            println!(
                "{:<24} {:<44} {:>12} {:>12}",
                "", k.key, k.this_minute, k.last_minute
            );
        }
    }
}

/// `log`'s entries: a line each, as people read them (with `json`, one JSON
/// object a line).
pub(super) fn drop_log_entries(log: &crate::protocol::answer::DropLog, json: bool) {
    use std::io::Write as _;
    let mut out = std::io::stdout().lock();
    for e in &log.entries {
        if json {
            let _ = writeln!(out, "{}", value(e));
            continue;
        }
        let transport = match (&e.proto, e.dport) {
            (Some(p), Some(port)) => format!("{p} {port}"),
            (Some(p), None) => p.clone(),
            _ => "-".into(),
        };
        let reason = if e.dry_run {
            format!("would drop ({})", e.reason)
        } else {
            e.reason.clone()
        };
        let _ = writeln!(
            out,
            "{}  {:<15}  {:<9}  {:<18}  {}  {} bytes",
            e.time,
            e.source.as_deref().unwrap_or("-"),
            transport,
            reason,
            e.rule,
            e.len
        );
    }
    let _ = out.flush();
}

/// `log`'s closing line: the budget and what was logged and skipped.
pub(super) fn drop_log_summary(log: &crate::protocol::answer::DropLog) {
    println!(
        "(drop log {}: {} records written, {} drops skipped over the budget, {} lost to a full ring, since the maps were created)",
        if log.drop_log == "off" {
            "off".to_string()
        } else {
            format!("{} per CPU", log.drop_log)
        },
        log.written,
        log.skipped,
        log.lost
    );
}
