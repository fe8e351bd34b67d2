//! Behaviour of one queue, stepping time by hand.

use super::*;
use crate::error::KernelError;
use crate::types::{NewMessage, Priority, QueueName, QueueUid};

const T0: u64 = 1_000_000;

fn queue() -> Queue {
    Queue::new(
        QueueName::new("q").unwrap(),
        QueueUid(7),
        QueueConfig::default(),
    )
}

fn msg(body: &str) -> NewMessage {
    NewMessage {
        body: body.as_bytes().to_vec(),
        persistent: true,
        ..Default::default()
    }
}

fn recv(owner: u64, wait: Wait) -> ReceiveRequest {
    ReceiveRequest {
        owner: Some(SessionId(owner)),
        max_messages: 1,
        wait,
        lease_ms: Some(1_000),
        selector: None,
    }
}

fn send(q: &mut Queue, body: &str, now: u64) -> Effects {
    let (_, fx) = q.send(vec![msg(body)], now).unwrap();
    q.check_invariants();
    fx
}

fn parked(outcome: ReceiveOutcome) -> WaiterId {
    match outcome {
        ReceiveOutcome::Parked(id) => id,
        other => panic!("expected a parked receiver, got {other:?}"),
    }
}

fn delivered(outcome: ReceiveOutcome) -> Vec<Delivery> {
    match outcome {
        ReceiveOutcome::Delivered(d) => d,
        other => panic!("expected deliveries, got {other:?}"),
    }
}

#[test]
fn receive_times_out_exactly_at_the_deadline() {
    let mut q = queue();
    let (out, _) = q
        .receive(recv(1, Wait::from_timeout_ms(Some(5_000), T0).unwrap()), T0)
        .unwrap();
    let id = parked(out);
    assert_eq!(q.next_deadline_ms(), Some(T0 + 5_000));
    assert!(
        q.tick(T0 + 4_999).is_empty(),
        "nothing fires a millisecond early"
    );
    assert_eq!(q.waiter_count(), 1);
    let fx = q.tick(T0 + 5_000);
    assert_eq!(fx.finished_empty, vec![id]);
    assert_eq!(q.waiter_count(), 0);
    assert_eq!(q.next_deadline_ms(), None);
    q.check_invariants();
}

#[test]
fn receive_no_wait_answers_empty_and_parks_nothing() {
    let mut q = queue();
    let (out, fx) = q.receive(recv(1, Wait::NoWait), T0).unwrap();
    assert_eq!(out, ReceiveOutcome::Empty);
    assert!(fx.is_empty());
    assert_eq!(q.waiter_count(), 0);
}

#[test]
fn negative_timeout_is_rejected_and_registers_nothing() {
    assert_eq!(
        Wait::from_timeout_ms(Some(-1), T0),
        Err(KernelError::NegativeTimeout { timeout_ms: -1 })
    );
    assert_eq!(Wait::from_timeout_ms(Some(0), T0), Ok(Wait::NoWait));
    assert_eq!(Wait::from_timeout_ms(None, T0), Ok(Wait::Forever));
}

#[test]
fn cancelled_receive_leaves_no_waiter_and_next_message_goes_to_next_receiver() {
    let mut q = queue();
    let first = parked(q.receive(recv(1, Wait::Forever), T0).unwrap().0);
    let second = parked(q.receive(recv(2, Wait::Forever), T0).unwrap().0);
    assert!(q.cancel_waiter(first));
    assert!(!q.cancel_waiter(first), "a cancelled waiter is gone");
    assert_eq!(q.waiter_count(), 1);
    let fx = send(&mut q, "hello", T0 + 1);
    assert_eq!(fx.handed.len(), 1);
    assert_eq!(
        fx.handed[0].0, second,
        "the message goes to the live receiver at once"
    );
    assert_eq!(q.waiter_count(), 0);
}

