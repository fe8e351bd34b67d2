use std::sync::{Arc, Mutex};

use ferry_kernel::{ManualClock, NodeId, PlacementEpoch, QueueName};
use ferry_proto::pb;
use ferry_proto::pb::admin_server::Admin as _;
use tokio::sync::watch;
use tonic::{Code, Request, Status};

use super::AdminService;
use crate::catalog::{Catalog, CatalogEntry, PlacementAsked};
use crate::dispatch::Dispatch;
use crate::fake::FakeBackend;
use crate::router::{Owner, Placement, Router};
use crate::FrontendConfig;

/// A catalog that places every queue on node b at epoch 7 and records what it was asked.
#[derive(Default)]
struct FakeCatalog {
    asked: Mutex<Vec<(String, Option<String>)>>,
}

#[tonic::async_trait]
impl Catalog for FakeCatalog {
    async fn create_queue(
        &self,
        name: &QueueName,
        _settings: pb::QueueConfig,
        asked: PlacementAsked,
        _if_not_exists: bool,
    ) -> Result<CatalogEntry, Status> {
        let pinned = asked.pinned.map(|n| n.to_string());
        self.asked
            .lock()
            .expect("lock")
            .push((name.to_string(), pinned));
        Ok(CatalogEntry {
            owner: owner_b(),
            created: true,
            replicas: vec![],
        })
    }

    async fn delete_queue(&self, _name: &QueueName) -> Result<(), Status> {
        Ok(())
    }
}

fn owner_b() -> Owner {
    Owner {
        node: NodeId::new("b").expect("id"),
        epoch: PlacementEpoch::new(7),
    }
}

/// What must live as long as the service (the placement and stop channels' senders).
type Keep = (watch::Sender<Arc<Placement>>, watch::Sender<bool>);

/// An admin service on node a, with node b (`b`) and the catalog.
fn admin(b: &Arc<FakeBackend>, catalog: Arc<FakeCatalog>) -> (AdminService, Keep) {
    let a = FakeBackend::new();
    let placement = Placement::new(NodeId::new("a").expect("id"), a.backend())
        .with_node(NodeId::new("b").expect("id"), b.backend());
    let (router, placement_tx) = Router::fixed(placement);
    let (stop_tx, stopping) = watch::channel(false);
    let core = Dispatch::new(
        FrontendConfig::default(),
        Arc::new(router),
        stopping,
        ManualClock::new(0),
    );
    (
        AdminService::new(Arc::new(core)).with_catalog(catalog),
        (placement_tx, stop_tx),
    )
}

fn create(node: &str) -> Request<pb::CreateQueueRequest> {
    Request::new(pb::CreateQueueRequest {
        replicas: 0,
        own_shard: false,
        name: "orders".into(),
        config: None,
        if_not_exists: false,
        node: node.into(),
    })
}

#[tokio::test(start_paused = true)]
async fn a_queue_created_through_the_catalog_is_answered_once_its_owner_serves_it() {
    let b = FakeBackend::new();
    let catalog = Arc::new(FakeCatalog::default());
    let (admin, _keep) = admin(&b, catalog.clone());
    // The owner applies the definition after two looks.
    b.script([
        Status::not_found("not yet"),
        Status::failed_precondition("epoch not set yet"),
    ]);
    let r = admin.create_queue(create("b")).await.expect("created");
    assert!(r.into_inner().created);
    let looks = b.calls();
    assert_eq!(looks.len(), 3);
    assert!(looks
        .iter()
        .all(|c| c.method == "get_queue" && c.epochs == [PlacementEpoch::new(7)]));
    assert_eq!(
        *catalog.asked.lock().expect("lock"),
        [("orders".to_owned(), Some("b".to_owned()))]
    );
}

#[tokio::test(start_paused = true)]
async fn an_owner_that_never_creates_the_queue_is_named_in_an_unavailable_answer() {
    let b = FakeBackend::new();
    b.always(Status::not_found("no such queue"));
    let (admin, _keep) = admin(&b, Arc::new(FakeCatalog::default()));
    let e = admin.create_queue(create("")).await.unwrap_err();
    assert_eq!(e.code(), Code::Unavailable, "{e:?}");
    assert!(e.message().contains("node b"), "{e:?}");
}

