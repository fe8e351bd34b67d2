//! Deterministic simulations of the metadata group: 3 and 5 multiraft engines in one process,
//! each applying group 0 to its own `MetaState`, over a seeded network with partitions,
//! crashes that lose unsynced writes, restarts, and membership changes driven by the metadata
//! commands. The simulator checks its invariants at every applied entry and step (see
//! `support/sim.rs`): identical states at each index, one owner per (queue, epoch), epochs
//! that never decrease, one leader per term.
//!
//! A failing random seed prints itself; `META_SIM_SEED=<seed> cargo test --release -p
//! ferry-cluster --test meta_sim random` replays it exactly, `META_SIM_SEEDS=<count>` runs more.

#![allow(clippy::unwrap_used)]

#[path = "support/sim.rs"]
mod sim;

use std::collections::BTreeMap;

use ferry_cluster::meta::{
    choose_owner, choose_queue_owner, MetaCommand, MetaError, MetaEvent, NodeRole, NodeState,
    RaftId,
};
use ferry_kernel::{NodeId, QueueName};
use ferry_multiraft::NodeId as PeerId;
use ferry_proto::pb;
use rand::Rng;
use sim::{node_name, Faults, Sim, ELECTION_STEPS, G0};

fn q(name: &str) -> QueueName {
    QueueName::new(name).unwrap()
}

/// Proposes `command` until it is applied by the leader; returns how it was applied.
fn propose_and_wait(sim: &mut Sim, command: &MetaCommand) -> Result<MetaEvent, MetaError> {
    let mut position = None;
    for _ in 0..ELECTION_STEPS * 4 {
        if let Some(p) = position.filter(|p| sim.is_committed(*p)) {
            if let Some(result) = sim.result(p.index) {
                return result.clone();
            }
        }
        if position.is_none_or(|p| sim.is_lost(p)) {
            position = sim.propose(command);
        }
        sim.step();
    }
    panic!(
        "{command:?} not applied (position {position:?}) {}",
        sim.describe()
    );
}

fn converge(sim: &mut Sim) {
    assert!(
        sim.run_until(ELECTION_STEPS * 4, Sim::converged),
        "no convergence: {}",
        sim.describe()
    );
    let digests = sim.digests();
    let members = sim.engine(sim.leader().unwrap()).status(G0).unwrap();
    let expected = digests[&sim.leader().unwrap()];
    for m in members.voters.iter().chain(&members.learners) {
        assert_eq!(digests.get(m), Some(&expected), "{m}: {}", sim.describe());
    }
}

fn create_by_rule(sim: &mut Sim, name: &str) -> Result<MetaEvent, MetaError> {
    let meta = sim.leader_meta().unwrap();
    let owner = choose_owner(meta, &BTreeMap::new(), None)?;
    let command = MetaCommand::CreateQueue {
        name: q(name),
        settings: pb::QueueConfig::default(),
        owner,
    };
    propose_and_wait(sim, &command)
}

fn add(id: u64, learner: bool) -> MetaCommand {
    MetaCommand::AddNode {
        id: node_name(id),
        client_addr: format!("10.0.0.{id}:7400"),
        peer_addr: format!("10.0.0.{id}:7401"),
        learner,
    }
}

#[test]
fn three_nodes_bootstrap_and_place_queues_by_the_rule_identically_everywhere() {
    let mut sim = Sim::new(1, 3);
    converge(&mut sim);
    for i in 0..6 {
        create_by_rule(&mut sim, &format!("q{i}")).unwrap();
    }
    converge(&mut sim);
    let placement = sim.leader_meta().unwrap().placement_snapshot();
    let mut per_node: BTreeMap<NodeId, usize> = BTreeMap::new();
    for owner in placement.owners.values() {
        *per_node.entry(owner.node.clone()).or_default() += 1;
    }
    // q0 → n1, q1 → n2, q2 → n3, q3 → n1...: each with its dead-letter queue.
    assert_eq!(per_node.values().copied().collect::<Vec<_>>(), [4, 4, 4]);
    assert_eq!(placement.owners[&q("q1.DLQ")].node, node_name(2));
    for node in sim.node_ids() {
        assert_eq!(sim.nodes[&node].meta.placement_snapshot(), placement);
    }
}

