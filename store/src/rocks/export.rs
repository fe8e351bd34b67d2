//! A queue shard's data read from one RocksDB snapshot, for a replica that needs it
//! ([`crate::QueueStore::export_shard`]), and the queues a shard's delete removes.

use std::collections::HashSet;

use ferry_kernel::{DedupRecord, PersistOp, QueueUid, Seq, ShardId};
use rocksdb::{DBRawIteratorWithThreadMode, ReadOptions, Snapshot, DB};

use super::keys::{self, seq_key, uid_prefix};
use super::{io, Cfs, RocksStore};
use crate::{codec, ExportBatcher, KvSpace, StoreError, StoreOp};

fn at(snapshot: &Snapshot<'_>) -> ReadOptions {
    let mut ro = ReadOptions::default();
    ro.set_snapshot(snapshot);
    ro
}

/// Read options over one queue's keys (every key starting with its uid) in `snapshot`.
fn queue_range(snapshot: &Snapshot<'_>, uid: QueueUid) -> ReadOptions {
    let mut ro = at(snapshot);
    ro.set_iterate_lower_bound(uid_prefix(uid).to_vec());
    if let Some(end) = keys::prefix_end(&uid_prefix(uid)) {
        ro.set_iterate_upper_bound(end);
    }
    ro
}

fn seq_at(key: &[u8], offset: usize) -> Result<Seq, StoreError> {
    key.get(offset..offset + 8)
        .and_then(keys::be_u64)
        .map(Seq)
        .ok_or_else(|| StoreError::Corrupt {
            what: "queue key",
            reason: format!("a key of {} bytes has no seq at {offset}", key.len()),
        })
}

/// Walks a raw iterator to its end, handing each key and value to `each`.
fn walk(
    mut it: DBRawIteratorWithThreadMode<'_, DB>,
    context: &'static str,
    mut each: impl FnMut(&[u8], &[u8]) -> Result<(), StoreError>,
) -> Result<(), StoreError> {
    it.seek_to_first();
    while let Some((k, v)) = it.item() {
        each(k, v)?;
        it.next();
    }
    it.status().map_err(io(context))
}

impl RocksStore {
    /// The uids of the queues whose definitions name `shard`, as the database holds them now
    /// (what [`StoreOp::DeleteShard`] removes).
    pub(super) fn shard_queues(
        &self,
        cfs: &Cfs<'_>,
        shard: ShardId,
    ) -> Result<Vec<QueueUid>, StoreError> {
        let mut uids = Vec::new();
        walk(
            self.db
                .raw_iterator_cf_opt(cfs.queues, ReadOptions::default()),
            "reading queue definitions",
            |_, v| {
                let def = codec::decode_queue(v)?;
                if def.replica.is_some_and(|r| r.shard == shard) {
                    uids.push(def.uid);
                }
                Ok(())
            },
        )?;
        Ok(uids)
    }

    pub(super) fn export(
        &self,
        shard: ShardId,
        app_key: &[u8],
        batch_bytes: usize,
        sink: &mut dyn FnMut(Vec<StoreOp>) -> Result<(), StoreError>,
    ) -> Result<Option<Vec<u8>>, StoreError> {
        let cfs = self.cfs()?;
        let snapshot = self.db.snapshot();
        let app_value = self
            .db
            .get_cf_opt(cfs.kv(KvSpace::RaftApp), app_key, &at(&snapshot))
            .map_err(io("reading a shard's applied position"))?;
        let mut out = ExportBatcher::new(batch_bytes, sink);
        let mut defs = Vec::new();
        walk(
            self.db.raw_iterator_cf_opt(cfs.queues, at(&snapshot)),
            "reading queue definitions",
            |_, v| {
                let def = codec::decode_queue(v)?;
                if def.replica.is_some_and(|r| r.shard == shard) {
                    defs.push(def);
                }
                Ok(())
            },
        )?;
        for def in defs {
            let uid = def.uid;
            out.push(StoreOp::PutQueue(def))?;
            self.export_queue(&cfs, &snapshot, uid, &mut out)?;
        }
        out.finish()?;
        Ok(app_value)
    }

    /// One queue's sequence reservation, dedup records, messages and the delivery records of
    /// the messages it holds (a delivery record left by a range delete is not copied).
    fn export_queue(
        &self,
        cfs: &Cfs<'_>,
        snapshot: &Snapshot<'_>,
        uid: QueueUid,
        out: &mut ExportBatcher<'_>,
    ) -> Result<(), StoreError> {
        let queue_op = |op| StoreOp::Queue { uid, op };
        let reserved = self
            .db
            .get_cf_opt(cfs.meta, seq_key(uid), &at(snapshot))
            .map_err(io("reading sequence reservations"))?;
        if let Some(until) = reserved.as_deref().and_then(keys::be_u64) {
            out.push(queue_op(PersistOp::ReserveSeq { until: Seq(until) }))?;
        }
        walk(
            self.db
                .raw_iterator_cf_opt(cfs.dedup, queue_range(snapshot, uid)),
            "reading dedup records",
            |k, v| {
                let dedup_id =
                    String::from_utf8(k[8..].to_vec()).map_err(|_| StoreError::Corrupt {
                        what: "dedup record",
                        reason: "the dedup id is not UTF-8".into(),
                    })?;
                let (seq, expires_ms) = codec::decode_dedup(v)?;
                out.push(queue_op(PersistOp::PutDedup(DedupRecord {
                    dedup_id,
                    seq,
                    expires_ms,
                })))
            },
        )?;
        let mut held = HashSet::new();
        walk(
            self.db
                .raw_iterator_cf_opt(cfs.messages, queue_range(snapshot, uid)),
            "reading messages",
            |_, v| {
                let m = codec::decode_message(uid, v)?;
                held.insert(m.seq);
                out.push(queue_op(PersistOp::PutMessage(std::sync::Arc::new(m))))
            },
        )?;
        walk(
            self.db
                .raw_iterator_cf_opt(cfs.deliveries, queue_range(snapshot, uid)),
            "reading delivery records",
            |k, v| {
                let seq = seq_at(k, 8)?;
                if !held.contains(&seq) {
                    return Ok(());
                }
                let (count, mark) = codec::decode_delivery(v)?;
                out.push(queue_op(match mark {
                    Some(mark) => PersistOp::MarkDelivery { seq, count, mark },
                    None => PersistOp::SetDeliveryCount { seq, count },
                }))
            },
        )
    }
}
