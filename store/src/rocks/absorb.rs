//! One database per node. Releases before it kept the Raft engine's records in a RocksDB of
//! their own (`data_dir/raft`, column families `raft` and `raft_app`); this database now holds
//! them in column families of the same names ([`crate::KvSpace`]). At its first start a node
//! absorbs the old database: every key of both families, and a record saying it did, go into
//! this database in ONE synced batch; then the node removes the old directory. A crash before
//! the batch leaves everything as it was; a crash after it finds the record and only removes the
//! directory again. Nothing writes the Raft spaces before the absorption is done.

use std::path::Path;

use rocksdb::{Options, WriteBatch, WriteOptions, DB};

use super::{cf, io, RocksStore, CF_META};
use crate::{KvSpace, StoreError};

/// The `meta` key recording that the old Raft database was copied in.
const ABSORBED_KEY: &[u8] = b"absorbed/raft-db";

/// What [`RocksStore::absorb_raft_database`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Absorbed {
    /// Copied this many keys (both families together).
    Copied { keys: u64 },
    /// A run before this one copied them already (it stopped before removing the directory).
    Earlier,
    /// The directory holds no database (a start that stopped before opening it).
    NoDatabase,
}

impl RocksStore {
    /// Copies the Raft engine's database of an earlier release (`old_dir`) into this one; see
    /// the module docs. The caller removes `old_dir` once this returns `Ok`.
    pub fn absorb_raft_database(&self, old_dir: &Path) -> Result<Absorbed, StoreError> {
        let meta = cf(&self.db, CF_META)?;
        let done = self
            .db
            .get_cf(meta, ABSORBED_KEY)
            .map_err(io("reading the absorption record"))?;
        if done.is_some() {
            return Ok(Absorbed::Earlier);
        }
        if !old_dir.join("CURRENT").exists() {
            return Ok(Absorbed::NoDatabase);
        }
        for space in KvSpace::ALL {
            if self
                .db
                .iterator_cf(
                    cf(&self.db, space.column_family())?,
                    rocksdb::IteratorMode::Start,
                )
                .next()
                .is_some()
            {
                return Err(StoreError::Corrupt {
                    what: "data directory",
                    reason: format!(
                        "both the node's database and {} hold Raft state; restore the data directory from a backup, or move {} away to keep the node's own",
                        old_dir.display(),
                        old_dir.display()
                    ),
                });
            }
        }
        let names = KvSpace::ALL.map(KvSpace::column_family);
        let old = DB::open_cf_for_read_only(&Options::default(), old_dir, names, false)
            .map_err(io("opening the old Raft database"))?;
        let mut batch = WriteBatch::default();
        let mut keys = 0u64;
        for space in KvSpace::ALL {
            let name = space.column_family();
            let from = cf(&old, name)?;
            let to = cf(&self.db, name)?;
            for item in old.iterator_cf(from, rocksdb::IteratorMode::Start) {
                let (k, v) = item.map_err(io("reading the old Raft database"))?;
                batch.put_cf(to, k, v);
                keys += 1;
            }
        }
        batch.put_cf(meta, ABSORBED_KEY, keys.to_be_bytes());
        let mut wo = WriteOptions::default();
        wo.set_sync(true);
        self.poison_on_error(
            "absorbing the old Raft database",
            self.db.write_opt(batch, &wo),
        )?;
        Ok(Absorbed::Copied { keys })
    }
}

/// Test support: the layout of the release before one database per node, made from today's —
/// the Raft spaces of the node's database in `db_dir` move into a database of their own in
/// `old_dir` (column families `raft` and `raft_app`, as that release wrote them) and are dropped
/// from the node's. With `old_dir` then removed, the layout of a single-node release (no
/// cluster state at all).
#[doc(hidden)]
pub fn split_raft_database_out(db_dir: &Path, old_dir: &Path) -> Result<(), StoreError> {
    let mut store = RocksStore::open(db_dir)?;
    let mut opts = Options::default();
    opts.create_if_missing(true);
    opts.create_missing_column_families(true);
    let names = KvSpace::ALL.map(KvSpace::column_family);
    let old = DB::open_cf(&opts, old_dir, names).map_err(io("creating the old Raft database"))?;
    let mut batch = WriteBatch::default();
    for space in KvSpace::ALL {
        let to = cf(&old, space.column_family())?;
        for (k, v) in crate::QueueStore::kv_scan(&store, space, &[])? {
            batch.put_cf(to, k, v);
        }
    }
    let mut wo = WriteOptions::default();
    wo.set_sync(true);
    old.write_opt(batch, &wo)
        .map_err(io("writing the old Raft database"))?;
    for name in names {
        store
            .db
            .drop_cf(name)
            .map_err(io("dropping a Raft column family"))?;
    }
    Ok(())
}
