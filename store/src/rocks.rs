//! The RocksDB store.
//!
//! Column families, numbers big-endian so keys sort by them; `rank` is `9 - priority`, so higher
//! priorities sort first:
//! - `queues`: `uid` → queue definition
//! - `queue_messages`: `uid ++ rank ++ seq` → message. One queue's messages sort in delivery
//!   order and each priority is one contiguous run, read by `read_page` within exact bounds.
//! - `deliveries`: `uid ++ seq` → delivery count (u32), only for messages delivered at least once
//! - `counts`: `uid ++ priority` → message count (i64) ++ bytes (i64), changed by merges of signed
//!   deltas in the same batch as the messages they count
//! - `header_index`: `uid ++ kind ++ len (u16) ++ value ++ rank ++ seq` → empty; kind 0 is the
//!   correlation id, 1 the group id; one value's entries sort in delivery order. Values longer
//!   than 65,535 bytes are indexed by their first 65,535 bytes.
//! - `meta`: `"seq/" ++ uid` → sequence numbers reserved up to (u64)
//! - `dedup`: `uid ++ dedup id` → expiry (u64) ++ seq of the message it produced (u64)
//! - `delayed`: `uid ++ deliver_at_ms ++ seq` → priority (u8), for each message with a delivery
//!   time, written and deleted with it. Entries whose time has passed stay until their message is
//!   deleted; `read_delayed` starts its range after a time, so it never walks them.
//!
//! `DeleteStored` deletes a range of one priority's messages without reading them, so their
//! `header_index`, `delayed` and `deliveries` entries stay behind (orphans) until the queue is
//! deleted. Reads skip them: an index or delayed entry counts only if its message exists, and a
//! delivery count is only looked up for a message that exists (sequence numbers are never
//! reused). `deliveries` cannot be range-deleted: it is keyed by seq alone, so a range would take
//! other priorities' counts; `delayed` is keyed by time, so a range of seqs is no range of it.
//!
//! Databases written before paging kept messages in `messages` (`uid ++ seq`); opening one moves
//! them into `queue_messages`, building their counts, index and delayed entries, then drops
//! `messages`.

mod absorb;
mod export;
mod keys;
mod migrate;
mod options;
mod read;

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};

use ferry_kernel::{
    DedupRecord, IndexedHeader, Message, PersistOp, Priority, QueueUid, RecoveredMessage, Seq,
    ShardId,
};
use rocksdb::{ColumnFamily, ReadOptions, WriteBatch, WriteOptions, DB};

use crate::message_keys::KeysRef;
use crate::{codec, INDEXED_HEADERS, PRIORITY_LEVELS};
use crate::{KeyValue, KvOp, KvSpace};
use crate::{Page, QueueDef, QueueStore, RecoveredQueue, StoreError, StoreOp, StoredLevel};
pub use absorb::{split_raft_database_out, Absorbed};
use keys::{
    counts_key, dedup_key, delayed_key, delivery_key, index_key, message_key, seq_key, uid_prefix,
};
pub use migrate::write_pre_paging_database;

const CF_QUEUES: &str = "queues";
const CF_QUEUE_MESSAGES: &str = "queue_messages";
const CF_DELIVERIES: &str = "deliveries";
const CF_COUNTS: &str = "counts";
const CF_HEADER_INDEX: &str = "header_index";
const CF_META: &str = "meta";
const CF_DEDUP: &str = "dedup";
const CF_DELAYED: &str = "delayed";
/// Every column family of the queues, in the order `dump` lists them.
const QUEUE_CFS: [&str; 8] = [
    CF_QUEUES,
    CF_QUEUE_MESSAGES,
    CF_DELIVERIES,
    CF_COUNTS,
    CF_HEADER_INDEX,
    CF_META,
    CF_DEDUP,
    CF_DELAYED,
];
/// Messages before paging, keyed `uid ++ seq`; only opened to be migrated.
const CF_OLD_MESSAGES: &str = "messages";

