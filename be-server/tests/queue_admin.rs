//! Changing a running queue's settings, sealing an empty queue for deletion, and counting the
//! deliveries a session holds: each one step of the queue's owner.

#![allow(clippy::unwrap_used)]

use std::sync::Arc;

use ferry_be_server::{BackendService, Broker, BrokerConfig, Error, SystemClock};
use ferry_kernel::{
    Caller, NewMessage, NodeId, QueueConfig, QueueName, ReceiveRequest, SessionId, Wait,
};
use ferry_proto::pb;
use ferry_proto::pb::backend_server::Backend as _;
use ferry_store::{CommitSettings, CommitWriter, MemoryStore, QueueStore};
use tonic::{Code, Request};

fn q(name: &str) -> QueueName {
    QueueName::new(name).unwrap()
}

/// A broker on `store` with queue `q` (default settings) if it does not exist yet.
async fn broker_on(store: Arc<dyn QueueStore>) -> Broker {
    let writer = CommitWriter::start(store.clone(), CommitSettings::default()).unwrap();
    let b = Broker::open(
        BrokerConfig::new(NodeId::new("n1").unwrap()),
        store,
        writer.handle(),
        Arc::new(SystemClock),
    )
    .await
    .unwrap();
    b.create_queue(q("q"), QueueConfig::default(), true, false)
        .await
        .unwrap();
    b
}

fn text(body: &str) -> NewMessage {
    NewMessage {
        body: body.as_bytes().to_vec(),
        ..NewMessage::default()
    }
}

fn receive(owner: Option<SessionId>, n: u32) -> ReceiveRequest {
    ReceiveRequest {
        owner,
        max_messages: n,
        wait: Wait::NoWait,
        lease_ms: None,
        selector: None,
    }
}

