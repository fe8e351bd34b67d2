//! Simulations of the metadata group running the node's real driver (`driver.rs`: the node's
//! thread around `ferry_multiraft::Driver` with the real `MetaMachine`) on
//! `ferry_multiraft::sim`: many nodes in one process, simulated time, a seeded network that
//! drops, delays and partitions. Each node's store is a [`SimStore`], opened as a node opens
//! its store ([`open_start`](super::open_start)), so a node restarts from what it made
//! durable; a node can be killed between rounds or die in a synced write, losing it. As the
//! node's async tasks would, the cluster proposes `Bootstrap` through the first leader and
//! starts a node as soon as the metadata assigns it a raft id (`AddNode`); the leader's
//! driver turns the recorded nodes into Raft membership changes itself. A node that applied its
//! own removal leaves for good.
//!
//! [`checks`] checks the invariants at every entry each node's machine applies and after every
//! wake-up of its driver.

// A failing seed says itself on stderr, and a random run shows what it exercised there.
#![allow(clippy::unwrap_used, clippy::print_stderr)]

mod checks;
mod random;
mod shards;
mod tests;

use std::collections::BTreeMap;
use std::sync::atomic::AtomicUsize;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use ferry_cluster::meta::{
    ClusterId, MetaCommand, MetaError, MetaEvent, MetaState, NewNode, NodeState, RaftId, RequestId,
};
use ferry_cluster::{next_conf_change, StartMode};
use ferry_kernel::NodeId;
use ferry_multiraft::sim::{Faults, Replica, Sim, SimStore};
use ferry_multiraft::{LogStore, NodeId as PeerId};
use tokio::sync::{oneshot, watch};

use super::driver::{Driver, Input, Proposed, META_GROUP};
use super::shard::sim_link::{inbox, Inboxes, SnapshotLink};
use super::view::{MetaView, RaftCounters};
use checks::{lock, Checks};

/// Enough steps for several election timeouts (a tick every 4 steps).
const ELECTION_STEPS: u64 = 160;
/// Most times a command is proposed again after its attempt was lost.
const ATTEMPTS_MAX: u32 = 20;
/// The leader proposes `Bootstrap` every this many steps until the cluster is formed.
const BOOTSTRAP_EVERY_STEPS: u64 = 32;

/// A node's driver on the simulator, checked after every wake-up. The batches a step
/// delivers wait for its wake-up and are handled together, as the node's thread handles the
/// inputs it finds waiting.
struct SimNode {
    peer: PeerId,
    driver: Driver,
    view: watch::Receiver<Arc<MetaView>>,
    checks: checks::Shared,
    received: Vec<Input>,
}

impl SimNode {
    fn woke(&self) {
        if self.driver.halted().is_none() {
            lock(&self.checks).woke(self.peer, &self.view.borrow());
        }
    }
}

impl Replica for SimNode {
    fn receive(&mut self, from: PeerId, bytes: &[u8]) {
        self.received.push(Input::Batch {
            from,
            bytes: Bytes::copy_from_slice(bytes),
        });
    }

    fn wake(&mut self, tick: bool) {
        self.driver.step(std::mem::take(&mut self.received), tick);
        self.woke();
    }
}

/// A node of the cluster, up or down.
struct Member {
    name: NodeId,
    mode: StartMode,
    store: SimStore,
    /// Set to die in its next synced write.
    dying: bool,
    /// It applied its own removal: never started again.
    retired: bool,
}

/// See the module docs.
struct Cluster {
    sim: Sim<SimNode>,
    members: BTreeMap<PeerId, Member>,
    checks: checks::Shared,
    /// Passed to every driver started from now on.
    compact_after_entries: u64,
    initial: Vec<NewNode>,
    cluster_id: ClusterId,
    next_request: u128,
    /// Each node's staged shard snapshot data (queue shards' snapshots carry their data).
    inboxes: Inboxes,
    /// Shard snapshots sent, by every node.
    snapshots_sent: Arc<AtomicUsize>,
}

