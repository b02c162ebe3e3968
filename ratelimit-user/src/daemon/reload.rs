//! Reloads of the config file (SIGHUP, `ratelimit reload`): the file and its
//! lists are read and checked off the daemon's loop, one reload at a time, so
//! that a slow read holds up no change, stats or expiry; the loop applies the
//! result when it comes, on top of the live changes as they are then, and
//! answers the client that asked with what changed.

use std::time::{Duration, Instant};

use tokio::sync::{mpsc, oneshot};
use tracing::{error, info, warn};

use super::Daemon;
use crate::{
    error::{Error, Result, chain},
    model::overlay::{Layers, Overlay},
    model::rules::RuleSet,
    protocol::answer::Answer,
};

/// How long a reload may take to read and check the config file and its
/// lists before it is refused (the read is left to finish on its own, its
/// result unused): under the CLI's wait for an answer, so `ratelimit reload`
/// says why.
const RELOAD_READ_TIMEOUT: Duration = Duration::from_secs(25);
/// Reloads asked for by `ratelimit reload` that may wait behind the one being
/// read; past it, one is refused (SIGHUPs that wait are one).
const RELOADS_WAITING_MAX: usize = 8;

/// A reload asked for: by SIGHUP (nobody waits for its answer) or by
/// `ratelimit reload` (its connection does).
pub(super) struct ReloadAsk {
    /// Drop the live changes: the file alone.
    pub(super) replace: bool,
    /// Where its answer goes, if anybody waits for it.
    pub(super) reply: Option<oneshot::Sender<Result<Answer>>>,
}

/// The reloads: the config file and its lists are read and checked off the
/// loop, one reload at a time, so that a slow read holds up no change, stats
/// or expiry; the result is applied by the loop when it comes, on top of the
/// live changes as they are then.
#[derive(Default)]
pub(super) struct Reloads {
    /// The reload being read: its ask, its number, when it started.
    reading: Option<(ReloadAsk, u64, Instant)>,
    /// Those asked for since, in order.
    waiting: std::collections::VecDeque<ReloadAsk>,
    /// The number of the last read started (a late result of an abandoned
    /// read is known by its number and dropped).
    started: u64,
}

/// What a reload's read gives back: its number and the checked base rules.
pub(super) type ReadDone = (u64, Result<RuleSet>);

impl Daemon {
    /// When the reload being read is given up on, if one is.
    pub(super) fn reload_deadline(&self) -> Option<tokio::time::Instant> {
        self.reloads
            .reading
            .as_ref()
            .map(|(_, _, at)| tokio::time::Instant::from_std(*at + RELOAD_READ_TIMEOUT))
    }

    /// Asks for a reload: started at once when none is being read, else
    /// after those before it.
    pub(super) fn ask_reload(&mut self, ask: ReloadAsk, read_tx: &mpsc::Sender<ReadDone>) {
        let r = &mut self.reloads;
        if r.reading.is_some() {
            if ask.reply.is_none() && r.waiting.iter().any(|w| w.reply.is_none() && !w.replace) {
                // SIGHUPs that wait together are one.
                return;
            }
            if r.waiting.len() >= RELOADS_WAITING_MAX {
                let e = Error::Refused(format!(
                    "{} reloads are waiting for the one being read; try again when it is done",
                    r.waiting.len()
                ));
                self.reload_done(ask, Err(e), None);
                return;
            }
            r.waiting.push_back(ask);
            return;
        }
        self.start_reload(ask, read_tx);
    }

    /// Starts a reload: a daemon started without --config answers at once;
    /// else its file and lists are read and checked on a thread of their own
    /// (a file system that hangs holds up that thread alone; a thread, not
    /// the runtime's blocking pool, whose end the runtime would wait for at
    /// exit), and [`Daemon::reload_read`] applies what it read.
    fn start_reload(&mut self, ask: ReloadAsk, read_tx: &mpsc::Sender<ReadDone>) {
        if self.opts.config.is_none() {
            let before = self.rules.clone();
            let done = if ask.replace {
                let next = Layers {
                    decisions: self.rules.decisions.clone(),
                    ..Layers::of(self.rules.base.clone())
                };
                self.apply(next).inspect(|()| info!("live changes dropped"))
            } else {
                warn!("reload without --config: nothing to read");
                Err(Error::Refused(
                    "the daemon was started without --config: there is no file to reload".into(),
                ))
            };
            self.reload_done(ask, done, Some(&before));
            return;
        }
        self.reloads.started += 1;
        let n = self.reloads.started;
        let opts = self.opts.clone();
        let tx = read_tx.clone();
        let spawned = std::thread::Builder::new()
            .name("reload".into())
            .spawn(move || {
                let read = opts
                    .given()
                    .map(|set| set.expect("a config file gives a base"));
                let _ = tx.blocking_send((n, read));
            });
        match spawned {
            Ok(_) => self.reloads.reading = Some((ask, n, Instant::now())),
            Err(e) => {
                let e = Error::Io {
                    what: "starting a thread to read the config file".into(),
                    source: e,
                };
                self.reload_done(ask, Err(e), None);
            }
        }
    }

    /// A reload's read came back (`n`: its number): the new base with the
    /// live changes as they are now on top (or alone, with `replace`),
    /// applied whole or not at all; then the next reload waiting starts.
    pub(super) fn reload_read(
        &mut self,
        n: u64,
        read: Result<RuleSet>,
        read_tx: &mpsc::Sender<ReadDone>,
    ) {
        let Some((ask, _, _)) = self.reloads.reading.take_if(|(_, m, _)| *m == n) else {
            // The late result of a read given up on.
            return;
        };
        let before = self.rules.clone();
        let done = read.and_then(|base| {
            let live = if ask.replace {
                Overlay::default()
            } else {
                self.rules.live.clone()
            };
            self.apply(Layers {
                base,
                live,
                decisions: self.rules.decisions.clone(),
            })?;
            let path = self.opts.config.clone().unwrap_or_default();
            info!(config = %path.display(), replace = ask.replace, "reloaded");
            self.announce();
            Ok(())
        });
        self.reload_done(ask, done, Some(&before));
        if let Some(next) = self.reloads.waiting.pop_front() {
            self.start_reload(next, read_tx);
        }
    }

    /// The reload being read took too long: refused (its read, if it ever
    /// ends, is dropped).
    pub(super) fn reload_timed_out(&mut self, read_tx: &mpsc::Sender<ReadDone>) {
        let Some((_, n, _)) = &self.reloads.reading else {
            return;
        };
        let path = self.opts.config.clone().unwrap_or_default();
        let e = Error::Refused(format!(
            "reading {} and its lists took more than {} s (a slow or hung file system?); nothing changed",
            path.display(),
            RELOAD_READ_TIMEOUT.as_secs()
        ));
        self.reload_read(*n, Err(e), read_tx);
    }

    /// Says how a reload went: to its client (the rules and what changed
    /// since `before`), and in the log.
    fn reload_done(&mut self, ask: ReloadAsk, done: Result<()>, before: Option<&Layers>) {
        match &done {
            Ok(()) => {}
            // One log line per error of the file, each with its line.
            Err(Error::Config(errors)) => {
                for line in errors.lines() {
                    error!("{line}");
                }
                error!(
                    "reload refused: {}; the rules enforced before stay",
                    errors.summary()
                );
            }
            Err(e) => error!(error = %chain(e), "reload refused; nothing changed"),
        }
        if let Some(reply) = ask.reply {
            let answer = done
                .and_then(|()| self.reloaded(before.unwrap_or(&self.rules)))
                .map(Answer::from);
            let _ = reply.send(answer);
        }
    }
}
