//! Which node owns a queue, and the one way the front-end calls it.
//!
//! [`Placement`] is a snapshot: the nodes with their back-ends, each placed queue's [`Owner`]
//! (node and placement epoch), and the rules for queues without an entry. The [`Router`] reads
//! the newest snapshot from a `watch` channel whose sender the node keeps: static configuration
//! gives the first snapshot ([`PlacementEpoch::STATIC`] for every placed queue), and the Raft metadata group will
//! publish the next ones without changing this interface.
//!
//! Every front-end call that names a queue goes through [`Router::call`] (or
//! [`Router::call_each`] for a call naming several): it resolves the owner in the snapshot at
//! the moment of the call, hands the back-end the placement epoch it routed by, and when the
//! back-end answers "not the owner" (`FAILED_PRECONDITION` with a `ferry.v1.NotOwner` detail,
//! see `ferry_proto::not_owner_of`) waits briefly for a newer snapshot and tries again, a
//! bounded number of times. Nothing keeps an owner across calls: a receipt handle is routed by
//! its queue, not by the node written in it.

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use ferry_kernel::{NodeId, PlacementEpoch, QueueName};
use ferry_proto::not_owner_of;
use tokio::sync::watch;
use tokio::time::Instant;
use tonic::{Code, Response, Status};

use crate::error::Error;
use crate::BackendRef;

/// Tries after a "not the owner" answer, before the call fails with FAILED_PRECONDITION.
pub const NOT_OWNER_RETRIES_MAX: u32 = 3;
/// The longest a call waits for a newer placement after a "not the owner" answer (less if its
/// deadline is nearer) before it tries again anyway.
pub const REFRESH_WAIT_MAX: Duration = Duration::from_millis(500);

/// The longest a call whose queue was not found waits for a [`CatchUp`] and for this node's
/// placement to reflect it, before the NOT_FOUND is answered as it is.
pub const CATCH_UP_WAIT_MAX: Duration = Duration::from_secs(2);

/// Makes this node's metadata at least as new as every change answered anywhere before the
/// call (the metadata group's barrier), and says which metadata index that is. A queue this
/// node's placement does not know may have been created through another node a moment ago:
/// its NOT_FOUND is only believed after a catch-up.
#[tonic::async_trait]
pub trait CatchUp: Send + Sync + 'static {
    async fn catch_up(&self) -> Result<u64, Status>;
}

/// Where a queue lives: a node, and the placement epoch of that decision (a fencing token: it
/// grows each time the queue changes owner; [`PlacementEpoch::UNKNOWN`] for a queue placed by a
/// rule, which the back-end does not check).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Owner {
    pub node: NodeId,
    pub epoch: PlacementEpoch,
}

/// One snapshot of placement; see the module docs.
#[derive(Clone)]
pub struct Placement {
    local_node: NodeId,
    /// The metadata index this snapshot was built from (0 for a placement made by hand).
    version: u64,
    nodes: BTreeMap<NodeId, BackendRef>,
    /// A persistent map: a snapshot made from the previous one by a few changes
    /// ([`Placement::with_queues_of`], [`Placement::without_queue`]) costs those changes, not
    /// a copy of every entry.
    queues: imbl::HashMap<QueueName, Owner>,
}

impl std::fmt::Debug for Placement {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Placement")
            .field("local_node", &self.local_node)
            .field("version", &self.version)
            .field("nodes", &self.nodes.keys().collect::<Vec<_>>())
            .field("queues", &self.queues)
            .finish()
    }
}

impl Placement {
    /// A placement with one node, this one, where every queue lives.
    pub fn new(local_node: NodeId, local: BackendRef) -> Self {
        let mut nodes = BTreeMap::new();
        nodes.insert(local_node.clone(), local);
        Self {
            local_node,
            version: 0,
            nodes,
            queues: imbl::HashMap::new(),
        }
    }

    /// Says which metadata index this snapshot was built from.
    pub fn with_version(mut self, version: u64) -> Self {
        self.version = version;
        self
    }

    /// The metadata index this snapshot was built from.
    pub fn version(&self) -> u64 {
        self.version
    }

    /// Whether `queue` has an entry (rather than an owner by rule).
    pub fn has_entry(&self, queue: &QueueName) -> bool {
        self.queues.contains_key(queue)
    }

