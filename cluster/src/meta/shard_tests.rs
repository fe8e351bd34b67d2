//! Unit tests of queue shards: the placement rule, each refusal, companions, removal, and the
//! shards' way through the codec, snapshots and the durable copy.

#![allow(clippy::unwrap_used)]

use std::collections::{BTreeMap, BTreeSet};

use ferry_kernel::{NodeId, ShardId};
use ferry_proto::pb;

use super::durable_tests::{rebuilt, write_durable};
use super::tests::{n, next, q};
use super::*;

/// A cluster bootstrapped with voters `ids` at index 2.
pub(super) fn cluster_of(ids: &[&str]) -> MetaState {
    let mut s = MetaState::new();
    let nodes = ids
        .iter()
        .map(|id| NewNode {
            id: n(id),
            client_addr: format!("{id}:7400"),
            peer_addr: format!("{id}:7401"),
        })
        .collect();
    let cmd = MetaCommand::Bootstrap {
        cluster_id: ClusterId(7),
        nodes,
    };
    s.apply(2, &cmd).unwrap();
    s
}

#[test]
fn the_default_replication_is_3_from_3_nodes_up_and_follows_an_existing_companion() {
    let settings = pb::QueueConfig::default();
    for (ids, expected) in [
        (&["a"][..], 1),
        (&["a", "b"][..], 1),
        (&["a", "b", "c"][..], 3),
    ] {
        let s = cluster_of(ids);
        assert_eq!(
            s.default_replication(&q("orders"), &settings, false),
            Ok(expected),
            "{ids:?}"
        );
        assert_eq!(s.default_replication(&q("orders"), &settings, true), Ok(1));
    }
    let mut s = cluster_of(&["a", "b", "c", "d", "e"]);
    assert_eq!(s.default_replication(&q("x"), &settings, false), Ok(3));
    // A queue whose dead-letter queue is left over from an unreplicated one stays with it.
    apply(
        &mut s,
        &MetaCommand::CreateQueue {
            name: q("plain"),
            settings: settings.clone(),
            owner: n("a"),
        },
    );
    apply(&mut s, &MetaCommand::DeleteQueue { name: q("plain") });
    assert_eq!(s.default_replication(&q("plain"), &settings, false), Ok(1));
    // One whose dead-letter queue is in a shard of 5 takes 5.
    let five = replicated(&s, "big", 5, false);
    apply(&mut s, &five);
    apply(&mut s, &MetaCommand::DeleteQueue { name: q("big") });
    assert_eq!(s.default_replication(&q("big"), &settings, false), Ok(5));
}

/// The command the proposer makes for `name` with `replication` (the rule's choice).
fn replicated(s: &MetaState, name: &str, replication: usize, dedicated: bool) -> MetaCommand {
    let settings = pb::QueueConfig::default();
    let shard = choose_shard(
        s,
        &q(name),
        &settings,
        replication,
        dedicated,
        &BTreeSet::new(),
    )
    .unwrap();
    MetaCommand::CreateReplicatedQueue {
        name: q(name),
        settings,
        shard,
    }
}

fn apply(s: &mut MetaState, cmd: &MetaCommand) -> MetaEvent {
    let index = next(s);
    let event = s.apply(index, cmd).unwrap();
    s.check_invariants().unwrap();
    event
}

/// [`super::tests::refused`], for a command the test keeps.
fn refused(s: &mut MetaState, cmd: &MetaCommand, expected: &MetaError) {
    super::tests::refused(s, cmd.clone(), expected);
}

fn shard_of(s: &MetaState, name: &str) -> ShardId {
    s.queue(&q(name)).unwrap().shard.unwrap()
}

