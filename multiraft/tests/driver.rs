//! The generic round loop ([`Driver`]) with a toy state machine, three nodes in one process on
//! a network of queues: proposals answered once applied, with their index; a follower's
//! proposal refused with the leader's id; the same applied sequence on every node, its applied
//! index in the same job; a machine that cannot apply an entry halts its driver with nothing of
//! that round written.

#![allow(clippy::unwrap_used)]

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use ferry_multiraft::{
    Driver, DriverConfig, Engine, EngineConfig, GroupId, GroupMachine, Halt, LogPosition, LogStore,
    MemStore, NodeId, OutSnapshot, Outbound, PersistJob, ProposeFailure, Proposed, Recovered, Role,
};

const G0: GroupId = GroupId(0);
const APPLIED_KEY: &[u8] = b"toy/applied";
/// Enough ticks for several election timeouts.
const TICKS_MAX: usize = 400;

/// Applies entries by remembering them; halts on an entry that says "poison", after changing
/// its applied index (a machine half-way through: what the driver must then not write).
#[derive(Debug, Default)]
struct Toy {
    applied_index: u64,
    entries: Vec<(u64, Vec<u8>)>,
    dirty: bool,
}

impl GroupMachine for Toy {
    type Outcome = usize;

    fn applied_index(&self) -> u64 {
        self.applied_index
    }

    fn apply(&mut self, position: LogPosition, data: &[u8]) -> Result<usize, Halt> {
        self.applied_index = position.index;
        self.dirty = true;
        if data == b"poison" {
            return Err(Halt(format!("entry {} cannot be applied", position.index)));
        }
        if !data.is_empty() {
            self.entries.push((position.index, data.to_vec()));
        }
        Ok(self.entries.len())
    }

    fn skip(&mut self, position: LogPosition) -> Result<(), Halt> {
        self.applied_index = position.index;
        self.dirty = true;
        Ok(())
    }

    fn restore(&mut self, position: LogPosition, _data: &[u8]) -> Result<(), Halt> {
        self.applied_index = position.index;
        self.dirty = true;
        Ok(())
    }

    fn snapshot(&self) -> Vec<u8> {
        Vec::new()
    }

    fn persist(&mut self, job: &mut PersistJob) {
        if std::mem::take(&mut self.dirty) {
            job.put_app(APPLIED_KEY, self.applied_index.to_be_bytes().to_vec());
        }
    }
}

/// A store the test can read while the driver owns it.
#[derive(Clone, Default)]
struct SharedStore(Arc<Mutex<MemStore>>);

impl LogStore for SharedStore {
    fn write(&mut self, job: &PersistJob) -> Result<(), ferry_multiraft::Error> {
        self.0.lock().unwrap().write(job)
    }
    fn load(&self) -> Result<Recovered, ferry_multiraft::Error> {
        self.0.lock().unwrap().load()
    }
    fn app_get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, ferry_multiraft::Error> {
        self.0.lock().unwrap().app_get(key)
    }
    fn app_scan(
        &self,
        prefix: &[u8],
    ) -> Result<Vec<ferry_multiraft::KeyValue>, ferry_multiraft::Error> {
        self.0.lock().unwrap().app_scan(prefix)
    }
}

type Wire = Arc<Mutex<VecDeque<(NodeId, NodeId, Bytes)>>>;

/// Queues what a node sends, for the test to deliver.
struct Queue {
    from: NodeId,
    wire: Wire,
}

impl Outbound for Queue {
    fn send(&self, to: NodeId, bytes: Bytes) {
        self.wire.lock().unwrap().push_back((self.from, to, bytes));
    }
    fn send_snapshot(&self, snapshot: OutSnapshot) {
        let bytes = snapshot.as_batch();
        self.wire
            .lock()
            .unwrap()
            .push_back((self.from, snapshot.to, bytes));
    }
}

struct Cluster {
    drivers: BTreeMap<NodeId, Driver<Toy>>,
    stores: BTreeMap<NodeId, SharedStore>,
    wire: Wire,
}

impl Cluster {
    fn new(n: u64) -> Self {
        let voters: Vec<NodeId> = (1..=n).map(NodeId).collect();
        let wire = Wire::default();
        let mut drivers = BTreeMap::new();
        let mut stores = BTreeMap::new();
        for &node in &voters {
            let config = EngineConfig {
                election_seed: 7 * node.0,
                ..EngineConfig::new(node)
            };
            let mut engine = Engine::open(config, Recovered::default()).unwrap();
            engine.bootstrap_group(G0, &voters).unwrap();
            let mut store = SharedStore::default();
            let job = engine.round().persist.expect("bootstrap writes");
            store.write(&job).unwrap();
            engine.on_persisted(job.id()).unwrap();
            let queue = Queue {
                from: node,
                wire: Arc::clone(&wire),
            };
            let machines = BTreeMap::from([(G0, Toy::default())]);
            let driver = Driver::new(
                Some(engine),
                machines,
                Box::new(store.clone()),
                Box::new(queue),
                DriverConfig::default(),
            );
            drivers.insert(node, driver);
            stores.insert(node, store);
        }
        Cluster {
            drivers,
            stores,
            wire,
        }
    }

