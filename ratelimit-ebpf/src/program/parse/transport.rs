//! The transport fields of a frame whose IP header starts at `l3`: addresses,
//! protocol (after any IPv6 extension headers), ports, TCP flags, ICMP type →
//! a [`Flow`], whose status says how far the reading got.
//!
//! Read on demand, not for every frame: by the match groups
//! ([`crate::program::classify::rl_select`]) and by the host-connection check
//! ([`crate::program::host::rl_host_connection`]).

use core::ptr::read_unaligned;

use aya_ebpf::programs::XdpContext;
use network_types::ip::{Ipv4Hdr, Ipv6Hdr};
use ratelimit_common::{V4_MAPPED_WORD, Words, family};

use super::{
    IPPROTO_ICMP, IPPROTO_ICMPV6, IPPROTO_TCP, IPPROTO_UDP, IPV4_OFFSET_MASK, Malformed,
    ipv6::{CHAIN_FRAGMENT, CHAIN_TINY, CHAIN_WHOLE, walk_ipv6},
    ptr_at, version_at,
};

/// What a frame's transport header says.
pub(crate) struct Flow {
    /// Source and destination addresses, network order (IPv4-mapped for IPv4).
    pub(crate) source: Words,
    pub(crate) dest: Words,
    /// Ports as on the wire (network order); zero without ports.
    pub(crate) sport: u16,
    pub(crate) dport: u16,
    /// The transport protocol (after any IPv6 extension headers).
    pub(crate) proto: u8,
    /// TCP's flags byte (CWR … FIN).
    pub(crate) tcp_flags: u8,
    /// The ICMP or ICMPv6 type.
    pub(crate) icmp_type: u8,
    /// One of the `L4_*` consts.
    pub(crate) status: u8,
    /// [`family`] of the header (IPv6 for an IPv4-mapped source).
    pub(crate) family: u8,
}

impl Flow {
    /// Nothing read yet.
    #[inline(always)]
    pub(crate) fn unread() -> Self {
        Self {
            source: [0; 4],
            dest: [0; 4],
            sport: 0,
            dport: 0,
            proto: 0,
            tcp_flags: 0,
            icmp_type: 0,
            status: L4_NONE,
            family: 0,
        }
    }
}

/// [`Flow::status`]: the transport header was read (TCP's or UDP's ports and
/// TCP's flags, ICMP's type).
pub(crate) const L4_HEADER: u8 = 0;
/// The protocol is known, not its header: a header cut short (a tiny first
/// fragment), or a protocol whose header we do not read.
pub(crate) const L4_PROTO: u8 = 1;
/// Not even the protocol: an IPv6 extension header chain longer than
/// [`ratelimit_common::MAX_EXT_HEADERS`], or cut short.
pub(crate) const L4_NONE: u8 = 2;
/// The protocol is known, and the frame is a non-first fragment: it has no
/// transport header (the `fragments` policy judges it).
pub(crate) const L4_FRAGMENT: u8 = 3;
/// The transport header's first word, read at once: TCP's and UDP's ports,
/// ICMP's type, code and checksum.
pub(crate) const L4_WORD: usize = 4;
pub(crate) const TCP_SYN: u8 = 0x02;
pub(crate) const TCP_ACK: u8 = 0x10;
/// Where TCP's flags byte is in its header.
pub(crate) const TCP_FLAGS_AT: usize = 13;

/// Reads the addresses, protocol, ports and TCP flags (or ICMP type) of the
/// frame whose IP header starts at `l3` into `out`; its status says how far
/// that got. Nothing is read past the IP payload's end (a short frame is
/// padded to 60 bytes on Ethernet: padding is no header).
#[inline(always)]
pub(crate) fn transport(ctx: &XdpContext, l3: usize, out: &mut Flow) -> Result<(), Malformed> {
    let (next, offset, end);
    if version_at(ctx, l3)? == family::V4 {
        out.family = family::V4;
        let ip: *const Ipv4Hdr = ptr_at(ctx, l3)?;
        // SAFETY: ptr_at checked the bounds; packet loads may be unaligned.
        unsafe {
            out.source = [
                0,
                0,
                V4_MAPPED_WORD,
                read_unaligned((*ip).src_addr.as_ptr().cast()),
            ];
            out.dest = [
                0,
                0,
                V4_MAPPED_WORD,
                read_unaligned((*ip).dst_addr.as_ptr().cast()),
            ];
            next = (*ip).proto;
            if u16::from_be_bytes((*ip).frags) & IPV4_OFFSET_MASK != 0 {
                // A non-first fragment: no transport header.
                out.proto = next;
                out.status = L4_FRAGMENT;
                return Ok(());
            }
            offset = l3 + usize::from((*ip).vihl & 0x0f) * 4;
            end = l3 + usize::from(u16::from_be_bytes((*ip).tot_len));
        }
    } else {
        out.family = family::V6;
        let ip: *const Ipv6Hdr = ptr_at(ctx, l3)?;
        // SAFETY: as above.
        unsafe {
            out.source = read_unaligned((*ip).src_addr.as_ptr().cast());
            out.dest = read_unaligned((*ip).dst_addr.as_ptr().cast());
        }
        let chain = walk_ipv6(ctx, l3);
        match chain.status {
            CHAIN_WHOLE => {}
            CHAIN_FRAGMENT => {
                out.proto = chain.proto;
                out.status = L4_FRAGMENT;
                return Ok(());
            }
            CHAIN_TINY => {
                out.proto = chain.proto;
                out.status = L4_PROTO;
                return Ok(());
            }
            // Too long, or cut short: not even the protocol is known.
            _ => return Ok(()),
        }
        (next, offset, end) = (chain.proto, chain.offset, chain.end);
    }
    out.proto = next;
    out.status = L4_PROTO;
    if next == IPPROTO_ICMP || next == IPPROTO_ICMPV6 {
        // Type, code and checksum: read as one, for a one-byte read at a
        // variable offset is checked in a form the verifier cannot follow.
        if offset + L4_WORD > end {
            return Ok(());
        }
        let icmp: *const [u8; L4_WORD] = ptr_at(ctx, offset)?;
        // SAFETY: ptr_at checked the bounds.
        out.icmp_type = unsafe { (*icmp)[0] };
        out.status = L4_HEADER;
        return Ok(());
    }
    if next != IPPROTO_TCP && next != IPPROTO_UDP {
        return Ok(());
    }
    if offset + L4_WORD > end {
        return Ok(());
    }
    let ports: *const [u8; L4_WORD] = ptr_at(ctx, offset)?;
    // SAFETY: ptr_at checked the bounds.
    let ports = unsafe { *ports };
    out.sport = u16::from_ne_bytes([ports[0], ports[1]]);
    out.dport = u16::from_ne_bytes([ports[2], ports[3]]);
    if next == IPPROTO_TCP {
        if offset + TCP_FLAGS_AT + 1 > end {
            return Ok(());
        }
        let flags: *const u8 = ptr_at(ctx, offset + TCP_FLAGS_AT)?;
        // SAFETY: ptr_at checked the bounds.
        out.tcp_flags = unsafe { *flags };
    }
    out.status = L4_HEADER;
    Ok(())
}
