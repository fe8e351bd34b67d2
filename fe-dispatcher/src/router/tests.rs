use super::*;
use crate::fake::{Call, FakeBackend};
use ferry_proto::{not_owner_status, pb};
use tonic::Request;

const STATIC: PlacementEpoch = PlacementEpoch::STATIC;
const UNKNOWN: PlacementEpoch = PlacementEpoch::UNKNOWN;
/// The epoch of `orders` once it moved.
const MOVED: PlacementEpoch = PlacementEpoch::new(2);

fn node(n: &str) -> NodeId {
    NodeId::new(n).expect("a node id")
}

fn queue(q: &str) -> QueueName {
    QueueName::new(q).expect("a queue name")
}

/// Nodes a (this one) and b, each with a fake back-end; `orders` placed on b at the static
/// epoch.
fn two_nodes() -> (Placement, Arc<FakeBackend>, Arc<FakeBackend>) {
    let (a, b) = (FakeBackend::new(), FakeBackend::new());
    let placement = Placement::new(node("a"), a.backend())
        .with_node(node("b"), b.backend())
        .with_queue(
            queue("orders"),
            Owner {
                node: node("b"),
                epoch: STATIC,
            },
        );
    (placement, a, b)
}

fn not_owner(q: &str, owner: &str, epoch: PlacementEpoch) -> Status {
    not_owner_status(pb::NotOwner {
        queue: q.into(),
        owner_node: owner.into(),
        epoch: epoch.get(),
    })
}

async fn get_queue(router: &Router, q: &str) -> Result<pb::QueueInfo, Status> {
    let q = queue(q);
    router
        .call(&q, |be, placement_epoch| {
            let req = pb::BackendQueueRequest {
                name: q.to_string(),
                placement_epoch: placement_epoch.get(),
                wait_placed_ms: 0,
                wait_settings: None,
            };
            async move { be.get_queue(Request::new(req)).await }
        })
        .await
}

fn call(method: &'static str, q: &str, epoch: PlacementEpoch) -> Call {
    Call {
        method,
        queues: vec![q.into()],
        epochs: vec![epoch],
    }
}

#[test]
fn placement_rules_place_every_queue() {
    let (p, _, _) = two_nodes();
    let owner = |n: &str, epoch| Owner {
        node: node(n),
        epoch,
    };
    assert_eq!(p.owner_of(&queue("orders")), owner("b", STATIC));
    // A dead-letter queue lives with its queue, at its epoch.
    assert_eq!(p.owner_of(&queue("orders.DLQ")), owner("b", STATIC));
    // A temporary queue lives on the node in its name, whatever else is placed.
    assert_eq!(p.owner_of(&queue("tmp.b.x1.1")), owner("b", UNKNOWN));
    assert_eq!(p.owner_of(&queue("tmp.a.x1.1")), owner("a", UNKNOWN));
    // One naming a node that is not in the cluster, and any unplaced queue: this node.
    assert_eq!(p.owner_of(&queue("tmp.z.x1.1")), owner("a", UNKNOWN));
    assert_eq!(p.owner_of(&queue("invoices")), owner("a", UNKNOWN));
    assert_eq!(p.owner_of(&queue("invoices.DLQ")), owner("a", UNKNOWN));
    let nodes: Vec<NodeId> = p.nodes().into_iter().map(|(n, _)| n).collect();
    assert_eq!(nodes, vec![node("a"), node("b")], "this node first");
}

#[tokio::test]
async fn a_call_goes_to_the_owner_with_its_epoch() {
    let (p, a, b) = two_nodes();
    let (router, _tx) = Router::fixed(p);
    get_queue(&router, "orders").await.expect("answered");
    get_queue(&router, "invoices").await.expect("answered");
    assert_eq!(b.calls(), vec![call("get_queue", "orders", STATIC)]);
    assert_eq!(a.calls(), vec![call("get_queue", "invoices", UNKNOWN)]);
}

