//! The engine's own thread: it runs `ferry_multiraft`'s [`Driver`] (the round loop: inputs,
//! round, send, apply, one synced write, `on_persisted`) with the metadata as group 0's state
//! machine ([`MetaMachine`]), and adds what only a node does: the real clock's ticks, joining a
//! cluster, proposing the membership changes the metadata records, and publishing the
//! [`MetaView`]. Everything else talks to it through [`Input`]s and reads what it publishes.
//!
//! A thread, not a task: each round ends in a synced RocksDB write, which must not block the
//! async runtime, and the engine must see its inputs in one order.

mod first_leader;
mod membership;

use std::collections::{BTreeMap, BTreeSet};
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
use super::machines::{NodeMachine, Outcome};
use super::shard::{
    Balancer, LedShard, LocalShard, ShardMachine, ShardMembers, ShardSnapshots, TransferRefusal,
    BALANCE_EVERY_TICKS,
};
use super::view::{MetaView, RaftCounters, ShardGroupView};
use ferry_be_server::{ShardId, ShardRefusal};
use ferry_cluster::meta::{MetaError, MetaEvent, MetaState, RaftId};

/// Group 0: the cluster metadata.
pub const META_GROUP: GroupId = GroupId(0);
/// The application key that held the whole metadata state (with its applied index) before the
/// durable copy was kept key by key ([`ferry_cluster::meta::DURABLE_PREFIX`]); read once to
/// convert it, then deleted.
pub(crate) const META_KEY: &[u8] = b"meta/state";
/// The application key holding this node's raft id (8 bytes, big-endian).
pub(crate) const IDENTITY_KEY: &[u8] = b"node/raft_id";
/// The data directory's incarnation (`crate::data_dir::incarnation`), beside the raft id.
pub(crate) const INCARNATION_KEY: &[u8] = b"node/incarnation";
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
    /// An encoded shard entry to propose to its group if this node leads it at `term`,
    /// answered once applied here.
    ProposeShard {
        group: GroupId,
        term: u64,
        entry: Vec<u8>,
        reply: oneshot::Sender<Result<(), ShardRefusal>>,
    },
    /// Starts a queue shard's group on this node with `voters` as its first replicas (each of
    /// them is told the same), unless it runs already.
    OpenShard {
        group: GroupId,
        voters: Vec<PeerId>,
        reply: oneshot::Sender<Result<(), String>>,
    },
    /// As the shard's leader: hands its leadership to `to` (`ferry shard transfer-leader`);
    /// answered once the transfer is started (or refused).
    TransferShard {
        group: GroupId,
        to: PeerId,
        reply: oneshot::Sender<Result<(), TransferRefusal>>,
    },
    /// An operator asked this node to lead the shard: the balancer leaves it here while this
    /// node leads it at the term it gets it at.
    HoldShard { group: GroupId },
    /// Reports the queue shard groups running here (see [`LocalShard`]).
    LocalShards {
        reply: oneshot::Sender<Vec<LocalShard>>,
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
    /// Where the data of the shard snapshots this node receives waits for their install.
    pub(crate) snapshots: Arc<ShardSnapshots>,
}

