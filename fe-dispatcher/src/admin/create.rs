//! Creating and changing a queue through the cluster catalog: the definition is committed in
//! the metadata, then the call waits until the back-end that serves the queue (its owner, or its
//! shard's leader) carries the change out.
//!
//! The wait lasts at most [`OWNER_CREATE_WAIT`], and so does every call it makes: a node cut off
//! or paused does not answer, and the front-end's fail-fast for an unreachable node refuses only
//! new calls, once the cluster's liveness timeout has passed, not one already under way. A
//! replicated queue's wait asks the replica the router would call (the shard's leader last
//! learned, else the preferred leader), follows the leader a replica names, and passes over a
//! replica that has not answered within what it was asked to wait plus [`ANSWER_MARGIN`]. A wait
//! that runs out answers UNAVAILABLE, saying that the change is committed in the metadata and
//! what it waited for.

use std::collections::BTreeMap;
use std::future::Future;
use std::time::Duration;

use ferry_kernel::{NodeId, PlacementEpoch, QueueName};
use ferry_proto::pb;
use tokio::time::Instant;
use tonic::{Code, Request, Response, Status};

use super::{AdminService, Reply};
use crate::catalog::CatalogRef;
use crate::error::Error;
use crate::router::Owner;

/// How long a queue just defined (or changed) in the catalog may take to be served (with the
/// change) by its owner's back-end, or its shard's leader's.
pub(super) const OWNER_CREATE_WAIT: Duration = Duration::from_secs(5);

/// The longest one call of a replicated queue's wait asks a replica to wait for the change (a
/// replica that does not lead the shard waits it out before it says so).
pub(super) const REPLICA_WAIT: Duration = Duration::from_millis(200);

/// How much longer than the wait it asked for a call waits for a node's answer (a round trip,
/// on a loaded machine) before it takes the node for silent: cut off or paused.
pub(super) const ANSWER_MARGIN: Duration = Duration::from_millis(300);

/// The pause before a wait's next call.
const RETRY_PAUSE: Duration = Duration::from_millis(20);

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
            let wait = ShardWait {
                name,
                epoch: entry.owner.epoch,
                replicas: &entry.replicas,
                updated: None,
                started: Instant::now(),
            };
            self.wait_shard_serves(&wait).await?
        };
        Ok(Response::new(pb::CreateQueueResponse {
            queue: Some(info),
            created: entry.created,
        }))
    }

    /// Waits until `owner` serves `name` at its epoch (a new queue, which it creates when it
    /// applies the metadata change), with the settings `updated` when given (an update, which it
    /// applies when it applies the change); a replicated queue's shard leader, see
    /// [`Self::wait_shard_serves`]. The owner answers one `GetQueue` as soon as it does
    /// (`wait_placed_ms`, `wait_settings`); a node of an older release answers at once, and is
    /// asked again every 20 ms until [`OWNER_CREATE_WAIT`] has passed.
    pub(super) async fn wait_owner_serves(
        &self,
        name: &QueueName,
        owner: &Owner,
        updated: Option<pb::QueueConfig>,
    ) -> Result<pb::QueueInfo, Status> {
        let started = Instant::now();
        let deadline = started + OWNER_CREATE_WAIT;
        let placement = self.router().placement();
        if let Some((_, replicas)) = placement.shard_of(name) {
            let replicas = match replicas {
                [] => vec![owner.node.clone()],
                r => r.to_vec(),
            };
            let wait = ShardWait {
                name,
                epoch: owner.epoch,
                replicas: &replicas,
                updated: updated.as_ref(),
                started,
            };
            return self.wait_shard_serves(&wait).await;
        }
        let backend = placement.backend(&owner.node)?.clone();
        let not_served = |last: &str| -> Status {
            Error::NotServedInTime {
                change: change(name, updated.is_some()),
                waited_for: format!("its owner, node {}", owner.node),
                waited_ms: millis(started.elapsed()),
                last: last.to_owned(),
            }
            .into()
        };
        loop {
            let now = Instant::now();
            let left = deadline.saturating_duration_since(now);
            let late = left.is_zero();
            let req = pb::BackendQueueRequest {
                name: name.to_string(),
                placement_epoch: owner.epoch.get(),
                wait_placed_ms: millis(left).max(1),
                wait_settings: updated.clone(),
            };
            let until = now + left + ANSWER_MARGIN;
            match answer_by(&owner.node, until, backend.get_queue(Request::new(req))).await {
                Ok(info) if updated.is_none() || info.config == updated => return Ok(info),
                Ok(_) if !late => {}
                Ok(_) => return Err(not_served("it serves the settings before the change")),
                // A new queue not created on the owner yet (NOT_FOUND), or created with its
                // epoch not yet set (FAILED_PRECONDITION): it will be, shortly.
                Err(e)
                    if updated.is_none()
                        && matches!(e.code(), Code::NotFound | Code::FailedPrecondition)
                        && !late => {}
                Err(e)
                    if e.code() == Code::Unavailable
                        || (updated.is_none() && e.code() == Code::NotFound) =>
                {
                    return Err(not_served(e.message()))
                }
                Err(e) => return Err(e),
            }
            tokio::time::sleep(RETRY_PAUSE).await;
        }
    }

    /// Waits until the leader of a replicated queue's shard serves it at `wait.epoch`, with the
    /// settings `wait.updated` when given, for at most [`OWNER_CREATE_WAIT`]. A new queue: the leader creates it
    /// through the shard's log once it applies the metadata change (and a shard made for it
    /// elects its first leader meanwhile); a change: it writes the settings through the log.
    /// See the module docs for whom it asks; the router learns the leader that answered.
    async fn wait_shard_serves(&self, wait: &ShardWait<'_>) -> Result<pb::QueueInfo, Status> {
        let deadline = wait.started + OWNER_CREATE_WAIT;
        let router = self.router();
        let shard = router.shard_replica_to_call(wait.name);
        let mut asked = match &shard {
            Some((_, node)) if wait.replicas.contains(node) => node.clone(),
            _ => wait.replicas.first().cloned().ok_or_else(|| {
                Status::internal(format!("queue {} has a shard with no replica", wait.name))
            })?,
        };
        // Each replica's last answer, for the error when none served the queue in time.
        let mut answers: BTreeMap<NodeId, String> = BTreeMap::new();
        loop {
            let now = Instant::now();
            let left = deadline.saturating_duration_since(now);
            if left.is_zero() {
                return Err(wait.not_served(&answers));
            }
            let asked_wait = left.min(REPLICA_WAIT);
            let req = pb::BackendQueueRequest {
                name: wait.name.to_string(),
                placement_epoch: wait.epoch.get(),
                wait_placed_ms: millis(asked_wait).max(1),
                wait_settings: wait.updated.cloned(),
            };
            let until = (now + asked_wait + ANSWER_MARGIN).min(deadline);
            let answer = match router.placement().backend(&asked) {
                Ok(be) => answer_by(&asked, until, be.get_queue(Request::new(req))).await,
                Err(e) => Err(e.into()),
            };
            match answer {
                Ok(info) if wait.updated.is_none_or(|u| info.config.as_ref() == Some(u)) => {
                    if let Some((s, _)) = shard {
                        router.learn_leader(s, &asked);
                    }
                    return Ok(info);
                }
                // The leader, which has not applied the change yet.
                Ok(_) => {
                    let before = "serves the settings before the change".to_owned();
                    answers.insert(asked.clone(), before);
                }
                Err(status) => {
                    let next =
                        next_replica(&status, &asked, wait.replicas).ok_or(status.clone())?;
                    answers.insert(asked.clone(), status.message().to_owned());
                    asked = next;
                }
            }
            tokio::time::sleep_until((Instant::now() + RETRY_PAUSE).min(deadline)).await;
        }
    }
}

