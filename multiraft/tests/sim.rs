//! Deterministic simulations of several engines: elections, replication, membership changes,
//! partitions, crashes that lose unsynced writes, many groups, and random faults over many
//! seeds. The simulator checks its invariants after every step (see `support/sim.rs`):
//! a committed (group, index) never changes, at most one leader per group and term, and each
//! node's applied sequence is a prefix of the committed log.
//!
//! The bugs the random runs found are scripted scenarios in `sim_regressions.rs`, which do
//! not hang on a seed's luck.
//!
//! A failing random seed prints itself; `MULTIRAFT_SEED=<seed> cargo test --release -p
//! ferry-multiraft --test sim random_faults` replays it exactly, and `MULTIRAFT_SEEDS=<count>`
//! runs more seeds than the default.

#![allow(clippy::unwrap_used)]

#[path = "support/sim.rs"]
mod sim;

use ferry_multiraft::{ConfChange, GroupId, NodeId, Role};
use rand::Rng;
use sim::scenario::{nodes, ELECTION_STEPS};
use sim::script::{Applied, Event};
use sim::{Faults, Sim, TICK_STEPS};

const G0: GroupId = GroupId(0);

#[test]
fn a_leader_is_elected_and_known_to_every_node() {
    let mut sim = Sim::three_nodes(1, &[G0]);
    assert!(sim.run_until(ELECTION_STEPS, |s| s.converged(G0)));
    let leader = sim.leader(G0).unwrap();
    for node in sim.node_ids() {
        let status = sim.engine(node).status(G0).unwrap();
        assert_eq!(status.leader, Some(leader));
        let expected = if node == leader {
            Role::Leader
        } else {
            Role::Follower
        };
        assert_eq!(status.role, expected);
    }
}

#[test]
fn proposals_are_replicated_and_applied_in_order_on_every_node() {
    let mut sim = Sim::three_nodes(2, &[G0]);
    sim.faults = Faults::lossy();
    for i in 0..30u32 {
        sim.propose_and_wait(G0, format!("entry {i}").as_bytes());
    }
    let leader = sim.leader(G0).unwrap();
    let commit = sim.engine(leader).status(G0).unwrap().commit_index;
    assert!(
        commit >= 32,
        "30 entries, the leader's no-op and the bootstrap: {commit}"
    );
    for node in sim.node_ids() {
        assert_eq!(sim.applied_index(node, G0), Some(commit));
    }
}

#[test]
fn membership_changes_add_a_learner_promote_it_add_a_voter_and_remove_a_node() {
    let mut sim = Sim::new(3, 5, &[G0], &nodes(&[1, 2, 3]));
    sim.compact_every_entries = 8;
    for i in 0..20u32 {
        sim.propose_and_wait(G0, format!("before {i}").as_bytes());
    }
    // Node 4 joins as a learner: it fills from a snapshot (the log is compacted), then follows.
    sim.create_group(NodeId(4), G0);
    sim.conf_change_and_wait(G0, ConfChange::AddLearner(NodeId(4)));
    sim.propose_and_wait(G0, b"learner catches up");
    assert!(
        sim.wire.snapshots >= 1,
        "the learner's snapshot travels apart from the batches"
    );
    let status = sim.engine(NodeId(4)).status(G0).unwrap();
    assert_eq!(status.learners, nodes(&[4]));
    assert_eq!(status.role, Role::Follower);

    sim.conf_change_and_wait(G0, ConfChange::PromoteLearner(NodeId(4)));
    sim.create_group(NodeId(5), G0);
    sim.conf_change_and_wait(G0, ConfChange::AddVoter(NodeId(5)));
    sim.propose_and_wait(G0, b"five voters");
    let status = sim.engine(NodeId(5)).status(G0).unwrap();
    assert_eq!(status.voters, nodes(&[1, 2, 3, 4, 5]));
    assert!(status.learners.is_empty());

    // Remove a follower, then the leader itself.
    let leader = sim.leader(G0).unwrap();
    let follower = sim.node_ids().into_iter().find(|n| *n != leader).unwrap();
    sim.conf_change_and_wait(G0, ConfChange::Remove(follower));
    sim.engine_mut(follower).remove_group(G0).unwrap();
    sim.conf_change_and_wait(G0, ConfChange::Remove(leader));
    // The removed leader steps down as it applies its removal; the rest elect a leader.
    sim.run_until(ELECTION_STEPS * 2, |s| {
        s.leader(G0).is_some_and(|l| l != leader)
    });
    sim.engine_mut(leader).remove_group(G0).unwrap();
    sim.propose_and_wait(G0, b"three voters again");
    let new_leader = sim.leader(G0).unwrap();
    let status = sim.engine(new_leader).status(G0).unwrap();
    assert_eq!(status.voters.len(), 3);
    assert!(!status.voters.contains(&leader) && !status.voters.contains(&follower));
}

