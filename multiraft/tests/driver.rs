//! The generic round loop ([`Driver`]) with a toy state machine, several nodes in one process
//! on the crate's simulator: proposals answered once applied, with their index; a follower's
//! proposal refused with the leader's id; the same applied sequence on every node, its applied
//! index in the same job; a machine that cannot apply an entry halts its driver with nothing
//! of that round written; the same seed gives the same run.

#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use ferry_multiraft::sim::{Faults, Sim, SimStore};
use ferry_multiraft::{
    Driver, DriverConfig, Engine, EngineConfig, GroupId, GroupMachine, Halt, LogPosition, LogStore,
    NodeId, PersistJob, ProposeFailure, Proposed, Recovered, Role,
};

const G0: GroupId = GroupId(0);
const APPLIED_KEY: &[u8] = b"toy/applied";
/// Enough steps for many election timeouts.
const STEPS_MAX: u64 = 4_000;

/// Applies entries by remembering them; halts on an entry that says "poison", after changing
/// its applied index (a machine half-way through: what the driver must then not write).
#[derive(Debug, Default)]
struct Toy {
    applied_index: u64,
    entries: Vec<(u64, Vec<u8>)>,
    dirty: bool,
    /// Says it cannot make snapshots.
    no_snapshots: bool,
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

    fn can_snapshot(&self) -> bool {
        !self.no_snapshots
    }

    fn persist(&mut self, job: &mut PersistJob) {
        if std::mem::take(&mut self.dirty) {
            job.put_app(APPLIED_KEY, self.applied_index.to_be_bytes().to_vec());
        }
    }
}

struct Cluster {
    sim: Sim<Driver<Toy>>,
    stores: BTreeMap<NodeId, SimStore>,
}

impl Cluster {
    fn new(n: u64, seed: u64, faults: Faults) -> Self {
        Self::with(n, seed, faults, DriverConfig::default(), false)
    }

    fn with(n: u64, seed: u64, faults: Faults, rounds: DriverConfig, no_snapshots: bool) -> Self {
        let voters: Vec<NodeId> = (1..=n).map(NodeId).collect();
        let mut sim = Sim::new(seed, faults);
        let mut stores = BTreeMap::new();
        for &node in &voters {
            let config = EngineConfig {
                election_seed: seed ^ (7 * node.0),
                ..EngineConfig::new(node)
            };
            let mut engine = Engine::open(config, Recovered::default()).unwrap();
            engine.bootstrap_group(G0, &voters).unwrap();
            let store = SimStore::new();
            let toy = Toy {
                no_snapshots,
                ..Toy::default()
            };
            let machines = BTreeMap::from([(G0, toy)]);
            let driver = Driver::new(
                Some(engine),
                machines,
                Box::new(store.clone()),
                Box::new(sim.outbound(node)),
                rounds,
            );
            sim.add(node, driver);
            stores.insert(node, store);
        }
        Cluster { sim, stores }
    }

    fn leader(&self) -> Option<NodeId> {
        self.sim.replicas().find_map(|(id, d)| {
            let status = d.engine()?.status(G0)?;
            (status.role == Role::Leader).then_some(id)
        })
    }

    fn elect(&mut self) -> NodeId {
        assert!(
            self.sim
                .run_until(STEPS_MAX, |s| s.replicas().any(|(_, d)| {
                    d.engine()
                        .and_then(|e| e.status(G0))
                        .is_some_and(|st| st.role == Role::Leader)
                })),
            "no leader within {STEPS_MAX} steps"
        );
        self.leader().unwrap()
    }

    /// Proposes `data` on `node`; its outcome, once there is one.
    fn propose(&mut self, node: NodeId, data: &[u8]) -> Answer {
        let answer = Answer::default();
        let to = Arc::clone(&answer);
        self.sim.replica_mut(node).unwrap().propose(
            G0,
            data.to_vec(),
            Box::new(move |outcome| *to.lock().unwrap() = Some(outcome)),
        );
        self.sim.collect();
        answer
    }