/// What a replicated queue's wait waits for.
struct ShardWait<'a> {
    name: &'a QueueName,
    /// The queue's placement epoch, as the metadata committed it.
    epoch: PlacementEpoch,
    /// The shard's replicas, the preferred leader first.
    replicas: &'a [NodeId],
    /// The settings the leader must serve (a change); `None`: a new queue.
    updated: Option<&'a pb::QueueConfig>,
    /// When the wait began (the change committed).
    started: Instant,
}

impl ShardWait<'_> {
    /// The answer when no replica served the queue in time, with what each last said.
    fn not_served(&self, answers: &BTreeMap<NodeId, String>) -> Status {
        let replicas: Vec<String> = self.replicas.iter().map(ToString::to_string).collect();
        let last: Vec<String> = answers.iter().map(|(n, a)| format!("{n}: {a}")).collect();
        let last = match last.as_slice() {
            [] => "no replica was asked".to_owned(),
            _ => last.join("; "),
        };
        Error::NotServedInTime {
            change: change(self.name, self.updated.is_some()),
            waited_for: format!("the leader of its shard (replicas {})", replicas.join(", ")),
            waited_ms: millis(self.started.elapsed()),
            last,
        }
        .into()
    }
}

/// What a wait waits for, as its error says it.
fn change(name: &QueueName, updated: bool) -> String {
    if updated {
        format!("the change to queue {name}")
    } else {
        format!("queue {name}")
    }
}

/// Whom a replicated queue's wait asks after `asked` answered `status`: the leader it names;
/// itself again when the queue is not there yet (it will be once it applies the change); the
/// next replica when it named no leader, was not reached or did not answer. `None`: the answer
/// ends the wait.
fn next_replica(status: &Status, asked: &NodeId, replicas: &[NodeId]) -> Option<NodeId> {
    let named = ferry_proto::not_leader_of(status)
        .and_then(|n| NodeId::new(&n.leader_node).ok())
        .filter(|l| l != asked && replicas.contains(l));
    if named.is_some() {
        return named;
    }
    match status.code() {
        Code::NotFound | Code::FailedPrecondition => Some(asked.clone()),
        Code::Unavailable => {
            let at = replicas
                .iter()
                .position(|r| r == asked)
                .map_or(0, |i| i + 1);
            replicas.get(at % replicas.len().max(1)).cloned()
        }
        _ => None,
    }
}

/// The answer of `call` to `node`, if it comes by `until`; else UNAVAILABLE saying `node` did
/// not answer in time (only reads are bounded so: giving one up changes nothing).
async fn answer_by<T>(
    node: &NodeId,
    until: Instant,
    call: impl Future<Output = Result<Response<T>, Status>>,
) -> Result<T, Status> {
    let asked_at = Instant::now();
    match tokio::time::timeout_at(until, call).await {
        Ok(answer) => answer.map(Response::into_inner),
        Err(_) => Err(Error::NoAnswer {
            node: node.clone(),
            within_ms: millis(until.saturating_duration_since(asked_at)),
        }
        .into()),
    }
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}
