//! One storage suite run against both stores: rounds written with one synced write each, then
//! reopened (in a loop) with log, hard state, apply state, snapshot and application keys
//! intact. Losing unsynced writes at a crash is the in-memory model's job (see `sim.rs`);
//! RocksDB cannot simulate it.

#![allow(clippy::unwrap_used)]

use ferry_multiraft::{
    Apply, ConfChange, Engine, EngineConfig, EntryKind, GroupId, LogStore, MemStore, NodeId,
    RocksStore, Role,
};

const G: GroupId = GroupId(7);
const OTHER: GroupId = GroupId(8);

/// A store that can be closed and opened again.
trait Reopen: LogStore {
    fn reopen(self) -> Self;
}

impl Reopen for MemStore {
    fn reopen(mut self) -> Self {
        self.crash();
        self
    }
}

struct Rocks {
    dir: tempfile::TempDir,
    store: RocksStore,
}

impl LogStore for Rocks {
    fn write(&mut self, job: &ferry_multiraft::PersistJob) -> Result<(), ferry_multiraft::Error> {
        self.store.write(job)
    }
    fn load(&self) -> Result<ferry_multiraft::Recovered, ferry_multiraft::Error> {
        self.store.load()
    }
    fn app_get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, ferry_multiraft::Error> {
        self.store.app_get(key)
    }
    fn app_scan(
        &self,
        prefix: &[u8],
    ) -> Result<Vec<ferry_multiraft::KeyValue>, ferry_multiraft::Error> {
        self.store.app_scan(prefix)
    }
}

impl Reopen for Rocks {
    fn reopen(self) -> Self {
        let Rocks { dir, store } = self;
        drop(store);
        let store = RocksStore::open(dir.path()).unwrap();
        Rocks { dir, store }
    }
}

fn rocks() -> Rocks {
    let dir = tempfile::tempdir().unwrap();
    let store = RocksStore::open(dir.path()).unwrap();
    Rocks { dir, store }
}

/// An engine and its store, driven synchronously: every job is written before the next round.
struct Node<S> {
    engine: Engine,
    store: S,
    applied: Vec<Apply>,
}

impl<S: Reopen> Node<S> {
    fn open(node: NodeId, store: S) -> Self {
        let engine = Engine::open(EngineConfig::new(node), store.load().unwrap()).unwrap();
        Node {
            engine,
            store,
            applied: Vec::new(),
        }
    }

    /// Runs rounds until idle; returns the batches sent, for a peer.
    fn pump(&mut self) -> Vec<ferry_multiraft::OutBatch> {
        let mut sent = Vec::new();
        while self.engine.has_ready() {
            let round = self.engine.round();
            let requests = round.snapshot_requests.clone();
            if let Some(mut job) = round.persist {
                for apply in &round.applies {
                    let key = format!("applied/{}", apply.group().0);
                    job.put_app(key, apply.position().index.to_be_bytes().to_vec());
                }
                self.store.write(&job).unwrap();
                self.engine.on_persisted(job.id()).unwrap();
            }
            self.applied.extend(round.applies);
            for group in requests {
                let applied = self.engine.status(group).unwrap().applied_index;
                self.engine
                    .compact(group, applied, b"state".to_vec())
                    .unwrap();
            }
            sent.extend(round.batches);
            // Snapshots travel apart; here they go the same way as the batches.
            sent.extend(round.snapshots.iter().map(|s| ferry_multiraft::OutBatch {
                to: s.to,
                bytes: s.as_batch(),
                message_count: 1,
            }));
        }
        sent
    }

    fn elect(&mut self, group: GroupId) {
        self.engine.campaign(group).unwrap();
        self.pump();
        assert_eq!(self.engine.status(group).unwrap().role, Role::Leader);
    }

    fn propose(&mut self, group: GroupId, count: usize) {
        for i in 0..count {
            self.engine
                .propose(group, format!("entry {i}").into_bytes())
                .unwrap();
            self.pump();
        }
    }

    fn reopen(self, node: NodeId) -> Self {
        Node::open(node, self.store.reopen())
    }
}

fn app_applied<S: LogStore>(store: &S, group: GroupId) -> u64 {
    let bytes = store
        .app_get(format!("applied/{}", group.0).as_bytes())
        .unwrap()
        .unwrap();
    u64::from_be_bytes(bytes.try_into().unwrap())
}

/// Log, hard state, apply state and compaction survive reopening, round after round.
fn rounds_survive_reopening<S: Reopen>(store: S) {
    let me = NodeId(1);
    let mut node = Node::open(me, store);
    node.engine.bootstrap_group(G, &[me]).unwrap();
    node.engine.bootstrap_group(OTHER, &[me]).unwrap();
    node.pump();
    node.elect(G);
    node.elect(OTHER);
    for cycle in 0..5u64 {
        node.propose(G, 10);
        node.propose(OTHER, 3);
        if cycle == 2 {
            let applied = node.engine.status(G).unwrap().applied_index;
            node.engine
                .compact(G, applied - 4, b"snapshot data".to_vec())
                .unwrap();
            node.pump();
        }
        let before = node.engine.status(G).unwrap();
        let other_before = node.engine.status(OTHER).unwrap();
        node = node.reopen(me);
        let after = node.engine.status(G).unwrap();
        assert_eq!(after.term, before.term, "cycle {cycle}: hard state");
        assert_eq!(after.commit_index, before.commit_index, "cycle {cycle}");
        assert_eq!(after.last_index, before.last_index, "cycle {cycle}: log");
        assert_eq!(
            after.applied_index, before.applied_index,
            "cycle {cycle}: apply state"
        );
        assert_eq!(
            after.first_index, before.first_index,
            "cycle {cycle}: compaction"
        );
        assert_eq!(after.voters, vec![me]);
        assert_eq!(
            node.engine.status(OTHER).unwrap().last_index,
            other_before.last_index
        );
        assert_eq!(
            app_applied(&node.store, G),
            before.applied_index,
            "app key with the job"
        );
        // A restarted single voter elects itself again and keeps going.
        node.elect(G);
        node.elect(OTHER);
    }
    let keys = node.store.app_scan(b"applied/").unwrap();
    assert_eq!(keys.len(), 2);
    assert!(node.store.app_scan(b"nothing/").unwrap().is_empty());
}

