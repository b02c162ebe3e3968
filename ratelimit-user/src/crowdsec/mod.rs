//! A native CrowdSec bouncer: the daemon follows a CrowdSec Local API's
//! decision stream (`run --crowdsec URL --crowdsec-key-file FILE`) and
//! enforces its bans at the driver.
//!
//! # How
//! A task of its own ([`run`]) pulls `GET /v1/decisions/stream` every
//! `--crowdsec-every` (10 s by default) with the bouncer key (`X-Api-Key`):
//! the whole set (`startup=true`) first and after any failure, then what
//! changed since the last pull. Off the daemon's loop, each decision is
//! kept or ignored by [`decision::Filter`] (type, scope, origin, scenario,
//! width, what must stay reachable, duration) and the pull is compared with
//! what the loop holds ([`change`]); only what differs goes to the loop, the
//! one writer of the maps, as [`Job`]s of at most [`change::CHUNK`]
//! decisions. The loop lays each into
//! [`crate::model::decisions::Decisions`] (one deny list per origin,
//! `crowdsec:ORIGIN`, each entry ending by itself) and applies it, saved for
//! a restart, as it does every change, at the cost of what it changes.
//!
//! - A deleted decision is removed by its id; a resync makes the held set
//!   exactly the Local API's. Neither touches a rule or list of the
//!   operator's: a hand-made rule on a banned CIDR stays (and wins, as a
//!   rule wins over a list entry of its CIDR).
//! - While the Local API cannot be reached, what is held stays enforced and
//!   ends at its time; the next answer is a resync. The loss and the return
//!   are logged once each.
//!
//! What enters: the options ([`Options`]), a sender of jobs to the loop.
//! What leaves: jobs, and the bouncer's view ([`Status`]) on a watch
//! channel for `status`, `stats` and the metrics. Called by `daemon::run`.

pub mod change;
pub mod decision;
pub mod lapi;

use std::{path::PathBuf, time::Duration};

use serde::{Deserialize, Serialize};
use tokio::sync::{mpsc, oneshot, watch};
use tracing::{error, info, warn};

use crate::{
    host::clock::now_ms,
    model::decisions::{Applied, Decision},
};
use decision::{Filter, Ignored};
use lapi::Lapi;

/// The default time between two pulls.
pub const DEFAULT_EVERY: Duration = Duration::from_secs(10);

/// The default of `--crowdsec-max-decisions`: the community blocklist and a
/// busy site's own bans fit many times over, within the list entries a
/// daemon holds by default (a million, `--max-list-entries`).
pub const DEFAULT_MAX_DECISIONS: usize = 500_000;

/// The bouncer's options, checked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Options {
    /// The Local API.
    pub lapi: Lapi,
    /// The bouncer key.
    pub key: String,
    /// Where the key was read from.
    pub key_file: PathBuf,
    /// Time between two pulls.
    pub every: Duration,
    /// Which decisions are applied.
    pub filter: Filter,
    /// The most decisions held.
    pub max_decisions: usize,
}

/// What a feed may never deny, now: loopback, the addresses of this
/// namespace's interfaces, and the Local API's (its host resolved).
async fn protected(lapi: &Lapi) -> Vec<crate::model::prefix::Prefix> {
    use crate::model::prefix::Prefix;
    let mut out = decision::loopback();
    let mut addrs = crate::host::addresses::own();
    if let Ok(found) = tokio::net::lookup_host(lapi.authority()).await {
        addrs.extend(found.map(|a| a.ip()));
    }
    for a in addrs {
        // An IPv4-mapped address as the IPv4 one, as decisions are.
        let a = match a {
            std::net::IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(a, std::net::IpAddr::V4),
            v4 => v4,
        };
        let len = if a.is_ipv4() { 32 } else { 128 };
        if let Ok(p) = Prefix::parse("address", &format!("{a}/{len}")) {
            out.push(p);
        }
    }
    out
}

/// What the bouncer asks of the daemon's loop: apply a part of a pull's
/// change ([`change::Change::chunks`]), and say what it did (or why it
/// could not).
pub struct Job {
    /// Decisions to add or replace.
    pub new: Vec<Decision>,
    /// Ids of decisions to let go.
    pub deleted: Vec<u64>,
    /// What was applied, or why not.
    pub reply: oneshot::Sender<std::result::Result<Applied, String>>,
    /// The most decisions held (`--crowdsec-max-decisions`).
    pub max: usize,
}

