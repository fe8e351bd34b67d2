//! Random metadata commands and faults (lost, delayed and reordered packets, partitions one
//! and both ways, kills, deaths in a synced write, restarts, nodes joining and leaving) on
//! three and on five voters, over many seeds, under the checks of `checks.rs`; then a liveness
//! phase: healed and restarted, the group converges and still takes commands.
//!
//! A failing seed prints itself; `META_SIM_SEED=<seed> cargo nextest run --workspace -E
//! 'test(raft::sim::random)'` replays it exactly, `META_SIM_SEEDS=<count>` runs more.

use std::collections::{BTreeMap, BTreeSet};

use ferry_cluster::meta::{
    choose_queue_owner, choose_shard, MetaCommand, MetaError, RaftId, ShardChoice,
};
use ferry_kernel::{NodeId, QueueName, ShardId};
use ferry_multiraft::sim::Faults;
use ferry_proto::pb;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::checks::{lock, Stats};
use super::tests::add;
use super::{node_name, Cluster};

const SEEDS: u64 = 32;
const FAULT_STEPS: u64 = 3000;
/// Node names the random commands use (more than ever join, so some are unknown).
const NAMES_MAX: u64 = 9;
/// Some dead-letter queues too: deleting a queue and then its dead-letter queue empties its
/// shard, which then goes.
const QUEUE_NAMES: [&str; 9] = ["a", "b", "c", "d", "e", "f", "a.DLQ", "b.DLQ", "c.DLQ"];
/// The drivers compact their logs this often, so that lagging and new nodes get snapshots.
const COMPACT_AFTER_ENTRIES: u64 = 10;

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
    let mut total = Stats::default();
    for &seed in &seeds {
        match std::panic::catch_unwind(|| run_random(seed, voters)) {
            Ok(stats) => total.add(&stats),
            Err(panic) => {
                eprintln!("meta sim failed with {voters} voters; replay with META_SIM_SEED={seed}");
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
                && total.restarts > 0
                && total.shards > 0,
            "{total:?}"
        );
    }
}

fn run_random(seed: u64, voters: u64) -> Stats {
    let mut cluster = Cluster::new(seed, voters, COMPACT_AFTER_ENTRIES);
    cluster.set_faults(Faults::lossy());
    // The test's own choices come from a generator of their own: the simulator's network
    // draws from the seed too, and both stay reproducible.
    let mut rng = StdRng::seed_from_u64(seed ^ 0x5eed);
    for _ in 0..FAULT_STEPS {
        random_fault(&mut cluster, &mut rng);
        if rng.random_ratio(1, 4) {
            if let Some(command) = random_command(&cluster, &mut rng) {
                cluster.propose(&command);
            }
        }
        cluster.step();
    }
    // Liveness: healed, every node that was not removed up again, the group converges and
    // still takes commands.
    cluster.heal();
    cluster.set_faults(Faults::none());
    for node in cluster.live_ids() {
        if cluster.is_failing(node) {
            if cluster.is_up(node) {
                cluster.crash(node);
            }
            cluster.restart(node);
        }
    }
    cluster.converge();
    let marker = MetaCommand::DeleteQueue {
        name: QueueName::new("never-created").unwrap(),
    };
    let refused = cluster.propose_and_wait(&marker);
    assert!(matches!(refused, Err(MetaError::QueueNotFound { .. })));
    cluster.converge();
    // Every node runs exactly the shard groups the metadata gives it (those of shards gone
    // while it was down or cut off removed, those made meanwhile started).
    for peer in cluster.up_ids() {
        let view = cluster.view(peer).unwrap();
        let Some((me, _)) = view.meta.node_by_raft_id(RaftId(peer.0)) else {
            continue;
        };
        let expected: BTreeSet<ShardId> = view
            .meta
            .shards()
            .iter()
            .filter(|(_, d)| d.replicas.contains(me))
            .map(|(id, _)| *id)
            .collect();
        let running: BTreeSet<ShardId> = view.shards.keys().copied().collect();
        assert_eq!(running, expected, "seed {seed}: {me}'s shard groups");
    }
    lock(cluster.checks()).stats.shards = cluster
        .leader_meta()
        .map_or(0, |m| m.next_shard().0.saturating_sub(1));
    let checks = lock(cluster.checks());
    let stats = checks.stats;
    // Shown with --nocapture: what the run exercised.
    eprintln!(
        "seed {seed}, {voters} voters: {stats:?}, {} nodes ({} retired), refusals {:?}",
        cluster.all_ids().len(),
        cluster.all_ids().len() - cluster.live_ids().len(),
        checks.refusals()
    );
    assert!(
        stats.accepted > 0,
        "seed {seed}: nothing accepted: {stats:?}"
    );
    stats
}

fn random_command(cluster: &Cluster, rng: &mut StdRng) -> Option<MetaCommand> {
    let meta = cluster.leader_meta()?;
    let name = QueueName::new(QUEUE_NAMES[rng.random_range(0..QUEUE_NAMES.len())]).unwrap();
    let node = node_name(rng.random_range(1..=NAMES_MAX));
    Some(match rng.random_range(0..100) {
        0..=11 => {
            // A replicated queue: its shard starts on its replicas (the driver follows the
            // metadata), and goes with its last queue. A choice the rule cannot make (too few
            // nodes) is proposed anyway, on random nodes: apply refuses it.
            let settings = random_settings(rng);
            let replication = [3, 3, 5][rng.random_range(0..3)];
            let dedicated = rng.random_ratio(1, 4);
            let shard = choose_shard(
                &meta,
                &name,
                &settings,
                replication,
                dedicated,
                &BTreeSet::new(),
            )
            .unwrap_or_else(|_| ShardChoice::New {
                replicas: (0..replication)
                    .map(|_| node_name(rng.random_range(1..=NAMES_MAX)))
                    .collect(),
                dedicated,
            });
            MetaCommand::CreateReplicatedQueue {
                name,
                settings,
                shard,
            }
        }
        12..=49 => {
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

fn random_fault(cluster: &mut Cluster, rng: &mut StdRng) {
    let all = cluster.live_ids();
    let pick = |rng: &mut StdRng| all[rng.random_range(0..all.len())];
    let failing = all.iter().filter(|n| cluster.is_failing(**n)).count();
    match rng.random_range(0..1000) {
        0..=2 if failing < 2 => {
            let node = pick(rng);
            if !cluster.is_failing(node) {
                // Killed between rounds, or in the middle of its next synced write.
                if rng.random_ratio(1, 2) {
                    cluster.crash(node);
                } else {
                    cluster.crash_in_next_write(node);
                }
            }
        }
        3..=12 => {
            let node = pick(rng);
            if !cluster.is_up(node) {
                cluster.restart(node);
            }
        }
        13..=15 => {
            let node = pick(rng);
            cluster.isolate(node);
        }
        16..=19 => {
            let (a, b) = (pick(rng), pick(rng));
            if a != b {
                cluster.block(a, b);
            }
        }
        20..=27 => cluster.heal(),
        _ => {}
    }
}
