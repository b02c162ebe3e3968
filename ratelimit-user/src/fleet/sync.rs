//! The sync task: every [`SYNC`], the counts from the daemon's loop (which
//! owns the maps), one call per key group and the members' renewal to Redis
//! at once, each group's raises and cursors back to the loop as its answer
//! comes, and the groups that did not answer within [`CALL_TIMEOUT`] judged
//! by the fallback; the heartbeat once every key is settled.

use std::{
    collections::HashMap,
    time::{Duration, Instant},
};

use prometheus_client::metrics::histogram::Histogram;
use ratelimit_redis::{
    Error, Store,
    fleet::{Members, Report, members_key},
};
use tokio::{
    sync::{mpsc, oneshot, watch},
    task::JoinSet,
};
use tracing::{info, warn};

use super::{
    CALL_TIMEOUT, Fallback, GRACE, Job, LEASE, PREFIX, SILENCE, SLOW, SYNC, Snapshot, Status,
    book::{Book, Item, Plan, Settled, View},
    link::{Link, MEMBERS},
};
use crate::kernel::monotonic_ns;

/// The fleet's metrics that are more than a number: shared by the sync task
/// (which observes) and the daemon's metrics (which encode).
#[derive(Clone, Debug)]
pub struct Metrics {
    /// Each sync's age: from reading the counts to the last answer it used,
    /// seconds.
    pub sync: Histogram,
}

impl Default for Metrics {
    fn default() -> Self {
        Self {
            sync: Histogram::new([
                0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.15, 0.2, 0.25, 0.5, 1.0,
            ]),
        }
    }
}

/// One call's answer; an error `None` is no answer in time.
enum Answer {
    Group {
        group: u32,
        result: Result<Vec<Option<Duration>>, Option<Error>>,
        sent: u64,
        answered: u64,
    },
    Members(Result<Members, Option<Error>>),
}

/// What the logs said last, so that each change is said once.
#[derive(Default)]
struct Said {
    down: bool,
    slow: bool,
}

/// The sync task: runs until the daemon's loop goes away.
pub async fn run(
    url: String,
    fallback: Fallback,
    member: String,
    jobs: mpsc::Sender<Job>,
    status: watch::Sender<Status>,
    metrics: Metrics,
) {
    let mut sync = Syncer {
        members: members_key(PREFIX),
        link: Link::new(url.clone()),
        book: Book::default(),
        view: View {
            members: 1,
            silent: 0,
            fallback,
        },
        st: Status {
            redis: url,
            daemons: 1,
            fallback: Some(fallback),
            ..Default::default()
        },
        said: Said::default(),
        members_up: false,
        past_lease: 0,
        first: true,
        member,
        jobs,
        status,
        metrics,
    };
    let mut tick = tokio::time::interval(SYNC);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    sync.link.first().await;
    loop {
        tick.tick().await;
        if sync.round().await.is_none() {
            return;
        }
    }
}

/// The sync task's state from one round to the next.
struct Syncer {
    /// The members' key.
    members: String,
    /// This daemon's name among them.
    member: String,
    link: Link,
    book: Book,
    view: View,
    st: Status,
    said: Said,
    /// Whether the last renewal of the members was answered.
    members_up: bool,
    /// Of the silent members, those past their lease that never left (their
    /// programs may still enforce their shares).
    past_lease: u64,
    /// The first round (it reads the pinned report cursors).
    first: bool,
    jobs: mpsc::Sender<Job>,
    status: watch::Sender<Status>,
    metrics: Metrics,
}

/// One round's calls, from sent to settled.
#[derive(Default)]
struct Round {
    calls: JoinSet<Answer>,
    /// Each group's items whose answer has not come.
    pending: HashMap<u32, Vec<Item>>,
    /// What is settled and not yet written to the loop.
    settled: Settled,
    failed_groups: u64,
    /// When the last group's answer used came (monotonic ns).
    last_answer: Option<u64>,
    /// The members' renewal was sent and has not answered: the heartbeat
    /// waits for the count it carries.
    members_pending: bool,
}

