//! Benchmark floors, built into their own object (`floors`), never attached by
//! the daemon:
//! - `floor_drop`: XDP_DROP and nothing else — the cost of running any program;
//! - `floor_lru`: reads the IPv4 source at a fixed offset, looks it up in an LRU
//!   hash and bumps the value in place (inserting on a miss) — the floor for any
//!   stateful per-source limiter;
//! - `floor_exact`, `floor_table`: the exact floors of an LRU hash and of the
//!   set-associative table the program keeps IPv4 state in (a lookup and one
//!   compare-and-swap);
//! - `floor_count`: XDP_DROP after counting the frame in a per-CPU array — the
//!   drop-throughput floor, which must count what it received;
//! - `gen_tx`: the traffic generator, run with BPF_PROG_RUN in live-frames mode:
//!   gives each frame a source from a counter (IPv4: base + n mod count; IPv6:
//!   the /64 from the counter), fixes the IPv4 checksum, and sends it out with
//!   XDP_TX.
#![cfg_attr(target_arch = "bpf", no_std)]
#![cfg_attr(target_arch = "bpf", no_main)]
#![cfg_attr(target_arch = "bpf", feature(core_intrinsics))]
#![cfg_attr(target_arch = "bpf", allow(internal_features))]

#[cfg(target_arch = "bpf")]
mod floors {
    use aya_ebpf::{
        bindings::xdp_action,
        macros::{map, xdp},
        maps::{Array, LruHashMap, PerCpuArray},
        programs::XdpContext,
    };
    use network_types::{
        eth::{EthHdr, EtherType},
        ip::{Ipv4Hdr, Ipv6Hdr},
    };
    use ratelimit_common::FlowKey;

    /// Frames counted by `floor_count`.
    #[map(name = "FLOOR_COUNT")]
    static FLOOR_COUNT: PerCpuArray<u64> = PerCpuArray::with_max_entries(1, 0);

    /// The generator's per-CPU counters: its runs (0) and the frames it sent
    /// (1).
    #[map(name = "GEN_SEQ")]
    static GEN_SEQ: PerCpuArray<u64> = PerCpuArray::with_max_entries(2, 0);

    /// The generator's settings: (0) the mask applied to the frame counter to
    /// pick a source (the number of sources − 1, a power of two minus one);
    /// (1) send one run in this many (0 and 1: every run), the others dropped
    /// on the generator's own CPU: an even pace below its best.
    #[map(name = "GEN_CFG")]
    static GEN_CFG: Array<u64> = Array::with_max_entries(2, 0);

    /// `floor_lru` plus one read of the clock: what the clock costs here.
    #[xdp]
    pub fn floor_lru_clock(ctx: XdpContext) -> u32 {
        // SAFETY: a helper with no preconditions.
        let now = unsafe { aya_ebpf::helpers::bpf_ktime_get_ns() };
        let start = ctx.data();
        if start + EthHdr::LEN + Ipv4Hdr::LEN > ctx.data_end() {
            return xdp_action::XDP_PASS;
        }
        // SAFETY: bounds checked above.
        let src = unsafe { (*((start + EthHdr::LEN) as *const Ipv4Hdr)).src_addr };
        match FLOOR_LRU.get_ptr_mut(src) {
            // SAFETY: a map value, valid for this run.
            Some(v) => unsafe { *v = now },
            None => {
                let _ = FLOOR_LRU.insert(src, now, 0);
            }
        }
        xdp_action::XDP_DROP
    }

