//! The checker bites: a synthetic history with each kind of anomaly is judged invalid, for that
//! kind and no other; a clean one is judged valid. Until the back-end has planted-bug features,
//! these are what prove the checker can fail.

#![allow(clippy::unwrap_used)]

use ferry_integration_tests::chaos::checker::{check, AnomalyKind, CheckOptions, DeadLetterRule};
use ferry_integration_tests::chaos::history::{Outcome, Value};
use ferry_integration_tests::chaos::synthetic::Synthetic;

const Q: &str = "q";

fn v(producer: u32, seq: u64) -> Value {
    Value { producer, seq }
}

fn unknown() -> Option<Outcome> {
    Some(Outcome::Unknown {
        error: "timed out".into(),
    })
}

/// Asserts the history has exactly `n` anomalies of `kind` and none of any other kind.
fn only(h: &Synthetic, options: &CheckOptions, kind: AnomalyKind, n: u64) {
    let verdict = check(&h.history(), options);
    assert!(!verdict.is_valid(), "{kind:?} went unnoticed: {verdict:#?}");
    assert_eq!(verdict.count(kind), n, "{verdict:#?}");
    assert_eq!(
        verdict.anomaly_counts.len(),
        1,
        "only {kind:?} expected: {verdict:#?}"
    );
}

#[test]
fn a_clean_history_is_valid_and_counted() {
    let mut h = Synthetic::new();
    h.send_ok(Q, v(0, 0))
        .send_ok(Q, v(0, 1))
        .send_ok(Q, v(1, 0));
    // An unknown send that made it (recovered) and one that did not.
    h.send(Q, v(1, 1), unknown()).send(Q, v(1, 2), None);
    h.send(
        Q,
        v(1, 3),
        Some(Outcome::Fail {
            error: "refused".into(),
        }),
    );
    h.consume(Q, v(0, 0))
        .consume(Q, v(0, 1))
        .consume(Q, v(1, 1));
    // Delivered, the ack's outcome unknown, redelivered flagged, acknowledged.
    let d = h.deliver(Q, Some(v(1, 0)), "ID:p1-0", 1, false);
    h.ack(&[d], unknown());
    let d = h.deliver(Q, Some(v(1, 0)), "ID:p1-0", 2, true);
    h.ack(&[d], Some(Outcome::Ok));
    let verdict = check(&h.history(), &CheckOptions::default());
    assert!(verdict.is_valid(), "{verdict:#?}");
    assert_eq!(
        (
            verdict.attempted,
            verdict.confirmed,
            verdict.unknown,
            verdict.failed,
            verdict.received,
            verdict.recovered
        ),
        (6, 3, 2, 1, 4, 1)
    );
    assert_eq!(
        (verdict.duplicated_flagged, verdict.duplicated_unflagged),
        (1, 0)
    );
}

#[test]
fn a_confirmed_value_never_delivered_is_lost() {
    let mut h = Synthetic::new();
    h.send_ok(Q, v(0, 0)).send_ok(Q, v(0, 1));
    h.consume(Q, v(0, 0));
    only(&h, &CheckOptions::default(), AnomalyKind::Lost, 1);
    assert_eq!(check(&h.history(), &CheckOptions::default()).lost, 1);
}

#[test]
fn a_value_never_sent_is_unexpected() {
    let mut h = Synthetic::new();
    h.send_ok(Q, v(0, 0)).consume(Q, v(0, 0));
    let d = h.deliver(Q, Some(v(7, 7)), "ID:ghost", 1, false);
    h.ack(&[d], Some(Outcome::Ok));
    let d = h.deliver(Q, None, "ID:no-value", 1, false);
    h.ack(&[d], Some(Outcome::Ok));
    only(&h, &CheckOptions::default(), AnomalyKind::Unexpected, 2);
}

