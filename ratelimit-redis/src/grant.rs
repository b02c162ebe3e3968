//! The throttling service's calls (`ratelimit serve`): acquires that hand out
//! grants, many keys in one script call; refills bound to a grant; the keyed
//! refill of the open mode; and what a per-slot breaker needs of a Cluster
//! (a key's slot, who serves which slots, a probe of one slot).
//!
//! One script, `serve.lua`, run after `limit.lua` wrapped as a function: the
//! decisions and the states they write are `limit.lua`'s, so they cannot
//! drift apart; `serve.lua` only keeps the grants beside them (see its header
//! for the record and the rules). A grant is the key `KEY:g:ID`, in the key's
//! hash slot, so that the refund and the grant's record change in one atomic
//! call on a Cluster too.
//!
//! **What a refill gives back.** The amount a refill names is what the grant
//! did not use *in all*: the grant gives back the part of it not given back
//! yet, so a retried refill gives nothing more. It gives back at most what
//! the grant took, and only units that have not come back by themselves
//! (gcra: the grant's units are the last of the key's debt right after it;
//! windows: within the grant's own window), so a refill never admits more
//! than the grant would have taken had it asked only for what it used, and
//! never lifts a key above its capacity. Under another limit than the
//! grant's (the key's limit changed since) it gives nothing.

use std::{sync::LazyLock, time::Duration};

use redis::{Script, Value};

use crate::{Conn, EXACT_MAX, Error, Limit, Store};

/// `gcra.lua`, `limit.lua` as the function `limit(KEYS, ARGV)`, then `serve.lua`.
static SCRIPT: LazyLock<Script> = LazyLock::new(|| {
    Script::new(concat!(
        include_str!("gcra.lua"),
        "local function limit(KEYS, ARGV)\n",
        include_str!("limit.lua"),
        "\nend\n",
        include_str!("serve.lua")
    ))
});

/// How many keys one acquire call carries at most (a script runs alone in
/// Redis: a few hundred microseconds at most).
pub const MAX_BATCH: usize = 128;

/// One key asked for in an acquire call.
#[derive(Clone, Debug)]
pub struct Ask {
    /// The full Redis key ([`Store::key`]).
    pub key: String,
    /// Its limit.
    pub limit: Limit,
    /// Units asked for (at least 1).
    pub amount: u64,
    /// All or nothing (as Envoy's descriptors are); else what is there.
    pub whole: bool,
    /// The id to record a grant under (see [`Store::grant_key`]) when
    /// anything is granted; `None` for no grant.
    pub grant: Option<String>,
    /// Who may refill the grant: a word without blanks, given again by
    /// [`Store::refill_grant`] (a refill by anyone else is
    /// [`RefillOutcome::Foreign`]).
    pub owner: String,
}

/// What one [`Ask`] was answered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Granted {
    /// Whether the whole amount was granted.
    pub allowed: bool,
    /// Units granted (all, some, or none).
    pub granted: u64,
    /// Whole units left after it.
    pub remaining: u64,
    /// When not all was granted: how long until it would be, if nothing else
    /// came; `None` if it never can be at once (more than the capacity).
    pub retry_after: Option<Duration>,
}

/// What a refill by grant did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Refilled {
    /// What happened to the grant.
    pub outcome: RefillOutcome,
    /// Units given back now (the key's remaining rose by as much).
    pub refunded: u64,
    /// Whole units left after it; `None` when the grant is unknown.
    pub remaining: Option<u64>,
    /// Units the grant took.
    pub taken: u64,
    /// Units of it said unused so far, this refill's included (at most
    /// `taken`).
    pub unused: u64,
}

/// How a refill by grant went.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RefillOutcome {
    /// Done (possibly giving nothing back: a retry, or units already back).
    Done,
    /// No such grant: it expired (its units came back by themselves) or
    /// never was.
    Unknown,
    /// The key's limit changed since the grant: nothing given back.
    LimitChanged,
    /// A grant of another owner: nothing given back.
    Foreign,
}

/// What a keyed refund (the open mode's refill) did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Refunded {
    /// Units given back (the key's remaining rose by as much).
    pub refunded: u64,
    /// Whole units left; `None` when the key has no state (it is full) and
    /// no limit was named, so how many that is is not known.
    pub remaining: Option<u64>,
    /// The key was written under another limit than the one named: nothing
    /// was given back.
    pub other_limit: bool,
}

/// An owner as the grant's record holds it: one word (`-` for none).
fn owner_word(owner: &str) -> String {
    let w: String = owner.chars().filter(|c| c.is_ascii_graphic()).collect();
    if w.is_empty() { "-".into() } else { w }
}

