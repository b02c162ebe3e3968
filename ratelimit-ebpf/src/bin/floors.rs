//! Benchmark floors, built into their own object (`floors`), never attached by
//! the daemon:
//! - `floor_drop`: XDP_DROP and nothing else — the cost of running any program;
//! - `floor_lru`: reads the IPv4 source at a fixed offset, looks it up in an LRU
//!   hash and bumps the value in place (inserting on a miss) — the floor for any
//!   stateful per-source limiter.
#![cfg_attr(target_arch = "bpf", no_std)]
#![cfg_attr(target_arch = "bpf", no_main)]

#[cfg(target_arch = "bpf")]
mod floors {
    use aya_ebpf::{
        bindings::xdp_action,
        macros::{map, xdp},
        maps::LruHashMap,
        programs::XdpContext,
    };
    use network_types::{eth::EthHdr, ip::Ipv4Hdr};

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
