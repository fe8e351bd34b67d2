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
//!
//! A **replicated queue** lives in a queue shard, served by whichever of the shard's replicas
//! leads it. The router calls the leader it last learned for the shard (the preferred leader,
//! the queue's owner in the placement, until it learned one). A replica that does not lead
//! answers "not the leader" (`UNAVAILABLE` with a `ferry.v1.NotLeader` detail, see
//! `ferry_proto::not_leader_of`) naming the leader it knows: the call goes there at once. With
//! no leader named (an election is under way), or a replica the call never reached (unreachable,
//! no connection), the call tries the next replica after a short back-off, for at most
//! [`FAILOVER_WAIT_MAX`] (less if its deadline is nearer). A replica that does not know the
//! queue (`NOT_FOUND`: a node made a replica by a move learns the shard's queues from its
//! metadata a moment later) passes the call to the next replica too, each at most once. Only
//! those answers are tried again: they say nothing was done. A link lost mid-call, or a write the shard did not confirm, may
//! have done what was asked, and is answered as it is (a send resent with its dedup id is
//! stored once). A read ([`Router::call_read`]: it changes nothing, so asking again elsewhere
//! is safe) also moves on from a replica that does not answer within [`READ_ATTEMPT_WAIT`]: a
//! leader cut off (packets dropped) would otherwise hold it until the heal.

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::{Arc, PoisonError};
use std::time::Duration;

use ferry_kernel::{NodeId, PlacementEpoch, QueueName, ShardId};
use ferry_proto::{not_leader_of, not_owner_of};
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

/// The longest a call to a replicated queue looks for its shard's leader (an election after a
/// leader fails takes 1-2 s, and the new leader recovers its queues before it serves) before it
/// fails with the last answer.
pub const FAILOVER_WAIT_MAX: Duration = Duration::from_secs(8);

/// The longest one try of a read at a replicated queue waits for a replica's answer before it
/// asks the next one ([`Router::call_read`]). A back-end answers a read in milliseconds.
pub const READ_ATTEMPT_WAIT: Duration = Duration::from_secs(1);