/// A learner that joins late receives a snapshot; after reopening its store it resumes from
/// the snapshot and the entries after it.
fn an_installed_snapshot_survives_reopening<S: Reopen>(leader_store: S, learner_store: S) {
    let (one, two) = (NodeId(1), NodeId(2));
    let mut leader = Node::open(one, leader_store);
    leader.engine.bootstrap_group(G, &[one]).unwrap();
    leader.pump();
    leader.elect(G);
    leader.propose(G, 20);
    let applied = leader.engine.status(G).unwrap().applied_index;
    leader
        .engine
        .compact(G, applied, b"app state at compaction".to_vec())
        .unwrap();
    leader.pump();

    let mut learner = Node::open(two, learner_store);
    learner.engine.create_group(G).unwrap();
    learner.pump();
    leader
        .engine
        .propose_conf_change(G, ConfChange::AddLearner(two))
        .unwrap();
    leader.propose(G, 3);
    for _ in 0..50 {
        for batch in leader.pump() {
            learner.engine.step(one, &batch.bytes).unwrap();
        }
        for batch in learner.pump() {
            leader.engine.step(two, &batch.bytes).unwrap();
        }
        leader.engine.tick();
    }
    let snapshot = learner.applied.iter().find_map(|a| match a {
        Apply::Snapshot { position, data, .. } => Some((position.index, data.clone())),
        Apply::Entry { .. } => None,
    });
    let (snapshot_index, data) = snapshot.expect("the learner got a snapshot");
    assert!(snapshot_index >= applied);
    assert!(!data.is_empty());
    let before = learner.engine.status(G).unwrap();
    assert_eq!(
        before.commit_index,
        leader.engine.status(G).unwrap().commit_index
    );
    assert_eq!(before.learners, vec![two]);

    let learner = learner.reopen(two);
    let after = learner.engine.status(G).unwrap();
    assert_eq!(
        after.first_index,
        snapshot_index + 1,
        "log starts after the snapshot"
    );
    assert_eq!(after.last_index, before.last_index);
    assert_eq!(after.applied_index, before.applied_index);
    assert_eq!(
        after.learners,
        vec![two],
        "configuration from the snapshot and after"
    );
}

#[test]
fn memory_rounds_survive_reopening() {
    rounds_survive_reopening(MemStore::new());
}

#[test]
fn rocksdb_rounds_survive_reopening() {
    rounds_survive_reopening(rocks());
}

#[test]
fn memory_an_installed_snapshot_survives_reopening() {
    an_installed_snapshot_survives_reopening(MemStore::new(), MemStore::new());
}

#[test]
fn rocksdb_an_installed_snapshot_survives_reopening() {
    an_installed_snapshot_survives_reopening(rocks(), rocks());
}

#[test]
fn memory_store_loses_unsynced_jobs_at_a_crash() {
    let me = NodeId(1);
    let mut engine = Engine::open(EngineConfig::new(me), Default::default()).unwrap();
    engine.bootstrap_group(G, &[me]).unwrap();
    let mut store = MemStore::new();
    let job = engine.round().persist.unwrap();
    store.write_unsynced(&job);
    assert_eq!(
        store.load().unwrap().group_ids(),
        vec![G],
        "read back before the sync, as RocksDB does"
    );
    store.crash();
    assert!(
        store.load().unwrap().group_ids().is_empty(),
        "lost at the crash"
    );
    store.write_unsynced(&job);
    store.sync();
    store.crash();
    assert_eq!(store.load().unwrap().group_ids(), vec![G]);
}

#[test]
fn a_round_that_only_applies_is_not_synced_and_after_a_crash_its_entries_are_applied_again() {
    let me = NodeId(1);
    let mut node = Node::open(me, MemStore::new());
    node.engine.bootstrap_group(G, &[me]).unwrap();
    node.pump();
    node.elect(G);
    node.propose(G, 3);
    let applied = node.engine.status(G).unwrap().applied_index;
    assert_eq!(app_applied(&node.store, G), applied, "read back at once");
    assert!(
        node.store.unsynced_job_count() > 0,
        "the round that applied the last entry was synced"
    );
    node = node.reopen(me);
    assert!(
        app_applied(&node.store, G) < applied,
        "the crash kept the unsynced apply"
    );
    // The entries are in the synced log: the next leader's first commit applies them again.
    node.elect(G);
    let replayed = node.applied.iter().any(
        |a| matches!(a, Apply::Entry { kind: EntryKind::Normal(data), .. } if data == b"entry 2"),
    );
    assert!(replayed, "{:?}", node.applied);
    assert_eq!(
        app_applied(&node.store, G),
        node.engine.status(G).unwrap().applied_index
    );
}
