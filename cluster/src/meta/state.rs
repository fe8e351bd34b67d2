//! The replicated metadata: cluster id, nodes, queue definitions and their placement, and the
//! applied index. Read-only accessors here; changes only through [`MetaState::apply`].

use std::collections::BTreeMap;
use std::fmt;

use ferry_kernel::{NodeId, PlacementEpoch, QueueName, ShardId};
use ferry_proto::pb;

use super::requests::Requests;
use super::shards::{ShardDef, ShardDefs};

/// Highest value of the raft id and epoch counters a valid state holds.
pub(crate) const COUNTER_MAX: u64 = 1 << 48;

/// The id of a cluster, chosen at random by the shell that bootstraps it, so that a node of
/// another cluster is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ClusterId(pub u128);

impl fmt::Display for ClusterId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:032x}", self.0)
    }
}

/// A node's peer id in every Raft group, assigned by the state machine and never reused
/// (the multiraft engine's `NodeId(u64)`; never 0).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct RaftId(pub u64);

impl fmt::Display for RaftId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "raft id {}", self.0)
    }
}

/// Whether a node votes in the metadata group.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NodeRole {
    /// Votes and counts for commitment.
    Voter,
    /// Receives the log only.
    Learner,
}

/// Whether a node is part of the cluster.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NodeState {
    /// Serves and may own queues.
    Active,
    /// Removed; its id and raft id stay reserved.
    Removed,
}

/// A node of the cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeInfo {
    /// Its peer id in the Raft groups.
    pub raft_id: RaftId,
    /// Where clients connect (`host:port`).
    pub client_addr: String,
    /// Where peers connect (`host:port`).
    pub peer_addr: String,
    /// Voter or learner.
    pub role: NodeRole,
    /// Active or removed.
    pub state: NodeState,
    /// The data directory the node runs on, as first heard from it (random, drawn when the
    /// directory was made; 0: none recorded yet). A node heard from with another one lost its
    /// disk, or was started on a new one: its peers refuse it ([`MetaCommand::NoteIncarnation`]).
    ///
    /// [`MetaCommand::NoteIncarnation`]: super::MetaCommand::NoteIncarnation
    pub incarnation: u64,
}

impl NodeInfo {
    /// Whether the node is active.
    pub fn is_active(&self) -> bool {
        self.state == NodeState::Active
    }
}

/// The node that owns a queue, with the epoch that fences any former owner.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Owner {
    /// The owning node.
    pub node: NodeId,
    /// Bumped at every change of owner (a fencing token). Drawn from one cluster-wide counter,
    /// so a queue deleted and created again never gets an epoch it had before.
    pub epoch: PlacementEpoch,
}

/// A queue's definition and placement.
///
/// Settings are kept as the wire type `pb::QueueConfig`: it is already a stable, versioned
/// protobuf (fields are only ever added), `ferry_proto::convert` turns it into the kernel's
/// `QueueConfig` with the owner's defaults, and it encodes straight into the prost commands
/// and snapshots of this module. A serde mirror of the kernel type would be a second copy of
/// every setting to keep in step.
#[derive(Debug, Clone, PartialEq)]
pub struct QueueDef {
    /// The settings given at creation or last update (fields not set take server defaults).
    pub settings: pb::QueueConfig,
    /// Where it lives. For a replicated queue, the node that serves it is whichever replica of
    /// its shard leads; `owner.node` is the shard's preferred leader (its first replica) and
    /// the epoch fences as for any queue.
    pub owner: Owner,
    /// The shard holding a replicated queue's data; `None` for replication factor 1 (the data
    /// on the owner alone, with no log in front).
    pub shard: Option<ShardId>,
}

/// The queue definitions by name: a persistent map, so that a copy of the state shares every
/// definition with the original and a change copies O(log n) (see [`MetaState`]).
pub type QueueDefs = imbl::OrdMap<QueueName, QueueDef>;

