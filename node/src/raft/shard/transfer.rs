//! `Cluster.TransferShardLeader` (`ferry shard transfer-leader <shard> <node>`): moves a queue
//! shard's leadership to one of its replicas.
//!
//! Three nodes take part, any two of which may be the same:
//! 1. the node asked checks the request against its metadata (the shard exists, the node is
//!    one of its replicas and is reachable) and forwards it to the node named
//!    (`Peer.TakeShardLeadership`);
//! 2. the node named tells its balancer to leave the shard with it once it leads it
//!    (`balance.rs`), asks the leader it knows of (`Peer.StartShardTransfer`), and answers
//!    once its own engine shows it leading the shard, at most [`TRANSFER_WAIT`];
//! 3. the leader hands leadership over with the engine's `transfer_leader`: raft-rs brings the
//!    named node's log up to date and tells it to campaign at once.
//!
//! Waiting where the new leader is means waiting on that node's own view, which changes the
//! moment it leads, with no polling.

use std::time::Duration;

use ferry_be_server::ShardId;
use ferry_cluster::meta::RaftId;
use ferry_kernel::NodeId;
use ferry_multiraft::{GroupId, NodeId as PeerId, Role};
use ferry_proto::pb;
use tokio::sync::oneshot;

use super::super::driver::Input;
use super::super::propose::peer_client;
use super::super::MetaNode;

/// How long the node named waits for leadership to reach it.
pub(crate) const TRANSFER_WAIT: Duration = Duration::from_secs(5);

/// How much longer than [`TRANSFER_WAIT`] the node asked waits for the node named to answer.
const FORWARD_SLACK: Duration = Duration::from_secs(2);

/// Why a shard's leader did not start a transfer (its driver's answer).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum TransferRefusal {
    /// The node does not run the shard's group.
    #[error("this node does not run shard {}'s group", shard.0)]
    NotRunning { shard: ShardId },
    /// The node does not lead the shard.
    #[error("this node no longer leads shard {}; {}", shard.0, leader_text(leader))]
    NotLeader {
        shard: ShardId,
        leader: Option<String>,
    },
    /// The engine refused.
    #[error("shard {}'s leader refused to hand leadership over: {reason}", shard.0)]
    Refused { shard: ShardId, reason: String },
}

fn leader_text(leader: &Option<String>) -> String {
    match leader {
        Some(l) => format!("{l} leads it"),
        None => "no leader is known".to_owned(),
    }
}

/// Why a transfer was refused or did not complete; each maps to the code the proto documents.
#[derive(Debug, thiserror::Error)]
pub(crate) enum TransferError {
    /// Shard 0 is no shard.
    #[error("shard: name a queue shard by its id (1 or more), as `ferry shard list` shows it")]
    NoShard,
    /// The node id does not parse.
    #[error("node_id: {0}")]
    BadNode(String),
    /// The shard is not in the metadata.
    #[error("shard {} does not exist (never made, or gone with its last queue); `ferry shard list` shows the shards that do", shard.0)]
    UnknownShard { shard: ShardId },
    /// The node is not one of the shard's replicas.
    #[error("node {node} is not a replica of shard {}; its replicas are {}", shard.0, replicas.join(", "))]
    NotReplica {
        shard: ShardId,
        node: NodeId,
        replicas: Vec<String>,
    },
    /// The node named is down or cut off from the node asked.
    #[error("node {node} is not reachable from {from} (down or cut off); it cannot take the lead of shard {}", shard.0)]
    NodeDown {
        shard: ShardId,
        node: NodeId,
        from: NodeId,
    },
    /// No leader is known to hand leadership over.
    #[error("shard {} has no leader now (an election, or most of its replicas down); try again", shard.0)]
    NoLeader { shard: ShardId },
    /// The node named does not run the shard's group yet.
    #[error("node {node} does not run shard {}'s group yet; try again once `ferry shard list` shows it", shard.0)]
    NotStarted { shard: ShardId, node: NodeId },
    /// The leader did not start the transfer.
    #[error("{0}")]
    Refusal(TransferRefusal),
    /// Leadership did not move in time.
    #[error("leadership did not move: shard {} is still led by {} after {} s (the log of {node} did not catch up within an election timeout, or it lost the election)", shard.0, leader_text(leader), wait.as_secs())]
    TimedOut {
        shard: ShardId,
        node: NodeId,
        leader: Option<String>,
        wait: Duration,
    },
    /// The node asked could not reach another one.
    #[error("{what}: {status}", status = status.message())]
    Peer { what: String, status: tonic::Status },
}

impl From<TransferError> for tonic::Status {
    fn from(e: TransferError) -> Self {
        use tonic::Status;
        match &e {
            TransferError::NoShard
            | TransferError::BadNode(_)
            | TransferError::NotReplica { .. } => Status::invalid_argument(e.to_string()),
            TransferError::UnknownShard { .. } => Status::not_found(e.to_string()),
            TransferError::NodeDown { .. } | TransferError::NoLeader { .. } => {
                Status::unavailable(e.to_string())
            }
            TransferError::NotStarted { .. } => Status::failed_precondition(e.to_string()),
            TransferError::Refusal(r) => match r {
                TransferRefusal::NotRunning { .. } | TransferRefusal::NotLeader { .. } => {
                    Status::unavailable(e.to_string())
                }
                TransferRefusal::Refused { .. } => Status::failed_precondition(e.to_string()),
            },
            TransferError::TimedOut { .. } => Status::deadline_exceeded(e.to_string()),
            // The other node's own answer, code and all (its message says what it was).
            TransferError::Peer { status, .. } => Status::new(status.code(), e.to_string()),
        }
    }
}

