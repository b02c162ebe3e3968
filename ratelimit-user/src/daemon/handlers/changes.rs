//! What differs between two states of the rules: the answer of every change
//! and of a reload, one [`Change`] per default rule, mode, rule and list that
//! differs.

use std::collections::BTreeSet;

use crate::{
    host::clock::now_ms,
    model::overlay::Layers,
    model::{lists::List, rules::Selector},
    protocol::answer::{ActionView, Change, ListChange, ModeChange, RuleView, rules::expiry},
};

/// What differs between `before` and `after`: the default rule, the mode,
/// each rule and each list, before and after (absent: none).
pub(in crate::daemon) fn between(before: &Layers, after: &Layers) -> Vec<Change> {
    let now = now_ms();
    let (b, a) = (before.effective(), after.effective());
    let mut out = Vec::new();
    if b.default != a.default {
        out.push(Change::default_rule(
            ActionView::of(&b.default, None),
            ActionView::of(&a.default, None),
        ));
    }
    if b.mode != a.mode {
        out.push(Change::Mode {
            mode: ModeChange {
                before: b.mode,
                after: a.mode,
            },
        });
    }
    let selectors: BTreeSet<&Selector> = b.rules.keys().chain(a.rules.keys()).collect();
    for p in selectors {
        let (x, y) = (b.rules.get(p), a.rules.get(p));
        let (ex, ey) = (before.expires(p), after.expires(p));
        if x != y || ex != ey {
            out.push(Change::Rule {
                cidr: p.to_string(),
                before: x.map(|r| Box::new(RuleView::of(p, r, ex, now))),
                after: y.map(|r| Box::new(RuleView::of(p, r, ey, now))),
            });
        }
    }
    let names: BTreeSet<&String> = b.lists.keys().chain(a.lists.keys()).collect();
    for name in names {
        let summary = |l: Option<&List>, at: Option<u64>| {
            l.map(|l| {
                let (expires_at, expires_in_s) = expiry(at, now);
                ListChange {
                    action: l.action,
                    entries: l.entries.len(),
                    source: l.source.clone(),
                    expires_at,
                    expires_in_s,
                }
            })
        };
        let (x, y) = (b.lists.get(name), a.lists.get(name));
        let (ex, ey) = (before.list_expires(name), after.list_expires(name));
        if x != y || ex != ey {
            out.push(Change::List {
                list: name.clone(),
                before: summary(x, ex),
                after: summary(y, ey),
            });
        }
    }
    out
}
