//! The node's durable copy of the metadata, one key per node, per queue and per shard beside a
//! header (the scalars, with the applied index), so that applying a change writes what it changed: a queue
//! created writes that queue, its dead-letter and expiry queues and the header. When every
//! change rewrote the whole state, creating n queues one by one wrote O(n²) bytes (4 000 queues
//! left a 509 MiB data directory until compaction). Raft snapshots stay whole
//! ([`MetaState::snapshot`]).
//!
//! The shell collects what its round applied in [`Touched`] (from the [`MetaEvent`]s, which
//! name everything a command changes) and writes [`MetaState::durable_writes`] in the same
//! synced batch as the round's Raft records, so the copy and its applied index move together.

use std::collections::BTreeSet;

use ferry_kernel::{NodeId, QueueName, ShardId};
use prost::Message;

use super::codec::{
    decode_wire, node_from_wire, queue_from_wire, shard_from_wire, wire_node, wire_queue,
    wire_shard,
};
use super::command::{Applied, MetaEvent};
use super::error::MetaError;
use super::requests::RequestId;
use super::state::MetaState;

/// Every key of the durable copy starts with this; no other key does.
pub const DURABLE_PREFIX: &[u8] = b"md/";
/// The first key after every key of the durable copy (`'/' + 1`).
pub const DURABLE_END: &[u8] = b"md0";
const HEADER_KEY: &[u8] = b"md/h";
const NODE_PREFIX: &[u8] = b"md/n/";
const QUEUE_PREFIX: &[u8] = b"md/q/";
/// One key per shard (its id, 16 hex digits).
const SHARD_PREFIX: &[u8] = b"md/s/";
/// One key per remembered request id (32 hex digits), its index as the value (8 bytes, big
/// endian).
const REQUEST_PREFIX: &[u8] = b"md/r/";

/// One write to the durable copy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DurableWrite {
    /// Every key of the copy goes (before the whole state is written again).
    Clear,
    /// Sets a key.
    Put {
        /// The key.
        key: Vec<u8>,
        /// Its value.
        value: Vec<u8>,
    },
    /// Removes a key.
    Delete {
        /// The key.
        key: Vec<u8>,
    },
}

/// What applied entries changed, for [`MetaState::durable_writes`].
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Touched {
    nodes: BTreeSet<NodeId>,
    queues: BTreeSet<QueueName>,
    shards: BTreeSet<ShardId>,
    requests: BTreeSet<RequestId>,
    everything: bool,
    header: bool,
}

impl Touched {
    /// Notes what an applied entry changed: its command's event and the request ids.
    pub fn note_applied(&mut self, applied: &Applied) {
        self.note(&applied.event);
        self.requests.extend(applied.recorded);
        self.requests.extend(applied.evicted);
    }

    /// Notes what an applied command changed.
    pub fn note(&mut self, event: &MetaEvent) {
        self.header = true;
        match event {
            MetaEvent::Bootstrapped { voters, .. } => {
                self.nodes.extend(voters.iter().map(|(id, _)| id.clone()));
            }
            MetaEvent::NodeAdded { id, .. }
            | MetaEvent::NodePromoted { id, .. }
            | MetaEvent::NodeRemoved { id, .. }
            | MetaEvent::IncarnationNoted { node: id, .. } => {
                self.nodes.insert(id.clone());
            }
            MetaEvent::QueuesCreated { queues } => {
                self.queues
                    .extend(queues.iter().map(|(name, _)| name.clone()));
            }
            MetaEvent::QueueUpdated { name, created, .. } => {
                self.queues.insert(name.clone());
                self.queues
                    .extend(created.iter().map(|(name, _)| name.clone()));
            }
            MetaEvent::ReplicatedQueuesCreated { shard, queues, .. } => {
                self.shards.insert(*shard);
                self.queues
                    .extend(queues.iter().map(|(name, _)| name.clone()));
            }
            MetaEvent::QueueDeleted {
                name,
                removed_shard,
                ..
            } => {
                self.queues.insert(name.clone());
                self.shards.extend(*removed_shard);
            }
            MetaEvent::ReplicaMoved {
                shard,
                owners_moved,
                ..
            } => {
                self.shards.insert(*shard);
                self.queues.extend(owners_moved.iter().cloned());
            }
            MetaEvent::Nothing | MetaEvent::Repeated { .. } => {}
        }
    }

    /// Notes an entry applied that changed nothing but the applied index (a refused command, a
    /// configuration change).
    pub fn note_index(&mut self) {
        self.header = true;
    }

    /// Everything is to be written again: a snapshot was installed, or the copy is in an
    /// earlier release's form.
    pub fn everything(&mut self) {
        self.everything = true;
    }

    /// Whether there is nothing to write.
    pub fn is_empty(&self) -> bool {
        !self.everything && !self.header
    }
}

fn shard_key(id: ShardId) -> Vec<u8> {
    key(SHARD_PREFIX, &format!("{:016x}", id.0))
}

fn request_key(id: RequestId) -> Vec<u8> {
    key(REQUEST_PREFIX, &id.to_string())
}

