//! The engine's own thread: it owns the multi-group [`Engine`], its [`LogStore`] and the
//! metadata state, and runs the round loop of `ferry_multiraft` (inputs, round, send, apply,
//! one synced write, `on_persisted`). Everything else talks to it through [`Input`]s and reads
//! what it publishes ([`MetaView`]).
//!
//! A thread, not a task: each round ends in a synced RocksDB write, which must not block the
//! async runtime, and the engine must see its inputs in one order.

use std::collections::BTreeMap;
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use ferry_multiraft::{
    Apply, ConfChange, Engine, EngineConfig, EntryKind, GroupId, LogStore, NodeId as PeerId,
    Recovered, Role,
};
use tokio::sync::{oneshot, watch};

use super::view::{MetaView, RaftCounters};
use ferry_cluster::meta::{
    DurableWrite, MetaError, MetaEvent, MetaState, RaftId, Touched, DURABLE_END, DURABLE_PREFIX,
};
use ferry_cluster::next_conf_change;

/// Group 0: the cluster metadata.
pub const META_GROUP: GroupId = GroupId(0);
/// The application key that held the whole metadata state (with its applied index) before the
/// durable copy was kept key by key ([`ferry_cluster::meta::DURABLE_PREFIX`]); read once to
/// convert it, then deleted.
pub(crate) const META_KEY: &[u8] = b"meta/state";
/// The application key holding this node's raft id (8 bytes, big-endian).
pub(crate) const IDENTITY_KEY: &[u8] = b"node/raft_id";
/// Most inputs handled before a round runs.
const INPUTS_PER_ROUND_MAX: usize = 1024;
/// Most rounds run back to back before inputs are read again.
const ROUNDS_PER_WAKE_MAX: usize = 16;
/// The log is compacted when it holds this many applied entries past its first index.
const COMPACT_AFTER_ENTRIES: u64 = 1_000;

/// The result of a proposal: the index it was applied at and what applying it did.
pub(crate) type Proposed = Result<(u64, Result<MetaEvent, MetaError>), ProposeFailure>;

/// Why a proposal got no result.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum ProposeFailure {
    /// This node does not lead group 0; the leader it knows, if any.
    NotLeader(Option<RaftId>),
    /// This node is not a member yet (it waits to be added).
    NotMember,
    /// Appended, then overwritten by another leader's entry: it will never apply.
    Overwritten,
    /// raft-rs dropped it (a leadership transfer or configuration change in progress).
    Dropped(String),
    /// The driver stopped.
    Stopped,
}

/// Where the driver sends what its rounds produce for other nodes: the peer links on a node
/// (`transport.rs`), a simulated network in tests. The driver knows nothing of the transport.
pub(crate) trait Outbound: Send {
    /// One batch of Raft messages for a peer (dropped when its link is down: Raft retries).
    fn send(&self, to: PeerId, bytes: Bytes);
    /// A snapshot for a peer, sent on a stream of its own.
    fn send_snapshot(&self, snapshot: ferry_multiraft::OutSnapshot);
}

/// What the driver is told.
pub(crate) enum Input {
    /// A batch of Raft messages from a peer.
    Batch { from: PeerId, bytes: Bytes },
    /// A metadata command to propose, answered once applied.
    Propose {
        command: Vec<u8>,
        reply: oneshot::Sender<Proposed>,
    },
    /// The stream to a peer broke.
    Unreachable(PeerId),
    /// This node was added to a cluster as `raft_id`: create group 0 (empty, filled by the
    /// leader) and remember the id.
    Join(RaftId),
    /// Stop after the current round.
    Stop,
}

/// Where the driver starts from.
pub(crate) struct Start {
    pub(crate) engine: Option<Engine>,
    pub(crate) meta: MetaState,
    pub(crate) store: Box<dyn LogStore + Send>,
    pub(crate) tick: Duration,
    pub(crate) election_seed: u64,
    /// The durable copy is in an earlier release's form (one key): write it all again.
    pub(crate) rewrite_durable: bool,
}

/// The running driver.
pub(crate) struct Driver {
    engine: Option<Engine>,
    meta: MetaState,
    /// What entries applied since the last write changed, to write as a delta.
    touched: Touched,
    store: Box<dyn LogStore + Send>,
    links: Box<dyn Outbound>,
    view: watch::Sender<Arc<MetaView>>,
    tick: Duration,
    election_seed: u64,
    /// Index → (term, reply) of proposals made here.
    pending: BTreeMap<u64, (u64, oneshot::Sender<Proposed>)>,
    /// A configuration change this node proposed as leader: (term, index).
    conf_pending: Option<(u64, u64)>,
    counters: Arc<RaftCounters>,
    /// The leader last seen, to count changes.
    last_leader: Option<PeerId>,
    stopping: bool,
    /// Why the driver stopped by itself (it cannot go on without breaking a promise), once it
    /// has.
    halted: Option<String>,
}

