//! `explain` and `get`: which rule judges a frame and why
//! ([`crate::kernel::explain`], over the rules as they are compiled for the
//! kernel), and a source's state under the rules that may judge it, read
//! from the state maps and previewed with the rule's own algorithm on a copy
//! (nothing is written).

use std::net::IpAddr;

use ratelimit_common::{
    self as common, FlowKey, V4_MAPPED_BITS, WIDE_WORDS, algorithm, dispatch, gcra, rule_flags,
};

use crate::{
    daemon::Daemon,
    error::Result,
    kernel::{
        self,
        explain::{self, Judge, Probe},
    },
    model::{
        matching::{Selector, contains, proto_name},
        prefix::Prefix,
        rules::{Action, RuleSet},
    },
    protocol::answer::{Beaten, Explained, JudgeKind, Judged, KeyState, States},
};

impl Daemon {
    /// Which rule judges `probe`'s frame, whom it beat and why, and the
    /// source's state under it.
    pub(super) fn explain(&self, probe: Probe) -> Result<Explained> {
        let set = self.rules.effective();
        let source = probe.source.expect("the CLI gives the source");
        let v = explain::explain(&set, &probe)?;
        let state = match &v.judge {
            Judge::Rule(s) => self.key_state(&set, Some(s), source)?,
            Judge::Default => self.key_state(&set, None, source)?,
            Judge::List(..) => None,
        };
        Ok(Explained {
            frame: frame_text(&probe),
            judged_by: judged(&set, &v.judge),
            action: v.action.text(Some(source.is_ipv4())),
            mode: set.mode,
            beaten: v
                .beaten
                .iter()
                .map(|(j, why)| Beaten {
                    judge: judged(&set, j),
                    why: why.clone(),
                })
                .collect(),
            not_given: v.not_given,
            state,
        })
    }

    /// `source`'s state under every limit rule whose source holds it (the
    /// most specific first), and the default rule's.
    pub(super) fn get(&self, source: IpAddr) -> Result<States> {
        let set = self.rules.effective();
        let host = Prefix {
            addr: source,
            len: if source.is_ipv4() { 32 } else { 128 },
        };
        let mut holding: Vec<&Selector> = set
            .rules
            .keys()
            .filter(|s| contains(&s.source, &host))
            .collect();
        holding.sort_by_key(|s| std::cmp::Reverse(s.source.len));
        let mut states = Vec::new();
        for s in holding {
            states.extend(self.key_state(&set, Some(s), source)?);
        }
        states.extend(self.key_state(&set, None, source)?);
        Ok(States {
            source: source.to_string(),
            states,
        })
    }

    /// `source`'s state under the rule of `selector` (`None`: the default
    /// rule), when that is a limit.
    fn key_state(
        &self,
        set: &RuleSet,
        selector: Option<&Selector>,
        source: IpAddr,
    ) -> Result<Option<KeyState>> {
        let maps = &self.enforcer.maps;
        let (name, rule) = match selector {
            Some(s) => match maps.rules()?.get(s) {
                Some(r) => (s.to_string(), *r),
                None => return Ok(None),
            },
            None => ("default".to_string(), maps.default_rule()?),
        };
        let Some(Action::Limit(limit)) = (match selector {
            Some(s) => set.rules.get(s).copied(),
            None => Some(set.default),
        }) else {
            return Ok(None);
        };
        if rule.action != common::action::LIMIT {
            return Ok(None);
        }
        let v4 = source.is_ipv4();
        let bits = if v4 {
            rule.key_prefix_v4
        } else {
            rule.key_prefix_v6
        };
        let mut addr = match source {
            IpAddr::V4(a) => common::map_v4(a.octets()),
            IpAddr::V6(a) => a.octets(),
        };
        common::mask_addr(&mut addr, if v4 { V4_MAPPED_BITS + bits } else { bits });
        let key = FlowKey {
            addr,
            rule_id: rule.id,
        };
        let now = kernel::program_clock_ns(set.clock);
        // The cost of the smallest frame for a byte rate: what a frame costs
        // at least.
        let cost = if rule.flags & rule_flags::BYTES != 0 {
            64
        } else {
            1
        };
        let (tracked, born, decision) = if rule.algorithm == algorithm::GCRA {
            let found = maps.source_state(&key);
            // A key without a state meets a full bucket of the rule as it is
            // now (the program gives it one when it earns a state): not a
            // zero word, which reads as a state of the rule's earlier
            // generation, converted under the limit it had before a change.
            let mut state = found
                .map(|s| s.gcra)
                .unwrap_or_else(|| gcra::State::full(now, rule.gcra_params()));
            let d = gcra::decide(&mut state, rule.gcra_params(), now, cost);
            (found.is_some(), found.map(|s| s.born), d)
        } else {
            let found = maps.wide_state(&key);
            let mut body = found.map_or([0; WIDE_WORDS], |w| w.body);
            let d = dispatch::wide(
                rule.algorithm,
                dispatch::Op::Decide,
                &mut body,
                &rule.params,
                now,
                cost,
            );
            (found.is_some(), found.map(|w| w.born), d)
        };
        let shown = Prefix {
            addr: source,
            len: if v4 { 32 } else { 128 },
        }
        .widened(bits);
        Ok(Some(KeyState {
            rule: name,
            key: shown.to_string(),
            algorithm: limit.algo.name().to_string(),
            tracked,
            admitted_now: decision.allowed,
            remaining: decision.remaining,
            next_admission_in_s: (decision.retry_after_ns != common::NEVER)
                .then(|| decision.retry_after_ns as f64 / 1e9),
            age_s: born
                .filter(|b| *b != 0)
                .map(|b| now.saturating_sub(b) as f64 / 1e9),
        }))
    }
}

/// A judge as the answer names it.
fn judged(set: &RuleSet, j: &Judge) -> Judged {
    match j {
        Judge::Rule(s) => Judged {
            kind: JudgeKind::Rule,
            name: s.to_string(),
            rule: set.rules[s].text(Some(s.source.addr.is_ipv4())),
        },
        Judge::List(name, action, entry) => Judged {
            kind: JudgeKind::List,
            name: format!("{name} {entry}"),
            rule: format!("{action} list {name}"),
        },
        Judge::Default => Judged {
            kind: JudgeKind::Default,
            name: "default".into(),
            rule: set.default.text(None),
        },
    }
}

/// `udp from 198.18.0.20 to 198.18.0.2 port 27015`, as asked.
fn frame_text(p: &Probe) -> String {
    let mut s = p.proto.map_or("a frame".to_string(), proto_name);
    if let Some(src) = p.source {
        s.push_str(&format!(" from {src}"));
    }
    match (p.dest, p.dport) {
        (Some(to), Some(port)) => s.push_str(&format!(" to {to} port {port}")),
        (Some(to), None) => s.push_str(&format!(" to {to}")),
        (None, Some(port)) => s.push_str(&format!(" to port {port}")),
        (None, None) => {}
    }
    if p.syn {
        s.push_str(" (SYN)");
    }
    if let Some(t) = p.icmp_type {
        s.push_str(&format!(" (ICMP type {t})"));
    }
    s
}
