//! Moving a queue shard's replica to another node ([`super::MetaCommand::MoveReplica`]): what
//! an operator does when a node's disk is lost, or to drain a node before removing it.
//!
//! The metadata decides where replicas are; the shard's Raft group follows, driven by its
//! leader one configuration change at a time ([`next_replica_step`]): the new replica joins as a
//! learner (its group started empty, filled by a snapshot of the shard), becomes a voter once
//! its log matches the leader's, and only then is the replica that left removed. The node that
//! left stops its group and deletes its copy of the shard when it applies the move.

use std::collections::{BTreeMap, BTreeSet};

use ferry_kernel::{NodeId, ShardId};

use super::command::MetaEvent;
use super::error::MetaError;
use super::state::{MetaState, RaftId};
use super::voters::MembershipStep;

/// The node that takes `shard`'s replica on `from`: an active node holding no replica of the
/// shard, the one holding the fewest replicas of any shard, nodes in `down` last, ties to the
/// smaller id. Pure; apply checks the choice again.
pub fn choose_replacement(
    state: &MetaState,
    shard: ShardId,
    from: &NodeId,
    down: &BTreeSet<NodeId>,
) -> Result<NodeId, MetaError> {
    let def = state
        .shards
        .get(&shard)
        .ok_or(MetaError::ShardNotFound { shard })?;
    if !def.replicas.contains(from) {
        return Err(MetaError::NotAReplica {
            shard,
            node: from.clone(),
            replicas: def.replicas.clone(),
        });
    }
    let mut held: BTreeMap<&NodeId, usize> = BTreeMap::new();
    for s in state.shards.values() {
        for r in &s.replicas {
            *held.entry(r).or_default() += 1;
        }
    }
    state
        .nodes
        .iter()
        .filter(|(id, n)| n.is_active() && !def.replicas.contains(id))
        .map(|(id, _)| id)
        .min_by_key(|id| (down.contains(*id), held.get(id).copied().unwrap_or(0), *id))
        .cloned()
        .ok_or(MetaError::NoReplacement { shard })
}

impl MetaState {
    /// Applies [`super::MetaCommand::MoveReplica`].
    pub(crate) fn move_replica(
        &mut self,
        shard: ShardId,
        from: &NodeId,
        to: &NodeId,
    ) -> Result<MetaEvent, MetaError> {
        let def = self
            .shards
            .get(&shard)
            .ok_or(MetaError::ShardNotFound { shard })?;
        let Some(at) = def.replicas.iter().position(|r| r == from) else {
            return Err(MetaError::NotAReplica {
                shard,
                node: from.clone(),
                replicas: def.replicas.clone(),
            });
        };
        if def.replicas.contains(to) {
            return Err(MetaError::AlreadyAReplica {
                shard,
                node: to.clone(),
            });
        }
        self.active_node(to)?;
        let epoch = self.take_epoch();
        if let Some(def) = self.shards.get_mut(&shard) {
            def.replicas[at] = to.clone();
            def.epoch = epoch;
            def.reshaped = true;
        }
        let mut owners_moved = Vec::new();
        if at == 0 {
            // The preferred leader moved: its queues' owner follows (same epochs: the queues
            // and their messages stay what they were).
            let moved: Vec<_> = self
                .queues
                .iter()
                .filter(|(_, q)| q.shard == Some(shard))
                .map(|(name, q)| (name.clone(), q.clone()))
                .collect();
            for (name, mut q) in moved {
                q.owner.node = to.clone();
                owners_moved.push(name.clone());
                self.insert_queue(name, q);
            }
        }
        Ok(MetaEvent::ReplicaMoved {
            shard,
            from: from.clone(),
            to: to.clone(),
            owners_moved,
        })
    }
}

/// The next configuration change that brings a shard's Raft group (`voters`, `learners`, as
/// its leader `me` knows them) towards its replicas in the metadata (`wanted`, as raft ids);
/// `None` when they agree or the next step must wait. `caught_up` says whether a learner's log
/// matches the leader's well enough to vote. Additions before removals, so the group never
/// has fewer copies than it had: a learner not wanted is removed at once (it never counted);
/// a missing replica is added as a learner, then promoted once caught up; a voter not wanted
/// is removed only once every wanted replica votes. The leader never removes itself (the node
/// that leaves stops its group when it applies the move, and another replica is elected).
pub fn next_replica_step(
    wanted: &[RaftId],
    voters: &[RaftId],
    learners: &[RaftId],
    me: RaftId,
    caught_up: impl Fn(RaftId) -> bool,
) -> Option<MembershipStep> {
    if let Some(l) = learners.iter().find(|l| !wanted.contains(l)) {
        return Some(MembershipStep::Remove(*l));
    }
    if let Some(r) = wanted
        .iter()
        .find(|r| !voters.contains(r) && !learners.contains(r))
    {
        return Some(MembershipStep::AddLearner(*r));
    }
    if let Some(r) = wanted
        .iter()
        .find(|r| learners.contains(r) && caught_up(**r))
    {
        return Some(MembershipStep::Promote(*r));
    }
    if wanted.iter().all(|r| voters.contains(r)) {
        if let Some(v) = voters.iter().find(|v| !wanted.contains(v) && **v != me) {
            return Some(MembershipStep::Remove(*v));
        }
    }
    None
}