    /// Adds another node and its back-end.
    pub fn with_node(mut self, node: NodeId, backend: BackendRef) -> Self {
        self.nodes.insert(node, backend);
        self
    }

    /// Places a queue.
    pub fn with_queue(mut self, queue: QueueName, owner: Owner) -> Self {
        self.queues.insert(queue, owner);
        self
    }

    /// Removes a queue's entry (the rules place it again).
    pub fn without_queue(mut self, queue: &QueueName) -> Self {
        self.queues.remove(queue);
        self
    }

    /// Takes every queue entry of `other` in place of its own (in O(1): the entries are
    /// shared), to build a snapshot from the previous one by its changes.
    pub fn with_queues_of(mut self, other: &Placement) -> Self {
        self.queues = other.queues.clone();
        self
    }

    pub fn local_node(&self) -> &NodeId {
        &self.local_node
    }

    /// The owner of `queue`. Its entry if it has one; else, by rule: a temporary queue
    /// (`tmp.<node>.<connection>.<n>`) lives on the node in its name, `<queue>.DLQ` with
    /// `<queue>`, and any other queue on this node (for now: the metadata group will give every
    /// queue an entry).
    pub fn owner_of(&self, queue: &QueueName) -> Owner {
        if let Some(node) = queue.temporary_node() {
            if let Some((node, _)) = self.nodes.get_key_value(node) {
                return Owner {
                    node: node.clone(),
                    epoch: PlacementEpoch::UNKNOWN,
                };
            }
        }
        if let Some(owner) = self.queues.get(queue) {
            return owner.clone();
        }
        // A dead-letter queue is created on demand next to its queue.
        if let Some(base) = queue.dead_letter_source() {
            return self.owner_of(&base);
        }
        Owner {
            node: self.local_node.clone(),
            epoch: PlacementEpoch::UNKNOWN,
        }
    }

    /// The back-end of `node`; UNAVAILABLE naming it if this placement has none.
    pub fn backend(&self, node: &NodeId) -> Result<&BackendRef, Error> {
        self.nodes
            .get(node)
            .ok_or_else(|| Error::UnknownNode { node: node.clone() })
    }

    /// The queues placed on `node` by an entry, in name order (those placed by a rule, such as
    /// temporary queues, are not listed).
    pub fn queues_on(&self, node: &NodeId) -> Vec<QueueName> {
        let mut on: Vec<QueueName> = self
            .queues
            .iter()
            .filter(|(_, owner)| owner.node == *node)
            .map(|(q, _)| q.clone())
            .collect();
        on.sort();
        on
    }

    /// Every node with its back-end, this node's first.
    pub fn nodes(&self) -> Vec<(NodeId, BackendRef)> {
        let mut all: Vec<_> = self
            .nodes
            .iter()
            .map(|(n, be)| (n.clone(), be.clone()))
            .collect();
        all.sort_by_key(|(n, _)| (*n != self.local_node, n.clone()));
        all
    }
}

/// See the module docs. Cheap to clone.
#[derive(Clone)]
pub struct Router {
    local_node: NodeId,
    placement: watch::Receiver<Arc<Placement>>,
    /// Asked before a NOT_FOUND for a queue without an entry is believed.
    catch_up: Option<Arc<dyn CatchUp>>,
    /// Calls routed again after a "not the owner" answer (a metric).
    redirects: Arc<std::sync::atomic::AtomicU64>,
}

/// The queues of one call to one node, each with the epoch it was routed by.
pub type QueueEpochs = Vec<(QueueName, PlacementEpoch)>;

impl std::fmt::Debug for Router {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Router")
            .field("local_node", &self.local_node)
            .field("catch_up", &self.catch_up.is_some())
            .finish_non_exhaustive()
    }
}

impl Router {
    /// A router that follows the snapshots published on `placement`.
    pub fn new(placement: watch::Receiver<Arc<Placement>>) -> Self {
        let local_node = placement.borrow().local_node.clone();
        Self {
            local_node,
            placement,
            catch_up: None,
            redirects: Arc::default(),
        }
    }

