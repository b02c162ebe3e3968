//! Parse: from the frame to its source. Ethernet, up to [`MAX_VLAN_TAGS`]
//! VLAN tags, then IPv4 (any IHL, its fragment fields) or IPv6 (its extension
//! header chain, walked in [`ipv6`]) → [`Parsed`]: the family rules see, the
//! source address, where the IP header starts, and whether the frame can be
//! judged; a truncated or malformed IP frame → [`Malformed`].
//!
//! Called by the entry ([`super::try_ratelimit`]) once per frame. The global
//! functions that read the header again (the limit, the shared levels, the
//! match groups, the host's connections) find the source with [`source_at`]
//! and the transport fields with [`transport()`]. Every read of the frame goes
//! through the one bounds-checked accessor, [`ptr_at`].

pub(crate) mod ipv6;
pub(crate) mod transport;

use core::{
    mem::size_of,
    ptr::{read_unaligned, read_volatile},
};

use aya_ebpf::{bindings::xdp_md, programs::XdpContext};
use network_types::{
    eth::{EthHdr, EtherType},
    ip::{Ipv4Hdr, Ipv6Hdr},
    vlan::VlanHdr,
};
use ratelimit_common::{MAX_VLAN_TAGS, V4_MAPPED_WORD, Words, family};

use ipv6::{is_extension, rl_ipv6_chain};
pub(crate) use transport::{Flow, L4_FRAGMENT, L4_HEADER, L4_NONE, TCP_ACK, TCP_SYN, transport};

pub(crate) const ETH_P_8021Q: u16 = EtherType::Ieee8021q as u16;
pub(crate) const ETH_P_8021AD: u16 = EtherType::Ieee8021ad as u16;
pub(crate) const ETH_P_IP: u16 = EtherType::Ipv4 as u16;
pub(crate) const ETH_P_IPV6: u16 = EtherType::Ipv6 as u16;

/// What parsing found: the family rules see ([`family`], 0 when not IP;
/// IPv4 for an IPv6 frame from an IPv4-mapped source), the source address
/// words (IPv4-mapped for IPv4), where the IP header starts, and whether the
/// frame can be judged ([`JUDGED`], [`UNJUDGED`], [`TINY`]).
pub(crate) struct Parsed {
    pub(crate) family: u8,
    pub(crate) source: Words,
    pub(crate) l3: usize,
    pub(crate) judged: u32,
}

/// [`Parsed::judged`]: the frame can be judged.
pub(crate) const JUDGED: u32 = 0;
/// More VLAN tags than [`MAX_VLAN_TAGS`], or an IPv6 extension header chain
/// longer than [`ratelimit_common::MAX_EXT_HEADERS`].
pub(crate) const UNJUDGED: u32 = 1;
/// A first fragment too short for the transport header fields rules match
/// on, or a TCP fragment at offset 8 ([`ratelimit_common::Reason::TinyFragment`]).
pub(crate) const TINY: u32 = 2;

/// A truncated or malformed IP frame.
pub(crate) struct Malformed;

/// A pointer to a `T` at `offset` bytes into the frame, if the frame is long enough.
#[inline(always)]
pub(crate) fn ptr_at<T>(ctx: &XdpContext, offset: usize) -> Result<*const T, Malformed> {
    let start = ctx.data();
    if start + offset + size_of::<T>() > ctx.data_end() {
        return Err(Malformed);
    }
    Ok((start + offset) as *const T)
}

