//! A store in memory: the same contract as RocksDB, without the disk. Clones share state, so a
//! test can "reopen" it.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, PoisonError};

use ferry_kernel::{DedupRecord, Message, PersistOp, QueueUid, RecoveredMessage, Seq};

use crate::{QueueDef, QueueStore, RecoveredQueue, StoreError, StoreOp};

#[derive(Debug, Default)]
struct State {
    queues: BTreeMap<QueueUid, QueueDef>,
    messages: BTreeMap<(QueueUid, Seq), Message>,
    delivery_counts: BTreeMap<(QueueUid, Seq), u32>,
    seq_reserved: HashMap<QueueUid, Seq>,
    dedup: BTreeMap<(QueueUid, String), (Seq, u64)>,
}

/// See the module docs.
#[derive(Debug, Clone, Default)]
pub struct MemoryStore {
    state: Arc<Mutex<State>>,
}

impl MemoryStore {
    pub fn new() -> Self {
        Self::default()
    }
}

impl QueueStore for MemoryStore {
    fn write(&self, batches: &[Vec<StoreOp>]) -> Result<(), StoreError> {
        let mut s = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        for op in batches.iter().flatten() {
            match op {
                StoreOp::PutQueue(def) => {
                    s.queues.insert(def.uid, def.clone());
                }
                StoreOp::DeleteQueue(uid) => {
                    let uid = *uid;
                    s.queues.remove(&uid);
                    s.messages.retain(|(u, _), _| *u != uid);
                    s.delivery_counts.retain(|(u, _), _| *u != uid);
                    s.seq_reserved.remove(&uid);
                    s.dedup.retain(|(u, _), _| *u != uid);
                }
                StoreOp::Queue { uid, op } => match op {
                    PersistOp::PutMessage(m) => {
                        s.messages.insert((*uid, m.seq), (**m).clone());
                    }
                    PersistOp::DeleteMessage(seq) => {
                        s.messages.remove(&(*uid, *seq));
                        s.delivery_counts.remove(&(*uid, *seq));
                    }
                    PersistOp::SetDeliveryCount { seq, count } => {
                        s.delivery_counts.insert((*uid, *seq), *count);
                    }
                    PersistOp::ReserveSeq { until } => {
                        s.seq_reserved.insert(*uid, *until);
                    }
                    PersistOp::PutDedup(r) => {
                        s.dedup
                            .insert((*uid, r.dedup_id.clone()), (r.seq, r.expires_ms));
                    }
                    PersistOp::DeleteDedup { dedup_id } => {
                        s.dedup.remove(&(*uid, dedup_id.clone()));
                    }
                },
            }
        }
        Ok(())
    }

    fn recover(&self) -> Result<Vec<RecoveredQueue>, StoreError> {
        let s = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        Ok(s.queues
            .values()
            .map(|def| RecoveredQueue {
                def: def.clone(),
                seq_reserved_until: s.seq_reserved.get(&def.uid).copied().unwrap_or(Seq(1)),
                messages: s
                    .messages
                    .range((def.uid, Seq(0))..=(def.uid, Seq(u64::MAX)))
                    .map(|(k, m)| RecoveredMessage {
                        message: m.clone(),
                        delivery_count: s.delivery_counts.get(k).copied().unwrap_or(0),
                    })
                    .collect(),
                dedup: s
                    .dedup
                    .iter()
                    .filter(|((u, _), _)| *u == def.uid)
                    .map(|((_, id), &(seq, expires_ms))| DedupRecord {
                        dedup_id: id.clone(),
                        seq,
                        expires_ms,
                    })
                    .collect(),
            })
            .collect())
    }
}
