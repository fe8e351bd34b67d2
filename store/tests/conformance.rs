//! One suite, run against every store: what one opening writes, the next opening reads back.

#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::sync::Arc;

use ferry_kernel::{
    DedupRecord, Message, MessageId, PersistOp, Priority, PropertyValue, QueueConfig, QueueName,
    QueueUid, RecoveredMessage, Seq,
};
use ferry_store::{MemoryStore, QueueDef, QueueStore, RecoveredQueue, RocksStore, StoreOp};

/// Opens the same underlying data again, as a restart would.
trait Reopen {
    fn reopen(&mut self) -> Arc<dyn QueueStore>;
}

struct Memory(MemoryStore);
impl Reopen for Memory {
    fn reopen(&mut self) -> Arc<dyn QueueStore> {
        Arc::new(self.0.clone())
    }
}

struct Rocks(tempfile::TempDir, Option<Arc<dyn QueueStore>>);
impl Reopen for Rocks {
    fn reopen(&mut self) -> Arc<dyn QueueStore> {
        // Close the previous instance first: RocksDB holds a lock on its directory.
        self.1 = None;
        let s: Arc<dyn QueueStore> = Arc::new(RocksStore::open(self.0.path()).unwrap());
        self.1 = Some(s.clone());
        s
    }
}

fn backends() -> Vec<(&'static str, Box<dyn Reopen>)> {
    vec![
        ("memory", Box::new(Memory(MemoryStore::new()))),
        (
            "rocksdb",
            Box::new(Rocks(tempfile::tempdir().unwrap(), None)),
        ),
    ]
}

fn def(name: &str, uid: u64) -> QueueDef {
    QueueDef {
        name: QueueName::new(name).unwrap(),
        uid: QueueUid(uid),
        config: QueueConfig::default(),
    }
}

fn message(uid: u64, seq: u64) -> Message {
    let mut properties = BTreeMap::new();
    properties.insert("n".to_string(), PropertyValue::Long(seq as i64));
    Message {
        id: MessageId::new(QueueUid(uid), Seq(seq)),
        seq: Seq(seq),
        body: format!("body-{seq}").into_bytes(),
        properties,
        correlation_id: Some(format!("corr-{seq}")),
        reply_to: None,
        jms_type: None,
        priority: Priority::DEFAULT,
        timestamp_ms: 1_000 + seq,
        expiration_ms: None,
        deliver_at_ms: None,
        persistent: true,
        dedup_id: None,
        group_id: None,
    }
}

fn put(uid: u64, seq: u64) -> StoreOp {
    StoreOp::Queue {
        uid: QueueUid(uid),
        op: PersistOp::PutMessage(Arc::new(message(uid, seq))),
    }
}

fn op(uid: u64, op: PersistOp) -> StoreOp {
    StoreOp::Queue {
        uid: QueueUid(uid),
        op,
    }
}

fn by_name(r: Vec<RecoveredQueue>) -> BTreeMap<String, RecoveredQueue> {
    r.into_iter().map(|q| (q.def.name.to_string(), q)).collect()
}

#[test]
fn queues_messages_and_delivery_counts_survive_reopen() {
    for (name, mut b) in backends() {
        let s = b.reopen();
        s.write(&[vec![
            StoreOp::PutQueue(def("a", 1)),
            StoreOp::PutQueue(def("b", 2)),
        ]])
        .unwrap();
        s.write(&[
            vec![put(1, 1), put(1, 2), put(2, 1)],
            vec![op(
                1,
                PersistOp::SetDeliveryCount {
                    seq: Seq(2),
                    count: 3,
                },
            )],
            vec![op(1, PersistOp::ReserveSeq { until: Seq(10_001) })],
        ])
        .unwrap();
        drop(s);
        let got = by_name(b.reopen().recover().unwrap());
        assert_eq!(got.len(), 2, "{name}");
        let a = &got["a"];
        assert_eq!(a.def, def("a", 1), "{name}");
        assert_eq!(a.seq_reserved_until, Seq(10_001), "{name}");
        assert_eq!(
            a.messages,
            vec![
                RecoveredMessage {
                    message: message(1, 1),
                    delivery_count: 0
                },
                RecoveredMessage {
                    message: message(1, 2),
                    delivery_count: 3
                },
            ],
            "{name}"
        );
        assert_eq!(got["b"].messages.len(), 1, "{name}");
        assert_eq!(
            got["b"].seq_reserved_until,
            Seq(1),
            "{name}: nothing reserved yet"
        );
    }
}

#[test]
fn deleting_a_message_removes_its_delivery_count() {
    for (name, mut b) in backends() {
        let s = b.reopen();
        s.write(&[vec![StoreOp::PutQueue(def("a", 1)), put(1, 1)]])
            .unwrap();
        s.write(&[vec![op(
            1,
            PersistOp::SetDeliveryCount {
                seq: Seq(1),
                count: 1,
            },
        )]])
        .unwrap();
        s.write(&[vec![op(1, PersistOp::DeleteMessage(Seq(1)))]])
            .unwrap();
        // The same seq written again (it cannot happen in a queue, but the store must not
        // resurrect the old count if it did).
        s.write(&[vec![put(1, 1)]]).unwrap();
        drop(s);
        let got = by_name(b.reopen().recover().unwrap());
        assert_eq!(got["a"].messages[0].delivery_count, 0, "{name}");
    }
}

