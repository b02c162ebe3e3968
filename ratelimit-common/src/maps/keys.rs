//! Addresses as the program carries them (16 bytes, IPv4-mapped; four
//! words) and the keys made of them: a source's state key, a drop's key.

/// An IPv6 address or an IPv4-mapped IPv4 address, network byte order.
pub type Addr = [u8; 16];

/// A source address as the program carries it: four 32-bit words holding the
/// 16 bytes of an [`Addr`] exactly as they are in memory (network byte order),
/// IPv4 as `::ffff:a.b.c.d`. Words, not bytes, so that the program masks and
/// copies an address in four operations, not sixteen.
pub type Words = [u32; 4];

/// The [`Words`] of an [`Addr`].
#[inline(always)]
pub const fn words(a: &Addr) -> Words {
    [
        u32::from_ne_bytes([a[0], a[1], a[2], a[3]]),
        u32::from_ne_bytes([a[4], a[5], a[6], a[7]]),
        u32::from_ne_bytes([a[8], a[9], a[10], a[11]]),
        u32::from_ne_bytes([a[12], a[13], a[14], a[15]]),
    ]
}

/// The [`Addr`] of [`Words`].
#[inline(always)]
pub const fn addr_of(w: &Words) -> Addr {
    // SAFETY: both are 16 bytes of plain integers.
    unsafe { core::mem::transmute::<Words, Addr>(*w) }
}

/// The third word of an IPv4-mapped address: `0, 0, 0xff, 0xff` in memory.
pub const V4_MAPPED_WORD: u32 = u32::from_ne_bytes([0, 0, 0xff, 0xff]);

/// The key data of [`MAP_RULES`](crate::MAP_RULES): the family ([`family`]) in the first byte of
/// the first word, zeros to the end of it, then the address (IPv4: one word,
/// then zeros). With the family first, an IPv6 rule never covers an IPv4
/// source (`::/0` is every IPv6 source, not every source), and an IPv4-mapped
/// IPv6 source never matches an IPv4 rule.
pub type RuleAddr = [u32; 5];

/// Bits in front of the address in a [`RuleAddr`]: a rule's prefix length in
/// the trie is this plus its own.
pub const FAMILY_BITS: u32 = 32;

/// The address families of [`RuleAddr`]'s first byte.
pub mod family {
    /// IPv4.
    pub const V4: u8 = 4;
    /// IPv6.
    pub const V6: u8 = 6;
}

/// The rule key of a source: `family` (from the frame's EtherType) and its
/// address words (IPv4-mapped for IPv4).
#[inline(always)]
pub const fn rule_addr(fam: u8, w: &Words) -> RuleAddr {
    let f = u32::from_ne_bytes([fam, 0, 0, 0]);
    if fam == family::V4 {
        [f, w[3], 0, 0, 0]
    } else {
        [f, w[0], w[1], w[2], w[3]]
    }
}

/// Words `w` with their first `bits` (0..=128) bits kept, the rest cleared.
#[inline(always)]
pub fn mask_words(w: &Words, bits: u32) -> Words {
    let mut out = [0u32; 4];
    let mut i = 0;
    while i < 4 {
        let keep = bits.saturating_sub(32 * i as u32);
        let mask = if keep >= 32 {
            u32::MAX
        } else if keep == 0 {
            0
        } else {
            u32::MAX << (32 - keep)
        };
        // The mask is built in host order and applied in network order.
        out[i] = w[i] & mask.to_be();
        i += 1;
    }
    out
}

/// The prefix `::ffff:0:0/96` under which IPv4 addresses are mapped.
pub const V4_MAPPED_PREFIX: [u8; 12] = [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff];
/// Length of [`V4_MAPPED_PREFIX`] in bits.
pub const V4_MAPPED_BITS: u8 = 96;

/// The IPv4-mapped form of an IPv4 address given as 4 bytes in network order.
#[inline(always)]
pub const fn map_v4(v4: [u8; 4]) -> Addr {
    [
        0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, v4[0], v4[1], v4[2], v4[3],
    ]
}

/// Whether `addr` is IPv4-mapped.
#[inline(always)]
pub fn is_v4_mapped(addr: &Addr) -> bool {
    addr[..12] == V4_MAPPED_PREFIX
}

/// Keeps the first `bits` bits of `addr` (0..=128) and clears the rest.
#[inline(always)]
pub fn mask_addr(addr: &mut Addr, bits: u8) {
    *addr = addr_of(&mask_words(&words(addr), u32::from(bits)));
}

/// A key of a gcra state ([`crate::table`]) or a wide one ([`crate::MAP_WIDE`]): the rule a source fell under and its address masked to
/// that rule's key prefix. 128 bits kept whole: never hashed or folded.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct FlowKey {
    /// Masked source address (IPv4-mapped for IPv4), network byte order.
    pub addr: Addr,
    /// [`Rule::id`](crate::Rule::id) of the rule that applied.
    pub rule_id: u32,
}
const _: () = assert!(core::mem::size_of::<FlowKey>() == 20);

/// Key of [`MAP_TABLE`](crate::MAP_TABLE): a [`FlowKey`] of an IPv4 source, without the
/// IPv4-mapped prefix.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct FlowKeyV4 {
    /// Masked source address, network byte order.
    pub addr: [u8; 4],
    /// [`Rule::id`](crate::Rule::id) of the rule that applied.
    pub rule_id: u32,
}
const _: () = assert!(core::mem::size_of::<FlowKeyV4>() == 8);

impl FlowKey {
    /// The key of `rule_id` for address words `w`.
    #[inline(always)]
    pub const fn of(w: &Words, rule_id: u32) -> Self {
        Self {
            addr: addr_of(w),
            rule_id,
        }
    }

    /// The IPv4 form of this key (its last four address bytes).
    #[inline(always)]
    pub const fn v4(&self) -> FlowKeyV4 {
        FlowKeyV4 {
            addr: [self.addr[12], self.addr[13], self.addr[14], self.addr[15]],
            rule_id: self.rule_id,
        }
    }
}

impl FlowKeyV4 {
    /// The [`FlowKey`] of this IPv4 key.
    pub const fn widen(&self) -> FlowKey {
        FlowKey {
            addr: map_v4(self.addr),
            rule_id: self.rule_id,
        }
    }
}

/// What a drop is charged to in [`MAP_DROPS`](crate::MAP_DROPS) ([`crate::top`]). A source, or for a drop
/// at a rule's second or third key level the key of that level (a source's
/// network, e.g. its /24).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct DropKey {
    /// The address, masked to `prefix` (IPv4-mapped for IPv4).
    pub addr: Addr,
    /// The bits of `addr` that count, of its family (24 for an IPv4 /24),
    /// or 0 for a whole source address.
    pub prefix: u8,
    /// 1 for a source (its own level, a denial); 2 or 3 for a key level.
    pub level: u8,
    /// Zero.
    pub _pad: [u8; 2],
}
const _: () = assert!(core::mem::size_of::<DropKey>() == 20);
