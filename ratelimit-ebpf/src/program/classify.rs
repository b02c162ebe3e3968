//! Classify: from the source to its rule. The longest prefix of the source in
//! the active rule trie (else the default rule); where that prefix has rules
//! with matches (destination, protocol, ports, TCP SYN, ICMP type), the first
//! of its match group that matches the frame ([`rl_select`]), or the group's
//! policy for a frame that does not show what a match needs.
//!
//! Enters: the parsed source and the config. Leaves: a reference into the
//! rule table. Called by the entry ([`super::try_ratelimit`]).

use core::ptr::read_volatile;

use aya_ebpf::{bindings::xdp_md, maps::lpm_trie::Key, programs::XdpContext};
use ratelimit_common::{
    Config, Event, FAMILY_BITS, GROUP_BIT, MAX_MATCHES, MAX_PORT_RANGES, MatchEntry, NO_RULE, Rule,
    RuleAddr, Words, match_fields, rule_addr,
};

use super::{
    count::event,
    maps::{RL_GROUPS, RL_RULE_TABLE, RL_RULES, RL_RULES_B},
    parse::{Flow, L4_FRAGMENT, L4_HEADER, L4_NONE, TCP_ACK, TCP_SYN, transport},
};

/// The rule for a frame: the longest prefix matching its source, else the
/// default rule; where that prefix has rules with matches, the first of its
/// group that matches the frame ([`rl_select`]).
/// By reference into the rule table: a rule is 168 bytes, too many to copy per
/// frame, and one map for every rule gives the verifier one kind of pointer
/// (with two, it would verify everything after this twice).
#[inline(always)]
pub(crate) fn lookup_rule(
    ctx: &XdpContext,
    l3: usize,
    fam: u8,
    addr: &Words,
    config: &Config,
) -> Option<&'static Rule> {
    let mut index = config.default_rule;
    if config.rule_count != 0 {
        let key = Key::new(128 + FAMILY_BITS, rule_addr(fam, addr));
        let mut found = if config.active_rules == 0 {
            in_rules_a(&key)
        } else {
            in_rules_b(&key)
        };
        if found != NO_RULE && found & GROUP_BIT != 0 {
            found = rl_select(ctx.ctx, l3 as u64, found & !GROUP_BIT);
        }
        if found != NO_RULE {
            // Both ways here leave the same bounds on the index, so the
            // verifier walks what follows once.
            index = found & !GROUP_BIT;
        }
    }
    RL_RULE_TABLE.get(index)
}

/// The rule index of the longest prefix of `key` in the first trie. Not inlined,
/// nor is [`in_rules_b`]: see [`super::limit::state_v4`].
#[inline(never)]
pub(crate) fn in_rules_a(key: &Key<RuleAddr>) -> u32 {
    match RL_RULES.get(key) {
        Some(i) => *i,
        None => NO_RULE,
    }
}

/// The rule index of the longest prefix of `key` in the second trie.
#[inline(never)]
pub(crate) fn in_rules_b(key: &Key<RuleAddr>) -> u32 {
    match RL_RULES_B.get(key) {
        Some(i) => *i,
        None => NO_RULE,
    }
}

/// The rule index (in [`RL_RULE_TABLE`]) for the frame whose IP header starts
/// at `l3`, from match group `group`: the first entry that matches it; when
/// an entry needs what the frame does not show, the group's `fragments` rule
/// for a non-first fragment, its `unjudged` rule for any other, unless the
/// policy is to go on ([`NO_RULE`]; [`Event::Unjudged`] counted once a
/// frame); [`NO_RULE`] if none matches (the daemon ends every group with an
/// entry that matches everything, so only a group it never wrote).
///
/// A global function, as [`super::host::rl_host_connection`] and for the same
/// reason: the verifier checks it once, and the program sees only a number
/// come back.
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn rl_select(ctx: *mut xdp_md, l3: u64, group: u32) -> u32 {
    // See `rl_host_connection` on the mask.
    // SAFETY: a local.
    let l3 = (unsafe { read_volatile(&l3) } & 63) as usize;
    let Some(g) = RL_GROUPS.get(group) else {
        return NO_RULE;
    };
    let mut flow = Flow::unread();
    let xdp = XdpContext::new(ctx);
    // A transport header cut short leaves the status at what was read before
    // it (`L4_HEADER` is set only once the header is read): the error itself
    // says nothing more.
    let _ = transport(&xdp, l3, &mut flow);
    let policy = if flow.status == L4_FRAGMENT {
        g.fragments
    } else {
        g.unjudged
    };
    let mut counted = false;
    let mut i = 0;
    while i < MAX_MATCHES {
        if i as u32 >= g.count {
            break;
        }
        let e = &g.entries[i];
        match judge(e, &flow) {
            Judged::Yes => return e.rule,
            Judged::No => {}
            Judged::Unknown => {
                if !counted {
                    event(Event::Unjudged);
                    counted = true;
                }
                if policy != NO_RULE {
                    return policy;
                }
            }
        }
        i += 1;
    }
    NO_RULE
}

/// Whether a [`MatchEntry`] matches a frame.
pub(crate) enum Judged {
    Yes,
    No,
    /// It needs what the frame does not show.
    Unknown,
}

/// Judges `flow` by `e`: a field the frame shows that differs is a no, even
/// when another the frame does not show is unknown.
#[inline(always)]
pub(crate) fn judge(e: &MatchEntry, flow: &Flow) -> Judged {
    let fields = e.fields;
    if fields & match_fields::DEST != 0 {
        let mut k = 0;
        while k < 4 {
            if flow.dest[k] & e.dest_mask[k] != e.dest[k] {
                return Judged::No;
            }
            k += 1;
        }
    }
    if fields & (match_fields::PROTO | match_fields::NEEDS_HEADER) == 0 {
        return Judged::Yes;
    }
    if flow.status == L4_NONE {
        return Judged::Unknown;
    }
    if flow.proto != e.proto {
        return Judged::No;
    }
    if fields & match_fields::NEEDS_HEADER == 0 {
        return Judged::Yes;
    }
    if flow.status != L4_HEADER {
        return Judged::Unknown;
    }
    if fields & match_fields::PORTS != 0 && !in_ports(e, u16::from_be(flow.dport)) {
        return Judged::No;
    }
    if fields & match_fields::SYN != 0 && flow.tcp_flags & (TCP_SYN | TCP_ACK) != TCP_SYN {
        return Judged::No;
    }
    if fields & match_fields::ICMP_TYPE != 0 && flow.icmp_type != e.icmp_type {
        return Judged::No;
    }
    Judged::Yes
}

/// Whether `port` is in one of `e`'s port ranges: tried in order, so one
/// range costs what a single range always cost.
#[inline(always)]
fn in_ports(e: &MatchEntry, port: u16) -> bool {
    let mut k = 0;
    while k < MAX_PORT_RANGES {
        if k >= e.port_ranges as usize {
            break;
        }
        let r = &e.ports[k];
        if port >= r.first && port <= r.last {
            return true;
        }
        k += 1;
    }
    false
}