/// The first back-off between two tries of a replicated queue's call without a leader named;
/// it doubles up to [`FAILOVER_BACKOFF_MAX`].
const FAILOVER_BACKOFF_FIRST: Duration = Duration::from_millis(25);
const FAILOVER_BACKOFF_MAX: Duration = Duration::from_millis(400);

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
    /// The shard of each replicated queue (persistent, as `queues`).
    shard_of: imbl::HashMap<QueueName, ShardId>,
    /// Each queue shard's replicas, the preferred leader first.
    replicas: BTreeMap<ShardId, Vec<NodeId>>,
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
            shard_of: imbl::HashMap::new(),
            replicas: BTreeMap::new(),
        }
    }

    /// Says that `queue` is replicated in `shard` (its owner is the shard's preferred leader).
    pub fn with_shard_queue(mut self, queue: QueueName, shard: ShardId) -> Self {
        self.shard_of.insert(queue, shard);
        self
    }

    /// Says which nodes hold a replica of `shard`, the preferred leader first.
    pub fn with_shard(mut self, shard: ShardId, replicas: Vec<NodeId>) -> Self {
        self.replicas.insert(shard, replicas);
        self
    }

    /// The shard of `queue` and its replicas, if it is a replicated queue.
    pub fn shard_of(&self, queue: &QueueName) -> Option<(ShardId, &[NodeId])> {
        let shard = match self.shard_of.get(queue) {
            Some(s) => *s,
            None => *self.shard_of.get(&queue.dead_letter_source()?)?,
        };
        Some((
            shard,
            self.replicas.get(&shard).map_or(&[][..], Vec::as_slice),
        ))
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
        self.shard_of.remove(queue);
        self
    }

    /// Takes every queue entry of `other` in place of its own (in O(1): the entries are
    /// shared), to build a snapshot from the previous one by its changes.
    pub fn with_queues_of(mut self, other: &Placement) -> Self {
        self.queues = other.queues.clone();
        self.shard_of = other.shard_of.clone();
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
    /// The leader last learned of each queue shard (see the module docs).
    leaders: Arc<std::sync::Mutex<BTreeMap<ShardId, NodeId>>>,
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
            leaders: Arc::default(),
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
        f: F,
    ) -> Result<T, Status>
    where
        F: FnMut(BackendRef, PlacementEpoch) -> Fut,
        Fut: Future<Output = Result<Response<T>, Status>>,
    {
        self.call_bounded(queue, deadline, None, f).await
    }

    /// [`Self::call`] for a call that changes nothing (a queue's definition, its figures): at a
    /// replicated queue, a replica that does not answer within [`READ_ATTEMPT_WAIT`] is passed
    /// over for the next, as one that refused the call would be (see the module docs).
    pub async fn call_read<T, F, Fut>(&self, queue: &QueueName, f: F) -> Result<T, Status>
    where
        F: FnMut(BackendRef, PlacementEpoch) -> Fut,
        Fut: Future<Output = Result<Response<T>, Status>>,
    {
        self.call_bounded(queue, None, Some(READ_ATTEMPT_WAIT), f)
            .await
    }

    /// [`Self::call_until`], each try at a replicated queue bounded by `attempt` if given (only
    /// for calls that may be asked again elsewhere: reads).
    async fn call_bounded<T, F, Fut>(
        &self,
        queue: &QueueName,
        deadline: Option<Instant>,
        attempt: Option<Duration>,
        mut f: F,
    ) -> Result<T, Status>
    where
        F: FnMut(BackendRef, PlacementEpoch) -> Fut,
        Fut: Future<Output = Result<Response<T>, Status>>,
    {
        let mut retries = 0;
        let mut caught_up = false;
        let mut not_found_by = 0;
        let mut failover = Failover::new(deadline);
        loop {
            let placement = self.placement();
            let mut owner = placement.owner_of(queue);
            let shard = placement.shard_of(queue).map(|(s, r)| (s, r.to_vec()));
            if let Some((s, replicas)) = &shard {
                owner.node = self.replica_to_call(*s, replicas, &owner.node);
            }
            let status = match placement.backend(&owner.node) {
                Ok(be) => match bounded(
                    f(be.clone(), owner.epoch),
                    attempt.filter(|_| shard.is_some()),
                    &owner.node,
                )
                .await
                {
                    Ok(answer) => {
                        if let Some((s, _)) = &shard {
                            self.learn_leader(*s, &owner.node);
                        }
                        return Ok(answer.into_inner());
                    }
                    Err(status) => status,
                },
                Err(e) if shard.is_some() => crate::remote::not_sent(Status::from(e)),
                Err(e) => return Err(e.into()),
            };
            if let Some((s, replicas)) = &shard {
                let mut next = self.after_replica_failed(*s, replicas, &owner.node, &status);
                // A replica that does not know the queue may not serve its shard yet (a node
                // made a replica by a move learns the shard's queues from its metadata a
                // moment later): nothing was done, so each other replica is asked once.
                if next.is_none()
                    && status.code() == Code::NotFound
                    && not_found_by < replicas.len()
                {
                    not_found_by += 1;
                    next = Some(self.guess_next_replica(*s, replicas, &owner.node));
                }
                if let Some(next) = next {
                    if failover.next(next).await {
                        continue;
                    }
                    return Err(self.named(status, &owner.node));
                }
            }
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

    /// The replica of shard `s` to call: the leader last learned (or guessed, see
    /// [`Router::after_replica_failed`]), else the preferred leader (`preferred`, the queue's
    /// owner).
    fn replica_to_call(&self, s: ShardId, replicas: &[NodeId], preferred: &NodeId) -> NodeId {
        let leaders = self.leaders.lock().unwrap_or_else(PoisonError::into_inner);
        match leaders.get(&s) {
            Some(l) if replicas.contains(l) => l.clone(),
            _ => preferred.clone(),
        }
    }

    /// The shard of `queue` and the replica a call to it goes to now (see
    /// [`Router::replica_to_call`]); `None` for a queue that is not replicated.
    pub(crate) fn shard_replica_to_call(&self, queue: &QueueName) -> Option<(ShardId, NodeId)> {
        let placement = self.placement();
        let (s, replicas) = placement.shard_of(queue)?;
        let preferred = placement.owner_of(queue).node;
        Some((s, self.replica_to_call(s, replicas, &preferred)))
    }

    /// Notes `node` as the leader of shard `s` (it served a call to one of its queues).
    pub(crate) fn learn_leader(&self, s: ShardId, node: &NodeId) {
        let mut leaders = self.leaders.lock().unwrap_or_else(PoisonError::into_inner);
        if leaders.get(&s) != Some(node) {
            leaders.insert(s, node.clone());
        }
    }

    /// After replica `tried` of shard `s` answered `status`: moves the shard's leader to the
    /// leader it named, or else to a guess, the next replica; whether a leader was named.
    /// `None` when the answer is the call's own (it did not fail for want of a leader).
    fn after_replica_failed(
        &self,
        s: ShardId,
        replicas: &[NodeId],
        tried: &NodeId,
        status: &Status,
    ) -> Option<bool> {
        // Only an answer that says nothing was done is tried again: "not the leader", or a
        // call that never reached the replica. Any other failure (a link lost mid-call, an
        // outcome the shard could not confirm) may have done what it asked, and is the call's.
        let named = match not_leader_of(status) {
            Some(n) => NodeId::new(&n.leader_node)
                .ok()
                .filter(|l| l != tried && replicas.contains(l)),
            None if crate::remote::was_not_sent(status) => None,
            None => return None,
        };
        match named {
            Some(leader) => {
                self.note_redirect();
                self.leaders
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .insert(s, leader);
                Some(true)
            }
            None => Some(self.guess_next_replica(s, replicas, tried)),
        }
    }

    /// Moves shard `s`'s leader to a guess, the replica after `tried`; false (no leader named).
    fn guess_next_replica(&self, s: ShardId, replicas: &[NodeId], tried: &NodeId) -> bool {
        self.note_redirect();
        let at = replicas
            .iter()
            .position(|r| r == tried)
            .map_or(0, |i| i + 1);
        let next = replicas
            .get(at % replicas.len().max(1))
            .unwrap_or(tried)
            .clone();
        self.leaders
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(s, next);
        false
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
        let mut failover = Failover::new(None);
        while !pending.is_empty() {
            let placement = self.placement();
            let mut by_node: BTreeMap<NodeId, QueueEpochs> = BTreeMap::new();
            for q in pending.drain(..) {
                let mut owner = placement.owner_of(&q);
                if let Some((s, replicas)) = placement.shard_of(&q) {
                    owner.node = self.replica_to_call(s, replicas, &owner.node);
                }
                by_node
                    .entry(owner.node)
                    .or_default()
                    .push((q, owner.epoch));
            }
            let mut again: Vec<(QueueName, Owner)> = vec![];
            // Queues whose replica did not lead their shard: (node, its queues, answer,
            // whether a leader was named).
            let mut leaderless: Vec<(NodeId, QueueEpochs, Status, bool)> = vec![];
            for (node, queues) in by_node {
                let be = match placement.backend(&node) {
                    Ok(be) => be.clone(),
                    Err(e) => {
                        out.push((node, Err(e.into())));
                        continue;
                    }
                };
                let result = f(be, queues.clone()).await;
                // Whether the answer is for want of a leader of the queues' shards (each shard's
                // leader moved on as `after_replica_failed` does).
                let leader_wanted = |status: &Status| {
                    let mut wanted = false;
                    for (q, _) in &queues {
                        if let Some((s, replicas)) = placement.shard_of(q) {
                            wanted |= self
                                .after_replica_failed(s, replicas, &node, status)
                                .is_some();
                        }
                    }
                    wanted
                };
                match result {
                    // A leader is learned from single-queue calls only: a call over a session's
                    // queues may be answered by a node that skipped queues it does not have.
                    Ok(answer) => out.push((node, Ok(answer.into_inner()))),
                    Err(status) if not_owner_of(&status).is_none() && leader_wanted(&status) => {
                        let named =
                            not_leader_of(&status).is_some_and(|n| !n.leader_node.is_empty());
                        leaderless.push((node, queues, status, named));
                    }
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
            if !leaderless.is_empty() {
                let named = leaderless.iter().all(|(_, _, _, named)| *named);
                if failover.next(named).await {
                    pending.extend(
                        leaderless
                            .into_iter()
                            .flat_map(|(_, qs, _, _)| qs)
                            .map(|(q, _)| q),
                    );
                } else {
                    for (node, _, status, _) in leaderless {
                        let status = self.named(status, &node);
                        out.push((node, Err(status)));
                    }
                }
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

/// `call`, given up after `bound` if one is given: then answered as a call that was never sent
/// (the router may ask another replica; only reads are bounded, so asking again is safe).
async fn bounded<T>(
    call: impl Future<Output = Result<Response<T>, Status>>,
    bound: Option<Duration>,
    node: &NodeId,
) -> Result<Response<T>, Status> {
    let Some(bound) = bound else {
        return call.await;
    };
    match tokio::time::timeout(bound, call).await {
        Ok(answer) => answer,
        Err(_) => Err(crate::remote::not_sent(Status::unavailable(format!(
            "node {node} did not answer within {} ms (down, paused or cut off); asking another replica",
            bound.as_millis()
        )))),
    }
}

/// A call's search for its shard's leader (see the module docs): bounded by
/// [`FAILOVER_WAIT_MAX`] and the call's deadline.
struct Failover {
    until: Instant,
    backoff: Duration,
    /// Hops to a named leader since the last back-off: two replicas naming each other (each
    /// with an old view) must not bounce a call between them without a pause.
    hops: u32,
}

impl Failover {
    fn new(deadline: Option<Instant>) -> Self {
        let until = Instant::now() + FAILOVER_WAIT_MAX;
        Failover {
            until: deadline.map_or(until, |d| d.min(until)),
            backoff: FAILOVER_BACKOFF_FIRST,
            hops: 0,
        }
    }

    /// Waits before the next try: none after a named leader (a few times in a row), else the
    /// back-off; false once the time is up.
    async fn next(&mut self, named: bool) -> bool {
        if named && self.hops < 3 {
            self.hops += 1;
            return Instant::now() < self.until;
        }
        self.hops = 0;
        let wake = (Instant::now() + self.backoff).min(self.until);
        if wake >= self.until {
            return false;
        }
        tokio::time::sleep_until(wake).await;
        self.backoff = (self.backoff * 2).min(FAILOVER_BACKOFF_MAX);
        true
    }
}
