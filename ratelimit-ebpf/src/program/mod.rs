//! The `ratelimit` XDP program. A frame meets the stages in the order of
//! this table, one module each:
//!
//! | module | what enters → what leaves |
//! |---|---|
//! | [`mod@parse`] | the frame → its source address, where its IP header starts, whether it can be judged (Ethernet, VLAN tags, IPv4, IPv6 and its extension headers, fragments); the transport fields for the stages that match on them |
//! | [`classify`] | the source (and the transport fields, for a prefix with match groups) → the rule |
//! | [`limit`] | a frame under a limit rule → its key, the key's state, the [`Reason`] |
//! | [`key`] | what the limit's stages share: a key's masks, one GCRA level, the target a state leads to |
//! | [`untracked`] | a key without state → the doorkeeper's sighting, the new-source budget, or a state of its own |
//! | [`levels`] | the own level and the rule's shared levels (key levels, aggregate) → taken at all of them or at none |
//! | [`aggregate`] | the rule's aggregate bucket and its episodes of pressure (young and established sources) |
//! | [`wide`] | a key under a wide-state algorithm → its decision under the state's lock, by ratelimit-common's one dispatch (`dispatch::wide`) |
//! | [`table`] | an IPv4 key → its slot in the state table (found, or claimed) |
//! | [`bucket`] | one GCRA word → peeked, taken or given back with compare-and-swap |
//! | [`host`] | a frame a limit would drop → whether it belongs to one of the host's own connections |
//! | [`mod@count`] | the verdict → counters by reason and by rule, events, drops for `top` |
//! | [`droplog`] | a drop → a record for `ratelimit log`, within a budget per CPU |
//! | [`fleet`] | a fleet-wide key's frame → what its bucket is charged (its members times over once the daemon's heartbeat is stale), its count for the daemon |
//! | [`clock`] | → now |
//! | [`maps`] | every map, named as ratelimit-common's `MAP_*` consts |
//!
//! This module is the entry: [`ratelimit`] calls three global functions in
//! turn, none under another: [`rl_classify`] (parse and classify: a verdict
//! already made, or the limit rule that judges the frame), [`rl_limit`] for
//! a limit rule, and [`rl_verdict`] (dry run, the host's own connections,
//! the counters and the drop log). Between them the outcome travels as one
//! number ([`code`]), so the entry's own frame stays small: it sits under
//! every chain of calls, and the verifier allows a chain 512 bytes.
//!
//! Fail-open or fail-closed, decided here and only here (for every stage):
//! - frames that are not IP (ARP, LLDP, …; the kernel does not deliver them as
//!   IP either): **pass**, counted `not_ip`.
//! - frames the kernel would deliver as IP but the program cannot judge (more
//!   than `MAX_VLAN_TAGS` VLAN tags, an IPv6 extension header chain longer than
//!   `MAX_EXT_HEADERS`, a tiny or overlapping first fragment): the `unjudged`
//!   policy, **drop** by default (`UNJUDGED_DROP`, counted `unjudged` and
//!   `tiny_fragment`); `next-rule` lets the rules that need nothing they hide
//!   judge them, `pass` passes them.
//! - a non-first fragment (no ports, no TCP flags) under a match that needs
//!   them: the `fragments` policy, the next rule of its source by default (its
//!   first fragment was judged whole, so its datagram cannot be completed past
//!   a rule), or drop (`FRAGMENTS_DROP`).
//! - truncated or malformed IP: **pass**, counted (the kernel drops it too);
//!   dropped instead when the daemon sets `DROP_MALFORMED`.
//! - a source without state is judged by its rule's **new-source budget** (drop
//!   when it is used up, counted as `new_source_limited`); it gets a state of
//!   its own only when the doorkeeper has seen it twice (see
//!   `ratelimit_common::doorkeeper`), and then only within the state-creation
//!   cap.
//! - a promoted source whose state cannot be stored: **pass**, counted as
//!   `state_failed` (an LRU map evicts rather than fail: not seen in practice).
//!   An IPv4 source whose two lines of the state table hold only busy slots
//!   gets no state: judged by the **new-source budget**, counted as the event
//!   `state_full`.
//! - an IPv4 slot claimed by two CPUs at once, or reclaimed between the
//!   lookup and the compare-and-swap: **drop**, counted as `contended`.
//! - compare-and-swap retries exhausted on one key: **drop**, counted as
//!   `contended`; each failed retry means another CPU was admitted on that key in
//!   between, so it is being flooded.
//! - the default rule missing (cannot happen for an array map): **pass**.
//! - dry run (global or per rule): nothing is dropped for a limit or a deny rule;
//!   what would have been is counted as `would_drop`.