    /// Steps until `answer` has an outcome; the outcome.
    fn outcome(&mut self, answer: &Answer) -> Proposed<usize> {
        assert!(
            self.sim
                .run_until(STEPS_MAX, |_| answer.lock().unwrap().is_some()),
            "no outcome within {STEPS_MAX} steps"
        );
        answer.lock().unwrap().take().unwrap()
    }

    fn stored_applied(&self, node: NodeId) -> Option<u64> {
        let bytes = self.stores[&node].app_get(APPLIED_KEY).unwrap()?;
        Some(u64::from_be_bytes(bytes.try_into().unwrap()))
    }
}

type Answer = Arc<Mutex<Option<Proposed<usize>>>>;

#[test]
fn a_proposal_is_answered_once_applied_and_every_node_applies_the_same_entries() {
    let mut cluster = Cluster::new(3, 1, Faults::lossy());
    let mut indexes = vec![];
    let mut i = 0;
    while indexes.len() < 5 {
        let leader = cluster.elect();
        let answer = cluster.propose(leader, format!("entry {i}").as_bytes());
        match cluster.outcome(&answer) {
            Ok((index, applied_count)) => {
                indexes.push(index);
                assert_eq!(applied_count, indexes.len());
                i += 1;
            }
            // Lost to a leader change on the lossy network: proposed again.
            Err(ProposeFailure::Overwritten | ProposeFailure::NotLeader(_)) => {}
            Err(e) => panic!("{e:?}"),
        }
    }
    assert!(indexes.windows(2).all(|w| w[0] < w[1]), "{indexes:?}");
    let leader = cluster.leader().unwrap();
    let expected = cluster
        .sim
        .replica(leader)
        .unwrap()
        .machine(G0)
        .unwrap()
        .entries
        .clone();
    assert_eq!(expected.len(), 5);
    let everywhere = |s: &Sim<Driver<Toy>>| {
        s.replicas()
            .all(|(_, d)| d.machine(G0).unwrap().entries == expected)
    };
    assert!(
        cluster.sim.run_until(STEPS_MAX, everywhere),
        "not applied everywhere"
    );
    for (node, driver) in cluster.sim.replicas() {
        // What a machine applied reached the store with its applied index, in the same job.
        let toy = driver.machine(G0).unwrap();
        assert_eq!(
            cluster.stored_applied(node),
            Some(toy.applied_index),
            "node {node}"
        );
    }
}

/// A machine that cannot make snapshots keeps its group's whole log; one that can is
/// compacted once it applied `compact_after_entries` entries.
#[test]
fn a_group_whose_machine_cannot_snapshot_is_never_compacted() {
    let config = DriverConfig {
        compact_after_entries: 4,
        ..DriverConfig::default()
    };
    let mut first_indexes = vec![];
    for no_snapshots in [false, true] {
        let mut cluster = Cluster::with(3, 3, Faults::none(), config, no_snapshots);
        let leader = cluster.elect();
        for i in 0..12 {
            let answer = cluster.propose(leader, format!("entry {i}").as_bytes());
            cluster.outcome(&answer).unwrap();
        }
        let engine = cluster.sim.replica(leader).unwrap().engine().unwrap();
        first_indexes.push(engine.status(G0).unwrap().first_index);
    }
    assert!(first_indexes[0] > 2, "compacted: {first_indexes:?}");
    assert_eq!(first_indexes[1], 2, "never compacted: {first_indexes:?}");
}

