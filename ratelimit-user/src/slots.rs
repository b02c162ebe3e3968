//! Connection slots of one listener, shared by the control socket and the
//! metrics endpoint: at most `cap` connections at once, and when they are all
//! taken, the one that has waited longest without sending its request is
//! closed to make room. A flood of idle clients therefore costs a bounded
//! number of file descriptors and delays a real client by nothing: it is the
//! newest, and it asks at once.

use std::{
    collections::{BTreeMap, HashSet},
    future::Future,
    sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError},
};

use tokio::task::AbortHandle;

use crate::metrics::QuietLog;

/// An accept loop's pace after failures (out of file descriptors, or the
/// like): it waits before the next accept, 10 ms doubling up to 1 s, rather
/// than spin, and logs the error at most once per
/// [`LOG_EVERY`](crate::metrics::LOG_EVERY).
pub struct AcceptBackoff {
    log: QuietLog,
    wait: std::time::Duration,
}

impl Default for AcceptBackoff {
    fn default() -> Self {
        Self {
            log: QuietLog::new(),
            wait: Self::FIRST,
        }
    }
}

impl AcceptBackoff {
    const FIRST: std::time::Duration = std::time::Duration::from_millis(10);

    /// An accept succeeded: the next failure waits the shortest time again.
    pub fn accepted(&mut self) {
        self.wait = Self::FIRST;
    }

    /// An accept failed with `error`: logs `what` (rate-limited) and waits.
    pub async fn failed(&mut self, what: &str, error: &(dyn std::fmt::Display + Sync)) {
        self.log.warn(what, error);
        tokio::time::sleep(self.wait).await;
        self.wait = (self.wait * 2).min(std::time::Duration::from_secs(1));
    }
}

#[derive(Default)]
struct Inner {
    next: u64,
    /// Connections open, idle or not.
    open: HashSet<u64>,
    /// Connections that have not sent their request yet, oldest first, with
    /// the handle that closes them (set once their task is spawned).
    idle: BTreeMap<u64, Arc<OnceLock<AbortHandle>>>,
}

fn lock(inner: &Mutex<Inner>) -> MutexGuard<'_, Inner> {
    inner.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The slots of one listener.
#[derive(Clone)]
pub struct Slots {
    cap: usize,
    inner: Arc<Mutex<Inner>>,
}

/// One connection's slot: released when dropped (the connection's task ends
/// or is aborted).
pub struct Slot {
    id: u64,
    inner: Arc<Mutex<Inner>>,
}

impl Slots {
    /// Slots for at most `cap` connections.
    pub fn new(cap: usize) -> Self {
        Self {
            cap: cap.max(1),
            inner: Arc::default(),
        }
    }

    /// Runs `serve` for a new connection on its own task, its slot idle until
    /// it calls [`Slot::busy`]. When every slot is taken, the oldest idle
    /// connection is closed first; if none can be, the new connection is
    /// refused (`false`: the caller drops it).
    pub fn spawn<F, Fut>(&self, serve: F) -> bool
    where
        F: FnOnce(Slot) -> Fut,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let handle = Arc::new(OnceLock::new());
        let id = {
            let mut inner = lock(&self.inner);
            if inner.open.len() >= self.cap {
                let oldest = inner
                    .idle
                    .iter()
                    .find(|(_, h)| h.get().is_some())
                    .map(|(id, _)| *id);
                let Some(oldest) = oldest else {
                    return false;
                };
                if let Some(h) = inner.idle.remove(&oldest).and_then(|h| h.get().cloned()) {
                    h.abort();
                }
                // Counted free now; the aborted task's slot finds nothing left
                // to release.
                inner.open.remove(&oldest);
            }
            let id = inner.next;
            inner.next += 1;
            inner.open.insert(id);
            inner.idle.insert(id, handle.clone());
            id
        };
        // No lock is held from here: the task may end (and release its slot)
        // at any point.
        let slot = Slot {
            id,
            inner: self.inner.clone(),
        };
        let task = tokio::spawn(serve(slot));
        let _ = handle.set(task.abort_handle());
        true
    }

    /// Connections open now.
    pub fn open(&self) -> usize {
        lock(&self.inner).open.len()
    }
}

impl Slot {
    /// The request has arrived: this connection is no longer closed to make
    /// room for others.
    pub fn busy(&self) {
        lock(&self.inner).idle.remove(&self.id);
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut inner = lock(&self.inner);
        inner.idle.remove(&self.id);
        inner.open.remove(&self.id);
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[tokio::test]
    async fn the_oldest_idle_connection_makes_room() {
        let slots = Slots::new(2);
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<u64>();
        for i in 0..2u64 {
            let tx = tx.clone();
            assert!(slots.spawn(move |slot| async move {
                let _held = slot;
                tokio::time::sleep(Duration::from_secs(60)).await;
                let _ = tx.send(i);
            }));
        }
        assert_eq!(slots.open(), 2);
        // A third: the first (oldest idle) is closed for it.
        let tx3 = tx.clone();
        assert!(slots.spawn(move |slot| async move {
            slot.busy();
            let _ = tx3.send(3);
        }));
        assert_eq!(rx.recv().await, Some(3));
        tokio::task::yield_now().await;
        assert_eq!(slots.open(), 1, "the first was closed, the third is done");
        // A fourth fits without closing the second.
        assert!(slots.spawn(|slot| async move {
            let _held = slot;
            tokio::time::sleep(Duration::from_secs(60)).await;
        }));
        assert_eq!(slots.open(), 2);
    }

    #[tokio::test]
    async fn busy_connections_are_never_closed_for_room() {
        let slots = Slots::new(1);
        let (release, wait) = tokio::sync::oneshot::channel::<()>();
        let (started, is_started) = tokio::sync::oneshot::channel::<()>();
        assert!(slots.spawn(move |slot| async move {
            slot.busy();
            let _ = started.send(());
            let _ = wait.await;
        }));
        is_started.await.unwrap();
        assert!(!slots.spawn(|_slot| async {}), "a busy slot was taken");
        release.send(()).unwrap();
        for _ in 0..100 {
            if slots.open() == 0 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        assert!(slots.spawn(|_slot| async {}));
    }
}