#[test]
fn nodes_join_as_learners_are_promoted_and_removed_through_the_metadata_log() {
    let mut sim = Sim::new(2, 3);
    sim.compact_every_entries = 8;
    converge(&mut sim);
    for i in 0..10 {
        create_by_rule(&mut sim, &format!("early{i}")).unwrap();
    }
    for id in [4, 5] {
        let event = propose_and_wait(&mut sim, &add(id, true)).unwrap();
        assert!(matches!(
            event,
            MetaEvent::NodeAdded {
                role: NodeRole::Learner,
                ..
            }
        ));
    }
    converge(&mut sim);
    let status = sim.engine(sim.leader().unwrap()).status(G0).unwrap();
    assert_eq!(status.learners, [PeerId(4), PeerId(5)]);
    for id in [4, 5] {
        propose_and_wait(&mut sim, &MetaCommand::PromoteNode { id: node_name(id) }).unwrap();
    }
    converge(&mut sim);
    let status = sim.engine(sim.leader().unwrap()).status(G0).unwrap();
    assert_eq!(status.voters.len(), 5);
    assert!(status.learners.is_empty());

    // A node that owns queues cannot leave; an empty one can.
    let pinned = MetaCommand::CreateQueue {
        name: q("on-five"),
        settings: pb::QueueConfig::default(),
        owner: node_name(5),
    };
    propose_and_wait(&mut sim, &pinned).unwrap();
    let remove = |id| MetaCommand::RemoveNode { id: node_name(id) };
    let refused = propose_and_wait(&mut sim, &remove(5)).unwrap_err();
    assert_eq!(
        refused,
        MetaError::NodeOwnsQueues {
            node: node_name(5),
            queues: vec![q("on-five"), q("on-five.DLQ")]
        }
    );
    let empty = sim
        .leader_meta()
        .unwrap()
        .nodes()
        .keys()
        .find(|n| sim.leader_meta().unwrap().queues_of(n).is_empty())
        .cloned()
        .unwrap();
    propose_and_wait(&mut sim, &MetaCommand::RemoveNode { id: empty.clone() }).unwrap();
    converge(&mut sim);
    let meta = sim.leader_meta().unwrap();
    let raft_id = meta.node(&empty).unwrap().raft_id;
    assert_eq!(meta.node(&empty).unwrap().state, NodeState::Removed);
    let status = sim.engine(sim.leader().unwrap()).status(G0).unwrap();
    assert_eq!(status.voters.len(), 4);
    assert!(!status.voters.contains(&PeerId(raft_id.0)));
    // Its raft id is never given again.
    let event = propose_and_wait(&mut sim, &add(6, true)).unwrap();
    assert!(matches!(
        event,
        MetaEvent::NodeAdded {
            raft_id: RaftId(6),
            ..
        }
    ));
    converge(&mut sim);
}

#[test]
fn a_crash_loses_the_unsynced_tail_and_the_node_rebuilds_its_metadata() {
    let mut sim = Sim::new(3, 3);
    converge(&mut sim);
    create_by_rule(&mut sim, "durable").unwrap();
    sim.faults.sync_delay_steps_max = 30;
    let victim = sim.leader().unwrap();
    for i in 0..5 {
        let meta = sim.leader_meta().unwrap();
        let owner = choose_owner(meta, &BTreeMap::new(), None).unwrap();
        let name = q(&format!("maybe{i}"));
        let settings = pb::QueueConfig::default();
        sim.propose(&MetaCommand::CreateQueue {
            name,
            settings,
            owner,
        });
    }
    assert!(sim.run_until(20, |s| s.unsynced_jobs(victim) > 0));
    sim.crash(victim);
    sim.faults.sync_delay_steps_max = 0;
    sim.run(ELECTION_STEPS);
    sim.restart(victim);
    converge(&mut sim);
    create_by_rule(&mut sim, "after").unwrap();
    converge(&mut sim);
}