mod aggregate;
mod bucket;
mod classify;
mod clock;
mod count;
mod droplog;
mod fleet;
mod host;
mod key;
mod levels;
mod limit;
mod maps;
mod parse;
mod table;
mod untracked;
mod wide;

use core::ptr::read_volatile;

use aya_ebpf::{
    bindings::{xdp_action, xdp_md},
    macros::xdp,
    programs::XdpContext,
};
use aya_log_ebpf::warn;
use ratelimit_common::{
    Config, DROP_SAMPLE, DropKey, Event, NO_RULE, RULE_COUNTERS, Reason, action, addr_of,
    config_flags, drop_sampled, family, rule_flags,
};

use classify::lookup_rule;
use count::{count, count_drop, count_rule, event};
use droplog::{WHAT_DRY_RUN, WHAT_REASON_SHIFT, rl_drop_log};
use host::rl_host_connection;
use key::reason_of;
use levels::level_masked;
use limit::rl_limit;
use maps::{RL_CONFIG, RL_RULE_TABLE};
use parse::{JUDGED, Parsed, TINY, parse, source_at};

/// The verdict before dry run is applied.
struct Outcome {
    reason: Reason,
    /// The rule asked for dry run.
    dry_run: bool,
    /// The rule's counters: its first slot in `RL_RULE_STATS` (`NO_SLOT`
    /// when no rule judged the frame).
    counters: u32,
    /// The rule's index in `RL_RULE_TABLE` (`NO_RULE` when no rule judged
    /// the frame), for the drop log and `top`.
    rule: u32,
    /// Where the IP header starts (0: the frame has none to read), for the
    /// drop log and `top`.
    l3: u8,
}

/// No rule's counters.
pub(crate) const NO_SLOT: u32 = u32::MAX;

impl Outcome {
    const fn of(reason: Reason) -> Self {
        Self {
            reason,
            dry_run: false,
            counters: NO_SLOT,
            rule: NO_RULE,
            l3: 0,
        }
    }
}

/// What [`rl_classify`] answers, in one number (a global function answers a
/// scalar): the reason in bits 0-7 (when a limit is still to judge it,
/// `Passed`), where the IP header starts in bits 8-15 (0: none to read), the
/// family in bits 16-23, [`CODE_MALFORMED`], [`CODE_LIMIT`], and the rule's
/// index in bits 32-63 ([`NO_RULE`]: no rule judged the frame).
const CODE_L3_SHIFT: u64 = 8;
const CODE_FAMILY_SHIFT: u64 = 16;
/// The frame is truncated or malformed IP.
const CODE_MALFORMED: u64 = 1 << 24;
/// A limit rule judges the frame ([`rl_limit`]), then the verdict.
const CODE_LIMIT: u64 = 1 << 25;
const CODE_RULE_SHIFT: u64 = 32;

#[inline(always)]
fn code(reason: Reason, l3: usize, family: u8, rule: u32) -> u64 {
    reason as u64
        | ((l3 as u64) & 0xff) << CODE_L3_SHIFT
        | u64::from(family) << CODE_FAMILY_SHIFT
        | u64::from(rule) << CODE_RULE_SHIFT
}

/// The entry: three stages, each a global function called from here, so
/// that no stage's stack sits under another's. The entry keeps only the
/// frame and a number across the calls; the deepest chain is then this
/// frame, the limit and one of its stages (`rl_untracked`, or `rl_levels`
/// and `rl_level`), within the 512 bytes even where each frame is rounded
/// up to 32 (Linux 6.1; the figures are in `tests/kernels.txt`). A frame
/// that passes is counted here, without the verdict's call.
#[xdp]
pub fn ratelimit(ctx: XdpContext) -> u32 {
    let mut code = rl_classify(ctx.ctx);
    if code & CODE_LIMIT != 0 {
        let len = (ctx.data_end() - ctx.data()) as u64;
        let l3 = (code >> CODE_L3_SHIFT) & 0xff;
        let fam = (code >> CODE_FAMILY_SHIFT) & 0xff;
        let reason = rl_limit(
            ctx.ctx,
            l3,
            fam | (len << 16),
            (code >> CODE_RULE_SHIFT) as u32,
        );
        code = (code & !(0xff | CODE_LIMIT)) | u64::from(reason & 0xff);
    }
    // A frame that passes (most of them) is counted here: nothing of the
    // verdict's (dry run, the host's connections, `top`, the drop log)
    // concerns it, and a call less is a tenth of its cost. The rest go to
    // the verdict.
    let reason = reason_of((code & 0xff) as u32);
    if code & CODE_MALFORMED == 0 && !reason.drops() && reason != Reason::StateFailed {
        let len = (ctx.data_end() - ctx.data()) as u64;
        let index = (code >> CODE_RULE_SHIFT) as u32;
        if index != NO_RULE
            && let Some(rule) = RL_RULE_TABLE.get(index)
        {
            count_rule(rule.slot.wrapping_mul(RULE_COUNTERS), reason, len);
        }
        count(reason, len);
        return xdp_action::XDP_PASS;
    }
    // Two constants: the verifier sees the program answer a verdict.
    if rl_verdict(ctx.ctx, code) == xdp_action::XDP_DROP {
        xdp_action::XDP_DROP
    } else {
        xdp_action::XDP_PASS
    }
}

