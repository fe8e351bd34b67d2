//! The client-facing `Admin` service: each call goes to the back-end that owns the queue; listings
//! ask every back-end.

use std::future::Future;
use std::sync::Arc;

use ferry_kernel::{PlacementEpoch, QueueName};

use ferry_proto::pb;
use tonic::{Request, Response, Status};

use crate::catalog::CatalogRef;
use crate::dispatch::{queue_name, Dispatch};
use crate::router::Router;
use crate::BackendRef;

/// See the module docs.
#[derive(Clone)]
pub struct AdminService {
    /// The front-end's core: the router, this node's connections and how to close one.
    core: Arc<Dispatch>,
    movers: crate::mover::Movers,
    /// The cluster's queue catalog; `None`: queues are created where the router says.
    catalog: Option<CatalogRef>,
}

impl std::fmt::Debug for AdminService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AdminService")
            .field("core", &self.core)
            .field("catalog", &self.catalog.is_some())
            .finish_non_exhaustive()
    }
}

impl AdminService {
    pub(crate) fn new(core: Arc<Dispatch>) -> Self {
        Self {
            core,
            movers: crate::mover::Movers::default(),
            catalog: None,
        }
    }

    pub(crate) fn with_catalog(mut self, catalog: CatalogRef) -> Self {
        self.catalog = Some(catalog);
        self
    }

    fn router(&self) -> &Arc<Router> {
        &self.core.router
    }

    /// Seals a queue at its owner (see `Backend.SealQueue`), or unseals it.
    async fn seal(&self, name: &QueueName, seal: bool) -> Result<(), Status> {
        self.router()
            .call(name, |be, placement_epoch| {
                let req = pb::BackendSealQueueRequest {
                    name: name.to_string(),
                    placement_epoch: placement_epoch.get(),
                    seal,
                };
                async move { be.seal_queue(Request::new(req)).await }
            })
            .await?;
        Ok(())
    }

    /// Deliveries held by each listed connection's sessions, asked of each queue's owner: the
    /// count per connection, and the queues whose owner did not answer.
    async fn unacked(
        &self,
        connections: &[crate::sessions::ConnectionSummary],
    ) -> Vec<(u64, Vec<String>)> {
        use std::collections::BTreeMap;
        let mut by_queue: BTreeMap<QueueName, Vec<(usize, ferry_kernel::SessionId)>> =
            BTreeMap::new();
        for (i, c) in connections.iter().enumerate() {
            for (session, queues) in &c.session_queues {
                for q in queues {
                    by_queue.entry(q.clone()).or_default().push((i, *session));
                }
            }
        }
        let mut out = vec![(0u64, Vec::new()); connections.len()];
        for (queue, holders) in by_queue {
            let session_ids: Vec<String> = holders.iter().map(|(_, s)| s.to_string()).collect();
            let answer = self
                .router()
                .call(&queue, |be, placement_epoch| {
                    let req = pb::BackendSessionLeasesRequest {
                        queue: queue.to_string(),
                        placement_epoch: placement_epoch.get(),
                        session_ids: session_ids.clone(),
                    };
                    async move { be.session_leases(Request::new(req)).await }
                })
                .await;
            match answer {
                Ok(r) => {
                    for ((i, _), n) in holders.iter().zip(r.leased) {
                        out[*i].0 += n;
                    }
                }
                // Deleted since: it holds nothing for anyone.
                Err(e) if e.code() == tonic::Code::NotFound => {}
                Err(_) => {
                    for (i, _) in &holders {
                        if !out[*i].1.contains(&queue.to_string()) {
                            out[*i].1.push(queue.to_string());
                        }
                    }
                }
            }
        }
        out
    }

    /// A read naming one queue, to its owner (see [`Router::call_read`]: a replica of a
    /// replicated queue that does not answer in time is passed over).
    async fn queue_read<T, F, Fut>(&self, queue: &QueueName, f: F) -> Result<T, Status>
    where
        F: Fn(BackendRef, pb::BackendQueueRequest) -> Fut,
        Fut: Future<Output = Result<Response<T>, Status>>,
    {
        self.router()
            .call_read(queue, |be, placement_epoch| {
                f(be, queue_request(queue, placement_epoch))
            })
            .await
    }