/// A leader cut off with proposals it could not commit: a new leader is elected whose log is
/// shorter, and nothing more is proposed, so those indexes are never reached. Each proposal
/// still gets an outcome (unknown: overwritten) once the old leader learns of the new term,
/// instead of waiting for ever.
#[test]
fn proposals_of_a_deposed_leader_fail_even_if_their_indexes_are_never_reached() {
    let mut cluster = Cluster::new(3, 4, Faults::none());
    let old = cluster.elect();
    let all: Vec<NodeId> = (1..=3).map(NodeId).collect();
    cluster.sim.isolate(old, &all);
    let answers: Vec<Answer> = (0..3)
        .map(|i| cluster.propose(old, format!("lost {i}").as_bytes()))
        .collect();
    let old_term = cluster
        .sim
        .replica(old)
        .unwrap()
        .engine()
        .unwrap()
        .status(G0)
        .unwrap()
        .term;
    let others_elect = |s: &Sim<Driver<Toy>>| {
        s.replicas().any(|(id, d)| {
            id != old
                && d.engine()
                    .and_then(|e| e.status(G0))
                    .is_some_and(|st| st.role == Role::Leader && st.term > old_term)
        })
    };
    assert!(
        cluster.sim.run_until(STEPS_MAX, others_elect),
        "no new leader"
    );
    cluster.sim.heal();
    let all_answered = |_: &Sim<Driver<Toy>>| answers.iter().all(|a| a.lock().unwrap().is_some());
    assert!(
        cluster.sim.run_until(STEPS_MAX, all_answered),
        "a deposed leader's proposals still wait"
    );
    for a in &answers {
        assert_eq!(
            a.lock().unwrap().take(),
            Some(Err(ProposeFailure::Overwritten))
        );
    }
}

/// A leader cut off from every other replica steps down after an election timeout (check
/// quorum) at its own term: its proposals fail then, not when the cut heals.
#[test]
fn a_leader_that_steps_down_fails_its_proposals_before_the_cut_heals() {
    let mut cluster = Cluster::new(3, 11, Faults::none());
    let old = cluster.elect();
    let all: Vec<NodeId> = (1..=3).map(NodeId).collect();
    cluster.sim.isolate(old, &all);
    let answers: Vec<Answer> = (0..3)
        .map(|i| cluster.propose(old, format!("cut {i}").as_bytes()))
        .collect();
    let all_answered = |_: &Sim<Driver<Toy>>| answers.iter().all(|a| a.lock().unwrap().is_some());
    assert!(
        cluster.sim.run_until(STEPS_MAX, all_answered),
        "a leader cut off from the majority still holds its proposals"
    );
    let status = cluster
        .sim
        .replica(old)
        .unwrap()
        .engine()
        .unwrap()
        .status(G0)
        .unwrap();
    assert_ne!(status.role, Role::Leader, "it stepped down");
    for a in &answers {
        assert_eq!(
            a.lock().unwrap().take(),
            Some(Err(ProposeFailure::Overwritten))
        );
    }
}

#[test]
fn a_proposal_on_a_follower_is_refused_with_the_leader() {
    let mut cluster = Cluster::new(3, 2, Faults::none());
    let leader = cluster.elect();
    let follower = NodeId(if leader == NodeId(1) { 2 } else { 1 });
    // A follower knows the leader once its first message arrived.
    let knows = |s: &Sim<Driver<Toy>>| {
        let status = s
            .replica(follower)
            .unwrap()
            .engine()
            .unwrap()
            .status(G0)
            .unwrap();
        status.leader == Some(leader)
    };
    assert!(cluster.sim.run_until(STEPS_MAX, knows));
    let answer = cluster.propose(follower, b"from a follower");
    let outcome = answer.lock().unwrap().take().unwrap();
    assert_eq!(outcome, Err(ProposeFailure::NotLeader(Some(leader))));
}

#[test]
fn an_entry_the_machine_cannot_apply_halts_the_driver_with_nothing_of_its_round_written() {
    let mut cluster = Cluster::new(1, 3, Faults::none());
    let leader = cluster.elect();
    let answer = cluster.propose(leader, b"fine");
    assert!(cluster.outcome(&answer).is_ok());
    let before = cluster.stored_applied(leader).unwrap();
    let poisoned = cluster.propose(leader, b"poison");
    let halted = |s: &Sim<Driver<Toy>>| s.replica(leader).unwrap().halted().is_some();
    assert!(cluster.sim.run_until(STEPS_MAX, halted));
    let halt = cluster
        .sim
        .replica(leader)
        .unwrap()
        .halted()
        .unwrap()
        .clone();
    assert!(halt.0.contains("cannot be applied"), "{halt:?}");
    // The poisoned entry's round wrote nothing: the stored applied index did not move.
    assert_eq!(cluster.stored_applied(leader), Some(before));
    // Nothing runs after a halt, and the waiting proposal fails when the driver ends.
    let driver = cluster.sim.replica_mut(leader).unwrap();
    assert_eq!(driver.run_rounds().rounds, 0);
    driver.end();
    assert_eq!(
        poisoned.lock().unwrap().take(),
        Some(Err(ProposeFailure::Stopped))
    );
}