/// The state machine of Raft group 0. Deterministic: the same commands at the same indexes
/// give the same state (and [`MetaState::digest`]) on every node.
///
/// Cheap to clone whatever the number of queues: the queues and the request table are
/// persistent maps (structurally shared), and the nodes are few. The node publishes a copy
/// after every round that changed it, and its follower compares two copies in proportion to
/// what changed between them ([`MetaState::queue_changes`]); when a clone copied every queue,
/// creating a queue cost in proportion to the number of queues.
#[derive(Debug, Clone, PartialEq)]
pub struct MetaState {
    pub(crate) cluster_id: Option<ClusterId>,
    pub(crate) nodes: BTreeMap<NodeId, NodeInfo>,
    /// Changed only through [`MetaState::insert_queue`] and [`MetaState::remove_queue`], which
    /// keep `queue_counts` in step.
    pub(crate) queues: QueueDefs,
    /// How many queues each node owns (nodes owning none are absent): derived from `queues`,
    /// so that the placement rule, read at every create, does not count every queue.
    pub(crate) queue_counts: BTreeMap<NodeId, usize>,
    /// The queue shards (`shards.rs`). Changed only through [`MetaState::insert_queue`],
    /// [`MetaState::remove_queue`] (which keep each shard's queue count) and the shard
    /// commands.
    pub(crate) shards: ShardDefs,
    pub(crate) next_raft_id: u64,
    pub(crate) next_epoch: PlacementEpoch,
    /// The id the next shard gets (never 0: group 0 is the metadata's).
    pub(crate) next_shard: u64,
    pub(crate) applied_index: u64,
    /// The request ids of the last applied proposals (`requests.rs`).
    pub(crate) requests: Requests,
}

impl MetaState {
    /// The state of a group before anything was applied.
    pub fn new() -> Self {
        MetaState {
            cluster_id: None,
            nodes: BTreeMap::new(),
            queues: QueueDefs::new(),
            queue_counts: BTreeMap::new(),
            shards: ShardDefs::new(),
            next_raft_id: 1,
            next_shard: 1,
            // The first epoch the metadata gives (never UNKNOWN, which a back-end does not check).
            next_epoch: PlacementEpoch::new(1),
            applied_index: 0,
            requests: Requests::default(),
        }
    }

    /// The cluster id, once bootstrapped.
    pub fn cluster_id(&self) -> Option<ClusterId> {
        self.cluster_id
    }

    /// Every node, removed ones included.
    pub fn nodes(&self) -> &BTreeMap<NodeId, NodeInfo> {
        &self.nodes
    }

    /// The node with `raft_id`, if recorded.
    pub fn node_by_raft_id(&self, raft_id: RaftId) -> Option<(&NodeId, &NodeInfo)> {
        self.nodes.iter().find(|(_, n)| n.raft_id == raft_id)
    }

    /// One node.
    pub fn node(&self, id: &NodeId) -> Option<&NodeInfo> {
        self.nodes.get(id)
    }

    /// Every queue, in name order.
    pub fn queues(&self) -> &QueueDefs {
        &self.queues
    }

    /// One queue.
    pub fn queue(&self, name: &QueueName) -> Option<&QueueDef> {
        self.queues.get(name)
    }

    /// How many queues `node` owns.
    pub fn queue_count(&self, node: &NodeId) -> usize {
        self.queue_counts.get(node).copied().unwrap_or(0)
    }

    /// Every queue shard, in id order.
    pub fn shards(&self) -> &ShardDefs {
        &self.shards
    }

    /// One shard.
    pub fn shard(&self, id: ShardId) -> Option<&ShardDef> {
        self.shards.get(&id)
    }

    /// The epoch the next placement decision gets: every queue epoch below it was given by
    /// this state or an earlier one.
    pub fn next_epoch(&self) -> PlacementEpoch {
        self.next_epoch
    }

    /// The id the next shard gets.
    pub fn next_shard(&self) -> ShardId {
        ShardId(self.next_shard)
    }

    /// Defines (or redefines) a queue, keeping the owners' and shards' counts in step.
    pub(crate) fn insert_queue(&mut self, name: QueueName, def: QueueDef) {
        *self.queue_counts.entry(def.owner.node.clone()).or_default() += 1;
        self.count_in_shard(def.shard, 1);
        if let Some(old) = self.queues.insert(name, def) {
            self.uncount(&old.owner.node);
            self.count_in_shard(old.shard, -1);
        }
    }

    /// Removes a queue's definition, keeping the owners' and shards' counts in step.
    pub(crate) fn remove_queue(&mut self, name: &QueueName) -> Option<QueueDef> {
        let removed = self.queues.remove(name)?;
        self.uncount(&removed.owner.node);
        self.count_in_shard(removed.shard, -1);
        Some(removed)
    }

    fn count_in_shard(&mut self, shard: Option<ShardId>, by: isize) {
        if let Some(def) = shard.and_then(|id| self.shards.get_mut(&id)) {
            def.queues = def.queues.saturating_add_signed(by);
        }
    }

