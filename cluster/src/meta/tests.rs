//! Unit tests: each command, each refusal (the state is unchanged but for the applied
//! index), the codec against hostile bytes, the placement rule and the voter helpers.

#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;

use ferry_kernel::{NodeId, PlacementEpoch, QueueName};
use ferry_proto::pb;

use super::*;

pub(super) fn n(id: &str) -> NodeId {
    NodeId::new(id).unwrap()
}

pub(super) fn q(name: &str) -> QueueName {
    QueueName::new(name).unwrap()
}

pub(super) fn new_node(id: &str) -> NewNode {
    NewNode {
        id: n(id),
        client_addr: format!("{id}:7400"),
        peer_addr: format!("{id}:7401"),
    }
}

pub(super) const CLUSTER: ClusterId = ClusterId(0xfeed_beef);

/// A cluster bootstrapped with voters a, b, c at index 2.
pub(super) fn cluster() -> MetaState {
    let mut s = MetaState::new();
    let cmd = MetaCommand::Bootstrap {
        cluster_id: CLUSTER,
        nodes: vec![new_node("c"), new_node("a"), new_node("b")],
    };
    s.apply(2, &cmd).unwrap();
    s
}

pub(super) fn next(s: &MetaState) -> u64 {
    s.applied_index() + 1
}

pub(super) fn create(name: &str, owner: &str) -> MetaCommand {
    MetaCommand::CreateQueue {
        name: q(name),
        settings: pb::QueueConfig::default(),
        owner: n(owner),
    }
}

pub(super) fn add(id: &str, learner: bool) -> MetaCommand {
    MetaCommand::AddNode {
        id: n(id),
        client_addr: format!("{id}:7400"),
        peer_addr: format!("{id}:7401"),
        learner,
    }
}

/// Applies `cmd`, expects `expected`, and checks that nothing but the applied index changed.
pub(super) fn refused(s: &mut MetaState, cmd: MetaCommand, expected: &MetaError) {
    let before = s.clone();
    let index = next(s);
    let got = s.apply(index, &cmd).unwrap_err();
    assert_eq!(&got, expected);
    assert!(!got.to_string().is_empty());
    assert_eq!(s.applied_index(), index);
    let mut after = s.clone();
    after.applied_index = before.applied_index;
    assert_eq!(after, before, "{cmd:?} changed the state");
}

#[test]
fn bootstrap_makes_every_node_a_voter_with_raft_ids_in_id_order() {
    let s = cluster();
    assert_eq!(s.cluster_id(), Some(CLUSTER));
    let ids: Vec<(String, u64)> = s
        .nodes()
        .iter()
        .map(|(id, i)| (id.to_string(), i.raft_id.0))
        .collect();
    assert_eq!(ids, [("a".into(), 1), ("b".into(), 2), ("c".into(), 3)]);
    assert_eq!(s.voters().len(), 3);
    assert_eq!(s.next_raft_id(), RaftId(4));
    s.check_invariants().unwrap();
}

#[test]
fn bootstrap_is_refused_twice_for_another_cluster_and_without_nodes() {
    let mut s = cluster();
    let again = MetaCommand::Bootstrap {
        cluster_id: CLUSTER,
        nodes: vec![new_node("x")],
    };
    refused(
        &mut s,
        again,
        &MetaError::AlreadyBootstrapped {
            cluster_id: CLUSTER,
        },
    );
    let other = MetaCommand::Bootstrap {
        cluster_id: ClusterId(7),
        nodes: vec![new_node("x")],
    };
    let wrong = MetaError::WrongCluster {
        expected: CLUSTER,
        got: ClusterId(7),
    };
    refused(&mut s, other, &wrong);
    assert_eq!(s.check_cluster_id(ClusterId(7)), Err(wrong));
    assert_eq!(s.check_cluster_id(CLUSTER), Ok(()));

    let mut empty = MetaState::new();
    let none = MetaCommand::Bootstrap {
        cluster_id: CLUSTER,
        nodes: vec![],
    };
    refused(&mut empty, none, &MetaError::NoNodes);
    let dup = MetaCommand::Bootstrap {
        cluster_id: CLUSTER,
        nodes: vec![new_node("a"), new_node("a")],
    };
    refused(&mut empty, dup, &MetaError::DuplicateNode { node: n("a") });
    refused(&mut empty, add("d", true), &MetaError::NotBootstrapped);
}

