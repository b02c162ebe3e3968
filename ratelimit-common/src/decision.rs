//! The answer every algorithm gives.

/// The answer to one arrival.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Decision {
    /// Whether the arrival is admitted.
    pub allowed: bool,
    /// Whole units of cost that could still be admitted now, after this decision.
    pub remaining: u64,
    /// When denied: ns until this same arrival would be admitted if nothing else
    /// came; [`NEVER`] if it never will (cost above what the algorithm can ever
    /// admit at once, or a rate of 0). 0 when admitted.
    pub retry_after_ns: u64,
}

/// `retry_after_ns` of an arrival that can never be admitted.
pub const NEVER: u64 = u64::MAX;

impl Decision {
    /// An admission leaving `remaining`.
    #[inline(always)]
    pub const fn allow(remaining: u64) -> Self {
        Self {
            allowed: true,
            remaining,
            retry_after_ns: 0,
        }
    }

    /// A denial: `remaining` available now, admitted after `retry_after_ns`.
    #[inline(always)]
    pub const fn deny(remaining: u64, retry_after_ns: u64) -> Self {
        Self {
            allowed: false,
            remaining,
            retry_after_ns,
        }
    }
}
