//! Proposing metadata commands from any node: to the local engine when it leads group 0, else
//! forwarded to the leader (`Peer.ProposeMeta`), then waited for until applied here, so that
//! whoever asked sees the change on this node at once. Also the node's own proposals: forming
//! the cluster, importing a single node's queues, and joining.

use std::collections::BTreeSet;
use std::time::Duration;

use ferry_kernel::{NodeId, QueueName};
use ferry_proto::pb;
use tokio::sync::oneshot;
use tokio::time::Instant;
use tonic::{Code, Status};

use super::driver::{Input, ProposeFailure, Proposed};
use super::transport::peer_endpoint;
use super::{MetaNode, StartError, StartMode};
use ferry_cluster::meta::{
    choose_queue_owner_avoiding, choose_shard, ClusterId, MetaCommand, MetaError, NewNode, Owner,
    RaftId, RequestId, ShardChoice,
};
use ferry_fe_dispatcher::PlacementAsked;

/// How long a proposal may take, leader elections included, before it fails UNAVAILABLE.
pub(crate) const PROPOSE_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a node waits for an answer from a peer it asks something.
const PEER_CALL_TIMEOUT: Duration = Duration::from_secs(2);
/// Pause between two attempts while no leader is known.
const RETRY_PAUSE: Duration = Duration::from_millis(100);

/// A queue defined in the metadata.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CreatedQueue {
    /// Where it lives (a replicated queue: its shard's preferred leader).
    pub owner: Owner,
    /// False when it existed already (`if_not_exists`).
    pub created: bool,
    /// A replicated queue's shard replicas, the preferred leader first (empty: replication
    /// factor 1).
    pub replicas: Vec<NodeId>,
}

/// A queue whose settings an update changed (or found as asked).
#[derive(Debug, Clone, PartialEq)]
pub struct UpdatedQueue {
    /// Where it lives.
    pub owner: Owner,
    /// False when its settings in the metadata were already as asked (nothing was proposed).
    pub changed: bool,
}

/// How often an update is merged and proposed again when another change to the same queue
/// committed in between.
const UPDATE_TRIES_MAX: u32 = 5;

/// The gRPC status of a refused metadata command: the caller's mistakes are INVALID_ARGUMENT,
/// NOT_FOUND, ALREADY_EXISTS or FAILED_PRECONDITION, with the error's own advice.
pub fn meta_status(e: &MetaError) -> Status {
    let code = match e {
        MetaError::InvalidAddress { .. }
        | MetaError::InvalidSettings { .. }
        | MetaError::InvalidReplication { .. }
        | MetaError::InvalidReplicas { .. }
        | MetaError::NotAReplica { .. }
        | MetaError::AlreadyAReplica { .. }
        | MetaError::NoNodes => Code::InvalidArgument,
        MetaError::UnknownNode { .. } | MetaError::QueueNotFound { .. } => Code::NotFound,
        MetaError::DuplicateNode { .. } | MetaError::QueueExists { .. } => Code::AlreadyExists,
        MetaError::NotBootstrapped | MetaError::NoActiveNode => Code::Unavailable,
        MetaError::AlreadyBootstrapped { .. }
        | MetaError::WrongCluster { .. }
        | MetaError::NodeRemoved { .. }
        | MetaError::AlreadyVoter { .. }
        | MetaError::OtherIncarnation { .. }
        | MetaError::LastVoter { .. }
        | MetaError::NodeOwnsQueues { .. }
        | MetaError::NodeHoldsReplicas { .. }
        | MetaError::CompanionElsewhere { .. }
        | MetaError::CompanionInOtherShard { .. }
        | MetaError::TooFewNodes { .. }
        | MetaError::NoReplacement { .. }
        | MetaError::UnsupportedVersion { .. } => Code::FailedPrecondition,
        // A choice made on a view that changed before it was ordered: retry.
        MetaError::SettingsChanged { .. }
        | MetaError::ShardNotFound { .. }
        | MetaError::ShardDedicated { .. } => Code::Aborted,
        MetaError::StaleIndex { .. } | MetaError::Decode { .. } => Code::Internal,
    };
    Status::new(code, e.to_string())
}

