//! A queue shard's snapshots (issue 24 §3). A shard's state is what its queues hold in the
//! node's store, written there by every applied entry with the shard's applied position: so its
//! log can be compacted at any applied index with nothing beside it (the Raft snapshot record
//! holds one format byte, [`SNAPSHOT_FORMAT`]), and a replica too far behind for the log is
//! sent the shard's data itself, read from one point in time of the sender's store
//! ([`ferry_store::QueueStore::export_shard`]) and streamed after the snapshot message on the
//! peer link. That point is at or past the snapshot's index (it is read when the message is
//! sent, from a store that only moves forward): the data carries its own applied position, and
//! the replica skips the entries the data already holds, as it skips any entry at or below its
//! applied position.
//!
//! The receiver keeps the data here ([`ShardSnapshots::stage`]) and steps the message into its
//! driver; when raft-rs installs the snapshot, the shard's machine takes the data
//! ([`ShardSnapshots::take`]) and writes, in the round's one synced write with the Raft records
//! of the install, a delete of every queue of the shard it held
//! ([`ferry_store::StoreOp::DeleteShard`]), the data, and the data's applied position. A crash
//! before that write leaves the replica as it was; after it, as the sender's store was.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use ferry_multiraft::{GroupId, LogPosition};
use ferry_store::{QueueStore, StoreOp};

/// The data of a shard's Raft snapshot record: a format byte. Everything else is in the store.
pub(crate) const SNAPSHOT_FORMAT: u8 = 1;

/// Bytes of messages in one batch of a snapshot's data (one chunk on the peer link).
pub(crate) const BATCH_BYTES: usize = 1024 * 1024;

/// A received shard snapshot's data, waiting for its install.
#[derive(Debug)]
pub(crate) struct Staged {
    /// The snapshot message's position.
    pub(crate) at: LogPosition,
    /// The position the data holds: at or past `at`.
    pub(crate) applied: LogPosition,
    /// The data, in batches, as the sender's store exported it.
    pub(crate) ops: Vec<Vec<StoreOp>>,
}

/// The node's shard snapshots: where the data of one it sends comes from, and where the data of
/// one it received waits for its install (the latest per shard).
#[derive(Debug, Default)]
pub(crate) struct ShardSnapshots {
    store: Option<Arc<dyn QueueStore>>,
    staged: Mutex<BTreeMap<GroupId, Staged>>,
    sent: AtomicU64,
    installed: AtomicU64,
}

impl ShardSnapshots {
    /// Snapshots whose data is exported from `store` (`None`: this node sends none).
    pub(crate) fn new(store: Option<Arc<dyn QueueStore>>) -> Self {
        ShardSnapshots {
            store,
            ..ShardSnapshots::default()
        }
    }

    /// Snapshots sent whole to a peer.
    pub(crate) fn sent(&self) -> u64 {
        self.sent.load(Ordering::Relaxed)
    }

    pub(crate) fn count_sent(&self) {
        self.sent.fetch_add(1, Ordering::Relaxed);
    }

    /// Snapshots installed here.
    pub(crate) fn installed(&self) -> u64 {
        self.installed.load(Ordering::Relaxed)
    }

    fn count_installed(&self) {
        self.installed.fetch_add(1, Ordering::Relaxed);
    }

    /// Keeps `staged` for `group`'s next install, in place of any older data.
    pub(crate) fn stage(&self, group: GroupId, staged: Staged) {
        self.lock().insert(group, staged);
    }

    /// The data received for `group`'s snapshot at `index`, if it is the one staged; counted
    /// as installed when `install` says the machine installs it.
    pub(crate) fn take(&self, group: GroupId, index: u64, install: bool) -> Option<Staged> {
        let mut staged = self.lock();
        if staged.get(&group).is_some_and(|s| s.at.index == index) {
            if install {
                self.count_installed();
            }
            return staged.remove(&group);
        }
        None
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<GroupId, Staged>> {
        self.staged.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Reads `group`'s data from the store at one point in time, handing it to `sink` in
    /// batches; returns the applied position it holds, which must be at or past `at` (the
    /// snapshot's). Blocks on the disk.
    pub(crate) fn export(
        &self,
        group: GroupId,
        at: LogPosition,
        sink: &mut dyn FnMut(Vec<StoreOp>) -> Result<(), ferry_store::StoreError>,
    ) -> Result<LogPosition, String> {
        let Some(store) = &self.store else {
            return Err("this node keeps no store to send shard snapshots from".into());
        };
        let shard = ferry_kernel::ShardId(group.0);
        let applied = store
            .export_shard(shard, &super::applied_key(group), BATCH_BYTES, sink)
            .map_err(|e| format!("reading shard {group}'s data: {e}"))?;
        let applied = applied
            .as_deref()
            .and_then(super::decode_position)
            .ok_or_else(|| format!("shard {group} has no applied position in this store"))?;
        if applied.index < at.index {
            return Err(format!(
                "shard {group}'s store holds index {}, behind the snapshot's {}",
                applied.index, at.index
            ));
        }
        Ok(applied)
    }
}
