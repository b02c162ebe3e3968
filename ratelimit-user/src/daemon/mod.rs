//! The daemon: load, give the maps their rules, attach, serve the control
//! socket and metrics, follow the interface, and detach on shutdown. [`run`]
//! takes its shutdown as a future so tests can run it in-process.
//!
//! - [`store`]: where the rules come from (the file, live changes on top, the
//!   kernel as the fallback) and where they are saved;
//! - [`server`]: the control socket (concurrent connections, one writer);
//! - `requests`: what each request does.
//!
//! Order at start, so that a failure anywhere leaves what enforced before
//! enforcing, with its pins and saved rules: the user's input is checked; the
//! run directory is checked and the lock taken; the program is loaded (adopting
//! pinned maps) and verified; the rules are decided and written whole (into the
//! trie the running program does not read); only then is the program attached
//! or swapped into the pinned link.

pub mod metrics;
pub mod offline;
mod requests;
pub mod server;
pub mod store;

use std::{
    fs::File,
    future::Future,
    os::fd::AsRawFd,
    path::PathBuf,
    time::{Duration, Instant},
};

use ratelimit_common::{Counter, Event, REASON_COUNT, gcra};
use tokio::{
    net::UnixListener,
    signal::unix::{SignalKind, signal},
    sync::{mpsc, oneshot, watch},
};
use tracing::{error, info, warn};

use crate::{
    config::RawConfig,
    daemon::metrics::SnapshotRequest,
    error::{Error, Result, chain},
    host::identity::Identity,
    host::rundir,
    kernel::monotonic_ns,
    kernel::{AttachMode, Enforcer, InterfaceState, LoadOptions},
    model::rules::{Action, RuleSet},
    protocol::{Response, socket_path},
};
use store::Rules;

/// How the daemon runs.
#[derive(Clone, Debug)]
pub struct RunOptions {
    /// The interface.
    pub iface: String,
    /// A TOML config file, re-read on SIGHUP.
    pub config: Option<PathBuf>,
    /// What the command line's rule options set (nothing else): merged with the
    /// config file, where setting one thing in both places is refused.
    pub cli: RawConfig,
    /// Attach mode.
    pub mode: AttachMode,
    /// Leave the program enforcing after exit.
    pub keep_attached: bool,
    /// Fresh maps (new sizes; buckets and counters start over), rules kept.
    pub reset: bool,
    /// Sizes of maps created now.
    pub load: LoadOptions,
    /// Where to serve Prometheus metrics.
    pub metrics: Option<std::net::SocketAddr>,
    /// The fleet's Redis, for fleet-wide rules.
    pub fleet: Option<String>,
    /// What fleet-wide rules do while Redis cannot be reached.
    pub fleet_fallback: crate::fleet::Fallback,
}

impl RunOptions {
    /// The base rules the user gave (config file and command line), checked;
    /// `None` if they gave none. A config file's errors are all of them, each
    /// with its line ([`Error::Config`]), as `ratelimit check` says them.
    pub fn given(&self) -> Result<Option<RuleSet>> {
        match &self.config {
            Some(path) => crate::config::check::file(path, &self.cli)
                .map(Some)
                .map_err(Error::Config),
            None if self.cli.is_empty() => Ok(None),
            None => RawConfig::merge(RawConfig::default(), &self.cli, "")?
                .validate(&RuleSet::default())
                .map(Some),
        }
    }
}

