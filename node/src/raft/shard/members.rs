//! The Raft configuration of each queue shard led here, brought in line with the shard's
//! replicas in the metadata after a replica moved (`ferry shard move-replica`): the leader adds
//! the new replica as a learner, promotes it once its log matches, then removes the replica
//! that left, one change at a time per shard ([`ferry_cluster::meta::next_replica_step`]).
//!
//! The leader decides on every tick, from what it knows then, so a change is never lost to a
//! leader change: a new leader finds the configuration unlike the metadata and goes on where
//! the old one stopped.

use std::collections::BTreeMap;

use ferry_cluster::conf_change_of;
use ferry_cluster::meta::{next_replica_step, MetaState, RaftId};
use ferry_multiraft::{ConfChange, Engine, GroupId, LogPosition, NodeId as PeerId, Role};

/// How far behind the leader's commit index a learner's log may be and still be promoted:
/// under steady writes it is never exactly there, and a voter a few entries behind catches up
/// within a round trip.
const CATCH_UP_SLACK: u64 = 64;

/// The configuration change proposed last in each shard led here, until it applies.
#[derive(Debug, Default)]
pub(crate) struct ShardMembers {
    pending: BTreeMap<GroupId, LogPosition>,
}

impl ShardMembers {
    /// The changes to propose now: at most one per shard led here whose configuration differs
    /// from its replicas in `meta` and whose last change applied.
    pub(crate) fn decide(
        &mut self,
        engine: &Engine,
        meta: &MetaState,
    ) -> Vec<(GroupId, ConfChange)> {
        let me = RaftId(engine.node().0);
        let mut changes = Vec::new();
        for (id, def) in meta.shards() {
            let group = GroupId(id.0);
            let Some(status) = engine.status(group) else {
                continue;
            };
            if status.role != Role::Leader {
                self.pending.remove(&group);
                continue;
            }
            if let Some(p) = self.pending.get(&group) {
                if p.term == status.term && status.applied_index < p.index {
                    continue;
                }
                self.pending.remove(&group);
            }
            let Some(wanted) = def
                .replicas
                .iter()
                .map(|r| meta.node(r).map(|n| n.raft_id))
                .collect::<Option<Vec<RaftId>>>()
            else {
                continue;
            };
            let ids = |nodes: &[PeerId]| nodes.iter().map(|n| RaftId(n.0)).collect::<Vec<_>>();
            let matched = engine.match_indexes(group).unwrap_or_default();
            let caught_up = |r: RaftId| {
                matched.iter().any(|(n, m)| {
                    n.0 == r.0 && *m > 0 && m.saturating_add(CATCH_UP_SLACK) >= status.commit_index
                })
            };
            let step = next_replica_step(
                &wanted,
                &ids(&status.voters),
                &ids(&status.learners),
                me,
                caught_up,
            );
            if let Some(step) = step {
                changes.push((group, conf_change_of(step)));
            }
        }
        changes
    }

    /// `change` was proposed to `shard` at `position`: the next waits until it applies.
    pub(crate) fn proposed(&mut self, shard: GroupId, position: LogPosition) {
        self.pending.insert(shard, position);
    }
}
