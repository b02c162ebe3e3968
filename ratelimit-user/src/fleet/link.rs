//! The sync's connection to Redis, and which of its key groups can be asked.
//!
//! A connection is made in the background (a sync never waits on it), and
//! made again when calls fail in a way a new connection may mend: above all
//! a silent connection (a partition: TCP retransmits with growing waits and
//! would come back seconds after Redis does), and a Cluster's slot map
//! (`MOVED`, `ASK`, `CLUSTERDOWN` coming back to us: the `redis` crate's
//! Cluster connection reads the map again on `MOVED` and reconnects to a
//! master that comes back by itself, as the fleet tests check, so this is
//! the guarantee, not the rule). The old connection serves until the new
//! one is made.
//!
//! A key group whose call failed is asked again once a [`RETRY`], with the
//! very call a sync makes (no `PING`: a Cluster answers one while a master
//! is down); until then its keys are judged by the fallback. So a master
//! down costs its own groups, never the others'.

use std::{collections::HashMap, time::Instant};

use ratelimit_redis::{Error, Store};
use tokio::task::JoinHandle;

use super::{CALL_TIMEOUT, RETRY};

/// A new connection at most this often.
const RECONNECT: std::time::Duration = std::time::Duration::from_secs(2);

/// The members' renewal, beside the key groups.
pub(super) const MEMBERS: u32 = u32::MAX;

pub(super) struct Link {
    url: String,
    store: Option<Store>,
    /// A connection being made.
    connecting: Option<JoinHandle<Option<Store>>>,
    /// When the last one was started.
    started: Option<Instant>,
    /// A new connection is wanted.
    renew: bool,
    /// Groups (and [`MEMBERS`]) that failed: when they are asked again.
    down: HashMap<u32, Instant>,
}

impl Link {
    pub(super) fn new(url: String) -> Self {
        Self {
            url,
            store: None,
            connecting: None,
            started: None,
            renew: false,
            down: HashMap::new(),
        }
    }

    /// Makes the first connection, waiting for it (at most the time a
    /// connection may take): the first sync then knows whether Redis
    /// answers.
    pub(super) async fn first(&mut self) {
        self.refresh().await;
        if let Some(handle) = self.connecting.take()
            && let Ok(Some(store)) = handle.await
        {
            self.store = Some(store);
        }
    }

    /// Takes a connection made in the background, and starts one when there
    /// is none or a new one is wanted (at most every [`RECONNECT`]).
    pub(super) async fn refresh(&mut self) {
        if self
            .connecting
            .as_ref()
            .is_some_and(JoinHandle::is_finished)
            && let Some(handle) = self.connecting.take()
            && let Ok(Some(store)) = handle.await
        {
            self.store = Some(store);
            self.renew = false;
        }
        let wanted = self.store.is_none() || self.renew;
        let due = self.started.is_none_or(|s| s.elapsed() >= RECONNECT);
        if wanted && due && self.connecting.is_none() {
            let url = self.url.clone();
            self.started = Some(Instant::now());
            self.connecting = Some(tokio::spawn(async move {
                // A cluster's first connection reads its slot map from a
                // node and connects to the others: more than one call.
                let within = CALL_TIMEOUT * 4;
                tokio::time::timeout(within, Store::connect(&url))
                    .await
                    .ok()
                    .and_then(Result::ok)
            }));
        }
    }

    /// The connection, if one is made.
    pub(super) fn store(&self) -> Option<&Store> {
        self.store.as_ref()
    }

    /// Whether `group` may be asked now: it did not fail, or its retry is due.
    pub(super) fn due(&self, group: u32, now: Instant) -> bool {
        self.down.get(&group).is_none_or(|at| now >= *at)
    }

    /// `group` answered.
    pub(super) fn answered(&mut self, group: u32) {
        self.down.remove(&group);
    }

    /// `group` failed at `now` with `error` (`None`: no answer in time).
    pub(super) fn failed(&mut self, group: u32, error: Option<&Error>, now: Instant) {
        self.down.insert(group, now + RETRY);
        if error.is_none_or(Error::wants_new_connection) {
            self.renew = true;
        }
    }

    /// Key groups (not the members) that failed and are not answered yet.
    pub(super) fn groups_down(&self) -> u64 {
        self.down.keys().filter(|g| **g != MEMBERS).count() as u64
    }

    /// Forgets the groups no key is in any more.
    pub(super) fn keep_groups(&mut self, live: impl Fn(u32) -> bool) {
        self.down.retain(|g, _| *g == MEMBERS || live(*g));
    }
}
