//! Counters by reason: what the program did with each frame and why, and
//! the bounds of its loops.

/// One counter of [`MAP_STATS`](crate::MAP_STATS): packets and bytes (whole frame lengths).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Counter {
    /// Frames counted.
    pub packets: u64,
    /// Sum of their lengths from the Ethernet header on, bytes.
    pub bytes: u64,
}
const _: () = assert!(core::mem::size_of::<Counter>() == 16);

/// Why a frame got its verdict: the index into [`MAP_STATS`](crate::MAP_STATS).
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Reason {
    /// Within its limit: passed.
    Passed = 0,
    /// Over its limit: dropped.
    Limited = 1,
    /// Under an `allow` rule: passed without a limit.
    Allowed = 2,
    /// Under a `deny` rule: dropped.
    Denied = 3,
    /// Not IPv4 or IPv6 (ARP, LLDP, ...): passed.
    NotIp = 4,
    /// Truncated or malformed IP: passed or dropped by [`config_flags::DROP_MALFORMED`](crate::config_flags::DROP_MALFORMED).
    Malformed = 5,
    /// Over its limit or denied under dry run: passed.
    WouldDrop = 6,
    /// New source whose state could not be stored (map full and not evictable):
    /// passed, as a new source's first packet always would be.
    StateFailed = 7,
    /// Compare-and-swap retries ran out: the key is hammered from several CPUs at
    /// once, so it is over its limit; dropped.
    Contended = 8,
    /// From a source without state, within its rule's new-source budget: passed.
    NewSource = 9,
    /// From a source without state, over its rule's new-source budget: dropped.
    NewSourceLimited = 10,
    /// Over its rule's aggregate level (all the rule's sources together): dropped.
    AggregateLimited = 11,
    /// Belongs to one of the host's own connections (see
    /// [`rule_flags::HOST_CONNECTIONS`](crate::rule_flags::HOST_CONNECTIONS)): passed without a limit.
    HostConnection = 12,
    /// Allowlist-only mode and not under an `allow` rule: dropped.
    NotAllowed = 13,
    /// Over the second key level of its rule ([`Rule::levels`](crate::Rule::levels)`[0]`): dropped.
    Level2Limited = 14,
    /// Over the third key level of its rule ([`Rule::levels`](crate::Rule::levels)`[1]`): dropped.
    Level3Limited = 15,
    /// A frame the kernel would deliver as IP that the program cannot judge
    /// (more VLAN tags than [`MAX_VLAN_TAGS`], an IPv6 extension header chain
    /// longer than [`MAX_EXT_HEADERS`]): dropped by the `unjudged` policy
    /// ([`config_flags::UNJUDGED_DROP`](crate::config_flags::UNJUDGED_DROP)).
    Unjudged = 16,
    /// A first fragment too short to hold the transport header fields a rule
    /// can match on (TCP: 20 bytes; UDP, ICMP: 8), or a TCP fragment at offset
    /// 8 bytes, which could rewrite the flags of the one before (RFC 1858,
    /// RFC 3128): dropped by the `unjudged` policy.
    TinyFragment = 17,
    /// From a new or young source, refused by its rule's aggregate because
    /// what is left of it is the reserve for established sources
    /// ([`RuleState`](crate::RuleState)): dropped. [`Reason::AggregateLimited`] is the
    /// aggregate refusing whatever the class.
    AggregateYoung = 18,
}

/// Number of [`Reason`]s: the size of [`MAP_STATS`](crate::MAP_STATS).
pub const REASON_COUNT: u32 = 19;

/// 802.1Q and 802.1ad tags the program walks before the IP header: as many as
/// any real network stacks (the kernel strips every tag it meets, VID 0 ones
/// without a VLAN device too). A frame with more is unjudged
/// ([`Reason::Unjudged`]).
pub const MAX_VLAN_TAGS: usize = 8;

/// IPv6 extension headers the program walks before the transport header. A
/// frame whose chain is longer is unjudged ([`Reason::Unjudged`]).
pub const MAX_EXT_HEADERS: usize = 8;

impl Reason {
    /// Every reason, in index order.
    pub const ALL: [Reason; REASON_COUNT as usize] = [
        Reason::Passed,
        Reason::Limited,
        Reason::Allowed,
        Reason::Denied,
        Reason::NotIp,
        Reason::Malformed,
        Reason::WouldDrop,
        Reason::StateFailed,
        Reason::Contended,
        Reason::NewSource,
        Reason::NewSourceLimited,
        Reason::AggregateLimited,
        Reason::HostConnection,
        Reason::NotAllowed,
        Reason::Level2Limited,
        Reason::Level3Limited,
        Reason::Unjudged,
        Reason::TinyFragment,
        Reason::AggregateYoung,
    ];

    /// Stable name, used in stats output and metric labels.
    pub const fn name(self) -> &'static str {
        match self {
            Reason::Passed => "passed",
            Reason::Limited => "limited",
            Reason::Allowed => "allowed",
            Reason::Denied => "denied",
            Reason::NotIp => "not_ip",
            Reason::Malformed => "malformed",
            Reason::WouldDrop => "would_drop",
            Reason::StateFailed => "state_failed",
            Reason::Contended => "contended",
            Reason::NewSource => "new_source",
            Reason::NewSourceLimited => "new_source_limited",
            Reason::AggregateLimited => "aggregate_limited",
            Reason::HostConnection => "host_connection",
            Reason::NotAllowed => "not_allowed",
            Reason::Level2Limited => "level2_limited",
            Reason::Level3Limited => "level3_limited",
            Reason::Unjudged => "unjudged",
            Reason::TinyFragment => "tiny_fragment",
            Reason::AggregateYoung => "aggregate_young",
        }
    }

    /// Whether frames counted under this reason were dropped (dry run aside).
    pub const fn drops(self) -> bool {
        matches!(
            self,
            Reason::Limited
                | Reason::Denied
                | Reason::Contended
                | Reason::NewSourceLimited
                | Reason::AggregateLimited
                | Reason::AggregateYoung
                | Reason::NotAllowed
                | Reason::Level2Limited
                | Reason::Level3Limited
                | Reason::Unjudged
                | Reason::TinyFragment
        )
    }
}

/// How many times the program retries a compare-and-swap on a contended state
/// before giving up ([`Reason::Contended`]). Each failed attempt means another CPU
/// updated the same key in between. Every retry is a path the verifier walks,
/// for every level: 8 keeps the program well inside its limit.
pub const CAS_RETRIES: u32 = 8;

/// How many times the program tries to take a wide state's lock word before
/// giving up ([`Reason::Contended`]). The holder runs with preemption off and
/// releases within a microsecond or so.
pub const LOCK_RETRIES: u32 = 128;