/// What the node named answers: itself as leader, at `term`.
fn led(me: &NodeId, term: u64) -> pb::TransferShardLeaderResponse {
    pb::TransferShardLeaderResponse {
        leader: me.to_string(),
        term,
    }
}

impl MetaNode {
    /// `Cluster.TransferShardLeader` on the node asked (step 1 of the module docs).
    pub(crate) async fn transfer_shard_leader(
        &self,
        shard: u64,
        node: &str,
    ) -> Result<pb::TransferShardLeaderResponse, TransferError> {
        if shard == 0 {
            return Err(TransferError::NoShard);
        }
        let shard = ShardId(shard);
        let node = NodeId::new(node).map_err(|e| TransferError::BadNode(e.to_string()))?;
        let view = self.shared.view.borrow().clone();
        let def = view
            .meta
            .shard(shard)
            .ok_or(TransferError::UnknownShard { shard })?;
        if !def.replicas.contains(&node) {
            let replicas = def.replicas.iter().map(ToString::to_string).collect();
            return Err(TransferError::NotReplica {
                shard,
                node,
                replicas,
            });
        }
        if &node == self.node_id() {
            return self.take_shard_leadership(shard, TRANSFER_WAIT).await;
        }
        let info = view.meta.node(&node).filter(|_| self.is_reachable(&node));
        let Some(info) = info else {
            let from = self.node_id().clone();
            return Err(TransferError::NodeDown { shard, node, from });
        };
        let what = format!("asking {node} to take the lead of shard {}", shard.0);
        let peer = |status| TransferError::Peer {
            what: what.clone(),
            status,
        };
        let mut client = peer_client(&info.peer_addr).map_err(peer)?;
        let mut request = tonic::Request::new(pb::TakeShardLeadershipRequest {
            shard: shard.0,
            wait_ms: TRANSFER_WAIT.as_millis() as u64,
        });
        request.set_timeout(TRANSFER_WAIT + FORWARD_SLACK);
        let answer = client.take_shard_leadership(request).await.map_err(peer)?;
        Ok(answer.into_inner())
    }

    /// `Peer.TakeShardLeadership` on the node named (step 2 of the module docs).
    pub(crate) async fn take_shard_leadership(
        &self,
        shard: ShardId,
        wait: Duration,
    ) -> Result<pb::TransferShardLeaderResponse, TransferError> {
        let deadline = tokio::time::Instant::now() + wait.min(TRANSFER_WAIT);
        let me = self.node_id().clone();
        let group = GroupId(shard.0);
        let mut view = self.shared.view.clone();
        let current = view.borrow_and_update().clone();
        let Some(g) = current.shards.get(&shard) else {
            return Err(TransferError::NotStarted { shard, node: me });
        };
        // Held first, so the balancer never hands it back between the transfer and the hold.
        let _ = self.shared.inputs.try_send(Input::HoldShard { group });
        if g.role == Role::Leader {
            return Ok(led(&me, g.term));
        }
        let leader = g.leader.and_then(|l| current.node_by_raft_id(l));
        let (Some((leader, info)), Some(my_id)) = (leader, current.raft_id) else {
            return Err(TransferError::NoLeader { shard });
        };
        let what = format!(
            "asking {leader}, shard {}'s leader, to hand it over",
            shard.0
        );
        let peer = |status| TransferError::Peer {
            what: what.clone(),
            status,
        };
        let mut client = peer_client(&info.peer_addr).map_err(peer)?;
        let mut request = tonic::Request::new(pb::StartShardTransferRequest {
            shard: shard.0,
            to_raft_id: my_id.0,
        });
        request.set_timeout(wait);
        client.start_shard_transfer(request).await.map_err(peer)?;
        let leads = |v: &std::sync::Arc<super::super::MetaView>| {
            v.shards.get(&shard).is_some_and(|g| g.role == Role::Leader)
        };
        let waited = tokio::time::timeout_at(deadline, async {
            let v = view.wait_for(leads).await.ok()?;
            v.shards.get(&shard).map(|g| g.term)
        })
        .await;
        match waited {
            Ok(Some(term)) => Ok(led(&me, term)),
            Ok(None) => Err(TransferError::Refusal(TransferRefusal::NotRunning {
                shard,
            })),
            Err(_) => {
                let now = self.shared.view.borrow().clone();
                let leader = now
                    .shards
                    .get(&shard)
                    .and_then(|g| g.leader)
                    .and_then(|l| now.node_by_raft_id(l))
                    .map(|(id, _)| id.to_string());
                Err(TransferError::TimedOut {
                    shard,
                    node: me,
                    leader,
                    wait,
                })
            }
        }
    }

    /// `Peer.StartShardTransfer` on the shard's leader (step 3 of the module docs).
    pub(crate) async fn start_shard_transfer(
        &self,
        shard: ShardId,
        to: RaftId,
    ) -> Result<(), TransferError> {
        let (reply, answer) = oneshot::channel();
        let input = Input::TransferShard {
            group: GroupId(shard.0),
            to: PeerId(to.0),
            reply,
        };
        let busy = || TransferError::Refusal(TransferRefusal::NotRunning { shard });
        self.shared.inputs.try_send(input).map_err(|_| busy())?;
        answer
            .await
            .map_err(|_| busy())?
            .map_err(TransferError::Refusal)
    }
}
