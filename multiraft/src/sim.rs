//! A deterministic simulation of many nodes' real drivers in one process (feature `sim`): a
//! seeded network that drops, delays (so reorders) and partitions (both ways or one way), and
//! simulated time in steps, a Raft tick every [`Sim::tick_steps`] steps. Every crate that needs
//! a cluster in a test runs its real driver here instead of a copy of the round loop: a
//! [`Driver`] is a [`Replica`] as it is, and a node's own thread (which adds joining, membership
//! and a published view around it) implements [`Replica`] over its `step`.
//!
//! A node's store is a [`SimStore`]: the test keeps a handle to restart the node from what it
//! made durable, and can make the node die in a synced write, losing it.
//!
//! The same seed gives the same run, step for step: [`Sim::trace`] records every packet sent,
//! delivered and lost, so a test can show it (and a failing seed replays exactly). The
//! simulator only moves bytes and time: what a replica applies and whether the cluster stays
//! consistent is for the test to check, with the replicas' state in hand after every step.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex, PoisonError};

use bytes::Bytes;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::driver::{Driver, GroupMachine, Outbound};
use crate::error::Error;
use crate::ids::NodeId;
use crate::persist::PersistJob;
use crate::round::OutSnapshot;
use crate::storage::memory::MemStore;
use crate::storage::{KeyValue, LogStore, Recovered};

/// What the simulator asks of a node.
pub trait Replica {
    /// A batch (or a snapshot, as a one-message batch) from `from`.
    fn receive(&mut self, from: NodeId, bytes: &[u8]);
    /// One wake-up: a Raft tick of time passed when `tick`; then the rounds that are ready.
    fn wake(&mut self, tick: bool);
}

impl<M: GroupMachine> Replica for Driver<M> {
    fn receive(&mut self, from: NodeId, bytes: &[u8]) {
        Driver::receive(self, from, bytes);
    }

    fn wake(&mut self, tick: bool) {
        if tick {
            self.tick();
        }
        self.run_rounds();
    }
}

/// Fault rates of the network.
#[derive(Debug, Clone, Copy)]
pub struct Faults {
    /// Chance a packet is lost, per mille.
    pub drop_per_mille: u32,
    /// Packets arrive 1..=this many steps after being sent.
    pub delay_steps_max: u64,
}

impl Faults {
    /// Every packet arrives, the next step.
    pub fn none() -> Self {
        Faults {
            drop_per_mille: 0,
            delay_steps_max: 1,
        }
    }

    /// 5 % lost, the rest within 5 steps, in any order.
    pub fn lossy() -> Self {
        Faults {
            drop_per_mille: 50,
            delay_steps_max: 5,
        }
    }
}

/// One thing the network did, at a step.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Traced {
    /// A packet was handed to the network, to arrive at `at`.
    Sent {
        from: NodeId,
        to: NodeId,
        len: usize,
        at: u64,
    },
    /// A packet reached a running node.
    Delivered {
        from: NodeId,
        to: NodeId,
        len: usize,
    },
    /// A packet was lost: by chance, a cut link, or a node that is down.
    Lost {
        from: NodeId,
        to: NodeId,
        len: usize,
    },
}

type Outbox = Arc<Mutex<Vec<(NodeId, NodeId, Bytes)>>>;

/// A replica's [`Outbound`] in a simulation: what it sends waits in the simulator's outbox
/// until the step ends.
#[derive(Debug)]
pub struct SimOutbound {
    from: NodeId,
    outbox: Outbox,
}

impl Outbound for SimOutbound {
    fn send(&self, to: NodeId, bytes: Bytes) {
        lock(&self.outbox).push((self.from, to, bytes));
    }