impl Store {
    /// The key of the grant `id` of `key` (the full Redis key): in the same
    /// hash slot.
    pub fn grant_key(key: &str, id: &str) -> String {
        format!("{key}:g:{id}")
    }

    /// Whether this is a Redis Cluster.
    pub fn is_cluster(&self) -> bool {
        matches!(self.conn, Conn::Cluster(_))
    }

    async fn serve_call(&self, call: &mut redis::ScriptInvocation<'_>) -> Result<Vec<i64>, Error> {
        let r: Vec<i64> = match &self.conn {
            Conn::Single(c) => call.invoke_async(&mut c.clone()).await?,
            Conn::Cluster(c) => call.invoke_async(&mut c.clone()).await?,
        };
        if let Some(&now) = r.last() {
            self.clock.sample(now.max(0) as u64, self.clock.now_us());
        }
        if r.len() == 3 && r[0] == -1 {
            return Err(Error::Late {
                late: Duration::from_micros(r[1].max(0) as u64),
            });
        }
        Ok(r)
    }

    /// Asks for each of `asks` in one atomic call (each key decided as
    /// [`Store::acquire`] or [`Store::take`] would, in order). On a Cluster
    /// every key must be in one hash slot ([`slot`]); at most [`MAX_BATCH`].
    pub async fn acquire_many(&self, asks: &[Ask]) -> Result<Vec<Granted>, Error> {
        assert!(asks.len() <= MAX_BATCH, "at most {MAX_BATCH} keys a call");
        let args = asks
            .iter()
            .map(|a| a.limit.args())
            .collect::<Result<Vec<_>, _>>()?;
        let deadline = self.deadline().await?;
        let mut call = SCRIPT.prepare_invoke();
        call.arg("acquire").arg(deadline);
        for (a, (algo, x, y, z)) in asks.iter().zip(args) {
            let id = a.grant.as_deref().unwrap_or("");
            call.key(&a.key)
                .key(Self::grant_key(&a.key, id))
                .arg(if a.whole { "take" } else { "partial" })
                .arg(algo)
                .arg(x)
                .arg(y)
                .arg(z)
                .arg(a.amount.clamp(1, EXACT_MAX))
                .arg(id)
                .arg(owner_word(&a.owner));
        }
        let r = self.serve_call(&mut call).await?;
        if r.len() != asks.len() * 4 + 1 {
            return Err(Error::Redis(redis::RedisError::from((
                redis::ErrorKind::Parse,
                "the acquire script answered the wrong number of values",
            ))));
        }
        Ok(r.chunks_exact(4)
            .map(|v| Granted {
                allowed: v[0] == 1,
                granted: v[1].max(0) as u64,
                remaining: v[2].max(0) as u64,
                retry_after: (v[3] >= 0 && v[0] != 1).then(|| Duration::from_micros(v[3] as u64)),
            })
            .collect())
    }

    /// Refills the grant `id` of `key` (the full Redis key) as `owner` (the
    /// grant's, or it is [`RefillOutcome::Foreign`]): `unused` is what the
    /// grant did not use in all (see the module's rules).
    pub async fn refill_grant(
        &self,
        key: &str,
        id: &str,
        owner: &str,
        unused: u64,
    ) -> Result<Refilled, Error> {
        let deadline = self.deadline().await?;
        let mut call = SCRIPT.prepare_invoke();
        call.key(key)
            .key(Self::grant_key(key, id))
            .arg("refill")
            .arg(deadline)
            .arg(unused.min(EXACT_MAX))
            .arg(owner_word(owner));
        let r = self.serve_call(&mut call).await?;
        let outcome = match r.first() {
            Some(1) => RefillOutcome::Done,
            Some(2) => RefillOutcome::LimitChanged,
            Some(3) => RefillOutcome::Foreign,
            _ => RefillOutcome::Unknown,
        };
        let at = |i: usize| r.get(i).copied().unwrap_or(0);
        Ok(Refilled {
            outcome,
            refunded: at(1).max(0) as u64,
            remaining: (at(2) >= 0
                && !matches!(outcome, RefillOutcome::Unknown | RefillOutcome::Foreign))
            .then(|| at(2) as u64),
            taken: at(3).max(0) as u64,
            unused: at(4).max(0) as u64,
        })
    }

