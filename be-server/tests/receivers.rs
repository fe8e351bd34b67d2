//! Waiting receivers as the queue counts them: the receives one consumer keeps open count once.

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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn receives_tagged_with_one_consumer_count_as_one_waiting_receiver() {
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
