//! The JMS rules beyond plain delivery, stepping time by hand: the redelivery policy, dead
//! letters, expiry in every state, transacted sessions, message groups and producer dedup.

use std::sync::Arc;

use super::*;
use crate::error::KernelError;
use crate::types::{NewMessage, QueueName, QueueUid};

const T0: u64 = 1_000_000;

fn queue_with(config: QueueConfig) -> Queue {
    let mut q = Queue::new(QueueName::new("orders").unwrap(), QueueUid(9), config);
    q.seed_random(42);
    q
}

fn queue() -> Queue {
    queue_with(QueueConfig::default())
}

fn msg(body: &str) -> NewMessage {
    NewMessage {
        body: body.as_bytes().to_vec(),
        persistent: true,
        ..Default::default()
    }
}

fn grouped(body: &str, group: &str) -> NewMessage {
    NewMessage {
        group_id: Some(group.into()),
        ..msg(body)
    }
}

fn req(owner: u64, max: u32, wait: Wait) -> ReceiveRequest {
    ReceiveRequest {
        owner: Some(SessionId(owner)),
        max_messages: max,
        wait,
        lease_ms: Some(60_000),
        selector: None,
    }
}

fn take(q: &mut Queue, owner: u64, max: u32, now: u64) -> Vec<Delivery> {
    let (out, _) = q.receive(req(owner, max, Wait::NoWait), now).unwrap();
    q.check_invariants();
    match out {
        ReceiveOutcome::Delivered(d) => d,
        ReceiveOutcome::Empty => vec![],
        ReceiveOutcome::Parked(_) => unreachable!("NoWait never parks"),
        ReceiveOutcome::NeedStore => unreachable!("nothing is paged out"),
    }
}

fn bodies(d: &[Delivery]) -> Vec<String> {
    d.iter()
        .map(|d| String::from_utf8(d.message.body.to_vec()).unwrap())
        .collect()
}

fn policy(initial: u64, delay: u64) -> RedeliveryPolicy {
    RedeliveryPolicy {
        initial_delay_ms: initial,
        delay_ms: delay,
        ..RedeliveryPolicy::default()
    }
}

// ---------------------------------------------------------------- the redelivery delay sequence

#[test]
fn constant_delay_sequence() {
    let p = policy(100, 250);
    let seq: Vec<u64> = (1..=5).map(|n| p.delay_ms(n, 0.0)).collect();
    assert_eq!(seq, [100, 250, 250, 250, 250]);
}

#[test]
fn exponential_backoff_sequence() {
    let p = RedeliveryPolicy {
        exponential_backoff: true,
        backoff_multiplier: 3.0,
        ..policy(100, 100)
    };
    let seq: Vec<u64> = (1..=5).map(|n| p.delay_ms(n, 0.0)).collect();
    assert_eq!(seq, [100, 300, 900, 2_700, 8_100]);
}

#[test]
fn maximum_delay_caps_every_delay_including_the_initial_one() {
    let p = RedeliveryPolicy {
        exponential_backoff: true,
        backoff_multiplier: 10.0,
        max_delay_ms: 5_000,
        collision_avoidance_percent: 50,
        ..policy(5_000, 1_000)
    };
    // With the largest upward spread the initial delay would be 7 500 ms: the cap holds it.
    assert_eq!(p.delay_ms(1, 1.0), 5_000);
    assert_eq!(p.delay_ms(2, 0.0), 5_000, "1 000 × 10 = 10 000, capped");
    assert_eq!(
        p.delay_ms(40, 1.0),
        5_000,
        "an overflowing power is capped too"
    );
    assert_eq!(p.delay_ms(u32::MAX, 1.0), 5_000);
}

#[test]
fn collision_avoidance_stays_within_its_band_and_is_seeded() {
    let p = RedeliveryPolicy {
        collision_avoidance_percent: 20,
        ..policy(1_000, 1_000)
    };
    let mut rng = policy::SplitMix64::new(7);
    let delays: Vec<u64> = (0..1_000).map(|_| p.delay_ms(2, rng.spread())).collect();
    assert!(
        delays.iter().all(|d| (800..=1_200).contains(d)),
        "{delays:?}"
    );
    assert!(delays.iter().any(|&d| d < 900) && delays.iter().any(|&d| d > 1_100));
    let mut again = policy::SplitMix64::new(7);
    let replay: Vec<u64> = (0..1_000).map(|_| p.delay_ms(2, again.spread())).collect();
    assert_eq!(delays, replay, "the same seed gives the same delays");
}

#[test]
fn invalid_policies_are_refused_with_the_field_named() {
    let bad = RedeliveryPolicy {
        backoff_multiplier: 0.5,
        ..RedeliveryPolicy::default()
    };
    assert_eq!(
        bad.validate().unwrap_err().0,
        "redelivery.backoff_multiplier"
    );
    let bad = RedeliveryPolicy {
        collision_avoidance_percent: 101,
        ..RedeliveryPolicy::default()
    };
    assert_eq!(
        bad.validate().unwrap_err().0,
        "redelivery.collision_avoidance_percent"
    );
    let bad = RedeliveryPolicy {
        max_delay_ms: 10,
        ..policy(100, 0)
    };
    assert_eq!(bad.validate().unwrap_err().0, "redelivery.max_delay_ms");
    assert!(RedeliveryPolicy::default().validate().is_ok());
}

