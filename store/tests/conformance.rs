//! One suite, run against every store: what one opening writes, the next opening reads back.

#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::sync::Arc;

use ferry_kernel::{
    DedupRecord, IndexedHeader, Message, MessageId, PersistOp, Priority, PropertyValue,
    QueueConfig, QueueName, QueueUid, RecoveredMessage, Seq,
};
use ferry_store::{
    MemoryStore, Page, QueueDef, QueueStore, RecoveredQueue, RocksStore, StoreOp, StoredLevel,
    PRIORITY_LEVELS,
};

#[path = "conformance/delayed.rs"]
mod delayed;
#[path = "conformance/marks.rs"]
mod marks;
#[path = "conformance/shards.rs"]
mod shards;

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
        replica: None,
        config: QueueConfig::default(),
    }
}

fn prio(p: u32) -> Priority {
    Priority::new(p).unwrap()
}

/// A message of the default priority whose correlation id is `corr-<seq>`.
fn message(uid: u64, seq: u64) -> Message {
    let mut properties = BTreeMap::new();
    properties.insert("n".to_string(), PropertyValue::Long(seq as i64));
    Message {
        id: MessageId::new(QueueUid(uid), Seq(seq)),
        seq: Seq(seq),
        body: format!("body-{seq}").into_bytes().into(),
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

/// A message of priority `p`, its body `seq` times longer than the last (sizes differ).
fn at(uid: u64, p: u32, seq: u64) -> Message {
    Message {
        priority: prio(p),
        body: vec![b'x'; 10 * seq as usize].into(),
        ..message(uid, seq)
    }
}

fn with_headers(m: Message, corr: Option<&str>, group: Option<&str>) -> Message {
    Message {
        correlation_id: corr.map(str::to_string),
        group_id: group.map(str::to_string),
        ..m
    }
}

fn op(uid: u64, op: PersistOp) -> StoreOp {
    StoreOp::Queue {
        uid: QueueUid(uid),
        op,
    }
}

fn uid_of(m: &Message) -> u64 {
    MessageId::parts(m.id.as_str()).unwrap().0 .0
}

fn put_msg(m: &Message) -> StoreOp {
    op(uid_of(m), PersistOp::PutMessage(Arc::new(m.clone())))
}

fn delete_msg(m: &Message) -> StoreOp {
    op(uid_of(m), PersistOp::DeleteMessage(Arc::new(m.clone())))
}

fn put(uid: u64, seq: u64) -> StoreOp {
    put_msg(&message(uid, seq))
}

fn set_delivery(uid: u64, seq: u64, count: u32) -> StoreOp {
    op(
        uid,
        PersistOp::SetDeliveryCount {
            seq: Seq(seq),
            count,
        },
    )
}

fn delete_stored(uid: u64, p: u32, from: u64, to: u64, doomed: &[&Message]) -> StoreOp {
    op(
        uid,
        PersistOp::DeleteStored {
            priority: prio(p),
            from: Seq(from),
            to: Seq(to),
            count: doomed.len() as u64,
            bytes: doomed.iter().map(|m| m.size_bytes()).sum(),
        },
    )
}

fn by_name(r: Vec<RecoveredQueue>) -> BTreeMap<String, RecoveredQueue> {
    r.into_iter().map(|q| (q.def.name.to_string(), q)).collect()
}

/// The per-priority counts `messages` add up to.
fn levels<'a>(messages: impl IntoIterator<Item = &'a Message>) -> [StoredLevel; PRIORITY_LEVELS] {
    let mut l = [StoredLevel::default(); PRIORITY_LEVELS];
    for m in messages {
        let level = &mut l[usize::from(m.priority.get())];
        level.count += 1;
        level.bytes += m.size_bytes();
    }
    l
}

fn seqs(page: &Page) -> Vec<u64> {
    page.messages.iter().map(|m| m.message.seq.0).collect()
}

fn recovered(m: &Message, delivery_count: u32) -> RecoveredMessage {
    RecoveredMessage {
        message: m.clone(),
        delivery_count,
        mark: None,
    }
}

/// Every message of one priority, read page by page (`max_count` each) to the end.
fn read_all(s: &dyn QueueStore, uid: u64, p: Priority, max_count: usize) -> Vec<RecoveredMessage> {
    let (mut from, mut all) = (Seq(0), vec![]);
    for _ in 0..10_000 {
        let page = s
            .read_page(QueueUid(uid), p, from, Seq(u64::MAX), max_count, u64::MAX)
            .unwrap();
        all.extend(page.messages);
        if page.end {
            assert_eq!(page.next, Seq(u64::MAX));
            return all;
        }
        assert!(page.next > from, "a page that is not the end moves on");
        from = page.next;
    }
    panic!("paging never reached the end");
}

#[test]
fn definitions_reservations_counts_and_delivery_counts_survive_reopen() {
    for (name, mut b) in backends() {
        let s = b.reopen();
        let mut limited = def("a", 1);
        limited.config.max_messages = Some(10_000);
        limited.config.max_bytes = Some(1 << 30);
        s.write(&[vec![
            StoreOp::PutQueue(limited.clone()),
            StoreOp::PutQueue(def("b", 2)),
        ]])
        .unwrap();
        let a = [at(1, 4, 1), at(1, 4, 2), at(1, 9, 3)];
        s.write(&[
            a.iter().map(put_msg).chain([put(2, 1)]).collect(),
            vec![set_delivery(1, 2, 3)],
            vec![op(1, PersistOp::ReserveSeq { until: Seq(10_001) })],
        ])
        .unwrap();
        drop(s);
        let s = b.reopen();
        let got = by_name(s.recover().unwrap());
        assert_eq!(got.len(), 2, "{name}");
        assert_eq!(got["a"].def, limited, "{name}: limits kept");
        assert_eq!(got["a"].seq_reserved_until, Seq(10_001), "{name}");
        assert_eq!(got["a"].stored, levels(&a), "{name}");
        assert_eq!(got["b"].stored, levels(&[message(2, 1)]), "{name}");
        assert_eq!(
            got["b"].seq_reserved_until,
            Seq(1),
            "{name}: nothing reserved yet"
        );
        assert_eq!(
            read_all(&*s, 1, prio(4), 10),
            [recovered(&a[0], 0), recovered(&a[1], 3)],
            "{name}"
        );
        assert_eq!(read_all(&*s, 1, prio(9), 10), [recovered(&a[2], 0)]);
    }
}

#[test]
fn counts_follow_puts_deletes_deleted_ranges_and_queue_deletion() {
    for (name, mut b) in backends() {
        let m: Vec<Message> = (1..=8)
            .map(|seq| at(1, [2, 7][seq as usize % 2], seq))
            .collect();
        let s = b.reopen();
        s.write(&[vec![StoreOp::PutQueue(def("a", 1))]]).unwrap();
        s.write(&[m.iter().map(put_msg).collect()]).unwrap();
        let stored = |b: &mut Box<dyn Reopen>| by_name(b.reopen().recover().unwrap())["a"].stored;
        drop(s);
        assert_eq!(stored(&mut b), levels(&m), "{name}: after puts");
        // Priority 2 holds the even seqs, 7 the odd ones.
        b.reopen().write(&[vec![delete_msg(&m[0])]]).unwrap();
        assert_eq!(stored(&mut b), levels(&m[1..]), "{name}: after a delete");
        b.reopen()
            .write(&[vec![delete_stored(1, 2, 2, 6, &[&m[1], &m[3]])]])
            .unwrap();
        let left = [&m[2], &m[4], &m[5], &m[6], &m[7]];
        assert_eq!(stored(&mut b), levels(left), "{name}: after a range");
        b.reopen()
            .write(&[vec![StoreOp::DeleteQueue(QueueUid(1))]])
            .unwrap();
        b.reopen()
            .write(&[vec![StoreOp::PutQueue(def("a", 1))]])
            .unwrap();
        assert_eq!(
            stored(&mut b),
            [StoredLevel::default(); PRIORITY_LEVELS],
            "{name}: the queue's counts went with it"
        );
    }
}

/// Recovery reads the counts, not the messages: a count the kernel wrote stays as written even
/// when no message backs it (the kernel corrects it on a complete page read).
#[test]
fn recovered_counts_are_the_counts_written_not_a_count_of_the_messages() {
    for (name, mut b) in backends() {
        let s = b.reopen();
        s.write(&[vec![StoreOp::PutQueue(def("a", 1)), put(1, 1)]])
            .unwrap();
        // A range that holds the message, said to hold none.
        s.write(&[vec![delete_stored(1, 4, 0, 10, &[])]]).unwrap();
        drop(s);
        let s = b.reopen();
        let got = by_name(s.recover().unwrap());
        assert_eq!(got["a"].stored, levels(&[message(1, 1)]), "{name}");
        assert!(
            s.find_message(QueueUid(1), Seq(1)).unwrap().is_none(),
            "{name}: the message itself is gone"
        );
    }
}

#[test]
fn deleting_a_message_removes_its_delivery_count() {
    for (name, mut b) in backends() {
        let s = b.reopen();
        s.write(&[vec![StoreOp::PutQueue(def("a", 1)), put(1, 1)]])
            .unwrap();
        s.write(&[vec![set_delivery(1, 1, 1)]]).unwrap();
        s.write(&[vec![delete_msg(&message(1, 1))]]).unwrap();
        // The same seq written again (it cannot happen in a queue, but the store must not
        // resurrect the old count or index entry if it did).
        let again = with_headers(message(1, 1), Some("again"), None);
        s.write(&[vec![put_msg(&again)]]).unwrap();
        drop(s);
        let s = b.reopen();
        let m = s.find_message(QueueUid(1), Seq(1)).unwrap().unwrap();
        assert_eq!(m.delivery_count, 0, "{name}");
        let corr = IndexedHeader::CorrelationId;
        let find = |v| s.find_by_header(QueueUid(1), corr, v, 10).unwrap();
        assert_eq!(
            find("corr-1"),
            [],
            "{name}: the deleted message's entry is gone"
        );
        assert_eq!(find("again"), [(Priority::DEFAULT, Seq(1))], "{name}");
    }
}

#[test]
fn deleting_a_range_keeps_other_priorities_delivery_counts() {
    for (name, mut b) in backends() {
        let s = b.reopen();
        let (low, high) = (at(1, 4, 1), at(1, 7, 2));
        s.write(&[vec![
            StoreOp::PutQueue(def("a", 1)),
            put_msg(&low),
            put_msg(&high),
            set_delivery(1, 2, 5),
        ]])
        .unwrap();
        s.write(&[vec![delete_stored(1, 4, 0, 10, &[&low])]])
            .unwrap();
        drop(s);
        let s = b.reopen();
        assert_eq!(
            s.find_message(QueueUid(1), Seq(2)).unwrap(),
            Some(recovered(&high, 5)),
            "{name}"
        );
        assert_eq!(s.find_message(QueueUid(1), Seq(1)).unwrap(), None, "{name}");
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
            set_delivery(1, 1, 2),
            op(1, PersistOp::ReserveSeq { until: Seq(500) }),
        ]])
        .unwrap();
        s.write(&[vec![StoreOp::DeleteQueue(QueueUid(1))]]).unwrap();
        drop(s);
        let got = by_name(b.reopen().recover().unwrap());
        assert_eq!(got.keys().collect::<Vec<_>>(), ["b"], "{name}");
        assert_eq!(got["b"].stored, levels(&[message(2, 1)]), "{name}");
        // The same uid created again starts clean: no message, count or index entry is left.
        let s = b.reopen();
        s.write(&[vec![StoreOp::PutQueue(def("a", 1))]]).unwrap();
        drop(s);
        let s = b.reopen();
        let got = by_name(s.recover().unwrap());
        assert_eq!(got["a"].stored, [StoredLevel::default(); PRIORITY_LEVELS]);
        assert_eq!(got["a"].seq_reserved_until, Seq(1), "{name}");
        assert!(read_all(&*s, 1, Priority::DEFAULT, 10).is_empty(), "{name}");
        assert_eq!(s.find_message(QueueUid(1), Seq(1)).unwrap(), None);
        // A message at a seq the old queue used must not be found by the old one's headers.
        let fresh = with_headers(message(1, 1), Some("fresh"), None);
        s.write(&[vec![put_msg(&fresh)]]).unwrap();
        let corr = IndexedHeader::CorrelationId;
        assert!(s
            .find_by_header(QueueUid(1), corr, "corr-1", 10)
            .unwrap()
            .is_empty());
        assert_eq!(
            s.find_by_header(QueueUid(2), corr, "corr-1", 10).unwrap(),
            [(Priority::DEFAULT, Seq(1))],
            "{name}: the other queue keeps its index"
        );
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

