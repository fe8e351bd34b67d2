//! Group commit: concurrent writers hand their ops to one writer thread, which takes everything
//! queued at that moment, writes it as one synced batch, then answers all of them. Throughput grows
//! with concurrency while every caller still waits for its own data to be durable.
//!
//! A submission nobody is waiting on (an acknowledgement on a `Consume` stream) may be *deferred*:
//! the writer applies it at once without syncing, and answers it when a later synced write has
//! made it durable too (the write-ahead log is one sequential file, so syncing it syncs what came
//! before), or, if none comes within `defer_max`, after syncing the log for it alone. Its answer
//! still means "durable"; it just does not occupy the disk on its own, so a send that arrives
//! meanwhile is not queued behind an fsync for an acknowledgement.
//!
//! A submission that can be rebuilt after a power loss (a Raft round that only applies what the
//! synced log already holds) may be *replayable*: written in the writer's order without a sync
//! of its own and answered at once ([`GroupCommit::apply_blocking`]). A power loss may take it,
//! never a later write without it (the log is one sequential file); the next synced write makes
//! it durable too.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use tokio::sync::{mpsc, oneshot};

use crate::{QueueStore, StoreError, StoreOp};

struct Pending {
    ops: Vec<StoreOp>,
    done: oneshot::Sender<Result<(), StoreError>>,
    durability: Durability,
}

/// What a submission's answer promises (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Durability {
    /// Durable: synced before it is answered.
    Now,
    /// Durable, but may wait for a later synced write to carry it.
    Deferred,
    /// Written, not synced: answered at once.
    Replayable,
}

enum Job {
    Write(Pending),
    /// Finish what came before, then stop and close the store.
    Close,
}

/// A histogram with fixed bucket bounds, updated without locks.
#[derive(Debug)]
pub struct Buckets {
    bounds: &'static [u64],
    /// One per bound, then one for everything above the last.
    counts: Vec<AtomicU64>,
    sum: AtomicU64,
}

/// A histogram's state at one moment: sum, count, and (upper bound, cumulative count) per bucket
/// (the last bound is `u64::MAX`, i.e. +Inf).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BucketsSnapshot {
    pub sum: u64,
    pub count: u64,
    pub buckets: Vec<(u64, u64)>,
}

impl Buckets {
    pub fn new(bounds: &'static [u64]) -> Self {
        Self {
            bounds,
            counts: (0..=bounds.len()).map(|_| AtomicU64::new(0)).collect(),
            sum: AtomicU64::new(0),
        }
    }

    pub fn observe(&self, v: u64) {
        let i = self.bounds.partition_point(|&b| b < v);
        if let Some(c) = self.counts.get(i) {
            c.fetch_add(1, Ordering::Relaxed);
        }
        self.sum.fetch_add(v, Ordering::Relaxed);
    }

    pub fn snapshot(&self) -> BucketsSnapshot {
        let mut cumulative = 0;
        let buckets = self
            .counts
            .iter()
            .enumerate()
            .map(|(i, c)| {
                cumulative += c.load(Ordering::Relaxed);
                (self.bounds.get(i).copied().unwrap_or(u64::MAX), cumulative)
            })
            .collect();
        BucketsSnapshot {
            sum: self.sum.load(Ordering::Relaxed),
            count: cumulative,
            buckets,
        }
    }
}

/// Counters for operators and tests.
#[derive(Debug)]
pub struct GroupCommitStats {
    /// Synced writes made.
    pub writes: AtomicU64,
    /// Submissions carried by those writes.
    pub submissions: AtomicU64,
    /// Time of each synced write, in microseconds.
    pub write_micros: Buckets,
    /// Submissions per synced write.
    pub batch_submissions: Buckets,
    /// Deferred submissions applied without a sync of their own.
    pub deferred: AtomicU64,
    /// Replayable submissions written without a sync of their own.
    pub replayable: AtomicU64,
    /// Times the log was synced for deferred submissions alone (no synced write came in time,
    /// the node was closing, or a synced write was refused before reaching the log).
    pub deferred_syncs: AtomicU64,
}

impl Default for GroupCommitStats {
    fn default() -> Self {
        Self {
            writes: AtomicU64::new(0),
            submissions: AtomicU64::new(0),
            write_micros: Buckets::new(&[
                100, 250, 500, 1_000, 2_500, 5_000, 10_000, 25_000, 50_000, 100_000, 250_000,
                1_000_000,
            ]),
            batch_submissions: Buckets::new(&[1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1_024]),
            deferred: AtomicU64::new(0),
            replayable: AtomicU64::new(0),
            deferred_syncs: AtomicU64::new(0),
        }
    }
}

