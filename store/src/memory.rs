//! A store in memory: the same contract as RocksDB, without the disk, kept the same way (messages
//! in delivery order, per-priority counts changed by deltas, a header index and delayed entries
//! that `DeleteStored` leaves orphans in). Clones share state, so a test can "reopen" it.

use std::collections::{BTreeMap, BTreeSet};
use std::ops::Bound;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use ferry_kernel::{
    DedupRecord, DeliveryMark, IndexedHeader, Message, PersistOp, Priority, QueueUid,
    RecoveredMessage, Seq, ShardId,
};

use crate::message_keys::KeysRef;
use crate::{codec, header_kind, priorities_high_first, priority_of_rank, rank, INDEXED_HEADERS};
use crate::{
    ExportBatcher, Page, QueueDef, QueueStore, RecoveredQueue, StoreError, StoreOp, PRIORITY_LEVELS,
};
use crate::{KeyValue, KvOp, KvSpace};

/// `(uid, rank, seq)`: a queue's messages in delivery order, like the RocksDB keys.
type MessageKey = (QueueUid, u8, Seq);
/// `(uid, header kind, value, rank, seq)`.
type IndexKey = (QueueUid, u8, String, u8, Seq);

#[derive(Debug, Default)]
struct State {
    queues: BTreeMap<QueueUid, QueueDef>,
    messages: BTreeMap<MessageKey, Message>,
    /// Delivery count and mark (a replicated queue's, see `DeliveryMark`) per message.
    delivery_counts: BTreeMap<(QueueUid, Seq), (u32, Option<DeliveryMark>)>,
    /// Per priority: message count and bytes, as signed totals of the deltas written.
    counts: BTreeMap<(QueueUid, u8), (i64, i64)>,
    index: BTreeSet<IndexKey>,
    /// `(uid, deliver_at_ms, seq)` → priority, for messages with a delivery time.
    delayed: BTreeMap<(QueueUid, u64, Seq), Priority>,
    seq_reserved: BTreeMap<QueueUid, Seq>,
    dedup: BTreeMap<(QueueUid, String), (Seq, u64)>,
    /// The key spaces kept for other parts of the node.
    kv: BTreeMap<KvSpace, BTreeMap<Vec<u8>, Vec<u8>>>,
}

/// See the module docs.
#[derive(Debug, Clone, Default)]
pub struct MemoryStore {
    state: Arc<Mutex<State>>,
}