/// The policy of the end-to-end test (`a_poison_message_ends_in_the_dead_letter_queue_...` in
/// integration-tests/tests/jms_semantics.rs), here to the millisecond: 200, 400, then 800 held to
/// the 500 ms cap; the history step says the same time as the state.
#[test]
fn a_nacked_message_waits_the_capped_policy_delay_then_comes_back_redelivered() {
    let mut q = queue_with(QueueConfig {
        redelivery: RedeliveryPolicy {
            exponential_backoff: true,
            backoff_multiplier: 2.0,
            max_delay_ms: 500,
            ..policy(200, 200)
        },
        ..QueueConfig::default()
    });
    let _ = q.send(vec![msg("a")], T0).unwrap();
    let mut now = T0;
    for (n, expected_delay) in [(1, 200), (2, 400), (3, 500)] {
        let d = take(&mut q, 1, 1, now);
        assert_eq!(d[0].delivery_count, n);
        let (_, fx) = q.nack(Caller::Backend, &[d[0].lease_ref()], None, false, now);
        q.check_invariants();
        assert_eq!(
            q.state_of(d[0].message.seq),
            Some(MessageState::Scheduled {
                until_ms: now + expected_delay
            })
        );
        assert_eq!(
            fx.history.last().map(|h| &h.transition),
            Some(&Transition::Returned {
                cause: ReturnCause::Nack,
                redeliver_at_ms: Some(now + expected_delay)
            })
        );
        assert!(take(&mut q, 1, 1, now + expected_delay - 1).is_empty());
        now += expected_delay;
    }
    let d = take(&mut q, 1, 1, now);
    assert!(d[0].redelivered());
    assert_eq!(d[0].delivery_count, 4);
}

#[test]
fn a_delay_named_by_the_consumer_replaces_the_policy_delay() {
    let mut q = queue_with(QueueConfig {
        redelivery: policy(5_000, 5_000),
        ..QueueConfig::default()
    });
    let _ = q.send(vec![msg("a")], T0).unwrap();
    let d = take(&mut q, 1, 1, T0);
    let _ = q.nack(Caller::Backend, &[d[0].lease_ref()], Some(10), false, T0);
    assert_eq!(
        q.state_of(d[0].message.seq),
        Some(MessageState::Scheduled { until_ms: T0 + 10 })
    );
}

// ---------------------------------------------------------------- dead letters

#[test]
fn a_poison_message_is_dead_lettered_after_exactly_one_plus_max_redeliveries() {
    let mut q = queue_with(QueueConfig {
        redelivery: RedeliveryPolicy {
            max_redeliveries: Some(2),
            ..RedeliveryPolicy::default()
        },
        ..QueueConfig::default()
    });
    let _ = q.send(vec![msg("poison")], T0).unwrap();
    for n in 1..=3 {
        let d = take(&mut q, 1, 1, T0 + n);
        assert_eq!(d.len(), 1, "delivery {n} happens");
        let (res, fx) = q.nack(Caller::Backend, &[d[0].lease_ref()], None, false, T0 + n);
        assert!(res[0].is_ok());
        q.check_invariants();
        if n < 3 {
            assert!(fx.dead_letters.is_empty());
        } else {
            let dl = &fx.dead_letters[0];
            assert_eq!(dl.reason, DeadLetterReason::MaxDeliveries);
            assert_eq!(dl.delivery_count, 3);
            assert_eq!(dl.target, DeadLetterTarget::Default);
            assert_eq!(
                dl.delete,
                Some(PersistOp::DeleteMessage(d[0].message.clone()))
            );
            assert!(
                !fx.persist
                    .contains(&PersistOp::DeleteMessage(d[0].message.clone())),
                "the delete travels with the dead letter, not on its own"
            );
        }
    }
    assert!(take(&mut q, 1, 1, T0 + 10).is_empty());
    assert_eq!(q.stats().dead_lettered.max_deliveries, 1);
    assert_eq!(q.stats().ready + q.stats().leased + q.stats().scheduled, 0);
}

#[test]
fn lease_expiry_counts_toward_max_redeliveries() {
    let mut q = queue_with(QueueConfig {
        redelivery: RedeliveryPolicy {
            max_redeliveries: Some(0),
            ..RedeliveryPolicy::default()
        },
        ..QueueConfig::default()
    });
    let _ = q.send(vec![msg("a")], T0).unwrap();
    let d = take(&mut q, 1, 1, T0);
    let fx = q.tick(d[0].lease_until_ms);
    q.check_invariants();
    assert_eq!(fx.dead_letters.len(), 1);
    assert_eq!(fx.dead_letters[0].reason, DeadLetterReason::MaxDeliveries);
}

#[test]
fn unlimited_redeliveries_never_dead_letter() {
    let mut q = queue_with(QueueConfig {
        redelivery: RedeliveryPolicy {
            max_redeliveries: None,
            ..RedeliveryPolicy::default()
        },
        ..QueueConfig::default()
    });
    let _ = q.send(vec![msg("a")], T0).unwrap();
    for n in 0..50 {
        let d = take(&mut q, 1, 1, T0 + n);
        let (_, fx) = q.nack(Caller::Backend, &[d[0].lease_ref()], None, false, T0 + n);
        assert!(fx.dead_letters.is_empty());
    }
}

#[test]
fn a_rejected_message_goes_to_the_dead_letter_target_at_once() {
    let mut q = queue_with(QueueConfig {
        dead_letter: DeadLetterTarget::Queue(QueueName::new("parked").unwrap()),
        ..QueueConfig::default()
    });
    let _ = q.send(vec![msg("bad")], T0).unwrap();
    let d = take(&mut q, 1, 1, T0);
    let (res, fx) = q.nack(Caller::Backend, &[d[0].lease_ref()], None, true, T0);
    assert!(res[0].is_ok());
    q.check_invariants();
    assert_eq!(fx.dead_letters[0].reason, DeadLetterReason::Rejected);
    assert_eq!(
        fx.dead_letters[0].target,
        DeadLetterTarget::Queue(QueueName::new("parked").unwrap())
    );
    assert_eq!(q.stats().dead_lettered.rejected, 1);
}

