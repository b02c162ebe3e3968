//! The host's own connections: a frame a limit would drop, from a TCP
//! connection or connected UDP socket of this host (by the kernel's socket
//! lookup on its 4-tuple, never by a flag alone), passes instead.
//!
//! Enters: the frame (its transport fields read again) and the daemon's range
//! of local ports. Leaves: 1 or 0. Called by the entry
//! ([`super::try_ratelimit`]) on the drop path only, through the global
//! function [`rl_host_connection`].

use core::{mem::size_of, ptr::read_volatile};

use aya_ebpf::{
    bindings::{
        bpf_sock_tuple, bpf_sock_tuple__bindgen_ty_1__bindgen_ty_1,
        bpf_sock_tuple__bindgen_ty_1__bindgen_ty_2, xdp_md,
    },
    cty::c_void,
    helpers::{bpf_sk_lookup_tcp, bpf_sk_lookup_udp, bpf_sk_release},
    programs::XdpContext,
};
use ratelimit_common::family;

use super::parse::{Flow, IPPROTO_TCP, IPPROTO_UDP, L4_HEADER, TCP_ACK, TCP_SYN, transport};

/// `TCP_ESTABLISHED` of the kernel's socket states (also a connected UDP socket's).
pub(crate) const TCP_ESTABLISHED: u32 = 1;

/// Whether the frame whose IP header starts at `l3` belongs to one of the
/// host's own connections (1) or not (0): TCP with ACK and without SYN, or
/// UDP, to a local port in `local_ports` (the ephemeral range, where the
/// host's outgoing connections live), whose 4-tuple the kernel's socket
/// lookup finds as an established TCP connection or a connected UDP socket.
/// Nothing here trusts a flag alone: an ACK bit without a socket that has
/// this exact 4-tuple proves nothing.
///
/// A global function: the verifier checks it once, apart, and the program
/// sees only a number come back. Inlined, its many exits (and the IPv6
/// extension headers' paths) each carried a state of their own into the
/// limit, and the verifier walked the limit again for each: 910 k
/// instructions instead of 520 k.
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn rl_host_connection(ctx: *mut xdp_md, l3: u64, local_ports: u32) -> u32 {
    // Masked after a volatile read, not only checked: LLVM would drop a mask
    // it can prove redundant, and the verifier must see the offset's bound
    // on the very register it adds. The IP header starts within 64 bytes
    // (Ethernet and eight VLAN tags).
    // SAFETY: a local.
    let l3 = (unsafe { read_volatile(&l3) } & 63) as usize;
    let mut flow = Flow::unread();
    let xdp = XdpContext::new(ctx);
    if transport(&xdp, l3, &mut flow).is_err() || flow.status != L4_HEADER {
        return 0;
    }
    let port = u32::from(u16::from_be(flow.dport));
    if port < local_ports >> 16 || port > local_ports & 0xffff {
        return 0;
    }
    let candidate = match flow.proto {
        IPPROTO_TCP => flow.tcp_flags & (TCP_SYN | TCP_ACK) == TCP_ACK,
        IPPROTO_UDP => true,
        _ => false,
    };
    u32::from(candidate && host_socket(ctx, &flow))
}

/// Whether the kernel has an established TCP connection or a connected UDP
/// socket for `f`'s 4-tuple (from the frame's point of view), in the network
/// namespace of the interface.
#[inline(always)]
pub(crate) fn host_socket(ctx: *mut xdp_md, f: &Flow) -> bool {
    // SAFETY: a plain C struct; all zeroes is valid.
    let mut tuple: bpf_sock_tuple = unsafe { core::mem::zeroed() };
    let ctx = ctx.cast::<c_void>();
    // BPF_F_CURRENT_NETNS: the namespace of the interface.
    let netns = u64::MAX;
    // SAFETY: helpers given a tuple of the size they are told; every socket
    // they return is released below.
    let sk = unsafe {
        if f.family == family::V4 {
            tuple.__bindgen_anon_1.ipv4 = bpf_sock_tuple__bindgen_ty_1__bindgen_ty_1 {
                saddr: f.source[3],
                daddr: f.dest[3],
                sport: f.sport,
                dport: f.dport,
            };
            let size = size_of::<bpf_sock_tuple__bindgen_ty_1__bindgen_ty_1>() as u32;
            if f.proto == IPPROTO_TCP {
                bpf_sk_lookup_tcp(ctx, &mut tuple, size, netns, 0)
            } else {
                bpf_sk_lookup_udp(ctx, &mut tuple, size, netns, 0)
            }
        } else {
            tuple.__bindgen_anon_1.ipv6 = bpf_sock_tuple__bindgen_ty_1__bindgen_ty_2 {
                saddr: f.source,
                daddr: f.dest,
                sport: f.sport,
                dport: f.dport,
            };
            let size = size_of::<bpf_sock_tuple__bindgen_ty_1__bindgen_ty_2>() as u32;
            if f.proto == IPPROTO_TCP {
                bpf_sk_lookup_tcp(ctx, &mut tuple, size, netns, 0)
            } else {
                bpf_sk_lookup_udp(ctx, &mut tuple, size, netns, 0)
            }
        }
    };
    if sk.is_null() {
        return false;
    }
    // SAFETY: a socket the helper returned, read before it is released.
    let state = unsafe { (*sk).state };
    // SAFETY: released once.
    unsafe { bpf_sk_release(sk.cast()) };
    state == TCP_ESTABLISHED
}
