//! Durable storage for Ferry's queues.
//!
//! [`QueueStore`] is the interface the back-end writes through: a synced batch of [`StoreOp`]s and
//! a full read at startup ([`QueueStore::recover`]). Two implementations share one conformance
//! suite (`tests/conformance.rs`): [`MemoryStore`] (tests, and nodes run without a disk) and
//! [`RocksStore`]. [`GroupCommit`] lets many concurrent writers share one synced write.
//!
//! Depends on the kernel for domain types only; it must not depend on gRPC or the servers.

mod codec;
mod group_commit;
mod memory;
mod rocks;

use ferry_kernel::{
    DedupRecord, PersistOp, QueueConfig, QueueName, QueueUid, RecoveredMessage, Seq,
};

pub use group_commit::{Buckets, BucketsSnapshot, CommitTicket, GroupCommit, GroupCommitStats};
pub use memory::MemoryStore;
pub use rocks::RocksStore;

/// A queue's durable definition.
#[derive(Debug, Clone, PartialEq)]
pub struct QueueDef {
    pub name: QueueName,
    pub uid: QueueUid,
    pub config: QueueConfig,
}

/// One change to durable state.
#[derive(Debug, Clone, PartialEq)]
pub enum StoreOp {
    PutQueue(QueueDef),
    /// Removes the queue with every message and record it had.
    DeleteQueue(QueueUid),
    /// A change to one queue's messages, as the kernel asked for it.
    Queue {
        uid: QueueUid,
        op: PersistOp,
    },
}

/// Everything kept for one queue, read back at startup.
#[derive(Debug, Clone, PartialEq)]
pub struct RecoveredQueue {
    pub def: QueueDef,
    pub seq_reserved_until: Seq,
    /// In sequence order.
    pub messages: Vec<RecoveredMessage>,
    /// Producer dedup ids still remembered (some may have expired since; the queue forgets
    /// those at once).
    pub dedup: Vec<DedupRecord>,
}

/// Why a store operation failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StoreError {
    #[error("storage I/O failed while {context}: {message}")]
    Io {
        context: &'static str,
        message: String,
    },
    #[error("stored {what} is unreadable: {reason}")]
    Corrupt { what: &'static str, reason: String },
    /// An earlier write failed; nothing more is written until the node restarts and recovers.
    #[error("the store refuses writes after an earlier write failed; restart the node")]
    Poisoned,
    #[error("the store is shutting down")]
    Closed,
}

/// Durable storage for queues. `write` returns only once the whole batch is durable (synced), or
/// fails having written none of it. Dropping the store closes it (RocksDB must be closed before
/// the process exits, or its background threads may abort it).
pub trait QueueStore: Send + Sync + std::fmt::Debug + 'static {
    /// Applies every op of every batch, in order, atomically and durably.
    fn write(&self, batches: &[Vec<StoreOp>]) -> Result<(), StoreError>;

    /// Reads every queue back, messages in sequence order with their delivery counts.
    fn recover(&self) -> Result<Vec<RecoveredQueue>, StoreError>;
}