#[test]
fn a_partitioned_minority_makes_no_progress_and_catches_up_after_heal() {
    let mut sim = Sim::three_nodes(4, &[G0]);
    sim.propose_and_wait(G0, b"first");
    let leader = sim.leader(G0).unwrap();
    let minority = sim.node_ids().into_iter().find(|n| *n != leader).unwrap();
    let before = sim.engine(minority).status(G0).unwrap();
    sim.isolate(minority);
    for i in 0..20u32 {
        sim.propose_and_wait_without(G0, minority, format!("while cut off {i}").as_bytes());
    }
    sim.run(ELECTION_STEPS * 3);
    let during = sim.engine(minority).status(G0).unwrap();
    assert_eq!(
        during.applied_index, before.applied_index,
        "no progress alone"
    );
    assert_ne!(during.role, Role::Leader);
    // pre_vote: campaigning alone never raises the term, so the minority cannot disrupt.
    assert_eq!(during.term, before.term);

    sim.heal();
    assert!(sim.run_until(ELECTION_STEPS * 2, |s| s.converged(G0)));
    assert_eq!(
        sim.leader(G0),
        Some(leader),
        "the healed node did not disrupt the leader"
    );
    let status = sim.engine(leader).status(G0).unwrap();
    assert_eq!(sim.applied_index(minority, G0), Some(status.commit_index));
}

#[test]
fn a_partitioned_leader_steps_down_and_the_majority_elects_a_new_one() {
    let mut sim = Sim::three_nodes(5, &[G0]);
    sim.propose_and_wait(G0, b"first");
    let old = sim.leader(G0).unwrap();
    let old_term = sim.engine(old).status(G0).unwrap().term;
    sim.isolate(old);
    // check_quorum: without hearing from a majority for an election timeout, it steps down.
    assert!(
        sim.run_until(ELECTION_STEPS, |s| s.engine(old).status(G0).unwrap().role
            != Role::Leader)
    );
    assert!(sim.run_until(ELECTION_STEPS, |s| s.leader(G0).is_some_and(|l| l != old)));
    let new = sim.leader(G0).unwrap();
    assert!(sim.engine(new).status(G0).unwrap().term > old_term);
    sim.propose_and_wait_without(G0, old, b"on the majority side");

    sim.heal();
    assert!(sim.run_until(ELECTION_STEPS * 2, |s| s.converged(G0)));
    let status = sim.engine(old).status(G0).unwrap();
    assert_eq!(status.role, Role::Follower);
    assert_eq!(status.leader, sim.leader(G0));
}

