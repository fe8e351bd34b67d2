//! The bytes of the metadata log and snapshots: versioned protobuf (prost) messages defined
//! here. Field tags are never reused, so old entries stay readable; hostile bytes decode to a
//! [`MetaError`], never a panic. Encoding is deterministic (no protobuf maps; nodes and queues
//! in name order), so equal states give equal snapshot bytes.

use ferry_kernel::{NodeId, PlacementEpoch, QueueName, ShardId};
use ferry_proto::pb;
use prost::Message;

use super::command::{MetaCommand, NewNode};
use super::error::MetaError;
use super::requests::RequestId;
use super::shards::{ShardChoice, ShardDef};
use super::state::{ClusterId, MetaState, NodeInfo, NodeRole, NodeState, Owner, QueueDef, RaftId};

/// The version of commands this release writes and reads.
pub const COMMAND_VERSION: u32 = 1;
/// The newest command kinds this release reads. Every kind has the level of the release that
/// added it ([`MetaCommand::level`]); the first kinds are level 1. A node proposes a command of
/// a higher level only once every active node reported that it reads it, so that no node meets
/// a command it cannot read (which would stop its metadata group) during a rolling upgrade.
/// Level 2 added replicated queues (`CreateReplicatedQueue`, shards in snapshots); level 3
/// moving a shard's replica (`MoveReplica`, a shard's `reshaped` mark); level 4 recording the
/// data directory each node runs on (`NoteIncarnation`, a node's `incarnation`).
pub const COMMAND_LEVEL: u32 = 4;
/// The newest version of snapshots (and of the durable copy's header) this release writes and
/// reads. A state that made a shard is written as version 2, so that a release that knows
/// nothing of shards refuses it instead of reading its replicated queues as unreplicated; a
/// state that never made one is written as version 1, byte for byte as before shards.
pub const SNAPSHOT_VERSION: u32 = 2;
/// The version of a snapshot with no shard ever made.
const SNAPSHOT_VERSION_NO_SHARDS: u32 = 1;

#[derive(Clone, PartialEq, Message)]
struct WireCommand {
    #[prost(uint32, tag = "1")]
    version: u32,
    #[prost(oneof = "Kind", tags = "2, 3, 4, 5, 6, 7, 8, 11, 12, 13")]
    kind: Option<Kind>,
    /// The proposal's request id (both halves 0: none), the same across its retries.
    #[prost(fixed64, tag = "9")]
    request_high: u64,
    #[prost(fixed64, tag = "10")]
    request_low: u64,
}

#[derive(Clone, PartialEq, prost::Oneof)]
enum Kind {
    #[prost(message, tag = "2")]
    Bootstrap(WireBootstrap),
    #[prost(message, tag = "3")]
    AddNode(WireAddNode),
    #[prost(string, tag = "4")]
    PromoteNode(String),
    #[prost(string, tag = "5")]
    RemoveNode(String),
    #[prost(message, tag = "6")]
    CreateQueue(WireQueue),
    #[prost(message, tag = "7")]
    UpdateQueue(WireQueue),
    #[prost(string, tag = "8")]
    DeleteQueue(String),
    #[prost(message, tag = "11")]
    CreateReplicatedQueue(WireReplicatedQueue),
    #[prost(message, tag = "12")]
    MoveReplica(WireMoveReplica),
    #[prost(message, tag = "13")]
    NoteIncarnation(WireIncarnation),
}

/// `NoteIncarnation`.
#[derive(Clone, PartialEq, Message)]
struct WireIncarnation {
    #[prost(string, tag = "1")]
    node: String,
    #[prost(fixed64, tag = "2")]
    incarnation: u64,
}

/// `MoveReplica`.
#[derive(Clone, PartialEq, Message)]
struct WireMoveReplica {
    #[prost(uint64, tag = "1")]
    shard: u64,
    #[prost(string, tag = "2")]
    from: String,
    #[prost(string, tag = "3")]
    to: String,
}

