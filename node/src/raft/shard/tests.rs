//! Exactly-once apply of a queue shard, on the multiraft simulator: three replicas of one shard
//! run the real driver over [`ShardMachine`]s while sends and deletes are proposed through the
//! leader, the network drops and reorders packets and cuts replicas off, leadership is handed
//! over, and replicas die in their synced writes (a crash at any point of a round: before its
//! job is durable, or right after) and restart from what they made durable. Then every replica's store, rebuilt from exactly what its node made
//! durable, must show: every confirmed send that was not deleted; counts that match the
//! messages held (a put or delete applied twice, or lost, breaks them: they are merge deltas);
//! the same data as every other replica. Logs are compacted every few entries, so a replica
//! that was away or cut off comes back through a snapshot: the sender's data as its store held
//! it when sent, installed by the replica's machine.

#![allow(clippy::unwrap_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use ferry_kernel::{
    Message, MessageId, PersistOp, PlacementEpoch, Priority, QueueConfig, QueueName, QueueUid, Seq,
    ShardId,
};
use ferry_multiraft::sim::{Faults, Sim, SimStore};
use ferry_multiraft::{
    Driver, DriverConfig, Engine, EngineConfig, GroupId, GroupMachine, LogStore, NodeId, Proposed,
    Role,
};
use ferry_store::{encode_entry, MemoryStore, QueueDef, QueueStore, ShardReplica, StoreOp};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::sim_link::{durable_store, inbox, Inboxes, SnapshotLink};
use super::{Plant, ShardMachine};

const SHARD: GroupId = GroupId(5);
const QUEUE: QueueUid = QueueUid(77);
const NODES: [NodeId; 3] = [NodeId(1), NodeId(2), NodeId(3)];
/// Steps allowed for one proposal's outcome, or for the end's catch-up: many election timeouts.
const STEPS_MAX: u64 = 6_000;
const SENDS: u64 = 60;

type Answer = Arc<Mutex<Option<Proposed<()>>>>;

fn config(node: NodeId, seed: u64) -> EngineConfig {
    EngineConfig {
        election_seed: seed ^ (7 * node.0),
        ..EngineConfig::new(node)
    }
}

fn driver_config() -> DriverConfig {
    // Compaction due often: a replica away for a few proposals needs a snapshot.
    DriverConfig {
        compact_after_entries: 8,
        ..DriverConfig::default()
    }
}

fn message(seq: u64) -> Message {
    Message {
        id: MessageId::new(QUEUE, Seq(seq)),
        seq: Seq(seq),
        body: vec![b'm'; 10 + seq as usize].into(),
        properties: BTreeMap::new(),
        correlation_id: Some(format!("c{seq}")),
        reply_to: None,
        jms_type: None,
        priority: Priority::DEFAULT,
        timestamp_ms: seq,
        expiration_ms: None,
        deliver_at_ms: None,
        persistent: true,
        dedup_id: None,
        group_id: None,
    }
}

fn queue_op(op: PersistOp) -> StoreOp {
    StoreOp::Queue { uid: QUEUE, op }
}

struct Shard {
    sim: Sim<Driver<ShardMachine>>,
    stores: BTreeMap<NodeId, SimStore>,
    /// Each replica's staged snapshot data.
    inboxes: Inboxes,
    snapshots_sent: Arc<AtomicUsize>,
    seed: u64,
    plant: Plant,
    /// Replicas that died in a write and were restarted.
    restarts: usize,
    /// Replicas cut off from the others.
    isolations: usize,
    /// Leadership transfers asked for.
    transfers: usize,
}

impl Shard {
    fn new(seed: u64, plant: Plant) -> Self {
        let mut shard = Shard {
            sim: Sim::new(seed, Faults::lossy()),
            stores: BTreeMap::new(),
            inboxes: Inboxes::default(),
            snapshots_sent: Arc::default(),
            seed,
            plant,
            restarts: 0,
            isolations: 0,
            transfers: 0,
        };
        for node in NODES {
            let store = SimStore::new();
            let mut engine = Engine::open(config(node, seed), store.load().unwrap()).unwrap();
            engine.bootstrap_group(SHARD, &NODES).unwrap();
            shard.stores.insert(node, store);
            shard.start(node, engine);
        }
        shard
    }