/// Parse and classify: the frame → the [`code`] of its outcome so far (a
/// verdict already made, or the limit rule that is to judge it).
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn rl_classify(ctx: *mut xdp_md) -> u64 {
    let ctx = XdpContext::new(ctx);
    let Some(config) = RL_CONFIG.get(0) else {
        return code(Reason::Passed, 0, 0, NO_RULE);
    };
    let Ok(Parsed {
        family,
        source,
        l3,
        judged,
    }) = parse(&ctx)
    else {
        return CODE_MALFORMED | code(Reason::Malformed, 0, 0, NO_RULE);
    };
    if judged != JUDGED {
        // Judged here, once, by the policy; nothing below reads `judged`, so
        // the verifier walks the rest once for judged and unjudged frames.
        // Under `next-rule` and `pass` a frame with a source goes on: the
        // rules that need nothing it hides judge it, and a match that needs
        // what it hides counts it ([`rl_select`]).
        let drop = config.flags & config_flags::UNJUDGED_DROP != 0;
        if drop || family == 0 {
            event(Event::Unjudged);
            // Nothing to judge by (no source) is dropped under `next-rule`
            // too; passed only by `pass`, outside allowlist-only mode.
            let pass = !drop
                && config.flags & config_flags::UNJUDGED_PASS != 0
                && config.flags & config_flags::ALLOWLIST_ONLY == 0;
            let reason = if pass {
                Reason::Allowed
            } else if judged == TINY {
                Reason::TinyFragment
            } else {
                Reason::Unjudged
            };
            // With a source, the drop log can say whose it was.
            let l3 = if family != 0 { l3 } else { 0 };
            return code(reason, l3, family, NO_RULE);
        }
    }
    if family == 0 {
        return code(Reason::NotIp, 0, 0, NO_RULE);
    }
    let Some(rule) = lookup_rule(&ctx, l3, family, &source, config) else {
        return code(Reason::Passed, 0, 0, NO_RULE);
    };
    match rule.action {
        action::LIMIT => CODE_LIMIT | code(Reason::Passed, l3, family, rule.index),
        action::DENY => code(Reason::Denied, l3, family, rule.index),
        action::ALLOW => code(Reason::Allowed, l3, family, rule.index),
        // Allowlist-only mode: the daemon marks every other rule so.
        _ => code(Reason::NotAllowed, l3, family, rule.index),
    }
}

/// The verdict: the outcome's [`code`] → `XDP_PASS` or `XDP_DROP`, with dry
/// run applied, the host's own connections spared, and everything counted
/// (by reason, by rule, for `top`, in the drop log).
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn rl_verdict(ctx: *mut xdp_md, code: u64) -> u32 {
    let xdp = XdpContext::new(ctx);
    let len = (xdp.data_end() - xdp.data()) as u64;
    let Some(config) = RL_CONFIG.get(0) else {
        return xdp_action::XDP_PASS;
    };
    let mut dropper = None;
    let (reason, action) = if code & CODE_MALFORMED == 0 {
        let Outcome {
            reason,
            dry_run,
            counters,
            rule,
            l3,
        } = outcome(&xdp, code, config);
        let dry = dry_run || config.flags & config_flags::DRY_RUN != 0;
        let (reason, action) = if reason.drops() {
            // `top` ranks sources and networks: a drop for a shared budget
            // says nothing about the source that happened to meet it.
            // A would-drop is no drop: `top` ranks what is dropped.
            if !dry
                && matches!(
                    reason,
                    Reason::Limited
                        | Reason::Denied
                        | Reason::NotAllowed
                        | Reason::Level2Limited
                        | Reason::Level3Limited
                )
            {
                dropper = Some((rule, l3, reason));
            }
            // The drop log: drops and dry run's would-drops, by the
            // reason that drops (or would); one compare when it is off.
            if config.drop_log_rate != 0 {
                let dry_bit = if dry { WHAT_DRY_RUN } else { 0 };
                rl_drop_log(
                    ctx,
                    u64::from(l3) | dry_bit | (reason as u64) << WHAT_REASON_SHIFT,
                    len,
                    rule,
                    config.drop_log_rate,
                );
            }
            if dry {
                (Reason::WouldDrop, xdp_action::XDP_PASS)
            } else {
                (reason, xdp_action::XDP_DROP)
            }
        } else {
            (reason, xdp_action::XDP_PASS)
        };
        count_rule(counters, reason, len);
        (reason, action)
    } else {
        let drop = config.flags & config_flags::DROP_MALFORMED != 0
            && config.flags & config_flags::DRY_RUN == 0;
        let action = if drop {
            if config.drop_log_rate != 0 {
                // No header to read: neither source nor ports are sure.
                rl_drop_log(
                    ctx,
                    (Reason::Malformed as u64) << WHAT_REASON_SHIFT,
                    len,
                    NO_RULE,
                    config.drop_log_rate,
                );
            }
            xdp_action::XDP_DROP
        } else {
            xdp_action::XDP_PASS
        };
        (Reason::Malformed, action)
    };
    let n = count(reason, len);

    // `top` needs drops per source, but a hash update per dropped frame would
    // double the cost of the drop path: one drop in DROP_SAMPLE, at random, is
    // credited DROP_SAMPLE times to its source.
    if let Some((rule, l3, reason)) = dropper
        && drop_sampled(n, config.hash_seed)
    {
        count_drop(
            &drop_key(&xdp, code, rule, l3, reason),
            DROP_SAMPLE,
            config.hash_seed,
        );
    }
    if reason == Reason::StateFailed {
        warn!(&xdp, "storing a promoted source's state failed; passed");
    }
    action
}

