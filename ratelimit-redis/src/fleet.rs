//! What the fleet sync of `ratelimit run --fleet` asks of Redis: many keys'
//! reports in one script call, and the fleet's members by leases on Redis's
//! clock.
//!
//! # Groups
//! A key of a fleet is `PREFIX{gNN}NAME`: its hash tag is one of [`GROUPS`]
//! groups ([`group_of`] its name), so that on a Redis Cluster every key of
//! a group is in one slot and a daemon reports all its keys of a group in
//! one call ([`Store::fleet_sync`]): at most [`GROUPS`] calls per sync
//! however many keys, spread over the cluster's masters. A call that fails
//! fails its group only: the keys of the other groups (on the other
//! masters) stay in step.
//!
//! # Members
//! [`Store::fleet_members`] renews a member's lease on Redis's clock and
//! says how many members are counted and how many of them are silent (no
//! renewal for a while: cut off from Redis, or dead, while their lease
//! lasts). A member that stops for good leaves ([`Store::fleet_leave`]).

use std::{sync::LazyLock, time::Duration};

use redis::Script;

use crate::{Conn, EXACT_MAX, Error, Limit, Store};
use ratelimit_common::ParamError;

/// Groups of keys: the hash tags a fleet's keys share.
pub const GROUPS: u32 = 64;

/// How long a tally of a minute lives (`ratelimit top --fleet` reads this
/// minute's and the last).
pub const TALLY_TTL: Duration = Duration::from_secs(180);

static SYNC: LazyLock<Script> =
    LazyLock::new(|| Script::new(concat!(include_str!("gcra.lua"), include_str!("fleet.lua"))));
static MEMBERS: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("members.lua")));

/// The group of the key named `name`: FNV-1a of its bytes, modulo
/// [`GROUPS`] (the same on every daemon and every version).
pub fn group_of(name: &str) -> u32 {
    let mut h: u32 = 0x811c_9dc5;
    for b in name.bytes() {
        h ^= u32::from(b);
        h = h.wrapping_mul(0x0100_0193);
    }
    h % GROUPS
}

/// The hash tag of `group`: `{gNN}`.
fn tag(group: u32) -> String {
    format!("{{g{group}}}")
}

/// The Redis key of the fleet's key `name` under `prefix`: `PREFIX{gNN}NAME`.
pub fn bucket_key(prefix: &str, name: &str) -> String {
    format!("{prefix}{}{name}", tag(group_of(name)))
}

/// The tally of `group` for `minute` (since the epoch, on Redis's clock):
/// `PREFIX{gNN}used:MINUTE`.
pub fn tally_key(prefix: &str, group: u32, minute: u64) -> String {
    format!("{prefix}{}used:{minute}", tag(group))
}

/// The members of the fleet under `prefix`: `PREFIX{members}`.
pub fn members_key(prefix: &str) -> String {
    format!("{prefix}{{members}}")
}

/// One key's report in a [`Store::fleet_sync`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Report {
    /// The key's name (without prefix or tag): in the call's group.
    pub name: String,
    /// Its limit (gcra).
    pub limit: Limit,
    /// Units to add to its debt (0: only read it).
    pub amount: u64,
    /// Units to add to its tally (what was really admitted).
    pub tallied: u64,
}

/// The fleet's members, as Redis counts them now.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Members {
    /// Members counted (the caller included): those whose lease runs, and
    /// those past it that have not left, within the grace given.
    pub members: u64,
    /// Of those, members that have not renewed for the silence given.
    pub silent: u64,
    /// Of those, members past their lease that have not left: dead or cut
    /// off, their programs perhaps still enforcing.
    pub past_lease: u64,
}

impl Error {
    /// Whether a failure may come from the connection itself (a broken or
    /// silent connection, a Cluster's slots that moved): a new connection
    /// may succeed where this one fails.
    pub fn wants_new_connection(&self) -> bool {
        match self {
            Self::Unreachable(_) | Self::TimedOut(_) | Self::Redis(_) => true,
            Self::Refused(e) => matches!(
                e.code(),
                Some("MOVED" | "ASK" | "CLUSTERDOWN" | "TRYAGAIN" | "MASTERDOWN" | "LOADING")
            ),
            Self::Late { .. } | Self::Param(_) | Self::Url(_) => false,
        }
    }
}