/// Ethernet, up to [`MAX_VLAN_TAGS`] VLAN tags ([`rl_vlan`]), then the source
/// address of IPv4 or IPv6, and whether the frame can be judged: IPv4's
/// fragment fields are read here, an IPv6 extension header chain is walked
/// by [`rl_ipv6_chain`].
#[inline(always)]
pub(crate) fn parse(ctx: &XdpContext) -> Result<Parsed, Malformed> {
    let eth: *const EthHdr = ptr_at(ctx, 0)?;
    // SAFETY: ptr_at checked the bounds.
    let mut ether_type = unsafe { (*eth).ether_type };
    let mut offset = EthHdr::LEN as u64;
    if ether_type == ETH_P_8021Q || ether_type == ETH_P_8021AD {
        let found = rl_vlan(ctx.ctx);
        if found == VLAN_CUT_SHORT {
            return Err(Malformed);
        }
        if found == VLAN_TOO_DEEP {
            return Ok(Parsed {
                family: 0,
                source: [0; 4],
                l3: 0,
                judged: UNJUDGED,
            });
        }
        ether_type = found as u16;
        offset = u64::from(found >> 16);
    }
    // The IP header starts within 64 bytes (14 + 8 tags of 4). Masked after
    // a volatile read, as in `rl_host_connection`: the verifier must see the
    // bound on the very register the packet pointer is added to.
    // SAFETY: a local.
    let offset = (unsafe { read_volatile(&offset) } & 63) as usize;
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
        let frags = u16::from_be_bytes(ip.frags);
        let judged = if frags & (IPV4_MORE_FRAGMENTS | IPV4_OFFSET_MASK) != 0 {
            rl_ipv4_fragment(ctx.ctx, offset as u64)
        } else {
            JUDGED
        };
        // SAFETY: ptr_at checked the bounds; packet loads may be unaligned.
        let src = unsafe { core::ptr::read_unaligned(ip.src_addr.as_ptr().cast::<u32>()) };
        Ok(Parsed {
            family: family::V4,
            source: [0, 0, V4_MAPPED_WORD, src],
            l3: offset,
            judged,
        })
    } else if ether_type == ETH_P_IPV6 {
        let ip: *const Ipv6Hdr = ptr_at(ctx, offset)?;
        // SAFETY: ptr_at checked the bounds.
        let ip = unsafe { &*ip };
        let payload_len = usize::from(u16::from_be_bytes(ip.payload_len));
        if ip.version() != 6 || offset + Ipv6Hdr::LEN + payload_len > frame_len {
            return Err(Malformed);
        }
        let judged = if is_extension(ip.next_hdr) {
            rl_ipv6_chain(ctx.ctx, offset as u64)
        } else {
            JUDGED
        };
        // SAFETY: as above.
        let src = unsafe { core::ptr::read_unaligned(ip.src_addr.as_ptr().cast::<Words>()) };
        // An IPv4-mapped source (::ffff:a.b.c.d) is judged as the IPv4
        // address it maps: its words are already the IPv4 key's, and the
        // rules for that address (and its buckets) are the ones it meets.
        if src[0] == 0 && src[1] == 0 && src[2] == V4_MAPPED_WORD {
            // Built as the IPv4 branch builds it, so that the verifier finds
            // the two alike and walks what follows once.
            return Ok(Parsed {
                family: family::V4,
                source: [0, 0, V4_MAPPED_WORD, src[3]],
                l3: offset,
                judged,
            });
        }
        Ok(Parsed {
            family: family::V6,
            source: src,
            l3: offset,
            judged,
        })
    } else {
        Ok(Parsed {
            family: 0,
            source: [0; 4],
            l3: offset,
            judged: JUDGED,
        })
    }
}

/// Whether the IPv4 fragment whose header starts at `l3` can be judged:
/// [`JUDGED`] or [`TINY`] (see [`too_short`]).
///
/// A global function, as [`rl_vlan`]: the program goes on from one unknown
/// number, not from the ranges each comparison here would leave it with.
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn rl_ipv4_fragment(ctx: *mut xdp_md, l3: u64) -> u32 {
    // See `rl_host_connection` on the mask.
    // SAFETY: a local.
    let l3 = (unsafe { read_volatile(&l3) } & 63) as usize;
    let Ok(ip) = ptr_at::<Ipv4Hdr>(&XdpContext::new(ctx), l3) else {
        return JUDGED;
    };
    // SAFETY: ptr_at checked the bounds.
    let ip = unsafe { &*ip };
    let l4_len = usize::from(u16::from_be_bytes(ip.tot_len)).saturating_sub(usize::from(ip.ihl()));
    let offset = u16::from_be_bytes(ip.frags) & IPV4_OFFSET_MASK;
    if too_short(ip.proto, offset, l4_len) {
        TINY
    } else {
        JUDGED
    }
}

/// [`rl_vlan`]: the frame ends inside a tag.
pub(crate) const VLAN_CUT_SHORT: u32 = 0;
/// [`rl_vlan`]: more than [`MAX_VLAN_TAGS`] tags.
pub(crate) const VLAN_TOO_DEEP: u32 = 1;

