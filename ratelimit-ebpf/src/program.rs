//! Fail-open or fail-closed, decided here and only here:
//! - frames we cannot read as IP (not IP, truncated, malformed): **pass**, counted;
//!   malformed IP is dropped instead when the daemon sets `DROP_MALFORMED`.
//! - a new source whose state cannot be stored: **pass** (its first packet would be
//!   admitted anyway: a new bucket is full), counted as `state_failed`.
//! - compare-and-swap retries exhausted on one key: **drop**, counted as
//!   `contended`; each failed retry means another CPU was admitted on that key in
//!   between, so it is being flooded.
//! - the default rule missing (cannot happen for an array map): **pass**.
//! - dry run (global or per rule): nothing is dropped for a limit or a deny rule;
//!   what would have been is counted as `would_drop`.

use core::{
    intrinsics::{AtomicOrdering, atomic_cxchg, atomic_xadd, atomic_xchg},
    mem::size_of,
    ptr::read_volatile,
};

use aya_ebpf::{
    bindings::{BPF_NOEXIST, xdp_action},
    helpers::bpf_ktime_get_ns,
    macros::{map, xdp},
    maps::{Array, LpmTrie, LruHashMap, PerCpuArray, lpm_trie::Key},
    programs::XdpContext,
};
use aya_log_ebpf::warn;
use network_types::{
    eth::{EthHdr, EtherType},
    ip::{Ipv4Hdr, Ipv6Hdr},
    vlan::VlanHdr,
};
use ratelimit_common::{
    Addr, CAS_RETRIES, Config, Counter, DEFAULT_RULES_CAPACITY, DEFAULT_STATE_CAPACITY,
    DROPS_CAPACITY, FlowKey, REASON_COUNT, Reason, Rule, V4_MAPPED_BITS, action, config_flags,
    gcra, is_v4_mapped, map_v4, mask_addr, rule_flags,
};
use ratelimit_common::{
    DEFAULT_WIDE_CAPACITY, DROP_SAMPLE, LOCK_RETRIES, WideState, algorithm, fixed_window, interval,
    rolling_quota, sliding_log, sliding_window,
};

// Map names must equal the `MAP_*` consts of ratelimit-common (a test checks).
#[map(name = "RL_RULES")]
static RL_RULES: LpmTrie<Addr, Rule> = LpmTrie::with_max_entries(DEFAULT_RULES_CAPACITY, 0);

#[map(name = "RL_DEFAULT")]
static RL_DEFAULT: Array<Rule> = Array::with_max_entries(1, 0);

#[map(name = "RL_STATE")]
static RL_STATE: LruHashMap<FlowKey, gcra::State> =
    LruHashMap::with_max_entries(DEFAULT_STATE_CAPACITY, 0);

#[map(name = "RL_STATS")]
static RL_STATS: PerCpuArray<Counter> = PerCpuArray::with_max_entries(REASON_COUNT, 0);

#[map(name = "RL_CONFIG")]
static RL_CONFIG: Array<Config> = Array::with_max_entries(1, 0);

#[map(name = "RL_WIDE")]
static RL_WIDE: LruHashMap<FlowKey, WideState> =
    LruHashMap::with_max_entries(DEFAULT_WIDE_CAPACITY, 0);

#[map(name = "RL_WIDE_ZERO")]
static RL_WIDE_ZERO: PerCpuArray<WideState> = PerCpuArray::with_max_entries(1, 0);

#[map(name = "RL_DROPS")]
static RL_DROPS: LruHashMap<Addr, u64> = LruHashMap::with_max_entries(DROPS_CAPACITY, 0);

const ETH_P_8021Q: u16 = EtherType::Ieee8021q as u16;
const ETH_P_8021AD: u16 = EtherType::Ieee8021ad as u16;
const ETH_P_IP: u16 = EtherType::Ipv4 as u16;
const ETH_P_IPV6: u16 = EtherType::Ipv6 as u16;
/// VLAN tags we look through (802.1Q inside 802.1ad is QinQ).
const MAX_VLAN_TAGS: usize = 2;
const EEXIST: i32 = 17;

