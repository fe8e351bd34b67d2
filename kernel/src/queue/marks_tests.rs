//! Delivery marks (`marks.rs`): what a replicated queue writes of its deliveries, and how a
//! queue rebuilt from those writes (a new shard leader taking over) honours them.

use std::collections::BTreeMap;

use super::*;
use crate::types::{LeaseId, Message, NewMessage, QueueName, QueueUid};

const T0: u64 = 1_000_000;
const LEASE_MS: u64 = 5_000;

/// What the replicas' stores hold of a queue: each persistent message, its count and mark,
/// kept from the writes the queue asked for, as the shard's log applies them.
#[derive(Default)]
struct Replica {
    messages: BTreeMap<Seq, (Message, u32, Option<DeliveryMark>)>,
}

impl Replica {
    fn apply(&mut self, fx: &Effects) {
        let deletes = fx.dead_letters.iter().filter_map(|d| d.delete.as_ref());
        for op in fx.persist.iter().chain(deletes) {
            match op {
                PersistOp::PutMessage(m) => {
                    self.messages.insert(m.seq, ((**m).clone(), 0, None));
                }
                PersistOp::DeleteMessage(m) => {
                    self.messages.remove(&m.seq);
                }
                PersistOp::SetDeliveryCount { seq, count } => {
                    let e = self
                        .messages
                        .get_mut(seq)
                        .expect("counted message is stored");
                    (e.1, e.2) = (*count, None);
                }
                PersistOp::MarkDelivery { seq, count, mark } => {
                    let e = self
                        .messages
                        .get_mut(seq)
                        .expect("marked message is stored");
                    (e.1, e.2) = (*count, Some(*mark));
                }
                _ => {}
            }
        }
    }

    /// The queue a new leader builds from this store at `now`.
    fn take_over(&self, now: u64) -> Queue {
        let messages = self
            .messages
            .values()
            .map(|(m, count, mark)| RecoveredMessage {
                message: m.clone(),
                delivery_count: *count,
                mark: *mark,
            })
            .collect();
        let mut q = Queue::recover(name(), QueueUid(7), config(), Seq(1), messages, vec![], now);
        q.write_delivery_marks();
        q.check_invariants();
        q
    }

    fn mark_of(&self, seq: Seq) -> Option<DeliveryMark> {
        self.messages[&seq].2
    }
}

fn name() -> QueueName {
    QueueName::new("q").unwrap()
}

fn config() -> QueueConfig {
    QueueConfig {
        redelivery: RedeliveryPolicy {
            initial_delay_ms: 10_000,
            collision_avoidance_percent: 0,
            ..RedeliveryPolicy::default()
        },
        ..QueueConfig::default()
    }
}

fn replicated() -> Queue {
    let mut q = Queue::new(name(), QueueUid(7), config());
    q.write_delivery_marks();
    q
}

fn msg(body: &str, group: Option<&str>) -> NewMessage {
    NewMessage {
        body: body.as_bytes().to_vec(),
        persistent: true,
        group_id: group.map(str::to_owned),
        ..Default::default()
    }
}

fn send(q: &mut Queue, r: &mut Replica, m: NewMessage, now: u64) -> Seq {
    let (ids, fx) = q.send(vec![m], now).unwrap();
    r.apply(&fx);
    q.check_invariants();
    let seq = fx
        .persist
        .iter()
        .find_map(|op| match op {
            PersistOp::PutMessage(m) => Some(m.seq),
            _ => None,
        })
        .unwrap_or_else(|| panic!("no message stored for {ids:?}"));
    seq
}

fn receive(q: &mut Queue, r: &mut Replica, session: u64, now: u64) -> Vec<Delivery> {
    let req = ReceiveRequest {
        owner: Some(SessionId(session)),
        max_messages: 10,
        wait: Wait::NoWait,
        lease_ms: Some(LEASE_MS),
        selector: None,
    };
    let (out, fx) = q.receive(req, now).unwrap();
    r.apply(&fx);
    q.check_invariants();
    match out {
        ReceiveOutcome::Delivered(d) => d,
        _ => vec![],
    }
}