    fn start(&mut self, node: NodeId, engine: Engine) {
        let store = self.stores[&node].clone();
        let mut machine = ShardMachine::open(SHARD, &store, inbox(&self.inboxes, node)).unwrap();
        machine.plant(self.plant);
        let link = SnapshotLink {
            inner: self.sim.outbound(node),
            store: store.clone(),
            inboxes: Arc::clone(&self.inboxes),
            snapshots_sent: Arc::clone(&self.snapshots_sent),
            skip: None,
        };
        let driver = Driver::new(
            Some(engine),
            BTreeMap::from([(SHARD, machine)]),
            Box::new(store),
            Box::new(link),
            driver_config(),
        );
        self.sim.add(node, driver);
    }

    /// Restarts every replica that died in a write, from what its store made durable.
    fn restart_the_dead(&mut self) {
        for node in NODES {
            let store = self.stores[&node].clone();
            if !store.died() {
                continue;
            }
            self.sim.crash(node);
            store.crash();
            self.restarts += 1;
            let engine = Engine::open(config(node, self.seed), store.load().unwrap()).unwrap();
            self.start(node, engine);
        }
    }

    fn leader(&mut self) -> Option<NodeId> {
        let found = self.sim.run_until(STEPS_MAX, |s| {
            s.replicas().any(|(_, d)| {
                d.halted().is_none()
                    && d.engine()
                        .and_then(|e| e.status(SHARD))
                        .is_some_and(|st| st.role == Role::Leader)
            })
        });
        found.then(|| {
            self.sim.replicas().find_map(|(id, d)| {
                let st = d.engine()?.status(SHARD)?;
                (d.halted().is_none() && st.role == Role::Leader).then_some(id)
            })
        })?
    }

    /// Proposes `ops` through the leader; true once confirmed applied, false when the outcome
    /// is unknown or refused.
    fn propose(&mut self, ops: &[StoreOp]) -> bool {
        let Some(leader) = self.leader() else {
            return false;
        };
        let answer = Answer::default();
        let to = Arc::clone(&answer);
        self.sim.replica_mut(leader).unwrap().propose(
            SHARD,
            encode_entry(ops).unwrap(),
            Box::new(move |outcome| *to.lock().unwrap() = Some(outcome)),
        );
        self.sim.collect();
        let store = self.stores[&leader].clone();
        self.sim.run_until(STEPS_MAX, |_| {
            answer.lock().unwrap().is_some() || store.died()
        });
        let confirmed = matches!(answer.lock().unwrap().take(), Some(Ok(_)));
        self.restart_the_dead();
        confirmed
    }

    /// Before a proposal, maybe: a replica set to die in its next synced write, a replica cut
    /// off both ways (or the network healed), leadership handed to another replica.
    fn nemesis(&mut self, rng: &mut StdRng) {
        let node = NODES[rng.random_range(0..NODES.len())];
        if rng.random_ratio(1, 6) {
            self.stores[&node].die_in_next_write();
        }
        match rng.random_range(0..10) {
            0 => {
                self.sim.isolate(node, &NODES);
                self.isolations += 1;
            }
            1 | 2 => self.sim.heal(),
            3 => {
                let leader = self.sim.replicas().find_map(|(id, d)| {
                    let st = d.engine()?.status(SHARD)?;
                    (st.role == Role::Leader).then_some(id)
                });
                if let Some(engine) = leader
                    .filter(|l| *l != node)
                    .and_then(|l| self.sim.replica_mut(l))
                    .and_then(|d| d.engine_mut())
                {
                    if engine.transfer_leader(SHARD, node).is_ok() {
                        self.transfers += 1;
                    }
                }
            }
            _ => {}
        }
    }