/// The bouncer as the daemon reports it (`status`, metrics).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Status {
    /// The Local API's URL.
    pub lapi: String,
    /// Whether the last pull was answered and applied.
    pub lapi_up: bool,
    /// Why not, when it was not.
    pub error: Option<String>,
    /// When the last pull was answered and applied (RFC 3339).
    pub last_pull: Option<String>,
    /// Pulls answered and applied since the daemon started.
    pub pulls: u64,
    /// Pulls that failed (no answer, refused, not applied).
    pub failed_pulls: u64,
    /// Resyncs (`startup=true`) applied.
    pub resyncs: u64,
    /// Decisions not applied since the daemon started, by why.
    pub ignored: IgnoredCounts,
    /// Decisions held for `--crowdsec-longest` instead of their longer
    /// duration, since the daemon started.
    #[serde(default)]
    pub clipped: u64,
    /// Decisions not applied because `--crowdsec-max-decisions` were held
    /// (counted at each pull that sends them).
    #[serde(default)]
    pub over_cap: u64,
    /// Seconds between two pulls.
    pub every_s: f64,
    /// The decisions held now, and per origin with its drops: filled in by
    /// the daemon when it answers.
    #[serde(default)]
    pub decisions: usize,
    /// Per origin.
    #[serde(default)]
    pub origins: Vec<OriginStatus>,
}

/// Decisions not applied, by why ([`Ignored`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct IgnoredCounts {
    /// Of a type not applied (`captcha`, by default).
    pub by_type: u64,
    /// Of a scope other than `Ip` and `Range`.
    pub by_scope: u64,
    /// Left out by the origin and scenario filters.
    pub filtered: u64,
    /// Wider than `--crowdsec-widest`, from an origin not trusted with it.
    #[serde(default)]
    pub too_broad: u64,
    /// With a duration that cannot be read.
    #[serde(default)]
    pub bad_duration: u64,
    /// Covering loopback, an address of the host or the Local API's.
    #[serde(default)]
    pub protected: u64,
}

impl IgnoredCounts {
    pub(crate) fn count(&mut self, why: Ignored) {
        match why {
            Ignored::Type => self.by_type += 1,
            Ignored::Scope => self.by_scope += 1,
            Ignored::Filtered => self.filtered += 1,
            Ignored::TooBroad => self.too_broad += 1,
            Ignored::Duration => self.bad_duration += 1,
            Ignored::Protected => self.protected += 1,
            Ignored::Ended => {}
        }
    }
}

/// One origin's decisions and drops.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct OriginStatus {
    /// The origin (`crowdsec`, `cscli`, `CAPI`, …).
    pub origin: String,
    /// Its deny list.
    pub list: String,
    /// Entries of its list (addresses and ranges).
    pub entries: usize,
    /// Frames dropped by its list since the daemon started.
    pub dropped_packets: u64,
    /// Their bytes.
    pub dropped_bytes: u64,
}