/// A key of [`RocksStore::dump`]: its column family, key and value.
#[doc(hidden)]
pub type DumpedKey = (&'static str, Box<[u8]>, Box<[u8]>);

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

fn signed(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// The column families, looked up once per operation.
struct Cfs<'a> {
    queues: &'a ColumnFamily,
    messages: &'a ColumnFamily,
    deliveries: &'a ColumnFamily,
    counts: &'a ColumnFamily,
    index: &'a ColumnFamily,
    meta: &'a ColumnFamily,
    dedup: &'a ColumnFamily,
    delayed: &'a ColumnFamily,
    raft_log: &'a ColumnFamily,
    raft_app: &'a ColumnFamily,
}

fn cf<'a>(db: &'a DB, name: &'static str) -> Result<&'a ColumnFamily, StoreError> {
    db.cf_handle(name).ok_or(StoreError::Corrupt {
        what: "database",
        reason: format!("column family {name} is missing"),
    })
}

impl<'a> Cfs<'a> {
    fn of(db: &'a DB) -> Result<Self, StoreError> {
        Ok(Self {
            queues: cf(db, CF_QUEUES)?,
            messages: cf(db, CF_QUEUE_MESSAGES)?,
            deliveries: cf(db, CF_DELIVERIES)?,
            counts: cf(db, CF_COUNTS)?,
            index: cf(db, CF_HEADER_INDEX)?,
            meta: cf(db, CF_META)?,
            dedup: cf(db, CF_DEDUP)?,
            delayed: cf(db, CF_DELAYED)?,
            raft_log: cf(db, KvSpace::RaftLog.column_family())?,
            raft_app: cf(db, KvSpace::RaftApp.column_family())?,
        })
    }

    fn kv(&self, space: KvSpace) -> &'a ColumnFamily {
        match space {
            KvSpace::RaftLog => self.raft_log,
            KvSpace::RaftApp => self.raft_app,
        }
    }

    fn add_kv(&self, batch: &mut WriteBatch, op: &KvOp) {
        match op {
            KvOp::Put { space, key, value } => batch.put_cf(self.kv(*space), key, value),
            KvOp::Delete { space, key } => batch.delete_cf(self.kv(*space), key),
            KvOp::DeleteRange { space, from, to } => {
                batch.delete_range_cf(self.kv(*space), from, to)
            }
        }
    }

    /// A message, its count, its index entries and its delayed entry, in one batch (also used by
    /// the migration).
    fn put_message(&self, batch: &mut WriteBatch, uid: QueueUid, m: &Message) {
        let key = message_key(uid, m.priority, m.seq);
        batch.put_cf(self.messages, key, codec::encode_message(m));
        let delta = codec::encode_counts(1, signed(m.size_bytes()));
        batch.merge_cf(self.counts, counts_key(uid, m.priority), delta);
        for h in INDEXED_HEADERS {
            if let Some(v) = h.value_of(m) {
                batch.put_cf(self.index, index_key(uid, h, v, m.priority, m.seq), []);
            }
        }
        if let Some(at_ms) = m.deliver_at_ms {
            let key = delayed_key(uid, at_ms, m.seq);
            batch.put_cf(self.delayed, key, [m.priority.get()]);
        }
    }

    fn delete_message(&self, batch: &mut WriteBatch, uid: QueueUid, m: KeysRef<'_>) {
        batch.delete_cf(self.messages, message_key(uid, m.priority, m.seq));
        batch.delete_cf(self.deliveries, delivery_key(uid, m.seq));
        let delta = codec::encode_counts(-1, -signed(m.size_bytes));
        batch.merge_cf(self.counts, counts_key(uid, m.priority), delta);
        for h in INDEXED_HEADERS {
            if let Some(v) = m.header(h) {
                batch.delete_cf(self.index, index_key(uid, h, v, m.priority, m.seq));
            }
        }
        if let Some(at_ms) = m.deliver_at_ms {
            batch.delete_cf(self.delayed, delayed_key(uid, at_ms, m.seq));
        }
    }

    fn delete_queue(&self, batch: &mut WriteBatch, uid: QueueUid) -> Result<(), StoreError> {
        let Some(end) = keys::prefix_end(&uid_prefix(uid)) else {
            // No 8-byte key follows it, and uids are random: this one is simply reserved.
            return Err(StoreError::Corrupt {
                what: "queue uid",
                reason: "u64::MAX is reserved".into(),
            });
        };
        let from = uid_prefix(uid);
        for cf in [
            self.messages,
            self.deliveries,
            self.counts,
            self.index,
            self.dedup,
            self.delayed,
        ] {
            batch.delete_range_cf(cf, &from[..], &end[..]);
        }
        batch.delete_cf(self.meta, seq_key(uid));
        batch.delete_cf(self.queues, from);
        Ok(())
    }

    fn add(&self, batch: &mut WriteBatch, op: &StoreOp) -> Result<(), StoreError> {
        match op {
            StoreOp::PutQueue(def) => {
                batch.put_cf(self.queues, uid_prefix(def.uid), codec::encode_queue(def));
            }
            StoreOp::DeleteQueue(uid) => self.delete_queue(batch, *uid)?,
            StoreOp::Queue { uid, op } => self.add_queue_op(batch, *uid, op),
            StoreOp::DeleteMessage { uid, keys } => {
                self.delete_message(batch, *uid, KeysRef::of_keys(keys));
            }
            StoreOp::Kv(op) => self.add_kv(batch, op),
            StoreOp::DeleteShard(_) => {
                return Err(StoreError::Corrupt {
                    what: "batch",
                    reason: "invariant: a shard's delete is resolved before its batch is built"
                        .into(),
                })
            }
        }
        Ok(())
    }

    fn add_queue_op(&self, batch: &mut WriteBatch, uid: QueueUid, op: &PersistOp) {
        match op {
            PersistOp::PutMessage(m) => self.put_message(batch, uid, m),
            PersistOp::DeleteMessage(m) => self.delete_message(batch, uid, KeysRef::of_message(m)),
            PersistOp::DeleteStored {
                priority,
                from,
                to,
                count,
                bytes,
            } => {
                if from < to {
                    let (lo, hi) = (
                        message_key(uid, *priority, *from),
                        message_key(uid, *priority, *to),
                    );
                    batch.delete_range_cf(self.messages, lo, hi);
                }
                let delta = codec::encode_counts(-signed(*count), -signed(*bytes));
                batch.merge_cf(self.counts, counts_key(uid, *priority), delta);
            }
            PersistOp::SetDeliveryCount { seq, count } => {
                batch.put_cf(
                    self.deliveries,
                    delivery_key(uid, *seq),
                    count.to_be_bytes(),
                );
            }
            PersistOp::MarkDelivery { seq, count, mark } => {
                batch.put_cf(
                    self.deliveries,
                    delivery_key(uid, *seq),
                    codec::encode_delivery(*count, mark),
                );
            }
            PersistOp::ReserveSeq { until } => {
                batch.put_cf(self.meta, seq_key(uid), until.0.to_be_bytes());
            }
            PersistOp::PutDedup(r) => {
                batch.put_cf(
                    self.dedup,
                    dedup_key(uid, &r.dedup_id),
                    codec::encode_dedup(r.seq, r.expires_ms),
                );
            }
            PersistOp::DeleteDedup { dedup_id } => {
                batch.delete_cf(self.dedup, dedup_key(uid, dedup_id));
            }
        }
    }
}