    /// Heals the network and runs until every replica applied the same index, restarting a
    /// replica that dies on the way (one still set to die in its next write).
    fn settle(&mut self) {
        self.sim.faults = Faults::none();
        self.sim.heal();
        // Each replica is set to die at most once more.
        for _ in 0..=NODES.len() {
            self.restart_the_dead();
            let stores: Vec<SimStore> = self.stores.values().cloned().collect();
            let someone_died = move || stores.iter().any(SimStore::died);
            let done = self
                .sim
                .run_until(STEPS_MAX, |s| someone_died() || converged(s));
            if done && !self.stores.values().any(SimStore::died) {
                return;
            }
        }
        panic!("seed {}: replicas did not converge", self.seed);
    }

    /// A replica's store as its node made it durable.
    fn replica_store(&self, node: NodeId) -> MemoryStore {
        durable_store(&self.stores[&node], &[SHARD])
    }
}

/// Every replica applied the same index.
fn converged(s: &Sim<Driver<ShardMachine>>) -> bool {
    let applied: BTreeSet<u64> = s
        .replicas()
        .filter_map(|(_, d)| Some(d.machine(SHARD)?.applied_index()))
        .collect();
    applied.len() == 1
}

/// What the workload did: sends confirmed, and messages whose delete was proposed (whatever
/// its outcome).
#[derive(Debug, Default)]
struct Record {
    confirmed: BTreeSet<u64>,
    delete_proposed: BTreeSet<u64>,
}

/// What a run exercised.
#[derive(Debug, Default)]
struct Ran {
    confirmed: usize,
    restarts: usize,
    isolations: usize,
    transfers: usize,
    snapshots: usize,
}

fn run(seed: u64, plant: Plant) -> Result<Ran, String> {
    let mut shard = Shard::new(seed, plant);
    let mut rng = StdRng::seed_from_u64(seed);
    let def = QueueDef {
        name: QueueName::new("orders").unwrap(),
        uid: QUEUE,
        replica: Some(ShardReplica {
            shard: ShardId(SHARD.0),
            epoch: PlacementEpoch::new(3),
            handle_key: None,
        }),
        config: QueueConfig::default(),
    };
    let mut created = false;
    for _ in 0..20 {
        created = shard.propose(&[StoreOp::PutQueue(def.clone())]);
        if created {
            break;
        }
    }
    assert!(created, "seed {seed}: the queue was never created");
    let mut record = Record::default();
    for seq in 1..=SENDS {
        shard.nemesis(&mut rng);
        let mut ops = vec![queue_op(PersistOp::PutMessage(Arc::new(message(seq))))];
        let deletable: Vec<u64> = record
            .confirmed
            .difference(&record.delete_proposed)
            .copied()
            .collect();
        if !deletable.is_empty() && rng.random_ratio(1, 2) {
            let gone = deletable[rng.random_range(0..deletable.len())];
            record.delete_proposed.insert(gone);
            ops.push(queue_op(PersistOp::DeleteMessage(Arc::new(message(gone)))));
        }
        if shard.propose(&ops) {
            record.confirmed.insert(seq);
        }
    }
    shard.settle();
    check(&shard, &record)?;
    Ok(Ran {
        confirmed: record.confirmed.len(),
        restarts: shard.restarts,
        isolations: shard.isolations,
        transfers: shard.transfers,
        snapshots: shard.snapshots_sent.load(Ordering::Relaxed),
    })
}

