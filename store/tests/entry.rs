//! The replicated log's entry format: a store that applies the decoded entries ends up exactly
//! where a store that applied the original batches does, on every store; bad entries are errors.

#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::sync::Arc;

use ferry_kernel::{
    DedupRecord, DeliveryMark, IndexedHeader, LeaseId, Message, MessageId, PersistOp, Priority,
    PropertyValue, QueueConfig, QueueName, QueueUid, Seq, SessionId,
};
use ferry_store::{
    decode_entry, encode_entry, KvOp, KvSpace, MemoryStore, MessageKeys, QueueDef, QueueStore,
    RocksStore, StoreError, StoreOp, ENTRY_VERSION,
};
use proptest::prelude::*;

const QUEUES: [u64; 2] = [7, 9];
const HEADER_VALUES: [&str; 3] = ["a", "b", "c"];

#[derive(Debug, Clone)]
struct MessageSpec {
    queue: usize,
    seq: u64,
    priority: u32,
    body_len: usize,
    correlation: Option<usize>,
    group: Option<usize>,
    deliver_at_ms: Option<u64>,
}

fn message(spec: &MessageSpec) -> (QueueUid, Message) {
    let uid = QueueUid(QUEUES[spec.queue]);
    let mut properties = BTreeMap::new();
    properties.insert("n".to_string(), PropertyValue::Long(spec.seq as i64));
    let m = Message {
        id: MessageId::new(uid, Seq(spec.seq)),
        seq: Seq(spec.seq),
        body: vec![b'x'; spec.body_len].into(),
        properties,
        correlation_id: spec.correlation.map(|i| HEADER_VALUES[i].to_string()),
        reply_to: None,
        jms_type: Some("t".into()),
        priority: Priority::new(spec.priority).unwrap(),
        timestamp_ms: 1_000 + spec.seq,
        expiration_ms: Some(99_000),
        deliver_at_ms: spec.deliver_at_ms,
        persistent: true,
        dedup_id: None,
        group_id: spec.group.map(|i| HEADER_VALUES[i].to_string()),
    };
    (uid, m)
}

/// One op of a generated workload; messages are named by their place in the pool.
#[derive(Debug, Clone)]
enum Action {
    PutQueue(usize),
    DeleteQueue(usize),
    Put(usize),
    Delete(usize),
    DeleteStored {
        queue: usize,
        priority: u32,
        from: u64,
        len: u64,
    },
    Deliveries {
        message: usize,
        count: u32,
    },
    /// A delivery mark: a lease (with or without a session) or a back-off.
    Mark {
        message: usize,
        count: u32,
        lease: Option<(u64, Option<u64>)>,
        until_ms: u64,
    },
    Reserve {
        queue: usize,
        until: u64,
    },
    PutDedup {
        queue: usize,
        id: usize,
        seq: u64,
    },
    DeleteDedup {
        queue: usize,
        id: usize,
    },
}

fn spec() -> impl Strategy<Value = MessageSpec> {
    (
        0..QUEUES.len(),
        0u32..=9,
        0usize..64,
        proptest::option::of(0..HEADER_VALUES.len()),
        proptest::option::of(0..HEADER_VALUES.len()),
        proptest::option::of(1u64..5_000),
    )
        .prop_map(
            |(queue, priority, body_len, correlation, group, deliver_at_ms)| MessageSpec {
                queue,
                seq: 0,
                priority,
                body_len,
                correlation,
                group,
                deliver_at_ms,
            },
        )
}

fn action(pool: usize) -> impl Strategy<Value = Action> {
    let q = 0..QUEUES.len();
    prop_oneof![
        1 => q.clone().prop_map(Action::PutQueue),
        1 => q.clone().prop_map(Action::DeleteQueue),
        6 => (0..pool).prop_map(Action::Put),
        4 => (0..pool).prop_map(Action::Delete),
        1 => (q.clone(), 0u32..=9, 0u64..40, 0u64..10).prop_map(|(queue, priority, from, len)| {
            Action::DeleteStored { queue, priority, from, len }
        }),
        1 => (0..pool, 1u32..20).prop_map(|(message, count)| Action::Deliveries { message, count }),
        1 => (
            0..pool,
            1u32..20,
            proptest::option::of((1u64..100, proptest::option::of(0u64..u64::MAX))),
            0u64..u64::MAX,
        )
            .prop_map(|(message, count, lease, until_ms)| Action::Mark {
                message,
                count,
                lease,
                until_ms
            }),
        1 => (q.clone(), 0u64..1_000).prop_map(|(queue, until)| Action::Reserve { queue, until }),
        1 => (q.clone(), 0usize..3, 0u64..40).prop_map(|(queue, id, seq)| Action::PutDedup {
            queue,
            id,
            seq
        }),
        1 => (q, 0usize..3).prop_map(|(queue, id)| Action::DeleteDedup { queue, id }),
    ]
}

