//! Raft between nodes: one long-lived `Peer.Raft` stream from this node to each peer, carrying
//! the engine's batches (opaque bytes) and, on an idle link, probes; the server side of that
//! stream; and liveness (when each peer was last heard from).

use std::collections::HashMap;
use std::sync::mpsc::{SyncSender, TrySendError};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use bytes::Bytes;
use ferry_multiraft::{NodeId as PeerId, OutSnapshot};
use ferry_proto::pb;
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::Endpoint;

use super::driver::{Input, Outbound};
use super::shard::ShardSnapshots;
use super::snapshot_stream::send_snapshot_once;
use ferry_cluster::meta::{ClusterId, COMMAND_LEVEL};

/// Batches waiting for one peer's stream; past this, new ones are dropped (Raft sends again).
const LINK_QUEUE_MAX: usize = 256;
/// The longest wait between two connection attempts to a peer.
const RECONNECT_DELAY_MAX: Duration = Duration::from_secs(2);
/// Largest batch accepted on the stream.
pub(crate) const BATCH_BYTES_MAX: usize = 64 * 1024 * 1024;

/// The outgoing streams, one per peer, and what they share.
pub(crate) struct Links {
    links: Mutex<HashMap<PeerId, Link>>,
    pub(crate) inputs: SyncSender<Input>,
    runtime: tokio::runtime::Handle,
    /// Stamped on every batch sent: this node's raft id and cluster id.
    sender: Mutex<(u64, Option<ClusterId>)>,
    probe_interval: Duration,
    /// What each peer last told this node, by raft id.
    heard: Mutex<HashMap<u64, Heard>>,
    /// Told when a peer reports a command level it had not reported before (its first word).
    pub(crate) level_learned: tokio::sync::Notify,
    /// This node's data directory, stamped on every batch (`NodeSettings::incarnation`).
    incarnation: u64,
    /// Set when a peer refused this node's batches for running on another data directory than
    /// the one the cluster recorded for it: why (the node stops, see `MetaNode::halted`).
    pub(crate) refused: watch::Sender<Option<String>>,
    /// Bytes of messages this node's queues hold, stamped on every batch.
    local_bytes: std::sync::atomic::AtomicU64,
    /// Where a queue shard's snapshot data is read from, and a received one kept.
    pub(crate) snapshots: Arc<ShardSnapshots>,
}

/// The last word from a peer: any batch or probe.
#[derive(Debug, Clone, Copy)]
struct Heard {
    at: Instant,
    /// What it last reported.
    report: Report,
}

/// What a peer reports on every batch and probe.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Report {
    /// The bytes its queues held.
    pub(crate) stored_bytes: u64,
    /// The newest metadata command kinds its release reads ([`COMMAND_LEVEL`]).
    pub(crate) command_level: u32,
    /// Its data directory (0: a release that does not say).
    pub(crate) incarnation: u64,
}

struct Link {
    addr: String,
    tx: mpsc::Sender<Bytes>,
    /// A snapshot is on its way to this peer: another one is dropped meanwhile (the leader
    /// sends a new one if the peer still needs it).
    snapshot_in_flight: Arc<std::sync::atomic::AtomicBool>,
}

impl Links {
    pub(crate) fn new(
        inputs: SyncSender<Input>,
        runtime: tokio::runtime::Handle,
        probe_interval: Duration,
        snapshots: Arc<ShardSnapshots>,
        incarnation: u64,
    ) -> Self {
        Links {
            links: Mutex::new(HashMap::new()),
            inputs,
            runtime,
            sender: Mutex::new((0, None)),
            probe_interval,
            heard: Mutex::new(HashMap::new()),
            level_learned: tokio::sync::Notify::new(),
            incarnation,
            refused: watch::channel(None).0,
            local_bytes: std::sync::atomic::AtomicU64::new(0),
            snapshots,
        }
    }

    /// Queues a batch for `to`; dropped if there is no link to it or its queue is full (Raft
    /// retransmits what matters). Called from the driver's thread: never blocks.
    pub(crate) fn send(&self, to: PeerId, bytes: Bytes) {
        let links = self.links.lock().unwrap_or_else(PoisonError::into_inner);
        match links.get(&to) {
            Some(link) => {
                if link.tx.try_send(bytes).is_err() {
                    tracing::debug!(to = to.0, "peer link full; Raft batch dropped");
                }
            }
            None => tracing::debug!(to = to.0, "no link to this peer yet; Raft batch dropped"),
        }
    }