/// `CreateReplicatedQueue`: the queue (name and settings) and its shard, existing or new.
#[derive(Clone, PartialEq, Message)]
struct WireReplicatedQueue {
    #[prost(message, optional, tag = "1")]
    queue: Option<WireQueue>,
    /// An existing shard (0: a new one, on `new_replicas`).
    #[prost(uint64, tag = "2")]
    existing_shard: u64,
    #[prost(string, repeated, tag = "3")]
    new_replicas: Vec<String>,
    #[prost(bool, tag = "4")]
    dedicated: bool,
}

/// A shard in a snapshot or the durable copy (its queue count is derived from the queues).
#[derive(Clone, PartialEq, Message)]
pub(super) struct WireShard {
    #[prost(uint64, tag = "1")]
    id: u64,
    #[prost(string, repeated, tag = "2")]
    replicas: Vec<String>,
    #[prost(uint64, tag = "3")]
    epoch: u64,
    #[prost(bool, tag = "4")]
    dedicated: bool,
    /// Its replicas changed since it was made (level 3).
    #[prost(bool, tag = "5")]
    reshaped: bool,
}

#[derive(Clone, PartialEq, Message)]
struct WireBootstrap {
    #[prost(fixed64, tag = "1")]
    cluster_id_high: u64,
    #[prost(fixed64, tag = "2")]
    cluster_id_low: u64,
    #[prost(message, repeated, tag = "3")]
    nodes: Vec<WireAddNode>,
}

#[derive(Clone, PartialEq, Message)]
struct WireAddNode {
    #[prost(string, tag = "1")]
    id: String,
    #[prost(string, tag = "2")]
    client_addr: String,
    #[prost(string, tag = "3")]
    peer_addr: String,
    #[prost(bool, tag = "4")]
    learner: bool,
}

/// A queue in a command (owner set for create) or in a snapshot (owner and epoch).
#[derive(Clone, PartialEq, Message)]
pub(super) struct WireQueue {
    #[prost(string, tag = "1")]
    name: String,
    #[prost(message, optional, tag = "2")]
    settings: Option<pb::QueueConfig>,
    #[prost(string, tag = "3")]
    owner: String,
    #[prost(uint64, tag = "4")]
    epoch: u64,
    /// `UpdateQueue`: the settings it expects to replace (absent: any).
    #[prost(message, optional, tag = "5")]
    expected: Option<pb::QueueConfig>,
    /// A replicated queue's shard (0: none, replication factor 1).
    #[prost(uint64, tag = "6")]
    shard: u64,
}

#[derive(Clone, PartialEq, Message)]
pub(super) struct WireNode {
    #[prost(string, tag = "1")]
    id: String,
    #[prost(uint64, tag = "2")]
    raft_id: u64,
    #[prost(string, tag = "3")]
    client_addr: String,
    #[prost(string, tag = "4")]
    peer_addr: String,
    #[prost(bool, tag = "5")]
    learner: bool,
    #[prost(bool, tag = "6")]
    removed: bool,
    /// Its data directory's incarnation (0: none recorded; level 4).
    #[prost(fixed64, tag = "7")]
    incarnation: u64,
}

#[derive(Clone, PartialEq, Message)]
pub(super) struct WireSnapshot {
    #[prost(uint32, tag = "1")]
    version: u32,
    #[prost(bool, tag = "2")]
    bootstrapped: bool,
    #[prost(fixed64, tag = "3")]
    cluster_id_high: u64,
    #[prost(fixed64, tag = "4")]
    cluster_id_low: u64,
    #[prost(uint64, tag = "5")]
    next_raft_id: u64,
    #[prost(uint64, tag = "6")]
    next_epoch: u64,
    #[prost(uint64, tag = "7")]
    applied_index: u64,
    #[prost(message, repeated, tag = "8")]
    nodes: Vec<WireNode>,
    #[prost(message, repeated, tag = "9")]
    queues: Vec<WireQueue>,
    /// The request ids remembered, oldest first (snapshots only; the durable copy keeps one key
    /// each).
    #[prost(message, repeated, tag = "10")]
    requests: Vec<WireRequest>,
    #[prost(message, repeated, tag = "11")]
    shards: Vec<WireShard>,
    /// How many shard ids were given (the next is one more). 0 until the first shard, so a
    /// state without shards has the bytes (and digest) a level-1 release gives it.
    #[prost(uint64, tag = "12")]
    shards_made: u64,
}