#[test]
fn a_leader_that_cannot_send_to_its_followers_is_replaced() {
    let mut sim = Sim::three_nodes(6, &[G0]);
    sim.propose_and_wait(G0, b"first");
    let old = sim.leader(G0).unwrap();
    for node in sim.node_ids() {
        if node != old {
            sim.block(old, node);
        }
    }
    assert!(sim.run_until(ELECTION_STEPS * 2, |s| s
        .leader(G0)
        .is_some_and(|l| l != old)));
    sim.propose_and_wait_without(G0, old, b"after the one-way cut");
    sim.heal();
    assert!(sim.run_until(ELECTION_STEPS * 2, |s| s.converged(G0)));
}

#[test]
fn a_crash_loses_the_unsynced_tail_and_the_node_recovers() {
    let mut sim = Sim::three_nodes(7, &[G0]);
    sim.propose_and_wait(G0, b"durable");
    // Slow disks: writes stay unsynced for a while.
    sim.faults.sync_delay_steps_max = 30;
    let victim = sim.leader(G0).unwrap();
    for i in 0..5u32 {
        sim.propose(G0, format!("maybe lost {i}").as_bytes());
    }
    assert!(sim.run_until(20, |s| s.unsynced_jobs(victim) > 0));
    sim.crash(victim);
    sim.faults.sync_delay_steps_max = 0;
    sim.run(ELECTION_STEPS);
    sim.restart(victim);
    assert!(sim.run_until(ELECTION_STEPS * 2, |s| s.converged(G0)));
    sim.propose_and_wait(G0, b"after the restart");
}

#[test]
fn the_whole_cluster_restarts_with_every_committed_entry() {
    let mut sim = Sim::three_nodes(8, &[G0, GroupId(1)]);
    sim.faults.sync_delay_steps_max = 4;
    for i in 0..10u32 {
        sim.propose_and_wait(G0, format!("a{i}").as_bytes());
        sim.propose_and_wait(GroupId(1), format!("b{i}").as_bytes());
    }
    let committed = sim.committed_count();
    for node in sim.node_ids() {
        sim.crash(node);
    }
    for node in sim.node_ids() {
        sim.restart(node);
    }
    assert!(sim.run_until(ELECTION_STEPS * 3, |s| s.all_converged(&[G0, GroupId(1)])));
    sim.propose_and_wait(G0, b"after");
    assert!(sim.committed_count() > committed);
}

#[test]
fn sixty_four_groups_on_three_nodes_share_one_batch_per_peer_per_round() {
    let groups: Vec<GroupId> = (0..64).map(GroupId).collect();
    let mut sim = Sim::three_nodes(9, &groups);
    assert!(sim.run_until(ELECTION_STEPS * 2, |s| s.all_converged(&groups)));
    for &g in &groups {
        sim.propose_and_wait(g, b"x");
    }
    // Idle now: count what heartbeats cost.
    let before = sim.wire;
    sim.run(TICK_STEPS * 50);
    let batches = sim.wire.batches - before.batches;
    let messages = sim.wire.messages - before.messages;
    // 64 groups heartbeat every 2 ticks and every follower answers; batched, that is a few
    // dozen messages per batch, not one batch per message.
    assert!(
        messages >= batches * 10,
        "{messages} messages in {batches} batches"
    );
    // At most one batch per peer per round (asserted in the simulator) and, idle, at most one
    // round with messages per node per tick plus the answers to what it received.
    let ticks = 50;
    assert!(
        batches <= ticks * 3 * 2 * 2,
        "{batches} batches in {ticks} ticks"
    );
    assert!(sim.all_converged(&groups));
}

// ---- random faults over many seeds ----

const SEEDS: u64 = 48;
const FAULT_STEPS: u64 = 2000;

#[test]
fn random_faults() {
    let seeds: Vec<u64> = match std::env::var("MULTIRAFT_SEED") {
        Ok(seed) => vec![seed.parse().expect("MULTIRAFT_SEED is a number")],
        // MULTIRAFT_SEEDS=<count> runs more seeds (a longer soak).
        Err(_) => {
            let count =
                std::env::var("MULTIRAFT_SEEDS").map_or(SEEDS, |n| n.parse().expect("count"));
            (1000..1000 + count).collect()
        }
    };
    for seed in seeds {
        let result = std::panic::catch_unwind(|| run_random(seed, FAULT_STEPS, false));
        if let Err(panic) = result {
            eprintln!("random_faults failed; replay with MULTIRAFT_SEED={seed}");
            std::panic::resume_unwind(panic);
        }
    }
}