#[test]
fn a_second_delivery_that_looks_new_is_an_unflagged_duplicate() {
    // The delivery count was not kept: delivered twice, both times as new.
    let mut h = Synthetic::new();
    h.send_ok(Q, v(0, 0));
    let first = h.deliver(Q, Some(v(0, 0)), "ID:p0-0", 1, false);
    h.ack(&[first], unknown());
    let again = h.deliver(Q, Some(v(0, 0)), "ID:p0-0", 1, false);
    h.ack(&[again], Some(Outcome::Ok));
    only(
        &h,
        &CheckOptions::default(),
        AnomalyKind::UnflaggedDuplicate,
        1,
    );
    let verdict = check(&h.history(), &CheckOptions::default());
    assert_eq!(
        (verdict.duplicated_flagged, verdict.duplicated_unflagged),
        (0, 1)
    );
}

#[test]
fn a_value_stored_twice_is_an_unflagged_duplicate() {
    // A retry with the same dedup id stored a second copy.
    let mut h = Synthetic::new();
    h.send(Q, v(0, 0), unknown()).send_ok(Q, v(0, 0));
    h.consume(Q, v(0, 0));
    let copy = h.deliver(Q, Some(v(0, 0)), "ID:copy", 1, false);
    h.ack(&[copy], unknown());
    only(
        &h,
        &CheckOptions::default(),
        AnomalyKind::UnflaggedDuplicate,
        1,
    );
    // Both copies acknowledged with success: consumed twice, too.
    h.ack(&[copy], Some(Outcome::Ok));
    let verdict = check(&h.history(), &CheckOptions::default());
    assert_eq!(verdict.count(AnomalyKind::AckedTwice), 1, "{verdict:#?}");
}

#[test]
fn a_flagged_redelivery_is_a_duplicate_but_no_anomaly() {
    let mut h = Synthetic::new();
    h.send_ok(Q, v(0, 0));
    // The first delivery went to a consumer that died: only the flagged one is seen... twice.
    let a = h.deliver(Q, Some(v(0, 0)), "ID:p0-0", 2, true);
    let b = h.deliver(Q, Some(v(0, 0)), "ID:p0-0", 3, true);
    h.ack(
        &[a],
        Some(Outcome::Fail {
            error: "stale".into(),
        }),
    );
    h.ack(&[b], Some(Outcome::Ok));
    let verdict = check(&h.history(), &CheckOptions::default());
    assert!(verdict.is_valid(), "{verdict:#?}");
    assert_eq!(
        (verdict.duplicated_flagged, verdict.duplicated_unflagged),
        (1, 0)
    );
}

#[test]
fn a_delivery_never_acknowledged_is_stranded() {
    let mut h = Synthetic::new();
    h.send_ok(Q, v(0, 0));
    let d = h.deliver(Q, Some(v(0, 0)), "ID:p0-0", 1, false);
    h.ack(
        &[d],
        Some(Outcome::Fail {
            error: "stale".into(),
        }),
    );
    only(&h, &CheckOptions::default(), AnomalyKind::Stranded, 1);
}

#[test]
fn two_successful_acks_of_one_value_are_reported() {
    let mut h = Synthetic::new();
    h.send_ok(Q, v(0, 0));
    let a = h.deliver(Q, Some(v(0, 0)), "ID:p0-0", 1, false);
    let b = h.deliver(Q, Some(v(0, 0)), "ID:p0-0", 2, true);
    h.ack(&[a], Some(Outcome::Ok)).ack(&[b], Some(Outcome::Ok));
    only(&h, &CheckOptions::default(), AnomalyKind::AckedTwice, 1);
}

#[test]
fn a_delivery_requested_after_a_successful_ack_is_reported() {
    let mut h = Synthetic::new();
    h.send_ok(Q, v(0, 0));
    let a = h.deliver(Q, Some(v(0, 0)), "ID:p0-0", 1, false);
    h.ack(&[a], Some(Outcome::Ok));
    // Delivered again after the ack was confirmed; its own ack failed, so not acked twice.
    let b = h.deliver(Q, Some(v(0, 0)), "ID:p0-0", 2, true);
    h.ack(
        &[b],
        Some(Outcome::Fail {
            error: "stale".into(),
        }),
    );
    only(
        &h,
        &CheckOptions::default(),
        AnomalyKind::DeliveredAfterAck,
        1,
    );
}