#[test]
fn a_partitioned_leader_is_replaced_and_learns_what_the_majority_placed() {
    let mut sim = Sim::new(5, 3);
    converge(&mut sim);
    create_by_rule(&mut sim, "before").unwrap();
    let old = sim.leader().unwrap();
    sim.isolate(old);
    // Proposed to the cut-off leader: never committed (its term is left behind).
    let meta = sim.leader_meta().unwrap();
    let owner = choose_owner(meta, &BTreeMap::new(), None).unwrap();
    let stranded = MetaCommand::CreateQueue {
        name: q("stranded"),
        settings: pb::QueueConfig::default(),
        owner,
    };
    let position = sim.propose(&stranded).unwrap();
    assert!(sim.run_until(ELECTION_STEPS * 2, |s| s.leader().is_some_and(|l| l != old)));
    create_by_rule(&mut sim, "majority").unwrap();
    sim.heal();
    converge(&mut sim);
    // The new leader's log overwrote the cut-off proposal: another entry is committed at its
    // index, and no node applied it.
    assert!(
        sim.is_lost(position) && !sim.is_committed(position),
        "the cut-off leader's proposal at {position:?} committed"
    );
    assert!(sim.nodes[&old].meta.queue(&q("majority")).is_some());
    for (id, node) in &sim.nodes {
        assert!(
            node.meta.queue(&q("stranded")).is_none(),
            "node {id:?} applied the cut-off leader's proposal"
        );
    }
}

#[test]
fn the_whole_cluster_restarts_with_its_metadata() {
    let mut sim = Sim::new(4, 3);
    sim.compact_every_entries = 5;
    sim.faults.sync_delay_steps_max = 4;
    converge(&mut sim);
    for i in 0..12 {
        create_by_rule(&mut sim, &format!("q{i}")).unwrap();
    }
    converge(&mut sim);
    let before = sim.leader_meta().unwrap().placement_snapshot().owners;
    for node in sim.node_ids() {
        sim.crash(node);
    }
    for node in sim.node_ids() {
        sim.restart(node);
    }
    converge(&mut sim);
    assert_eq!(
        sim.leader_meta().unwrap().placement_snapshot().owners,
        before
    );
    create_by_rule(&mut sim, "after").unwrap();
}

// ---- random commands and faults over many seeds ----

const SEEDS: u64 = 32;
const FAULT_STEPS: u64 = 3000;
/// Node names the random commands use (more than ever join, so some are unknown).
const NAMES_MAX: u64 = 9;
const QUEUE_NAMES: [&str; 6] = ["a", "b", "c", "d", "e", "f"];

#[test]
fn random_commands_and_faults_on_three_voters() {
    run_seeds(3, 2000);
}

#[test]
fn random_commands_and_faults_on_five_voters() {
    run_seeds(5, 3000);
}

fn run_seeds(voters: u64, first_seed: u64) {
    let seeds: Vec<u64> = match std::env::var("META_SIM_SEED") {
        Ok(seed) => vec![seed.parse().expect("META_SIM_SEED is a number")],
        Err(_) => {
            let count =
                std::env::var("META_SIM_SEEDS").map_or(SEEDS, |n| n.parse().expect("count"));
            (first_seed..first_seed + count).collect()
        }
    };
    let mut total = sim::Stats::default();
    for seed in &seeds {
        let seed = *seed;
        match std::panic::catch_unwind(|| run_random(seed, voters)) {
            Ok(stats) => {
                total.accepted += stats.accepted;
                total.refused += stats.refused;
                total.conf_changes += stats.conf_changes;
                total.snapshots_installed += stats.snapshots_installed;
                total.restarts += stats.restarts;
            }
            Err(panic) => {
                eprintln!("meta_sim failed with {voters} voters; replay with META_SIM_SEED={seed}");
                std::panic::resume_unwind(panic);
            }
        }
    }
    // The seeds together exercised every kind of event (one seed alone may not).
    if seeds.len() > 1 {
        assert!(
            total.refused > 0
                && total.conf_changes > 0
                && total.snapshots_installed > 0
                && total.restarts > 0,
            "{total:?}"
        );
    }
}

