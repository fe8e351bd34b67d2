//! The RocksDB store: the `raft` column family holds every group's records under group-prefixed
//! big-endian keys, `raft_app` the application's keys; each job is one `WriteBatch` written with
//! `sync = true` when [`crate::PersistJob::must_sync`] says so.

use std::path::Path;

use rocksdb::{ColumnFamilyDescriptor, IteratorMode, Options, WriteBatch, WriteOptions, DB};

use crate::error::Error;
use crate::keys::{KvOp, Space};
use crate::persist::PersistJob;
use crate::storage::{KeyValue, LogStore, Recovered};

/// Column family of the engine's records.
pub const RAFT_CF: &str = "raft";
/// Column family of the application's keys ([`PersistJob::put_app`]).
pub const APP_CF: &str = "raft_app";

/// Raft storage in a RocksDB database of its own.
pub struct RocksStore {
    db: DB,
    poisoned: bool,
}

impl std::fmt::Debug for RocksStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RocksStore")
            .field("path", &self.db.path())
            .field("poisoned", &self.poisoned)
            .finish()
    }
}

fn storage_error(operation: &'static str) -> impl FnOnce(rocksdb::Error) -> Error {
    move |e| Error::Storage {
        operation,
        reason: e.into_string(),
    }
}

impl RocksStore {
    /// Opens (or creates) the store in `dir`.
    pub fn open(dir: &Path) -> Result<Self, Error> {
        let mut opts = Options::default();
        opts.create_if_missing(true);
        opts.create_missing_column_families(true);
        let cfs =
            [RAFT_CF, APP_CF].map(|name| ColumnFamilyDescriptor::new(name, Options::default()));
        let db = DB::open_cf_descriptors(&opts, dir, cfs).map_err(storage_error("open"))?;
        Ok(RocksStore {
            db,
            poisoned: false,
        })
    }

    fn cf(&self, space: Space) -> Result<&rocksdb::ColumnFamily, Error> {
        let name = match space {
            Space::Raft => RAFT_CF,
            Space::App => APP_CF,
        };
        self.db.cf_handle(name).ok_or(Error::Storage {
            operation: "open column family",
            reason: format!("column family {name} missing"),
        })
    }

    fn batch(&self, job: &PersistJob) -> Result<WriteBatch, Error> {
        if !job.attached.is_empty() {
            // This store keeps the engine's key spaces only: an attachment has nowhere to go.
            return Err(Error::Storage {
                operation: "synced write",
                reason: "the job carries writes of an application store this store does not have"
                    .into(),
            });
        }
        let mut batch = WriteBatch::default();
        for op in &job.ops {
            match op {
                KvOp::Put { space, key, value } => batch.put_cf(self.cf(*space)?, key, value),
                KvOp::Delete { space, key } => batch.delete_cf(self.cf(*space)?, key),
                KvOp::DeleteRange { space, from, to } => {
                    batch.delete_range_cf(self.cf(*space)?, from, to)
                }
            }
        }
        Ok(batch)
    }
}

impl LogStore for RocksStore {
    fn write(&mut self, job: &PersistJob) -> Result<(), Error> {
        if self.poisoned {
            return Err(Error::StoragePoisoned);
        }
        let batch = self.batch(job)?;
        let mut wo = WriteOptions::default();
        wo.set_sync(job.must_sync());
        let result = self
            .db
            .write_opt(batch, &wo)
            .map_err(storage_error("write"));
        if result.is_err() {
            self.poisoned = true;
        }
        result
    }

    fn load(&self) -> Result<Recovered, Error> {
        let records = self
            .db
            .iterator_cf(self.cf(Space::Raft)?, IteratorMode::Start)
            .map(|r| r.map_err(storage_error("read raft records")));
        Recovered::from_records(records)
    }

    fn app_get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, Error> {
        self.db
            .get_cf(self.cf(Space::App)?, key)
            .map_err(storage_error("read app key"))
    }

    fn app_scan(&self, prefix: &[u8]) -> Result<Vec<KeyValue>, Error> {
        let mode = IteratorMode::From(prefix, rocksdb::Direction::Forward);
        let mut out = Vec::new();
        for record in self.db.iterator_cf(self.cf(Space::App)?, mode) {
            let (key, value) = record.map_err(storage_error("scan app keys"))?;
            if !key.starts_with(prefix) {
                break;
            }
            out.push((key.into_vec(), value.into_vec()));
        }
        Ok(out)
    }
}