/// What parsing found.
enum Parsed {
    /// The frame's source address (IPv4-mapped for IPv4).
    Source(Addr),
    /// Not an IP frame.
    NotIp,
}

/// The verdict before dry run is applied.
struct Outcome {
    reason: Reason,
    /// The rule asked for dry run.
    dry_run: bool,
    /// The frame's source address (zero when not IP).
    source: Addr,
}

impl Outcome {
    const fn of(reason: Reason) -> Self {
        Self {
            reason,
            dry_run: false,
            source: [0; 16],
        }
    }
}

#[xdp]
pub fn ratelimit(ctx: XdpContext) -> u32 {
    let len = (ctx.data_end() - ctx.data()) as u64;
    let config = RL_CONFIG.get(0).copied().unwrap_or_default();
    let mut dropper = None;
    let (reason, action) = match try_ratelimit(&ctx, len, &config) {
        Ok(Outcome {
            reason,
            dry_run,
            source,
        }) => {
            if reason.drops() {
                dropper = Some(source);
                if dry_run || config.flags & config_flags::DRY_RUN != 0 {
                    (Reason::WouldDrop, xdp_action::XDP_PASS)
                } else {
                    (reason, xdp_action::XDP_DROP)
                }
            } else {
                (reason, xdp_action::XDP_PASS)
            }
        }
        Err(Malformed) => {
            let drop = config.flags & config_flags::DROP_MALFORMED != 0
                && config.flags & config_flags::DRY_RUN == 0;
            let action = if drop {
                xdp_action::XDP_DROP
            } else {
                xdp_action::XDP_PASS
            };
            (Reason::Malformed, action)
        }
    };
    let n = count(reason, len);
    // `top` needs drops per source, but a hash update per dropped frame would
    // double the cost of the drop path: one drop in DROP_SAMPLE (per CPU) is
    // credited DROP_SAMPLE times to its source.
    if let Some(source) = dropper
        && n.is_multiple_of(DROP_SAMPLE)
    {
        count_drop(&source, DROP_SAMPLE);
    }
    action
}

/// A truncated or malformed IP frame.
struct Malformed;

#[inline(always)]
fn try_ratelimit(ctx: &XdpContext, len: u64, config: &Config) -> Result<Outcome, Malformed> {
    let source = match parse(ctx)? {
        Parsed::Source(addr) => addr,
        Parsed::NotIp => return Ok(Outcome::of(Reason::NotIp)),
    };
    let mut addr = source;
    let rule = match lookup_rule(&addr, config) {
        Some(rule) => rule,
        None => return Ok(Outcome::of(Reason::Passed)),
    };
    let dry_run = rule.flags & rule_flags::DRY_RUN != 0;
    let reason = match rule.action {
        action::LIMIT => {
            let bits = if is_v4_mapped(&addr) {
                V4_MAPPED_BITS + rule.key_prefix_v4
            } else {
                rule.key_prefix_v6
            };
            mask_addr(&mut addr, bits);
            let key = FlowKey {
                addr,
                rule_id: rule.id,
            };
            let cost = if rule.flags & rule_flags::BYTES != 0 {
                len
            } else {
                1
            };
            // SAFETY: a BPF helper with no preconditions.
            let now = unsafe { bpf_ktime_get_ns() };
            if rule.algorithm == algorithm::GCRA {
                limit(ctx, &key, &rule.gcra(), now, cost)
            } else {
                limit_wide(&key, &rule, now, cost)
            }
        }
        action::DENY => Reason::Denied,
        _ => Reason::Allowed,
    };
    Ok(Outcome {
        reason,
        dry_run,
        source,
    })
}

/// Counts a drop against its source for `ratelimit top`. Only on the drop path.
#[inline(always)]
fn count_drop(source: &Addr, weight: u64) {
    match RL_DROPS.get_ptr_mut(source) {
        // SAFETY: an 8-byte, 8-aligned map value; other CPUs add atomically too.
        Some(n) => unsafe {
            atomic_xadd::<u64, u64, { AtomicOrdering::Relaxed }>(n, weight);
        },
        None => {
            // A lost race with another CPU loses one count: fine for a ranking.
            let _ = RL_DROPS.insert(source, weight, 0);
        }
    }
}