fn check(shard: &Shard, record: &Record) -> Result<(), String> {
    let mut views = BTreeMap::new();
    for node in NODES {
        let store = shard.replica_store(node);
        let held = held(&store);
        let kept = record.confirmed.difference(&record.delete_proposed);
        let lost: Vec<u64> = kept.filter(|s| !held.contains_key(s)).copied().collect();
        if !lost.is_empty() {
            return Err(format!("node {node:?} lost confirmed sends {lost:?}"));
        }
        let recovered = store.recover().unwrap();
        let Some(queue) = recovered.first() else {
            return Err(format!("node {node:?} lost the queue"));
        };
        let level = queue.stored[usize::from(Priority::DEFAULT.get())];
        let bytes: u64 = held.values().sum();
        if (level.count, level.bytes) != (held.len() as u64, bytes) {
            return Err(format!(
                "node {node:?} counts {} messages of {} bytes and holds {} of {bytes}",
                level.count,
                level.bytes,
                held.len()
            ));
        }
        views.insert(node, view(&store));
    }
    let distinct: BTreeSet<&String> = views.values().collect();
    if distinct.len() != 1 {
        return Err("the replicas hold different data".into());
    }
    Ok(())
}

/// What a store holds of the queue, read as the back-end reads it (a snapshot's install
/// rebuilds derived state, so the stores' insides may differ where this does not).
fn view(store: &MemoryStore) -> String {
    let recovered = store.recover().unwrap();
    let page = store
        .read_page(
            QUEUE,
            Priority::DEFAULT,
            Seq(0),
            Seq(u64::MAX),
            usize::MAX,
            u64::MAX,
        )
        .unwrap();
    format!("{recovered:?} {:?}", page.messages)
}

/// The messages a store holds: seq → size.
fn held(store: &MemoryStore) -> BTreeMap<u64, u64> {
    let page = store
        .read_page(
            QUEUE,
            Priority::DEFAULT,
            Seq(0),
            Seq(u64::MAX),
            usize::MAX,
            u64::MAX,
        )
        .unwrap();
    page.messages
        .iter()
        .map(|m| (m.message.seq.0, m.message.size_bytes()))
        .collect()
}

#[test]
fn every_replica_applies_each_committed_entry_exactly_once_across_crashes() {
    let mut total = Ran::default();
    for seed in 1..=12 {
        match run(seed, Plant::default()) {
            Ok(ran) => {
                total.confirmed += ran.confirmed;
                total.restarts += ran.restarts;
                total.isolations += ran.isolations;
                total.transfers += ran.transfers;
                total.snapshots += ran.snapshots;
            }
            Err(e) => panic!("seed {seed}: {e}"),
        }
    }
    // The runs did what they are for: many sends confirmed (a cut-off leader's are not), many
    // replicas killed in a write, cut off, and handed the leadership.
    assert!(total.confirmed > 12 * SENDS as usize / 4, "{total:?}");
    assert!(total.restarts >= 24, "{total:?}");
    assert!(total.isolations >= 24 && total.transfers >= 24, "{total:?}");
    assert!(
        total.snapshots >= 12,
        "replicas caught up through snapshots: {total:?}"
    );
    tracing::info!(?total, "exactly-once runs");
}

fn caught(plant: Plant) -> Vec<String> {
    (1..=12)
        .filter_map(|seed| run(seed, plant).err().map(|e| format!("seed {seed}: {e}")))
        .collect()
}

#[test]
fn applied_data_written_a_job_after_its_applied_position_is_caught() {
    let caught = caught(Plant {
        data_one_job_late: true,
        ..Plant::default()
    });
    assert!(!caught.is_empty(), "no seed caught the planted bug");
    tracing::info!(?caught, "the planted bug was caught");
}

#[test]
fn a_snapshot_installed_at_its_own_index_rather_than_its_datas_is_caught() {
    let caught = caught(Plant {
        restore_at_snapshot_index: true,
        ..Plant::default()
    });
    assert!(!caught.is_empty(), "no seed caught the planted bug");
    tracing::info!(?caught, "the planted bug was caught");
}

#[test]
fn a_snapshot_written_over_the_old_data_is_caught() {
    let caught = caught(Plant {
        restore_over_old_data: true,
        ..Plant::default()
    });
    assert!(!caught.is_empty(), "no seed caught the planted bug");
    tracing::info!(?caught, "the planted bug was caught");
}
