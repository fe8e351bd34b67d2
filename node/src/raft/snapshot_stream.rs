//! Snapshots between nodes: each on a `Peer.Snapshot` stream of its own, in chunks. The
//! metadata group's snapshot is its encoded message alone (its state is inside); a queue
//! shard's is its message followed by the shard's data, read by the sender from one point in
//! time of its store and staged by the receiver for the install (`shard/snapshot.rs`).

use std::collections::BTreeSet;
use std::sync::mpsc::TrySendError;
use std::sync::Arc;

use bytes::Bytes;
use ferry_kernel::{PersistOp, QueueUid};
use ferry_multiraft::{GroupId, LogPosition, NodeId as PeerId, OutSnapshot};
use ferry_proto::pb;
use ferry_store::{StoreError, StoreOp};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

use super::driver::{Input, META_GROUP};
use super::shard::{decode_position, encode_position, Staged};
use super::transport::{cluster_id_bytes, cluster_id_of, peer_endpoint, Links};
use ferry_cluster::meta::ClusterId;

/// Size of one chunk of a snapshot message on its stream.
const SNAPSHOT_CHUNK_BYTES: usize = 1024 * 1024;
/// Largest snapshot a node accepts (message and shard data): a shard's data is held in memory
/// until its install, which writes it in one batch.
const SNAPSHOT_BYTES_MAX: usize = 1024 * 1024 * 1024;
/// Chunks of a shard's data read ahead of the stream.
const CHUNKS_AHEAD: usize = 4;

/// Sends one snapshot to the peer at `addr`.
pub(crate) async fn send_snapshot_once(
    links: &Links,
    addr: &str,
    snapshot: OutSnapshot,
) -> Result<(), String> {
    let endpoint = peer_endpoint(addr).map_err(|e| e.to_string())?;
    let mut client = pb::peer_client::PeerClient::new(endpoint.connect_lazy());
    let head = message_chunks(links.sender(), &snapshot);
    if snapshot.group == META_GROUP {
        return client
            .snapshot(tokio_stream::iter(head))
            .await
            .map(|_| ())
            .map_err(|s| s.message().to_owned());
    }
    let (tx, rx) = mpsc::channel(CHUNKS_AHEAD);
    let snapshots = Arc::clone(&links.snapshots);
    let (group, at) = (snapshot.group, snapshot.position);
    let producer = tokio::task::spawn_blocking(move || -> Result<(), String> {
        let gone = || "the peer stopped reading the snapshot".to_owned();
        for chunk in head {
            tx.blocking_send(chunk).map_err(|_| gone())?;
        }
        let applied = snapshots.export(group, at, &mut |ops| {
            let entry = ferry_store::encode_entry(&ops)?;
            tx.blocking_send(shard_chunk(group, entry, vec![]))
                .map_err(|_| StoreError::Closed)
        })?;
        tx.blocking_send(shard_chunk(group, vec![], encode_position(applied)))
            .map_err(|_| gone())
    });
    let sent = client.snapshot(ReceiverStream::new(rx)).await;
    let produced = producer
        .await
        .map_err(|e| format!("reading the shard's data stopped: {e}"))?;
    // The reader's error says more than the stream's end it caused.
    produced?;
    sent.map_err(|s| s.message().to_owned())?;
    links.snapshots.count_sent();
    Ok(())
}

/// The snapshot message in chunks, the first naming the sender.
fn message_chunks(
    (from, cluster_id): (u64, Option<ClusterId>),
    snapshot: &OutSnapshot,
) -> Vec<pb::SnapshotChunk> {
    let data = &snapshot.bytes;
    (0..data.len().max(1))
        .step_by(SNAPSHOT_CHUNK_BYTES)
        .enumerate()
        .map(|(i, start)| {
            let end = (start + SNAPSHOT_CHUNK_BYTES).min(data.len());
            pb::SnapshotChunk {
                from_raft_id: if i == 0 { from } else { 0 },
                cluster_id: if i == 0 {
                    cluster_id_bytes(cluster_id)
                } else {
                    vec![]
                },
                group: snapshot.group.0,
                data: data.slice(start.min(end)..end),
                shard_ops: Bytes::new(),
                shard_applied: vec![],
            }
        })
        .collect()
}

fn shard_chunk(group: GroupId, ops: Vec<u8>, applied: Vec<u8>) -> pb::SnapshotChunk {
    pb::SnapshotChunk {
        group: group.0,
        shard_ops: ops.into(),
        shard_applied: applied,
        ..pb::SnapshotChunk::default()
    }
}

/// A shard's data as it arrives: checked op by op, so a sender can only recreate queues of the
/// shard the snapshot is for.
#[derive(Default)]
struct ShardData {
    ops: Vec<Vec<StoreOp>>,
    applied: Option<LogPosition>,
    /// The queues the data defined so far.
    queues: BTreeSet<QueueUid>,
}

impl ShardData {
    fn add(&mut self, group: GroupId, chunk: &pb::SnapshotChunk) -> Result<(), tonic::Status> {
        let invalid = |why: String| tonic::Status::invalid_argument(why);
        if self.applied.is_some() {
            return Err(invalid("shard data after its applied position".into()));
        }
        if !chunk.shard_ops.is_empty() {
            let ops = ferry_store::decode_entry(&chunk.shard_ops)
                .map_err(|e| invalid(format!("shard_ops: {e}")))?;
            for op in &ops {
                self.check(group, op).map_err(invalid)?;
            }
            self.ops.push(ops);
        }
        if !chunk.shard_applied.is_empty() {
            self.applied =
                Some(decode_position(&chunk.shard_applied).ok_or_else(|| {
                    invalid("shard_applied: 16 bytes (index, term) expected".into())
                })?);
        }
        Ok(())
    }

