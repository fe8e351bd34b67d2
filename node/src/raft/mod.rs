//! The metadata group on a running node: the async shell around the Raft engine and the
//! metadata state machine ([`crate::meta`]).
//!
//! [`MetaNode::start`] reads the Raft records from the node's store ([`NodeLogStore`]), starts the engine's thread (`driver.rs`),
//! the links to the other nodes (`transport.rs`) and a task that follows every applied change:
//! it keeps the links pointed at the current nodes and carries queue creations and deletions out
//! on the local back-end ([`QueueHost`]). The node assembly publishes [`MetaNode::view`] to the
//! front-end's router, mounts [`MetaNode::peer_service`] on the peer listener and
//! [`MetaNode::cluster_service`] on the client listener.
//!
//! How a node starts (see [`StartMode`]): a node with Raft state resumes it; otherwise a node
//! with `initial_cluster` (or none: a one-node cluster) bootstraps group 0 with the listed
//! voters, and the first leader proposes `Bootstrap` with a new random cluster id; a node with
//! `join` waits, serving only its peer listener, until an admin adds it (`ferry node add`), then
//! follows the leader.

mod driver;
mod host;
mod incarnation;
mod log_store;
mod machine;
mod machines;
mod propose;
mod reach;
mod service;
mod shard;
#[cfg(test)]
mod sim;
mod snapshot_stream;
#[cfg(test)]
mod test_host;
#[cfg(test)]
mod tests;
mod transport;
mod view;

use std::collections::HashMap;
use std::sync::mpsc::{sync_channel, Receiver, SyncSender};
use std::sync::Arc;
use std::time::Duration;

use ferry_cluster::StartMode;
use ferry_kernel::NodeId;
use ferry_multiraft::{DriverConfig, LogStore, NodeId as PeerId};
use tokio::sync::watch;

pub use driver::META_GROUP;
pub use host::{HeldQueue, QueueHost};
pub use log_store::NodeLogStore;
pub use propose::{meta_status, CreatedQueue, UpdatedQueue, IMPORT_MARKER};
pub use reach::utc_text;
pub(crate) use shard::LocalShard;
use shard::ShardSnapshots;
use view::RaftCounters;
pub use view::{MetaView, RaftMetrics};

use driver::{Driver, Input, Start, META_KEY};
pub(crate) use driver::{IDENTITY_KEY, INCARNATION_KEY};
use transport::Links;

use ferry_cluster::meta::{bootstrap_raft_ids, MetaState, RaftId, DURABLE_PREFIX};

/// How often a node counts the bytes its queues hold (reported to the peers on the links).
const BYTES_COUNT_INTERVAL: Duration = Duration::from_secs(2);

/// How long a one-node cluster may take to form before the node serves anyway.
const ALONE_FORM_WAIT: Duration = Duration::from_secs(5);

/// Inputs queued for the driver before senders drop new ones.
const INPUT_QUEUE_MAX: usize = 8192;

/// What a node's metadata group needs to start.
#[derive(Debug, Clone)]
pub struct NodeSettings {
    /// This node.
    pub node_id: NodeId,
    /// Where clients reach this node (`host:port`), recorded in the metadata.
    pub client_addr: String,
    /// Where peers reach this node (`host:port`), recorded in the metadata.
    pub peer_addr: String,
    /// Used when the store is empty.
    pub start: StartMode,
    /// One Raft tick; elections take 10-20 ticks, heartbeats every 2.
    pub tick: Duration,
    /// A peer not heard from for this long is shown down.
    pub liveness_timeout: Duration,
    /// An idle link sends a probe this often.
    pub probe_interval: Duration,
    /// Set while queues held by the back-end before this node ever had metadata are to be
    /// proposed into the new cluster's metadata, owned here (the upgrade from a single-node data
    /// directory): the file whose presence says so, removed once they are.
    pub import_marker: Option<std::path::PathBuf>,
    /// The node's store, which the queue shards' snapshots this node sends are read from
    /// (`None`: it sends none; a replica that needs one waits for another leader).
    pub shard_data: Option<Arc<dyn ferry_store::QueueStore>>,
    /// The data directory's incarnation (`crate::data_dir::incarnation`), stamped on every Raft
    /// batch this node sends (0: none, as an earlier release).
    pub incarnation: u64,
}

