//! The membership changes a leader drives: the metadata group's after the nodes the metadata
//! records, and the queue shards' after their replicas (`shard/members.rs`).

use ferry_cluster::next_conf_change;
use ferry_multiraft::{ConfChange, Engine};

use super::{Driver, NodeMachine, Role, META_GROUP};

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
            hand_over_before_leaving(engine);
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
        let Some(engine) = self.rounds.engine_mut() else {
            return;
        };
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

/// The metadata leader never removes itself: it hands its leadership to the voter that has the
/// most of its log, which removes it. A leader that applied its own removal could stop before
/// any other voter learned that the change committed (a commit reaches followers with the next
/// message), leaving them a configuration that still needs its vote.
fn hand_over_before_leaving(engine: &mut Engine) {
    let Some(progress) = engine.leader_progress(META_GROUP) else {
        return;
    };
    if progress.transferring_to.is_some() {
        return;
    }
    let Some(to) = progress
        .followers
        .iter()
        .filter(|f| f.recently_active)
        .max_by_key(|f| f.match_index)
        .map(|f| f.node)
    else {
        tracing::debug!("removed from the metadata group, and no other voter to hand it to yet");
        return;
    };
    match engine.transfer_leader(META_GROUP, to) {
        Ok(()) => tracing::info!(
            to = to.0,
            "this node leaves the cluster: handing the metadata leadership over first"
        ),
        Err(e) => tracing::debug!(error = %e, "metadata leadership not handed over yet"),
    }
}
