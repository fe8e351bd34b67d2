//! The crate's one error enum.

use crate::ids::{GroupId, NodeId, PersistId};

/// What can go wrong in the engine, its codec and its storage.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A proposal went to a node that does not lead the group; `leader` is the leader this
    /// node knows of, to retry there.
    #[error(
        "{group}: this node is not its leader (leader known: {leader:?}); propose to the leader"
    )]
    NotLeader {
        /// The group proposed to.
        group: GroupId,
        /// The leader this node knows of, if any.
        leader: Option<NodeId>,
    },
    /// The leader dropped the proposal (leadership transfer in progress, or a configuration
    /// change is still pending).
    #[error("{group}: the proposal was dropped ({reason}); retry later")]
    ProposalDropped {
        /// The group proposed to.
        group: GroupId,
        /// Why, as raft-rs reports it.
        reason: String,
    },
    /// The group is not hosted on this node.
    #[error("{group} is not hosted on this node; create or bootstrap it first")]
    GroupNotFound {
        /// The group asked for.
        group: GroupId,
    },
    /// The group already exists on this node.
    #[error("{group} already exists on this node")]
    GroupExists {
        /// The group asked for.
        group: GroupId,
    },
    /// A bootstrap was asked with no voters, or with node id 0.
    #[error("{group}: invalid initial voters {voters:?} (need at least one, none 0)")]
    InvalidVoters {
        /// The group being bootstrapped.
        group: GroupId,
        /// The voters given.
        voters: Vec<u64>,
    },
    /// The engine configuration was refused by raft-rs or by the engine.
    #[error("invalid Raft configuration: {reason}")]
    InvalidConfig {
        /// What is wrong.
        reason: String,
    },
    /// A compaction asked for an index that is not applied yet, or already compacted.
    #[error("{group}: cannot compact to index {index}: {reason}")]
    InvalidCompaction {
        /// The group.
        group: GroupId,
        /// The index asked for.
        index: u64,
        /// Why.
        reason: &'static str,
    },
    /// A batch of messages from a peer could not be decoded (hostile or corrupt bytes).
    #[error("undecodable batch from {from}: {reason} at byte {offset}")]
    BadBatch {
        /// The peer the batch came from (`NodeId(0)` when decoding without a sender).
        from: NodeId,
        /// What was wrong.
        reason: &'static str,
        /// Byte offset in the batch.
        offset: usize,
    },
    /// A Raft message inside a batch was malformed or misaddressed.
    #[error("bad message from {from} for {group}: {reason}")]
    BadMessage {
        /// The peer the batch came from.
        from: NodeId,
        /// The group it was for.
        group: GroupId,
        /// What was wrong.
        reason: String,
    },
    /// `on_persisted` named a job that was never handed out or not in order.
    #[error("persistence completion for unknown job {job:?} (next expected {expected:?})")]
    UnknownPersistJob {
        /// The job named.
        job: PersistId,
        /// The oldest job still waiting.
        expected: Option<PersistId>,
    },
    /// A stored record could not be decoded, or the log has a gap.
    #[error("corrupt Raft storage for {group}: {reason}; restore the node from a peer")]
    CorruptStorage {
        /// The group whose records are damaged.
        group: GroupId,
        /// What is wrong.
        reason: String,
    },
    /// The storage engine failed; the store refuses further writes until restart.
    #[error("Raft storage failed ({operation}): {reason}")]
    Storage {
        /// What was being done.
        operation: &'static str,
        /// The storage engine's error.
        reason: String,
    },
    /// A previous write failed: the store is poisoned until the process restarts.
    #[error("Raft storage refuses writes after an earlier failure; restart the node")]
    StoragePoisoned,
    /// raft-rs reported an error the engine does not expect.
    #[error("{group}: raft error: {reason}")]
    Raft {
        /// The group.
        group: GroupId,
        /// raft-rs's error, as text.
        reason: String,
    },
}