/// Why the metadata group could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// The Raft records in the node's store could not be read.
    #[error("the Raft records in the node's store: {0}")]
    Store(ferry_multiraft::Error),
    /// The stored metadata does not decode.
    #[error("the stored cluster metadata is unreadable: {0}")]
    Metadata(#[from] ferry_cluster::meta::MetaError),
    /// `initial_cluster` does not name this node, or names a node twice.
    #[error("cluster.initial: {0}")]
    InitialCluster(String),
    /// `join` names no reachable member.
    #[error("cluster.join = {addr:?}: {reason}")]
    Join {
        /// The address.
        addr: String,
        /// What went wrong and what to do.
        reason: String,
    },
    /// The engine's thread could not start.
    #[error("cannot start the metadata thread: {0}")]
    Thread(std::io::Error),
}

/// The running metadata group of a node. Cheap to clone.
#[derive(Clone)]
pub struct MetaNode {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for MetaNode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MetaNode")
            .field("node_id", &self.shared.settings.node_id)
            .finish()
    }
}

pub(crate) struct Shared {
    settings: NodeSettings,
    inputs: SyncSender<Input>,
    view: watch::Receiver<Arc<MetaView>>,
    links: Arc<Links>,
    host: Arc<dyn QueueHost>,
    /// Raft id → peer address of the nodes to talk to before the metadata names them: the
    /// initial voters, or the members a joining node learned of.
    early_peers: std::sync::Mutex<HashMap<PeerId, String>>,
    counters: Arc<RaftCounters>,
    shutdown_tx: watch::Sender<bool>,
    shutdown: watch::Receiver<bool>,
    thread: std::sync::Mutex<Option<std::thread::JoinHandle<()>>>,
    /// The node's tasks (following the metadata, counting bytes, bootstrapping...): stopped and
    /// waited for by [`MetaNode::stop`], so that nothing of the node (its store included)
    /// outlives it.
    tasks: std::sync::Mutex<Vec<tokio::task::JoinHandle<()>>>,
    /// Why the driver's thread ended by itself (a failed write, an entry it cannot apply, a
    /// panic), once it has.
    halted: watch::Receiver<Option<String>>,
    /// When this node first asked whether each node is reachable ([`MetaNode::is_reachable`]):
    /// a node never heard from is given the liveness timeout from then, so a node that just
    /// started does not find every peer unreachable.
    first_asked: std::sync::Mutex<HashMap<NodeId, std::time::Instant>>,
    /// Held by a create that makes a new queue shard, from its choice until it is applied here
    /// (see [`MetaNode::create_queue`]).
    new_shard: tokio::sync::Mutex<()>,
}

