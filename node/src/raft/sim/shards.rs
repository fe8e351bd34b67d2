//! Queue shards following the metadata, on the node's real driver: a replicated queue's shard
//! starts on exactly its replicas, elects one leader, replicates an entry to all of them, comes
//! back after a restart, and leaves every replica with its last queue, its Raft records and
//! applied position deleted.

use std::collections::{BTreeMap, BTreeSet};

use ferry_cluster::meta::{choose_shard, MetaCommand, MetaEvent, RaftId};
use ferry_kernel::{QueueName, QueueUid, ShardId};
use ferry_multiraft::{GroupId, LogStore, NodeId as PeerId, Role};
use ferry_proto::pb;
use ferry_store::{encode_entry, QueueDef, QueueStore, StoreOp};
use tokio::sync::oneshot;

use super::{Cluster, ELECTION_STEPS};
use crate::raft::driver::Input;
use crate::raft::shard::applied_key;
use crate::raft::shard::sim_link::durable_store;

fn q(name: &str) -> QueueName {
    QueueName::new(name).unwrap()
}

/// Creates replicated queue `name` (factor 3) where the leader's rule puts it; its shard.
fn create_replicated(cluster: &mut Cluster, name: &str) -> ShardId {
    let meta = cluster.leader_meta().unwrap();
    let settings = pb::QueueConfig::default();
    let shard = choose_shard(&meta, &q(name), &settings, 3, false, &BTreeSet::new()).unwrap();
    let command = MetaCommand::CreateReplicatedQueue {
        name: q(name),
        settings,
        shard,
    };
    let Ok(MetaEvent::ReplicatedQueuesCreated { shard, .. }) = cluster.propose_and_wait(&command)
    else {
        panic!("{name} not created")
    };
    shard
}

/// The raft ids of `shard`'s replicas in the leader's metadata.
fn replicas(cluster: &Cluster, shard: ShardId) -> BTreeSet<PeerId> {
    let meta = cluster.leader_meta().unwrap();
    meta.shard(shard)
        .unwrap()
        .replicas
        .iter()
        .map(|r| PeerId(meta.node(r).unwrap().raft_id.0))
        .collect()
}

/// The nodes running `shard`'s group, and the leader each knows.
fn running(cluster: &Cluster, shard: ShardId) -> BTreeMap<PeerId, Option<RaftId>> {
    cluster
        .up_ids()
        .into_iter()
        .filter_map(|peer| {
            let view = cluster.view(peer)?;
            view.shards.get(&shard).map(|g| (peer, g.leader))
        })
        .collect()
}

/// Every replica runs the group and knows the same leader, one of them.
fn settled(cluster: &Cluster, shard: ShardId, replicas: &BTreeSet<PeerId>) -> bool {
    let running = running(cluster, shard);
    let nodes: BTreeSet<PeerId> = running.keys().copied().collect();
    let leaders: BTreeSet<Option<RaftId>> = running.values().copied().collect();
    nodes == *replicas
        && leaders.len() == 1
        && leaders
            .first()
            .copied()
            .flatten()
            .is_some_and(|l| replicas.contains(&PeerId(l.0)))
}

fn shard_leader(cluster: &Cluster, shard: ShardId) -> PeerId {
    let (_, leader) = running(cluster, shard).into_iter().next().unwrap();
    PeerId(leader.unwrap().0)
}

/// What a node's store holds of `shard`: its Raft records, its applied position.
fn stored(cluster: &Cluster, peer: PeerId, shard: ShardId) -> (bool, bool) {
    let store = cluster.store(peer);
    let records = store
        .load()
        .unwrap()
        .group_ids()
        .contains(&GroupId(shard.0));
    let applied = store.app_get(&applied_key(GroupId(shard.0))).unwrap();
    (records, applied.is_some())
}

