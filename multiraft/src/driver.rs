//! The round loop around an [`Engine`], generic over what each group applies its entries to.
//!
//! A [`Driver`] owns the engine, one [`GroupMachine`] per group, the node's [`LogStore`] and an
//! [`Outbound`] for what goes to other nodes. It does steps 2 to 6 of the crate's round (see the
//! crate docs) the same way for every group and every caller: the node's metadata thread and the
//! simulations run this code, not a copy of it. Like the engine it reads no clock and starts no
//! thread: the caller feeds it inputs and says when a tick of time passed.
//!
//! Exactly-once apply is the machines' half of the bargain: a machine writes its applied index
//! in the same job as what it applied ([`GroupMachine::persist`]), so that after a crash the
//! engine replays only entries past it.

use std::collections::BTreeMap;

use bytes::Bytes;

use crate::engine::Engine;
use crate::error::Error;
use crate::ids::{GroupId, LogPosition, NodeId};
use crate::persist::PersistJob;
use crate::round::{Apply, ConfChange, EntryKind, OutSnapshot, Role, RoleChange};
use crate::storage::LogStore;

/// What a group's state machine is to the [`Driver`].
pub trait GroupMachine {
    /// What applying a normal entry answers the node that proposed it.
    type Outcome;

    /// The index of the last entry applied (or covered by the last snapshot restored).
    fn applied_index(&self) -> u64;

    /// Applies the data of a committed normal entry (empty: a new leader's no-op). An error
    /// stops the driver: the entry is committed, so skipping it would let this node diverge.
    fn apply(&mut self, position: LogPosition, data: &[u8]) -> Result<Self::Outcome, Halt>;

    /// Notes a committed entry that holds no data for the machine (a configuration change),
    /// so that its applied index moves past it.
    fn skip(&mut self, position: LogPosition) -> Result<(), Halt>;

    /// Replaces the state with a snapshot's `data` (what [`GroupMachine::snapshot`] gave on
    /// the node that made it; empty: the empty state at `position`).
    fn restore(&mut self, position: LogPosition, data: &[u8]) -> Result<(), Halt>;

    /// The state at its applied index, for [`Engine::compact`].
    fn snapshot(&self) -> Vec<u8>;

    /// Whether the machine can make a snapshot: a machine that cannot (yet) keeps its whole
    /// log, and its group is never compacted.
    fn can_snapshot(&self) -> bool {
        true
    }

    /// Adds to `job` what was applied since the last call, with the applied index, so that
    /// both reach the disk in the same synced write.
    fn persist(&mut self, job: &mut PersistJob);

    /// The group was removed from this node ([`Driver::remove_group`]): adds to `job` what
    /// was applied and not yet persisted, and deletes the machine's own keys. Called once, in
    /// the job that deletes the group's Raft records.
    fn close(&mut self, job: &mut PersistJob) {
        self.persist(job);
    }
}

/// Why a driver stopped by itself: it cannot go on without breaking a promise.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Halt(pub String);

/// Why a proposal got no outcome.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProposeFailure {
    /// This node does not lead the group; the leader it knows, if any.
    NotLeader(Option<NodeId>),
    /// This node has no such group (yet): it waits to be added.
    NotMember,
    /// Appended, then overwritten by another leader's entry, or decided by a snapshot that
    /// replaced the state: its outcome here is unknown.
    Overwritten,
    /// Appended, then dropped with its group (removed from this node): its outcome here is
    /// unknown.
    Dropped(String),
    /// raft-rs would not append it (a leadership transfer or configuration change in
    /// progress): nothing was written; it may be proposed again.
    Refused(String),
    /// The driver stopped.
    Stopped,
}

/// The outcome of a proposal: the index it was applied at, and what applying it answered.
pub type Proposed<O> = Result<(u64, O), ProposeFailure>;

/// Called once with a proposal's outcome.
pub type Reply<O> = Box<dyn FnOnce(Proposed<O>) + Send>;

/// Where a driver sends what its rounds produce for other nodes: peer links on a node, a
/// simulated network in tests.
pub trait Outbound: Send {
    /// One batch of Raft messages for a peer (dropped when its link is down: Raft retries).
    fn send(&self, to: NodeId, bytes: Bytes);
    /// A snapshot for a peer, sent on a stream of its own.
    fn send_snapshot(&self, snapshot: OutSnapshot);
}

/// How a driver compacts and how much it does per call.
#[derive(Debug, Clone, Copy)]
pub struct DriverConfig {
    /// A group's log is compacted once it holds this many applied entries past its first
    /// index.
    pub compact_after_entries: u64,
    /// Most rounds [`Driver::run_rounds`] runs back to back.
    pub rounds_per_call_max: usize,
}

