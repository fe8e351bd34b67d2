//! A queue shard on a node's real driver, beside the metadata group: entries proposed through
//! the node's `ShardProposer` reach its store through its one writer, and the shard's group
//! comes back with the node after a restart.

#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::time::Duration;

use ferry_be_server::{ShardId, ShardRefusal};
use ferry_kernel::{QueueConfig, QueueName, QueueUid};
use ferry_store::{encode_entry, GroupCommit, QueueDef, QueueStore, RocksStore, StoreOp};

use crate::raft::log_store::NodeLogStore;
use crate::raft::test_host::{one_node_settings, Recorder};
use crate::raft::MetaNode;

const SHARD: ShardId = ShardId(1);

/// A one-node cluster on `store`, formed (or resumed), and its writer's thread: join it once
/// the node stopped, so that no thread still uses the database when the test's process exits
/// (a detached writer crashed it there).
async fn node_on(store: &Arc<dyn QueueStore>) -> (MetaNode, std::thread::JoinHandle<()>) {
    let settings = one_node_settings();
    let (commit, thread) = GroupCommit::start(Arc::clone(store), 64, 64, Duration::ZERO).unwrap();
    let log = NodeLogStore::new(Arc::clone(store), commit);
    let node = MetaNode::start(settings, Arc::new(Recorder::default()), Box::new(log))
        .await
        .unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    assert!(node.wait_formed(deadline).await, "formed");
    (node, thread)
}

/// Stops the node, then waits for its writer's thread (it ends with the node's last handle).
async fn stop(node: MetaNode, thread: std::thread::JoinHandle<()>) {
    node.stop().await;
    drop(node);
    tokio::task::spawn_blocking(move || thread.join().unwrap())
        .await
        .unwrap();
}

/// Proposes `ops` to the shard through the node's proposer. A shard's only replica leads as
/// soon as its group starts (it campaigns alone), so no retry is needed.
async fn propose(node: &MetaNode, ops: &[StoreOp]) -> Result<(), ShardRefusal> {
    propose_at(node, leader_term(node).await, ops).await
}

/// Proposes `ops` at `term`.
async fn propose_at(node: &MetaNode, term: u64, ops: &[StoreOp]) -> Result<(), ShardRefusal> {
    let proposer = node.shard_proposer();
    proposer
        .propose(SHARD, term, encode_entry(ops).unwrap())
        .await
        .unwrap()
}

/// The term the node leads the shard at, once its view shows it does (at most 10 s).
async fn leader_term(node: &MetaNode) -> u64 {
    let mut view = node.view();
    let leads = |v: &Arc<crate::raft::MetaView>| {
        v.shards
            .get(&SHARD)
            .is_some_and(|g| g.role == ferry_multiraft::Role::Leader)
    };
    let seen = tokio::time::timeout(Duration::from_secs(10), view.wait_for(leads))
        .await
        .expect("the node leads the shard within 10 s")
        .expect("the view is published");
    seen.shards[&SHARD].term
}

fn def() -> QueueDef {
    QueueDef {
        name: QueueName::new("orders").unwrap(),
        uid: QueueUid(41),
        replica: None,
        config: QueueConfig::default(),
    }
}

#[tokio::test]
async fn a_shard_on_the_nodes_driver_writes_to_its_store_and_comes_back_after_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let store: Arc<dyn QueueStore> = Arc::new(RocksStore::open(dir.path()).unwrap());
    let (node, writer) = node_on(&store).await;
    let me = node.view().borrow().raft_id.unwrap().0;

    let e = propose_at(&node, 1, &[StoreOp::PutQueue(def())])
        .await
        .unwrap_err();
    assert!(
        matches!(e, ShardRefusal::NotLeader { .. }),
        "not open yet: {e}"
    );
    node.open_shard(SHARD, &[me]).await.unwrap();
    node.open_shard(SHARD, &[me]).await.unwrap();
    // A proposal made for another term than the one the node leads at is refused.
    let term = leader_term(&node).await;
    let e = propose_at(&node, term + 1, &[StoreOp::PutQueue(def())])
        .await
        .unwrap_err();
    assert!(matches!(e, ShardRefusal::NotLeader { .. }), "{e}");
    assert!(store.recover().unwrap().is_empty());
    propose(&node, &[StoreOp::PutQueue(def())]).await.unwrap();
    assert_eq!(store.recover().unwrap()[0].def, def());
    stop(node, writer).await;

    let (node, writer) = node_on(&store).await;
    propose(&node, &[StoreOp::DeleteQueue(def().uid)])
        .await
        .unwrap();
    assert!(store.recover().unwrap().is_empty());
    stop(node, writer).await;
}

/// What `Peer.LocalShards` answers from the node's driver: the shard group it runs, led here,
/// with its applied index up to its log's last entry once a proposal was applied. A listing
/// names only the metadata's shards (this one was opened by hand) and refuses an unknown one.
#[tokio::test]
async fn the_driver_reports_the_shard_groups_it_runs_for_a_listing() {
    let dir = tempfile::tempdir().unwrap();
    let store: Arc<dyn QueueStore> = Arc::new(RocksStore::open(dir.path()).unwrap());
    let (node, writer) = node_on(&store).await;
    let me = node.view().borrow().raft_id.unwrap().0;
    assert_eq!(node.local_shards().await.unwrap(), vec![]);

    node.open_shard(SHARD, &[me]).await.unwrap();
    let term = leader_term(&node).await;
    propose(&node, &[StoreOp::PutQueue(def())]).await.unwrap();
    let local = node.local_shards().await.unwrap();
    assert_eq!(local.len(), 1, "{local:?}");
    let l = &local[0];
    assert_eq!((l.shard, l.leading, l.term), (SHARD, true, term));
    assert_eq!(l.leader.map(|r| r.0), Some(me));
    assert!(l.applied_index >= 2, "the proposal was applied: {l:?}");
    assert_eq!(l.applied_index, l.last_index, "{l:?}");
    assert!(l.match_indexes.is_empty(), "no other voter: {l:?}");

    assert!(node.list_shards(None).await.unwrap().is_empty());
    let e = node.list_shards(Some(ShardId(9))).await.unwrap_err();
    let status = tonic::Status::from(e);
    assert_eq!(status.code(), tonic::Code::NotFound, "{status:?}");
    assert!(status.message().contains("shard 9"), "{status:?}");
    stop(node, writer).await;
}
