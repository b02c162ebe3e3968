//! The daemon: load, attach, enforce a rule set, serve the control socket, and
//! detach on shutdown. [`run`] takes its shutdown as a future so tests can run it
//! in-process.

use std::{
    fs::File,
    future::Future,
    os::{fd::AsRawFd, unix::fs::PermissionsExt},
    path::PathBuf,
    time::{Duration, Instant},
};

use ratelimit_common::{Counter, Event, REASON_COUNT, Reason, gcra};
use serde_json::{Value, json};
use tokio::{
    io::{AsyncBufReadExt, AsyncWriteExt, BufReader},
    net::{UnixListener, UnixStream},
    signal::unix::{SignalKind, signal},
};
use tracing::{error, info, warn};

use crate::{
    config::RawConfig,
    control::{Request, Response, run_dir, socket_path},
    error::{Error, Result},
    kernel::{AttachMode, Enforcer, LoadOptions},
    rules::{Action, Prefix, RuleSet},
};

/// How the daemon runs.
#[derive(Clone, Debug)]
pub struct RunOptions {
    /// The interface.
    pub iface: String,
    /// A TOML config file, re-read on SIGHUP.
    pub config: Option<PathBuf>,
    /// The rule set from the command line (default rule and global flags).
    pub base: RuleSet,
    /// Whether the command line set limits explicitly (else an adopted daemon keeps
    /// the rules it finds).
    pub explicit: bool,
    /// Attach mode.
    pub mode: AttachMode,
    /// Leave the program enforcing after exit.
    pub keep_attached: bool,
    /// Ignore pinned state and start fresh.
    pub reset: bool,
    /// Load-time settings.
    pub load: LoadOptions,
    /// Where to serve Prometheus metrics.
    pub metrics: Option<std::net::SocketAddr>,
}

/// How often counters are sampled for per-second rates.
const SAMPLE_EVERY: Duration = Duration::from_secs(1);
/// How often idle states are swept (see `ratelimit_common::gcra`, "Wrapping").
const SWEEP_EVERY: Duration = Duration::from_secs(3600);
/// A request line must arrive within this time.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(2);

struct Sample {
    at: Instant,
    counters: [Counter; REASON_COUNT as usize],
}

struct Daemon {
    opts: RunOptions,
    enforcer: Enforcer,
    rules: RuleSet,
    started: Instant,
    last: Sample,
    prev: Option<Sample>,
    /// Tracked sources, counted at most every [`TRACKED_MAX_AGE`].
    tracked: Option<(Instant, usize)>,
    /// What the state maps held and had created when this daemon started, and
    /// what its sweeps removed since: for the estimate of evictions.
    baseline: Baseline,
}

/// See [`Daemon::baseline`].
#[derive(Clone, Copy, Default)]
struct Baseline {
    tracked: usize,
    created: u64,
    swept: u64,
}

/// How stale the tracked-sources gauge may be.
const TRACKED_MAX_AGE: Duration = Duration::from_secs(10);

/// An exclusive lock on the interface, released on drop.
struct Lock {
    _file: File,
    path: PathBuf,
}

impl Drop for Lock {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

fn lock(iface: &str) -> Result<Lock> {
    let dir = run_dir();
    std::fs::create_dir_all(&dir).map_err(Error::io(format!("creating {}", dir.display())))?;
    let _ = std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700));
    let path = dir.join(format!("{iface}.lock"));
    let file = File::create(&path).map_err(Error::io(format!("creating {}", path.display())))?;
    // SAFETY: a valid open fd.
    if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
        return Err(Error::AlreadyRunning {
            iface: iface.to_string(),
            lock: path,
        });
    }
    Ok(Lock { _file: file, path })
}

fn saved_rules_path(iface: &str) -> PathBuf {
    run_dir().join(format!("{iface}.rules.json"))
}

/// The rule set to start with: the config file, or the command line; for a
/// daemon adopting a pinned program without either, the rules it last enforced.
fn initial_rules(opts: &RunOptions) -> Result<RuleSet> {
    if let Some(path) = &opts.config {
        return RawConfig::load(path)?.validate(&opts.base);
    }
    opts.base.validate()?;
    Ok(opts.base.clone())
}

