//! A deterministic simulation of Ferry nodes running the metadata group: multiraft engines
//! with in-memory stores in one process, a seeded network that drops, delays (so reorders) and
//! partitions, crashes that lose unsynced writes, restarts that rebuild the metadata from the
//! node's durable copy (a snapshot written with its applied index) and the log. Each node
//! applies the committed entries of group 0 to its own `MetaState`; the leader turns the nodes
//! recorded there into Raft configuration changes (`next_membership_step`), and a node added
//! by `AddNode` is started when its raft id is assigned.
//!
//! Invariants, checked at every applied entry and after every step: a committed index never
//! changes (term and state digest); every node that applied index i has the same digest at i;
//! at most one owner per (queue, epoch) across all nodes and time; a queue's epoch never
//! decreases along the log; at most one leader per term; each state's own invariants.
//! Adapted from multiraft/tests/support/sim.rs (test support is not importable across crates).

#![allow(dead_code, clippy::unwrap_used)]

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use ferry_cluster::meta::{ClusterId, MetaCommand, MetaError, MetaEvent, MetaState, NewNode};
use ferry_kernel::{NodeId, PlacementEpoch, QueueName};
use ferry_multiraft::{
    Apply, ConfChange, Engine, EngineConfig, EntryKind, GroupId, LogPosition, LogStore, MemStore,
    NodeId as PeerId, PersistId, Role,
};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// The metadata group.
pub const G0: GroupId = GroupId(0);
/// Simulated steps per engine tick.
pub const TICK_STEPS: u64 = 4;
/// Enough steps for several election timeouts.
pub const ELECTION_STEPS: u64 = 40 * TICK_STEPS;
/// The application key of a node's durable copy of its metadata.
const META_KEY: &[u8] = b"meta/state";

/// Fault rates of the network and the disks.
#[derive(Debug, Clone)]
pub struct Faults {
    /// Chance a packet is lost, per mille.
    pub drop_per_mille: u32,
    /// Packets arrive 1..=this many steps after being sent.
    pub delay_steps_max: u64,
    /// A synced write completes 0..=this many steps after being issued.
    pub sync_delay_steps_max: u64,
}

impl Faults {
    pub fn none() -> Self {
        Faults {
            drop_per_mille: 0,
            delay_steps_max: 1,
            sync_delay_steps_max: 0,
        }
    }

    pub fn lossy() -> Self {
        Faults {
            drop_per_mille: 50,
            delay_steps_max: 5,
            sync_delay_steps_max: 3,
        }
    }
}

#[derive(Debug)]
struct Packet {
    from: PeerId,
    to: PeerId,
    deliver_at: u64,
    bytes: Vec<u8>,
}

#[derive(Debug)]
pub struct SimNode {
    pub engine: Option<Engine>,
    pub store: MemStore,
    pending_syncs: VecDeque<(PersistId, u64)>,
    pub meta: MetaState,
    /// Removed from the group (it applied its own removal): never started again.
    pub retired: bool,
}

/// Counts of applied commands, to show the simulation exercised something.
#[derive(Debug, Default, Clone, Copy)]
pub struct Stats {
    pub accepted: u64,
    pub refused: u64,
    pub conf_changes: u64,
    pub snapshots_installed: u64,
    pub restarts: u64,
}

#[derive(Debug)]
pub struct Sim {
    pub seed: u64,
    pub rng: StdRng,
    pub now: u64,
    pub nodes: BTreeMap<PeerId, SimNode>,
    pub faults: Faults,
    pub compact_every_entries: u64,
    pub cluster_id: ClusterId,
    pub initial: Vec<NewNode>,
    pub stats: Stats,
    packets: Vec<Packet>,
    blocked: BTreeSet<(PeerId, PeerId)>,
    /// Every applied index: its term and the state digest after it.
    committed: BTreeMap<u64, (u64, u64)>,
    /// The result of each applied command, as the first node to apply it saw it.
    results: BTreeMap<u64, Result<MetaEvent, MetaError>>,
    /// (queue, epoch) → owner, across all nodes and time.
    owners: BTreeMap<(QueueName, PlacementEpoch), NodeId>,
    /// Each queue's epoch at the highest index applied so far.
    last_epochs: BTreeMap<QueueName, PlacementEpoch>,
    leaders: BTreeMap<u64, PeerId>,
    /// A configuration change proposed by the leader and not yet applied by it.
    conf_pending: Option<(PeerId, LogPosition)>,
    /// Nodes whose raft id was assigned, to start after the round.
    to_spawn: BTreeSet<PeerId>,
}