    /// Sends a snapshot to its peer on a stream of its own, in chunks. Called from the
    /// driver's thread: never blocks.
    pub(crate) fn send_snapshot(self: &Arc<Self>, snapshot: OutSnapshot) {
        use std::sync::atomic::Ordering;
        let (addr, in_flight) = {
            let links = self.links.lock().unwrap_or_else(PoisonError::into_inner);
            let Some(link) = links.get(&snapshot.to) else {
                tracing::debug!(
                    to = snapshot.to.0,
                    "no link to this peer yet; snapshot dropped"
                );
                return;
            };
            (link.addr.clone(), Arc::clone(&link.snapshot_in_flight))
        };
        if in_flight.swap(true, Ordering::AcqRel) {
            tracing::debug!(
                to = snapshot.to.0,
                "a snapshot is already on its way; this one dropped"
            );
            return;
        }
        let links = Arc::clone(self);
        self.runtime.spawn(async move {
            let to = snapshot.to;
            let bytes = snapshot.bytes.len();
            match send_snapshot_once(&links, &addr, snapshot).await {
                Ok(()) => tracing::info!(to = to.0, bytes, "snapshot sent"),
                Err(why) => {
                    tracing::warn!(to = to.0, %addr, %why, "snapshot not sent");
                    let _ = links.inputs.try_send(Input::Unreachable(to));
                }
            }
            in_flight.store(false, Ordering::Release);
        });
    }

    /// Sets who this node is on the wire.
    pub(crate) fn set_sender(&self, raft_id: u64, cluster_id: Option<ClusterId>) {
        *self.sender.lock().unwrap_or_else(PoisonError::into_inner) = (raft_id, cluster_id);
    }

    pub(crate) fn sender(&self) -> (u64, Option<ClusterId>) {
        *self.sender.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Keeps one link per peer in `peers` (raft id → peer address), starting new ones and
    /// ending those of peers no longer listed or moved.
    pub(crate) fn update(self: &Arc<Self>, peers: &HashMap<PeerId, String>) {
        let mut links = self.links.lock().unwrap_or_else(PoisonError::into_inner);
        links.retain(|id, link| peers.get(id) == Some(&link.addr));
        for (id, addr) in peers {
            if links.contains_key(id) {
                continue;
            }
            let (tx, rx) = mpsc::channel(LINK_QUEUE_MAX);
            links.insert(
                *id,
                Link {
                    addr: addr.clone(),
                    tx,
                    snapshot_in_flight: Arc::default(),
                },
            );
            let me = Arc::clone(self);
            self.runtime.spawn(run_link(me, *id, addr.clone(), rx));
        }
    }

    /// Ends every link.
    pub(crate) fn close(&self) {
        self.links
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clear();
    }

    /// Notes a word from `raft_id`, with its report when it sent one (a snapshot does not).
    pub(crate) fn heard_from(&self, raft_id: u64, report: Option<Report>) {
        let mut heard = self.heard.lock().unwrap_or_else(PoisonError::into_inner);
        let kept = heard.get(&raft_id).map(|h| h.report);
        let report = report.or(kept).unwrap_or(Report {
            stored_bytes: 0,
            command_level: 0,
            incarnation: 0,
        });
        heard.insert(
            raft_id,
            Heard {
                at: Instant::now(),
                report,
            },
        );
        drop(heard);
        if kept.map(|k| k.command_level) != Some(report.command_level) {
            self.level_learned.notify_waiters();
        }
    }

    fn last_word(&self, raft_id: u64) -> Option<Heard> {
        self.heard
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&raft_id)
            .copied()
    }

    /// Sets the bytes this node reports to its peers.
    pub(crate) fn set_local_bytes(&self, bytes: u64) {
        self.local_bytes
            .store(bytes, std::sync::atomic::Ordering::Relaxed);
    }