#[tokio::test]
async fn a_new_placement_takes_effect_for_the_next_call() {
    let (p, a, b) = two_nodes();
    let (router, tx) = Router::fixed(p.clone());
    get_queue(&router, "orders").await.expect("answered");
    let moved = p.with_queue(
        queue("orders"),
        Owner {
            node: node("a"),
            epoch: MOVED,
        },
    );
    tx.send(Arc::new(moved)).expect("the router listens");
    get_queue(&router, "orders").await.expect("answered");
    assert_eq!(b.calls(), vec![call("get_queue", "orders", STATIC)]);
    assert_eq!(a.calls(), vec![call("get_queue", "orders", MOVED)]);
}

#[tokio::test(start_paused = true)]
async fn not_the_owner_waits_for_the_new_placement_and_calls_the_new_owner() {
    let (p, a, b) = two_nodes();
    let (router, tx) = Router::fixed(p.clone());
    // b answers "not the owner" once, and the new placement is published as it does.
    b.script([not_owner("orders", "a", MOVED)]);
    let moved = p.with_queue(
        queue("orders"),
        Owner {
            node: node("a"),
            epoch: MOVED,
        },
    );
    b.on_scripted(move || {
        tx.send(Arc::new(moved)).expect("the router listens");
    });
    let started = Instant::now();
    get_queue(&router, "orders").await.expect("answered by a");
    assert_eq!(b.calls(), vec![call("get_queue", "orders", STATIC)]);
    assert_eq!(a.calls(), vec![call("get_queue", "orders", MOVED)]);
    // It went on as soon as the placement changed, not after the refresh bound.
    assert_eq!(started.elapsed(), Duration::ZERO);
}

/// A catch-up that publishes `next` (at version 7) when asked, and counts how often it was.
struct Publishes {
    next: Arc<Placement>,
    tx: watch::Sender<Arc<Placement>>,
    asked: std::sync::atomic::AtomicU32,
}

#[tonic::async_trait]
impl CatchUp for Publishes {
    async fn catch_up(&self) -> Result<u64, Status> {
        self.asked
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.tx.send_replace(Arc::clone(&self.next));
        Ok(self.next.version())
    }
}

fn catching_up(p: Placement, next: Placement) -> (Router, Arc<Publishes>) {
    let (router, tx) = Router::fixed(p);
    let publishes = Arc::new(Publishes {
        next: Arc::new(next.with_version(7)),
        tx,
        asked: Default::default(),
    });
    let router = router.with_catch_up(Arc::clone(&publishes) as Arc<dyn CatchUp>);
    (router, publishes)
}

#[tokio::test(start_paused = true)]
async fn not_found_for_a_queue_without_an_entry_catches_up_and_calls_its_owner() {
    let (p, a, b) = two_nodes();
    // `fresh` was created through another node; this node's placement has not seen it.
    let next = p.clone().with_queue(
        queue("fresh"),
        Owner {
            node: node("b"),
            epoch: PlacementEpoch::new(4),
        },
    );
    let (router, publishes) = catching_up(p, next);
    a.script([Status::not_found("queue \"fresh\" does not exist")]);
    get_queue(&router, "fresh").await.expect("answered by b");
    assert_eq!(a.calls(), vec![call("get_queue", "fresh", UNKNOWN)]);
    assert_eq!(
        b.calls(),
        vec![call("get_queue", "fresh", PlacementEpoch::new(4))]
    );
    assert_eq!(
        publishes.asked.load(std::sync::atomic::Ordering::Relaxed),
        1
    );
}

#[tokio::test(start_paused = true)]
async fn not_found_is_believed_after_one_catch_up_and_never_for_a_placed_queue() {
    let (p, a, b) = two_nodes();
    let (router, publishes) = catching_up(p.clone(), p);
    a.always(Status::not_found("queue \"nothing\" does not exist"));
    let e = get_queue(&router, "nothing").await.expect_err("not found");
    assert_eq!(e.code(), Code::NotFound);
    assert_eq!(a.calls().len(), 1);
    assert_eq!(
        publishes.asked.load(std::sync::atomic::Ordering::Relaxed),
        1
    );
    // A queue with an entry was routed by the metadata: its owner's answer stands.
    b.always(Status::not_found("queue \"orders\" does not exist"));
    let e = get_queue(&router, "orders").await.expect_err("not found");
    assert_eq!(e.code(), Code::NotFound);
    assert_eq!(
        publishes.asked.load(std::sync::atomic::Ordering::Relaxed),
        1
    );
}

