//! The RocksDB store.
//!
//! Column families, all keys big-endian so numbers sort:
//! - `queues`: `uid` → queue definition
//! - `messages`: `uid ++ seq` → message
//! - `deliveries`: `uid ++ seq` → delivery count (u32), only for messages delivered at least once
//! - `meta`: `"seq/" ++ uid` → sequence numbers reserved up to (u64)
//! - `dedup`: `uid ++ dedup id` → expiry (u64) ++ seq of the message it produced (u64)

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};

use ferry_kernel::{DedupRecord, PersistOp, QueueUid, RecoveredMessage, Seq};
use rocksdb::{
    ColumnFamily, ColumnFamilyDescriptor, Options, ReadOptions, WriteBatch, WriteOptions, DB,
};

use crate::codec;
use crate::{QueueStore, RecoveredQueue, StoreError, StoreOp};

const CF_QUEUES: &str = "queues";
const CF_MESSAGES: &str = "messages";
const CF_DELIVERIES: &str = "deliveries";
const CF_META: &str = "meta";
const CF_DEDUP: &str = "dedup";

/// See the module docs.
#[derive(Debug)]
pub struct RocksStore {
    db: DB,
    /// Set when a write fails: the in-memory state may now be ahead of the disk, so no further
    /// write is accepted until a restart recovers from what is really there.
    poisoned: AtomicBool,
}

fn io(context: &'static str) -> impl FnOnce(rocksdb::Error) -> StoreError {
    move |e| StoreError::Io {
        context,
        message: e.into_string(),
    }
}

fn msg_key(uid: QueueUid, seq: Seq) -> [u8; 16] {
    let mut k = [0u8; 16];
    k[..8].copy_from_slice(&uid.0.to_be_bytes());
    k[8..].copy_from_slice(&seq.0.to_be_bytes());
    k
}

fn seq_key(uid: QueueUid) -> [u8; 12] {
    let mut k = [0u8; 12];
    k[..4].copy_from_slice(b"seq/");
    k[4..].copy_from_slice(&uid.0.to_be_bytes());
    k
}

fn dedup_key(uid: QueueUid, dedup_id: &str) -> Vec<u8> {
    let mut k = Vec::with_capacity(8 + dedup_id.len());
    k.extend_from_slice(&uid.0.to_be_bytes());
    k.extend_from_slice(dedup_id.as_bytes());
    k
}

fn be_u64(b: &[u8]) -> Option<u64> {
    Some(u64::from_be_bytes(b.try_into().ok()?))
}

impl RocksStore {
    /// Opens (creating if needed) the database in `dir`.
    pub fn open(dir: &Path) -> Result<Self, StoreError> {
        let mut opts = Options::default();
        opts.create_if_missing(true);
        opts.create_missing_column_families(true);
        let cfs = [CF_QUEUES, CF_MESSAGES, CF_DELIVERIES, CF_META, CF_DEDUP]
            .into_iter()
            .map(|name| ColumnFamilyDescriptor::new(name, Options::default()));
        let db = DB::open_cf_descriptors(&opts, dir, cfs).map_err(io("opening the database"))?;
        Ok(Self {
            db,
            poisoned: AtomicBool::new(false),
        })
    }

    fn cf(&self, name: &'static str) -> Result<&ColumnFamily, StoreError> {
        self.db.cf_handle(name).ok_or(StoreError::Corrupt {
            what: "database",
            reason: format!("column family {name} is missing"),
        })
    }

    fn add(&self, batch: &mut WriteBatch, op: &StoreOp) -> Result<(), StoreError> {
        match op {
            StoreOp::PutQueue(def) => {
                batch.put_cf(
                    self.cf(CF_QUEUES)?,
                    def.uid.0.to_be_bytes(),
                    codec::encode_queue(def),
                );
            }
            StoreOp::DeleteQueue(uid) => {
                let (from, to) = (
                    msg_key(*uid, Seq(0)),
                    msg_key(QueueUid(uid.0.wrapping_add(1)), Seq(0)),
                );
                if uid.0 == u64::MAX {
                    // No successor key: delete the last range one key at a time is not worth it;
                    // uids are random and this one is reserved.
                    return Err(StoreError::Corrupt {
                        what: "queue uid",
                        reason: "u64::MAX is reserved".into(),
                    });
                }
                batch.delete_range_cf(self.cf(CF_MESSAGES)?, from, to);
                batch.delete_range_cf(self.cf(CF_DELIVERIES)?, from, to);
                batch.delete_range_cf(
                    self.cf(CF_DEDUP)?,
                    uid.0.to_be_bytes(),
                    (uid.0 + 1).to_be_bytes(),
                );
                batch.delete_cf(self.cf(CF_META)?, seq_key(*uid));
                batch.delete_cf(self.cf(CF_QUEUES)?, uid.0.to_be_bytes());
            }
            StoreOp::Queue { uid, op } => match op {
                PersistOp::PutMessage(m) => {
                    batch.put_cf(
                        self.cf(CF_MESSAGES)?,
                        msg_key(*uid, m.seq),
                        codec::encode_message(m),
                    );
                }
                PersistOp::DeleteMessage(seq) => {
                    batch.delete_cf(self.cf(CF_MESSAGES)?, msg_key(*uid, *seq));
                    batch.delete_cf(self.cf(CF_DELIVERIES)?, msg_key(*uid, *seq));
                }
                PersistOp::SetDeliveryCount { seq, count } => {
                    batch.put_cf(
                        self.cf(CF_DELIVERIES)?,
                        msg_key(*uid, *seq),
                        count.to_be_bytes(),
                    );
                }
                PersistOp::ReserveSeq { until } => {
                    batch.put_cf(self.cf(CF_META)?, seq_key(*uid), until.0.to_be_bytes());
                }
                PersistOp::PutDedup(r) => {
                    batch.put_cf(
                        self.cf(CF_DEDUP)?,
                        dedup_key(*uid, &r.dedup_id),
                        codec::encode_dedup(r.seq, r.expires_ms),
                    );
                }
                PersistOp::DeleteDedup { dedup_id } => {
                    batch.delete_cf(self.cf(CF_DEDUP)?, dedup_key(*uid, dedup_id));
                }
            },
        }
        Ok(())
    }

