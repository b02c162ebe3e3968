//! A source prefix (an IPv4 or IPv6 network) as rules and lists name it, and
//! its form as the kernel's longest-prefix-match key.

use std::{fmt, net::IpAddr};

use ratelimit_common::{self as common, V4_MAPPED_BITS, map_v4};

use crate::error::{Error, Result};

/// A source prefix: an IPv4 or IPv6 network. Host bits are cleared on parsing.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Prefix {
    /// The network address.
    pub addr: IpAddr,
    /// Prefix length: 0..=32 for IPv4, 0..=128 for IPv6.
    pub len: u8,
}

/// Forms accepted for a prefix, for error messages.
pub const PREFIX_FORMS: &str = "an IPv4 or IPv6 address with an optional /length, like 198.18.0.0/15, 198.18.0.1 or 2001:db8::/32";

impl Prefix {
    /// Parses `198.18.0.0/15`, `2001:db8::/32`, or a bare address (a /32 or /128).
    pub fn parse(field: &str, s: &str) -> Result<Self> {
        let bad = |why: String| {
            Error::invalid(
                field,
                format!("invalid prefix {s:?}: {why}; expected {PREFIX_FORMS}"),
            )
        };
        let (addr, len) = match s.trim().split_once('/') {
            Some((a, l)) => (a, Some(l)),
            None => (s.trim(), None),
        };
        let addr: IpAddr = addr
            .parse()
            .map_err(|_| bad(format!("{addr:?} is not an IP address")))?;
        if let IpAddr::V6(v6) = addr
            && let Some(v4) = v6.to_ipv4_mapped()
        {
            let v4_len = len
                .and_then(|l| l.parse::<u8>().ok())
                .map_or(32, |l| l.saturating_sub(96).min(32));
            return Err(Error::invalid(
                field,
                format!(
                    "{s:?} is an IPv4-mapped IPv6 address: IPv4 sources are matched by IPv4 rules; write {v4}/{v4_len}"
                ),
            ));
        }
        let max = if addr.is_ipv4() { 32 } else { 128 };
        let len = match len {
            None => max,
            Some(l) => l
                .parse::<u8>()
                .ok()
                .filter(|&l| l <= max)
                .ok_or_else(|| bad(format!("the length must be 0 to {max}")))?,
        };
        let mut p = Self { addr, len };
        p.addr = p.network();
        Ok(p)
    }

    /// The prefix of `len` bits (at most this one's) that contains this one.
    pub fn widened(&self, len: u8) -> Self {
        let p = Self {
            addr: self.addr,
            len: len.min(self.len),
        };
        Self {
            addr: p.network(),
            ..p
        }
    }

    /// The address with host bits cleared.
    fn network(&self) -> IpAddr {
        let (mut bytes, bits) = match self.addr {
            IpAddr::V4(a) => (map_v4(a.octets()), V4_MAPPED_BITS + self.len),
            IpAddr::V6(a) => (a.octets(), self.len),
        };
        common::mask_addr(&mut bytes, bits);
        source_ip(&bytes)
    }

    /// The rule trie's key: (prefix length after the family word, family and
    /// address).
    pub fn lpm(&self) -> (u32, common::RuleAddr) {
        let (fam, addr) = match self.addr {
            IpAddr::V4(a) => (common::family::V4, map_v4(a.octets())),
            IpAddr::V6(a) => (common::family::V6, a.octets()),
        };
        (
            common::FAMILY_BITS + u32::from(self.len),
            common::rule_addr(fam, &common::words(&addr)),
        )
    }

    /// Reads a prefix back from a rule trie key.
    pub fn from_lpm(bits: u32, key: common::RuleAddr) -> Self {
        let len = bits.saturating_sub(common::FAMILY_BITS) as u8;
        if key[0].to_ne_bytes()[0] == common::family::V4 {
            Self {
                addr: IpAddr::from(key[1].to_ne_bytes()),
                len,
            }
        } else {
            let w = [key[1], key[2], key[3], key[4]];
            Self {
                addr: IpAddr::from(common::addr_of(&w)),
                len,
            }
        }
    }
}

/// A source address as the maps keep it (IPv4-mapped for IPv4), as an `IpAddr`.
pub fn source_ip(addr: &common::Addr) -> IpAddr {
    if common::is_v4_mapped(addr) {
        IpAddr::from([addr[12], addr[13], addr[14], addr[15]])
    } else {
        IpAddr::from(*addr)
    }
}

impl fmt::Display for Prefix {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.len)
    }
}
