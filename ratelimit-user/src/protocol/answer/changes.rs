//! What a change command changed: the rules after it, and each rule, list,
//! default or mode before and after. The daemon's handlers (and its reload)
//! answer with [`Changed`], `deny --from` and `allow --from` with
//! [`ListLoaded`]; the CLI prints one line per change.

use serde::{Deserialize, Serialize};
use serde_json::Number;

use super::rules::{ActionView, RuleView, Rules};
use crate::model::{lists::ListAction, rules::Mode};

/// The answer of a change: the rules as they are now, and what changed.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Changed {
    /// The rules after the change.
    #[serde(flatten)]
    pub rules: Rules,
    /// What differs from before; empty when nothing did.
    pub changes: Vec<Change>,
}

/// One thing a change changed.
// Told apart by their fields: a mode's `mode`, a list's `list`, a rule's
// `cidr` with rules (a selector's fields) or the default rule's actions.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Change {
    /// The mode.
    Mode {
        /// Before and after.
        mode: ModeChange,
    },
    /// A list: added (no `before`), removed (no `after`) or replaced.
    List {
        /// Its name.
        list: String,
        /// What it was.
        before: Option<ListChange>,
        /// What it is.
        after: Option<ListChange>,
    },
    /// A rule: added, removed or changed.
    Rule {
        /// Its selector.
        cidr: String,
        /// What it was.
        before: Option<Box<RuleView>>,
        /// What it is.
        after: Option<Box<RuleView>>,
    },
    /// The default rule (`cidr` is `default`), which is always there.
    Default {
        /// `default`.
        cidr: String,
        /// What it was.
        before: Box<ActionView>,
        /// What it is.
        after: Box<ActionView>,
    },
}

impl Change {
    /// The default rule's `cidr`.
    pub const DEFAULT: &str = "default";

    /// The default rule changed from `before` to `after`.
    pub fn default_rule(before: ActionView, after: ActionView) -> Self {
        Change::Default {
            cidr: Self::DEFAULT.into(),
            before: Box::new(before),
            after: Box::new(after),
        }
    }
}

/// The mode before and after.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ModeChange {
    /// Before.
    pub before: Mode,
    /// After.
    pub after: Mode,
}

/// A list as a change shows it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ListChange {
    /// Deny or allow.
    pub action: ListAction,
    /// Its CIDRs.
    pub entries: usize,
    /// Where it was read.
    pub source: String,
    /// When it ends, RFC 3339 UTC.
    pub expires_at: Option<String>,
    /// In how many seconds it ends.
    pub expires_in_s: Option<Number>,
}

/// The answer of a list loaded whole (`deny --from`, `allow --from`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ListLoaded {
    /// The rules after it, and what changed.
    #[serde(flatten)]
    pub changed: Changed,
    /// What was loaded.
    pub loaded: Loaded,
}

/// A list loaded: what was read, what it replaced, how long it took.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Loaded {
    /// The list's name.
    pub name: String,
    /// Deny or allow.
    pub action: ListAction,
    /// Where it was read.
    pub source: String,
    /// Lines that held an entry, duplicates included.
    pub lines: usize,
    /// Its CIDRs, each once.
    pub entries: usize,
    /// Entries given more than once.
    pub duplicates: usize,
    /// Whether a list of that name was replaced.
    pub replaced: bool,
    /// How long applying it took, ms.
    pub applied_ms: u64,
    /// When it ends, RFC 3339 UTC.
    pub expires_at: Option<String>,
    /// The line the CLI prints.
    pub summary: String,
}