impl RocksStore {
    /// Opens (creating if needed) the database in `dir`, moving messages of a database written
    /// before paging into the current layout first.
    pub fn open(dir: &Path) -> Result<Self, StoreError> {
        let mut opts = options::db_options();
        if crate::faults::on(crate::faults::POWER_LOSS) {
            tracing::warn!("fault injection: unsynced writes stay in this process until a sync, and are lost at a crash");
            opts.set_manual_wal_flush(true);
        }
        // RocksDB must open every column family a database has; a new database has none yet.
        let old_layout =
            DB::list_cf(&opts, dir).is_ok_and(|cfs| cfs.iter().any(|name| name == CF_OLD_MESSAGES));
        let mut db = DB::open_cf_descriptors(&opts, dir, options::column_families(old_layout))
            .map_err(io("opening the database"))?;
        if old_layout {
            let moved = migrate::move_old_messages(&db)?;
            db.drop_cf(CF_OLD_MESSAGES)
                .map_err(io("dropping the pre-paging messages"))?;
            tracing::info!(moved, "moved messages to the paging layout");
        }
        Ok(Self {
            db,
            poisoned: AtomicBool::new(false),
        })
    }

    fn cfs(&self) -> Result<Cfs<'_>, StoreError> {
        Cfs::of(&self.db)
    }

    /// Every key and value of every column family, in key order: for tests that compare two
    /// stores byte for byte (a replica and the store it replicates).
    #[doc(hidden)]
    pub fn dump(&self) -> Result<Vec<DumpedKey>, StoreError> {
        let kv = [
            KvSpace::RaftLog.column_family(),
            KvSpace::RaftApp.column_family(),
        ];
        let mut all = Vec::new();
        for name in QUEUE_CFS.into_iter().chain(kv) {
            let mut ro = ReadOptions::default();
            ro.set_total_order_seek(true);
            let iter =
                self.db
                    .iterator_cf_opt(cf(&self.db, name)?, ro, rocksdb::IteratorMode::Start);
            for item in iter {
                let (k, v) = item.map_err(io("dumping the database"))?;
                all.push((name, k, v));
            }
        }
        Ok(all)
    }

    fn recover_queue(&self, cfs: &Cfs<'_>, def: QueueDef) -> Result<RecoveredQueue, StoreError> {
        let uid = def.uid;
        let seq_reserved_until = self
            .db
            .get_cf(cfs.meta, seq_key(uid))
            .map_err(io("reading sequence reservations"))?
            .and_then(|v| keys::be_u64(&v))
            .map_or(Seq(1), Seq);
        let mut stored = [StoredLevel::default(); PRIORITY_LEVELS];
        let count_keys: Vec<_> = (0..=Priority::MAX)
            .filter_map(|p| Priority::new(p.into()).ok())
            .map(|p| counts_key(uid, p))
            .collect();
        let counts = self.db.batched_multi_get_cf(cfs.counts, &count_keys, true);
        for (level, got) in stored.iter_mut().zip(counts) {
            if let Some(v) = got.map_err(io("reading message counts"))? {
                *level = codec::decode_counts(&v)?;
            }
        }
        Ok(RecoveredQueue {
            def,
            seq_reserved_until,
            stored,
            dedup: self.recover_dedup(cfs, uid)?,
        })
    }

    fn recover_dedup(&self, cfs: &Cfs<'_>, uid: QueueUid) -> Result<Vec<DedupRecord>, StoreError> {
        let mut ro = ReadOptions::default();
        ro.set_iterate_lower_bound(uid_prefix(uid));
        if let Some(end) = keys::prefix_end(&uid_prefix(uid)) {
            ro.set_iterate_upper_bound(end);
        }
        // Every record of the queue shares its uid prefix (the column family's prefix extractor).
        ro.set_prefix_same_as_start(true);
        let mut dedup = Vec::new();
        for item in self
            .db
            .iterator_cf_opt(cfs.dedup, ro, rocksdb::IteratorMode::Start)
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
        Ok(dedup)
    }
}