/// The EtherType after the VLAN tags of a frame whose Ethernet header names
/// one (low 16 bits, as on the wire) and where it ends (from bit 16: at least
/// 18), or [`VLAN_CUT_SHORT`] or [`VLAN_TOO_DEEP`]. Every 802.1Q and 802.1ad
/// tag counts, VID 0 (priority tags) as any other: the kernel strips them all
/// and delivers what is inside.
///
/// A global function: the verifier walks the tags once, apart, and the
/// program goes on from one unknown offset instead of one path per depth.
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn rl_vlan(ctx: *mut xdp_md) -> u32 {
    let xdp = XdpContext::new(ctx);
    let mut offset = EthHdr::LEN;
    let mut i = 0;
    while i < MAX_VLAN_TAGS {
        let Ok(vlan) = ptr_at::<VlanHdr>(&xdp, offset) else {
            return VLAN_CUT_SHORT;
        };
        // SAFETY: ptr_at checked the bounds.
        let ether_type = unsafe { (*vlan).ether_type };
        offset += VlanHdr::LEN;
        if ether_type != ETH_P_8021Q && ether_type != ETH_P_8021AD {
            return ((offset as u32) << 16) | u32::from(ether_type);
        }
        i += 1;
    }
    VLAN_TOO_DEEP
}

/// The shortest TCP header: flags and ports are all within it.
pub(crate) const TCP_MIN_HEADER: usize = 20;
/// The UDP header, and ICMP's (type, code, checksum and the rest word): a
/// first fragment shorter than this cannot be one of theirs.
pub(crate) const SHORT_L4_HEADER: usize = 8;
pub(crate) const IPPROTO_ICMP: u8 = 1;
pub(crate) const IPPROTO_TCP: u8 = 6;
pub(crate) const IPPROTO_UDP: u8 = 17;
pub(crate) const IPPROTO_ICMPV6: u8 = 58;
/// The fragment offset's bits: of IPv4's flags-and-offset word (in 8-octet
/// units), and of the IPv6 fragment header's offset word (shifted by 3).
pub(crate) const IPV4_OFFSET_MASK: u16 = 0x1fff;
pub(crate) const IPV6_OFFSET_MASK: u16 = 0xfff8;
/// The more-fragments bits of the same words.
pub(crate) const IPV4_MORE_FRAGMENTS: u16 = 0x2000;
pub(crate) const IPV6_MORE_FRAGMENTS: u16 = 0x0001;

/// Whether a first fragment (`offset` 0, in 8-octet units) with `l4_len`
/// bytes after its IP headers is too short for the transport header fields a
/// rule can match on, or a non-first one could overwrite them: RFC 1858's
/// tiny fragment (a TCP header cut before its flags, or before its ports
/// for UDP) and its overlapping fragment (TCP at offset 8 bytes, which the
/// flags of the fragment before it could be rewritten by). RFC 3128: drop
/// both; no sender fragments so.
#[inline(always)]
pub(crate) fn too_short(proto: u8, offset: u16, l4_len: usize) -> bool {
    match proto {
        IPPROTO_TCP => (offset == 0 && l4_len < TCP_MIN_HEADER) || offset == 1,
        IPPROTO_UDP | IPPROTO_ICMP | IPPROTO_ICMPV6 => offset == 0 && l4_len < SHORT_L4_HEADER,
        _ => false,
    }
}

/// The IP version of the header at `l3`: [`family::V4`] or [`family::V6`]
/// (the families are numbered as the versions). Functions that read the
/// header again take its family from the header itself, for the family rules
/// see may differ (an IPv6 frame from an IPv4-mapped source is judged as
/// IPv4).
#[inline(always)]
pub(crate) fn version_at(ctx: &XdpContext, l3: usize) -> Result<u8, Malformed> {
    // Four bytes, not one: LLVM turns a one-byte check into `p >= end`,
    // from which the verifier learns no readable range.
    let first: *const [u8; 4] = ptr_at(ctx, l3)?;
    // SAFETY: ptr_at checked the bounds.
    Ok(unsafe { (*first)[0] } >> 4)
}

/// The source address words of the frame whose IP header starts at `l3`
/// (IPv4-mapped for IPv4), whichever family its rules see.
#[inline(always)]
pub(crate) fn source_at(ctx: &XdpContext, l3: usize) -> Result<Words, Malformed> {
    if version_at(ctx, l3)? == family::V4 {
        let ip: *const Ipv4Hdr = ptr_at(ctx, l3)?;
        // SAFETY: ptr_at checked the bounds; packet loads may be unaligned.
        let src = unsafe { read_unaligned((*ip).src_addr.as_ptr().cast::<u32>()) };
        Ok([0, 0, V4_MAPPED_WORD, src])
    } else {
        let ip: *const Ipv6Hdr = ptr_at(ctx, l3)?;
        // SAFETY: as above.
        Ok(unsafe { read_unaligned((*ip).src_addr.as_ptr().cast::<Words>()) })
    }
}
