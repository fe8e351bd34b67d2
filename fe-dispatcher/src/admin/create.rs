//! Creating and changing a queue through the cluster catalog: the definition is committed in
//! the metadata, then the call waits until the back-end that serves the queue (its owner, or its
//! shard's leader) carries the change out.

use ferry_kernel::QueueName;
use ferry_proto::pb;
use tonic::{Request, Response, Status};

use super::{AdminService, Reply};
use crate::catalog::{CatalogEntry, CatalogRef};
use crate::router::Owner;

/// How long a queue just defined in the catalog may take to appear on its owner's back-end.
const OWNER_CREATE_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

impl AdminService {
    /// Creates a queue through the catalog, then waits until its owner's back-end serves it
    /// (the owner creates it when it applies the definition).
    pub(super) async fn create_in_catalog(
        &self,
        catalog: &CatalogRef,
        name: &QueueName,
        r: pb::CreateQueueRequest,
    ) -> Reply<pb::CreateQueueResponse> {
        let pinned = match r.node.as_str() {
            "" => None,
            node => Some(
                ferry_kernel::NodeId::new(node)
                    .map_err(|e| Status::invalid_argument(format!("node: {e}")))?,
            ),
        };
        match r.replicas {
            0 | 1 if r.own_shard => {
                return Err(Status::invalid_argument(
                    "own_shard: only a replicated queue has a shard (set replicas to 3 or 5)",
                ))
            }
            0 | 1 | 3 | 5 => {}
            n => {
                return Err(Status::invalid_argument(format!(
                    "replicas: {n} is not a replication factor; use 1, 3 or 5 (0: the cluster's default)"
                )))
            }
        }
        if r.replicas > 1 && pinned.is_some() {
            return Err(Status::invalid_argument(
                "node: a replicated queue lives on its shard's replicas, not on one node; leave node empty, or set replicas to 1",
            ));
        }
        let asked = crate::catalog::PlacementAsked {
            pinned,
            replicas: r.replicas,
            own_shard: r.own_shard,
        };
        let entry = catalog
            .create_queue(name, r.config.unwrap_or_default(), asked, r.if_not_exists)
            .await?;
        let info = if entry.replicas.is_empty() {
            self.wait_owner_serves(name, &entry.owner, None).await?
        } else {
            self.wait_leader_serves(name, &entry).await?
        };
        Ok(Response::new(pb::CreateQueueResponse {
            queue: Some(info),
            created: entry.created,
        }))
    }