    fn recover_queue(&self, def: crate::QueueDef) -> Result<RecoveredQueue, StoreError> {
        let uid = def.uid;
        let seq_reserved_until = self
            .db
            .get_cf(self.cf(CF_META)?, seq_key(uid))
            .map_err(io("reading sequence reservations"))?
            .and_then(|v| be_u64(&v))
            .map_or(Seq(1), Seq);
        let bounds = || {
            let mut ro = ReadOptions::default();
            ro.set_iterate_lower_bound(msg_key(uid, Seq(0)).to_vec());
            ro.set_iterate_upper_bound(msg_key(QueueUid(uid.0.saturating_add(1)), Seq(0)).to_vec());
            ro
        };
        let mut counts = std::collections::HashMap::new();
        for item in self.db.iterator_cf_opt(
            self.cf(CF_DELIVERIES)?,
            bounds(),
            rocksdb::IteratorMode::Start,
        ) {
            let (k, v) = item.map_err(io("reading delivery counts"))?;
            let seq = be_u64(&k[8..]).map(Seq);
            let count = <[u8; 4]>::try_from(&v[..]).ok().map(u32::from_be_bytes);
            if let (Some(seq), Some(count)) = (seq, count) {
                counts.insert(seq, count);
            }
        }
        let mut messages = Vec::new();
        for item in self.db.iterator_cf_opt(
            self.cf(CF_MESSAGES)?,
            bounds(),
            rocksdb::IteratorMode::Start,
        ) {
            let (_, v) = item.map_err(io("reading messages"))?;
            let message = codec::decode_message(uid, &v)?;
            let delivery_count = counts.get(&message.seq).copied().unwrap_or(0);
            messages.push(RecoveredMessage {
                message,
                delivery_count,
            });
        }
        let mut dedup = Vec::new();
        let mut ro = ReadOptions::default();
        ro.set_iterate_lower_bound(uid.0.to_be_bytes().to_vec());
        ro.set_iterate_upper_bound(uid.0.saturating_add(1).to_be_bytes().to_vec());
        for item in self
            .db
            .iterator_cf_opt(self.cf(CF_DEDUP)?, ro, rocksdb::IteratorMode::Start)
        {
            let (k, v) = item.map_err(io("reading dedup records"))?;
            let dedup_id = String::from_utf8(k[8..].to_vec()).map_err(|_| StoreError::Corrupt {
                what: "dedup record",
                reason: "the dedup id is not UTF-8".into(),
            })?;
            let (seq, expires_ms) = codec::decode_dedup(&v)?;
            dedup.push(DedupRecord {
                dedup_id,
                seq,
                expires_ms,
            });
        }
        Ok(RecoveredQueue {
            def,
            seq_reserved_until,
            messages,
            dedup,
        })
    }
}

impl QueueStore for RocksStore {
    fn write(&self, batches: &[Vec<StoreOp>]) -> Result<(), StoreError> {
        if self.poisoned.load(Ordering::Acquire) {
            return Err(StoreError::Poisoned);
        }
        let mut batch = WriteBatch::default();
        for op in batches.iter().flatten() {
            self.add(&mut batch, op)?;
        }
        let mut wo = WriteOptions::default();
        wo.set_sync(true);
        self.db.write_opt(batch, &wo).map_err(|e| {
            self.poisoned.store(true, Ordering::Release);
            io("writing a batch")(e)
        })
    }

    fn recover(&self) -> Result<Vec<RecoveredQueue>, StoreError> {
        let mut defs = Vec::new();
        for item in self
            .db
            .iterator_cf(self.cf(CF_QUEUES)?, rocksdb::IteratorMode::Start)
        {
            let (_, v) = item.map_err(io("reading queue definitions"))?;
            defs.push(codec::decode_queue(&v)?);
        }
        defs.into_iter()
            .map(|def| self.recover_queue(def))
            .collect()
    }
}
