//! Bugs the random simulations found, each as a scripted scenario: explicit holds, drops,
//! releases, cuts, stalled disks and proposals drive the engines into the bug's precondition,
//! the test asserts that the precondition happened (so a change to the engine or to the
//! simulator cannot quietly make the scenario miss it), then asserts the right outcome. The
//! simulator's invariants hold after every step (see `support/sim.rs`).

#![allow(clippy::unwrap_used)]

#[path = "support/sim.rs"]
mod sim;

use ferry_multiraft::{ConfChange, EngineConfig, GroupId, NodeId, Role};
use raft::eraftpb::MessageType;
use sim::scenario::ELECTION_STEPS;
use sim::script::{Applied, Event, Msg};
use sim::Sim;

const G0: GroupId = GroupId(0);

/// The two nodes of a three-node group other than `leader`.
fn followers(sim: &Sim, leader: NodeId) -> (NodeId, NodeId) {
    let others: Vec<NodeId> = sim
        .node_ids()
        .into_iter()
        .filter(|n| *n != leader)
        .collect();
    (others[0], others[1])
}

/// The messages delivered at `step`, in delivery order.
fn delivered_at(sim: &Sim, step: u64) -> Vec<Msg> {
    sim.trace()
        .iter()
        .filter(|t| t.step == step)
        .filter_map(|t| match t.event {
            Event::Delivered(msg) => Some(msg),
            _ => None,
        })
        .collect()
}

/// Steps until a held message matches; panics if none does within an election's worth.
fn wait_held(sim: &mut Sim, what: &str, matches: impl Fn(&Msg) -> bool) {
    assert!(
        sim.run_until(ELECTION_STEPS, |s| s.held().iter().any(&matches)),
        "no {what} held: {}",
        sim.describe(G0)
    );
}

/// raft-rs 0.7's batch_append put entry 14 into a pending "prev 14" append; the follower acked
/// 15 without having it and later got commit 15 with a log ending at 14 (seed 1001). Off now.
///
/// The precondition, scripted: the leader has an empty append to follower F pending (prev P,
/// its last index) when F's stale rejection of prev P makes it send F entry P again, in the
/// same round. batch_append merged the two into "prev P, entries [P]", which F (it has P) acked
/// as P + 1.
#[test]
fn regression_a_follower_never_acks_an_entry_it_lacks() {
    let mut sim = Sim::three_nodes(11, &[G0]);
    sim.record_trace();
    sim.propose_and_wait(G0, b"first");
    let leader = sim.leader(G0).unwrap();
    let (f, _) = followers(&sim, leader);
    let p = hold_a_stale_rejection(&mut sim, leader, f);
    deliver_heartbeat_response_then_rejection(&mut sim, leader, f, p);

    // Precondition: in that round the leader, its empty append at prev P to F pending, sent F
    // entry P again: the pair batch_append merged into one append.
    sim.step();
    let at_f: Vec<Msg> = delivered_at(&sim, sim.now)
        .into_iter()
        .filter(|m| m.from == leader && m.to == f && m.kind == MessageType::MsgAppend)
        .collect();
    assert!(
        at_f.first().is_some_and(|m| m.index == p)
            && at_f.iter().any(|m| m.entries == Some((p, p))),
        "the append at prev P, then P again, in one batch: {at_f:?}"
    );

    // Outcome: each append carries the entries that follow its prev index, ...
    for m in &at_f {
        assert!(
            m.entries.is_none_or(|(first, _)| first == m.index + 1),
            "an append whose entries do not follow its prev index: {m:?}"
        );
    }
    // ... F answers them with an ack of P, not past it (the simulator checks every ack of
    // every node), and the group goes on, every node applying the same entries.
    let answered = sim.now;
    let first_ack = |s: &Sim| {
        s.trace().iter().find_map(|t| match t.event {
            Event::Sent(m) if t.step >= answered && m.from == f && m.is_ack() => Some(m),
            _ => None,
        })
    };
    assert!(sim.run_until(ELECTION_STEPS, |s| first_ack(s).is_some()));
    assert_eq!(first_ack(&sim).unwrap().index, p, "F acks P, which it has");
    for i in 0..5u32 {
        sim.propose_and_wait(G0, format!("after {i}").as_bytes());
    }
}