/// A pool of messages (sequence numbers distinct) and batches of actions over it.
fn workload() -> impl Strategy<Value = (Vec<MessageSpec>, Vec<Vec<Action>>)> {
    proptest::collection::vec(spec(), 1..24).prop_flat_map(|mut pool| {
        for (i, s) in pool.iter_mut().enumerate() {
            s.seq = i as u64 + 1;
        }
        let n = pool.len();
        let batches = proptest::collection::vec(proptest::collection::vec(action(n), 1..8), 1..10);
        (Just(pool), batches)
    })
}

fn to_op(pool: &[MessageSpec], a: &Action) -> StoreOp {
    let uid = |q: usize| QueueUid(QUEUES[q]);
    let queue_op = |q: usize, op| StoreOp::Queue { uid: uid(q), op };
    match a {
        Action::PutQueue(q) => StoreOp::PutQueue(QueueDef {
            name: QueueName::new(format!("q{q}")).unwrap(),
            uid: uid(*q),
            replica: None,
            config: QueueConfig::default(),
        }),
        Action::DeleteQueue(q) => StoreOp::DeleteQueue(uid(*q)),
        Action::Put(i) | Action::Delete(i) => {
            let (uid, m) = message(&pool[*i]);
            let m = Arc::new(m);
            let op = match a {
                Action::Put(_) => PersistOp::PutMessage(m),
                _ => PersistOp::DeleteMessage(m),
            };
            StoreOp::Queue { uid, op }
        }
        Action::DeleteStored {
            queue,
            priority,
            from,
            len,
        } => queue_op(
            *queue,
            PersistOp::DeleteStored {
                priority: Priority::new(*priority).unwrap(),
                from: Seq(*from),
                to: Seq(from + len),
                count: *len / 2,
                bytes: len * 10,
            },
        ),
        Action::Deliveries { message: i, count } => queue_op(
            pool[*i].queue,
            PersistOp::SetDeliveryCount {
                seq: Seq(pool[*i].seq),
                count: *count,
            },
        ),
        Action::Mark {
            message: i,
            count,
            lease,
            until_ms,
        } => queue_op(
            pool[*i].queue,
            PersistOp::MarkDelivery {
                seq: Seq(pool[*i].seq),
                count: *count,
                mark: match lease {
                    Some((lease, owner)) => DeliveryMark::Leased {
                        lease: LeaseId(*lease),
                        owner: owner.map(SessionId),
                        until_ms: *until_ms,
                        lease_ms: until_ms / 3,
                    },
                    None => DeliveryMark::Backoff {
                        until_ms: *until_ms,
                    },
                },
            },
        ),
        Action::Reserve { queue, until } => {
            queue_op(*queue, PersistOp::ReserveSeq { until: Seq(*until) })
        }
        Action::PutDedup { queue, id, seq } => queue_op(
            *queue,
            PersistOp::PutDedup(DedupRecord {
                dedup_id: format!("d{id}"),
                seq: Seq(*seq),
                expires_ms: 50_000 + seq,
            }),
        ),
        Action::DeleteDedup { queue, id } => queue_op(
            *queue,
            PersistOp::DeleteDedup {
                dedup_id: format!("d{id}"),
            },
        ),
    }
}

/// Everything a store shows of its queues, in a form two stores can be compared by.
fn observe(s: &dyn QueueStore) -> Vec<String> {
    let mut seen = Vec::new();
    let mut recovered = s.recover().unwrap();
    recovered.sort_by_key(|q| q.def.uid);
    seen.push(format!("{recovered:?}"));
    for uid in QUEUES.map(QueueUid) {
        for p in 0..=9 {
            let p = Priority::new(p).unwrap();
            let page = s.read_page(uid, p, Seq(0), Seq(u64::MAX), 1_000, u64::MAX);
            seen.push(format!("{uid:?} {p:?} {page:?}"));
        }
        for h in [IndexedHeader::CorrelationId, IndexedHeader::GroupId] {
            for v in HEADER_VALUES {
                let found = s.find_by_header(uid, h, v, 1_000);
                seen.push(format!("{uid:?} {h:?} {v} {found:?}"));
            }
        }
        seen.push(format!("{uid:?} delayed {:?}", s.read_delayed(uid, 0)));
        seen.push(format!("{uid:?} marked {:?}", s.read_marked(uid)));
    }
    seen
}

/// Writes the batches to `original` as the owner task would, and through the entry format to
/// `replica`, then compares what both show.
fn check_same(original: &dyn QueueStore, replica: &dyn QueueStore, batches: &[Vec<StoreOp>]) {
    replicate(original, replica, batches);
    assert_eq!(observe(original), observe(replica));
}

