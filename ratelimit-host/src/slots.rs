//! Connection slots of one listener, shared by the control socket, the
//! metrics endpoint and `ratelimit serve`: at most `cap` connections at once,
//! and when they are all taken, the one that has been idle longest (it has not
//! sent its request, or waits for its next one, or for its reader to take the
//! answer) is closed to make room. A flood of idle or slow clients therefore
//! costs a bounded number of file descriptors and delays a real client by
//! nothing: it is the newest, and it asks at once.

use std::{
    collections::{BTreeMap, HashMap},
    future::Future,
    sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError},
};

use tokio::task::AbortHandle;

use crate::logs::QuietLog;

/// An accept loop's pace after failures (out of file descriptors, or the
/// like): it waits before the next accept, 10 ms doubling up to 1 s, rather
/// than spin, and logs the error at most once per
/// [`LOG_EVERY`](crate::logs::LOG_EVERY).
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

/// Keeps the soft limit on open files at the hard one (at most 65 536): the
/// connection caps keep a server far below either, but a soft limit of 1 024
/// (systemd's default) leaves less room than they need. Returns the soft
/// limit now in force.
pub fn raise_nofile() -> u64 {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: a valid out pointer.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
        return 1024;
    }
    let want = lim.rlim_max.min(65_536);
    if lim.rlim_cur < want {
        let raised = libc::rlimit {
            rlim_cur: want,
            rlim_max: lim.rlim_max,
        };
        // SAFETY: a valid rlimit; failure leaves the limit as it was.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } == 0 {
            return want;
        }
    }
    lim.rlim_cur
}

/// Makes a socket close with a reset when dropped, unless [disarmed]: what
/// is still queued for a reader who does not read is dropped at once, not
/// kept by the kernel while it retries. For connections cut off, or closed to
/// make room. Declare it after the socket's owner, so that it is dropped
/// first, while the socket is open (in an aborted task as well).
///
/// [disarmed]: ResetOnClose::disarm
pub struct ResetOnClose {
    fd: std::os::fd::RawFd,
    armed: bool,
}

impl ResetOnClose {
    /// For the open socket `fd`.
    pub fn new(fd: std::os::fd::RawFd) -> Self {
        Self { fd, armed: true }
    }

    /// The connection ended by itself: it closes as usual.
    pub fn disarm(&mut self) {
        self.armed = false;
    }
}

impl Drop for ResetOnClose {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let linger = libc::linger {
            l_onoff: 1,
            l_linger: 0,
        };
        // SAFETY: the socket is open (its owner is dropped after this) and the
        // option is of its size; failure leaves an ordinary close.
        unsafe {
            libc::setsockopt(
                self.fd,
                libc::SOL_SOCKET,
                libc::SO_LINGER,
                (&raw const linger).cast(),
                std::mem::size_of::<libc::linger>() as libc::socklen_t,
            )
        };
    }
}

struct Open {
    /// Closes the connection (set once its task is spawned).
    handle: Arc<OnceLock<AbortHandle>>,
    /// Its place among the idle ones, while it is idle.
    idle: Option<u64>,
}

#[derive(Default)]
struct Inner {
    next: u64,
    /// Slots not dropped yet: the open connections and those closed for room
    /// whose task has not ended yet (their socket is still open).
    alive: usize,
    /// Connections open, idle or not, by id.
    open: HashMap<u64, Open>,
    /// Connections not working on a request (waiting for one, or for a
    /// reader to take their answer), longest idle first: place → id.
    idle: BTreeMap<u64, u64>,
}

impl Inner {
    fn place(&mut self) -> u64 {
        self.next += 1;
        self.next
    }
}

#[derive(Default)]
struct Shared {
    inner: Mutex<Inner>,
    /// A slot was dropped.
    released: tokio::sync::Notify,
}

fn lock(shared: &Shared) -> MutexGuard<'_, Inner> {
    shared.inner.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The slots of one listener.
#[derive(Clone)]
pub struct Slots {
    cap: usize,
    inner: Arc<Shared>,
}

/// One connection's slot: released when dropped (the connection's task ends
/// or is aborted).
pub struct Slot {
    id: u64,
    inner: Arc<Shared>,
}