fn failure_status(f: &ProposeFailure) -> Status {
    match f {
        ProposeFailure::NotMember => Status::failed_precondition(
            "this node is not a member of a cluster yet; add it with `ferry node add` on a member",
        ),
        ProposeFailure::Stopped => Status::unavailable("node shutting down"),
        ProposeFailure::NotLeader(_) => {
            Status::unavailable("this node does not lead the metadata group")
        }
        ProposeFailure::Overwritten | ProposeFailure::Dropped(_) => {
            Status::unavailable("the proposal was lost to a leader change; retry")
        }
        ProposeFailure::Refused(why) => Status::unavailable(format!(
            "the metadata group did not take the proposal ({why}); nothing was written: retry"
        )),
    }
}

impl MetaNode {
    /// Proposes `command` to the local engine: the index it applied at and its outcome.
    pub(crate) async fn propose_local(&self, command: Vec<u8>) -> Proposed {
        let (reply, answer) = oneshot::channel();
        if self
            .shared
            .inputs
            .try_send(Input::Propose { command, reply })
            .is_err()
        {
            return Err(ProposeFailure::Dropped(
                "the metadata driver is busy".into(),
            ));
        }
        answer.await.unwrap_or(Err(ProposeFailure::Stopped))
    }

    /// Proposes `command` through whichever node leads, and returns once it is applied on this
    /// node: the index it applied at. A refused command is its [`meta_status`].
    pub(crate) async fn propose(&self, command: &MetaCommand) -> Result<u64, Status> {
        use std::sync::atomic::Ordering::Relaxed;
        let started = Instant::now();
        let result = self.propose_uncounted(command).await;
        let c = &self.shared.counters;
        match &result {
            Ok(_) => {
                c.proposals.fetch_add(1, Relaxed);
                let ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
                c.proposal_ms_total.fetch_add(ms, Relaxed);
            }
            Err(_) => {
                c.proposals_failed.fetch_add(1, Relaxed);
            }
        }
        result
    }

    async fn propose_uncounted(&self, command: &MetaCommand) -> Result<u64, Status> {
        // The node a replica moves off may be gone for good (its disk lost): it need not
        // have reported the level (back with an older release, it stops applying, as a node
        // the cluster is evicting may).
        let leaving = match command {
            MetaCommand::MoveReplica { from, .. } => Some(from),
            _ => None,
        };
        self.check_command_level(command.level(), leaving).await?;
        // One id for every attempt of this call: a copy that committed while its answer was
        // lost makes the next one answer as it did, instead of applying twice.
        let request = RequestId(rand::random::<u128>().max(1));
        self.propose_bytes(command.encode_request(Some(request)))
            .await
    }

    /// Proposes log bytes (empty: a barrier, nothing to apply) through whichever node leads,
    /// retrying on leader changes until [`PROPOSE_TIMEOUT`]; returns once this node applied
    /// them. A refusal is answered once this node applied it too, so that what the caller
    /// reads next here is at least what the refusal was judged on.
    async fn propose_bytes(&self, bytes: Vec<u8>) -> Result<u64, Status> {
        let deadline = Instant::now() + PROPOSE_TIMEOUT;
        let mut view = self.shared.view.clone();
        let mut last_error = Status::unavailable(
            "no metadata leader answered within 10 s; is a majority of the voters running? (`ferry cluster status`)",
        );
        while Instant::now() < deadline {
            // A leader cut off from the majority appends and never commits: bounded here.
            let Ok(proposed) =
                tokio::time::timeout_at(deadline, self.propose_local(bytes.clone())).await
            else {
                break;
            };
            let decided = match proposed {
                Ok((index, outcome)) => Some((index, outcome.err().map(|e| meta_status(&e)))),
                Err(ProposeFailure::NotLeader(Some(leader))) => {
                    match self.forward(RaftId(leader.0), &bytes).await {
                        Ok(decided) => Some(decided),
                        Err(s) if s.code() == Code::Unavailable => {
                            last_error = s;
                            None
                        }
                        Err(s) => return Err(s),
                    }
                }
                Err(f @ (ProposeFailure::NotMember | ProposeFailure::Stopped)) => {
                    return Err(failure_status(&f))
                }
                Err(f) => {
                    last_error = failure_status(&f);
                    None
                }
            };
            if let Some((index, refused)) = decided {
                // Applied by the driver; published to the view right after its round.
                self.wait_applied(index, deadline).await?;
                return match refused {
                    None => Ok(index),
                    Some(status) => Err(status),
                };
            }
            // Wait for news (a leader elected) or a short pause, whichever comes first.
            let _ = tokio::time::timeout(RETRY_PAUSE, view.changed()).await;
        }
        Err(last_error)
    }