    /// Waits until the owner serves `name` at `owner`'s epoch (a new queue, which it creates
    /// when it applies the metadata change), with the settings `updated` when given (an update,
    /// which it applies when it applies the change). The owner answers one `GetQueue` as soon
    /// as it does (`wait_placed_ms`, `wait_settings`); a node of an older release answers at
    /// once, and is asked again every 20 ms until [`OWNER_CREATE_WAIT`] has passed.
    pub(super) async fn wait_owner_serves(
        &self,
        name: &QueueName,
        owner: &Owner,
        updated: Option<pb::QueueConfig>,
    ) -> Result<pb::QueueInfo, Status> {
        if let Some(updated) = &updated {
            if self.router().placement().shard_of(name).is_some() {
                return self.wait_leader_updated(name, updated).await;
            }
        }
        let backend = self.router().placement().backend(&owner.node)?.clone();
        let deadline = tokio::time::Instant::now() + OWNER_CREATE_WAIT;
        loop {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            let late = left.is_zero();
            let req = pb::BackendQueueRequest {
                name: name.to_string(),
                placement_epoch: owner.epoch.get(),
                wait_placed_ms: u64::try_from(left.as_millis()).unwrap_or(u64::MAX).max(1),
                wait_settings: updated.clone(),
            };
            match backend.get_queue(Request::new(req)).await {
                Ok(info) if updated.is_none() || info.get_ref().config == updated => {
                    return Ok(info.into_inner())
                }
                Ok(_) if !late => {}
                Ok(_) => {
                    return Err(Status::unavailable(format!(
                        "the change to queue {name} is committed, but its owner, node {}, has not applied it within {} s; is that node up? (`ferry cluster status`)",
                        owner.node,
                        OWNER_CREATE_WAIT.as_secs()
                    )))
                }
                // A new queue not created on the owner yet (NOT_FOUND), or created with its
                // epoch not yet set (FAILED_PRECONDITION): it will be, shortly.
                Err(e)
                    if updated.is_none()
                        && matches!(e.code(), tonic::Code::NotFound | tonic::Code::FailedPrecondition)
                        && !late => {}
                Err(e) if updated.is_none() && e.code() == tonic::Code::NotFound => {
                    return Err(Status::unavailable(format!(
                        "queue {name} is defined on node {}, which has not created it within {} s; is that node up? (`ferry cluster status`)",
                        owner.node,
                        OWNER_CREATE_WAIT.as_secs()
                    )))
                }
                Err(e) => return Err(e),
            }
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
    }

    /// Waits until the leader of a replicated queue's shard serves it with the settings
    /// `updated` (it writes them through the shard's log when it applies the change), asking it
    /// through the router (which finds the leader) for at most [`OWNER_CREATE_WAIT`].
    async fn wait_leader_updated(
        &self,
        name: &QueueName,
        updated: &pb::QueueConfig,
    ) -> Result<pb::QueueInfo, Status> {
        let deadline = tokio::time::Instant::now() + OWNER_CREATE_WAIT;
        loop {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            let info = self
                .router()
                .call_until(name, Some(deadline), |be, placement_epoch| {
                    let req = pb::BackendQueueRequest {
                        name: name.to_string(),
                        placement_epoch: placement_epoch.get(),
                        wait_placed_ms: u64::try_from(left.as_millis())
                            .unwrap_or(u64::MAX)
                            .clamp(1, 200),
                        wait_settings: Some(updated.clone()),
                    };
                    async move { be.get_queue(Request::new(req)).await }
                })
                .await?;
            if info.config.as_ref() == Some(updated) {
                return Ok(info);
            }
            if left.is_zero() {
                return Err(Status::unavailable(format!(
                    "the change to queue {name} is committed, but its shard's leader has not applied it within {} s",
                    OWNER_CREATE_WAIT.as_secs()
                )));
            }
        }
    }

    /// Waits until the leader of a new replicated queue's shard serves it at `entry`'s epoch
    /// (the leader creates it through the shard's log once it applies the metadata change, and
    /// a shard made for it elects its first leader meanwhile). Asks the replicas in turn,
    /// following the leader a replica names, for at most [`OWNER_CREATE_WAIT`].
    async fn wait_leader_serves(
        &self,
        name: &QueueName,
        entry: &CatalogEntry,
    ) -> Result<pb::QueueInfo, Status> {
        let deadline = tokio::time::Instant::now() + OWNER_CREATE_WAIT;
        let mut at = 0;
        let mut asked = entry.owner.node.clone();
        loop {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            let req = pb::BackendQueueRequest {
                name: name.to_string(),
                placement_epoch: entry.owner.epoch.get(),
                wait_placed_ms: u64::try_from(left.as_millis())
                    .unwrap_or(u64::MAX)
                    .clamp(1, 200),
                wait_settings: None,
            };
            let answer = match self.router().placement().backend(&asked) {
                Ok(be) => be.get_queue(Request::new(req)).await,
                Err(e) => Err(e.into()),
            };
            let status = match answer {
                Ok(info) => return Ok(info.into_inner()),
                Err(status) => status,
            };
            let named = ferry_proto::not_leader_of(&status)
                .and_then(|n| ferry_kernel::NodeId::new(&n.leader_node).ok())
                .filter(|l| entry.replicas.contains(l) && *l != asked);
            let waitable = matches!(
                status.code(),
                tonic::Code::NotFound | tonic::Code::FailedPrecondition | tonic::Code::Unavailable
            );
            if !waitable {
                return Err(status);
            }
            if left.is_zero() {
                return Err(Status::unavailable(format!(
                    "queue {name} is defined in a shard on nodes {}, but no replica served it within {} s (the last said: {}); are they up? (`ferry cluster status`)",
                    entry.replicas.iter().map(ToString::to_string).collect::<Vec<_>>().join(", "),
                    OWNER_CREATE_WAIT.as_secs(),
                    status.message()
                )));
            }
            match named {
                Some(leader) => asked = leader,
                None => {
                    if ferry_proto::not_leader_of(&status).is_some()
                        || status.code() == tonic::Code::Unavailable
                    {
                        at = (at + 1) % entry.replicas.len().max(1);
                        asked = entry.replicas.get(at).cloned().unwrap_or(asked);
                    }
                    tokio::time::sleep(std::time::Duration::from_millis(20)).await;
                }
            }
        }
    }
}