#[test]
fn lease_expiry_returns_the_message_with_delivery_count_plus_one() {
    let mut q = queue();
    let _ = send(&mut q, "m", T0);
    let d = delivered(q.receive(recv(1, Wait::NoWait), T0).unwrap().0);
    assert_eq!((d[0].delivery_count, d[0].redelivered()), (1, false));
    assert_eq!(d[0].lease_until_ms, T0 + 1_000);
    assert!(q.tick(T0 + 999).is_empty());
    assert!(matches!(
        q.state_of(d[0].message.seq),
        Some(MessageState::Leased { .. })
    ));
    let _ = q.tick(T0 + 1_000);
    assert_eq!(q.state_of(d[0].message.seq), Some(MessageState::Ready));
    let again = delivered(q.receive(recv(2, Wait::NoWait), T0 + 1_001).unwrap().0);
    assert_eq!(again[0].message.id, d[0].message.id);
    assert_eq!((again[0].delivery_count, again[0].redelivered()), (2, true));
    q.check_invariants();
}

#[test]
fn stale_receipt_never_acknowledges_a_newer_delivery() {
    let mut q = queue();
    let _ = send(&mut q, "m", T0);
    let old = delivered(q.receive(recv(1, Wait::NoWait), T0).unwrap().0).remove(0);
    let new = delivered(q.receive(recv(2, Wait::NoWait), T0 + 1_000).unwrap().0).remove(0);
    let (results, fx) = q.ack(Caller::Backend, &[old.lease_ref()], T0 + 1_001);
    assert_eq!(
        results,
        vec![Err(KernelError::StaleReceipt {
            seq: old.message.seq
        })]
    );
    assert!(fx.persist.is_empty());
    assert!(matches!(
        q.state_of(new.message.seq),
        Some(MessageState::Leased { .. })
    ));
    let (results, fx) = q.ack(Caller::Backend, &[new.lease_ref()], T0 + 1_002);
    assert_eq!(results, vec![Ok(())]);
    assert_eq!(
        fx.persist,
        vec![PersistOp::DeleteMessage(new.message.clone())]
    );
    assert_eq!(q.state_of(new.message.seq), None);
    q.check_invariants();
}

#[test]
fn closing_a_session_returns_its_messages_at_once_and_ends_its_waiters() {
    let mut q = queue();
    let _ = send(&mut q, "a", T0);
    let d = delivered(q.receive(recv(1, Wait::NoWait), T0).unwrap().0);
    let w = parked(q.receive(recv(1, Wait::Forever), T0).unwrap().0);
    let other = parked(q.receive(recv(2, Wait::Forever), T0).unwrap().0);
    let (released, fx) = q.release_session(SessionId(1), T0 + 10);
    assert_eq!(released, 1);
    assert_eq!(fx.finished_empty, vec![w]);
    assert_eq!(
        fx.handed.len(),
        1,
        "the released message goes to the other session's receiver"
    );
    assert_eq!(fx.handed[0].0, other);
    assert_eq!(fx.handed[0].1[0].message.id, d[0].message.id);
    assert!(fx.handed[0].1[0].redelivered());
    q.check_invariants();
}

#[test]
fn undeliverable_hand_off_returns_the_message_without_counting_it() {
    let mut q = queue();
    let w = parked(q.receive(recv(1, Wait::Forever), T0).unwrap().0);
    let fx = send(&mut q, "m", T0);
    let (id, deliveries) = &fx.handed[0];
    assert_eq!(*id, w);
    let leases: Vec<_> = deliveries.iter().map(Delivery::lease_ref).collect();
    let (_, fx) = q.return_undelivered(Caller::Backend, &leases, T0 + 1);
    assert_eq!(
        fx.persist,
        vec![PersistOp::SetDeliveryCount {
            seq: leases[0].seq,
            count: 0
        }]
    );
    let d = delivered(q.receive(recv(2, Wait::NoWait), T0 + 2).unwrap().0);
    assert_eq!((d[0].delivery_count, d[0].redelivered()), (1, false));
    q.check_invariants();
}

#[test]
fn higher_priority_first_then_fifo() {
    let mut q = queue();
    let mut send_p = |body: &str, p: u32| {
        let m = NewMessage {
            priority: Priority::new(p).unwrap(),
            ..msg(body)
        };
        let _ = q.send(vec![m], T0).unwrap();
    };
    send_p("low-1", 1);
    send_p("high-1", 9);
    send_p("low-2", 1);
    send_p("high-2", 9);
    let req = ReceiveRequest {
        max_messages: 4,
        ..recv(1, Wait::NoWait)
    };
    let bodies: Vec<_> = delivered(q.receive(req, T0).unwrap().0)
        .iter()
        .map(|d| String::from_utf8(d.message.body.to_vec()).unwrap())
        .collect();
    assert_eq!(bodies, ["high-1", "high-2", "low-1", "low-2"]);
}