impl Default for DriverConfig {
    fn default() -> Self {
        DriverConfig {
            compact_after_entries: 1_000,
            rounds_per_call_max: 16,
        }
    }
}

/// What the rounds of one [`Driver::run_rounds`] call did that the caller may act on.
#[derive(Debug, Default)]
pub struct RoundsDone {
    /// Rounds run.
    pub rounds: usize,
    /// Role and leader changes, in order.
    pub role_changes: Vec<RoleChange>,
    /// Configuration changes applied, in order.
    pub conf_changes: Vec<(GroupId, ConfChange)>,
    /// Groups whose state was replaced by a snapshot.
    pub restored: Vec<GroupId>,
}

/// A proposal made here: the term it was appended at, and who waits for its outcome.
type Pending<O> = (u64, Reply<O>);

/// An entry applied in a round: its group, position and outcome (none for a configuration
/// change), answered once the round's job is written.
type Applied<O> = (GroupId, LogPosition, Option<O>);

/// See the module docs.
#[allow(missing_debug_implementations)]
pub struct Driver<M: GroupMachine> {
    engine: Option<Engine>,
    machines: BTreeMap<GroupId, M>,
    store: Box<dyn LogStore + Send>,
    outbound: Box<dyn Outbound>,
    config: DriverConfig,
    /// Proposals made here, by (group, index).
    pending: BTreeMap<(GroupId, u64), Pending<M::Outcome>>,
    /// Machines of removed groups, closed in the next job.
    closing: Vec<M>,
    halted: Option<Halt>,
}

impl<M: GroupMachine> Driver<M> {
    /// A driver over `engine` (none: this node is not a member yet, see
    /// [`Driver::set_engine`]) and the machines of its groups.
    pub fn new(
        engine: Option<Engine>,
        machines: BTreeMap<GroupId, M>,
        store: Box<dyn LogStore + Send>,
        outbound: Box<dyn Outbound>,
        config: DriverConfig,
    ) -> Self {
        Driver {
            engine,
            machines,
            store,
            outbound,
            config,
            pending: BTreeMap::new(),
            closing: Vec::new(),
            halted: None,
        }
    }

    /// The engine, once this node is a member.
    pub fn engine(&self) -> Option<&Engine> {
        self.engine.as_ref()
    }

    /// The engine, to propose configuration changes, campaign or transfer leadership.
    pub fn engine_mut(&mut self) -> Option<&mut Engine> {
        self.engine.as_mut()
    }

    /// Becomes a member: from now on the driver runs `engine`.
    pub fn set_engine(&mut self, engine: Engine) {
        self.engine = Some(engine);
    }

    /// The machine of `group`.
    pub fn machine(&self, group: GroupId) -> Option<&M> {
        self.machines.get(&group)
    }

    /// The machine of `group`, to change what it holds outside the log (a node's identity).
    pub fn machine_mut(&mut self, group: GroupId) -> Option<&mut M> {
        self.machines.get_mut(&group)
    }

    /// Gives `group` its machine (a group created after the driver was), unless it has one.
    pub fn add_machine(&mut self, group: GroupId, machine: M) {
        self.machines.entry(group).or_insert(machine);
    }

    /// Removes `group` from this node: the engine deletes its Raft records and its machine is
    /// closed ([`GroupMachine::close`]) in the next job; a proposal still waiting in it fails
    /// with [`ProposeFailure::Dropped`].
    pub fn remove_group(&mut self, group: GroupId) -> Result<(), Error> {
        let Some(engine) = self.engine.as_mut() else {
            return Err(Error::GroupNotFound { group });
        };
        engine.remove_group(group)?;
        if let Some(machine) = self.machines.remove(&group) {
            self.closing.push(machine);
        }
        let waiting: Vec<(GroupId, u64)> = self
            .pending
            .range((group, 0)..=(group, u64::MAX))
            .map(|(key, _)| *key)
            .collect();
        for key in waiting {
            if let Some((_, reply)) = self.pending.remove(&key) {
                reply(Err(ProposeFailure::Dropped(format!(
                    "group {group} was removed from this node"
                ))));
            }
        }
        Ok(())
    }

    /// The store the driver writes to, to read a new machine's durable state from.
    pub fn store(&self) -> &dyn LogStore {
        self.store.as_ref()
    }

    /// Why the driver stopped by itself, once it has.
    pub fn halted(&self) -> Option<&Halt> {
        self.halted.as_ref()
    }

