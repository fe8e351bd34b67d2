//! Fencing by placement: a back-end answers for a queue only at the placement epoch it owns it
//! at; any other epoch is refused with a structured "not the owner" detail.

#![allow(clippy::unwrap_used)]

use std::sync::Arc;

use ferry_be_server::{BackendService, Broker, BrokerConfig, SystemClock};
use ferry_kernel::{NodeId, PlacementEpoch, QueueConfig, QueueName};
use ferry_proto::pb;
use ferry_proto::pb::backend_server::Backend as _;
use ferry_store::{CommitSettings, CommitWriter, MemoryStore, QueueStore};
use tonic::{Code, Request};

async fn backend() -> (Broker, BackendService) {
    let store: Arc<dyn QueueStore> = Arc::new(MemoryStore::new());
    let writer = CommitWriter::start(store.clone(), CommitSettings::default()).unwrap();
    let b = Broker::open(
        BrokerConfig::new(NodeId::new("n1").unwrap()),
        store,
        writer.handle(),
        Arc::new(SystemClock),
    )
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
    (b.clone(), BackendService::new(b))
}

fn stats(epoch: PlacementEpoch) -> Request<pb::BackendQueueRequest> {
    Request::new(pb::BackendQueueRequest {
        name: "q".into(),
        placement_epoch: epoch.get(),
        wait_placed_ms: 0,
        wait_settings: None,
    })
}