/// What [`Slots::spawn`] did with a new connection.
#[must_use]
pub enum Admission<T> {
    /// It was given a free slot.
    Admitted,
    /// Every slot was taken: the connection idle longest was closed for it.
    MadeRoom,
    /// Every slot is taken by a connection working on a request: `serve` was
    /// not run; the connection is given back.
    Full(T),
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
    /// it calls [`Slot::busy`]. When every slot is taken, the connection idle
    /// longest is closed first; if none can be, `serve` is not run.
    pub fn spawn<F, Fut>(&self, serve: F) -> Admission<()>
    where
        F: FnOnce(Slot) -> Fut,
        Fut: Future<Output = ()> + Send + 'static,
    {
        self.spawn_with((), |slot, ()| serve(slot))
    }

    /// [`Slots::spawn`] with `value` (the connection) handed to `serve`, or
    /// given back when every slot is busy, for the caller to answer that.
    pub fn spawn_with<T, F, Fut>(&self, value: T, serve: F) -> Admission<T>
    where
        F: FnOnce(Slot, T) -> Fut,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let handle = Arc::new(OnceLock::new());
        let mut admission = Admission::Admitted;
        let id = {
            let mut inner = lock(&self.inner);
            if inner.open.len() >= self.cap {
                let oldest = inner
                    .idle
                    .iter()
                    .map(|(place, id)| (*place, *id))
                    .find(|(_, id)| inner.open[id].handle.get().is_some());
                let Some((place, oldest)) = oldest else {
                    return Admission::Full(value);
                };
                inner.idle.remove(&place);
                // Counted free now; the aborted task's slot finds nothing left
                // to release.
                if let Some(h) = inner
                    .open
                    .remove(&oldest)
                    .and_then(|o| o.handle.get().cloned())
                {
                    h.abort();
                }
                admission = Admission::MadeRoom;
            }
            let id = inner.place();
            let place = inner.place();
            inner.alive += 1;
            inner.open.insert(
                id,
                Open {
                    handle: handle.clone(),
                    idle: Some(place),
                },
            );
            inner.idle.insert(place, id);
            id
        };
        // No lock is held from here: the task may end (and release its slot)
        // at any point.
        let slot = Slot {
            id,
            inner: self.inner.clone(),
        };
        let task = tokio::spawn(serve(slot, value));
        let _ = handle.set(task.abort_handle());
        admission
    }

    /// Connections open now.
    pub fn open(&self) -> usize {
        lock(&self.inner).open.len()
    }

    /// Waits until fewer than `most` sockets are held: the open connections
    /// and those closed for room whose task has not ended yet. A connection
    /// closed for room lets go of its socket when its task is next run, not at
    /// once; an accept loop that waits for this before it accepts holds at most
    /// `most` sockets however fast connections come (they wait in the
    /// listener's backlog meanwhile).
    pub async fn room(&self, most: usize) {
        loop {
            if lock(&self.inner).alive < most {
                return;
            }
            // A slot dropped after the check left a permit: no wake-up is lost.
            self.inner.released.notified().await;
        }
    }
}

impl Slot {
    /// A request has arrived: this connection is not closed to make room for
    /// others until [`Slot::idle`].
    pub fn busy(&self) {
        let mut inner = lock(&self.inner);
        if let Some(place) = inner.open.get_mut(&self.id).and_then(|o| o.idle.take()) {
            inner.idle.remove(&place);
        }
    }

    /// The request is answered: the connection waits for its next one (or for
    /// its reader to take the answer), and may be closed to make room, after
    /// those idle longer.
    pub fn idle(&self) {
        let mut inner = lock(&self.inner);
        let place = inner.place();
        let Some(open) = inner.open.get_mut(&self.id) else {
            return;
        };
        let old = open.idle.replace(place);
        if let Some(old) = old {
            inner.idle.remove(&old);
        }
        inner.idle.insert(place, self.id);
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        {
            let mut inner = lock(&self.inner);
            inner.alive -= 1;
            if let Some(place) = inner.open.remove(&self.id).and_then(|o| o.idle) {
                inner.idle.remove(&place);
            }
        }
        self.inner.released.notify_one();
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn admitted<F>(a: Admission<F>) -> &'static str {
        match a {
            Admission::Admitted => "admitted",
            Admission::MadeRoom => "made room",
            Admission::Full(_) => "full",
        }
    }

