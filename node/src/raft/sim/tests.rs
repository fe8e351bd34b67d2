//! The metadata group's scenarios on the node's real driver: forming and placing, joining and
//! leaving, a crash in a synced write, a partitioned leader, a restart of every node, a
//! failover on a lossy network; one seed gives the same run twice. Every scenario runs under
//! the checks of `checks.rs`.

use std::collections::BTreeMap;

use ferry_cluster::meta::{
    choose_owner, MetaCommand, MetaError, MetaEvent, NodeRole, NodeState, RaftId,
};
use ferry_kernel::{NodeId, QueueName};
use ferry_multiraft::sim::{Faults, Traced};
use ferry_multiraft::{NodeId as PeerId, ProposeFailure};
use ferry_proto::pb;

use super::{node_name, Cluster, ELECTION_STEPS};

fn q(name: &str) -> QueueName {
    QueueName::new(name).unwrap()
}

/// Creates `name` on the owner the placement rule picks on the leader's metadata.
fn create_by_rule(cluster: &mut Cluster, name: &str) -> Result<MetaEvent, MetaError> {
    let meta = cluster.leader_meta().unwrap();
    let owner = choose_owner(&meta, &BTreeMap::new(), None)?;
    let command = MetaCommand::CreateQueue {
        name: q(name),
        settings: pb::QueueConfig::default(),
        owner,
    };
    cluster.propose_and_wait(&command)
}

pub(super) fn add(id: u64, learner: bool) -> MetaCommand {
    MetaCommand::AddNode {
        id: node_name(id),
        client_addr: format!("10.0.0.{id}:7400"),
        peer_addr: format!("10.0.0.{id}:7401"),
        learner,
    }
}

fn leader_status(cluster: &Cluster) -> ferry_multiraft::GroupStatus {
    let leader = cluster.leader().unwrap();
    cluster.view(leader).unwrap().group.clone().unwrap()
}

#[test]
fn three_nodes_bootstrap_and_place_queues_by_the_rule_identically_everywhere() {
    let mut cluster = Cluster::new(1, 3, 1_000);
    cluster.converge();
    for i in 0..6 {
        create_by_rule(&mut cluster, &format!("q{i}")).unwrap();
    }
    cluster.converge();
    let placement = cluster.leader_meta().unwrap().placement_snapshot();
    let mut per_node: BTreeMap<NodeId, usize> = BTreeMap::new();
    for owner in placement.owners.values() {
        *per_node.entry(owner.node.clone()).or_default() += 1;
    }
    // q0 → n1, q1 → n2, q2 → n3, q3 → n1...: each with its dead-letter queue.
    assert_eq!(per_node.values().copied().collect::<Vec<_>>(), [4, 4, 4]);
    assert_eq!(placement.owners[&q("q1.DLQ")].node, node_name(2));
    for node in cluster.up_ids() {
        let meta = &cluster.view(node).unwrap().meta;
        assert_eq!(meta.placement_snapshot(), placement, "{node}");
    }
}

#[test]
fn nodes_join_as_learners_are_promoted_and_removed_through_the_metadata_log() {
    let mut cluster = Cluster::new(2, 3, 8);
    cluster.converge();
    for i in 0..10 {
        create_by_rule(&mut cluster, &format!("early{i}")).unwrap();
    }
    for id in [4, 5] {
        let event = cluster.propose_and_wait(&add(id, true)).unwrap();
        assert!(matches!(
            event,
            MetaEvent::NodeAdded {
                role: NodeRole::Learner,
                ..
            }
        ));
    }
    cluster.converge();
    assert_eq!(leader_status(&cluster).learners, [PeerId(4), PeerId(5)]);
    for id in [4, 5] {
        let promote = MetaCommand::PromoteNode { id: node_name(id) };
        cluster.propose_and_wait(&promote).unwrap();
    }
    cluster.converge();
    let status = leader_status(&cluster);
    assert_eq!(status.voters.len(), 5);
    assert!(status.learners.is_empty());
    leave_through_the_log(&mut cluster);
}

