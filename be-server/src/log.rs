//! The log the back-end writes through: an owner task (and the registry, and a transaction's
//! commit) hands it a batch of [`StoreOp`]s and learns, from a future, when the batch is
//! durable. Batches become durable in the order they were submitted.
//!
//! Two implementations: [`LocalLog`], the node's group commit (replication factor 1: the batch
//! is written to this node's store, and durable once synced), and `ShardLog` (`shard_log.rs`):
//! the batch proposed to a queue shard's Raft group, durable once committed and applied here.
//! The interface names no storage engine, so either fits behind it.

use std::future::Future;

use futures::TryFutureExt;

use ferry_store::{CommitTicket, GroupCommit, StoreError, StoreOp};

/// Why a batch handed to a queue's log is not known to be durable.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum LogError {
    /// The node's store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// A queue shard did not confirm the batch here: this node does not lead the shard (any
    /// more), or the batch's outcome is unknown (appended, then overwritten or dropped; the
    /// driver stopped). Either way the owner task's memory may be ahead of the log, and the
    /// owner task must be rebuilt from the store before it serves again.
    #[error("{0}")]
    Shard(#[from] crate::shard_log::ShardRefusal),
}

/// When a submitted batch must reach the disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum LogSync {
    /// Synced with the next write.
    Now,
    /// Nobody waits for the answer: the write may wait for a later synced write to carry it
    /// (see `ferry_store::GroupCommit`). Its durability future still resolves only once it is
    /// durable.
    Deferred,
}

/// See the module docs. Cheap to clone: every owner task holds one.
pub(crate) trait QueueLog: Clone + Send + Sync + 'static {
    /// Resolves once a submitted batch is durable, or with why it is not known to be.
    type Durable: Future<Output = Result<(), LogError>> + Send + 'static;

    /// Queues `ops` as one batch, after everything submitted before. Waits only while the log
    /// is full; fails if the log is closed.
    fn submit(
        &self,
        ops: Vec<StoreOp>,
        sync: LogSync,
    ) -> impl Future<Output = Result<Self::Durable, LogError>> + Send;

    /// Queues `ops` as one batch, synced, and waits until it is durable.
    fn write(&self, ops: Vec<StoreOp>) -> impl Future<Output = Result<(), LogError>> + Send {
        async move { self.submit(ops, LogSync::Now).await?.await }
    }
}

/// The log of a queue with replication factor 1: the node's group commit, writing to its own
/// store.
#[derive(Debug, Clone)]
pub(crate) struct LocalLog {
    commit: GroupCommit,
}

impl LocalLog {
    pub(crate) fn new(commit: GroupCommit) -> Self {
        Self { commit }
    }

    /// The group commit it writes through (for its counters).
    pub(crate) fn group_commit(&self) -> &GroupCommit {
        &self.commit
    }
}

/// A [`LocalLog`] batch's durability: the group commit's ticket, its error a [`LogError`].
pub(crate) type LocalDurable = futures::future::MapErr<CommitTicket, fn(StoreError) -> LogError>;

impl QueueLog for LocalLog {
    type Durable = LocalDurable;

    async fn submit(&self, ops: Vec<StoreOp>, sync: LogSync) -> Result<LocalDurable, LogError> {
        let ticket = match sync {
            LogSync::Now => self.commit.submit(ops).await,
            LogSync::Deferred => self.commit.submit_deferred(ops).await,
        }?;
        Ok(ticket.map_err(LogError::Store as fn(StoreError) -> LogError))
    }
}

/// The log of one queue on this node: the node's group commit (replication factor 1), or the
/// log of the queue shard it belongs to. Every owner task, and the registry's writes of its
/// definition, go through its queue's.
#[derive(Debug, Clone)]
pub(crate) enum NodeLog {
    Local(LocalLog),
    Shard(crate::shard_log::ShardLog),
}

impl NodeLog {
    /// The shard whose log this is, if it is one.
    pub(crate) fn shard(&self) -> Option<crate::shard_log::ShardId> {
        match self {
            NodeLog::Local(_) => None,
            NodeLog::Shard(s) => Some(s.shard()),
        }
    }

    /// Makes `queue` fit this log: a shard's queue writes its delivery marks (a new leader
    /// honours them) and numbers its leases from its run's term up, so that no delivery of this
    /// run has the lease id of one an earlier leader made (receipt handles outlive a run).
    pub(crate) fn prepare(&self, queue: &mut ferry_kernel::Queue) {
        if let NodeLog::Shard(s) = self {
            queue.write_delivery_marks();
            queue.begin_lease_ids_at(ferry_kernel::LeaseId(s.term().saturating_mul(1 << 32)));
        }
    }
}

/// A [`NodeLog`] batch's durability.
pub(crate) type NodeDurable = futures::future::Either<LocalDurable, crate::shard_log::ShardDurable>;

impl QueueLog for NodeLog {
    type Durable = NodeDurable;

    async fn submit(&self, ops: Vec<StoreOp>, sync: LogSync) -> Result<NodeDurable, LogError> {
        use futures::future::Either;
        match self {
            NodeLog::Local(l) => l.submit(ops, sync).await.map(Either::Left),
            NodeLog::Shard(s) => s.submit(ops, sync).await.map(Either::Right),
        }
    }
}