#[test]
fn add_node_assigns_the_next_raft_id_and_never_reuses_one() {
    // (A removed node's id added again: `returning_node_tests.rs`.)
    let mut s = cluster();
    let event = s.apply(3, &add("d", true)).unwrap();
    assert_eq!(
        event,
        MetaEvent::NodeAdded {
            id: n("d"),
            raft_id: RaftId(4),
            role: NodeRole::Learner
        }
    );
    s.apply(4, &MetaCommand::RemoveNode { id: n("d") }).unwrap();
    refused(
        &mut s,
        add("a", false),
        &MetaError::DuplicateNode { node: n("a") },
    );
    let event = s.apply(next(&s), &add("e", false)).unwrap();
    assert!(matches!(
        event,
        MetaEvent::NodeAdded {
            raft_id: RaftId(5),
            role: NodeRole::Voter,
            ..
        }
    ));
    s.check_invariants().unwrap();
}

#[test]
fn promote_makes_a_learner_a_voter_and_refuses_voters_and_unknown_nodes() {
    let mut s = cluster();
    s.apply(3, &add("d", true)).unwrap();
    let event = s
        .apply(4, &MetaCommand::PromoteNode { id: n("d") })
        .unwrap();
    assert_eq!(
        event,
        MetaEvent::NodePromoted {
            id: n("d"),
            raft_id: RaftId(4)
        }
    );
    assert_eq!(s.node(&n("d")).unwrap().role, NodeRole::Voter);
    let promote = |id: &str| MetaCommand::PromoteNode { id: n(id) };
    refused(
        &mut s,
        promote("d"),
        &MetaError::AlreadyVoter { node: n("d") },
    );
    refused(
        &mut s,
        promote("zz"),
        &MetaError::UnknownNode { node: n("zz") },
    );
}

#[test]
fn remove_refuses_the_last_voter_a_node_with_queues_and_removed_nodes() {
    let mut s = cluster();
    let remove = |id: &str| MetaCommand::RemoveNode { id: n(id) };
    s.apply(3, &create("orders", "a")).unwrap();
    refused(
        &mut s,
        remove("a"),
        &MetaError::NodeOwnsQueues {
            node: n("a"),
            queues: vec![q("orders"), q("orders.DLQ")],
        },
    );
    let event = s.apply(next(&s), &remove("b")).unwrap();
    assert_eq!(
        event,
        MetaEvent::NodeRemoved {
            id: n("b"),
            raft_id: RaftId(2)
        }
    );
    refused(
        &mut s,
        remove("b"),
        &MetaError::NodeRemoved { node: n("b") },
    );
    s.apply(next(&s), &MetaCommand::DeleteQueue { name: q("orders") })
        .unwrap();
    s.apply(
        next(&s),
        &MetaCommand::DeleteQueue {
            name: q("orders.DLQ"),
        },
    )
    .unwrap();
    s.apply(next(&s), &remove("a")).unwrap();
    refused(&mut s, remove("c"), &MetaError::LastVoter { node: n("c") });
    refused(
        &mut s,
        remove("nope"),
        &MetaError::UnknownNode { node: n("nope") },
    );
    s.check_invariants().unwrap();
}