    /// A router that, before answering NOT_FOUND for a queue its placement has no entry for,
    /// catches up with the metadata and tries again if the queue turned up (what a client
    /// created through another node is seen by its next call through this one).
    pub fn with_catch_up(mut self, catch_up: Arc<dyn CatchUp>) -> Self {
        self.catch_up = Some(catch_up);
        self
    }

    /// A router over one placement that never changes (tests, single-node tools). The returned
    /// sender publishes new snapshots; dropping it freezes the placement.
    pub fn fixed(placement: Placement) -> (Self, watch::Sender<Arc<Placement>>) {
        let (tx, rx) = watch::channel(Arc::new(placement));
        (Self::new(rx), tx)
    }

    pub fn local_node(&self) -> &NodeId {
        &self.local_node
    }

    /// Calls routed again after a back-end answered "not the owner", since start.
    pub fn redirects_total(&self) -> u64 {
        self.redirects.load(std::sync::atomic::Ordering::Relaxed)
    }

    fn note_redirect(&self) {
        self.redirects
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }

    /// The newest snapshot.
    pub fn placement(&self) -> Arc<Placement> {
        self.placement.borrow().clone()
    }

    /// The owner of `queue` in the newest snapshot.
    pub fn owner_of(&self, queue: &QueueName) -> Owner {
        self.placement.borrow().owner_of(queue)
    }

    /// Whether `queue` lives on this node now.
    pub fn is_local(&self, queue: &QueueName) -> bool {
        self.owner_of(queue).node == self.local_node
    }

    /// Every node with its back-end, this node's first (listings, events, history: calls that
    /// ask every node rather than a queue's owner).
    pub fn nodes(&self) -> Vec<(NodeId, BackendRef)> {
        self.placement.borrow().nodes()
    }

    /// Calls the owner of `queue`: `f(backend, placement epoch)` makes the call. See the
    /// module docs; fails with UNAVAILABLE naming the node if the owner cannot be reached, and
    /// with FAILED_PRECONDITION naming the queue if the owner keeps saying it is not.
    pub async fn call<T, F, Fut>(&self, queue: &QueueName, f: F) -> Result<T, Status>
    where
        F: FnMut(BackendRef, PlacementEpoch) -> Fut,
        Fut: Future<Output = Result<Response<T>, Status>>,
    {
        self.call_until(queue, None, f).await
    }

    /// [`Self::call`] for a call with a deadline: waits for a newer placement no longer than it.
    pub async fn call_until<T, F, Fut>(
        &self,
        queue: &QueueName,
        deadline: Option<Instant>,
        mut f: F,
    ) -> Result<T, Status>
    where
        F: FnMut(BackendRef, PlacementEpoch) -> Fut,
        Fut: Future<Output = Result<Response<T>, Status>>,
    {
        let mut retries = 0;
        let mut caught_up = false;
        loop {
            let placement = self.placement();
            let owner = placement.owner_of(queue);
            let be = placement.backend(&owner.node)?.clone();
            let status = match f(be, owner.epoch).await {
                Ok(answer) => return Ok(answer.into_inner()),
                Err(status) => status,
            };
            if status.code() == Code::NotFound
                && !caught_up
                && !placement.has_entry(queue)
                && !queue.is_temporary()
            {
                caught_up = true;
                if self.caught_up_with(queue).await {
                    continue;
                }
            }
            if not_owner_of(&status).is_none() {
                return Err(self.named(status, &owner.node));
            }
            if retries == NOT_OWNER_RETRIES_MAX {
                return Err(unsettled(queue, &status));
            }
            retries += 1;
            self.note_redirect();
            let used = [(queue.clone(), owner)];
            self.refresh(&used, deadline).await;
        }
    }