/// Commits a new entry P without follower F, then has F reject an empty append at prev P
/// (it lacks P) and only then receive P. Returns P with F's rejection held, F's ack of P
/// held, and F's appends still held.
fn hold_a_stale_rejection(sim: &mut Sim, leader: NodeId, f: NodeId) -> u64 {
    let to_f = move |m: &Msg| m.from == leader && m.to == f && m.kind == MessageType::MsgAppend;
    let from_f = move |m: &Msg| m.from == f && m.to == leader;
    // F's appends wait. F's next heartbeat response makes the leader (no ack of P from F)
    // send F an empty append at prev P: it waits too.
    sim.hold(to_f);
    let p = sim.propose(G0, b"second").unwrap().index;
    wait_held(sim, "empty append at P", move |m| {
        to_f(m) && m.is_empty_append() && m.index == p
    });
    // F sees the empty append first and rejects it; then P's append. Both answers wait.
    sim.hold(move |m| from_f(m) && m.kind == MessageType::MsgAppendResponse);
    sim.release_first(move |m| to_f(m) && m.is_empty_append() && m.index == p);
    wait_held(sim, "F's rejection", move |m| from_f(m) && m.reject);
    sim.release_first(move |m| to_f(m) && m.entries == Some((p, p)));
    wait_held(sim, "F's ack of P", move |m| from_f(m) && m.is_ack());
    assert_eq!(sim.engine(f).status(G0).unwrap().last_index, p, "F has P");
    p
}

/// Delivers F's next heartbeat response, then F's held rejection of prev P, to the leader in
/// one step; F's ack of P is lost, so the leader still counts F at P - 1 (asserted).
fn deliver_heartbeat_response_then_rejection(sim: &mut Sim, leader: NodeId, f: NodeId, p: u64) {
    let from_f = move |m: &Msg| m.from == f && m.to == leader;
    let heartbeat_response =
        move |m: &Msg| from_f(m) && m.kind == MessageType::MsgHeartbeatResponse;
    sim.hold(heartbeat_response);
    wait_held(sim, "F's heartbeat response", heartbeat_response);
    sim.lift_all();
    sim.discard(move |m| m.to == f || (from_f(m) && m.is_ack()));
    sim.release_first(heartbeat_response);
    sim.release_first(move |m| from_f(m) && m.reject);
    assert!(sim.held().is_empty(), "{:?}", sim.held());
    sim.step();
    let acked_p = sim.trace().iter().any(
        |t| matches!(t.event, Event::Delivered(m) if from_f(&m) && m.is_ack() && m.index >= p),
    );
    assert!(!acked_p, "the leader never heard F ack P");
    let at_leader: Vec<(MessageType, bool, u64)> = delivered_at(sim, sim.now)
        .into_iter()
        .filter(|m| from_f(m))
        .map(|m| (m.kind, m.reject, m.index))
        .collect();
    assert!(
        matches!(
            at_leader[..],
            [
                (MessageType::MsgHeartbeatResponse, false, _),
                (MessageType::MsgAppendResponse, true, index)
            ] if index == p
        ),
        "the leader gets F's heartbeat response, then its rejection of prev P: {at_leader:?}"
    );
}