#[test]
fn the_first_shards_spread_their_leaders_then_queues_join_the_emptiest() {
    let mut s = cluster_of(&["a", "b", "c"]);
    for name in ["q1", "q2", "q3"] {
        let cmd = replicated(&s, name, 3, false);
        let MetaEvent::ReplicatedQueuesCreated {
            created_shard,
            queues,
            shard,
        } = apply(&mut s, &cmd)
        else {
            panic!("not a replicated create")
        };
        assert!(created_shard, "{name} made no shard");
        // The queue and its dead-letter queue, both owned by the shard's preferred leader.
        let names: Vec<String> = queues.iter().map(|(q, _)| q.to_string()).collect();
        assert_eq!(names, [name.to_owned(), format!("{name}.DLQ")]);
        let leader = s.shard(shard).unwrap().preferred_leader().clone();
        assert!(queues.iter().all(|(_, o)| o.node == leader));
    }
    let leaders: BTreeSet<String> = s
        .shards()
        .values()
        .map(|d| d.preferred_leader().to_string())
        .collect();
    assert_eq!(leaders.len(), 3, "each node leads one shard: {leaders:?}");
    assert!(s.shards().values().all(|d| d.replicas.len() == 3));
    // As many shards as nodes: the next queues join the one holding the fewest.
    let cmd = replicated(&s, "q4", 3, false);
    assert_eq!(
        cmd,
        MetaCommand::CreateReplicatedQueue {
            name: q("q4"),
            settings: pb::QueueConfig::default(),
            shard: ShardChoice::Existing(ShardId(1)),
        }
    );
    apply(&mut s, &cmd);
    let cmd = replicated(&s, "q5", 3, false);
    apply(&mut s, &cmd);
    assert_eq!(shard_of(&s, "q5"), ShardId(2));
    assert_eq!(s.shard(ShardId(1)).unwrap().queues, 4);
    assert_eq!(s.next_shard(), ShardId(4));
}

#[test]
fn on_five_nodes_each_leads_one_shard_and_holds_three_replicas() {
    let mut s = cluster_of(&["a", "b", "c", "d", "e"]);
    for i in 0..5 {
        let cmd = replicated(&s, &format!("q{i}"), 3, false);
        apply(&mut s, &cmd);
    }
    assert_eq!(s.shards().len(), 5);
    let mut led: BTreeMap<String, usize> = BTreeMap::new();
    let mut held: BTreeMap<String, usize> = BTreeMap::new();
    for d in s.shards().values() {
        *led.entry(d.preferred_leader().to_string()).or_default() += 1;
        for r in &d.replicas {
            *held.entry(r.to_string()).or_default() += 1;
        }
    }
    assert!(led.values().all(|c| *c == 1), "leaders {led:?}");
    assert!(held.values().all(|c| *c == 3), "replicas {held:?}");
    // Replication factor 5 makes shards of its own kind.
    let cmd = replicated(&s, "wide", 5, false);
    apply(&mut s, &cmd);
    assert_eq!(s.shard(shard_of(&s, "wide")).unwrap().replicas.len(), 5);
}

#[test]
fn the_rule_avoids_nodes_the_proposer_cannot_reach() {
    let s = cluster_of(&["a", "b", "c", "d"]);
    let down: BTreeSet<NodeId> = [n("a")].into();
    let choice = choose_shard(&s, &q("q"), &pb::QueueConfig::default(), 3, false, &down).unwrap();
    let ShardChoice::New { replicas, .. } = choice else {
        panic!("{choice:?}")
    };
    assert_eq!(replicas, [n("b"), n("c"), n("d")]);
}

#[test]
fn replication_factors_other_than_3_and_5_or_above_the_node_count_are_refused() {
    let mut s = cluster_of(&["a", "b", "c"]);
    let settings = pb::QueueConfig::default();
    let none = BTreeSet::new();
    for (rf, expected) in [
        (2, MetaError::InvalidReplication { replication: 2 }),
        (1, MetaError::InvalidReplication { replication: 1 }),
        (
            5,
            MetaError::TooFewNodes {
                replication: 5,
                active: 3,
            },
        ),
    ] {
        assert_eq!(
            choose_shard(&s, &q("x"), &settings, rf, false, &none),
            Err(expected)
        );
    }
    let new = |replicas: &[&str]| MetaCommand::CreateReplicatedQueue {
        name: q("x"),
        settings: settings.clone(),
        shard: ShardChoice::New {
            replicas: replicas.iter().map(|r| n(r)).collect(),
            dedicated: false,
        },
    };
    refused(
        &mut s,
        &new(&["a", "b"]),
        &MetaError::InvalidReplication { replication: 2 },
    );
    let twice = new(&["a", "b", "a"]);
    let before = s.clone();
    let index = next(&s);
    let err = s.apply(index, &twice).unwrap_err();
    assert!(matches!(err, MetaError::InvalidReplicas { .. }), "{err}");
    assert_eq!(s.shards(), before.shards());
    assert_eq!(s.queues(), before.queues());
    refused(
        &mut s,
        &new(&["a", "b", "zz"]),
        &MetaError::UnknownNode { node: n("zz") },
    );
    let existing = |id| MetaCommand::CreateReplicatedQueue {
        name: q("x"),
        settings: settings.clone(),
        shard: ShardChoice::Existing(ShardId(id)),
    };
    refused(
        &mut s,
        &existing(9),
        &MetaError::ShardNotFound { shard: ShardId(9) },
    );
    assert_eq!(default_replication(2), 1);
    assert_eq!(default_replication(3), 3);
    assert_eq!(default_replication(7), 3);
}