pub fn node_name(i: u64) -> NodeId {
    NodeId::new(format!("n{i}")).unwrap()
}

impl Sim {
    /// `voters` nodes n1..=n<voters> bootstrap the metadata group; the first leader proposes
    /// `Bootstrap` (see [`Sim::step`]).
    pub fn new(seed: u64, voters: u64) -> Self {
        let initial: Vec<NewNode> = (1..=voters)
            .map(|i| NewNode {
                id: node_name(i),
                client_addr: format!("10.0.0.{i}:7400"),
                peer_addr: format!("10.0.0.{i}:7401"),
            })
            .collect();
        let mut sim = Sim {
            seed,
            rng: StdRng::seed_from_u64(seed),
            now: 0,
            nodes: BTreeMap::new(),
            faults: Faults::none(),
            compact_every_entries: 0,
            cluster_id: ClusterId(u128::from(seed) << 64 | 0xc1),
            initial,
            stats: Stats::default(),
            packets: Vec::new(),
            blocked: BTreeSet::new(),
            committed: BTreeMap::new(),
            results: BTreeMap::new(),
            owners: BTreeMap::new(),
            last_epochs: BTreeMap::new(),
            leaders: BTreeMap::new(),
            conf_pending: None,
            to_spawn: BTreeSet::new(),
        };
        let ids: Vec<NodeId> = sim.initial.iter().map(|n| n.id.clone()).collect();
        let raft_ids = ferry_cluster::meta::bootstrap_raft_ids(&ids);
        let peers: Vec<PeerId> = raft_ids.iter().map(|(_, r)| PeerId(r.0)).collect();
        for &peer in &peers {
            let mut engine = Engine::open(sim.config(peer), Default::default()).unwrap();
            engine.bootstrap_group(G0, &peers).unwrap();
            let mut store = MemStore::new();
            let job = engine.round().persist.expect("bootstrap writes");
            store.write(&job).unwrap();
            engine.on_persisted(job.id()).unwrap();
            let mut meta = MetaState::new();
            meta.skip(1).unwrap();
            sim.nodes.insert(peer, SimNode::new(engine, store, meta));
        }
        sim
    }

    fn config(&self, node: PeerId) -> EngineConfig {
        EngineConfig {
            election_seed: self.seed ^ node.0.wrapping_mul(0x100_0000_01b3),
            ..EngineConfig::new(node)
        }
    }

    /// Starts a node whose raft id `AddNode` assigned: an empty group, made durable at once,
    /// that fills from the leader's snapshot.
    fn spawn(&mut self, peer: PeerId) {
        let mut engine = Engine::open(self.config(peer), Default::default()).unwrap();
        engine.create_group(G0).unwrap();
        let mut store = MemStore::new();
        let job = engine.round().persist.expect("group creation writes");
        store.write(&job).unwrap();
        engine.on_persisted(job.id()).unwrap();
        self.nodes
            .insert(peer, SimNode::new(engine, store, MetaState::new()));
    }

    pub fn engine(&self, node: PeerId) -> &Engine {
        self.nodes[&node].engine.as_ref().expect("node is up")
    }

    fn engine_mut(&mut self, node: PeerId) -> &mut Engine {
        self.nodes
            .get_mut(&node)
            .unwrap()
            .engine
            .as_mut()
            .expect("node is up")
    }

    pub fn is_up(&self, node: PeerId) -> bool {
        self.nodes[&node].engine.is_some()
    }

    pub fn node_ids(&self) -> Vec<PeerId> {
        self.nodes.keys().copied().collect()
    }

    /// Nodes that may be crashed, restarted or partitioned (not retired).
    pub fn live_ids(&self) -> Vec<PeerId> {
        self.nodes
            .iter()
            .filter(|(_, n)| !n.retired)
            .map(|(id, _)| *id)
            .collect()
    }

    // ---- faults ----

    pub fn isolate(&mut self, node: PeerId) {
        for other in self.node_ids() {
            if other != node {
                self.blocked.insert((node, other));
                self.blocked.insert((other, node));
            }
        }
    }

