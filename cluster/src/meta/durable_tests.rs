//! The metadata's durable copy: written as deltas, it rebuilds the state after every command;
//! a damaged copy is an error.

#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;

use ferry_proto::pb;

use super::tests::{add, cluster, create, n, new_node, q, CLUSTER};
use super::*;

/// Applies `writes` to `copy` as the shell's store would.
pub(super) fn write_durable(copy: &mut BTreeMap<Vec<u8>, Vec<u8>>, writes: Vec<DurableWrite>) {
    for w in writes {
        match w {
            DurableWrite::Clear => copy.clear(),
            DurableWrite::Put { key, value } => {
                assert!(key.starts_with(DURABLE_PREFIX) && key.as_slice() < DURABLE_END);
                copy.insert(key, value);
            }
            DurableWrite::Delete { key } => {
                copy.remove(&key);
            }
        }
    }
}

pub(super) fn rebuilt(copy: &BTreeMap<Vec<u8>, Vec<u8>>) -> MetaState {
    let items: Vec<(Vec<u8>, Vec<u8>)> = copy.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
    MetaState::from_durable(&items).unwrap().unwrap()
}

/// The durable copy written as deltas (what each applied command's event names, and the
/// header) rebuilds exactly the state after every command of every kind, refused ones too; a
/// lone queue created writes that queue, its dead-letter queue and the header, nothing more.
#[test]
fn the_durable_copy_written_as_deltas_rebuilds_the_state_after_every_command() {
    let mut s = MetaState::new();
    let mut copy = BTreeMap::new();
    assert_eq!(MetaState::from_durable(&[]).unwrap(), None);
    let expiring = pb::QueueConfig {
        expiry: Some(pb::DeadLetterTarget {
            target: Some(pb::dead_letter_target::Target::Queue("expired".into())),
        }),
        ..Default::default()
    };
    let commands = vec![
        MetaCommand::Bootstrap {
            cluster_id: CLUSTER,
            nodes: vec![new_node("a"), new_node("b"), new_node("c")],
        },
        create("orders", "a"),
        create("orders", "b"), // refused: exists
        add("d", true),
        MetaCommand::PromoteNode { id: n("d") },
        MetaCommand::CreateQueue {
            name: q("pay"),
            settings: expiring.clone(),
            owner: n("d"),
        },
        MetaCommand::UpdateQueue {
            name: q("orders"),
            settings: expiring,
            expected: None,
        },
        MetaCommand::DeleteQueue { name: q("pay") },
        MetaCommand::DeleteQueue { name: q("nothing") }, // refused: not found
        add("e", true),
        MetaCommand::RemoveNode { id: n("e") },
    ];
    for (command, index) in commands.iter().zip(2u64..) {
        let mut touched = Touched::default();
        let bytes = command.encode_request(Some(RequestId(u128::from(index))));
        match s.apply_entry(index, &bytes) {
            Ok(applied) => touched.note_applied(&applied),
            Err(_) => touched.note_index(),
        }
        write_durable(&mut copy, s.durable_writes(&touched));
        assert_eq!(rebuilt(&copy), s, "after {command:?}");
    }
    assert!(copy.keys().any(|k| k.starts_with(b"md/r/")));
    assert!(s.queue(&q("orders")).is_some() && s.queue(&q("pay")).is_none());
    assert!(s.node(&n("e")).is_some_and(|e| !e.is_active()));
    // A lone create writes the header, the queue and its dead-letter queue.
    let mut fresh = cluster();
    let mut touched = Touched::default();
    touched.note(&fresh.apply(3, &create("lone", "a")).unwrap());
    assert_eq!(fresh.durable_writes(&touched).len(), 3);
    // Everything again (a snapshot installed): the copy is cleared and rewritten whole.
    let mut touched = Touched::default();
    touched.everything();
    copy.insert(b"md/q/stale".to_vec(), b"junk".to_vec());
    write_durable(&mut copy, s.durable_writes(&touched));
    assert_eq!(rebuilt(&copy), s);
    assert!(Touched::default().is_empty());
    assert!(s.durable_writes(&Touched::default()).is_empty());
}

#[test]
fn a_damaged_durable_copy_is_an_error_not_a_state() {
    let s = cluster();
    let mut touched = Touched::default();
    touched.everything();
    let mut copy = BTreeMap::new();
    write_durable(&mut copy, s.durable_writes(&touched));
    let mut damaged = copy.clone();
    damaged.insert(b"md/n/a".to_vec(), vec![0xff, 0xff, 0xff]);
    let items: Vec<_> = damaged.into_iter().collect();
    assert!(MetaState::from_durable(&items).is_err());
    let mut request = copy.clone();
    request.insert(b"md/r/not-hex".to_vec(), 3u64.to_be_bytes().to_vec());
    let items: Vec<_> = request.into_iter().collect();
    assert!(MetaState::from_durable(&items).is_err());
    let mut unknown = copy;
    unknown.insert(b"md/zzz".to_vec(), vec![]);
    let items: Vec<_> = unknown.into_iter().collect();
    assert!(MetaState::from_durable(&items).is_err());
}