    /// Makes this node's view at least as new as every metadata change answered anywhere
    /// before the call: an empty entry through the leader, applied here. What a client did
    /// through one node is then seen by its next call through this one.
    pub(crate) async fn catch_up(&self) -> Result<(), Status> {
        self.propose_bytes(Vec::new()).await.map(|_| ())
    }

    /// Asks the leader to propose: the index it applied at, and the refusal if the command was
    /// refused there (every node refuses it alike at that index).
    async fn forward(
        &self,
        leader: RaftId,
        command: &[u8],
    ) -> Result<(u64, Option<Status>), Status> {
        let addr = {
            let view = self.shared.view.borrow();
            view.node_by_raft_id(leader)
                .map(|(_, n)| n.peer_addr.clone())
        };
        let Some(addr) = addr else {
            return Err(Status::unavailable(format!(
                "the metadata leader ({leader}) is not known here yet"
            )));
        };
        let mut client = peer_client(&addr)?;
        let req = pb::ProposeMetaRequest {
            command: command.to_vec(),
            refusal_in_answer: true,
        };
        let mut request = tonic::Request::new(req);
        request.set_timeout(PROPOSE_TIMEOUT);
        match client.propose_meta(request).await {
            Ok(r) => {
                let r = r.into_inner();
                let refused = r
                    .refused
                    .map(|refusal| Status::new(Code::from_i32(refusal.code), refusal.message));
                Ok((r.index, refused))
            }
            // Transport trouble is worth a retry (the leader may have changed or died).
            Err(s)
                if matches!(
                    s.code(),
                    Code::Unknown | Code::Cancelled | Code::DeadlineExceeded
                ) =>
            {
                Err(Status::unavailable(s.message().to_owned()))
            }
            Err(s) => Err(s),
        }
    }

    /// Refuses a command of a level some active node has not reported reading (an older
    /// release, mid-upgrade): proposed, it would stop that node's metadata group. A node not
    /// heard from since this one started (a cluster that has just come up) is waited for, up to
    /// the liveness timeout, before it counts as behind.
    async fn check_command_level(
        &self,
        needed: u32,
        except: Option<&NodeId>,
    ) -> Result<(), Status> {
        if needed <= 1 {
            return Ok(());
        }
        let deadline = tokio::time::Instant::now() + self.shared.settings.liveness_timeout;
        loop {
            // Registered before looking, so a report that arrives meanwhile is not missed.
            let learned = self.shared.links.level_learned.notified();
            let behind = self.nodes_behind(needed, except);
            if behind.is_empty() {
                return Ok(());
            }
            let unheard = behind.iter().any(|(_, level)| *level == 0);
            if !unheard || tokio::time::timeout_at(deadline, learned).await.is_err() {
                return Err(behind_status(needed, &behind));
            }
        }
    }

    /// The other active nodes (but `except`) that have not reported reading command level
    /// `needed`, with the level they reported (0: not heard from).
    fn nodes_behind(&self, needed: u32, except: Option<&NodeId>) -> Vec<(NodeId, u32)> {
        let me = &self.shared.settings.node_id;
        let view = self.shared.view.borrow();
        let reported = view
            .meta
            .nodes()
            .iter()
            .filter(|(id, n)| *id != me && Some(*id) != except && n.is_active())
            .map(|(id, n)| {
                (
                    id.clone(),
                    self.shared.links.peer_command_level(n.raft_id.0),
                )
            });
        nodes_behind(needed, reported)
    }