/// How often counters are sampled for per-second rates.
const SAMPLE_EVERY: Duration = Duration::from_millis(250);
/// The span `stats` rates are computed over (at least; up to
/// [`SAMPLE_EVERY`] more), ending at the request.
const RATE_WINDOW: Duration = Duration::from_secs(1);
/// Samples kept: enough for [`RATE_WINDOW`] and a sample's delay.
const SAMPLES_KEPT: usize = 8;
/// How often idle states are swept (see `ratelimit_common::gcra`, "Wrapping").
const SWEEP_EVERY: Duration = Duration::from_secs(3600);
/// How often the interface is checked (deleted? re-created?).
const WATCH_EVERY: Duration = Duration::from_secs(1);
/// How often temporary rules are checked: each ends at most this late.
const EXPIRE_EVERY: Duration = Duration::from_millis(200);
/// How stale the tracked-sources gauge may be.
const TRACKED_MAX_AGE: Duration = Duration::from_secs(10);
/// How long a reload may take to read and check the config file and its
/// lists before it is refused (the read is left to finish on its own, its
/// result unused): under the CLI's wait for an answer, so `ratelimit reload`
/// says why.
const RELOAD_READ_TIMEOUT: Duration = Duration::from_secs(25);
/// Reloads asked for by `ratelimit reload` that may wait behind the one being
/// read; past it, one is refused (SIGHUPs that wait are one).
const RELOADS_WAITING_MAX: usize = 8;

pub(super) struct Sample {
    at: Instant,
    counters: [Counter; REASON_COUNT as usize],
}

/// What the state maps held and had created when this daemon started, and
/// what its sweeps removed since: for the estimate of evictions.
#[derive(Clone, Copy, Default)]
struct Baseline {
    tracked: usize,
    created: u64,
    swept: u64,
}

/// A reload asked for: by SIGHUP (nobody waits for its answer) or by
/// `ratelimit reload` (its connection does).
struct ReloadAsk {
    replace: bool,
    reply: Option<oneshot::Sender<Response>>,
}

/// The reloads: the config file and its lists are read and checked off the
/// loop, one reload at a time, so that a slow read holds up no change, stats
/// or expiry; the result is applied by the loop when it comes, on top of the
/// live changes as they are then.
#[derive(Default)]
struct Reloads {
    /// The reload being read: its ask, its number, when it started.
    reading: Option<(ReloadAsk, u64, Instant)>,
    /// Those asked for since, in order.
    waiting: std::collections::VecDeque<ReloadAsk>,
    /// The number of the last read started (a late result of an abandoned
    /// read is known by its number and dropped).
    started: u64,
}

/// What a reload's read gives back: its number and the checked base rules.
type ReadDone = (u64, Result<RuleSet>);

struct Daemon {
    opts: RunOptions,
    id: Identity,
    enforcer: Enforcer,
    rules: Rules,
    started: Instant,
    /// Counter samples, oldest first, the last [`SAMPLES_KEPT`].
    samples: std::collections::VecDeque<Sample>,
    tracked: Option<(Instant, usize)>,
    baseline: Baseline,
    /// The interface as last seen.
    interface: InterfaceState,
    /// The fleet sync task's view, when run with --fleet.
    fleet: Option<watch::Receiver<crate::fleet::Status>>,
    /// Reloads being read and waiting.
    reloads: Reloads,
    /// The list files the saved record names.
    list_files: store::ListFiles,
    /// Pinning again what was removed failed (said once).
    pins_failing: bool,
}

/// An exclusive lock on the daemon's identity, released on drop.
struct Lock {
    _file: File,
    path: PathBuf,
}

impl Drop for Lock {
    fn drop(&mut self) {
        rundir::remove(&self.path);
    }
}

fn lock(id: &Identity) -> Result<Lock> {
    let path = rundir::file(id, "lock");
    let file = rundir::open_lock(&path)?;
    // SAFETY: a valid open fd.
    if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
        return Err(Error::AlreadyRunning {
            iface: id.to_string(),
            lock: path,
        });
    }
    Ok(Lock { _file: file, path })
}

