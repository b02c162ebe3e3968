//! The daemon: load, give the maps their rules, attach, serve the control
//! socket and metrics, follow the interface, and detach on shutdown. [`run`]
//! takes its shutdown as a future so tests can run it in-process.
//!
//! - [`store`]: where the rules come from (the file, live changes on top, the
//!   kernel as the fallback) and where they are saved;
//! - [`control`]: the control socket's server (concurrent connections, one
//!   writer);
//! - `handlers`: a handler per request; the loop only dispatches;
//! - `read`: the read-only answers, built alike for the daemon and
//!   [`offline`] (a program read from its pins with no daemon);
//! - `reload`: the config file read again, off the loop;
//! - `upkeep`: what the loop does on its timers (samples, the idle sweep,
//!   the interface and the pins) and for metrics and the fleet sync;
//! - [`droplog`]: the drop log's reader and buffer (`ratelimit log`);
//! - [`metrics`]: Prometheus metrics.
//!
//! Order at start, so that a failure anywhere leaves what enforced before
//! enforcing, with its pins and saved rules: the user's input is checked; the
//! run directory is checked and the lock taken; the program is loaded (adopting
//! pinned maps) and verified; the rules are decided and written whole (into the
//! trie the running program does not read); only then is the program attached
//! or swapped into the pinned link.

pub mod control;
mod crowdsec;
pub mod droplog;
mod handlers;
pub mod metrics;
pub mod offline;
mod read;
mod reload;
pub mod store;
mod upkeep;

use std::{
    fs::File,
    future::Future,
    os::fd::AsRawFd,
    path::PathBuf,
    time::{Duration, Instant},
};

use ratelimit_common::{Counter, Event, REASON_COUNT};
use tokio::{
    net::UnixListener,
    signal::unix::{SignalKind, signal},
    sync::{mpsc, watch},
};
use tracing::{error, info, warn};

use crate::{
    config::RawConfig,
    daemon::metrics::SnapshotRequest,
    error::{Error, Result, chain},
    host::identity::Identity,
    host::rundir,
    kernel::{AttachMode, Enforcer, InterfaceState, LoadOptions},
    model::rules::RuleSet,
    protocol::socket_path,
};
use crate::{host::clock::now_ms, model::overlay::Layers};
use reload::{ReadDone, ReloadAsk, Reloads};

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
    /// Without `fleet`: remove fleet-wide rules rather than refuse to start.
    pub drop_fleet_rules: bool,
    /// The CrowdSec Local API whose decisions are enforced.
    pub crowdsec: Option<crate::crowdsec::Options>,
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
/// How often the maps are checked against what the daemon wrote
/// ([`crate::kernel::Maps::check`]).
const DRIFT_EVERY: Duration = Duration::from_secs(5);
/// List entries looked up in each trie at each check: a million in about
/// 40 minutes, a few milliseconds a check.
const DRIFT_WINDOW: usize = 2_000;
/// How stale the tracked-sources gauge may be.
const TRACKED_MAX_AGE: Duration = Duration::from_secs(10);

/// A reading of the counters by reason, for per-second rates.
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

struct Daemon {
    opts: RunOptions,
    id: Identity,
    enforcer: Enforcer,
    rules: Layers,
    started: Instant,
    /// Counter samples, oldest first, the last [`SAMPLES_KEPT`].
    samples: std::collections::VecDeque<Sample>,
    tracked: Option<(Instant, usize)>,
    baseline: Baseline,
    /// The interface as last seen.
    interface: InterfaceState,
    /// The fleet sync task's view, when run with --fleet.
    fleet: Option<watch::Receiver<crate::fleet::Status>>,
    /// The fleet sync's histograms, when run with --fleet.
    fleet_metrics: Option<crate::fleet::Metrics>,
    /// Writing the fleet heartbeat failed (said once).
    beat_failing: bool,
    /// The CrowdSec bouncer's view, when run with --crowdsec.
    crowdsec: Option<watch::Receiver<crate::crowdsec::Status>>,
    /// The decisions held, for the bouncer to compare its pulls with.
    crowdsec_held: Option<watch::Sender<crate::model::decisions::Decisions>>,
    /// Entries of the maps found different from what the daemon wrote, and
    /// put back, since it started.
    drift_repaired: u64,
    /// Reloads being read and waiting.
    reloads: Reloads,
    /// The list files the saved record names.
    list_files: store::ListFiles,
    /// Pinning again what was removed failed (said once).
    pins_failing: bool,
    /// The drop log's last records, filled by its reader.
    drop_log: droplog::SharedLog,
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
            iface: id.iface.clone(),
            place: id.to_string(),
            lock: path,
        });
    }
    Ok(Lock { _file: file, path })
}

