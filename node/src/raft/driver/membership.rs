//! The membership changes a leader drives: the metadata group's after the nodes the metadata
//! records, and the queue shards' after their replicas (`shard/members.rs`).

use std::collections::{BTreeMap, BTreeSet};

use ferry_be_server::ShardId;
use ferry_cluster::meta::{MetaState, RaftId};
use ferry_cluster::next_conf_change;
use ferry_kernel::NodeId;
use ferry_multiraft::{ConfChange, Engine, GroupId, NodeId as PeerId};

use super::{Driver, NodeMachine, Role, META_GROUP};

/// How long a replica moved away keeps its group while that group knows no leader: several
/// election timeouts (10-20 ticks each). A node that was down when its group removed it is
/// never told (a leader sends nothing to a node outside its configuration); it lets its group
/// go after this long.
const LEAVING_SILENCE_TICKS: u64 = 60;

impl Driver {
    /// As leader: forms the cluster's Raft membership after the nodes recorded in the metadata,
    /// one configuration change at a time.
    pub(super) fn drive_leader(&mut self) {
        // The field, not `meta_machine()`: `conf_pending` changes while this is borrowed.
        let Some(machine) = self
            .rounds
            .machine(META_GROUP)
            .and_then(NodeMachine::as_meta)
        else {
            return;
        };
        if machine.meta().cluster_id().is_none() {
            return;
        }
        let Some(status) = self.rounds.engine().and_then(|e| e.status(META_GROUP)) else {
            return;
        };
        if status.role != Role::Leader {
            return;
        }
        if let Some((term, index)) = self.conf_pending {
            if term == status.term && status.applied_index < index {
                return;
            }
            self.conf_pending = None;
        }
        let Some(change) = next_conf_change(machine.meta(), &status) else {
            return;
        };
        let Some(engine) = self.rounds.engine_mut() else {
            return;
        };
        if change == ConfChange::Remove(engine.node()) {
            hand_over(engine, META_GROUP, None);
            return;
        }
        match engine.propose_conf_change(META_GROUP, change) {
            Ok(position) => {
                tracing::info!(?change, "proposing a metadata group membership change");
                self.conf_pending = Some((position.term, position.index));
            }
            Err(e) => tracing::debug!(?change, error = %e, "membership change not proposed yet"),
        }
    }

    /// As the leader of queue shards: proposes the next change that brings each one's Raft
    /// configuration towards its replicas in the metadata (`shard/members.rs`).
    pub(super) fn drive_shard_members(&mut self) {
        let (Some(machine), Some(engine)) = (
            self.rounds
                .machine(META_GROUP)
                .and_then(NodeMachine::as_meta),
            self.rounds.engine(),
        ) else {
            return;
        };
        let changes = self.shard_members.decide(engine, machine.meta());
        let leaving = led_and_moved_away(engine, machine.meta());
        let Some(engine) = self.rounds.engine_mut() else {
            return;
        };
        for (group, staying) in leaving {
            hand_over(engine, group, Some(&staying));
        }
        for (group, change) in changes {
            match engine.propose_conf_change(group, change) {
                Ok(position) => {
                    tracing::info!(
                        shard = group.0,
                        ?change,
                        "proposing a queue shard membership change"
                    );
                    self.shard_members.proposed(group, position);
                }
                Err(e) => {
                    tracing::debug!(shard = group.0, ?change, error = %e, "shard membership change not proposed yet")
                }
            }
        }
    }
}

impl Driver {
    /// Which of the shard groups `running` here to remove, as the metadata `meta` and this
    /// node (`me`) stand: those whose shard is gone, and those whose replica moved away once
    /// their group no longer has this node in its configuration (or has known no leader for
    /// [`LEAVING_SILENCE_TICKS`]); the others moved away, kept meanwhile, with the tick since
    /// which each has known no leader. Until its group removes it, a replica moved away from a
    /// node that works keeps voting and copying the log: the shard never has fewer copies than
    /// before the move, and one less election.
    pub(super) fn shards_to_close(
        &self,
        engine: &Engine,
        meta: &MetaState,
        me: &NodeId,
        running: BTreeSet<GroupId>,
    ) -> (Vec<GroupId>, BTreeMap<GroupId, Option<u64>>) {
        let mut leaving = BTreeMap::new();
        let close = running
            .into_iter()
            .filter(|g| {
                let id = ShardId(g.0);
                if id >= meta.next_shard() {
                    return false;
                }
                match meta.shard(id) {
                    None => true,
                    Some(def) if def.replicas.contains(me) => false,
                    Some(_) => match self.still_leaving(engine, *g) {
                        Some(silent_since) => {
                            leaving.insert(*g, silent_since);
                            false
                        }
                        None => true,
                    },
                }
            })
            .collect();
        (close, leaving)
    }

    /// For a group whose replica moved away: `None` once it may go, else since when (in ticks)
    /// it has known no leader, if it has none.
    fn still_leaving(&self, engine: &Engine, group: GroupId) -> Option<Option<u64>> {
        let status = engine.status(group)?;
        let me = engine.node();
        if !status.voters.contains(&me) && !status.learners.contains(&me) {
            return None;
        }
        if status.leader.is_some() {
            return Some(None);
        }
        let since = self
            .leaving
            .get(&group)
            .copied()
            .flatten()
            .unwrap_or(self.ticks);
        (self.ticks.saturating_sub(since) < LEAVING_SILENCE_TICKS).then_some(Some(since))
    }
}

/// The shards led here whose replicas in the metadata no longer include this node, each with
/// the raft ids of the replicas that stay: their leadership goes to one of those at once.
fn led_and_moved_away(engine: &Engine, meta: &MetaState) -> Vec<(GroupId, Vec<PeerId>)> {
    let Some((me, _)) = meta.node_by_raft_id(RaftId(engine.node().0)) else {
        return vec![];
    };
    meta.shards()
        .iter()
        .filter_map(|(id, def)| {
            let group = GroupId(id.0);
            let status = engine.status(group)?;
            if status.role != Role::Leader || def.replicas.contains(me) {
                return None;
            }
            let staying = def
                .replicas
                .iter()
                .filter_map(|r| meta.node(r).map(|n| PeerId(n.raft_id.0)))
                .collect();
            Some((group, staying))
        })
        .collect()
}

/// A leader that leaves a group never removes itself: it hands its leadership to the voter
/// (among `to_one_of`, if given) that has the most of its log, which removes it. A leader that
/// applied its own removal could stop before any other voter learned that the change
/// committed (a commit reaches followers with the next message), leaving them a configuration
/// that still needs its vote; and front-ends look for a shard's leader among its replicas in
/// the metadata only.
fn hand_over(engine: &mut Engine, group: GroupId, to_one_of: Option<&[PeerId]>) {
    let Some(progress) = engine.leader_progress(group) else {
        return;
    };
    if progress.transferring_to.is_some() {
        return;
    }
    let Some(to) = progress
        .followers
        .iter()
        .filter(|f| f.recently_active && to_one_of.is_none_or(|ids| ids.contains(&f.node)))
        .max_by_key(|f| f.match_index)
        .map(|f| f.node)
    else {
        tracing::debug!(%group, "leaving the group, and no voter to hand its leadership to yet");
        return;
    };
    match engine.transfer_leader(group, to) {
        Ok(()) => tracing::info!(
            %group,
            to = to.0,
            "this node leaves the group: handing its leadership over first"
        ),
        Err(e) => tracing::debug!(%group, error = %e, "leadership not handed over yet"),
    }
}