#[test]
fn a_replicated_queue_s_shard_runs_on_its_replicas_only_and_goes_with_its_last_queue() {
    let mut cluster = Cluster::new(11, 5, 1_000);
    cluster.converge();
    let shard = create_replicated(&mut cluster, "orders");
    let replicas = replicas(&cluster, shard);
    assert_eq!(replicas.len(), 3);
    assert!(
        cluster.run_until(ELECTION_STEPS * 8, |c| settled(c, shard, &replicas)),
        "the shard did not settle on its replicas: {:?}",
        running(&cluster, shard)
    );
    let leader = shard_leader(&cluster, shard);
    let view = cluster.view(leader).unwrap();
    assert_eq!(view.shards[&shard].role, Role::Leader);
    let voters: BTreeSet<PeerId> = view.shards[&shard]
        .voters
        .iter()
        .map(|v| PeerId(v.0))
        .collect();
    assert_eq!(voters, replicas);

    // An entry proposed at the leader is applied on every replica.
    let def = QueueDef {
        name: q("orders"),
        uid: QueueUid(7),
        replica: None,
        config: Default::default(),
    };
    put_queue(&mut cluster, shard, &def);
    let holds = |c: &Cluster, peer: PeerId| {
        c.store(peer).attachments().iter().any(|a| {
            a.downcast_ref::<Vec<StoreOp>>()
                .is_some_and(|ops| ops.contains(&StoreOp::PutQueue(def.clone())))
        })
    };
    assert!(cluster.run_until(ELECTION_STEPS * 4, |c| replicas
        .iter()
        .all(|p| holds(c, *p))));
    for peer in cluster.up_ids() {
        assert_eq!(stored(&cluster, peer, shard).0, replicas.contains(&peer));
    }

    // A replica restarted runs the group again, from its store.
    let follower = *replicas.iter().find(|p| **p != leader).unwrap();
    cluster.crash(follower);
    cluster.restart(follower);
    assert!(cluster.run_until(ELECTION_STEPS * 8, |c| settled(c, shard, &replicas)));

    // The queue and its dead-letter queue deleted: the group leaves every replica, and so do
    // its records and applied position.
    for name in ["orders", "orders.DLQ"] {
        let delete = MetaCommand::DeleteQueue { name: q(name) };
        cluster.propose_and_wait(&delete).unwrap();
    }
    assert!(
        cluster.run_until(ELECTION_STEPS * 8, |c| running(c, shard).is_empty()
            && c.up_ids()
                .iter()
                .all(|p| stored(c, *p, shard) == (false, false))),
        "the shard stayed: {:?}",
        running(&cluster, shard)
    );
    // ... and does not come back with a restart.
    cluster.crash(follower);
    cluster.restart(follower);
    cluster.converge();
    assert!(running(&cluster, shard).is_empty());
    assert_eq!(stored(&cluster, follower, shard), (false, false));
}

/// The raft id of `shard`'s preferred leader in the leader's metadata.
fn preferred(cluster: &Cluster, shard: ShardId) -> PeerId {
    let meta = cluster.leader_meta().unwrap();
    let node = meta.shard(shard).unwrap().preferred_leader().clone();
    PeerId(meta.node(&node).unwrap().raft_id.0)
}

/// A new shard's first leader is its preferred leader, whichever node leads the metadata: no
/// hand-over by the balancer a few seconds after its queue was made, which would break the
/// streams of the queue's first clients (`driver/first_leader.rs`).
#[test]
fn a_new_shard_is_first_led_by_its_preferred_leader() {
    for seed in 0..8 {
        let mut cluster = Cluster::new(seed, 3, 1_000);
        cluster.converge();
        for i in 0..3 {
            let shard = create_replicated(&mut cluster, &format!("q{i}"));
            let replicas = replicas(&cluster, shard);
            assert!(
                cluster.run_until(ELECTION_STEPS * 8, |c| settled(c, shard, &replicas)),
                "seed {seed}: shard {shard} did not settle: {:?}",
                running(&cluster, shard)
            );
            assert_eq!(
                shard_leader(&cluster, shard),
                preferred(&cluster, shard),
                "seed {seed}: shard {shard} first led by another replica"
            );
        }
    }
}

#[test]
fn a_replica_down_when_its_shard_went_removes_it_when_it_comes_back() {
    let mut cluster = Cluster::new(12, 3, 1_000);
    cluster.converge();
    let shard = create_replicated(&mut cluster, "orders");
    let replicas = replicas(&cluster, shard);
    assert!(cluster.run_until(ELECTION_STEPS * 8, |c| settled(c, shard, &replicas)));
    let away = *replicas.iter().next().unwrap();
    cluster.crash(away);
    for name in ["orders", "orders.DLQ"] {
        let delete = MetaCommand::DeleteQueue { name: q(name) };
        cluster.propose_and_wait(&delete).unwrap();
    }
    assert!(
        stored(&cluster, away, shard).0,
        "the node away kept the group's records"
    );
    cluster.restart(away);
    assert!(
        cluster.run_until(ELECTION_STEPS * 8, |c| c.view(away).is_some_and(|v| v
            .meta
            .shard(shard)
            .is_none()
            && v.shards.is_empty())
            && stored(c, away, shard) == (false, false)),
        "the shard stayed on the node that was away: {:?}",
        running(&cluster, shard)
    );
}