#[tokio::test(start_paused = true)]
async fn not_the_owner_without_a_new_placement_retries_after_the_refresh_bound() {
    let (p, _, b) = two_nodes();
    let (router, _tx) = Router::fixed(p);
    b.script([not_owner("orders", "", UNKNOWN)]);
    let started = Instant::now();
    get_queue(&router, "orders")
        .await
        .expect("answered on the retry");
    assert_eq!(b.calls().len(), 2);
    assert_eq!(started.elapsed(), REFRESH_WAIT_MAX);
}

#[tokio::test(start_paused = true)]
async fn an_owner_that_keeps_saying_not_owner_fails_naming_the_queue() {
    let (p, _, b) = two_nodes();
    let (router, _tx) = Router::fixed(p);
    b.always(not_owner("orders", "c", PlacementEpoch::new(9)));
    let started = Instant::now();
    let e = get_queue(&router, "orders")
        .await
        .expect_err("never settles");
    assert_eq!(e.code(), Code::FailedPrecondition);
    assert!(e.message().contains("queue orders"), "{e:?}");
    // The last answer's detail is passed on, for a client that reads it.
    assert_eq!(
        ferry_proto::not_owner_of(&e).map(|n| n.owner_node),
        Some("c".to_owned())
    );
    let tries = usize::try_from(NOT_OWNER_RETRIES_MAX).expect("small") + 1;
    assert_eq!(b.calls().len(), tries);
    assert_eq!(started.elapsed(), REFRESH_WAIT_MAX * NOT_OWNER_RETRIES_MAX);
}

#[tokio::test(start_paused = true)]
async fn the_refresh_wait_ends_at_the_call_deadline() {
    let (p, _, b) = two_nodes();
    let (router, _tx) = Router::fixed(p);
    b.script([not_owner("orders", "", UNKNOWN)]);
    let started = Instant::now();
    let deadline = started + Duration::from_millis(40);
    let q = queue("orders");
    router
        .call_until(&q, Some(deadline), |be, placement_epoch| {
            let req = pb::BackendQueueRequest {
                name: "orders".into(),
                placement_epoch: placement_epoch.get(),
                wait_placed_ms: 0,
                wait_settings: None,
            };
            async move { be.get_queue(Request::new(req)).await }
        })
        .await
        .expect("answered on the retry");
    assert_eq!(started.elapsed(), Duration::from_millis(40));
}

#[tokio::test]
async fn an_owner_missing_from_the_node_list_is_unavailable_naming_it() {
    let (p, a, _) = two_nodes();
    let p = p.with_queue(
        queue("lost"),
        Owner {
            node: node("c"),
            epoch: STATIC,
        },
    );
    let (router, _tx) = Router::fixed(p);
    let e = get_queue(&router, "lost").await.expect_err("no route");
    assert_eq!(e.code(), Code::Unavailable);
    assert!(e.message().contains("node c"), "{e:?}");
    assert!(a.calls().is_empty(), "never sent elsewhere");
}

#[tokio::test]
async fn an_unreachable_owner_is_unavailable_naming_it() {
    let (p, a, b) = two_nodes();
    let (router, _tx) = Router::fixed(p);
    b.always(Status::unavailable("tcp connect error"));
    let e = get_queue(&router, "orders").await.expect_err("unreachable");
    assert_eq!(e.code(), Code::Unavailable);
    assert_eq!(e.message(), "node b: tcp connect error");
    assert_eq!(b.calls().len(), 1, "not retried");
    // Other errors, and this node's own, pass through as they are.
    a.always(Status::unavailable("the node is stopping"));
    let e = get_queue(&router, "invoices").await.expect_err("stopping");
    assert_eq!(e.message(), "the node is stopping");
    b.always(Status::not_found("queue orders does not exist"));
    let e = get_queue(&router, "orders").await.expect_err("missing");
    assert_eq!(e.code(), Code::NotFound);
    assert_eq!(e.message(), "queue orders does not exist");
}