impl Syncer {
    /// One sync; `None` once the daemon's loop is gone.
    async fn round(&mut self) -> Option<()> {
        self.link.refresh().await;
        let snap = self.read().await?;
        let plan = self.book.plan(&snap, snap.at, &self.view);
        self.link.keep_groups(|g| plan.contains_key(&g));
        let mut round = self.send(plan);
        // What failed at once is written at once.
        self.write(&mut round.settled).await?;
        let beaten = self.collect(&mut round, snap.at).await?;
        self.finish(round, &snap).await?;
        if !beaten {
            self.beat(snap.at).await?;
        }
        Some(())
    }

    /// The heartbeat, once every key of the counts read at `at` is settled:
    /// a daemon that cannot settle its keys (starved of CPU, stuck) leaves
    /// it to age, and its program charges fleet-wide keys as under the
    /// fallback once it is [`ratelimit_common::FLEET_STALE_NS`] old. Written
    /// when the counts were read, a heartbeat could hide a stall between the
    /// read and the answer's write, and let the debt the program judges with
    /// age to twice that.
    async fn beat(&mut self, at: u64) -> Option<()> {
        let beat = Job::Beat {
            at,
            members: self.view.members,
        };
        self.jobs.send(beat).await.ok()
    }

    /// The counts, from the loop.
    async fn read(&mut self) -> Option<Snapshot> {
        let (reply, answer) = oneshot::channel();
        let read = Job::Read {
            cursors: self.first,
            reply,
        };
        self.jobs.send(read).await.ok()?;
        answer.await.ok()
    }

    /// The members' renewal (when due) and a call per key group that is
    /// due; the others are judged by the fallback at once.
    fn send(&mut self, plan: Plan) -> Round {
        let now = Instant::now();
        let mut round = Round::default();
        let Some(store) = self.link.store() else {
            self.members_up = false;
            for (_, items) in plan {
                round.failed_groups += 1;
                round
                    .settled
                    .merge(self.book.failed(items, monotonic_ns(), &self.view));
            }
            return round;
        };
        if self.link.due(MEMBERS, now) {
            let (s, key, m) = (store.clone(), self.members.clone(), self.member.clone());
            round.calls.spawn(async move {
                let call = s.fleet_members(&key, &m, LEASE, SILENCE, GRACE);
                Answer::Members(within(call).await)
            });
            round.members_pending = true;
        }
        for (group, mut items) in plan {
            if !self.link.due(group, now) {
                round.failed_groups += 1;
                round
                    .settled
                    .merge(self.book.failed(items, monotonic_ns(), &self.view));
                continue;
            }
            // The names go with the call (the books need them no more).
            let reports: Vec<Report> = items
                .iter_mut()
                .map(|i| Report {
                    name: std::mem::take(&mut i.name),
                    limit: i.limit,
                    amount: i.amount,
                    tallied: i.tally,
                })
                .collect();
            round.pending.insert(group, items);
            let s = store.clone();
            round.calls.spawn(async move {
                let sent = monotonic_ns();
                let result = within(s.fleet_sync(PREFIX, group, &reports)).await;
                Answer::Group {
                    group,
                    result,
                    sent,
                    answered: monotonic_ns(),
                }
            });
        }
        round
    }