/// Proposes queue `def`'s definition to `shard` at its leader and waits until it is applied
/// there.
fn put_queue(cluster: &mut Cluster, shard: ShardId, def: &QueueDef) {
    let leader = shard_leader(cluster, shard);
    let term = cluster.view(leader).unwrap().shards[&shard].term;
    let (reply, mut answer) = oneshot::channel();
    let input = Input::ProposeShard {
        group: GroupId(shard.0),
        term,
        entry: encode_entry(&[StoreOp::PutQueue(def.clone())]).unwrap(),
        reply,
    };
    cluster
        .sim
        .replica_mut(leader)
        .unwrap()
        .received
        .push(input);
    assert!(cluster.run_until(ELECTION_STEPS * 4, |_| !answer.is_empty()));
    assert_eq!(answer.try_recv().unwrap(), Ok(()));
}

/// The queues `peer`'s store made durable for `shard`.
fn durable_queues(cluster: &Cluster, peer: PeerId, shard: ShardId) -> Vec<QueueName> {
    let store = durable_store(cluster.store(peer), &[GroupId(shard.0)]);
    let recovered = store.recover().unwrap();
    recovered
        .into_iter()
        .filter(|q| q.def.replica.as_ref().is_some_and(|r| r.shard == shard))
        .map(|q| q.def.name)
        .collect()
}

/// The voters and learners of `shard`'s group as its leader knows them.
fn configuration(cluster: &Cluster, shard: ShardId) -> Option<(BTreeSet<PeerId>, usize)> {
    let running = running(cluster, shard);
    let leader = running.values().flatten().next()?;
    let view = cluster.view(PeerId(leader.0))?;
    let group = view.shards.get(&shard)?;
    (group.role == Role::Leader).then(|| {
        let voters = group.voters.iter().map(|v| PeerId(v.0)).collect();
        (voters, group.learners.len())
    })
}

/// The metadata name of node `peer`.
fn name_of(cluster: &Cluster, peer: PeerId) -> ferry_kernel::NodeId {
    let meta = cluster.leader_meta().unwrap();
    meta.node_by_raft_id(RaftId(peer.0)).unwrap().0.clone()
}