/// The [`Outcome`] of a frame whose [`code`] says no more than its reason,
/// the rule that judged it, and where its IP header starts: the host's own
/// connections spared from a limit's drop.
#[inline(always)]
fn outcome(ctx: &XdpContext, code: u64, config: &Config) -> Outcome {
    let mut reason = reason_of((code & 0xff) as u32);
    let l3 = ((code >> CODE_L3_SHIFT) & 0xff) as usize;
    let index = (code >> CODE_RULE_SHIFT) as u32;
    let rule = if index == NO_RULE {
        None
    } else {
        RL_RULE_TABLE.get(index)
    };
    let Some(rule) = rule else {
        return Outcome {
            l3: l3 as u8,
            ..Outcome::of(reason)
        };
    };
    // A limit never drops the host's own connections; the check is made on
    // the drop path only, so frames within their limit pay nothing for it.
    if reason.drops()
        && reason != Reason::Denied
        && reason != Reason::NotAllowed
        && rule.flags & rule_flags::HOST_CONNECTIONS != 0
        && config.local_ports != 0
        && rl_host_connection(ctx.ctx, l3 as u64, config.local_ports) != 0
    {
        reason = Reason::HostConnection;
    }
    Outcome {
        reason,
        dry_run: rule.flags & rule_flags::DRY_RUN != 0,
        counters: rule.slot.wrapping_mul(RULE_COUNTERS),
        rule: rule.index,
        l3: l3 as u8,
    }
}

/// What a sampled drop is charged to in `top`: the frame's source address,
/// or for a drop at a key level its key (zero when not IP). Read only for
/// the drop that is sampled (one in [`DROP_SAMPLE`]), not for every drop.
#[inline(always)]
fn drop_key(ctx: &XdpContext, code: u64, rule: u32, l3: u8, reason: Reason) -> DropKey {
    let family = ((code >> CODE_FAMILY_SHIFT) & 0xff) as u8;
    // The source read again where the parse read it (the same bytes; `[0;
    // 4]` should they not read again, which they do).
    // SAFETY: a local; see `rl_host_connection` on the mask.
    let at = (unsafe { read_volatile(&l3) } as usize) & 63;
    let source = source_at(ctx, at).unwrap_or([0; 4]);
    // A source is charged whole: prefix 0 stands for all its bits.
    let (mut charged, mut prefix, mut level) = (source, 0u8, 1u8);
    if matches!(reason, Reason::Level2Limited | Reason::Level3Limited)
        && let Some(rule) = RL_RULE_TABLE.get(rule)
    {
        let n = if reason == Reason::Level2Limited {
            0
        } else {
            1
        };
        let lv = &rule.levels[n];
        charged = level_masked(lv, family, &source);
        prefix = if family == family::V4 {
            lv.key_prefix_v4
        } else {
            lv.key_prefix_v6
        };
        level = n as u8 + 2;
    }
    DropKey {
        addr: addr_of(&charged),
        prefix,
        level,
        _pad: [0; 2],
    }
}

#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    // The verifier rejects any reachable panic path, so this is never called.
    loop {}
}

#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 13] = *b"Dual MIT/GPL\0";
