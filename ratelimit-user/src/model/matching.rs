//! What a rule matches: its source prefix and, optionally, the destination,
//! the transport protocol, destination ports (a port, a range or a set),
//! TCP's SYN and the ICMP type. Several rules may share a source prefix with
//! different matches; the order in which they are tried (their precedence)
//! is the order of [`Selector`]s, and the kernel's match groups are built
//! from it.
//!
//! Precedence, for the rules one frame can meet:
//! 1. the longest source prefix that has a rule matching the frame (a prefix
//!    whose rules all need more than the frame has passes it on to the
//!    prefix around it, and in the end to the default rule);
//! 2. among one prefix's rules: a destination first (longer first), then a
//!    port range (narrower first), then SYN or an ICMP type, then the
//!    protocol alone; the rule with no match last;
//! 3. rules alike in all that (`udp dport 53` and `tcp dport 53`): by
//!    protocol number, then first port.
//!
//! A port set (`dport 22,80,443`) ranks by how many ports it holds, as a
//! range does: `dport 22` before `dport 22,80,443` before `dport 1-1024`.

use std::{cmp::Ordering, collections::BTreeMap, fmt, net::IpAddr};

use ratelimit_common::{
    self as common, GROUP_BIT, GROUPS_CAPACITY, MAX_MATCHES, MatchEntry, MatchGroup,
    V4_MAPPED_BITS, Words, match_fields,
};

use crate::{
    error::{Error, Result},
    model::{ports::Ports, prefix::Prefix},
};

/// IP protocol number of ICMP.
pub const PROTO_ICMP: u8 = 1;
/// IP protocol number of TCP.
pub const PROTO_TCP: u8 = 6;
/// IP protocol number of UDP.
pub const PROTO_UDP: u8 = 17;
/// IP protocol number of ICMPv6.
pub const PROTO_ICMPV6: u8 = 58;

/// Forms accepted for a protocol, for errors.
pub const PROTO_FORMS: &str = "tcp, udp, icmp, icmpv6 or a protocol number 0 to 255";

/// What a rule matches besides its source. Every field is optional; the
/// default matches every frame.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Match {
    /// The destination network.
    pub dest: Option<Prefix>,
    /// The transport protocol (IANA number).
    pub proto: Option<u8>,
    /// Destination ports (TCP or UDP): a port, a range or a set.
    pub dports: Option<Ports>,
    /// TCP with SYN and without ACK.
    pub syn: bool,
    /// The ICMP or ICMPv6 type.
    pub icmp_type: Option<u8>,
}

/// How errors name a match's fields: `--dport` on the command line,
/// `rule[2].dport` in a file.
pub type FieldName<'a> = &'a dyn Fn(&str) -> String;

/// The command line's names.
pub fn flag_name(field: &str) -> String {
    format!("--{field}")
}

impl Match {
    /// Whether it matches every frame.
    pub fn is_any(&self) -> bool {
        *self == Match::default()
    }

    /// Checks that the fields make sense together and with `source`.
    pub fn validate(&self, source: &Prefix, name: FieldName) -> Result<()> {
        let v4 = source.addr.is_ipv4();
        if let Some(d) = &self.dest
            && d.addr.is_ipv4() != v4
        {
            return Err(Error::invalid(
                name("to"),
                format!(
                    "{d} and the source {source} are of different families: a rule's destination is of its source's family"
                ),
            ));
        }
        match self.proto {
            Some(PROTO_ICMP) if !v4 => {
                return Err(Error::invalid(
                    name("proto"),
                    format!("icmp is IPv4's; {source} is IPv6: write icmpv6"),
                ));
            }
            Some(PROTO_ICMPV6) if v4 => {
                return Err(Error::invalid(
                    name("proto"),
                    format!("icmpv6 is IPv6's; {source} is IPv4: write icmp"),
                ));
            }
            _ => {}
        }
        if self.dports.is_some() && !matches!(self.proto, Some(PROTO_TCP | PROTO_UDP)) {
            return Err(Error::invalid(
                name("dport"),
                "a port is TCP's or UDP's: give --proto tcp or --proto udp with it",
            ));
        }
        if self.syn && self.proto != Some(PROTO_TCP) {
            return Err(Error::invalid(
                name("syn"),
                "SYN is TCP's: give --proto tcp with it",
            ));
        }
        if self.icmp_type.is_some() && !matches!(self.proto, Some(PROTO_ICMP | PROTO_ICMPV6)) {
            return Err(Error::invalid(
                name("icmp-type"),
                "a type is ICMP's: give --proto icmp (IPv4) or --proto icmpv6 (IPv6) with it",
            ));
        }
        Ok(())
    }