    pub fn block(&mut self, from: PeerId, to: PeerId) {
        self.blocked.insert((from, to));
    }

    pub fn heal(&mut self) {
        self.blocked.clear();
    }

    /// Stops a node: its unsynced writes and in-memory state are lost.
    pub fn crash(&mut self, node: PeerId) {
        let n = self.nodes.get_mut(&node).unwrap();
        n.engine = None;
        n.store.crash();
        n.pending_syncs.clear();
        n.meta = MetaState::new();
        self.packets.retain(|p| p.to != node);
    }

    /// Starts a crashed node: the engine from its durable log, the metadata from its durable
    /// copy (written atomically with the engine's applied index); the log after it is applied
    /// again as the engine hands it out.
    pub fn restart(&mut self, node: PeerId) {
        let config = self.config(node);
        let n = self.nodes.get_mut(&node).unwrap();
        assert!(n.engine.is_none() && !n.retired, "{node} is up or retired");
        let recovered = n.store.load().unwrap();
        let engine_applied = recovered.applied_index(G0).unwrap();
        n.meta = match n.store.app_get(META_KEY).unwrap() {
            Some(bytes) => MetaState::restore(&bytes).unwrap(),
            None => {
                let mut meta = MetaState::new();
                if engine_applied > 0 {
                    meta.skip(engine_applied).unwrap();
                }
                meta
            }
        };
        assert_eq!(
            n.meta.applied_index(),
            engine_applied,
            "{node}: metadata and engine disagree (seed {})",
            self.seed
        );
        n.engine = Some(Engine::open(config, recovered).unwrap());
        self.stats.restarts += 1;
    }

    pub fn unsynced_jobs(&self, node: PeerId) -> usize {
        self.nodes[&node].store.unsynced_job_count()
    }

    // ---- the step ----

    /// One simulated step: deliver, tick, complete syncs, run rounds, start added nodes,
    /// bootstrap and reconcile membership through the leader, check invariants.
    pub fn step(&mut self) {
        self.now += 1;
        self.deliver();
        for node in self.node_ids() {
            if self.is_up(node) && (self.now + node.0).is_multiple_of(TICK_STEPS) {
                self.engine_mut(node).tick();
            }
        }
        self.complete_syncs();
        for node in self.node_ids() {
            self.run_rounds(node);
        }
        for peer in std::mem::take(&mut self.to_spawn) {
            if !self.nodes.contains_key(&peer) {
                self.spawn(peer);
            }
        }
        self.drive_leader();
        self.check_invariants();
    }

    pub fn run(&mut self, steps: u64) {
        for _ in 0..steps {
            self.step();
        }
    }

    /// Steps until `done` holds; false if it never did within `steps_max`.
    pub fn run_until(&mut self, steps_max: u64, mut done: impl FnMut(&Sim) -> bool) -> bool {
        for _ in 0..steps_max {
            if done(self) {
                return true;
            }
            self.step();
        }
        done(self)
    }

    fn deliver(&mut self) {
        let now = self.now;
        let (due, later): (Vec<Packet>, Vec<Packet>) = std::mem::take(&mut self.packets)
            .into_iter()
            .partition(|p| p.deliver_at <= now);
        self.packets = later;
        for packet in due {
            let Some(engine) = self
                .nodes
                .get_mut(&packet.to)
                .and_then(|n| n.engine.as_mut())
            else {
                continue;
            };
            engine.step(packet.from, &packet.bytes).unwrap();
        }
    }

    fn complete_syncs(&mut self) {
        let now = self.now;
        for n in self.nodes.values_mut() {
            let mut done = 0;
            let mut last_done = None;
            while n.pending_syncs.front().is_some_and(|(_, due)| *due <= now) {
                last_done = n.pending_syncs.pop_front().map(|(id, _)| id);
                done += 1;
            }
            if let Some(id) = last_done {
                n.store.sync_jobs(done);
                n.engine.as_mut().unwrap().on_persisted(id).unwrap();
            }
        }
    }

