//! The node's side of the cluster: the back-end as the metadata group's [`QueueHost`], the
//! front-end's [`Catalog`] over the metadata group, and the placement the router follows,
//! rebuilt from every metadata change.

use std::collections::HashMap;
use std::sync::Arc;

use crate::raft::MetaNode;
use crate::raft::{HeldQueue, MetaView, QueueHost};
use anyhow::Context as _;
use ferry_be_server::{BackendService, Broker, ShardId, ShardProposer, ShardQueue};
use ferry_cluster::meta::{MetaState, QueueDef};
use ferry_fe_dispatcher::{
    BackendRef, Catalog, CatalogEntry, CatchUp, Owner, Placement, PlacementAsked, Reachability,
    RemoteBackend,
};
use ferry_kernel::{NodeId, PlacementEpoch, QueueName};
use ferry_proto::pb;
use ferry_proto::pb::backend_server::Backend as _;
use tokio::sync::watch;
use tonic::{Request, Status};

/// The local back-end, for the metadata group.
#[allow(missing_debug_implementations)]
pub struct BrokerHost {
    pub broker: Broker,
    pub backend: BackendService,
}

#[tonic::async_trait]
impl QueueHost for BrokerHost {
    fn queues(&self) -> Vec<HeldQueue> {
        self.broker
            .list_queues()
            .into_iter()
            .filter(|q| !q.temporary)
            .map(|q| HeldQueue {
                settings: ferry_proto::convert::queue_config_to_pb(&q.name, &q.config),
                epoch: self
                    .broker
                    .placement_epoch(&q.name)
                    .unwrap_or(PlacementEpoch::UNKNOWN),
                name: q.name,
            })
            .collect()
    }

    fn check_settings(&self, name: &QueueName, settings: &pb::QueueConfig) -> Result<(), Status> {
        self.broker
            .check_queue_config(name, settings.clone())
            .map_err(Status::from)
    }

    async fn create(
        &self,
        name: &QueueName,
        settings: &pb::QueueConfig,
        epoch: PlacementEpoch,
    ) -> Result<(), String> {
        let req = pb::BackendCreateQueueRequest {
            name: name.to_string(),
            config: Some(settings.clone()),
            if_not_exists: true,
            temporary: false,
            // Its placement is set just below, once it exists.
            placement_epoch: PlacementEpoch::UNKNOWN.get(),
        };
        self.backend
            .create_queue(Request::new(req))
            .await
            .map_err(|s| s.message().to_owned())?;
        self.broker.set_placement_epoch(name, epoch);
        Ok(())
    }

    async fn stored_bytes(&self) -> u64 {
        self.broker.stored_bytes()
    }

    fn set_epoch(&self, name: &QueueName, epoch: PlacementEpoch) {
        self.broker.set_placement_epoch(name, epoch);
    }

    async fn delete(&self, name: &QueueName) -> Result<(), String> {
        match self.broker.delete_queue(name).await {
            Ok(_) | Err(ferry_be_server::Error::QueueNotFound { .. }) => Ok(()),
            Err(e) => Err(e.to_string()),
        }
    }

    async fn update(&self, name: &QueueName, settings: &pb::QueueConfig) -> Result<(), String> {
        match self.broker.update_queue(name, settings.clone()).await {
            Ok(_) => Ok(()),
            Err(e) => Err(e.to_string()),
        }
    }

    async fn lead_shard(
        &self,
        shard: ShardId,
        term: u64,
        proposer: Arc<dyn ShardProposer>,
        queues: Vec<ShardQueue>,
        known_below: PlacementEpoch,
    ) -> Result<bool, String> {
        self.broker
            .lead_shard(shard, term, proposer, queues, known_below)
            .await
            .map_err(|e| e.to_string())
    }

    async fn follow_shard(&self, shard: ShardId, leader: Option<String>, queues: &[QueueName]) {
        self.broker.follow_shard(shard, leader, queues).await;
    }

    async fn forget_shard(&self, shard: ShardId) -> Result<(), String> {
        self.broker
            .forget_shard(shard)
            .await
            .map_err(|e| e.to_string())
    }

    fn shard_fences(&self) -> watch::Receiver<u64> {
        self.broker.shard_fences()
    }

    fn shard_leader_event(&self, shard: ferry_be_server::ShardId, term: u64, detail: String) {
        self.broker.shard_leader_event(shard, term, detail);
    }

    fn shard_replication_event(
        &self,
        shard: ferry_be_server::ShardId,
        under: bool,
        whole: u64,
        detail: String,
    ) {
        self.broker
            .shard_replication_event(shard, under, whole, detail);
    }
}

/// The front-end's catalog: the metadata group.
#[derive(Debug)]
pub struct MetaCatalog(pub MetaNode);

#[tonic::async_trait]
impl Catalog for MetaCatalog {
    async fn create_queue(
        &self,
        name: &QueueName,
        settings: pb::QueueConfig,
        asked: PlacementAsked,
        if_not_exists: bool,
    ) -> Result<CatalogEntry, Status> {
        let created = self
            .0
            .create_queue(name, settings, asked, if_not_exists)
            .await?;
        Ok(CatalogEntry {
            owner: Owner {
                node: created.owner.node,
                epoch: created.owner.epoch,
            },
            created: created.created,
            replicas: created.replicas,
        })
    }

    async fn delete_queue(&self, name: &QueueName) -> Result<(), Status> {
        self.0.delete_queue(name).await
    }