    /// Each answer written as it comes; what has not come within SLOW is
    /// charged as under the fallback at once, and what has not come by the
    /// deadline is judged by the fallback. The heartbeat for the counts read
    /// at `at` goes as soon as every key is settled and the members' count
    /// it carries is in (or at SLOW); answers whether it went.
    async fn collect(&mut self, round: &mut Round, at: u64) -> Option<bool> {
        let sent = tokio::time::Instant::now();
        let deadline = sent + CALL_TIMEOUT + Duration::from_millis(10);
        let mut late = false;
        let mut beaten = false;
        loop {
            if !beaten && (late || (round.pending.is_empty() && !round.members_pending)) {
                self.beat(at).await?;
                beaten = true;
            }
            let done = tokio::select! {
                done = round.calls.join_next() => done,
                () = tokio::time::sleep_until(sent + SLOW), if !late && !round.pending.is_empty() => {
                    late = true;
                    let now = monotonic_ns();
                    for items in round.pending.values_mut() {
                        round.settled.merge(self.book.late(items, now, &self.view));
                    }
                    self.write(&mut round.settled).await?;
                    continue;
                }
                () = tokio::time::sleep_until(deadline) => break,
            };
            let Some(done) = done else { break };
            let Ok(answer) = done else { continue };
            self.answered(round, answer);
            self.write(&mut round.settled).await?;
        }
        round.calls.abort_all();
        for (group, items) in round.pending.drain() {
            round.failed_groups += 1;
            self.link.failed(group, None, Instant::now());
            round
                .settled
                .merge(self.book.failed(items, monotonic_ns(), &self.view));
        }
        Some(beaten)
    }

    /// One call's answer into the books.
    fn answered(&mut self, round: &mut Round, answer: Answer) {
        match answer {
            Answer::Members(Ok(m)) => {
                round.members_pending = false;
                self.link.answered(MEMBERS);
                self.members_up = true;
                self.view.members = m.members.max(1);
                self.view.silent = m.silent.min(self.view.members - 1);
                self.past_lease = m.past_lease.min(self.view.silent);
            }
            Answer::Members(Err(e)) => {
                round.members_pending = false;
                self.link.failed(MEMBERS, e.as_ref(), Instant::now());
                self.members_up = false;
            }
            Answer::Group {
                group,
                result,
                sent,
                answered,
            } => {
                let Some(items) = round.pending.remove(&group) else {
                    return;
                };
                let s = match result {
                    Ok(debts) => {
                        self.link.answered(group);
                        round.last_answer = Some(answered);
                        self.book
                            .answered(items, &debts, sent, answered, &self.view)
                    }
                    Err(e) => {
                        round.failed_groups += 1;
                        self.link.failed(group, e.as_ref(), Instant::now());
                        self.book.failed(items, answered, &self.view)
                    }
                };
                round.settled.merge(s);
            }
        }
    }

    /// The report cursors written, the status and the log brought up to
    /// date.
    async fn finish(&mut self, mut round: Round, snap: &Snapshot) -> Option<()> {
        round
            .settled
            .cursors
            .extend(self.book.take_writes(monotonic_ns()));
        self.write(&mut round.settled).await?;
        let end = monotonic_ns();
        let st = &mut self.st;
        if let Some(answered) = round.last_answer {
            let age = answered.saturating_sub(snap.at);
            self.metrics.sync.observe(age as f64 / 1e9);
            st.redis_ms = age as f64 / 1e6;
        }
        let counts = self.book.counts(&snap.rules, end);
        st.redis_up = self.link.store().is_some() && round.failed_groups == 0 && self.members_up;
        st.daemons = self.view.members;
        st.silent_daemons = self.view.silent;
        st.past_lease_daemons = self.past_lease;
        st.keys = counts.keys;
        st.keys_over = counts.over;
        st.keys_fallback = counts.fallback;
        st.lag_ms = counts.lag_ns as f64 / 1e6;
        st.groups_down = self.link.groups_down();
        if round.failed_groups > 0 || self.link.store().is_none() {
            st.fallback_syncs += 1;
        }
        if round.settled.slow > 0 {
            st.slow_syncs += 1;
        }
        tell(
            st,
            &self.view,
            round.failed_groups,
            round.settled.slow,
            &mut self.said,
            self.first,
        );
        let _ = self.status.send(st.clone());
        self.first = false;
        Some(())
    }