/// Opens the engine of a node that already belongs to a cluster (its group 0 is in `recovered`).
pub(crate) fn open_engine(
    raft_id: RaftId,
    recovered: Recovered,
    election_seed: u64,
) -> Result<Engine, ferry_multiraft::Error> {
    Engine::open(engine_config(raft_id, election_seed), recovered)
}

fn engine_config(raft_id: RaftId, election_seed: u64) -> EngineConfig {
    EngineConfig {
        election_seed: election_seed ^ raft_id.0,
        ..EngineConfig::new(PeerId(raft_id.0))
    }
}

impl Driver {
    pub(crate) fn new(
        start: Start,
        links: Box<dyn Outbound>,
        view: watch::Sender<Arc<MetaView>>,
        counters: Arc<RaftCounters>,
    ) -> Self {
        let mut touched = Touched::default();
        if start.rewrite_durable {
            touched.everything();
        }
        Driver {
            engine: start.engine,
            meta: start.meta,
            touched,
            store: start.store,
            links,
            view,
            tick: start.tick,
            election_seed: start.election_seed,
            pending: BTreeMap::new(),
            conf_pending: None,
            counters,
            last_leader: None,
            stopping: false,
            halted: None,
        }
    }

    /// Runs on the calling thread until [`Input::Stop`] or until every sender is gone: the real
    /// clock decides when a tick is due, everything else is [`Driver::step`]. Returns why it
    /// stopped by itself ([`Driver::halt`]), if it did.
    pub(crate) fn run(mut self, inputs: Receiver<Input>) -> Option<String> {
        let mut next_tick = Instant::now() + self.tick;
        self.begin();
        while !self.stopping {
            let wait = next_tick.saturating_duration_since(Instant::now());
            let mut batch = Vec::new();
            match inputs.recv_timeout(wait) {
                Ok(input) => {
                    batch.push(input);
                    batch.extend(inputs.try_iter().take(INPUTS_PER_ROUND_MAX));
                }
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => break,
            }
            let tick = Instant::now() >= next_tick;
            if tick {
                next_tick += self.tick;
                // A thread that fell far behind (a paused process) does not tick in a burst.
                next_tick = next_tick.max(Instant::now());
            }
            self.step(batch, tick);
        }
        self.end();
        self.halted
    }

    /// Stops the driver by itself, for `reason`: a write to the store failed, or an entry or
    /// snapshot cannot be applied. Nothing more is applied, written or published after.
    fn halt(&mut self, reason: String) {
        tracing::error!(%reason, "the metadata group stops on this node");
        self.halted = Some(reason);
        self.stopping = true;
    }

    /// What the driver does first: the only voter campaigns, a first round runs, the view is
    /// published.
    pub(crate) fn begin(&mut self) {
        self.campaign_if_alone();
        self.run_rounds();
        self.publish();
    }

    /// One wake-up: handles `inputs`, ticks the engine when `tick` (one Raft tick of time
    /// passed: the caller's clock, real or simulated, decides), runs the rounds that are ready
    /// and publishes the view. Reads no clock.
    pub(crate) fn step(&mut self, inputs: impl IntoIterator<Item = Input>, tick: bool) {
        for input in inputs {
            self.handle(input);
        }
        if tick {
            if let Some(engine) = self.engine.as_mut() {
                engine.tick();
            }
            self.drive_leader();
        }
        self.run_rounds();
        if self.halted.is_none() {
            // A halted round's changes were not written: nobody may act on them.
            self.publish();
        }
    }

    /// Fails every proposal still waiting.
    pub(crate) fn end(&mut self) {
        for (_, (_, reply)) in std::mem::take(&mut self.pending) {
            let _ = reply.send(Err(ProposeFailure::Stopped));
        }
        tracing::debug!("metadata driver stopped");
    }

    /// The only voter of group 0 leads at once, without waiting out an election timeout (a
    /// one-node cluster serves as soon as it starts).
    fn campaign_if_alone(&mut self) {
        let Some(engine) = self.engine.as_mut() else {
            return;
        };
        let alone = engine
            .status(META_GROUP)
            .is_some_and(|s| s.voters == [engine.node()]);
        if alone {
            if let Err(e) = engine.campaign(META_GROUP) {
                tracing::debug!(error = %e, "no campaign");
            }
        }
    }