/// About what `op` adds to a write batch: its keys, values and record headers (a message's
/// encoding adds its headers to its content; a few index keys may come with it).
fn estimated_batch_bytes(op: &StoreOp) -> usize {
    const OVERHEAD: usize = 128;
    let content = match op {
        StoreOp::Queue {
            op: PersistOp::PutMessage(m),
            ..
        } => usize::try_from(m.size_bytes()).unwrap_or(0),
        StoreOp::Kv(KvOp::Put { key, value, .. }) => key.len() + value.len(),
        _ => 0,
    };
    content + OVERHEAD
}

impl RocksStore {
    /// One atomic batch, synced or not.
    fn write_batches(&self, batches: &[Vec<StoreOp>], sync: bool) -> Result<(), StoreError> {
        self.check_poisoned()?;
        let cfs = self.cfs()?;
        // Sized once: grown as it fills, a batch of large entries was copied again at every
        // doubling, into fresh pages each time.
        let estimate: usize = batches.iter().flatten().map(estimated_batch_bytes).sum();
        let mut batch = WriteBatch::with_capacity_bytes(estimate);
        for op in batches.iter().flatten() {
            if let StoreOp::DeleteShard(shard) = op {
                for uid in self.shard_queues(&cfs, *shard)? {
                    cfs.delete_queue(&mut batch, uid)?;
                }
                continue;
            }
            cfs.add(&mut batch, op)?;
        }
        let mut wo = WriteOptions::default();
        wo.set_sync(sync && !crate::faults::on(crate::faults::CONFIRM_BEFORE_DURABLE));
        self.poison_on_error("writing a batch", self.db.write_opt(batch, &wo))
    }

