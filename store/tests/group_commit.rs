//! Group commit shares one synced write among everyone queued when the writer gets to them.

#![allow(clippy::unwrap_used)]

use std::sync::atomic::Ordering;
use std::sync::{mpsc, Arc, Mutex};

use ferry_kernel::{
    IndexedHeader, PersistOp, Priority, QueueConfig, QueueName, QueueUid, RecoveredMessage, Seq,
};
use ferry_store::{
    GroupCommit, MemoryStore, Page, QueueDef, QueueStore, RecoveredQueue, StoreError, StoreOp,
};

/// A store whose first write blocks until the test opens the gate, so the test knows exactly what
/// is queued behind it.
#[derive(Debug)]
struct Gated {
    inner: MemoryStore,
    entered: Mutex<Option<mpsc::Sender<()>>>,
    gate: Mutex<Option<mpsc::Receiver<()>>>,
}

impl QueueStore for Gated {
    fn write(&self, batches: &[Vec<StoreOp>]) -> Result<(), StoreError> {
        if let Some(tx) = self.entered.lock().unwrap().take() {
            tx.send(()).unwrap();
            let gate = self.gate.lock().unwrap().take().unwrap();
            gate.recv().unwrap();
        }
        self.inner.write(batches)
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
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_submissions_share_one_write_and_all_become_durable() {
    let (entered_tx, entered_rx) = mpsc::channel();
    let (gate_tx, gate_rx) = mpsc::channel();
    let inner = MemoryStore::new();
    let store = Arc::new(Gated {
        inner: inner.clone(),
        entered: Mutex::new(Some(entered_tx)),
        gate: Mutex::new(Some(gate_rx)),
    });
    let (gc, thread) = GroupCommit::start(store, 1024, 1024).unwrap();
    let uid = QueueUid(1);
    let q = QueueDef {
        name: QueueName::new("q").unwrap(),
        uid,
        config: QueueConfig::default(),
    };
    let first = gc.submit(vec![StoreOp::PutQueue(q)]).await.unwrap();
    entered_rx.recv().unwrap();
    // The writer is inside its first write; these 99 queue up behind it.
    let mut tickets = vec![];
    for i in 0..99u64 {
        let op = StoreOp::Queue {
            uid,
            op: PersistOp::ReserveSeq { until: Seq(i + 2) },
        };
        tickets.push(gc.submit(vec![op]).await.unwrap());
    }
    gate_tx.send(()).unwrap();
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
}

#[tokio::test]
async fn a_failed_write_fails_every_submission_in_it() {
    let (gc, _thread) = GroupCommit::start(Arc::new(Failing), 8, 8).unwrap();
    let err = gc.commit(vec![]).await.unwrap_err();
    assert!(matches!(err, StoreError::Io { .. }), "{err}");
}
