//! Group commit shares one synced write among everyone queued when the writer gets to them.

#![allow(clippy::unwrap_used)]

use std::sync::atomic::Ordering;
use std::sync::{mpsc, Arc, Mutex};
use std::time::Duration;

use ferry_kernel::{
    IndexedHeader, PersistOp, Priority, QueueConfig, QueueName, QueueUid, RecoveredMessage, Seq,
};
use ferry_store::{
    GroupCommit, KeyValue, KvSpace, MemoryStore, Page, QueueDef, QueueStore, RecoveredQueue,
    StoreError, StoreOp,
};

/// A store whose first synced write (or, with [`Gated::gating_unsynced`], first unsynced one)
/// blocks until the test opens the gate, so the test knows exactly what is queued behind it. It
/// logs every write and sync, and tells the test of each unsynced write.
#[derive(Debug)]
struct Gated<S = MemoryStore> {
    inner: S,
    /// Which kind of write the gate holds: "write" or "unsynced".
    gated: &'static str,
    entered: Mutex<Option<mpsc::Sender<()>>>,
    gate: Mutex<Option<mpsc::Receiver<()>>>,
    unsynced: Mutex<Option<mpsc::Sender<()>>>,
    log: Mutex<Vec<&'static str>>,
}

/// The test's ends of a [`Gated`] store: the first synced write has begun; open its gate; an
/// unsynced write was made.
struct GateEnds {
    entered: mpsc::Receiver<()>,
    open: mpsc::Sender<()>,
    unsynced: mpsc::Receiver<()>,
}

impl<S: QueueStore> Gated<S> {
    fn new(inner: S) -> (Arc<Self>, GateEnds) {
        Self::gating(inner, "write")
    }

    fn gating_unsynced(inner: S) -> (Arc<Self>, GateEnds) {
        Self::gating(inner, "unsynced")
    }

    fn gating(inner: S, gated: &'static str) -> (Arc<Self>, GateEnds) {
        let (entered_tx, entered) = mpsc::channel();
        let (open, gate_rx) = mpsc::channel();
        let (unsynced_tx, unsynced) = mpsc::channel();
        let store = Arc::new(Gated {
            inner,
            gated,
            entered: Mutex::new(Some(entered_tx)),
            gate: Mutex::new(Some(gate_rx)),
            unsynced: Mutex::new(Some(unsynced_tx)),
            log: Mutex::new(vec![]),
        });
        let ends = GateEnds {
            entered,
            open,
            unsynced,
        };
        (store, ends)
    }

    fn log(&self) -> Vec<&'static str> {
        self.log.lock().unwrap().clone()
    }

    /// Holds the first write of the gated kind until the test opens the gate.
    fn hold(&self, kind: &'static str) {
        if kind != self.gated {
            return;
        }
        if let Some(tx) = self.entered.lock().unwrap().take() {
            tx.send(()).unwrap();
            let gate = self.gate.lock().unwrap().take().unwrap();
            gate.recv().unwrap();
        }
    }
}

