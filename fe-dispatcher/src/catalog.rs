//! The cluster's queue catalog as the front-end sees it: creating and deleting a queue is a
//! metadata proposal, answered once committed and applied on this node (its placement snapshot
//! then names the queue's owner). The node assembly implements it over the Raft metadata group;
//! without one (tests, tools) the front-end creates queues on the back-end the router picks.

use std::sync::Arc;

use ferry_kernel::{NodeId, QueueName};
use ferry_proto::pb;
use tonic::Status;

use crate::router::Owner;

/// A queue defined in the catalog.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CatalogEntry {
    /// Where it lives, at which placement epoch (a replicated queue: its shard's preferred
    /// leader).
    pub owner: Owner,
    /// False when it existed already.
    pub created: bool,
    /// A replicated queue's shard replicas, the preferred leader first; empty for a queue with
    /// replication factor 1.
    pub replicas: Vec<NodeId>,
}

/// Where a new queue is asked to go.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PlacementAsked {
    /// On this node (replication factor 1 only).
    pub pinned: Option<NodeId>,
    /// The replication factor (0: the cluster's default).
    pub replicas: u32,
    /// A shard of its own (replicated queues only).
    pub own_shard: bool,
}

/// See the module docs.
#[tonic::async_trait]
pub trait Catalog: Send + Sync + 'static {
    /// Defines a queue (where `asked`, or where the placement rule puts it).
    async fn create_queue(
        &self,
        name: &QueueName,
        settings: pb::QueueConfig,
        asked: PlacementAsked,
        if_not_exists: bool,
    ) -> Result<CatalogEntry, Status>;

    /// Deletes a queue's definition (judged where the deletion is ordered: NOT_FOUND when the
    /// queue is gone by then).
    async fn delete_queue(&self, name: &QueueName) -> Result<(), Status>;

    /// Changes a queue's settings: each field set in `patch` replaces the queue's. Returns where
    /// it lives and whether its definition changed.
    async fn update_queue(
        &self,
        name: &QueueName,
        patch: &pb::QueueConfig,
    ) -> Result<(Owner, bool), Status> {
        let _ = patch;
        Err(Status::unimplemented(format!(
            "this catalog cannot change the settings of queue {name}"
        )))
    }
}

/// A shared catalog.
pub type CatalogRef = Arc<dyn Catalog>;
