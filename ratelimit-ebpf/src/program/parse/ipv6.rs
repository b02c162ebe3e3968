//! IPv6 extension headers: hop-by-hop, routing, fragment, destination
//! options and AH, walked up to [`MAX_EXT_HEADERS`] from the IPv6 header at
//! `l3` → a [`Chain`]: the transport protocol, where its header starts, where
//! the payload ends, and whether the chain is whole, a fragment, too short or
//! too long.
//!
//! Walked once, by the global function [`rl_walk_ipv6`]; called by the parse
//! ([`rl_ipv6_chain`]: can the frame be judged?) and by
//! [`mod@super::transport`] (where are the ports?).

use core::ptr::read_volatile;

use aya_ebpf::{bindings::xdp_md, programs::XdpContext};
use network_types::ip::Ipv6Hdr;
use ratelimit_common::MAX_EXT_HEADERS;

use super::{
    IPPROTO_TCP, IPV6_MORE_FRAGMENTS, IPV6_OFFSET_MASK, JUDGED, Malformed, TINY, UNJUDGED, ptr_at,
    too_short,
};

/// The shortest IPv6 extension header (and the fragment header's length).
pub(crate) const IPV6_EXT_MIN: usize = 8;
/// IPv6 extension headers, by the next-header value that names them.
pub(crate) const IPV6_HOP_BY_HOP: u8 = 0;
pub(crate) const IPV6_ROUTING: u8 = 43;
pub(crate) const IPV6_FRAGMENT: u8 = 44;
pub(crate) const IPV6_AUTH: u8 = 51;
pub(crate) const IPV6_DEST_OPTIONS: u8 = 60;

/// Whether an IPv6 next-header value names an extension header the program
/// walks.
#[inline(always)]
pub(crate) fn is_extension(next: u8) -> bool {
    matches!(
        next,
        IPV6_HOP_BY_HOP | IPV6_ROUTING | IPV6_FRAGMENT | IPV6_AUTH | IPV6_DEST_OPTIONS
    )
}

/// Where an IPv6 extension header chain ends.
pub(crate) struct Chain {
    /// The transport protocol (the next-header value after the chain).
    pub(crate) proto: u8,
    /// Where its header starts.
    pub(crate) offset: usize,
    /// Where the IP payload ends.
    pub(crate) end: usize,
    /// One of the `CHAIN_*` consts.
    pub(crate) status: u8,
}

/// [`Chain::status`]: the transport header's place is known.
pub(crate) const CHAIN_WHOLE: u8 = 0;
/// A non-first fragment: no transport header in it.
pub(crate) const CHAIN_FRAGMENT: u8 = 1;
/// A first fragment (more follow) too short for its transport header, or cut
/// inside its chain (RFC 7112 wants the whole chain in the first fragment),
/// or a TCP fragment at offset 8: see [`too_short`].
pub(crate) const CHAIN_TINY: u8 = 2;
/// Longer than [`MAX_EXT_HEADERS`].
pub(crate) const CHAIN_TOO_LONG: u8 = 3;
/// Cut short in a frame that is not a fragment (the kernel drops it).
pub(crate) const CHAIN_CUT_SHORT: u8 = 4;

