//! The persistence job of a round: every group's Raft writes plus the application's own, for
//! one synced write.

use std::any::Any;
use std::sync::Arc;

use crate::ids::PersistId;
use crate::keys::{KvOp, Space};

/// Writes of the application's own store, opaque to the engine, carried in a job by
/// [`PersistJob::attach`].
pub type Attachment = Arc<dyn Any + Send + Sync>;

/// Everything to make durable at the end of a round, for every group, as ONE atomic synced
/// write ([`crate::LogStore::write`]).
///
/// The application adds its own writes with [`PersistJob::put_app`] / [`PersistJob::delete_app`]
/// — typically the effects of the round's committed entries together with its applied index —
/// so that its state and the engine's apply state are made durable atomically. Application keys
/// live in their own key space (the `app` column family in RocksDB) and are read back with
/// [`crate::LogStore::app_get`] / [`crate::LogStore::app_scan`].
///
/// Writes the application keeps outside these key spaces (a queue shard's applied data, in
/// the node's queue store) travel as [`Attachment`]s ([`PersistJob::attach`]): the engine does
/// not look inside them, and the [`crate::LogStore`] that writes the job, which knows their
/// type, writes them in the same atomic batch. A store that does not know an attachment's type
/// must fail the write, never drop it.
///
/// After the write returns, the driver calls [`crate::Engine::on_persisted`] with
/// [`PersistJob::id`]. Jobs must be written in the order of their ids.
pub struct PersistJob {
    pub(crate) id: PersistId,
    pub(crate) ops: Vec<KvOp>,
    pub(crate) must_sync: bool,
    pub(crate) attached: Vec<Attachment>,
}

impl std::fmt::Debug for PersistJob {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PersistJob")
            .field("id", &self.id)
            .field("ops", &self.ops)
            .field("must_sync", &self.must_sync)
            .field("attached", &self.attached.len())
            .finish()
    }
}

impl PersistJob {
    /// The job's number, to pass to [`crate::Engine::on_persisted`] once written.
    pub fn id(&self) -> PersistId {
        self.id
    }

    /// Whether the job must be synced before anything it holds is relied on: raft-rs's own
    /// reasons (entries, a snapshot, a term or vote change), a group created, removed or
    /// compacted, or a configuration change applied. When false, only commit indexes and what the machines applied changed: a store
    /// may write it without a sync of its own, since a power loss that takes it takes the
    /// applied indexes with the applied data, and the node applies those entries again from its
    /// synced log. It must still be written before [`crate::Engine::on_persisted`] is called
    /// and before any later job.
    pub fn must_sync(&self) -> bool {
        self.must_sync
    }

    /// The job's writes, in the order a store must apply them (one atomic batch), for a store
    /// implemented outside this crate (one that shares its database and writer with others).
    pub fn ops(&self) -> &[KvOp] {
        &self.ops
    }

    /// Number of key/value operations in the job.
    pub fn op_count(&self) -> usize {
        self.ops.len()
    }

    /// Bytes of keys and values the job writes.
    pub fn size_bytes(&self) -> usize {
        self.ops.iter().map(KvOp::size_bytes).sum()
    }

    /// Adds an application key/value, written atomically with the rest of the job.
    pub fn put_app(&mut self, key: impl Into<Vec<u8>>, value: impl Into<Vec<u8>>) {
        self.ops.push(KvOp::Put {
            space: Space::App,
            key: key.into(),
            value: value.into(),
        });
    }

    /// Deletes every application key in `[from, to)`, atomically with the rest of the job.
    pub fn delete_app_range(&mut self, from: impl Into<Vec<u8>>, to: impl Into<Vec<u8>>) {
        self.ops.push(KvOp::DeleteRange {
            space: Space::App,
            from: from.into(),
            to: to.into(),
        });
    }

    /// Adds writes of the application's own store, made durable atomically with the rest of
    /// the job by a store that knows their type (see the type's docs).
    pub fn attach(&mut self, writes: Attachment) {
        self.attached.push(writes);
    }

    /// The attachments, in the order they were added.
    pub fn attachments(&self) -> &[Attachment] {
        &self.attached
    }

    /// Deletes an application key, atomically with the rest of the job.
    pub fn delete_app(&mut self, key: impl Into<Vec<u8>>) {
        self.ops.push(KvOp::Delete {
            space: Space::App,
            key: key.into(),
        });
    }
}