    /// The order of precedence among one source's rules: smaller first.
    fn rank(&self) -> (u16, u32, u8, u8) {
        (
            self.dest.map_or(u16::MAX, |d| 128 - u16::from(d.len)),
            self.dports.map_or(u32::MAX, |p| p.count() - 1),
            u8::from(!(self.syn || self.icmp_type.is_some())),
            u8::from(self.proto.is_none()),
        )
    }

    /// The kernel's entry for this match, pointing at table index `rule`.
    pub fn entry(&self, rule: u32, own: bool) -> MatchEntry {
        let mut e = MatchEntry {
            rule,
            ..Default::default()
        };
        if own {
            e.fields |= match_fields::OWN;
        }
        if let Some(d) = &self.dest {
            let (bits, key) = d.lpm();
            let addr: Words = [key[1], key[2], key[3], key[4]];
            let (addr, mask_bits) = if d.addr.is_ipv4() {
                (
                    [0, 0, common::V4_MAPPED_WORD, key[1]],
                    u32::from(V4_MAPPED_BITS) + u32::from(d.len),
                )
            } else {
                (addr, bits - common::FAMILY_BITS)
            };
            e.dest = addr;
            e.dest_mask = common::mask_words(&[u32::MAX; 4], mask_bits);
            e.fields |= match_fields::DEST;
        }
        if let Some(p) = self.proto {
            e.proto = p;
            e.fields |= match_fields::PROTO;
        }
        if let Some(p) = self.dports {
            (e.ports, e.port_ranges) = p.entry();
            e.fields |= match_fields::PORTS;
        }
        if self.syn {
            e.fields |= match_fields::SYN;
        }
        if let Some(t) = self.icmp_type {
            e.icmp_type = t;
            e.fields |= match_fields::ICMP_TYPE;
        }
        e
    }

    /// Reads a match back from a kernel entry.
    pub fn from_entry(e: &MatchEntry) -> Self {
        let has = |f: u8| e.fields & f != 0;
        let dest = has(match_fields::DEST).then(|| {
            let addr = common::addr_of(&e.dest);
            let ones: u32 = e.dest_mask.iter().map(|w| w.count_ones()).sum();
            if common::is_v4_mapped(&addr) && ones >= u32::from(V4_MAPPED_BITS) {
                Prefix {
                    addr: IpAddr::from([addr[12], addr[13], addr[14], addr[15]]),
                    len: (ones - u32::from(V4_MAPPED_BITS)) as u8,
                }
            } else {
                Prefix {
                    addr: IpAddr::from(addr),
                    len: ones as u8,
                }
            }
        });
        Match {
            dest,
            proto: has(match_fields::PROTO).then_some(e.proto),
            dports: has(match_fields::PORTS)
                .then(|| {
                    let n = usize::from(e.port_ranges).min(e.ports.len());
                    Ports::of(&e.ports[..n])
                })
                .flatten(),
            syn: has(match_fields::SYN),
            icmp_type: has(match_fields::ICMP_TYPE).then_some(e.icmp_type),
        }
    }
}

/// A protocol's name, or its number.
pub fn proto_name(p: u8) -> String {
    match p {
        PROTO_TCP => "tcp".into(),
        PROTO_UDP => "udp".into(),
        PROTO_ICMP => "icmp".into(),
        PROTO_ICMPV6 => "icmpv6".into(),
        n => format!("proto {n}"),
    }
}