    /// A call naming one queue, to its owner (see [`Router::call`]).
    async fn queue_call<T, F, Fut>(&self, queue: &QueueName, f: F) -> Result<T, Status>
    where
        F: Fn(BackendRef, pb::BackendQueueRequest) -> Fut,
        Fut: Future<Output = Result<Response<T>, Status>>,
    {
        self.router()
            .call(queue, |be, placement_epoch| {
                f(be, queue_request(queue, placement_epoch))
            })
            .await
    }

    /// Every queue of every node that answers, by name, and the nodes that did not. Asks each
    /// node for what it holds (not a queue's owner), all at once, each for at most
    /// [`NODE_ANSWER_WAIT`]: one node down, paused or cut off leaves its queues out of the answer
    /// instead of failing it whole.
    async fn all_queues(&self) -> Listing {
        let placement = self.router().placement();
        let asks = placement.nodes().into_iter().map(|(node, be)| async move {
            let ask = be.list_queues(Request::new(pb::BackendListQueuesRequest {}));
            let answer = tokio::time::timeout(NODE_ANSWER_WAIT, ask).await;
            (node, answer)
        });
        let mut listing = Listing::default();
        for (node, answer) in futures::future::join_all(asks).await {
            match answer {
                Ok(Ok(r)) => listing.queues.extend(r.into_inner().queues),
                Ok(Err(status)) => listing.missing(&placement, &node, status.message()),
                Err(_) => listing.missing(&placement, &node, &no_answer()),
            }
        }
        listing.queues.sort_by(|a, b| a.name.cmp(&b.name));
        listing
    }

    /// The statistics of every queue in `listing`, each from its owner; an owner that is
    /// unavailable or stays silent for [`NODE_ANSWER_WAIT`] joins the unreachable nodes, its
    /// queues left out.
    async fn all_stats(&self, listing: Listing) -> Result<pb::GetQueueStatsResponse, Status> {
        let Listing {
            queues: names,
            mut unreachable,
        } = listing;
        let mut queues = vec![];
        for info in names {
            let name = match queue_name(&info.name) {
                Ok(name) => name,
                Err(_) => continue, // a back-end holds only valid names
            };
            let owner = self.router().owner_of(&name).node;
            if unreachable.iter().any(|u| u.node_id == owner.as_str()) {
                continue;
            }
            let ask = self.queue_read(&name, |be, req| async move {
                be.get_queue_stats(Request::new(req)).await
            });
            match tokio::time::timeout(NODE_ANSWER_WAIT, ask).await {
                Ok(Ok(s)) => queues.push(s),
                // Deleted between the listing and now: leave it out of "every queue".
                Ok(Err(e)) if e.code() == tonic::Code::NotFound => {}
                Ok(Err(e)) if e.code() == tonic::Code::Unavailable => {
                    let placement = self.router().placement();
                    unreachable.push(unreachable_node(&placement, &owner, e.message()));
                }
                Ok(Err(e)) => return Err(e),
                Err(_) => {
                    let placement = self.router().placement();
                    unreachable.push(unreachable_node(&placement, &owner, &no_answer()));
                }
            }
        }
        Ok(pb::GetQueueStatsResponse {
            queues,
            unreachable_nodes: unreachable,
        })
    }
}

/// How long a listing waits for each node's part (and a listing of statistics for each queue's)
/// before it names the node unreachable and answers with the rest: a paused node accepts
/// connections and never answers, and the cluster takes its liveness timeout to show it down.
pub const NODE_ANSWER_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

fn no_answer() -> String {
    format!("no answer within {} s", NODE_ANSWER_WAIT.as_secs())
}

/// The queues of the nodes that answered a listing, and the nodes that did not.
#[derive(Debug, Default)]
struct Listing {
    queues: Vec<pb::QueueInfo>,
    unreachable: Vec<pb::UnreachableNode>,
}

impl Listing {
    fn missing(&mut self, placement: &crate::Placement, node: &ferry_kernel::NodeId, reason: &str) {
        self.unreachable
            .push(unreachable_node(placement, node, reason));
    }
}