#[test]
fn read_page_reads_one_priority_within_its_bounds() {
    for (name, mut b) in backends() {
        let s = b.reopen();
        // Odd seqs at priority 8, even ones at 3, in another queue too (uid 2).
        let m: Vec<Message> = (1..=10)
            .map(|seq| at(1, [3, 8][seq as usize % 2], seq))
            .collect();
        let mut ops: Vec<StoreOp> = m.iter().map(put_msg).collect();
        ops.extend([put_msg(&at(2, 8, 11)), set_delivery(1, 3, 2)]);
        s.write(&[ops]).unwrap();
        drop(s);
        let s = b.reopen();
        let read = |p: u32, from: u64, upto: u64, count: usize, bytes: u64| {
            s.read_page(QueueUid(1), prio(p), Seq(from), Seq(upto), count, bytes)
                .unwrap()
        };
        let page = read(8, 0, u64::MAX, 100, u64::MAX);
        assert_eq!(seqs(&page), [1, 3, 5, 7, 9], "{name}");
        assert_eq!((page.next, page.end), (Seq(u64::MAX), true), "{name}");
        assert_eq!(page.messages[0], recovered(&m[0], 0), "{name}");
        assert_eq!(
            page.messages[1],
            recovered(&m[2], 2),
            "{name}: delivery count"
        );
        let page = read(3, 4, 9, 100, u64::MAX);
        assert_eq!(seqs(&page), [4, 6, 8], "{name}: from is in, upto is out");
        assert_eq!((page.next, page.end), (Seq(9), true), "{name}");
        let page = read(8, 0, 5, 100, u64::MAX);
        assert_eq!(seqs(&page), [1, 3], "{name}");
        assert_eq!((page.next, page.end), (Seq(5), true), "{name}");
        // Counted pages.
        let page = read(8, 0, u64::MAX, 2, u64::MAX);
        assert_eq!(seqs(&page), [1, 3], "{name}");
        assert_eq!((page.next, page.end), (Seq(4), false), "{name}");
        let page = read(8, 5, u64::MAX, 3, u64::MAX);
        assert_eq!(seqs(&page), [5, 7, 9], "{name}: the last one fits exactly");
        assert_eq!((page.next, page.end), (Seq(u64::MAX), true), "{name}");
        let page = read(8, 2, u64::MAX, 0, u64::MAX);
        assert_eq!((seqs(&page), page.next, page.end), (vec![], Seq(2), false));
        // Pages bounded by bytes: they stop after the message that reaches the limit.
        let (s1, s3) = (m[0].size_bytes(), m[2].size_bytes());
        for (max_bytes, want) in [
            (0, vec![1]),
            (1, vec![1]),
            (s1, vec![1]),
            (s1 + 1, vec![1, 3]),
            (s1 + s3, vec![1, 3]),
            (s1 + s3 + 1, vec![1, 3, 5]),
        ] {
            let page = read(8, 0, u64::MAX, 100, max_bytes);
            assert_eq!(seqs(&page), want, "{name}: max_bytes {max_bytes}");
            let last = *want.last().unwrap();
            assert_eq!((page.next, page.end), (Seq(last + 1), false), "{name}");
        }
        // Nothing to read.
        let page = read(5, 0, u64::MAX, 100, u64::MAX);
        assert_eq!(
            (seqs(&page), page.next, page.end),
            (vec![], Seq(u64::MAX), true)
        );
        let page = read(8, 9, 9, 100, u64::MAX);
        assert_eq!((seqs(&page), page.next, page.end), (vec![], Seq(9), true));
        let page = read(8, 10, u64::MAX, 100, u64::MAX);
        assert_eq!(
            (seqs(&page), page.next, page.end),
            (vec![], Seq(u64::MAX), true)
        );
    }
}

