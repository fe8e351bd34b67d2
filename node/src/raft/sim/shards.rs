//! Queue shards following the metadata, on the node's real driver: a replicated queue's shard
//! starts on exactly its replicas, elects one leader, replicates an entry to all of them, comes
//! back after a restart, and leaves every replica with its last queue, its Raft records and
//! applied position deleted.

use std::collections::{BTreeMap, BTreeSet};

use ferry_cluster::meta::{choose_shard, MetaCommand, MetaEvent, RaftId};
use ferry_kernel::{QueueName, QueueUid, ShardId};
use ferry_multiraft::{GroupId, LogStore, NodeId as PeerId, Role};
use ferry_proto::pb;
use ferry_store::{encode_entry, QueueDef, StoreOp};
use tokio::sync::oneshot;

use super::{Cluster, ELECTION_STEPS};
use crate::raft::driver::Input;
use crate::raft::shard::applied_key;

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
    let (reply, answer) = oneshot::channel();
    let term = view.shards[&shard].term;
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
    let mut answer = answer;
    assert!(cluster.run_until(ELECTION_STEPS * 4, |_| !answer.is_empty()));
    assert_eq!(answer.try_recv().unwrap(), Ok(()));
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