/// A node's disk is lost (it dies and never comes back): its replica is moved to a node that
/// held none; the shard's leader adds it as a learner, fills it with a snapshot (its group
/// started empty), promotes it and removes the lost one; the new replica holds the shard's
/// data. Then the leader's replica, on a node that works, is moved off too: it hands its
/// leadership over at once, keeps voting until its group removed it, then stops its group and
/// deletes what it held of the shard.
#[test]
fn a_moved_replica_is_filled_by_a_snapshot_and_voted_in_and_the_one_that_left_removed() {
    let mut cluster = Cluster::new(13, 5, 1_000);
    cluster.converge();
    let shard = create_replicated(&mut cluster, "orders");
    let first = replicas(&cluster, shard);
    assert!(cluster.run_until(ELECTION_STEPS * 8, |c| settled(c, shard, &first)));
    let def = QueueDef {
        name: q("orders"),
        uid: QueueUid(7),
        replica: Some(ferry_store::ShardReplica {
            shard,
            epoch: ferry_kernel::PlacementEpoch::new(3),
            handle_key: None,
        }),
        config: Default::default(),
    };
    put_queue(&mut cluster, shard, &def);
    let leader = shard_leader(&cluster, shard);
    let lost = *first.iter().find(|p| **p != leader).unwrap();
    let spare: Vec<PeerId> = cluster
        .up_ids()
        .into_iter()
        .filter(|p| !first.contains(p))
        .collect();
    cluster.crash(lost);
    let command = MetaCommand::MoveReplica {
        shard,
        from: name_of(&cluster, lost),
        to: name_of(&cluster, spare[0]),
    };
    let moved = cluster.propose_and_wait(&command);
    assert!(
        matches!(moved, Ok(MetaEvent::ReplicaMoved { .. })),
        "{moved:?}"
    );
    let mut wanted = first.clone();
    wanted.remove(&lost);
    wanted.insert(spare[0]);
    let whole = |c: &Cluster, wanted: &BTreeSet<PeerId>| {
        settled(c, shard, wanted) && configuration(c, shard) == Some((wanted.clone(), 0))
    };
    assert!(
        cluster.run_until(ELECTION_STEPS * 16, |c| whole(c, &wanted)),
        "the shard did not move: running {:?}, configuration {:?}",
        running(&cluster, shard),
        configuration(&cluster, shard)
    );
    use std::sync::atomic::Ordering::Relaxed;
    assert!(
        cluster.snapshots_sent.load(Relaxed) >= 1,
        "the new replica came through a snapshot"
    );
    assert_eq!(durable_queues(&cluster, spare[0], shard), [q("orders")]);
    assert!(
        cluster
            .view(spare[0])
            .unwrap()
            .meta
            .shard(shard)
            .unwrap()
            .reshaped
    );

    // The working leader's replica moved off: it hands its leadership over at once and keeps
    // voting until its group removed it (never fewer voters running than before the move), then
    // removes its group and what it held, and the shard goes on.
    assert!(cluster.run_until(ELECTION_STEPS * 8, |c| settled(c, shard, &wanted)));
    let leaving = shard_leader(&cluster, shard);
    assert_eq!(durable_queues(&cluster, leaving, shard), [q("orders")]);
    let command = MetaCommand::MoveReplica {
        shard,
        from: name_of(&cluster, leaving),
        to: name_of(&cluster, spare[1]),
    };
    cluster.propose_and_wait(&command).unwrap();
    wanted.remove(&leaving);
    wanted.insert(spare[1]);
    let mut fewest_voting = usize::MAX;
    let mut led_by_leaving_after_move = 0;
    let done = cluster.run_until(ELECTION_STEPS * 16, |c| {
        let running = running(c, shard);
        if let Some((voters, _)) = configuration(c, shard) {
            fewest_voting =
                fewest_voting.min(voters.iter().filter(|v| running.contains_key(v)).count());
        }
        if running.get(&leaving).copied().flatten() == Some(RaftId(leaving.0)) {
            led_by_leaving_after_move += 1;
        }
        whole(c, &wanted) && stored(c, leaving, shard) == (false, false)
    });
    assert!(
        fewest_voting >= 3,
        "a replica stopped before the group removed it: {fewest_voting} voting"
    );
    assert!(
        // At once (a few steps), not when the balancer would hand it to its preferred leader.
        led_by_leaving_after_move < ELECTION_STEPS as usize / 8,
        "the leaving leader kept its leadership for {led_by_leaving_after_move} steps"
    );
    assert!(
        done,
        "the second move did not finish: running {:?}, configuration {:?}",
        running(&cluster, shard),
        configuration(&cluster, shard)
    );
    assert!(durable_queues(&cluster, leaving, shard).is_empty());
    for peer in &wanted {
        assert_eq!(
            durable_queues(&cluster, *peer, shard),
            [q("orders")],
            "{peer:?}"
        );
    }
}

/// A replica moved off a node that was down: the group removed it without it, and nobody
/// tells it so (a leader sends nothing to a node outside its configuration). Back up, it keeps
/// its group while it hears from no leader for a while, then removes it and what it held.
#[test]
fn a_replica_moved_off_a_node_that_was_down_is_removed_when_it_comes_back() {
    let mut cluster = Cluster::new(14, 4, 1_000);
    cluster.converge();
    let shard = create_replicated(&mut cluster, "orders");
    let first = replicas(&cluster, shard);
    assert!(cluster.run_until(ELECTION_STEPS * 8, |c| settled(c, shard, &first)));
    let leader = shard_leader(&cluster, shard);
    let away = *first.iter().find(|p| **p != leader).unwrap();
    let spare = *cluster
        .up_ids()
        .iter()
        .find(|p| !first.contains(p))
        .unwrap();
    cluster.crash(away);
    let command = MetaCommand::MoveReplica {
        shard,
        from: name_of(&cluster, away),
        to: name_of(&cluster, spare),
    };
    cluster.propose_and_wait(&command).unwrap();
    let mut wanted = first.clone();
    wanted.remove(&away);
    wanted.insert(spare);
    assert!(
        cluster.run_until(ELECTION_STEPS * 16, |c| settled(c, shard, &wanted)
            && configuration(c, shard) == Some((wanted.clone(), 0))),
        "the shard did not move: {:?}",
        configuration(&cluster, shard)
    );
    assert!(
        stored(&cluster, away, shard).0,
        "the node away kept its group"
    );
    cluster.restart(away);
    assert!(
        cluster.run_until(ELECTION_STEPS * 16, |c| c.is_up(away)
            && !running(c, shard).contains_key(&away)
            && stored(c, away, shard) == (false, false)),
        "the node that was away kept the shard: running {:?}",
        running(&cluster, shard)
    );
    assert!(settled(&cluster, shard, &wanted));
}