impl MetaNode {
    /// Starts the metadata group on the Raft records of `log` (see the module docs). Returns
    /// once the local back-end matches the stored metadata, before any listener serves.
    pub async fn start(
        settings: NodeSettings,
        host: Arc<dyn QueueHost>,
        log: Box<dyn LogStore + Send>,
    ) -> Result<MetaNode, StartError> {
        let mut start = open_start(
            &settings.node_id,
            &settings.start,
            log,
            settings.tick,
            rand::random(),
        )?;
        let snapshots = Arc::new(ShardSnapshots::new(settings.shard_data.clone()));
        start.snapshots = Arc::clone(&snapshots);
        let resumed = start.resumed;
        if let (false, StartMode::Join(addr)) = (resumed, &settings.start) {
            propose::check_join_target(addr).await?;
        }
        let (inputs, inputs_rx) = sync_channel(INPUT_QUEUE_MAX);
        let links = Arc::new(Links::new(
            inputs.clone(),
            tokio::runtime::Handle::current(),
            settings.probe_interval,
            snapshots,
            settings.incarnation,
        ));
        // The stored metadata is the first view, so nothing reads an empty one meanwhile.
        let first_view = MetaView {
            meta: start.meta.clone(),
            ..MetaView::empty()
        };
        let (view_tx, view) = watch::channel(Arc::new(first_view));
        let (shutdown_tx, shutdown) = watch::channel(false);
        // The stored metadata first, so the back-end can be reconciled before serving.
        let me = settings.node_id.clone();
        if resumed {
            host::reconcile(&*host, &start.meta, &me, settings.import_marker.is_none()).await;
        }
        let settings_start = settings.start.clone();
        let counters = Arc::new(RaftCounters::default());
        let driver = Driver::new(
            start,
            Box::new(transport::SharedLinks(Arc::clone(&links))),
            view_tx,
            Arc::clone(&counters),
        );
        let (halt_tx, halted) = watch::channel(None);
        let thread = std::thread::Builder::new()
            .name("ferry-raft".into())
            .spawn(move || supervise(driver, inputs_rx, &halt_tx))
            .map_err(StartError::Thread)?;
        let shared = Arc::new(Shared {
            settings,
            inputs,
            view,
            links,
            host,
            early_peers: std::sync::Mutex::new(initial_peers(&settings_start, &me)),
            counters,
            shutdown_tx,
            shutdown,
            thread: std::sync::Mutex::new(Some(thread)),
            tasks: std::sync::Mutex::default(),
            halted,
            first_asked: std::sync::Mutex::default(),
            new_shard: tokio::sync::Mutex::default(),
        });
        let node = MetaNode { shared };
        node.spawn_tasks(resumed);
        if matches!(&node.shared.settings.start, StartMode::Initial(v) if v.len() == 1) {
            // A one-node cluster forms by itself at once: serve only once it has.
            let deadline = tokio::time::Instant::now() + ALONE_FORM_WAIT;
            node.wait_formed(deadline).await;
        }
        Ok(node)
    }

    /// Starts the node's tasks (kept to be stopped by [`MetaNode::stop`]): following the
    /// metadata, counting bytes, logging reachability, and, on a node that did not resume,
    /// forming the cluster or waiting to be added; importing the local queues when marked.
    fn spawn_tasks(&self, resumed: bool) {
        let mut tasks = vec![
            tokio::spawn(self.clone().follow()),
            tokio::spawn(self.clone().serve_shards()),
            tokio::spawn(self.clone().count_bytes()),
            tokio::spawn(self.clone().log_reachability()),
            tokio::spawn(self.clone().record_incarnations()),
        ];
        if !resumed {
            match &self.shared.settings.start {
                StartMode::Initial(_) => {
                    tasks.push(tokio::spawn(self.clone().bootstrap_when_leader()));
                }
                StartMode::Join(addr) => {
                    tasks.push(tokio::spawn(self.clone().wait_until_added(addr.clone())));
                }
            }
        }
        if self.shared.settings.import_marker.is_some() {
            tasks.push(tokio::spawn(self.clone().import_local_queues()));
        }
        *self
            .shared
            .tasks
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = tasks;
    }

    /// Completes, with the reason, once the metadata group stopped on this node by itself: its
    /// store failed a write, it met an entry or snapshot it cannot apply (a newer release's
    /// command), or its thread panicked. The node must stop serving then: without its
    /// metadata it would route and place with a view that no longer moves. Never completes
    /// after [`MetaNode::stop`].
    ///
    /// Also once a peer refused this node for running on another data directory than the one
    /// the cluster recorded for it (its disk lost, see `transport::admit_incarnation`): it may
    /// not take part under its old identity.
    pub async fn halted(&self) -> String {
        let mut halted = self.shared.halted.clone();
        let mut refused = self.shared.links.refused.subscribe();
        let reason = tokio::select! {
            r = halted.wait_for(Option::is_some) => r.ok().and_then(|r| r.clone()),
            r = refused.wait_for(Option::is_some) => r.ok().and_then(|r| r.clone()),
        };
        match reason {
            Some(reason) => reason,
            None => std::future::pending().await,
        }
    }

    /// The newest metadata and this node's view of group 0.
    pub fn view(&self) -> watch::Receiver<Arc<MetaView>> {
        self.shared.view.clone()
    }