    fn uncount(&mut self, node: &NodeId) {
        if let Some(count) = self.queue_counts.get_mut(node) {
            *count = count.saturating_sub(1);
            if *count == 0 {
                self.queue_counts.remove(node);
            }
        }
    }

    /// The last index applied.
    pub fn applied_index(&self) -> u64 {
        self.applied_index
    }

    /// The raft id the next added node gets.
    pub fn next_raft_id(&self) -> RaftId {
        RaftId(self.next_raft_id)
    }

    /// Active voters.
    pub fn voters(&self) -> Vec<&NodeId> {
        self.active_with(NodeRole::Voter)
    }

    /// Active learners.
    pub fn learners(&self) -> Vec<&NodeId> {
        self.active_with(NodeRole::Learner)
    }

    fn active_with(&self, role: NodeRole) -> Vec<&NodeId> {
        self.nodes
            .iter()
            .filter(|(_, n)| n.is_active() && n.role == role)
            .map(|(id, _)| id)
            .collect()
    }

    /// Queues owned by `node`, in name order.
    pub fn queues_of(&self, node: &NodeId) -> Vec<QueueName> {
        self.queues
            .iter()
            .filter(|(_, q)| &q.owner.node == node)
            .map(|(name, _)| name.clone())
            .collect()
    }

    /// Checks a peer's cluster id against this cluster's (join handshake).
    pub fn check_cluster_id(&self, got: ClusterId) -> Result<(), super::MetaError> {
        match self.cluster_id {
            None => Err(super::MetaError::NotBootstrapped),
            Some(expected) if expected == got => Ok(()),
            Some(expected) => Err(super::MetaError::WrongCluster { expected, got }),
        }
    }

    /// A fingerprint of the whole state (FNV-1a of [`MetaState::snapshot`]); equal states at
    /// the same applied index have equal digests on every node.
    pub fn digest(&self) -> u64 {
        self.snapshot().iter().fold(0xcbf2_9ce4_8422_2325, |h, b| {
            (h ^ u64::from(*b)).wrapping_mul(0x100_0000_01b3)
        })
    }

    /// Checks what every applied command keeps true: raft ids distinct and below the
    /// counter, owners active, epochs below the counter and distinct, at least one active
    /// voter once bootstrapped. Tests call it after every step; restore refuses a snapshot
    /// that breaks it.
    pub fn check_invariants(&self) -> Result<(), String> {
        // Counters grow by one per command: far below these unless the bytes were forged.
        let counter_range = 1..=COUNTER_MAX;
        if !counter_range.contains(&self.next_raft_id)
            || !counter_range.contains(&self.next_epoch.get())
        {
            return Err(format!(
                "counters out of range: next raft id {}, next epoch {}",
                self.next_raft_id, self.next_epoch
            ));
        }
        let mut raft_ids = std::collections::BTreeSet::new();
        for (id, n) in &self.nodes {
            if n.raft_id.0 == 0 || n.raft_id.0 >= self.next_raft_id {
                return Err(format!(
                    "node {id}: {} not below {}",
                    n.raft_id, self.next_raft_id
                ));
            }
            if !raft_ids.insert(n.raft_id) {
                return Err(format!("node {id}: {} used twice", n.raft_id));
            }
        }
        let mut epochs = std::collections::BTreeSet::new();
        for (name, q) in &self.queues {
            if !self
                .nodes
                .get(&q.owner.node)
                .is_some_and(NodeInfo::is_active)
            {
                return Err(format!(
                    "queue {name}: owner {} is not active",
                    q.owner.node
                ));
            }
            if !q.owner.epoch.is_known()
                || q.owner.epoch >= self.next_epoch
                || !epochs.insert(q.owner.epoch)
            {
                return Err(format!(
                    "queue {name}: epoch {} reused or out of range",
                    q.owner.epoch
                ));
            }
        }
        let mut counts: BTreeMap<NodeId, usize> = BTreeMap::new();
        for q in self.queues.values() {
            *counts.entry(q.owner.node.clone()).or_default() += 1;
        }
        if counts != self.queue_counts {
            return Err(format!(
                "queue counts per node {:?}, the queues say {counts:?}",
                self.queue_counts
            ));
        }
        self.check_shards()?;
        if self.cluster_id.is_some() && self.voters().is_empty() {
            return Err("no active voter".to_owned());
        }
        self.requests.check(self.applied_index)
    }
}

impl Default for MetaState {
    fn default() -> Self {
        MetaState::new()
    }
}
