//! The core's commands against fake back-ends, under a paused tokio clock and a manual wall
//! clock.

use std::sync::Arc;
use std::time::Duration;

use ferry_kernel::{
    LeaseId, ManualClock, NodeId, PlacementEpoch, QueueName, QueueUid, ReceiptHandle, Seq,
};
use ferry_proto::pb;
use tokio::sync::watch;

use super::Dispatch;
use crate::fake::{Call, FakeBackend};
use crate::router::{Owner, Placement, Router};
use crate::FrontendConfig;

const WALL_START_MS: u64 = 1_700_000_000_000;

struct Fixture {
    core: Dispatch,
    clock: Arc<ManualClock>,
    a: Arc<FakeBackend>,
    b: Arc<FakeBackend>,
    placement: watch::Sender<Arc<Placement>>,
    /// Set: the node is stopping.
    stop: watch::Sender<bool>,
}

fn node(n: &str) -> NodeId {
    NodeId::new(n).expect("a node id")
}

fn queue(q: &str) -> QueueName {
    QueueName::new(q).expect("a queue name")
}

/// This node a, another node b; `orders` placed on a, `invoices` on b (at the static
/// epoch).
fn fixture() -> Fixture {
    let (a, b) = (FakeBackend::new(), FakeBackend::new());
    let placed = |n: &str| Owner {
        node: node(n),
        epoch: PlacementEpoch::STATIC,
    };
    let placement = Placement::new(node("a"), a.backend())
        .with_node(node("b"), b.backend())
        .with_queue(queue("orders"), placed("a"))
        .with_queue(queue("invoices"), placed("b"));
    let (router, placement_tx) = Router::fixed(placement);
    let (stop_tx, stopping) = watch::channel(false);
    let clock = ManualClock::new(WALL_START_MS);
    let config = FrontendConfig {
        connection_lease_min_ms: 1_000,
        ..FrontendConfig::default()
    };
    let core = Dispatch::new(config, Arc::new(router), stopping, clock.clone());
    Fixture {
        core,
        clock,
        a,
        b,
        placement: placement_tx,
        stop: stop_tx,
    }
}

fn handle(q: &str) -> String {
    ReceiptHandle {
        queue: queue(q),
        uid: QueueUid(7),
        seq: Seq(1),
        lease: LeaseId(1),
        delivery_count: 1,
        tag: 0xabc,
    }
    .to_string()
}

fn call(method: &'static str, q: &str, epoch: PlacementEpoch) -> Call {
    Call {
        method,
        queues: vec![q.into()],
        epochs: vec![epoch],
    }
}

#[tokio::test]
async fn an_ack_is_routed_by_the_queue_of_its_handle_through_placement() {
    let f = fixture();
    // A handle names no node: orders lives on a now (it may have moved since the delivery).
    let r = pb::AckRequest {
        receipt_handles: vec![handle("orders"), handle("invoices")],
        ..Default::default()
    };
    f.core.ack(r).await.expect("acknowledged");
    assert_eq!(
        f.a.calls(),
        vec![call("ack", "orders", PlacementEpoch::STATIC)]
    );
    assert_eq!(
        f.b.calls(),
        vec![call("ack", "invoices", PlacementEpoch::STATIC)]
    );
}

#[tokio::test]
async fn sends_and_receives_carry_the_placement_epoch() {
    let f = fixture();
    let send = pb::SendRequest {
        queue: "invoices".into(),
        messages: vec![pb::OutgoingMessage::default()],
        ..Default::default()
    };
    f.core.send(send).await.expect("sent");
    let receive = pb::ReceiveRequest {
        queue: "scratch".into(),
        wait_ms: Some(0),
        ..Default::default()
    };
    f.core.receive(receive, None).await.expect("received");
    assert_eq!(
        f.b.calls(),
        vec![call("send", "invoices", PlacementEpoch::STATIC)]
    );
    assert_eq!(
        f.a.calls(),
        vec![call("receive", "scratch", PlacementEpoch::UNKNOWN)]
    );
}

