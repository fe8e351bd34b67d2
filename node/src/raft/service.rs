//! The gRPC services of the metadata group: `Peer` (node to node, on the peer listener) and
//! `Cluster` (membership for admins, on the client listener). Thin: decode, one call, encode.

use std::str::FromStr;

use ferry_kernel::NodeId;
use ferry_proto::pb;
use tonic::{Request, Response, Status};

use super::propose::{hello, meta_status, PROPOSE_TIMEOUT};
use super::snapshot_stream::receive_snapshot;
use super::transport::{
    admit, admit_incarnation, cluster_id_bytes, cluster_id_of, receive_stream, BATCH_BYTES_MAX,
};
use super::MetaNode;
use ferry_cluster::meta::{
    check_voters, MetaCommand, MetaError, MetaEvent, NodeRole, ShardDef, VoterChange, VoterCheck,
};

/// The `Peer` service of a node.
#[derive(Debug, Clone)]
pub struct PeerService {
    node: MetaNode,
}

/// The `Cluster` service of a node.
#[derive(Debug, Clone)]
pub struct ClusterService {
    node: MetaNode,
}

impl MetaNode {
    /// The `Peer` service, for the peer listener.
    pub fn peer_service(&self) -> pb::peer_server::PeerServer<PeerService> {
        pb::peer_server::PeerServer::new(PeerService { node: self.clone() })
            .max_decoding_message_size(BATCH_BYTES_MAX)
    }

    /// The `Cluster` service, for the client listener.
    pub fn cluster_service(&self) -> pb::cluster_server::ClusterServer<ClusterService> {
        pb::cluster_server::ClusterServer::new(ClusterService { node: self.clone() })
    }
}

type Reply<T> = Result<Response<T>, Status>;

#[tonic::async_trait]
impl pb::peer_server::Peer for PeerService {
    async fn raft(
        &self,
        req: Request<tonic::Streaming<pb::RaftBatch>>,
    ) -> Reply<pb::RaftStreamEnd> {
        let shared = &self.node.shared;
        let view = shared.view.clone();
        receive_stream(
            &shared.links,
            req.into_inner(),
            move |from, theirs, incarnation| {
                let view = view.borrow();
                let sender = view.node_by_raft_id(ferry_cluster::meta::RaftId(from));
                admit(view.meta.cluster_id(), theirs, from, |_| {
                    sender.is_some_and(|(_, n)| n.is_active())
                })?;
                match sender {
                    Some((id, n)) => admit_incarnation(from, id, n.incarnation, incarnation)
                        .inspect_err(|e| tracing::warn!(error = %e.message(), "refused a peer's Raft batches")),
                    None => Ok(()),
                }
            },
            shared.shutdown.clone(),
        )
        .await?;
        Ok(Response::new(pb::RaftStreamEnd {}))
    }

    async fn snapshot(
        &self,
        req: Request<tonic::Streaming<pb::SnapshotChunk>>,
    ) -> Reply<pb::SnapshotReceived> {
        let shared = &self.node.shared;
        let ours = shared.view.borrow().meta.cluster_id();
        receive_snapshot(&shared.links, req.into_inner(), ours).await?;
        Ok(Response::new(pb::SnapshotReceived {}))
    }

    async fn hello(&self, _req: Request<pb::HelloRequest>) -> Reply<pb::HelloResponse> {
        let shared = &self.node.shared;
        let view = shared.view.borrow().clone();
        let members = view
            .meta
            .nodes()
            .iter()
            .filter(|(_, n)| n.is_active())
            .map(|(id, n)| (id.to_string(), n.raft_id.0))
            .collect();
        let member_peer_addresses = view
            .meta
            .nodes()
            .values()
            .filter(|n| n.is_active())
            .map(|n| (n.raft_id.0, n.peer_addr.clone()))
            .collect();
        Ok(Response::new(pb::HelloResponse {
            node_id: shared.settings.node_id.to_string(),
            client_address: shared.settings.client_addr.clone(),
            peer_address: shared.settings.peer_addr.clone(),
            cluster_id: cluster_id_bytes(view.meta.cluster_id()),
            raft_id: view.raft_id.map_or(0, |r| r.0),
            members,
            member_peer_addresses,
        }))
    }

