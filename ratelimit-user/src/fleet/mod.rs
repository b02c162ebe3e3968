//! Fleet-wide rules: one limit per key across every daemon run with
//! `--fleet REDIS_URL`. The kernel keeps deciding every frame locally, with
//! the key's own bucket; Redis is never on the packet path.
//!
//! - [`sync`]: the sync task ([`run`]): reads the counts, reports, raises;
//! - `book`: its books, pure: cursors, what is owed, the fallback's charges;
//! - `link`: its connection to Redis: a new one when the old one fails,
//!   key groups that failed tried again once a second;
//! - `top`: `ratelimit top --fleet`.
//!
//! # How
//! The program counts what each key of a fleet-wide rule is admitted
//! (`RL_FLEET_USED`). Every [`SYNC`], each daemon reports what each key
//! admitted since the last sync to the key's bucket in Redis (gcra, the same
//! limit), all its keys of a group in one script call (a Cluster keeps a
//! group in one slot: at most 64 calls a sync however many keys); Redis
//! answers with the fleet's debt for each key: how long until its bucket
//! would be full again, counting every daemon's admissions. The daemon
//! raises the key's bucket in the kernel to that debt (never lowers it), up
//! to a whole bucket and [`gcra::OVER_MAX`] (about 100 ms) beyond it. A key
//! that admitted nothing here is read only while the fleet holds it below
//! full and it admitted something here in the last [`FOLLOW`]; nothing is
//! tallied for it. What a key admitted and has been accounted for (the
//! report cursor, `RL_FLEET_REPORTED`) is pinned with the counts, so that a
//! restarted daemon reports nothing twice (see `book`).
//!
//! Members are counted by Redis's clock, each with a lease of [`LEASE`]
//! renewed at every sync; a member that has not renewed for [`SILENCE`] is
//! silent, and the others weight their reports `N / (N − silent)`, leaving
//! it its share (`book`), while its lease lasts and past it, for [`GRACE`]:
//! a member that never left may have a program that still enforces. A daemon that stops
//! for good (SIGINT or SIGTERM without `--keep-attached`: its program goes
//! with it) leaves at once.
//!
//! Each sync writes a heartbeat (`RL_FLEET_BEAT`: when its counts were
//! read, and `N`) once every key of it is settled (answered, or charged as
//! under the fallback), and the program reads it: when it is older than five
//! syncs (the daemon is dead, stuck or starved) the program itself charges
//! each frame of a fleet-wide key `N` times (ratelimit-common's
//! `fleet_cost`), as the `share` fallback would. So the debt a program
//! judges with is never more than five syncs old, however late its daemon
//! runs.
//!
//! # The bound, and what it depends on
//! With `N` daemons, a key of rate `R` and burst `B`, and `Δ` the age of the
//! fleet's debt a daemon judges with (the sync age: at most a sync, the time
//! from reading the counts to Redis's answer, and a sync again: exported as
//! the histogram `ratelimit_fleet_sync_seconds`, the worst key's in
//! `ratelimit_fleet_lag_seconds`), the fleet admits over any time `t` at
//! most
//!
//! ```text
//! B + R·t  +  (N − 1)·(B + R·Δ)
//! ```
//!
//! The daemon that admits last admitted at most `B + R·t` counting what it
//! knew of the others; what it did not know is what the others admitted in
//! the last `Δ`, at most `B + R·Δ` each (their own buckets hold). The excess
//! does not grow with `t`. An answer not come within [`SLOW`] is not
//! waited for: what its keys admitted is charged as under the fallback at
//! once (its answer counts beside that when it comes), so that `Δ` stays at
//! most `2·SYNC + SLOW` (0.3 s) in the bound however slow Redis gets. Under
//! each fault:
//!
//! - **Redis down, slow, or a Cluster master down** (its keys; the others
//!   stay in step): each daemon charges what it admits `N` times (`share`):
//!   the fleet admits at most `B + R·t` of a key from then on, beside the
//!   `Δ` term up to the moment the failure is seen ([`CALL_TIMEOUT`]).
//!   `local`: each daemon the whole limit, the fleet up to `N` times it.
//! - **A daemon cut off from Redis** (its TCP silent): it falls back to
//!   `share`; the others count it and leave it its share from [`SILENCE`]
//!   on: the bound above, with `Δ` up to `SILENCE + CALL_TIMEOUT` once. Past
//!   its lease ([`LEASE`]) they go on counting it (it never left: its
//!   program may still enforce its share) for [`GRACE`]; after that they
//!   take the whole limit, and the fleet admits up to `R/N` a second more
//!   per such daemon. When it reconnects, what it admitted meanwhile is
//!   reported (as the units it still weighs: at most a bucket).
//! - **A daemon dead, its program attached** (SIGKILL, or stopped with
//!   `--keep-attached`): its program admits its own bucket unsynced for
//!   five syncs (`FLEET_STALE_NS`, 0.5 s), then charges `N` times: the same
//!   as a daemon cut off, with `Δ` up to 0.5 s once, for [`GRACE`].
//! - **A restart** of any kind: the restarted daemon reports what was
//!   admitted while it was down as owed, at most a bucket; it never reports
//!   a key's history twice (a shut-out) nor forgets what it admitted (a
//!   fresh burst). Without `--keep-attached` the program is detached while
//!   the daemon is down and limits nothing (as for any rule).
//!
//! A report whose answer is lost (sent, decided by Redis, and not seen back
//! within [`CALL_TIMEOUT`]) is owed and reported again: one sync's units
//! twice, erring toward limiting. A key's cursor is written at most once a
//! second (`book::CURSOR_EVERY`): a restart finds at most that much past it
//! (and whatever was admitted while no daemon synced), charged as owed, at
//! most a bucket.
//!
//! The aggregate level of a fleet-wide rule stays per host.