#[test]
fn a_dedicated_shard_takes_no_other_queue_and_a_shard_goes_with_its_last_queue() {
    let mut s = cluster_of(&["a", "b", "c"]);
    let cmd = replicated(&s, "own", 3, true);
    apply(&mut s, &cmd);
    let own = shard_of(&s, "own");
    assert!(s.shard(own).unwrap().dedicated);
    for i in 0..6 {
        let cmd = replicated(&s, &format!("q{i}"), 3, false);
        apply(&mut s, &cmd);
        assert_ne!(shard_of(&s, &format!("q{i}")), own);
    }
    let join = MetaCommand::CreateReplicatedQueue {
        name: q("intruder"),
        settings: pb::QueueConfig::default(),
        shard: ShardChoice::Existing(own),
    };
    refused(&mut s, &join, &MetaError::ShardDedicated { shard: own });
    // The dead-letter queue keeps the shard; deleting it too removes the shard.
    let event = apply(&mut s, &MetaCommand::DeleteQueue { name: q("own") });
    assert!(matches!(
        event,
        MetaEvent::QueueDeleted {
            removed_shard: None,
            ..
        }
    ));
    let event = apply(&mut s, &MetaCommand::DeleteQueue { name: q("own.DLQ") });
    assert!(matches!(
        event,
        MetaEvent::QueueDeleted { removed_shard: Some(id), .. } if id == own
    ));
    assert!(s.shard(own).is_none());
    // Shard ids are never given twice.
    let cmd = replicated(&s, "own", 3, true);
    apply(&mut s, &cmd);
    assert!(shard_of(&s, "own") > own);
}

#[test]
fn a_queue_and_its_dead_letter_queue_share_one_shard() {
    let mut s = cluster_of(&["a", "b", "c"]);
    let cmd = replicated(&s, "orders", 3, false);
    apply(&mut s, &cmd);
    let shard = shard_of(&s, "orders");
    assert_eq!(shard_of(&s, "orders.DLQ"), shard);
    // Deleted, the queue goes; created again it goes where its dead-letter queue stayed,
    // whatever the rule would choose otherwise.
    for i in 0..4 {
        let cmd = replicated(&s, &format!("x{i}"), 3, false);
        apply(&mut s, &cmd);
    }
    apply(&mut s, &MetaCommand::DeleteQueue { name: q("orders") });
    let again = replicated(&s, "orders", 3, false);
    assert!(matches!(
        &again,
        MetaCommand::CreateReplicatedQueue { shard: ShardChoice::Existing(id), .. } if *id == shard
    ));
    // Another shard, a new one, or no shard at all is refused.
    let elsewhere = MetaCommand::CreateReplicatedQueue {
        name: q("orders"),
        settings: pb::QueueConfig::default(),
        shard: ShardChoice::New {
            replicas: vec![n("c"), n("a"), n("b")],
            dedicated: true,
        },
    };
    let expected = MetaError::CompanionInOtherShard {
        queue: q("orders"),
        companion: q("orders.DLQ"),
        shard: Some(shard),
    };
    refused(&mut s, &elsewhere, &expected);
    let unreplicated = MetaCommand::CreateQueue {
        name: q("orders"),
        settings: pb::QueueConfig::default(),
        owner: n("a"),
    };
    refused(&mut s, &unreplicated, &expected);
    apply(&mut s, &again);
    // An unreplicated dead-letter queue cannot take a replicated queue's messages.
    apply(
        &mut s,
        &MetaCommand::CreateQueue {
            name: q("plain"),
            settings: pb::QueueConfig::default(),
            owner: n("a"),
        },
    );
    apply(&mut s, &MetaCommand::DeleteQueue { name: q("plain") });
    assert_eq!(
        choose_shard(
            &s,
            &q("plain"),
            &pb::QueueConfig::default(),
            3,
            false,
            &BTreeSet::new()
        ),
        Err(MetaError::CompanionInOtherShard {
            queue: q("plain"),
            companion: q("plain.DLQ"),
            shard: None,
        })
    );
    // A new expiry queue named by an update goes into the queue's shard.
    let expiring = pb::QueueConfig {
        expiry: Some(pb::DeadLetterTarget {
            target: Some(pb::dead_letter_target::Target::Queue(
                "orders.expired".into(),
            )),
        }),
        ..Default::default()
    };
    let update = MetaCommand::UpdateQueue {
        name: q("orders"),
        settings: expiring,
        expected: None,
    };
    apply(&mut s, &update);
    assert_eq!(shard_of(&s, "orders.expired"), shard);
}