    async fn propose_meta(
        &self,
        req: Request<pb::ProposeMetaRequest>,
    ) -> Reply<pb::ProposeMetaResponse> {
        let req = req.into_inner();
        let command = req.command;
        // Empty: a barrier (nothing to decode or apply).
        if !command.is_empty() {
            MetaCommand::decode(&command).map_err(|e| meta_status(&e))?;
        }
        let proposed = tokio::time::timeout(PROPOSE_TIMEOUT, self.node.propose_local(command))
            .await
            .map_err(|_| Status::unavailable("the proposal was not applied within 10 s"))?;
        // Never on a repeat: the leader that answers the retry lives.
        let first_time =
            matches!(&proposed, Ok((_, Ok(e))) if !matches!(e, MetaEvent::Repeated { .. }));
        if first_time && crate::faults::on(crate::faults::LEADER_DIES_BEFORE_ANSWER) {
            tracing::error!("planted fault: the leader dies before answering a forwarded proposal");
            // As a kill does: no answer, nothing closed in order.
            std::process::exit(137);
        }
        match proposed {
            Ok((index, Ok(_))) => Ok(Response::new(pb::ProposeMetaResponse {
                index,
                refused: None,
            })),
            Ok((index, Err(e))) if req.refusal_in_answer => {
                let status = meta_status(&e);
                Ok(Response::new(pb::ProposeMetaResponse {
                    index,
                    refused: Some(pb::ProposeRefusal {
                        code: status.code() as i32,
                        message: status.message().to_owned(),
                    }),
                }))
            }
            Ok((_, Err(e))) => Err(meta_status(&e)),
            Err(f) => Err(Status::unavailable(format!(
                "not proposed here ({f:?}); ask the current leader"
            ))),
        }
    }

    async fn local_shards(
        &self,
        _req: Request<pb::LocalShardsRequest>,
    ) -> Reply<pb::LocalShardsResponse> {
        let shards = self
            .node
            .local_shards()
            .await
            .map_err(Status::unavailable)?;
        Ok(Response::new(pb::LocalShardsResponse {
            shards: shards.iter().map(pb::LocalShard::from).collect(),
        }))
    }

    async fn take_shard_leadership(
        &self,
        req: Request<pb::TakeShardLeadershipRequest>,
    ) -> Reply<pb::TransferShardLeaderResponse> {
        let r = req.into_inner();
        let wait = std::time::Duration::from_millis(r.wait_ms);
        let shard = ferry_be_server::ShardId(r.shard);
        let answer = self.node.take_shard_leadership(shard, wait).await?;
        Ok(Response::new(answer))
    }

    async fn start_shard_transfer(
        &self,
        req: Request<pb::StartShardTransferRequest>,
    ) -> Reply<pb::StartShardTransferResponse> {
        let r = req.into_inner();
        let shard = ferry_be_server::ShardId(r.shard);
        let to = ferry_cluster::meta::RaftId(r.to_raft_id);
        self.node.start_shard_transfer(shard, to).await?;
        Ok(Response::new(pb::StartShardTransferResponse {}))
    }
}

pub(super) fn node_id(field: &str, value: &str) -> Result<NodeId, Status> {
    NodeId::new(value).map_err(|e| Status::invalid_argument(format!("{field}: {e}")))
}

/// `host:port` with a numeric port.
fn check_address(field: &str, addr: &str) -> Result<(), Status> {
    let ok = addr
        .rsplit_once(':')
        .is_some_and(|(host, port)| !host.is_empty() && u16::from_str(port).is_ok_and(|p| p > 0));
    if ok {
        Ok(())
    } else {
        Err(Status::invalid_argument(format!(
            "{field} is {addr:?}; write it as host:port (the node's peer listener)"
        )))
    }
}

