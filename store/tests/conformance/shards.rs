//! A queue shard's export ([`QueueStore::export_shard`]) and delete ([`StoreOp::DeleteShard`]):
//! what a replica installing a snapshot writes. Every store exports what every store imports.

use ferry_kernel::{DeliveryMark, IndexedHeader, LeaseId, PlacementEpoch, SessionId, ShardId};
use ferry_store::{KvOp, KvSpace, ShardReplica};

use super::*;

const APPLIED_KEY: &[u8] = b"shard/3/applied";

fn in_shard(name: &str, uid: u64, shard: u64) -> StoreOp {
    StoreOp::PutQueue(QueueDef {
        replica: Some(ShardReplica {
            shard: ShardId(shard),
            epoch: PlacementEpoch::new(uid),
            handle_key: Some((uid, 7)),
        }),
        ..def(name, uid)
    })
}

/// What a store holds of one queue, read through every read the back-end makes.
fn view(s: &dyn QueueStore, uid: u64) -> String {
    let recovered: Vec<RecoveredQueue> = s
        .recover()
        .unwrap()
        .into_iter()
        .filter(|q| q.def.uid == QueueUid(uid))
        .collect();
    let pages: Vec<Vec<RecoveredMessage>> = (0..=9).map(|p| read_all(s, uid, prio(p), 3)).collect();
    let headers = (
        s.find_by_header(QueueUid(uid), IndexedHeader::CorrelationId, "c", 100)
            .unwrap(),
        s.find_by_header(QueueUid(uid), IndexedHeader::GroupId, "g", 100)
            .unwrap(),
    );
    let delayed = s.read_delayed(QueueUid(uid), 0).unwrap();
    let marked = s.read_marked(QueueUid(uid)).unwrap();
    format!("{recovered:?}\n{pages:?}\n{headers:?}\n{delayed:?}\n{marked:?}")
}

/// A source store: queues 1 and 2 in shard 3 (with messages of several priorities, delivery
/// counts, a lease and a back-off, dedup records, a reservation, delayed messages, a deleted
/// range leaving orphans), queue 4 in shard 9, queue 5 on this node alone.
fn fill(s: &dyn QueueStore) {
    let leased = DeliveryMark::Leased {
        lease: LeaseId(11),
        owner: Some(SessionId(4)),
        until_ms: 5_000,
        lease_ms: 30_000,
    };
    let delayed = Message {
        deliver_at_ms: Some(9_000),
        ..at(1, 4, 6)
    };
    let mut ops = vec![
        in_shard("a", 1, 3),
        in_shard("a.DLQ", 2, 3),
        in_shard("b", 4, 9),
        StoreOp::PutQueue(def("local", 5)),
        put_msg(&with_headers(at(1, 9, 1), Some("c"), Some("g"))),
        put_msg(&with_headers(at(1, 4, 2), Some("c"), None)),
        put_msg(&at(1, 0, 3)),
        put_msg(&at(1, 0, 4)),
        put_msg(&at(1, 0, 5)),
        put_msg(&delayed),
        put(2, 1),
        put(4, 1),
        put(5, 1),
        set_delivery(1, 2, 3),
        op(
            1,
            PersistOp::MarkDelivery {
                seq: Seq(1),
                count: 1,
                mark: leased,
            },
        ),
        op(
            1,
            PersistOp::MarkDelivery {
                seq: Seq(3),
                count: 2,
                mark: DeliveryMark::Backoff { until_ms: 7_000 },
            },
        ),
        set_delivery(1, 4, 1),
        op(1, PersistOp::ReserveSeq { until: Seq(500) }),
        op(1, PersistOp::PutDedup(dedup("d1", 1, 60_000))),
        op(2, PersistOp::PutDedup(dedup("d2", 1, 60_000))),
        StoreOp::Kv(KvOp::Put {
            space: KvSpace::RaftApp,
            key: APPLIED_KEY.to_vec(),
            value: b"position".to_vec(),
        }),
    ];
    // Messages 3 and 4 go by a range delete: their delivery records stay behind as orphans.
    ops.push(delete_stored(1, 0, 3, 5, &[&at(1, 0, 3), &at(1, 0, 4)]));
    s.write(&[ops]).unwrap();
}

/// A target that held other data of shard 3 (queue 6, and an older copy of queue 1), and
/// queues of other shards that must stay.
fn fill_target(s: &dyn QueueStore) {
    s.write(&[vec![
        in_shard("gone", 6, 3),
        put(6, 1),
        in_shard("a", 1, 3),
        put(1, 99),
        op(1, PersistOp::PutDedup(dedup("old", 99, 60_000))),
        in_shard("b", 4, 9),
        put(4, 1),
        StoreOp::PutQueue(def("local", 5)),
        put(5, 1),
    ]])
    .unwrap();
}

#[test]
fn a_shards_export_recreates_its_queues_in_any_store_and_nothing_else() {
    for (from_name, mut from) in backends() {
        let source = from.reopen();
        fill(&*source);
        let mut batches = Vec::new();
        let app = source
            .export_shard(ShardId(3), APPLIED_KEY, 20, &mut |ops| {
                batches.push(ops);
                Ok(())
            })
            .unwrap();
        assert_eq!(app.as_deref(), Some(&b"position"[..]), "{from_name}");
        assert!(
            batches.len() > 2,
            "{from_name}: a small batch size cuts the export ({} batches)",
            batches.len()
        );
        for (to_name, mut to) in backends() {
            let target = to.reopen();
            fill_target(&*target);
            let (other, local) = (view(&*target, 4), view(&*target, 5));
            let mut write = vec![vec![StoreOp::DeleteShard(ShardId(3))]];
            write.extend(batches.iter().cloned());
            target.write(&write).unwrap();
            drop(target);
            let target = to.reopen();
            let case = format!("{from_name} to {to_name}");
            for uid in [1, 2] {
                assert_eq!(
                    view(&*target, uid),
                    view(&*source, uid),
                    "{case}: queue {uid}"
                );
            }
            assert_eq!(
                view(&*target, 6),
                view(&*source, 6),
                "{case}: queue 6 is gone"
            );
            assert_eq!(
                view(&*target, 4),
                other,
                "{case}: another shard's queue stays"
            );
            assert_eq!(
                view(&*target, 5),
                local,
                "{case}: an unreplicated queue stays"
            );
        }
    }
}

/// A shard's queues recovered alone are what a whole recovery holds of them, in every store.
#[test]
fn a_shards_queues_recover_alone_as_they_do_among_all() {
    for (name, mut backend) in backends() {
        let s = backend.reopen();
        fill(&*s);
        let in_shard_3 = |d: &QueueDef| d.replica.is_some_and(|r| r.shard == ShardId(3));
        let all: Vec<RecoveredQueue> = s
            .recover()
            .unwrap()
            .into_iter()
            .filter(|r| in_shard_3(&r.def))
            .collect();
        let alone = s.recover_where(&in_shard_3).unwrap();
        assert_eq!(alone.len(), 2, "{name}: {alone:?}");
        assert_eq!(format!("{alone:?}"), format!("{all:?}"), "{name}");
        assert!(s.recover_where(&|_| false).unwrap().is_empty(), "{name}");
    }
}

#[test]
fn a_shards_delete_and_export_are_never_log_entries() {
    assert!(ferry_store::encode_entry(&[StoreOp::DeleteShard(ShardId(3))]).is_err());
}