#[test]
fn a_node_holding_replicas_is_not_removed() {
    let mut s = cluster_of(&["a", "b", "c", "d"]);
    let cmd = MetaCommand::CreateReplicatedQueue {
        name: q("orders"),
        settings: pb::QueueConfig::default(),
        shard: ShardChoice::New {
            replicas: vec![n("a"), n("b"), n("c")],
            dedicated: false,
        },
    };
    apply(&mut s, &cmd);
    refused(
        &mut s,
        &MetaCommand::RemoveNode { id: n("b") },
        &MetaError::NodeHoldsReplicas {
            node: n("b"),
            shards: vec![ShardId(1)],
        },
    );
    apply(&mut s, &MetaCommand::RemoveNode { id: n("d") });
    apply(&mut s, &MetaCommand::DeleteQueue { name: q("orders") });
    apply(
        &mut s,
        &MetaCommand::DeleteQueue {
            name: q("orders.DLQ"),
        },
    );
    apply(&mut s, &MetaCommand::RemoveNode { id: n("b") });
}

#[test]
fn shards_survive_encoding_snapshots_and_the_durable_copy() {
    let mut s = cluster_of(&["a", "b", "c"]);
    let mut copy: BTreeMap<Vec<u8>, Vec<u8>> = BTreeMap::new();
    let mut touched = Touched::default();
    touched.everything();
    write_durable(&mut copy, s.durable_writes(&touched));
    let mut index = next(&s);
    let mut step = |s: &mut MetaState, cmd: MetaCommand| {
        assert_eq!(cmd.level(), COMMAND_LEVEL.min(cmd.level()));
        let bytes = cmd.encode();
        assert_eq!(MetaCommand::decode(&bytes).unwrap(), cmd);
        let mut touched = Touched::default();
        match s.apply_entry(index, &bytes) {
            Ok(applied) => touched.note_applied(&applied),
            Err(e) => {
                assert!(!e.stops_apply(), "{e}");
                touched.note_index();
            }
        }
        index += 1;
        write_durable(&mut copy, s.durable_writes(&touched));
        assert_eq!(&rebuilt(&copy), s);
        let restored = MetaState::restore(&s.snapshot()).unwrap();
        assert_eq!(&restored, s);
        assert_eq!(restored.digest(), s.digest());
    };
    for i in 0..4 {
        let cmd = replicated(&s, &format!("q{i}"), 3, i == 3);
        step(&mut s, cmd);
    }
    step(&mut s, MetaCommand::DeleteQueue { name: q("q3") });
    step(&mut s, MetaCommand::DeleteQueue { name: q("q3.DLQ") });
    let again = replicated(&s, "q3", 3, false);
    step(&mut s, again);
    assert!(copy.keys().any(|k| k.starts_with(b"md/s/")));
    assert_eq!(s.shards().len(), 3);
    let create = replicated(&s, "x", 3, false);
    assert_eq!(create.level(), 2);
}

#[test]
fn a_state_that_made_a_shard_is_a_snapshot_an_older_release_refuses() {
    // A snapshot starts with its version (field 1, a varint): 1 until a shard is made, as a
    // release without shards wrote it and reads it; 2 from then on, which such a release
    // refuses (it would read the replicated queues as unreplicated).
    let s = cluster_of(&["a", "b", "c"]);
    assert_eq!(s.snapshot()[..2], [0x08, 1]);
    let mut with_shard = s.clone();
    let cmd = replicated(&with_shard, "q", 3, false);
    apply(&mut with_shard, &cmd);
    apply(&mut with_shard, &MetaCommand::DeleteQueue { name: q("q") });
    apply(
        &mut with_shard,
        &MetaCommand::DeleteQueue { name: q("q.DLQ") },
    );
    // No shard left, but one was made: its id stays used, and so does the version.
    assert!(with_shard.shards().is_empty());
    let mut bytes = with_shard.snapshot();
    assert_eq!(bytes[..2], [0x08, 2]);
    assert_eq!(MetaState::restore(&bytes).unwrap(), with_shard);
    bytes[1] = 3;
    assert!(matches!(
        MetaState::restore(&bytes),
        Err(MetaError::UnsupportedVersion { version: 3, .. })
    ));
}

