//! Durable storage for Ferry's queues.
//!
//! [`QueueStore`] is the interface the back-end writes and reads through: a synced batch of
//! [`StoreOp`]s, a small read at startup ([`QueueStore::recover`]: definitions, sequence
//! reservations, per-priority counts and dedup records, never messages), and the reads that page
//! messages in while the queue runs ([`QueueStore::read_page`], [`QueueStore::find_by_header`],
//! [`QueueStore::read_messages`], [`QueueStore::find_message`]). Queues may be far larger than
//! memory: each queue's messages are kept in delivery order (priority high first, then sequence),
//! so every priority is a run read from a cursor. Messages with a future delivery time are kept
//! in memory by the back-end; [`QueueStore::read_delayed`] finds them again after a restart
//! without reading the others.
//!
//! The store is the node's one database: beside the queues it keeps key spaces for the Raft
//! engine ([`KvSpace`]), written through the same [`GroupCommit`] writer, so a node makes one
//! synced write where it would otherwise make one per database.
//!
//! Two implementations share one conformance suite (`tests/conformance.rs`): [`MemoryStore`]
//! (tests, and nodes run without a disk) and [`RocksStore`]. [`GroupCommit`] lets many concurrent
//! writers share one synced write.
//!
//! Depends on the kernel for domain types only; it must not depend on gRPC or the servers.

mod codec;
mod entry;
pub mod faults;
mod group_commit;
mod kv;
mod memory;
mod message_keys;
mod rocks;

use ferry_kernel::{
    DedupRecord, IndexedHeader, PersistOp, Priority, QueueConfig, QueueName, QueueUid,
    RecoveredMessage, Seq, ShardId,
};

pub use entry::{decode_entry, encode_entry, ENTRY_VERSION};
pub use group_commit::{
    Buckets, BucketsSnapshot, CommitSettings, CommitTicket, CommitWriter, GroupCommit,
    GroupCommitStats,
};
pub use kv::{KeyValue, KvOp, KvSpace};
pub use memory::MemoryStore;
pub use message_keys::MessageKeys;
#[doc(hidden)]
pub use rocks::{split_raft_database_out, write_pre_paging_database};
pub use rocks::{Absorbed, RocksStore};

/// Priorities 0..=9, so per-priority arrays are indexed by `Priority::get()`.
pub const PRIORITY_LEVELS: usize = Priority::MAX as usize + 1;

/// A queue's durable definition.
#[derive(Debug, Clone, PartialEq)]
pub struct QueueDef {
    pub name: QueueName,
    pub uid: QueueUid,
    pub config: QueueConfig,
    /// The queue shard whose log wrote this queue (`None`: replication factor 1, written by
    /// this node alone). A replica's store holds the queues of every shard it replicates; only
    /// the shard's leader serves them.
    pub replica: Option<ShardReplica>,
}

/// Which queue shard a replicated queue belongs to, and the metadata's placement epoch of the
/// queue it was created for (a queue deleted and created again under its name has a new one).
/// Its `Debug` shows whether it has a handle key, never the key.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct ShardReplica {
    pub shard: ferry_kernel::ShardId,
    pub epoch: ferry_kernel::PlacementEpoch,
    /// The secret the queue's receipt handles are checked with, drawn once by the leader that
    /// created the queue, so a handle stays good on whichever replica leads next (`None` in a
    /// definition written before it was kept: the serving node's own secret).
    pub handle_key: Option<(u64, u64)>,
}

impl std::fmt::Debug for ShardReplica {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ShardReplica")
            .field("shard", &self.shard)
            .field("epoch", &self.epoch)
            .field("handle_key", &self.handle_key.map(|_| ".."))
            .finish()
    }
}

/// One change to durable state.
#[derive(Debug, Clone, PartialEq)]
pub enum StoreOp {
    PutQueue(QueueDef),
    /// Removes the queue with every message, count, index entry and record it had.
    DeleteQueue(QueueUid),
    /// A change to one queue's messages, as the kernel asked for it.
    Queue {
        uid: QueueUid,
        op: PersistOp,
    },
    /// Deletes one message known by its keys and size only: how a replicated log entry carries
    /// a [`PersistOp::DeleteMessage`] ([`encode_entry`]). A store applies it exactly as it
    /// applies that op for the whole message.
    DeleteMessage {
        uid: QueueUid,
        keys: MessageKeys,
    },
    /// A write to a key space kept for another part of the node (the Raft engine).
    Kv(KvOp),
    /// Removes every queue whose definition names this shard ([`QueueDef::replica`]), with
    /// everything it holds, as [`StoreOp::DeleteQueue`] removes one: how a replica installing
    /// a shard's snapshot ([`QueueStore::export_shard`]) clears what it held of the shard. It
    /// sees the queues as they were before its write: no other op of the same write may
    /// touch the shard's queues before it. Never carried by a shard's log.
    DeleteShard(ShardId),
}

