//! A frame's key and what judges it, shared by the stages of the limit: the
//! source masked to a rule's key prefix, one GCRA level ([`Level`]), the
//! [`Target`] a key's state leads to, and the [`Reason`] a global function
//! answered.
//!
//! Below [`super::limit`], [`super::levels`], [`super::untracked`] and
//! [`super::wide`], which all use it; it uses none of them.

use ratelimit_common::{REASON_COUNT, Reason, Rule, V4_MAPPED_WORD, Words, family, gcra};

/// One GCRA level: a state word, its parameters, the frame's cost there and
/// the reasons for its verdicts.
pub(crate) struct Level {
    pub(crate) word: *mut u64,
    /// The key word of the table slot `word` is in (0: a word of no table):
    /// see [`super::table::still_owned`].
    pub(crate) owner: u64,
    pub(crate) params: *const gcra::Params,
    pub(crate) cost: u64,
    pub(crate) pass: Reason,
    pub(crate) deny: Reason,
}

impl Level {
    /// No level (a placeholder in a [`Target`] of another kind).
    #[inline(always)]
    pub(crate) fn none(rule: &Rule) -> Self {
        Self {
            word: core::ptr::null_mut(),
            owner: 0,
            params: rule.gcra_params(),
            cost: 0,
            pass: Reason::Passed,
            deny: Reason::Limited,
        }
    }

    /// A source's own bucket under `rule`, in the table slot of key word
    /// `owner` (0: in no table).
    #[inline(always)]
    pub(crate) fn own(word: *mut u64, owner: u64, rule: &Rule, cost: u64) -> Self {
        Self {
            word,
            owner,
            params: rule.gcra_params(),
            cost,
            pass: Reason::Passed,
            deny: Reason::Limited,
        }
    }
}

/// What judges a frame under a limit rule (all fields always set; see
/// [`super::aggregate::Aggregate`]).
pub(crate) struct Target {
    pub(crate) kind: Kind,
    /// For [`Kind::Gcra`]: the source's own bucket, or the new-source budget.
    pub(crate) level: Level,
    /// For [`Kind::Done`]: the verdict.
    pub(crate) reason: Reason,
}

#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Gcra,
    Wide,
    Done,
    /// An IPv4 gcra key to be given a slot of the table, charged with the
    /// units in `level.cost` ([`super::untracked::UNTRACKED_CLAIM`]).
    Claim,
}

impl Target {
    #[inline(always)]
    pub(crate) fn gcra(level: Level) -> Self {
        Self {
            kind: Kind::Gcra,
            level,
            reason: Reason::Passed,
        }
    }

    /// An IPv4 key that earned a slot, charged with `units` (see [`Kind::Claim`]).
    #[inline(always)]
    pub(crate) fn claim(units: u64) -> Self {
        Self {
            kind: Kind::Claim,
            level: Level {
                word: core::ptr::null_mut(),
                owner: 0,
                params: core::ptr::null(),
                cost: units,
                pass: Reason::Passed,
                deny: Reason::Limited,
            },
            reason: Reason::Passed,
        }
    }

    #[inline(always)]
    /// The key has a wide state ([`super::wide::rl_wide`] finds it again).
    pub(crate) fn wide(rule: &Rule) -> Self {
        Self {
            kind: Kind::Wide,
            level: Level::none(rule),
            reason: Reason::Passed,
        }
    }

    #[inline(always)]
    pub(crate) fn done(reason: Reason, rule: &Rule) -> Self {
        Self {
            kind: Kind::Done,
            level: Level::none(rule),
            reason,
        }
    }
}

/// The reason a global function answered (`Contended` for a number that is
/// none: it errs toward limiting).
#[inline(always)]
pub(crate) fn reason_of(r: u32) -> Reason {
    if r < REASON_COUNT {
        // SAFETY: `Reason` is `repr(u32)` with every value below
        // `REASON_COUNT` a variant (`Reason::ALL` lists them in order).
        unsafe { core::mem::transmute::<u32, Reason>(r) }
    } else {
        Reason::Contended
    }
}

/// The bits of `source` that make its key under `rule`.
#[inline(always)]
pub(crate) fn masked(rule: &Rule, fam: u8, source: &Words) -> Words {
    mask_source(rule.mask_v4, &rule.mask_v6, fam, source)
}

/// `source` with only the bits of its family's mask kept.
#[inline(always)]
pub(crate) fn mask_source(mask_v4: u32, mask_v6: &Words, fam: u8, source: &Words) -> Words {
    if fam == family::V4 {
        [0, 0, V4_MAPPED_WORD, source[3] & mask_v4]
    } else {
        [
            source[0] & mask_v6[0],
            source[1] & mask_v6[1],
            source[2] & mask_v6[2],
            source[3] & mask_v6[3],
        ]
    }
}