/// A handle to the writer thread; cheap to clone. The thread ends, after finishing everything
/// already submitted, on [`GroupCommit::close`] or when the last handle is dropped; the store is
/// dropped (closed) with it.
#[derive(Debug, Clone)]
pub struct GroupCommit {
    tx: mpsc::Sender<Job>,
    stats: Arc<GroupCommitStats>,
}

/// A submission in the queue; await it to learn when (and whether) it is durable.
#[derive(Debug)]
pub struct CommitTicket(oneshot::Receiver<Result<(), StoreError>>);

impl CommitTicket {
    pub async fn durable(self) -> Result<(), StoreError> {
        self.await
    }
}

/// A ticket is also the future of its durability (as [`CommitTicket::durable`]), a type that
/// can be named: the back-end's log interface hands it out as its durability future.
impl Future for CommitTicket {
    type Output = Result<(), StoreError>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        Pin::new(&mut self.0)
            .poll(cx)
            .map(|r| r.unwrap_or(Err(StoreError::Closed)))
    }
}

impl GroupCommit {
    /// Starts the writer thread. `queue_depth` bounds the submissions waiting for it;
    /// `batch_submissions_max` bounds how many one write carries; `defer_max` is how long a
    /// deferred submission may wait for a synced write to carry it.
    pub fn start(
        store: Arc<dyn QueueStore>,
        queue_depth: usize,
        batch_submissions_max: usize,
        defer_max: Duration,
    ) -> std::io::Result<(Self, JoinHandle<()>)> {
        let (tx, rx) = mpsc::channel(queue_depth.max(1));
        let stats = Arc::new(GroupCommitStats::default());
        let thread_stats = stats.clone();
        let writer = Writer {
            store,
            rx,
            batch_max: batch_submissions_max.max(1),
            defer_max,
            stats: thread_stats,
            unsynced: Vec::new(),
            unsynced_since: None,
        };
        let handle = std::thread::Builder::new()
            .name("ferry-group-commit".into())
            .spawn(move || writer.run())?;
        Ok((Self { tx, stats }, handle))
    }

    /// Queues `ops` for the next write. Waits only while the queue is full.
    pub async fn submit(&self, ops: Vec<StoreOp>) -> Result<CommitTicket, StoreError> {
        self.submit_with(ops, Durability::Now).await
    }

    /// Queues `ops` for the next write, which may leave them unsynced for up to `defer_max`
    /// (see the module docs). The ticket still resolves only once they are durable.
    pub async fn submit_deferred(&self, ops: Vec<StoreOp>) -> Result<CommitTicket, StoreError> {
        self.submit_with(ops, Durability::Deferred).await
    }

    async fn submit_with(
        &self,
        ops: Vec<StoreOp>,
        durability: Durability,
    ) -> Result<CommitTicket, StoreError> {
        let (done, rx) = oneshot::channel();
        let job = Job::Write(Pending {
            ops,
            done,
            durability,
        });
        self.tx.send(job).await.map_err(|_| StoreError::Closed)?;
        Ok(CommitTicket(rx))
    }

    /// Queues `ops` and waits until they are durable.
    pub async fn commit(&self, ops: Vec<StoreOp>) -> Result<(), StoreError> {
        self.submit(ops).await?.durable().await
    }

    /// Queues `ops` and waits until they are durable, blocking the calling thread: for a thread
    /// of its own (the Raft driver's), never from async code (tokio refuses to block a runtime
    /// thread, and panics).
    pub fn commit_blocking(&self, ops: Vec<StoreOp>) -> Result<(), StoreError> {
        self.write_blocking(ops, Durability::Now)
    }

    /// Queues `ops` and waits until they are written, not synced (see the module docs:
    /// *replayable*): only for what can be rebuilt after a power loss, from a thread of its own
    /// as [`GroupCommit::commit_blocking`].
    pub fn apply_blocking(&self, ops: Vec<StoreOp>) -> Result<(), StoreError> {
        self.write_blocking(ops, Durability::Replayable)
    }

    fn write_blocking(&self, ops: Vec<StoreOp>, durability: Durability) -> Result<(), StoreError> {
        let (done, rx) = oneshot::channel();
        let job = Job::Write(Pending {
            ops,
            done,
            durability,
        });
        self.tx.blocking_send(job).map_err(|_| StoreError::Closed)?;
        rx.blocking_recv().unwrap_or(Err(StoreError::Closed))
    }