fn node_name(i: u64) -> NodeId {
    NodeId::new(format!("n{i}")).unwrap()
}

impl Cluster {
    /// `voters` nodes n1..=n<voters> bootstrap the metadata group, each driver compacting its
    /// log after `compact_after_entries` entries.
    fn new(seed: u64, voters: u64, compact_after_entries: u64) -> Self {
        let initial: Vec<NewNode> = (1..=voters)
            .map(|i| NewNode {
                id: node_name(i),
                client_addr: format!("10.0.0.{i}:7400"),
                peer_addr: format!("10.0.0.{i}:7401"),
            })
            .collect();
        let voters: Vec<(NodeId, String)> = initial
            .iter()
            .map(|n| (n.id.clone(), n.peer_addr.clone()))
            .collect();
        let ids: Vec<NodeId> = voters.iter().map(|(id, _)| id.clone()).collect();
        let mut cluster = Cluster {
            sim: Sim::new(seed, Faults::none()),
            members: BTreeMap::new(),
            checks: Checks::new(seed),
            compact_after_entries,
            initial,
            cluster_id: ClusterId(u128::from(seed) << 64 | 0xc1),
            next_request: 0,
            inboxes: Inboxes::default(),
            snapshots_sent: Arc::default(),
        };
        for (name, raft_id) in ferry_cluster::meta::bootstrap_raft_ids(&ids) {
            let member = Member {
                name,
                mode: StartMode::Initial(voters.clone()),
                store: SimStore::new(),
                dying: false,
                retired: false,
            };
            let peer = PeerId(raft_id.0);
            cluster.members.insert(peer, member);
            cluster.start(peer);
        }
        cluster.sim.collect();
        cluster
    }

    /// Starts node `peer`'s driver from its store, as the node's own start does: resumed from
    /// its Raft records and durable metadata, or bootstrapped, or waiting to join (then told
    /// its raft id at once: the metadata assigned it). Checks the metadata read back is at the
    /// applied index of the Raft records.
    fn start(&mut self, peer: PeerId) {
        let member = &self.members[&peer];
        let store = Box::new(member.store.clone());
        let recovered = store.load().unwrap().applied_index(META_GROUP);
        let tick = Duration::from_millis(100);
        let mut start = super::open_start(&member.name, &member.mode, store, tick, self.sim.seed)
            .unwrap_or_else(|e| panic!("{peer} does not open: {e}"));
        if let Some(applied) = recovered {
            assert_eq!(
                start.meta.applied_index(),
                applied,
                "{peer}: metadata and Raft records disagree (seed {})",
                self.sim.seed
            );
        }
        start.rounds.compact_after_entries = self.compact_after_entries;
        start.snapshots = inbox(&self.inboxes, peer);
        lock(&self.checks).started(peer, &start.meta);
        let join = start.engine.is_none();
        let first_view = MetaView {
            meta: start.meta.clone(),
            ..MetaView::empty()
        };
        let (view_tx, view) = watch::channel(Arc::new(first_view));
        let outbound = Box::new(SnapshotLink {
            inner: self.sim.outbound(peer),
            store: member.store.clone(),
            inboxes: Arc::clone(&self.inboxes),
            snapshots_sent: Arc::clone(&self.snapshots_sent),
            skip: Some(META_GROUP),
        });
        let counters = Arc::new(RaftCounters::default());
        let mut driver = Driver::new(start, outbound, view_tx, counters);
        driver.set_probe(Checks::probe(&self.checks, peer));
        driver.begin();
        if join {
            driver.step([Input::Join(RaftId(peer.0))], false);
        }
        let checks = Arc::clone(&self.checks);
        let node = SimNode {
            peer,
            driver,
            view,
            checks,
            received: Vec::new(),
        };
        node.woke();
        self.sim.add(peer, node);
    }

    // ---- faults ----

    /// Every node, up or down, retired or not.
    fn all_ids(&self) -> Vec<PeerId> {
        self.members.keys().copied().collect()
    }