#[test]
fn read_page_skips_deleted_messages_and_deleted_ranges() {
    for (name, mut b) in backends() {
        let s = b.reopen();
        let m: Vec<Message> = (1..=6).map(|seq| at(1, 4, seq)).collect();
        s.write(&[m.iter().map(put_msg).collect()]).unwrap();
        s.write(&[vec![
            delete_msg(&m[0]),
            delete_stored(1, 4, 3, 5, &[&m[2], &m[3]]),
        ]])
        .unwrap();
        let page = s
            .read_page(QueueUid(1), prio(4), Seq(0), Seq(u64::MAX), 2, u64::MAX)
            .unwrap();
        assert_eq!(seqs(&page), [2, 5], "{name}");
        assert_eq!((page.next, page.end), (Seq(6), false), "{name}");
    }
}

#[test]
fn find_by_header_finds_in_delivery_order_and_skips_deleted_messages() {
    for (name, mut b) in backends() {
        let (corr, group) = (IndexedHeader::CorrelationId, IndexedHeader::GroupId);
        let c = |p, seq| with_headers(at(1, p, seq), Some("c"), None);
        let m = [
            c(9, 1),
            c(9, 2),
            c(4, 3),
            c(0, 4),
            c(4, 5),
            with_headers(at(1, 4, 6), Some("cc"), Some("c")),
            with_headers(at(1, 9, 7), Some("c\u{0}"), Some("g")),
            with_headers(at(1, 2, 8), None, Some("g")),
            with_headers(at(2, 9, 9), Some("c"), Some("g")),
        ];
        let s = b.reopen();
        s.write(&[m.iter().map(put_msg).collect()]).unwrap();
        drop(s);
        let s = b.reopen();
        let find = |h, v: &str, max| s.find_by_header(QueueUid(1), h, v, max).unwrap();
        let ps = |v: &[(u32, u64)]| -> Vec<(Priority, Seq)> {
            v.iter().map(|&(p, seq)| (prio(p), Seq(seq))).collect()
        };
        assert_eq!(
            find(corr, "c", 100),
            ps(&[(9, 1), (9, 2), (4, 3), (4, 5), (0, 4)]),
            "{name}: exactly \"c\", this queue only, priority high first"
        );
        assert_eq!(find(corr, "c", 2), ps(&[(9, 1), (9, 2)]), "{name}");
        assert_eq!(find(corr, "c", 0), [], "{name}");
        assert_eq!(find(group, "g", 100), ps(&[(9, 7), (2, 8)]), "{name}");
        assert_eq!(find(group, "c", 100), ps(&[(4, 6)]), "{name}");
        assert_eq!(find(corr, "none", 100), [], "{name}");
        s.write(&[vec![
            delete_msg(&m[2]),
            delete_stored(1, 9, 0, 3, &[&m[0], &m[1]]),
        ]])
        .unwrap();
        assert_eq!(
            find(corr, "c", 1),
            ps(&[(4, 5)]),
            "{name}: orphans at the head are skipped, not counted"
        );
        drop(s);
        let s = b.reopen();
        assert_eq!(
            s.find_by_header(QueueUid(1), corr, "c", 100).unwrap(),
            ps(&[(4, 5), (0, 4)]),
            "{name}: after reopen"
        );
    }
}

