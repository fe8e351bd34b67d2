//! Waiting receivers as the queue counts them: the receives one consumer keeps open count once;
//! how they end when the node stops.

#![allow(clippy::unwrap_used)]

use std::sync::Arc;

use ferry_be_server::{Broker, BrokerConfig, SystemClock};
use ferry_kernel::{NodeId, QueueConfig, QueueName, ReceiveRequest, Wait};
use ferry_store::{CommitSettings, CommitWriter, MemoryStore, QueueStore};

fn forever() -> ReceiveRequest {
    ReceiveRequest {
        owner: None,
        max_messages: 10,
        wait: Wait::Forever,
        lease_ms: None,
        selector: None,
    }
}

/// A broker over a memory store with queue `q`.
async fn broker_with_a_queue() -> (Broker, QueueName) {
    let store: Arc<dyn QueueStore> = Arc::new(MemoryStore::new());
    let writer = CommitWriter::start(store.clone(), CommitSettings::default()).unwrap();
    let b = Broker::open(
        BrokerConfig::new(NodeId::new("n").unwrap()),
        store,
        writer.handle(),
        Arc::new(SystemClock),
    )
    .await
    .unwrap();
    let q = QueueName::new("q").unwrap();
    b.create_queue(q.clone(), QueueConfig::default(), false, false)
        .await
        .unwrap();
    (b, q)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn receives_tagged_with_one_consumer_count_as_one_waiting_receiver() {
    let (b, q) = broker_with_a_queue().await;
    // A consumer's two receives, another consumer's one, and two untagged receives. Polling
    // each once hands its receive to the queue's owner task, ahead of the stats call below.
    let mut receives = vec![
        Box::pin(b.receive_for(&q, forever(), 7)),
        Box::pin(b.receive_for(&q, forever(), 7)),
        Box::pin(b.receive_for(&q, forever(), 8)),
        Box::pin(b.receive_for(&q, forever(), 0)),
        Box::pin(b.receive_for(&q, forever(), 0)),
    ];
    for r in &mut receives {
        assert!(futures::poll!(r.as_mut()).is_pending());
    }
    assert_eq!(b.stats(&q).await.unwrap().waiters, 4);
    // A receive that stops waiting is no longer counted; its consumer still is, by the other.
    drop(receives.remove(0));
    assert_eq!(b.stats(&q).await.unwrap().waiters, 4);
    drop(receives.remove(0));
    assert_eq!(b.stats(&q).await.unwrap().waiters, 3);
}

// Postmortem: a receive parked when the node stopped was answered empty, as if no message had
// come; a receiver on another node could not tell.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_parked_receive_is_told_the_node_is_shutting_down() {
    let (b, q) = broker_with_a_queue().await;
    let mut parked = Box::pin(b.receive_for(&q, forever(), 0));
    assert!(futures::poll!(parked.as_mut()).is_pending());
    let mut stopped = Box::pin(b.stopped());
    assert!(
        futures::poll!(stopped.as_mut()).is_pending(),
        "not stopping yet"
    );
    b.shutdown().await;
    stopped.await;
    let e = parked.await.expect_err("the stop ends it with an error");
    assert!(matches!(e, ferry_be_server::Error::ShuttingDown), "{e}");
}