    pub fn stats(&self) -> &GroupCommitStats {
        &self.stats
    }

    /// Asks the writer to finish everything submitted so far, then close the store and end
    /// (join its thread to know when it has). Later submissions fail with [`StoreError::Closed`].
    pub async fn close(&self) {
        // An error means the writer is already gone.
        let _ = self.tx.send(Job::Close).await;
    }
}

/// How the group-commit writer batches (see [`GroupCommit::start`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CommitSettings {
    /// Submissions waiting for the writer.
    pub queue_depth: usize,
    /// Submissions one synced write may carry.
    pub batch_submissions_max: usize,
    /// How long a write nobody waits for may wait for a synced write to carry it before the log
    /// is synced for it alone.
    pub defer_max: Duration,
}

impl Default for CommitSettings {
    fn default() -> Self {
        Self {
            queue_depth: 4_096,
            batch_submissions_max: 1_024,
            defer_max: Duration::from_millis(1),
        }
    }
}

/// The group-commit writer of a node, owned by whoever started it (the node): it hands out
/// [`GroupCommit`] handles to everything that writes (the back-end, and the Raft driver for
/// every group of the node), and at the end closes the store and joins its thread.
#[derive(Debug)]
pub struct CommitWriter {
    commit: GroupCommit,
    thread: Option<JoinHandle<()>>,
}

impl CommitWriter {
    /// Starts the writer thread on `store`.
    pub fn start(store: Arc<dyn QueueStore>, settings: CommitSettings) -> Result<Self, StoreError> {
        let (commit, thread) = GroupCommit::start(
            store,
            settings.queue_depth,
            settings.batch_submissions_max,
            settings.defer_max,
        )
        .map_err(|e| StoreError::Io {
            context: "starting the group-commit writer thread",
            message: e.to_string(),
        })?;
        Ok(Self {
            commit,
            thread: Some(thread),
        })
    }

    /// A handle to submit writes with.
    pub fn handle(&self) -> GroupCommit {
        self.commit.clone()
    }

    /// Finishes everything submitted so far, closes the store and waits for the thread to end.
    /// Returns whether it ended cleanly. Call it once every writer has stopped submitting.
    pub async fn stop(mut self) -> bool {
        self.commit.close().await;
        let Some(thread) = self.thread.take() else {
            return true;
        };
        matches!(
            tokio::task::spawn_blocking(move || thread.join()).await,
            Ok(Ok(()))
        )
    }
}

type Done = oneshot::Sender<Result<(), StoreError>>;

struct Writer {
    store: Arc<dyn QueueStore>,
    rx: mpsc::Receiver<Job>,
    batch_max: usize,
    defer_max: Duration,
    stats: Arc<GroupCommitStats>,
    /// Deferred submissions applied but not yet synced, waiting for their answer.
    unsynced: Vec<Done>,
    /// When the oldest of them was applied.
    unsynced_since: Option<Instant>,
}

impl Writer {
    fn run(mut self) {
        // The writer blocks on the disk; its own small runtime only waits on the queue with a
        // timeout (the time left for the deferred submissions).
        let rt = match tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
        {
            Ok(rt) => rt,
            Err(e) => {
                tracing::error!(error = %e, "group commit writer cannot start its timer");
                return;
            }
        };
        let mut closing = false;
        while !closing {
            let next = match self.unsynced_since {
                None => rt.block_on(self.rx.recv()),
                Some(since) => {
                    let left = self.defer_max.saturating_sub(since.elapsed());
                    // The timer is made inside the runtime (it needs the runtime's clock).
                    let rx = &mut self.rx;
                    match rt.block_on(async { tokio::time::timeout(left, rx.recv()).await }) {
                        Ok(job) => job,
                        Err(_) => {
                            // No synced write came in time.
                            self.sync_deferred();
                            continue;
                        }
                    }
                }
            };
            let first = match next {
                Some(Job::Write(p)) => p,
                Some(Job::Close) | None => break,
            };
            let mut group = vec![first];
            while group.len() < self.batch_max {
                match self.rx.try_recv() {
                    Ok(Job::Write(p)) => group.push(p),
                    Ok(Job::Close) => {
                        closing = true;
                        break;
                    }
                    Err(_) => break,
                }
            }
            self.write(group);
        }
        // Deferred submissions still waiting are made durable before the store closes.
        self.sync_deferred();
        // Submissions still queued get `Closed` when `rx` drops; then the store closes.
    }