#[test]
fn find_by_header_handles_values_longer_than_the_index_holds() {
    for (name, mut b) in backends() {
        let base = "v".repeat(70_000);
        let (long_a, long_b) = (format!("{base}a"), format!("{base}b"));
        let s = b.reopen();
        s.write(&[vec![
            put_msg(&with_headers(at(1, 4, 1), Some(&long_a), None)),
            put_msg(&with_headers(at(1, 4, 2), Some(&long_b), None)),
        ]])
        .unwrap();
        let find = |v: &str| {
            s.find_by_header(QueueUid(1), IndexedHeader::CorrelationId, v, 10)
                .unwrap()
        };
        assert_eq!(find(&long_b), [(prio(4), Seq(2))], "{name}");
        assert_eq!(find(&long_a), [(prio(4), Seq(1))], "{name}");
        assert_eq!(find(&base), [], "{name}");
    }
}

#[test]
fn read_messages_skips_missing_keys_and_find_message_finds_any_priority() {
    for (name, mut b) in backends() {
        let m = [at(1, 0, 1), at(1, 9, 2), at(1, 5, 3)];
        let s = b.reopen();
        let mut ops: Vec<StoreOp> = m.iter().map(put_msg).collect();
        ops.push(set_delivery(1, 3, 2));
        s.write(&[ops]).unwrap();
        drop(s);
        let s = b.reopen();
        let keys = [
            (prio(5), Seq(3)),
            (prio(0), Seq(2)),
            (prio(9), Seq(2)),
            (prio(5), Seq(99)),
        ];
        assert_eq!(
            s.read_messages(QueueUid(1), &keys).unwrap(),
            [recovered(&m[2], 2), recovered(&m[1], 0)],
            "{name}: in the order asked, missing keys skipped"
        );
        assert!(s.read_messages(QueueUid(2), &keys).unwrap().is_empty());
        for (i, want) in m.iter().enumerate() {
            let got = s.find_message(QueueUid(1), want.seq).unwrap();
            assert_eq!(got.map(|r| r.message), Some(want.clone()), "{name}: {i}");
        }
        let third = s.find_message(QueueUid(1), Seq(3)).unwrap().unwrap();
        assert_eq!(third.delivery_count, 2, "{name}");
        assert_eq!(s.find_message(QueueUid(1), Seq(4)).unwrap(), None);
        assert_eq!(s.find_message(QueueUid(2), Seq(1)).unwrap(), None);
    }
}

