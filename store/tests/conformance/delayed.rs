//! Messages with a delivery time, found again without reading the others.

use super::*;

/// A message of priority `p` due at `at_ms`.
fn delayed(uid: u64, p: u32, seq: u64, at_ms: u64) -> Message {
    Message {
        deliver_at_ms: Some(at_ms),
        ..at(uid, p, seq)
    }
}

/// The seqs `read_delayed` returns.
fn delayed_seqs(s: &dyn QueueStore, uid: u64, after_ms: u64) -> Vec<u64> {
    s.read_delayed(QueueUid(uid), after_ms)
        .unwrap()
        .iter()
        .map(|m| m.message.seq.0)
        .collect()
}

#[test]
fn delayed_messages_are_found_after_reopen_in_delivery_time_order() {
    for (name, mut b) in backends() {
        let m = [
            delayed(1, 4, 1, 500),
            delayed(1, 9, 2, 300),
            at(1, 4, 3),
            delayed(1, 0, 4, 300),
            delayed(1, 4, 5, 100),
            delayed(2, 4, 6, 200),
        ];
        let s = b.reopen();
        let mut ops: Vec<StoreOp> = m.iter().map(put_msg).collect();
        ops.push(set_delivery(1, 4, 2));
        s.write(&[ops]).unwrap();
        drop(s);
        let s = b.reopen();
        assert_eq!(
            s.read_delayed(QueueUid(1), 0).unwrap(),
            [
                recovered(&m[4], 0),
                recovered(&m[1], 0),
                recovered(&m[3], 2),
                recovered(&m[0], 0)
            ],
            "{name}: by time, then seq; whatever the priority; with delivery counts"
        );
        assert_eq!(
            s.read_delayed(QueueUid(2), 0).unwrap(),
            [recovered(&m[5], 0)],
            "{name}: this queue only"
        );
        assert_eq!(delayed_seqs(&*s, 3, 0), [] as [u64; 0], "{name}");
    }
}

#[test]
fn read_delayed_returns_only_messages_due_after_the_time() {
    for (name, mut b) in backends() {
        let s = b.reopen();
        s.write(&[vec![
            put_msg(&delayed(1, 4, 1, 100)),
            put_msg(&delayed(1, 4, 2, 200)),
            put_msg(&delayed(1, 4, 3, 201)),
            put_msg(&delayed(1, 4, 4, u64::MAX)),
        ]])
        .unwrap();
        drop(s);
        let s = b.reopen();
        for (after_ms, want) in [
            (0, vec![1, 2, 3, 4]),
            (99, vec![1, 2, 3, 4]),
            (100, vec![2, 3, 4]),
            (200, vec![3, 4]),
            (u64::MAX - 1, vec![4]),
            (u64::MAX, vec![]),
        ] {
            assert_eq!(
                delayed_seqs(&*s, 1, after_ms),
                want,
                "{name}: after {after_ms}"
            );
        }
    }
}

#[test]
fn deleted_messages_and_deleted_ranges_are_not_returned() {
    for (name, mut b) in backends() {
        let m: Vec<Message> = (1..=5)
            .map(|seq| delayed(1, 4, seq, 1_000 - seq))
            .chain([delayed(1, 7, 6, 50)])
            .collect();
        let s = b.reopen();
        s.write(&[m.iter().map(put_msg).collect()]).unwrap();
        s.write(&[vec![
            delete_msg(&m[1]),
            delete_stored(1, 4, 3, 5, &[&m[2], &m[3]]),
        ]])
        .unwrap();
        assert_eq!(delayed_seqs(&*s, 1, 0), [6, 5, 1], "{name}");
        // The deleted message's entry went with it: the same key written again without a
        // delivery time is not delayed.
        s.write(&[vec![put_msg(&at(1, 4, 2))]]).unwrap();
        drop(s);
        let s = b.reopen();
        assert_eq!(delayed_seqs(&*s, 1, 0), [6, 5, 1], "{name}: after reopen");
    }
}

#[test]
fn deleting_a_queue_removes_its_delayed_entries_and_no_other_queues() {
    for (name, mut b) in backends() {
        let m = [
            delayed(1, 4, 1, 100),
            delayed(1, 4, 2, 200),
            delayed(2, 4, 3, 100),
        ];
        let s = b.reopen();
        s.write(&[vec![
            StoreOp::PutQueue(def("a", 1)),
            StoreOp::PutQueue(def("b", 2)),
            put_msg(&m[0]),
            put_msg(&m[1]),
            put_msg(&m[2]),
        ]])
        .unwrap();
        // Leaves an orphan entry for seq 2.
        s.write(&[vec![delete_stored(1, 4, 2, 3, &[&m[1]])]])
            .unwrap();
        s.write(&[vec![StoreOp::DeleteQueue(QueueUid(1))]]).unwrap();
        // The uid again, with messages at the old keys and no delivery time: no entry of the old
        // queue may name them.
        s.write(&[vec![
            StoreOp::PutQueue(def("a", 1)),
            put_msg(&at(1, 4, 1)),
            put_msg(&at(1, 4, 2)),
        ]])
        .unwrap();
        drop(s);
        let s = b.reopen();
        assert_eq!(delayed_seqs(&*s, 1, 0), [] as [u64; 0], "{name}");
        assert_eq!(
            delayed_seqs(&*s, 2, 0),
            [3],
            "{name}: the other queue keeps its own"
        );
    }
}

#[test]
fn a_migrated_database_keeps_its_delayed_messages() {
    let dir = tempfile::tempdir().unwrap();
    let messages: Vec<(QueueUid, RecoveredMessage)> = (1..=6u64)
        .map(|seq| {
            let mut m = at(1, (seq % 10) as u32, seq);
            if seq % 2 == 1 {
                m.deliver_at_ms = Some(1_000 - seq);
            }
            (QueueUid(1), recovered(&m, (seq % 3) as u32))
        })
        .collect();
    ferry_store::write_pre_paging_database(dir.path(), &[def("a", 1)], &messages).unwrap();
    let want: Vec<RecoveredMessage> = [4, 2, 0].map(|i| messages[i].1.clone()).to_vec();
    for opening in 0..2 {
        let s = RocksStore::open(dir.path()).unwrap();
        assert_eq!(
            s.read_delayed(QueueUid(1), 0).unwrap(),
            want,
            "opening {opening}"
        );
        assert_eq!(delayed_seqs(&s, 1, 997), [1], "opening {opening}");
    }
}