fn saved_rules(iface: &str) -> Option<RuleSet> {
    let text = std::fs::read_to_string(saved_rules_path(iface)).ok()?;
    let raw: RawConfig = serde_json::from_str(&text).ok()?;
    raw.validate(&RuleSet::default()).ok()
}

/// Runs the daemon on `opts.iface` until `shutdown` completes.
pub async fn run(opts: RunOptions, shutdown: impl Future<Output = ()>) -> Result<()> {
    let lock = lock(&opts.iface)?;
    // Everything the user gave is checked before the kernel is touched.
    let mut rules = initial_rules(&opts)?;
    let enforcer = Enforcer::start(&opts.iface, opts.mode, &opts.load, opts.reset)?;
    if enforcer.adopted
        && opts.config.is_none()
        && !opts.explicit
        && let Some(saved) = saved_rules(&opts.iface)
    {
        rules = saved;
    }
    let counters = enforcer.maps.counters()?;
    let (gcra_keys, wide_keys) = enforcer.maps.tracked()?;
    let baseline = Baseline {
        tracked: gcra_keys + wide_keys,
        created: enforcer.maps.events()?[Event::StateCreated as usize],
        swept: 0,
    };
    let mut daemon = Daemon {
        baseline,
        opts,
        enforcer,
        rules: RuleSet::default(),
        started: Instant::now(),
        last: Sample {
            at: Instant::now(),
            counters,
        },
        prev: None,
        tracked: None,
    };
    if let Err(e) = daemon.apply(rules) {
        daemon.shutdown(false);
        return Err(e);
    }
    daemon.announce();

    let sock = socket_path(&daemon.opts.iface);
    let _ = std::fs::remove_file(&sock);
    let listener = match UnixListener::bind(&sock) {
        Ok(l) => l,
        Err(e) => {
            daemon.shutdown(false);
            return Err(Error::Io {
                what: format!("binding the control socket {}", sock.display()),
                source: e,
            });
        }
    };
    let _ = std::fs::set_permissions(&sock, std::fs::Permissions::from_mode(0o600));

    let (metrics_tx, mut metrics_rx) =
        tokio::sync::mpsc::channel::<tokio::sync::oneshot::Sender<String>>(8);
    if let Some(addr) = daemon.opts.metrics {
        match tokio::net::TcpListener::bind(addr).await {
            Ok(l) => {
                info!(%addr, "serving Prometheus metrics at /metrics");
                tokio::spawn(crate::metrics::serve(l, metrics_tx));
            }
            Err(e) => {
                let _ = std::fs::remove_file(&sock);
                daemon.shutdown(false);
                return Err(Error::Io {
                    what: format!("binding --metrics {addr}"),
                    source: e,
                });
            }
        }
    }
    if let Some(logger) = daemon.enforcer.take_logger() {
        crate::logs::forward(logger);
    }
    let mut hup = signal(SignalKind::hangup()).map_err(Error::io("installing SIGHUP handler"))?;
    let mut sample = tokio::time::interval(SAMPLE_EVERY);
    let mut sweep = tokio::time::interval(SWEEP_EVERY);
    sweep.tick().await;
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            () = &mut shutdown => break,
            _ = hup.recv() => daemon.reload(),
            _ = sample.tick() => daemon.sample(),
            _ = sweep.tick() => daemon.sweep(),
            Some(reply) = metrics_rx.recv() => {
                let _ = reply.send(daemon.metrics());
            }
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => daemon.serve(stream).await,
                Err(e) => warn!(error = %e, "control socket accept failed"),
            },
        }
    }
    let _ = std::fs::remove_file(&sock);
    let keep = daemon.opts.keep_attached;
    daemon.shutdown(keep);
    drop(lock);
    Ok(())
}

impl Daemon {
    /// Applies a validated rule set whole, and remembers it for a restarted daemon.
    fn apply(&mut self, rules: RuleSet) -> Result<()> {
        let capacity = self.opts.load.rules_capacity as usize;
        if rules.rules.len() > capacity {
            return Err(Error::invalid(
                "rules",
                format!(
                    "{} rules do not fit in {capacity}; restart the daemon with a larger --max-rules",
                    rules.rules.len()
                ),
            ));
        }
        self.enforcer.maps.apply(&rules)?;
        self.rules = rules;
        let raw = RawConfig::from(&self.rules);
        let path = saved_rules_path(&self.opts.iface);
        if let Err(e) = std::fs::write(&path, serde_json::to_vec(&raw).expect("serializes")) {
            warn!(path = %path.display(), error = %e, "could not save the rules for a restart");
        }
        Ok(())
    }

