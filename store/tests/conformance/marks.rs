//! Delivery marks (a replicated queue's leases and back-offs): written with the delivery count,
//! read back with the message, found again on their own, gone with their message.

use ferry_kernel::{DeliveryMark, LeaseId, SessionId};

use super::*;

fn mark(uid: u64, seq: u64, count: u32, mark: DeliveryMark) -> StoreOp {
    op(
        uid,
        PersistOp::MarkDelivery {
            seq: Seq(seq),
            count,
            mark,
        },
    )
}

fn leased(lease: u64, owner: Option<u64>) -> DeliveryMark {
    DeliveryMark::Leased {
        lease: LeaseId(lease),
        owner: owner.map(SessionId),
        until_ms: 1_000 + lease,
        lease_ms: 30_000,
    }
}

fn marks_of(found: &[RecoveredMessage]) -> Vec<(u64, u32, Option<DeliveryMark>)> {
    found
        .iter()
        .map(|m| (m.message.seq.0, m.delivery_count, m.mark))
        .collect()
}

#[test]
fn marks_are_read_back_with_their_messages_and_found_on_their_own() {
    for (name, mut b) in backends() {
        let s = b.reopen();
        let backoff = DeliveryMark::Backoff { until_ms: 9_000 };
        s.write(&[vec![
            StoreOp::PutQueue(def("a", 1)),
            StoreOp::PutQueue(def("b", 2)),
            put_msg(&at(1, 9, 1)),
            put_msg(&at(1, 0, 2)),
            put_msg(&at(1, 4, 3)),
            put_msg(&at(1, 4, 4)),
            put(2, 5),
            mark(1, 1, 1, leased(7, Some(42))),
            mark(1, 2, 3, backoff),
            set_delivery(1, 3, 2),
            mark(1, 4, 1, leased(8, None)),
            mark(2, 5, 1, leased(1, Some(1))),
        ]])
        .unwrap();
        // A return without back-off writes the count alone: the mark is gone.
        s.write(&[vec![set_delivery(1, 4, 1)]]).unwrap();
        drop(s);
        let s = b.reopen();
        assert_eq!(
            marks_of(&s.read_marked(QueueUid(1)).unwrap()),
            [(1, 1, Some(leased(7, Some(42)))), (2, 3, Some(backoff))],
            "{name}: in seq order, whatever the priority; counts alone are not marks"
        );
        assert_eq!(
            marks_of(&read_all(&*s, 1, prio(4), 10)),
            [(3, 2, None), (4, 1, None)],
            "{name}"
        );
        let found = s.find_message(QueueUid(1), Seq(1)).unwrap();
        assert_eq!(
            found.map(|m| m.mark),
            Some(Some(leased(7, Some(42)))),
            "{name}: a point read carries the mark"
        );
        assert_eq!(marks_of(&s.read_marked(QueueUid(2)).unwrap()).len(), 1);
        assert_eq!(s.read_marked(QueueUid(3)).unwrap(), [], "{name}");

        s.write(&[vec![
            delete_msg(&at(1, 9, 1)),
            delete_stored(1, 0, 0, 3, &[&at(1, 0, 2)]),
        ]])
        .unwrap();
        assert_eq!(
            s.read_marked(QueueUid(1)).unwrap(),
            [],
            "{name}: a deleted message takes its mark along"
        );
        s.write(&[vec![StoreOp::DeleteQueue(QueueUid(2))]]).unwrap();
        assert_eq!(s.read_marked(QueueUid(2)).unwrap(), [], "{name}");
    }
}