    /// Delivers everything sent so far, then runs every driver's rounds.
    fn settle(&mut self) {
        for _ in 0..50 {
            let sent: Vec<_> = self.wire.lock().unwrap().drain(..).collect();
            for (from, to, bytes) in &sent {
                if let Some(d) = self.drivers.get_mut(to) {
                    d.receive(*from, bytes);
                }
            }
            for d in self.drivers.values_mut() {
                d.run_rounds();
            }
            if self.wire.lock().unwrap().is_empty() {
                return;
            }
        }
    }

    fn tick(&mut self) {
        for d in self.drivers.values_mut() {
            d.tick();
        }
        self.settle();
    }

    fn leader(&self) -> Option<NodeId> {
        self.drivers.iter().find_map(|(id, d)| {
            let status = d.engine()?.status(G0)?;
            (status.role == Role::Leader).then_some(*id)
        })
    }

    fn elect(&mut self) -> NodeId {
        for _ in 0..TICKS_MAX {
            if let Some(leader) = self.leader() {
                return leader;
            }
            self.tick();
        }
        panic!("no leader within {TICKS_MAX} ticks");
    }

    fn propose(&mut self, node: NodeId, data: &[u8]) -> Arc<Mutex<Option<Proposed<usize>>>> {
        let answer = Arc::new(Mutex::new(None));
        let to = Arc::clone(&answer);
        self.drivers.get_mut(&node).unwrap().propose(
            G0,
            data.to_vec(),
            Box::new(move |outcome| *to.lock().unwrap() = Some(outcome)),
        );
        self.settle();
        answer
    }

    fn stored_applied(&self, node: NodeId) -> Option<u64> {
        let bytes = self.stores[&node].app_get(APPLIED_KEY).unwrap()?;
        Some(u64::from_be_bytes(bytes.try_into().unwrap()))
    }
}

#[test]
fn a_proposal_is_answered_once_applied_and_every_node_applies_the_same_entries() {
    let mut cluster = Cluster::new(3);
    let leader = cluster.elect();
    let mut indexes = vec![];
    for i in 0..5 {
        let answer = cluster.propose(leader, format!("entry {i}").as_bytes());
        let (index, applied_count) = answer.lock().unwrap().take().unwrap().unwrap();
        assert_eq!(applied_count, i + 1);
        indexes.push(index);
    }
    assert!(indexes.windows(2).all(|w| w[0] < w[1]), "{indexes:?}");
    // Followers learn the last commit on the next heartbeat.
    for _ in 0..10 {
        cluster.tick();
    }
    let expected = &cluster.drivers[&leader].machine(G0).unwrap().entries;
    assert_eq!(expected.len(), 5);
    for (node, driver) in &cluster.drivers {
        let toy = driver.machine(G0).unwrap();
        assert_eq!(&toy.entries, expected, "node {node}");
        // What a machine applied reached the store with its applied index, in the same job.
        assert_eq!(
            cluster.stored_applied(*node),
            Some(toy.applied_index),
            "node {node}"
        );
    }
}

#[test]
fn a_proposal_on_a_follower_is_refused_with_the_leader() {
    let mut cluster = Cluster::new(3);
    let leader = cluster.elect();
    // Followers know the leader once its first heartbeat arrived.
    cluster.tick();
    let follower = *cluster.drivers.keys().find(|n| **n != leader).unwrap();
    let answer = cluster.propose(follower, b"from a follower");
    let outcome = answer.lock().unwrap().take().unwrap();
    assert_eq!(outcome, Err(ProposeFailure::NotLeader(Some(leader))));
}

#[test]
fn an_entry_the_machine_cannot_apply_halts_the_driver_with_nothing_of_its_round_written() {
    let mut cluster = Cluster::new(1);
    let leader = cluster.elect();
    let answer = cluster.propose(leader, b"fine");
    assert!(answer.lock().unwrap().take().unwrap().is_ok());
    let before = cluster.stored_applied(leader).unwrap();
    let poisoned = cluster.propose(leader, b"poison");
    let driver = cluster.drivers.get_mut(&leader).unwrap();
    let halt = driver.halted().expect("halted").clone();
    assert!(halt.0.contains("cannot be applied"), "{halt:?}");
    // The poisoned entry's round wrote nothing: the stored applied index did not move.
    assert_eq!(cluster.stored_applied(leader), Some(before));
    // Nothing runs after a halt, and the waiting proposal fails when the driver ends.
    let driver = cluster.drivers.get_mut(&leader).unwrap();
    assert_eq!(driver.run_rounds().rounds, 0);
    driver.end();
    assert_eq!(
        poisoned.lock().unwrap().take(),
        Some(Err(ProposeFailure::Stopped))
    );
}