    async fn update_queue(
        &self,
        name: &QueueName,
        patch: &pb::QueueConfig,
    ) -> Result<(Owner, bool), Status> {
        let updated = self.0.update_queue(name, patch).await?;
        Ok((
            Owner {
                node: updated.owner.node,
                epoch: updated.owner.epoch,
            },
            updated.changed,
        ))
    }
}

/// The router's catch-up: a barrier through the metadata leader, applied here.
#[derive(Debug)]
pub struct MetaCatchUp(pub MetaNode);

#[tonic::async_trait]
impl CatchUp for MetaCatchUp {
    async fn catch_up(&self) -> Result<u64, Status> {
        if self.0.view().borrow().meta.cluster_id().is_none() {
            return Err(Status::unavailable("the metadata group is not formed yet"));
        }
        self.0.catch_up().await?;
        Ok(self.0.view().borrow().meta.applied_index())
    }
}

/// Builds the router's placements from the metadata: this node's back-end in-process, every
/// other active node's over gRPC at its peer address (one client per node, kept across
/// changes).
#[allow(missing_debug_implementations)]
pub struct PlacementBuilder {
    me: NodeId,
    local: BackendRef,
    remotes: HashMap<(NodeId, String), BackendRef>,
    /// Whether a node is reachable from here (see [`RemoteBackend::with_reachability`]).
    reachability: Option<ReachabilityOf>,
    /// The metadata the last placement was built from, and that placement.
    last: Option<(MetaState, Placement)>,
}

/// Whether a node is reachable from here, by id.
type ReachabilityOf = Arc<dyn Fn(&NodeId) -> bool + Send + Sync>;

impl PlacementBuilder {
    pub fn new(me: NodeId, local: BackendRef) -> Self {
        Self {
            me,
            local,
            remotes: HashMap::new(),
            reachability: None,
            last: None,
        }
    }

    /// Remote back-ends fail calls at once while `of` says their node is unreachable.
    pub fn with_reachability(
        mut self,
        of: impl Fn(&NodeId) -> bool + Send + Sync + 'static,
    ) -> Self {
        self.reachability = Some(Arc::new(of));
        self
    }

    /// The placement of `meta`: built from the one made last by the queues that changed since
    /// (see [`MetaState::queue_changes`]), so its cost follows the change, not the number of
    /// queues.
    pub fn build(&mut self, meta: &MetaState) -> anyhow::Result<Placement> {
        let mut placement = self.with_nodes(meta)?;
        match self.last.take() {
            Some((before, last)) => {
                placement = placement.with_queues_of(&last);
                for change in before.queue_changes(meta) {
                    placement = placement.without_queue(change.name);
                    if let Some(def) = change.after {
                        placement = placed(placement, change.name, def);
                    }
                }
            }
            None => {
                for (name, def) in meta.queues() {
                    placement = placed(placement, name, def);
                }
            }
        }
        self.last = Some((meta.clone(), placement.clone()));
        Ok(placement)
    }

    /// A placement of `meta`'s active nodes and no queue.
    fn with_nodes(&mut self, meta: &MetaState) -> anyhow::Result<Placement> {
        let mut placement =
            Placement::new(self.me.clone(), self.local.clone()).with_version(meta.applied_index());
        for (id, shard) in meta.shards().iter() {
            placement = placement.with_shard(*id, shard.replicas.clone());
        }
        let mut kept = HashMap::new();
        for (id, n) in meta.nodes() {
            if id == &self.me || !n.is_active() {
                continue;
            }
            let key = (id.clone(), n.peer_addr.clone());
            let backend = match self.remotes.remove(&key) {
                Some(b) => b,
                None => self.remote(id, &n.peer_addr)?,
            };
            placement = placement.with_node(id.clone(), backend.clone());
            kept.insert(key, backend);
        }
        self.remotes = kept;
        Ok(placement)
    }

    /// A client of node `id`'s back-end at `peer_addr`.
    fn remote(&self, id: &NodeId, peer_addr: &str) -> anyhow::Result<BackendRef> {
        let url = format!("http://{peer_addr}");
        let mut remote = RemoteBackend::new(&url)
            .with_context(|| format!("peer address of node {id}: {url:?}"))?;
        if let Some(of) = &self.reachability {
            let (of, node) = (Arc::clone(of), id.clone());
            remote = remote.with_reachability(Reachability {
                node: id.to_string(),
                up: Arc::new(move || of(&node)),
            });
        }
        Ok(Arc::new(remote) as BackendRef)
    }
}

/// `placement` with `name` placed as `def` says (in its shard, if replicated).
fn placed(placement: Placement, name: &QueueName, def: &QueueDef) -> Placement {
    let placement = placement.with_queue(name.clone(), owner(def));
    match def.shard {
        Some(shard) => placement.with_shard_queue(name.clone(), shard),
        None => placement,
    }
}

fn owner(def: &QueueDef) -> Owner {
    Owner {
        node: def.owner.node.clone(),
        epoch: def.owner.epoch,
    }
}

/// Republishes the placement at every metadata change until the view's sender is gone.
pub async fn follow_placement(
    mut view: watch::Receiver<Arc<MetaView>>,
    mut builder: PlacementBuilder,
    placement: watch::Sender<Arc<Placement>>,
) {
    let mut applied = None;
    loop {
        let current = view.borrow_and_update().clone();
        if applied != Some(current.meta.applied_index()) {
            applied = Some(current.meta.applied_index());
            match builder.build(&current.meta) {
                Ok(p) => {
                    placement.send_replace(Arc::new(p));
                }
                Err(e) => tracing::error!(error = %e, "cannot route to a node"),
            }
        }
        if view.changed().await.is_err() {
            return;
        }
    }
}