impl Store {
    /// Reports `reports` (every key of `group`, under `prefix`) in one
    /// script call, with a deadline on Redis's clock as every call; answers
    /// each key's debt after it (how long its bucket takes to be full
    /// again), or `None` for a key that is not a bucket (another program's
    /// key of that name). A call that fails changed nothing (see the
    /// crate's documentation for an answer lost after Redis decided).
    pub async fn fleet_sync(
        &self,
        prefix: &str,
        group: u32,
        reports: &[Report],
    ) -> Result<Vec<Option<Duration>>, Error> {
        let deadline = self.deadline().await?;
        let minute = self.redis_now_us().await? / 60_000_000;
        let head = format!("{prefix}{}", tag(group));
        let mut call = SYNC.prepare_invoke();
        call.key(tally_key(prefix, group, minute))
            .arg(deadline)
            .arg(TALLY_TTL.as_millis() as u64)
            .arg(head.len());
        // A sync's keys share a few limits: each reduced once.
        let mut last: Option<(Limit, (u64, u64, u64))> = None;
        let mut key = String::with_capacity(head.len() + 64);
        for r in reports {
            let (s, p, b) = match last {
                Some((l, args)) if l == r.limit => args,
                _ => {
                    let ("gcra", s, p, b) = r.limit.args()? else {
                        return Err(Error::Param(ParamError {
                            param: "limit",
                            accepted: "a fleet's keys take a gcra limit",
                        }));
                    };
                    last = Some((r.limit, (s, p, b)));
                    (s, p, b)
                }
            };
            key.clear();
            key.push_str(&head);
            key.push_str(&r.name);
            call.key(key.as_str())
                .arg(s)
                .arg(p)
                .arg(b)
                .arg(r.amount.min(EXACT_MAX))
                .arg(r.tallied.min(EXACT_MAX));
        }
        let out: Vec<i64> = match &self.conn {
            Conn::Single(c) => call.invoke_async(&mut c.clone()).await?,
            Conn::Cluster(c) => call.invoke_async(&mut c.clone()).await?,
        };
        match out.as_slice() {
            [-1, late, ..] => Err(Error::Late {
                late: Duration::from_micros((*late).max(0) as u64),
            }),
            [now, debts @ ..] if debts.len() == reports.len() => {
                self.clock.sample((*now).max(0) as u64, self.clock.now_us());
                Ok(debts
                    .iter()
                    .map(|d| (*d >= 0).then(|| Duration::from_micros(*d as u64)))
                    .collect())
            }
            _ => Err(Error::Redis(redis::RedisError::from((
                redis::ErrorKind::UnexpectedReturnType,
                "the fleet script answered with the wrong number of keys",
            )))),
        }
    }

    /// Renews `member`'s lease in the members `key` on Redis's clock;
    /// answers how many members are counted (a member that has not left is
    /// counted for `grace` after its last renewal, past its `lease` too),
    /// how many have not renewed for `silence`, and how many are past their
    /// lease.
    pub async fn fleet_members(
        &self,
        key: &str,
        member: &str,
        lease: Duration,
        silence: Duration,
        grace: Duration,
    ) -> Result<Members, Error> {
        self.members_call(key, member, "renew", lease, silence, grace)
            .await
    }

    /// Removes `member` from the members `key`: it stops for good (its
    /// program went with it). The others are kept as [`Store::fleet_members`]
    /// keeps them, for `grace`.
    pub async fn fleet_leave(
        &self,
        key: &str,
        member: &str,
        lease: Duration,
        grace: Duration,
    ) -> Result<(), Error> {
        self.members_call(key, member, "leave", lease, lease, grace)
            .await
            .map(|_| ())
    }

    async fn members_call(
        &self,
        key: &str,
        member: &str,
        op: &str,
        lease: Duration,
        silence: Duration,
        grace: Duration,
    ) -> Result<Members, Error> {
        let mut call = MEMBERS.prepare_invoke();
        call.key(key)
            .arg(member)
            .arg(op)
            .arg(lease.as_millis() as u64)
            .arg(silence.as_millis() as u64)
            .arg(grace.as_millis() as u64);
        let (members, silent, past_lease): (u64, u64, u64) = match &self.conn {
            Conn::Single(c) => call.invoke_async(&mut c.clone()).await?,
            Conn::Cluster(c) => call.invoke_async(&mut c.clone()).await?,
        };
        Ok(Members {
            members,
            silent,
            past_lease,
        })
    }

    /// Redis's time now, µs since the epoch: estimated from its answers,
    /// asked (`TIME`) before the first.
    async fn redis_now_us(&self) -> Result<u64, Error> {
        match self.clock.deadline(Duration::ZERO) {
            Some(now) => Ok(now),
            None => self.time().await,
        }
    }

    /// The fleet's tallies of `minute` minutes ago (0: this minute, on
    /// Redis's clock) under `prefix`, every group's: each key's name and the
    /// units it was admitted.
    pub async fn fleet_tallies(&self, prefix: &str, ago: u64) -> Result<Vec<(String, u64)>, Error> {
        let minute = (self.time().await? / 60_000_000).saturating_sub(ago);
        let mut out = Vec::new();
        for group in 0..GROUPS {
            let cmd = redis::Cmd::zrange_withscores(tally_key(prefix, group, minute), 0, -1);
            let r: Vec<(String, f64)> = match &self.conn {
                Conn::Single(c) => cmd.query_async(&mut c.clone()).await?,
                Conn::Cluster(c) => cmd.query_async(&mut c.clone()).await?,
            };
            out.extend(r.into_iter().map(|(m, s)| (m, s.max(0.0) as u64)));
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_of_a_group_share_its_tag() {
        let name = "198.18.0.0/24|198.18.0.60/32";
        let g = group_of(name);
        assert!(g < GROUPS);
        assert_eq!(
            bucket_key("ratelimit:fleet:", name),
            format!("ratelimit:fleet:{{g{g}}}{name}")
        );
        assert_eq!(
            tally_key("ratelimit:fleet:", g, 7),
            format!("ratelimit:fleet:{{g{g}}}used:7")
        );
    }

    #[test]
    fn groups_are_stable_and_spread() {
        // FNV-1a of "a": 0xe40c292c.
        assert_eq!(group_of("a"), 0xe40c_292c % GROUPS);
        let mut seen = [0u32; GROUPS as usize];
        for i in 0..6400 {
            seen[group_of(&format!("default|198.18.{}.{}/32", i / 256, i % 256)) as usize] += 1;
        }
        assert!(seen.iter().all(|n| *n > 50), "{seen:?}");
    }
}