#[test]
fn delayed_message_is_invisible_until_its_time() {
    let mut q = queue();
    let m = NewMessage {
        delivery_delay_ms: Some(500),
        ..msg("later")
    };
    let _ = q.send(vec![m], T0).unwrap();
    let w = parked(q.receive(recv(1, Wait::Forever), T0).unwrap().0);
    assert!(q.tick(T0 + 499).is_empty());
    let fx = q.tick(T0 + 500);
    assert_eq!(fx.handed[0].0, w);
    q.check_invariants();
}

#[test]
fn expired_message_is_never_delivered() {
    let mut q = queue();
    let m = NewMessage {
        time_to_live_ms: Some(100),
        ..msg("old")
    };
    let (_, _) = q.send(vec![m], T0).unwrap();
    let (out, fx) = q.receive(recv(1, Wait::NoWait), T0 + 100).unwrap();
    assert_eq!(out, ReceiveOutcome::Empty);
    assert_eq!(
        fx.dead_letters.len(),
        1,
        "the expired message is dead-lettered"
    );
    assert_eq!(fx.dead_letters[0].reason, DeadLetterReason::Expired);
    assert!(
        fx.dead_letters[0].delete.is_some(),
        "its delete travels with it"
    );
    assert_eq!(q.stats().expired_total, 1);
    q.check_invariants();
}

#[test]
fn message_over_the_size_limit_is_refused_and_nothing_is_added() {
    let mut q = queue();
    let big = NewMessage {
        body: vec![0; 1024 * 1024 + 1],
        ..msg("")
    };
    let err = q.send(vec![msg("ok"), big], T0).unwrap_err();
    assert!(matches!(err, KernelError::MessageTooLarge { index: 1, .. }));
    assert_eq!(q.stats().ready, 0);
}

#[test]
fn message_ids_are_never_reused_after_recovery() {
    let mut q = queue();
    let (ids, fx) = q
        .send(
            vec![NewMessage {
                persistent: false,
                ..msg("a")
            }],
            T0,
        )
        .unwrap();
    let until = fx.persist.iter().find_map(|op| match op {
        PersistOp::ReserveSeq { until } => Some(*until),
        _ => None,
    });
    let until = until.expect("the first send reserves sequence numbers durably");
    let mut r = Queue::recover(
        q.name().clone(),
        q.uid(),
        QueueConfig::default(),
        until,
        vec![],
        vec![],
        T0,
    );
    let (ids2, fx2) = r.send(vec![msg("b")], T0).unwrap();
    assert_ne!(ids, ids2);
    assert!(fx2
        .persist
        .iter()
        .any(|op| matches!(op, PersistOp::ReserveSeq { .. })));
    r.check_invariants();
}

/// `q` as a restart finds it: the message `fx` (a send's effects) stored, delivered `count` times.
fn restarted(q: &Queue, fx: &Effects, count: u32) -> Queue {
    let PersistOp::PutMessage(m) = &fx.persist[1] else {
        panic!("{:?}", fx.persist)
    };
    let rec = vec![RecoveredMessage {
        message: (**m).clone(),
        delivery_count: count,
        mark: None,
    }];
    Queue::recover(
        q.name().clone(),
        q.uid(),
        QueueConfig::default(),
        Seq(1),
        rec,
        vec![],
        T0,
    )
}

#[test]
fn recovered_messages_keep_their_delivery_count() {
    let mut q = queue();
    let (_, fx) = q.send(vec![msg("a")], T0).unwrap();
    let mut r = restarted(&q, &fx, 3);
    r.check_invariants();
    let d = delivered(r.receive(recv(1, Wait::NoWait), T0).unwrap().0);
    assert_eq!((d[0].delivery_count, d[0].redelivered()), (4, true));
}