// Postmortem: a receive parked when the node stopped was answered empty, and `ferry receive`
// said "no message arrived" and exited 0.
#[tokio::test(start_paused = true)]
async fn a_parked_receive_ends_unavailable_when_the_node_stops() {
    let f = fixture();
    f.a.park_receives();
    let receive = pb::ReceiveRequest {
        queue: "orders".into(),
        ..Default::default()
    };
    let mut receive = std::pin::pin!(f.core.receive(receive, None));
    assert!(futures::poll!(&mut receive).is_pending(), "parked");
    assert_eq!(
        f.a.calls(),
        vec![call("receive", "orders", PlacementEpoch::STATIC)]
    );
    f.stop.send_replace(true);
    let e = receive.await.expect_err("the stop ends it with an error");
    assert_eq!(e.code(), tonic::Code::Unavailable, "{e:?}");
    assert_eq!(
        e.message(),
        "node a is shutting down; retry on another node or after it restarts"
    );
}

#[tokio::test(start_paused = true)]
async fn a_send_carries_its_messages_on_every_try() {
    let f = fixture();
    let send = |q: &str, n: usize| pb::SendRequest {
        queue: q.into(),
        messages: vec![pb::OutgoingMessage::default(); n],
        ..Default::default()
    };
    // At an unknown epoch the messages go as they are (nothing kept for a retry).
    f.core.send(send("scratch", 2)).await.expect("sent");
    assert_eq!(f.a.sent(), vec![2]);
    // At a known epoch a copy goes, so the retry after "not the owner" has them all.
    f.b.script([ferry_proto::not_owner_status(pb::NotOwner {
        queue: "invoices".into(),
        owner_node: String::new(),
        epoch: 0,
    })]);
    f.core
        .send(send("invoices", 3))
        .await
        .expect("sent on the retry");
    assert_eq!(f.b.sent(), vec![3, 3]);
}

#[tokio::test]
async fn a_temporary_queue_is_created_on_this_node_and_named_after_it() {
    let f = fixture();
    let (connection_id, _) = f.core.sessions.open("c".into(), None).expect("open");
    let r = pb::CreateTemporaryQueueRequest { connection_id };
    let name = f
        .core
        .create_temporary_queue(r)
        .await
        .expect("created")
        .queue;
    assert!(name.starts_with("tmp.a."), "{name}");
    assert_eq!(
        f.a.calls(),
        vec![call("create_queue", &name, PlacementEpoch::UNKNOWN)]
    );
    assert!(f.b.calls().is_empty());
}

#[tokio::test]
async fn a_transaction_commits_at_the_owner_of_its_queues_with_their_epochs() {
    let f = fixture();
    let (connection_id, _) = f.core.sessions.open("c".into(), None).expect("open");
    let session = f
        .core
        .create_session(pb::CreateSessionRequest {
            connection_id,
            ack_mode: pb::AckMode::Transacted as i32,
        })
        .expect("a session")
        .session_id;
    let send = |q: &str| pb::SendRequest {
        session_id: session.clone(),
        queue: q.into(),
        messages: vec![pb::OutgoingMessage::default()],
    };
    f.core.send(send("invoices")).await.expect("staged");
    // A queue on another back-end cannot join the transaction.
    let e = f
        .core
        .send(send("orders"))
        .await
        .expect_err("spans back-ends");
    assert_eq!(e.code(), tonic::Code::FailedPrecondition);
    let commit = pb::CommitRequest {
        session_id: session.clone(),
        receipt_handles: vec![handle("invoices")],
    };
    f.core.commit(commit).await.expect("committed");
    let calls = f.b.calls();
    assert_eq!(calls.len(), 2, "{calls:?}");
    assert_eq!(calls[1], call("commit", "invoices", PlacementEpoch::STATIC));
}

#[tokio::test(start_paused = true)]
async fn a_heartbeat_answers_its_lease_expiry_in_wall_time_of_the_injected_clock() {
    let f = fixture();
    let (connection_id, lease_ms) = f.core.sessions.open("c".into(), Some(5_000)).expect("open");
    assert_eq!(lease_ms, 5_000);
    f.clock.advance_ms(1_234);
    let r = pb::HeartbeatRequest { connection_id };
    let answer = f.core.heartbeat(r).await.expect("alive");
    assert_eq!(answer.lease_expires_at_ms, WALL_START_MS + 1_234 + 5_000);
}