/// `node`, why its part is missing, and the queues the placement gives it.
fn unreachable_node(
    placement: &crate::Placement,
    node: &ferry_kernel::NodeId,
    reason: &str,
) -> pb::UnreachableNode {
    pb::UnreachableNode {
        node_id: node.to_string(),
        reason: reason.to_owned(),
        queues: placement
            .queues_on(node)
            .into_iter()
            .map(|q| q.to_string())
            .collect(),
    }
}

/// Listing pages: the default and the largest page size.
const PAGE_SIZE_DEFAULT: usize = 1_000;
const PAGE_SIZE_MAX: usize = 10_000;

/// One page of `all` (sorted by `key`): the items after `token`, at most `page_size` (0: the
/// default), and the token of the next page (empty when this is the last).
fn page<T>(
    all: Vec<T>,
    key: impl Fn(&T) -> &str,
    page_size: u32,
    token: &str,
) -> Result<(Vec<T>, String), Status> {
    let size = match page_size as usize {
        0 => PAGE_SIZE_DEFAULT,
        n if n > PAGE_SIZE_MAX => {
            return Err(Status::invalid_argument(format!(
                "page_size is {n}, above the most one answer holds, {PAGE_SIZE_MAX}"
            )))
        }
        n => n,
    };
    let mut items: Vec<T> = all
        .into_iter()
        .filter(|t| token.is_empty() || key(t) > token)
        .collect();
    let next = if items.len() > size {
        items.truncate(size);
        items.last().map(|t| key(t).to_owned()).unwrap_or_default()
    } else {
        String::new()
    };
    Ok((items, next))
}

type Reply<T> = Result<Response<T>, Status>;

#[tonic::async_trait]
impl pb::admin_server::Admin for AdminService {
    async fn create_queue(
        &self,
        req: Request<pb::CreateQueueRequest>,
    ) -> Reply<pb::CreateQueueResponse> {
        let r = req.into_inner();
        let name = queue_name(&r.name)?;
        if name.is_temporary() {
            return Err(Status::invalid_argument(format!(
                "queue names starting with {:?} are reserved for temporary queues",
                QueueName::TEMPORARY_PREFIX
            )));
        }
        if let Some(catalog) = &self.catalog {
            return self.create_in_catalog(catalog, &name, r).await;
        }
        if !r.node.is_empty() && r.node != self.router().local_node().as_str() {
            return Err(Status::invalid_argument(format!(
                "node: {} is not this node, and this node has no cluster catalog to place queues elsewhere",
                r.node
            )));
        }
        // Dead letters move within one back-end: their target must live where the queue does.
        let owner = self.router().owner_of(&name).node;
        let cfg = r.config.clone().unwrap_or_default();
        for (field, target) in [("dead_letter", &cfg.dead_letter), ("expiry", &cfg.expiry)] {
            use pb::dead_letter_target::Target;
            let target = match target.as_ref().and_then(|t| t.target.as_ref()) {
                Some(Target::Queue(q)) => queue_name(q)?,
                Some(Target::Discard(true)) => continue,
                _ => queue_name(&format!("{name}{}", QueueName::DEAD_LETTER_SUFFIX))?,
            };
            let target_owner = self.router().owner_of(&target).node;
            if target_owner != owner {
                return Err(Status::invalid_argument(format!(
                    "{field}: queue {target} lives on node {target_owner} but {name} on {owner}; a dead-letter queue must live on its queue's node (fix cluster.placement or name another queue)"
                )));
            }
        }
        // Tell "created" from "already there" by asking first; create is idempotent either way.
        let existed = self
            .queue_read(&name, |be, req| async move {
                be.get_queue(Request::new(req)).await
            })
            .await
            .is_ok();
        let info = self
            .router()
            .call(&name, |be, placement_epoch| {
                let create = pb::BackendCreateQueueRequest {
                    name: r.name.clone(),
                    config: r.config.clone(),
                    if_not_exists: r.if_not_exists,
                    temporary: false,
                    placement_epoch: placement_epoch.get(),
                };
                async move { be.create_queue(Request::new(create)).await }
            })
            .await?;
        Ok(Response::new(pb::CreateQueueResponse {
            queue: Some(info),
            created: !existed,
        }))
    }