/// Walks the IPv6 extension headers of the frame whose IPv6 header starts at
/// `l3`: hop-by-hop, routing, fragment, destination options, AH.
#[inline(always)]
pub(crate) fn walk(ctx: &XdpContext, l3: usize) -> Result<Chain, Malformed> {
    let ip: *const Ipv6Hdr = ptr_at(ctx, l3)?;
    // SAFETY: ptr_at checked the bounds.
    let (mut next, payload) = unsafe { ((*ip).next_hdr, (*ip).payload_len) };
    let end = l3 + Ipv6Hdr::LEN + usize::from(u16::from_be_bytes(payload));
    let mut offset = l3 + Ipv6Hdr::LEN;
    let mut first_fragment = false;
    let chain = |proto, offset, status| Chain {
        proto,
        offset,
        end,
        status,
    };
    let mut walked = 0;
    while walked < MAX_EXT_HEADERS {
        if !is_extension(next) {
            break;
        }
        let cut = if first_fragment {
            CHAIN_TINY
        } else {
            CHAIN_CUT_SHORT
        };
        if offset + IPV6_EXT_MIN > end {
            return Ok(chain(next, offset, cut));
        }
        let Ok(ext) = ptr_at::<[u8; 4]>(ctx, offset) else {
            return Ok(chain(next, offset, cut));
        };
        // SAFETY: ptr_at checked the bounds.
        let ext = unsafe { *ext };
        match next {
            // Lengths in 8-octet units, not counting the first.
            IPV6_HOP_BY_HOP | IPV6_ROUTING | IPV6_DEST_OPTIONS => {
                offset += (usize::from(ext[1]) + 1) * 8
            }
            // In 4-octet units, not counting the first two.
            IPV6_AUTH => offset += (usize::from(ext[1]) + 2) * 4,
            // IPV6_FRAGMENT
            _ => {
                let word = u16::from_be_bytes([ext[2], ext[3]]);
                let units = (word & IPV6_OFFSET_MASK) >> 3;
                if units != 0 {
                    // A non-first fragment has no transport header.
                    let status = if ext[0] == IPPROTO_TCP && units == 1 {
                        CHAIN_TINY
                    } else {
                        CHAIN_FRAGMENT
                    };
                    return Ok(chain(ext[0], offset, status));
                }
                first_fragment = word & IPV6_MORE_FRAGMENTS != 0;
                offset += IPV6_EXT_MIN;
            }
        }
        next = ext[0];
        walked += 1;
    }
    if is_extension(next) {
        // Still an extension header: the chain is longer than we walk.
        return Ok(chain(next, offset, CHAIN_TOO_LONG));
    }
    let status = if first_fragment && (offset > end || too_short(next, 0, end - offset)) {
        CHAIN_TINY
    } else {
        CHAIN_WHOLE
    };
    Ok(chain(next, offset, status))
}

/// [`walk`] as one number: the status (bits 0-7), the protocol (8-15), where
/// its header starts (16-31) and where the payload ends (32-63);
/// [`CHAIN_CUT_SHORT`] when not even the IPv6 header is there.
///
/// A global function, as [`super::rl_vlan`]: its parser, called from the
/// program, [`crate::program::classify::rl_select`] and
/// [`crate::program::host::rl_host_connection`], is verified once.
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn rl_walk_ipv6(ctx: *mut xdp_md, l3: u64) -> u64 {
    // See `rl_host_connection` on the mask.
    // SAFETY: a local.
    let l3 = (unsafe { read_volatile(&l3) } & 63) as usize;
    match walk(&XdpContext::new(ctx), l3) {
        Ok(c) => {
            u64::from(c.status)
                | u64::from(c.proto) << 8
                | (c.offset as u64 & 0xffff) << 16
                | (c.end as u64) << 32
        }
        Err(Malformed) => u64::from(CHAIN_CUT_SHORT),
    }
}

/// [`rl_walk_ipv6`]'s answer for the frame whose IPv6 header starts at `l3`,
/// unpacked; offsets bounded for the verifier (an offset past 32 KiB is past
/// any frame).
#[inline(always)]
pub(crate) fn walk_ipv6(ctx: &XdpContext, l3: usize) -> Chain {
    let packed = rl_walk_ipv6(ctx.ctx, l3 as u64);
    let offset = (packed >> 16) & 0xffff;
    // SAFETY: a local.
    let offset = (unsafe { read_volatile(&offset) } & 0x7fff) as usize;
    Chain {
        status: packed as u8,
        proto: (packed >> 8) as u8,
        offset,
        end: (packed >> 32) as usize,
    }
}

/// Whether the IPv6 frame whose header starts at `l3`, with an extension
/// header after it, can be judged: [`JUDGED`], [`UNJUDGED`] (a chain longer
/// than [`MAX_EXT_HEADERS`]) or [`TINY`].
///
/// A global function, as [`super::rl_vlan`]: the walk is verified once.
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn rl_ipv6_chain(ctx: *mut xdp_md, l3: u64) -> u32 {
    match rl_walk_ipv6(ctx, l3) as u8 {
        CHAIN_TOO_LONG => UNJUDGED,
        CHAIN_TINY => TINY,
        _ => JUDGED,
    }
}