#[test]
fn a_send_that_failed_for_sure_and_was_delivered_is_reported() {
    let mut h = Synthetic::new();
    h.send(
        Q,
        v(0, 0),
        Some(Outcome::Fail {
            error: "NOT_FOUND".into(),
        }),
    );
    h.consume(Q, v(0, 0));
    only(
        &h,
        &CheckOptions::default(),
        AnomalyKind::FailedButReceived,
        1,
    );
}

#[test]
fn first_deliveries_out_of_producer_order_are_reported_where_order_is_promised() {
    let mut h = Synthetic::new();
    for seq in 0..4 {
        h.send_ok(Q, v(0, seq));
    }
    h.consume(Q, v(0, 0)).consume(Q, v(0, 2));
    h.consume(Q, v(0, 1)).consume(Q, v(0, 3));
    let ordered = CheckOptions {
        ordered_queues: vec![Q.into()],
        ..CheckOptions::default()
    };
    only(&h, &ordered, AnomalyKind::OutOfOrder, 1);
    // Where no order is promised the same history is clean.
    assert!(check(&h.history(), &CheckOptions::default()).is_valid());
}

#[test]
fn a_redelivery_or_a_retried_send_out_of_order_is_not_an_order_violation() {
    let mut h = Synthetic::new();
    h.send_ok(Q, v(0, 0));
    h.send(Q, v(0, 1), unknown()).send_ok(Q, v(0, 1));
    h.send_ok(Q, v(0, 2));
    let first = h.deliver(Q, Some(v(0, 0)), "ID:p0-0", 1, false);
    h.ack(&[first], unknown());
    h.consume(Q, v(0, 2)).consume(Q, v(0, 1));
    let again = h.deliver(Q, Some(v(0, 0)), "ID:p0-0", 2, true);
    h.ack(&[again], Some(Outcome::Ok));
    let ordered = CheckOptions {
        ordered_queues: vec![Q.into()],
        ..CheckOptions::default()
    };
    let verdict = check(&h.history(), &ordered);
    assert!(verdict.is_valid(), "{verdict:#?}");
}

fn poison_options(exact: bool) -> CheckOptions {
    CheckOptions {
        dead_letter_queues: vec!["q.DLQ".into()],
        dead_letter_rule: Some(DeadLetterRule {
            max_deliveries: 3,
            exact,
        }),
        ..CheckOptions::default()
    }
}

/// `v` delivered from the queue with these counts, then from the DLQ with `dlq_count`.
fn poisoned(h: &mut Synthetic, value: Value, counts: &[u32], dlq_count: Option<i64>) {
    for &c in counts {
        h.deliver(Q, Some(value), &Synthetic::message_id(value), c, c > 1);
    }
    if let Some(n) = dlq_count {
        let d = h.deliver_dead_letter("q.DLQ", value, "max-deliveries", n);
        h.ack(&[d], Some(Outcome::Ok));
    }
}

#[test]
fn poison_messages_dead_lettered_after_exactly_max_deliveries_are_valid() {
    let mut h = Synthetic::new();
    h.send_ok(Q, v(0, 0)).send_ok(Q, v(0, 1));
    poisoned(&mut h, v(0, 0), &[1, 2, 3], Some(3));
    poisoned(&mut h, v(0, 1), &[1, 2, 3], Some(3));
    let verdict = check(&h.history(), &poison_options(true));
    assert!(verdict.is_valid(), "{verdict:#?}");
    assert_eq!(
        verdict.duplicated_unflagged, 0,
        "a dead letter is no duplicate"
    );
}