    async fn get_queue(&self, req: Request<pb::GetQueueRequest>) -> Reply<pb::GetQueueResponse> {
        let name = queue_name(&req.into_inner().name)?;
        let info = self
            .queue_read(&name, |be, req| async move {
                be.get_queue(Request::new(req)).await
            })
            .await?;
        let placement = self.router().placement();
        let (shard, replicas) = placement
            .shard_of(&name)
            .map_or((0, vec![]), |(shard, replicas)| {
                (shard.0, replicas.iter().map(ToString::to_string).collect())
            });
        Ok(Response::new(pb::GetQueueResponse {
            queue: Some(info),
            shard,
            replicas,
        }))
    }

    async fn list_queues(
        &self,
        req: Request<pb::ListQueuesRequest>,
    ) -> Reply<pb::ListQueuesResponse> {
        let r = req.into_inner();
        let all = self.all_queues().await;
        let (queues, next_page_token) = page(all.queues, |q| &q.name, r.page_size, &r.page_token)?;
        Ok(Response::new(pb::ListQueuesResponse {
            queues,
            next_page_token,
            unreachable_nodes: all.unreachable,
        }))
    }

    async fn delete_queue(
        &self,
        req: Request<pb::DeleteQueueRequest>,
    ) -> Reply<pb::DeleteQueueResponse> {
        let r = req.into_inner();
        let name = queue_name(&r.name)?;
        if r.if_empty {
            // The owner checks and, if empty, refuses sends until the queue is gone: nothing
            // sent meanwhile is deleted with it.
            self.seal(&name, true).await?;
        }
        if let Some(catalog) = &self.catalog {
            // What it holds as it goes (its owner deletes it once it applies the deletion).
            let held = if r.if_empty {
                0
            } else {
                self.queue_read(&name, |be, req| async move {
                    be.get_queue_stats(Request::new(req)).await
                })
                .await
                .map(|s| s.ready + s.scheduled + s.leased)
                .unwrap_or(0)
            };
            if let Err(e) = catalog.delete_queue(&name).await {
                if r.if_empty {
                    // Best effort: the seal lapses by itself otherwise.
                    let _ = self.seal(&name, false).await;
                }
                return Err(e);
            }
            return Ok(Response::new(pb::DeleteQueueResponse {
                deleted_messages: held,
            }));
        }
        let n = self
            .queue_call(&name, |be, req| async move {
                be.delete_queue(Request::new(req)).await
            })
            .await?
            .count;
        Ok(Response::new(pb::DeleteQueueResponse {
            deleted_messages: n,
        }))
    }

    async fn purge_queue(
        &self,
        req: Request<pb::PurgeQueueRequest>,
    ) -> Reply<pb::PurgeQueueResponse> {
        let name = req.into_inner().name;
        let n = self
            .queue_call(&queue_name(&name)?, |be, req| async move {
                be.purge_queue(Request::new(req)).await
            })
            .await?
            .count;
        Ok(Response::new(pb::PurgeQueueResponse { purged: n }))
    }

    async fn get_queue_stats(
        &self,
        req: Request<pb::GetQueueStatsRequest>,
    ) -> Reply<pb::GetQueueStatsResponse> {
        let name = req.into_inner().name;
        if name.is_empty() {
            let listing = self.all_queues().await;
            return Ok(Response::new(self.all_stats(listing).await?));
        }
        let stats = self
            .queue_read(&queue_name(&name)?, |be, req| async move {
                be.get_queue_stats(Request::new(req)).await
            })
            .await?;
        Ok(Response::new(pb::GetQueueStatsResponse {
            queues: vec![stats],
            unreachable_nodes: vec![],
        }))
    }

    async fn delete_message(
        &self,
        req: Request<pb::DeleteMessageRequest>,
    ) -> Reply<pb::DeleteMessageResponse> {
        let r = req.into_inner();
        let queue = queue_name(&r.queue)?;
        self.router()
            .call(&queue, |be, placement_epoch| {
                let req = pb::BackendDeleteMessageRequest {
                    queue: r.queue.clone(),
                    message_id: r.message_id.clone(),
                    placement_epoch: placement_epoch.get(),
                };
                async move { be.delete_message(Request::new(req)).await }
            })
            .await?;
        Ok(Response::new(pb::DeleteMessageResponse {}))
    }

