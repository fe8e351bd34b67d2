//! The Raft engine's storage on the node's one database: [`NodeLogStore`] writes each round's
//! job through the node's group-commit writer, as a synced batch shared with whatever the queues
//! submitted meanwhile, and reads the engine's key spaces back from the same store.

use std::sync::Arc;

use ferry_multiraft::{KeyValue, KvOp, LogStore, PersistJob, Recovered, Space};
use ferry_store::{GroupCommit, KvSpace, QueueStore, StoreError, StoreOp};

/// The engine's [`LogStore`] on the node's database (see the module docs).
pub struct NodeLogStore {
    store: Arc<dyn QueueStore>,
    commit: GroupCommit,
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
        NodeLogStore { store, commit }
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

impl LogStore for NodeLogStore {
    fn write(&mut self, job: &PersistJob) -> Result<(), ferry_multiraft::Error> {
        let ops = job.ops().iter().map(store_op).collect();
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
