//! The engine's own thread: it runs `ferry_multiraft`'s [`Driver`] (the round loop: inputs,
//! round, send, apply, one synced write, `on_persisted`) with the metadata as group 0's state
//! machine ([`MetaMachine`]), and adds what only a node does: the real clock's ticks, joining a
//! cluster, proposing the membership changes the metadata records, and publishing the
//! [`MetaView`]. Everything else talks to it through [`Input`]s and reads what it publishes.
//!
//! A thread, not a task: each round ends in a synced RocksDB write, which must not block the
//! async runtime, and the engine must see its inputs in one order.

use std::collections::BTreeMap;
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use ferry_multiraft::{
    ConfChange, Driver as RoundLoop, DriverConfig, Engine, EngineConfig, GroupId, LogStore,
    NodeId as PeerId, Recovered, Role, RoundsDone,
};
use tokio::sync::{oneshot, watch};

use super::machine::MetaMachine;
use super::view::{MetaView, RaftCounters};
use ferry_cluster::meta::{MetaError, MetaEvent, MetaState, RaftId};
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

/// The result of a metadata proposal: the index it was applied at and what applying it did.
pub(crate) type Proposed = ferry_multiraft::Proposed<Result<MetaEvent, MetaError>>;
pub(crate) use ferry_multiraft::{Outbound, ProposeFailure};

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
    /// The store held this node's Raft state: it resumes as a member.
    pub(crate) resumed: bool,
    /// How the round loop compacts and how many rounds it runs per wake-up.
    pub(crate) rounds: DriverConfig,
}

/// The running driver.
pub(crate) struct Driver {
    rounds: RoundLoop<MetaMachine>,
    view: watch::Sender<Arc<MetaView>>,
    tick: Duration,
    election_seed: u64,
    /// A configuration change this node proposed as leader: (term, index).
    conf_pending: Option<(u64, u64)>,
    counters: Arc<RaftCounters>,
    /// The leader last seen, to count changes.
    last_leader: Option<PeerId>,
    stopping: bool,
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
        let raft_id = start.engine.as_ref().map(|e| RaftId(e.node().0));
        let machine = MetaMachine::new(start.meta, raft_id, start.rewrite_durable);
        let rounds = RoundLoop::new(
            start.engine,
            BTreeMap::from([(META_GROUP, machine)]),
            start.store,
            links,
            start.rounds,
        );
        Driver {
            rounds,
            view,
            tick: start.tick,
            election_seed: start.election_seed,
            conf_pending: None,
            counters,
            last_leader: None,
            stopping: false,
        }
    }

    /// Shows every change of the metadata machine to `probe` (set it before [`Driver::begin`]
    /// to see the entries a restart applies again).
    #[cfg(test)]
    pub(crate) fn set_probe(&mut self, probe: super::machine::Probe) {
        if let Some(machine) = self.rounds.machine_mut(META_GROUP) {
            machine.set_probe(probe);
        }
    }

    /// Why the round loop stopped by itself, once it has (see [`ferry_multiraft::Halt`]).
    #[cfg(test)]
    pub(crate) fn halted(&self) -> Option<&ferry_multiraft::Halt> {
        self.rounds.halted()
    }

    /// Runs on the calling thread until [`Input::Stop`] or until every sender is gone: the real
    /// clock decides when a tick is due, everything else is [`Driver::step`]. Returns why it
    /// stopped by itself (see [`ferry_multiraft::Halt`]), if it did.
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
        self.rounds.halted().map(|h| h.0.clone())
    }

    /// What the driver does first: the only voter campaigns, a first round runs, the view is
    /// published.
    pub(crate) fn begin(&mut self) {
        self.rounds.campaign_if_alone(META_GROUP);
        self.run_rounds();
        self.publish();
    }

    /// One wake-up: handles `inputs`, ticks the engine when `tick` (one Raft tick of time
    /// passed: the caller's clock, real or simulated, decides), runs the rounds that are ready
    /// and publishes the view. Reads no clock. After a halt it does nothing.
    pub(crate) fn step(&mut self, inputs: impl IntoIterator<Item = Input>, tick: bool) {
        if self.rounds.halted().is_some() {
            self.stopping = true;
            return;
        }
        for input in inputs {
            self.handle(input);
        }
        if tick {
            self.rounds.tick();
            self.drive_leader();
        }
        self.run_rounds();
        if self.rounds.halted().is_some() {
            // A halted round's changes were not written: nobody may act on them.
            self.stopping = true;
        } else {
            self.publish();
        }
    }

    /// Fails every proposal still waiting.
    pub(crate) fn end(&mut self) {
        self.rounds.end();
        tracing::debug!("metadata driver stopped");
    }

    fn handle(&mut self, input: Input) {
        match input {
            Input::Batch { from, bytes } => self.rounds.receive(from, &bytes),
            Input::Propose { command, reply } => self.rounds.propose(
                META_GROUP,
                command,
                Box::new(move |outcome| {
                    let _ = reply.send(outcome);
                }),
            ),
            Input::Unreachable(peer) => self.rounds.unreachable(peer),
            Input::Join(raft_id) => self.join(raft_id),
            Input::Stop => self.stopping = true,
        }
    }

    fn join(&mut self, raft_id: RaftId) {
        if self.rounds.engine().is_some() {
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
                self.rounds.set_engine(engine);
                if let Some(machine) = self.rounds.machine_mut(META_GROUP) {
                    machine.set_raft_id(raft_id);
                }
            }
            Err(e) => tracing::error!(error = %e, "cannot start the metadata group"),
        }
    }

    /// The rounds that are ready, and what they mean to the node: leader changes counted and
    /// logged, this node's own removal said.
    fn run_rounds(&mut self) {
        let done: RoundsDone = self.rounds.run_rounds();
        for change in &done.role_changes {
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
        let me = self.rounds.engine().map(Engine::node);
        for (_, change) in &done.conf_changes {
            if let ConfChange::Remove(node) = change {
                if Some(*node) == me {
                    tracing::warn!("this node was removed from the cluster; it no longer takes part in the metadata group");
                }
            }
        }
    }

    /// As leader: forms the cluster's Raft membership after the nodes recorded in the metadata,
    /// one configuration change at a time.
    fn drive_leader(&mut self) {
        let Some(machine) = self.rounds.machine(META_GROUP) else {
            return;
        };
        if machine.meta().cluster_id().is_none() {
            return;
        }
        let Some(status) = self.rounds.engine().and_then(|e| e.status(META_GROUP)) else {
            return;
        };
        if status.role != Role::Leader {
            return;
        }
        if let Some((term, index)) = self.conf_pending {
            if term == status.term && status.applied_index < index {
                return;
            }
            self.conf_pending = None;
        }
        let Some(change) = next_conf_change(machine.meta(), &status) else {
            return;
        };
        let Some(engine) = self.rounds.engine_mut() else {
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
        let Some(machine) = self.rounds.machine(META_GROUP) else {
            return;
        };
        let meta = machine.meta();
        let engine = self.rounds.engine();
        let status = engine.and_then(|e| e.status(META_GROUP));
        let raft_id = engine.map(|e| RaftId(e.node().0));
        let current = self.view.borrow().clone();
        let changed = current.meta.applied_index() != meta.applied_index()
            || current.raft_id != raft_id
            || current.group != status;
        if changed {
            let view = MetaView {
                meta: meta.clone(),
                raft_id,
                group: status,
            };
            self.view.send_replace(Arc::new(view));
        }
    }
}