#[test]
fn every_existing_companion_must_be_in_the_shard() {
    let mut s = cluster_of(&["a", "b", "c"]);
    // a.dlq replicated, a.exp not: a queue naming both can live with neither.
    let cmd = replicated(&s, "a.dlq", 3, false);
    apply(&mut s, &cmd);
    let dlq = shard_of(&s, "a.dlq");
    apply(
        &mut s,
        &MetaCommand::CreateQueue {
            name: q("a.exp"),
            settings: pb::QueueConfig::default(),
            owner: n("b"),
        },
    );
    let target = |name: &str| {
        Some(pb::DeadLetterTarget {
            target: Some(pb::dead_letter_target::Target::Queue(name.into())),
        })
    };
    let settings = pb::QueueConfig {
        dead_letter: target("a.dlq"),
        expiry: target("a.exp"),
        ..Default::default()
    };
    let expected = MetaError::CompanionInOtherShard {
        queue: q("a"),
        companion: q("a.exp"),
        shard: None,
    };
    assert_eq!(
        choose_shard(&s, &q("a"), &settings, 3, false, &BTreeSet::new()),
        Err(expected.clone())
    );
    let cmd = MetaCommand::CreateReplicatedQueue {
        name: q("a"),
        settings,
        shard: ShardChoice::Existing(dlq),
    };
    refused(&mut s, &cmd, &expected);
}

#[test]
fn a_queue_of_a_dedicated_shard_is_made_again_where_its_dead_letter_queue_stayed() {
    let mut s = cluster_of(&["a", "b", "c"]);
    let cmd = replicated(&s, "own", 3, true);
    apply(&mut s, &cmd);
    let own = shard_of(&s, "own");
    apply(&mut s, &MetaCommand::DeleteQueue { name: q("own") });
    // Only its dead-letter queue is left in the shard: the queue may come back, nothing else.
    let intruder = MetaCommand::CreateReplicatedQueue {
        name: q("other"),
        settings: pb::QueueConfig::default(),
        shard: ShardChoice::Existing(own),
    };
    refused(&mut s, &intruder, &MetaError::ShardDedicated { shard: own });
    let again = replicated(&s, "own", 3, false);
    apply(&mut s, &again);
    assert_eq!(shard_of(&s, "own"), own);
}

#[test]
fn a_new_shard_leaves_a_node_the_proposer_cannot_reach_last() {
    let mut s = cluster_of(&["a", "b", "c", "d"]);
    let first = MetaCommand::CreateReplicatedQueue {
        name: q("q1"),
        settings: pb::QueueConfig::default(),
        shard: ShardChoice::New {
            replicas: vec![n("a"), n("b"), n("c")],
            dedicated: false,
        },
    };
    apply(&mut s, &first);
    // d leads nothing and holds nothing, but is down: b leads (the first of the reachable
    // nodes leading nothing), a and c (one replica each) follow, d is left out.
    let down: BTreeSet<NodeId> = [n("d")].into();
    let choice = choose_shard(&s, &q("q2"), &pb::QueueConfig::default(), 3, false, &down).unwrap();
    assert_eq!(
        choice,
        ShardChoice::New {
            replicas: vec![n("b"), n("a"), n("c")],
            dedicated: false,
        }
    );
    // With d up, d leads the new shard.
    let choice = choose_shard(
        &s,
        &q("q2"),
        &pb::QueueConfig::default(),
        3,
        false,
        &BTreeSet::new(),
    )
    .unwrap();
    let ShardChoice::New { replicas, .. } = choice else {
        panic!("{choice:?}")
    };
    assert_eq!(replicas[0], n("d"));
}

#[test]
fn the_invariants_catch_a_broken_shard_map() {
    let mut s = cluster_of(&["a", "b", "c"]);
    let cmd = replicated(&s, "q", 3, false);
    apply(&mut s, &cmd);
    let id = shard_of(&s, "q");
    let mut lost = s.clone();
    lost.shards.remove(&id);
    assert!(lost.check_invariants().is_err(), "a queue in no shard");
    let mut miscounted = s.clone();
    miscounted.shards.get_mut(&id).unwrap().queues = 1;
    assert!(miscounted.check_invariants().is_err(), "a wrong count");
    let mut doubled = s.clone();
    doubled.shards.get_mut(&id).unwrap().replicas[1] = n("a");
    assert!(doubled.check_invariants().is_err(), "a node twice");
    let mut reused = s.clone();
    let epoch = reused.queue(&q("q")).unwrap().owner.epoch;
    reused.shards.get_mut(&id).unwrap().epoch = epoch;
    assert!(reused.check_invariants().is_err(), "an epoch given twice");
    let mut beyond = s.clone();
    beyond.next_shard = id.0;
    assert!(
        beyond.check_invariants().is_err(),
        "an id not below the counter"
    );
    // A snapshot of a broken map is refused, not restored.
    assert!(MetaState::restore(&lost.snapshot()).is_err());
}