    /// `floor_count` that first reads the frame's source address (IPv4 or
    /// IPv6) and counts it in: what any per-source limiter must do at least,
    /// including fetching the frame's headers from the cache of the CPU that
    /// wrote them.
    #[xdp]
    pub fn floor_parse(ctx: XdpContext) -> u32 {
        let start = ctx.data();
        let end = ctx.data_end();
        let mut sum = 0u64;
        if start + EthHdr::LEN + Ipv6Hdr::LEN <= end {
            // SAFETY: bounds checked above.
            let ether_type = unsafe { (*(start as *const EthHdr)).ether_type };
            if ether_type == EtherType::Ipv4 as u16 {
                // SAFETY: an IPv4 header is shorter than the IPv6 one checked.
                let ip = unsafe { &*((start + EthHdr::LEN) as *const Ipv4Hdr) };
                sum = u64::from(u32::from_ne_bytes(ip.src_addr));
            } else {
                // SAFETY: bounds checked above.
                let ip = unsafe { &*((start + EthHdr::LEN) as *const Ipv6Hdr) };
                let a = ip.src_addr;
                sum = u64::from_ne_bytes([a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7]])
                    ^ u64::from_ne_bytes([a[8], a[9], a[10], a[11], a[12], a[13], a[14], a[15]]);
            }
        }
        if let Some(n) = FLOOR_COUNT.get_ptr_mut(0) {
            // SAFETY: a per-CPU slot. The source is folded in so that the read
            // cannot be optimized away; the count stays exact (`| 1`, then − 0).
            unsafe { *n += (sum | 1) & 1 };
        }
        xdp_action::XDP_DROP
    }

    #[xdp]
    pub fn floor_count(_ctx: XdpContext) -> u32 {
        if let Some(n) = FLOOR_COUNT.get_ptr_mut(0) {
            // SAFETY: a per-CPU slot.
            unsafe { *n += 1 };
        }
        xdp_action::XDP_DROP
    }

    #[xdp]
    pub fn gen_tx(ctx: XdpContext) -> u32 {
        let start = ctx.data();
        let end = ctx.data_end();
        if start + EthHdr::LEN > end {
            return xdp_action::XDP_ABORTED;
        }
        let mask = GEN_CFG.get(0).copied().unwrap_or(0);
        let every = GEN_CFG.get(1).copied().unwrap_or(1);
        let bump = |slot: u32| match GEN_SEQ.get_ptr_mut(slot) {
            // SAFETY: a per-CPU slot.
            Some(p) => unsafe {
                *p += 1;
                *p
            },
            None => 0,
        };
        if every > 1 && bump(0) % every != 0 {
            return xdp_action::XDP_DROP;
        }
        let n = bump(1) & mask;
        // SAFETY: bounds checked above.
        let ether_type = unsafe { (*(start as *const EthHdr)).ether_type };
        if ether_type == EtherType::Ipv4 as u16 {
            if start + EthHdr::LEN + Ipv4Hdr::LEN > end {
                return xdp_action::XDP_ABORTED;
            }
            // SAFETY: bounds checked above.
            let ip = unsafe { &mut *((start + EthHdr::LEN) as *mut Ipv4Hdr) };
            // 198.18.0.0/15: the low 17 bits from the counter.
            let addr = 0xc612_0000u32 | (n as u32 & 0x1_ffff);
            ip.src_addr = addr.to_be_bytes();
            ip.check = [0, 0];
            let words = unsafe { &*((start + EthHdr::LEN) as *const [u16; Ipv4Hdr::LEN / 2]) };
            let mut sum = 0u32;
            for w in words {
                sum += u32::from(u16::from_be(*w));
            }
            sum = (sum & 0xffff) + (sum >> 16);
            sum = (sum & 0xffff) + (sum >> 16);
            ip.check = (!(sum as u16)).to_be_bytes();
        } else if ether_type == EtherType::Ipv6 as u16 {
            if start + EthHdr::LEN + Ipv6Hdr::LEN > end {
                return xdp_action::XDP_ABORTED;
            }
            // SAFETY: bounds checked above.
            let ip = unsafe { &mut *((start + EthHdr::LEN) as *mut Ipv6Hdr) };
            // 2001:db8::/32, the next 32 bits (the /64) from the counter.
            ip.src_addr[4..8].copy_from_slice(&(n as u32).to_be_bytes());
        }
        xdp_action::XDP_TX
    }

    /// The "exact floor": what any exact per-source limiter must do at least —
    /// the same 20-byte key as the limiter's ([`FlowKey`]) looked up in an LRU
    /// hash and its 8-byte value updated with one compare-and-swap.
    #[xdp]
    pub fn floor_exact(ctx: XdpContext) -> u32 {
        exact(&ctx)
    }

    #[inline(always)]
    fn exact(ctx: &XdpContext) -> u32 {
        let start = ctx.data();
        if start + EthHdr::LEN + Ipv4Hdr::LEN > ctx.data_end() {
            return xdp_action::XDP_PASS;
        }
        // SAFETY: bounds checked above.
        let src = unsafe { (*((start + EthHdr::LEN) as *const Ipv4Hdr)).src_addr };
        let key = FlowKey {
            addr: ratelimit_common::map_v4(src),
            rule_id: 0,
        };
        match FLOOR_EXACT.get_ptr_mut(key) {
            // SAFETY: an 8-byte map value, valid for this run; others change it
            // only by compare-and-swap.
            Some(v) => unsafe {
                let seen = core::ptr::read_volatile(v);
                let _ = core::intrinsics::atomic_cxchg::<
                    u64,
                    { core::intrinsics::AtomicOrdering::SeqCst },
                    { core::intrinsics::AtomicOrdering::SeqCst },
                >(v, seen, seen + 1);
            },
            None => {
                let _ = FLOOR_EXACT.insert(key, 1, 0);
            }
        }
        xdp_action::XDP_DROP
    }

    /// The exact floor of the state table the program keeps sources in
    /// (`ratelimit_common::table`): the source's key word and keyed hash, its
    /// slot found in the first of its two 64-byte lines or the second, and
    /// its 8-byte state updated with one compare-and-swap; a missing key
    /// takes an empty slot with one compare-and-swap (no reclaim, no birth
    /// stamp).
    #[xdp]
    pub fn floor_table(ctx: XdpContext) -> u32 {
        table(&ctx)
    }

    /// `floor_table` that counts what it took in, for the live benchmark.
    #[xdp]
    pub fn floor_table_count(ctx: XdpContext) -> u32 {
        if let Some(n) = FLOOR_COUNT.get_ptr_mut(0) {
            // SAFETY: a per-CPU slot.
            unsafe { *n += 1 };
        }
        table(&ctx)
    }

    #[inline(always)]
    fn table(ctx: &XdpContext) -> u32 {
        use ratelimit_common::table as t;
        let start = ctx.data();
        let end = ctx.data_end();
        if start + EthHdr::LEN + Ipv6Hdr::LEN > end {
            return xdp_action::XDP_PASS;
        }
        // SAFETY: bounds checked above.
        let ether_type = unsafe { (*(start as *const EthHdr)).ether_type };
        // The key as the program makes it: IPv4 exact; IPv6 its /64, hashed
        // under a second seed, in lines of its own.
        let (w, kw, region) = if ether_type == EtherType::Ipv4 as u16 {
            // SAFETY: an IPv4 header is shorter than the IPv6 one checked.
            let src = unsafe { (*((start + EthHdr::LEN) as *const Ipv4Hdr)).src_addr };
            let w = ratelimit_common::words(&ratelimit_common::map_v4(src));
            (
                w,
                t::key_word_of(&w, 0),
                t::region(FLOOR_TABLE_LINES / 2 - 1, 0),
            )
        } else {
            // SAFETY: bounds checked above.
            let src = unsafe { (*((start + EthHdr::LEN) as *const Ipv6Hdr)).src_addr };
            let mut w = ratelimit_common::words(&src);
            w[2] = 0;
            w[3] = 0;
            (
                w,
                t::key_word6(&w, 0, 0x5eed),
                t::region(FLOOR_TABLE_LINES / 2 - 1, FLOOR_TABLE_LINES / 2),
            )
        };
        let h = ratelimit_common::doorkeeper::hash_words(&w, 0, 0x5eed);
        let (a, b) = t::region_lines(h, region);
        for n in [a, b] {
            let Some(line) = FLOOR_TABLE.get_ptr_mut(n) else {
                return xdp_action::XDP_DROP;
            };
            let mut i = 0;
            while i < t::WAYS {
                // SAFETY: words of a map value valid for this run; others
                // change them only by compare-and-swap.
                unsafe {
                    let k = core::ptr::read_volatile(&raw const (*line).keys[i]);
                    if k == kw || k == 0 {
                        let word = &raw mut (*line).tats[i];
                        let seen = core::ptr::read_volatile(word);
                        if k == 0 {
                            let _ = core::intrinsics::atomic_cxchg::<
                                u64,
                                { core::intrinsics::AtomicOrdering::SeqCst },
                                { core::intrinsics::AtomicOrdering::SeqCst },
                            >(&raw mut (*line).keys[i], 0, kw);
                        }
                        let _ = core::intrinsics::atomic_cxchg::<
                            u64,
                            { core::intrinsics::AtomicOrdering::SeqCst },
                            { core::intrinsics::AtomicOrdering::SeqCst },
                        >(word, seen, seen + 1);
                        return xdp_action::XDP_DROP;
                    }
                }
                i += 1;
            }
        }
        xdp_action::XDP_DROP
    }

    /// Lines of `FLOOR_TABLE`: the program's default for IPv4 (the first
    /// half) and as many for IPv6.
    const FLOOR_TABLE_LINES: u32 =
        2 * ratelimit_common::state_lines(ratelimit_common::DEFAULT_STATE_CAPACITY);

    #[map(name = "FLOOR_TABLE")]
    static FLOOR_TABLE: Array<ratelimit_common::table::Line> =
        Array::with_max_entries(FLOOR_TABLE_LINES, 0);

    /// `floor_exact` that counts what it took in, for the live benchmark.
    #[xdp]
    pub fn floor_exact_count(ctx: XdpContext) -> u32 {
        if let Some(n) = FLOOR_COUNT.get_ptr_mut(0) {
            // SAFETY: a per-CPU slot.
            unsafe { *n += 1 };
        }
        exact(&ctx)
    }

    /// `floor_lru` plus one `bpf_jiffies64` (inlined by the JIT).
    #[xdp]
    pub fn floor_lru_jiffies(ctx: XdpContext) -> u32 {
        // SAFETY: a helper with no preconditions.
        let now = unsafe { aya_ebpf::helpers::bpf_jiffies64() };
        lru_store(&ctx, now)
    }

    /// `floor_lru` plus one `bpf_ktime_get_coarse_ns`.
    #[xdp]
    pub fn floor_lru_coarse(ctx: XdpContext) -> u32 {
        // SAFETY: a helper with no preconditions.
        let now = unsafe { aya_ebpf::helpers::bpf_ktime_get_coarse_ns() };
        lru_store(&ctx, now)
    }

    #[inline(always)]
    fn lru_store(ctx: &XdpContext, now: u64) -> u32 {
        let start = ctx.data();
        if start + EthHdr::LEN + Ipv4Hdr::LEN > ctx.data_end() {
            return xdp_action::XDP_PASS;
        }
        // SAFETY: bounds checked above.
        let src = unsafe { (*((start + EthHdr::LEN) as *const Ipv4Hdr)).src_addr };
        match FLOOR_LRU.get_ptr_mut(src) {
            // SAFETY: a map value, valid for this run.
            Some(v) => unsafe { *v = now },
            None => {
                let _ = FLOOR_LRU.insert(src, now, 0);
            }
        }
        xdp_action::XDP_DROP
    }

    #[map(name = "FLOOR_EXACT")]
    static FLOOR_EXACT: LruHashMap<FlowKey, u64> =
        LruHashMap::with_max_entries(ratelimit_common::DEFAULT_STATE_CAPACITY, 0);

    #[map(name = "FLOOR_LRU")]
    static FLOOR_LRU: LruHashMap<[u8; 4], u64> =
        LruHashMap::with_max_entries(ratelimit_common::DEFAULT_STATE_CAPACITY, 0);

    #[xdp]
    pub fn floor_drop(_ctx: XdpContext) -> u32 {
        xdp_action::XDP_DROP
    }

    #[xdp]
    pub fn floor_lru(ctx: XdpContext) -> u32 {
        let start = ctx.data();
        if start + EthHdr::LEN + Ipv4Hdr::LEN > ctx.data_end() {
            return xdp_action::XDP_PASS;
        }
        // SAFETY: bounds checked above.
        let src = unsafe { (*((start + EthHdr::LEN) as *const Ipv4Hdr)).src_addr };
        match FLOOR_LRU.get_ptr_mut(src) {
            // SAFETY: a map value, valid for this run.
            Some(v) => unsafe { *v += 1 },
            None => {
                let _ = FLOOR_LRU.insert(src, 1, 0);
            }
        }
        xdp_action::XDP_DROP
    }

    #[panic_handler]
    fn panic(_info: &core::panic::PanicInfo) -> ! {
        loop {}
    }

    #[unsafe(link_section = "license")]
    #[unsafe(no_mangle)]
    static LICENSE: [u8; 13] = *b"Dual MIT/GPL\0";
}

#[cfg(not(target_arch = "bpf"))]
fn main() {
    eprintln!("floors is an XDP object: it builds for bpfel-unknown-none only");
}