#[test]
fn create_places_the_queue_and_its_dead_letter_queue_on_the_owner_with_fresh_epochs() {
    let mut s = cluster();
    let event = s.apply(3, &create("orders", "b")).unwrap();
    let owner = |epoch| Owner {
        node: n("b"),
        epoch: PlacementEpoch::new(epoch),
    };
    assert_eq!(
        event,
        MetaEvent::QueuesCreated {
            queues: vec![(q("orders"), owner(1)), (q("orders.DLQ"), owner(2))]
        }
    );
    // An expiry queue of its own is created next to it, too.
    let settings = pb::QueueConfig {
        expiry: Some(pb::DeadLetterTarget {
            target: Some(pb::dead_letter_target::Target::Queue("expired".into())),
        }),
        ..Default::default()
    };
    let cmd = MetaCommand::CreateQueue {
        name: q("pay"),
        settings,
        owner: n("c"),
    };
    let event = s.apply(4, &cmd).unwrap();
    let MetaEvent::QueuesCreated { queues } = event else {
        panic!("{event:?}")
    };
    let names: Vec<&str> = queues.iter().map(|(q, _)| q.as_str()).collect();
    assert_eq!(names, ["pay", "pay.DLQ", "expired"]);
    assert!(queues.iter().all(|(_, o)| o.node == n("c")));
    // Deleted and created again: a new, higher epoch.
    s.apply(5, &MetaCommand::DeleteQueue { name: q("orders") })
        .unwrap();
    s.apply(6, &create("orders", "b")).unwrap();
    assert_eq!(
        s.queue(&q("orders")).unwrap().owner.epoch,
        PlacementEpoch::new(6)
    );
    s.check_invariants().unwrap();
}

#[test]
fn create_is_refused_for_existing_queues_bad_owners_bad_settings_and_split_companions() {
    let mut s = cluster();
    s.apply(3, &create("orders", "a")).unwrap();
    s.apply(4, &MetaCommand::RemoveNode { id: n("b") }).unwrap();
    refused(
        &mut s,
        create("orders", "a"),
        &MetaError::QueueExists { queue: q("orders") },
    );
    refused(
        &mut s,
        create("x", "zz"),
        &MetaError::UnknownNode { node: n("zz") },
    );
    refused(
        &mut s,
        create("x", "b"),
        &MetaError::NodeRemoved { node: n("b") },
    );
    // orders.DLQ lives on a: a queue dead-lettering into it cannot live on c.
    let settings = pb::QueueConfig {
        dead_letter: Some(pb::DeadLetterTarget {
            target: Some(pb::dead_letter_target::Target::Queue("orders.DLQ".into())),
        }),
        ..Default::default()
    };
    let cmd = MetaCommand::CreateQueue {
        name: q("y"),
        settings,
        owner: n("c"),
    };
    let split = MetaError::CompanionElsewhere {
        queue: q("y"),
        companion: q("orders.DLQ"),
        owner: n("a"),
    };
    refused(&mut s, cmd, &split);
    let bad = pb::QueueConfig {
        redelivery: Some(pb::RedeliveryPolicy {
            collision_avoidance_percent: Some(300),
            ..Default::default()
        }),
        ..Default::default()
    };
    let cmd = MetaCommand::CreateQueue {
        name: q("z"),
        settings: bad,
        owner: n("c"),
    };
    let index = next(&s);
    assert!(matches!(
        s.apply(index, &cmd),
        Err(MetaError::InvalidSettings { .. })
    ));
    assert!(s.queue(&q("z")).is_none());
}

#[test]
fn update_replaces_settings_and_delete_removes_only_the_queue() {
    let mut s = cluster();
    s.apply(3, &create("orders", "a")).unwrap();
    let settings = pb::QueueConfig {
        default_lease_ms: Some(5_000),
        ..Default::default()
    };
    let cmd = MetaCommand::UpdateQueue {
        name: q("orders"),
        settings: settings.clone(),
        expected: None,
    };
    let event = s.apply(4, &cmd).unwrap();
    assert!(matches!(event, MetaEvent::QueueUpdated { ref created, .. } if created.is_empty()));
    assert_eq!(s.queue(&q("orders")).unwrap().settings, settings);
    assert_eq!(
        s.queue(&q("orders")).unwrap().owner.epoch,
        PlacementEpoch::new(1),
        "same owner, same epoch"
    );
    let event = s
        .apply(5, &MetaCommand::DeleteQueue { name: q("orders") })
        .unwrap();
    assert!(matches!(event, MetaEvent::QueueDeleted { .. }));
    assert!(s.queue(&q("orders.DLQ")).is_some());
    let gone = MetaError::QueueNotFound { queue: q("orders") };
    let update = MetaCommand::UpdateQueue {
        name: q("orders"),
        settings,
        expected: None,
    };
    refused(&mut s, update, &gone);
    refused(
        &mut s,
        MetaCommand::DeleteQueue { name: q("orders") },
        &gone,
    );
}