/// Runs the daemon on `opts.iface` until `shutdown` completes.
pub async fn run(opts: RunOptions, shutdown: impl Future<Output = ()>) -> Result<()> {
    crate::host::slots::raise_nofile();
    let id = Identity::here(&opts.iface)?;
    // Everything the user gave is checked before anything else is touched.
    let given = opts.given()?;
    rundir::secure(&id)?;
    rundir::check_files(&id)?;
    let lock = lock(&id)?;
    rundir::tidy(&id);
    for dir in crate::kernel::sweep_stale_pins() {
        info!(dir = %dir.display(), "removed the pins of a network namespace that is gone (its interfaces went with it; its maps held kernel memory)");
    }
    let found = store::load(&id);
    let mut prepared = Enforcer::prepare(&id, &opts.load, opts.reset)?;
    // What a previous daemon's pins enforce: the truth to fall back on (kept
    // with --reset too, which renews buckets and counters, not rules).
    let kernel = match prepared.pinned_rules() {
        Some(Err(e)) if opts.reset => {
            warn!(error = %chain(&e), "the pinned maps being replaced (--reset) cannot be read; their rules are not carried over");
            None
        }
        other => other.transpose()?,
    };
    let rules = store::initial(&id, given, found, kernel)?;
    if opts.fleet.is_none() && rules.effective().has_fleet() {
        return Err(Error::invalid(
            "--fleet",
            "the rules have a fleet-wide limit: run with --fleet REDIS_URL (the Redis the fleet shares)",
        ));
    }
    let sizes = prepared.maps.capacities();
    if prepared.adopted_maps && sizes != opts.load {
        info!(
            "the pinned maps keep the sizes they were created with ({} rules, {} IPv4 and {} IPv6 sources, {} wide-state sources); restart with --reset to resize (rules are kept)",
            sizes.rules_capacity,
            sizes.state_capacity,
            sizes.state_capacity_v6,
            sizes.wide_capacity
        );
    }
    let effective = rules.effective();
    // Written into the trie the running program (if any) does not read: a
    // failure here changes nothing it enforces.
    prepared.maps.apply(&effective)?;
    let adopting = prepared.will_adopt();
    let enforcer = prepared.attach(opts.mode)?;
    let counters = enforcer.maps.counters()?;
    let (gcra_keys, wide_keys) = enforcer.maps.tracked()?;
    let baseline = Baseline {
        tracked: gcra_keys + wide_keys,
        created: enforcer.maps.events()?[Event::StateCreated as usize],
        swept: 0,
    };
    let mut daemon = Daemon {
        opts,
        id: id.clone(),
        enforcer,
        rules,
        started: Instant::now(),
        samples: std::collections::VecDeque::from([Sample {
            at: Instant::now(),
            counters,
        }]),
        tracked: None,
        baseline,
        interface: InterfaceState::Attached,
        fleet: None,
        reloads: Reloads::default(),
        list_files: store::ListFiles::default(),
        pins_failing: false,
    };
    daemon.save();
    daemon.announce();

    // From here a failure to start leaves an adopted program enforcing (it was
    // enforcing before); one this daemon attached goes with it.
    let started = daemon.serve_setup().await;
    let (listener, metrics_rx) = match started {
        Ok(s) => s,
        Err(e) => {
            let keep = adopting || daemon.opts.keep_attached;
            daemon.shutdown(keep);
            return Err(e);
        }
    };
    let (jobs_tx, jobs_rx) = mpsc::channel::<server::Job>(64);
    tokio::spawn(server::serve(listener, jobs_tx));
    let (fleet_tx, fleet_rx) = mpsc::channel::<crate::fleet::Job>(4);
    if let Some(url) = daemon.opts.fleet.clone() {
        let (status_tx, status_rx) = watch::channel(crate::fleet::Status::default());
        daemon.fleet = Some(status_rx);
        let member = format!("{}/{}/{}", hostname(), daemon.id, std::process::id());
        info!(redis = %url, fallback = ?daemon.opts.fleet_fallback, "fleet-wide rules are kept in step through Redis");
        tokio::spawn(crate::fleet::run(
            url,
            daemon.opts.fleet_fallback,
            member,
            fleet_tx,
            status_tx,
        ));
    } else {
        drop(fleet_tx);
    }
    daemon
        .run_loop(shutdown, jobs_rx, metrics_rx, fleet_rx)
        .await?;
    let keep = daemon.opts.keep_attached;
    rundir::remove(&socket_path(&daemon.id));
    daemon.shutdown(keep);
    drop(lock);
    Ok(())
}

