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
    sync::{mpsc, watch},
};
use tracing::{error, info, warn};

use crate::{
    config::RawConfig,
    control::{Response, socket_path},
    error::{Error, Result, chain},
    identity::Identity,
    kernel::{AttachMode, Enforcer, InterfaceState, LoadOptions},
    metrics::{self, SnapshotRequest},
    rules::{Action, RuleSet},
    rundir,
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
            Some(path) => crate::check::file(path, &self.cli)
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
    crate::slots::raise_nofile();
    let id = Identity::here(&opts.iface)?;
    // Everything the user gave is checked before anything else is touched.
    let given = opts.given()?;
    rundir::secure(&id)?;
    rundir::check_files(&id)?;
    let lock = lock(&id)?;
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
            crate::logs::forward(logger);
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
        sweep.tick().await;
        tokio::pin!(shutdown);
        loop {
            tokio::select! {
                () = &mut shutdown => return Ok(()),
                _ = hup.recv() => match self.reload(false) {
                    Ok(()) => {}
                    // One log line per error of the file, each with its line.
                    Err(Error::Config(errors)) => {
                        for line in errors.lines() {
                            error!("{line}");
                        }
                        error!("reload refused: {}; the rules enforced before stay", errors.summary());
                    }
                    Err(e) => error!(error = %chain(&e), "reload refused; nothing changed"),
                },
                _ = sample.tick() => self.sample(),
                _ = sweep.tick() => self.sweep(),
                _ = watch.tick() => self.watch(),
                _ = expire.tick() => self.expire(),
                Some(reply) = metrics_rx.recv() => {
                    let _ = reply.send(self.metrics());
                }
                Some(job) = fleet_rx.recv() => self.fleet_job(job),
                Some((request, reply)) = jobs.recv() => {
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
                        if rule.flags & ratelimit_common::rule_flags::FLEET == 0 {
                            return;
                        }
                        if let Some(Action::Limit(l)) = action
                            && let Ok(limit) = ratelimit_redis::Limit::gcra(
                                l.rate.tokens,
                                Duration::from_nanos(l.rate.period_ns),
                                l.burst,
                            )
                        {
                            rules.insert(
                                rule.id,
                                FleetRule {
                                    name,
                                    limit,
                                    params: *rule.gcra_params(),
                                    bytes: rule.flags & ratelimit_common::rule_flags::BYTES != 0,
                                    per: (rule.key_prefix_v4, rule.key_prefix_v6),
                                },
                            );
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

    /// Makes `next` the rules: written whole or not at all, then saved.
    fn apply(&mut self, next: Rules) -> Result<()> {
        let effective = next.effective();
        effective.validate()?;
        if self.opts.fleet.is_none() && effective.has_fleet() {
            return Err(Error::invalid(
                "--fleet",
                "a fleet-wide rule needs a daemon run with --fleet REDIS_URL (restart it with one)",
            ));
        }
        self.enforcer.maps.apply(&effective)?;
        self.rules = next;
        self.save();
        Ok(())
    }

    fn save(&self) {
        if let Err(e) = store::save(&self.id, &self.rules) {
            error!(error = %chain(&e), "could not save the rules for a restart (the kernel enforces them; a restart will read them back from it)");
        }
    }

    fn announce(&self) {
        let e = &self.enforcer;
        let set = self.rules.effective();
        println!(
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
        );
        for (p, a) in &set.rules {
            println!(
                "ratelimit:   {p}: {}",
                a.text(Some(p.source.addr.is_ipv4()))
            );
        }
        for (name, l) in &set.lists {
            println!(
                "ratelimit:   {} list {name}: {} entries from {}",
                l.action,
                l.entries.len(),
                l.source
            );
        }
    }

    /// Reads the config file again: the new base with the live changes on top
    /// (or alone, with `replace`). All or nothing.
    fn reload(&mut self, replace: bool) -> Result<()> {
        let Some(path) = self.opts.config.clone() else {
            if replace {
                let next = Rules::of(self.rules.base.clone());
                self.apply(next)?;
                info!("live changes dropped");
                return Ok(());
            }
            warn!("reload without --config: nothing to read");
            return Err(Error::Refused(
                "the daemon was started without --config: there is no file to reload".into(),
            ));
        };
        let base = self.opts.given()?.expect("a config file gives a base");
        let live = if replace {
            store::Overlay::default()
        } else {
            self.rules.live.clone()
        };
        self.apply(Rules { base, live })?;
        info!(config = %path.display(), replace, "reloaded");
        self.announce();
        Ok(())
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
            println!(
                "ratelimit: exiting; the program stays attached to {id} and keeps enforcing (--keep-attached)"
            );
        } else {
            // The saved rules stay: the live changes come back with the next
            // start (see `store`).
            match self.enforcer.detach() {
                Ok(()) => println!("ratelimit: detached from {id}"),
                Err(e) => error!(error = %chain(&e), "detaching failed"),
            }
        }
    }
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_else(|_| "host".into())
}

/// CLOCK_MONOTONIC in ns: the clock of `bpf_ktime_get_ns`.
pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid out pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}
