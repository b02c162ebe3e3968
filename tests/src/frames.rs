//! Crafted Ethernet frames: UDP, TCP or ICMP over IPv4 (with options) or
//! IPv6 (with extension headers), behind any number of VLAN tags, whole or
//! in fragments; and ARP.

use std::net::IpAddr;

/// 802.1Q tag protocol id.
pub const TPID_8021Q: u16 = 0x8100;
/// 802.1ad (QinQ outer) tag protocol id.
pub const TPID_8021AD: u16 = 0x88a8;

/// What to put in a UDP frame.
#[derive(Clone, Debug)]
pub struct Udp {
    /// Source address.
    pub src: IpAddr,
    /// Destination address (same family).
    pub dst: IpAddr,
    /// Source MAC.
    pub src_mac: [u8; 6],
    /// Destination MAC.
    pub dst_mac: [u8; 6],
    /// VLAN tags, outermost first: (TPID, VLAN id).
    pub vlans: Vec<(u16, u16)>,
    /// IPv4 option bytes (a multiple of 4, at most 40).
    pub ipv4_options: usize,
    /// UDP destination port.
    pub dport: u16,
    /// UDP payload length.
    pub payload: usize,
    /// Source port.
    pub sport: u16,
    /// A TCP segment with these flags instead of UDP.
    pub tcp: Option<u8>,
    /// The TCP segment's payload length (0: a bare header).
    pub tcp_payload: usize,
    /// An ICMP (IPv4) or ICMPv6 (IPv6) message of this type (code 0, 4
    /// bytes of rest and the payload) instead of UDP.
    pub icmp: Option<u8>,
    /// IPv4: the fragment offset, in 8-octet units (non-zero: a non-first
    /// fragment, whose bytes after the IP header are not a transport header).
    pub ipv4_frag_offset: u16,
    /// IPv6 extension headers before the transport header, in order: (next
    /// header value naming it, fragment offset in 8-octet units for a
    /// fragment header). Each is 8 octets.
    pub ipv6_ext: Vec<(u8, u16)>,
}

/// TCP flags for [`Udp::tcp`].
pub mod tcp {
    /// SYN.
    pub const SYN: u8 = 0x02;
    /// ACK.
    pub const ACK: u8 = 0x10;
    /// PSH.
    pub const PSH: u8 = 0x08;
}

impl Udp {
    /// A frame from `src` to `dst` with default MACs, no tags, no options.
    pub fn new(src: IpAddr, dst: IpAddr) -> Self {
        Self {
            src,
            dst,
            src_mac: [0x02, 0, 0, 0, 0, 1],
            dst_mac: [0x02, 0, 0, 0, 0, 2],
            vlans: Vec::new(),
            ipv4_options: 0,
            dport: 9,
            payload: 18,
            sport: 40000,
            tcp: None,
            tcp_payload: 0,
            icmp: None,
            ipv4_frag_offset: 0,
            ipv6_ext: Vec::new(),
        }
    }

    /// Builds the frame.
    pub fn build(&self) -> Vec<u8> {
        let (proto, l4) = self.transport();
        let frag = (self.ipv4_frag_offset != 0).then_some((self.ipv4_frag_offset, true));
        self.frame(proto, &l4, frag)
    }

    /// The datagram split into fragments: the first carries the first
    /// `first` bytes of the transport header and payload (a multiple of 8),
    /// the second the rest. For IPv6 a fragment header is added after the
    /// extension headers of [`Udp::ipv6_ext`].
    pub fn fragments(&self, first: usize) -> [Vec<u8>; 2] {
        assert!(
            first.is_multiple_of(8),
            "fragments are cut at multiples of 8"
        );
        let (proto, l4) = self.transport();
        assert!(
            first < l4.len(),
            "the first fragment must leave some to the second"
        );
        [
            self.frame(proto, &l4[..first], Some((0, true))),
            self.frame(proto, &l4[first..], Some(((first / 8) as u16, false))),
        ]
    }

