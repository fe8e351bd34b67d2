//! The commands of the metadata log and what applying one did.

use ferry_kernel::{NodeId, QueueName, ShardId};
use ferry_proto::pb;

use super::requests::RequestId;
use super::shards::ShardChoice;
use super::state::{ClusterId, NodeRole, Owner, RaftId};

/// A node named in `Bootstrap`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewNode {
    /// Its id.
    pub id: NodeId,
    /// Where clients connect.
    pub client_addr: String,
    /// Where peers connect.
    pub peer_addr: String,
}

/// One entry of the metadata log. Encoded with [`MetaCommand::encode`] (versioned protobuf).
#[derive(Debug, Clone, PartialEq)]
pub enum MetaCommand {
    /// Forms the cluster: every node listed is a voter, with raft ids given by
    /// [`super::bootstrap_raft_ids`].
    Bootstrap {
        /// The new cluster's id.
        cluster_id: ClusterId,
        /// Its first nodes.
        nodes: Vec<NewNode>,
    },
    /// Adds a node (raft id assigned here); a learner unless `learner` is false.
    AddNode {
        /// Its id.
        id: NodeId,
        /// Where clients connect.
        client_addr: String,
        /// Where peers connect.
        peer_addr: String,
        /// Joins as a learner.
        learner: bool,
    },
    /// Makes a learner a voter.
    PromoteNode {
        /// The node.
        id: NodeId,
    },
    /// Removes a node that owns no queue.
    RemoveNode {
        /// The node.
        id: NodeId,
    },
    /// Defines a queue on `owner` (chosen by the proposer with [`super::choose_owner`]), with
    /// its dead-letter and expiry queues on the same owner.
    CreateQueue {
        /// The queue.
        name: QueueName,
        /// Its settings.
        settings: pb::QueueConfig,
        /// Its owner.
        owner: NodeId,
    },
    /// Defines a replicated queue in a shard (chosen by the proposer with
    /// [`super::choose_shard`]), with its dead-letter and expiry queues in the same shard.
    /// A command of level 2 ([`super::COMMAND_LEVEL`]).
    CreateReplicatedQueue {
        /// The queue.
        name: QueueName,
        /// Its settings.
        settings: pb::QueueConfig,
        /// An existing shard, or a new one and its replicas.
        shard: ShardChoice,
    },
    /// Replaces a queue's settings (a new dead-letter or expiry queue is created next to it).
    UpdateQueue {
        /// The queue.
        name: QueueName,
        /// The new settings.
        settings: pb::QueueConfig,
        /// Refused ([`super::MetaError::SettingsChanged`]) unless the queue's settings are these
        /// when the command applies: the proposer merged its change into them, and another
        /// change committed meanwhile would be lost. `None`: replace whatever they are.
        expected: Option<Box<pb::QueueConfig>>,
    },
    /// Deletes a queue (its dead-letter queue stays: it may hold messages).
    DeleteQueue {
        /// The queue.
        name: QueueName,
    },
    /// Moves a shard's replica from `from` to `to` (chosen by the proposer with
    /// [`super::choose_replacement`] unless an admin named it): `to` takes `from`'s place in the
    /// replica list (the preferred leader's too, with its queues' ownership), the shard gets a
    /// new epoch and is marked reshaped. The shard's leader then adds `to` to the group as a
    /// learner, promotes it once it holds the log, and removes `from`. A command of level 3.
    MoveReplica {
        /// The shard.
        shard: ShardId,
        /// The replica that leaves (down, or its disk lost, or drained).
        from: NodeId,
        /// The node that takes its place: active, not a replica of the shard yet.
        to: NodeId,
    },
    /// Records the data directory `node` runs on ([`super::NodeInfo::incarnation`]), as first
    /// heard from it by the metadata leader; refused once another one is recorded. A command
    /// of level 4.
    NoteIncarnation {
        /// The node.
        node: NodeId,
        /// Its data directory's incarnation (not 0).
        incarnation: u64,
    },
}