fn replicate(original: &dyn QueueStore, replica: &dyn QueueStore, batches: &[Vec<StoreOp>]) {
    for batch in batches {
        let entry = encode_entry(batch).unwrap();
        let decoded = decode_entry(&entry).unwrap();
        assert_eq!(decoded.len(), batch.len());
        original.write(std::slice::from_ref(batch)).unwrap();
        replica.write(&[decoded]).unwrap();
    }
}

fn batches_of(pool: &[MessageSpec], actions: &[Vec<Action>]) -> Vec<Vec<StoreOp>> {
    actions
        .iter()
        .map(|b| b.iter().map(|a| to_op(pool, a)).collect())
        .collect()
}

proptest! {
    #[test]
    fn a_memory_replica_ends_where_the_original_does((pool, actions) in workload()) {
        let batches = batches_of(&pool, &actions);
        let (original, replica) = (MemoryStore::new(), MemoryStore::new());
        check_same(&original, &replica, &batches);
        // Also what no read shows (an index entry left behind): the whole state.
        prop_assert_eq!(format!("{original:?}"), format!("{replica:?}"));
    }

    #[test]
    fn every_op_but_a_delete_decodes_as_it_was((pool, actions) in workload()) {
        for batch in batches_of(&pool, &actions) {
            let decoded = decode_entry(&encode_entry(&batch).unwrap()).unwrap();
            for (op, back) in batch.iter().zip(&decoded) {
                match op {
                    StoreOp::Queue { uid, op: PersistOp::DeleteMessage(m) } => {
                        let keys = MessageKeys::of(m);
                        prop_assert_eq!(back, &StoreOp::DeleteMessage { uid: *uid, keys });
                    }
                    op => prop_assert_eq!(back, op),
                }
            }
        }
    }

    #[test]
    fn garbage_is_an_error_never_a_panic(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
        let _ = decode_entry(&bytes);
    }
}

proptest! {
    // Each case opens two RocksDB instances: fewer cases.
    #![proptest_config(ProptestConfig::with_cases(24))]
    #[test]
    fn a_rocksdb_replica_ends_where_the_original_does((pool, actions) in workload()) {
        let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let original = RocksStore::open(a.path()).unwrap();
        let replica = RocksStore::open(b.path()).unwrap();
        check_same(&original, &replica, &batches_of(&pool, &actions));
        // Byte for byte, including what no read shows (an index entry left behind).
        prop_assert_eq!(original.dump().unwrap(), replica.dump().unwrap());
    }
}

#[test]
fn a_delete_carries_no_body() {
    let spec = MessageSpec {
        queue: 0,
        seq: 5,
        priority: 4,
        body_len: 10_000,
        correlation: Some(0),
        group: Some(1),
        deliver_at_ms: Some(7),
    };
    let (uid, m) = message(&spec);
    let put = encode_entry(&[StoreOp::Queue {
        uid,
        op: PersistOp::PutMessage(Arc::new(m.clone())),
    }])
    .unwrap();
    let delete = encode_entry(&[StoreOp::Queue {
        uid,
        op: PersistOp::DeleteMessage(Arc::new(m)),
    }])
    .unwrap();
    assert!(
        put.len() > 10_000,
        "the put carries the body: {}",
        put.len()
    );
    assert!(delete.len() < 64, "the delete is {} bytes", delete.len());
}

#[test]
fn an_unknown_version_is_refused_naming_it() {
    let mut entry = encode_entry(&[StoreOp::DeleteQueue(QueueUid(1))]).unwrap();
    entry[0] = ENTRY_VERSION + 1;
    let e = decode_entry(&entry).unwrap_err();
    assert!(
        matches!(&e, StoreError::Corrupt { reason, .. } if reason.contains("version 2")),
        "{e}"
    );
}

#[test]
fn truncated_and_trailing_bytes_are_refused() {
    let entry = encode_entry(&[
        StoreOp::DeleteQueue(QueueUid(1)),
        StoreOp::DeleteQueue(QueueUid(2)),
    ])
    .unwrap();
    for cut in 0..entry.len() {
        assert!(decode_entry(&entry[..cut]).is_err(), "cut at {cut}");
    }
    let mut longer = entry.clone();
    longer.push(0);
    assert!(decode_entry(&longer).is_err());
    assert_eq!(decode_entry(&entry).unwrap().len(), 2);
}

#[test]
fn a_raft_key_space_write_is_refused() {
    let kv = StoreOp::Kv(KvOp::Delete {
        space: KvSpace::RaftApp,
        key: b"k".to_vec(),
    });
    assert!(encode_entry(&[kv]).is_err());
}
