//! The rules as the daemon validates and keeps them, with nothing of the
//! kernel or the wire: rates and durations ([`rate`]), what a rule matches
//! ([`matching`]), named source lists ([`lists`]), the rule set
//! ([`rules`]), CrowdSec's decisions ([`decisions`]) and how their numbers and times are written for people
//! and scripts ([`describe`]).

pub mod decisions;
pub mod describe;
pub mod droplog;
pub mod encode;
pub mod limit;
pub mod lists;
pub mod matching;
pub mod overlay;
pub mod ports;
pub mod prefix;
pub mod rules;

pub use ratelimit_host::rate;
