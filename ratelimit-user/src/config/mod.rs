//! The TOML config file and the `run` options, both turned into one validated
//! [`RuleSet`](crate::model::rules::RuleSet). See `examples/ratelimit.toml`
//! for every key.
//!
//! - [`schema`]: what serde reads, every key as written.
//! - [`limit`]: a rule's match and limit validated.
//! - [`set`]: a whole config validated, every error.
//! - [`merge`]: the file and `run`'s options together.
//! - [`raw_form`]: a rule set back in its raw form (the saved live changes).
//! - [`check`]: reading a file with each error located at its line.

pub mod check;
mod limit;
mod merge;
mod raw_form;
mod schema;
mod set;

pub use schema::*;

#[cfg(test)]
mod tests;