    /// Gives back `amount` of `key` (the full Redis key) under `limit`, or the
    /// key's own limit when `None`; never above its capacity. Says what was
    /// really given back. Refused (nothing given) when `limit` is not the
    /// one the key was written under.
    pub async fn refund_key(
        &self,
        key: &str,
        limit: Option<&Limit>,
        amount: u64,
    ) -> Result<Refunded, Error> {
        let (algo, x, y, z) = match limit {
            Some(l) => l.args()?,
            None => ("stored", 0, 0, 0),
        };
        let deadline = self.deadline().await?;
        let mut call = SCRIPT.prepare_invoke();
        call.key(key)
            .arg("refund")
            .arg(deadline)
            .arg(algo)
            .arg(x)
            .arg(y)
            .arg(z)
            .arg(amount.clamp(1, EXACT_MAX));
        let r = self.serve_call(&mut call).await?;
        let at = |i: usize| r.get(i).copied().unwrap_or(0);
        Ok(Refunded {
            refunded: at(1).max(0) as u64,
            remaining: (at(2) >= 0).then(|| at(2) as u64),
            other_limit: at(0) == 2,
        })
    }

    /// Who serves which slots: `(first, last, "host:port")` of each master,
    /// from `CLUSTER SLOTS`. Empty for one server.
    pub async fn cluster_slots(&self) -> Result<Vec<(u16, u16, String)>, Error> {
        let Conn::Cluster(c) = &self.conn else {
            return Ok(Vec::new());
        };
        let v: Value = redis::cmd("CLUSTER")
            .arg("SLOTS")
            .query_async(&mut c.clone())
            .await?;
        Ok(parse_cluster_slots(&v))
    }

    /// Runs the decision script's probe (a write, as a decision's) on a key
    /// of `slot` under `prefix`: whether that slot takes decisions.
    pub async fn probe_slot(&self, prefix: &str, slot: u16) -> Result<(), Error> {
        let key = format!("{prefix}{{{}}}:healthz", tag_of_slot(slot));
        self.invoke(crate::Op::Probe, &key, None, 1)
            .await
            .map(|_| ())
    }
}

fn parse_cluster_slots(v: &Value) -> Vec<(u16, u16, String)> {
    let int = |v: &Value| match v {
        Value::Int(n) => Some(*n),
        _ => None,
    };
    let text = |v: &Value| match v {
        Value::BulkString(b) => Some(String::from_utf8_lossy(b).into_owned()),
        Value::SimpleString(s) => Some(s.clone()),
        _ => None,
    };
    let Value::Array(ranges) = v else {
        return Vec::new();
    };
    ranges
        .iter()
        .filter_map(|r| {
            let Value::Array(r) = r else { return None };
            let (first, last) = (int(r.first()?)?, int(r.get(1)?)?);
            let Value::Array(master) = r.get(2)? else {
                return None;
            };
            let host = text(master.first()?)?;
            let port = int(master.get(1)?)?;
            Some((first as u16, last as u16, format!("{host}:{port}")))
        })
        .collect()
}

/// The Cluster hash slot of `key`: CRC16 (XMODEM) of its hash tag (the text
/// between the first `{` and the next `}`, if not empty) or of the whole key,
/// modulo 16384.
pub fn slot(key: &str) -> u16 {
    let b = key.as_bytes();
    let tagged = b.iter().position(|&c| c == b'{').and_then(|open| {
        let rest = &b[open + 1..];
        rest.iter()
            .position(|&c| c == b'}')
            .filter(|&close| close > 0)
            .map(|close| &rest[..close])
    });
    crc16(tagged.unwrap_or(b)) % 16384
}

fn crc16(data: &[u8]) -> u16 {
    let mut crc: u16 = 0;
    for &byte in data {
        crc ^= u16::from(byte) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc
}

/// A short hash tag whose slot is `slot` (a decimal number: the first that
/// hashes there).
pub fn tag_of_slot(slot: u16) -> String {
    (0u32..)
        .map(|i| i.to_string())
        .find(|t| crc16(t.as_bytes()) % 16384 == slot % 16384)
        .expect("every slot has a decimal tag")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_are_redis_own() {
        assert_eq!(crc16(b"123456789"), 0x31c3);
        // CLUSTER KEYSLOT foo / bar / {user1000}.following.
        assert_eq!(slot("foo"), 12182);
        assert_eq!(slot("bar"), 5061);
        assert_eq!(slot("{user1000}.following"), slot("user1000"));
        // An empty tag: the whole key.
        assert_eq!(slot("{}x"), crc16(b"{}x") % 16384);
        assert_eq!(slot(&Store::grant_key("api:{alice}", "7")), slot("alice"));
        for s in [0, 1, 5061, 16383] {
            assert_eq!(slot(&tag_of_slot(s)), s);
        }
    }
}