mod book;
mod link;
pub mod sync;
mod top;

use std::{
    collections::HashMap,
    net::{IpAddr, Ipv6Addr},
    time::Duration,
};

use ratelimit_common::{FleetCursor, FleetUsed, FlowKey, addr_of, gcra, words};
use ratelimit_redis::Limit;
use serde::{Deserialize, Serialize};
use tokio::sync::oneshot;

use crate::model::rules::Action;

pub use sync::{Metrics, leave, run};
pub use top::{KeyUse, RuleUse, top};

/// How often a daemon reports to Redis and takes the fleet's debts back.
pub const SYNC: Duration = Duration::from_millis(100);
/// A key that admitted nothing here for this long is no longer followed.
pub const FOLLOW: Duration = Duration::from_secs(2);
/// How long a member is counted after its last renewal (on Redis's clock).
pub const LEASE: Duration = Duration::from_secs(10);
/// How long a member that has not left is counted after its last renewal,
/// past its lease too: a daemon dead (or cut off) with its program attached
/// keeps its share, since that program may still admit it (it charges
/// itself `N` times, with `N` as the daemon last counted); a host gone for
/// good is forgotten after it. A daemon that stops for good leaves at once.
pub const GRACE: Duration = Duration::from_secs(600);
/// A member counted that has not renewed for this long is silent: its
/// share is left to it (see `book`).
pub const SILENCE: Duration = Duration::from_secs(1);
/// How long one call to Redis may take before its keys are judged by the
/// fallback for the sync.
pub const CALL_TIMEOUT: Duration = Duration::from_millis(250);
/// An answer later than this is older than the bound assumes: its keys are
/// charged as under the fallback too.
pub const SLOW: Duration = Duration::from_millis(100);
/// A key group (or the members) that failed is asked again this often.
pub const RETRY: Duration = Duration::from_secs(1);
/// The prefix of every fleet key in Redis.
pub const PREFIX: &str = "ratelimit:fleet:";

/// What fleet-wide rules do while Redis cannot be reached.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Fallback {
    /// Each daemon charges what it admits `N` times (`N` the daemons last
    /// seen): the fleet stays near the limit.
    Share,
    /// Each daemon admits the whole limit alone.
    Local,
}

/// A fleet-wide rule, as the sync task needs it.
#[derive(Clone, Debug)]
pub struct FleetRule {
    /// Its name across the fleet: the CIDR, or `default`.
    pub name: String,
    /// Its limit, in Redis's terms.
    pub limit: Limit,
    /// Its parameters in the kernel.
    pub params: gcra::Params,
    /// Whether it counts bytes.
    pub bytes: bool,
    /// Its key sizes, for names: IPv4 and IPv6 prefix lengths.
    pub per: (u8, u8),
}

impl FleetRule {
    /// The fleet-wide rule that the kernel's `rule` (under the name `name`)
    /// and the daemon's `action` for it make; `None` when it is not fleet-wide
    /// or its limit has no form Redis can keep.
    pub fn of(
        name: String,
        rule: &ratelimit_common::Rule,
        action: Option<&Action>,
    ) -> Option<Self> {
        use ratelimit_common::rule_flags;
        if rule.flags & rule_flags::FLEET == 0 {
            return None;
        }
        let Some(Action::Limit(l)) = action else {
            return None;
        };
        let limit = Limit::gcra(
            l.rate.tokens,
            Duration::from_nanos(l.rate.period_ns),
            l.burst,
        )
        .ok()?;
        Some(FleetRule {
            name,
            limit,
            params: *rule.gcra_params(),
            bytes: rule.flags & rule_flags::BYTES != 0,
            per: (rule.key_prefix_v4, rule.key_prefix_v6),
        })
    }
}