    /// Hands a batch from `from` to the engine; a batch the engine refuses is logged and
    /// dropped (Raft retries).
    pub fn receive(&mut self, from: NodeId, bytes: &[u8]) {
        let Some(engine) = self.engine.as_mut() else {
            return;
        };
        if let Err(e) = engine.step(from, bytes) {
            tracing::warn!(from = from.0, error = %e, "refused a Raft batch");
        }
        // Groups this node does not have are the caller's to create, from its own metadata.
        engine.take_unknown_groups();
    }

    /// The stream to `peer` broke.
    pub fn unreachable(&mut self, peer: NodeId) {
        if let Some(engine) = self.engine.as_mut() {
            engine.report_unreachable(peer);
        }
    }

    /// One tick of time passed.
    pub fn tick(&mut self) {
        if let Some(engine) = self.engine.as_mut() {
            engine.tick();
        }
    }

    /// Proposes `data` to `group`; `reply` gets its outcome once applied here and what it
    /// applied is written with its round's job (so a store read after the answer sees it), or
    /// why it will have none.
    pub fn propose(&mut self, group: GroupId, data: Vec<u8>, reply: Reply<M::Outcome>) {
        let Some(engine) = self.engine.as_mut() else {
            reply(Err(ProposeFailure::NotMember));
            return;
        };
        match engine.propose(group, data) {
            Ok(position) => {
                self.pending
                    .insert((group, position.index), (position.term, reply));
            }
            Err(Error::NotLeader { leader, .. }) => reply(Err(ProposeFailure::NotLeader(leader))),
            Err(Error::GroupNotFound { .. }) => reply(Err(ProposeFailure::NotMember)),
            Err(e) => reply(Err(ProposeFailure::Refused(e.to_string()))),
        }
    }

    /// The only voter of `group` leads at once, without waiting out an election timeout.
    pub fn campaign_if_alone(&mut self, group: GroupId) {
        let Some(engine) = self.engine.as_mut() else {
            return;
        };
        let alone = engine
            .status(group)
            .is_some_and(|s| s.voters == [engine.node()]);
        if alone {
            if let Err(e) = engine.campaign(group) {
                tracing::debug!(%group, error = %e, "no campaign");
            }
        }
    }

    /// Runs rounds until the engine has nothing ready (at most
    /// [`DriverConfig::rounds_per_call_max`]): sends, applies, writes each round's job with
    /// one synced write, compacts. Stops at the first [`Halt`]: nothing of that round is
    /// written, and nothing more is done until the driver is dropped.
    pub fn run_rounds(&mut self) -> RoundsDone {
        let mut done = RoundsDone::default();
        for _ in 0..self.config.rounds_per_call_max {
            if self.halted.is_some() {
                break;
            }
            let Some(engine) = self.engine.as_mut() else {
                break;
            };
            if !engine.has_ready() {
                break;
            }
            let round = engine.round();
            done.rounds += 1;
            for batch in &round.batches {
                self.outbound.send(batch.to, batch.bytes.clone());
            }
            for snapshot in round.snapshots {
                self.outbound.send_snapshot(snapshot);
            }
            done.role_changes.extend(round.role_changes);
            let outcomes = match self.apply(&round.applies, &mut done) {
                Ok(outcomes) => outcomes,
                Err(halt) => {
                    self.halt(halt);
                    break;
                }
            };
            for group in round.snapshot_requests {
                self.compact(group, true);
            }
            if let Some(mut job) = round.persist {
                for machine in self.machines.values_mut() {
                    machine.persist(&mut job);
                }
                for mut machine in std::mem::take(&mut self.closing) {
                    machine.close(&mut job);
                }
                if let Err(e) = self.store.write(&job) {
                    // The store refuses every write from now on: this node cannot take part
                    // in Raft any more without breaking its promises.
                    self.halt(Halt(format!("writing the Raft log failed: {e}")));
                    break;
                }
                if let Some(engine) = self.engine.as_mut() {
                    if let Err(e) = engine.on_persisted(job.id()) {
                        tracing::error!(error = %e, "invariant: jobs are reported in order");
                    }
                }
            }
            // Only now: what the entries applied is on this node's disk, so a proposer that
            // reads the store after its answer finds it.
            for (group, position, outcome) in outcomes {
                self.answer(group, position, outcome);
            }
            if !done.role_changes.is_empty() {
                self.fail_proposals_of_past_terms();
            }
            let groups: Vec<GroupId> = self.machines.keys().copied().collect();
            for group in groups {
                self.compact(group, false);
            }
        }
        done
    }