fn send(epoch: PlacementEpoch) -> Request<pb::BackendSendRequest> {
    Request::new(pb::BackendSendRequest {
        queue: "q".into(),
        messages: vec![pb::OutgoingMessage {
            body: b"x".to_vec().into(),
            ..Default::default()
        }],
        placement_epoch: epoch.get(),
        ..Default::default()
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_routed_by_another_epoch_is_refused_with_the_owner_and_its_epoch() {
    let (_, be) = backend().await;
    // Unknown epoch (0) and the epoch the queue is owned at are served.
    be.get_queue_stats(stats(PlacementEpoch::UNKNOWN))
        .await
        .unwrap();
    be.get_queue_stats(stats(PlacementEpoch::STATIC))
        .await
        .unwrap();
    be.send(send(PlacementEpoch::STATIC)).await.unwrap();

    let refused = be.send(send(PlacementEpoch::new(7))).await.unwrap_err();
    assert_eq!(refused.code(), Code::FailedPrecondition, "{refused}");
    let detail = ferry_proto::not_owner_of(&refused).expect("a NotOwner detail");
    assert_eq!(
        (
            detail.queue.as_str(),
            detail.owner_node.as_str(),
            detail.epoch
        ),
        ("q", "n1", PlacementEpoch::STATIC.get())
    );
    // Nothing was stored by the refused send.
    let s = be
        .get_queue_stats(stats(PlacementEpoch::UNKNOWN))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(s.ready, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn once_the_epoch_moves_on_calls_routed_by_the_former_one_are_fenced() {
    let (broker, be) = backend().await;
    let moved = PlacementEpoch::new(2);
    assert!(broker.set_placement_epoch(&QueueName::new("q").unwrap(), moved));
    let fenced = be
        .get_queue_stats(stats(PlacementEpoch::STATIC))
        .await
        .unwrap_err();
    assert_eq!(
        ferry_proto::not_owner_of(&fenced).map(|n| n.epoch),
        Some(moved.get()),
        "{fenced}"
    );
    be.get_queue_stats(stats(moved)).await.unwrap();
    // A queue this back-end does not have is NOT_FOUND, whatever the epoch.
    let missing = be
        .get_queue_stats(Request::new(pb::BackendQueueRequest {
            name: "nope".into(),
            placement_epoch: moved.get(),
            wait_placed_ms: 0,
            wait_settings: None,
        }))
        .await
        .unwrap_err();
    assert_eq!(missing.code(), Code::NotFound);
    assert!(!broker.set_placement_epoch(&QueueName::new("nope").unwrap(), PlacementEpoch::new(3)));
}

/// A `GetQueue` with `wait_placed_ms` for a queue the metadata just defined answers as soon as
/// the queue is here at the asked epoch, woken by its placement rather than at the end of its
/// wait, and with NOT_FOUND at the end of its wait when the queue never comes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_get_queue_that_waits_for_its_placement_answers_once_the_queue_is_placed() {
    const WAIT: std::time::Duration = std::time::Duration::from_secs(20);
    let (broker, be) = backend().await;
    let epoch = PlacementEpoch::new(7);
    let ask = move |name: &str, wait: std::time::Duration| {
        Request::new(pb::BackendQueueRequest {
            name: name.into(),
            placement_epoch: epoch.get(),
            wait_placed_ms: u64::try_from(wait.as_millis()).unwrap(),
            wait_settings: None,
        })
    };
    // Without a wait: NOT_FOUND at once.
    let e = be
        .get_queue(ask("fresh", std::time::Duration::ZERO))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::NotFound, "{e}");
    // Created as the metadata's apply does it: first the queue, then its epoch.
    let fresh = QueueName::new("fresh").unwrap();
    broker
        .create_queue(fresh.clone(), QueueConfig::default(), false, false)
        .await
        .unwrap();
    let started = std::time::Instant::now();
    let wait = broker.wait_placed(&fresh, epoch, |_| true, WAIT);
    tokio::pin!(wait);
    // Polled once: it waits (the queue is here, at another epoch).
    assert!(futures::poll!(&mut wait).is_pending(), "placed too soon");
    assert!(broker.set_placement_epoch(&fresh, epoch));
    assert!(wait.await, "placed");
    // A wait that missed the placement would end only at its 20 s bound.
    assert!(
        started.elapsed() < WAIT,
        "woken by the placement, not by the end of its wait: {:?}",
        started.elapsed()
    );
    // Now the call answers at once.
    let info = be.get_queue(ask("fresh", WAIT)).await.unwrap().into_inner();
    assert_eq!(info.name, "fresh");

    // A queue that never comes: NOT_FOUND once the wait is over.
    let wait = std::time::Duration::from_millis(200);
    let started = std::time::Instant::now();
    let e = be.get_queue(ask("never", wait)).await.unwrap_err();
    assert_eq!(e.code(), Code::NotFound, "{e}");
    assert!(started.elapsed() >= wait);
}

/// An update its owner applies when it applies the metadata change: a `GetQueue` waiting for
/// the new settings (`wait_settings`) answers as soon as they are served, woken by the update
/// rather than at the end of its wait; without the update it answers, with what is served, at
/// the end of its wait.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_get_queue_that_waits_for_new_settings_answers_once_they_are_served() {
    use ferry_proto::convert::{queue_config_from_pb, queue_config_to_pb};
    const WAIT: std::time::Duration = std::time::Duration::from_secs(20);
    let (broker, be) = backend().await;
    let q = QueueName::new("q").unwrap();
    let ask = |wait: std::time::Duration, settings: &pb::QueueConfig| {
        Request::new(pb::BackendQueueRequest {
            name: "q".into(),
            placement_epoch: PlacementEpoch::STATIC.get(),
            wait_placed_ms: u64::try_from(wait.as_millis()).unwrap(),
            wait_settings: Some(settings.clone()),
        })
    };
    let served = be.get_queue(stats(PlacementEpoch::STATIC)).await.unwrap();
    let before = served.into_inner().config.unwrap();
    let patch = pb::QueueConfig {
        max_messages: Some(5),
        ..Default::default()
    };
    let current = queue_config_from_pb(Some(before.clone()), &QueueConfig::default()).unwrap();
    let expected = queue_config_to_pb(
        &q,
        &queue_config_from_pb(Some(patch.clone()), &current).unwrap(),
    );
    assert_ne!(expected, before);

    // Not applied: the answer comes at the end of the wait, showing what is served.
    let short = std::time::Duration::from_millis(200);
    let started = std::time::Instant::now();
    let info = be
        .get_queue(ask(short, &expected))
        .await
        .unwrap()
        .into_inner();
    assert!(started.elapsed() >= short);
    assert_eq!(info.config.as_ref(), Some(&before));

    let started = std::time::Instant::now();
    let get = be.get_queue(ask(WAIT, &expected));
    tokio::pin!(get);
    assert!(
        futures::poll!(&mut get).is_pending(),
        "answered before the update"
    );
    broker.update_queue(&q, patch).await.unwrap();
    let info = get.await.unwrap().into_inner();
    assert_eq!(info.config.as_ref(), Some(&expected));
    assert!(
        started.elapsed() < WAIT,
        "woken by the update, not by the end of its wait: {:?}",
        started.elapsed()
    );
}