impl<S: QueueStore> QueueStore for Gated<S> {
    fn write(&self, batches: &[Vec<StoreOp>]) -> Result<(), StoreError> {
        self.hold("write");
        self.log.lock().unwrap().push("write");
        self.inner.write(batches)
    }
    fn write_unsynced(&self, batches: &[Vec<StoreOp>]) -> Result<(), StoreError> {
        self.hold("unsynced");
        self.log.lock().unwrap().push("unsynced");
        let result = self.inner.write(batches);
        if let Some(tx) = self.unsynced.lock().unwrap().as_ref() {
            let _ = tx.send(());
        }
        result
    }
    fn sync(&self) -> Result<(), StoreError> {
        self.log.lock().unwrap().push("sync");
        self.inner.sync()
    }
    fn recover(&self) -> Result<Vec<RecoveredQueue>, StoreError> {
        self.inner.recover()
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
        self.inner
            .read_page(uid, priority, from, upto, max_count, max_bytes)
    }
    fn find_by_header(
        &self,
        uid: QueueUid,
        header: IndexedHeader,
        value: &str,
        max: usize,
    ) -> Result<Vec<(Priority, Seq)>, StoreError> {
        self.inner.find_by_header(uid, header, value, max)
    }
    fn read_messages(
        &self,
        uid: QueueUid,
        keys: &[(Priority, Seq)],
    ) -> Result<Vec<RecoveredMessage>, StoreError> {
        self.inner.read_messages(uid, keys)
    }
    fn find_message(
        &self,
        uid: QueueUid,
        seq: Seq,
    ) -> Result<Option<RecoveredMessage>, StoreError> {
        self.inner.find_message(uid, seq)
    }
    fn read_delayed(
        &self,
        uid: QueueUid,
        after_ms: u64,
    ) -> Result<Vec<RecoveredMessage>, StoreError> {
        self.inner.read_delayed(uid, after_ms)
    }
    fn read_marked(&self, uid: QueueUid) -> Result<Vec<RecoveredMessage>, StoreError> {
        self.inner.read_marked(uid)
    }
    fn kv_get(&self, space: KvSpace, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        self.inner.kv_get(space, key)
    }
    fn kv_scan(&self, space: KvSpace, prefix: &[u8]) -> Result<Vec<KeyValue>, StoreError> {
        self.inner.kv_scan(space, prefix)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_submissions_share_one_write_and_all_become_durable() {
    let inner = MemoryStore::new();
    let (store, ends) = Gated::new(inner.clone());
    let (gc, thread) = GroupCommit::start(store, 1024, 1024, Duration::from_millis(1)).unwrap();
    let uid = QueueUid(1);
    let q = QueueDef {
        name: QueueName::new("q").unwrap(),
        uid,
        replica: None,
        config: QueueConfig::default(),
    };
    let first = gc.submit(vec![StoreOp::PutQueue(q)]).await.unwrap();
    ends.entered.recv().unwrap();
    // The writer is inside its first write; these 99 queue up behind it.
    let mut tickets = vec![];
    for i in 0..99u64 {
        let op = StoreOp::Queue {
            uid,
            op: PersistOp::ReserveSeq { until: Seq(i + 2) },
        };
        tickets.push(gc.submit(vec![op]).await.unwrap());
    }
    ends.open.send(()).unwrap();
    first.durable().await.unwrap();
    for t in tickets {
        t.durable().await.unwrap();
    }
    assert_eq!(
        gc.stats().writes.load(Ordering::Relaxed),
        2,
        "99 submissions shared one write"
    );
    assert_eq!(gc.stats().submissions.load(Ordering::Relaxed), 100);
    assert_eq!(
        inner.recover().unwrap()[0].seq_reserved_until,
        Seq(100),
        "applied in order"
    );
    drop(gc);
    thread.join().unwrap();
}

#[derive(Debug)]
struct Failing;
impl QueueStore for Failing {
    fn write(&self, _: &[Vec<StoreOp>]) -> Result<(), StoreError> {
        Err(StoreError::Io {
            context: "writing a batch",
            message: "disk on fire".into(),
        })
    }
    fn recover(&self) -> Result<Vec<RecoveredQueue>, StoreError> {
        Ok(vec![])
    }
    fn read_page(
        &self,
        _: QueueUid,
        _: Priority,
        from: Seq,
        _: Seq,
        _: usize,
        _: u64,
    ) -> Result<Page, StoreError> {
        Ok(Page {
            messages: vec![],
            next: from,
            end: true,
        })
    }
    fn find_by_header(
        &self,
        _: QueueUid,
        _: IndexedHeader,
        _: &str,
        _: usize,
    ) -> Result<Vec<(Priority, Seq)>, StoreError> {
        Ok(vec![])
    }
    fn read_messages(
        &self,
        _: QueueUid,
        _: &[(Priority, Seq)],
    ) -> Result<Vec<RecoveredMessage>, StoreError> {
        Ok(vec![])
    }
    fn find_message(&self, _: QueueUid, _: Seq) -> Result<Option<RecoveredMessage>, StoreError> {
        Ok(None)
    }
    fn read_delayed(&self, _: QueueUid, _: u64) -> Result<Vec<RecoveredMessage>, StoreError> {
        Ok(vec![])
    }
    fn read_marked(&self, _: QueueUid) -> Result<Vec<RecoveredMessage>, StoreError> {
        Ok(vec![])
    }
    fn kv_get(&self, _: KvSpace, _: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        Ok(None)
    }
    fn kv_scan(&self, _: KvSpace, _: &[u8]) -> Result<Vec<KeyValue>, StoreError> {
        Ok(vec![])
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_write_fails_every_submission_in_it() {
    let (store, ends) = Gated::new(Failing);
    let (gc, thread) = GroupCommit::start(store, 64, 64, Duration::from_millis(1)).unwrap();
    let uid = QueueUid(1);
    let first = gc.submit(reserve(uid, 2)).await.unwrap();
    ends.entered.recv().unwrap();
    // The writer is held inside its first write; these ten queue up behind it and go in one.
    let mut tickets = vec![];
    for i in 0..10 {
        tickets.push(gc.submit(reserve(uid, i + 3)).await.unwrap());
    }
    ends.open.send(()).unwrap();
    let err = first.durable().await.unwrap_err();
    assert!(matches!(err, StoreError::Io { .. }), "{err}");
    for (i, t) in tickets.into_iter().enumerate() {
        let result = t.durable().await;
        assert!(
            matches!(result, Err(StoreError::Io { .. })),
            "submission {i} of the failed write: {result:?}"
        );
    }
    assert_eq!(
        gc.stats().writes.load(Ordering::Relaxed),
        2,
        "the ten shared one write"
    );
    drop(gc);
    thread.join().unwrap();
}

fn reserve(uid: QueueUid, until: u64) -> Vec<StoreOp> {
    vec![StoreOp::Queue {
        uid,
        op: PersistOp::ReserveSeq { until: Seq(until) },
    }]
}

/// An hour: longer than any test, so only a synced write (or closing) can answer.
const NEVER: Duration = Duration::from_secs(3_600);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deferred_write_is_answered_only_once_a_later_synced_write_is_durable() {
    let (store, ends) = Gated::new(MemoryStore::new());
    let (gc, thread) = GroupCommit::start(store.clone(), 64, 64, NEVER).unwrap();
    let uid = QueueUid(1);
    let deferred = gc.submit_deferred(reserve(uid, 2)).await.unwrap();
    ends.unsynced.recv().unwrap();
    let mut deferred = Box::pin(deferred.durable());
    // The writer moves on to a synced write and is held inside it: it has done all it will for
    // the deferred one, which must still be waiting (not durable yet).
    let synced = gc.submit(reserve(uid, 3)).await.unwrap();
    ends.entered.recv().unwrap();
    assert!(
        futures::poll!(&mut deferred).is_pending(),
        "answered before anything synced it"
    );
    ends.open.send(()).unwrap();
    synced.durable().await.unwrap();
    deferred.await.unwrap();
    assert_eq!(store.log(), ["unsynced", "write"], "no sync of its own");
    assert_eq!(gc.stats().deferred.load(Ordering::Relaxed), 1);
    assert_eq!(gc.stats().deferred_syncs.load(Ordering::Relaxed), 0);
    drop(gc);
    thread.join().unwrap();
}

#[tokio::test]
async fn a_deferred_write_alone_is_synced_once_its_time_is_up() {
    let (store, _ends) = Gated::new(MemoryStore::new());
    let (gc, thread) = GroupCommit::start(store.clone(), 64, 64, Duration::from_millis(1)).unwrap();
    gc.submit_deferred(reserve(QueueUid(1), 2))
        .await
        .unwrap()
        .durable()
        .await
        .unwrap();
    assert_eq!(store.log(), ["unsynced", "sync"]);
    assert_eq!(gc.stats().deferred_syncs.load(Ordering::Relaxed), 1);
    drop(gc);
    thread.join().unwrap();
}

#[tokio::test]
async fn closing_syncs_deferred_writes_before_the_store_closes() {
    let (store, ends) = Gated::new(MemoryStore::new());
    let (gc, thread) = GroupCommit::start(store.clone(), 64, 64, NEVER).unwrap();
    let deferred = gc.submit_deferred(reserve(QueueUid(1), 2)).await.unwrap();
    ends.unsynced.recv().unwrap();
    gc.close().await;
    deferred.durable().await.unwrap();
    thread.join().unwrap();
    assert_eq!(store.log(), ["unsynced", "sync"]);
}

#[tokio::test]
async fn with_no_time_to_wait_a_deferred_write_is_synced_like_any_other() {
    let (store, ends) = Gated::new(MemoryStore::new());
    let (gc, thread) = GroupCommit::start(store.clone(), 64, 64, Duration::ZERO).unwrap();
    let ticket = gc.submit_deferred(reserve(QueueUid(1), 2)).await.unwrap();
    ends.entered.recv().unwrap();
    ends.open.send(()).unwrap();
    ticket.durable().await.unwrap();
    assert_eq!(store.log(), ["write"]);
    drop(gc);
    thread.join().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deferred_writes_past_their_time_are_synced_even_by_a_deferred_group() {
    // A steady run of deferred writes: the next one is already queued when the first has used
    // up its time, so the writer takes it before its timer fires. It must sync then, not leave
    // the first waiting behind yet another unsynced write.
    let (store, ends) = Gated::gating_unsynced(MemoryStore::new());
    let (gc, thread) = GroupCommit::start(store.clone(), 64, 64, Duration::from_nanos(1)).unwrap();
    let uid = QueueUid(1);
    let first = gc.submit_deferred(reserve(uid, 2)).await.unwrap();
    ends.entered.recv().unwrap();
    let second = gc.submit_deferred(reserve(uid, 3)).await.unwrap();
    ends.open.send(()).unwrap();
    first.durable().await.unwrap();
    second.durable().await.unwrap();
    assert_eq!(store.log(), ["unsynced", "write"]);
    drop(gc);
    thread.join().unwrap();
}

#[test]
fn a_replayable_write_is_answered_once_written_without_a_sync_even_with_no_time_to_wait() {
    let (store, ends) = Gated::gating_unsynced(MemoryStore::new());
    let (gc, thread) = GroupCommit::start(store.clone(), 64, 64, Duration::ZERO).unwrap();
    // The gate holds the first unsynced write: open it from here once the writer is in it.
    let gate = std::thread::spawn({
        let GateEnds { entered, open, .. } = ends;
        move || {
            entered.recv().unwrap();
            open.send(()).unwrap();
        }
    });
    gc.apply_blocking(reserve(QueueUid(1), 2)).unwrap();
    gate.join().unwrap();
    assert_eq!(store.log(), ["unsynced"], "no sync of its own");
    assert_eq!(gc.stats().replayable.load(Ordering::Relaxed), 1);
    assert_eq!(gc.stats().writes.load(Ordering::Relaxed), 0);
    // A synced write after it syncs it too (one sequential log).
    gc.commit_blocking(reserve(QueueUid(1), 3)).unwrap();
    assert_eq!(store.log(), ["unsynced", "write"]);
    drop(gc);
    thread.join().unwrap();
}