/// The leader's match index of each other member (what `ferry shard list` reads its lag
/// from): every follower's reaches the leader's last index once it acknowledged it; a follower
/// cut off stays where it was while the leader goes on; followers have none.
#[test]
fn the_leader_reports_how_far_each_follower_matches_its_log() {
    let mut cluster = Cluster::new(3, 5, Faults::none());
    let leader = cluster.elect();
    for i in 0..3 {
        let answer = cluster.propose(leader, format!("entry {i}").as_bytes());
        cluster.outcome(&answer).unwrap();
    }
    let status = |c: &Cluster, n: NodeId| c.sim.replica(n).unwrap().engine().unwrap().status(G0);
    let matched = |c: &Cluster| {
        let engine = c.sim.replica(leader).unwrap().engine().unwrap();
        engine.match_indexes(G0).unwrap()
    };
    let last = status(&cluster, leader).unwrap().last_index;
    let caught_up = |s: &Sim<Driver<Toy>>| {
        let engine = s.replica(leader).unwrap().engine().unwrap();
        engine
            .match_indexes(G0)
            .is_some_and(|m| m.iter().all(|(_, i)| *i == last))
    };
    assert!(
        cluster.sim.run_until(STEPS_MAX, caught_up),
        "{:?}",
        matched(&cluster)
    );
    let others: Vec<NodeId> = (1..=3).map(NodeId).filter(|n| *n != leader).collect();
    assert_eq!(
        matched(&cluster)
            .iter()
            .map(|(n, _)| *n)
            .collect::<Vec<_>>(),
        others,
        "the other members, in order, not the leader"
    );
    for follower in &others {
        let engine = cluster.sim.replica(*follower).unwrap().engine().unwrap();
        assert_eq!(engine.match_indexes(G0), None, "a follower has no progress");
    }

    let behind = others[0];
    cluster.sim.block(leader, behind);
    for i in 0..4 {
        let answer = cluster.propose(leader, format!("more {i}").as_bytes());
        cluster.outcome(&answer).unwrap();
    }
    let m = matched(&cluster);
    assert_eq!(m[0], (behind, last), "{m:?}");
    let now = status(&cluster, leader).unwrap().last_index;
    assert_eq!(now, last + 4);
    assert_eq!(m[1], (others[1], now), "{m:?}");
}

/// Runs three nodes on a lossy network with a partition, proposing as it goes; the trace.
fn scripted_run(seed: u64) -> Vec<(u64, ferry_multiraft::sim::Traced)> {
    let mut cluster = Cluster::new(3, seed, Faults::lossy());
    let leader = cluster.elect();
    for i in 0..3 {
        let answer = cluster.propose(leader, format!("before {i}").as_bytes());
        cluster
            .sim
            .run_until(200, |_| answer.lock().unwrap().is_some());
    }
    cluster
        .sim
        .isolate(leader, &[NodeId(1), NodeId(2), NodeId(3)]);
    cluster.sim.run_until(400, |_| false);
    cluster.sim.heal();
    cluster.sim.run_until(400, |_| false);
    cluster.sim.trace().to_vec()
}

#[test]
fn one_seed_gives_the_same_run_twice_and_another_seed_another() {
    let first = scripted_run(11);
    assert!(
        first.len() > 100,
        "the run did something: {} events",
        first.len()
    );
    let lost = first
        .iter()
        .filter(|(_, e)| matches!(e, ferry_multiraft::sim::Traced::Lost { .. }))
        .count();
    assert!(lost > 0, "the partition and the lossy network lost packets");
    assert_eq!(scripted_run(11), first);
    assert_ne!(scripted_run(12), first);
}