/// How many messages of one priority a queue holds in the store, and their bytes
/// (`Message::size_bytes`).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct StoredLevel {
    pub count: u64,
    pub bytes: u64,
}

/// What is kept for one queue, read back at startup. Messages are not read: they stay in the
/// store and are paged in.
#[derive(Debug, Clone, PartialEq)]
pub struct RecoveredQueue {
    pub def: QueueDef,
    pub seq_reserved_until: Seq,
    /// The messages held in the store, per priority (index: `Priority::get()`).
    pub stored: [StoredLevel; PRIORITY_LEVELS],
    /// Producer dedup ids still remembered (some may have expired since; the queue forgets
    /// those at once).
    pub dedup: Vec<DedupRecord>,
}

/// One read of a priority's run of messages ([`QueueStore::read_page`]).
#[derive(Debug, Clone, PartialEq)]
pub struct Page {
    /// In sequence order, with their delivery counts.
    pub messages: Vec<RecoveredMessage>,
    /// Where to read on: one past the last message returned, or `upto` when the range was read
    /// to its end (then `end` is true). Every message of the priority in `[from, next)` is in
    /// `messages`.
    pub next: Seq,
    /// True when no message of this priority is left in `[next, upto)`.
    pub end: bool,
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
///
/// Counts are kept without reading messages: each `PutMessage` adds one message, each
/// `DeleteMessage` and `DeleteStored` subtracts what it names. The kernel must therefore put each
/// message once and delete it once.
///
/// Reads may be called from any thread while writes go on; each sees every write that has
/// returned, and may block on the disk (call them off the async runtime's worker threads).
pub trait QueueStore: Send + Sync + std::fmt::Debug + 'static {
    /// Applies every op of every batch, in order, atomically and durably.
    fn write(&self, batches: &[Vec<StoreOp>]) -> Result<(), StoreError>;

    /// Applies every op of every batch, in order and atomically, without waiting for the disk:
    /// the ops are durable once a later [`write`](Self::write) or [`sync`](Self::sync) returns.
    /// Reads see them at once. A store without a disk writes them like `write`.
    fn write_unsynced(&self, batches: &[Vec<StoreOp>]) -> Result<(), StoreError> {
        self.write(batches)
    }

    /// Makes every earlier [`write_unsynced`](Self::write_unsynced) durable.
    fn sync(&self) -> Result<(), StoreError> {
        Ok(())
    }

    /// Whether a write or sync failed: then every later write fails with
    /// [`StoreError::Poisoned`] until the process restarts (the disk is behind memory).
    fn poisoned(&self) -> bool {
        false
    }

    /// Reads every queue's definition, sequence reservation, per-priority counts and dedup
    /// records. No message is read.
    fn recover(&self) -> Result<Vec<RecoveredQueue>, StoreError>;

    /// [`QueueStore::recover`] of the queues whose definition `keep` accepts: the others'
    /// records past their definitions are not read (a node that starts to lead one queue shard
    /// among many recovers that shard's queues only).
    fn recover_where(
        &self,
        keep: &dyn Fn(&QueueDef) -> bool,
    ) -> Result<Vec<RecoveredQueue>, StoreError> {
        Ok(self
            .recover()?
            .into_iter()
            .filter(|r| keep(&r.def))
            .collect())
    }

    /// Messages of one priority with seq in `[from, upto)`, in seq order, with delivery counts:
    /// at most `max_count`, and stopping after the message that reaches `max_bytes` (always at
    /// least one if any and `max_count > 0`). See [`Page`] for `next` and `end`; when
    /// `from >= upto` the page is empty, `next` is `from` and `end` is true.
    fn read_page(
        &self,
        uid: QueueUid,
        priority: Priority,
        from: Seq,
        upto: Seq,
        max_count: usize,
        max_bytes: u64,
    ) -> Result<Page, StoreError>;

    /// (priority, seq) of the messages whose indexed header equals `value`, in delivery order
    /// (priority high first, then seq), at most `max`. Index entries whose message is gone (left
    /// by `DeleteStored`) are skipped.
    fn find_by_header(
        &self,
        uid: QueueUid,
        header: IndexedHeader,
        value: &str,
        max: usize,
    ) -> Result<Vec<(Priority, Seq)>, StoreError>;

    /// The messages at these keys, with delivery counts, in the order of `keys`; keys with no
    /// message are skipped.
    fn read_messages(
        &self,
        uid: QueueUid,
        keys: &[(Priority, Seq)],
    ) -> Result<Vec<RecoveredMessage>, StoreError>;

    /// One message by seq, whatever its priority, with its delivery count.
    fn find_message(&self, uid: QueueUid, seq: Seq)
        -> Result<Option<RecoveredMessage>, StoreError>;