async fn release(router: &Router, queues: &[&str]) -> Vec<(NodeId, Result<u64, Status>)> {
    let queues = queues.iter().map(|q| queue(q)).collect();
    router
        .call_each(queues, |be, queues| {
            let (queues, placement_epochs) = queues
                .into_iter()
                .map(|(q, e)| (q.to_string(), e.get()))
                .unzip();
            let req = pb::BackendReleaseSessionRequest {
                queues,
                placement_epochs,
                ..Default::default()
            };
            async move { be.release_session(Request::new(req)).await }
        })
        .await
        .into_iter()
        .map(|(n, r)| (n, r.map(|c| c.count)))
        .collect()
}

#[tokio::test(start_paused = true)]
async fn a_call_naming_several_queues_goes_to_each_owner_and_regroups_after_not_owner() {
    let (p, a, b) = two_nodes();
    let (router, tx) = Router::fixed(p.clone());
    b.script([not_owner("orders", "a", MOVED)]);
    let moved = p.with_queue(
        queue("orders"),
        Owner {
            node: node("a"),
            epoch: MOVED,
        },
    );
    b.on_scripted(move || {
        tx.send(Arc::new(moved)).expect("the router listens");
    });
    let answers = release(&router, &["invoices", "orders"]).await;
    let nodes: Vec<&NodeId> = answers.iter().map(|(n, _)| n).collect();
    assert_eq!(nodes, vec![&node("a"), &node("a")]);
    assert!(answers.iter().all(|(_, r)| r.is_ok()), "{answers:?}");
    let release_call = |queues: Vec<&str>, epochs| Call {
        method: "release_session",
        queues: queues.into_iter().map(String::from).collect(),
        epochs,
    };
    assert_eq!(b.calls(), vec![release_call(vec!["orders"], vec![STATIC])]);
    assert_eq!(
        a.calls(),
        vec![
            release_call(vec!["invoices"], vec![UNKNOWN]),
            release_call(vec!["orders"], vec![MOVED]),
        ]
    );
}

/// Nodes a (this one), b and c, each with a fake back-end; `orders` replicated in shard 1 on
/// b, c and a (b the preferred leader, so its owner).
fn replicated() -> (Placement, [Arc<FakeBackend>; 3]) {
    let fakes = [FakeBackend::new(), FakeBackend::new(), FakeBackend::new()];
    let placement = Placement::new(node("a"), fakes[0].backend())
        .with_node(node("b"), fakes[1].backend())
        .with_node(node("c"), fakes[2].backend())
        .with_shard(ShardId(1), vec![node("b"), node("c"), node("a")])
        .with_queue(
            queue("orders"),
            Owner {
                node: node("b"),
                epoch: MOVED,
            },
        )
        .with_shard_queue(queue("orders"), ShardId(1));
    (placement, fakes)
}

fn not_leader(leader: &str) -> Status {
    ferry_proto::not_leader_status(
        pb::NotLeader {
            shard: 1,
            leader_node: leader.into(),
        },
        format!("not the leader of shard 1 (leader: {leader:?})"),
    )
}

#[tokio::test(start_paused = true)]
async fn a_replica_that_does_not_lead_names_the_leader_and_the_next_calls_go_there() {
    let (p, [a, b, c]) = replicated();
    let (router, _tx) = Router::fixed(p);
    b.script([not_leader("c")]);
    let started = Instant::now();
    get_queue(&router, "orders").await.expect("answered");
    assert_eq!(
        started.elapsed(),
        Duration::ZERO,
        "a named leader is called at once"
    );
    get_queue(&router, "orders").await.expect("answered");
    assert_eq!(b.calls(), vec![call("get_queue", "orders", MOVED)]);
    assert_eq!(c.calls(), vec![call("get_queue", "orders", MOVED); 2]);
    assert!(a.calls().is_empty());
    // Its dead-letter queue is in the shard too, and goes to the leader learned.
    get_queue(&router, "orders.DLQ").await.expect("answered");
    assert_eq!(c.calls().len(), 3);
}