    /// The metadata group's figures on this node, for metrics.
    pub fn metrics(&self) -> RaftMetrics {
        use std::sync::atomic::Ordering::Relaxed;
        let view = self.shared.view.borrow().clone();
        let c = &self.shared.counters;
        let peers_down = self.down_nodes(&view.meta).len() as u64;
        let group = view.group.as_ref();
        RaftMetrics {
            term: group.map_or(0, |g| g.term),
            leader: view.is_leader(),
            commit_index: group.map_or(0, |g| g.commit_index),
            applied_index: view.meta.applied_index(),
            log_entries: group.map_or(0, |g| {
                g.last_index.saturating_sub(g.first_index.saturating_sub(1))
            }),
            leader_changes_total: c.leader_changes.load(Relaxed),
            proposals_total: c.proposals.load(Relaxed),
            proposals_failed_total: c.proposals_failed.load(Relaxed),
            proposal_ms_total: c.proposal_ms_total.load(Relaxed),
            peers_down,
            shard_snapshots_sent_total: self.shared.links.snapshots.sent(),
            shard_snapshots_installed_total: self.shared.links.snapshots.installed(),
        }
    }

    /// This node's id.
    pub fn node_id(&self) -> &NodeId {
        &self.shared.settings.node_id
    }

    /// Stops the group: the thread ends after its round, links close, streams end.
    pub async fn stop(&self) {
        let _ = self.shared.shutdown_tx.send(true);
        let _ = self.shared.inputs.try_send(Input::Stop);
        self.shared.links.close();
        let thread = self
            .shared
            .thread
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take();
        if let Some(thread) = thread {
            let _ = tokio::task::spawn_blocking(move || thread.join()).await;
        }
        let tasks = std::mem::take(
            &mut *self
                .shared
                .tasks
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        );
        for task in tasks {
            task.abort();
            // Returns once the task's future is dropped, with what it held.
            let _ = task.await;
        }
    }

    /// Follows every change of the metadata: links to the current nodes, queue deletions and
    /// creations on the local back-end. Ends at shutdown.
    async fn follow(self) {
        let mut view = self.shared.view.clone();
        let mut shutdown = self.shared.shutdown.clone();
        let me = self.shared.settings.node_id.clone();
        // The state carried out last: a copy that shares every unchanged queue with the newer
        // views, so comparing them costs what changed (`host::carry_out`).
        let mut before = view.borrow_and_update().meta.clone();
        let mut retry = std::collections::BTreeSet::new();
        loop {
            let current = view.borrow_and_update().clone();
            self.update_links(&current);
            if current.meta.cluster_id().is_some() && current.meta.node(&me).is_some() {
                let host = &*self.shared.host;
                host::carry_out(host, &before, &current.meta, &me, &mut retry).await;
                before = current.meta.clone();
            }
            tokio::select! {
                changed = view.changed() => if changed.is_err() { return },
                _ = shutdown.wait_for(|s| *s) => return,
            }
        }
    }