#[test]
fn a_poison_message_dead_lettered_early_late_twice_or_never_is_reported() {
    for (counts, dlq, why) in [
        (&[1, 2][..], Some(3), "dead-lettered after 2 deliveries"),
        (&[1, 2, 3, 4][..], Some(3), "delivered a 4th time"),
        (&[1, 2, 3][..], Some(4), "wrong FerryDeliveryCount"),
        (&[1, 2, 3][..], None, "never dead-lettered"),
        (&[1, 2, 2, 3][..], Some(3), "a delivery count repeated"),
    ] {
        let mut h = Synthetic::new();
        h.send_ok(Q, v(0, 0));
        poisoned(&mut h, v(0, 0), counts, dlq);
        if dlq.is_none() {
            // Acknowledged from the queue instead, so only the dead-letter rule is broken.
            let d = h.deliver(Q, Some(v(0, 0)), "ID:p0-0", 4, true);
            h.ack(&[d], Some(Outcome::Ok));
        }
        let verdict = check(&h.history(), &poison_options(true));
        assert!(
            verdict.count(AnomalyKind::DeadLetter) > 0,
            "{why} went unnoticed: {verdict:#?}"
        );
    }
    // Dead-lettered twice: two messages in the DLQ for one value.
    let mut h = Synthetic::new();
    h.send_ok(Q, v(0, 0));
    poisoned(&mut h, v(0, 0), &[1, 2, 3], Some(3));
    let d = h.deliver("q.DLQ", Some(v(0, 0)), "ID:another", 1, false);
    h.ack(&[d], Some(Outcome::Ok));
    let verdict = check(&h.history(), &poison_options(false));
    assert!(verdict.count(AnomalyKind::DeadLetter) > 0, "{verdict:#?}");
}

#[test]
fn a_history_survives_a_round_trip_through_json_lines() {
    let mut h = Synthetic::new();
    h.send_ok(Q, v(0, 0))
        .consume(Q, v(0, 0))
        .send_ok(Q, v(0, 1));
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("history.jsonl");
    h.history().write_jsonl(&path).unwrap();
    let back = ferry_integration_tests::chaos::history::History::read_jsonl(&path).unwrap();
    assert_eq!(back.events(), h.history().events());
    assert_eq!(check(&back, &CheckOptions::default()).lost, 1);
}

/// The failover time of a shard leader's kill runs from the kill to the first send on one of the
/// shard's queues that was invoked after the kill and confirmed: a send the dying leader
/// confirmed (invoked before the kill, its answer read after) and a send to another shard's
/// queue do not end it.
#[test]
fn a_failover_time_runs_from_the_kill_to_the_first_send_on_its_shard_invoked_after_it() {
    use ferry_integration_tests::chaos::failover::Failovers;
    use ferry_integration_tests::chaos::history::{Event, Fault, Op};
    let at = |t_us: u64, op: Op| Event {
        t_us,
        process: "p".into(),
        node: "n2".into(),
        op,
    };
    let invoke = |op: u64, queue: &str| Op::SendInvoke {
        op,
        queue: queue.into(),
        producer: 0,
        first_seq: op,
        count: 1,
        attempt: 1,
    };
    let ok = |op: u64| Op::SendEnd {
        op,
        outcome: Outcome::Ok,
        message_ids: vec![],
    };
    let kill = |queue: &str, shard: u64| {
        Op::Fault(Fault::KillShardLeader {
            queue: queue.into(),
            shard,
            queues: vec![queue.into(), format!("{queue}.DLQ")],
        })
    };
    let events = vec![
        at(1_000, invoke(1, "a")),
        at(2_000, kill("a", 1)),
        // Invoked before the kill: the old leader's answer.
        at(2_500, ok(1)),
        at(3_000, invoke(2, "b")),
        at(3_500, ok(2)),
        at(4_000, invoke(3, "a")),
        at(1_502_000, ok(3)),
        // A second kill, of shard 2, after which nothing on it is confirmed.
        at(2_000_000, kill("b", 2)),
        at(2_000_100, invoke(4, "a")),
        at(2_000_200, ok(4)),
    ];
    let f = Failovers::of(&events).unwrap();
    assert_eq!(f.kills.len(), 2);
    assert_eq!(f.kills[0].failover_ms, Some(1_500.0));
    assert_eq!(f.kills[1].failover_ms, None);
    assert_eq!((f.count, f.not_recovered), (1, 1));
    assert_eq!((f.p50_ms, f.p99_ms, f.max_ms), (1_500.0, 1_500.0, 1_500.0));
    assert!(!f.target_met(), "a shard that never took a send again");
    assert!(Failovers::of(&events[..2]).is_some_and(|f| f.count == 0));
    assert!(Failovers::of(&events[2..7]).is_none(), "no kill, no figure");
}