/// Parses `tcp`, `udp`, `icmp`, `icmpv6` or a number.
pub fn parse_proto(field: &str, s: &str) -> Result<u8> {
    match s.trim().to_ascii_lowercase().as_str() {
        "tcp" => Ok(PROTO_TCP),
        "udp" => Ok(PROTO_UDP),
        "icmp" => Ok(PROTO_ICMP),
        "icmpv6" | "ipv6-icmp" => Ok(PROTO_ICMPV6),
        other => other.parse::<u8>().map_err(|_| {
            Error::invalid(
                field,
                format!("{s:?} is not a protocol; expected {PROTO_FORMS}"),
            )
        }),
    }
}

impl fmt::Display for Match {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut parts = Vec::new();
        if let Some(d) = &self.dest {
            parts.push(format!("to {d}"));
        }
        if let Some(p) = self.proto {
            parts.push(proto_name(p));
        }
        if let Some(ports) = self.dports {
            parts.push(format!("dport {ports}"));
        }
        if self.syn {
            parts.push("syn".into());
        }
        if let Some(t) = self.icmp_type {
            parts.push(format!("type {t}"));
        }
        f.write_str(&parts.join(" "))
    }
}

/// What picks a rule: a source prefix and a match. Ordered by source, then
/// by precedence among one source's rules (module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Selector {
    /// The source prefix.
    pub source: Prefix,
    /// What it matches besides the source.
    pub matches: Match,
}

impl From<Prefix> for Selector {
    fn from(source: Prefix) -> Self {
        Self {
            source,
            matches: Match::default(),
        }
    }
}

impl Ord for Selector {
    fn cmp(&self, other: &Self) -> Ordering {
        let m = |s: &Selector| {
            (
                s.matches.rank(),
                s.matches.proto,
                s.matches.dports,
                s.matches.icmp_type,
                s.matches.dest,
                s.matches.syn,
            )
        };
        self.source
            .cmp(&other.source)
            .then_with(|| m(self).cmp(&m(other)))
    }
}

impl PartialOrd for Selector {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

/// Forms accepted for a selector in text, for errors.
pub const SELECTOR_FORMS: &str = "a CIDR, then optionally: to CIDR, tcp|udp|icmp|icmpv6|proto N, dport P, P-Q or P,Q,R-S, syn, type T (e.g. \"198.18.0.0/15 udp dport 53\")";

impl Selector {
    /// Parses the text form (as [`fmt::Display`] writes it): `198.18.0.0/15`,
    /// `198.18.0.0/15 tcp syn`, `0.0.0.0/0 to 198.18.0.1/32 udp dport 53`.
    /// Errors name `field` for the CIDR and the command line's flags for the
    /// rest.
    pub fn parse(field: &str, s: &str) -> Result<Self> {
        let mut words = s.split_whitespace();
        let source = Prefix::parse(field, words.next().unwrap_or(""))?;
        let mut m = Match::default();
        let missing = |what: &str| {
            Error::invalid(
                field,
                format!("{s:?}: {what} needs a value; expected {SELECTOR_FORMS}"),
            )
        };
        while let Some(w) = words.next() {
            match w {
                "to" => {
                    let v = words.next().ok_or_else(|| missing("to"))?;
                    m.dest = Some(Prefix::parse("--to", v)?);
                }
                "tcp" | "udp" | "icmp" | "icmpv6" => m.proto = Some(parse_proto("--proto", w)?),
                "proto" => {
                    let v = words.next().ok_or_else(|| missing("proto"))?;
                    m.proto = Some(parse_proto("--proto", v)?);
                }
                "dport" => {
                    let v = words.next().ok_or_else(|| missing("dport"))?;
                    m.dports = Some(Ports::parse("--dport", v)?);
                }
                "syn" => m.syn = true,
                "type" => {
                    let v = words.next().ok_or_else(|| missing("type"))?;
                    m.icmp_type = Some(v.parse().map_err(|_| {
                        Error::invalid("--icmp-type", format!("{v:?} is not an ICMP type 0 to 255"))
                    })?);
                }
                other => {
                    return Err(Error::invalid(
                        field,
                        format!("{s:?}: {other:?} is not understood; expected {SELECTOR_FORMS}"),
                    ));
                }
            }
        }
        m.validate(&source, &flag_name)?;
        Ok(Self { source, matches: m })
    }