    /// Counts the bytes the local queues hold every [`BYTES_COUNT_INTERVAL`], for the links to
    /// report to the peers. Ends at shutdown.
    async fn count_bytes(self) {
        let mut shutdown = self.shared.shutdown.clone();
        let mut tick = tokio::time::interval(BYTES_COUNT_INTERVAL);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let stopping = tokio::select! {
                _ = tick.tick() => false,
                _ = shutdown.wait_for(|s| *s) => true,
            };
            if stopping {
                return;
            }
            let bytes = self.shared.host.stored_bytes().await;
            self.shared.links.set_local_bytes(bytes);
        }
    }

    /// Logs each peer's reachability once known and at every change (see [`reach`]), looking
    /// every probe interval. Ends at shutdown.
    async fn log_reachability(self) {
        let mut shutdown = self.shared.shutdown.clone();
        let mut tick = tokio::time::interval(self.shared.settings.probe_interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut log = reach::ReachLog::new(self.shared.settings.liveness_timeout);
        let me = &self.shared.settings.node_id;
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                _ = shutdown.wait_for(|s| *s) => return,
            }
            let view = self.shared.view.borrow().clone();
            let peers: Vec<reach::PeerSeen> = view
                .meta
                .nodes()
                .iter()
                .filter(|(id, n)| *id != me && n.is_active())
                .map(|(id, n)| reach::PeerSeen {
                    node: id.clone(),
                    peer_addr: n.peer_addr.clone(),
                    silent_for: self.shared.links.last_heard(n.raft_id.0),
                })
                .collect();
            for change in log.look(std::time::Instant::now(), &peers) {
                reach::log(&change);
            }
        }
    }

    /// Whether `node` is reachable from here: heard from within the liveness timeout (a node
    /// never heard from: within the liveness timeout of the first time it was asked about); true
    /// for a node the metadata does not know. The front-end fails calls to an unreachable
    /// node's back-end at once with UNAVAILABLE instead of waiting for an answer that cannot
    /// come.
    pub fn is_reachable(&self, node: &NodeId) -> bool {
        let view = self.shared.view.borrow().clone();
        let Some(n) = view.meta.node(node) else {
            return true;
        };
        let timeout = self.shared.settings.liveness_timeout;
        match self.shared.links.last_heard(n.raft_id.0) {
            Some(silent) => silent <= timeout,
            None => {
                let mut first = self
                    .shared
                    .first_asked
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
                first
                    .entry(node.clone())
                    .or_insert_with(std::time::Instant::now)
                    .elapsed()
                    <= timeout
            }
        }
    }

    /// Bytes held per node as last counted here (this node) or reported (the others).
    pub(crate) fn loads_bytes(&self, meta: &MetaState) -> std::collections::BTreeMap<NodeId, u64> {
        let links = &self.shared.links;
        meta.nodes()
            .iter()
            .filter_map(|(id, n)| {
                let bytes = if id == &self.shared.settings.node_id {
                    Some(links.local_bytes())
                } else {
                    links.peer_bytes(n.raft_id.0)
                };
                bytes.map(|b| (id.clone(), b))
            })
            .collect()
    }

    /// Points the links at every other active node (or, before the cluster is formed, at the
    /// initial voters).
    fn update_links(&self, view: &MetaView) {
        let settings = &self.shared.settings;
        let mut peers: HashMap<PeerId, String> = HashMap::new();
        if view.meta.cluster_id().is_some() {
            for (id, n) in view.meta.nodes() {
                if id != &settings.node_id && n.is_active() {
                    peers.insert(PeerId(n.raft_id.0), n.peer_addr.clone());
                }
            }
        } else {
            peers = self
                .shared
                .early_peers
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .clone();
        }
        self.shared
            .links
            .set_sender(view.raft_id.map_or(0, |r| r.0), view.meta.cluster_id());
        self.shared.links.update(&peers);
    }
}

/// The initial voters other than `me`, by the raft ids bootstrap gives them.
fn initial_peers(start: &StartMode, me: &NodeId) -> HashMap<PeerId, String> {
    let StartMode::Initial(voters) = start else {
        return HashMap::new();
    };
    let ids: Vec<NodeId> = voters.iter().map(|(id, _)| id.clone()).collect();
    bootstrap_raft_ids(&ids)
        .into_iter()
        .filter(|(id, _)| id != me)
        .filter_map(|(id, raft_id)| {
            let (_, addr) = voters.iter().find(|(v, _)| v == &id)?;
            Some((PeerId(raft_id.0), addr.clone()))
        })
        .collect()
}