    fn check_poisoned(&self) -> Result<(), StoreError> {
        if self.poisoned.load(Ordering::Acquire) {
            return Err(StoreError::Poisoned);
        }
        Ok(())
    }

    /// A failed write or log sync leaves the disk behind memory: no write is accepted after it.
    fn poison_on_error(
        &self,
        context: &'static str,
        result: Result<(), rocksdb::Error>,
    ) -> Result<(), StoreError> {
        result.map_err(|e| {
            if !self.poisoned.swap(true, Ordering::AcqRel) {
                tracing::error!(
                    error = %e,
                    context,
                    "the store failed a write and takes no more until the node restarts: the node stops; fix the cause (free disk space, a failing disk), then start it again; nothing confirmed is lost"
                );
            }
            io(context)(e)
        })
    }
}

impl QueueStore for RocksStore {
    fn poisoned(&self) -> bool {
        self.poisoned.load(Ordering::Acquire)
    }

    fn write(&self, batches: &[Vec<StoreOp>]) -> Result<(), StoreError> {
        self.write_batches(batches, true)
    }

    fn write_unsynced(&self, batches: &[Vec<StoreOp>]) -> Result<(), StoreError> {
        self.write_batches(batches, false)
    }

    fn sync(&self) -> Result<(), StoreError> {
        self.check_poisoned()?;
        if crate::faults::on(crate::faults::CONFIRM_BEFORE_DURABLE) {
            return Ok(());
        }
        self.poison_on_error("syncing the write-ahead log", self.db.flush_wal(true))
    }

    fn kv_get(&self, space: KvSpace, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        let cfs = self.cfs()?;
        self.db
            .get_cf(cfs.kv(space), key)
            .map_err(io("reading a Raft key"))
    }

    fn kv_scan(&self, space: KvSpace, prefix: &[u8]) -> Result<Vec<KeyValue>, StoreError> {
        let cfs = self.cfs()?;
        let mut ro = ReadOptions::default();
        ro.set_iterate_lower_bound(prefix.to_vec());
        if let Some(end) = keys::prefix_end(prefix) {
            ro.set_iterate_upper_bound(end);
        }
        self.db
            .iterator_cf_opt(cfs.kv(space), ro, rocksdb::IteratorMode::Start)
            .map(|item| {
                item.map(|(k, v)| (k.into_vec(), v.into_vec()))
                    .map_err(io("reading Raft keys"))
            })
            .collect()
    }

    fn recover(&self) -> Result<Vec<RecoveredQueue>, StoreError> {
        self.recover_where(&|_| true)
    }