#[test]
fn an_update_expecting_other_settings_is_refused_without_any_change() {
    let mut s = cluster();
    s.apply(3, &create("orders", "a")).unwrap();
    let first = pb::QueueConfig {
        default_lease_ms: Some(5_000),
        ..Default::default()
    };
    let update =
        |settings: &pb::QueueConfig, expected: &pb::QueueConfig| MetaCommand::UpdateQueue {
            name: q("orders"),
            settings: settings.clone(),
            expected: Some(Box::new(expected.clone())),
        };
    let created = s.queue(&q("orders")).unwrap().settings.clone();
    s.apply(4, &update(&first, &created)).unwrap();
    // A second update merged into the settings as they were before the first: refused, so the
    // first change is not lost.
    let second = pb::QueueConfig {
        max_messages: Some(9),
        ..created.clone()
    };
    refused(
        &mut s,
        update(&second, &created),
        &MetaError::SettingsChanged { queue: q("orders") },
    );
    assert_eq!(s.queue(&q("orders")).unwrap().settings, first);
}

#[test]
fn an_index_applied_twice_is_refused_without_any_change() {
    let mut s = cluster();
    let before = s.clone();
    assert_eq!(
        s.apply(2, &create("orders", "a")),
        Err(MetaError::StaleIndex {
            index: 2,
            applied_index: 2
        })
    );
    assert_eq!(s, before);
}

#[test]
fn every_command_survives_encoding_and_snapshots_restore_the_same_state() {
    let commands = [
        MetaCommand::Bootstrap {
            cluster_id: ClusterId(u128::MAX - 5),
            nodes: vec![new_node("a")],
        },
        add("d", true),
        MetaCommand::PromoteNode { id: n("d") },
        MetaCommand::RemoveNode { id: n("d") },
        create("orders", "a"),
        MetaCommand::UpdateQueue {
            name: q("orders"),
            settings: pb::QueueConfig {
                max_messages: Some(9),
                ..Default::default()
            },
            expected: Some(Box::default()),
        },
        MetaCommand::DeleteQueue { name: q("orders") },
    ];
    let mut s = MetaState::new();
    for (i, cmd) in commands.iter().enumerate() {
        let request = RequestId(u128::MAX - i as u128);
        let bytes = cmd.encode_request(Some(request));
        assert_eq!(
            MetaCommand::decode_request(&bytes).unwrap(),
            (Some(request), cmd.clone())
        );
        assert_eq!(&MetaCommand::decode(&cmd.encode()).unwrap(), cmd);
        let _ = s.apply_entry(i as u64 + 2, &bytes);
        let restored = MetaState::restore(&s.snapshot()).unwrap();
        assert_eq!(restored, s);
        assert_eq!(restored.digest(), s.digest());
    }
    assert_eq!(
        MetaState::restore(&MetaState::new().snapshot()).unwrap(),
        MetaState::new()
    );
}

#[test]
fn hostile_bytes_are_refused_never_a_panic() {
    let good = create("orders", "a").encode();
    let mut s = cluster();
    for len in 0..good.len() {
        let _ = MetaCommand::decode(&good[..len]);
    }
    let mut x: u64 = 0x1234_5678;
    for _ in 0..2000 {
        x = x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
        let mut bytes = good.clone();
        let at = (x >> 33) as usize % bytes.len();
        bytes[at] ^= (x >> 13) as u8 | 1;
        let _ = MetaCommand::decode(&bytes);
        let _ = MetaState::restore(&bytes);
    }
    assert!(matches!(
        MetaCommand::decode(&[0xff, 0xff]),
        Err(MetaError::Decode { .. })
    ));
    let bad_name = MetaCommand::DeleteQueue { name: q("x") }.encode();
    let bad_name: Vec<u8> = bad_name
        .iter()
        .map(|b| if *b == b'x' { b'/' } else { *b })
        .collect();
    assert!(matches!(
        MetaCommand::decode(&bad_name),
        Err(MetaError::Decode { .. })
    ));
    let future = [0x08, 0x02];
    assert!(matches!(
        MetaCommand::decode(&future),
        Err(MetaError::UnsupportedVersion { version: 2, .. })
    ));
    // Garbage in the log stops applying: nothing changes, not even the applied index, and
    // the error says so (a node must not skip what the others applied).
    let before = s.clone();
    for garbage in [&[0xff, 0xff][..], &future[..], &bad_name[..]] {
        let e = s.apply_entry(3, garbage).unwrap_err();
        assert!(e.stops_apply(), "{e}");
        assert_eq!(s, before);
    }
    // A command kind this release does not know (a later oneof tag) stops it too.
    let unknown_kind = [0x08, 0x01, 0x5a, 0x00];
    assert!(s.apply_entry(3, &unknown_kind).unwrap_err().stops_apply());
    assert_eq!(s, before);
    assert!(!MetaError::QueueExists { queue: q("x") }.stops_apply());
    assert_eq!(s.apply_entry(3, &[]).unwrap().event, MetaEvent::Nothing);
    assert!(s.apply_entry(3, &[]).unwrap_err().stops_apply());
}

