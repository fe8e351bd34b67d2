//! An in-memory store that models durability, for simulations: a write is durable only once a
//! sync covers it, and a simulated crash loses every write not yet synced.

use std::collections::BTreeMap;

use crate::error::Error;
use crate::keys::{KvOp, Space};
use crate::persist::{Attachment, PersistJob};
use crate::storage::{KeyValue, LogStore, Recovered};

type KvMap = BTreeMap<Vec<u8>, Vec<u8>>;

/// What a store holds at one moment: its two key spaces and the attachments of its jobs.
#[derive(Debug, Clone, Default)]
struct Image {
    raft: KvMap,
    app: KvMap,
    attached: Vec<Attachment>,
}

impl Image {
    fn space(&mut self, space: Space) -> &mut KvMap {
        match space {
            Space::Raft => &mut self.raft,
            Space::App => &mut self.app,
        }
    }

    fn apply(&mut self, ops: &[KvOp], attached: &[Attachment]) {
        for op in ops {
            match op {
                KvOp::Put { space, key, value } => {
                    self.space(*space).insert(key.clone(), value.clone());
                }
                KvOp::Delete { space, key } => {
                    self.space(*space).remove(key);
                }
                KvOp::DeleteRange { space, from, to } => {
                    let map = self.space(*space);
                    if from < to {
                        let doomed: Vec<Vec<u8>> = map
                            .range(from.clone()..to.clone())
                            .map(|(k, _)| k.clone())
                            .collect();
                        for key in doomed {
                            map.remove(&key);
                        }
                    }
                }
            }
        }
        self.attached.extend(attached.iter().cloned());
    }
}

/// The same key layout as [`crate::RocksStore`], in ordered maps, as RocksDB behaves: a write is
/// read back at once ([`MemStore::write_unsynced`]) and becomes durable at [`MemStore::sync`];
/// [`MemStore::crash`] (a power loss) drops what was not synced, so reads see the durable state
/// again. [`LogStore::write`] syncs the job unless [`PersistJob::must_sync`] is false.
///
/// A job's attachments are kept, in order ([`MemStore::attachments`]): the application's own
/// store, modelled by whoever knows their type, is what replaying them gives.
#[derive(Default)]
pub struct MemStore {
    /// What reads see: every job written.
    visible: Image,
    /// What a power loss keeps: every job synced.
    durable: Image,
    unsynced: Vec<(Vec<KvOp>, Vec<Attachment>)>,
    synced_write_count: u64,
}

impl std::fmt::Debug for MemStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemStore")
            .field("raft", &self.visible.raft)
            .field("app", &self.visible.app)
            .field("unsynced", &self.unsynced.len())
            .field("attached", &self.visible.attached.len())
            .field("synced_write_count", &self.synced_write_count)
            .finish()
    }
}

impl MemStore {
    /// An empty store.
    pub fn new() -> Self {
        MemStore::default()
    }

    /// Writes a job without a sync: read back at once, lost by [`MemStore::crash`] unless
    /// [`MemStore::sync`] runs first.
    pub fn write_unsynced(&mut self, job: &PersistJob) {
        self.visible.apply(&job.ops, &job.attached);
        self.unsynced.push((job.ops.clone(), job.attached.clone()));
    }

    /// Makes every job written durable, in order, each atomically.
    pub fn sync(&mut self) {
        self.sync_jobs(self.unsynced.len());
    }

    /// Makes the oldest `count` jobs not yet synced durable, in order, each atomically.
    pub fn sync_jobs(&mut self, count: usize) {
        let count = count.min(self.unsynced.len());
        for (ops, attached) in self.unsynced.drain(..count).collect::<Vec<_>>() {
            self.durable.apply(&ops, &attached);
            self.synced_write_count += 1;
        }
    }

    /// A simulated power loss: every write not synced is lost.
    pub fn crash(&mut self) {
        self.unsynced.clear();
        self.visible = self.durable.clone();
    }

    /// The attachments of every job written (after a crash: every durable one), in order.
    pub fn attachments(&self) -> &[Attachment] {
        &self.visible.attached
    }

    /// Jobs written but not yet synced.
    pub fn unsynced_job_count(&self) -> usize {
        self.unsynced.len()
    }

    /// Jobs made durable so far.
    pub fn synced_write_count(&self) -> u64 {
        self.synced_write_count
    }
}

impl LogStore for MemStore {
    fn write(&mut self, job: &PersistJob) -> Result<(), Error> {
        self.write_unsynced(job);
        if job.must_sync() {
            self.sync();
        }
        Ok(())
    }

    fn load(&self) -> Result<Recovered, Error> {
        Recovered::from_records(self.visible.raft.iter().map(|(k, v)| Ok((k, v))))
    }

    fn app_get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, Error> {
        Ok(self.visible.app.get(key).cloned())
    }

    fn app_scan(&self, prefix: &[u8]) -> Result<Vec<KeyValue>, Error> {
        Ok(self
            .visible
            .app
            .range(prefix.to_vec()..)
            .take_while(|(k, _)| k.starts_with(prefix))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect())
    }
}