fn run_random(seed: u64, voters: u64) -> sim::Stats {
    let mut sim = Sim::new(seed, voters);
    sim.faults = Faults::lossy();
    sim.compact_every_entries = 10;
    for _ in 0..FAULT_STEPS {
        random_fault(&mut sim);
        if sim.rng.random_ratio(1, 4) {
            if let Some(command) = random_command(&mut sim) {
                sim.propose(&command);
            }
        }
        sim.step();
    }
    // Liveness: healed, every node that was not removed up again, the group converges and
    // still takes commands.
    sim.heal();
    sim.faults = Faults::none();
    for node in sim.live_ids() {
        if !sim.is_up(node) {
            sim.restart(node);
        }
    }
    converge(&mut sim);
    let marker = MetaCommand::DeleteQueue {
        name: q("never-created"),
    };
    let refused = propose_and_wait(&mut sim, &marker);
    assert!(matches!(refused, Err(MetaError::QueueNotFound { .. })));
    converge(&mut sim);
    let stats = sim.stats;
    // Shown with --nocapture: what the run exercised.
    eprintln!(
        "seed {seed}, {voters} voters: {stats:?}, {} nodes ({} removed), refusals {:?}",
        sim.nodes.len(),
        sim.nodes.values().filter(|n| n.retired).count(),
        sim.refusals()
    );
    assert!(
        stats.accepted > 0,
        "seed {seed}: nothing accepted: {stats:?}"
    );
    stats
}

fn random_command(sim: &mut Sim) -> Option<MetaCommand> {
    let meta = sim.leader_meta()?.clone();
    let rng = &mut sim.rng;
    let name = q(QUEUE_NAMES[rng.random_range(0..QUEUE_NAMES.len())]);
    let node = node_name(rng.random_range(1..=NAMES_MAX));
    Some(match rng.random_range(0..100) {
        0..=49 => {
            let pinned = rng.random_ratio(1, 5).then_some(&node);
            let loads: BTreeMap<NodeId, u64> = meta
                .nodes()
                .keys()
                .map(|n| (n.clone(), rng.random_range(0..1000)))
                .collect();
            let settings = random_settings(rng);
            // An unknown or removed pinned node is proposed anyway: apply refuses it.
            let owner =
                choose_queue_owner(&meta, &name, &settings, &loads, pinned).unwrap_or(node.clone());
            MetaCommand::CreateQueue {
                name,
                settings,
                owner,
            }
        }
        50..=59 => MetaCommand::UpdateQueue {
            name,
            settings: random_settings(rng),
            expected: None,
        },
        60..=74 => MetaCommand::DeleteQueue { name },
        75..=84 => {
            let id = rng.random_range(1..=NAMES_MAX);
            add(id, rng.random_ratio(3, 4))
        }
        85..=92 => MetaCommand::PromoteNode { id: node },
        _ => MetaCommand::RemoveNode { id: node },
    })
}

fn random_settings(rng: &mut impl Rng) -> pb::QueueConfig {
    // A shared dead-letter queue sometimes: a queue on another owner is refused with it.
    let dead_letter = rng.random_ratio(1, 8).then(|| pb::DeadLetterTarget {
        target: Some(pb::dead_letter_target::Target::Queue(
            ["shared-dlq", "a"][rng.random_range(0..2)].to_owned(),
        )),
    });
    pb::QueueConfig {
        default_lease_ms: Some(rng.random_range(1_000..60_000)),
        dead_letter,
        ..Default::default()
    }
}

fn random_fault(sim: &mut Sim) {
    let all = sim.live_ids();
    let pick = |sim: &mut Sim| all[sim.rng.random_range(0..all.len())];
    let down = all.iter().filter(|n| !sim.is_up(**n)).count();
    match sim.rng.random_range(0..1000) {
        0..=2 if down < 2 => {
            let node = pick(sim);
            if sim.is_up(node) {
                sim.crash(node);
            }
        }
        3..=12 => {
            let node = pick(sim);
            if !sim.is_up(node) {
                sim.restart(node);
            }
        }
        13..=15 => {
            let node = pick(sim);
            sim.isolate(node);
        }
        16..=19 => {
            let (a, b) = (pick(sim), pick(sim));
            if a != b {
                sim.block(a, b);
            }
        }
        20..=27 => sim.heal(),
        _ => {}
    }
}
