//! The Raft engine's storage on the node's one database: [`NodeLogStore`] writes each round's
//! job through the node's group-commit writer, as a synced batch shared with whatever the queues
//! submitted meanwhile, and reads the engine's key spaces back from the same store.
//!
//! A job raft-rs does not need synced (no entries, no vote or term, no snapshot: a round that
//! only moves commit indexes and applies committed entries) is written without a sync of its
//! own: a power loss may take it, and with it the applied indexes it carries, so the node
//! applies those entries again from its synced log at its restart (exactly once: what they
//! applied went with the same lost write). A leader answers a proposal once its entry is
//! committed on a majority's disks and applied in memory and in this write: the entry is safe
//! whatever happens to the write.
//!
//! A job's attachments are the queue shards' applied data: batches of [`StoreOp`]s
//! ([`ShardWrites`]) written in the same atomic batch as the Raft records and applied indexes.

use std::sync::Arc;

use ferry_multiraft::{KeyValue, KvOp, LogStore, PersistJob, Recovered, Space};
use ferry_store::{GroupCommit, KvSpace, QueueStore, StoreError, StoreOp};

/// The engine's [`LogStore`] on the node's database (see the module docs).
pub struct NodeLogStore {
    store: Arc<dyn QueueStore>,
    commit: GroupCommit,
    /// The planted bug `RAFT_ENTRIES_UNSYNCED` only: when it last synced.
    planted_synced_at: Option<std::time::Instant>,
}

impl std::fmt::Debug for NodeLogStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeLogStore")
            .field("store", &self.store)
            .finish_non_exhaustive()
    }
}

impl NodeLogStore {
    /// Reads through `store`, writes through `commit` (the writer of the same store).
    pub fn new(store: Arc<dyn QueueStore>, commit: GroupCommit) -> Self {
        NodeLogStore {
            store,
            commit,
            planted_synced_at: None,
        }
    }

    /// The planted bug `RAFT_ENTRIES_UNSYNCED`: the job is written without a sync, and the
    /// store synced only once that was long enough ago.
    fn write_planted(&mut self, ops: Vec<StoreOp>) -> Result<(), ferry_multiraft::Error> {
        self.store
            .write_unsynced(&[ops])
            .map_err(engine_error("unsynced write (planted bug)"))?;
        let now = std::time::Instant::now();
        let due = self
            .planted_synced_at
            .is_none_or(|at| now.duration_since(at) >= crate::faults::RAFT_UNSYNCED_FOR);
        if due {
            self.planted_synced_at = Some(now);
            self.store
                .sync()
                .map_err(engine_error("sync (planted bug)"))?;
        }
        Ok(())
    }
}

fn space(space: Space) -> KvSpace {
    match space {
        Space::Raft => KvSpace::RaftLog,
        Space::App => KvSpace::RaftApp,
    }
}

fn store_op(op: &KvOp) -> StoreOp {
    StoreOp::Kv(match op {
        KvOp::Put {
            space: s,
            key,
            value,
        } => ferry_store::KvOp::Put {
            space: space(*s),
            key: key.clone(),
            value: value.clone(),
        },
        KvOp::Delete { space: s, key } => ferry_store::KvOp::Delete {
            space: space(*s),
            key: key.clone(),
        },
        KvOp::DeleteRange { space: s, from, to } => ferry_store::KvOp::DeleteRange {
            space: space(*s),
            from: from.clone(),
            to: to.clone(),
        },
    })
}

fn engine_error(operation: &'static str) -> impl FnOnce(StoreError) -> ferry_multiraft::Error {
    move |e| match e {
        StoreError::Poisoned => ferry_multiraft::Error::StoragePoisoned,
        e => ferry_multiraft::Error::Storage {
            operation,
            reason: e.to_string(),
        },
    }
}

/// What a queue shard attaches to a job: the store operations its applied entries carried.
pub(crate) type ShardWrites = Vec<StoreOp>;

/// Every op of a job, in one batch: the engine's records, then the attached shard writes. An
/// attachment of another type fails the write (nothing of the job is written).
pub(crate) fn job_ops(job: &PersistJob) -> Result<Vec<StoreOp>, ferry_multiraft::Error> {
    let mut ops: Vec<StoreOp> = job.ops().iter().map(store_op).collect();
    for attached in job.attachments() {
        let Some(writes) = attached.downcast_ref::<ShardWrites>() else {
            return Err(ferry_multiraft::Error::Storage {
                operation: "synced write",
                reason: "a Raft job carries an attachment that is not a shard's store writes"
                    .into(),
            });
        };
        ops.extend(writes.iter().cloned());
    }
    Ok(ops)
}

