//! Persist, then reply: nobody hears of a change before it is durable.

#![allow(clippy::unwrap_used)]

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex};

use ferry_be_server::{Broker, BrokerConfig, SystemClock};
use ferry_kernel::{
    Caller, IndexedHeader, NewMessage, NodeId, Priority, QueueConfig, QueueName, QueueUid,
    ReceiveRequest, RecoveredMessage, Seq, SessionId, Wait,
};
use ferry_store::{
    CommitSettings, CommitWriter, KeyValue, KvSpace, MemoryStore, Page, QueueStore, RecoveredQueue,
    StoreError, StoreOp,
};

/// A store whose writes block while the gate is armed, and that counts writes (synced and not)
/// and logs which kind each was.
#[derive(Debug, Default)]
struct Gated {
    inner: MemoryStore,
    writes: AtomicUsize,
    gate: Mutex<Option<(mpsc::Sender<()>, mpsc::Receiver<()>)>>,
    /// Told of each unsynced write.
    unsynced: Mutex<Option<mpsc::Sender<()>>>,
    log: Mutex<Vec<&'static str>>,
    /// The gated write fails once released (as a full or broken disk makes it).
    fail_gated: std::sync::atomic::AtomicBool,
}

impl QueueStore for Gated {
    fn write(&self, batches: &[Vec<StoreOp>]) -> Result<(), StoreError> {
        let gate = self.gate.lock().unwrap().take();
        if let Some((entered, release)) = gate {
            entered.send(()).unwrap();
            release.recv().unwrap();
            if self.fail_gated.load(Ordering::SeqCst) {
                return Err(StoreError::Io {
                    context: "writing a batch",
                    message: "injected by the test".into(),
                });
            }
        }
        self.writes.fetch_add(1, Ordering::SeqCst);
        self.log.lock().unwrap().push("write");
        self.inner.write(batches)
    }
    fn write_unsynced(&self, batches: &[Vec<StoreOp>]) -> Result<(), StoreError> {
        self.writes.fetch_add(1, Ordering::SeqCst);
        self.log.lock().unwrap().push("unsynced");
        let result = self.inner.write(batches);
        if let Some(tx) = self.unsynced.lock().unwrap().as_ref() {
            tx.send(()).unwrap();
        }
        result
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

/// receiveNoWait of one message.
fn one_now() -> ReceiveRequest {
    ReceiveRequest {
        owner: None,
        max_messages: 1,
        wait: Wait::NoWait,
        lease_ms: None,
        selector: None,
    }
}

async fn broker(store: Arc<Gated>) -> Broker {
    broker_with(store, BrokerConfig::new(NodeId::new("n").unwrap())).await
}

async fn broker_with(store: Arc<Gated>, config: BrokerConfig) -> Broker {
    broker_with_settings(store, config, CommitSettings::default()).await
}

async fn broker_with_settings(
    store: Arc<Gated>,
    config: BrokerConfig,
    settings: CommitSettings,
) -> Broker {
    let writer = CommitWriter::start(store.clone(), settings).unwrap();
    let b = Broker::open(config, store, writer.handle(), Arc::new(SystemClock))
        .await
        .unwrap();
    b.create_queue(
        QueueName::new("q").unwrap(),
        QueueConfig::default(),
        false,
        false,
    )
    .await
    .unwrap();
    b
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sender_and_waiting_receiver_hear_only_after_the_write_is_durable() {
    let store = Arc::new(Gated::default());
    let b = broker(store.clone()).await;
    let q = QueueName::new("q").unwrap();
    let receiver = {
        let (b, q) = (b.clone(), q.clone());
        let req = ReceiveRequest {
            owner: Some(SessionId(1)),
            max_messages: 1,
            wait: Wait::Forever,
            lease_ms: None,
            selector: None,
        };
        tokio::spawn(async move { b.receive(&q, req).await })
    };
    // Make sure the receiver is parked before the send (stats count parked receivers).
    while b.stats(&q).await.unwrap().waiters == 0 {
        tokio::task::yield_now().await;
    }
    let (entered_tx, entered_rx) = mpsc::channel();
    let (release_tx, release_rx) = mpsc::channel();
    *store.gate.lock().unwrap() = Some((entered_tx, release_rx));
    let sender = {
        let (b, q) = (b.clone(), q.clone());
        let m = NewMessage {
            body: b"x".to_vec(),
            persistent: true,
            ..Default::default()
        };
        tokio::spawn(async move { b.send(&q, vec![m]).await })
    };
    tokio::task::spawn_blocking(move || entered_rx.recv().unwrap())
        .await
        .unwrap();
    // The write is in progress and cannot finish until released: neither may have an answer.
    for _ in 0..100 {
        tokio::task::yield_now().await;
    }
    assert!(
        !sender.is_finished(),
        "send confirmed before its write was durable"
    );
    assert!(
        !receiver.is_finished(),
        "receiver got a message before it was durable"
    );
    release_tx.send(()).unwrap();
    let ids = sender.await.unwrap().unwrap();
    let got = receiver.await.unwrap().unwrap();
    assert_eq!(got[0].message.id, ids[0]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn non_persistent_messages_never_touch_the_store() {
    let store = Arc::new(Gated::default());
    let b = broker(store.clone()).await;
    let q = QueueName::new("q").unwrap();
    let before = store.writes.load(Ordering::SeqCst);
    let m = NewMessage {
        body: b"x".to_vec(),
        persistent: false,
        ..Default::default()
    };
    b.send(&q, vec![m]).await.unwrap();
    let got = b.receive(&q, one_now()).await.unwrap();
    let results = b
        .ack(&q, Caller::Backend, vec![got[0].lease_ref()], false)
        .await
        .unwrap();
    assert!(results[0].is_ok());
    // The first send reserves a block of sequence numbers (one write); nothing else is written.
    assert_eq!(store.writes.load(Ordering::SeqCst), before + 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_queue_leaves_nothing_in_the_store() {
    let store = Arc::new(Gated::default());
    let b = broker(store.clone()).await;
    let q = QueueName::new("q").unwrap();
    let m = NewMessage {
        body: b"x".to_vec(),
        persistent: true,
        ..Default::default()
    };
    b.send(&q, vec![m]).await.unwrap();
    assert_eq!(b.delete_queue(&q).await.unwrap(), 1);
    // Only its dead-letter queue, created with it, is left (a queue of its own).
    let left: Vec<String> = store
        .recover()
        .unwrap()
        .iter()
        .map(|r| r.def.name.to_string())
        .collect();
    assert_eq!(left, ["q.DLQ"]);
    let err = b.send(&q, vec![NewMessage::default()]).await.unwrap_err();
    assert!(
        matches!(err, ferry_be_server::Error::QueueNotFound { .. }),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deferred_ack_is_answered_once_a_later_synced_write_made_it_durable() {
    let store = Arc::new(Gated::default());
    let (unsynced_tx, unsynced_rx) = mpsc::channel();
    *store.unsynced.lock().unwrap() = Some(unsynced_tx);
    let config = BrokerConfig::new(NodeId::new("n").unwrap());
    let settings = CommitSettings {
        // Longer than the test: only a synced write can answer the ack.
        defer_max: std::time::Duration::from_secs(3_600),
        ..CommitSettings::default()
    };
    let b = Arc::new(broker_with_settings(store.clone(), config, settings).await);
    let q = QueueName::new("q").unwrap();
    let persistent = || NewMessage {
        body: b"x".to_vec(),
        persistent: true,
        ..Default::default()
    };
    b.send(&q, vec![persistent()]).await.unwrap();
    let got = b.receive(&q, one_now()).await.unwrap();
    let ack = {
        let (b, q, lease) = (b.clone(), q.clone(), got[0].lease_ref());
        tokio::spawn(async move { b.ack(&q, Caller::Backend, vec![lease], true).await })
    };
    // The delete was applied without a sync of its own ...
    tokio::task::spawn_blocking(move || unsynced_rx.recv().unwrap())
        .await
        .unwrap();
    // ... and the next send's synced write makes it durable and answers it.
    b.send(&q, vec![persistent()]).await.unwrap();
    let results = ack.await.unwrap().unwrap();
    assert!(results[0].is_ok());
    let log = store.log.lock().unwrap().clone();
    assert_eq!(log[log.len() - 2..], ["unsynced", "write"]);
    assert_eq!(b.stats(&q).await.unwrap().leased, 0);
}

fn deduped(body: &str, dedup_id: &str) -> NewMessage {
    NewMessage {
        body: body.as_bytes().to_vec(),
        persistent: true,
        dedup_id: Some(dedup_id.into()),
        ..Default::default()
    }
}

// Postmortem: a send repeating a dedup id wrote nothing and its owner task answered it at once,
// ahead of the first send's write still on its way: a kill -9 right after the repeat's OK lost a
// confirmed message, and a failed first write left the repeat confirmed with nothing stored.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_that_writes_nothing_is_answered_behind_the_writes_before_it() {
    for first_write_fails in [false, true] {
        let store = Arc::new(Gated::default());
        store.fail_gated.store(first_write_fails, Ordering::SeqCst);
        let b = broker(store.clone()).await;
        let q = QueueName::new("q").unwrap();
        let (entered_tx, entered_rx) = mpsc::channel();
        let (release_tx, release_rx) = mpsc::channel();
        *store.gate.lock().unwrap() = Some((entered_tx, release_rx));
        let first = {
            let (b, q) = (b.clone(), q.clone());
            tokio::spawn(async move { b.send(&q, vec![deduped("first", "k")]).await })
        };
        tokio::task::spawn_blocking(move || entered_rx.recv().unwrap())
            .await
            .unwrap();
        // The repeat goes into the owner task's channel (one poll) ...
        let mut repeat = Box::pin(b.send(&q, vec![deduped("again", "k")]));
        assert!(futures::poll!(&mut repeat).is_pending());
        // ... and is handled before this later command is answered (one channel, in order).
        let _ = b.stats(&q).await.unwrap();
        assert!(
            futures::poll!(&mut repeat).is_pending(),
            "the repeat was confirmed while the first send's write was still on its way"
        );
        release_tx.send(()).unwrap();
        let first = first.await.unwrap();
        let repeat = repeat.await;
        if first_write_fails {
            assert!(first.is_err());
            assert!(
                repeat.is_err(),
                "the repeat of a send that failed must fail too"
            );
        } else {
            assert_eq!(repeat.unwrap(), first.unwrap());
        }
    }
}

// Postmortem: a rejected message's dead-letter queue was created a moment after the nack was
// answered, so a reader of <queue>.DLQ got NOT_FOUND and the message was in neither queue.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rejected_message_is_in_its_dead_letter_queue_when_the_reject_is_answered() {
    let store = Arc::new(Gated::default());
    let b = broker(store.clone()).await;
    let q = QueueName::new("q").unwrap();
    let dlq = QueueName::new("q.DLQ").unwrap();
    // Created with its queue; a dead-letter queue gets none of its own up front.
    assert!(b.get_queue(&dlq).is_ok());
    assert!(b.get_queue(&QueueName::new("q.DLQ.DLQ").unwrap()).is_err());
    for i in 0..20 {
        let m = NewMessage {
            body: format!("m{i}").into_bytes(),
            persistent: true,
            ..Default::default()
        };
        let ids = b.send(&q, vec![m]).await.unwrap();
        let got = b.receive(&q, one_now()).await.unwrap();
        let results = b
            .nack(
                &q,
                Caller::Client(None),
                vec![got[0].lease_ref()],
                None,
                true,
            )
            .await
            .unwrap();
        assert!(results[0].is_ok());
        let moved = b.receive(&dlq, one_now()).await.unwrap();
        assert_eq!(
            moved.len(),
            1,
            "round {i}: the rejected message is not in q.DLQ yet"
        );
        assert_eq!(
            moved[0].message.properties.get("FerryOriginalMessageId"),
            Some(&ferry_kernel::PropertyValue::String(ids[0].to_string()))
        );
        let acked = b
            .ack(
                &dlq,
                Caller::Client(None),
                vec![moved[0].lease_ref()],
                false,
            )
            .await
            .unwrap();
        assert!(acked[0].is_ok());
    }
}

// Postmortem: staged sends live only in the back-end's memory; a commit carried nothing naming
// the run that staged them, so after a restart a send-only commit answered OK and published
// nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_commit_naming_another_run_of_the_back_end_is_refused_and_rolled_back() {
    let store = Arc::new(Gated::default());
    let b = broker(store.clone()).await;
    let q = QueueName::new("q").unwrap();
    let session = SessionId(7);
    b.stage(&q, session, vec![deduped("staged", "t")])
        .await
        .unwrap();
    let other_run = b.incarnation().wrapping_add(1).max(1);
    let err = b
        .commit(session, other_run, vec![(q.clone(), vec![])])
        .await
        .unwrap_err();
    assert!(
        matches!(err, ferry_be_server::Error::TransactionFenced { .. }),
        "{err}"
    );
    assert_eq!(tonic::Status::from(err).code(), tonic::Code::Aborted);
    // Rolled back: a commit of this run now publishes nothing.
    b.commit(session, b.incarnation(), vec![(q.clone(), vec![])])
        .await
        .unwrap();
    assert_eq!(b.stats(&q).await.unwrap().ready, 0);
}

// Postmortem: deleting a queue answered its waiting receivers with an empty OK, which reads as
// "no message came in time".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleting_a_queue_answers_its_waiting_receivers_not_found() {
    let store = Arc::new(Gated::default());
    let b = broker(store.clone()).await;
    let q = QueueName::new("q").unwrap();
    let waiting = {
        let (b, q) = (b.clone(), q.clone());
        let req = ReceiveRequest {
            wait: Wait::Forever,
            ..one_now()
        };
        tokio::spawn(async move { b.receive(&q, req).await })
    };
    while b.stats(&q).await.unwrap().waiters == 0 {
        tokio::task::yield_now().await;
    }
    b.delete_queue(&q).await.unwrap();
    let err = waiting.await.unwrap().unwrap_err();
    assert!(
        matches!(err, ferry_be_server::Error::QueueNotFound { .. }),
        "{err}"
    );
}

/// Postmortem: events and history steps were published when the owner task decided, before the
/// write they describe was durable; a watcher could see a dead letter that a crash then undid.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_and_history_are_published_only_once_their_write_is_durable() {
    let store = Arc::new(Gated::default());
    let b = broker(store.clone()).await;
    let q = QueueName::new("q").unwrap();
    let m = NewMessage {
        body: b"x".to_vec(),
        persistent: true,
        ..Default::default()
    };
    let id = b.send(&q, vec![m]).await.unwrap()[0].to_string();
    let got = b.receive(&q, one_now()).await.unwrap();
    let steps_before = b.message_history(&id).len();
    assert!(
        steps_before >= 2,
        "sent and delivered: {steps_before} steps"
    );
    let mut events = b.subscribe_events();

    let (entered_tx, entered_rx) = mpsc::channel();
    let (release_tx, release_rx) = mpsc::channel();
    *store.gate.lock().unwrap() = Some((entered_tx, release_rx));
    let reject = {
        let (b, q, lease) = (b.clone(), q.clone(), got[0].lease_ref());
        tokio::spawn(async move { b.nack(&q, Caller::Backend, vec![lease], None, true).await })
    };
    tokio::task::spawn_blocking(move || entered_rx.recv().unwrap())
        .await
        .unwrap();
    for _ in 0..100 {
        tokio::task::yield_now().await;
    }
    assert!(
        matches!(
            events.try_recv(),
            Err(tokio::sync::broadcast::error::TryRecvError::Empty)
        ),
        "an event was published before its write was durable"
    );
    assert_eq!(
        b.message_history(&id).len(),
        steps_before,
        "a history step was kept before its write was durable"
    );
    release_tx.send(()).unwrap();
    reject.await.unwrap().unwrap()[0].as_ref().unwrap();
    let event = events.recv().await.unwrap();
    assert_eq!(
        (event.kind, event.message_id.as_str()),
        ("dead-lettered", id.as_str())
    );
    assert!(b.message_history(&id).len() > steps_before);
}