    fn send_snapshot(&self, snapshot: OutSnapshot) {
        let bytes = snapshot.as_batch();
        lock(&self.outbox).push((self.from, snapshot.to, bytes));
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A node's store in a simulation: a [`MemStore`] behind a handle that the test keeps across
/// the node's crashes while the replica owns a clone. A write is synced before it returns
/// unless [`PersistJob::must_sync`] is false, as the real store's is; a node set to die in its next write
/// ([`SimStore::die_in_next_write`]) leaves that write unsynced and fails it, so that its
/// driver halts with the round's messages sent and nothing of it durable, as a process killed
/// in its synced write; [`SimStore::crash`] then loses what was not synced.
#[derive(Debug, Clone, Default)]
pub struct SimStore(Arc<Mutex<SimDisk>>);

#[derive(Debug, Default)]
struct SimDisk {
    store: MemStore,
    die_in_next_write: bool,
    /// The node died in a write: nothing more is written until [`SimStore::crash`].
    dead: bool,
}

impl SimStore {
    /// An empty store.
    pub fn new() -> Self {
        SimStore::default()
    }

    /// The node dies in its next write (see the type's docs).
    pub fn die_in_next_write(&self) {
        lock(&self.0).die_in_next_write = true;
    }

    /// Whether the node died in a write since the last [`SimStore::crash`].
    pub fn died(&self) -> bool {
        lock(&self.0).dead
    }

    /// The node's power goes: every write not synced is lost, and the store opens again for
    /// the node's restart.
    pub fn crash(&self) {
        let mut disk = lock(&self.0);
        disk.store.crash();
        disk.die_in_next_write = false;
        disk.dead = false;
    }

    /// The attachments of every durable job, in the order they were written (see
    /// [`MemStore::attachments`]).
    pub fn attachments(&self) -> Vec<crate::persist::Attachment> {
        lock(&self.0).store.attachments().to_vec()
    }

    /// Writes handed to the store and not synced (the one a node died in).
    pub fn unsynced_job_count(&self) -> usize {
        lock(&self.0).store.unsynced_job_count()
    }
}

impl LogStore for SimStore {
    fn write(&mut self, job: &PersistJob) -> Result<(), Error> {
        let mut disk = lock(&self.0);
        if disk.dead {
            return Err(Error::StoragePoisoned);
        }
        if std::mem::take(&mut disk.die_in_next_write) {
            disk.store.write_unsynced(job);
            disk.dead = true;
            return Err(Error::Storage {
                operation: "write",
                reason: "the simulated node died in its synced write".into(),
            });
        }
        disk.store.write(job)
    }

    fn load(&self) -> Result<Recovered, Error> {
        lock(&self.0).store.load()
    }

    fn app_get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, Error> {
        lock(&self.0).store.app_get(key)
    }

    fn app_scan(&self, prefix: &[u8]) -> Result<Vec<KeyValue>, Error> {
        lock(&self.0).store.app_scan(prefix)
    }
}

#[derive(Debug)]
struct Packet {
    from: NodeId,
    to: NodeId,
    at: u64,
    bytes: Bytes,
}

/// See the module docs.
#[allow(missing_debug_implementations)]
pub struct Sim<R: Replica> {
    /// The seed the run was made from.
    pub seed: u64,
    /// Steps run so far.
    pub now: u64,
    /// Steps per Raft tick.
    pub tick_steps: u64,
    /// The network's fault rates, changeable between steps.
    pub faults: Faults,
    rng: StdRng,
    replicas: BTreeMap<NodeId, R>,
    outbox: Outbox,
    in_flight: Vec<Packet>,
    /// One-way cuts: (from, to) pairs whose packets are lost.
    blocked: BTreeSet<(NodeId, NodeId)>,
    trace: Vec<(u64, Traced)>,
}

impl<R: Replica> Sim<R> {
    /// An empty simulation: no nodes yet ([`Sim::add`]), a tick every 4 steps.
    pub fn new(seed: u64, faults: Faults) -> Self {
        Sim {
            seed,
            now: 0,
            tick_steps: 4,
            faults,
            rng: StdRng::seed_from_u64(seed),
            replicas: BTreeMap::new(),
            outbox: Outbox::default(),
            in_flight: Vec::new(),
            blocked: BTreeSet::new(),
            trace: Vec::new(),
        }
    }

    /// The [`Outbound`] to build node `from`'s replica with.
    pub fn outbound(&self, from: NodeId) -> SimOutbound {
        SimOutbound {
            from,
            outbox: Arc::clone(&self.outbox),
        }
    }

    /// Starts node `id` (again, after [`Sim::crash`]).
    pub fn add(&mut self, id: NodeId, replica: R) {
        self.replicas.insert(id, replica);
    }

    /// Stops node `id` at once, as a kill does: its replica is handed back (what its store
    /// made durable is the test's to restart it from), and packets to it are lost until it is
    /// added again, those on their way included (its connections broke).
    pub fn crash(&mut self, id: NodeId) -> Option<R> {
        let now = self.now;
        let (lost, kept): (Vec<Packet>, Vec<Packet>) = std::mem::take(&mut self.in_flight)
            .into_iter()
            .partition(|p| p.to == id);
        self.in_flight = kept;
        for p in lost {
            let (from, to, len) = (p.from, p.to, p.bytes.len());
            self.trace.push((now, Traced::Lost { from, to, len }));
        }
        self.replicas.remove(&id)
    }

    /// Whether node `id` runs.
    pub fn is_up(&self, id: NodeId) -> bool {
        self.replicas.contains_key(&id)
    }

    /// The running nodes, in id order.
    pub fn ids(&self) -> Vec<NodeId> {
        self.replicas.keys().copied().collect()
    }

    /// Node `id`'s replica, if it runs.
    pub fn replica(&self, id: NodeId) -> Option<&R> {
        self.replicas.get(&id)
    }

    /// Node `id`'s replica, to propose or look inside.
    pub fn replica_mut(&mut self, id: NodeId) -> Option<&mut R> {
        self.replicas.get_mut(&id)
    }

    /// Every running replica, in id order.
    pub fn replicas(&self) -> impl Iterator<Item = (NodeId, &R)> {
        self.replicas.iter().map(|(id, r)| (*id, r))
    }

    /// Cuts `node` off from every other node, both ways.
    pub fn isolate(&mut self, node: NodeId, all: &[NodeId]) {
        for &other in all {
            if other != node {
                self.blocked.insert((node, other));
                self.blocked.insert((other, node));
            }
        }
    }

    /// Cuts the link from `from` to `to` (one way).
    pub fn block(&mut self, from: NodeId, to: NodeId) {
        self.blocked.insert((from, to));
    }

    /// Restores every link.
    pub fn heal(&mut self) {
        self.blocked.clear();
    }

    /// What the network did so far, with the step of each event.
    pub fn trace(&self) -> &[(u64, Traced)] {
        &self.trace
    }

    /// One step: packets due are delivered, every running node wakes (ticking every
    /// [`Sim::tick_steps`] steps), and what they sent goes on the network.
    pub fn step(&mut self) {
        self.now += 1;
        self.deliver();
        let tick = self.now.is_multiple_of(self.tick_steps);
        for replica in self.replicas.values_mut() {
            replica.wake(tick);
        }
        self.collect();
    }

    /// Steps until `done` holds (checked before each step) or `steps_max` steps ran; whether
    /// it held.
    pub fn run_until(&mut self, steps_max: u64, mut done: impl FnMut(&Self) -> bool) -> bool {
        for _ in 0..steps_max {
            if done(self) {
                return true;
            }
            self.step();
        }
        done(self)
    }

    /// Puts what the replicas sent (outside a step too: a proposal's first round) on the
    /// network.
    pub fn collect(&mut self) {
        let sent: Vec<_> = lock(&self.outbox).drain(..).collect();
        for (from, to, bytes) in sent {
            let len = bytes.len();
            let lost = self.blocked.contains(&(from, to))
                || self.rng.random_range(0..1000) < self.faults.drop_per_mille;
            if lost {
                self.trace.push((self.now, Traced::Lost { from, to, len }));
                continue;
            }
            let at = self.now
                + self
                    .rng
                    .random_range(1..=self.faults.delay_steps_max.max(1));
            self.trace
                .push((self.now, Traced::Sent { from, to, len, at }));
            self.in_flight.push(Packet {
                from,
                to,
                at,
                bytes,
            });
        }
    }

    fn deliver(&mut self) {
        let now = self.now;
        let (due, later): (Vec<Packet>, Vec<Packet>) = std::mem::take(&mut self.in_flight)
            .into_iter()
            .partition(|p| p.at <= now);
        self.in_flight = later;
        for p in due {
            let len = p.bytes.len();
            let (from, to) = (p.from, p.to);
            // A link cut while the packet was on its way loses it too.
            let replica = if self.blocked.contains(&(from, to)) {
                None
            } else {
                self.replicas.get_mut(&to)
            };
            match replica {
                Some(r) => {
                    r.receive(from, &p.bytes);
                    self.trace.push((now, Traced::Delivered { from, to, len }));
                }
                None => self.trace.push((now, Traced::Lost { from, to, len })),
            }
        }
    }
}