    /// Nodes that may be crashed, restarted or partitioned (not retired).
    fn live_ids(&self) -> Vec<PeerId> {
        let live = self.members.iter().filter(|(_, m)| !m.retired);
        live.map(|(id, _)| *id).collect()
    }

    fn is_up(&self, peer: PeerId) -> bool {
        self.sim.is_up(peer)
    }

    /// Down, or set to die at its next write.
    fn is_failing(&self, peer: PeerId) -> bool {
        !self.is_up(peer) || self.members[&peer].dying
    }

    /// Kills node `peer` between two rounds: what it wrote is durable, the rest is lost.
    fn crash(&mut self, peer: PeerId) {
        self.sim.crash(peer);
        let member = self.members.get_mut(&peer).unwrap();
        member.store.crash();
        member.dying = false;
    }

    /// Node `peer` dies in its next synced write, losing it (taken down after the step).
    fn crash_in_next_write(&mut self, peer: PeerId) {
        let member = self.members.get_mut(&peer).unwrap();
        member.store.die_in_next_write();
        member.dying = true;
    }

    /// Starts a crashed node again from its store.
    fn restart(&mut self, peer: PeerId) {
        let member = &self.members[&peer];
        assert!(
            !self.is_up(peer) && !member.retired,
            "{peer} is up or retired"
        );
        self.start(peer);
        lock(&self.checks).stats.restarts += 1;
    }

    fn isolate(&mut self, peer: PeerId) {
        let all = self.all_ids();
        self.sim.isolate(peer, &all);
    }

    fn block(&mut self, from: PeerId, to: PeerId) {
        self.sim.block(from, to);
    }

    fn heal(&mut self) {
        self.sim.heal();
    }

    fn set_faults(&mut self, faults: Faults) {
        self.sim.faults = faults;
    }

    /// The store of node `peer`.
    fn store(&self, peer: PeerId) -> &SimStore {
        &self.members[&peer].store
    }

    // ---- the step ----

    /// One simulated step, then what the node's shell would do: take down the nodes that died
    /// in a write, retire those that applied their own removal, start those the metadata
    /// added, propose `Bootstrap` through the leader until the cluster is formed.
    fn step(&mut self) {
        self.sim.step();
        self.take_down_the_dead();
        self.retire_removed();
        self.start_added();
        self.bootstrap_through_leader();
    }

    fn run(&mut self, steps: u64) {
        for _ in 0..steps {
            self.step();
        }
    }

    /// Steps until `done` holds; false if it never did within `steps_max`.
    fn run_until(&mut self, steps_max: u64, mut done: impl FnMut(&Self) -> bool) -> bool {
        for _ in 0..steps_max {
            if done(self) {
                return true;
            }
            self.step();
        }
        done(self)
    }

    fn take_down_the_dead(&mut self) {
        let halted: Vec<PeerId> = self
            .sim
            .replicas()
            .filter(|(_, n)| n.driver.halted().is_some())
            .map(|(id, _)| id)
            .collect();
        for peer in halted {
            let halt = self.sim.replica(peer).unwrap().driver.halted().cloned();
            assert!(
                self.members[&peer].store.died(),
                "{peer} halted by itself: {halt:?} (seed {})",
                self.sim.seed
            );
            self.crash(peer);
        }
    }

    fn retire_removed(&mut self) {
        let removed: Vec<PeerId> = self
            .sim
            .replicas()
            .filter(|(peer, n)| applied_own_removal(*peer, &n.view.borrow()))
            .map(|(id, _)| id)
            .collect();
        for peer in removed {
            self.sim.crash(peer);
            self.members.get_mut(&peer).unwrap().retired = true;
        }
    }