/// A remembered request id and the index it applied at.
#[derive(Clone, PartialEq, Message)]
pub(super) struct WireRequest {
    #[prost(fixed64, tag = "1")]
    high: u64,
    #[prost(fixed64, tag = "2")]
    low: u64,
    #[prost(uint64, tag = "3")]
    index: u64,
}

impl WireRequest {
    pub(super) fn new(id: RequestId, index: u64) -> WireRequest {
        let (high, low) = split(id.0);
        WireRequest { high, low, index }
    }

    pub(super) fn parts(&self) -> (RequestId, u64) {
        (RequestId(join(self.high, self.low)), self.index)
    }
}

fn split(id: u128) -> (u64, u64) {
    // Truncations are the point: the high and the low 64 bits.
    ((id >> 64) as u64, id as u64)
}

fn join(high: u64, low: u64) -> u128 {
    (u128::from(high) << 64) | u128::from(low)
}

fn node_id(what: &'static str, s: String) -> Result<NodeId, MetaError> {
    NodeId::new(s).map_err(|e| MetaError::Decode {
        what,
        reason: e.to_string(),
    })
}

fn queue_name(what: &'static str, s: String) -> Result<QueueName, MetaError> {
    QueueName::new(s).map_err(|e| MetaError::Decode {
        what,
        reason: e.to_string(),
    })
}

fn add_node(n: &NewNode, learner: bool) -> WireAddNode {
    WireAddNode {
        id: n.id.to_string(),
        client_addr: n.client_addr.clone(),
        peer_addr: n.peer_addr.clone(),
        learner,
    }
}

impl MetaCommand {
    /// The level of the release that added this command's kind ([`COMMAND_LEVEL`]).
    pub fn level(&self) -> u32 {
        match self {
            MetaCommand::Bootstrap { .. }
            | MetaCommand::AddNode { .. }
            | MetaCommand::PromoteNode { .. }
            | MetaCommand::RemoveNode { .. }
            | MetaCommand::CreateQueue { .. }
            | MetaCommand::UpdateQueue { .. }
            | MetaCommand::DeleteQueue { .. } => 1,
            MetaCommand::CreateReplicatedQueue { .. } => 2,
            MetaCommand::MoveReplica { .. } => 3,
            MetaCommand::NoteIncarnation { .. } => 4,
        }
    }

    /// The command as log bytes, without a request id (applied again if proposed again).
    pub fn encode(&self) -> Vec<u8> {
        self.encode_request(None)
    }