#[test]
fn a_recovered_message_with_exhausted_deliveries_is_dead_lettered_at_the_first_tick() {
    let config = QueueConfig {
        redelivery: RedeliveryPolicy {
            max_redeliveries: Some(1),
            ..RedeliveryPolicy::default()
        },
        ..QueueConfig::default()
    };
    let stored = |seq: u64, count: u32| RecoveredMessage {
        message: crate::types::Message {
            id: crate::types::MessageId::new(QueueUid(9), Seq(seq)),
            seq: Seq(seq),
            body: Default::default(),
            properties: Default::default(),
            correlation_id: None,
            reply_to: None,
            jms_type: None,
            priority: crate::types::Priority::DEFAULT,
            timestamp_ms: T0,
            expiration_ms: None,
            deliver_at_ms: None,
            persistent: true,
            dedup_id: None,
            group_id: None,
        },
        delivery_count: count,
        mark: None,
    };
    let mut q = Queue::recover(
        QueueName::new("orders").unwrap(),
        QueueUid(9),
        config,
        Seq(10),
        vec![stored(1, 2), stored(2, 1)],
        vec![],
        T0,
    );
    assert_eq!(q.next_deadline_ms(), Some(0), "due at once");
    let fx = q.tick(T0);
    q.check_invariants();
    assert_eq!(fx.dead_letters.len(), 1);
    assert_eq!(fx.dead_letters[0].message.seq, Seq(1));
    let d = take(&mut q, 1, 5, T0);
    assert_eq!(
        d.len(),
        1,
        "the other message may still be delivered once more"
    );
    assert_eq!(d[0].delivery_count, 2);
}

// ---------------------------------------------------------------- expiry in every state

fn expiring(body: &str, ttl: u64) -> NewMessage {
    NewMessage {
        time_to_live_ms: Some(ttl),
        ..msg(body)
    }
}

#[test]
fn a_ready_message_expires_on_time_without_any_receiver() {
    let mut q = queue();
    let _ = q.send(vec![expiring("a", 100)], T0).unwrap();
    assert_eq!(q.next_deadline_ms(), Some(T0 + 100));
    assert!(q.tick(T0 + 99).dead_letters.is_empty());
    let fx = q.tick(T0 + 100);
    q.check_invariants();
    assert_eq!(fx.dead_letters.len(), 1);
    assert_eq!(fx.dead_letters[0].reason, DeadLetterReason::Expired);
    assert_eq!(fx.dead_letters[0].delivery_count, 0);
    assert_eq!(q.stats().expired_total, 1);
}

#[test]
fn a_scheduled_message_that_expires_before_its_delivery_time_is_never_delivered() {
    let mut q = queue();
    let m = NewMessage {
        delivery_delay_ms: Some(500),
        ..expiring("a", 200)
    };
    let _ = q.send(vec![m], T0).unwrap();
    let (out, _) = q.receive(req(1, 1, Wait::Forever), T0).unwrap();
    assert!(matches!(out, ReceiveOutcome::Parked(_)));
    let fx = q.tick(T0 + 200);
    q.check_invariants();
    assert_eq!(fx.dead_letters[0].reason, DeadLetterReason::Expired);
    let fx = q.tick(T0 + 500);
    assert!(fx.handed.is_empty(), "nothing reaches the parked receiver");
}

#[test]
fn a_leased_message_that_expires_is_judged_when_it_comes_back() {
    let mut q = queue();
    let _ = q
        .send(vec![expiring("a", 100), expiring("b", 100)], T0)
        .unwrap();
    let d = take(&mut q, 1, 2, T0);
    // Its receiver got it in time: expiry does not take it away.
    let fx = q.tick(T0 + 150);
    assert!(fx.dead_letters.is_empty());
    assert!(matches!(
        q.state_of(d[0].message.seq),
        Some(MessageState::Leased { .. })
    ));
    // Acknowledged late: still fine.
    let (res, _) = q.ack(Caller::Backend, &[d[0].lease_ref()], T0 + 150);
    assert!(res[0].is_ok());
    // Given back late: dead-lettered as expired, not redelivered.
    let (res, fx) = q.nack(Caller::Backend, &[d[1].lease_ref()], None, false, T0 + 150);
    assert!(res[0].is_ok());
    q.check_invariants();
    assert_eq!(fx.dead_letters.len(), 1);
    assert_eq!(fx.dead_letters[0].reason, DeadLetterReason::Expired);
    assert_eq!(fx.dead_letters[0].delivery_count, 1);
}

#[test]
fn expired_messages_can_be_discarded_instead() {
    let mut q = queue_with(QueueConfig {
        expiry: DeadLetterTarget::Discard,
        ..QueueConfig::default()
    });
    let _ = q.send(vec![expiring("a", 10)], T0).unwrap();
    let fx = q.tick(T0 + 10);
    assert_eq!(fx.dead_letters[0].target, DeadLetterTarget::Discard);
    assert_eq!(q.stats().expired_total, 1, "discarded, and counted");
}

// ---------------------------------------------------------------- rollback, close, recover

fn returns_through_policy(f: impl FnOnce(&mut Queue, SessionId, u64) -> Effects) {
    let mut q = queue_with(QueueConfig {
        redelivery: policy(300, 300),
        ..QueueConfig::default()
    });
    let _ = q.send(vec![msg("a")], T0).unwrap();
    let d = take(&mut q, 1, 1, T0);
    let _ = f(&mut q, SessionId(1), T0 + 5);
    q.check_invariants();
    assert_eq!(
        q.state_of(d[0].message.seq),
        Some(MessageState::Scheduled { until_ms: T0 + 305 })
    );
    assert!(take(&mut q, 2, 1, T0 + 304).is_empty());
    let again = take(&mut q, 2, 1, T0 + 305);
    assert!(again[0].redelivered());
}

#[test]
fn rollback_redelivers_through_the_policy() {
    returns_through_policy(|q, s, now| q.rollback(s, now).1);
}

#[test]
fn closing_a_session_without_commit_redelivers_through_the_policy() {
    returns_through_policy(|q, s, now| q.release_session(s, now).1);
}

#[test]
fn recover_redelivers_through_the_policy() {
    returns_through_policy(|q, s, now| q.recover_session(s, now).1);
}

// ---------------------------------------------------------------- transacted sessions

