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

/// Counters for operators and tests.
#[derive(Debug, Default)]
pub struct GroupCommitStats {
    /// Synced writes made.
    pub writes: AtomicU64,
    /// Submissions carried by those writes.
    pub submissions: AtomicU64,
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
        let result = store.write(&batches);
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