/// Node a (answers, empty) and node b holding `orders` by the placement.
fn admin_with_orders_on_b(b: &Arc<FakeBackend>) -> (AdminService, Keep) {
    let a = FakeBackend::new();
    let placement = Placement::new(NodeId::new("a").expect("id"), a.backend())
        .with_node(NodeId::new("b").expect("id"), b.backend())
        .with_queue(QueueName::new("orders").expect("name"), owner_b());
    let (router, placement_tx) = Router::fixed(placement);
    let (stop_tx, stopping) = watch::channel(false);
    let core = Dispatch::new(
        FrontendConfig::default(),
        Arc::new(router),
        stopping,
        ManualClock::new(0),
    );
    (AdminService::new(Arc::new(core)), (placement_tx, stop_tx))
}

#[tokio::test(start_paused = true)]
async fn a_listing_with_a_node_down_answers_the_rest_and_names_it_with_its_queues() {
    let b = FakeBackend::new();
    b.always(Status::unavailable("tcp connect error"));
    let (admin, _keep) = admin_with_orders_on_b(&b);
    let list = admin
        .list_queues(Request::new(pb::ListQueuesRequest::default()))
        .await
        .expect("a partial answer, not an error")
        .into_inner();
    assert!(list.queues.is_empty());
    assert_eq!(
        list.unreachable_nodes,
        [pb::UnreachableNode {
            node_id: "b".into(),
            reason: "tcp connect error".into(),
            queues: vec!["orders".into()],
        }]
    );
    let stats = admin
        .get_queue_stats(Request::new(pb::GetQueueStatsRequest::default()))
        .await
        .expect("a partial answer, not an error")
        .into_inner();
    assert_eq!(stats.unreachable_nodes, list.unreachable_nodes);
    // One named queue is not a listing: its owner's failure is the call's.
    let e = admin
        .get_queue_stats(Request::new(pb::GetQueueStatsRequest {
            name: "orders".into(),
        }))
        .await
        .expect_err("the owner is down");
    assert_eq!(e.code(), Code::Unavailable, "{e:?}");
}

#[tokio::test(start_paused = true)]
async fn a_listing_waits_for_a_silent_node_five_seconds_then_answers_without_it() {
    let b = FakeBackend::new();
    b.park_listings();
    let (admin, _keep) = admin_with_orders_on_b(&b);
    let started = tokio::time::Instant::now();
    let list = admin
        .list_queues(Request::new(pb::ListQueuesRequest::default()))
        .await
        .expect("a partial answer")
        .into_inner();
    assert_eq!(started.elapsed(), super::NODE_ANSWER_WAIT);
    assert_eq!(list.unreachable_nodes.len(), 1);
    assert_eq!(list.unreachable_nodes[0].reason, "no answer within 5 s");
}

#[tokio::test(start_paused = true)]
async fn a_pin_that_is_not_a_node_id_is_refused_before_the_catalog_is_asked() {
    let b = FakeBackend::new();
    let catalog = Arc::new(FakeCatalog::default());
    let (admin, _keep) = admin(&b, catalog.clone());
    let e = admin.create_queue(create("Not An Id")).await.unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
    assert!(catalog.asked.lock().expect("lock").is_empty());
}

/// `ferry queue show` names a replicated queue's shard and replicas from the placement, and
/// none for a queue of replication factor 1.
#[tokio::test(start_paused = true)]
async fn get_queue_names_a_replicated_queues_shard_and_replicas() {
    let id = |s: &str| NodeId::new(s).expect("id");
    let name = |s: &str| QueueName::new(s).expect("name");
    let (a, b) = (FakeBackend::new(), FakeBackend::new());
    let placement = Placement::new(id("a"), a.backend())
        .with_node(id("b"), b.backend())
        .with_queue(name("orders"), owner_b())
        .with_shard_queue(name("orders"), ferry_kernel::ShardId(4))
        .with_shard(ferry_kernel::ShardId(4), vec![id("b"), id("a")])
        .with_queue(name("plain"), owner_b());
    let (router, _placement_tx) = Router::fixed(placement);
    let (_stop_tx, stopping) = watch::channel(false);
    let core = Dispatch::new(
        FrontendConfig::default(),
        Arc::new(router),
        stopping,
        ManualClock::new(0),
    );
    let admin = AdminService::new(Arc::new(core));
    let get = |q: &str| admin.get_queue(Request::new(pb::GetQueueRequest { name: q.into() }));
    let orders = get("orders").await.expect("answered").into_inner();
    assert_eq!(
        (orders.shard, orders.replicas),
        (4, vec!["b".into(), "a".into()])
    );
    let plain = get("plain").await.expect("answered").into_inner();
    assert_eq!((plain.shard, plain.replicas), (0, vec![]));
    let e = get("Not A Name").await.unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
}