/// Reopens the store many times, changing it in between, and checks each time that the counts
/// recovered and the pages read are exactly what a plain model of the writes says.
#[test]
fn recovery_and_pages_match_the_writes_across_many_reopens() {
    for (name, mut b) in backends() {
        // seq → (message, delivery count)
        let mut model: BTreeMap<u64, (Message, u32)> = BTreeMap::new();
        let mut next = 1u64;
        b.reopen()
            .write(&[vec![StoreOp::PutQueue(def("loop", 7))]])
            .unwrap();
        for round in 0..25u64 {
            let s = b.reopen();
            let got = by_name(s.recover().unwrap());
            let want = levels(model.values().map(|(m, _)| m));
            assert_eq!(got["loop"].stored, want, "{name}: round {round}");
            for p in (0..=Priority::MAX).map(|p| prio(p.into())) {
                let want: Vec<RecoveredMessage> = model
                    .values()
                    .filter(|(m, _)| m.priority == p)
                    .map(|(m, c)| recovered(m, *c))
                    .collect();
                let page_size = (round % 4 + 1) as usize;
                assert_eq!(
                    read_all(&*s, 7, p, page_size),
                    want,
                    "{name}: round {round}"
                );
            }
            let mut ops = vec![];
            for _ in 0..(round % 7 + 3) {
                let m = at(7, (next * 7 % 10) as u32, next);
                ops.push(put_msg(&m));
                model.insert(next, (m, 0));
                next += 1;
            }
            // Acknowledge every third message still there, deliver every other one again.
            let present: Vec<u64> = model.keys().copied().collect();
            for (i, seq) in present.into_iter().enumerate() {
                if (i as u64 + round).is_multiple_of(3) {
                    ops.push(delete_msg(&model[&seq].0));
                    model.remove(&seq);
                } else if i.is_multiple_of(2) {
                    let c = model[&seq].1 + 1;
                    ops.push(set_delivery(7, seq, c));
                    model.entry(seq).or_insert_with(|| unreachable!()).1 = c;
                }
            }
            // Every fifth round, purge the oldest few messages of the round's priority.
            if round % 5 == 4 {
                let p = (round % 10) as u32;
                let (from, to) = (0, next / 2);
                let doomed: Vec<u64> = model
                    .iter()
                    .filter(|(&seq, (m, _))| m.priority.get() == p as u8 && seq < to)
                    .map(|(&seq, _)| seq)
                    .collect();
                let doomed: Vec<Message> =
                    doomed.iter().map(|s| model.remove(s).unwrap().0).collect();
                ops.push(delete_stored(
                    7,
                    p,
                    from,
                    to,
                    &doomed.iter().collect::<Vec<_>>(),
                ));
            }
            s.write(&[ops]).unwrap();
        }
    }
}

