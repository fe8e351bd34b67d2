//! What the driver publishes after its rounds: the metadata state and its view of group 0.

use std::collections::BTreeMap;

use ferry_kernel::{NodeId, ShardId};
use ferry_multiraft::{GroupStatus, Role};

use ferry_cluster::meta::{MetaState, NodeInfo, RaftId};

/// The newest metadata on this node, published through a `watch` channel.
#[derive(Debug, Clone)]
pub struct MetaView {
    /// The state machine at its applied index.
    pub meta: MetaState,
    /// This node's raft id, once it is a member.
    pub raft_id: Option<RaftId>,
    /// This node's view of group 0, once it is a member.
    pub group: Option<GroupStatus>,
    /// The queue shards whose groups run here (this node is one of their replicas), as it sees
    /// them: republished when a role, term, leader or voter set changes, not at every commit.
    pub shards: BTreeMap<ShardId, ShardGroupView>,
}

/// A queue shard's Raft group as the node hosting one of its replicas sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShardGroupView {
    /// This node's role in it.
    pub role: Role,
    /// Its current term here.
    pub term: u64,
    /// The leader this node knows, if any.
    pub leader: Option<RaftId>,
    /// Its voters in force.
    pub voters: Vec<RaftId>,
    /// Its learners in force (a replica joining after a move, see `shard/members.rs`).
    pub learners: Vec<RaftId>,
    /// This node leads it and has applied an entry of its own term, so everything committed
    /// before its term is applied (and durable) here: its back-end may serve the shard's queues.
    pub serving: bool,
}

impl ShardGroupView {
    /// The view of a group's status; `applied_term`: the term of the last entry its machine
    /// applied.
    pub fn of(status: &GroupStatus, applied_term: u64) -> Self {
        ShardGroupView {
            role: status.role,
            term: status.term,
            leader: status.leader.map(|l| RaftId(l.0)),
            voters: status.voters.iter().map(|v| RaftId(v.0)).collect(),
            learners: status.learners.iter().map(|v| RaftId(v.0)).collect(),
            serving: status.role == Role::Leader && applied_term == status.term,
        }
    }
}

impl MetaView {
    /// Before anything was loaded or applied.
    pub fn empty() -> Self {
        MetaView {
            meta: MetaState::new(),
            raft_id: None,
            group: None,
            shards: BTreeMap::new(),
        }
    }

    /// Whether this node leads group 0.
    pub fn is_leader(&self) -> bool {
        self.group.as_ref().is_some_and(|g| g.role == Role::Leader)
    }

    /// The leader this node knows of, as a raft id.
    pub fn leader_raft_id(&self) -> Option<RaftId> {
        self.group
            .as_ref()
            .and_then(|g| g.leader)
            .map(|l| RaftId(l.0))
    }

    /// The node with `raft_id`, if recorded.
    pub fn node_by_raft_id(&self, raft_id: RaftId) -> Option<(&NodeId, &NodeInfo)> {
        self.meta.node_by_raft_id(raft_id)
    }
}

/// Counters of the metadata group on this node, since start (for metrics).
#[derive(Debug, Default)]
pub struct RaftCounters {
    /// Times this node saw the leader of group 0 change.
    pub leader_changes: std::sync::atomic::AtomicU64,
    /// Commands proposed through this node and applied.
    pub proposals: std::sync::atomic::AtomicU64,
    /// Commands proposed through this node that failed (refused, no leader, timed out).
    pub proposals_failed: std::sync::atomic::AtomicU64,
    /// Milliseconds from proposal to applied on this node, summed over `proposals`.
    pub proposal_ms_total: std::sync::atomic::AtomicU64,
}

/// A reading of the metadata group for metrics.
#[derive(Debug, Clone, Default)]
pub struct RaftMetrics {
    /// The term this node knows.
    pub term: u64,
    /// Whether this node leads group 0.
    pub leader: bool,
    /// Highest index known committed.
    pub commit_index: u64,
    /// Highest index applied here.
    pub applied_index: u64,
    /// Entries in the log since the last compaction.
    pub log_entries: u64,
    /// See [`RaftCounters`].
    pub leader_changes_total: u64,
    /// See [`RaftCounters`].
    pub proposals_total: u64,
    /// See [`RaftCounters`].
    pub proposals_failed_total: u64,
    /// See [`RaftCounters`].
    pub proposal_ms_total: u64,
    /// Peers shown down.
    pub peers_down: u64,
    /// Queue shard snapshots this node sent.
    pub shard_snapshots_sent_total: u64,
    /// Queue shard snapshots this node installed.
    pub shard_snapshots_installed_total: u64,
}
