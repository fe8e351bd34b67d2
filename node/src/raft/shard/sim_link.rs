//! Shard snapshots on the simulator: a link that carries a queue shard's data with its
//! snapshot message, as the node's snapshot stream does (`snapshot_stream.rs`), in one step:
//! read from what the sender's store made durable when it is sent, staged where the receiver's
//! machine takes it at the install. Shared by the shard simulation (`tests.rs`) and the node
//! simulation (`sim/`).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use bytes::Bytes;
use ferry_multiraft::sim::{SimOutbound, SimStore};
use ferry_multiraft::{GroupId, LogStore, NodeId, OutSnapshot, Outbound};
use ferry_store::{KvOp, KvSpace, MemoryStore, QueueStore, StoreOp};

use super::{applied_key, ShardSnapshots, Staged};
use crate::raft::log_store::shard_writes;

/// The store a node made durable, for `groups`' applied positions: the shard writes of its
/// durable jobs and those positions (what a read of its RocksDB at this moment would see).
pub(crate) fn durable_store(store: &SimStore, groups: &[GroupId]) -> MemoryStore {
    let rebuilt = MemoryStore::new();
    for writes in shard_writes(&store.attachments()) {
        rebuilt
            .write(std::slice::from_ref(writes))
            .expect("a memory store takes any write");
    }
    for group in groups {
        let key = applied_key(*group);
        if let Some(applied) = store.app_get(&key).expect("a sim store reads") {
            let put = StoreOp::Kv(KvOp::Put {
                space: KvSpace::RaftApp,
                key,
                value: applied,
            });
            rebuilt
                .write(&[vec![put]])
                .expect("a memory store takes any write");
        }
    }
    rebuilt
}

/// Each node's staged snapshot data, by node: what arrived with a snapshot message (it outlives
/// a restart only so that a message still in flight meets its data, as on a real link).
pub(crate) type Inboxes = Arc<Mutex<BTreeMap<NodeId, Arc<ShardSnapshots>>>>;

/// The inbox of `node`, made on first use.
pub(crate) fn inbox(inboxes: &Inboxes, node: NodeId) -> Arc<ShardSnapshots> {
    let mut all = inboxes.lock().unwrap_or_else(PoisonError::into_inner);
    Arc::clone(all.entry(node).or_default())
}

/// A node's link to the others (see the module docs). Snapshots of `skip` (the metadata's
/// group, whose snapshot carries its state itself) go as they are.
pub(crate) struct SnapshotLink {
    pub(crate) inner: SimOutbound,
    pub(crate) store: SimStore,
    pub(crate) inboxes: Inboxes,
    pub(crate) snapshots_sent: Arc<AtomicUsize>,
    pub(crate) skip: Option<GroupId>,
}

impl Outbound for SnapshotLink {
    fn send(&self, to: NodeId, bytes: Bytes) {
        self.inner.send(to, bytes);
    }

    fn send_snapshot(&self, snapshot: OutSnapshot) {
        if Some(snapshot.group) != self.skip {
            let durable = durable_store(&self.store, &[snapshot.group]);
            let source = ShardSnapshots::new(Some(Arc::new(durable)));
            let mut ops = Vec::new();
            let applied = source
                .export(snapshot.group, snapshot.position, &mut |batch| {
                    ops.push(batch);
                    Ok(())
                })
                .expect("a memory store exports");
            let staged = Staged {
                at: snapshot.position,
                applied,
                ops,
            };
            inbox(&self.inboxes, snapshot.to).stage(snapshot.group, staged);
            self.snapshots_sent.fetch_add(1, Ordering::Relaxed);
        }
        self.inner.send_snapshot(snapshot);
    }
}