    /// The value of `key` in a [`KvSpace`].
    fn kv_get(&self, space: KvSpace, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError>;

    /// Every key of a [`KvSpace`] starting with `prefix` (empty: all of them), in key order.
    fn kv_scan(&self, space: KvSpace, prefix: &[u8]) -> Result<Vec<KeyValue>, StoreError>;

    /// Messages of the queue whose delivery time is after `after_ms`, with delivery counts, in
    /// delivery-time order (then seq). Entries at or before `after_ms` are never read: the range
    /// starts after it. Entries whose message is gone (left by `DeleteStored`) are skipped.
    fn read_delayed(
        &self,
        uid: QueueUid,
        after_ms: u64,
    ) -> Result<Vec<RecoveredMessage>, StoreError>;

    /// Messages of the queue whose delivery is marked (a replicated queue's lease or back-off,
    /// see [`ferry_kernel::DeliveryMark`]), with their counts and marks, in seq order: what a
    /// new shard leader holds in memory from the start. A queue that writes counts only has
    /// none.
    fn read_marked(&self, uid: QueueUid) -> Result<Vec<RecoveredMessage>, StoreError>;

    /// A copy of a queue shard's data as of one point in time, for a replica that needs a
    /// snapshot: every queue whose definition names `shard`, as ops that recreate it when
    /// written in order after [`StoreOp::DeleteShard`] (each queue's definition, sequence
    /// reservation, dedup records, messages, then the delivery counts and marks of the
    /// messages held; counts, header index and delayed entries follow from the puts). `sink`
    /// gets them in batches of about `batch_bytes` of messages each, as they are read (a
    /// large shard is never held whole). Returns the value `app_key` (a
    /// [`KvSpace::RaftApp`] key: the shard's applied position) had at that same point.
    fn export_shard(
        &self,
        shard: ShardId,
        app_key: &[u8],
        batch_bytes: usize,
        sink: &mut dyn FnMut(Vec<StoreOp>) -> Result<(), StoreError>,
    ) -> Result<Option<Vec<u8>>, StoreError> {
        let _ = (shard, app_key, batch_bytes, sink);
        Err(StoreError::Io {
            context: "exporting a queue shard",
            message: "this store cannot export shards".into(),
        })
    }
}

/// Cuts an export into batches: ops go in, a batch goes to the sink once its messages reach
/// `batch_bytes`.
struct ExportBatcher<'a> {
    sink: &'a mut dyn FnMut(Vec<StoreOp>) -> Result<(), StoreError>,
    batch_bytes: usize,
    ops: Vec<StoreOp>,
    bytes: usize,
}

impl<'a> ExportBatcher<'a> {
    fn new(
        batch_bytes: usize,
        sink: &'a mut dyn FnMut(Vec<StoreOp>) -> Result<(), StoreError>,
    ) -> Self {
        ExportBatcher {
            sink,
            batch_bytes,
            ops: Vec::new(),
            bytes: 0,
        }
    }

    fn push(&mut self, op: StoreOp) -> Result<(), StoreError> {
        if let StoreOp::Queue {
            op: PersistOp::PutMessage(m),
            ..
        } = &op
        {
            self.bytes = self
                .bytes
                .saturating_add(usize::try_from(m.size_bytes()).unwrap_or(usize::MAX));
        }
        self.ops.push(op);
        // Ops other than puts are small: a bound on their number keeps a batch bounded too.
        if self.bytes >= self.batch_bytes || self.ops.len() >= 65_536 {
            self.flush()?;
        }
        Ok(())
    }

    fn finish(mut self) -> Result<(), StoreError> {
        self.flush()
    }

    fn flush(&mut self) -> Result<(), StoreError> {
        if self.ops.is_empty() {
            return Ok(());
        }
        self.bytes = 0;
        (self.sink)(std::mem::take(&mut self.ops))
    }
}

/// The headers every store indexes, in the order their entries are written.
const INDEXED_HEADERS: [IndexedHeader; 2] = [IndexedHeader::CorrelationId, IndexedHeader::GroupId];

/// A priority's place in delivery order: 0 for the highest priority, so ascending keys deliver
/// first.
fn rank(p: Priority) -> u8 {
    Priority::MAX - p.get()
}

/// The priority at a rank (inverse of [`rank`]); `None` for a byte no key holds.
fn priority_of_rank(rank: u8) -> Option<Priority> {
    Priority::MAX
        .checked_sub(rank)
        .and_then(|p| Priority::new(p.into()).ok())
}

/// Every priority, highest first (delivery order).
fn priorities_high_first() -> impl Iterator<Item = Priority> {
    (0..=Priority::MAX).filter_map(priority_of_rank)
}

/// The byte naming an indexed header in index keys. Stored on disk: never renumber.
fn header_kind(h: IndexedHeader) -> u8 {
    match h {
        IndexedHeader::CorrelationId => 0,
        IndexedHeader::GroupId => 1,
    }
}
