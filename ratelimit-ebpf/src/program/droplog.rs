//! The drop log: a dropped frame (or a would-drop under dry run) written as a
//! [`DropRecord`] into the ring buffer for `ratelimit log`, within a budget of
//! records per second per CPU; what exceeds it is counted, never written.
//!
//! Enters: the frame, where its IP header starts (0: none), the reason, its
//! rule's index, the budget's rate. Leaves: the record, and this CPU's
//! counts (written, skipped, lost) in `RL_DROP_LOG_BUDGET`. Called by the
//! entry ([`super::ratelimit`]) once the verdict is a drop, only when the log
//! is on, through the global function [`rl_drop_log`].
//!
//! Cost: a drop over the budget pays one per-CPU lookup, `bpf_jiffies64`
//! (inlined by the JIT: a load) and a compare; the coarse clock only once a
//! tick and for a record written (`admit_in_tick`); the frame's headers are
//! read again only for a record that is written.

use core::ptr::read_volatile;

use aya_ebpf::{
    bindings::xdp_md,
    helpers::{bpf_jiffies64, bpf_ktime_get_coarse_ns, bpf_ktime_get_ns},
    programs::XdpContext,
};
use ratelimit_common::{DropRecord, NO_RULE, admit_in_tick, drop_log_flags};

use super::{
    maps::{RL_DROP_LOG, RL_DROP_LOG_BUDGET, RL_RULE_TABLE},
    parse::{Flow, IPPROTO_TCP, IPPROTO_UDP, L4_HEADER, L4_NONE, transport},
};

/// [`rl_drop_log`]'s `what`: the IP header's offset in its low byte (0: the
/// frame has none to read), this bit for dry run, the reason from bit 16.
pub(crate) const WHAT_DRY_RUN: u64 = 1 << 8;
/// Where the reason is in [`rl_drop_log`]'s `what`.
pub(crate) const WHAT_REASON_SHIFT: u64 = 16;

/// Logs the dropped frame if this CPU's budget of `rate` records a second
/// allows (1 if written, else 0). `what` packs the IP header's offset, dry
/// run and the reason ([`WHAT_DRY_RUN`]); `rule` is the judging rule's index
/// in the rule table (or [`NO_RULE`]); `len` the frame's length.
///
/// A global function: verified once, apart from the paths that lead here,
/// which see only a number come back.
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn rl_drop_log(ctx: *mut xdp_md, what: u64, len: u64, rule: u32, rate: u32) -> u32 {
    let Some(budget) = RL_DROP_LOG_BUDGET.get_ptr_mut(0) else {
        return 0;
    };
    // SAFETY: a per-CPU slot, written only by this CPU.
    let budget = unsafe { &mut *budget };
    // SAFETY: a helper with no preconditions.
    let tick = unsafe { bpf_jiffies64() };
    // SAFETY: a helper with no preconditions (the budget needs no precision:
    // the last tick's time, read only once the tick has moved).
    let coarse = || unsafe { bpf_ktime_get_coarse_ns() };
    if !admit_in_tick(budget, tick, coarse, rate) {
        budget.skipped += 1;
        return 0;
    }
    // Masked after a volatile read (see `rl_host_connection`): the IP header
    // starts within 64 bytes.
    // SAFETY: a local.
    let what = unsafe { read_volatile(&what) };
    let l3 = (what & 63) as usize;
    let mut record = DropRecord {
        // SAFETY: a helper with no preconditions.
        time_ns: unsafe { bpf_ktime_get_ns() },
        rule_id: NO_RULE,
        rule_slot: NO_RULE,
        len: len as u32,
        reason: (what >> WHAT_REASON_SHIFT) as u8,
        flags: if what & WHAT_DRY_RUN != 0 {
            drop_log_flags::DRY_RUN
        } else {
            0
        },
        ..DropRecord::default()
    };
    if let Some(r) = RL_RULE_TABLE.get(rule) {
        record.rule_id = r.id;
        record.rule_slot = r.slot;
    }
    if l3 != 0 {
        let mut flow = Flow::unread();
        let read = transport(&XdpContext::new(ctx), l3, &mut flow);
        record.source = flow.source;
        record.family = flow.family;
        if read.is_ok() && flow.status != L4_NONE {
            record.proto = flow.proto;
            record.flags |= drop_log_flags::PROTO;
            if flow.status == L4_HEADER && (flow.proto == IPPROTO_TCP || flow.proto == IPPROTO_UDP)
            {
                record.dport = u16::from_be(flow.dport);
                record.flags |= drop_log_flags::PORT;
            }
        }
    }
    if RL_DROP_LOG.output::<DropRecord>(&record, 0).is_ok() {
        budget.written += 1;
        1
    } else {
        budget.lost += 1;
        0
    }
}
