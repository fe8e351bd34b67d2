//! Recording the data directory each node runs on (its incarnation, drawn when the directory
//! was made: `crate::data_dir::incarnation`). Every Raft batch carries its sender's; the
//! metadata leader proposes `MetaCommand::NoteIncarnation` for each active node it has heard one
//! from and none is recorded for, and every node refuses batches from a member whose
//! incarnation differs from the one recorded (`transport::admit_incarnation`). So a node whose
//! disk was lost, started again on an empty directory under its old identity, takes no part:
//! its vote could otherwise elect a leader missing entries it had acknowledged.

use std::time::Duration;

use ferry_cluster::meta::MetaCommand;
use ferry_kernel::NodeId;

use super::MetaNode;

/// How often the metadata leader looks for nodes whose incarnation is not recorded yet, besides
/// every change of the metadata it sees (a peer's incarnation is learned from its batches,
/// which change nothing there).
const RECORD_INTERVAL: Duration = Duration::from_secs(1);

impl MetaNode {
    /// While this node leads the metadata group, records the incarnation of every active node
    /// that has none recorded, once heard from: at once when it comes to lead (its own, as a
    /// cluster forms), else within [`RECORD_INTERVAL`]. Ends at shutdown.
    pub(super) async fn record_incarnations(self) {
        let mut shutdown = self.shared.shutdown.clone();
        let mut view = self.shared.view.clone();
        let mut tick = tokio::time::interval(RECORD_INTERVAL);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                changed = view.changed() => if changed.is_err() { return },
                _ = shutdown.wait_for(|s| *s) => return,
            }
            for (node, incarnation) in self.unrecorded_incarnations() {
                let shown = format!("{incarnation:016x}");
                let command = MetaCommand::NoteIncarnation {
                    node: node.clone(),
                    incarnation,
                };
                match self.propose(&command).await {
                    Ok(_) => {
                        tracing::info!(%node, incarnation = %shown, "recorded the data directory a node runs on");
                    }
                    Err(e) => {
                        // Asked again at the next look (a leader change, a node of an older
                        // release that cannot read the command yet).
                        tracing::debug!(%node, incarnation = %shown, error = %e, "could not record the data directory a node runs on");
                        break;
                    }
                }
            }
        }
    }

    /// The active nodes with no incarnation recorded whose incarnation this node knows (its
    /// own, and each peer's as its batches said), while it leads the metadata group and every
    /// other active node reads the command (none is proposed to fail during an upgrade).
    fn unrecorded_incarnations(&self) -> Vec<(NodeId, u64)> {
        let view = self.shared.view.borrow();
        if !view.is_leader() {
            return vec![];
        }
        let me = &self.shared.settings.node_id;
        let links = &self.shared.links;
        let needed = MetaCommand::NoteIncarnation {
            node: me.clone(),
            incarnation: 1,
        }
        .level();
        let all_read_it = view
            .meta
            .nodes()
            .iter()
            .filter(|(id, n)| *id != me && n.is_active())
            .all(|(_, n)| links.peer_command_level(n.raft_id.0) >= needed);
        if !all_read_it {
            return vec![];
        }
        view.meta
            .nodes()
            .iter()
            .filter(|(_, n)| n.is_active() && n.incarnation == 0)
            .filter_map(|(id, n)| {
                let known = if id == me {
                    self.shared.settings.incarnation
                } else {
                    links.peer_incarnation(n.raft_id.0)
                };
                (known != 0).then(|| (id.clone(), known))
            })
            .collect()
    }
}