    fn recover_where(
        &self,
        keep: &dyn Fn(&QueueDef) -> bool,
    ) -> Result<Vec<RecoveredQueue>, StoreError> {
        let cfs = self.cfs()?;
        let mut defs = Vec::new();
        for item in self
            .db
            .iterator_cf(cfs.queues, rocksdb::IteratorMode::Start)
        {
            let (_, v) = item.map_err(io("reading queue definitions"))?;
            let def = codec::decode_queue(&v)?;
            if keep(&def) {
                defs.push(def);
            }
        }
        defs.into_iter()
            .map(|def| self.recover_queue(&cfs, def))
            .collect()
    }

    fn read_page(
        &self,
        uid: QueueUid,
        priority: Priority,
        from: Seq,
        upto: Seq,
        max_count: usize,
        max_bytes: u64,
    ) -> Result<Page, StoreError> {
        self.page(uid, priority, from, upto, max_count, max_bytes)
    }

    fn find_by_header(
        &self,
        uid: QueueUid,
        header: IndexedHeader,
        value: &str,
        max: usize,
    ) -> Result<Vec<(Priority, Seq)>, StoreError> {
        self.by_header(uid, header, value, max)
    }

    fn read_messages(
        &self,
        uid: QueueUid,
        keys: &[(Priority, Seq)],
    ) -> Result<Vec<RecoveredMessage>, StoreError> {
        self.messages_at(uid, keys)
    }

    fn find_message(
        &self,
        uid: QueueUid,
        seq: Seq,
    ) -> Result<Option<RecoveredMessage>, StoreError> {
        self.message_by_seq(uid, seq)
    }

    fn read_delayed(
        &self,
        uid: QueueUid,
        after_ms: u64,
    ) -> Result<Vec<RecoveredMessage>, StoreError> {
        self.delayed_after(uid, after_ms)
    }

    fn read_marked(&self, uid: QueueUid) -> Result<Vec<RecoveredMessage>, StoreError> {
        self.marked(uid)
    }