#[test]
fn a_delivery_writes_its_lease_and_a_return_writes_its_back_off_or_clears_it() {
    let (mut q, mut r) = (replicated(), Replica::default());
    let seq = send(&mut q, &mut r, msg("a", None), T0);
    let d = receive(&mut q, &mut r, 1, T0);
    assert_eq!(
        r.mark_of(seq),
        Some(DeliveryMark::Leased {
            lease: d[0].lease,
            owner: Some(SessionId(1)),
            until_ms: T0 + LEASE_MS,
            lease_ms: LEASE_MS,
        })
    );
    let (res, fx) = q.nack(
        Caller::Client(Some(SessionId(1))),
        &[d[0].lease_ref()],
        None,
        false,
        T0 + 1,
    );
    assert_eq!(res, vec![Ok(())]);
    r.apply(&fx);
    assert_eq!(
        r.mark_of(seq),
        Some(DeliveryMark::Backoff {
            until_ms: T0 + 1 + 10_000
        })
    );
    let d = receive(&mut q, &mut r, 1, T0 + 20_000);
    let (_, fx) = q.nack(
        Caller::Client(Some(SessionId(1))),
        &[d[0].lease_ref()],
        Some(0),
        false,
        T0 + 20_001,
    );
    r.apply(&fx);
    assert_eq!(
        r.mark_of(seq),
        None,
        "a return without delay clears the lease"
    );
    assert_eq!(r.messages[&seq].1, 2, "the count stays");
}

#[test]
fn a_queue_without_written_marks_writes_counts_only_as_it_always_did() {
    let mut q = Queue::new(name(), QueueUid(7), config());
    let mut r = Replica::default();
    send(&mut q, &mut r, msg("a", None), T0);
    let req = ReceiveRequest {
        owner: Some(SessionId(1)),
        max_messages: 1,
        wait: Wait::NoWait,
        lease_ms: Some(LEASE_MS),
        selector: None,
    };
    let (out, fx) = q.receive(req, T0).unwrap();
    assert!(matches!(
        fx.persist.as_slice(),
        [PersistOp::SetDeliveryCount { count: 1, .. }]
    ));
    let ReceiveOutcome::Delivered(d) = out else {
        panic!("{out:?}")
    };
    let (_, fx) = q.nack(
        Caller::Client(Some(SessionId(1))),
        &[d[0].lease_ref()],
        None,
        false,
        T0 + 1,
    );
    assert!(fx.persist.is_empty(), "a return writes nothing: {fx:?}");
}

#[test]
fn a_new_leader_honours_a_written_lease_so_the_consumers_ack_lands() {
    let (mut q, mut r) = (replicated(), Replica::default());
    send(&mut q, &mut r, msg("a", None), T0);
    send(&mut q, &mut r, msg("b", None), T0);
    let d = receive(&mut q, &mut r, 1, T0);
    assert_eq!(d.len(), 2);
    let (res, fx) = q.ack(
        Caller::Client(Some(SessionId(1))),
        &[d[0].lease_ref()],
        T0 + 1,
    );
    assert_eq!(res, vec![Ok(())]);
    r.apply(&fx);

    let mut next = r.take_over(T0 + 2_000);
    next.begin_lease_ids_at(LeaseId(7 << 32));
    assert!(
        receive(&mut next, &mut r, 2, T0 + 2_000).is_empty(),
        "the leased message is not handed to anyone else"
    );
    send(&mut next, &mut r, msg("c", None), T0 + 2_000);
    let fresh = receive(&mut next, &mut r, 2, T0 + 2_000);
    assert_eq!(fresh.len(), 1);
    assert!(
        fresh[0].lease >= LeaseId(7 << 32),
        "this run's leases are numbered where no earlier run's are"
    );
    let (res, fx) = next.ack(
        Caller::Client(Some(SessionId(1))),
        &[d[1].lease_ref()],
        T0 + 2_001,
    );
    assert_eq!(
        res,
        vec![Ok(())],
        "the old leader's delivery is acknowledged"
    );
    r.apply(&fx);
    assert!(!r.messages.contains_key(&d[1].message.seq));
    assert_eq!(r.messages.len(), 1, "only c is left");
    let (res, _) = next.ack(
        Caller::Client(Some(SessionId(1))),
        &[d[0].lease_ref()],
        T0 + 2_002,
    );
    assert!(res[0].is_err(), "an acked message stays acked");
}