#[tonic::async_trait]
impl pb::cluster_server::Cluster for ClusterService {
    async fn add_node(&self, req: Request<pb::AddNodeRequest>) -> Reply<pb::AddNodeResponse> {
        let r = req.into_inner();
        let id = node_id("node_id", &r.node_id)?;
        check_address("peer_address", &r.peer_address)?;
        let view = self.node.shared.view.borrow().clone();
        let Some(ours) = view.meta.cluster_id() else {
            return Err(meta_status(&MetaError::NotBootstrapped));
        };
        // A removed node's id may be added again: a machine back on an empty disk.
        if view.meta.node(&id).is_some_and(|n| n.is_active()) {
            return Err(meta_status(&MetaError::DuplicateNode { node: id }));
        }
        if !r.learner {
            if let VoterCheck::Breaks { advice, .. } =
                check_voters(&view.meta, VoterChange::AddVoter)
            {
                return Err(Status::failed_precondition(advice));
            }
        }
        let h = hello(&r.peer_address, self.node.node_id()).await?;
        if h.node_id != id.as_str() {
            return Err(Status::invalid_argument(format!(
                "node {} runs at {}, not {id}; check the id and the address",
                h.node_id, r.peer_address
            )));
        }
        if let Some(theirs) = cluster_id_of(&h.cluster_id)? {
            if theirs != ours {
                return Err(meta_status(&MetaError::WrongCluster {
                    expected: ours,
                    got: theirs,
                }));
            }
        }
        if h.raft_id != 0 {
            return Err(Status::failed_precondition(format!(
                "node {id} at {} still runs on its data directory of this cluster (raft id {}): a node is added only on an empty data directory; stop it, empty its data directory, start it with --join, then add it",
                r.peer_address, h.raft_id
            )));
        }
        let command = MetaCommand::AddNode {
            id: id.clone(),
            client_addr: h.client_address,
            peer_addr: r.peer_address,
            learner: r.learner,
        };
        self.node.propose(&command).await?;
        let status = self.node.status();
        let node = status.nodes.into_iter().find(|n| n.node_id == id.as_str());
        Ok(Response::new(pb::AddNodeResponse { node }))
    }

    async fn remove_node(
        &self,
        req: Request<pb::RemoveNodeRequest>,
    ) -> Reply<pb::RemoveNodeResponse> {
        let id = node_id("node_id", &req.into_inner().node_id)?;
        let view = self.node.shared.view.borrow().clone();
        let Some(node) = view.meta.node(&id) else {
            return Err(meta_status(&MetaError::UnknownNode { node: id }));
        };
        if !node.is_active() {
            return Err(meta_status(&MetaError::NodeRemoved { node: id }));
        }
        if node.role == NodeRole::Voter && view.meta.voters().len() > 1 {
            if let VoterCheck::Breaks { advice, .. } =
                check_voters(&view.meta, VoterChange::RemoveVoter)
            {
                return Err(Status::failed_precondition(format!(
                    "removing voter {id}: {advice}"
                )));
            }
        }
        self.node.propose(&MetaCommand::RemoveNode { id }).await?;
        Ok(Response::new(pb::RemoveNodeResponse {}))
    }

    async fn promote_nodes(
        &self,
        req: Request<pb::PromoteNodesRequest>,
    ) -> Reply<pb::PromoteNodesResponse> {
        let ids = req
            .into_inner()
            .node_ids
            .iter()
            .map(|id| node_id("node_ids", id))
            .collect::<Result<Vec<_>, _>>()?;
        if ids.is_empty() {
            return Err(Status::invalid_argument(
                "node_ids: name the learners to promote",
            ));
        }
        let view = self.node.shared.view.borrow().clone();
        let mut seen = std::collections::BTreeSet::new();
        for id in &ids {
            if !seen.insert(id) {
                return Err(Status::invalid_argument(format!(
                    "node {id} is named twice"
                )));
            }
            match view.meta.node(id) {
                None => return Err(meta_status(&MetaError::UnknownNode { node: id.clone() })),
                Some(n) if !n.is_active() => {
                    return Err(meta_status(&MetaError::NodeRemoved { node: id.clone() }))
                }
                Some(n) if n.role == NodeRole::Voter => {
                    return Err(meta_status(&MetaError::AlreadyVoter { node: id.clone() }))
                }
                Some(_) => {}
            }
        }
        let after = view.meta.voters().len() + ids.len();
        if !ferry_cluster::meta::VOTER_COUNTS.contains(&after) {
            return Err(Status::failed_precondition(format!(
                "{after} voters after this; the voters must be 1, 3 or 5: promote {} learners at once",
                if after.is_multiple_of(2) { "one more or one fewer" } else { "fewer" }
            )));
        }
        for id in ids {
            self.node.propose(&MetaCommand::PromoteNode { id }).await?;
        }
        Ok(Response::new(pb::PromoteNodesResponse {}))
    }

    async fn get_cluster_status(
        &self,
        _req: Request<pb::GetClusterStatusRequest>,
    ) -> Reply<pb::ClusterStatus> {
        let mut status = self.node.status();
        if !self.node.shared.view.borrow().meta.shards().is_empty() {
            let shards = self.node.list_shards(None).await?;
            count_led(&mut status, &shards);
        }
        Ok(Response::new(status))
    }