    /// The command as log bytes carrying `request`: however many copies of these bytes
    /// commit, the first applies and the others answer [`super::MetaEvent::Repeated`].
    pub fn encode_request(&self, request: Option<RequestId>) -> Vec<u8> {
        let kind = match self {
            MetaCommand::Bootstrap { cluster_id, nodes } => {
                let (high, low) = split(cluster_id.0);
                Kind::Bootstrap(WireBootstrap {
                    cluster_id_high: high,
                    cluster_id_low: low,
                    nodes: nodes.iter().map(|n| add_node(n, false)).collect(),
                })
            }
            MetaCommand::AddNode {
                id,
                client_addr,
                peer_addr,
                learner,
            } => Kind::AddNode(add_node(
                &NewNode {
                    id: id.clone(),
                    client_addr: client_addr.clone(),
                    peer_addr: peer_addr.clone(),
                },
                *learner,
            )),
            MetaCommand::PromoteNode { id } => Kind::PromoteNode(id.to_string()),
            MetaCommand::RemoveNode { id } => Kind::RemoveNode(id.to_string()),
            MetaCommand::CreateQueue {
                name,
                settings,
                owner,
            } => Kind::CreateQueue(WireQueue {
                name: name.to_string(),
                settings: Some(settings.clone()),
                owner: owner.to_string(),
                epoch: 0,
                expected: None,
                shard: 0,
            }),
            MetaCommand::UpdateQueue {
                name,
                settings,
                expected,
            } => Kind::UpdateQueue(WireQueue {
                name: name.to_string(),
                settings: Some(settings.clone()),
                owner: String::new(),
                epoch: 0,
                expected: expected.as_deref().cloned(),
                shard: 0,
            }),
            MetaCommand::DeleteQueue { name } => Kind::DeleteQueue(name.to_string()),
            MetaCommand::CreateReplicatedQueue {
                name,
                settings,
                shard,
            } => {
                let (existing_shard, new_replicas, dedicated) = match shard {
                    ShardChoice::Existing(id) => (id.0, Vec::new(), false),
                    ShardChoice::New {
                        replicas,
                        dedicated,
                    } => (
                        0,
                        replicas.iter().map(ToString::to_string).collect(),
                        *dedicated,
                    ),
                };
                Kind::CreateReplicatedQueue(WireReplicatedQueue {
                    queue: Some(WireQueue {
                        name: name.to_string(),
                        settings: Some(settings.clone()),
                        ..WireQueue::default()
                    }),
                    existing_shard,
                    new_replicas,
                    dedicated,
                })
            }
            MetaCommand::MoveReplica { shard, from, to } => Kind::MoveReplica(WireMoveReplica {
                shard: shard.0,
                from: from.to_string(),
                to: to.to_string(),
            }),
            MetaCommand::NoteIncarnation { node, incarnation } => {
                Kind::NoteIncarnation(WireIncarnation {
                    node: node.to_string(),
                    incarnation: *incarnation,
                })
            }
        };
        let (request_high, request_low) = split(request.map_or(0, |r| r.0));
        WireCommand {
            version: COMMAND_VERSION,
            kind: Some(kind),
            request_high,
            request_low,
        }
        .encode_to_vec()
    }

    /// Log bytes back into a command; any damage, an unknown version or an invalid name is an
    /// error.
    pub fn decode(bytes: &[u8]) -> Result<MetaCommand, MetaError> {
        MetaCommand::decode_request(bytes).map(|(_, command)| command)
    }

    /// Log bytes back into a command and its request id, if it has one.
    pub fn decode_request(bytes: &[u8]) -> Result<(Option<RequestId>, MetaCommand), MetaError> {
        const WHAT: &str = "command";
        let wire = WireCommand::decode(bytes).map_err(|e| MetaError::Decode {
            what: WHAT,
            reason: e.to_string(),
        })?;
        if wire.version != COMMAND_VERSION {
            return Err(MetaError::UnsupportedVersion {
                what: WHAT,
                version: wire.version,
                supported: COMMAND_VERSION,
            });
        }
        let kind = wire.kind.ok_or_else(|| MetaError::Decode {
            what: WHAT,
            reason: "no command in the entry (a command kind of a newer release?)".to_owned(),
        })?;
        let request = match join(wire.request_high, wire.request_low) {
            0 => None,
            id => Some(RequestId(id)),
        };
        let command = match kind {
            Kind::Bootstrap(b) => MetaCommand::Bootstrap {
                cluster_id: ClusterId(join(b.cluster_id_high, b.cluster_id_low)),
                nodes: b
                    .nodes
                    .into_iter()
                    .map(|n| {
                        Ok(NewNode {
                            id: node_id(WHAT, n.id)?,
                            client_addr: n.client_addr,
                            peer_addr: n.peer_addr,
                        })
                    })
                    .collect::<Result<_, MetaError>>()?,
            },
            Kind::AddNode(n) => MetaCommand::AddNode {
                id: node_id(WHAT, n.id)?,
                client_addr: n.client_addr,
                peer_addr: n.peer_addr,
                learner: n.learner,
            },
            Kind::PromoteNode(id) => MetaCommand::PromoteNode {
                id: node_id(WHAT, id)?,
            },
            Kind::RemoveNode(id) => MetaCommand::RemoveNode {
                id: node_id(WHAT, id)?,
            },
            Kind::CreateQueue(q) => MetaCommand::CreateQueue {
                name: queue_name(WHAT, q.name)?,
                settings: q.settings.unwrap_or_default(),
                owner: node_id(WHAT, q.owner)?,
            },
            Kind::UpdateQueue(q) => MetaCommand::UpdateQueue {
                name: queue_name(WHAT, q.name)?,
                settings: q.settings.unwrap_or_default(),
                expected: q.expected.map(Box::new),
            },
            Kind::DeleteQueue(name) => MetaCommand::DeleteQueue {
                name: queue_name(WHAT, name)?,
            },
            Kind::CreateReplicatedQueue(r) => {
                let q = r.queue.ok_or_else(|| MetaError::Decode {
                    what: WHAT,
                    reason: "a replicated queue create names no queue".to_owned(),
                })?;
                let shard = match r.existing_shard {
                    0 => ShardChoice::New {
                        replicas: r
                            .new_replicas
                            .into_iter()
                            .map(|id| node_id(WHAT, id))
                            .collect::<Result<_, _>>()?,
                        dedicated: r.dedicated,
                    },
                    id => ShardChoice::Existing(ShardId(id)),
                };
                MetaCommand::CreateReplicatedQueue {
                    name: queue_name(WHAT, q.name)?,
                    settings: q.settings.unwrap_or_default(),
                    shard,
                }
            }
            Kind::MoveReplica(m) => MetaCommand::MoveReplica {
                shard: ShardId(m.shard),
                from: node_id(WHAT, m.from)?,
                to: node_id(WHAT, m.to)?,
            },
            Kind::NoteIncarnation(i) => MetaCommand::NoteIncarnation {
                node: node_id(WHAT, i.node)?,
                incarnation: i.incarnation,
            },
        };
        Ok((request, command))
    }
}