#[test]
fn a_written_lease_runs_at_least_its_length_from_the_takeover_then_comes_back_redelivered() {
    let (mut q, mut r) = (replicated(), Replica::default());
    let seq = send(&mut q, &mut r, msg("a", None), T0);
    let d = receive(&mut q, &mut r, 1, T0);
    // The old leader renewed it (not written), then died long after its written expiry.
    let takeover = T0 + 60_000;
    let mut next = r.take_over(takeover);
    assert_eq!(
        next.state_of(seq),
        Some(MessageState::Leased {
            lease: d[0].lease,
            owner: Some(SessionId(1)),
            until_ms: takeover + LEASE_MS,
        })
    );
    let (renewed, fx) = next.renew_session(SessionId(1), takeover + 1_000);
    assert_eq!(
        renewed, 1,
        "the session's heartbeat renews it on the new leader"
    );
    r.apply(&fx);
    assert!(receive(&mut next, &mut r, 2, takeover + LEASE_MS).is_empty());
    let lapsed = takeover + 1_000 + LEASE_MS;
    let fx = next.tick(lapsed);
    r.apply(&fx);
    assert_eq!(
        r.mark_of(seq),
        Some(DeliveryMark::Backoff {
            until_ms: lapsed + 10_000
        }),
        "it came back through the redelivery policy"
    );
    let again = receive(&mut next, &mut r, 2, lapsed + 10_000);
    assert_eq!(again.len(), 1);
    assert!(again[0].redelivered());
    assert_eq!(again[0].delivery_count, 2);
    assert_ne!(again[0].lease_ref(), d[0].lease_ref());
    let (res, _) = next.ack(
        Caller::Client(Some(SessionId(1))),
        &[d[0].lease_ref()],
        lapsed + 10_001,
    );
    assert!(
        res[0].is_err(),
        "the lapsed delivery cannot be acked any more"
    );
}

#[test]
fn a_poison_message_keeps_its_back_off_across_a_takeover() {
    let (mut q, mut r) = (replicated(), Replica::default());
    let seq = send(&mut q, &mut r, msg("poison", None), T0);
    let d = receive(&mut q, &mut r, 1, T0);
    let (_, fx) = q.nack(
        Caller::Client(Some(SessionId(1))),
        &[d[0].lease_ref()],
        None,
        false,
        T0 + 10,
    );
    r.apply(&fx);
    let mut next = r.take_over(T0 + 20);
    assert_eq!(
        next.state_of(seq),
        Some(MessageState::Scheduled {
            until_ms: T0 + 10 + 10_000
        })
    );
    assert!(receive(&mut next, &mut r, 1, T0 + 9_000).is_empty());
    let fx = next.tick(T0 + 10 + 10_000);
    r.apply(&fx);
    assert_eq!(receive(&mut next, &mut r, 1, T0 + 10 + 10_000).len(), 1);
}

#[test]
fn a_session_holding_a_groups_message_keeps_the_group_across_a_takeover() {
    let (mut q, mut r) = (replicated(), Replica::default());
    send(&mut q, &mut r, msg("g1", Some("g")), T0);
    let d = receive(&mut q, &mut r, 1, T0);
    assert_eq!(d.len(), 1);
    send(&mut q, &mut r, msg("g2", Some("g")), T0 + 1);
    send(&mut q, &mut r, msg("other", None), T0 + 1);

    let mut next = r.take_over(T0 + 100);
    let to_two = receive(&mut next, &mut r, 2, T0 + 100);
    let bodies: Vec<_> = to_two.iter().map(|d| d.message.body.clone()).collect();
    assert_eq!(
        bodies,
        vec![bytes::Bytes::from_static(b"other")],
        "group g stays with session 1"
    );
    let to_one = receive(&mut next, &mut r, 1, T0 + 101);
    assert_eq!(to_one.len(), 1);
    assert_eq!(to_one[0].message.body, bytes::Bytes::from_static(b"g2"));
}

#[test]
fn a_delivery_that_never_reached_its_receiver_clears_its_lease() {
    let (mut q, mut r) = (replicated(), Replica::default());
    let seq = send(&mut q, &mut r, msg("a", None), T0);
    let d = receive(&mut q, &mut r, 1, T0);
    let (res, fx) = q.return_undelivered(Caller::Backend, &[d[0].lease_ref()], T0 + 1);
    assert_eq!(res, vec![Ok(())]);
    r.apply(&fx);
    assert_eq!((r.messages[&seq].1, r.mark_of(seq)), (0, None));
    let mut next = r.take_over(T0 + 2);
    assert_eq!(next.state_of(seq), Some(MessageState::Ready));
    let again = receive(&mut next, &mut r, 2, T0 + 2);
    assert!(!again[0].redelivered());
}