fn redeliveries(n: u32) -> pb::QueueConfig {
    pb::QueueConfig {
        redelivery: Some(pb::RedeliveryPolicy {
            max_redeliveries: Some(n),
            ..Default::default()
        }),
        ..Default::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_update_applies_from_the_next_return_on_and_survives_a_restart() {
    let store: Arc<dyn QueueStore> = Arc::new(MemoryStore::new());
    let b = broker_on(store.clone()).await;
    let mut events = b.subscribe_events();
    let (before, after) = b
        .update_queue(&q("q"), redeliveries(0))
        .await
        .unwrap()
        .expect("changed");
    assert_eq!(before.redelivery.max_redeliveries, Some(6));
    assert_eq!(after.redelivery.max_redeliveries, Some(0));
    assert_eq!(
        after.default_lease_ms, before.default_lease_ms,
        "what the change does not name stays"
    );
    let e = events.recv().await.unwrap();
    assert_eq!(
        (e.kind, e.queue.as_ref().map(|q| q.as_str())),
        ("queue-updated", Some("q"))
    );
    assert_eq!(e.detail, "redelivery.max_redeliveries: 6 -> 0");
    // The same change again changes nothing.
    assert!(b
        .update_queue(&q("q"), redeliveries(0))
        .await
        .unwrap()
        .is_none());

    // Live: with no redelivery allowed, the first return dead-letters the message.
    b.send(&q("q"), vec![text("once")]).await.unwrap();
    let d = b.receive(&q("q"), receive(None, 1)).await.unwrap();
    b.nack(
        &q("q"),
        Caller::Client(None),
        vec![d[0].lease_ref()],
        None,
        false,
    )
    .await
    .unwrap();
    let dlq = b.stats(&q("q.DLQ")).await.unwrap();
    assert_eq!(dlq.ready, 1, "dead-lettered by the new setting");

    // Invalid settings are refused as at creation, and change nothing.
    let bad = pb::QueueConfig {
        default_lease_ms: Some(0),
        ..Default::default()
    };
    let e = b.update_queue(&q("q"), bad).await.unwrap_err();
    assert!(e.to_string().contains("default_lease_ms"), "{e}");
    assert_eq!(
        b.get_queue(&q("q"))
            .unwrap()
            .config
            .redelivery
            .max_redeliveries,
        Some(0)
    );

    // Durable: a back-end opened on the same store has the new settings.
    b.shutdown().await;
    let again = broker_on(store).await;
    assert_eq!(
        again
            .get_queue(&q("q"))
            .unwrap()
            .config
            .redelivery
            .max_redeliveries,
        Some(0)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_temporary_queue_has_no_settings_to_change() {
    let b = broker_on(Arc::new(MemoryStore::new())).await;
    b.create_queue(q("tmp.n1.c1.1"), QueueConfig::default(), false, true)
        .await
        .unwrap();
    let e = b
        .update_queue(&q("tmp.n1.c1.1"), redeliveries(1))
        .await
        .unwrap_err();
    assert!(matches!(e, Error::CannotUpdate { .. }), "{e}");
    assert_eq!(tonic::Status::from(e).code(), Code::InvalidArgument);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_seal_is_refused_for_a_queue_holding_messages_and_stops_sends_to_an_empty_one() {
    let b = broker_on(Arc::new(MemoryStore::new())).await;
    let be = BackendService::new(b.clone());
    let seal = |seal: bool| {
        Request::new(pb::BackendSealQueueRequest {
            name: "q".into(),
            placement_epoch: 0,
            seal,
        })
    };
    b.send(&q("q"), vec![text("a"), text("b")]).await.unwrap();
    // One of them delivered and not acknowledged: it counts too.
    b.receive(&q("q"), receive(None, 1)).await.unwrap();
    let e = be.seal_queue(seal(true)).await.unwrap_err();
    assert_eq!(e.code(), Code::FailedPrecondition);
    assert!(
        e.message().contains("1 ready") && e.message().contains("1 delivered"),
        "{}",
        e.message()
    );
    b.send(&q("q"), vec![text("still taken")]).await.unwrap();

    b.purge(&q("q")).await.unwrap();
    let empty = q("empty");
    b.create_queue(empty.clone(), QueueConfig::default(), false, false)
        .await
        .unwrap();
    b.seal_queue(&empty, true).await.unwrap();
    let e = b.send(&empty, vec![text("late")]).await.unwrap_err();
    assert!(matches!(e, Error::QueueDeleting { .. }), "{e}");
    assert_eq!(tonic::Status::from(e).code(), Code::FailedPrecondition);
    b.seal_queue(&empty, false).await.unwrap();
    b.send(&empty, vec![text("taken again")]).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_deliveries_each_session_holds_are_counted() {
    let b = broker_on(Arc::new(MemoryStore::new())).await;
    let (s1, s2, s3) = (SessionId(1), SessionId(2), SessionId(3));
    b.send(&q("q"), (0..5).map(|i| text(&i.to_string())).collect())
        .await
        .unwrap();
    b.receive(&q("q"), receive(Some(s1), 3)).await.unwrap();
    let d = b.receive(&q("q"), receive(Some(s2), 2)).await.unwrap();
    b.ack(
        &q("q"),
        Caller::Client(Some(s2)),
        vec![d[0].lease_ref()],
        false,
    )
    .await
    .unwrap();
    assert_eq!(
        b.session_leases(&q("q"), vec![s1, s2, s3]).await.unwrap(),
        [3, 1, 0]
    );
}

/// The back-end's total of the bytes its queues hold follows them without asking each queue
/// (the node reads it every 2 s for the placement rule; asking every owner task cost a round
/// trip per queue).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_bytes_held_are_totalled_as_queues_change() {
    let b = broker_on(Arc::new(MemoryStore::new())).await;
    b.create_queue(q("r"), QueueConfig::default(), false, false)
        .await
        .unwrap();
    assert_eq!(b.stored_bytes(), 0);
    b.send(&q("q"), vec![text("hello"), text("world!")])
        .await
        .unwrap();
    b.send(&q("r"), vec![text("abc")]).await.unwrap();
    // A call through each queue's task: the send's wake-up has reported by the time it answers.
    let held = b.stats(&q("q")).await.unwrap().bytes + b.stats(&q("r")).await.unwrap().bytes;
    assert!(held >= 14, "{held}");
    assert_eq!(b.stored_bytes(), held);
    b.delete_queue(&q("r")).await.unwrap();
    assert_eq!(b.stored_bytes(), b.stats(&q("q")).await.unwrap().bytes);
}
