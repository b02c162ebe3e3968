//! `ratelimit mode`: normal or allowlist-only, kept as a live change.

use crate::{daemon::Daemon, error::Result, model::rules::Mode, protocol::answer::Changed};

impl Daemon {
    /// Switches the mode.
    pub(super) fn mode(&mut self, mode: Mode) -> Result<Changed> {
        self.change(|r| {
            r.live.mode = Some(mode);
            Ok(())
        })
    }
}