    fn announce(&self) {
        let e = &self.enforcer;
        println!(
            "ratelimit: enforcing on {} ({} mode{}): default {}; {} rule(s){}",
            e.iface(),
            e.mode(),
            if e.adopted {
                ", adopted the pinned program and its buckets"
            } else {
                ""
            },
            self.rules.default,
            self.rules.rules.len(),
            if self.rules.dry_run {
                "; DRY RUN: nothing is dropped"
            } else {
                ""
            },
        );
        for (p, a) in &self.rules.rules {
            println!("ratelimit:   {p}: {a}");
        }
    }

    fn reload(&mut self) {
        let Some(path) = self.opts.config.clone() else {
            warn!("SIGHUP without --config: nothing to reload");
            return;
        };
        match RawConfig::load(&path).and_then(|raw| raw.validate(&self.opts.base)) {
            Ok(rules) => match self.apply(rules) {
                Ok(()) => {
                    info!(config = %path.display(), "reloaded");
                    self.announce();
                }
                Err(e) => error!(error = %format!("{e:#}"), "reload failed while writing maps"),
            },
            Err(e) => error!(error = %e, "reload refused, nothing changed"),
        }
    }

    fn sample(&mut self) {
        match self.enforcer.maps.counters() {
            Ok(counters) => {
                let now = Sample {
                    at: Instant::now(),
                    counters,
                };
                self.prev = Some(std::mem::replace(&mut self.last, now));
            }
            Err(e) => warn!(error = %e, "reading counters failed"),
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

    async fn serve(&mut self, stream: UnixStream) {
        let (read, mut write) = stream.into_split();
        let mut line = String::new();
        let mut reader = BufReader::new(read);
        let response =
            match tokio::time::timeout(REQUEST_TIMEOUT, reader.read_line(&mut line)).await {
                Ok(Ok(_)) => match serde_json::from_str::<Request>(&line) {
                    Ok(request) => match self.handle(request) {
                        Ok(data) => Response {
                            ok: true,
                            error: None,
                            data,
                        },
                        Err(e) => Response {
                            ok: false,
                            error: Some(format!("{e}")),
                            data: Value::Null,
                        },
                    },
                    Err(e) => Response {
                        ok: false,
                        error: Some(format!("bad request: {e}")),
                        data: Value::Null,
                    },
                },
                _ => return,
            };
        let mut out = serde_json::to_string(&response).expect("serializes");
        out.push('\n');
        let _ = write.write_all(out.as_bytes()).await;
    }

    fn change(&mut self, edit: impl FnOnce(&mut RuleSet) -> Result<()>) -> Result<Value> {
        let mut next = self.rules.clone();
        edit(&mut next)?;
        next.validate()?;
        self.apply(next)?;
        Ok(self.list())
    }

    fn handle(&mut self, request: Request) -> Result<Value> {
        match request {
            Request::Set { target, limit } => {
                if target == "default" {
                    // Keep the daemon's key prefixes unless the request sets them.
                    let mut limit = *limit;
                    if let Action::Limit(current) = self.rules.default {
                        limit.per_v4 = limit.per_v4.or(Some(current.per_v4));
                        limit.per_v6 = limit.per_v6.or(Some(current.per_v6));
                    }
                    let action = limit.validate("default", None)?;
                    self.change(|r| {
                        r.default = action;
                        Ok(())
                    })
                } else {
                    let prefix = Prefix::parse("CIDR", &target)?;
                    let action =
                        limit.validate(&prefix.to_string(), Some(prefix.addr.is_ipv4()))?;
                    self.change(|r| {
                        r.rules.insert(prefix, action);
                        Ok(())
                    })
                }
            }
            Request::Allow { cidr } => {
                let prefix = Prefix::parse("CIDR", &cidr)?;
                self.change(|r| {
                    r.rules.insert(prefix, Action::Allow);
                    Ok(())
                })
            }
            Request::Deny { cidr } => {
                let prefix = Prefix::parse("CIDR", &cidr)?;
                self.change(|r| {
                    r.rules.insert(prefix, Action::Deny { dry_run: false });
                    Ok(())
                })
            }
            Request::Unset { cidr } => {
                let prefix = Prefix::parse("CIDR", &cidr)?;
                self.change(|r| {
                    r.rules.remove(&prefix).map(|_| ()).ok_or_else(|| {
                        Error::invalid(
                            "CIDR",
                            format!("no rule for {prefix}; `ratelimit list` shows the rules"),
                        )
                    })
                })
            }
            Request::List => Ok(self.list()),
            Request::Status => self.status(),
            Request::Stats => self.stats(),
            Request::Top { n } => self.top(n),
        }
    }

    fn list(&self) -> Value {
        let rules: Vec<Value> = self
            .rules
            .rules
            .iter()
            .map(|(p, a)| json!({"cidr": p.to_string(), "rule": a.to_string()}))
            .collect();
        let tick = crate::rules::tick_ns();
        let clock = match self.rules.clock {
            crate::rules::Clock::Precise => {
                "precise: each key admits at most burst + rate × T in any span T".to_string()
            }
            crate::rules::Clock::Coarse => format!(
                "coarse: each key admits at most burst + rate × (T + {}) in any span T (one scheduler tick)",
                crate::rules::fmt_duration(tick)
            ),
        };
        json!({
            "default": self.rules.default.to_string(),
            "dry_run": self.rules.dry_run,
            "malformed": self.rules.malformed,
            "clock": clock,
            "new_states": self.rules.new_states.to_string(),
            "rules": rules,
        })
    }

    /// States evicted since this daemon started, estimated: states created
    /// minus what the maps gained and what the sweep removed.
    fn evicted(&self, tracked: usize, created: u64) -> u64 {
        let b = &self.baseline;
        (created.saturating_sub(b.created) + b.tracked as u64)
            .saturating_sub(tracked as u64 + b.swept)
    }

    fn status(&self) -> Result<Value> {
        let (v4_keys, v6_keys, wide_keys) = self.enforcer.maps.tracked_by_map()?;
        let gcra_keys = v4_keys + v6_keys;
        let events = self.enforcer.maps.events()?;
        let created = events[Event::StateCreated as usize];
        let load = &self.opts.load;
        // An LRU map starts evicting a little before it is full: each CPU keeps
        // a few free entries of its own.
        let full = |n: usize, cap: u32| n as u64 * 100 >= u64::from(cap) * 99;
        let mut notes = Vec::new();
        let mut state_full = false;
        for (what, n, cap, flag) in [
            (
                "IPv4 state map",
                v4_keys,
                load.state_capacity,
                "--max-sources",
            ),
            (
                "IPv6 state map",
                v6_keys,
                load.state_capacity_v6,
                "--max-sources-v6",
            ),
            (
                "wide-state map",
                wide_keys,
                load.wide_capacity,
                "--max-wide-sources",
            ),
        ] {
            if full(n, cap) {
                state_full = true;
                notes.push(format!(
                    "the {what} is full ({n} of {cap}): a source that earns a state now evicts the one seen least recently (busy sources stay); raise {flag} if legitimate sources are being evicted"
                ));
            }
        }
        Ok(json!({
            "iface": self.enforcer.iface(),
            "mode": self.enforcer.mode(),
            "adopted": self.enforcer.adopted,
            "pid": std::process::id(),
            "uptime_s": self.started.elapsed().as_secs(),
            "clock": self.rules.clock.name(),
            "tracked_sources": gcra_keys + wide_keys,
            "ipv4_sources": v4_keys,
            "ipv4_capacity": load.state_capacity,
            "ipv6_sources": v6_keys,
            "ipv6_capacity": load.state_capacity_v6,
            "wide_sources": wide_keys,
            "wide_capacity": load.wide_capacity,
            "state_map_full": state_full,
            "states_created": created,
            "new_states_capped": events[Event::NewStateCapped as usize],
            "evicted_estimate": self.evicted(gcra_keys + wide_keys, created),
            "doorkeeper_slots": load.seen_slots,
            "rules": self.rules.rules.len(),
            "dry_run": self.rules.dry_run,
            "keep_attached": self.opts.keep_attached,
            "notes": notes,
        }))
    }

    /// Totals read now; per-second rates over the last sampling interval.
    fn stats(&self) -> Result<Value> {
        let totals = self.enforcer.maps.counters()?;
        let last = &self.last;
        let rate = |r: Reason| match &self.prev {
            Some(prev) => {
                let dt = last.at.duration_since(prev.at).as_secs_f64().max(1e-9);
                let (a, b) = (last.counters[r as usize], prev.counters[r as usize]);
                (
                    (a.packets - b.packets) as f64 / dt,
                    (a.bytes - b.bytes) as f64 / dt,
                )
            }
            None => (0.0, 0.0),
        };
        let by_reason: Vec<Value> = Reason::ALL
            .iter()
            .map(|r| {
                let c = totals[*r as usize];
                let (pps, bps) = rate(*r);
                json!({
                    "reason": r.name(),
                    "packets": c.packets,
                    "bytes": c.bytes,
                    "packets_per_s": pps,
                    "bytes_per_s": bps,
                })
            })
            .collect();
        let events = self.enforcer.maps.events()?;
        let events: serde_json::Map<String, Value> = Event::ALL
            .iter()
            .map(|e| (e.name().to_string(), json!(events[*e as usize])))
            .collect();
        Ok(json!({
            "iface": self.enforcer.iface(),
            "reasons": by_reason,
            "events": events,
        }))
    }

    fn top(&self, n: usize) -> Result<Value> {
        let read =
            |maps: &crate::kernel::Maps| -> Result<std::collections::HashMap<[u8; 16], u64>> {
                maps.drops().collect()
            };
        let before = read(&self.enforcer.maps)?;
        let window = Duration::from_millis(250);
        std::thread::sleep(window);
        let after = read(&self.enforcer.maps)?;
        let mut rows: Vec<(u64, f64, [u8; 16])> = after
            .iter()
            .map(|(addr, &total)| {
                let was = before.get(addr).copied().unwrap_or(0);
                (
                    total,
                    (total.saturating_sub(was)) as f64 / window.as_secs_f64(),
                    *addr,
                )
            })
            .collect();
        rows.sort_by(|a, b| b.0.cmp(&a.0).then(b.1.total_cmp(&a.1)));
        rows.truncate(n);
        let rows: Vec<Value> = rows
            .into_iter()
            .map(|(total, rate, addr)| {
                let source = crate::rules::source_ip(&addr);
                json!({"source": source.to_string(), "dropped": total, "dropped_per_s": rate})
            })
            .collect();
        Ok(json!({ "iface": self.enforcer.iface(), "top": rows }))
    }

    /// The Prometheus text exposition.
    fn metrics(&mut self) -> String {
        let counters = self.enforcer.maps.counters().unwrap_or_default();
        if self
            .tracked
            .is_none_or(|(at, _)| at.elapsed() > TRACKED_MAX_AGE)
        {
            let (gcra_keys, wide_keys) = self.enforcer.maps.tracked().unwrap_or_default();
            self.tracked = Some((Instant::now(), gcra_keys + wide_keys));
        }
        let events = self.enforcer.maps.events().unwrap_or_default();
        crate::metrics::render(&crate::metrics::Snapshot {
            iface: self.enforcer.iface(),
            mode: self.enforcer.mode(),
            counters: &counters,
            tracked: self.tracked.map_or(0, |(_, n)| n),
            rules: self.rules.rules.len(),
            events: &events,
        })
    }

    fn shutdown(self, keep: bool) {
        let iface = self.opts.iface.clone();
        if keep {
            self.enforcer.keep();
            println!(
                "ratelimit: exiting; the program stays attached to {iface} and keeps enforcing (--keep-attached)"
            );
        } else {
            match self.enforcer.detach() {
                Ok(()) => println!("ratelimit: detached from {iface}"),
                Err(e) => error!(error = %format!("{e:#}"), "detaching failed"),
            }
            let _ = std::fs::remove_file(saved_rules_path(&iface));
        }
    }
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