/// The rule for `addr`: the longest matching prefix, else the default rule.
#[inline(always)]
fn lookup_rule(addr: &Addr, config: &Config) -> Option<Rule> {
    if config.rule_count != 0
        && let Some(rule) = RL_RULES.get(Key::new(128, *addr))
    {
        return Some(*rule);
    }
    RL_DEFAULT.get(0).copied()
}

/// Applies the token bucket to `key`: an exact compare-and-swap on the state word.
#[inline(always)]
fn limit(ctx: &XdpContext, key: &FlowKey, params: &gcra::Params, now: u64, cost: u64) -> Reason {
    if let Some(state) = RL_STATE.get_ptr_mut(key) {
        return update(state.cast::<u64>(), params, now, cost);
    }
    // A new source: its bucket starts full.
    let mut fresh = gcra::State::full(now, params);
    if !gcra::decide(&mut fresh, params, now, cost).allowed {
        // A denied arrival stores nothing (cost above the burst, or rate 0).
        return Reason::Limited;
    }
    match RL_STATE.insert(key, fresh, u64::from(BPF_NOEXIST)) {
        Ok(()) => Reason::Passed,
        // Another CPU created it first: decide against what it stored.
        Err(e) if e == -EEXIST => match RL_STATE.get_ptr_mut(key) {
            Some(state) => update(state.cast::<u64>(), params, now, cost),
            None => Reason::StateFailed,
        },
        Err(e) => {
            // Rare: an LRU map evicts rather than fail. Logged for the daemon.
            warn!(
                ctx,
                "storing a new source's bucket failed (error {}); passed", e
            );
            Reason::StateFailed
        }
    }
}

/// Decides against the state at `word` and writes the new state with
/// compare-and-swap, retrying on the value another CPU wrote in between.
#[inline(always)]
fn update(word: *mut u64, params: &gcra::Params, now: u64, cost: u64) -> Reason {
    // SAFETY: `word` points at an 8-byte, 8-aligned map value that stays valid for
    // the program's run (RCU); other CPUs change it only through `cmpxchg`.
    let mut seen = unsafe { read_volatile(word) };
    for _ in 0..CAS_RETRIES {
        let mut next = gcra::State { tat: seen };
        let allowed = gcra::decide(&mut next, params, now, cost).allowed;
        let verdict = if allowed {
            Reason::Passed
        } else {
            Reason::Limited
        };
        if next.tat == seen {
            return verdict;
        }
        // SAFETY: as above.
        let (found, swapped) = unsafe {
            atomic_cxchg::<u64, { AtomicOrdering::SeqCst }, { AtomicOrdering::SeqCst }>(
                word, seen, next.tat,
            )
        };
        if swapped {
            return verdict;
        }
        seen = found;
    }
    Reason::Contended
}

/// Applies a wide-state algorithm to `key`, under the state's lock word.
#[inline(always)]
fn limit_wide(key: &FlowKey, rule: &Rule, now: u64, cost: u64) -> Reason {
    let wide = match RL_WIDE.get_ptr_mut(key) {
        Some(p) => p,
        None => {
            // A new key: a zeroed state is a fresh one for every wide algorithm.
            let Some(zero) = RL_WIDE_ZERO.get_ptr(0) else {
                return Reason::StateFailed;
            };
            // By reference: a 536-byte value would not fit on the 512-byte BPF stack.
            // SAFETY: a valid map value of the same type, read by the helper.
            let zero: &WideState = unsafe { &*zero };
            let _ = RL_WIDE.insert(key, zero, u64::from(BPF_NOEXIST));
            match RL_WIDE.get_ptr_mut(key) {
                Some(p) => p,
                None => return Reason::StateFailed,
            }
        }
    };
    // SAFETY: `wide` is a map value valid for this run; its lock word is only
    // touched atomically, its body only while the lock is held.
    unsafe {
        let lock = &raw mut (*wide).lock;
        let mut held = false;
        for _ in 0..LOCK_RETRIES {
            if atomic_cxchg::<u64, { AtomicOrdering::SeqCst }, { AtomicOrdering::SeqCst }>(
                lock, 0, 1,
            )
            .1
            {
                held = true;
                break;
            }
        }
        if !held {
            return Reason::Contended;
        }
        let body = (&raw mut (*wide).body).cast::<u8>();
        let params = &rule.params;
        let allowed = match rule.algorithm {
            algorithm::INTERVAL => {
                interval::decide(&mut *body.cast(), &params.interval, now, cost).allowed
            }
            algorithm::FIXED_WINDOW => {
                fixed_window::decide(&mut *body.cast(), &params.fixed_window, now, cost).allowed
            }
            algorithm::SLIDING_LOG => {
                sliding_log::decide(&mut *body.cast(), &params.sliding_log, now, cost).allowed
            }
            algorithm::SLIDING_WINDOW => {
                sliding_window::decide(&mut *body.cast(), &params.sliding_window, now, cost).allowed
            }
            algorithm::ROLLING_QUOTA => {
                rolling_quota::decide(&mut *body.cast(), &params.rolling_quota, now, cost).allowed
            }
            // An algorithm this program does not know: fail open.
            _ => true,
        };
        atomic_xchg::<u64, { AtomicOrdering::SeqCst }>(lock, 0);
        if allowed {
            Reason::Passed
        } else {
            Reason::Limited
        }
    }
}