/// A node that owns queues cannot leave; an empty one can, and its raft id is never given
/// again.
fn leave_through_the_log(cluster: &mut Cluster) {
    let pinned = MetaCommand::CreateQueue {
        name: q("on-five"),
        settings: pb::QueueConfig::default(),
        owner: node_name(5),
    };
    cluster.propose_and_wait(&pinned).unwrap();
    let remove = |id| MetaCommand::RemoveNode { id: node_name(id) };
    let refused = cluster.propose_and_wait(&remove(5)).unwrap_err();
    assert_eq!(
        refused,
        MetaError::NodeOwnsQueues {
            node: node_name(5),
            queues: vec![q("on-five"), q("on-five.DLQ")]
        }
    );
    let meta = cluster.leader_meta().unwrap();
    let empty = meta
        .nodes()
        .keys()
        .find(|n| meta.queues_of(n).is_empty())
        .cloned()
        .unwrap();
    let raft_id = meta.node(&empty).unwrap().raft_id;
    cluster
        .propose_and_wait(&MetaCommand::RemoveNode { id: empty.clone() })
        .unwrap();
    cluster.converge();
    let meta = cluster.leader_meta().unwrap();
    assert_eq!(meta.node(&empty).unwrap().state, NodeState::Removed);
    let status = leader_status(cluster);
    assert_eq!(status.voters.len(), 4);
    assert!(!status.voters.contains(&PeerId(raft_id.0)));
    let event = cluster.propose_and_wait(&add(6, true)).unwrap();
    assert!(matches!(
        event,
        MetaEvent::NodeAdded {
            raft_id: RaftId(6),
            ..
        }
    ));
    cluster.converge();
}

/// The metadata leader asked to leave hands its leadership over first and is removed by the
/// next leader: had it removed itself, it would stop on applying its removal before the other
/// voter learned that it committed, and of two voters the one left would wait for ever for the
/// vote of the one gone.
#[test]
fn a_leader_asked_to_leave_hands_over_and_the_voter_left_goes_on() {
    let mut cluster = Cluster::new(6, 2, 1_000);
    cluster.converge();
    let leader = cluster.leader().unwrap();
    let name = node_name(leader.0);
    cluster
        .propose_and_wait(&MetaCommand::RemoveNode { id: name.clone() })
        .unwrap();
    // Handed over while still up (removing itself, it would lead until it stopped).
    let handed_over = |c: &Cluster| c.is_up(leader) && c.leader().is_some_and(|l| l != leader);
    assert!(
        cluster.run_until(ELECTION_STEPS * 4, handed_over),
        "{}",
        cluster.describe()
    );
    let left = |c: &Cluster| c.up_ids().len() == 1;
    assert!(
        cluster.run_until(ELECTION_STEPS * 4, left),
        "{}",
        cluster.describe()
    );
    cluster.converge();
    let status = leader_status(&cluster);
    assert_eq!(status.voters.len(), 1, "{status:?}");
    assert!(!status.voters.contains(&leader));
    create_by_rule(&mut cluster, "after").unwrap();
}

#[test]
fn a_crash_loses_the_unsynced_tail_and_the_node_rebuilds_its_metadata() {
    let mut cluster = Cluster::new(3, 3, 1_000);
    cluster.converge();
    create_by_rule(&mut cluster, "durable").unwrap();
    let victim = cluster.leader().unwrap();
    // The leader sends five creates to its followers and dies writing them itself.
    cluster.crash_in_next_write(victim);
    let meta = cluster.leader_meta().unwrap();
    let owner = choose_owner(&meta, &BTreeMap::new(), None).unwrap();
    let creates = (0..5)
        .map(|i| {
            let command = MetaCommand::CreateQueue {
                name: q(&format!("maybe{i}")),
                settings: pb::QueueConfig::default(),
                owner: owner.clone(),
            };
            command.encode()
        })
        .collect();
    cluster.submit_together(victim, creates);
    assert!(cluster.store(victim).died(), "the victim died in its write");
    assert!(cluster.store(victim).unsynced_job_count() > 0);
    cluster.step();
    assert!(!cluster.is_up(victim));
    cluster.run(ELECTION_STEPS);
    // Its metadata is rebuilt from its durable copy and its log (checked against the Raft
    // records' applied index as it starts), then catches up.
    cluster.restart(victim);
    cluster.converge();
    create_by_rule(&mut cluster, "after").unwrap();
    cluster.converge();
    let meta = &cluster.view(victim).unwrap().meta;
    assert!(meta.queue(&q("durable")).is_some() && meta.queue(&q("after")).is_some());
}