#[tokio::test(start_paused = true)]
async fn a_connection_lease_runs_out_after_its_length_unless_renewed() {
    let f = fixture();
    let sessions = &f.core.sessions;
    let (id, _) = sessions.open("c".into(), Some(2_000)).expect("open");
    tokio::time::advance(Duration::from_millis(1_500)).await;
    // Any call naming the connection renews it for its whole length.
    sessions.touch(&id).expect("still open");
    tokio::time::advance(Duration::from_millis(1_999)).await;
    assert!(sessions
        .close_expired(tokio::time::Instant::now())
        .is_empty());
    tokio::time::advance(Duration::from_millis(1)).await;
    let closed = sessions.close_expired(tokio::time::Instant::now());
    assert_eq!(closed.len(), 1);
    assert_eq!(closed[0].0, id);
    assert!(sessions.touch(&id).is_err(), "gone once closed");
}

#[tokio::test(start_paused = true)]
async fn a_lost_connection_releases_its_sessions_leases_at_each_owner() {
    let f = fixture();
    let (connection_id, _) = f.core.sessions.open("c".into(), Some(1_000)).expect("open");
    let session_id = f
        .core
        .create_session(pb::CreateSessionRequest {
            connection_id: connection_id.clone(),
            ack_mode: pb::AckMode::Client as i32,
        })
        .expect("a session")
        .session_id;
    for q in ["orders", "invoices"] {
        let r = pb::ReceiveRequest {
            session_id: session_id.clone(),
            queue: q.into(),
            wait_ms: Some(0),
            ..Default::default()
        };
        f.core.receive(r, None).await.expect("received");
    }
    tokio::time::advance(Duration::from_millis(1_000)).await;
    for (_, closed) in f.core.sessions.close_expired(tokio::time::Instant::now()) {
        f.core.release(closed).await;
    }
    let release = |q: &str| call("release_session", q, PlacementEpoch::STATIC);
    assert_eq!(f.a.calls()[1], release("orders"));
    assert_eq!(f.b.calls()[1], release("invoices"));
}

fn handle_at(q: &str, seq: u64, lease: u64) -> String {
    ReceiptHandle {
        queue: queue(q),
        uid: QueueUid(7),
        seq: Seq(seq),
        lease: LeaseId(lease),
        delivery_count: 1,
        tag: 0xabc,
    }
    .to_string()
}

/// `feed` is replicated in shard 1 (replicas b, then a), on top of [`fixture`].
fn with_replicated_feed(f: &Fixture) {
    let shard = ferry_kernel::ShardId(1);
    let placement = f
        .placement
        .borrow()
        .as_ref()
        .clone()
        .with_queue(
            queue("feed"),
            Owner {
                node: node("b"),
                epoch: PlacementEpoch::STATIC,
            },
        )
        .with_shard_queue(queue("feed"), shard)
        .with_shard(shard, vec![node("b"), node("a")]);
    f.placement.send_replace(Arc::new(placement));
}

/// A session of `f`'s front-end, in client-acknowledge mode.
fn client_session(f: &Fixture) -> String {
    let (connection_id, _) = f.core.sessions.open("c".into(), None).expect("open");
    f.core
        .create_session(pb::CreateSessionRequest {
            connection_id,
            ack_mode: pb::AckMode::Client as i32,
        })
        .expect("a session")
        .session_id
}

fn methods(calls: Vec<Call>) -> Vec<&'static str> {
    calls.into_iter().map(|c| c.method).collect()
}

/// What tonic makes of a receive whose link broke under it, as the front-end passes it on.
fn lost_answer() -> tonic::Status {
    crate::error::Error::OwnerLost {
        call: "receive",
        outcome: crate::error::CallOutcome::LeasesReturn,
    }
    .into()
}