    fn export_shard(
        &self,
        shard: ShardId,
        app_key: &[u8],
        batch_bytes: usize,
        sink: &mut dyn FnMut(Vec<StoreOp>) -> Result<(), StoreError>,
    ) -> Result<Option<Vec<u8>>, StoreError> {
        self.export(shard, app_key, batch_bytes, sink)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::sync::Arc;

    use ferry_kernel::{MessageId, QueueConfig, QueueName};

    use super::*;

    /// Moves everything out of the memtables into table files and compacts them, so reads go
    /// through bloom filters, prefix extractors and merges done by compaction.
    fn flush_and_compact(s: &RocksStore) {
        for name in QUEUE_CFS {
            let cf = s.db.cf_handle(name).unwrap();
            s.db.flush_cf(cf).unwrap();
            s.db.compact_range_cf(cf, None::<&[u8]>, None::<&[u8]>);
        }
    }

    fn message(uid: u64, p: u32, seq: u64, corr: &str) -> Message {
        Message {
            id: MessageId::new(QueueUid(uid), Seq(seq)),
            seq: Seq(seq),
            body: vec![7; seq as usize].into(),
            properties: Default::default(),
            correlation_id: Some(corr.to_string()),
            reply_to: None,
            jms_type: None,
            priority: Priority::new(p).unwrap(),
            timestamp_ms: seq,
            expiration_ms: None,
            deliver_at_ms: (seq % 4 == 1).then_some(10_000 - seq),
            persistent: true,
            dedup_id: None,
            group_id: Some(format!("g{}", seq % 2)),
        }
    }

    fn queue_op(uid: u64, op: PersistOp) -> StoreOp {
        StoreOp::Queue {
            uid: QueueUid(uid),
            op,
        }
    }

    /// Filters, the custom prefix extractor and the counts merge operator are only exercised
    /// once data leaves the memtable; reads must give the same answers from table files.
    #[test]
    fn reads_agree_after_flush_and_compaction() {
        let dir = tempfile::tempdir().unwrap();
        let s = RocksStore::open(dir.path()).unwrap();
        let mut ops = vec![];
        for uid in [1, 2] {
            ops.push(StoreOp::PutQueue(QueueDef {
                name: QueueName::new(format!("q{uid}")).unwrap(),
                uid: QueueUid(uid),
                replica: None,
                config: QueueConfig::default(),
            }));
            ops.push(queue_op(
                uid,
                PersistOp::PutDedup(DedupRecord {
                    dedup_id: format!("d{uid}"),
                    seq: Seq(1),
                    expires_ms: 9,
                }),
            ));
        }
        let messages: Vec<Message> = (1..=200)
            .map(|seq| message(1, (seq % 10) as u32, seq, &format!("c{}", seq % 7)))
            .collect();
        ops.extend(
            messages
                .iter()
                .map(|m| queue_op(1, PersistOp::PutMessage(Arc::new(m.clone())))),
        );
        s.write(&[ops]).unwrap();
        flush_and_compact(&s);
        // Deltas on top of compacted counts, in the memtable and then in a second table file.
        s.write(&[vec![
            queue_op(1, PersistOp::DeleteMessage(Arc::new(messages[0].clone()))),
            queue_op(
                1,
                PersistOp::SetDeliveryCount {
                    seq: Seq(11),
                    count: 4,
                },
            ),
        ]])
        .unwrap();
        flush_and_compact(&s);
        let p1 = Priority::new(1).unwrap();
        let got = s.recover().unwrap();
        let q1 = got.iter().find(|q| q.def.uid == QueueUid(1)).unwrap();
        let level1: Vec<&Message> = messages[1..].iter().filter(|m| m.priority == p1).collect();
        assert_eq!(
            q1.stored[1],
            StoredLevel {
                count: level1.len() as u64,
                bytes: level1.iter().map(|m| m.size_bytes()).sum(),
            }
        );
        assert_eq!(q1.dedup.len(), 1);
        assert_eq!(q1.dedup[0].dedup_id, "d1", "only this queue's records");
        let page = s
            .read_page(QueueUid(1), p1, Seq(0), Seq(u64::MAX), 3, u64::MAX)
            .unwrap();
        let seqs: Vec<u64> = page.messages.iter().map(|m| m.message.seq.0).collect();
        assert_eq!(seqs, [11, 21, 31]);
        assert_eq!(page.messages[0].delivery_count, 4);
        let c3 = s
            .find_by_header(QueueUid(1), IndexedHeader::CorrelationId, "c3", 1_000)
            .unwrap();
        let mut want: Vec<(Priority, Seq)> = messages
            .iter()
            .filter(|m| m.correlation_id.as_deref() == Some("c3"))
            .map(|m| (m.priority, m.seq))
            .collect();
        want.sort_by_key(|&(p, seq)| (std::cmp::Reverse(p), seq));
        assert_eq!(c3, want);
        let none = s
            .find_by_header(QueueUid(1), IndexedHeader::CorrelationId, "c77", 10)
            .unwrap();
        assert!(none.is_empty());
        let g1 = s
            .find_by_header(QueueUid(1), IndexedHeader::GroupId, "g1", 1_000)
            .unwrap();
        assert_eq!(g1.len(), 99, "the odd seqs but the deleted one");
        assert_eq!(
            s.find_message(QueueUid(1), Seq(57))
                .unwrap()
                .unwrap()
                .message,
            messages[56]
        );
        assert!(s.find_message(QueueUid(1), Seq(1)).unwrap().is_none());
        let delayed = |uid, after_ms| -> Vec<u64> {
            let got = s.read_delayed(QueueUid(uid), after_ms).unwrap();
            got.iter().map(|m| m.message.seq.0).collect()
        };
        // Seq 1 (the deleted message) took its entry with it; later seqs are due sooner.
        let want: Vec<u64> = (5..=200).rev().filter(|seq| seq % 4 == 1).collect();
        assert_eq!(delayed(1, 0), want);
        assert_eq!(delayed(1, 10_000 - 9), [5]);
        assert!(delayed(2, 0).is_empty());
    }
}