    /// The other active nodes not heard from within the liveness timeout.
    pub(crate) fn down_nodes(&self, meta: &ferry_cluster::meta::MetaState) -> BTreeSet<NodeId> {
        let me = &self.shared.settings.node_id;
        meta.nodes()
            .iter()
            .filter(|(id, n)| *id != me && n.is_active())
            .filter(|(_, n)| {
                !self
                    .shared
                    .links
                    .is_up(n.raft_id.0, self.shared.settings.liveness_timeout)
            })
            .map(|(id, _)| id.clone())
            .collect()
    }

    /// Waits until the cluster is formed (this node knows its id), at most until `deadline`;
    /// whether it is.
    pub(crate) async fn wait_formed(&self, deadline: Instant) -> bool {
        let mut view = self.shared.view.clone();
        let formed = view.wait_for(|v| v.meta.cluster_id().is_some());
        tokio::time::timeout_at(deadline, formed)
            .await
            .is_ok_and(|r| r.is_ok())
    }

    /// Waits until this node applied `index`.
    pub(crate) async fn wait_applied(&self, index: u64, deadline: Instant) -> Result<(), Status> {
        let mut view = self.shared.view.clone();
        let applied =
            tokio::time::timeout_at(deadline, view.wait_for(|v| v.meta.applied_index() >= index))
                .await;
        match applied {
            Ok(Ok(_)) => Ok(()),
            _ => Err(Status::unavailable(format!(
                "committed, but this node has not applied metadata index {index} yet; it is behind the leader"
            ))),
        }
    }

    /// Defines a queue through the metadata group: owner by the placement rule (or `pinned`),
    /// committed before the queue is used. The owner's back-end creates it when it applies the
    /// command.
    pub async fn create_queue(
        &self,
        name: &QueueName,
        settings: pb::QueueConfig,
        asked: PlacementAsked,
        if_not_exists: bool,
    ) -> Result<CreatedQueue, Status> {
        let existing = |created| {
            let view = self.shared.view.borrow();
            view.meta.queue(name).map(|d| CreatedQueue {
                owner: d.owner.clone(),
                created,
                replicas: d
                    .shard
                    .and_then(|s| view.meta.shard(s))
                    .map_or_else(Vec::new, |s| s.replicas.clone()),
            })
        };
        self.shared.host.check_settings(name, &settings)?;
        if !self.wait_formed(Instant::now() + PROPOSE_TIMEOUT).await {
            return Err(meta_status(&MetaError::NotBootstrapped));
        }
        // Whether the queue exists is judged where the command is ordered, never on this
        // node's view, which may not have applied a deletion answered through another node.
        let mut command = self.create_command(name, &settings, &asked)?;
        // Creates that make a new shard go one at a time, each choosing once the one before is
        // applied: chosen side by side, a burst of creates on a new cluster (eight creators)
        // made eight shards where the rule makes one per node, every one of them preferring the
        // same node as leader, which then served every queue. Creates joining a shard are not
        // held up.
        let _new_shard = match &command {
            MetaCommand::CreateReplicatedQueue {
                shard: ShardChoice::New { .. },
                ..
            } => {
                let held = self.shared.new_shard.lock().await;
                command = self.create_command(name, &settings, &asked)?;
                Some(held)
            }
            _ => None,
        };
        match self.propose(&command).await {
            Ok(_) => existing(true).ok_or_else(|| {
                Status::unavailable(format!("queue {name} was deleted right after its creation"))
            }),
            // Refused at apply, and applied here since: the view holds the queue found.
            Err(s) if s.code() == Code::AlreadyExists && if_not_exists => existing(false).ok_or(s),
            Err(s) => Err(s),
        }
    }

