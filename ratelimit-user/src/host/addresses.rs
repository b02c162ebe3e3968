//! The host's own addresses, in the calling thread's network namespace: what
//! a feed of bans must never take off the network (the CrowdSec bouncer
//! reads them at every pull, so it follows their changes).
//!
//! Enters: `getifaddrs(3)`. Leaves: the addresses of every interface, up or
//! not. Called by [`crate::crowdsec`].

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// Every address of every interface (IPv4 and IPv6); empty when they cannot
/// be read.
pub fn own() -> Vec<IpAddr> {
    let mut list: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs fills `list` with a list we free below.
    if unsafe { libc::getifaddrs(&mut list) } != 0 {
        return Vec::new();
    }
    let mut out = Vec::new();
    let mut at = list;
    while !at.is_null() {
        // SAFETY: a node of the list getifaddrs made, valid until freed.
        let node = unsafe { &*at };
        let sa = node.ifa_addr;
        if !sa.is_null() {
            // SAFETY: `sa` points at a sockaddr of the family it says.
            match i32::from(unsafe { (*sa).sa_family }) {
                libc::AF_INET => {
                    // SAFETY: an AF_INET sockaddr is a sockaddr_in.
                    let v4 = unsafe { &*sa.cast::<libc::sockaddr_in>() };
                    out.push(IpAddr::V4(Ipv4Addr::from(u32::from_be(v4.sin_addr.s_addr))));
                }
                libc::AF_INET6 => {
                    // SAFETY: an AF_INET6 sockaddr is a sockaddr_in6.
                    let v6 = unsafe { &*sa.cast::<libc::sockaddr_in6>() };
                    out.push(IpAddr::V6(Ipv6Addr::from(v6.sin6_addr.s6_addr)));
                }
                _ => {}
            }
        }
        at = node.ifa_next;
    }
    // SAFETY: the list getifaddrs made, freed once.
    unsafe { libc::freeifaddrs(list) };
    out.sort_unstable();
    out.dedup();
    out
}