    /// The bytes this node reports.
    pub(crate) fn local_bytes(&self) -> u64 {
        self.local_bytes.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// The bytes `raft_id` last reported, if any.
    pub(crate) fn peer_bytes(&self, raft_id: u64) -> Option<u64> {
        self.last_word(raft_id).map(|h| h.report.stored_bytes)
    }

    /// The command level `raft_id` last reported (0: not heard from on a batch yet).
    pub(crate) fn peer_command_level(&self, raft_id: u64) -> u32 {
        self.last_word(raft_id)
            .map_or(0, |h| h.report.command_level)
    }

    /// The data directory `raft_id` last reported running on (0: not heard from, or a release
    /// that does not say).
    pub(crate) fn peer_incarnation(&self, raft_id: u64) -> u64 {
        self.last_word(raft_id).map_or(0, |h| h.report.incarnation)
    }

    /// How long ago `raft_id` was last heard from, if ever.
    pub(crate) fn last_heard(&self, raft_id: u64) -> Option<Duration> {
        self.last_word(raft_id).map(|h| h.at.elapsed())
    }

    /// Whether `raft_id` was heard from within `timeout` (liveness).
    pub(crate) fn is_up(&self, raft_id: u64, timeout: Duration) -> bool {
        self.last_heard(raft_id).is_some_and(|h| h <= timeout)
    }

    fn batch(&self, bytes: Bytes) -> pb::RaftBatch {
        let (from, cluster_id) = self.sender();
        pb::RaftBatch {
            from_raft_id: from,
            cluster_id: cluster_id_bytes(cluster_id),
            batch: bytes,
            stored_bytes: self.local_bytes(),
            command_level: COMMAND_LEVEL,
            incarnation: self.incarnation,
        }
    }
}

/// Channel to a peer's listener with keepalive, so a dead peer is noticed within seconds.
pub(crate) fn peer_endpoint(addr: &str) -> Result<Endpoint, tonic::transport::Error> {
    Ok(Endpoint::from_shared(format!("http://{addr}"))?
        .connect_timeout(Duration::from_secs(1))
        .http2_keep_alive_interval(Duration::from_secs(1))
        .keep_alive_timeout(Duration::from_secs(2))
        .keep_alive_while_idle(true)
        .tcp_nodelay(true))
}

/// Sends `to`'s batches on one stream, reconnecting after a failure with a growing delay, until
/// the link is dropped.
async fn run_link(links: Arc<Links>, to: PeerId, addr: String, mut rx: mpsc::Receiver<Bytes>) {
    let mut delay = Duration::from_millis(100);
    loop {
        match stream_once(&links, &addr, &mut rx).await {
            StreamEnd::LinkDropped => return,
            StreamEnd::Failed(why) => {
                tracing::debug!(to = to.0, %addr, %why, "Raft stream to peer ended");
                if let Err(TrySendError::Disconnected(_)) =
                    links.inputs.try_send(Input::Unreachable(to))
                {
                    return;
                }
            }
        }
        let wait = tokio::time::sleep(delay);
        tokio::pin!(wait);
        loop {
            tokio::select! {
                () = &mut wait => break,
                // Batches queued meanwhile are stale by the time a stream is back.
                got = rx.recv() => if got.is_none() { return },
            }
        }
        delay = (delay * 2).min(RECONNECT_DELAY_MAX);
    }
}

enum StreamEnd {
    LinkDropped,
    Failed(String),
}

async fn stream_once(links: &Links, addr: &str, rx: &mut mpsc::Receiver<Bytes>) -> StreamEnd {
    let endpoint = match peer_endpoint(addr) {
        Ok(e) => e,
        Err(e) => return StreamEnd::Failed(e.to_string()),
    };
    let mut client = pb::peer_client::PeerClient::new(endpoint.connect_lazy())
        .max_encoding_message_size(BATCH_BYTES_MAX);
    let (tx, stream) = mpsc::channel::<pb::RaftBatch>(LINK_QUEUE_MAX);
    // The first message opens the stream (and tells the peer this node is alive).
    let _ = tx.try_send(links.batch(Bytes::new()));
    let call = client.raft(ReceiverStream::new(stream));
    tokio::pin!(call);
    let mut probe = tokio::time::interval(links.probe_interval);
    probe.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut last_sent = Instant::now();
    loop {
        tokio::select! {
            ended = &mut call => {
                return StreamEnd::Failed(match ended {
                    Ok(_) => "closed by the peer".to_owned(),
                    Err(status) => {
                        if status.metadata().contains_key(OTHER_INCARNATION_KEY) {
                            let why = format!("a peer refused this node: {}", status.message());
                            links.refused.send_replace(Some(why));
                        }
                        status.message().to_owned()
                    }
                });
            }
            got = rx.recv() => {
                let Some(bytes) = got else { return StreamEnd::LinkDropped };
                if tx.try_send(links.batch(bytes)).is_err() {
                    tracing::debug!(%addr, "Raft stream backed up; batch dropped");
                }
                last_sent = Instant::now();
            }
            _ = probe.tick() => {
                // A busy link needs no probe: its batches tell the peer this node is alive.
                if last_sent.elapsed() >= links.probe_interval {
                    let _ = tx.try_send(links.batch(Bytes::new()));
                    last_sent = Instant::now();
                }
            }
        }
    }
}

/// Whether this node (of cluster `ours`, once formed) takes a batch from raft id `from` that
/// names cluster `theirs`: another cluster's is refused; one naming none only from a member
/// (an initial voter or an added node that has not applied its cluster's first entry yet;
/// dropping its messages could leave a majority unable to elect). A sender that names no
/// cluster and is no member here is refused: a node of another cluster, wiped and started
/// anew, must not reach this group with a raft id that happens to match.
pub(crate) fn admit(
    ours: Option<ClusterId>,
    theirs: Option<ClusterId>,
    from: u64,
    is_member: impl Fn(u64) -> bool,
) -> Result<(), tonic::Status> {
    match (ours, theirs) {
        (Some(ours), Some(theirs)) if ours != theirs => Err(tonic::Status::failed_precondition(format!(
            "this node belongs to cluster {ours}, the sender to {theirs}; a node of another cluster is refused (wipe its data directory to join this one)"
        ))),
        (Some(ours), None) if from != 0 && !is_member(from) => {
            Err(tonic::Status::failed_precondition(format!(
                "raft id {from} names no cluster and is no member of cluster {ours}; add the node with `ferry node add` on a member"
            )))
        }
        _ => Ok(()),
    }
}

/// The metadata key of a refusal for running on another data directory than the one the
/// cluster recorded (see [`admit_incarnation`]).
pub(crate) const OTHER_INCARNATION_KEY: &str = "ferry-other-incarnation";

/// Whether this node takes a batch from `node` (raft id `from`) stamped with `sent`, the
/// cluster having recorded `recorded` for it: refused when both are known and differ. The node
/// lost its disk (or ran in memory) and came back empty under its old identity: its vote could
/// elect a leader missing entries it had acknowledged.
pub(crate) fn admit_incarnation(
    from: u64,
    node: &ferry_kernel::NodeId,
    recorded: u64,
    sent: u64,
) -> Result<(), tonic::Status> {
    if recorded == 0 || sent == 0 || recorded == sent {
        return Ok(());
    }
    let mut status = tonic::Status::failed_precondition(format!(
        "node {node} (raft id {from}) runs on data directory {sent:016x}, but the cluster knows it on {recorded:016x}: its disk was lost or replaced (or it ran in memory), and it may not come back empty under its old identity. Move its shard replicas off it (`ferry shard move-replica --from {node}`) and remove it (`ferry node remove {node}`); then empty its data directory again, start it with --join (not its initial list) and add it again (`ferry node add {node}`): it comes back under a new raft id"
    ));
    status.metadata_mut().insert(
        OTHER_INCARNATION_KEY,
        tonic::metadata::MetadataValue::from_static("1"),
    );
    Err(status)
}

/// The receiving side of `Peer.Raft`: checks each batch's sender with `admits` (raft id, the
/// cluster it names, its incarnation; see [`admit`] and [`admit_incarnation`]), notes liveness, hands batches to the driver. Ends when the
/// peer closes the stream, a batch is refused, or this node shuts down.
pub(crate) async fn receive_stream(
    links: &Links,
    mut stream: tonic::Streaming<pb::RaftBatch>,
    admits: impl Fn(u64, Option<ClusterId>, u64) -> Result<(), tonic::Status>,
    mut shutdown: watch::Receiver<bool>,
) -> Result<(), tonic::Status> {
    loop {
        let batch = tokio::select! {
            got = stream.message() => match got? {
                Some(batch) => batch,
                None => return Ok(()),
            },
            _ = shutdown.wait_for(|stopping| *stopping) => {
                return Err(tonic::Status::unavailable("node shutting down"));
            }
        };
        admits(
            batch.from_raft_id,
            cluster_id_of(&batch.cluster_id)?,
            batch.incarnation,
        )?;
        if batch.from_raft_id == 0 {
            continue;
        }
        let report = Report {
            stored_bytes: batch.stored_bytes,
            // An earlier release does not report one: it reads the first kinds.
            command_level: batch.command_level.max(1),
            incarnation: batch.incarnation,
        };
        links.heard_from(batch.from_raft_id, Some(report));
        if batch.batch.is_empty() {
            continue;
        }
        let input = Input::Batch {
            from: PeerId(batch.from_raft_id),
            bytes: batch.batch,
        };
        match links.inputs.try_send(input) {
            Ok(()) | Err(TrySendError::Full(_)) => {}
            Err(TrySendError::Disconnected(_)) => {
                return Err(tonic::Status::unavailable("node shutting down"));
            }
        }
    }
}

/// A cluster id from the wire: empty is none, 16 bytes is one, anything else is refused.
pub(crate) fn cluster_id_of(bytes: &[u8]) -> Result<Option<ClusterId>, tonic::Status> {
    match bytes.len() {
        0 => Ok(None),
        16 => {
            let mut b = [0u8; 16];
            b.copy_from_slice(bytes);
            Ok(Some(ClusterId(u128::from_be_bytes(b))))
        }
        n => Err(tonic::Status::invalid_argument(format!(
            "cluster_id has {n} bytes; it has 16, or none"
        ))),
    }
}

/// A cluster id for the wire.
pub(crate) fn cluster_id_bytes(id: Option<ClusterId>) -> Vec<u8> {
    id.map(|c| c.0.to_be_bytes().to_vec()).unwrap_or_default()
}

/// The driver's [`Outbound`]: the node's peer links, shared with the rest of the node.
pub(crate) struct SharedLinks(pub(crate) Arc<Links>);

impl Outbound for SharedLinks {
    fn send(&self, to: PeerId, bytes: Bytes) {
        self.0.send(to, bytes);
    }