/// The running driver.
pub(crate) struct Driver {
    rounds: RoundLoop<NodeMachine>,
    view: watch::Sender<Arc<MetaView>>,
    tick: Duration,
    election_seed: u64,
    /// A configuration change this node proposed as leader: (term, index).
    conf_pending: Option<(u64, u64)>,
    /// The configuration changes of the shards led here (`shard/members.rs`).
    shard_members: ShardMembers,
    counters: Arc<RaftCounters>,
    /// The leader last seen, to count changes.
    last_leader: Option<PeerId>,
    stopping: bool,
    /// The metadata's applied index when the shard groups were last brought in line with it
    /// ([`Driver::follow_shards`]).
    shards_followed_at: Option<u64>,
    /// Hands the shards led here to their preferred leaders (`shard/balance.rs`).
    balancer: Balancer,
    /// Raft ticks since the driver started: the balancer's time.
    ticks: u64,
    /// Shard groups running here whose replica the metadata moved away, kept until their group
    /// removes this node (`driver/membership.rs`): each with the tick since which it has known
    /// no leader, if it has none.
    leaving: BTreeMap<GroupId, Option<u64>>,
    /// New shards this node is the preferred leader of, each with the tick until which it
    /// campaigns while the group knows no leader (`driver/first_leader.rs`).
    first_campaigns: BTreeMap<GroupId, u64>,
    /// Given to every shard's machine (see [`Start::snapshots`]).
    snapshots: Arc<ShardSnapshots>,
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
        // Well under what a peer's stream accepts, so no round's batch is refused there.
        batch_bytes_max: super::transport::BATCH_BYTES_MAX / 4,
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
        let mut rounds = RoundLoop::new(
            start.engine,
            BTreeMap::from([(META_GROUP, NodeMachine::Meta(Box::new(machine)))]),
            start.store,
            links,
            start.rounds,
        );
        let shards: Vec<GroupId> = rounds.engine().map_or_else(Vec::new, |e| {
            e.group_ids()
                .into_iter()
                .filter(|g| *g != META_GROUP)
                .collect()
        });
        for group in shards {
            match ShardMachine::open(group, rounds.store(), Arc::clone(&start.snapshots)) {
                Ok(machine) => rounds.add_machine(group, NodeMachine::Shard(machine)),
                // Its entries halt the driver when they come: no machine to apply them to.
                Err(e) => tracing::error!(%group, reason = %e.0, "cannot open a queue shard"),
            }
        }
        Driver {
            rounds,
            view,
            tick: start.tick,
            election_seed: start.election_seed,
            conf_pending: None,
            shard_members: ShardMembers::default(),
            counters,
            last_leader: None,
            stopping: false,
            shards_followed_at: None,
            balancer: Balancer::default(),
            ticks: 0,
            leaving: BTreeMap::new(),
            first_campaigns: BTreeMap::new(),
            snapshots: start.snapshots,
        }
    }

    /// Shows every change of the metadata machine to `probe` (set it before [`Driver::begin`]
    /// to see the entries a restart applies again).
    #[cfg(test)]
    pub(crate) fn set_probe(&mut self, probe: super::machine::Probe) {
        if let Some(machine) = self.meta_machine_mut() {
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

    /// What the driver does first: the only voter of a group (the metadata's, a shard's)
    /// campaigns, a first round runs, the view is published.
    pub(crate) fn begin(&mut self) {
        let groups = self
            .rounds
            .engine()
            .map_or_else(Vec::new, Engine::group_ids);
        for group in groups {
            self.rounds.campaign_if_alone(group);
        }
        self.run_rounds();
        if self.follow_shards() {
            self.run_rounds();
        }
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
            self.ticks += 1;
            self.campaign_first();
            self.drive_leader();
            self.drive_shard_members();
            if self.ticks.is_multiple_of(BALANCE_EVERY_TICKS) {
                self.balance_leaders();
            }
        }
        self.run_rounds();
        if self.follow_shards() {
            self.run_rounds();
        }
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
                    let _ = reply.send(outcome.and_then(|(index, outcome)| match outcome {
                        Outcome::Meta(outcome) => Ok((index, outcome)),
                        Outcome::Shard => Err(ProposeFailure::Dropped(
                            "group 0 answered as a queue shard".into(),
                        )),
                    }));
                }),
            ),
            Input::ProposeShard {
                group,
                term,
                entry,
                reply,
            } => self.propose_shard(group, term, entry, reply),
            Input::OpenShard {
                group,
                voters,
                reply,
            } => {
                let _ = reply.send(self.open_shard(group, &voters));
            }
            Input::TransferShard { group, to, reply } => {
                let _ = reply.send(self.transfer_shard(group, to));
            }
            Input::HoldShard { group } => self.balancer.hold(ShardId(group.0), self.ticks),
            Input::LocalShards { reply } => {
                let _ = reply.send(self.local_shards());
            }
            Input::Unreachable(peer) => self.rounds.unreachable(peer),
            Input::Join(raft_id) => self.join(raft_id),
            Input::Stop => self.stopping = true,
        }
    }

    /// Proposes a shard entry; `reply` learns whether it was applied here (see
    /// `ferry_be_server::ShardProposer`).
    fn propose_shard(
        &mut self,
        group: GroupId,
        term: u64,
        entry: Vec<u8>,
        reply: oneshot::Sender<Result<(), ShardRefusal>>,
    ) {
        let shard = ShardId(group.0);
        let status = self.rounds.engine().and_then(|e| e.status(group));
        // Named now: a refusal comes back before `propose` returns.
        let leader = status
            .as_ref()
            .and_then(|s| s.leader)
            .and_then(|l| self.node_name(l));
        // A run of serving writes only at the term it began at: leading again at a later term
        // (another leader may have written in between) is a new run's.
        if status.is_none_or(|s| s.role != Role::Leader || s.term != term) {
            let _ = reply.send(Err(ShardRefusal::NotLeader { shard, leader }));
            return;
        }
        self.rounds.propose(
            group,
            entry,
            Box::new(move |outcome| {
                let answer = match outcome {
                    Ok(_) => Ok(()),
                    Err(ProposeFailure::NotLeader(_) | ProposeFailure::NotMember) => {
                        Err(ShardRefusal::NotLeader { shard, leader })
                    }
                    // Not appended (its leadership is being handed over): nothing was written,
                    // and the router retries a NotLeader on the leader it learns next.
                    Err(ProposeFailure::Refused(_)) => Err(ShardRefusal::NotLeader {
                        shard,
                        leader: None,
                    }),
                    Err(e) => Err(ShardRefusal::Unknown {
                        shard,
                        reason: format!("{e:?}"),
                    }),
                };
                let _ = reply.send(answer);
            }),
        );
    }

    /// Starts handing a shard's leadership to `to` (see [`Input::TransferShard`]).
    fn transfer_shard(&mut self, group: GroupId, to: PeerId) -> Result<(), TransferRefusal> {
        let shard = ShardId(group.0);
        let status = self.rounds.engine().and_then(|e| e.status(group));
        let Some(status) = status else {
            return Err(TransferRefusal::NotRunning { shard });
        };
        if status.role != Role::Leader {
            let leader = status.leader.and_then(|l| self.node_name(l));
            return Err(TransferRefusal::NotLeader { shard, leader });
        }
        let Some(engine) = self.rounds.engine_mut() else {
            return Err(TransferRefusal::NotRunning { shard });
        };
        engine
            .transfer_leader(group, to)
            .map_err(|e| TransferRefusal::Refused {
                shard,
                reason: e.to_string(),
            })?;
        tracing::info!(%shard, to = to.0, "handing a queue shard's leadership over (asked)");
        Ok(())
    }

    /// Hands at most one shard led here to its preferred leader (see `shard/balance.rs`).
    fn balance_leaders(&mut self) {
        let (Some(meta), Some(engine)) = (
            self.meta_machine().map(MetaMachine::meta),
            self.rounds.engine(),
        ) else {
            return;
        };
        let led: Vec<LedShard> = engine
            .group_ids()
            .into_iter()
            .filter(|g| *g != META_GROUP)
            .filter_map(|g| {
                let progress = engine.leader_progress(g)?;
                let preferred = meta
                    .shard(ShardId(g.0))
                    .and_then(|d| meta.node(d.preferred_leader()))
                    .map(|n| PeerId(n.raft_id.0));
                Some(LedShard {
                    shard: ShardId(g.0),
                    term: engine.status(g)?.term,
                    preferred,
                    progress,
                })
            })
            .collect();
        let Some((shard, to)) = self.balancer.decide(self.ticks, &led) else {
            return;
        };
        let Some(engine) = self.rounds.engine_mut() else {
            return;
        };
        match engine.transfer_leader(GroupId(shard.0), to) {
            Ok(()) => {
                tracing::info!(%shard, to = to.0, "handing a queue shard to its preferred leader")
            }
            Err(e) => {
                tracing::warn!(%shard, to = to.0, error = %e, "cannot hand a queue shard to its preferred leader")
            }
        }
    }

    /// The queue shard groups running here, as the engine and their machines stand now.
    fn local_shards(&self) -> Vec<LocalShard> {
        let Some(engine) = self.rounds.engine() else {
            return Vec::new();
        };
        engine
            .group_ids()
            .into_iter()
            .filter(|g| *g != META_GROUP)
            .filter_map(|g| {
                let status = engine.status(g)?;
                let applied_index = self
                    .rounds
                    .machine(g)
                    .and_then(NodeMachine::as_shard)
                    .map_or(status.applied_index, |m| {
                        ferry_multiraft::GroupMachine::applied_index(m)
                    });
                Some(LocalShard {
                    shard: ShardId(g.0),
                    leading: status.role == Role::Leader,
                    term: status.term,
                    leader: status.leader.map(|l| RaftId(l.0)),
                    applied_index,
                    last_index: status.last_index,
                    first_index: status.first_index,
                    commit_index: status.commit_index,
                    match_indexes: engine
                        .match_indexes(g)
                        .unwrap_or_default()
                        .into_iter()
                        .map(|(peer, index)| (RaftId(peer.0), index))
                        .collect(),
                    voters: status.voters.iter().map(|p| RaftId(p.0)).collect(),
                    learners: status.learners.iter().map(|p| RaftId(p.0)).collect(),
                })
            })
            .collect()
    }

    /// The node id the metadata gives a raft id.
    fn node_name(&self, peer: PeerId) -> Option<String> {
        let meta = self.meta_machine()?.meta();
        meta.node_by_raft_id(RaftId(peer.0))
            .map(|(id, _)| id.to_string())
    }

    /// Starts a shard's group here (see [`Input::OpenShard`]): formed with `voters`, or, with
    /// none, empty, to be filled by its leader once it adds this node (a replica that joins a
    /// shard whose group formed long ago). A new shard's preferred leader campaigns at once
    /// (`driver/first_leader.rs`).
    fn open_shard(&mut self, group: GroupId, voters: &[PeerId]) -> Result<(), String> {
        if group == META_GROUP {
            return Err("group 0 is the metadata group, not a queue shard".into());
        }
        let Some(engine) = self.rounds.engine_mut() else {
            return Err("this node is not a cluster member yet".into());
        };
        if engine.status(group).is_some() {
            return Ok(());
        }
        let started = if voters.is_empty() {
            engine.create_group(group)
        } else {
            engine.bootstrap_group(group, voters)
        };
        started.map_err(|e| format!("cannot start shard group {group}: {e}"))?;
        let machine = ShardMachine::open(group, self.rounds.store(), Arc::clone(&self.snapshots))
            .map_err(|h| h.0)?;
        self.rounds.add_machine(group, NodeMachine::Shard(machine));
        self.rounds.campaign_if_alone(group);
        self.lead_new_shard(group, voters);
        Ok(())
    }

    /// Brings the shard groups running here in line with the metadata, once per metadata
    /// change: a shard this node is a replica of and does not run is started with its
    /// replicas as voters (every replica starts it with the same ones), or empty if the shard
    /// was reshaped (its group formed before, with other replicas: its leader adds this node and
    /// sends it a snapshot, see [`Driver::drive_shard_members`]); a shard group running
    /// here that the metadata removed (its id is below the next shard id, so the metadata knows
    /// of it, and it is gone or no longer has this node) is removed, its Raft records and
    /// applied position deleted in the next job; but a replica moved away from a node that
    /// works stays until its group removed it ([`Driver::shards_to_close`]). A node whose
    /// metadata is behind leaves groups it does not know of yet alone. Whether anything
    /// changed.
    fn follow_shards(&mut self) -> bool {
        let Some(meta) = self.meta_machine().map(MetaMachine::meta) else {
            return false;
        };
        let at = meta.applied_index();
        // Replicas moved away are looked at again on every wake-up until their groups let them
        // go; the rest only when the metadata changed.
        if self.shards_followed_at == Some(at) && self.leaving.is_empty() {
            return false;
        }
        let Some(engine) = self.rounds.engine() else {
            return false;
        };
        let Some((me, _)) = meta.node_by_raft_id(RaftId(engine.node().0)) else {
            return false;
        };
        let running: BTreeSet<GroupId> = engine
            .group_ids()
            .into_iter()
            .filter(|g| *g != META_GROUP)
            .collect();
        let mut open = Vec::new();
        for (id, def) in meta.shards() {
            if def.replicas.contains(me) && !running.contains(&GroupId(id.0)) {
                if def.reshaped {
                    open.push((GroupId(id.0), Vec::new()));
                    continue;
                }
                let voters: Option<Vec<PeerId>> = def
                    .replicas
                    .iter()
                    .map(|r| meta.node(r).map(|n| PeerId(n.raft_id.0)))
                    .collect();
                match voters {
                    Some(voters) => open.push((GroupId(id.0), voters)),
                    None => {
                        tracing::error!(shard = %id, "a replica of the shard is not a node of the metadata")
                    }
                }
            }
        }
        let (close, leaving) = self.shards_to_close(engine, meta, me, running);
        self.leaving = leaving;
        self.shards_followed_at = Some(at);
        let changed = !open.is_empty() || !close.is_empty();
        for (group, voters) in open {
            match self.open_shard(group, &voters) {
                Ok(()) => tracing::info!(shard = group.0, "queue shard started here"),
                Err(e) => {
                    tracing::error!(shard = group.0, error = %e, "cannot start a queue shard")
                }
            }
        }
        for group in close {
            match self.rounds.remove_group(group) {
                Ok(()) => tracing::info!(shard = group.0, "queue shard removed from here"),
                Err(e) => {
                    tracing::error!(shard = group.0, error = %e, "cannot remove a queue shard")
                }
            }
        }
        changed
    }

    fn meta_machine(&self) -> Option<&MetaMachine> {
        self.rounds
            .machine(META_GROUP)
            .and_then(NodeMachine::as_meta)
    }

    fn meta_machine_mut(&mut self) -> Option<&mut MetaMachine> {
        self.rounds
            .machine_mut(META_GROUP)
            .and_then(NodeMachine::as_meta_mut)
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
                if let Some(machine) = self.meta_machine_mut() {
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
            if change.group != META_GROUP {
                // Not the metadata's: told apart, and not counted as its leader changes.
                tracing::info!(
                    shard = change.group.0,
                    role = ?change.role,
                    term = change.term,
                    leader = change.leader.map(|l| l.0),
                    "queue shard role"
                );
                continue;
            }
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
        for (group, change) in &done.conf_changes {
            if let ConfChange::Remove(node) = change {
                if Some(*node) == me && *group == META_GROUP {
                    tracing::warn!("this node was removed from the cluster; it no longer takes part in the metadata group");
                }
            }
        }
    }

    /// Publishes the view when it changed.
    fn publish(&self) {
        let Some(machine) = self.meta_machine() else {
            return;
        };
        let meta = machine.meta();
        let engine = self.rounds.engine();
        let status = engine.and_then(|e| e.status(META_GROUP));
        let raft_id = engine.map(|e| RaftId(e.node().0));
        let shards: BTreeMap<ShardId, ShardGroupView> = engine.map_or_else(BTreeMap::new, |e| {
            e.group_ids()
                .into_iter()
                .filter(|g| *g != META_GROUP)
                .filter_map(|g| {
                    let applied_term = self
                        .rounds
                        .machine(g)
                        .and_then(NodeMachine::as_shard)
                        .map_or(0, ShardMachine::applied_term);
                    Some((
                        ShardId(g.0),
                        ShardGroupView::of(&e.status(g)?, applied_term),
                    ))
                })
                .collect()
        });
        let current = self.view.borrow().clone();
        let changed = current.meta.applied_index() != meta.applied_index()
            || current.raft_id != raft_id
            || current.group != status
            || current.shards != shards;
        if changed {
            let view = MetaView {
                meta: meta.clone(),
                raft_id,
                group: status,
                shards,
            };
            self.view.send_replace(Arc::new(view));
        }
    }
}