    /// Calls the owners of `queues`, one call per owning node: `f(backend, its queues with
    /// their epochs)`. A node that answers "not the owner" has its queues routed again after a
    /// refresh, as [`Self::call`] does. Returns each call's node and answer.
    pub async fn call_each<T, F, Fut>(
        &self,
        queues: Vec<QueueName>,
        mut f: F,
    ) -> Vec<(NodeId, Result<T, Status>)>
    where
        F: FnMut(BackendRef, QueueEpochs) -> Fut,
        Fut: Future<Output = Result<Response<T>, Status>>,
    {
        let mut out = vec![];
        let mut pending = queues;
        let mut retries = 0;
        while !pending.is_empty() {
            let placement = self.placement();
            let mut by_node: BTreeMap<NodeId, QueueEpochs> = BTreeMap::new();
            for q in pending.drain(..) {
                let owner = placement.owner_of(&q);
                by_node
                    .entry(owner.node)
                    .or_default()
                    .push((q, owner.epoch));
            }
            let mut again: Vec<(QueueName, Owner)> = vec![];
            for (node, queues) in by_node {
                let be = match placement.backend(&node) {
                    Ok(be) => be.clone(),
                    Err(e) => {
                        out.push((node, Err(e.into())));
                        continue;
                    }
                };
                let result = f(be, queues.clone()).await;
                match result {
                    Ok(answer) => out.push((node, Ok(answer.into_inner()))),
                    Err(status) if not_owner_of(&status).is_some() => {
                        if retries == NOT_OWNER_RETRIES_MAX {
                            let first = &queues[0].0;
                            out.push((node, Err(unsettled(first, &status))));
                        } else {
                            again.extend(queues.into_iter().map(|(q, epoch)| {
                                let owner = Owner {
                                    node: node.clone(),
                                    epoch,
                                };
                                (q, owner)
                            }));
                        }
                    }
                    Err(status) => {
                        let status = self.named(status, &node);
                        out.push((node, Err(status)));
                    }
                }
            }
            if !again.is_empty() {
                retries += 1;
                self.note_redirect();
                self.refresh(&again, None).await;
                pending = again.into_iter().map(|(q, _)| q).collect();
            }
        }
        out
    }

    /// Catches up with the metadata (see [`CatchUp`]) and waits until this node's placement is
    /// at least that new; whether `queue` has an entry then. False without a catch-up, or when
    /// it fails or the placement lags more than [`CATCH_UP_WAIT_MAX`].
    async fn caught_up_with(&self, queue: &QueueName) -> bool {
        let Some(catch_up) = &self.catch_up else {
            return false;
        };
        let mut placement = self.placement.clone();
        let caught_up = async {
            let index = catch_up.catch_up().await?;
            let p = placement
                .wait_for(|p| p.version >= index)
                .await
                .map_err(|_| Status::unavailable("the placement is no longer published"))?;
            Ok::<_, Status>(p.has_entry(queue))
        };
        match tokio::time::timeout(CATCH_UP_WAIT_MAX, caught_up).await {
            Ok(Ok(found)) => found,
            Ok(Err(status)) => {
                tracing::debug!(%queue, error = %status, "no catch-up with the metadata");
                false
            }
            Err(_) => false,
        }
    }

    /// Waits until the placement of any of `used` changed from the owner it was routed to, at
    /// most [`REFRESH_WAIT_MAX`] and not past `deadline`.
    async fn refresh(&self, used: &[(QueueName, Owner)], deadline: Option<Instant>) {
        let mut placement = self.placement.clone();
        let changed = placement.wait_for(|p| used.iter().any(|(q, o)| p.owner_of(q) != *o));
        let limit = Instant::now() + REFRESH_WAIT_MAX;
        let limit = deadline.map_or(limit, |d| d.min(limit));
        // Timed out, or no sender publishes any more: try again with what there is.
        let _ = tokio::time::timeout_at(limit, changed).await;
    }

    /// An error from `node`'s back-end, as the caller sees it: an UNAVAILABLE from another node
    /// says which node could not answer.
    fn named(&self, status: Status, node: &NodeId) -> Status {
        if status.code() != Code::Unavailable || *node == self.local_node {
            return status;
        }
        let message = format!("node {node}: {}", status.message());
        Status::with_details(status.code(), message, status.details().to_vec().into())
    }
}

/// The answer when a queue's owner kept saying it was not the owner: FAILED_PRECONDITION naming
/// the queue, with the last answer's detail.
fn unsettled(queue: &QueueName, last: &Status) -> Status {
    let status: Status = Error::OwnerUnsettled {
        queue: queue.to_string(),
        tries: NOT_OWNER_RETRIES_MAX + 1,
        last: last.message().to_owned(),
    }
    .into();
    Status::with_details(
        status.code(),
        status.message(),
        last.details().to_vec().into(),
    )
}

#[cfg(test)]
mod tests;