/// Runs the daemon on `opts.iface` until `shutdown` completes.
pub async fn run(opts: RunOptions, shutdown: impl Future<Output = ()>) -> Result<()> {
    crate::host::slots::raise_nofile();
    // A kernel below the core's minimum is refused before anything is
    // touched; the optional features it lacks are named once known.
    let release = crate::host::kernel::release();
    crate::host::kernel::check(&release)?;
    let id = Identity::here(&opts.iface)?;
    for m in crate::host::kernel::missing() {
        warn!(kernel = %release, "{m}");
    }
    // Everything the user gave is checked before anything else is touched.
    let given = opts.given()?;
    rundir::secure(&id)?;
    rundir::check_files(&id)?;
    let lock = lock(&id)?;
    rundir::tidy(&id);
    for gone in crate::kernel::pins::remove_orphans() {
        info!(dir = %gone.dir.display(), mib = gone.bytes >> 20, "removed the pins of a network namespace that is gone (its interfaces went with it; its maps held kernel memory)");
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
    let mut rules = store::initial(&id, given, found, kernel)?;
    if opts.crowdsec.is_none() && !rules.decisions.is_empty() {
        let n = rules.decisions.clear();
        info!(
            decisions = n,
            "run without --crowdsec: the CrowdSec decisions saved by the last daemon are not enforced"
        );
    }
    let fleet_rules = rules.fleet_rules();
    if opts.fleet.is_none() && !fleet_rules.is_empty() {
        let named = fleet_rules.join(", ");
        if !opts.drop_fleet_rules {
            return Err(Error::invalid(
                "--fleet",
                format!(
                    "fleet-wide limits ({named}) need a daemon run with --fleet REDIS_URL (the Redis the fleet shares); to start without the fleet, add --drop-fleet-rules: those rules are removed (a config file's until `ratelimit reload --replace`) and a fleet-wide default rule becomes a limit of this host alone"
                ),
            ));
        }
        rules.drop_fleet();
        warn!(rules = %named, "started without --fleet: the fleet-wide rules are removed (--drop-fleet-rules); a fleet-wide default rule is a limit of this host alone");
    }
    let sizes = prepared.maps.capacities();
    if prepared.adopted_maps && sizes != opts.load.as_created() {
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
        fleet_metrics: None,
        beat_failing: false,
        crowdsec: None,
        crowdsec_held: None,
        drift_repaired: 0,
        reloads: Reloads::default(),
        list_files: store::ListFiles::default(),
        pins_failing: false,
        drop_log: droplog::SharedLog::default(),
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
    let (jobs_tx, jobs_rx) = mpsc::channel::<control::Job>(64);
    tokio::spawn(control::serve(listener, jobs_tx));
    let (fleet_rx, fleet_task) = daemon.start_fleet();
    let crowdsec_rx = daemon.start_crowdsec();
    daemon
        .run_loop(shutdown, jobs_rx, metrics_rx, fleet_rx, crowdsec_rx)
        .await?;
    let keep = daemon.opts.keep_attached;
    if let Some(FleetTask { task, url, member }) = fleet_task {
        task.abort();
        // With --keep-attached the program stays and charges by the
        // heartbeat: still a member while its lease runs. Without, it goes
        // with the daemon, which leaves the fleet's members.
        if !keep {
            crate::fleet::leave(&url, &member).await;
        }
    }
    rundir::remove(&socket_path(&daemon.id));
    daemon.shutdown(keep);
    drop(lock);
    Ok(())
}

/// The fleet's sync task, its Redis and this daemon's member name (to
/// leave the fleet when the daemon stops).
struct FleetTask {
    task: tokio::task::JoinHandle<()>,
    url: String,
    member: String,
}

impl Daemon {
    /// The fleet's sync task, with `--fleet`: its jobs (none without), and
    /// the task.
    fn start_fleet(&mut self) -> (mpsc::Receiver<crate::fleet::Job>, Option<FleetTask>) {
        let (fleet_tx, fleet_rx) = mpsc::channel::<crate::fleet::Job>(4);
        let Some(url) = self.opts.fleet.clone() else {
            return (fleet_rx, None);
        };
        let (status_tx, status_rx) = watch::channel(crate::fleet::Status::default());
        self.fleet = Some(status_rx);
        let metrics = crate::fleet::Metrics::default();
        self.fleet_metrics = Some(metrics.clone());
        // The same member across restarts of this daemon (no pid): a
        // restart is not counted twice while the old lease runs.
        let member = format!("{}/{}", hostname(), self.id);
        info!(redis = %url, fallback = ?self.opts.fleet_fallback, "fleet-wide rules are kept in step through Redis");
        let task = tokio::spawn(crate::fleet::run(
            url.clone(),
            self.opts.fleet_fallback,
            member.clone(),
            fleet_tx,
            status_tx,
            metrics,
        ));
        (fleet_rx, Some(FleetTask { task, url, member }))
    }

    /// The CrowdSec bouncer's task, with `--crowdsec`: its jobs (none
    /// without).
    fn start_crowdsec(&mut self) -> mpsc::Receiver<crate::crowdsec::Job> {
        let (crowdsec_tx, crowdsec_rx) = mpsc::channel::<crate::crowdsec::Job>(1);
        if let Some(cs) = self.opts.crowdsec.clone() {
            let (status_tx, status_rx) = watch::channel(crate::crowdsec::Status::default());
            self.crowdsec = Some(status_rx);
            let (held_tx, held_rx) = watch::channel(self.rules.decisions.clone());
            self.crowdsec_held = Some(held_tx);
            info!(lapi = %cs.lapi.url, every = ?cs.every, "enforcing the decisions of a CrowdSec Local API");
            tokio::spawn(crate::crowdsec::run(cs, crowdsec_tx, status_tx, held_rx));
        }
        crowdsec_rx
    }

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
        match self.enforcer.maps.drop_log_reader() {
            Ok(ring) => droplog::spawn_reader(ring, self.drop_log.clone()),
            Err(e) => {
                warn!(error = %chain(&e), "cannot read the drop log's ring buffer: `ratelimit log` will stay empty")
            }
        }
        Ok((listener, metrics_rx))
    }

    async fn run_loop(
        &mut self,
        shutdown: impl Future<Output = ()>,
        mut jobs: mpsc::Receiver<control::Job>,
        mut metrics_rx: mpsc::Receiver<SnapshotRequest>,
        mut fleet_rx: mpsc::Receiver<crate::fleet::Job>,
        mut crowdsec_rx: mpsc::Receiver<crate::crowdsec::Job>,
    ) -> Result<()> {
        let mut hup =
            signal(SignalKind::hangup()).map_err(Error::io("installing SIGHUP handler"))?;
        let mut sample = tokio::time::interval(SAMPLE_EVERY);
        let mut sweep = tokio::time::interval(SWEEP_EVERY);
        let mut watch = tokio::time::interval(WATCH_EVERY);
        let mut expire = tokio::time::interval(EXPIRE_EVERY);
        let mut drift = tokio::time::interval(DRIFT_EVERY);
        let (read_tx, mut read_rx) = mpsc::channel::<ReadDone>(4);
        sweep.tick().await;
        tokio::pin!(shutdown);
        loop {
            let read_deadline = self.reload_deadline();
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
                _ = drift.tick() => self.check_drift(),
                _ = expire.tick() => {
                    self.expire();
                    self.publish_decisions();
                }
                // Once nothing else waits: the trie the program does not read
                // catches up with a list change, so the next change is cheap.
                () = tokio::task::yield_now(), if self.enforcer.maps.unsettled() => self.settle(),
                Some(reply) = metrics_rx.recv() => {
                    let _ = reply.send(self.metrics());
                }
                Some(job) = fleet_rx.recv() => self.fleet_job(job),
                Some(job) = crowdsec_rx.recv() => self.crowdsec_job(job),
                Some((request, reply)) = jobs.recv() => {
                    if let crate::protocol::Request::Reload { replace } = request {
                        // Read off the loop; answered when it is applied.
                        self.ask_reload(ReloadAsk { replace, reply: Some(reply) }, &read_tx);
                        continue;
                    }
                    let _ = reply.send(self.handle(request));
                }
            }
        }
    }

    /// Makes `next` the rules, saved for a restart: written whole or not at
    /// all. The record is written down to its last rename before the kernel
    /// is touched, and put in place once the kernel enforces the change: a
    /// change that cannot be saved (a full disk) is refused with nothing
    /// changed, so no change is acknowledged that a restart would lose.
    fn apply(&mut self, next: Layers) -> Result<()> {
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

    /// Ends the temporary rules and lists whose time came; logs what ended.
    fn expire(&mut self) {
        let now = now_ms();
        if !self.rules.has_due(now) {
            return;
        }
        let mut next = self.rules.clone();
        let ended = next.expire(now);
        match self.apply_expired(next) {
            Ok(()) => info!(ended = %ended.join(", "), "temporary rules ended"),
            Err(e) => {
                // Tried again in a minute; until then what was set stays.
                error!(ended = %ended.join(", "), error = %chain(&e), "ending temporary rules failed; they stay until the next try");
                self.rules.postpone_due(now, 60_000);
            }
        }
    }

    /// Ends what expired: in the kernel even when the record cannot be saved
    /// (a restart reads the same ends from the old record and ends them too).
    fn apply_expired(&mut self, next: Layers) -> Result<()> {
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
                _ if e.upgraded_from.is_some() =>
                    ", replaced the running program of an earlier version: rules from the record, fresh buckets and counters",
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
        // Live changes kept from before this start are marked: an operator
        // who restarts with a changed config sees what does not come from it.
        let live = |yes: bool| if yes { "  (live)" } else { "" };
        let mut any_live = self.rules.live.default.is_some();
        if set.mode != crate::model::rules::Mode::Normal {
            say(format_args!(
                "ratelimit:   mode {}{}",
                set.mode.name(),
                live(self.rules.live.mode.is_some())
            ));
        }
        for (p, a) in &set.rules {
            let is_live = self.rules.origin(p) == "live";
            any_live |= is_live;
            say(format_args!(
                "ratelimit:   {p}: {}{}",
                a.text(Some(p.source.addr.is_ipv4())),
                live(is_live)
            ));
        }
        for (name, l) in &set.lists {
            let is_live = self.rules.list_origin(name) == "live";
            any_live |= is_live;
            say(format_args!(
                "ratelimit:   {} list {name}: {} entries from {}{}",
                l.action,
                l.entries.len(),
                l.source,
                live(is_live)
            ));
        }
        if let Some(live_default) = self.rules.live.default
            && live_default != self.rules.base.default
        {
            // The start's own default is not what is enforced: name it, and
            // what overrides it.
            say(format_args!(
                "ratelimit:   the default rule is the one set live before this start, {live_default}; this start's {} ({}) is overridden until `ratelimit reset --live`",
                if self.opts.config.is_some() {
                    "config file's default"
                } else {
                    "--rate/--burst"
                },
                self.rules.base.default
            ));
        }
        if any_live || self.rules.live.mode.is_some() {
            say(format_args!(
                "ratelimit:   (live: changes made with the CLI before this start, kept on top of {}{}; `ratelimit reset --live` drops them)",
                if self.opts.config.is_some() {
                    "the config file"
                } else {
                    "the command line's rules"
                },
                if self.rules.live.default.is_some() {
                    ", the default rule among them"
                } else {
                    ""
                },
            ));
        }
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
