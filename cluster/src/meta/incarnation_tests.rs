//! Unit tests of recording the data directory each node runs on
//! ([`MetaCommand::NoteIncarnation`]): recorded once, the same again changes nothing, another
//! one is refused; kept by the codec, snapshots and the durable copy.

#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;

use super::shard_tests::cluster_of;
use super::tests::{n, next, rebuilt, refused, write_durable};
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