/// A leader applied its own removal, kept leading and raft-rs panicked at its next commit
/// (its own progress was gone; seed 1010). A removed leader now steps down.
///
/// The precondition, scripted: the leader proposes its removal at R and an entry at R + 1,
/// whose appends wait; it applies R while it leads. Then the followers get R + 1 and ack it:
/// a leader that kept leading would commit R + 1 without its own progress.
#[test]
fn regression_a_removed_leader_steps_down() {
    let mut sim = Sim::three_nodes(12, &[G0]);
    sim.record_trace();
    sim.propose_and_wait(G0, b"first");
    let leader = sim.leader(G0).unwrap();
    let term = sim.engine(leader).status(G0).unwrap().term;
    let removal = sim
        .propose_conf_change(G0, ConfChange::Remove(leader))
        .unwrap();
    sim.hold(move |m| m.entries.is_some_and(|(_, last)| last > removal.index));
    let next = sim.propose(G0, b"after R").unwrap();
    assert_eq!(next.index, removal.index + 1);
    assert!(sim.run_until(ELECTION_STEPS, |s| {
        s.applied_index(leader, G0) >= Some(removal.index)
    }));

    // Precondition: the leader applied its own removal while it led (the last role its rounds
    // reported before that apply), with R + 1 not committed.
    let applied_at = position_of(
        &sim,
        &Event::Applied {
            node: leader,
            group: G0,
            position: removal,
            what: Applied::ConfChange(ConfChange::Remove(leader)),
        },
    );
    assert_eq!(
        role_before(&sim, leader, applied_at),
        Some((Role::Leader, term)),
        "it led as it applied its removal"
    );
    assert_eq!(
        sim.engine(leader).status(G0).unwrap().commit_index,
        removal.index
    );

    // Outcome: it steps down in the round that applies its removal, in the same term, and
    // takes no proposal; the followers' acks of R + 1 commit nothing on it (they made raft-rs
    // panic), ...
    let status = sim.engine(leader).status(G0).unwrap();
    assert_eq!(
        (status.role, status.term),
        (Role::Follower, term),
        "the removed leader steps down"
    );
    assert!(sim.engine_mut(leader).propose(G0, b"x".to_vec()).is_err());
    sim.lift_all();
    sim.release(|_| true);
    sim.run(ELECTION_STEPS);
    let acked = sim.trace()[applied_at..].iter().any(|t| {
        matches!(t.event, Event::Delivered(m)
            if m.to == leader && m.is_ack() && m.index > removal.index && m.term == term)
    });
    assert!(
        acked,
        "a follower acked R + 1 to the removed leader in its term"
    );
    // ... the other two elect a leader among themselves and commit, and the removed node never
    // leads again.
    sim.propose_and_wait(G0, b"after the removal");
    let new_leader = sim.leader(G0).unwrap();
    assert_ne!(new_leader, leader);
    let voters = sim.engine(new_leader).status(G0).unwrap().voters;
    assert!(!voters.contains(&leader) && voters.len() == 2, "{voters:?}");
    let led_again = sim.trace()[applied_at..]
        .iter()
        .any(|t| matches!(t.event, Event::Role { node, role: Role::Leader, .. } if node == leader));
    assert!(!led_again, "the removed node led again");
}

/// Where `event` first is in the trace.
fn position_of(sim: &Sim, event: &Event) -> usize {
    sim.trace()
        .iter()
        .position(|t| t.event == *event)
        .unwrap_or_else(|| panic!("{event:?} never happened"))
}

/// The last role (and term) `node`'s rounds reported in group 0 before trace entry `at`.
fn role_before(sim: &Sim, node: NodeId, at: usize) -> Option<(Role, u64)> {
    sim.trace()[..at].iter().rev().find_map(|t| match t.event {
        Event::Role {
            node: n,
            group,
            role,
            term,
        } if n == node && group == G0 => Some((role, term)),
        _ => None,
    })
}

/// A follower campaigned between installing a snapshot and its persistence, while raft-rs's
/// applied index still pointed into the compacted log (raft-rs aborted; seed 1002). Groups
/// with a snapshot in flight no longer tick or take MsgTimeoutNow.
///
/// The precondition, scripted: follower F falls behind the leader's compaction, its disk
/// stalls, it installs the leader's snapshot and is then cut off for longer than any election
/// timeout, the snapshot still not durable.
#[test]
fn regression_no_campaign_while_a_snapshot_is_not_durable() {
    let mut sim = Sim::three_nodes(13, &[G0]);
    sim.propose_and_wait(G0, b"first");
    let leader = sim.leader(G0).unwrap();
    let (f, _) = followers(&sim, leader);
    let snapshot_at = install_an_unsynced_snapshot(&mut sim, leader, f);
    let term = sim.engine(f).status(G0).unwrap().term;
    sim.isolate(f);
    // Packets already on their way arrive in the next step (no delays); none after it.
    sim.step();
    let (quiet_from, ticks) = (sim.now, sim.ticks(f));
    let timeout_ticks_max = 2 * EngineConfig::new(f).election_tick as u64;
    assert!(sim.run_until(ELECTION_STEPS * 2, |s| {
        s.ticks(f) >= ticks + timeout_ticks_max
    }));

    // Precondition: F's election timeout elapsed (it heard nothing for as many ticks as the
    // longest timeout) while its snapshot was installed and not durable.
    let since = &sim.trace()[snapshot_at..];
    assert!(!since.iter().any(|t| t.event == Event::Synced { node: f }));
    assert!(!since
        .iter()
        .any(|t| matches!(t.event, Event::Delivered(m) if m.to == f && t.step > quiet_from)));

    // Outcome: F did not campaign (raft-rs would have read the compacted log and aborted);
    // once the snapshot is durable and F hears the leader again, it catches up.
    assert_no_campaign(&sim, f, snapshot_at, term);
    sim.resume_disk(f);
    sim.heal();
    sim.propose_and_wait(G0, b"after the snapshot");
    assert_eq!(sim.leader(G0), Some(leader));
}

