//! A deterministic simulation of many engines in one process: a seeded network that drops,
//! delays (so reorders) and partitions (both ways or one way), simulated ticks, in-memory
//! stores whose unsynced writes a crash loses, and a toy state machine (a hash chain of applied
//! entries). Invariants are checked after every step. Tests script runs with the hooks of
//! `script.rs` (hold, drop and release messages, stall disks, a trace) and share the queries
//! and waits of `scenario.rs`.

#![allow(dead_code, clippy::unwrap_used)]

pub mod scenario;
pub mod script;

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use ferry_multiraft::{
    Apply, Engine, EngineConfig, EntryKind, GroupId, LogPosition, LogStore, MemStore, NodeId,
    PersistId, Role, RoleChange,
};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use script::{Applied, Event, Msg, Script};

/// Simulated steps per engine tick.
pub const TICK_STEPS: u64 = 4;
/// Hash of a group's state right after bootstrap (applied index 1, nothing applied).
const BOOT_HASH: u64 = 0x5eed;

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
    from: NodeId,
    to: NodeId,
    deliver_at: u64,
    bytes: bytes::Bytes,
    /// What the batch holds, decoded.
    messages: Vec<Msg>,
}

/// The toy state machine of one group on one node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct AppState {
    applied_index: u64,
    hash: u64,
}

impl AppState {
    fn encode(self) -> Vec<u8> {
        let mut v = self.applied_index.to_be_bytes().to_vec();
        v.extend_from_slice(&self.hash.to_be_bytes());
        v
    }

    fn decode(bytes: &[u8]) -> Self {
        assert_eq!(bytes.len(), 16, "app state is 16 bytes");
        AppState {
            applied_index: u64::from_be_bytes(bytes[..8].try_into().unwrap()),
            hash: u64::from_be_bytes(bytes[8..].try_into().unwrap()),
        }
    }
}

#[derive(Debug)]
pub struct SimNode {
    pub engine: Option<Engine>,
    pub store: MemStore,
    /// Jobs written unsynced, with the step their sync completes.
    pending_syncs: VecDeque<(PersistId, u64)>,
    apps: BTreeMap<GroupId, AppState>,
}

/// What one committed (group, index) was: term, content fingerprint, chain hash after it.
type CommittedEntry = (u64, u64, u64);

/// Message and batch counts, to show batching.
#[derive(Debug, Default, Clone, Copy)]
pub struct WireStats {
    pub batches: u64,
    /// Snapshot messages, sent apart from the batches.
    pub snapshots: u64,
    pub messages: u64,
    pub bytes: u64,
    pub rounds: u64,
}

#[derive(Debug)]
pub struct Sim {
    pub seed: u64,
    pub rng: StdRng,
    pub now: u64,
    pub nodes: BTreeMap<NodeId, SimNode>,
    pub faults: Faults,
    packets: Vec<Packet>,
    /// One-way blocks: (from, to) pairs whose packets are lost.
    blocked: BTreeSet<(NodeId, NodeId)>,
    /// Every (group, index) any node applied, with what it was.
    committed: BTreeMap<(GroupId, u64), CommittedEntry>,
    /// Snapshot positions seen: (group, index) -> chain hash.
    leaders: BTreeMap<(GroupId, u64), NodeId>,
    pub wire: WireStats,
    pub compact_every_entries: u64,
    script: Script,
    /// Nodes whose disks complete no sync (see [`Sim::stall_disk`]).
    stalled: BTreeSet<NodeId>,
    /// Engine ticks per node.
    ticks: BTreeMap<NodeId, u64>,
}

