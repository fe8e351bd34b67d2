//! The invariants of the metadata simulations, checked at every entry a node's real
//! `MetaMachine` applies (through its [`Probe`]) and after every wake-up of its driver:
//!
//! - an index, once applied anywhere, has one term and one state digest on every node that
//!   applies it, and a node applies the log in order (a snapshot never takes it back);
//! - a (queue, epoch) pair has one owner across all nodes and all time;
//! - a queue's epoch never decreases along the log;
//! - one leader per term;
//! - the state's own invariants ([`MetaState::check_invariants`]) and no apply lag (what the
//!   engine handed out is what the machine applied) after every wake-up.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use ferry_cluster::meta::{MetaError, MetaEvent, MetaState};
use ferry_kernel::{NodeId, PlacementEpoch, QueueName};
use ferry_multiraft::{LogPosition, NodeId as PeerId};

use super::super::machine::{Change, Probe};
use super::super::view::MetaView;

/// What a run exercised, to show the seeds together did something.
#[derive(Debug, Default, Clone, Copy)]
pub(super) struct Stats {
    pub(super) accepted: u64,
    pub(super) refused: u64,
    pub(super) conf_changes: u64,
    pub(super) snapshots_installed: u64,
    pub(super) restarts: u64,
    /// Shards the run made (their groups started on their replicas, most removed again).
    pub(super) shards: u64,
}

impl Stats {
    pub(super) fn add(&mut self, other: &Stats) {
        self.accepted += other.accepted;
        self.refused += other.refused;
        self.conf_changes += other.conf_changes;
        self.snapshots_installed += other.snapshots_installed;
        self.restarts += other.restarts;
        self.shards += other.shards;
    }
}

/// The checker every node of a simulation reports to.
#[derive(Debug)]
pub(super) struct Checks {
    seed: u64,
    /// Every applied index: its term and the state digest after it.
    committed: BTreeMap<u64, (u64, u64)>,
    /// The outcome of each command applied, as the first node to apply it saw it.
    results: BTreeMap<u64, Result<MetaEvent, MetaError>>,
    /// (queue, epoch) → owner, across all nodes and time.
    owners: BTreeMap<(QueueName, PlacementEpoch), NodeId>,
    /// Each queue's epoch at the highest index applied so far.
    last_epochs: BTreeMap<QueueName, PlacementEpoch>,
    /// term → its leader.
    leaders: BTreeMap<u64, PeerId>,
    /// The index each node's machine reached last.
    reached: BTreeMap<PeerId, u64>,
    pub(super) stats: Stats,
}

/// A checker shared by a simulation's nodes.
pub(super) type Shared = Arc<Mutex<Checks>>;

/// Locks the checker (a check that failed on another node poisons nothing worth keeping: the
/// test is failing already).
pub(super) fn lock(checks: &Shared) -> MutexGuard<'_, Checks> {
    checks.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Checks {
    pub(super) fn new(seed: u64) -> Shared {
        Arc::new(Mutex::new(Checks {
            seed,
            committed: BTreeMap::new(),
            results: BTreeMap::new(),
            owners: BTreeMap::new(),
            last_epochs: BTreeMap::new(),
            leaders: BTreeMap::new(),
            reached: BTreeMap::new(),
            stats: Stats::default(),
        }))
    }

    /// The probe to give node `node`'s machine.
    pub(super) fn probe(checks: &Shared, node: PeerId) -> Probe {
        let checks = Arc::clone(checks);
        Probe(Box::new(move |position, change, meta| {
            lock(&checks).on_change(node, position, change, meta);
        }))
    }

    /// Node `node` (re)starts with `meta`, rebuilt from its store: the state every node had
    /// at its index.
    pub(super) fn started(&mut self, node: PeerId, meta: &MetaState) {
        let index = meta.applied_index();
        if let Some((_, digest)) = self.committed.get(&index) {
            assert_eq!(
                *digest,
                meta.digest(),
                "{node}: the metadata rebuilt at index {index} differs from the log's (seed {})",
                self.seed
            );
        }
        self.reached.insert(node, index);
    }

    fn on_change(
        &mut self,
        node: PeerId,
        position: LogPosition,
        change: Change<'_>,
        meta: &MetaState,
    ) {
        let seed = self.seed;
        let before = self.reached.get(&node).copied().unwrap_or(0);
        match change {
            Change::Restored => {
                assert!(
                    position.index >= before,
                    "{node}: a snapshot at {} takes it back from {before} (seed {seed})",
                    position.index
                );
                self.stats.snapshots_installed += 1;
            }
            Change::Applied(_) | Change::Skipped => assert_eq!(
                position.index,
                before + 1,
                "{node}: applied out of order (seed {seed})"
            ),
        }
        self.reached.insert(node, position.index);
        if !self.results.contains_key(&position.index) {
            match change {
                Change::Applied(Ok(MetaEvent::Nothing)) | Change::Restored => {}
                Change::Applied(outcome) => {
                    match outcome {
                        Ok(_) => self.stats.accepted += 1,
                        Err(_) => self.stats.refused += 1,
                    }
                    self.results.insert(position.index, outcome.clone());
                }
                Change::Skipped => self.stats.conf_changes += 1,
            }
        }
        self.record(node, position, meta);
    }

    /// Checks `node`'s state right after it reached `position`.
    fn record(&mut self, node: PeerId, position: LogPosition, meta: &MetaState) {
        let seed = self.seed;
        if let Err(e) = meta.check_invariants() {
            panic!("{node} at {}: {e} (seed {seed})", position.index);
        }
        assert_eq!(
            meta.applied_index(),
            position.index,
            "{node}: state at its index"
        );
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
        // An unreplicated queue's owner at an epoch is the one node holding it: never two. A
        // replicated queue's owner is its shard's preferred leader (`check_invariants` checks
        // that), which a replica move changes at the same epoch: the queue stays what it was.
        for (name, q) in meta.queues().iter().filter(|(_, q)| q.shard.is_none()) {
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

    /// After a wake-up of node `node`'s driver, with the view it published: one leader per
    /// term, and the machine applied everything the engine handed out.
    pub(super) fn woke(&mut self, node: PeerId, view: &MetaView) {
        let seed = self.seed;
        let Some(group) = &view.group else {
            return;
        };
        assert_eq!(
            group.applied_index,
            view.meta.applied_index(),
            "{node}: apply lag (seed {seed})"
        );
        if view.is_leader() {
            let first = *self.leaders.entry(group.term).or_insert(node);
            assert_eq!(
                first, node,
                "two leaders in term {} (seed {seed})",
                group.term
            );
        }
    }

    /// The term of the entry applied at `index`, once any node applied it.
    pub(super) fn term_at(&self, index: u64) -> Option<u64> {
        self.committed.get(&index).map(|(term, _)| *term)
    }

    /// The outcome of the command applied at `index`.
    pub(super) fn result(&self, index: u64) -> Option<&Result<MetaEvent, MetaError>> {
        self.results.get(&index)
    }

    /// Refusals by kind (the error's variant name).
    pub(super) fn refusals(&self) -> BTreeMap<String, u64> {
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
}