/// The same through a MsgTimeoutNow: the leader's transfer to F, held while F falls behind,
/// reaches F while its snapshot is not durable.
#[test]
fn regression_no_campaign_on_timeout_now_while_a_snapshot_is_not_durable() {
    let mut sim = Sim::three_nodes(14, &[G0]);
    sim.propose_and_wait(G0, b"first");
    let leader = sim.leader(G0).unwrap();
    let (f, _) = followers(&sim, leader);
    let timeout_now = move |m: &Msg| m.to == f && m.kind == MessageType::MsgTimeoutNow;
    sim.hold(timeout_now);
    sim.engine_mut(leader).transfer_leader(G0, f).unwrap();
    wait_held(&mut sim, "the MsgTimeoutNow to F", timeout_now);
    let snapshot_at = install_an_unsynced_snapshot(&mut sim, leader, f);
    let term = sim.engine(f).status(G0).unwrap().term;
    let sent = sim.release_first(timeout_now);
    sim.step();

    // Precondition: F took the MsgTimeoutNow of its term, its snapshot installed and not
    // durable.
    let since = &sim.trace()[snapshot_at..];
    assert!(since.iter().any(|t| t.event == Event::Delivered(sent)));
    assert!(!since.iter().any(|t| t.event == Event::Synced { node: f }));
    assert_eq!(sent.term, term, "a MsgTimeoutNow of F's term");

    // Outcome: F did not campaign; the leader's transfer times out and it keeps leading.
    sim.run(ELECTION_STEPS);
    assert_no_campaign(&sim, f, snapshot_at, term);
    sim.resume_disk(f);
    sim.propose_and_wait(G0, b"after the snapshot");
    assert_eq!(sim.leader(G0), Some(leader));
}

/// Follower F, cut off, falls behind the leader's compaction; then its disk stalls and it
/// installs the leader's snapshot, which stays unsynced. Where the install is in the trace.
fn install_an_unsynced_snapshot(sim: &mut Sim, leader: NodeId, f: NodeId) -> usize {
    sim.record_trace();
    sim.compact_every_entries = 5;
    sim.isolate(f);
    for i in 0..20u32 {
        sim.propose_and_wait_without(G0, f, format!("without F {i}").as_bytes());
    }
    let first_index = sim.engine(leader).status(G0).unwrap().first_index;
    let f_last = sim.engine(f).status(G0).unwrap().last_index;
    assert!(first_index > f_last + 1, "F lags behind the compacted log");
    sim.stall_disk(f);
    sim.heal();
    let installed = |s: &Sim| {
        s.trace().iter().position(|t| {
            matches!(t.event, Event::Applied { node, what: Applied::Snapshot, .. } if node == f)
        })
    };
    assert!(sim.run_until(ELECTION_STEPS, |s| installed(s).is_some()));
    assert!(sim.unsynced_jobs(f) > 0, "the snapshot is not durable");
    installed(sim).unwrap()
}

/// Since trace entry `from`, `node` asked for no (pre-)vote and stayed a follower in `term`.
fn assert_no_campaign(sim: &Sim, node: NodeId, from: usize, term: u64) {
    let campaigns: Vec<Msg> = sim.trace()[from..]
        .iter()
        .filter_map(|t| match t.event {
            Event::Sent(m) if m.from == node && m.is_campaign() => Some(m),
            _ => None,
        })
        .collect();
    assert!(campaigns.is_empty(), "{node} campaigned: {campaigns:?}");
    let status = sim.engine(node).status(G0).unwrap();
    assert_eq!((status.role, status.term), (Role::Follower, term));
}