#[test]
fn nack_with_delay_schedules_the_message() {
    let mut q = queue();
    let _ = send(&mut q, "m", T0);
    let d = delivered(q.receive(recv(1, Wait::NoWait), T0).unwrap().0);
    let (res, _) = q.nack(
        Caller::Backend,
        &[d[0].lease_ref()],
        Some(200),
        false,
        T0 + 1,
    );
    assert_eq!(res, vec![Ok(())]);
    assert_eq!(
        q.state_of(d[0].message.seq),
        Some(MessageState::Scheduled { until_ms: T0 + 201 })
    );
    let _ = q.tick(T0 + 201);
    assert_eq!(q.state_of(d[0].message.seq), Some(MessageState::Ready));
    q.check_invariants();
}

#[test]
fn extend_lease_keeps_the_message_leased() {
    let mut q = queue();
    let _ = send(&mut q, "m", T0);
    let d = delivered(q.receive(recv(1, Wait::NoWait), T0).unwrap().0);
    let (res, _) = q
        .extend_lease(Caller::Backend, &[d[0].lease_ref()], Some(5_000), T0 + 900)
        .unwrap();
    assert_eq!(res, vec![Ok(T0 + 5_900)]);
    let _ = q.tick(T0 + 1_000);
    assert!(matches!(
        q.state_of(d[0].message.seq),
        Some(MessageState::Leased { .. })
    ));
    q.check_invariants();
}

#[test]
fn receive_limits_are_checked_before_anything_happens() {
    let mut q = queue();
    let too_many = ReceiveRequest {
        max_messages: 1_001,
        ..recv(1, Wait::Forever)
    };
    assert!(matches!(
        q.receive(too_many, T0),
        Err(KernelError::OverLimit { .. })
    ));
    let zero = ReceiveRequest {
        max_messages: 0,
        ..recv(1, Wait::Forever)
    };
    assert!(q.receive(zero, T0).is_err());
    let no_lease = ReceiveRequest {
        lease_ms: Some(0),
        ..recv(1, Wait::Forever)
    };
    assert!(q.receive(no_lease, T0).is_err());
    assert_eq!(q.waiter_count(), 0);
}

#[test]
fn recover_returns_the_sessions_messages_but_keeps_its_receivers_waiting() {
    let mut q = queue();
    let _ = send(&mut q, "a", T0);
    let _ = send(&mut q, "b", T0);
    let req = ReceiveRequest {
        max_messages: 2,
        ..recv(1, Wait::NoWait)
    };
    let d = delivered(q.receive(req, T0).unwrap().0);
    assert_eq!(d.len(), 2);
    let (released, fx) = q.recover_session(SessionId(1), T0 + 1);
    assert_eq!(released, 2);
    assert!(fx.finished_empty.is_empty());
    let again = delivered(
        q.receive(
            ReceiveRequest {
                max_messages: 2,
                ..recv(1, Wait::NoWait)
            },
            T0 + 2,
        )
        .unwrap()
        .0,
    );
    assert!(again.iter().all(|d| d.redelivered()));
    q.check_invariants();
}

#[test]
fn a_receipt_from_before_a_restart_does_not_match_the_redelivery() {
    // Lease ids start again after a restart; the delivery count (persisted) tells the two
    // deliveries apart.
    let mut q = queue();
    let (_, fx) = q.send(vec![msg("a")], T0).unwrap();
    let old = delivered(q.receive(recv(1, Wait::NoWait), T0).unwrap().0).remove(0);
    let mut r = restarted(&q, &fx, 1);
    let new = delivered(r.receive(recv(2, Wait::NoWait), T0).unwrap().0).remove(0);
    assert_eq!(
        (old.lease, old.message.seq),
        (new.lease, new.message.seq),
        "same lease id and seq"
    );
    let (res, _) = r.ack(Caller::Backend, &[old.lease_ref()], T0 + 1);
    assert!(
        res[0].is_err(),
        "the stale receipt must not acknowledge the new delivery"
    );
    let (res, _) = r.ack(Caller::Backend, &[new.lease_ref()], T0 + 1);
    assert!(res[0].is_ok());
}

#[test]
fn a_receipt_from_a_deleted_queue_does_not_match_its_successor() {
    let mut q1 = queue();
    let _ = send(&mut q1, "a", T0);
    let old = delivered(q1.receive(recv(1, Wait::NoWait), T0).unwrap().0).remove(0);
    let mut q2 = Queue::new(
        QueueName::new("q").unwrap(),
        QueueUid(8),
        QueueConfig::default(),
    );
    let _ = send(&mut q2, "b", T0);
    let new = delivered(q2.receive(recv(1, Wait::NoWait), T0).unwrap().0).remove(0);
    assert_eq!((old.lease, old.message.seq), (new.lease, new.message.seq));
    let (res, _) = q2.ack(Caller::Backend, &[old.lease_ref()], T0 + 1);
    assert!(res[0].is_err());
}

