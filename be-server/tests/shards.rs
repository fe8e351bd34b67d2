//! A back-end serving queue shards (issue 24 §2): the shard's queues are served only while the
//! node leads the shard, every write goes through the shard's log, a new run of serving
//! recovers them from the store, and a write the shard does not confirm fences the run.
//!
//! The shard's log here is a fake proposer that applies each entry to the store at once, as
//! the node's Raft driver does once the entry is committed (or refuses it, when told to).

#![allow(clippy::unwrap_used)]

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use ferry_be_server::{
    BackendService, Broker, BrokerConfig, ProposalOutcome, ShardId, ShardProposer, ShardQueue,
    ShardRefusal, SystemClock,
};
use ferry_kernel::{NodeId, PlacementEpoch, QueueName};
use ferry_proto::pb;
use ferry_proto::pb::backend_server::Backend as _;
use ferry_store::{CommitSettings, CommitWriter, MemoryStore, QueueStore};
use tonic::{Code, Request};

const SHARD: ShardId = ShardId(1);

/// Applies every entry to the store and confirms it, unless told to refuse the next one.
#[derive(Debug)]
struct Applier {
    store: Arc<dyn QueueStore>,
    proposed: AtomicUsize,
    refuse_next: AtomicBool,
}

impl ShardProposer for Applier {
    fn propose(&self, shard: ShardId, _term: u64, entry: Vec<u8>) -> ProposalOutcome {
        let (tx, rx) = tokio::sync::oneshot::channel();
        self.proposed.fetch_add(1, Ordering::SeqCst);
        if self.refuse_next.swap(false, Ordering::SeqCst) {
            let _ = tx.send(Err(ShardRefusal::NotLeader {
                shard,
                leader: Some("n2".into()),
            }));
            return rx;
        }
        let ops = ferry_store::decode_entry(&entry).unwrap();
        self.store.write(&[ops]).unwrap();
        let _ = tx.send(Ok(()));
        rx
    }
}

struct Node {
    broker: Broker,
    be: BackendService,
    store: Arc<dyn QueueStore>,
    applier: Arc<Applier>,
}

async fn node() -> Node {
    let store: Arc<dyn QueueStore> = Arc::new(MemoryStore::new());
    let writer = CommitWriter::start(store.clone(), CommitSettings::default()).unwrap();
    let broker = Broker::open(
        BrokerConfig::new(NodeId::new("n1").unwrap()),
        store.clone(),
        writer.handle(),
        Arc::new(SystemClock),
    )
    .await
    .unwrap();
    let applier = Arc::new(Applier {
        store: store.clone(),
        proposed: AtomicUsize::new(0),
        refuse_next: AtomicBool::new(false),
    });
    Node {
        be: BackendService::new(broker.clone()),
        broker,
        store,
        applier,
    }
}

fn q(name: &str) -> QueueName {
    QueueName::new(name).unwrap()
}

fn queues(epoch: u64) -> Vec<ShardQueue> {
    ["orders", "orders.DLQ"]
        .into_iter()
        .map(|name| ShardQueue {
            name: q(name),
            settings: Some(pb::QueueConfig::default()),
            epoch: PlacementEpoch::new(epoch),
        })
        .collect()
}

impl Node {
    async fn lead(&self, term: u64, queues: Vec<ShardQueue>) {
        self.lead_knowing(term, queues, PlacementEpoch::new(100))
            .await;
    }

    /// Leads with metadata whose next epoch is `known_below`; whether a queue newer than it
    /// was kept.
    async fn lead_knowing(
        &self,
        term: u64,
        queues: Vec<ShardQueue>,
        known_below: PlacementEpoch,
    ) -> bool {
        let proposer = Arc::clone(&self.applier) as Arc<dyn ShardProposer>;
        self.broker
            .lead_shard(SHARD, term, proposer, queues, known_below)
            .await
            .unwrap()
    }

