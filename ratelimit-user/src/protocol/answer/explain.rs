//! `ratelimit explain` and `ratelimit get`: which rule judges a frame and
//! why ([`Explained`]), and a source's state under the rules that may judge
//! it ([`States`]). Built by the daemon's `explain` handler from
//! [`crate::kernel::explain`] and the state maps; printed by the CLI.

use serde::{Deserialize, Serialize};

use crate::model::rules::Mode;

/// Which rule judges a frame, whom it beat and why, and the source's state
/// under it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Explained {
    /// The frame asked about, in words (`udp from 198.18.0.20 to port 27015`).
    pub frame: String,
    /// What judges it.
    pub judged_by: Judged,
    /// What it does to the frame, the mode taken into account (`limit 10/s
    /// burst 10 per /32`, `deny`, …).
    pub action: String,
    /// Normal or allowlist-only.
    pub mode: Mode,
    /// Every other rule or list entry whose source holds the frame's, and
    /// the default rule, each with why it does not judge the frame.
    pub beaten: Vec<Beaten>,
    /// Flags a rule on the way needed to tell and the question did not give
    /// (`--dport`, …): such a rule was taken as not matching.
    pub not_given: Vec<String>,
    /// The source's state under the judging rule, when it is a limit.
    pub state: Option<KeyState>,
}

/// What judges a frame: a rule, a list's entry, the default rule.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Judged {
    /// `rule`, `list` or `default`.
    pub kind: JudgeKind,
    /// The rule's selector (`198.18.0.0/24 udp dport 27015`), the list's
    /// name and entry (`bad 198.18.4.0/24`), or `default`.
    pub name: String,
    /// The rule as `list` shows it.
    pub rule: String,
}

/// A kind of judge.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum JudgeKind {
    /// A rule.
    Rule,
    /// A list's entry.
    List,
    /// The default rule.
    Default,
}

/// A rule that does not judge the frame, and why.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Beaten {
    /// Which.
    #[serde(flatten)]
    pub judge: Judged,
    /// Why not.
    pub why: String,
}

/// A source's state under one limit rule.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct KeyState {
    /// The rule (`default`, a selector).
    pub rule: String,
    /// The source's key under it: the source masked to the rule's key
    /// prefix (`198.18.0.0/24` for a limit per /24).
    pub key: String,
    /// The rule's algorithm.
    pub algorithm: String,
    /// Whether the key has a state of its own. Without one its frames meet
    /// the rule's new-source budget until the doorkeeper has seen it twice;
    /// its bucket is then full.
    pub tracked: bool,
    /// Whether a frame from it would be admitted now (by its own bucket;
    /// key levels and the aggregate may still refuse it).
    pub admitted_now: bool,
    /// Units left after such a frame (or now, when it would be refused).
    pub remaining: u64,
    /// Seconds until a frame is admitted again; 0 when one would be now,
    /// null when never (a rate of 0).
    pub next_admission_in_s: Option<f64>,
    /// Seconds since the key got its state.
    pub age_s: Option<f64>,
}

/// A source's state under every limit rule that may judge its frames.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct States {
    /// The source.
    pub source: String,
    /// Under each limit rule whose source holds it, the default rule last.
    pub states: Vec<KeyState>,
}
