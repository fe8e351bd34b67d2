//! The metadata group of one node, in process on a memory log: proposals retried after a lost
//! answer, and a node that meets an entry it cannot read.

#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::time::Duration;

use ferry_cluster::meta::{MetaCommand, MetaEvent, RequestId};
use ferry_kernel::{NodeId, QueueName};
use ferry_multiraft::MemStore;
use ferry_proto::pb;

use super::driver::ProposeFailure;
use super::test_host::{one_node_settings, Recorder};
use super::MetaNode;

/// A one-node cluster, formed, on a memory log, its data directory recorded (so that no
/// proposal of its own comes between a test's).
async fn one_node() -> MetaNode {
    let settings = one_node_settings();
    let node = MetaNode::start(
        settings,
        Arc::new(Recorder::default()),
        Box::new(MemStore::default()),
    )
    .await
    .unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    assert!(node.wait_formed(deadline).await, "formed");
    let mut view = node.view();
    let recorded = view.wait_for(|v| v.meta.nodes().values().all(|n| n.incarnation != 0));
    tokio::time::timeout_at(deadline, recorded)
        .await
        .expect("its incarnation recorded")
        .unwrap();
    node
}

fn create(name: &str) -> MetaCommand {
    MetaCommand::CreateQueue {
        name: QueueName::new(name).unwrap(),
        settings: pb::QueueConfig::default(),
        owner: NodeId::new("a").unwrap(),
    }
}

/// The bytes of one call proposed twice (its first answer lost): the second copy answers as
/// the first succeeded instead of ALREADY_EXISTS, and the queue is created once.
#[tokio::test]
async fn the_same_proposal_twice_applies_once_and_both_succeed() {
    let node = one_node().await;
    let bytes = create("orders").encode_request(Some(RequestId(42)));
    let (first, outcome) = node.propose_local(bytes.clone()).await.unwrap();
    assert!(matches!(outcome, Ok(MetaEvent::QueuesCreated { .. })));
    let (_, outcome) = node.propose_local(bytes).await.unwrap();
    assert_eq!(outcome, Ok(MetaEvent::Repeated { first_index: first }));
    // A second call of its own (another id) is refused: the queue exists.
    let e = node
        .create_queue(
            &QueueName::new("orders").unwrap(),
            pb::QueueConfig::default(),
            ferry_fe_dispatcher::PlacementAsked::default(),
            false,
        )
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::AlreadyExists);
    node.stop().await;
}

/// A committed entry this release cannot read (a newer release's command kind) stops the
/// metadata group on the node, saying which entry, instead of being skipped; the proposal
/// waiting on it fails and nothing is applied after it.
#[tokio::test]
async fn an_entry_that_cannot_be_read_halts_the_group_and_says_which() {
    let node = one_node().await;
    let applied = node.view().borrow().meta.applied_index();
    // Version 1, a oneof tag no release has used yet (30: key 30 << 3 | 2, as a varint).
    let newer_kind = vec![0x08, 0x01, 0xf2, 0x01, 0x00];
    let answer = node.propose_local(newer_kind).await;
    assert!(matches!(answer, Err(ProposeFailure::Stopped)), "{answer:?}");
    let reason = tokio::time::timeout(Duration::from_secs(10), node.halted())
        .await
        .expect("halted");
    assert!(
        reason.contains(&format!("cannot apply metadata entry {}", applied + 1)),
        "{reason}"
    );
    assert_eq!(node.view().borrow().meta.applied_index(), applied);
    let after = node.propose_local(create("later").encode()).await;
    assert!(after.is_err(), "nothing applies after: {after:?}");
    node.stop().await;
}