    fn run_rounds(&mut self, node: PeerId) {
        for _ in 0..8 {
            let Some(engine) = self.nodes.get_mut(&node).and_then(|n| n.engine.as_mut()) else {
                return;
            };
            if !engine.has_ready() {
                return;
            }
            let round = engine.round();
            for change in &round.role_changes {
                if change.role == Role::Leader {
                    self.note_leader(node, change.term);
                }
            }
            let retire = self.apply_all(node, &round.applies);
            self.make_snapshots(node, &round.snapshot_requests);
            match round.persist {
                Some(mut job) => {
                    let n = self.nodes.get_mut(&node).unwrap();
                    if !round.applies.is_empty() {
                        job.put_app(META_KEY, n.meta.snapshot());
                    }
                    n.store.write_unsynced(&job);
                    let delay = self.rng.random_range(0..=self.faults.sync_delay_steps_max);
                    let n = self.nodes.get_mut(&node).unwrap();
                    let due = n
                        .pending_syncs
                        .back()
                        .map_or(0, |(_, d)| *d)
                        .max(self.now + delay);
                    n.pending_syncs.push_back((job.id(), due));
                }
                None => assert!(round.applies.is_empty(), "applies without a job"),
            }
            for batch in round.batches {
                self.send(node, batch.to, batch.bytes.to_vec());
            }
            for snapshot in round.snapshots {
                self.send(node, snapshot.to, snapshot.as_batch().to_vec());
            }
            self.maybe_compact(node);
            if retire {
                // It applied its own removal: it leaves for good.
                let n = self.nodes.get_mut(&node).unwrap();
                n.engine = None;
                n.retired = true;
                n.pending_syncs.clear();
                self.packets.retain(|p| p.to != node);
                return;
            }
        }
    }

    fn send(&mut self, from: PeerId, to: PeerId, bytes: Vec<u8>) {
        if self.blocked.contains(&(from, to))
            || self.rng.random_range(0..1000) < self.faults.drop_per_mille
        {
            return;
        }
        let delay = self
            .rng
            .random_range(1..=self.faults.delay_steps_max.max(1));
        self.packets.push(Packet {
            from,
            to,
            deliver_at: self.now + delay,
            bytes,
        });
    }

    fn make_snapshots(&mut self, node: PeerId, groups: &[GroupId]) {
        if groups.is_empty() {
            return;
        }
        let n = self.nodes.get_mut(&node).unwrap();
        let engine = n.engine.as_mut().unwrap();
        let applied = n.meta.applied_index();
        if applied >= engine.status(G0).unwrap().first_index {
            engine.compact(G0, applied, n.meta.snapshot()).unwrap();
        }
    }

    fn maybe_compact(&mut self, node: PeerId) {
        if self.compact_every_entries == 0 {
            return;
        }
        let n = self.nodes.get_mut(&node).unwrap();
        let Some(engine) = n.engine.as_mut() else {
            return;
        };
        let applied = n.meta.applied_index();
        let Some(status) = engine.status(G0) else {
            return;
        };
        if applied >= status.first_index + self.compact_every_entries {
            engine.compact(G0, applied, n.meta.snapshot()).unwrap();
        }
    }

    // ---- the state machine and the invariants ----

    /// Applies a round's entries; true if the node applied its own removal.
    fn apply_all(&mut self, node: PeerId, applies: &[Apply]) -> bool {
        let mut retire = false;
        for apply in applies {
            match apply {
                Apply::Entry { position, kind, .. } => {
                    retire |= self.apply_entry(node, *position, kind);
                }
                Apply::Snapshot { position, data, .. } => {
                    self.apply_snapshot(node, *position, data);
                }
            }
        }
        retire
    }

    fn apply_entry(&mut self, node: PeerId, position: LogPosition, kind: &EntryKind) -> bool {
        let seed = self.seed;
        let meta = &mut self.nodes.get_mut(&node).unwrap().meta;
        assert_eq!(
            position.index,
            meta.applied_index() + 1,
            "{node}: applied out of order (seed {seed})"
        );
        let mut retire = false;
        match kind {
            EntryKind::Normal(bytes) => {
                let result = meta
                    .apply_entry(position.index, bytes)
                    .map(|applied| applied.event);
                if let Ok(MetaEvent::NodeAdded { raft_id, .. }) = &result {
                    self.to_spawn.insert(PeerId(raft_id.0));
                }
                if !self.results.contains_key(&position.index) && !bytes.is_empty() {
                    match &result {
                        Ok(_) => self.stats.accepted += 1,
                        Err(_) => self.stats.refused += 1,
                    }
                    self.results.insert(position.index, result);
                }
            }
            EntryKind::ConfChange { change, .. } => {
                meta.skip(position.index).unwrap();
                retire = *change == ConfChange::Remove(node);
                self.stats.conf_changes += 1;
            }
            EntryKind::ConfTransition { .. } => meta.skip(position.index).unwrap(),
        }
        self.record(node, position);
        retire
    }