impl Daemon {
    /// The control socket and the metrics listener.
    async fn serve_setup(&mut self) -> Result<(UnixListener, mpsc::Receiver<SnapshotRequest>)> {
        let sock = socket_path(&self.id);
        // A socket left by a killed daemon (we hold the lock: nobody listens).
        rundir::remove(&sock);
        let listener = UnixListener::bind(&sock).map_err(Error::io(format!(
            "binding the control socket {}",
            sock.display()
        )))?;
        {
            use std::os::unix::fs::PermissionsExt as _;
            let _ = std::fs::set_permissions(&sock, std::fs::Permissions::from_mode(0o600));
        }
        let (metrics_tx, metrics_rx) = mpsc::channel::<SnapshotRequest>(8);
        if let Some(addr) = self.opts.metrics {
            let l = tokio::net::TcpListener::bind(addr)
                .await
                .map_err(Error::io(format!("binding --metrics {addr}")))?;
            info!(%addr, "serving Prometheus metrics at /metrics");
            tokio::spawn(metrics::serve(l, metrics_tx));
        }
        if let Some(logger) = self.enforcer.take_logger() {
            crate::host::logs::forward(logger);
        }
        Ok((listener, metrics_rx))
    }

    async fn run_loop(
        &mut self,
        shutdown: impl Future<Output = ()>,
        mut jobs: mpsc::Receiver<server::Job>,
        mut metrics_rx: mpsc::Receiver<SnapshotRequest>,
        mut fleet_rx: mpsc::Receiver<crate::fleet::Job>,
    ) -> Result<()> {
        let mut hup =
            signal(SignalKind::hangup()).map_err(Error::io("installing SIGHUP handler"))?;
        let mut sample = tokio::time::interval(SAMPLE_EVERY);
        let mut sweep = tokio::time::interval(SWEEP_EVERY);
        let mut watch = tokio::time::interval(WATCH_EVERY);
        let mut expire = tokio::time::interval(EXPIRE_EVERY);
        let (read_tx, mut read_rx) = mpsc::channel::<ReadDone>(4);
        sweep.tick().await;
        tokio::pin!(shutdown);
        loop {
            let read_deadline = self
                .reloads
                .reading
                .as_ref()
                .map(|(_, _, at)| tokio::time::Instant::from_std(*at + RELOAD_READ_TIMEOUT));
            tokio::select! {
                () = &mut shutdown => return Ok(()),
                _ = hup.recv() => self.ask_reload(ReloadAsk { replace: false, reply: None }, &read_tx),
                Some((n, read)) = read_rx.recv() => self.reload_read(n, read, &read_tx),
                () = tokio::time::sleep_until(read_deadline.unwrap_or_else(tokio::time::Instant::now)), if read_deadline.is_some() => {
                    self.reload_timed_out(&read_tx);
                }
                _ = sample.tick() => self.sample(),
                _ = sweep.tick() => self.sweep(),
                _ = watch.tick() => self.watch(),
                _ = expire.tick() => self.expire(),
                // Once nothing else waits: the trie the program does not read
                // catches up with a list change, so the next change is cheap.
                () = tokio::task::yield_now(), if self.enforcer.maps.unsettled() => {
                    if let Err(e) = self.enforcer.maps.settle() {
                        warn!(error = %chain(&e), "bringing the idle rule trie up to date failed; the next change does it");
                    }
                }
                Some(reply) = metrics_rx.recv() => {
                    let _ = reply.send(self.metrics());
                }
                Some(job) = fleet_rx.recv() => self.fleet_job(job),
                Some((request, reply)) = jobs.recv() => {
                    if let crate::protocol::Request::Reload { replace } = request {
                        // Read off the loop; answered when it is applied.
                        self.ask_reload(ReloadAsk { replace, reply: Some(reply) }, &read_tx);
                        continue;
                    }
                    let response = match self.handle(request) {
                        Ok(data) => Response::ok(data),
                        Err(e) => Response::refused_for(&e),
                    };
                    let _ = reply.send(response);
                }
            }
        }
    }

