//! An in-memory store that models durability, for simulations: a write is durable only once a
//! sync covers it, and a simulated crash loses every write not yet synced.

use std::collections::BTreeMap;

use crate::error::Error;
use crate::keys::{KvOp, Space};
use crate::persist::{Attachment, PersistJob};
use crate::storage::{KeyValue, LogStore, Recovered};

type KvMap = BTreeMap<Vec<u8>, Vec<u8>>;

/// The same key layout as [`crate::RocksStore`], in two ordered maps. Writes are queued by
/// [`MemStore::write_unsynced`] and become durable at [`MemStore::sync`];
/// [`MemStore::crash`] drops the queue. [`LogStore::write`] does both at once.
///
/// A job's attachments are kept, in order, once the job is durable ([`MemStore::attachments`]):
/// the application's own store, modelled by whoever knows their type, is what replaying them
/// gives.
#[derive(Default)]
pub struct MemStore {
    raft: KvMap,
    app: KvMap,
    unsynced: Vec<(Vec<KvOp>, Vec<Attachment>)>,
    attached: Vec<Attachment>,
    synced_write_count: u64,
}

impl std::fmt::Debug for MemStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemStore")
            .field("raft", &self.raft)
            .field("app", &self.app)
            .field("unsynced", &self.unsynced.len())
            .field("attached", &self.attached.len())
            .field("synced_write_count", &self.synced_write_count)
            .finish()
    }
}

impl MemStore {
    /// An empty store.
    pub fn new() -> Self {
        MemStore::default()
    }

    /// Queues a job's writes; they are lost by [`MemStore::crash`] unless [`MemStore::sync`]
    /// runs first.
    pub fn write_unsynced(&mut self, job: &PersistJob) {
        self.unsynced.push((job.ops.clone(), job.attached.clone()));
    }

    /// Makes every queued write durable, in order, each job atomically.
    pub fn sync(&mut self) {
        self.sync_jobs(self.unsynced.len());
    }

    /// Makes the oldest `count` queued jobs durable, in order, each atomically.
    pub fn sync_jobs(&mut self, count: usize) {
        let count = count.min(self.unsynced.len());
        for (ops, attached) in self.unsynced.drain(..count).collect::<Vec<_>>() {
            for op in ops {
                self.apply(op);
            }
            self.attached.extend(attached);
            self.synced_write_count += 1;
        }
    }

    /// A simulated crash: every write not synced is lost.
    pub fn crash(&mut self) {
        self.unsynced.clear();
    }

    /// The attachments of every durable job, in the order they were written.
    pub fn attachments(&self) -> &[Attachment] {
        &self.attached
    }

    /// Jobs written but not yet synced.
    pub fn unsynced_job_count(&self) -> usize {
        self.unsynced.len()
    }

    /// Jobs made durable so far.
    pub fn synced_write_count(&self) -> u64 {
        self.synced_write_count
    }

    fn space(&mut self, space: Space) -> &mut KvMap {
        match space {
            Space::Raft => &mut self.raft,
            Space::App => &mut self.app,
        }
    }

    fn apply(&mut self, op: KvOp) {
        match op {
            KvOp::Put { space, key, value } => {
                self.space(space).insert(key, value);
            }
            KvOp::Delete { space, key } => {
                self.space(space).remove(&key);
            }
            KvOp::DeleteRange { space, from, to } => {
                let map = self.space(space);
                if from < to {
                    let doomed: Vec<Vec<u8>> =
                        map.range(from..to).map(|(k, _)| k.clone()).collect();
                    for key in doomed {
                        map.remove(&key);
                    }
                }
            }
        }
    }
}

impl LogStore for MemStore {
    fn write(&mut self, job: &PersistJob) -> Result<(), Error> {
        self.write_unsynced(job);
        self.sync();
        Ok(())
    }

    /// Reads the durable state only: writes not yet synced are not seen.
    fn load(&self) -> Result<Recovered, Error> {
        Recovered::from_records(self.raft.iter().map(|(k, v)| Ok((k, v))))
    }

    fn app_get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, Error> {
        Ok(self.app.get(key).cloned())
    }

    fn app_scan(&self, prefix: &[u8]) -> Result<Vec<KeyValue>, Error> {
        Ok(self
            .app
            .range(prefix.to_vec()..)
            .take_while(|(k, _)| k.starts_with(prefix))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect())
    }
}