// Issue 24: a receive whose shard leader died under it left its written leases to run out
// (30 s) before the consumer got those messages; the next receive gives them back at once,
// keeping what the client got.
#[tokio::test(start_paused = true)]
async fn a_receive_that_lost_its_answer_has_the_next_one_give_back_what_the_client_never_got() {
    let f = fixture();
    with_replicated_feed(&f);
    let session_id = client_session(&f);
    let receive = |q: &str| pb::ReceiveRequest {
        session_id: session_id.clone(),
        queue: q.into(),
        wait_ms: Some(0),
        ..Default::default()
    };
    f.b.deliver(vec![handle_at("feed", 1, 10)]);
    let got = f
        .core
        .receive(receive("feed"), None)
        .await
        .expect("received");
    assert_eq!(got.deliveries.len(), 1);
    f.b.script([lost_answer()]);
    let e = f
        .core
        .receive(receive("feed"), None)
        .await
        .expect_err("lost");
    assert_eq!(e.code(), tonic::Code::Unavailable, "{e:?}");

    f.core
        .receive(receive("feed"), None)
        .await
        .expect("received");
    f.core
        .receive(receive("feed"), None)
        .await
        .expect("received");
    assert_eq!(
        methods(f.b.calls()),
        ["receive", "receive", "release_lost", "receive", "receive"],
        "given back once, before the next receive"
    );
    assert_eq!(
        f.b.kept(),
        [vec![(1, 10)]],
        "what the client got stays leased"
    );

    // A queue kept by one node writes no lease: nothing to give back, no call.
    f.a.script([lost_answer()]);
    assert!(f.core.receive(receive("orders"), None).await.is_err());
    f.core
        .receive(receive("orders"), None)
        .await
        .expect("received");
    assert_eq!(methods(f.a.calls()), ["receive", "receive"]);
}

// Issue 24, found by `a_consumer_goes_on_by_itself_when_the_shards_leader_is_killed` about one
// run in ten under load: the leader's death failed an ack first, which ended the consumer's
// stream; its receive, under way at the same dead leader, was dropped unanswered and noted
// nothing, and the leases it may have written ran out 10 minutes later.
#[tokio::test(start_paused = true)]
async fn a_receive_dropped_before_its_answer_has_the_next_one_give_back_what_it_may_have_left() {
    let f = fixture();
    with_replicated_feed(&f);
    let session_id = client_session(&f);
    let receive = || pb::ReceiveRequest {
        session_id: session_id.clone(),
        queue: "feed".into(),
        ..Default::default()
    };
    f.b.park_receives();
    {
        let mut parked = std::pin::pin!(f.core.receive(receive(), None));
        assert!(futures::poll!(&mut parked).is_pending(), "parked");
    }
    f.b.unpark_receives();
    f.core.receive(receive(), None).await.expect("received");
    assert_eq!(
        methods(f.b.calls()),
        ["receive", "release_lost", "receive"],
        "given back before the next receive"
    );

    // A queue kept by one node writes no lease: nothing to give back, no call.
    f.a.park_receives();
    let orders = pb::ReceiveRequest {
        queue: "orders".into(),
        ..receive()
    };
    {
        let mut parked = std::pin::pin!(f.core.receive(orders.clone(), None));
        assert!(futures::poll!(&mut parked).is_pending(), "parked");
    }
    f.a.unpark_receives();
    f.core.receive(orders, None).await.expect("received");
    assert_eq!(methods(f.a.calls()), ["receive", "receive"]);
}

#[tokio::test(start_paused = true)]
async fn giving_back_what_a_receive_lost_is_asked_again_while_the_back_end_cannot_answer() {
    let f = fixture();
    with_replicated_feed(&f);
    let session_id = client_session(&f);
    let receive = || pb::ReceiveRequest {
        session_id: session_id.clone(),
        queue: "feed".into(),
        wait_ms: Some(0),
        ..Default::default()
    };
    f.b.script([
        lost_answer(),
        tonic::Status::unavailable("the outcome of a write to shard 1 is unknown"),
    ]);
    assert!(f.core.receive(receive(), None).await.is_err());
    // The give-back's outcome is unknown: the receive goes on, and the next one asks again.
    f.core.receive(receive(), None).await.expect("received");
    // A back-end that refuses it for good (a node of an older release) is not asked again.
    f.b.script([tonic::Status::unimplemented("ReleaseLost")]);
    f.core.receive(receive(), None).await.expect("received");
    f.core.receive(receive(), None).await.expect("received");
    assert_eq!(
        methods(f.b.calls()),
        [
            "receive",
            "release_lost",
            "receive",
            "release_lost",
            "receive",
            "receive"
        ]
    );
}