    /// Answers the fleet sync task: what keys were admitted; raises buckets.
    fn fleet_job(&mut self, job: crate::fleet::Job) {
        use crate::fleet::{FleetRule, Job, Snapshot};
        match job {
            Job::Read(reply) => {
                let set = self.rules.effective();
                let mut rules = std::collections::HashMap::new();
                let mut add =
                    |name: String, rule: &ratelimit_common::Rule, action: Option<&Action>| {
                        if let Some(r) = FleetRule::of(name, rule, action) {
                            rules.insert(rule.id, r);
                        }
                    };
                if let Ok(d) = self.enforcer.maps.default_rule() {
                    add("default".into(), &d, Some(&set.default));
                }
                if let Ok(kernel) = self.enforcer.maps.rules() {
                    for (prefix, rule) in &kernel {
                        add(prefix.to_string(), rule, set.rules.get(prefix));
                    }
                }
                let used = self.enforcer.maps.fleet_used();
                let _ = reply.send(Snapshot { rules, used });
            }
            Job::Write(raises) => {
                for r in raises {
                    let (debt, add) = match r.at {
                        Some(at) => (
                            r.debt_ns.saturating_sub(
                                at.elapsed().as_nanos().min(u128::from(u64::MAX)) as u64,
                            ),
                            false,
                        ),
                        None => (r.debt_ns, true),
                    };
                    self.enforcer.maps.raise(&r.key, &r.params, debt, add);
                }
            }
        }
    }

    /// Makes `next` the rules, saved for a restart: written whole or not at
    /// all. The record is written down to its last rename before the kernel
    /// is touched, and put in place once the kernel enforces the change: a
    /// change that cannot be saved (a full disk) is refused with nothing
    /// changed, so no change is acknowledged that a restart would lose.
    fn apply(&mut self, next: Rules) -> Result<()> {
        let effective = next.effective();
        effective.validate()?;
        if self.opts.fleet.is_none() && effective.has_fleet() {
            return Err(Error::invalid(
                "--fleet",
                "a fleet-wide rule needs a daemon run with --fleet REDIS_URL (restart it with one)",
            ));
        }
        let unsaved = |e: Error| Error::NotSaved(chain(&e));
        let pending = store::stage(&self.id, &next, &mut self.list_files).map_err(unsaved)?;
        self.enforcer.maps.apply(&effective)?;
        if let Err(e) = pending.commit() {
            // Back to what the record says (and the kernel enforced).
            if let Err(back) = self.enforcer.maps.apply(&self.rules.effective()) {
                error!(error = %chain(&back), "putting the rules back after a failed save failed: the kernel enforces the refused change until the next one");
            }
            return Err(unsaved(e));
        }
        self.rules = next;
        Ok(())
    }

    /// Ends what expired: in the kernel even when the record cannot be saved
    /// (a restart reads the same ends from the old record and ends them too).
    fn apply_expired(&mut self, next: Rules) -> Result<()> {
        match self.apply(next.clone()) {
            Err(Error::NotSaved(why)) => {
                self.enforcer.maps.apply(&next.effective())?;
                self.rules = next;
                warn!(error = %why, "the ended rules could not be saved; the saved record still holds them with their ends, which a restart ends too");
                Ok(())
            }
            other => other,
        }
    }

    fn save(&mut self) {
        if let Err(e) = store::save(&self.id, &self.rules, &mut self.list_files) {
            error!(error = %chain(&e), "could not save the rules for a restart (the kernel enforces them; a restart given the same config reads the saved record as it was)");
        }
    }