    /// The transport protocol and its bytes (header with checksum, payload).
    fn transport(&self) -> (u8, Vec<u8>) {
        let v6 = self.src.is_ipv6();
        let mut l4 = Vec::with_capacity(20 + self.payload);
        let (proto, sum_at, pseudo) = if let Some(kind) = self.icmp {
            l4.extend_from_slice(&[kind, 0, 0, 0, 0, 1, 0, 1]);
            l4.extend((0..self.payload).map(|i| i as u8));
            // ICMP's checksum has no pseudo-header; ICMPv6's has.
            if v6 { (58, 2, true) } else { (1, 2, false) }
        } else if let Some(flags) = self.tcp {
            l4.extend_from_slice(&self.sport.to_be_bytes());
            l4.extend_from_slice(&self.dport.to_be_bytes());
            // seq, ack, data offset 5, flags, window, checksum, urgent.
            l4.extend_from_slice(&[0, 0, 0, 1, 0, 0, 0, 1, 0x50, flags, 0xff, 0xff, 0, 0, 0, 0]);
            l4.extend((0..self.tcp_payload).map(|i| i as u8));
            (6, 16, true)
        } else {
            l4.extend_from_slice(&self.sport.to_be_bytes());
            l4.extend_from_slice(&self.dport.to_be_bytes());
            l4.extend_from_slice(&((8 + self.payload) as u16).to_be_bytes());
            l4.extend_from_slice(&[0, 0]);
            l4.extend((0..self.payload).map(|i| i as u8));
            (17, 6, true)
        };
        let initial = if pseudo {
            let mut p = Vec::new();
            match (self.src, self.dst) {
                (IpAddr::V4(s), IpAddr::V4(d)) => {
                    p.extend_from_slice(&s.octets());
                    p.extend_from_slice(&d.octets());
                    p.extend_from_slice(&[0, proto]);
                    p.extend_from_slice(&(l4.len() as u16).to_be_bytes());
                }
                (IpAddr::V6(s), IpAddr::V6(d)) => {
                    p.extend_from_slice(&s.octets());
                    p.extend_from_slice(&d.octets());
                    p.extend_from_slice(&(l4.len() as u32).to_be_bytes());
                    p.extend_from_slice(&[0, 0, 0, proto]);
                }
                _ => panic!("mixed address families"),
            }
            sum_words(&p)
        } else {
            0
        };
        let sum = checksum(&l4, initial);
        // 0 means "no checksum" to UDP: an all-ones sum is sent as 0xffff.
        let sum = if sum == 0 && proto == 17 { 0xffff } else { sum };
        l4[sum_at..sum_at + 2].copy_from_slice(&sum.to_be_bytes());
        (proto, l4)
    }

    /// Ethernet, the tags, the IP header (a fragment's when `frag` is
    /// (offset in 8-octet units, more fragments)), extension headers, `l4`.
    fn frame(&self, proto: u8, l4: &[u8], frag: Option<(u16, bool)>) -> Vec<u8> {
        let mut f = Vec::with_capacity(128);
        f.extend_from_slice(&self.dst_mac);
        f.extend_from_slice(&self.src_mac);
        for (tpid, vid) in &self.vlans {
            f.extend_from_slice(&tpid.to_be_bytes());
            f.extend_from_slice(&vid.to_be_bytes());
        }
        match (self.src, self.dst) {
            (IpAddr::V4(s), IpAddr::V4(d)) => {
                f.extend_from_slice(&0x0800u16.to_be_bytes());
                assert!(self.ipv4_options.is_multiple_of(4) && self.ipv4_options <= 40);
                let ihl = 5 + self.ipv4_options / 4;
                let total = ihl * 4 + l4.len();
                // Don't fragment, or more fragments and the offset.
                let flags_offset = match frag {
                    None => 0x4000,
                    Some((offset, more)) => offset | if more { 0x2000 } else { 0 },
                };
                let mut ip = vec![
                    0x40 | ihl as u8,
                    0,
                    (total >> 8) as u8,
                    total as u8,
                    0,
                    1,
                    (flags_offset >> 8) as u8,
                    flags_offset as u8,
                    64,
                    proto,
                    0,
                    0,
                ];
                ip.extend_from_slice(&s.octets());
                ip.extend_from_slice(&d.octets());
                // NOP options (type 1).
                ip.extend(std::iter::repeat_n(1u8, self.ipv4_options));
                let c = checksum(&ip, 0);
                ip[10..12].copy_from_slice(&c.to_be_bytes());
                f.extend_from_slice(&ip);
            }
            (IpAddr::V6(s), IpAddr::V6(d)) => {
                f.extend_from_slice(&0x86ddu16.to_be_bytes());
                let mut ext: Vec<(u8, u16, bool)> =
                    self.ipv6_ext.iter().map(|(k, o)| (*k, *o, false)).collect();
                if let Some((offset, more)) = frag {
                    ext.push((44, offset, more));
                }
                let ext_len = 8 * ext.len();
                let mut ip = vec![0x60, 0, 0, 0];
                ip.extend_from_slice(&((ext_len + l4.len()) as u16).to_be_bytes());
                ip.push(ext.first().map_or(proto, |e| e.0));
                ip.push(64);
                ip.extend_from_slice(&s.octets());
                ip.extend_from_slice(&d.octets());
                for (i, (kind, offset, more)) in ext.iter().enumerate() {
                    let next = ext.get(i + 1).map_or(proto, |e| e.0);
                    if *kind == 44 {
                        let off = ((offset << 3) | u16::from(*more)).to_be_bytes();
                        ip.extend_from_slice(&[next, 0, off[0], off[1], 0, 0, 0, 7]);
                    } else {
                        // Length 0: 8 octets (PadN options inside).
                        ip.extend_from_slice(&[next, 0, 1, 4, 0, 0, 0, 0]);
                    }
                }
                f.extend_from_slice(&ip);
            }
            _ => panic!("mixed address families"),
        }
        f.extend_from_slice(l4);
        f
    }
}

