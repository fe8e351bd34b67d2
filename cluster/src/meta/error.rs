//! The metadata state machine's one error enum: why a command was refused or bytes were not a
//! command. Every message says what to fix.

use ferry_kernel::{NodeId, QueueName, ShardId};

use super::state::ClusterId;

/// Why a metadata command was refused (the state is unchanged) or could not be decoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MetaError {
    /// A command other than `Bootstrap` reached a cluster that was never bootstrapped.
    #[error("the cluster is not bootstrapped yet; start the first nodes with --initial-cluster")]
    NotBootstrapped,
    /// A second `Bootstrap` of the same cluster.
    #[error("cluster {cluster_id} is already bootstrapped; join new nodes with `ferry node add`")]
    AlreadyBootstrapped {
        /// The cluster's id.
        cluster_id: ClusterId,
    },
    /// A node or command of another cluster.
    #[error(
        "this is cluster {expected}, not {got}; point the node at its own cluster or wipe its data directory"
    )]
    WrongCluster {
        /// This cluster's id.
        expected: ClusterId,
        /// The id presented.
        got: ClusterId,
    },
    /// `Bootstrap` with no node.
    #[error("a cluster starts with at least one node; list them in --initial-cluster")]
    NoNodes,
    /// The node id is taken by an active node (a removed node's id may be added again).
    #[error(
        "node {node} is already a member of this cluster; choose another id, or remove it first"
    )]
    DuplicateNode {
        /// The id.
        node: NodeId,
    },
    /// A node's address is not `host:port`.
    #[error("the {field} of node {node} is {addr:?}; write it as host:port")]
    InvalidAddress {
        /// The node.
        node: NodeId,
        /// `client_addr` or `peer_addr`.
        field: &'static str,
        /// What was given.
        addr: String,
    },
    /// No node has this id.
    #[error("no node {node} in this cluster; `ferry node list` shows the nodes")]
    UnknownNode {
        /// The id.
        node: NodeId,
    },
    /// The node was removed from the cluster.
    #[error("node {node} was removed from the cluster; choose an active node")]
    NodeRemoved {
        /// The id.
        node: NodeId,
    },
    /// `NoteIncarnation` naming another data directory than the one recorded for the node.
    #[error("node {node} was recorded running on data directory {recorded:016x}, not {got:016x}: its disk was lost or replaced; move its shard replicas, remove it, and add it again on an empty data directory")]
    OtherIncarnation {
        /// The node.
        node: NodeId,
        /// The incarnation recorded.
        recorded: u64,
        /// The one proposed.
        got: u64,
    },
    /// `PromoteNode` of a node that already votes.
    #[error("node {node} is already a voter; promote a learner")]
    AlreadyVoter {
        /// The id.
        node: NodeId,
    },
    /// Removing the only voter would leave the metadata group without a quorum.
    #[error("node {node} is the last voter; promote another node first")]
    LastVoter {
        /// The id.
        node: NodeId,
    },
    /// Removing a node that still owns queues.
    #[error("node {node} still owns queues {queues:?}; delete them first (moving queues comes with replicated queues)")]
    NodeOwnsQueues {
        /// The id.
        node: NodeId,
        /// The queues it owns, in name order.
        queues: Vec<QueueName>,
    },
    /// `CreateQueue` of a name in use.
    #[error("queue {queue} already exists; choose another name or update it")]
    QueueExists {
        /// The queue.
        queue: QueueName,
    },
    /// `UpdateQueue` / `DeleteQueue` of an unknown queue.
    #[error("queue {queue} does not exist (`ferry queue list` shows the queues that do)")]
    QueueNotFound {
        /// The queue.
        queue: QueueName,
    },
    /// `UpdateQueue` whose settings were changed by another command since it was proposed.
    #[error("the settings of queue {queue} were changed by another update meanwhile; retry")]
    SettingsChanged {
        /// The queue.
        queue: QueueName,
    },
    /// A queue's dead-letter or expiry queue exists on another node: both must live together.
    #[error("queue {queue} would dead-letter into {companion}, which lives on node {owner}; pin {queue} to {owner} with --node or choose another target")]
    CompanionElsewhere {
        /// The queue.
        queue: QueueName,
        /// Its dead-letter or expiry queue.
        companion: QueueName,
        /// Where that one lives.
        owner: NodeId,
    },
    /// A queue and its dead-letter or expiry queue are in different shards (or one of them
    /// is replicated and the other not): a shard's entries only name its own queues, so both
    /// must share it.
    #[error("queue {queue} would dead-letter into {companion}, which is {}; a queue and its dead-letter and expiry queues share one shard: create {queue} with the replication of {companion} or choose another target", match shard { Some(s) => format!("in {s}"), None => "not replicated".to_owned() })]
    CompanionInOtherShard {
        /// The queue.
        queue: QueueName,
        /// Its dead-letter or expiry queue.
        companion: QueueName,
        /// That one's shard (`None`: replication factor 1).
        shard: Option<ShardId>,
    },
    /// A replication factor other than 3 or 5 for a shard (1 is a queue with no shard).
    #[error("replication factor {replication} is not one a shard can have; choose 3 or 5 (or 1, a queue that is not replicated)")]
    InvalidReplication {
        /// The factor asked for.
        replication: usize,
    },
    /// More replicas asked for than the cluster has active nodes.
    #[error("replication factor {replication} needs {replication} active nodes and the cluster has {active}; add nodes (`ferry node add`) or ask for fewer replicas")]
    TooFewNodes {
        /// The factor asked for.
        replication: usize,
        /// The active nodes.
        active: usize,
    },
    /// A shard's replica list is malformed.
    #[error("invalid shard replicas: {reason}")]
    InvalidReplicas {
        /// What is wrong.
        reason: String,
    },
    /// No such shard: the proposer chose it on a view where it existed.
    #[error("{shard} no longer exists (its last queue was deleted meanwhile); retry, and a shard is chosen again")]
    ShardNotFound {
        /// The shard.
        shard: ShardId,
    },
    /// The shard belongs to one queue, which asked for a shard of its own.
    #[error("{shard} was made for one queue alone and takes no other; retry, and a shard is chosen again")]
    ShardDedicated {
        /// The shard.
        shard: ShardId,
    },
    /// A node still holds replicas of shards.
    #[error("node {node} still holds replicas of {}; move them to other nodes first (`ferry shard move-replica --from {node}`)", shards.iter().map(ToString::to_string).collect::<Vec<_>>().join(", "))]
    NodeHoldsReplicas {
        /// The node.
        node: NodeId,
        /// The shards.
        shards: Vec<ShardId>,
    },
    /// The node a replica is to move from does not hold one.
    #[error("node {node} holds no replica of {shard}; its replicas are {}", replicas.iter().map(ToString::to_string).collect::<Vec<_>>().join(", "))]
    NotAReplica {
        /// The shard.
        shard: ShardId,
        /// The node named.
        node: NodeId,
        /// The shard's replicas.
        replicas: Vec<NodeId>,
    },
    /// The node a replica is to move to holds one already.
    #[error("node {node} already holds a replica of {shard}; name a node that does not")]
    AlreadyAReplica {
        /// The shard.
        shard: ShardId,
        /// The node named.
        node: NodeId,
    },
    /// No active node can take a replica of the shard.
    #[error("no active node can take {shard}'s replica: every active node but the one it leaves holds one already; add a node first")]
    NoReplacement {
        /// The shard.
        shard: ShardId,
    },
    /// The settings do not convert to a valid queue configuration.
    #[error("settings of queue {queue} are invalid: {reason}")]
    InvalidSettings {
        /// The queue.
        queue: QueueName,
        /// What is wrong, with the field.
        reason: String,
    },
    /// No active node can own a queue.
    #[error("no active node can own a queue; add a node")]
    NoActiveNode,
    /// The driver applied an index at or below one already applied.
    #[error("index {index} is already applied (applied index {applied_index}); apply each entry once, in order")]
    StaleIndex {
        /// The index given.
        index: u64,
        /// The state's applied index.
        applied_index: u64,
    },
    /// Bytes that are not a metadata command or snapshot.
    #[error("undecodable metadata {what}: {reason}")]
    Decode {
        /// "command" or "snapshot".
        what: &'static str,
        /// What was wrong.
        reason: String,
    },
    /// A command or snapshot written by a newer release.
    #[error("metadata {what} version {version} is not supported (this release reads {supported}); upgrade this node")]
    UnsupportedVersion {
        /// "command" or "snapshot".
        what: &'static str,
        /// The version found.
        version: u32,
        /// The version this release reads.
        supported: u32,
    },
}

impl MetaError {
    /// Whether applying must stop here rather than note the entry as refused: it could not be
    /// read (damaged, or a newer release's command) or was given out of order. Every other
    /// error is a refusal, the same on every node.
    pub fn stops_apply(&self) -> bool {
        matches!(
            self,
            MetaError::StaleIndex { .. }
                | MetaError::Decode { .. }
                | MetaError::UnsupportedVersion { .. }
        )
    }
}