/// One node as snapshots and the durable copy store it.
pub(super) fn wire_node(id: &NodeId, n: &NodeInfo) -> WireNode {
    WireNode {
        id: id.to_string(),
        raft_id: n.raft_id.0,
        client_addr: n.client_addr.clone(),
        peer_addr: n.peer_addr.clone(),
        learner: n.role == NodeRole::Learner,
        removed: n.state == NodeState::Removed,
        incarnation: n.incarnation,
    }
}

pub(super) fn node_from_wire(
    what: &'static str,
    n: WireNode,
) -> Result<(NodeId, NodeInfo), MetaError> {
    let info = NodeInfo {
        raft_id: RaftId(n.raft_id),
        client_addr: n.client_addr,
        peer_addr: n.peer_addr,
        role: if n.learner {
            NodeRole::Learner
        } else {
            NodeRole::Voter
        },
        state: if n.removed {
            NodeState::Removed
        } else {
            NodeState::Active
        },
        incarnation: n.incarnation,
    };
    Ok((node_id(what, n.id)?, info))
}

/// One queue as snapshots and the durable copy store it.
pub(super) fn wire_queue(name: &QueueName, q: &QueueDef) -> WireQueue {
    WireQueue {
        name: name.to_string(),
        settings: Some(q.settings.clone()),
        owner: q.owner.node.to_string(),
        epoch: q.owner.epoch.get(),
        expected: None,
        shard: q.shard.map_or(0, |s| s.0),
    }
}

/// One shard as snapshots and the durable copy store it.
pub(super) fn wire_shard(id: ShardId, s: &ShardDef) -> WireShard {
    WireShard {
        id: id.0,
        replicas: s.replicas.iter().map(ToString::to_string).collect(),
        epoch: s.epoch.get(),
        dedicated: s.dedicated,
        reshaped: s.reshaped,
    }
}

/// A shard back, with no queues counted (inserting its queues counts them).
pub(super) fn shard_from_wire(
    what: &'static str,
    s: WireShard,
) -> Result<(ShardId, ShardDef), MetaError> {
    let def = ShardDef {
        replicas: s
            .replicas
            .into_iter()
            .map(|id| node_id(what, id))
            .collect::<Result<_, _>>()?,
        epoch: PlacementEpoch::new(s.epoch),
        dedicated: s.dedicated,
        reshaped: s.reshaped,
        queues: 0,
    };
    Ok((ShardId(s.id), def))
}