    /// What is settled, to the loop; `None` once the loop is gone.
    async fn write(&mut self, settled: &mut Settled) -> Option<()> {
        write(&self.jobs, settled, &mut self.st).await.then_some(())
    }
}

/// Leaves the fleet's members at `url` (the daemon stops, its program with
/// it): the others take its share at once. Within half a second, or not at
/// all (its lease then ends by itself).
pub async fn leave(url: &str, member: &str) {
    let left = tokio::time::timeout(Duration::from_millis(500), async {
        let store = Store::connect(url).await?;
        store
            .fleet_leave(&members_key(PREFIX), member, LEASE, GRACE)
            .await
    })
    .await;
    if !matches!(left, Ok(Ok(()))) {
        info!(redis = %url, "fleet: could not leave the fleet's members; this daemon stops counting when its lease ends ({} s)", LEASE.as_secs());
    }
}

/// `call` within [`CALL_TIMEOUT`]; `Err(None)` when it did not answer.
async fn within<T>(call: impl Future<Output = Result<T, Error>>) -> Result<T, Option<Error>> {
    match tokio::time::timeout(CALL_TIMEOUT, call).await {
        Ok(r) => r.map_err(Some),
        Err(_) => Err(None),
    }
}

/// Sends what is settled to the daemon's loop; `false` when it is gone.
async fn write(jobs: &mpsc::Sender<Job>, settled: &mut Settled, st: &mut Status) -> bool {
    st.reported += std::mem::take(&mut settled.reported);
    st.owed_reported += std::mem::take(&mut settled.owed);
    if settled.is_empty() {
        return true;
    }
    let job = Job::Write {
        raises: std::mem::take(&mut settled.raises),
        cursors: std::mem::take(&mut settled.cursors),
    };
    jobs.send(job).await.is_ok()
}

/// Says what changed: Redis gone or back, answers too slow or in time
/// again; each once.
fn tell(st: &Status, view: &View, failed_groups: u64, slow: u64, said: &mut Said, first: bool) {
    let redis = &st.redis;
    if st.redis_up {
        if said.down {
            info!(redis = %redis, "fleet: Redis answers again; fleet-wide rules are back in step");
        } else if first {
            info!(redis = %redis, daemons = st.daemons, "fleet: in step through Redis");
        }
        said.down = false;
    } else if !said.down {
        said.down = true;
        let n = view.members;
        let some = failed_groups > 0 && st.keys_fallback < st.keys;
        match (view.fallback, some) {
            (Fallback::Share, false) => warn!(
                redis = %redis,
                daemons = n,
                "fleet: Redis cannot be reached; each fleet-wide key is charged {n} times what this daemon admits until it returns (--fleet-fallback share)"
            ),
            (Fallback::Local, false) => warn!(
                redis = %redis,
                "fleet: Redis cannot be reached; each daemon admits the whole of every fleet-wide limit until it returns (--fleet-fallback local): the fleet may admit up to {n} times it"
            ),
            (_, true) => warn!(
                redis = %redis,
                groups = st.groups_down,
                "fleet: Redis cannot be reached for {} key group(s) (a Cluster master down?): {} key(s) are judged by the fallback (--fleet-fallback {}) until it returns; the other keys stay in step",
                st.groups_down,
                st.keys_fallback,
                if view.fallback == Fallback::Share { "share" } else { "local" }
            ),
        }
    }
    if slow > 0 && !said.slow {
        said.slow = true;
        warn!(
            redis = %redis,
            keys = slow,
            "fleet: Redis answered later than the fleet's bound assumes ({} ms); what those keys admitted is charged as under the fallback while it lasts (counted in slow_syncs)",
            SLOW.as_millis()
        );
    } else if slow == 0 && said.slow && failed_groups == 0 {
        said.slow = false;
        info!(redis = %redis, "fleet: Redis answers in time again");
    }
}