    /// What an export writes, for this shard's queues only.
    fn check(&mut self, group: GroupId, op: &StoreOp) -> Result<(), String> {
        match op {
            StoreOp::PutQueue(def) if def.replica.is_some_and(|r| r.shard.0 == group.0) => {
                self.queues.insert(def.uid);
                Ok(())
            }
            StoreOp::PutQueue(def) => Err(format!(
                "shard {group}'s snapshot defines queue {}, which is not in it",
                def.name
            )),
            StoreOp::Queue { uid, op } if self.queues.contains(uid) => match op {
                PersistOp::PutMessage(_)
                | PersistOp::SetDeliveryCount { .. }
                | PersistOp::MarkDelivery { .. }
                | PersistOp::ReserveSeq { .. }
                | PersistOp::PutDedup(_) => Ok(()),
                other => Err(format!(
                    "a snapshot's data only puts; it holds {}",
                    op_name(other)
                )),
            },
            StoreOp::Queue { uid, .. } => Err(format!(
                "shard {group}'s snapshot writes to queue uid {} before defining it",
                uid.0
            )),
            _ => Err("a snapshot's data holds queue definitions and their data only".into()),
        }
    }
}

fn op_name(op: &PersistOp) -> &'static str {
    match op {
        PersistOp::DeleteMessage(_) => "a message delete",
        PersistOp::DeleteStored { .. } => "a range delete",
        PersistOp::DeleteDedup { .. } => "a dedup delete",
        _ => "another op",
    }
}

/// The receiving side of `Peer.Snapshot`: reassembles the message and a shard's data (at most
/// `SNAPSHOT_BYTES_MAX`), checks the cluster id, stages a shard's data and hands the message to
/// the driver.
pub(crate) async fn receive_snapshot(
    links: &Links,
    mut stream: tonic::Streaming<pb::SnapshotChunk>,
    our_cluster: Option<ClusterId>,
) -> Result<(), tonic::Status> {
    let Some(first) = stream.message().await? else {
        return Err(tonic::Status::invalid_argument("an empty snapshot stream"));
    };
    if let (Some(ours), Some(theirs)) = (our_cluster, cluster_id_of(&first.cluster_id)?) {
        if ours != theirs {
            return Err(tonic::Status::failed_precondition(format!(
                "this node belongs to cluster {ours}, the sender to {theirs}"
            )));
        }
    }
    if first.from_raft_id == 0 {
        return Err(tonic::Status::invalid_argument(
            "from_raft_id: the sender's raft id is missing",
        ));
    }
    let (from, group) = (first.from_raft_id, GroupId(first.group));
    let mut data = bytes::BytesMut::new();
    let mut shard = ShardData::default();
    let mut received = 0usize;
    let mut next = Some(first);
    while let Some(chunk) = next {
        if chunk.group != group.0 {
            return Err(tonic::Status::invalid_argument(
                "a snapshot's chunks name one group",
            ));
        }
        received = received
            .saturating_add(chunk.data.len())
            .saturating_add(chunk.shard_ops.len());
        if received > SNAPSHOT_BYTES_MAX {
            return Err(tonic::Status::resource_exhausted(format!(
                "a snapshot over {SNAPSHOT_BYTES_MAX} bytes"
            )));
        }
        data.extend_from_slice(&chunk.data);
        shard.add(group, &chunk)?;
        next = stream.message().await?;
    }
    links.heard_from(from, None);
    stage(links, group, &data, shard)?;
    let batch = ferry_multiraft::encode_batch([(group, &data[..])]);
    match links.inputs.try_send(Input::Batch {
        from: PeerId(from),
        bytes: batch,
    }) {
        Ok(()) => Ok(()),
        Err(TrySendError::Full(_)) => Err(tonic::Status::unavailable(
            "the node is busy; send the snapshot again",
        )),
        Err(TrySendError::Disconnected(_)) => Err(tonic::Status::unavailable("node shutting down")),
    }
}

/// Keeps a shard snapshot's data for its install; the metadata's carries none.
fn stage(
    links: &Links,
    group: GroupId,
    message: &[u8],
    shard: ShardData,
) -> Result<(), tonic::Status> {
    let invalid = |why: String| tonic::Status::invalid_argument(why);
    if group == META_GROUP {
        if !shard.ops.is_empty() || shard.applied.is_some() {
            return Err(invalid(
                "the metadata group's snapshot carries no shard data".into(),
            ));
        }
        return Ok(());
    }
    let at = ferry_multiraft::snapshot_position(message)
        .ok_or_else(|| invalid(format!("shard {group}'s snapshot message does not decode")))?;
    let applied = shard.applied.ok_or_else(|| {
        invalid(format!(
            "shard {group}'s snapshot is incomplete: its data ended without shard_applied"
        ))
    })?;
    if applied.index < at.index {
        return Err(invalid(format!(
            "shard {group}'s data holds index {}, behind its snapshot's {}",
            applied.index, at.index
        )));
    }
    links.snapshots.stage(
        group,
        Staged {
            at,
            applied,
            ops: shard.ops,
        },
    );
    Ok(())
}
