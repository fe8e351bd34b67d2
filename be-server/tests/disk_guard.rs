//! The disk guard: while the data directory's disk is short of space, sends to durable queues
//! are refused, and everything that frees space goes on.

#![allow(clippy::unwrap_used)]

use std::sync::Arc;

use ferry_be_server::{Broker, BrokerConfig, Error, SystemClock};
use ferry_kernel::{
    Caller, NewMessage, NodeId, QueueConfig, QueueName, ReceiveRequest, SessionId, Wait,
};
use ferry_store::{CommitSettings, CommitWriter, MemoryStore, QueueStore};

fn config(dir: &std::path::Path, disk_free_min_bytes: u64) -> BrokerConfig {
    let mut c = BrokerConfig::new(NodeId::new("n").unwrap());
    c.disk_guard_dir = Some(dir.to_path_buf());
    c.disk_free_min_bytes = disk_free_min_bytes;
    c
}

async fn open(config: BrokerConfig, store: Arc<dyn QueueStore>) -> Broker {
    let writer = CommitWriter::start(store.clone(), CommitSettings::default()).unwrap();
    Broker::open(config, store, writer.handle(), Arc::new(SystemClock))
        .await
        .unwrap()
}

fn message() -> NewMessage {
    NewMessage {
        body: b"x".to_vec(),
        persistent: true,
        ..Default::default()
    }
}

fn receive(owner: Option<SessionId>, max_messages: u32) -> ReceiveRequest {
    ReceiveRequest {
        owner,
        max_messages,
        wait: Wait::NoWait,
        lease_ms: None,
        selector: None,
    }
}

fn is_disk_full(e: &Error) -> bool {
    matches!(
        e,
        Error::DiskFull {
            limit_bytes: u64::MAX,
            ..
        }
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_short_disk_refuses_sends_but_receives_acks_and_dead_letters_go_on() {
    let dir = tempfile::tempdir().unwrap();
    let store: Arc<dyn QueueStore> = Arc::new(MemoryStore::new());
    let q = QueueName::new("orders").unwrap();
    let b = open(config(dir.path(), 0), store.clone()).await;
    b.create_queue(q.clone(), QueueConfig::default(), false, false)
        .await
        .unwrap();
    b.send(&q, vec![message(), message(), message()])
        .await
        .unwrap();
    b.shutdown().await;

    // No disk has u64::MAX bytes free.
    let b = open(config(dir.path(), u64::MAX), store).await;
    let err = b.send(&q, vec![message()]).await.unwrap_err();
    assert!(is_disk_full(&err), "{err}");
    let err = b
        .stage(&q, SessionId(1), vec![message()])
        .await
        .unwrap_err();
    assert!(is_disk_full(&err), "{err}");

    let got = b.receive(&q, receive(Some(SessionId(2)), 3)).await.unwrap();
    assert_eq!(got.len(), 3);
    assert!(b
        .ack(&q, Caller::Backend, vec![got[0].lease_ref()], false)
        .await
        .unwrap()[0]
        .is_ok());
    let rejected = b
        .nack(&q, Caller::Backend, vec![got[1].lease_ref()], None, true)
        .await
        .unwrap();
    assert!(rejected[0].is_ok());
    // A transaction that only acknowledges commits.
    b.commit(SessionId(2), 0, vec![(q.clone(), vec![got[2].lease_ref()])])
        .await
        .unwrap();
    assert_eq!(b.stats(&q).await.unwrap().ready, 0);

    // The rejected message reached the dead-letter queue (created on demand) all the same: a
    // reject is answered only once its dead letters are in their queue, so one no-wait receive
    // must find it.
    let dlq = QueueName::new("orders.DLQ").unwrap();
    let dead = b.receive(&dlq, receive(None, 1)).await.unwrap();
    assert_eq!(dead.len(), 1, "the rejected message is not in {dlq}");

    // A temporary queue keeps nothing on disk: it still takes sends.
    let tmp = QueueName::new("tmp.n.c1.1").unwrap();
    b.create_queue(tmp.clone(), QueueConfig::default(), false, true)
        .await
        .unwrap();
    b.send(&tmp, vec![message()]).await.unwrap();
    b.shutdown().await;
}