/// Counts the frame under `reason`; returns this CPU's count for it.
#[inline(always)]
fn count(reason: Reason, len: u64) -> u64 {
    match RL_STATS.get_ptr_mut(reason as u32) {
        // SAFETY: a per-CPU slot, written only by this CPU.
        Some(counter) => unsafe {
            (*counter).packets += 1;
            (*counter).bytes += len;
            (*counter).packets
        },
        None => 0,
    }
}

/// A pointer to a `T` at `offset` bytes into the frame, if the frame is long enough.
#[inline(always)]
fn ptr_at<T>(ctx: &XdpContext, offset: usize) -> Result<*const T, Malformed> {
    let start = ctx.data();
    if start + offset + size_of::<T>() > ctx.data_end() {
        return Err(Malformed);
    }
    Ok((start + offset) as *const T)
}

/// Ethernet, up to two VLAN tags, then the source address of IPv4 or IPv6.
#[inline(always)]
fn parse(ctx: &XdpContext) -> Result<Parsed, Malformed> {
    let eth: *const EthHdr = ptr_at(ctx, 0)?;
    // SAFETY: ptr_at checked the bounds.
    let mut ether_type = unsafe { (*eth).ether_type };
    let mut offset = EthHdr::LEN;
    for _ in 0..MAX_VLAN_TAGS {
        if ether_type != ETH_P_8021Q && ether_type != ETH_P_8021AD {
            break;
        }
        let vlan: *const VlanHdr = ptr_at(ctx, offset)?;
        // SAFETY: ptr_at checked the bounds.
        ether_type = unsafe { (*vlan).ether_type };
        offset += VlanHdr::LEN;
    }
    let frame_len = ctx.data_end() - ctx.data();
    if ether_type == ETH_P_IP {
        let ip: *const Ipv4Hdr = ptr_at(ctx, offset)?;
        // SAFETY: ptr_at checked the bounds.
        let ip = unsafe { &*ip };
        let header_len = usize::from(ip.ihl());
        let total_len = usize::from(u16::from_be_bytes(ip.tot_len));
        if ip.version() != 4
            || header_len < Ipv4Hdr::LEN
            || total_len < header_len
            || offset + total_len > frame_len
        {
            return Err(Malformed);
        }
        Ok(Parsed::Source(map_v4(ip.src_addr)))
    } else if ether_type == ETH_P_IPV6 {
        let ip: *const Ipv6Hdr = ptr_at(ctx, offset)?;
        // SAFETY: ptr_at checked the bounds.
        let ip = unsafe { &*ip };
        let payload_len = usize::from(u16::from_be_bytes(ip.payload_len));
        if ip.version() != 6 || offset + Ipv6Hdr::LEN + payload_len > frame_len {
            return Err(Malformed);
        }
        Ok(Parsed::Source(ip.src_addr))
    } else {
        Ok(Parsed::NotIp)
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