#[tokio::test(start_paused = true)]
async fn with_no_leader_known_the_call_tries_the_replicas_in_turn_after_a_pause() {
    let (p, [a, b, c]) = replicated();
    let (router, _tx) = Router::fixed(p);
    b.script([not_leader("")]);
    c.script([crate::remote::not_sent(Status::unavailable(
        "node c: connection refused",
    ))]);
    let started = Instant::now();
    get_queue(&router, "orders").await.expect("answered");
    assert!(
        started.elapsed() >= FAILOVER_BACKOFF_FIRST,
        "paused between tries"
    );
    assert_eq!(
        (b.calls().len(), c.calls().len(), a.calls().len()),
        (1, 1, 1),
        "b, then c, then a"
    );
    // The replica that answered is the leader from now on.
    get_queue(&router, "orders").await.expect("answered");
    assert_eq!(a.calls().len(), 2);
}

#[tokio::test(start_paused = true)]
async fn a_call_without_a_leader_gives_up_after_the_failover_wait_with_the_last_answer() {
    let (p, fakes) = replicated();
    let (router, _tx) = Router::fixed(p);
    for f in &fakes {
        f.always(not_leader(""));
    }
    let started = Instant::now();
    let e = get_queue(&router, "orders").await.unwrap_err();
    assert_eq!(e.code(), Code::Unavailable, "{e}");
    assert!(ferry_proto::not_leader_of(&e).is_some(), "{e}");
    let waited = started.elapsed();
    assert!(
        waited <= FAILOVER_WAIT_MAX && waited >= FAILOVER_WAIT_MAX - FAILOVER_BACKOFF_MAX,
        "{waited:?}"
    );
    let tries: usize = fakes.iter().map(|f| f.calls().len()).sum();
    assert!((3..=40).contains(&tries), "{tries} tries");
}

/// An answer of the call's own is not a reason to look for a leader, and neither is one that
/// may have done what the call asked (an UNAVAILABLE that is not "not the leader" and not "never
/// sent": a link lost mid-call, a write the shard did not confirm).
#[tokio::test(start_paused = true)]
async fn a_replicas_own_answer_is_the_calls() {
    let (p, [a, b, c]) = replicated();
    let (router, _tx) = Router::fixed(p);
    b.script([
        Status::invalid_argument("bad"),
        Status::unavailable("the outcome of a write to shard 1 is unknown"),
    ]);
    let e = get_queue(&router, "orders").await.unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
    let e = get_queue(&router, "orders").await.unwrap_err();
    assert_eq!(e.code(), Code::Unavailable);
    assert_eq!(b.calls().len(), 2);
    assert!(a.calls().is_empty() && c.calls().is_empty());
}

/// A replica that does not know a replicated queue (made a replica by a move, it learns the
/// shard's queues from its metadata a moment later) did nothing: each other replica is asked
/// once; only if none knows it is NOT_FOUND the call's answer.
#[tokio::test(start_paused = true)]
async fn a_replica_that_does_not_know_a_replicated_queue_yet_is_passed_over_once() {
    let (p, [a, b, c]) = replicated();
    let (router, _tx) = Router::fixed(p);
    b.script([Status::not_found("queue \"orders\" does not exist")]);
    get_queue(&router, "orders").await.expect("answered");
    assert_eq!(
        (b.calls().len(), c.calls().len(), a.calls().len()),
        (1, 1, 0)
    );

    for f in [&a, &b, &c] {
        f.always(Status::not_found("queue \"orders\" does not exist"));
    }
    let e = get_queue(&router, "orders").await.unwrap_err();
    assert_eq!(e.code(), Code::NotFound, "{e}");
    let tries = a.calls().len() + b.calls().len() + c.calls().len();
    assert_eq!(
        tries,
        2 + 4,
        "each replica once, and the first again: {tries}"
    );
}