#[test]
fn a_receiver_whose_deadline_came_does_not_get_a_message_ready_at_that_moment() {
    let mut q = queue();
    let m = NewMessage {
        delivery_delay_ms: Some(100),
        ..msg("m")
    };
    let _ = q.send(vec![m], T0).unwrap();
    let w = parked(q.receive(recv(1, Wait::Until(T0 + 100)), T0).unwrap().0);
    let fx = q.tick(T0 + 100);
    assert_eq!(fx.finished_empty, vec![w]);
    assert!(fx.handed.is_empty());
    assert_eq!(q.stats().ready, 1);
}

fn selected(owner: u64, wait: Wait, selector: &str) -> ReceiveRequest {
    let s = crate::selector::Selector::parse(selector, &crate::selector::SelectorLimits::default())
        .unwrap();
    ReceiveRequest {
        selector: Some(std::sync::Arc::new(s)),
        ..recv(owner, wait)
    }
}

fn with_color(body: &str, color: &str) -> NewMessage {
    let mut m = msg(body);
    m.properties.insert(
        "color".into(),
        crate::types::PropertyValue::String(color.into()),
    );
    m
}

#[test]
fn a_selective_receiver_skips_other_messages_without_disturbing_their_order() {
    let mut q = queue();
    for (body, color) in [("r1", "red"), ("b1", "blue"), ("r2", "red"), ("b2", "blue")] {
        let _ = q.send(vec![with_color(body, color)], T0).unwrap();
    }
    let blue = ReceiveRequest {
        max_messages: 5,
        ..selected(1, Wait::NoWait, "color = 'blue'")
    };
    let got = delivered(q.receive(blue, T0).unwrap().0);
    let bodies: Vec<_> = got.iter().map(|d| d.message.body.to_vec()).collect();
    assert_eq!(bodies, [b"b1".to_vec(), b"b2".to_vec()]);
    let rest = delivered(
        q.receive(
            ReceiveRequest {
                max_messages: 5,
                ..recv(2, Wait::NoWait)
            },
            T0,
        )
        .unwrap()
        .0,
    );
    let bodies: Vec<_> = rest.iter().map(|d| d.message.body.to_vec()).collect();
    assert_eq!(
        bodies,
        [b"r1".to_vec(), b"r2".to_vec()],
        "the others kept their order"
    );
    q.check_invariants();
}

#[test]
fn a_parked_selective_receiver_does_not_hold_up_the_next_one() {
    let mut q = queue();
    let picky = parked(
        q.receive(selected(1, Wait::Forever, "color = 'green'"), T0)
            .unwrap()
            .0,
    );
    let any = parked(q.receive(recv(2, Wait::Forever), T0).unwrap().0);
    let fx = q.send(vec![with_color("x", "red")], T0).unwrap().1;
    assert_eq!(fx.handed.len(), 1);
    assert_eq!(fx.handed[0].0, any);
    assert_eq!(q.waiter_count(), 1, "the picky receiver still waits");
    let fx = q.send(vec![with_color("y", "green")], T0).unwrap().1;
    assert_eq!(fx.handed[0].0, picky);
    q.check_invariants();
}

#[test]
fn selectors_see_the_delivery_count_the_message_would_have() {
    let mut q = queue();
    let _ = send(&mut q, "m", T0);
    let first = selected(1, Wait::NoWait, "JMSXDeliveryCount > 1");
    assert_eq!(
        q.receive(first.clone(), T0).unwrap().0,
        ReceiveOutcome::Empty
    );
    let d = delivered(q.receive(recv(1, Wait::NoWait), T0).unwrap().0);
    let _ = q.nack(Caller::Backend, &[d[0].lease_ref()], None, false, T0 + 1);
    let again = delivered(q.receive(first, T0 + 2).unwrap().0);
    assert_eq!(again[0].delivery_count, 2);
    q.check_invariants();
}