    fn start_added(&mut self) {
        let mut added: BTreeMap<PeerId, (NodeId, String)> = BTreeMap::new();
        for (_, node) in self.sim.replicas() {
            for (name, info) in node.view.borrow().meta.nodes() {
                let peer = PeerId(info.raft_id.0);
                if info.is_active() && !self.members.contains_key(&peer) {
                    added.insert(peer, (name.clone(), info.peer_addr.clone()));
                }
            }
        }
        for (peer, (name, peer_addr)) in added {
            let member = Member {
                name,
                mode: StartMode::Join(peer_addr),
                store: SimStore::new(),
                dying: false,
                retired: false,
            };
            self.members.insert(peer, member);
            self.start(peer);
        }
    }

    fn bootstrap_through_leader(&mut self) {
        let leader = self.leader().and_then(|l| self.view(l));
        let unformed = leader.is_some_and(|v| v.meta.cluster_id().is_none());
        if !unformed || !self.sim.now.is_multiple_of(BOOTSTRAP_EVERY_STEPS) {
            return;
        }
        let bootstrap = MetaCommand::Bootstrap {
            cluster_id: self.cluster_id,
            nodes: self.initial.clone(),
        };
        self.propose(&bootstrap);
    }

    // ---- proposals ----

    /// Proposes `command` through the current leader, if any; its answer.
    fn propose(&mut self, command: &MetaCommand) -> Option<oneshot::Receiver<Proposed>> {
        let leader = self.leader()?;
        Some(self.submit(leader, command.encode()))
    }

    /// Hands a proposal to node `peer`'s driver (its first round runs at once).
    fn submit(&mut self, peer: PeerId, command: Vec<u8>) -> oneshot::Receiver<Proposed> {
        let mut answers = self.submit_together(peer, vec![command]);
        answers.pop().expect("invariant: one answer per command")
    }

    /// Hands proposals to node `peer`'s driver in one wake-up: one round appends them all.
    fn submit_together(
        &mut self,
        peer: PeerId,
        commands: Vec<Vec<u8>>,
    ) -> Vec<oneshot::Receiver<Proposed>> {
        let mut inputs = Vec::new();
        let mut answers = Vec::new();
        for command in commands {
            let (reply, answer) = oneshot::channel();
            inputs.push(Input::Propose { command, reply });
            answers.push(answer);
        }
        let node = self.sim.replica_mut(peer).unwrap();
        node.driver.step(inputs, false);
        node.woke();
        self.sim.collect();
        answers
    }

    /// What the network did so far.
    fn trace(&self) -> Vec<(u64, ferry_multiraft::sim::Traced)> {
        self.sim.trace().to_vec()
    }

    /// Proposes `command` (with a request id of its own, so an attempt that was applied after
    /// all is not applied twice) until an attempt is applied; how the first application went.
    fn propose_and_wait(&mut self, command: &MetaCommand) -> Result<MetaEvent, MetaError> {
        self.next_request += 1;
        let bytes = command.encode_request(Some(RequestId(self.next_request)));
        for _ in 0..ATTEMPTS_MAX {
            if !self.run_until(ELECTION_STEPS * 4, |c| c.leader().is_some()) {
                break;
            }
            let leader = self.leader().unwrap();
            let answer = self.submit(leader, bytes.clone());
            if let Some(outcome) = self.wait(answer) {
                let Ok(MetaEvent::Repeated { first_index }) = outcome else {
                    return outcome;
                };
                // An earlier attempt was applied after all: how that went.
                let first = lock(&self.checks).result(first_index).cloned();
                return first.expect("invariant: the first attempt applied before");
            }
            // Lost (a leader change, a crash, a membership change in progress): again, a
            // tick later.
            self.run(self.sim.tick_steps);
        }
        panic!("{command:?} not applied: {}", self.describe());
    }

    /// Steps until `answer` says how its proposal was applied; `None` if it was lost.
    fn wait(
        &mut self,
        mut answer: oneshot::Receiver<Proposed>,
    ) -> Option<Result<MetaEvent, MetaError>> {
        for _ in 0..ELECTION_STEPS * 4 {
            match answer.try_recv() {
                Ok(outcome) => return outcome.ok().map(|(_, applied)| applied),
                Err(oneshot::error::TryRecvError::Closed) => return None,
                Err(oneshot::error::TryRecvError::Empty) => self.step(),
            }
        }
        None
    }