/// What an applied command changed, for the shell (create a queue on its owner's back-end,
/// propose the Raft configuration change, refresh routing...).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MetaEvent {
    /// The cluster was formed.
    Bootstrapped {
        /// Its id.
        cluster_id: ClusterId,
        /// Its voters and their raft ids.
        voters: Vec<(NodeId, RaftId)>,
    },
    /// A node was added: the leader adds it to the Raft group.
    NodeAdded {
        /// The node.
        id: NodeId,
        /// Its raft id.
        raft_id: RaftId,
        /// Voter or learner.
        role: NodeRole,
    },
    /// A learner became a voter: the leader promotes it in the Raft group.
    NodePromoted {
        /// The node.
        id: NodeId,
        /// Its raft id.
        raft_id: RaftId,
    },
    /// A node was removed: the leader removes it from the Raft group.
    NodeRemoved {
        /// The node.
        id: NodeId,
        /// Its raft id.
        raft_id: RaftId,
    },
    /// Queues were defined (the queue first, then its new dead-letter / expiry queues).
    QueuesCreated {
        /// The queues, each with its owner.
        queues: Vec<(QueueName, Owner)>,
    },
    /// Replicated queues were defined in `shard` (the queue first, then its new dead-letter /
    /// expiry queues), each with its owner (the shard's preferred leader).
    ReplicatedQueuesCreated {
        /// Their shard.
        shard: ShardId,
        /// Whether the shard was made by this command.
        created_shard: bool,
        /// The queues, each with its owner.
        queues: Vec<(QueueName, Owner)>,
    },
    /// A queue's settings changed; `created` lists dead-letter / expiry queues made for it.
    QueueUpdated {
        /// The queue.
        name: QueueName,
        /// Its owner.
        owner: Owner,
        /// New companion queues.
        created: Vec<(QueueName, Owner)>,
    },
    /// A queue was deleted.
    QueueDeleted {
        /// The queue.
        name: QueueName,
        /// Its owner at deletion.
        owner: Owner,
        /// Its shard, removed with it: it holds no other queue.
        removed_shard: Option<ShardId>,
    },
    /// A shard's replica moved (see [`MetaCommand::MoveReplica`]).
    ReplicaMoved {
        /// The shard.
        shard: ShardId,
        /// The replica that left.
        from: NodeId,
        /// The replica that took its place.
        to: NodeId,
        /// The shard's queues, whose owner became `to`: the preferred leader moved. Empty
        /// otherwise.
        owners_moved: Vec<QueueName>,
    },
    /// A node's incarnation was recorded.
    IncarnationNoted {
        /// The node.
        node: NodeId,
        /// Its incarnation.
        incarnation: u64,
    },
    /// An entry with no command (a new leader's no-op or a Raft configuration change).
    Nothing,
    /// A retried proposal whose request was applied already, at `first_index`: nothing
    /// changed, and the proposer answers as the original succeeded.
    Repeated {
        /// Where the original applied.
        first_index: u64,
    },
}

/// What applying one log entry did ([`super::MetaState::apply_entry`]): the command's event,
/// and the request ids the state now remembers or forgot, for the durable copy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Applied {
    /// What the command changed.
    pub event: MetaEvent,
    /// The entry's request id, remembered at this index.
    pub recorded: Option<RequestId>,
    /// A request id forgotten to make room.
    pub evicted: Option<RequestId>,
}

/// The raft ids of a bootstrap's nodes: 1, 2, 3... in ascending node id order. The shell of
/// every initial node computes them before the group exists (to bootstrap the Raft group
/// with these voters); `Bootstrap`'s apply assigns the same ones.
pub fn bootstrap_raft_ids(nodes: &[NodeId]) -> Vec<(NodeId, RaftId)> {
    let mut sorted: Vec<NodeId> = nodes.to_vec();
    sorted.sort();
    sorted.dedup();
    sorted
        .into_iter()
        .zip(1u64..)
        .map(|(id, n)| (id, RaftId(n)))
        .collect()
}