    /// The command that creates `name` by the placement rule, as this node's view has the
    /// cluster (see [`Self::create_queue`]).
    fn create_command(
        &self,
        name: &QueueName,
        settings: &pb::QueueConfig,
        asked: &PlacementAsked,
    ) -> Result<MetaCommand, Status> {
        let view = self.shared.view.borrow();
        let down = self.down_nodes(&view.meta);
        let replication = match asked.replicas {
            0 => view
                .meta
                .default_replication(name, settings, asked.pinned.is_some())
                .map_err(|e| meta_status(&e))?,
            n => n as usize,
        };
        if replication > 1 || asked.own_shard {
            let shard = choose_shard(
                &view.meta,
                name,
                settings,
                replication,
                asked.own_shard,
                &down,
            )
            .map_err(|e| meta_status(&e))?;
            Ok(MetaCommand::CreateReplicatedQueue {
                name: name.clone(),
                settings: settings.clone(),
                shard,
            })
        } else {
            let loads = self.loads_bytes(&view.meta);
            let pinned = asked.pinned.as_ref();
            let owner =
                choose_queue_owner_avoiding(&view.meta, name, settings, &loads, pinned, &down)
                    .map_err(|e| meta_status(&e))?;
            Ok(MetaCommand::CreateQueue {
                name: name.clone(),
                settings: settings.clone(),
                owner,
            })
        }
    }

    /// Changes a queue's settings through the metadata group: `patch` is merged into its
    /// settings (each field set replaces the queue's), the result checked as a creation's would
    /// be, and proposed to replace exactly the settings it was merged into (retried when another
    /// change committed in between). The owner applies the new settings when it applies the
    /// command.
    pub async fn update_queue(
        &self,
        name: &QueueName,
        patch: &pb::QueueConfig,
    ) -> Result<UpdatedQueue, Status> {
        for attempt in 0..UPDATE_TRIES_MAX {
            if attempt == 0 && self.shared.view.borrow().meta.queue(name).is_none() {
                // Not here yet, or gone: ask the log, not this node's view, which may not have
                // applied a creation answered through another node.
                self.catch_up().await?;
            }
            let found = {
                let view = self.shared.view.borrow();
                view.meta
                    .queue(name)
                    .map(|d| (d.owner.clone(), d.settings.clone()))
            };
            let Some((owner, current)) = found else {
                return Err(meta_status(&MetaError::QueueNotFound {
                    queue: name.clone(),
                }));
            };
            let settings = ferry_proto::settings::merge_queue_config(&current, patch);
            if settings == current {
                return Ok(UpdatedQueue {
                    owner,
                    changed: false,
                });
            }
            self.shared.host.check_settings(name, &settings)?;
            let command = MetaCommand::UpdateQueue {
                name: name.clone(),
                settings,
                expected: Some(Box::new(current)),
            };
            match self.propose(&command).await {
                Ok(_) => {
                    return Ok(UpdatedQueue {
                        owner,
                        changed: true,
                    })
                }
                Err(s) if s.code() == Code::Aborted => continue,
                Err(s) => return Err(s),
            }
        }
        Err(Status::aborted(format!(
            "the settings of queue {name} kept being changed by other updates; retry"
        )))
    }

    /// Deletes a queue through the metadata group; its owner deletes it when it applies the
    /// command. NOT_FOUND is judged where the deletion is ordered, not on this node's view.
    pub async fn delete_queue(&self, name: &QueueName) -> Result<(), Status> {
        self.propose(&MetaCommand::DeleteQueue { name: name.clone() })
            .await
            .map(|_| ())
    }

