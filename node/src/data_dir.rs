//! The node's data directory: one database for everything the node keeps (`<data_dir>/queues`,
//! the name it had when it held only the queues; the Raft engine's records are in it too), and
//! the upgrades of directories written by earlier releases, each resumable after a crash:
//!
//! - **two databases** (the Raft engine's in `<data_dir>/raft`, until one database per node):
//!   its records are copied into the node's database in one synced batch with a record that
//!   they were ([`RocksStore::absorb_raft_database`]), then the directory is removed; a crash
//!   in between finds the record and only removes it again;
//! - **no cluster state** (a single-node release, before the metadata group): the queues the
//!   back-end holds are proposed into the new cluster's metadata, owned here. The file
//!   [`IMPORT_MARKER`] in the data directory says the import is not finished; it is written
//!   before the node first takes part in Raft and removed once every queue is defined, so a crash
//!   during the import resumes it.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::Context as _;
use ferry_cluster::StartMode;
use ferry_store::{
    Absorbed, GroupCommit, KvOp, KvSpace, MemoryStore, QueueStore, RocksStore, StoreOp,
};

use crate::config::{Config, Storage};
use crate::raft::{IDENTITY_KEY, IMPORT_MARKER, INCARNATION_KEY};

/// The directory of the node's database, under the data directory.
pub const DATABASE_DIR: &str = "queues";
/// The directory of the Raft engine's own database in releases before one database per node.
pub const OLD_RAFT_DIR: &str = "raft";

/// Opens the node's store, upgrading the data directory first where an earlier release wrote it
/// (see the module docs).
pub fn open_store(config: &Config) -> anyhow::Result<Arc<dyn QueueStore>> {
    match config.storage {
        Storage::Memory => Ok(Arc::new(MemoryStore::new())),
        Storage::Rocksdb => {
            let data_dir = &config.data_dir;
            std::fs::create_dir_all(data_dir)
                .with_context(|| format!("cannot create data directory {}", data_dir.display()))?;
            let dir = data_dir.join(DATABASE_DIR);
            let store = RocksStore::open(&dir).map_err(|e| {
                let why = if e.to_string().contains("No space left on device") {
                    "the disk holding it is full: free space on it, then start the node again"
                } else {
                    "is another ferry server using it?"
                };
                anyhow::Error::new(e).context(format!(
                    "cannot open the node's database in {} ({why})",
                    dir.display()
                ))
            })?;
            absorb_old_raft_database(data_dir, &store)?;
            Ok(Arc::new(store))
        }
    }
}

/// Moves the Raft engine's database of an earlier release into the node's (module docs).
pub fn absorb_old_raft_database(data_dir: &Path, store: &RocksStore) -> anyhow::Result<()> {
    let old = data_dir.join(OLD_RAFT_DIR);
    if !old.exists() {
        return Ok(());
    }
    // An import left unfinished by the earlier release goes on from the data directory.
    let old_marker = old.join(IMPORT_MARKER);
    if old_marker.exists() {
        let marker = data_dir.join(IMPORT_MARKER);
        std::fs::copy(&old_marker, &marker).with_context(|| {
            format!(
                "cannot copy {} to {}",
                old_marker.display(),
                marker.display()
            )
        })?;
    }
    let absorbed = store.absorb_raft_database(&old).with_context(|| {
        format!(
            "cannot move the Raft records of {} into the node's database",
            old.display()
        )
    })?;
    std::fs::remove_dir_all(&old).with_context(|| {
        format!(
            "the Raft records of {} are in the node's database now, but the directory cannot be removed: remove it, then start the node again",
            old.display()
        )
    })?;
    match absorbed {
        Absorbed::Copied { keys } => tracing::info!(
            keys,
            dir = %old.display(),
            "one database per node: the Raft records moved into the node's database"
        ),
        Absorbed::Earlier => tracing::info!(
            dir = %old.display(),
            "one database per node: removed the old Raft database, moved in by an earlier start"
        ),
        Absorbed::NoDatabase => {
            tracing::info!(dir = %old.display(), "removed an old Raft directory with no database")
        }
    }
    Ok(())
}

/// The import marker when the back-end's queues are still to be proposed into the metadata
/// (module docs), writing it on the first start of a data directory with queues and no cluster
/// state; `None` when there is nothing to import (or no data directory).
pub fn import_marker(
    config: &Config,
    store: &dyn QueueStore,
    queues_held: usize,
    start: &StartMode,
) -> anyhow::Result<Option<PathBuf>> {
    if config.storage == Storage::Memory {
        return Ok(None);
    }
    let marker = config.data_dir.join(IMPORT_MARKER);
    let member = store.kv_get(KvSpace::RaftApp, IDENTITY_KEY)?.is_some();
    if !member && queues_held > 0 && !marker.exists() {
        anyhow::ensure!(
            matches!(start, StartMode::Initial(_)),
            "the data directory holds {queues_held} queues but no cluster state: a node joins a cluster empty (use another data directory), or start it without --join to keep its queues in a cluster of its own"
        );
        std::fs::write(
            &marker,
            b"queues of a single-node data directory to import\n",
        )
        .with_context(|| format!("cannot write {}", marker.display()))?;
        tracing::info!(
            queues = queues_held,
            "first start with cluster metadata: the queues of this data directory will be imported"
        );
    }
    Ok(marker.exists().then_some(marker))
}

/// The data directory's incarnation: random, drawn and written (synced, through the node's
/// writer) the first time a node of this release starts on it, the same at every start after.
/// The cluster records each node's first one heard and refuses a node that comes back with
/// another: one whose disk was lost, or a node kept in memory (`--memory`) started again.
pub async fn incarnation(store: &dyn QueueStore, writer: &GroupCommit) -> anyhow::Result<u64> {
    if let Some(bytes) = store.kv_get(KvSpace::RaftApp, INCARNATION_KEY)? {
        let id: [u8; 8] = bytes.as_slice().try_into().map_err(|_| {
            anyhow::anyhow!(
                "the data directory's incarnation is {} bytes, not 8: the node's database is damaged",
                bytes.len()
            )
        })?;
        return Ok(u64::from_be_bytes(id));
    }
    let drawn = rand::random::<u64>().max(1);
    let put = StoreOp::Kv(KvOp::Put {
        space: KvSpace::RaftApp,
        key: INCARNATION_KEY.to_vec(),
        value: drawn.to_be_bytes().to_vec(),
    });
    writer
        .submit(vec![put])
        .await?
        .durable()
        .await
        .context("cannot write the data directory's incarnation")?;
    tracing::info!(incarnation = %format!("{drawn:016x}"), "a new data directory: its incarnation drawn");
    Ok(drawn)
}