#[test]
fn staged_sends_are_invisible_until_commit_and_then_persisted_in_one_batch() {
    let mut q = queue();
    let s = SessionId(1);
    let (ids, fx) = q.stage(s, vec![msg("a"), msg("b")], T0).unwrap();
    q.check_invariants();
    assert_eq!(ids.len(), 2);
    assert!(
        fx.persist
            .iter()
            .all(|op| matches!(op, PersistOp::ReserveSeq { .. })),
        "nothing but the id reservation is written before commit"
    );
    assert!(take(&mut q, 2, 10, T0).is_empty());
    assert_eq!(q.stats().staged, 2);
    let (res, fx) = q.commit(s, &[], T0 + 1);
    res.unwrap();
    q.check_invariants();
    let puts = fx
        .persist
        .iter()
        .filter(|op| matches!(op, PersistOp::PutMessage(_)))
        .count();
    assert_eq!(puts, 2);
    let d = take(&mut q, 2, 10, T0 + 1);
    assert_eq!(bodies(&d), ["a", "b"]);
    assert_eq!(
        d[0].message.id, ids[0],
        "the id given at send is the message's id"
    );
}

#[test]
fn commit_acknowledges_held_acks_and_a_stale_one_fails_it_whole() {
    let mut q = queue();
    let _ = q.send(vec![msg("a"), msg("b")], T0).unwrap();
    let tx = SessionId(1);
    let d = take(&mut q, 1, 2, T0);
    let _ = q.stage(tx, vec![msg("out")], T0).unwrap();
    // The lease of one delivery runs out before commit; the other's was extended.
    let _ = q
        .extend_lease(Caller::Backend, &[d[0].lease_ref()], Some(120_000), T0)
        .unwrap();
    let _ = q.tick(d[1].lease_until_ms);
    let err = q
        .commit(
            tx,
            &[d[0].lease_ref(), d[1].lease_ref()],
            d[1].lease_until_ms,
        )
        .0
        .unwrap_err();
    assert!(matches!(err, KernelError::StaleReceipt { .. }));
    q.check_invariants();
    assert!(
        matches!(
            q.state_of(d[0].message.seq),
            Some(MessageState::Leased { .. })
        ),
        "nothing was acknowledged"
    );
    assert_eq!(q.stats().staged, 1, "nothing was sent");
}

#[test]
fn commit_refuses_another_sessions_delivery() {
    let mut q = queue();
    let _ = q.send(vec![msg("a")], T0).unwrap();
    let d = take(&mut q, 2, 1, T0);
    let err = q
        .commit(SessionId(1), &[d[0].lease_ref()], T0)
        .0
        .unwrap_err();
    assert!(matches!(err, KernelError::StaleReceipt { .. }));
}

#[test]
fn rollback_drops_staged_sends_and_returns_received_messages() {
    let mut q = queue();
    let _ = q.send(vec![msg("in")], T0).unwrap();
    let tx = SessionId(1);
    let d = take(&mut q, 1, 1, T0);
    let _ = q.stage(tx, vec![msg("out")], T0).unwrap();
    let (released, _) = q.rollback(tx, T0 + 1);
    q.check_invariants();
    assert_eq!(released, 1);
    assert_eq!(q.stats().staged, 0);
    let again = take(&mut q, 1, 10, T0 + 1);
    assert_eq!(bodies(&again), ["in"], "the staged send is gone");
    assert_eq!(again[0].delivery_count, d[0].delivery_count + 1);
    // The transaction after a rollback commits normally.
    let _ = q.stage(tx, vec![msg("out2")], T0 + 2).unwrap();
    q.commit(tx, &[again[0].lease_ref()], T0 + 2).0.unwrap();
    assert_eq!(bodies(&take(&mut q, 3, 10, T0 + 2)), ["out2"]);
}

#[test]
fn a_session_that_ends_drops_its_staged_sends() {
    let mut q = queue();
    let _ = q.stage(SessionId(1), vec![msg("x")], T0).unwrap();
    let _ = q.release_session(SessionId(1), T0);
    q.check_invariants();
    assert_eq!(q.stats().staged, 0);
    assert!(q.commit(SessionId(1), &[], T0).0.is_ok(), "an empty commit");
    assert!(take(&mut q, 2, 10, T0).is_empty());
}

// ---------------------------------------------------------------- message groups

#[test]
fn a_group_sticks_to_the_session_that_took_it_until_that_session_ends() {
    let mut q = queue();
    let _ = q
        .send(
            vec![
                grouped("g1-a", "g1"),
                grouped("g2-a", "g2"),
                grouped("g1-b", "g1"),
                msg("plain"),
                grouped("g2-b", "g2"),
            ],
            T0,
        )
        .unwrap();
    let a = take(&mut q, 1, 1, T0);
    assert_eq!(bodies(&a), ["g1-a"]);
    // Session 2 skips g1 (held by 1) without disturbing its order.
    let b = take(&mut q, 2, 2, T0);
    assert_eq!(bodies(&b), ["g2-a", "plain"]);
    let a2 = take(&mut q, 1, 5, T0);
    assert_eq!(bodies(&a2), ["g1-b"], "g2 belongs to session 2 now");
    assert_eq!(bodies(&take(&mut q, 2, 5, T0)), ["g2-b"]);
    // Session 1 goes away without acknowledging: g1 moves, in order, to whoever receives next.
    let (released, _) = q.release_session(SessionId(1), T0 + 1);
    q.check_invariants();
    assert_eq!(released, 2);
    let moved = take(&mut q, 3, 5, T0 + 1);
    assert_eq!(bodies(&moved), ["g1-a", "g1-b"]);
    assert!(moved.iter().all(Delivery::redelivered));
}

#[test]
fn a_parked_receiver_gets_a_group_the_moment_its_holder_ends() {
    let mut q = queue();
    let _ = q
        .send(vec![grouped("a", "g"), grouped("b", "g")], T0)
        .unwrap();
    let held = take(&mut q, 1, 1, T0);
    assert_eq!(bodies(&held), ["a"]);
    let (out, _) = q.receive(req(2, 5, Wait::Forever), T0).unwrap();
    let ReceiveOutcome::Parked(w) = out else {
        panic!("b belongs to session 1's group: session 2 must wait, got {out:?}")
    };
    q.check_invariants();
    let _ = q.ack(Caller::Backend, &[held[0].lease_ref()], T0);
    let (_, fx) = q.release_session(SessionId(1), T0 + 1);
    q.check_invariants();
    assert_eq!(fx.handed.len(), 1);
    assert_eq!(fx.handed[0].0, w);
    assert_eq!(bodies(&fx.handed[0].1), ["b"]);
}