    /// Writes one group: synced if anyone in it needs durability now (which also makes every
    /// earlier deferred or replayable write durable), else written unsynced: the replayable
    /// submissions answered at once, the deferred ones later.
    fn write(&mut self, group: Vec<Pending>) {
        // Deferred writes already waiting their full time are synced now, even if this group is
        // deferred too: a steady run of deferred writes must not keep them waiting for ever.
        let overdue = self
            .unsynced_since
            .is_some_and(|since| since.elapsed() >= self.defer_max);
        let sync = overdue
            || group.iter().any(|p| match p.durability {
                Durability::Now => true,
                Durability::Deferred => self.defer_max.is_zero(),
                Durability::Replayable => false,
            });
        let mut batches = Vec::with_capacity(group.len());
        let mut dones = Vec::with_capacity(group.len());
        for p in group {
            batches.push(p.ops);
            dones.push((p.done, p.durability));
        }
        if !sync {
            let result = self.store.write_unsynced(&batches);
            let (deferred, replayable): (Vec<_>, Vec<_>) = dones
                .into_iter()
                .partition(|(_, d)| *d == Durability::Deferred);
            self.stats
                .deferred
                .fetch_add(deferred.len() as u64, Ordering::Relaxed);
            self.stats
                .replayable
                .fetch_add(replayable.len() as u64, Ordering::Relaxed);
            if let Err(e) = &result {
                tracing::error!(error = %e, "group commit write failed");
            }
            answer(replayable.into_iter().map(|(done, _)| done), &result);
            let deferred: Vec<Done> = deferred.into_iter().map(|(done, _)| done).collect();
            if result.is_ok() && !deferred.is_empty() {
                self.unsynced_since.get_or_insert_with(Instant::now);
                self.unsynced.extend(deferred);
            } else {
                answer(deferred, &result);
            }
            return;
        }
        let dones: Vec<Done> = dones.into_iter().map(|(done, _)| done).collect();
        let result = self.timed(|store| store.write(&batches));
        self.stats.batch_submissions.observe(dones.len() as u64);
        self.stats
            .submissions
            .fetch_add(dones.len() as u64, Ordering::Relaxed);
        if let Err(e) = &result {
            tracing::error!(error = %e, "group commit write failed");
            // A write refused before it reached the log (the store was not poisoned) says
            // nothing about the deferred writes before it: sync them on their own.
            self.sync_deferred();
        }
        self.answer_unsynced(&result);
        answer(dones, &result);
    }

    /// Runs one synced write (or log sync), counted and timed.
    fn timed(
        &self,
        f: impl FnOnce(&dyn QueueStore) -> Result<(), StoreError>,
    ) -> Result<(), StoreError> {
        let started = Instant::now();
        let result = f(self.store.as_ref());
        self.stats
            .write_micros
            .observe(u64::try_from(started.elapsed().as_micros()).unwrap_or(u64::MAX));
        self.stats.writes.fetch_add(1, Ordering::Relaxed);
        result
    }

    /// Syncs the log for the deferred submissions waiting (if any) and answers them.
    fn sync_deferred(&mut self) {
        if self.unsynced.is_empty() {
            return;
        }
        self.stats.deferred_syncs.fetch_add(1, Ordering::Relaxed);
        let result = self.timed(|store| store.sync());
        self.answer_unsynced(&result);
    }

    fn answer_unsynced(&mut self, result: &Result<(), StoreError>) {
        self.unsynced_since = None;
        answer(std::mem::take(&mut self.unsynced), result);
    }
}

fn answer(dones: impl IntoIterator<Item = Done>, result: &Result<(), StoreError>) {
    for done in dones {
        // A caller that stopped waiting no longer needs the answer.
        let _ = done.send(result.clone());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_count_cumulatively_with_an_overflow_bucket() {
        let b = Buckets::new(&[10, 100]);
        for v in [1, 10, 11, 100, 101, 5_000] {
            b.observe(v);
        }
        let s = b.snapshot();
        assert_eq!(s.count, 6);
        assert_eq!(s.sum, 1 + 10 + 11 + 100 + 101 + 5_000);
        assert_eq!(s.buckets, vec![(10, 2), (100, 4), (u64::MAX, 6)]);
    }
}