/// `frame` padded with zeros to Ethernet's shortest frame (60 bytes before
/// the FCS), as a NIC sends a short one: the padding is no part of the IP
/// packet.
pub fn padded(mut frame: Vec<u8>) -> Vec<u8> {
    if frame.len() < 60 {
        frame.resize(60, 0);
    }
    frame
}

fn sum_words(b: &[u8]) -> u32 {
    b.chunks(2)
        .map(|c| u32::from(u16::from_be_bytes([c[0], *c.get(1).unwrap_or(&0)])))
        .sum()
}

/// The Internet checksum of `b`, starting from `initial`.
pub fn checksum(b: &[u8], initial: u32) -> u16 {
    let mut s = initial + sum_words(b);
    while s >> 16 != 0 {
        s = (s & 0xffff) + (s >> 16);
    }
    !(s as u16)
}

/// An ARP request frame.
pub fn arp() -> Vec<u8> {
    let mut f = vec![0xff; 6];
    f.extend_from_slice(&[0x02, 0, 0, 0, 0, 1]);
    f.extend_from_slice(&0x0806u16.to_be_bytes());
    f.extend_from_slice(&[0, 1, 8, 0, 6, 4, 0, 1]);
    f.extend_from_slice(&[0x02, 0, 0, 0, 0, 1, 198, 18, 0, 1]);
    f.extend_from_slice(&[0, 0, 0, 0, 0, 0, 198, 18, 0, 2]);
    f
}

/// Reads (source address, UDP destination port) from a received frame, looking
/// through VLAN tags. `None` for anything else.
pub fn parse_udp_source(f: &[u8]) -> Option<(IpAddr, u16)> {
    let mut off = 12;
    let mut et = u16::from_be_bytes([*f.get(off)?, *f.get(off + 1)?]);
    while et == TPID_8021Q || et == TPID_8021AD {
        off += 4;
        et = u16::from_be_bytes([*f.get(off)?, *f.get(off + 1)?]);
    }
    let ip = off + 2;
    match et {
        0x0800 => {
            let ihl = usize::from(f.get(ip)? & 0x0f) * 4;
            if *f.get(ip + 9)? != 17 {
                return None;
            }
            let src: [u8; 4] = f.get(ip + 12..ip + 16)?.try_into().ok()?;
            let udp = ip + ihl;
            let dport = u16::from_be_bytes([*f.get(udp + 2)?, *f.get(udp + 3)?]);
            Some((IpAddr::from(src), dport))
        }
        0x86dd => {
            if *f.get(ip + 6)? != 17 {
                return None;
            }
            let src: [u8; 16] = f.get(ip + 8..ip + 24)?.try_into().ok()?;
            let udp = ip + 40;
            let dport = u16::from_be_bytes([*f.get(udp + 2)?, *f.get(udp + 3)?]);
            Some((IpAddr::from(src), dport))
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip() {
        for (s, d) in [("198.18.0.1", "198.18.0.2"), ("2001:db8::1", "2001:db8::2")] {
            let mut u = Udp::new(s.parse().unwrap(), d.parse().unwrap());
            u.vlans = vec![(TPID_8021AD, 10), (TPID_8021Q, 20)];
            u.dport = 4242;
            let f = u.build();
            assert_eq!(parse_udp_source(&f), Some((s.parse().unwrap(), 4242)));
        }
    }

    #[test]
    fn ipv4_header_checksum_verifies() {
        let u = Udp::new("198.18.0.1".parse().unwrap(), "198.18.0.2".parse().unwrap());
        let f = u.build();
        assert_eq!(checksum(&f[14..34], 0), 0);
    }
}
