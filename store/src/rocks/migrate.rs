//! Moving a database written before paging (messages in `messages`, keyed `uid ++ seq`) into the
//! paging layout.

use std::path::Path;

use ferry_kernel::{QueueUid, RecoveredMessage};
use rocksdb::{ColumnFamilyDescriptor, Options, WriteBatch, WriteOptions, DB};

use super::keys::{self, delivery_key};
use super::{cf, io, Cfs, CF_DEDUP, CF_DELIVERIES, CF_META, CF_OLD_MESSAGES, CF_QUEUES};
use crate::{codec, QueueDef, StoreError};

/// Each synced write of the migration carries about this many bytes.
const BATCH_BYTES: usize = 4 * 1024 * 1024;

/// Moves every message of `messages` into `queue_messages` with its count, index entries and
/// delayed entry, deleting it from `messages` in the same batch: a crash part-way leaves each
/// message in exactly one place, and the next opening moves the rest. Returns how many were moved.
pub(super) fn move_old_messages(db: &DB) -> Result<u64, StoreError> {
    let cfs = Cfs::of(db)?;
    let old = cf(db, CF_OLD_MESSAGES)?;
    let mut wo = WriteOptions::default();
    wo.set_sync(true);
    // One iterator for the whole move: it reads the snapshot taken when it was made, so the
    // deletes written behind it are never walked.
    let mut it = db.raw_iterator_cf(old);
    it.seek_to_first();
    let (mut batch, mut moved) = (WriteBatch::default(), 0u64);
    while let Some((k, v)) = it.item() {
        let uid = k
            .get(..8)
            .and_then(keys::be_u64)
            .map(QueueUid)
            .ok_or_else(|| StoreError::Corrupt {
                what: "pre-paging message key",
                reason: format!("{} bytes instead of 16", k.len()),
            })?;
        cfs.put_message(&mut batch, uid, &codec::decode_message(uid, v)?);
        batch.delete_cf(old, k);
        moved += 1;
        if batch.size_in_bytes() >= BATCH_BYTES {
            db.write_opt(std::mem::take(&mut batch), &wo)
                .map_err(io("moving messages to the paging layout"))?;
        }
        it.next();
    }
    it.status()
        .map_err(io("reading messages in the pre-paging layout"))?;
    if !batch.is_empty() {
        db.write_opt(batch, &wo)
            .map_err(io("moving messages to the paging layout"))?;
    }
    Ok(moved)
}

/// Writes a database in the layout used before paging (column families `queues`, `messages`,
/// `deliveries`, `meta`, `dedup`, with default options), for tests of the migration. Queue
/// definitions are written in the current format (older ones still decode).
#[doc(hidden)]
pub fn write_pre_paging_database(
    dir: &Path,
    queues: &[QueueDef],
    messages: &[(QueueUid, RecoveredMessage)],
) -> Result<(), StoreError> {
    let mut opts = Options::default();
    opts.create_if_missing(true);
    opts.create_missing_column_families(true);
    let cfs = [CF_QUEUES, CF_OLD_MESSAGES, CF_DELIVERIES, CF_META, CF_DEDUP]
        .map(|name| ColumnFamilyDescriptor::new(name, Options::default()));
    let db = DB::open_cf_descriptors(&opts, dir, cfs).map_err(io("opening the database"))?;
    let mut batch = WriteBatch::default();
    for q in queues {
        batch.put_cf(
            cf(&db, CF_QUEUES)?,
            keys::uid_prefix(q.uid),
            codec::encode_queue(q),
        );
    }
    for (uid, m) in messages {
        let key = delivery_key(*uid, m.message.seq);
        batch.put_cf(
            cf(&db, CF_OLD_MESSAGES)?,
            key,
            codec::encode_message(&m.message),
        );
        if m.delivery_count > 0 {
            batch.put_cf(cf(&db, CF_DELIVERIES)?, key, m.delivery_count.to_be_bytes());
        }
    }
    db.write(batch).map_err(io("writing a batch"))
}