    /// Whether the rule matches every frame of its source.
    pub fn is_plain(&self) -> bool {
        self.matches.is_any()
    }
}

impl fmt::Display for Selector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.matches.is_any() {
            write!(f, "{}", self.source)
        } else {
            write!(f, "{} {}", self.source, self.matches)
        }
    }
}

/// Whether `outer` contains `inner` (same family, shorter or equal, same
/// network bits).
pub fn contains(outer: &Prefix, inner: &Prefix) -> bool {
    if outer.addr.is_ipv4() != inner.addr.is_ipv4() || outer.len > inner.len {
        return false;
    }
    let narrowed = Prefix::parse("cidr", &format!("{}/{}", inner.addr, outer.len));
    narrowed.is_ok_and(|n| n.addr == outer.addr)
}

/// What the kernel reads to pick a rule: the trie's entries (a prefix and a
/// table index, or [`common::GROUP_BIT`] and a group index) and the groups.
#[derive(Debug, Default)]
pub struct Compiled {
    /// The trie's entries: a prefix and its table or group index.
    pub trie: Vec<(Prefix, u32)>,
    /// The match groups.
    pub groups: Vec<MatchGroup>,
}

/// The rule-table indexes of what judges a frame a match cannot judge
/// ([`ratelimit_common::NO_RULE`]: the next entry of its group).
#[derive(Clone, Copy, Debug)]
pub struct Policies {
    /// For a frame whose transport header cannot be read or is cut short.
    pub unjudged: u32,
    /// For a non-first fragment.
    pub fragments: u32,
}

/// The list entries [`compile`] sees beside the rules: blocklist and
/// allowlist entries are rules without a match whose table index is a policy
/// rule's. Kept apart from the rules so that a rule change does not walk a
/// million of them.
pub trait ListEntries {
    /// The table index of the list entry at exactly `p`.
    fn at(&self, p: &Prefix) -> Option<u32>;
    /// The nearest list entry strictly around `p`: its prefix and table index.
    fn around(&self, p: &Prefix) -> Option<(Prefix, u32)>;
}

/// No lists.
pub struct NoLists;

impl ListEntries for NoLists {
    fn at(&self, _: &Prefix) -> Option<u32> {
        None
    }
    fn around(&self, _: &Prefix) -> Option<(Prefix, u32)> {
        None
    }
}

/// What is around a prefix: the rules of another prefix, or a list entry.
enum Around {
    Rules(Prefix),
    List(Prefix, u32),
}