    /// As the first leader of a new cluster: asks every initial node who it is, then proposes
    /// `Bootstrap` with a new cluster id. Ends once the cluster is formed or at shutdown.
    pub(crate) async fn bootstrap_when_leader(self) {
        let StartMode::Initial(voters) = self.shared.settings.start.clone() else {
            return;
        };
        let mut view = self.shared.view.clone();
        let mut shutdown = self.shared.shutdown.clone();
        loop {
            let (formed, leader) = {
                let v = view.borrow_and_update();
                (v.meta.cluster_id().is_some(), v.is_leader())
            };
            if formed {
                return;
            }
            if leader {
                match self.initial_nodes(&voters).await {
                    Ok(nodes) => {
                        let command = MetaCommand::Bootstrap {
                            cluster_id: ClusterId(rand::random::<u128>().max(1)),
                            nodes,
                        };
                        match self.propose_local(command.encode()).await {
                            Ok((_, Ok(_))) => tracing::info!("formed a new cluster"),
                            Ok((_, Err(e))) => tracing::debug!(error = %e, "bootstrap refused"),
                            Err(f) => tracing::debug!(?f, "bootstrap not proposed yet"),
                        }
                    }
                    Err(why) => tracing::info!(%why, "waiting for the initial nodes"),
                }
            }
            tokio::select! {
                _ = tokio::time::timeout(Duration::from_millis(500), view.changed()) => {}
                _ = shutdown.wait_for(|s| *s) => return,
            }
        }
    }

    /// Every initial node's addresses, asking the others for their client address.
    async fn initial_nodes(&self, voters: &[(NodeId, String)]) -> Result<Vec<NewNode>, String> {
        let settings = &self.shared.settings;
        let mut nodes = vec![];
        for (id, peer_addr) in voters {
            if id == &settings.node_id {
                nodes.push(NewNode {
                    id: id.clone(),
                    client_addr: settings.client_addr.clone(),
                    peer_addr: settings.peer_addr.clone(),
                });
                continue;
            }
            let hello = hello(peer_addr, &settings.node_id)
                .await
                .map_err(|s| format!("{id} at {peer_addr}: {}", s.message()))?;
            if hello.node_id != id.as_str() {
                return Err(format!(
                    "at {peer_addr} runs node {}, not {id}; fix the initial cluster list",
                    hello.node_id
                ));
            }
            nodes.push(NewNode {
                id: id.clone(),
                client_addr: hello.client_address,
                peer_addr: peer_addr.clone(),
            });
        }
        Ok(nodes)
    }

    /// As a node started with `join`: asks the member at `addr` until this node is listed, then
    /// starts following the cluster with its raft id.
    pub(crate) async fn wait_until_added(self, addr: String) {
        let me = self.shared.settings.node_id.clone();
        let mut shutdown = self.shared.shutdown.clone();
        tracing::info!(%addr, "waiting to be added to the cluster: run `ferry node add {me} --address {}` on a member", self.shared.settings.peer_addr);
        loop {
            if let Ok(h) = hello(&addr, &me).await {
                if let Some(raft_id) = h.members.get(me.as_str()) {
                    // Until the metadata arrives, the members' addresses come from here.
                    let peers = h
                        .member_peer_addresses
                        .into_iter()
                        .filter(|(id, _)| id != raft_id)
                        .map(|(id, addr)| (ferry_multiraft::NodeId(id), addr))
                        .collect();
                    *self
                        .shared
                        .early_peers
                        .lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner) = peers;
                    let _ = self.shared.inputs.try_send(Input::Join(RaftId(*raft_id)));
                    return;
                }
            }
            tokio::select! {
                () = tokio::time::sleep(Duration::from_millis(500)) => {}
                _ = shutdown.wait_for(|s| *s) => return,
            }
        }
    }

    /// Proposes the queues the back-end held before this node had metadata, owned here; then
    /// the back-end follows the metadata like any other node's.
    pub(crate) async fn import_local_queues(self) {
        let me = self.shared.settings.node_id.clone();
        let mut view = self.shared.view.clone();
        let ready = view
            .wait_for(|v| v.meta.cluster_id().is_some() && v.meta.node(&me).is_some())
            .await
            .is_ok();
        if !ready {
            return;
        }
        let mut held = self.shared.host.queues();
        // Queues before their dead-letter queues, which they define alongside.
        held.sort_by_key(|q| (q.name.is_dead_letter_queue(), q.name.clone()));
        for q in held {
            let defined = self.shared.view.borrow().meta.queue(&q.name).is_some();
            if defined {
                continue;
            }
            let command = MetaCommand::CreateQueue {
                name: q.name.clone(),
                settings: q.settings.clone(),
                owner: me.clone(),
            };
            match self.propose(&command).await {
                Ok(_) => {
                    tracing::info!(queue = %q.name, "queue imported into the cluster metadata")
                }
                Err(s) if s.code() == Code::AlreadyExists => {}
                Err(s) => {
                    tracing::error!(queue = %q.name, error = %s.message(), "cannot import the queue; it stays unplaced until the next start");
                    return;
                }
            }
        }
        if let Some(marker) = &self.shared.settings.import_marker {
            if let Err(e) = std::fs::remove_file(marker) {
                tracing::warn!(path = %marker.display(), error = %e, "cannot remove the import marker");
            }
        }
    }
}