fn mix(mut h: u64, word: u64) -> u64 {
    h ^= word.wrapping_add(0x9e37_79b9_7f4a_7c15);
    h = (h ^ (h >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    h = (h ^ (h >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    h ^ (h >> 31)
}

fn fingerprint(kind: &EntryKind) -> u64 {
    let text = format!("{kind:?}");
    text.bytes()
        .fold(0xcbf2_9ce4_8422_2325, |h, b| mix(h, u64::from(b)))
}

fn app_key(group: GroupId) -> Vec<u8> {
    format!("app/{:020}", group.0).into_bytes()
}

impl Sim {
    /// `node_count` nodes (ids 1..=n), each group bootstrapped with `voters` as initial
    /// voters on those nodes; other nodes host nothing yet.
    pub fn new(seed: u64, node_count: u64, groups: &[GroupId], voters: &[NodeId]) -> Self {
        init_logs();
        let mut sim = Sim {
            seed,
            rng: StdRng::seed_from_u64(seed),
            now: 0,
            nodes: BTreeMap::new(),
            faults: Faults::none(),
            packets: Vec::new(),
            blocked: BTreeSet::new(),
            committed: BTreeMap::new(),
            leaders: BTreeMap::new(),
            wire: WireStats::default(),
            compact_every_entries: 0,
            script: Script::default(),
            stalled: BTreeSet::new(),
            ticks: BTreeMap::new(),
        };
        for id in 1..=node_count {
            let node = NodeId(id);
            let mut sim_node = SimNode {
                engine: None,
                store: MemStore::new(),
                pending_syncs: VecDeque::new(),
                apps: BTreeMap::new(),
            };
            let mut engine = Engine::open(sim.config(node), Default::default()).unwrap();
            if voters.contains(&node) {
                for &g in groups {
                    engine.bootstrap_group(g, voters).unwrap();
                    sim_node.apps.insert(g, boot_app(1));
                }
                // Bootstrap is made durable before the node serves.
                let job = engine.round().persist.expect("bootstrap writes");
                sim_node.store.write(&job).unwrap();
                engine.on_persisted(job.id()).unwrap();
            }
            sim_node.engine = Some(engine);
            sim.nodes.insert(node, sim_node);
        }
        sim
    }

    fn config(&self, node: NodeId) -> EngineConfig {
        EngineConfig {
            election_seed: self.seed ^ node.0.wrapping_mul(0x100_0000_01b3),
            ..EngineConfig::new(node)
        }
    }

    pub fn engine(&self, node: NodeId) -> &Engine {
        self.nodes[&node].engine.as_ref().expect("node is up")
    }

    pub fn engine_mut(&mut self, node: NodeId) -> &mut Engine {
        self.nodes
            .get_mut(&node)
            .unwrap()
            .engine
            .as_mut()
            .expect("node is up")
    }

    pub fn is_up(&self, node: NodeId) -> bool {
        self.nodes[&node].engine.is_some()
    }

    pub fn node_ids(&self) -> Vec<NodeId> {
        self.nodes.keys().copied().collect()
    }

    /// Creates an empty group on `node` (to be added by a configuration change), made durable
    /// at once.
    pub fn create_group(&mut self, node: NodeId, group: GroupId) {
        self.engine_mut(node).create_group(group).unwrap();
        self.nodes
            .get_mut(&node)
            .unwrap()
            .apps
            .insert(group, boot_app(0));
        self.run_rounds(node);
        let n = self.nodes.get_mut(&node).unwrap();
        if let Some((last, _)) = n.pending_syncs.back().copied() {
            n.pending_syncs.clear();
            n.store.sync();
            n.engine.as_mut().unwrap().on_persisted(last).unwrap();
        }
    }

    // ---- faults ----

    pub fn isolate(&mut self, node: NodeId) {
        event!(now = self.now, "isolate {node}");
        for other in self.node_ids() {
            if other != node {
                self.blocked.insert((node, other));
                self.blocked.insert((other, node));
            }
        }
    }

    pub fn block(&mut self, from: NodeId, to: NodeId) {
        event!(now = self.now, "block {from} -> {to}");
        self.blocked.insert((from, to));
    }

    pub fn heal(&mut self) {
        event!(now = self.now, "heal");
        self.blocked.clear();
    }

    /// Stops a node: its unsynced writes and in-memory state are lost.
    pub fn crash(&mut self, node: NodeId) {
        event!(now = self.now, "crash {node}");
        let n = self.nodes.get_mut(&node).unwrap();
        n.engine = None;
        n.store.crash();
        n.pending_syncs.clear();
        n.apps.clear();
        self.packets.retain(|p| p.to != node);
    }

    /// Starts a crashed node from its durable state.
    pub fn restart(&mut self, node: NodeId) {
        event!(now = self.now, "restart {node}");
        let config = self.config(node);
        let n = self.nodes.get_mut(&node).unwrap();
        assert!(n.engine.is_none(), "{node} is up");
        let recovered = n.store.load().unwrap();
        for group in recovered.group_ids() {
            let engine_applied = recovered.applied_index(group).unwrap();
            let app = match n.store.app_get(&app_key(group)).unwrap() {
                Some(bytes) => AppState::decode(&bytes),
                None => boot_app(engine_applied),
            };
            // The application's state and the engine's apply state are written atomically.
            assert_eq!(
                app.applied_index, engine_applied,
                "{node} {group}: app and engine disagree"
            );
            n.apps.insert(group, app);
        }
        n.engine = Some(Engine::open(config, recovered).unwrap());
    }

    pub fn unsynced_jobs(&self, node: NodeId) -> usize {
        self.nodes[&node].store.unsynced_job_count()
    }

    // ---- the step ----

    /// One simulated step: deliver packets, tick, complete syncs, run rounds, check invariants.
    pub fn step(&mut self) {
        self.now += 1;
        self.deliver();
        for node in self.node_ids() {
            if self.is_up(node) && (self.now + node.0).is_multiple_of(TICK_STEPS) {
                self.engine_mut(node).tick();
                *self.ticks.entry(node).or_default() += 1;
            }
        }
        self.complete_syncs();
        for node in self.node_ids() {
            self.run_rounds(node);
        }
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
            for msg in packet.messages {
                self.note(Event::Delivered(msg));
            }
        }
    }

    fn complete_syncs(&mut self) {
        let now = self.now;
        let mut synced = Vec::new();
        for (&node, n) in &mut self.nodes {
            if self.stalled.contains(&node) {
                continue;
            }
            let mut done = 0;
            let mut last_done = None;
            while n.pending_syncs.front().is_some_and(|(_, due)| *due <= now) {
                last_done = n.pending_syncs.pop_front().map(|(id, _)| id);
                done += 1;
            }
            if let Some(id) = last_done {
                n.store.sync_jobs(done);
                n.engine.as_mut().unwrap().on_persisted(id).unwrap();
                if n.pending_syncs.is_empty() {
                    synced.push(node);
                }
            }
        }
        for node in synced {
            self.note(Event::Synced { node });
        }
    }

    fn run_rounds(&mut self, node: NodeId) {
        for _ in 0..8 {
            let Some(engine) = self.nodes.get_mut(&node).and_then(|n| n.engine.as_mut()) else {
                return;
            };
            if !engine.has_ready() {
                return;
            }
            let round = engine.round();
            self.wire.rounds += 1;
            for change in &round.role_changes {
                self.observe_role(node, change);
            }
            self.note_applies(node, &round.applies);
            let touched = self.apply_all(node, &round.applies);
            self.make_snapshots(node, &round.snapshot_requests);
            match round.persist {
                Some(mut job) => {
                    let n = self.nodes.get_mut(&node).unwrap();
                    for group in touched {
                        job.put_app(app_key(group), n.apps[&group].encode());
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
                None => assert!(
                    round.applies.is_empty(),
                    "applies without a job to record them"
                ),
            }
            let mut seen = BTreeSet::new();
            for batch in round.batches {
                assert!(
                    seen.insert(batch.to),
                    "two batches for {} in one round",
                    batch.to
                );
                self.wire.batches += 1;
                self.wire.messages += batch.message_count as u64;
                self.wire.bytes += batch.bytes.len() as u64;
                self.send(node, batch.to, batch.bytes);
            }
            for snapshot in round.snapshots {
                self.wire.snapshots += 1;
                self.send(node, snapshot.to, snapshot.as_batch());
            }
            self.maybe_compact(node);
        }
    }

    fn send(&mut self, from: NodeId, to: NodeId, bytes: bytes::Bytes) {
        let mut carried = script::decode(from, &bytes);
        for c in &carried {
            self.check_ack(&c.msg);
            self.note(Event::Sent(c.msg));
        }
        if self.blocked.contains(&(from, to)) {
            return;
        }
        let mut bytes = bytes;
        if self.filter(&mut carried) {
            if carried.is_empty() {
                return;
            }
            bytes = script::encode(&carried);
        }
        if self.rng.random_range(0..1000) < self.faults.drop_per_mille {
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
            messages: carried.iter().map(|c| c.msg).collect(),
        });
    }

    /// A follower acknowledges only what its log holds: an append response of its current
    /// term never claims an index past its last one (raft-rs's batch_append made one do so).
    fn check_ack(&self, msg: &Msg) {
        if !msg.is_ack() {
            return;
        }
        let Some(status) = self.engine(msg.from).status(msg.group) else {
            return;
        };
        assert!(
            msg.term != status.term || msg.index <= status.last_index,
            "{} {}: acked index {} in term {} with a log ending at {} (seed {})",
            msg.from,
            msg.group,
            msg.index,
            msg.term,
            status.last_index,
            self.seed
        );
    }

    /// The leader needs a snapshot that includes a new member: compact at the applied index.
    fn make_snapshots(&mut self, node: NodeId, groups: &[GroupId]) {
        let n = self.nodes.get_mut(&node).unwrap();
        let engine = n.engine.as_mut().unwrap();
        for group in groups {
            let app = n.apps[group];
            let first_index = engine.status(*group).unwrap().first_index;
            if app.applied_index >= first_index {
                engine
                    .compact(*group, app.applied_index, app.encode())
                    .unwrap();
            }
        }
    }

    fn maybe_compact(&mut self, node: NodeId) {
        if self.compact_every_entries == 0 {
            return;
        }
        let n = self.nodes.get_mut(&node).unwrap();
        let engine = n.engine.as_mut().unwrap();
        for (&group, app) in &n.apps {
            let Some(status) = engine.status(group) else {
                continue;
            };
            if app.applied_index >= status.first_index + self.compact_every_entries {
                engine
                    .compact(group, app.applied_index, app.encode())
                    .unwrap();
            }
        }
    }

    // ---- the state machine and the invariants ----

    fn apply_all(&mut self, node: NodeId, applies: &[Apply]) -> BTreeSet<GroupId> {
        let mut touched = BTreeSet::new();
        for apply in applies {
            touched.insert(apply.group());
            match apply {
                Apply::Entry {
                    group,
                    position,
                    kind,
                } => self.apply_entry(node, *group, *position, kind),
                Apply::Snapshot {
                    group,
                    position,
                    data,
                    ..
                } => self.apply_snapshot(node, *group, *position, data),
            }
        }
        touched
    }

    fn apply_entry(
        &mut self,
        node: NodeId,
        group: GroupId,
        position: LogPosition,
        kind: &EntryKind,
    ) {
        let app = self
            .nodes
            .get_mut(&node)
            .unwrap()
            .apps
            .get_mut(&group)
            .unwrap();
        assert_eq!(
            position.index,
            app.applied_index + 1,
            "{node} {group}: applied out of order"
        );
        let content = fingerprint(kind);
        let hash = mix(mix(app.hash, position.term), content);
        *app = AppState {
            applied_index: position.index,
            hash,
        };
        let seen = (position.term, content, hash);
        let global = *self
            .committed
            .entry((group, position.index))
            .or_insert(seen);
        assert_eq!(
            global, seen,
            "{node} {group}: committed entry {} changed (seed {})",
            position.index, self.seed
        );
    }

    fn apply_snapshot(&mut self, node: NodeId, group: GroupId, position: LogPosition, data: &[u8]) {
        let state = if data.is_empty() {
            boot_app(1)
        } else {
            AppState::decode(data)
        };
        assert_eq!(
            state.applied_index, position.index,
            "snapshot data at its index"
        );
        if let Some(&(_, _, hash)) = self.committed.get(&(group, position.index)) {
            assert_eq!(
                hash, state.hash,
                "{node} {group}: snapshot disagrees with the log"
            );
        }
        let app = self
            .nodes
            .get_mut(&node)
            .unwrap()
            .apps
            .get_mut(&group)
            .unwrap();
        assert!(
            state.applied_index >= app.applied_index,
            "{node} {group}: snapshot goes back"
        );
        *app = state;
    }

    /// Traces the configuration changes and snapshots a round applies.
    fn note_applies(&mut self, node: NodeId, applies: &[Apply]) {
        for apply in applies {
            let what = match apply {
                Apply::Entry {
                    kind: EntryKind::ConfChange { change, .. },
                    ..
                } => Applied::ConfChange(*change),
                Apply::Snapshot { .. } => Applied::Snapshot,
                Apply::Entry { .. } => continue,
            };
            self.note(Event::Applied {
                node,
                group: apply.group(),
                position: apply.position(),
                what,
            });
        }
    }

    fn observe_role(&mut self, node: NodeId, change: &RoleChange) {
        self.note(Event::Role {
            node,
            group: change.group,
            role: change.role,
            term: change.term,
        });
        if change.role == Role::Leader {
            self.note_leader(node, change.group, change.term);
        }
    }

    fn note_leader(&mut self, node: NodeId, group: GroupId, term: u64) {
        let first = *self.leaders.entry((group, term)).or_insert(node);
        assert_eq!(
            first, node,
            "{group}: two leaders in term {term} (seed {})",
            self.seed
        );
    }

    fn check_invariants(&mut self) {
        let mut leaders = Vec::new();
        for (&node, n) in &self.nodes {
            let Some(engine) = &n.engine else { continue };
            for (&group, app) in &n.apps {
                let Some(status) = engine.status(group) else {
                    continue;
                };
                assert_eq!(
                    status.applied_index, app.applied_index,
                    "{node} {group}: apply lag"
                );
                assert!(status.applied_index <= status.commit_index);
                if status.role == Role::Leader {
                    leaders.push((node, group, status.term));
                }
            }
        }
        for (node, group, term) in leaders {
            self.note_leader(node, group, term);
        }
    }
}

/// `RUST_LOG=ferry_multiraft=debug` shows raft-rs's logs through the slog bridge.
fn init_logs() {
    if std::env::var_os("RUST_LOG").is_some() {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
            .with_test_writer()
            .try_init();
    }
}

/// Simulator events, shown with `RUST_LOG=sim=debug`.
macro_rules! event {
    ($($arg:tt)*) => { tracing::debug!(target: "sim", $($arg)*) };
}
pub(crate) use event;

fn boot_app(applied_index: u64) -> AppState {
    AppState {
        applied_index,
        hash: BOOT_HASH,
    }
}