/// A proposal retried after its answer was lost commits twice: the first copy applies, the
/// second answers as the first did and changes nothing, even where applying it again would
/// (a queue deleted in between would come back).
#[test]
fn a_retried_proposal_applies_once_and_answers_as_the_original() {
    let mut s = cluster();
    let request = RequestId(7);
    let bytes = create("orders", "a").encode_request(Some(request));
    let first = s.apply_entry(3, &bytes).unwrap();
    assert!(matches!(first.event, MetaEvent::QueuesCreated { .. }));
    assert_eq!(first.recorded, Some(request));
    s.apply(4, &MetaCommand::DeleteQueue { name: q("orders") })
        .unwrap();
    let again = s.apply_entry(5, &bytes).unwrap();
    assert_eq!(again.event, MetaEvent::Repeated { first_index: 3 });
    assert_eq!((again.recorded, again.evicted), (None, None));
    assert!(s.queue(&q("orders")).is_none(), "not created a second time");
    assert_eq!(s.applied_index(), 5);
    // Without a request id the same command applies again.
    assert!(s.apply_entry(6, &create("orders", "a").encode()).is_ok());
    assert!(s.queue(&q("orders")).is_some());
    // Remembered across a snapshot.
    let mut restored = MetaState::restore(&s.snapshot()).unwrap();
    assert_eq!(
        restored.apply_entry(7, &bytes).unwrap().event,
        MetaEvent::Repeated { first_index: 3 }
    );
}

/// A refused proposal is not remembered: it changed nothing, so its retry is judged again
/// where it is ordered.
#[test]
fn a_refused_proposal_is_judged_again_when_retried() {
    let mut s = cluster();
    s.apply(3, &create("orders", "a")).unwrap();
    let retried = MetaCommand::DeleteQueue { name: q("pay") }.encode_request(Some(RequestId(9)));
    assert_eq!(
        s.apply_entry(4, &retried),
        Err(MetaError::QueueNotFound { queue: q("pay") })
    );
    s.apply(5, &create("pay", "a")).unwrap();
    let applied = s.apply_entry(6, &retried).unwrap();
    assert!(matches!(applied.event, MetaEvent::QueueDeleted { .. }));
    assert!(s.queue(&q("pay")).is_none());
}

/// The last REQUESTS_KEPT ids are remembered, the oldest forgotten first, alike on every node.
#[test]
fn request_ids_are_kept_up_to_the_bound_oldest_forgotten_first() {
    let mut s = cluster();
    s.apply(3, &create("orders", "a")).unwrap();
    let command = MetaCommand::UpdateQueue {
        name: q("orders"),
        settings: pb::QueueConfig::default(),
        expected: None,
    };
    let mut last = None;
    for (i, index) in (0..=REQUESTS_KEPT as u128).zip(4u64..) {
        last = Some(
            s.apply_request(index, Some(RequestId(i + 1)), &command)
                .unwrap(),
        );
    }
    let last = last.unwrap();
    assert_eq!(last.evicted, Some(RequestId(1)), "the oldest went first");
    assert_eq!(s.requests.len(), REQUESTS_KEPT);
    assert_eq!(s.requests.applied_at(RequestId(1)), None);
    assert!(s.requests.applied_at(RequestId(2)).is_some());
    s.check_invariants().unwrap();
}