    async fn list_shards(
        &self,
        req: Request<pb::ListShardsRequest>,
    ) -> Reply<pb::ListShardsResponse> {
        let shard = req.into_inner().shard;
        let only = (shard != 0).then_some(ferry_be_server::ShardId(shard));
        let shards = self.node.list_shards(only).await?;
        Ok(Response::new(pb::ListShardsResponse { shards }))
    }

    async fn transfer_shard_leader(
        &self,
        req: Request<pb::TransferShardLeaderRequest>,
    ) -> Reply<pb::TransferShardLeaderResponse> {
        let r = req.into_inner();
        let answer = self.node.transfer_shard_leader(r.shard, &r.node_id).await?;
        Ok(Response::new(answer))
    }

    async fn move_shard_replica(
        &self,
        req: Request<pb::MoveShardReplicaRequest>,
    ) -> Reply<pb::MoveShardReplicaResponse> {
        let answer = self.node.move_shard_replica(req.into_inner()).await?;
        Ok(Response::new(answer))
    }
}

/// How many of `shards` match.
fn count_shards(shards: &[&ShardDef], matches: impl Fn(&ShardDef) -> bool) -> u32 {
    let n = shards.iter().filter(|s| matches(s)).count();
    u32::try_from(n).unwrap_or(u32::MAX)
}

/// Sets each node's `shards_led` from a listing of the shards.
fn count_led(status: &mut pb::ClusterStatus, shards: &[pb::ShardStatus]) {
    for n in &mut status.nodes {
        let led = shards.iter().filter(|s| s.leader == n.node_id).count();
        n.shards_led = u32::try_from(led).unwrap_or(u32::MAX);
    }
}

impl MetaNode {
    /// How `node` is seen from here ("self", "up" or "down") and how long ago it was last heard
    /// from (none for this node, or never heard from).
    fn health(
        &self,
        node: &NodeId,
        raft_id: ferry_cluster::meta::RaftId,
    ) -> (&'static str, Option<std::time::Duration>) {
        let shared = &self.shared;
        if node == &shared.settings.node_id {
            return ("self", None);
        }
        let heard = shared.links.last_heard(raft_id.0);
        let up = shared
            .links
            .is_up(raft_id.0, shared.settings.liveness_timeout);
        (if up { "up" } else { "down" }, heard)
    }

    /// The cluster as this node sees it.
    pub fn status(&self) -> pb::ClusterStatus {
        let shared = &self.shared;
        let view = shared.view.borrow().clone();
        let me = &shared.settings.node_id;
        let leader = view
            .leader_raft_id()
            .and_then(|r| view.node_by_raft_id(r))
            .map(|(id, _)| id.to_string())
            .unwrap_or_default();
        let loads = self.loads_bytes(&view.meta);
        let shards: Vec<&ShardDef> = view.meta.shards().values().collect();
        let nodes = view
            .meta
            .nodes()
            .iter()
            .filter(|(_, n)| n.is_active())
            .map(|(id, n)| {
                let (health, heard) = self.health(id, n.raft_id);
                pb::NodeStatus {
                    node_id: id.to_string(),
                    raft_id: n.raft_id.0,
                    client_address: n.client_addr.clone(),
                    peer_address: n.peer_addr.clone(),
                    role: match n.role {
                        NodeRole::Voter => "voter",
                        NodeRole::Learner => "learner",
                    }
                    .into(),
                    health: health.into(),
                    last_heard_ms_ago: heard.map_or(0, |h| h.as_millis() as u64),
                    queues: view
                        .meta
                        .queues_of(id)
                        .into_iter()
                        .map(|q| q.to_string())
                        .collect(),
                    stored_bytes: loads.get(id).copied().unwrap_or(0),
                    shards_replicated: count_shards(&shards, |s| s.replicas.contains(id)),
                    shards_preferred: count_shards(&shards, |s| s.preferred_leader() == id),
                    // Asked of the replicas by `Cluster.GetClusterStatus`.
                    shards_led: 0,
                    incarnation: n.incarnation,
                }
            })
            .collect();
        let group = view.group.as_ref();
        pb::ClusterStatus {
            cluster_id: view
                .meta
                .cluster_id()
                .map(|c| c.to_string())
                .unwrap_or_default(),
            node_id: me.to_string(),
            leader_node_id: leader,
            term: group.map_or(0, |g| g.term),
            commit_index: group.map_or(0, |g| g.commit_index),
            applied_index: view.meta.applied_index(),
            nodes,
            raft_voters: group.map_or(vec![], |g| g.voters.iter().map(|v| v.0).collect()),
        }
    }
}