    async fn list_connections(
        &self,
        req: Request<pb::ListConnectionsRequest>,
    ) -> Reply<pb::ListConnectionsResponse> {
        let r = req.into_inner();
        let node = self.router().local_node().to_string();
        let listed = self.core.sessions.list();
        let (listed, next_page_token) = page(listed, |c| &c.id, r.page_size, &r.page_token)?;
        let unacked = self.unacked(&listed).await;
        let now_ms = self.core.clock.now_ms();
        let connections = listed
            .into_iter()
            .zip(unacked)
            .map(|(c, (unacked, unknown))| pb::ConnectionInfo {
                connection_id: c.id,
                client_id: c.client_id,
                sessions: u32::try_from(c.sessions).unwrap_or(u32::MAX),
                temporary_queues: u32::try_from(c.temporary_queues).unwrap_or(u32::MAX),
                lease_left_ms: u64::try_from(c.lease_left.as_millis()).unwrap_or(u64::MAX),
                node: node.clone(),
                client_address: c.client_address,
                connected_at_ms: now_ms
                    .saturating_sub(u64::try_from(c.open_for.as_millis()).unwrap_or(u64::MAX)),
                unacked,
                unacked_unknown_queues: unknown,
            })
            .collect();
        Ok(Response::new(pb::ListConnectionsResponse {
            connections,
            next_page_token,
        }))
    }

    async fn update_queue(
        &self,
        req: Request<pb::UpdateQueueRequest>,
    ) -> Reply<pb::UpdateQueueResponse> {
        let r = req.into_inner();
        let name = queue_name(&r.name)?;
        if name.is_temporary() {
            return Err(Status::invalid_argument(format!(
                "name: {name} is a temporary queue: it has no settings to change, and lives only as long as its connection"
            )));
        }
        let Some(catalog) = &self.catalog else {
            return Err(Status::unimplemented(
                "changing a queue's settings needs the cluster catalog, which this node does not have",
            ));
        };
        let patch = r.config.unwrap_or_default();
        // As its owner serves it now.
        let before = self
            .queue_read(&name, |be, req| async move {
                be.get_queue(Request::new(req)).await
            })
            .await?;
        if !r.node.is_empty() && r.node != before.owner_node {
            return Err(Status::invalid_argument(format!(
                "node: queue {name} lives on node {}, and a queue cannot move to another node ({}); leave --node out, or create a new queue on {} and move the messages (`ferry queue move`)",
                before.owner_node, r.node, r.node
            )));
        }
        let previous = before.config.clone().unwrap_or_default();
        // What the owner will serve: the change applied to what it serves now.
        let expected = {
            let current = ferry_proto::convert::queue_config_from_pb(
                Some(previous.clone()),
                &ferry_kernel::QueueConfig::default(),
            )
            .map_err(crate::error::Error::from)?;
            let after = ferry_proto::convert::queue_config_from_pb(Some(patch.clone()), &current)
                .map_err(crate::error::Error::from)?;
            ferry_proto::convert::queue_config_to_pb(&name, &after)
        };
        let (owner, _) = catalog.update_queue(&name, &patch).await?;
        let changed = expected != previous;
        let info = self
            .wait_owner_serves(&name, &owner, changed.then_some(expected))
            .await?;
        Ok(Response::new(pb::UpdateQueueResponse {
            queue: Some(info),
            previous: Some(previous),
            changed,
        }))
    }

    async fn close_connection(
        &self,
        req: Request<pb::AdminCloseConnectionRequest>,
    ) -> Reply<pb::AdminCloseConnectionResponse> {
        let id = req.into_inner().connection_id;
        let closed = self.core.sessions.close_connection_by_public(&id)?;
        tracing::info!(connection = %ferry_kernel::shown(&id), "connection closed by an administrator");
        let released = self.core.release(closed).await;
        Ok(Response::new(pb::AdminCloseConnectionResponse { released }))
    }