    /// Fails, as [`ProposeFailure::Overwritten`] (outcome unknown here), every proposal made at
    /// a term its group has left, or by a leader that stepped down (cut off from a majority, it
    /// stays at its term as a follower and is never leader at that term again): a later leader
    /// may still commit it (then it is applied here like any entry), but its index may also
    /// never be reached (the new leader's log is shorter and nothing more is proposed), and its
    /// proposer must not wait for ever, nor until the cut heals.
    fn fail_proposals_of_past_terms(&mut self) {
        let Some(engine) = self.engine.as_ref() else {
            return;
        };
        let stale: Vec<(GroupId, u64)> = self
            .pending
            .iter()
            .filter(|((group, _), (term, _))| {
                engine
                    .status(*group)
                    .is_some_and(|s| s.term > *term || s.role != Role::Leader)
            })
            .map(|(key, _)| *key)
            .collect();
        for key in stale {
            if let Some((_, reply)) = self.pending.remove(&key) {
                reply(Err(ProposeFailure::Overwritten));
            }
        }
    }

    /// Fails every proposal still waiting, with [`ProposeFailure::Stopped`].
    pub fn end(&mut self) {
        for (_, (_, reply)) in std::mem::take(&mut self.pending) {
            reply(Err(ProposeFailure::Stopped));
        }
    }

    fn halt(&mut self, halt: Halt) {
        tracing::error!(reason = %halt.0, "the Raft driver stops on this node");
        self.halted = Some(halt);
    }

    /// Applies a round's entries and snapshots; the outcomes of its entries, to answer once
    /// the round's job is written.
    fn apply(
        &mut self,
        applies: &[Apply],
        done: &mut RoundsDone,
    ) -> Result<Vec<Applied<M::Outcome>>, Halt> {
        let mut outcomes = Vec::new();
        for apply in applies {
            let group = apply.group();
            let Some(machine) = self.machines.get_mut(&group) else {
                return Err(Halt(format!(
                    "group {group} has committed entries but no state machine here"
                )));
            };
            match apply {
                Apply::Entry { position, kind, .. } => {
                    let outcome = match kind {
                        EntryKind::Normal(bytes) => Some(machine.apply(*position, bytes)?),
                        EntryKind::ConfChange { change, .. } => {
                            machine.skip(*position)?;
                            done.conf_changes.push((group, *change));
                            None
                        }
                        EntryKind::ConfTransition { .. } => {
                            machine.skip(*position)?;
                            None
                        }
                    };
                    outcomes.push((group, *position, outcome));
                }
                Apply::Snapshot { position, data, .. } => {
                    machine.restore(*position, data)?;
                    done.restored.push(group);
                    // Every proposal at or below the snapshot was decided elsewhere: its
                    // outcome here is unknown, so it fails (the caller retries).
                    let decided: Vec<(GroupId, u64)> = self
                        .pending
                        .range((group, 0)..=(group, position.index))
                        .map(|(k, _)| *k)
                        .collect();
                    for key in decided {
                        if let Some((_, reply)) = self.pending.remove(&key) {
                            reply(Err(ProposeFailure::Overwritten));
                        }
                    }
                }
            }
        }
        Ok(outcomes)
    }

    /// Answers the proposal made here at `position`'s index, if any: with `outcome` when it is
    /// the entry proposed (same term), else as overwritten.
    fn answer(&mut self, group: GroupId, position: LogPosition, outcome: Option<M::Outcome>) {
        let Some((term, reply)) = self.pending.remove(&(group, position.index)) else {
            return;
        };
        match outcome {
            Some(outcome) if term == position.term => reply(Ok((position.index, outcome))),
            _ => reply(Err(ProposeFailure::Overwritten)),
        }
    }

    /// Compacts `group`'s log when it grew long, or at once when a follower needs a snapshot.
    fn compact(&mut self, group: GroupId, now: bool) {
        let (Some(engine), Some(machine)) = (self.engine.as_mut(), self.machines.get(&group))
        else {
            return;
        };
        if !machine.can_snapshot() {
            return;
        }
        let Some(status) = engine.status(group) else {
            return;
        };
        let applied = machine.applied_index();
        let due = applied
            >= status
                .first_index
                .saturating_add(self.config.compact_after_entries);
        if (now || due) && applied >= status.first_index {
            if let Err(e) = engine.compact(group, applied, machine.snapshot()) {
                tracing::debug!(%group, error = %e, "log not compacted");
            }
        }
    }
}