fn signed(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

fn message_key(uid: QueueUid, p: Priority, seq: Seq) -> MessageKey {
    (uid, rank(p), seq)
}

fn index_key(uid: QueueUid, h: IndexedHeader, value: &str, p: Priority, seq: Seq) -> IndexKey {
    (uid, header_kind(h), value.to_string(), rank(p), seq)
}

impl State {
    fn apply_kv(&mut self, op: &KvOp) {
        match op {
            KvOp::Put { space, key, value } => {
                self.kv
                    .entry(*space)
                    .or_default()
                    .insert(key.clone(), value.clone());
            }
            KvOp::Delete { space, key } => {
                self.kv.entry(*space).or_default().remove(key);
            }
            KvOp::DeleteRange { space, from, to } => {
                if from < to {
                    let keys = self.kv.entry(*space).or_default();
                    let doomed: Vec<Vec<u8>> = keys
                        .range(from.clone()..to.clone())
                        .map(|(k, _)| k.clone())
                        .collect();
                    for k in doomed {
                        keys.remove(&k);
                    }
                }
            }
        }
    }

    fn add_counts(&mut self, uid: QueueUid, p: Priority, count: i64, bytes: i64) {
        let c = self.counts.entry((uid, p.get())).or_default();
        c.0 = c.0.wrapping_add(count);
        c.1 = c.1.wrapping_add(bytes);
    }

    fn delete_message(&mut self, uid: QueueUid, m: KeysRef<'_>) {
        self.messages.remove(&message_key(uid, m.priority, m.seq));
        self.delivery_counts.remove(&(uid, m.seq));
        self.add_counts(uid, m.priority, -1, -signed(m.size_bytes));
        for h in INDEXED_HEADERS {
            if let Some(v) = m.header(h) {
                self.index.remove(&index_key(uid, h, v, m.priority, m.seq));
            }
        }
        if let Some(at_ms) = m.deliver_at_ms {
            self.delayed.remove(&(uid, at_ms, m.seq));
        }
    }

    fn apply(&mut self, uid: QueueUid, op: &PersistOp) {
        match op {
            PersistOp::PutMessage(m) => {
                self.messages
                    .insert(message_key(uid, m.priority, m.seq), (**m).clone());
                self.add_counts(uid, m.priority, 1, signed(m.size_bytes()));
                for h in INDEXED_HEADERS {
                    if let Some(v) = h.value_of(m) {
                        self.index.insert(index_key(uid, h, v, m.priority, m.seq));
                    }
                }
                if let Some(at_ms) = m.deliver_at_ms {
                    self.delayed.insert((uid, at_ms, m.seq), m.priority);
                }
            }
            PersistOp::DeleteMessage(m) => self.delete_message(uid, KeysRef::of_message(m)),
            PersistOp::DeleteStored {
                priority,
                from,
                to,
                count,
                bytes,
            } => {
                if from < to {
                    let range =
                        message_key(uid, *priority, *from)..message_key(uid, *priority, *to);
                    let doomed: Vec<MessageKey> =
                        self.messages.range(range).map(|(k, _)| *k).collect();
                    for k in doomed {
                        self.messages.remove(&k);
                        self.delivery_counts.remove(&(uid, k.2));
                    }
                }
                self.add_counts(uid, *priority, -signed(*count), -signed(*bytes));
            }
            PersistOp::SetDeliveryCount { seq, count } => {
                self.delivery_counts.insert((uid, *seq), (*count, None));
            }
            PersistOp::MarkDelivery { seq, count, mark } => {
                self.delivery_counts
                    .insert((uid, *seq), (*count, Some(*mark)));
            }
            PersistOp::ReserveSeq { until } => {
                self.seq_reserved.insert(uid, *until);
            }
            PersistOp::PutDedup(r) => {
                self.dedup
                    .insert((uid, r.dedup_id.clone()), (r.seq, r.expires_ms));
            }
            PersistOp::DeleteDedup { dedup_id } => {
                self.dedup.remove(&(uid, dedup_id.clone()));
            }
        }
    }

    fn delete_queue(&mut self, uid: QueueUid) {
        self.queues.remove(&uid);
        self.messages.retain(|k, _| k.0 != uid);
        self.delivery_counts.retain(|(u, _), _| *u != uid);
        self.counts.retain(|(u, _), _| *u != uid);
        self.index.retain(|k| k.0 != uid);
        self.delayed.retain(|k, _| k.0 != uid);
        self.seq_reserved.remove(&uid);
        self.dedup.retain(|(u, _), _| *u != uid);
    }

    fn delete_shard(&mut self, shard: ShardId) {
        let doomed: Vec<QueueUid> = self
            .queues
            .values()
            .filter(|d| d.replica.is_some_and(|r| r.shard == shard))
            .map(|d| d.uid)
            .collect();
        for uid in doomed {
            self.delete_queue(uid);
        }
    }

    /// The ops that recreate the queues of `shard` (see [`QueueStore::export_shard`]).
    fn shard_copy(&self, shard: ShardId) -> Vec<StoreOp> {
        let mut ops = Vec::new();
        let defs = self
            .queues
            .values()
            .filter(|d| d.replica.is_some_and(|r| r.shard == shard));
        for def in defs {
            let uid = def.uid;
            let queue_op = |op| StoreOp::Queue { uid, op };
            ops.push(StoreOp::PutQueue(def.clone()));
            if let Some(&until) = self.seq_reserved.get(&uid) {
                ops.push(queue_op(PersistOp::ReserveSeq { until }));
            }
            let queue_keys = (uid, 0, Seq(0))..=(uid, u8::MAX, Seq(u64::MAX));
            for (&(dedup_uid, ref dedup_id), &(seq, expires_ms)) in &self.dedup {
                if dedup_uid == uid {
                    ops.push(queue_op(PersistOp::PutDedup(DedupRecord {
                        dedup_id: dedup_id.clone(),
                        seq,
                        expires_ms,
                    })));
                }
            }
            let mut held = BTreeSet::new();
            for m in self.messages.range(queue_keys).map(|(_, m)| m) {
                held.insert(m.seq);
                ops.push(queue_op(PersistOp::PutMessage(Arc::new(m.clone()))));
            }
            let deliveries = self
                .delivery_counts
                .range((uid, Seq(0))..=(uid, Seq(u64::MAX)));
            for (&(_, seq), &(count, mark)) in deliveries {
                if held.contains(&seq) {
                    ops.push(queue_op(match mark {
                        Some(mark) => PersistOp::MarkDelivery { seq, count, mark },
                        None => PersistOp::SetDeliveryCount { seq, count },
                    }));
                }
            }
        }
        ops
    }

    fn recovered(&self, uid: QueueUid, message: &Message) -> RecoveredMessage {
        let (delivery_count, mark) = self
            .delivery_counts
            .get(&(uid, message.seq))
            .copied()
            .unwrap_or_default();
        RecoveredMessage {
            message: message.clone(),
            delivery_count,
            mark,
        }
    }

    fn recover_queue(&self, def: &QueueDef) -> RecoveredQueue {
        let uid = def.uid;
        let mut stored = [crate::StoredLevel::default(); PRIORITY_LEVELS];
        for (p, level) in stored.iter_mut().enumerate() {
            let p = u8::try_from(p).unwrap_or(u8::MAX);
            if let Some(&(count, bytes)) = self.counts.get(&(uid, p)) {
                *level = codec::stored_level(count, bytes);
            }
        }
        RecoveredQueue {
            def: def.clone(),
            seq_reserved_until: self.seq_reserved.get(&uid).copied().unwrap_or(Seq(1)),
            stored,
            dedup: self
                .dedup
                .iter()
                .filter(|((u, _), _)| *u == uid)
                .map(|((_, id), &(seq, expires_ms))| DedupRecord {
                    dedup_id: id.clone(),
                    seq,
                    expires_ms,
                })
                .collect(),
        }
    }
}

impl MemoryStore {
    pub fn new() -> Self {
        Self::default()
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl QueueStore for MemoryStore {
    fn write(&self, batches: &[Vec<StoreOp>]) -> Result<(), StoreError> {
        let mut s = self.state();
        for op in batches.iter().flatten() {
            match op {
                StoreOp::PutQueue(def) => {
                    s.queues.insert(def.uid, def.clone());
                }
                StoreOp::DeleteQueue(uid) => s.delete_queue(*uid),
                StoreOp::Queue { uid, op } => s.apply(*uid, op),
                StoreOp::DeleteMessage { uid, keys } => {
                    s.delete_message(*uid, KeysRef::of_keys(keys));
                }
                StoreOp::Kv(op) => s.apply_kv(op),
                StoreOp::DeleteShard(shard) => s.delete_shard(*shard),
            }
        }
        Ok(())
    }

    /// Copies the shard under the lock (a point in time), then hands it out without it.
    fn export_shard(
        &self,
        shard: ShardId,
        app_key: &[u8],
        batch_bytes: usize,
        sink: &mut dyn FnMut(Vec<StoreOp>) -> Result<(), StoreError>,
    ) -> Result<Option<Vec<u8>>, StoreError> {
        let (ops, app_value) = {
            let s = self.state();
            let app_value =
                s.kv.get(&KvSpace::RaftApp)
                    .and_then(|kv| kv.get(app_key).cloned());
            (s.shard_copy(shard), app_value)
        };
        let mut batcher = ExportBatcher::new(batch_bytes, sink);
        for op in ops {
            batcher.push(op)?;
        }
        batcher.finish()?;
        Ok(app_value)
    }

    fn kv_get(&self, space: KvSpace, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        Ok(self
            .state()
            .kv
            .get(&space)
            .and_then(|keys| keys.get(key))
            .cloned())
    }

    fn kv_scan(&self, space: KvSpace, prefix: &[u8]) -> Result<Vec<KeyValue>, StoreError> {
        let s = self.state();
        let Some(keys) = s.kv.get(&space) else {
            return Ok(Vec::new());
        };
        Ok(keys
            .range(prefix.to_vec()..)
            .take_while(|(k, _)| k.starts_with(prefix))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect())
    }

    fn recover(&self) -> Result<Vec<RecoveredQueue>, StoreError> {
        self.recover_where(&|_| true)
    }

    fn recover_where(
        &self,
        keep: &dyn Fn(&QueueDef) -> bool,
    ) -> Result<Vec<RecoveredQueue>, StoreError> {
        let s = self.state();
        Ok(s.queues
            .values()
            .filter(|def| keep(def))
            .map(|def| s.recover_queue(def))
            .collect())
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
        if from >= upto {
            return Ok(Page {
                messages: vec![],
                next: from,
                end: true,
            });
        }
        let s = self.state();
        let mut range = s
            .messages
            .range(message_key(uid, priority, from)..message_key(uid, priority, upto))
            .peekable();
        let (mut messages, mut bytes) = (Vec::new(), 0u64);
        while range.peek().is_some()
            && messages.len() < max_count
            && (messages.is_empty() || bytes < max_bytes)
        {
            let Some((_, m)) = range.next() else { break };
            bytes = bytes.saturating_add(m.size_bytes());
            messages.push(s.recovered(uid, m));
        }
        let end = range.peek().is_none();
        let next = match messages.last() {
            _ if end => upto,
            Some(m) => Seq(m.message.seq.0.saturating_add(1)),
            None => from,
        };
        Ok(Page {
            messages,
            next,
            end,
        })
    }

    fn find_by_header(
        &self,
        uid: QueueUid,
        header: IndexedHeader,
        value: &str,
        max: usize,
    ) -> Result<Vec<(Priority, Seq)>, StoreError> {
        let s = self.state();
        let kind = header_kind(header);
        let lo = (uid, kind, value.to_string(), 0, Seq(0));
        let found = s
            .index
            .range((Bound::Included(lo), Bound::Unbounded))
            .take_while(|k| k.0 == uid && k.1 == kind && k.2 == value)
            // Orphans (messages removed by `DeleteStored`) are skipped, as in RocksDB.
            .filter(|k| s.messages.contains_key(&(uid, k.3, k.4)))
            .filter_map(|k| priority_of_rank(k.3).map(|p| (p, k.4)))
            .take(max)
            .collect();
        Ok(found)
    }

    fn read_messages(
        &self,
        uid: QueueUid,
        keys: &[(Priority, Seq)],
    ) -> Result<Vec<RecoveredMessage>, StoreError> {
        let s = self.state();
        Ok(keys
            .iter()
            .filter_map(|&(p, seq)| s.messages.get(&message_key(uid, p, seq)))
            .map(|m| s.recovered(uid, m))
            .collect())
    }

    fn find_message(
        &self,
        uid: QueueUid,
        seq: Seq,
    ) -> Result<Option<RecoveredMessage>, StoreError> {
        let s = self.state();
        Ok(priorities_high_first()
            .find_map(|p| s.messages.get(&message_key(uid, p, seq)))
            .map(|m| s.recovered(uid, m)))
    }

    fn read_marked(&self, uid: QueueUid) -> Result<Vec<RecoveredMessage>, StoreError> {
        let s = self.state();
        let range = (uid, Seq(0))..=(uid, Seq(u64::MAX));
        Ok(s.delivery_counts
            .range(range)
            .filter(|(_, (_, mark))| mark.is_some())
            .filter_map(|(&(_, seq), _)| {
                priorities_high_first().find_map(|p| s.messages.get(&message_key(uid, p, seq)))
            })
            .map(|m| s.recovered(uid, m))
            .collect())
    }

    fn read_delayed(
        &self,
        uid: QueueUid,
        after_ms: u64,
    ) -> Result<Vec<RecoveredMessage>, StoreError> {
        let Some(from_ms) = after_ms.checked_add(1) else {
            return Ok(vec![]);
        };
        let s = self.state();
        let lo = (uid, from_ms, Seq(0));
        Ok(s.delayed
            .range((Bound::Included(lo), Bound::Unbounded))
            .take_while(|((u, _, _), _)| *u == uid)
            // Orphans (messages removed by `DeleteStored`) are skipped, as in RocksDB.
            .filter_map(|(&(_, _, seq), &p)| s.messages.get(&message_key(uid, p, seq)))
            .map(|m| s.recovered(uid, m))
            .collect())
    }
}