    fn announce(&self) {
        let e = &self.enforcer;
        let set = self.rules.effective();
        say(format_args!(
            "ratelimit: enforcing on {} ({} mode{}): default {}; {} rule(s){}",
            e.id(),
            e.mode(),
            match (e.took_over_link, e.adopted) {
                (true, true) => ", took over the running program, its rules and buckets",
                (true, false) =>
                    ", replaced the running program; fresh buckets and counters (--reset)",
                (false, true) => ", attached anew with the pinned rules and buckets",
                (false, false) => "",
            },
            set.default,
            set.rules.len(),
            if set.dry_run {
                "; DRY RUN: nothing is dropped"
            } else {
                ""
            },
        ));
        for (p, a) in &set.rules {
            say(format_args!(
                "ratelimit:   {p}: {}",
                a.text(Some(p.source.addr.is_ipv4()))
            ));
        }
        for (name, l) in &set.lists {
            say(format_args!(
                "ratelimit:   {} list {name}: {} entries from {}",
                l.action,
                l.entries.len(),
                l.source
            ));
        }
    }

    /// Asks for a reload: started at once when none is being read, else
    /// after those before it.
    fn ask_reload(&mut self, ask: ReloadAsk, read_tx: &mpsc::Sender<ReadDone>) {
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
                let next = Rules::of(self.rules.base.clone());
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
    fn reload_read(&mut self, n: u64, read: Result<RuleSet>, read_tx: &mpsc::Sender<ReadDone>) {
        let Some((ask, _, _)) = self.reloads.reading.take_if(|(_, m, _)| *m == n) else {
            // The late result of a read given up on.
            return;
        };
        let before = self.rules.clone();
        let done = read.and_then(|base| {
            let live = if ask.replace {
                store::Overlay::default()
            } else {
                self.rules.live.clone()
            };
            self.apply(Rules { base, live })?;
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
    fn reload_timed_out(&mut self, read_tx: &mpsc::Sender<ReadDone>) {
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
    fn reload_done(&mut self, ask: ReloadAsk, done: Result<()>, before: Option<&Rules>) {
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
            let response = match done {
                Ok(()) => Response::ok(self.reloaded(before.unwrap_or(&self.rules))),
                Err(e) => Response::refused_for(&e),
            };
            let _ = reply.send(response);
        }
    }

    /// The sample rates are computed from (to now): the newest at least
    /// [`RATE_WINDOW`] old, else the oldest (a daemon started less than a
    /// second ago); `None` when there is none older than a tenth of a second.
    pub(super) fn rate_window(&self) -> Option<&Sample> {
        self.samples
            .iter()
            .rev()
            .find(|s| s.at.elapsed() >= RATE_WINDOW)
            .or_else(|| self.samples.front())
            .filter(|s| s.at.elapsed() >= Duration::from_millis(100))
    }

    fn sample(&mut self) {
        match self.enforcer.maps.counters() {
            Ok(counters) => {
                let now = Sample {
                    at: Instant::now(),
                    counters,
                };
                if self.samples.len() == SAMPLES_KEPT {
                    self.samples.pop_front();
                }
                self.samples.push_back(now);
            }
            Err(e) => warn!(error = %chain(&e), "reading counters failed"),
        }
    }

    /// Deletes states idle for longer than any bucket takes to refill: they read
    /// as full buckets anyway, and deleting them keeps the tick wrap harmless.
    fn sweep(&mut self) {
        let now = monotonic_ns();
        let limit_ns = gcra::TAU_MAX >> ratelimit_common::TICK_SHIFT;
        let idle: Vec<_> = self
            .enforcer
            .maps
            .states()
            .filter_map(|e| e.ok())
            .filter(|(_, s)| gcra::idle_for_ns(s, now).is_some_and(|idle| idle > limit_ns))
            .map(|(k, _)| k)
            .collect();
        for key in &idle {
            if self.enforcer.maps.remove_state(key).is_ok() {
                self.baseline.swept += 1;
            }
        }
        if !idle.is_empty() {
            info!(removed = idle.len(), "idle sweep");
        }
    }

    /// Follows the interface: when it is deleted, nothing is enforced (said
    /// once, and in `status`); when one of that name comes back, the program is
    /// attached to it again with its rules and buckets.
    fn watch(&mut self) {
        match self.enforcer.check_pins() {
            Ok(false) => self.pins_failing = false,
            Ok(true) => {
                self.pins_failing = false;
                warn!(iface = %self.id, pins = %self.enforcer.pin_dir().display(), "the pins were removed under the daemon: pinned again from its own handles (a restart adopts them, --keep-attached keeps them)");
            }
            Err(e) => {
                if !self.pins_failing {
                    error!(iface = %self.id, error = %chain(&e), "the pins were removed under the daemon and pinning them again failed (tried every second): a restart will not adopt this program, and an exit detaches it");
                }
                self.pins_failing = true;
            }
        }
        let now = self.enforcer.check_interface();
        match (self.interface, now) {
            (_, InterfaceState::Recreated) => match self.enforcer.reattach() {
                Ok(()) => {
                    warn!(iface = %self.id, mode = %self.enforcer.mode(), "the interface was re-created: attached to it again, rules and buckets kept");
                    self.interface = InterfaceState::Attached;
                }
                Err(e) => {
                    if self.interface != InterfaceState::Recreated {
                        error!(iface = %self.id, error = %chain(&e), "the interface was re-created but attaching to it failed; nothing is enforced on it");
                    }
                    self.interface = InterfaceState::Recreated;
                }
            },
            (InterfaceState::Attached, InterfaceState::Gone) => {
                error!(iface = %self.id, "the interface is gone: nothing is enforced until it comes back");
                self.interface = InterfaceState::Gone;
            }
            (_, state) => self.interface = state,
        }
    }

    fn metrics(&mut self) -> metrics::Snapshot {
        if self
            .tracked
            .is_none_or(|(at, _)| at.elapsed() > TRACKED_MAX_AGE)
        {
            let (gcra_keys, wide_keys) = self.enforcer.maps.tracked().unwrap_or_default();
            self.tracked = Some((Instant::now(), gcra_keys + wide_keys));
        }
        metrics::Snapshot {
            iface: self.enforcer.iface().to_string(),
            mode: self.enforcer.mode(),
            attached: self.interface == InterfaceState::Attached,
            counters: self.enforcer.maps.counters().unwrap_or_default(),
            events: self.enforcer.maps.events().unwrap_or_default(),
            tracked: self.tracked.map_or(0, |(_, n)| n),
            rules: self.rules.effective().rules.len(),
            rule_counters: self.rule_counters(),
            fleet: self.fleet.as_ref().map(|s| s.borrow().clone()),
        }
    }

    /// Each rule's counters, the default rule's first (a rule whose counters
    /// cannot be read is left out).
    fn rule_counters(
        &self,
    ) -> Vec<(
        String,
        [ratelimit_common::Counter; ratelimit_common::RuleCounter::ALL.len()],
    )> {
        let maps = &self.enforcer.maps;
        let mut out: Vec<_> = maps
            .rule_counters(0)
            .map(|c| ("default".to_string(), c))
            .into_iter()
            .collect();
        for (p, rule) in maps.rules().unwrap_or_default() {
            if let Ok(c) = maps.rule_counters(rule.slot) {
                out.push((p.to_string(), c));
            }
        }
        out
    }

    fn shutdown(self, keep: bool) {
        let id = self.id.clone();
        if keep {
            self.enforcer.keep();
            say(format_args!(
                "ratelimit: exiting; the program stays attached to {id} and keeps enforcing (--keep-attached)"
            ));
        } else {
            // The saved rules stay: the live changes come back with the next
            // start (see `store`).
            match self.enforcer.detach() {
                Ok(()) => say(format_args!("ratelimit: detached from {id}")),
                Err(e) => error!(error = %chain(&e), "detaching failed"),
            }
        }
    }
}

/// Prints `line` on stdout, for whoever watches the daemon. Written, not
/// printed: a closed stdout (`ratelimit run … | head -1`) is no reason to
/// panic or to stop enforcing; the logs (stderr) say the rest.
fn say(line: std::fmt::Arguments<'_>) {
    use std::io::Write as _;
    let _ = writeln!(std::io::stdout(), "{line}");
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_else(|_| "host".into())
}