#[test]
fn deleting_a_queue_removes_everything_of_it_and_nothing_else() {
    for (name, mut b) in backends() {
        let s = b.reopen();
        s.write(&[vec![
            StoreOp::PutQueue(def("a", 1)),
            StoreOp::PutQueue(def("b", 2)),
            put(1, 1),
            put(2, 1),
            op(
                1,
                PersistOp::SetDeliveryCount {
                    seq: Seq(1),
                    count: 2,
                },
            ),
            op(1, PersistOp::ReserveSeq { until: Seq(500) }),
        ]])
        .unwrap();
        s.write(&[vec![StoreOp::DeleteQueue(QueueUid(1))]]).unwrap();
        drop(s);
        let got = by_name(b.reopen().recover().unwrap());
        assert_eq!(got.keys().collect::<Vec<_>>(), ["b"], "{name}");
        assert_eq!(got["b"].messages.len(), 1, "{name}");
        // A new queue under the old name starts clean.
        let s = b.reopen();
        s.write(&[vec![StoreOp::PutQueue(def("a", 3))]]).unwrap();
        drop(s);
        let got = by_name(b.reopen().recover().unwrap());
        assert!(got["a"].messages.is_empty(), "{name}");
        assert_eq!(got["a"].seq_reserved_until, Seq(1), "{name}");
    }
}

fn dedup(id: &str, seq: u64, expires_ms: u64) -> DedupRecord {
    DedupRecord {
        dedup_id: id.into(),
        seq: Seq(seq),
        expires_ms,
    }
}

#[test]
fn dedup_records_survive_reopen_until_deleted_and_go_with_their_queue() {
    for (name, mut b) in backends() {
        let s = b.reopen();
        s.write(&[vec![
            StoreOp::PutQueue(def("a", 1)),
            StoreOp::PutQueue(def("b", 2)),
            op(1, PersistOp::PutDedup(dedup("k1", 1, 100))),
            op(1, PersistOp::PutDedup(dedup("k2", 2, 200))),
            op(2, PersistOp::PutDedup(dedup("k1", 7, 300))),
        ]])
        .unwrap();
        s.write(&[vec![op(
            1,
            PersistOp::DeleteDedup {
                dedup_id: "k1".into(),
            },
        )]])
        .unwrap();
        drop(s);
        let got = by_name(b.reopen().recover().unwrap());
        assert_eq!(got["a"].dedup, [dedup("k2", 2, 200)], "{name}");
        assert_eq!(got["b"].dedup, [dedup("k1", 7, 300)], "{name}");
        let s = b.reopen();
        s.write(&[vec![StoreOp::DeleteQueue(QueueUid(1))]]).unwrap();
        s.write(&[vec![StoreOp::PutQueue(def("a", 1))]]).unwrap();
        drop(s);
        let got = by_name(b.reopen().recover().unwrap());
        assert!(got["a"].dedup.is_empty(), "{name}: deleted with the queue");
        assert_eq!(got["b"].dedup.len(), 1, "{name}");
    }
}

/// Reopens the store many times, changing it in between, and checks each time that what was
/// recovered is exactly what a plain model of the writes says.
#[test]
fn recovery_matches_the_writes_across_many_reopens() {
    for (name, mut b) in backends() {
        let mut model: BTreeMap<u64, u32> = BTreeMap::new();
        let mut next = 1u64;
        b.reopen()
            .write(&[vec![StoreOp::PutQueue(def("loop", 7))]])
            .unwrap();
        for round in 0..25u64 {
            let s = b.reopen();
            let got = by_name(s.recover().unwrap());
            let recovered: BTreeMap<u64, u32> = got["loop"]
                .messages
                .iter()
                .map(|m| (m.message.seq.0, m.delivery_count))
                .collect();
            assert_eq!(recovered, model, "{name}: round {round}");
            for m in &got["loop"].messages {
                assert_eq!(
                    m.message,
                    message(7, m.message.seq.0),
                    "{name}: round {round}"
                );
            }
            let mut ops = vec![];
            for _ in 0..(round % 7 + 3) {
                ops.push(put(7, next));
                model.insert(next, 0);
                next += 1;
            }
            // Acknowledge every third message still there, deliver every other one again.
            let seqs: Vec<u64> = model.keys().copied().collect();
            for (i, seq) in seqs.into_iter().enumerate() {
                if (i as u64 + round).is_multiple_of(3) {
                    ops.push(op(7, PersistOp::DeleteMessage(Seq(seq))));
                    model.remove(&seq);
                } else if i.is_multiple_of(2) {
                    let c = model[&seq] + 1;
                    ops.push(op(
                        7,
                        PersistOp::SetDeliveryCount {
                            seq: Seq(seq),
                            count: c,
                        },
                    ));
                    model.insert(seq, c);
                }
            }
            s.write(&[ops]).unwrap();
        }
    }
}