    // ---- queries ----

    /// Node `peer`'s last published view, if it is up.
    fn view(&self, peer: PeerId) -> Option<Arc<MetaView>> {
        Some(self.sim.replica(peer)?.view.borrow().clone())
    }

    /// The up node that leads group 0 in the highest term, if any.
    fn leader(&self) -> Option<PeerId> {
        self.sim
            .replicas()
            .filter_map(|(id, n)| Some((id, n.view.borrow().group.clone()?)))
            .filter(|(_, g)| g.role == ferry_multiraft::Role::Leader)
            .max_by_key(|(_, g)| g.term)
            .map(|(id, _)| id)
    }

    /// The leader's metadata, which a proposer consults (e.g. to choose an owner).
    fn leader_meta(&self) -> Option<MetaState> {
        Some(self.view(self.leader()?)?.meta.clone())
    }

    /// The checker the nodes report to.
    fn checks(&self) -> &checks::Shared {
        &self.checks
    }

    /// The term of the entry applied at `index`, once any node applied it.
    fn term_at(&self, index: u64) -> Option<u64> {
        lock(&self.checks).term_at(index)
    }

    /// The up, not retired nodes.
    fn up_ids(&self) -> Vec<PeerId> {
        self.sim.ids()
    }

    /// Every member of the group (as the leader sees it) is up and applied everything the
    /// leader committed, and the Raft configuration matches the nodes in the metadata.
    fn converged(&self) -> bool {
        let Some(leader) = self.leader() else {
            return false;
        };
        let view = self.view(leader).unwrap();
        let status = view.group.as_ref().unwrap();
        let caught_up = |peer: &PeerId| {
            self.view(*peer).is_some_and(|v| {
                v.group.as_ref().is_some_and(|g| {
                    g.applied_index == status.commit_index && g.leader == Some(leader)
                })
            })
        };
        // Everything in the leader's log committed: its own term's first entry too, so that
        // entries of earlier terms whose commit a power loss took are committed again.
        view.meta.cluster_id().is_some()
            && next_conf_change(&view.meta, status).is_none()
            && status.commit_index == status.last_index
            && status.applied_index == status.commit_index
            && status.voters.iter().chain(&status.learners).all(caught_up)
    }

    /// Steps until the cluster converged; checks every member holds the leader's metadata.
    fn converge(&mut self) {
        assert!(
            self.run_until(ELECTION_STEPS * 4, Cluster::converged),
            "no convergence: {}",
            self.describe()
        );
        let leader = self.view(self.leader().unwrap()).unwrap();
        let expected = (leader.meta.applied_index(), leader.meta.digest());
        let status = leader.group.as_ref().unwrap();
        for m in status.voters.iter().chain(&status.learners) {
            let meta = &self.view(*m).unwrap().meta;
            assert_eq!(
                (meta.applied_index(), meta.digest()),
                expected,
                "{m}: {}",
                self.describe()
            );
        }
    }

    /// Every node's view, for failure messages.
    fn describe(&self) -> String {
        let mut out = format!("seed {} step {}:", self.sim.seed, self.sim.now);
        for (id, member) in &self.members {
            match self.view(*id) {
                None if member.retired => out += &format!("\n  {id}: retired"),
                None => out += &format!("\n  {id}: down"),
                Some(v) => out += &format!("\n  {id}: {:?}", v.group),
            }
        }
        out
    }
}

/// Whether the node `peer` whose view this is applied its own removal: removed in its
/// metadata and no longer in its Raft configuration.
fn applied_own_removal(peer: PeerId, view: &MetaView) -> bool {
    let removed = view
        .node_by_raft_id(RaftId(peer.0))
        .is_some_and(|(_, n)| n.state == NodeState::Removed);
    let member = view
        .group
        .as_ref()
        .is_some_and(|g| g.voters.contains(&peer) || g.learners.contains(&peer));
    removed && !member
}