#[test]
fn recover_keeps_the_group_with_its_session() {
    let mut q = queue();
    let _ = q.send(vec![grouped("a", "g")], T0).unwrap();
    let d = take(&mut q, 1, 1, T0);
    let _ = q.recover_session(SessionId(1), T0);
    assert!(take(&mut q, 2, 1, T0).is_empty(), "still session 1's group");
    let again = take(&mut q, 1, 1, T0);
    assert_eq!(again[0].message.seq, d[0].message.seq);
}

// ---------------------------------------------------------------- producer dedup

fn dedup(body: &str, id: &str) -> NewMessage {
    NewMessage {
        dedup_id: Some(id.into()),
        ..msg(body)
    }
}

#[test]
fn a_repeated_dedup_id_within_the_window_returns_the_original_id_and_stores_nothing() {
    let mut q = queue_with(QueueConfig {
        dedup_window_ms: 1_000,
        ..QueueConfig::default()
    });
    let (first, _) = q.send(vec![dedup("a", "k1")], T0).unwrap();
    let (again, fx) = q
        .send(vec![dedup("a-again", "k1"), dedup("b", "k2")], T0 + 999)
        .unwrap();
    q.check_invariants();
    assert_eq!(again[0], first[0]);
    assert_ne!(again[1], first[0]);
    let puts: Vec<_> = fx
        .persist
        .iter()
        .filter_map(|op| match op {
            PersistOp::PutMessage(m) => Some(m.dedup_id.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(puts, [Some("k2".to_owned())]);
    assert_eq!(q.stats().ready, 2);
    // The window passes: the id is forgotten (durably) and may be used again.
    let fx = q.tick(T0 + 1_000);
    assert!(fx.persist.contains(&PersistOp::DeleteDedup {
        dedup_id: "k1".into()
    }));
    let (later, _) = q.send(vec![dedup("a-later", "k1")], T0 + 1_000).unwrap();
    assert_ne!(later[0], first[0]);
    q.check_invariants();
}

#[test]
fn dedup_ids_survive_recovery() {
    let record = DedupRecord {
        dedup_id: "k".into(),
        seq: Seq(3),
        expires_ms: T0 + 500,
    };
    let mut q = Queue::recover(
        QueueName::new("orders").unwrap(),
        QueueUid(9),
        QueueConfig::default(),
        Seq(10),
        vec![],
        vec![record.clone()],
        T0,
    );
    let (ids, _) = q.send(vec![dedup("x", "k")], T0 + 1).unwrap();
    assert_eq!(ids[0], crate::types::MessageId::new(QueueUid(9), Seq(3)));
    assert_eq!(q.stats().ready, 0);
    q.check_invariants();
}

#[test]
fn a_transacted_send_repeating_a_dedup_id_commits_nothing_new() {
    let mut q = queue();
    let (first, _) = q.send(vec![dedup("a", "k")], T0).unwrap();
    let (ids, _) = q.stage(SessionId(1), vec![dedup("a", "k")], T0).unwrap();
    assert_eq!(ids[0], first[0]);
    q.commit(SessionId(1), &[], T0).0.unwrap();
    assert_eq!(q.stats().ready, 1);
    let _ = Arc::clone(&take(&mut q, 1, 1, T0)[0].message);
}

// ---------------------------------------------------------------- heartbeats renew leases

#[test]
fn a_heartbeat_renews_the_sessions_leases_for_their_own_length_and_revives_none() {
    let mut q = queue();
    let _ = q.send(vec![msg("a"), msg("b"), msg("c")], T0).unwrap();
    let short = ReceiveRequest {
        lease_ms: Some(100),
        ..req(1, 1, Wait::NoWait)
    };
    let (ReceiveOutcome::Delivered(a), _) = q.receive(short, T0).unwrap() else {
        panic!("a is ready")
    };
    let b = take(&mut q, 1, 1, T0); // 60 s lease
    let other = take(&mut q, 2, 1, T0);
    let (renewed, _) = q.renew_session(SessionId(1), T0 + 50);
    q.check_invariants();
    assert_eq!(renewed, 2);
    let until = |q: &Queue, d: &Delivery| match q.state_of(d.message.seq) {
        Some(MessageState::Leased { until_ms, .. }) => until_ms,
        other => panic!("{other:?}"),
    };
    assert_eq!(until(&q, &a[0]), T0 + 150, "renewed for its own 100 ms");
    assert_eq!(until(&q, &b[0]), T0 + 60_050);
    assert_eq!(
        until(&q, &other[0]),
        T0 + 60_000,
        "another session's lease is untouched"
    );
    // A heartbeat after the short lease ran out does not revive it: it was already returned.
    let (renewed, _) = q.renew_session(SessionId(1), T0 + 200);
    q.check_invariants();
    assert_eq!(renewed, 1);
    assert_eq!(q.state_of(a[0].message.seq), Some(MessageState::Ready));
    // The old receipt is stale even though the session is alive.
    let (res, _) = q.ack(Caller::Backend, &[a[0].lease_ref()], T0 + 200);
    assert!(res[0].is_err());
}

// Bug 3 (docs/reliability.md): a delivery whose answer was lost between back-end and front-end
// was renewed by every heartbeat of its session, so it stayed leased as long as the session
// lived. A heartbeat that names deliveries renews those alone.
#[test]
fn a_heartbeat_naming_deliveries_renews_those_alone_and_names_the_ones_gone() {
    let mut q = queue();
    let _ = q
        .send(vec![msg("a"), msg("b"), msg("c"), msg("d")], T0)
        .unwrap();
    let passed_on = take(&mut q, 1, 1, T0);
    let lost = take(&mut q, 1, 1, T0);
    let acked = take(&mut q, 1, 1, T0);
    let other = take(&mut q, 2, 1, T0);
    let (res, _) = q.ack(
        Caller::Client(Some(SessionId(1))),
        &[acked[0].lease_ref()],
        T0,
    );
    assert!(res[0].is_ok());
    let named = |d: &Delivery| (d.message.seq, d.lease_ref().lease);
    let (r, _) = q.renew_named(
        SessionId(1),
        &[named(&passed_on[0]), named(&acked[0]), named(&other[0])],
        T0 + 50,
    );
    q.check_invariants();
    assert_eq!(r.renewed, 1);
    assert_eq!(
        r.not_held,
        vec![named(&acked[0]), named(&other[0])],
        "settled, and another session's"
    );
    let until = |q: &Queue, d: &Delivery| match q.state_of(d.message.seq) {
        Some(MessageState::Leased { until_ms, .. }) => until_ms,
        other => panic!("{other:?}"),
    };
    assert_eq!(until(&q, &passed_on[0]), T0 + 60_050);
    assert_eq!(until(&q, &lost[0]), T0 + 60_000, "not named: not renewed");
    assert_eq!(until(&q, &other[0]), T0 + 60_000);
    // The unnamed delivery runs out and is delivered again, however often the session beats.
    let (r, _) = q.renew_named(SessionId(1), &[named(&passed_on[0])], T0 + 60_001);
    q.check_invariants();
    assert_eq!(r.renewed, 1);
    assert_eq!(q.state_of(lost[0].message.seq), Some(MessageState::Ready));
    let again = take(&mut q, 1, 1, T0 + 60_002);
    assert_eq!(bodies(&again), vec!["b".to_string()]);
    // The lost delivery's old lease names nothing now, though the session holds the message
    // again under a new one.
    let (r, _) = q.renew_named(SessionId(1), &[named(&lost[0])], T0 + 60_003);
    assert_eq!((r.renewed, r.not_held), (0, vec![named(&lost[0])]));
    assert_eq!(until(&q, &again[0]), T0 + 120_002);
}

#[test]
fn a_group_whose_holder_lets_its_last_lease_lapse_is_free_again() {
    let mut q = queue();
    let _ = q
        .send(vec![grouped("a", "g"), grouped("b", "g")], T0)
        .unwrap();
    let held = take(&mut q, 1, 1, T0);
    // Session 1 is gone without a word (its front-end died): nobody tells the queue.
    let (out, _) = q.receive(req(2, 5, Wait::Forever), T0).unwrap();
    let ReceiveOutcome::Parked(w) = out else {
        panic!("the group is session 1's: {out:?}")
    };
    let fx = q.tick(held[0].lease_until_ms);
    q.check_invariants();
    assert_eq!(fx.handed.len(), 1, "the group moved to the waiting session");
    assert_eq!(fx.handed[0].0, w);
    assert_eq!(bodies(&fx.handed[0].1), ["a", "b"]);
}

#[test]
fn a_refused_receive_still_hands_over_what_time_did() {
    let mut q = queue_with(QueueConfig {
        waiters_max: 1,
        ..QueueConfig::default()
    });
    let picky = ReceiveRequest {
        selector: Some(Arc::new(
            crate::selector::Selector::parse("x = 1", &crate::selector::SelectorLimits::default())
                .unwrap(),
        )),
        ..req(1, 1, Wait::Forever)
    };
    let _ = q.receive(picky, T0).unwrap();
    let _ = q.send(vec![expiring("short", 10)], T0).unwrap();
    let err = q.receive(req(2, 1, Wait::Forever), T0 + 20).unwrap_err();
    assert!(matches!(err, KernelError::TooManyWaiters { .. }));
    q.check_invariants();
    assert_eq!(
        q.next_deadline_ms(),
        Some(0),
        "the expiry's effects are due at once"
    );
    let fx = q.tick(T0 + 20);
    assert_eq!(fx.dead_letters.len(), 1, "the expired message is not lost");
    assert!(
        q.tick(T0 + 21).dead_letters.is_empty(),
        "and handed over once"
    );
}

#[test]
fn stats_name_the_oldest_ready_message_across_priorities() {
    let mut q = queue();
    assert_eq!(q.stats().oldest_ready_timestamp_ms, None);
    let low = NewMessage {
        priority: crate::types::Priority::new(1).unwrap(),
        ..msg("old, low priority")
    };
    let _ = q.send(vec![low], T0).unwrap();
    let high = NewMessage {
        priority: crate::types::Priority::new(9).unwrap(),
        ..msg("new, high priority")
    };
    let _ = q.send(vec![high], T0 + 500).unwrap();
    assert_eq!(q.stats().oldest_ready_timestamp_ms, Some(T0));
    let d = take(&mut q, 1, 1, T0 + 600);
    assert_eq!(bodies(&d), ["new, high priority"]);
    assert_eq!(q.stats().oldest_ready_timestamp_ms, Some(T0));
    let _ = take(&mut q, 1, 1, T0 + 600);
    assert_eq!(
        q.stats().oldest_ready_timestamp_ms,
        None,
        "leased is not ready"
    );
}

#[test]
fn one_message_can_be_deleted_by_id_unless_a_consumer_holds_it() {
    let mut q = queue();
    let (ids, _) = q.send(vec![msg("a"), msg("b")], T0).unwrap();
    let d = take(&mut q, 1, 1, T0);
    let (res, _) = q.delete_message(&ids[0], T0);
    assert!(matches!(res, Err(KernelError::MessageLeased { .. })));
    let (res, fx) = q.delete_message(&ids[1], T0);
    res.unwrap();
    q.check_invariants();
    assert!(
        matches!(&fx.persist[..], [PersistOp::DeleteMessage(m)] if m.seq == Seq(2)),
        "{:?}",
        fx.persist
    );
    let (res, _) = q.delete_message(&ids[1], T0);
    assert!(matches!(res, Err(KernelError::NoSuchMessage { .. })));
    let _ = q.ack(Caller::Backend, &[d[0].lease_ref()], T0);
    assert_eq!(q.stats().ready + q.stats().leased, 0);
}

#[test]
fn history_tells_each_step_of_a_message_that_was_rolled_back_and_redelivered() {
    let mut q = queue_with(QueueConfig {
        redelivery: policy(100, 100),
        ..QueueConfig::default()
    });
    let tx = SessionId(1);
    let (_, fx) = q.send(vec![msg("a")], T0).unwrap();
    let mut steps: Vec<HistoryEntry> = fx.history;
    let (out, fx) = q.receive(req(1, 1, Wait::NoWait), T0 + 1).unwrap();
    steps.extend(fx.history);
    let ReceiveOutcome::Delivered(d) = out else {
        panic!("{out:?}")
    };
    let (_, fx) = q.rollback(tx, T0 + 2);
    steps.extend(fx.history);
    let (out, fx) = q.receive(req(1, 1, Wait::NoWait), T0 + 102).unwrap();
    steps.extend(fx.history);
    let ReceiveOutcome::Delivered(d2) = out else {
        panic!("{out:?}")
    };
    let (res, fx) = q.commit(tx, &[d2[0].lease_ref()], T0 + 103);
    res.unwrap();
    steps.extend(fx.history);
    let seq = d[0].message.seq;
    assert!(steps.iter().all(|s| s.seq == seq));
    let got: Vec<(u64, Transition)> = steps.into_iter().map(|s| (s.at_ms, s.transition)).collect();
    assert_eq!(
        got,
        vec![
            (
                T0,
                Transition::Sent {
                    deliver_at_ms: None,
                    committed: false
                }
            ),
            (
                T0 + 1,
                Transition::Delivered {
                    session: Some(tx),
                    delivery_count: 1,
                    lease_until_ms: T0 + 1 + 60_000
                }
            ),
            (
                T0 + 2,
                Transition::Returned {
                    cause: ReturnCause::Rollback,
                    redeliver_at_ms: Some(T0 + 102)
                }
            ),
            (
                T0 + 102,
                Transition::Delivered {
                    session: Some(tx),
                    delivery_count: 2,
                    lease_until_ms: T0 + 102 + 60_000
                }
            ),
            (T0 + 103, Transition::Acked),
        ]
    );
}

// ---------------------------------------------------------------- hardening regressions

// Postmortem: a transaction staged its sends outside the dedup index, so a repeat of a dedup id
// in the same transaction was given a second id that commit then dropped as a duplicate.
#[test]
fn a_dedup_id_repeated_inside_one_transaction_returns_the_id_that_commit_publishes() {
    let mut q = queue();
    let (first, _) = q.stage(SessionId(1), vec![dedup("a", "k")], T0).unwrap();
    let (again, _) = q
        .stage(
            SessionId(1),
            vec![dedup("a-again", "k"), dedup("b", "k")],
            T0,
        )
        .unwrap();
    assert_eq!(again, vec![first[0].clone(), first[0].clone()]);
    q.check_invariants();
    q.commit(SessionId(1), &[], T0).0.unwrap();
    q.check_invariants();
    let got = take(&mut q, 2, 10, T0);
    assert_eq!(got.len(), 1);
    assert_eq!(
        got[0].message.id, first[0],
        "the id the sends were given is in the queue"
    );
}

#[test]
fn an_open_transaction_holds_its_dedup_ids_until_it_ends() {
    let mut q = queue();
    let (staged, _) = q.stage(SessionId(1), vec![dedup("a", "k")], T0).unwrap();
    let refused = q.send(vec![dedup("plain", "k")], T0).unwrap_err();
    assert!(
        matches!(refused, KernelError::DedupInTransaction { .. }),
        "{refused:?}"
    );
    let refused = q
        .stage(SessionId(2), vec![dedup("other", "k")], T0)
        .unwrap_err();
    assert!(matches!(refused, KernelError::DedupInTransaction { .. }));
    // Committed: a later send with the id is its duplicate.
    q.commit(SessionId(1), &[], T0).0.unwrap();
    let (later, _) = q.send(vec![dedup("plain", "k")], T0 + 1).unwrap();
    assert_eq!(later, staged);
    // Rolled back: the id is free again.
    let _ = q
        .stage(SessionId(3), vec![dedup("c", "k2")], T0 + 2)
        .unwrap();
    let _ = q.rollback(SessionId(3), T0 + 2);
    let (free, _) = q.send(vec![dedup("d", "k2")], T0 + 3).unwrap();
    assert_eq!(q.stats().ready, 2);
    assert_ne!(free[0], staged[0]);
    q.check_invariants();
}

// Postmortem: a nack's own delay was used as it came, so `u64::MAX` left the message
// scheduled for ever, past the queue's maximum redelivery delay.
#[test]
fn a_delay_named_in_a_nack_is_held_to_the_queues_maximum() {
    let mut q = queue_with(QueueConfig {
        redelivery: RedeliveryPolicy {
            max_delay_ms: 60_000,
            ..RedeliveryPolicy::default()
        },
        ..QueueConfig::default()
    });
    let _ = q.send(vec![msg("a")], T0).unwrap();
    let d = take(&mut q, 1, 1, T0);
    let (res, _) = q.nack(
        Caller::Backend,
        &[d[0].lease_ref()],
        Some(u64::MAX),
        false,
        T0,
    );
    res[0].clone().unwrap();
    assert_eq!(
        q.state_of(d[0].message.seq),
        Some(MessageState::Scheduled {
            until_ms: T0 + 60_000
        })
    );
    let _ = q.tick(T0 + 60_000);
    assert_eq!(take(&mut q, 1, 1, T0 + 60_000).len(), 1);
}

// Postmortem: with an initial delay, exponential back-off and no delay_ms, the second and later
// redeliveries came after 0 ms; ActiveMQ multiplies the previous delay.
#[test]
fn exponential_backoff_grows_from_the_initial_delay_as_activemq_does() {
    let p = RedeliveryPolicy {
        exponential_backoff: true,
        backoff_multiplier: 2.0,
        ..policy(1_000, 0)
    };
    let seq: Vec<u64> = (1..=5).map(|n| p.delay_ms(n, 0.0)).collect();
    assert_eq!(seq, [1_000, 2_000, 4_000, 8_000, 16_000]);
    let no_initial = RedeliveryPolicy {
        exponential_backoff: true,
        backoff_multiplier: 2.0,
        ..policy(0, 500)
    };
    let seq: Vec<u64> = (1..=5).map(|n| no_initial.delay_ms(n, 0.0)).collect();
    assert_eq!(seq, [0, 500, 1_000, 2_000, 4_000]);
}

// Postmortem: giving back an undelivered message checked only the lease id, so a bogus or
// stale handle was answered as done and could return a newer delivery of the same message.
#[test]
fn giving_back_undelivered_messages_checks_each_handle_as_an_ack_does() {
    let mut q = queue();
    let _ = q.send(vec![msg("a"), msg("b")], T0).unwrap();
    let d = take(&mut q, 1, 2, T0);
    let live = d[0].lease_ref();
    let stale_count = LeaseRef {
        delivery_count: 7,
        ..d[1].lease_ref()
    };
    let other_queue = LeaseRef {
        queue: QueueUid(12345),
        ..d[1].lease_ref()
    };
    let (results, _) = q.return_undelivered(
        Caller::Client(Some(SessionId(1))),
        &[live, stale_count, other_queue, live],
        T0,
    );
    assert!(results[0].is_ok());
    for r in &results[1..] {
        assert!(matches!(r, Err(KernelError::StaleReceipt { .. })), "{r:?}");
    }
    assert_eq!(q.state_of(d[0].message.seq), Some(MessageState::Ready));
    assert!(matches!(
        q.state_of(d[1].message.seq),
        Some(MessageState::Leased { .. })
    ));
    q.check_invariants();
}

#[test]
fn only_the_session_that_received_a_message_may_act_on_its_delivery() {
    let mut q = queue();
    let _ = q.send(vec![msg("a")], T0).unwrap();
    let d = take(&mut q, 1, 1, T0);
    let r = d[0].lease_ref();
    for caller in [Caller::Client(Some(SessionId(2))), Caller::Client(None)] {
        let (res, _) = q.ack(caller, &[r], T0);
        assert!(
            matches!(res[0], Err(KernelError::NotOwner { .. })),
            "{res:?}"
        );
        let (res, _) = q.nack(caller, &[r], None, true, T0);
        assert!(matches!(res[0], Err(KernelError::NotOwner { .. })));
        let (res, _) = q.return_undelivered(caller, &[r], T0);
        assert!(matches!(res[0], Err(KernelError::NotOwner { .. })));
        let (res, _) = q.extend_lease(caller, &[r], Some(1_000), T0).unwrap();
        assert!(matches!(res[0], Err(KernelError::NotOwner { .. })));
    }
    assert!(matches!(
        q.state_of(r.seq),
        Some(MessageState::Leased { .. })
    ));
    let (res, _) = q.ack(Caller::Client(Some(SessionId(1))), &[r], T0);
    assert!(res[0].is_ok());
    q.check_invariants();
}

#[test]
fn dedup_ids_are_bounded_in_size_and_count() {
    let mut q = queue();
    let long = "k".repeat(DEDUP_ID_BYTES_MAX + 1);
    let err = q.send(vec![dedup("a", &long)], T0).unwrap_err();
    assert!(
        matches!(
            err,
            KernelError::OverLimit {
                limit_name: "dedup_id_bytes_max",
                ..
            }
        ),
        "{err:?}"
    );
    for (i, id) in ["k0", "k1", "k2"].iter().enumerate() {
        let _ = q.send(vec![dedup("x", id)], T0 + i as u64).unwrap();
    }
    let mut fx = Effects::default();
    q.forget_dedup_over(2, &mut fx);
    assert_eq!(
        fx.persist,
        vec![PersistOp::DeleteDedup {
            dedup_id: "k0".into()
        }],
        "the id whose window ends first goes first"
    );
    q.check_invariants();
    let before = q.stats().ready;
    let _ = q.send(vec![dedup("x", "k2")], T0 + 5).unwrap();
    assert_eq!(q.stats().ready, before, "k2 is still remembered");
    let _ = q.send(vec![dedup("x", "k0")], T0 + 5).unwrap();
    assert_eq!(q.stats().ready, before + 1, "k0 was forgotten");
}

// Postmortem: non-persistent and staged messages ignored the memory budget (300 MB of either
// went in unrefused), though unlike persistent ones they cannot wait in the store.
#[test]
fn messages_that_can_only_live_in_memory_are_refused_past_the_budget() {
    let mut q = queue();
    q.set_pinned_budget(1_500);
    let body = |persistent: bool| NewMessage {
        body: vec![7; 600],
        persistent,
        ..Default::default()
    };
    let _ = q.send(vec![body(false), body(false)], T0).unwrap();
    let err = q.send(vec![body(false)], T0).unwrap_err();
    assert!(
        matches!(err, KernelError::QueueFull { .. })
            && err.to_string().contains("queue_memory_budget_bytes"),
        "{err}"
    );
    // A persistent message still goes in: it can wait in the store.
    let _ = q.send(vec![body(true)], T0).unwrap();
    let err = q.stage(SessionId(1), vec![body(true)], T0).unwrap_err();
    assert!(matches!(err, KernelError::QueueFull { .. }), "{err}");
    let many = NewMessage {
        properties: (0..=PROPERTIES_PER_MESSAGE_MAX)
            .map(|i| (format!("p{i}"), crate::types::PropertyValue::Int(1)))
            .collect(),
        ..body(true)
    };
    let err = q.send(vec![many], T0).unwrap_err();
    assert!(
        matches!(
            err,
            KernelError::OverLimit {
                limit_name: "properties_per_message_max",
                ..
            }
        ),
        "{err}"
    );
    q.check_invariants();
}