/// A database written before paging (messages keyed `uid ++ seq`) opens with every message,
/// count, delivery count and index entry, and the old column family is gone.
#[test]
fn a_database_in_the_pre_paging_layout_is_migrated_on_open() {
    let dir = tempfile::tempdir().unwrap();
    let queues = [def("a", 1), def("b", 2)];
    // Enough bytes for several migration batches.
    let messages: Vec<(QueueUid, RecoveredMessage)> = (1..=3_000u64)
        .map(|seq| {
            let uid = QueueUid(1 + seq % 2);
            let mut m = with_headers(at(uid.0, (seq % 10) as u32, seq), None, None);
            m.body = vec![b'b'; 2_000].into();
            if seq % 3 == 0 {
                m.correlation_id = Some(format!("c{}", seq % 4));
            }
            (uid, recovered(&m, (seq % 5) as u32))
        })
        .collect();
    ferry_store::write_pre_paging_database(dir.path(), &queues, &messages).unwrap();
    for opening in 0..2 {
        let s = RocksStore::open(dir.path()).unwrap();
        let got = by_name(s.recover().unwrap());
        for q in &queues {
            let mine: Vec<&RecoveredMessage> = messages
                .iter()
                .filter(|(u, _)| *u == q.uid)
                .map(|(_, m)| m)
                .collect();
            let want = levels(mine.iter().map(|m| &m.message));
            assert_eq!(got[q.name.as_str()].stored, want, "opening {opening}");
            for p in (0..=Priority::MAX).map(|p| prio(p.into())) {
                let want: Vec<RecoveredMessage> = mine
                    .iter()
                    .filter(|m| m.message.priority == p)
                    .map(|m| (*m).clone())
                    .collect();
                assert_eq!(read_all(&s, q.uid.0, p, 500), want, "opening {opening}");
            }
        }
        let c1 = s
            .find_by_header(QueueUid(2), IndexedHeader::CorrelationId, "c1", 10_000)
            .unwrap();
        let mut want: Vec<(Priority, Seq)> = messages
            .iter()
            .filter(|(u, m)| u.0 == 2 && m.message.correlation_id.as_deref() == Some("c1"))
            .map(|(_, m)| (m.message.priority, m.message.seq))
            .collect();
        want.sort_by_key(|&(p, seq)| (std::cmp::Reverse(p), seq));
        assert!(!want.is_empty());
        assert_eq!(c1, want, "opening {opening}");
        drop(s);
        let cfs = rocksdb::DB::list_cf(&rocksdb::Options::default(), dir.path()).unwrap();
        assert!(!cfs.iter().any(|c| c == "messages"), "{cfs:?}");
    }
}