/// Builds the trie's entries and the match groups for `rules` (each
/// selector's table index) and the list entries `lists`: a prefix whose
/// rules all match everything (one rule) points at its rule; any other points
/// at a group holding its rules in precedence order (its list entry, if it
/// has one and no rule without a match, last), followed, if none of them
/// matches everything, by the rules of the nearest prefix around it that has
/// any, or the list entry around it (in turn), and in the end the default
/// rule (`default`). Groups are numbered from `group_base`; each gets the
/// rules of `policies` for frames a match cannot judge. The trie entries are
/// the rules' prefixes only: the list entries elsewhere are the caller's.
pub fn compile(
    rules: &BTreeMap<Selector, u32>,
    lists: &dyn ListEntries,
    default: u32,
    policies: Policies,
    group_base: u32,
) -> Result<Compiled> {
    let mut by_source: BTreeMap<Prefix, Vec<(Match, u32)>> = BTreeMap::new();
    for (s, index) in rules {
        by_source
            .entry(s.source)
            .or_default()
            .push((s.matches, *index));
    }
    // A prefix whose rules all match more than the source takes its list
    // entry as its rule without a match (a rule without a match there would
    // have shadowed it).
    for (source, own) in by_source.iter_mut() {
        if !own.iter().any(|(m, _)| m.is_any())
            && let Some(index) = lists.at(source)
        {
            own.push((Match::default(), index));
        }
    }
    let sources: Vec<Prefix> = by_source.keys().copied().collect();
    let around = |p: &Prefix| {
        let rule = sources
            .iter()
            .filter(|q| q.len < p.len && contains(q, p))
            .max_by_key(|q| q.len)
            .copied();
        match (rule, lists.around(p)) {
            (Some(r), Some((l, i))) if l.len > r.len => Some(Around::List(l, i)),
            (Some(r), _) => Some(Around::Rules(r)),
            (None, Some((l, i))) => Some(Around::List(l, i)),
            (None, None) => None,
        }
    };
    let mut out = Compiled::default();
    for (source, own) in &by_source {
        if let [(m, index)] = own.as_slice()
            && m.is_any()
        {
            out.trie.push((*source, *index));
            continue;
        }
        let mut chain: Vec<MatchEntry> = own.iter().map(|(m, i)| m.entry(*i, true)).collect();
        let mut from = vec![*source];
        let mut at = *source;
        while !own_ends(&chain) {
            match around(&at) {
                Some(Around::Rules(p)) => {
                    chain.extend(by_source[&p].iter().map(|(m, i)| m.entry(*i, false)));
                    from.push(p);
                    at = p;
                }
                Some(Around::List(p, i)) => {
                    chain.push(Match::default().entry(i, false));
                    from.push(p);
                }
                None => chain.push(Match::default().entry(default, false)),
            }
        }
        if chain.len() > MAX_MATCHES {
            let names: Vec<String> = from.iter().map(|p| p.to_string()).collect();
            return Err(Error::invalid(
                source.to_string(),
                format!(
                    "a frame from {source} may meet {} rules in turn (those of {}); at most {MAX_MATCHES} can apply to one source: give {source} a rule without matches, or fewer rules with matches",
                    chain.len(),
                    names.join(", ")
                ),
            ));
        }
        if out.groups.len() == GROUPS_CAPACITY as usize {
            return Err(Error::Capacity {
                what: "source prefixes with matching rules".into(),
                wanted: by_source
                    .values()
                    .filter(|own| own.iter().any(|(m, _)| !m.is_any()))
                    .count(),
                capacity: GROUPS_CAPACITY as usize,
                option: "fewer prefixes with --proto/--dport/--syn/--icmp-type/--to rules",
            });
        }
        let mut group = MatchGroup {
            count: chain.len() as u32,
            unjudged: policies.unjudged,
            fragments: policies.fragments,
            ..Default::default()
        };
        group.entries[..chain.len()].copy_from_slice(&chain);
        out.trie
            .push((*source, GROUP_BIT | (group_base + out.groups.len() as u32)));
        out.groups.push(group);
    }
    Ok(out)
}

