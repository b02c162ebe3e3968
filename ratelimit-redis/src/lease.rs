//! Client-side batching, so that a busy client does not ask the shared
//! store for every unit: a client leases a batch of
//! tokens from Redis, spends it locally, and gives back what it did not spend
//! when the lease ends.
//!
//! # The over-admission bound
//! Let the limit admit `B + R·t` in any window of length `t` (burst `B`, rate
//! `R`), `C` clients lease from one key, each holding at most `b` tokens at
//! once (the batch, or one request if larger), and a lease last `L`. Then in
//! any window `[t0, t0 + t]` the clients together admit at most
//!
//! ```text
//! B + R·t + min(C·b, R·L)
//! ```
//!
//! Every token used in the window was leased from Redis, either inside it (at
//! most `B + R·t`) or before it and still held at `t0`: at most `b` per client,
//! and — since a token is never used after its lease ends — only tokens leased
//! in `[t0 − L, t0]`, which adds at most `R·L` to the window's `B + R·t`
//! (tokens given back return to the bucket and were not used). Over a run that
//! starts with nothing held, the total is never above `B + R·t` at all: leasing
//! only moves admissions earlier, never adds any. See [`bound`].

use std::{
    collections::HashMap,
    sync::Mutex,
    time::{Duration, Instant},
};

use crate::{Error, Limit, RedisLimiter};

struct Held {
    tokens: u64,
    /// When the oldest token held stops being usable.
    expires: Instant,
}

/// What [`Leases::acquire`] granted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Grant {
    /// Units granted, from 0 to what was asked.
    pub granted: u64,
    /// When less was granted than asked: how long until Redis would grant the
    /// rest, if nothing else came; `None` when all was granted or never can be.
    pub retry_after: Option<Duration>,
}

/// A leasing client of one [`RedisLimiter`].
pub struct Leases {
    limiter: RedisLimiter,
    batch: u64,
    lease: Duration,
    held: Mutex<HashMap<String, Held>>,
}

impl Leases {
    /// Leases `batch` tokens at a time (at most the limit's capacity), each
    /// lease usable for `lease`.
    pub fn new(limiter: RedisLimiter, batch: u64, lease: Duration) -> Self {
        let batch = batch.clamp(1, limiter.limit().capacity());
        Self {
            limiter,
            batch,
            lease,
            held: Mutex::new(HashMap::new()),
        }
    }

    fn held(&self) -> std::sync::MutexGuard<'_, HashMap<String, Held>> {
        self.held.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Takes `n` of `key` from what is held, leasing more from Redis when it
    /// is not enough; grants all of `n` or what there is.
    pub async fn acquire(&self, key: &str, n: u64) -> Result<Grant, Error> {
        let now = Instant::now();
        let (have, expired) = {
            let mut held = self.held();
            match held.get_mut(key) {
                Some(h) if h.expires <= now => (0, std::mem::take(&mut h.tokens)),
                Some(h) if h.tokens >= n => {
                    h.tokens -= n;
                    return Ok(Grant {
                        granted: n,
                        retry_after: None,
                    });
                }
                Some(h) => (h.tokens, 0),
                None => (0, 0),
            }
        };
        if expired > 0 {
            self.limiter.refund(key, expired).await?;
        }
        let ask = (n - have).max(self.batch);
        let reply = self.limiter.acquire(key, ask).await?;
        let mut held = self.held();
        let h = held.entry(key.to_string()).or_insert(Held {
            tokens: 0,
            expires: now,
        });
        if h.tokens == 0 || h.expires <= now {
            h.tokens = 0;
            h.expires = now + self.lease;
        }
        h.tokens += reply.granted;
        let granted = h.tokens.min(n);
        h.tokens -= granted;
        Ok(Grant {
            granted,
            retry_after: if granted < n { reply.retry_after } else { None },
        })
    }

    /// Puts back `n` of `key` acquired and not used: held again until the
    /// lease ends.
    pub fn refund(&self, key: &str, n: u64) {
        let now = Instant::now();
        if let Some(h) = self.held().get_mut(key)
            && h.expires > now
        {
            h.tokens += n;
        }
    }

    /// Gives back to Redis every token whose lease has ended. Call it about
    /// every lease time; [`Leases::acquire`] also does it for the key it serves.
    pub async fn expire(&self) -> Result<u64, Error> {
        let now = Instant::now();
        let ended: Vec<(String, u64)> = {
            let mut held = self.held();
            let ended = held
                .iter_mut()
                .filter(|(_, h)| h.expires <= now && h.tokens > 0)
                .map(|(k, h)| (k.clone(), std::mem::take(&mut h.tokens)))
                .collect();
            held.retain(|_, h| h.tokens > 0);
            ended
        };
        self.give_back(ended).await
    }

    /// Gives back to Redis every token held (at shutdown).
    pub async fn flush(&self) -> Result<u64, Error> {
        let all: Vec<(String, u64)> = self
            .held()
            .drain()
            .filter(|(_, h)| h.tokens > 0)
            .map(|(k, h)| (k, h.tokens))
            .collect();
        self.give_back(all).await
    }

    async fn give_back(&self, tokens: Vec<(String, u64)>) -> Result<u64, Error> {
        let mut total = 0;
        for (key, n) in tokens {
            self.limiter.refund(&key, n).await?;
            total += n;
        }
        Ok(total)
    }

    /// Tokens held now for `key`, usable or not.
    pub fn holding(&self, key: &str) -> u64 {
        self.held().get(key).map_or(0, |h| h.tokens)
    }

    /// The most this client holds at once per key.
    pub fn batch(&self) -> u64 {
        self.batch
    }
}

/// The most `clients` leasing clients (each holding at most `batch`, leases
/// of `lease`) admit together in any window of `window` under `limit`:
/// `B + R·t + min(C·b, R·L)` (module docs).
pub fn bound(limit: &Limit, clients: u64, batch: u64, lease: Duration, window: Duration) -> f64 {
    let rate = limit.rate_per_sec();
    limit.capacity() as f64
        + rate * window.as_secs_f64()
        + ((clients * batch) as f64).min(rate * lease.as_secs_f64())
}