    async fn move_messages(&self, req: Request<pb::MoveMessagesRequest>) -> Reply<pb::MoveTask> {
        let r = req.into_inner();
        let from = queue_name(&r.from_queue)?;
        let to = queue_name(&r.to_queue)?;
        if from == to {
            return Err(Status::invalid_argument(format!(
                "from_queue and to_queue are both {from}; name two queues"
            )));
        }
        if !r.selector.is_empty() {
            ferry_kernel::Selector::parse(&r.selector, &ferry_kernel::SelectorLimits::default())
                .map_err(crate::error::Error::from)?;
        }
        let stats = self
            .queue_read(&from, |be, req| async move {
                be.get_queue_stats(Request::new(req)).await
            })
            .await?;
        self.queue_read(&to, |be, req| async move {
            be.get_queue(Request::new(req)).await
        })
        .await
        .map_err(|e| Status::new(e.code(), format!("to_queue: {}", e.message())))?;
        let spec = crate::mover::MoveSpec {
            from,
            to,
            selector: r.selector,
            rate_per_sec: r.rate_per_sec,
            max_messages: r.max_messages,
        };
        let task = self.movers.start(
            self.router().clone(),
            self.core.clock.clone(),
            spec,
            stats.ready + stats.scheduled,
        );
        Ok(Response::new(task.info()))
    }

    async fn get_move_task(&self, req: Request<pb::GetMoveTaskRequest>) -> Reply<pb::MoveTask> {
        let id = req.into_inner().task_id;
        let task = self.movers.get(&id).ok_or_else(|| {
            Status::not_found(format!(
                "no move task {id} on this node (tasks live on the node that started them, until it stops)"
            ))
        })?;
        Ok(Response::new(task.info()))
    }

    type WatchEventsStream = ferry_proto::EventStream;

    async fn watch_events(
        &self,
        req: Request<pb::WatchEventsRequest>,
    ) -> Reply<Self::WatchEventsStream> {
        let local = self.core.events.subscribe();
        let stream = crate::events::watch(
            self.router().clone(),
            self.core.clock.clone(),
            local,
            self.core.stopping.clone(),
            req.into_inner(),
        )
        .await?;
        Ok(Response::new(stream))
    }

    async fn get_message_history(
        &self,
        req: Request<pb::GetMessageHistoryRequest>,
    ) -> Reply<pb::GetMessageHistoryResponse> {
        let r = req.into_inner();
        ferry_kernel::MessageId::parse(&r.message_id).map_err(crate::error::Error::from)?;
        // A message's steps are on the back-end of its queue, and of its dead-letter queue or a
        // queue it was moved to: ask them all.
        // A node that is down answers nothing: the others' steps still tell most of the story.
        let (mut steps, mut unreachable_nodes) = (vec![], vec![]);
        for (node, be) in self.router().nodes() {
            match be.get_message_history(Request::new(r.clone())).await {
                Ok(answer) => steps.extend(answer.into_inner().steps),
                Err(s) if s.code() == tonic::Code::Unavailable => {
                    unreachable_nodes.push(node.to_string());
                }
                Err(s) => return Err(s),
            }
        }
        steps.sort_by_key(|s| s.at_ms);
        if steps.is_empty() {
            let unasked = if unreachable_nodes.is_empty() {
                String::new()
            } else {
                format!("; not asked, unreachable: {}", unreachable_nodes.join(", "))
            };
            return Err(Status::not_found(format!(
                "no history of {} (unknown id, or older than the history retention){unasked}",
                r.message_id
            )));
        }
        Ok(Response::new(pb::GetMessageHistoryResponse {
            steps,
            unreachable_nodes,
        }))
    }
}

mod create;
#[cfg(test)]
mod tests;

/// The request of a call naming `queue` routed at `placement_epoch`.
fn queue_request(queue: &QueueName, placement_epoch: PlacementEpoch) -> pb::BackendQueueRequest {
    pb::BackendQueueRequest {
        name: queue.to_string(),
        placement_epoch: placement_epoch.get(),
        wait_placed_ms: 0,
        wait_settings: None,
    }
}
