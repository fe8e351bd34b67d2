//! Unit tests of moving a shard's replica: the command's effect (in place, new epoch, reshaped,
//! owners following the preferred leader), each refusal, the choice of a replacement, the
//! durable copy and snapshots, and the steps the shard's leader takes.

#![allow(clippy::unwrap_used)]

use std::collections::{BTreeMap, BTreeSet};

use ferry_kernel::ShardId;
use ferry_proto::pb;

use super::durable_tests::{rebuilt, write_durable};
use super::shard_tests::cluster_of;
use super::tests::{n, next, q, refused};
use super::*;

/// Voters a, b, c and learner d (added at index 3), with queue `orders` (and its dead-letter
/// queue) in a shard on a, b, c.
fn four_with_a_shard() -> (MetaState, ShardId) {
    let mut s = cluster_of(&["a", "b", "c"]);
    let shard = choose_shard(
        &s,
        &q("orders"),
        &pb::QueueConfig::default(),
        3,
        false,
        &BTreeSet::new(),
    )
    .unwrap();
    let create = MetaCommand::CreateReplicatedQueue {
        name: q("orders"),
        settings: pb::QueueConfig::default(),
        shard,
    };
    s.apply(3, &create).unwrap();
    let add = MetaCommand::AddNode {
        id: n("d"),
        client_addr: "d:7400".into(),
        peer_addr: "d:7401".into(),
        learner: true,
    };
    s.apply(4, &add).unwrap();
    s.check_invariants().unwrap();
    let id = s.queue(&q("orders")).unwrap().shard.unwrap();
    assert_eq!(s.shard(id).unwrap().replicas, [n("a"), n("b"), n("c")]);
    (s, id)
}

fn move_replica(shard: ShardId, from: &str, to: &str) -> MetaCommand {
    MetaCommand::MoveReplica {
        shard,
        from: n(from),
        to: n(to),
    }
}

fn apply(s: &mut MetaState, cmd: &MetaCommand) -> MetaEvent {
    let index = next(s);
    let event = s.apply(index, cmd).unwrap();
    s.check_invariants().unwrap();
    event
}

#[test]
fn a_moved_replica_takes_the_old_ones_place_with_a_new_epoch_and_the_shard_reshaped() {
    let (mut s, shard) = four_with_a_shard();
    let before = s.shard(shard).unwrap().clone();
    assert!(!before.reshaped);
    let owners = |s: &MetaState| {
        s.queues()
            .iter()
            .map(|(name, d)| (name.to_string(), d.owner.clone()))
            .collect::<Vec<_>>()
    };
    let owned = owners(&s);
    let event = apply(&mut s, &move_replica(shard, "c", "d"));
    assert_eq!(
        event,
        MetaEvent::ReplicaMoved {
            shard,
            from: n("c"),
            to: n("d"),
            owners_moved: vec![],
        }
    );
    let after = s.shard(shard).unwrap();
    assert_eq!(after.replicas, [n("a"), n("b"), n("d")]);
    assert!(after.reshaped);
    assert!(after.epoch > before.epoch);
    assert_eq!(owners(&s), owned, "the preferred leader stayed: owners too");
    // c holds nothing now: it may be removed.
    apply(&mut s, &MetaCommand::RemoveNode { id: n("c") });
}

#[test]
fn moving_the_preferred_leader_moves_its_queues_ownership_and_keeps_their_epochs() {
    let (mut s, shard) = four_with_a_shard();
    let epochs: Vec<_> = s.queues().values().map(|d| d.owner.epoch).collect();
    assert_eq!(s.queue_count(&n("a")), 2);
    let MetaEvent::ReplicaMoved { owners_moved, .. } =
        apply(&mut s, &move_replica(shard, "a", "d"))
    else {
        panic!("not a move")
    };
    assert_eq!(owners_moved, [q("orders"), q("orders.DLQ")]);
    assert_eq!(s.shard(shard).unwrap().replicas, [n("d"), n("b"), n("c")]);
    assert!(s.queues().values().all(|d| d.owner.node == n("d")));
    let kept: Vec<_> = s.queues().values().map(|d| d.owner.epoch).collect();
    assert_eq!(kept, epochs, "the queues are what they were");
    assert_eq!((s.queue_count(&n("a")), s.queue_count(&n("d"))), (0, 2));
    apply(&mut s, &MetaCommand::RemoveNode { id: n("a") });
}

