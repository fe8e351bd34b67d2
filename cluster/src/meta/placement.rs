//! Where a new queue goes, and the read-only placement view the front-end's router consumes.
//!
//! The rule: the proposer chooses the owner BEFORE proposing `CreateQueue` (so the choice is
//! committed before the queue is used): a pinned node (`ferry queue create --node`) if it is
//! active; otherwise, among the active nodes the proposer can reach (all of them if it reaches
//! none), the node (voter or learner) owning the fewest queues (dead-letter
//! and expiry queues count), then the fewest bytes according to the proposer's load map (bytes
//! are not replicated state: each node counts its own and reports it on its Raft links; a node
//! missing from the map counts 0), then the smallest node id.
//! Apply re-validates that the owner is still active.
//!
//! A queue whose dead-letter or expiry queue already exists (kept when the queue was deleted,
//! or shared) must live with it: [`choose_queue_owner`] applies the rule above only when no
//! companion exists yet.

use std::collections::{BTreeMap, BTreeSet};

use ferry_kernel::{NodeId, QueueName};

use ferry_proto::pb;

use super::error::MetaError;
use super::queues::companions;
use super::state::{ClusterId, MetaState, NodeRole, Owner};

/// Chooses the owner of a new queue (see the module docs for the rule). Pure.
pub fn choose_owner(
    state: &MetaState,
    loads_bytes: &BTreeMap<NodeId, u64>,
    pinned: Option<&NodeId>,
) -> Result<NodeId, MetaError> {
    choose_owner_avoiding(state, loads_bytes, pinned, &BTreeSet::new())
}

/// [`choose_owner`], skipping the nodes in `down` (those the proposer cannot reach: a queue
/// placed there could not be used until they return) unless every active node is down. A pin
/// is honoured whatever `down` says. Pure.
pub fn choose_owner_avoiding(
    state: &MetaState,
    loads_bytes: &BTreeMap<NodeId, u64>,
    pinned: Option<&NodeId>,
    down: &BTreeSet<NodeId>,
) -> Result<NodeId, MetaError> {
    if let Some(node) = pinned {
        state.active_node(node)?;
        return Ok(node.clone());
    }
    let active = || state.nodes.iter().filter(|(_, n)| n.is_active());
    let all_down = active().all(|(id, _)| down.contains(id));
    active()
        .filter(|(id, _)| all_down || !down.contains(*id))
        .map(|(id, _)| (id, state.queue_count(id)))
        .min_by_key(|(id, count)| (*count, loads_bytes.get(*id).copied().unwrap_or(0), *id))
        .map(|(id, _)| id.clone())
        .ok_or(MetaError::NoActiveNode)
}

/// The owner of a new queue `name` with `settings`: the owner of its existing dead-letter or
/// expiry queue if there is one (a pinned node elsewhere is refused), else [`choose_owner`].
pub fn choose_queue_owner(
    state: &MetaState,
    name: &QueueName,
    settings: &pb::QueueConfig,
    loads_bytes: &BTreeMap<NodeId, u64>,
    pinned: Option<&NodeId>,
) -> Result<NodeId, MetaError> {
    choose_queue_owner_avoiding(state, name, settings, loads_bytes, pinned, &BTreeSet::new())
}

/// [`choose_queue_owner`] with [`choose_owner_avoiding`]'s `down`.
pub fn choose_queue_owner_avoiding(
    state: &MetaState,
    name: &QueueName,
    settings: &pb::QueueConfig,
    loads_bytes: &BTreeMap<NodeId, u64>,
    pinned: Option<&NodeId>,
    down: &BTreeSet<NodeId>,
) -> Result<NodeId, MetaError> {
    let existing = companions(name, settings)?
        .into_iter()
        .find_map(|c| Some((state.queues.get(&c)?.owner.node.clone(), c)));
    match (existing, pinned) {
        (None, _) => choose_owner_avoiding(state, loads_bytes, pinned, down),
        (Some((owner, companion)), Some(node)) if node != &owner => {
            Err(MetaError::CompanionElsewhere {
                queue: name.clone(),
                companion,
                owner,
            })
        }
        (Some((owner, _)), _) => {
            state.active_node(&owner)?;
            Ok(owner)
        }
    }
}

/// A node as the router sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeAddrs {
    /// Where clients connect.
    pub client_addr: String,
    /// Where peers connect (the internal back-end service).
    pub peer_addr: String,
    /// Voter or learner of the metadata group.
    pub role: NodeRole,
}

/// Plain data for the front-end's placement cache (publish it in an `Arc` through a `watch`
/// channel after each applied round).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PlacementSnapshot {
    /// The cluster, once bootstrapped.
    pub cluster_id: Option<ClusterId>,
    /// The metadata index this view reflects; a newer view has a higher one.
    pub applied_index: u64,
    /// Queue → owner and epoch.
    pub owners: BTreeMap<QueueName, Owner>,
    /// Active nodes with their addresses.
    pub nodes: BTreeMap<NodeId, NodeAddrs>,
}

impl MetaState {
    /// The routing view of this state.
    pub fn placement_snapshot(&self) -> PlacementSnapshot {
        PlacementSnapshot {
            cluster_id: self.cluster_id,
            applied_index: self.applied_index,
            owners: self
                .queues
                .iter()
                .map(|(name, q)| (name.clone(), q.owner.clone()))
                .collect(),
            nodes: self
                .nodes
                .iter()
                .filter(|(_, n)| n.is_active())
                .map(|(id, n)| {
                    let addrs = NodeAddrs {
                        client_addr: n.client_addr.clone(),
                        peer_addr: n.peer_addr.clone(),
                        role: n.role,
                    };
                    (id.clone(), addrs)
                })
                .collect(),
        }
    }
}