#[test]
fn choose_owner_takes_fewest_queues_then_fewest_bytes_then_smallest_id_or_the_pinned_node() {
    let mut s = cluster();
    let none = BTreeMap::new();
    assert_eq!(choose_owner(&s, &none, None), Ok(n("a")));
    let loads: BTreeMap<NodeId, u64> = [(n("a"), 500), (n("b"), 100), (n("c"), 900)].into();
    assert_eq!(choose_owner(&s, &loads, None), Ok(n("b")));
    s.apply(3, &create("orders", "b")).unwrap();
    assert_eq!(choose_owner(&s, &loads, None), Ok(n("a")));
    s.apply(4, &create("pay", "a")).unwrap();
    assert_eq!(choose_owner(&s, &loads, None), Ok(n("c")));
    assert_eq!(choose_owner(&s, &loads, Some(&n("b"))), Ok(n("b")));
    assert_eq!(
        choose_owner(&s, &loads, Some(&n("zz"))),
        Err(MetaError::UnknownNode { node: n("zz") })
    );
    s.apply(5, &MetaCommand::RemoveNode { id: n("c") }).unwrap();
    assert_eq!(
        choose_owner(&s, &loads, None),
        Ok(n("b")),
        "removed nodes own nothing new; a and b own 2 each, b has fewer bytes"
    );
    assert_eq!(
        choose_owner(&s, &loads, Some(&n("c"))),
        Err(MetaError::NodeRemoved { node: n("c") })
    );
    assert_eq!(
        choose_owner(&MetaState::new(), &none, None),
        Err(MetaError::NoActiveNode)
    );
}

#[test]
fn voter_checks_keep_one_three_or_five_voters_and_say_what_to_do() {
    let mut s = cluster();
    assert!(matches!(
        check_voters(&s, VoterChange::AddVoter),
        VoterCheck::Breaks {
            voters_after: 4,
            ..
        }
    ));
    assert!(matches!(
        check_voters(&s, VoterChange::RemoveVoter),
        VoterCheck::Breaks {
            voters_after: 2,
            ..
        }
    ));
    s.apply(3, &add("d", true)).unwrap();
    s.apply(4, &add("e", true)).unwrap();
    let VoterCheck::Breaks { advice, .. } = check_voters(&s, VoterChange::Promote) else {
        panic!("4 voters is even");
    };
    assert!(advice.contains("promote a second learner"), "{advice}");
    s.apply(5, &MetaCommand::PromoteNode { id: n("d") })
        .unwrap();
    assert_eq!(
        check_voters(&s, VoterChange::Promote),
        VoterCheck::Keeps { voters_after: 5 }
    );
    s.apply(6, &MetaCommand::PromoteNode { id: n("e") })
        .unwrap();
    let VoterCheck::Breaks { advice, .. } = check_voters(&s, VoterChange::AddVoter) else {
        panic!("6 voters");
    };
    assert!(advice.contains("learner"), "{advice}");
}

#[test]
fn membership_steps_bring_the_raft_configuration_to_the_recorded_nodes() {
    let mut s = cluster();
    let r = |ids: &[u64]| ids.iter().copied().map(RaftId).collect::<Vec<_>>();
    assert_eq!(next_membership_step(&s, &r(&[1, 2, 3]), &[]), None);
    s.apply(3, &add("d", true)).unwrap();
    assert_eq!(
        next_membership_step(&s, &r(&[1, 2, 3]), &[]),
        Some(MembershipStep::AddLearner(RaftId(4)))
    );
    s.apply(4, &MetaCommand::PromoteNode { id: n("d") })
        .unwrap();
    assert_eq!(
        next_membership_step(&s, &r(&[1, 2, 3]), &r(&[4])),
        Some(MembershipStep::Promote(RaftId(4)))
    );
    s.apply(5, &add("e", false)).unwrap();
    s.apply(6, &MetaCommand::RemoveNode { id: n("a") }).unwrap();
    assert_eq!(
        next_membership_step(&s, &r(&[1, 2, 3, 4]), &[]),
        Some(MembershipStep::Remove(RaftId(1))),
        "removals first"
    );
    assert_eq!(
        next_membership_step(&s, &r(&[2, 3, 4]), &[]),
        Some(MembershipStep::AddVoter(RaftId(5)))
    );
    assert_eq!(next_membership_step(&s, &r(&[2, 3, 4, 5]), &[]), None);
}

