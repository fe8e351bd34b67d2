//! Group commit: concurrent writers hand their ops to one writer thread, which takes everything
//! queued at that moment, writes it as one synced batch, then answers all of them. Throughput grows
//! with concurrency while every caller still waits for its own data to be durable.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

use tokio::sync::{mpsc, oneshot};

use crate::{QueueStore, StoreError, StoreOp};

struct Pending {
    ops: Vec<StoreOp>,
    done: oneshot::Sender<Result<(), StoreError>>,
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
        self.0.await.unwrap_or(Err(StoreError::Closed))
    }
}

impl GroupCommit {
    /// Starts the writer thread. `queue_depth` bounds the submissions waiting for it;
    /// `batch_submissions_max` bounds how many one write carries.
    pub fn start(
        store: Arc<dyn QueueStore>,
        queue_depth: usize,
        batch_submissions_max: usize,
    ) -> std::io::Result<(Self, JoinHandle<()>)> {
        let (tx, rx) = mpsc::channel(queue_depth.max(1));
        let stats = Arc::new(GroupCommitStats::default());
        let thread_stats = stats.clone();
        let handle = std::thread::Builder::new()
            .name("ferry-group-commit".into())
            .spawn(move || writer(store, rx, batch_submissions_max.max(1), &thread_stats))?;
        Ok((Self { tx, stats }, handle))
    }

    /// Queues `ops` for the next write. Waits only while the queue is full.
    pub async fn submit(&self, ops: Vec<StoreOp>) -> Result<CommitTicket, StoreError> {
        let (done, rx) = oneshot::channel();
        let job = Job::Write(Pending { ops, done });
        self.tx.send(job).await.map_err(|_| StoreError::Closed)?;
        Ok(CommitTicket(rx))
    }

    /// Queues `ops` and waits until they are durable.
    pub async fn commit(&self, ops: Vec<StoreOp>) -> Result<(), StoreError> {
        self.submit(ops).await?.durable().await
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

fn writer(
    store: Arc<dyn QueueStore>,
    mut rx: mpsc::Receiver<Job>,
    batch_max: usize,
    stats: &GroupCommitStats,
) {
    let mut closing = false;
    while !closing {
        let first = match rx.blocking_recv() {
            Some(Job::Write(p)) => p,
            Some(Job::Close) | None => break,
        };
        let mut group = vec![first];
        while group.len() < batch_max {
            match rx.try_recv() {
                Ok(Job::Write(p)) => group.push(p),
                Ok(Job::Close) => {
                    closing = true;
                    break;
                }
                Err(_) => break,
            }
        }
        let (batches, dones): (Vec<_>, Vec<_>) = group.into_iter().map(|p| (p.ops, p.done)).unzip();
        let started = std::time::Instant::now();
        let result = store.write(&batches);
        stats
            .write_micros
            .observe(u64::try_from(started.elapsed().as_micros()).unwrap_or(u64::MAX));
        stats.batch_submissions.observe(dones.len() as u64);
        if let Err(e) = &result {
            tracing::error!(error = %e, "group commit write failed");
        }
        stats.writes.fetch_add(1, Ordering::Relaxed);
        stats
            .submissions
            .fetch_add(dones.len() as u64, Ordering::Relaxed);
        for done in dones {
            // A caller that stopped waiting no longer needs the answer.
            let _ = done.send(result.clone());
        }
    }
    // Submissions still queued get `Closed` when `rx` drops; then the store closes.
    drop(rx);
    drop(store);
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