#[test]
fn a_partitioned_leader_is_replaced_and_learns_what_the_majority_placed() {
    let mut cluster = Cluster::new(5, 3, 1_000);
    cluster.converge();
    create_by_rule(&mut cluster, "before").unwrap();
    let old = cluster.leader().unwrap();
    cluster.isolate(old);
    // Proposed to the cut-off leader: appended in its term, never committed.
    let meta = cluster.leader_meta().unwrap();
    let owner = choose_owner(&meta, &BTreeMap::new(), None).unwrap();
    let stranded = MetaCommand::CreateQueue {
        name: q("stranded"),
        settings: pb::QueueConfig::default(),
        owner,
    };
    let mut answer = cluster.submit(old, stranded.encode());
    let group = cluster.view(old).unwrap().group.clone().unwrap();
    let (index, term) = (group.last_index, group.term);
    assert!(cluster.run_until(ELECTION_STEPS * 2, |c| c.leader().is_some_and(|l| l != old)));
    create_by_rule(&mut cluster, "majority").unwrap();
    cluster.heal();
    cluster.converge();
    // The new leader's log overwrote the cut-off proposal: another entry is committed at its
    // index, the proposer is told so, and no node applied it.
    let committed = cluster.term_at(index);
    assert!(
        committed.is_some_and(|t| t != term),
        "the cut-off leader's proposal at index {index} term {term}: committed term {committed:?}"
    );
    assert_eq!(answer.try_recv(), Ok(Err(ProposeFailure::Overwritten)));
    assert!(cluster
        .view(old)
        .unwrap()
        .meta
        .queue(&q("majority"))
        .is_some());
    for node in cluster.up_ids() {
        let meta = &cluster.view(node).unwrap().meta;
        assert!(
            meta.queue(&q("stranded")).is_none(),
            "{node} applied the cut-off leader's proposal"
        );
    }
}

#[test]
fn the_whole_cluster_restarts_with_its_metadata() {
    let mut cluster = Cluster::new(4, 3, 5);
    cluster.converge();
    for i in 0..12 {
        create_by_rule(&mut cluster, &format!("q{i}")).unwrap();
    }
    cluster.converge();
    let before = cluster.leader_meta().unwrap().placement_snapshot().owners;
    // Every node dies in its next write, with a create on its way: nobody makes it durable.
    for node in cluster.up_ids() {
        cluster.crash_in_next_write(node);
    }
    create_in_flight(&mut cluster, "lost");
    let all_down = |c: &Cluster| c.up_ids().is_empty();
    assert!(
        cluster.run_until(ELECTION_STEPS, all_down),
        "{}",
        cluster.describe()
    );
    for node in cluster.all_ids() {
        cluster.restart(node);
    }
    cluster.converge();
    let after = cluster.leader_meta().unwrap().placement_snapshot().owners;
    assert_eq!(after, before);
    create_by_rule(&mut cluster, "after").unwrap();
}

fn create_in_flight(cluster: &mut Cluster, name: &str) {
    let meta = cluster.leader_meta().unwrap();
    let owner = choose_owner(&meta, &BTreeMap::new(), None).unwrap();
    let command = MetaCommand::CreateQueue {
        name: q(name),
        settings: pb::QueueConfig::default(),
        owner,
    };
    assert!(cluster.propose(&command).is_some(), "a leader took it");
}

// ---- a failover on a lossy network, and the same run from the same seed ----

/// Forms the cluster on a lossy network, creates a queue, cuts the leader off, creates
/// another through the new leader, heals and converges; the network's trace.
fn failover(seed: u64) -> (Cluster, Vec<(u64, Traced)>) {
    let mut cluster = Cluster::new(seed, 3, 1_000);
    cluster.set_faults(Faults::lossy());
    cluster.converge();
    let create = |queue: &str, owner| MetaCommand::CreateQueue {
        name: q(queue),
        settings: pb::QueueConfig::default(),
        owner: node_name(owner),
    };
    cluster.propose_and_wait(&create("before", 1)).unwrap();
    let old = cluster.leader().unwrap();
    cluster.isolate(old);
    assert!(cluster.run_until(ELECTION_STEPS * 4, |c| c.leader().is_some_and(|l| l != old)));
    cluster.propose_and_wait(&create("during", 2)).unwrap();
    cluster.heal();
    cluster.converge();
    let trace = cluster.trace();
    (cluster, trace)
}

#[test]
fn the_real_driver_forms_a_cluster_fails_over_and_converges_on_the_simulator() {
    let (cluster, trace) = failover(5);
    for peer in cluster.up_ids() {
        let view = cluster.view(peer).unwrap();
        for queue in ["before", "during"] {
            assert!(view.meta.queue(&q(queue)).is_some(), "{queue} on {peer}");
        }
        // Every node ends in the cluster's voters, as the metadata recorded them.
        let status = view.group.clone().unwrap();
        assert_eq!(status.voters.len(), 3, "{peer}: {status:?}");
        assert_eq!(view.raft_id, Some(RaftId(peer.0)));
    }
    assert!(trace.iter().any(|(_, e)| matches!(e, Traced::Lost { .. })));
}

#[test]
fn the_same_seed_gives_the_same_run() {
    let (_, first) = failover(9);
    let (_, again) = failover(9);
    assert_eq!(first, again);
}