#[test]
fn the_placement_snapshot_lists_owners_and_active_nodes() {
    let mut s = cluster();
    s.apply(3, &create("orders", "c")).unwrap();
    s.apply(4, &MetaCommand::RemoveNode { id: n("a") }).unwrap();
    let p = s.placement_snapshot();
    assert_eq!(p.applied_index, 4);
    assert_eq!(p.cluster_id, Some(CLUSTER));
    assert_eq!(
        p.owners[&q("orders")],
        Owner {
            node: n("c"),
            epoch: PlacementEpoch::new(1)
        }
    );
    assert_eq!(
        p.nodes.keys().map(NodeId::as_str).collect::<Vec<_>>(),
        ["b", "c"]
    );
    assert_eq!(p.nodes[&n("b")].peer_addr, "b:7401");
}

#[test]
fn a_queue_created_again_goes_where_its_dead_letter_queue_stayed() {
    let mut s = cluster();
    let none = BTreeMap::new();
    let settings = pb::QueueConfig::default();
    s.apply(3, &create("orders", "c")).unwrap();
    s.apply(4, &MetaCommand::DeleteQueue { name: q("orders") })
        .unwrap();
    // The rule alone would pick a (fewest queues); orders.DLQ stayed on c.
    assert_eq!(choose_owner(&s, &none, None), Ok(n("a")));
    assert_eq!(
        choose_queue_owner(&s, &q("orders"), &settings, &none, None),
        Ok(n("c"))
    );
    assert_eq!(
        choose_queue_owner(&s, &q("orders"), &settings, &none, Some(&n("a"))),
        Err(MetaError::CompanionElsewhere {
            queue: q("orders"),
            companion: q("orders.DLQ"),
            owner: n("c")
        })
    );
    assert_eq!(
        choose_queue_owner(&s, &q("fresh"), &settings, &none, None),
        Ok(n("a"))
    );
    refused(
        &mut s,
        create("orders", "a"),
        &MetaError::CompanionElsewhere {
            queue: q("orders"),
            companion: q("orders.DLQ"),
            owner: n("c"),
        },
    );
}

#[test]
fn a_node_address_must_be_host_and_port() {
    let mut s = cluster();
    let cmd = MetaCommand::AddNode {
        id: n("d"),
        client_addr: "d:7400".into(),
        peer_addr: "http://d".into(),
        learner: true,
    };
    let expected = MetaError::InvalidAddress {
        node: n("d"),
        field: "peer_addr",
        addr: "http://d".into(),
    };
    refused(&mut s, cmd, &expected);
    let mut empty = MetaState::new();
    let mut bad = new_node("a");
    bad.client_addr = String::new();
    let cmd = MetaCommand::Bootstrap {
        cluster_id: CLUSTER,
        nodes: vec![bad],
    };
    refused(
        &mut empty,
        cmd,
        &MetaError::InvalidAddress {
            node: n("a"),
            field: "client_addr",
            addr: String::new(),
        },
    );
}

#[test]
fn the_placement_rule_skips_nodes_the_proposer_cannot_reach_unless_all_are_down() {
    let s = cluster();
    let none = BTreeMap::new();
    let down: std::collections::BTreeSet<NodeId> = [n("a")].into();
    assert_eq!(choose_owner_avoiding(&s, &none, None, &down), Ok(n("b")));
    assert_eq!(
        choose_owner_avoiding(&s, &none, Some(&n("a")), &down),
        Ok(n("a")),
        "a pin is honoured"
    );
    let all: std::collections::BTreeSet<NodeId> = [n("a"), n("b"), n("c")].into();
    assert_eq!(choose_owner_avoiding(&s, &none, None, &all), Ok(n("a")));
}
