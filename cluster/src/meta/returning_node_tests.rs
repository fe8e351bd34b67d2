//! Unit tests of a node whose disk was lost: the data directory each node runs on is recorded
//! ([`MetaCommand::NoteIncarnation`]: once, the same again changes nothing, another one is
//! refused; kept by the codec, snapshots and the durable copy), and a removed node's id added
//! again gets a new raft id, the old one leaving the metadata group.

#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;

use super::durable_tests::{rebuilt, write_durable};
use super::shard_tests::cluster_of;
use super::tests::{n, next, refused};

use super::*;

fn note(node: &str, incarnation: u64) -> MetaCommand {
    MetaCommand::NoteIncarnation {
        node: n(node),
        incarnation,
    }
}

#[test]
fn an_incarnation_is_recorded_once_and_another_one_is_refused() {
    let mut s = cluster_of(&["a", "b", "c"]);
    assert_eq!(s.node(&n("b")).unwrap().incarnation, 0, "none at first");
    let event = s.apply(next(&s), &note("b", 0xfeed)).unwrap();
    assert_eq!(
        event,
        MetaEvent::IncarnationNoted {
            node: n("b"),
            incarnation: 0xfeed
        }
    );
    assert_eq!(s.node(&n("b")).unwrap().incarnation, 0xfeed);
    // The same again (a second leader heard it too), or none: nothing changes.
    assert_eq!(
        s.apply(next(&s), &note("b", 0xfeed)).unwrap(),
        MetaEvent::Nothing
    );
    assert_eq!(
        s.apply(next(&s), &note("b", 0)).unwrap(),
        MetaEvent::Nothing
    );
    // b's disk was lost and it started on a new one: refused, the record stays.
    refused(
        &mut s,
        note("b", 0xbeef),
        &MetaError::OtherIncarnation {
            node: n("b"),
            recorded: 0xfeed,
            got: 0xbeef,
        },
    );
    assert_eq!(s.node(&n("b")).unwrap().incarnation, 0xfeed);
    refused(
        &mut s,
        note("zz", 1),
        &MetaError::UnknownNode { node: n("zz") },
    );
    s.check_invariants().unwrap();
}

#[test]
fn an_incarnation_survives_the_codec_snapshots_and_the_durable_copy() {
    let command = note("c", u64::MAX);
    assert_eq!(command.level(), 4);
    assert_eq!(command.level(), COMMAND_LEVEL, "the newest kind");
    assert_eq!(MetaCommand::decode(&command.encode()).unwrap(), command);

    let mut s = cluster_of(&["a", "b", "c"]);
    let mut copy = BTreeMap::new();
    write_durable(&mut copy, s.durable_writes(&durable_everything()));
    let applied = s.apply_entry(next(&s), &command.encode()).unwrap();
    let mut touched = Touched::default();
    touched.note_applied(&applied);
    write_durable(&mut copy, s.durable_writes(&touched));
    assert_eq!(rebuilt(&copy), s, "the durable copy holds it");
    let restored = MetaState::restore(&s.snapshot()).unwrap();
    assert_eq!(restored, s);
    assert_eq!(restored.node(&n("c")).unwrap().incarnation, u64::MAX);
}

/// What a store written from scratch needs.
fn durable_everything() -> Touched {
    let mut t = Touched::default();
    t.everything();
    t
}

fn add(id: &str, learner: bool) -> MetaCommand {
    MetaCommand::AddNode {
        id: n(id),
        client_addr: format!("{id}:7400"),
        peer_addr: format!("{id}:7410"),
        learner,
    }
}

#[test]
fn a_removed_node_added_again_gets_a_new_raft_id_and_its_old_one_leaves_the_group() {
    let mut s = cluster_of(&["a", "b", "c"]);
    s.apply(next(&s), &add("d", true)).unwrap();
    s.apply(next(&s), &note("d", 0xd1)).unwrap();
    let old = s.node(&n("d")).unwrap().raft_id;
    refused(
        &mut s,
        add("d", true),
        &MetaError::DuplicateNode { node: n("d") },
    );
    s.apply(next(&s), &MetaCommand::RemoveNode { id: n("d") })
        .unwrap();
    // Its disk lost, the machine comes back empty under its old name.
    let event = s.apply(next(&s), &add("d", true)).unwrap();
    let MetaEvent::NodeAdded { raft_id, .. } = event else {
        panic!("{event:?}")
    };
    assert!(raft_id > old, "a new raft id: {raft_id:?} after {old:?}");
    let d = s.node(&n("d")).unwrap();
    assert!(d.is_active());
    assert_eq!(
        d.incarnation, 0,
        "its new data directory is recorded afresh"
    );
    assert_eq!(d.peer_addr, "d:7410");
    s.check_invariants().unwrap();

    // The group's leader removes the old raft id, which no node has, then adds the new one.
    let voters: Vec<RaftId> = ["a", "b", "c"]
        .iter()
        .map(|id| s.node(&n(id)).unwrap().raft_id)
        .collect();
    assert_eq!(
        next_membership_step(&s, &voters, &[old]),
        Some(MembershipStep::Remove(old))
    );
    assert_eq!(
        next_membership_step(&s, &voters, &[]),
        Some(MembershipStep::AddLearner(raft_id))
    );
    assert_eq!(next_membership_step(&s, &voters, &[raft_id]), None);
    // Before the cluster is formed, the configuration's members have no nodes yet: kept.
    assert_eq!(next_membership_step(&MetaState::new(), &voters, &[]), None);
}
