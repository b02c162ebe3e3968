//! The config file and `run`'s rule options together: one setting in both
//! places is refused, naming both.

use super::*;
use crate::{
    error::{Error, Result},
    model::rules::default_limit,
};

impl RawConfig {
    /// Whether nothing is set.
    pub fn is_empty(&self) -> bool {
        *self == RawConfig::default()
    }

    /// The config file `file` with what the command line set (`cli`): setting
    /// one thing in both places is refused, naming both (the file's path is
    /// `path`).
    pub fn merge(mut file: RawConfig, cli: &RawConfig, path: &str) -> Result<RawConfig> {
        let take = Taker { path };
        take.one(&cli.dry_run, &mut file.dry_run, "--dry-run", "dry-run")?;
        take.one(
            &cli.malformed,
            &mut file.malformed,
            "--drop-malformed",
            "malformed",
        )?;
        take.one(&cli.clock, &mut file.clock, "--clock", "clock")?;
        take.one(
            &cli.new_states,
            &mut file.new_states,
            "--new-states",
            "new-states",
        )?;
        take.one(&cli.unjudged, &mut file.unjudged, "--unjudged", "unjudged")?;
        take.one(&cli.drop_log, &mut file.drop_log, "--drop-log", "drop-log")?;
        take.one(
            &cli.fragments,
            &mut file.fragments,
            "--fragments",
            "fragments",
        )?;
        if let Some(c) = &cli.default {
            let d = file.default.get_or_insert_with(RawLimit::default);
            take.one(&c.rate, &mut d.rate, "--rate", "[default] rate")?;
            take.one(&c.burst, &mut d.burst, "--burst", "[default] burst")?;
            take.one(&c.per_v4, &mut d.per_v4, "--per-v4", "[default] per-v4")?;
            take.one(&c.per_v6, &mut d.per_v6, "--per-v6", "[default] per-v6")?;
            take.one(
                &c.new_sources,
                &mut d.new_sources,
                "--new-sources",
                "[default] new-sources",
            )?;
            if d.rate.is_none()
                && d.action.as_deref().unwrap_or("limit") == "limit"
                && d.algorithm.is_none()
            {
                // A burst or key prefix alone keeps the default rate.
                d.rate = Some(default_limit().rate.to_string());
            }
        }
        Ok(file)
    }
}

/// Moves settings of the command line into the file's config.
struct Taker<'a> {
    /// The file's path, for the error.
    path: &'a str,
}

impl Taker<'_> {
    /// Sets `file` to what `cli` set, if it did; both set is an error naming
    /// the option `flag` and the file's `key`.
    fn one<T: Clone>(
        &self,
        cli: &Option<T>,
        file: &mut Option<T>,
        flag: &str,
        key: &str,
    ) -> Result<()> {
        let Some(v) = cli else {
            return Ok(());
        };
        if file.is_some() {
            return Err(Error::invalid(
                flag,
                format!(
                    "{flag} conflicts with `{key}` in {}: set it in one place",
                    self.path
                ),
            ));
        }
        *file = Some(v.clone());
        Ok(())
    }
}