fn key(prefix: &[u8], name: &str) -> Vec<u8> {
    let mut key = Vec::with_capacity(prefix.len() + name.len());
    key.extend_from_slice(prefix);
    key.extend_from_slice(name.as_bytes());
    key
}

impl MetaState {
    /// The writes that bring the durable copy in step with this state for what `touched`
    /// names; nothing when it names nothing.
    pub fn durable_writes(&self, touched: &Touched) -> Vec<DurableWrite> {
        if touched.is_empty() {
            return Vec::new();
        }
        let mut writes = Vec::new();
        let (nodes, queues, requests): (Vec<&NodeId>, Vec<&QueueName>, Vec<RequestId>) =
            if touched.everything {
                writes.push(DurableWrite::Clear);
                (
                    self.nodes.keys().collect(),
                    self.queues.keys().collect(),
                    self.requests.iter().map(|(id, _)| id).collect(),
                )
            } else {
                (
                    touched.nodes.iter().collect(),
                    touched.queues.iter().collect(),
                    touched.requests.iter().copied().collect(),
                )
            };
        writes.push(DurableWrite::Put {
            key: HEADER_KEY.to_vec(),
            value: self.wire_header().encode_to_vec(),
        });
        writes.extend(nodes.into_iter().map(|id| {
            let value = self.nodes.get(id).map(|n| wire_node(id, n).encode_to_vec());
            put_or_delete(key(NODE_PREFIX, id.as_str()), value)
        }));
        writes.extend(queues.into_iter().map(|name| {
            let value = self
                .queues
                .get(name)
                .map(|q| wire_queue(name, q).encode_to_vec());
            put_or_delete(key(QUEUE_PREFIX, name.as_str()), value)
        }));
        let shards: Vec<ShardId> = if touched.everything {
            self.shards.keys().copied().collect()
        } else {
            touched.shards.iter().copied().collect()
        };
        writes.extend(shards.into_iter().map(|id| {
            let value = self
                .shards
                .get(&id)
                .map(|s| wire_shard(id, s).encode_to_vec());
            put_or_delete(shard_key(id), value)
        }));
        writes.extend(requests.into_iter().map(|id| {
            let value = self
                .requests
                .applied_at(id)
                .map(|i| i.to_be_bytes().to_vec());
            put_or_delete(request_key(id), value)
        }));
        writes
    }

    /// The state from the durable copy's keys (every key starting with [`DURABLE_PREFIX`], in
    /// any order); `None` when there is no copy (no header).
    pub fn from_durable(items: &[(Vec<u8>, Vec<u8>)]) -> Result<Option<MetaState>, MetaError> {
        const WHAT: &str = "durable metadata";
        let Some((_, header)) = items.iter().find(|(k, _)| k.as_slice() == HEADER_KEY) else {
            return Ok(None);
        };
        let mut state = MetaState::from_wire_header(WHAT, &decode_wire(WHAT, header)?)?;
        // Shards first, so that inserting their queues counts them.
        for (key, value) in items {
            if key.starts_with(SHARD_PREFIX) {
                let (id, def) = shard_from_wire(WHAT, decode_wire(WHAT, value)?)?;
                if key != &shard_key(id) {
                    return Err(MetaError::Decode {
                        what: WHAT,
                        reason: format!("{id} under key {:?}", String::from_utf8_lossy(key)),
                    });
                }
                state.shards.insert(id, def);
            }
        }
        for (key, value) in items {
            if key.starts_with(NODE_PREFIX) {
                let (id, info) = node_from_wire(WHAT, decode_wire(WHAT, value)?)?;
                state.nodes.insert(id, info);
            } else if key.starts_with(QUEUE_PREFIX) {
                let (name, def) = queue_from_wire(WHAT, decode_wire(WHAT, value)?)?;
                state.insert_queue(name, def);
            } else if let Some(id) = key.strip_prefix(REQUEST_PREFIX) {
                let (id, index) =
                    request_from_durable(id, value).ok_or_else(|| MetaError::Decode {
                        what: WHAT,
                        reason: format!("damaged request key {:?}", String::from_utf8_lossy(key)),
                    })?;
                state.requests.record(id, index);
            } else if key.as_slice() != HEADER_KEY && !key.starts_with(SHARD_PREFIX) {
                return Err(MetaError::Decode {
                    what: WHAT,
                    reason: format!("unknown key {:?}", String::from_utf8_lossy(key)),
                });
            }
        }
        state
            .check_invariants()
            .map_err(|reason| MetaError::Decode { what: WHAT, reason })?;
        Ok(Some(state))
    }
}

/// A request key's id (hex) and value (index) back.
fn request_from_durable(id: &[u8], value: &[u8]) -> Option<(RequestId, u64)> {
    let id = u128::from_str_radix(std::str::from_utf8(id).ok()?, 16).ok()?;
    let index = u64::from_be_bytes(value.try_into().ok()?);
    Some((RequestId(id), index))
}

/// The write that leaves `key` holding `value`, or absent.
fn put_or_delete(key: Vec<u8>, value: Option<Vec<u8>>) -> DurableWrite {
    match value {
        Some(value) => DurableWrite::Put { key, value },
        None => DurableWrite::Delete { key },
    }
}