    #[tokio::test]
    async fn the_oldest_idle_connection_makes_room() {
        let slots = Slots::new(2);
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<u64>();
        for i in 0..2u64 {
            let tx = tx.clone();
            let a = slots.spawn(move |slot| async move {
                let _held = slot;
                tokio::time::sleep(Duration::from_secs(60)).await;
                let _ = tx.send(i);
            });
            assert_eq!(admitted(a), "admitted");
        }
        assert_eq!(slots.open(), 2);
        // A third: the first (oldest idle) is closed for it.
        let tx3 = tx.clone();
        let a = slots.spawn(move |slot| async move {
            slot.busy();
            let _ = tx3.send(3);
        });
        assert_eq!(admitted(a), "made room");
        assert_eq!(rx.recv().await, Some(3));
        tokio::task::yield_now().await;
        assert_eq!(slots.open(), 1, "the first was closed, the third is done");
        // A fourth fits without closing the second.
        let a = slots.spawn(|slot| async move {
            let _held = slot;
            tokio::time::sleep(Duration::from_secs(60)).await;
        });
        assert_eq!(admitted(a), "admitted");
        assert_eq!(slots.open(), 2);
    }

    #[tokio::test]
    async fn busy_connections_are_never_closed_for_room() {
        let slots = Slots::new(1);
        let (release, wait) = tokio::sync::oneshot::channel::<()>();
        let (started, is_started) = tokio::sync::oneshot::channel::<()>();
        let a = slots.spawn(move |slot| async move {
            slot.busy();
            let _ = started.send(());
            let _ = wait.await;
        });
        assert_eq!(admitted(a), "admitted");
        is_started.await.unwrap();
        assert_eq!(
            admitted(slots.spawn(|_slot| async {})),
            "full",
            "a busy slot was taken"
        );
        release.send(()).unwrap();
        for _ in 0..100 {
            if slots.open() == 0 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        assert_eq!(admitted(slots.spawn(|_slot| async {})), "admitted");
    }

    /// The connection idle longest goes first, whatever its age: one answered
    /// goes idle behind those idle already (a client between two requests is
    /// closed after a flood's silent connections), and before those that
    /// come after.
    #[tokio::test]
    async fn an_answered_connection_is_closed_after_those_idle_longer() {
        let slots = Slots::new(2);
        let (answered, is_answered) = tokio::sync::oneshot::channel::<()>();
        let (closed_tx, mut closed) = tokio::sync::mpsc::unbounded_channel::<&str>();
        struct Closed(
            &'static str,
            tokio::sync::mpsc::UnboundedSender<&'static str>,
        );
        impl Drop for Closed {
            fn drop(&mut self) {
                let _ = self.1.send(self.0);
            }
        }
        // The client: its request comes first, then it idles.
        let c = Closed("client", closed_tx.clone());
        let _ = slots.spawn(move |slot| async move {
            let _c = c;
            slot.busy();
            slot.idle();
            let _ = answered.send(());
            tokio::time::sleep(Duration::from_secs(60)).await;
        });
        is_answered.await.unwrap();
        // A silent one, idle since after the client's answer.
        let s = Closed("silent", closed_tx.clone());
        let _ = slots.spawn(move |slot| async move {
            let _held = (slot, s);
            tokio::time::sleep(Duration::from_secs(60)).await;
        });
        let a = slots.spawn(|_slot| async {});
        assert_eq!(admitted(a), "made room");
        assert_eq!(closed.recv().await, Some("client"));

        // A silent connection idle since before the client's answer goes
        // before the client.
        let slots = Slots::new(2);
        let s = Closed("silent", closed_tx.clone());
        let _ = slots.spawn(move |slot| async move {
            let _held = (slot, s);
            tokio::time::sleep(Duration::from_secs(60)).await;
        });
        let (answered, is_answered) = tokio::sync::oneshot::channel::<()>();
        let c = Closed("client", closed_tx.clone());
        let _ = slots.spawn(move |slot| async move {
            let _c = c;
            slot.busy();
            slot.idle();
            let _ = answered.send(());
            tokio::time::sleep(Duration::from_secs(60)).await;
        });
        is_answered.await.unwrap();
        let a = slots.spawn(|_slot| async {});
        assert_eq!(admitted(a), "made room");
        assert_eq!(closed.recv().await, Some("silent"));
    }

    /// A connection closed for room holds its socket until its task lets go:
    /// `room` waits for that.
    #[tokio::test]
    async fn room_counts_the_sockets_of_connections_still_closing() {
        let slots = Slots::new(1);
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let _ = slots.spawn(move |slot| async move {
            let _held = slot;
            let _ = rx.await;
        });
        slots.room(2).await;
        assert!(
            tokio::time::timeout(Duration::from_millis(50), slots.room(1))
                .await
                .is_err(),
            "room with a socket held"
        );
        drop(tx);
        tokio::time::timeout(Duration::from_secs(5), slots.room(1))
            .await
            .expect("room once the task let go");
    }
}