/// What the daemon's loop (which owns the maps) reads for the sync task.
pub struct Snapshot {
    /// Fleet-wide rules by id.
    pub rules: HashMap<u32, FleetRule>,
    /// What each key was admitted here (cumulative).
    pub used: Vec<(FlowKey, FleetUsed)>,
    /// The report cursors the pins hold, when asked for (the first read).
    pub cursors: Option<Vec<(FlowKey, FleetCursor)>>,
    /// When the counts were read (CLOCK_MONOTONIC, ns).
    pub at: u64,
}

/// A change to one key's bucket.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Raise {
    /// The key.
    pub key: FlowKey,
    /// Its rule's parameters.
    pub params: gcra::Params,
    /// The debt to raise it to (ns), as of `at_ns`.
    pub debt_ns: u64,
    /// When `debt_ns` held (CLOCK_MONOTONIC, ns).
    pub at_ns: u64,
}

/// What the sync task asks of the daemon's loop.
pub enum Job {
    /// Read the fleet-wide rules and what their keys were admitted (and the
    /// pinned report cursors, if `cursors`).
    Read {
        /// Read the pinned report cursors too.
        cursors: bool,
        /// Where the snapshot goes.
        reply: oneshot::Sender<Snapshot>,
    },
    /// Write the heartbeat: every key of the counts read at `at` is
    /// settled (its answer written, or charged as under the fallback), so
    /// the debt the program judges with is no older than `at`. Sent after
    /// the round's writes, so that the program sees them first.
    Beat {
        /// When the counts were read ([`Snapshot::at`]).
        at: u64,
        /// The members last counted, this daemon included.
        members: u64,
    },
    /// Raise these keys' buckets and write these report cursors (`None`:
    /// remove).
    Write {
        /// The raises.
        raises: Vec<Raise>,
        /// The cursors.
        cursors: Vec<(FlowKey, Option<FleetCursor>)>,
    },
}

/// The fleet as this daemon sees it, for `status`, `top --fleet` and metrics.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Status {
    /// Where.
    pub redis: String,
    /// Whether the last sync reached Redis for every key (and the members).
    pub redis_up: bool,
    /// The policy while Redis cannot be reached.
    pub fallback: Option<Fallback>,
    /// Daemons counted by their leases (this one included).
    pub daemons: u64,
    /// Of those, daemons silent (cut off or dead, within their leases or
    /// past them): their share of each key is left to them.
    pub silent_daemons: u64,
    /// Of the silent ones, daemons past their lease that never left: dead
    /// or cut off for more than 10 s, their programs perhaps still enforcing
    /// (counted for [`GRACE`] after their last renewal; a daemon that
    /// stops for good leaves and is not among them).
    pub past_lease_daemons: u64,
    /// Keys this daemon follows (admitted something in the last 2 s).
    pub keys: u64,
    /// Of those, keys the fleet holds over their limit (bucket empty).
    pub keys_over: u64,
    /// Of those, keys judged by the fallback at their last sync (Redis, or
    /// their Cluster master, could not be asked, or answered too late).
    pub keys_fallback: u64,
    /// Key groups whose Redis could not be asked at the last sync.
    pub groups_down: u64,
    /// Units (packets or bytes) reported to Redis since start.
    pub reported: u64,
    /// Units charged late since start: what admissions Redis could not be
    /// told of at once (cut off, or before a restart) still weighed when it
    /// answered.
    pub owed_reported: u64,
    /// Syncs with keys judged by the fallback since start.
    pub fallback_syncs: u64,
    /// Syncs with an answer later than the bound assumes (100 ms), whose
    /// keys were charged as under the fallback too, since start.
    pub slow_syncs: u64,
    /// The last sync's age: from reading the counts to the last answer, ms.
    pub redis_ms: f64,
    /// The age of the oldest fleet debt a key reported at the last sync was
    /// judged with, ms.
    pub lag_ms: f64,
}

/// The name of a key across the fleet: `RULE|ADDRESS/BITS`.
pub fn key_name(rule: &FleetRule, key: &FlowKey) -> String {
    let v6 = Ipv6Addr::from(addr_of(&words(&key.addr)));
    match v6.to_ipv4_mapped() {
        Some(v4) => format!("{}|{}/{}", rule.name, IpAddr::V4(v4), rule.per.0),
        None => format!("{}|{}/{}", rule.name, IpAddr::V6(v6), rule.per.1),
    }
}