pub(super) fn queue_from_wire(
    what: &'static str,
    q: WireQueue,
) -> Result<(QueueName, QueueDef), MetaError> {
    let owner = Owner {
        node: node_id(what, q.owner)?,
        epoch: PlacementEpoch::new(q.epoch),
    };
    let def = QueueDef {
        settings: q.settings.unwrap_or_default(),
        owner,
        shard: (q.shard != 0).then_some(ShardId(q.shard)),
    };
    Ok((queue_name(what, q.name)?, def))
}

/// Decodes one protobuf message of the metadata's own.
pub(super) fn decode_wire<M: Message + Default>(
    what: &'static str,
    bytes: &[u8],
) -> Result<M, MetaError> {
    M::decode(bytes).map_err(|e| MetaError::Decode {
        what,
        reason: e.to_string(),
    })
}

impl MetaState {
    /// The scalars of the state, without nodes or queues (the durable copy's header).
    pub(super) fn wire_header(&self) -> WireSnapshot {
        let (high, low) = split(self.cluster_id.map_or(0, |c| c.0));
        let shards_made = self.next_shard.saturating_sub(1);
        WireSnapshot {
            version: if shards_made == 0 {
                SNAPSHOT_VERSION_NO_SHARDS
            } else {
                SNAPSHOT_VERSION
            },
            bootstrapped: self.cluster_id.is_some(),
            cluster_id_high: high,
            cluster_id_low: low,
            next_raft_id: self.next_raft_id,
            next_epoch: self.next_epoch.get(),
            applied_index: self.applied_index,
            nodes: Vec::new(),
            queues: Vec::new(),
            requests: Vec::new(),
            shards: Vec::new(),
            shards_made,
        }
    }

    /// A state with the header's scalars and no nodes or queues.
    pub(super) fn from_wire_header(
        what: &'static str,
        w: &WireSnapshot,
    ) -> Result<MetaState, MetaError> {
        if !(SNAPSHOT_VERSION_NO_SHARDS..=SNAPSHOT_VERSION).contains(&w.version) {
            return Err(MetaError::UnsupportedVersion {
                what,
                version: w.version,
                supported: SNAPSHOT_VERSION,
            });
        }
        Ok(MetaState {
            cluster_id: w
                .bootstrapped
                .then(|| ClusterId(join(w.cluster_id_high, w.cluster_id_low))),
            next_raft_id: w.next_raft_id,
            next_epoch: PlacementEpoch::new(w.next_epoch),
            next_shard: w.shards_made.saturating_add(1),
            applied_index: w.applied_index,
            ..MetaState::new()
        })
    }

    /// The whole state as bytes (for Raft snapshots).
    pub fn snapshot(&self) -> Vec<u8> {
        WireSnapshot {
            nodes: self.nodes.iter().map(|(id, n)| wire_node(id, n)).collect(),
            queues: self
                .queues
                .iter()
                .map(|(name, q)| wire_queue(name, q))
                .collect(),
            requests: self
                .requests
                .iter()
                .map(|(id, index)| WireRequest::new(id, index))
                .collect(),
            shards: self
                .shards
                .iter()
                .map(|(id, s)| wire_shard(*id, s))
                .collect(),
            ..self.wire_header()
        }
        .encode_to_vec()
    }

    /// A state from [`MetaState::snapshot`] bytes.
    pub fn restore(bytes: &[u8]) -> Result<MetaState, MetaError> {
        const WHAT: &str = "snapshot";
        let w: WireSnapshot = decode_wire(WHAT, bytes)?;
        let mut state = MetaState::from_wire_header(WHAT, &w)?;
        for n in w.nodes {
            let (id, info) = node_from_wire(WHAT, n)?;
            state.nodes.insert(id, info);
        }
        for s in w.shards {
            let (id, def) = shard_from_wire(WHAT, s)?;
            state.shards.insert(id, def);
        }
        for q in w.queues {
            let (name, def) = queue_from_wire(WHAT, q)?;
            state.insert_queue(name, def);
        }
        for r in &w.requests {
            let (id, index) = r.parts();
            state.requests.record(id, index);
        }
        state
            .check_invariants()
            .map_err(|reason| MetaError::Decode { what: WHAT, reason })?;
        Ok(state)
    }
}