fn bodies(d: &[Delivery]) -> Vec<String> {
    d.iter()
        .map(|d| String::from_utf8_lossy(&d.message.body).into_owned())
        .collect()
}

/// Issue 24: the old leader leased `lost1` and `lost2` to session 1, wrote the leases and died
/// before its answer reached the front-end, which passed on `got` alone. The next leader gives
/// the lost ones back at once (flagged redelivered next time); `got` stays the session's, and
/// so do the deliveries this leader made itself (one may be on its way to the client) and
/// another session's.
#[test]
fn lost_deliveries_of_an_earlier_run_come_back_at_once_and_nothing_else_does() {
    let (mut q, mut r) = (replicated(), Replica::default());
    for body in ["got", "lost1", "lost2"] {
        send(&mut q, &mut r, msg(body, None), T0);
    }
    let old = receive(&mut q, &mut r, 1, T0);
    assert_eq!(bodies(&old), ["got", "lost1", "lost2"]);
    send(&mut q, &mut r, msg("theirs", None), T0);
    let theirs = receive(&mut q, &mut r, 2, T0);
    assert_eq!(theirs.len(), 1);

    let now = T0 + 1_000;
    let mut next = r.take_over(now);
    next.begin_lease_ids_at(LeaseId(7 << 32));
    send(&mut next, &mut r, msg("new", None), now);
    let fresh = receive(&mut next, &mut r, 1, now);
    assert_eq!(bodies(&fresh), ["new"]);

    let keep = [(old[0].message.seq, old[0].lease)];
    let (released, fx) = next.release_lost(SessionId(1), &keep, now);
    r.apply(&fx);
    next.check_invariants();
    assert_eq!(released, 2);
    for lost in &old[1..] {
        assert!(
            matches!(
                r.mark_of(lost.message.seq),
                Some(DeliveryMark::Backoff { .. })
            ),
            "the written lease is over: a later leader must not honour it"
        );
    }
    let (again, _) = next.release_lost(SessionId(1), &keep, now);
    assert_eq!(again, 0, "nothing more to return");

    for (session, d) in [(1, &old[0]), (1, &fresh[0]), (2, &theirs[0])] {
        let (res, _) = next.ack(
            Caller::Client(Some(SessionId(session))),
            &[d.lease_ref()],
            now,
        );
        assert_eq!(res, vec![Ok(())], "still leased to session {session}");
    }
    // Back through the redelivery policy (this queue's waits 10 s first), flagged.
    let back = receive(&mut next, &mut r, 3, now + 10_000);
    assert_eq!(bodies(&back), ["lost1", "lost2"]);
    assert!(back
        .iter()
        .all(|d| d.redelivered() && d.delivery_count == 2));
}

/// The same leader serving anew at the same term (its run was fenced) numbers its leases
/// above the ones it read back: those are an earlier run's all the same.
#[test]
fn a_run_begun_anew_at_the_same_term_returns_the_lost_deliveries_of_the_run_before() {
    let (mut q, mut r) = (replicated(), Replica::default());
    q.begin_lease_ids_at(LeaseId(7 << 32));
    send(&mut q, &mut r, msg("lost", None), T0);
    assert_eq!(receive(&mut q, &mut r, 1, T0).len(), 1);
    let mut anew = r.take_over(T0 + 1);
    anew.begin_lease_ids_at(LeaseId(7 << 32));
    let (released, _) = anew.release_lost(SessionId(1), &[], T0 + 1);
    assert_eq!(released, 1);
}

/// A queue kept by one node writes no lease: nothing it holds is an earlier run's.
#[test]
fn an_unreplicated_queue_returns_nothing_as_lost() {
    let mut q = Queue::new(name(), QueueUid(7), config());
    let mut r = Replica::default();
    send(&mut q, &mut r, msg("a", None), T0);
    assert_eq!(receive(&mut q, &mut r, 1, T0).len(), 1);
    let (released, fx) = q.release_lost(SessionId(1), &[], T0 + 1);
    assert_eq!((released, fx.persist.len()), (0, 0));
    q.check_invariants();
}