    fn handle(&mut self, input: Input) {
        match input {
            Input::Batch { from, bytes } => {
                let Some(engine) = self.engine.as_mut() else {
                    return;
                };
                if let Err(e) = engine.step(from, &bytes) {
                    tracing::warn!(from = from.0, error = %e, "refused a Raft batch");
                }
                engine.take_unknown_groups();
            }
            Input::Propose { command, reply } => self.propose(command, reply),
            Input::Unreachable(peer) => {
                if let Some(engine) = self.engine.as_mut() {
                    engine.report_unreachable(peer);
                }
            }
            Input::Join(raft_id) => self.join(raft_id),
            Input::Stop => self.stopping = true,
        }
    }

    fn propose(&mut self, command: Vec<u8>, reply: oneshot::Sender<Proposed>) {
        let Some(engine) = self.engine.as_mut() else {
            let _ = reply.send(Err(ProposeFailure::NotMember));
            return;
        };
        match engine.propose(META_GROUP, command) {
            Ok(position) => {
                self.pending.insert(position.index, (position.term, reply));
            }
            Err(ferry_multiraft::Error::NotLeader { leader, .. }) => {
                let _ = reply.send(Err(ProposeFailure::NotLeader(leader.map(|l| RaftId(l.0)))));
            }
            Err(e) => {
                let _ = reply.send(Err(ProposeFailure::Dropped(e.to_string())));
            }
        }
    }

    fn join(&mut self, raft_id: RaftId) {
        if self.engine.is_some() {
            return;
        }
        let engine = Engine::open(
            engine_config(raft_id, self.election_seed),
            Recovered::default(),
        )
        .and_then(|mut engine| engine.create_group(META_GROUP).map(|()| engine));
        match engine {
            Ok(engine) => {
                tracing::info!(
                    raft_id = raft_id.0,
                    "added to the cluster; following its leader"
                );
                self.engine = Some(engine);
            }
            Err(e) => tracing::error!(error = %e, "cannot start the metadata group"),
        }
    }

    /// Rounds until the engine has nothing ready (bounded).
    fn run_rounds(&mut self) {
        for _ in 0..ROUNDS_PER_WAKE_MAX {
            let Some(engine) = self.engine.as_mut() else {
                return;
            };
            if !engine.has_ready() {
                return;
            }
            let round = engine.round();
            for batch in &round.batches {
                self.links.send(batch.to, batch.bytes.clone());
            }
            for snapshot in round.snapshots {
                self.links.send_snapshot(snapshot);
            }
            for change in &round.role_changes {
                if change.leader.is_some() && change.leader != self.last_leader {
                    self.last_leader = change.leader;
                    self.counters
                        .leader_changes
                        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                }
                tracing::info!(
                    role = ?change.role,
                    term = change.term,
                    leader = change.leader.map(|l| l.0),
                    "metadata group role"
                );
            }
            self.apply(&round.applies);
            if self.halted.is_some() {
                // Nothing of this round is written: at the next start the node applies from
                // its durable copy again and stops at the same place.
                return;
            }
            if !round.snapshot_requests.is_empty() {
                self.compact(true);
            }
            if let Some(mut job) = round.persist {
                self.write_durable(&mut job);
                if self.first_job_of_member() {
                    job.put_app(IDENTITY_KEY, self.raft_id_bytes());
                }
                if let Err(e) = self.store.write(&job) {
                    // The store refuses every write from now on: this node cannot take part
                    // in Raft any more without breaking its promises. Stop.
                    self.halt(format!("writing the Raft log failed: {e}"));
                    return;
                }
                if let Some(engine) = self.engine.as_mut() {
                    if let Err(e) = engine.on_persisted(job.id()) {
                        tracing::error!(error = %e, "invariant: jobs are reported in order");
                    }
                }
            }
            self.compact(false);
        }
    }

    /// Adds what the entries applied since the last job changed to `job` (the metadata's
    /// durable copy, key by key, with its applied index).
    fn write_durable(&mut self, job: &mut ferry_multiraft::PersistJob) {
        let touched = std::mem::take(&mut self.touched);
        for write in self.meta.durable_writes(&touched) {
            match write {
                DurableWrite::Clear => {
                    job.delete_app_range(DURABLE_PREFIX, DURABLE_END);
                    job.delete_app(META_KEY);
                }
                DurableWrite::Put { key, value } => job.put_app(key, value),
                DurableWrite::Delete { key } => job.delete_app(key),
            }
        }
    }

    /// Whether the identity key must be written (always: it is tiny, and a joining node's
    /// first job must carry it).
    fn first_job_of_member(&self) -> bool {
        self.engine.is_some()
    }

    fn raft_id_bytes(&self) -> Vec<u8> {
        let id = self.engine.as_ref().map_or(0, |e| e.node().0);
        id.to_be_bytes().to_vec()
    }