/// The nodes of `reported` (node, command level it reported, 0 for none) below `needed`.
fn nodes_behind(needed: u32, reported: impl Iterator<Item = (NodeId, u32)>) -> Vec<(NodeId, u32)> {
    reported.filter(|(_, level)| *level < needed).collect()
}

/// The refusal of a command of level `needed` for the nodes `behind` (see
/// `Proposer::check_command_level`).
fn behind_status(needed: u32, behind: &[(NodeId, u32)]) -> Status {
    let names: Vec<String> = behind
        .iter()
        .map(|(id, level)| match level {
            0 => format!("{id} (not heard from since this node started: down, or cut off)"),
            l => format!("{id} (level {l})"),
        })
        .collect();
    Status::failed_precondition(format!(
        "this change needs every node to read metadata command level {needed}; {} do not yet: start or upgrade them first (or remove a node gone for good)",
        names.join(", ")
    ))
}

/// Name of the file, in the data directory, that marks an unfinished import.
pub const IMPORT_MARKER: &str = "IMPORT_PENDING";

pub(crate) fn peer_client(
    addr: &str,
) -> Result<pb::peer_client::PeerClient<tonic::transport::Channel>, Status> {
    let endpoint = peer_endpoint(addr)
        .map_err(|e| Status::invalid_argument(format!("peer address {addr:?}: {e}")))?;
    Ok(pb::peer_client::PeerClient::new(endpoint.connect_lazy()))
}

/// Asks the node at `addr` who it is.
pub(crate) async fn hello(addr: &str, from: &NodeId) -> Result<pb::HelloResponse, Status> {
    let mut client = peer_client(addr)?;
    let mut request = tonic::Request::new(pb::HelloRequest {
        from_node_id: from.to_string(),
    });
    request.set_timeout(PEER_CALL_TIMEOUT);
    match client.hello(request).await {
        Ok(r) => Ok(r.into_inner()),
        Err(s) => Err(Status::unavailable(format!(
            "nothing answers as a Ferry node at {addr} ({}); check the address (a node's peer listener, `peer_listen`) and that the node runs",
            s.message()
        ))),
    }
}

/// Before a joining node starts: something must answer at `addr`, and belong to a cluster.
pub(crate) async fn check_join_target(addr: &str) -> Result<(), StartError> {
    let me = NodeId::new("joining").map_err(|e| StartError::Join {
        addr: addr.into(),
        reason: e.to_string(),
    })?;
    let h = hello(addr, &me).await.map_err(|s| StartError::Join {
        addr: addr.into(),
        reason: s.message().to_owned(),
    })?;
    if h.cluster_id.is_empty() {
        return Err(StartError::Join {
            addr: addr.into(),
            reason: format!(
                "node {} there belongs to no cluster yet; join a member of a formed cluster",
                h.node_id
            ),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn a_newer_command_waits_for_every_node_to_read_it() {
        let n = |s: &str| NodeId::new(s).unwrap();
        let reported = || [(n("a"), 2), (n("b"), 1), (n("c"), 0)].into_iter();
        assert_eq!(nodes_behind(1, reported()), vec![(n("c"), 0)]);
        assert_eq!(nodes_behind(2, reported()), vec![(n("b"), 1), (n("c"), 0)]);
        assert!(nodes_behind(2, [(n("a"), 2)].into_iter()).is_empty());
    }
}