/// The bouncer: pulls and hands the changes to the loop until the loop
/// goes away. `held` is what the loop holds: each pull is compared with it
/// off the loop, and only what differs is sent.
pub async fn run(
    opts: Options,
    jobs: mpsc::Sender<Job>,
    status: watch::Sender<Status>,
    held: watch::Receiver<crate::model::decisions::Decisions>,
) {
    let mut st = Status {
        lapi: opts.lapi.url.clone(),
        every_s: opts.every.as_secs_f64(),
        ..Status::default()
    };
    let mut tick = tokio::time::interval(opts.every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // The whole set first, and again after any failure (the deltas the
    // Local API gave meanwhile may be lost).
    let mut startup = true;
    // Whether the last pull failed, for logging each transition once.
    let mut down: Option<bool> = None;
    // The origins whose too-broad or protected decisions were logged.
    let mut warned = std::collections::HashSet::new();
    let mut filter = opts.filter.clone();
    loop {
        tick.tick().await;
        let now = now_ms();
        // What must stay reachable, read again at each pull: the host's
        // addresses change.
        filter.protected = protected(&opts.lapi).await;
        let outcome = match opts.lapi.pull(&opts.key, startup).await {
            Ok(stream) => {
                let held = held.borrow().clone();
                let (f, max) = (filter.clone(), opts.max_decisions);
                let planned = tokio::task::spawn_blocking(move || {
                    let mut sorted = change::sort(&f, stream.new.unwrap_or_default(), now);
                    let deleted = (!startup).then(|| {
                        stream
                            .deleted
                            .unwrap_or_default()
                            .iter()
                            .map(|d| d.id)
                            .collect()
                    });
                    let kept = std::mem::take(&mut sorted.kept);
                    (sorted, change::of(&held, kept, deleted, max))
                })
                .await;
                let Ok((sorted, change)) = planned else {
                    return;
                };
                account(&mut st, &mut warned, sorted);
                let over_cap = change.over_cap;
                match send(&jobs, change, opts.max_decisions).await {
                    None => return,
                    Some(Ok(mut applied)) => {
                        applied.over_cap += over_cap;
                        Ok(applied)
                    }
                    Some(Err(e)) => Err(e),
                }
            }
            Err(e) => Err(e),
        };
        match outcome {
            Ok(applied) => {
                if startup {
                    st.resyncs += 1;
                }
                if applied.added + applied.removed > 0 && down == Some(false) {
                    info!(
                        added = applied.added,
                        removed = applied.removed,
                        held = held.borrow().len(),
                        "crowdsec: decisions applied"
                    );
                }
                if applied.over_cap > 0 {
                    if st.over_cap == 0 {
                        warn!(
                            max = opts.max_decisions,
                            "crowdsec: more decisions than --crowdsec-max-decisions: the newest are not applied (counted as over_cap)"
                        );
                    }
                    st.over_cap += applied.over_cap as u64;
                }
                match down {
                    Some(true) => info!(
                        lapi = %opts.lapi.url,
                        added = applied.added,
                        removed = applied.removed,
                        "crowdsec: the Local API answers again; resynced with its decisions"
                    ),
                    None => info!(
                        lapi = %opts.lapi.url,
                        added = applied.added,
                        removed = applied.removed,
                        "crowdsec: following the Local API's decisions"
                    ),
                    Some(false) => {}
                }
                down = Some(false);
                startup = false;
                st.lapi_up = true;
                st.error = None;
                st.pulls += 1;
                st.last_pull = Some(crate::model::describe::rfc3339(now_ms()));
            }
            Err(e) => {
                if down != Some(true) {
                    let held = "the decisions held stay enforced and end at their time; the next answer resyncs";
                    if e.starts_with("the decisions could not be applied") {
                        error!(lapi = %opts.lapi.url, error = %e, "crowdsec: {held}");
                    } else {
                        warn!(lapi = %opts.lapi.url, error = %e, "crowdsec: the Local API cannot be reached or refused; {held}");
                    }
                }
                down = Some(true);
                startup = true;
                st.lapi_up = false;
                st.error = Some(e);
                st.failed_pulls += 1;
            }
        }
        let _ = status.send(st.clone());
    }
}

/// Counts a pull's ignored and clipped decisions; logs the first too broad
/// or protected decision of each origin, once.
fn account(
    st: &mut Status,
    warned: &mut std::collections::HashSet<(Ignored, String)>,
    sorted: change::Sorted,
) {
    let i = &mut st.ignored;
    let n = &sorted.ignored;
    i.by_type += n.by_type;
    i.by_scope += n.by_scope;
    i.filtered += n.filtered;
    i.too_broad += n.too_broad;
    i.bad_duration += n.bad_duration;
    i.protected += n.protected;
    st.clipped += sorted.clipped;
    for (why, origin, value) in sorted.firsts {
        if !warned.insert((why, origin.clone())) {
            continue;
        }
        if why == Ignored::TooBroad {
            warn!(
                %origin,
                %value,
                "a CrowdSec decision wider than --crowdsec-widest is not applied (counted as too_broad; logged once per origin): --crowdsec-broad-origins lets an origin ban wider networks"
            );
        } else {
            warn!(
                %origin,
                %value,
                "a CrowdSec decision that covers loopback, an address of this host or the Local API's is not applied (counted as protected; logged once per origin)"
            );
        }
    }
}

/// Hands `change` to the loop a chunk at a time; what it applied, or why
/// not (`None`: the loop is gone). A chunk refused ends the pull: what the
/// chunks before it applied stays, and the next pull resyncs.
async fn send(
    jobs: &mpsc::Sender<Job>,
    change: change::Change,
    max: usize,
) -> Option<std::result::Result<Applied, String>> {
    let mut total = Applied::default();
    for (new, deleted) in change.chunks() {
        let (reply, answer) = oneshot::channel();
        jobs.send(Job {
            new,
            deleted,
            reply,
            max,
        })
        .await
        .ok()?;
        match answer.await.ok()? {
            Ok(a) => {
                total.added += a.added;
                total.removed += a.removed;
                total.over_cap += a.over_cap;
            }
            Err(e) => return Some(Err(format!("the decisions could not be applied: {e}"))),
        }
    }
    Some(Ok(total))
}