    async fn send(&self, body: &str) -> Result<(), tonic::Status> {
        let req = pb::BackendSendRequest {
            queue: "orders".into(),
            messages: vec![pb::OutgoingMessage {
                body: body.as_bytes().to_vec().into(),
                ..Default::default()
            }],
            ..Default::default()
        };
        self.be.send(Request::new(req)).await.map(drop)
    }

    async fn receive_all(&self) -> Vec<String> {
        let req = pb::BackendReceiveRequest {
            queue: "orders".into(),
            max_messages: 100,
            wait_ms: Some(0),
            ..Default::default()
        };
        let got = self.be.receive(Request::new(req)).await.unwrap();
        got.into_inner()
            .deliveries
            .into_iter()
            .map(|d| String::from_utf8(d.message.unwrap().body.to_vec()).unwrap())
            .collect()
    }

    /// The replicated queues in the store, with their shard's epoch.
    fn stored(&self) -> Vec<(String, u64)> {
        let mut all: Vec<(String, u64)> = self
            .store
            .recover()
            .unwrap()
            .into_iter()
            .filter_map(|r| Some((r.def.name.to_string(), r.def.replica?.epoch.get())))
            .collect();
        all.sort();
        all
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_led_shard_is_served_through_its_log_and_a_later_run_recovers_it() {
    let n = node().await;
    n.lead(2, queues(5)).await;
    assert_eq!(
        n.stored(),
        [("orders".to_owned(), 5), ("orders.DLQ".to_owned(), 5)],
        "both definitions went through the log"
    );
    let before = n.applier.proposed.load(Ordering::SeqCst);
    for body in ["a", "b", "c"] {
        n.send(body).await.unwrap();
    }
    assert_eq!(n.applier.proposed.load(Ordering::SeqCst), before + 3);

    // Another node leads now: nothing is served here, and the answer names the leader.
    n.broker
        .follow_shard(SHARD, Some("n2".into()), &[q("orders"), q("orders.DLQ")])
        .await;
    let refused = n.send("d").await.unwrap_err();
    assert_eq!(refused.code(), Code::Unavailable, "{refused}");
    assert!(refused.message().contains("n2"), "{refused}");
    assert!(n.broker.shards_led().is_empty());

    // Led again at a later term: the queue comes back from the store with what was sent.
    n.lead(4, queues(5)).await;
    assert_eq!(n.receive_all().await, ["a", "b", "c"]);
    assert_eq!(n.broker.shards_led(), [SHARD]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_the_shard_does_not_confirm_fences_the_run_until_it_is_served_anew() {
    let n = node().await;
    let mut fences = n.broker.shard_fences();
    n.lead(2, queues(5)).await;
    n.send("kept").await.unwrap();
    n.applier.refuse_next.store(true, Ordering::SeqCst);
    let refused = n.send("lost").await.unwrap_err();
    assert_eq!(refused.code(), Code::Unavailable, "{refused}");
    assert!(fences.has_changed().unwrap(), "the fence is announced");
    fences.borrow_and_update();

    // Nothing is proposed from the fenced run's memory.
    let proposed = n.applier.proposed.load(Ordering::SeqCst);
    assert!(n.send("refused").await.is_err());
    assert_eq!(n.applier.proposed.load(Ordering::SeqCst), proposed);

    // Served anew at the same term: the kernel is rebuilt from the store, which never had
    // the refused write.
    n.lead(2, queues(5)).await;
    n.send("after").await.unwrap();
    assert_eq!(n.receive_all().await, ["kept", "after"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_leader_carries_out_the_metadata_queues_of_its_shard() {
    let n = node().await;
    n.lead(2, queues(5)).await;
    n.send("old").await.unwrap();
    // Deleted and created again under its name (a new epoch): it starts empty.
    n.lead(2, queues(9)).await;
    assert_eq!(
        n.stored(),
        [("orders".to_owned(), 9), ("orders.DLQ".to_owned(), 9)]
    );
    assert!(n.receive_all().await.is_empty());
    // A leader whose metadata is older than the queue (it never saw epoch 9 given) keeps it.
    assert!(
        n.lead_knowing(3, vec![], PlacementEpoch::new(9)).await,
        "the caller is told to come back once its metadata moved on"
    );
    assert_eq!(n.stored().len(), 2, "kept: newer than the metadata");
    n.send("kept").await.unwrap();
    // Deleted: gone from the store, through the log.
    assert!(!n.lead_knowing(3, vec![], PlacementEpoch::new(100)).await);
    assert!(n.stored().is_empty());
    let gone = n.send("x").await.unwrap_err();
    assert_eq!(gone.code(), Code::NotFound, "{gone}");
}

/// Within a run, the node passes the settings of the queues that changed only: the others are
/// left as they are, and a queue not served yet that comes without its settings is refused
/// (the node then tells the whole shard again), never created with made-up settings.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn within_a_run_only_changed_settings_are_carried_out() {
    let n = node().await;
    let mut given = queues(5);
    given[0].settings = Some(pb::QueueConfig {
        max_messages: Some(7),
        ..Default::default()
    });
    n.lead(2, given).await;
    let writes = n.applier.proposed.load(Ordering::SeqCst);
    // Unchanged: nothing written.
    let unchanged: Vec<ShardQueue> = queues(5)
        .into_iter()
        .map(|w| ShardQueue {
            settings: None,
            ..w
        })
        .collect();
    n.lead(2, unchanged.clone()).await;
    assert_eq!(n.applier.proposed.load(Ordering::SeqCst), writes);
    let info = n.broker.get_queue(&q("orders")).unwrap();
    assert_eq!(info.config.max_messages, Some(7), "{info:?}");

    // A new queue without its settings: refused, and not created.
    let mut with_new = unchanged;
    with_new.push(ShardQueue {
        name: q("invoices"),
        settings: None,
        epoch: PlacementEpoch::new(6),
    });
    let proposer = Arc::clone(&n.applier) as Arc<dyn ShardProposer>;
    let refused = n
        .broker
        .lead_shard(SHARD, 2, proposer, with_new, PlacementEpoch::new(100))
        .await
        .unwrap_err();
    assert!(refused.to_string().contains("invoices"), "{refused}");
    assert_eq!(n.stored().len(), 2);
}

/// A replicated queue in the store is not served when the back-end opens: only once the node
/// leads its shard.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replicated_queue_is_not_served_at_start() {
    let n = node().await;
    n.lead(2, queues(5)).await;
    n.send("a").await.unwrap();
    let writer = CommitWriter::start(n.store.clone(), CommitSettings::default()).unwrap();
    let reopened = Broker::open(
        BrokerConfig::new(NodeId::new("n1").unwrap()),
        n.store.clone(),
        writer.handle(),
        Arc::new(SystemClock),
    )
    .await
    .unwrap();
    assert!(reopened.list_queues().is_empty());
}

/// A shard gone with its last queue leaves nothing in the store of a replica that forgets it
/// (its Raft group is gone too, so no delete could come through its log).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forgotten_shard_leaves_nothing_in_the_store() {
    let n = node().await;
    n.lead(2, queues(5)).await;
    n.send("a").await.unwrap();
    n.broker.forget_shard(SHARD).await.unwrap();
    assert!(n.stored().is_empty());
    assert!(n.broker.shards_led().is_empty());
    let gone = n.send("b").await.unwrap_err();
    assert_eq!(gone.code(), Code::NotFound, "{gone}");
}

/// Confirms each entry once every replica's store has applied it, as a committed entry is on
/// a majority of disks: what one leader wrote, the next one reads.
#[derive(Debug)]
struct Replicas(Vec<Arc<dyn QueueStore>>);

impl ShardProposer for Replicas {
    fn propose(&self, _shard: ShardId, _term: u64, entry: Vec<u8>) -> ProposalOutcome {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let ops = ferry_store::decode_entry(&entry).unwrap();
        for store in &self.0 {
            store.write(std::slice::from_ref(&ops)).unwrap();
        }
        let _ = tx.send(Ok(()));
        rx
    }
}

const SESSION: &str = "00000000000000a1";
const OTHER_SESSION: &str = "00000000000000b2";

impl Node {
    async fn lead_replicated(&self, term: u64, replicas: &Arc<Replicas>) {
        let proposer = Arc::clone(replicas) as Arc<dyn ShardProposer>;
        self.broker
            .lead_shard(SHARD, term, proposer, queues(5), PlacementEpoch::new(100))
            .await
            .unwrap();
    }

    /// Receives up to 10 messages for `session`: (body, receipt handle, redelivered).
    async fn receive_as(&self, session: &str) -> Vec<(String, String, bool)> {
        let req = pb::BackendReceiveRequest {
            queue: "orders".into(),
            session_id: session.into(),
            max_messages: 10,
            wait_ms: Some(0),
            lease_ms: Some(60_000),
            ..Default::default()
        };
        let got = self.be.receive(Request::new(req)).await.unwrap();
        got.into_inner()
            .deliveries
            .into_iter()
            .map(|d| {
                let body = String::from_utf8(d.message.unwrap().body.to_vec()).unwrap();
                (body, d.receipt_handle, d.redelivered)
            })
            .collect()
    }

    /// Acks (or nacks with `delay_ms`) one handle as `session`: the per-handle error, if any.
    async fn settle(&self, session: &str, handle: &str, nack_delay_ms: Option<u64>) -> String {
        let req = pb::BackendLeaseRequest {
            queue: "orders".into(),
            receipt_handles: vec![handle.to_owned()],
            delay_ms: nack_delay_ms,
            session_id: session.into(),
            ..Default::default()
        };
        let answer = match nack_delay_ms {
            None => self.be.ack(Request::new(req)).await,
            Some(_) => self.be.nack(Request::new(req)).await,
        };
        answer.unwrap().into_inner().errors.concat()
    }
}

/// Issue 24 §2: what one leader handed out, the next one honours. A consumer's
/// acknowledgements of deliveries made before a failover land on the new leader (its receipt
/// handles stay good and its leases were written), those messages are not handed to anyone
/// else meanwhile, and a message given back with a back-off keeps its delay.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_leader_honours_the_old_leaders_deliveries_and_back_offs() {
    let (n1, n2) = (node().await, node().await);
    let replicas = Arc::new(Replicas(vec![n1.store.clone(), n2.store.clone()]));
    n1.lead_replicated(2, &replicas).await;
    for body in ["a", "b", "poison"] {
        n1.send(body).await.unwrap();
    }
    let got = n1.receive_as(SESSION).await;
    assert_eq!(got.len(), 3);
    let handle = |body: &str| got.iter().find(|g| g.0 == body).unwrap().1.clone();
    assert_eq!(n1.settle(SESSION, &handle("a"), None).await, "");
    assert_eq!(
        n1.settle(SESSION, &handle("poison"), Some(3_600_000)).await,
        ""
    );

    // n1 is gone; n2 leads the shard from its own copy of the log.
    n1.broker
        .follow_shard(SHARD, Some("n2".into()), &[q("orders"), q("orders.DLQ")])
        .await;
    n2.lead_replicated(3, &replicas).await;

    assert!(
        n2.receive_as(OTHER_SESSION).await.is_empty(),
        "b is still leased to its consumer and poison waits out its back-off"
    );
    assert_eq!(
        n2.settle(SESSION, &handle("b"), None).await,
        "",
        "the consumer's ack of a delivery made by the old leader lands"
    );
    let again = n2.settle(SESSION, &handle("a"), None).await;
    assert!(!again.is_empty(), "a stays acknowledged: {again}");
    assert!(n2.receive_as(SESSION).await.is_empty());
}

/// A consumer that gives a delivery back on the new leader gets it again flagged redelivered;
/// another session cannot act on it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delivery_made_before_a_failover_is_its_sessions_alone_and_comes_back_redelivered() {
    let (n1, n2) = (node().await, node().await);
    let replicas = Arc::new(Replicas(vec![n1.store.clone(), n2.store.clone()]));
    n1.lead_replicated(2, &replicas).await;
    n1.send("m").await.unwrap();
    let got = n1.receive_as(SESSION).await;
    let handle = got[0].1.clone();
    n1.broker
        .follow_shard(SHARD, Some("n2".into()), &[q("orders"), q("orders.DLQ")])
        .await;
    n2.lead_replicated(3, &replicas).await;

    let foreign = n2.settle(OTHER_SESSION, &handle, None).await;
    assert!(!foreign.is_empty(), "another session's ack is refused");
    assert_eq!(n2.settle(SESSION, &handle, Some(0)).await, "");
    let again = n2.receive_as(OTHER_SESSION).await;
    assert_eq!(again.len(), 1);
    assert_eq!(again[0].0, "m");
    assert!(again[0].2, "flagged redelivered");
}

impl Node {
    /// Gives back `session`'s deliveries of an earlier run but `held` (`ReleaseLost`).
    async fn release_lost(&self, session: &str, held: &[&str]) -> u64 {
        let (held_seqs, held_leases) = held
            .iter()
            .map(|h| {
                let r: ferry_kernel::ReceiptHandle = h.parse().unwrap();
                (r.seq.0, r.lease.0)
            })
            .unzip();
        let req = pb::BackendReleaseLostRequest {
            queue: "orders".into(),
            session_id: session.into(),
            held_seqs,
            held_leases,
            placement_epoch: 0,
        };
        self.be
            .release_lost(Request::new(req))
            .await
            .unwrap()
            .into_inner()
            .count
    }
}

/// Issue 24: the old leader leased `got`, `lost1` and `lost2` to a session and died before the
/// front-end had the answer of the receive that took the last two. The new leader gives those
/// back at once, flagged redelivered next time, and keeps what the client got and what it
/// handed out itself.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_leader_gives_back_at_once_the_deliveries_a_lost_answer_held() {
    let (n1, n2) = (node().await, node().await);
    let replicas = Arc::new(Replicas(vec![n1.store.clone(), n2.store.clone()]));
    n1.lead_replicated(2, &replicas).await;
    n1.send("got").await.unwrap();
    let got = n1.receive_as(SESSION).await;
    for body in ["lost1", "lost2"] {
        n1.send(body).await.unwrap();
    }
    assert_eq!(
        n1.receive_as(SESSION).await.len(),
        2,
        "the answer that is lost"
    );
    n1.broker
        .follow_shard(SHARD, Some("n2".into()), &[q("orders"), q("orders.DLQ")])
        .await;
    n2.lead_replicated(3, &replicas).await;
    n2.send("new").await.unwrap();
    let new = n2.receive_as(SESSION).await;
    assert_eq!(
        new.len(),
        1,
        "this run's delivery, on its way to the client"
    );

    assert_eq!(n2.release_lost(SESSION, &[&got[0].1]).await, 2);
    let back = n2.receive_as(OTHER_SESSION).await;
    let bodies: Vec<&str> = back.iter().map(|b| b.0.as_str()).collect();
    assert_eq!(bodies, ["lost1", "lost2"]);
    assert!(back.iter().all(|b| b.2), "flagged redelivered");
    for kept in [&got[0].1, &new[0].1] {
        assert_eq!(
            n2.settle(SESSION, kept, None).await,
            "",
            "still the session's"
        );
    }
    assert_eq!(n2.release_lost(SESSION, &[]).await, 0);
}