#[test]
fn a_move_is_refused_for_what_it_cannot_do() {
    let (mut s, shard) = four_with_a_shard();
    let missing = ShardId(99);
    refused(
        &mut s,
        move_replica(missing, "a", "d"),
        &MetaError::ShardNotFound { shard: missing },
    );
    refused(
        &mut s,
        move_replica(shard, "d", "a"),
        &MetaError::NotAReplica {
            shard,
            node: n("d"),
            replicas: vec![n("a"), n("b"), n("c")],
        },
    );
    refused(
        &mut s,
        move_replica(shard, "a", "b"),
        &MetaError::AlreadyAReplica {
            shard,
            node: n("b"),
        },
    );
    refused(
        &mut s,
        move_replica(shard, "a", "zz"),
        &MetaError::UnknownNode { node: n("zz") },
    );
    // Removing a node holding a replica is refused, saying how to move it.
    let err = s
        .clone()
        .apply(next(&s), &MetaCommand::RemoveNode { id: n("c") })
        .unwrap_err();
    assert!(
        err.to_string()
            .contains("ferry shard move-replica --from c"),
        "{err}"
    );
    apply(&mut s, &MetaCommand::RemoveNode { id: n("d") });
    refused(
        &mut s,
        move_replica(shard, "a", "d"),
        &MetaError::NodeRemoved { node: n("d") },
    );
}

#[test]
fn the_replacement_is_the_node_holding_fewest_replicas_and_one_that_is_down_comes_last() {
    let (mut s, shard) = four_with_a_shard();
    let none = BTreeSet::new();
    assert_eq!(choose_replacement(&s, shard, &n("c"), &none), Ok(n("d")));
    assert_eq!(
        choose_replacement(&s, shard, &n("d"), &none),
        Err(MetaError::NotAReplica {
            shard,
            node: n("d"),
            replicas: vec![n("a"), n("b"), n("c")],
        })
    );
    let add = MetaCommand::AddNode {
        id: n("e"),
        client_addr: "e:7400".into(),
        peer_addr: "e:7401".into(),
        learner: true,
    };
    apply(&mut s, &add);
    // d and e hold none: the smaller id, unless it is down.
    assert_eq!(choose_replacement(&s, shard, &n("c"), &none), Ok(n("d")));
    let down: BTreeSet<_> = [n("d")].into();
    assert_eq!(choose_replacement(&s, shard, &n("c"), &down), Ok(n("e")));
    // Every active node but the one leaving holds a replica: nowhere to go.
    apply(&mut s, &MetaCommand::RemoveNode { id: n("d") });
    apply(&mut s, &MetaCommand::RemoveNode { id: n("e") });
    assert_eq!(
        choose_replacement(&s, shard, &n("c"), &none),
        Err(MetaError::NoReplacement { shard })
    );
}

#[test]
fn a_move_goes_through_the_codec_the_durable_copy_and_snapshots() {
    let (mut s, shard) = four_with_a_shard();
    let cmd = move_replica(shard, "a", "d");
    assert_eq!(cmd.level(), 3);
    assert_eq!(MetaCommand::decode(&cmd.encode()).unwrap(), cmd);
    let mut copy = BTreeMap::new();
    let mut all = Touched::default();
    all.everything();
    write_durable(&mut copy, s.durable_writes(&all));
    let mut touched = Touched::default();
    touched.note(&apply(&mut s, &cmd));
    write_durable(&mut copy, s.durable_writes(&touched));
    assert_eq!(
        rebuilt(&copy),
        s,
        "the delta names the shard and the queues it moved"
    );
    let restored = MetaState::restore(&s.snapshot()).unwrap();
    assert_eq!(restored, s);
    assert!(restored.shard(shard).unwrap().reshaped);
}

#[test]
fn the_leader_adds_a_learner_promotes_it_once_caught_up_then_removes_the_old_voter() {
    let r = |ids: &[u64]| ids.iter().map(|i| RaftId(*i)).collect::<Vec<_>>();
    let wanted = r(&[1, 2, 4]);
    let me = RaftId(1);
    let behind = |_: RaftId| false;
    let there = |_: RaftId| true;
    use MembershipStep::{AddLearner, Promote, Remove};
    // The metadata moved 3's replica to 4.
    let step = next_replica_step(&wanted, &r(&[1, 2, 3]), &[], me, there);
    assert_eq!(step, Some(AddLearner(RaftId(4))));
    // Learning, not caught up: wait; nothing is removed before 4 votes.
    assert_eq!(
        next_replica_step(&wanted, &r(&[1, 2, 3]), &r(&[4]), me, behind),
        None
    );
    let step = next_replica_step(&wanted, &r(&[1, 2, 3]), &r(&[4]), me, there);
    assert_eq!(step, Some(Promote(RaftId(4))));
    let step = next_replica_step(&wanted, &r(&[1, 2, 3, 4]), &[], me, there);
    assert_eq!(step, Some(Remove(RaftId(3))));
    assert_eq!(
        next_replica_step(&wanted, &r(&[1, 2, 4]), &[], me, there),
        None
    );
    // A leader never removes itself; a learner no longer wanted goes at once.
    let step = next_replica_step(&wanted, &r(&[1, 2, 3, 4]), &[], RaftId(3), there);
    assert_eq!(step, None);
    let step = next_replica_step(&wanted, &r(&[1, 2, 4]), &r(&[5]), me, there);
    assert_eq!(step, Some(Remove(RaftId(5))));
}