    fn apply_snapshot(&mut self, node: PeerId, position: LogPosition, data: &[u8]) {
        let meta = if data.is_empty() {
            let mut meta = MetaState::new();
            meta.skip(position.index).unwrap();
            meta
        } else {
            MetaState::restore(data).unwrap()
        };
        assert_eq!(
            meta.applied_index(),
            position.index,
            "snapshot at its index"
        );
        let n = self.nodes.get_mut(&node).unwrap();
        assert!(
            meta.applied_index() >= n.meta.applied_index(),
            "{node}: snapshot goes back (seed {})",
            self.seed
        );
        n.meta = meta;
        self.stats.snapshots_installed += 1;
        self.record(node, position);
    }

    /// Checks `node`'s state right after it reached `position`.
    fn record(&mut self, node: PeerId, position: LogPosition) {
        let seed = self.seed;
        let meta = &self.nodes[&node].meta;
        if let Err(e) = meta.check_invariants() {
            panic!("{node} at {}: {e} (seed {seed})", position.index);
        }
        let seen = (position.term, meta.digest());
        match self.committed.get(&position.index) {
            Some(first) => assert_eq!(
                *first, seen,
                "{node}: state at index {} differs from another node's (seed {seed})",
                position.index
            ),
            None => {
                // First time any node reaches this index: indexes are first reached in
                // increasing order, so this is the log's next state.
                self.committed.insert(position.index, seen);
                for (name, q) in meta.queues() {
                    let last = self.last_epochs.entry(name.clone()).or_default();
                    assert!(
                        q.owner.epoch >= *last,
                        "queue {name}: epoch {} after {last} (seed {seed})",
                        q.owner.epoch
                    );
                    *last = q.owner.epoch;
                }
            }
        }
        for (name, q) in meta.queues() {
            let first = self
                .owners
                .entry((name.clone(), q.owner.epoch))
                .or_insert_with(|| q.owner.node.clone());
            assert_eq!(
                first, &q.owner.node,
                "queue {name} epoch {}: two owners (seed {seed})",
                q.owner.epoch
            );
        }
    }

    fn note_leader(&mut self, node: PeerId, term: u64) {
        let first = *self.leaders.entry(term).or_insert(node);
        assert_eq!(
            first, node,
            "two leaders in term {term} (seed {})",
            self.seed
        );
    }

    fn check_invariants(&mut self) {
        let mut leaders = Vec::new();
        for (&node, n) in &self.nodes {
            let Some(engine) = &n.engine else { continue };
            let Some(status) = engine.status(G0) else {
                continue;
            };
            assert_eq!(
                status.applied_index,
                n.meta.applied_index(),
                "{node}: apply lag (seed {})",
                self.seed
            );
            if status.role == Role::Leader {
                leaders.push((node, status.term));
            }
        }
        for (node, term) in leaders {
            self.note_leader(node, term);
        }
    }

    // ---- the leader's driver ----

    /// What the metadata leader's shell does each step: propose `Bootstrap` while the state
    /// has no cluster id, and the next membership step whenever no change is pending.
    fn drive_leader(&mut self) {
        let Some(leader) = self.leader() else {
            return;
        };
        if self.nodes[&leader].meta.cluster_id().is_none() {
            let bootstrap = MetaCommand::Bootstrap {
                cluster_id: self.cluster_id,
                nodes: self.initial.clone(),
            };
            if self.now.is_multiple_of(TICK_STEPS * 8) {
                let _ = self.engine_mut(leader).propose(G0, bootstrap.encode());
            }
            return;
        }
        let status = self.engine(leader).status(G0).unwrap();
        if let Some((by, position)) = self.conf_pending {
            let applied_by_leader = by == leader && status.applied_index >= position.index;
            let lost = by != leader || status.term != position.term;
            if !applied_by_leader && !lost {
                return;
            }
            self.conf_pending = None;
        }
        let meta = &self.nodes[&leader].meta;
        let Some(change) = ferry_cluster::next_conf_change(meta, &status) else {
            return;
        };
        if let Ok(position) = self.engine_mut(leader).propose_conf_change(G0, change) {
            self.conf_pending = Some((leader, position));
        }
    }