/// The shard writes attached to a job, in order.
#[cfg(test)]
pub(crate) fn shard_writes(
    attachments: &[ferry_multiraft::Attachment],
) -> impl Iterator<Item = &ShardWrites> {
    attachments.iter().filter_map(|a| a.downcast_ref())
}

impl LogStore for NodeLogStore {
    fn write(&mut self, job: &PersistJob) -> Result<(), ferry_multiraft::Error> {
        let ops = job_ops(job)?;
        if crate::faults::on(crate::faults::RAFT_ENTRIES_UNSYNCED) {
            return self.write_planted(ops);
        }
        if !job.must_sync() {
            return self
                .commit
                .apply_blocking(ops)
                .map_err(engine_error("write"));
        }
        self.commit
            .commit_blocking(ops)
            .map_err(engine_error("synced write"))
    }

    fn load(&self) -> Result<Recovered, ferry_multiraft::Error> {
        let records = self
            .store
            .kv_scan(KvSpace::RaftLog, &[])
            .map_err(engine_error("read raft records"))?;
        Recovered::from_records(records.into_iter().map(Ok))
    }

    fn app_get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, ferry_multiraft::Error> {
        self.store
            .kv_get(KvSpace::RaftApp, key)
            .map_err(engine_error("read app key"))
    }

    fn app_scan(&self, prefix: &[u8]) -> Result<Vec<KeyValue>, ferry_multiraft::Error> {
        self.store
            .kv_scan(KvSpace::RaftApp, prefix)
            .map_err(engine_error("scan app keys"))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::sync::Arc;
    use std::time::Duration;

    use ferry_kernel::{QueueConfig, QueueName, QueueUid};
    use ferry_multiraft::{Engine, EngineConfig, GroupId, LogStore, NodeId, Recovered};
    use ferry_store::{GroupCommit, KvSpace, QueueDef, QueueStore, RocksStore, StoreOp};

    use super::NodeLogStore;

    /// The store, the log over it, and its writer thread: [`close`] them at the end, so that
    /// no thread still uses the database when the test's process exits (it crashed there).
    fn open(
        dir: &std::path::Path,
    ) -> (
        Arc<dyn QueueStore>,
        NodeLogStore,
        std::thread::JoinHandle<()>,
    ) {
        let store: Arc<dyn QueueStore> = Arc::new(RocksStore::open(dir).unwrap());
        let (commit, thread) =
            GroupCommit::start(Arc::clone(&store), 16, 16, Duration::ZERO).unwrap();
        (Arc::clone(&store), NodeLogStore::new(store, commit), thread)
    }

    /// Stops the writer (its queue closes with the log's handle) and waits for its thread.
    fn close(log: NodeLogStore, thread: std::thread::JoinHandle<()>) {
        drop(log);
        thread.join().unwrap();
    }

    /// A bootstrap job of one group, as the engine hands it over.
    fn job() -> ferry_multiraft::PersistJob {
        let mut engine = Engine::open(EngineConfig::new(NodeId(1)), Recovered::default()).unwrap();
        engine.bootstrap_group(GroupId(3), &[NodeId(1)]).unwrap();
        engine.round().persist.unwrap()
    }

    #[test]
    fn a_shards_writes_go_in_the_same_batch_as_the_raft_records() {
        let dir = tempfile::tempdir().unwrap();
        let (store, mut log, thread) = open(dir.path());
        let mut job = job();
        let def = QueueDef {
            name: QueueName::new("orders").unwrap(),
            uid: QueueUid(9),
            replica: None,
            config: QueueConfig::default(),
        };
        job.attach(Arc::new(vec![StoreOp::PutQueue(def.clone())]));
        log.write(&job).unwrap();
        assert_eq!(store.recover().unwrap()[0].def, def);
        assert!(!log.load().unwrap().group_ids().is_empty());
        close(log, thread);
    }

    #[test]
    fn an_attachment_of_another_kind_fails_the_write_and_writes_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let (store, mut log, thread) = open(dir.path());
        let mut job = job();
        job.attach(Arc::new("not store writes".to_string()));
        assert!(log.write(&job).is_err());
        assert!(store.kv_scan(KvSpace::RaftLog, &[]).unwrap().is_empty());
        close(log, thread);
    }
}