/// Where the metadata driver of node `me` starts from, read from `store` on the calling thread
/// (no async runtime): the metadata stored with its applied index, and the engine resumed from
/// the Raft records, or, when the store has none, bootstrapped with `mode`'s initial voters, or
/// none yet (`Join`: the node waits to be added). [`MetaNode::start`] opens a node's store with
/// it, and the simulations restart a node from its store with it.
pub(crate) fn open_start(
    me: &NodeId,
    mode: &StartMode,
    store: Box<dyn LogStore + Send>,
    tick: Duration,
    seed: u64,
) -> Result<Start, StartError> {
    let recovered = store.load().map_err(StartError::Store)?;
    let durable = store.app_scan(DURABLE_PREFIX).map_err(StartError::Store)?;
    let (mut meta, rewrite_durable) = match MetaState::from_durable(&durable)? {
        Some(meta) => (meta, false),
        // An earlier release kept the whole state under one key: read it, write it anew.
        None => match store.app_get(META_KEY).map_err(StartError::Store)? {
            Some(bytes) => (MetaState::restore(&bytes)?, true),
            None => (MetaState::new(), false),
        },
    };
    let resumed = recovered.group_ids().contains(&META_GROUP);
    let engine = if resumed {
        let raft_id = stored_raft_id(&*store).map_err(StartError::Store)?;
        Some(driver::open_engine(raft_id, recovered, seed).map_err(StartError::Store)?)
    } else {
        match mode {
            StartMode::Initial(voters) => Some(bootstrap(me, voters, seed)?),
            StartMode::Join(_) => None,
        }
    };
    // A bootstrapped group starts with its first entry (the initial voters) applied, and no
    // metadata is written for it: the machine starts there too, as the engine does.
    let group = engine.as_ref().and_then(|e| e.status(META_GROUP));
    if group.is_some_and(|g| g.applied_index == 1) && meta.applied_index() == 0 {
        meta.skip(1)?;
    }
    Ok(Start {
        engine,
        meta,
        store,
        tick,
        election_seed: seed,
        rewrite_durable,
        resumed,
        rounds: DriverConfig::default(),
        snapshots: Arc::default(),
    })
}

/// Creates the engine of a node forming a new cluster: group 0 with every initial voter.
fn bootstrap(
    me: &NodeId,
    voters: &[(NodeId, String)],
    seed: u64,
) -> Result<ferry_multiraft::Engine, StartError> {
    let ids: Vec<NodeId> = voters.iter().map(|(id, _)| id.clone()).collect();
    let raft_ids = bootstrap_raft_ids(&ids);
    if raft_ids.len() != ids.len() {
        return Err(StartError::InitialCluster(
            "a node is listed twice; list each node once".into(),
        ));
    }
    let Some((_, my_raft_id)) = raft_ids.iter().find(|(id, _)| id == me) else {
        return Err(StartError::InitialCluster(format!(
            "this node ({me}) is not listed; list every initial node, this one included"
        )));
    };
    let peers: Vec<PeerId> = raft_ids.iter().map(|(_, r)| PeerId(r.0)).collect();
    let mut engine =
        driver::open_engine(*my_raft_id, Default::default(), seed).map_err(StartError::Store)?;
    engine
        .bootstrap_group(META_GROUP, &peers)
        .map_err(StartError::Store)?;
    Ok(engine)
}

fn stored_raft_id(store: &dyn LogStore) -> Result<RaftId, ferry_multiraft::Error> {
    let bytes = store.app_get(IDENTITY_KEY)?.unwrap_or_default();
    let id: [u8; 8] =
        bytes
            .as_slice()
            .try_into()
            .map_err(|_| ferry_multiraft::Error::CorruptStorage {
                group: META_GROUP,
                reason: "the node's raft id is missing".into(),
            })?;
    Ok(RaftId(u64::from_be_bytes(id)))
}

/// Runs the driver on this thread and reports, on `halted`, why it ended if it ended by itself
/// (a panic included: raft-rs panics on some inconsistencies a peer's message can reveal).
fn supervise(driver: Driver, inputs: Receiver<Input>, halted: &watch::Sender<Option<String>>) {
    let run = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || driver.run(inputs)));
    let reason = match run {
        Ok(reason) => reason,
        Err(panic) => {
            let what = panic
                .downcast_ref::<&str>()
                .map(|s| (*s).to_owned())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "no message".to_owned());
            tracing::error!(panic = %what, "the metadata thread panicked");
            Some(format!("the metadata thread panicked: {what}"))
        }
    };
    if let Some(reason) = reason {
        let _ = halted.send(Some(reason));
    }
}
