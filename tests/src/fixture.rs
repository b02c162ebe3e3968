//! The host most privileged tests stand up: a veth pair whose receiving end
//! the daemon runs on, and a run directory of its own.
//!
//! The host owns the pair and the directory; a daemon is a value the test
//! holds, made from the host, so that a restart (`d.stop(…)`, then
//! `h.daemon(…)`) never needs the host mutably while a closure borrows its
//! pair. Made from the host, a daemon is always declared after it, and so
//! dropped (killed) before it; [`Host::start`]'s `let (h, d)` keeps that
//! too, as a pattern's bindings drop right to left. Then the host's own
//! fields go in order: the run directory, then the pair (its pins, then its
//! namespaces): the order the tests kept by hand before. A host a test does
//! not use is bound as `_h`, never `_`: `_` would drop it at once, deleting
//! the namespaces under the daemon.
//!
//! The root check stays a line of its own (`privileged!` before the host):
//! returning an `Option` for the skip would spread every call site over
//! several lines (`let … else { return; }`).

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use crate::{Daemon, SharedBin, TempDir, net::Pair, ratelimit_bin};

/// The name of the config file [`Host::with_config`] writes.
const CONFIG: &str = "rules.toml";

/// A veth pair and a run directory, deleted on drop even when the test
/// panics.
pub struct Host {
    /// The daemons' run directory (`RATELIMIT_RUN_DIR`); removed first.
    run: TempDir,
    /// The config [`Host::with_config`] wrote, as the CLI takes it.
    config: Option<String>,
    /// The namespaces and the veth between them; the daemon runs on
    /// `pair.rx_if`. Dropped last: the pins, then the namespaces.
    pub pair: Pair,
}

impl Host {
    /// A new pair and run directory (`tag` names the directory), no daemon.
    pub fn bare(tag: &str) -> Self {
        Self {
            pair: Pair::new(),
            run: TempDir::new(tag),
            config: None,
        }
    }

    /// [`Host::bare`] with a daemon started on it: `ratelimit run --iface
    /// RX ARGS`.
    pub fn start(tag: &str, args: &[&str]) -> (Self, Daemon) {
        let h = Self::bare(tag);
        let d = h.daemon(args);
        (h, d)
    }

    /// [`Host::start`] with `toml` written to the run directory first and
    /// given as `--config FILE` before `args`; [`Host::config`] is the file.
    pub fn with_config(tag: &str, toml: &str, args: &[&str]) -> (Self, Daemon) {
        let mut h = Self::bare(tag);
        let config = h.write(CONFIG, toml);
        let mut all = vec!["--config", config.as_str()];
        all.extend_from_slice(args);
        let d = h.daemon(&all);
        h.config = Some(config);
        (h, d)
    }

    /// Starts a daemon on the receiving end with this host's run directory
    /// and waits until it answers (see [`Daemon::start`]).
    pub fn daemon(&self, args: &[&str]) -> Daemon {
        Daemon::spawn(
            self.daemon_command(args),
            &self.pair.rx,
            &self.pair.rx_if,
            self.run_dir(),
        )
    }

    /// Starts `cmd` (a `ratelimit run` however wrapped) as the daemon of the
    /// receiving end (see [`Daemon::spawn`]).
    pub fn spawn(&self, cmd: Command) -> Daemon {
        Daemon::spawn(cmd, &self.pair.rx, &self.pair.rx_if, self.run_dir())
    }

    /// The command [`Host::daemon`] runs, not started: for a start that
    /// must be refused, or one whose output the test reads itself.
    pub fn daemon_command(&self, args: &[&str]) -> Command {
        let mut cmd = self.command(&["run", "--iface", &self.pair.rx_if]);
        cmd.args(args);
        cmd
    }

    /// `ratelimit ARGS` in the receiving namespace with this host's run
    /// directory, as an operator types it there: no `--iface` added (a
    /// daemon's [`Daemon::cli`] adds it).
    pub fn command(&self, args: &[&str]) -> Command {
        let mut cmd = self.pair.rx.command(ratelimit_bin());
        cmd.args(args).env("RATELIMIT_RUN_DIR", self.run_dir());
        cmd
    }

    /// [`Host::command`] as `nobody` (uid and gid 65534, no groups), from
    /// `bin`: the build's binary may be where `nobody` cannot reach it.
    pub fn command_as_nobody(&self, bin: &SharedBin, args: &[&str]) -> Command {
        let mut cmd = self.pair.rx.command("setpriv");
        cmd.args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
            .arg(&bin.path)
            .args(args)
            .env("RATELIMIT_RUN_DIR", self.run_dir());
        cmd
    }

    /// The run directory.
    pub fn run_dir(&self) -> &Path {
        &self.run.0
    }

    /// `name` in the run directory.
    pub fn path(&self, name: &str) -> PathBuf {
        self.run_dir().join(name)
    }

    /// Writes `text` to `name` in the run directory; the path, as the CLI
    /// takes it.
    pub fn write(&self, name: &str, text: &str) -> String {
        let path = self.path(name);
        std::fs::write(&path, text).unwrap_or_else(|e| panic!("writing {}: {e}", path.display()));
        path.to_str().expect("a UTF-8 temporary path").to_string()
    }

    /// The config file [`Host::with_config`] wrote (rewrite it to reload).
    pub fn config(&self) -> &str {
        self.config
            .as_deref()
            .expect("a config: the host was made by Host::with_config")
    }
}