    // ---- queries for tests ----

    /// The up node that leads group 0 in the highest term, if any.
    pub fn leader(&self) -> Option<PeerId> {
        self.nodes
            .iter()
            .filter_map(|(&id, n)| Some((id, n.engine.as_ref()?.status(G0)?)))
            .filter(|(_, s)| s.role == Role::Leader)
            .max_by_key(|(_, s)| s.term)
            .map(|(id, _)| id)
    }

    /// The leader's metadata, which a proposer consults (e.g. to choose an owner).
    pub fn leader_meta(&self) -> Option<&MetaState> {
        Some(&self.nodes[&self.leader()?].meta)
    }

    /// Proposes a command through the current leader; `None` if there is none or it refused.
    pub fn propose(&mut self, command: &MetaCommand) -> Option<LogPosition> {
        let leader = self.leader()?;
        self.engine_mut(leader).propose(G0, command.encode()).ok()
    }

    /// Whether `position` was applied somewhere with its term.
    pub fn is_committed(&self, position: LogPosition) -> bool {
        self.committed
            .get(&position.index)
            .is_some_and(|(term, _)| *term == position.term)
    }

    /// A proposal that can no longer commit.
    pub fn is_lost(&self, position: LogPosition) -> bool {
        match self.committed.get(&position.index) {
            Some((term, _)) => *term != position.term,
            None => self
                .leader()
                .is_some_and(|l| self.engine(l).status(G0).unwrap().term != position.term),
        }
    }

    /// Refusals by kind (the error's variant name).
    pub fn refusals(&self) -> BTreeMap<String, u64> {
        let mut out = BTreeMap::new();
        for result in self.results.values() {
            if let Err(e) = result {
                let text = format!("{e:?}");
                let kind = text.split([' ', '{', '(']).next().unwrap_or("").to_owned();
                *out.entry(kind).or_default() += 1;
            }
        }
        out
    }

    /// The result of the command applied at `index`.
    pub fn result(&self, index: u64) -> Option<&Result<MetaEvent, MetaError>> {
        self.results.get(&index)
    }

    /// Every up member of the group applied everything the leader committed, and the Raft
    /// configuration matches the nodes recorded in the metadata.
    pub fn converged(&self) -> bool {
        let Some(leader) = self.leader() else {
            return false;
        };
        let status = self.engine(leader).status(G0).unwrap();
        let meta = &self.nodes[&leader].meta;
        meta.cluster_id().is_some()
            && ferry_cluster::next_conf_change(meta, &status).is_none()
            && status.applied_index == status.commit_index
            && status.voters.iter().chain(&status.learners).all(|m| {
                self.nodes.get(m).is_some_and(|n| {
                    n.engine.as_ref().is_some_and(|e| {
                        e.status(G0).is_some_and(|s| {
                            s.applied_index == status.commit_index && s.leader == Some(leader)
                        })
                    })
                })
            })
    }

    /// Digests of every up, not retired node.
    pub fn digests(&self) -> BTreeMap<PeerId, (u64, u64)> {
        self.nodes
            .iter()
            .filter(|(_, n)| n.engine.is_some())
            .map(|(id, n)| (*id, (n.meta.applied_index(), n.meta.digest())))
            .collect()
    }

    /// Every node's view, for failure messages.
    pub fn describe(&self) -> String {
        let mut out = format!("seed {} step {}:", self.seed, self.now);
        for (&id, n) in &self.nodes {
            match n.engine.as_ref().map(|e| e.status(G0)) {
                None if n.retired => out += &format!("\n  {id}: retired"),
                None => out += &format!("\n  {id}: down"),
                Some(s) => out += &format!("\n  {id}: {s:?}"),
            }
        }
        out
    }
}

impl SimNode {
    fn new(engine: Engine, store: MemStore, meta: MetaState) -> Self {
        SimNode {
            engine: Some(engine),
            store,
            pending_syncs: VecDeque::new(),
            meta,
            retired: false,
        }
    }
}