    fn send_snapshot(&self, snapshot: OutSnapshot) {
        self.0.send_snapshot(snapshot);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_batch_naming_no_cluster_is_taken_only_from_a_member() {
        let ours = Some(ClusterId(7));
        let members = |raft_id: u64| raft_id <= 3;
        // Before this node is formed it takes anything (it learns its cluster from the log).
        assert!(admit(None, None, 9, members).is_ok());
        assert!(admit(None, Some(ClusterId(8)), 9, members).is_ok());
        // Formed: its own cluster from anyone it knows of, another cluster never.
        assert!(admit(ours, ours, 2, members).is_ok());
        let other = admit(ours, Some(ClusterId(8)), 2, members).unwrap_err();
        assert_eq!(other.code(), tonic::Code::FailedPrecondition);
        // No cluster named: a member that has not applied its first entry yet is taken, a
        // stranger is refused, saying how to add it.
        assert!(admit(ours, None, 3, members).is_ok());
        let stranger = admit(ours, None, 4, members).unwrap_err();
        assert_eq!(stranger.code(), tonic::Code::FailedPrecondition);
        assert!(
            stranger.message().contains("ferry node add"),
            "{stranger:?}"
        );
        // A batch without a sender (liveness only) is not judged by its raft id.
        assert!(admit(ours, None, 0, members).is_ok());
    }

    #[test]
    fn a_member_back_on_another_data_directory_is_refused_saying_what_to_do() {
        let c = ferry_kernel::NodeId::new("c").unwrap();
        // Nothing recorded yet, an earlier release that does not say, or the one recorded.
        assert!(admit_incarnation(3, &c, 0, 0xaa).is_ok());
        assert!(admit_incarnation(3, &c, 0xaa, 0).is_ok());
        assert!(admit_incarnation(3, &c, 0xaa, 0xaa).is_ok());
        let lost = admit_incarnation(3, &c, 0xaa, 0xbb).unwrap_err();
        assert_eq!(lost.code(), tonic::Code::FailedPrecondition);
        assert!(lost.metadata().contains_key(OTHER_INCARNATION_KEY));
        for hint in ["disk was lost", "move-replica --from c", "node remove c"] {
            assert!(lost.message().contains(hint), "{hint}: {lost:?}");
        }
    }
}