fn own_ends(chain: &[MatchEntry]) -> bool {
    chain
        .last()
        .is_some_and(|e| e.fields & !match_fields::OWN == 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sel(s: &str) -> Selector {
        Selector::parse("CIDR", s).unwrap()
    }

    #[test]
    fn text_round_trips() {
        for s in [
            "198.18.0.0/15",
            "198.18.0.0/15 tcp syn",
            "198.18.0.0/15 udp dport 53",
            "198.18.0.0/15 udp dport 27015-27020",
            "0.0.0.0/0 to 198.18.0.1/32 tcp dport 443",
            "198.18.0.0/15 icmp type 8",
            "2001:db8::/32 icmpv6 type 128",
            "198.18.0.0/15 proto 47",
        ] {
            assert_eq!(sel(s).to_string(), s);
        }
    }

    #[test]
    fn bad_selectors_name_the_flag() {
        for (s, field) in [
            ("198.18.0.0/15 dport 53", "--dport"),
            ("198.18.0.0/15 udp syn", "--syn"),
            ("198.18.0.0/15 icmpv6", "--proto"),
            ("2001:db8::/32 icmp", "--proto"),
            ("198.18.0.0/15 tcp type 8", "--icmp-type"),
            ("198.18.0.0/15 to 2001:db8::1", "--to"),
            ("198.18.0.0/15 udp dport 70000", "--dport"),
            ("198.18.0.0/15 udp dport 60-50", "--dport"),
            ("198.18.0.0/15 proto gre", "--proto"),
            ("198.18.0.0/15 sport 5", "CIDR"),
        ] {
            let e = Selector::parse("CIDR", s).expect_err(s).to_string();
            assert!(e.starts_with(field), "{s}: {e}");
        }
    }

    #[test]
    fn precedence_is_the_order() {
        let mut v = [
            sel("198.18.0.0/15"),
            sel("198.18.0.0/15 tcp"),
            sel("198.18.0.0/15 tcp syn"),
            sel("198.18.0.0/15 udp dport 27015-27020"),
            sel("198.18.0.0/15 udp dport 53"),
            sel("198.18.0.0/15 to 198.18.0.0/24"),
            sel("198.18.0.0/15 to 198.18.0.1 udp"),
        ];
        v.reverse();
        v.sort();
        let order: Vec<String> = v.iter().map(|s| s.to_string()).collect();
        assert_eq!(
            order,
            [
                "198.18.0.0/15 to 198.18.0.1/32 udp",
                "198.18.0.0/15 to 198.18.0.0/24",
                "198.18.0.0/15 udp dport 53",
                "198.18.0.0/15 udp dport 27015-27020",
                "198.18.0.0/15 tcp syn",
                "198.18.0.0/15 tcp",
                "198.18.0.0/15",
            ]
        );
    }

    #[test]
    fn entries_read_back() {
        for s in [
            "198.18.0.0/15 to 198.18.0.1/32 tcp dport 80-90 syn",
            "2001:db8::/32 to 2001:db8:1::/48 icmpv6 type 128",
            "198.18.0.0/15 to 0.0.0.0/0",
        ] {
            let m = sel(s).matches;
            assert_eq!(Match::from_entry(&m.entry(7, true)), m, "{s}");
        }
    }

    #[test]
    fn groups_chain_to_the_prefix_around_and_the_default() {
        let rules: BTreeMap<Selector, u32> = [
            ("198.18.0.0/15", 1),
            ("198.18.0.0/15 tcp syn", 2),
            ("198.18.5.0/24 udp dport 53", 3),
            ("198.18.6.0/24", 4),
            ("2001:db8::/32 udp", 5),
        ]
        .into_iter()
        .map(|(s, i)| (sel(s), i))
        .collect();
        let policies = Policies {
            unjudged: 200,
            fragments: 201,
        };
        let c = compile(&rules, &NoLists, 100, policies, 10).unwrap();
        let trie: Vec<(String, u32)> = c.trie.iter().map(|(p, v)| (p.to_string(), *v)).collect();
        assert_eq!(
            trie,
            [
                ("198.18.0.0/15".to_string(), GROUP_BIT | 10),
                ("198.18.5.0/24".to_string(), GROUP_BIT | 11),
                ("198.18.6.0/24".to_string(), 4),
                ("2001:db8::/32".to_string(), GROUP_BIT | 12),
            ]
        );
        let rules_of = |g: &MatchGroup| -> Vec<(u32, bool)> {
            g.entries[..g.count as usize]
                .iter()
                .map(|e| (e.rule, e.fields & match_fields::OWN != 0))
                .collect()
        };
        assert_eq!(rules_of(&c.groups[0]), [(2, true), (1, true)]);
        assert_eq!(rules_of(&c.groups[1]), [(3, true), (2, false), (1, false)]);
        assert_eq!(rules_of(&c.groups[2]), [(5, true), (100, false)]);
        assert!(
            c.groups
                .iter()
                .all(|g| g.unjudged == 200 && g.fragments == 201)
        );

        let many: BTreeMap<Selector, u32> = (0..9u32)
            .map(|i| (sel(&format!("198.18.0.0/15 udp dport {}", 50 + i)), i))
            .collect();
        let e = compile(&many, &NoLists, 100, policies, 0)
            .unwrap_err()
            .to_string();
        assert!(e.contains("at most 8"), "{e}");
    }

    #[test]
    fn containment() {
        let p = |s| Prefix::parse("x", s).unwrap();
        assert!(contains(&p("198.18.0.0/15"), &p("198.19.1.0/24")));
        assert!(!contains(&p("198.18.0.0/16"), &p("198.19.1.0/24")));
        assert!(contains(&p("0.0.0.0/0"), &p("198.19.1.0/24")));
        assert!(!contains(&p("::/0"), &p("198.19.1.0/24")));
    }
}