    fn apply(&mut self, applies: &[Apply]) {
        for apply in applies {
            match apply {
                Apply::Entry { position, kind, .. } => {
                    let result = match kind {
                        EntryKind::Normal(bytes) => {
                            self.meta.apply_entry(position.index, bytes).map(|applied| {
                                self.touched.note_applied(&applied);
                                applied.event
                            })
                        }
                        EntryKind::ConfChange { change, .. } => {
                            self.note_conf_change(*change);
                            self.meta.skip(position.index).map(|()| MetaEvent::Nothing)
                        }
                        EntryKind::ConfTransition { .. } => {
                            self.meta.skip(position.index).map(|()| MetaEvent::Nothing)
                        }
                    };
                    if let Err(e) = &result {
                        if e.stops_apply() {
                            self.halt(format!(
                                "cannot apply metadata entry {} (term {}): {e}",
                                position.index, position.term
                            ));
                            return;
                        }
                        self.touched.note_index();
                        tracing::debug!(index = position.index, error = %e, "metadata command refused");
                    }
                    self.answer(position.index, position.term, result);
                }
                Apply::Snapshot { position, data, .. } => {
                    let restored = if data.is_empty() {
                        let mut meta = MetaState::new();
                        meta.skip(position.index).map(|()| meta)
                    } else {
                        MetaState::restore(data)
                    };
                    match restored {
                        Ok(meta) => {
                            self.meta = meta;
                            self.touched.everything();
                        }
                        Err(e) => {
                            self.halt(format!(
                                "cannot read the metadata snapshot at index {}: {e}",
                                position.index
                            ));
                            return;
                        }
                    }
                    // Every proposal at or below the snapshot was decided elsewhere: its
                    // outcome here is unknown, so it fails (the caller retries).
                    let decided: Vec<u64> = self
                        .pending
                        .range(..=position.index)
                        .map(|(i, _)| *i)
                        .collect();
                    for index in decided {
                        if let Some((_, reply)) = self.pending.remove(&index) {
                            let _ = reply.send(Err(ProposeFailure::Overwritten));
                        }
                    }
                }
            }
        }
    }

    fn note_conf_change(&self, change: ConfChange) {
        let me = self.engine.as_ref().map(Engine::node);
        if let ConfChange::Remove(node) = change {
            if Some(node) == me {
                tracing::warn!("this node was removed from the cluster; it no longer takes part in the metadata group");
            }
        }
    }

    fn answer(&mut self, index: u64, term: u64, result: Result<MetaEvent, MetaError>) {
        if let Some((proposed_term, reply)) = self.pending.remove(&index) {
            let answer = if proposed_term == term {
                Ok((index, result))
            } else {
                Err(ProposeFailure::Overwritten)
            };
            let _ = reply.send(answer);
        }
    }

    /// Compacts the log when it grew long, or at once when a follower needs a snapshot.
    fn compact(&mut self, now: bool) {
        let Some(engine) = self.engine.as_mut() else {
            return;
        };
        let Some(status) = engine.status(META_GROUP) else {
            return;
        };
        let applied = self.meta.applied_index();
        let due = applied >= status.first_index + COMPACT_AFTER_ENTRIES;
        if (now || due) && applied >= status.first_index {
            if let Err(e) = engine.compact(META_GROUP, applied, self.meta.snapshot()) {
                tracing::debug!(error = %e, "metadata log not compacted");
            }
        }
    }

    /// As leader: forms the cluster's Raft membership after the nodes recorded in the metadata,
    /// one configuration change at a time.
    fn drive_leader(&mut self) {
        let Some(engine) = self.engine.as_mut() else {
            return;
        };
        let Some(status) = engine.status(META_GROUP) else {
            return;
        };
        if status.role != Role::Leader || self.meta.cluster_id().is_none() {
            return;
        }
        if let Some((term, index)) = self.conf_pending {
            if term == status.term && status.applied_index < index {
                return;
            }
            self.conf_pending = None;
        }
        let Some(change) = next_conf_change(&self.meta, &status) else {
            return;
        };
        match engine.propose_conf_change(META_GROUP, change) {
            Ok(position) => {
                tracing::info!(?change, "proposing a metadata group membership change");
                self.conf_pending = Some((position.term, position.index));
            }
            Err(e) => tracing::debug!(?change, error = %e, "membership change not proposed yet"),
        }
    }

    /// Publishes the view when it changed.
    fn publish(&self) {
        let status = self.engine.as_ref().and_then(|e| e.status(META_GROUP));
        let raft_id = self.engine.as_ref().map(|e| RaftId(e.node().0));
        let current = self.view.borrow().clone();
        let changed = current.meta.applied_index() != self.meta.applied_index()
            || current.raft_id != raft_id
            || current.group != status;
        if changed {
            let view = MetaView {
                meta: self.meta.clone(),
                raft_id,
                group: status,
            };
            self.view.send_replace(Arc::new(view));
        }
    }
}