/// One seed gives the same run, event for event: every message sent and delivered, role
/// change, configuration change, snapshot and sync at the same step; another seed another.
#[test]
fn one_seed_gives_the_same_trace_twice_and_another_seed_another() {
    let steps = FAULT_STEPS / 4;
    let first = run_random(1003, steps, true);
    let again = run_random(1003, steps, true);
    let (a, b) = (first.trace(), again.trace());
    if let Some(at) = (0..a.len().min(b.len())).find(|i| a[*i] != b[*i]) {
        panic!("the runs part at event {at}: {:?} and {:?}", a[at], b[at]);
    }
    assert_eq!(a.len(), b.len(), "one run goes on");
    let count = |what: fn(&Event) -> bool| a.iter().filter(|t| what(&t.event)).count();
    let delivered = count(|e| matches!(e, Event::Delivered(_)));
    let roles = count(|e| matches!(e, Event::Role { .. }));
    let changes = count(|e| {
        matches!(
            e,
            Event::Applied {
                what: Applied::ConfChange(_),
                ..
            }
        )
    });
    let snapshots = count(|e| {
        matches!(
            e,
            Event::Applied {
                what: Applied::Snapshot,
                ..
            }
        )
    });
    assert!(
        delivered > 1000 && roles > 0 && changes > 0 && snapshots > 0,
        "a run with faults, elections, membership changes and snapshots: {delivered} \
         delivered, {roles} role changes, {changes} conf changes, {snapshots} snapshots"
    );
    assert_ne!(
        run_random(1004, steps, true).trace(),
        a,
        "another seed, another run"
    );
}

/// Five voters in three groups, a sixth node that group 0 adds as a learner, promotes, and
/// then one voter removed, all under random faults for `fault_steps`; then a liveness phase.
fn run_random(seed: u64, fault_steps: u64, trace: bool) -> Sim {
    let groups = [G0, GroupId(1), GroupId(2)];
    let mut sim = Sim::new(seed, 6, &groups, &nodes(&[1, 2, 3, 4, 5]));
    if trace {
        sim.record_trace();
    }
    sim.create_group(NodeId(6), G0);
    sim.faults = Faults::lossy();
    sim.compact_every_entries = 10;
    let all = sim.node_ids();
    let churn = [
        (fault_steps / 5, ConfChange::AddLearner(NodeId(6))),
        (fault_steps * 2 / 5, ConfChange::PromoteLearner(NodeId(6))),
        (
            fault_steps * 3 / 5,
            ConfChange::Remove(NodeId(1 + seed % 5)),
        ),
    ];
    for step in 0..fault_steps {
        for (at, change) in churn {
            // Proposed once; under faults it may be dropped, which is fine.
            if step == at {
                sim.propose_conf_change(G0, change);
            }
        }
        random_fault(&mut sim, &all);
        if sim.rng.random_ratio(1, 3) {
            let g = groups[sim.rng.random_range(0..groups.len())];
            let data = format!("s{}", sim.now);
            sim.propose(g, data.as_bytes());
        }
        sim.step();
    }
    // Liveness: with the network healed and every node up, every group converges and commits.
    sim.heal();
    sim.faults = Faults::none();
    for node in all {
        if !sim.is_up(node) {
            sim.restart(node);
        }
    }
    for g in groups {
        sim.propose_and_wait(g, b"after the storm");
    }
    assert!(sim.all_converged(&groups), "seed {seed}: no convergence");
    sim
}

fn random_fault(sim: &mut Sim, all: &[NodeId]) {
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
