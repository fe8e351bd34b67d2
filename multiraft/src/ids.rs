//! Identifiers: nodes, groups, persistence jobs and log positions.

use std::fmt;

/// A node of the cluster. It is also the node's Raft peer id in every group it belongs to, so
/// it is never 0 (raft-rs reserves 0 for "nobody").
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct NodeId(pub u64);

/// A Raft group hosted by the engine: 0 is the cluster metadata, 1..N queue shards.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct GroupId(pub u64);

/// The number of a [`crate::PersistJob`]; jobs are numbered in the order the engine made them
/// and must be written in that order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PersistId(pub u64);

/// Where an entry sits in a group's log: its index and the term it was proposed in. An entry is
/// identified by both: the same index may hold another entry after a leader change.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct LogPosition {
    /// Index of the entry in its group's log (the first entry of a group is at 2; 1 is the
    /// bootstrap snapshot).
    pub index: u64,
    /// Term of the leader that appended it.
    pub term: u64,
}

impl fmt::Display for NodeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "node {}", self.0)
    }
}

impl fmt::Display for GroupId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "group {}", self.0)
    }
}

/// Node ids in ascending order (raft-rs keeps configurations in hash sets).
pub(crate) fn sorted_nodes(ids: &[u64]) -> Vec<NodeId> {
    let mut nodes: Vec<NodeId> = ids.iter().copied().map(NodeId).collect();
    nodes.sort_unstable();
    nodes
}
