//! Paging corners, one test each: the cursor never steps over a write still on its way, a message
//! brought in out of turn is never brought in twice, a selector's match behind many others is
//! found (through the correlation-id index without any page read), higher priorities in the store
//! go first, purge and limits count what is paged out, and the ActiveMQ 5.1 story (consumers
//! churning over a queue far larger than its budget) loses and duplicates nothing.

#![allow(clippy::unwrap_used)]

mod support;

use std::collections::BTreeMap;

use ferry_kernel::{
    Caller, Delivery, Effects, KernelError, NewMessage, PersistOp, Priority, Queue, QueueConfig,
    QueueName, QueueUid, ReceiveOutcome, ReceiveRequest, Seq, SessionId, Wait,
};
use support::*;

#[test]
fn a_budget_keeps_most_of_a_long_queue_in_the_store_and_order_is_kept() {
    let mut store = FakeStore::default();
    let mut q = queue(2_000);
    for i in 0..1_000 {
        send(&mut q, &mut store, vec![msg(i)], T0);
    }
    let (paged, _) = q.paged_out();
    assert!(paged > 800, "only {paged} of 1000 paged out");
    assert!(
        q.resident_bytes() <= 2_000 + 16 * 64,
        "{}",
        q.resident_bytes()
    );
    assert_eq!(q.stats().ready, 1_000, "paged-out messages count as ready");
    let mut got = vec![];
    while got.len() < 1_000 {
        let d = receive(&mut q, &mut store, req(1, 7, None), T0);
        assert!(!d.is_empty(), "stalled after {}", got.len());
        ack(&mut q, &mut store, &d, T0);
        got.extend(d.iter().map(body));
        assert!(q.resident_bytes() <= 2_000 + 16 * 64 + 7 * 64);
    }
    let want: Vec<String> = (0..1_000).map(|i| format!("m{i}")).collect();
    assert_eq!(got, want);
    assert!(store.messages.is_empty());
    assert_eq!(q.paged_out(), (0, 0));
}

#[test]
fn the_cursor_never_steps_over_a_write_still_on_its_way() {
    let mut store = FakeStore::default();
    let mut q = queue(0);
    send(&mut q, &mut store, (0..5).map(msg).collect(), T0);
    // Messages 6..=10 are written but their write is not applied yet: reads cannot see them.
    store.visible_below = Some(6);
    send(&mut q, &mut store, (5..10).map(msg).collect(), T0);
    let mut got = vec![];
    for _ in 0..20 {
        let d = receive(&mut q, &mut store, req(1, 3, None), T0);
        ack(&mut q, &mut store, &d, T0);
        got.extend(d.iter().map(body));
    }
    assert_eq!(got, ["m0", "m1", "m2", "m3", "m4"]);
    // The write lands; the next fill sees it, and nothing was skipped.
    store.visible_below = None;
    settle(&mut q, &mut store, Effects::default(), T0);
    for _ in 0..20 {
        let d = receive(&mut q, &mut store, req(1, 3, None), T0);
        ack(&mut q, &mut store, &d, T0);
        got.extend(d.iter().map(body));
    }
    let want: Vec<String> = (0..10).map(|i| format!("m{i}")).collect();
    assert_eq!(got, want);
}

#[test]
fn a_message_brought_in_out_of_turn_is_never_brought_in_twice() {
    let mut store = FakeStore::default();
    let mut q = queue(0);
    send(&mut q, &mut store, (0..50).map(msg).collect(), T0);
    // A selector pulls message 40 from behind the cursor; it is acknowledged, but the store
    // does not apply the delete (as if the write were still on its way).
    let d = receive(&mut q, &mut store, req(1, 1, Some("i = 40")), T0);
    assert_eq!(d.iter().map(body).collect::<Vec<_>>(), ["m40"]);
    let refs: Vec<_> = d.iter().map(Delivery::lease_ref).collect();
    let (results, fx) = q.ack(Caller::Backend, &refs, T0);
    assert!(results[0].is_ok());
    assert!(matches!(&fx.persist[..], [PersistOp::DeleteMessage(m)] if m.seq == d[0].message.seq));
    // The store still holds it: the cursor passes it without bringing it back.
    settle(&mut q, &mut store, Effects::default(), T0);
    // One at a time, so the window is filled by page reads (not by receives pulling more).
    let mut got = vec![];
    for _ in 0..100 {
        let d = receive(&mut q, &mut store, req(2, 1, None), T0);
        ack(&mut q, &mut store, &d, T0);
        got.extend(d.iter().map(body));
    }
    let want: Vec<String> = (0..50)
        .filter(|&i| i != 40)
        .map(|i| format!("m{i}"))
        .collect();
    assert_eq!(got, want);
}

#[test]
fn a_correlation_id_behind_many_others_is_found_through_the_index() {
    let mut store = FakeStore::default();
    let mut q = queue(10_000);
    let mut batch: Vec<NewMessage> = (0..20_000).map(msg).collect();
    batch.push(NewMessage {
        correlation_id: Some("reply-42".into()),
        ..msg(20_000)
    });
    send(&mut q, &mut store, batch, T0);
    assert!(q.paged_out().0 > 19_000);
    let reads = store.page_reads.get();
    let d = receive(
        &mut q,
        &mut store,
        req(1, 1, Some("JMSCorrelationID = 'reply-42'")),
        T0,
    );
    assert_eq!(d.iter().map(body).collect::<Vec<_>>(), ["m20000"]);
    assert_eq!(store.index_lookups.get(), 1);
    assert_eq!(store.page_reads.get(), reads, "no page read, no scan");
    // Any other selector scans the store in chunks and still finds its match.
    let d = receive(&mut q, &mut store, req(1, 1, Some("i = 19999")), T0);
    assert_eq!(d.iter().map(body).collect::<Vec<_>>(), ["m19999"]);
}

#[test]
fn a_higher_priority_in_the_store_goes_before_lower_ones_in_memory() {
    let mut store = FakeStore::default();
    let mut q = queue(300);
    send(&mut q, &mut store, (0..20).map(msg).collect(), T0);
    let urgent = |i| NewMessage {
        priority: Priority::new(8).unwrap(),
        ..msg(i)
    };
    send(&mut q, &mut store, (100..103).map(urgent).collect(), T0);
    let d = receive(&mut q, &mut store, req(1, 5, None), T0);
    assert_eq!(
        d.iter().map(body).collect::<Vec<_>>(),
        ["m100", "m101", "m102", "m0", "m1"]
    );
}

#[test]
fn purge_removes_paged_out_messages_but_not_delivered_ones() {
    let mut store = FakeStore::default();
    let mut q = queue(0);
    send(&mut q, &mut store, (0..30).map(msg).collect(), T0);
    // One delivered message pulled from the middle of the store.
    let held = receive(&mut q, &mut store, req(1, 1, Some("i = 15")), T0);
    assert_eq!(held.len(), 1);
    let (n, fx) = q.purge(T0);
    assert_eq!(n, 29);
    settle(&mut q, &mut store, fx, T0);
    assert_eq!(q.paged_out(), (0, 0));
    assert_eq!(
        store.messages.len(),
        1,
        "only the delivered message is left"
    );
    ack(&mut q, &mut store, &held, T0);
    assert!(store.messages.is_empty());
    assert_eq!(q.stats().ready, 0);
}

#[test]
fn limits_count_paged_out_messages() {
    let mut store = FakeStore::default();
    let mut q = Queue::new(
        QueueName::new("limited").unwrap(),
        QueueUid(9),
        QueueConfig {
            max_messages: Some(100),
            max_bytes: Some(100_000),
            ..QueueConfig::default()
        },
    );
    q.set_memory_budget(0);
    send(&mut q, &mut store, (0..100).map(msg).collect(), T0);
    assert!(q.paged_out().0 >= 90);
    let err = q.send(vec![msg(100)], T0).unwrap_err();
    assert!(
        matches!(
            err,
            KernelError::QueueFull {
                limit_name: "max_messages",
                value: 101,
                limit: 100,
                ..
            }
        ),
        "{err}"
    );
    assert!(err.to_string().contains("max_messages = 100"), "{err}");
    let d = receive(&mut q, &mut store, req(1, 1, None), T0);
    ack(&mut q, &mut store, &d, T0);
    send(&mut q, &mut store, vec![msg(100)], T0);
    let big = NewMessage {
        body: vec![0; 99_000],
        persistent: true,
        ..NewMessage::default()
    };
    let mut q2 = Queue::new(
        QueueName::new("bytes").unwrap(),
        QueueUid(10),
        QueueConfig {
            max_bytes: Some(100_000),
            ..QueueConfig::default()
        },
    );
    q2.set_memory_budget(0);
    let (_, fx) = q2.send(vec![big.clone()], T0).unwrap();
    store.apply(&fx);
    let err = q2.send(vec![big], T0).unwrap_err();
    assert!(
        matches!(
            err,
            KernelError::QueueFull {
                limit_name: "max_bytes",
                ..
            }
        ),
        "{err}"
    );
}

/// The ActiveMQ 5.1 story at the kernel: a queue far larger than its budget, consumers that
/// come and go (some closing with messages unacknowledged, some with selectors), restarts. In
/// the end every message was acknowledged exactly once, and only redeliveries are flagged.
#[test]
fn consumers_churning_over_a_paged_queue_lose_and_duplicate_nothing() {
    const N: u64 = 5_000;
    let mut store = FakeStore::default();
    let mut q = queue(4_000);
    for chunk in (0..N).collect::<Vec<_>>().chunks(100) {
        send(
            &mut q,
            &mut store,
            chunk.iter().map(|&i| msg(i)).collect(),
            T0,
        );
    }
    let mut acked: BTreeMap<String, u32> = BTreeMap::new();
    let mut seen_first_time: BTreeMap<String, u32> = BTreeMap::new();
    let mut now = T0;
    let mut round = 0u64;
    while acked.len() < N as usize {
        round += 1;
        assert!(round < 10_000, "stalled with {} acknowledged", acked.len());
        now += 1;
        let session = SessionId(round);
        let selector = match round % 4 {
            0 => Some(format!(
                "i >= {} AND i < {}",
                (round * 37) % N,
                (round * 37) % N + 500
            )),
            _ => None,
        };
        let d = receive(
            &mut q,
            &mut store,
            ReceiveRequest {
                owner: Some(session),
                ..req(0, 50, selector.as_deref())
            },
            now,
        );
        for x in &d {
            if !x.redelivered() {
                *seen_first_time.entry(body(x)).or_default() += 1;
            }
        }
        match round % 5 {
            // Closes without acknowledging: everything comes back, flagged redelivered.
            0 => {
                let (_, fx) = q.release_session(session, now);
                settle(&mut q, &mut store, fx, now);
            }
            // Acknowledges half, then dies.
            1 => {
                ack(&mut q, &mut store, &d[..d.len() / 2], now);
                acked_all(&mut acked, &d[..d.len() / 2]);
                let (_, fx) = q.release_session(session, now);
                settle(&mut q, &mut store, fx, now);
            }
            _ => {
                ack(&mut q, &mut store, &d, now);
                acked_all(&mut acked, &d);
                let (_, fx) = q.release_session(session, now);
                settle(&mut q, &mut store, fx, now);
            }
        }
        if round.is_multiple_of(97) {
            q = restart(&store, now);
            settle(&mut q, &mut store, Effects::default(), now);
        }
    }
    assert!(acked.values().all(|&n| n == 1), "acknowledged twice");
    assert!(
        seen_first_time.values().all(|&n| n == 1),
        "delivered twice without the redelivered flag"
    );
    assert_eq!(acked.len() as u64, N);
    assert!(store.messages.is_empty());
    assert_eq!(q.stats().ready + q.stats().leased, 0);
}

fn acked_all(acked: &mut BTreeMap<String, u32>, d: &[Delivery]) {
    for x in d {
        *acked.entry(body(x)).or_default() += 1;
    }
}

fn restart(store: &FakeStore, now: u64) -> Queue {
    let mut q = Queue::recover(
        QueueName::new("paged").unwrap(),
        QueueUid(7),
        queue(0).config().clone(),
        Seq(store.reserved),
        vec![],
        vec![],
        now,
    );
    q.set_memory_budget(4_000);
    for p in 0..=9u8 {
        let (count, bytes) = store
            .messages
            .iter()
            .filter(|((std::cmp::Reverse(mp), _), _)| *mp == p)
            .fold((0, 0), |(c, b), (_, (m, _))| (c + 1, b + m.size_bytes()));
        q.restore_paged_out(Priority::new(p.into()).unwrap(), count, bytes);
    }
    q
}

#[test]
fn a_selective_receiver_behind_a_long_run_is_answered_in_bounded_looks() {
    let mut store = FakeStore::default();
    let mut q = queue(0);
    send(&mut q, &mut store, (0..50_000).map(msg).collect(), T0);
    send(&mut q, &mut store, vec![msg(1_000_000)], T0);
    // Each receive looks at 20 000 paged-out messages at most; the selector remembers how far
    // the store holds nothing for it, so the next receive goes on from there.
    let mut tries = 0;
    let got = loop {
        tries += 1;
        let reads = store.page_reads.get();
        let d = receive(&mut q, &mut store, req(1, 1, Some("i = 1000000")), T0);
        assert!(
            store.page_reads.get() - reads <= ferry_kernel::SCAN_LOOK_MAX / 1_000 + 2,
            "one receive read too much"
        );
        if !d.is_empty() {
            break d;
        }
    };
    assert_eq!(got.iter().map(body).collect::<Vec<_>>(), ["m1000000"]);
    assert_eq!(tries, 3, "50 000 messages in looks of 20 000");

    // A receiver that waits is found by the fills that follow, each looking a bounded way.
    send(&mut q, &mut store, vec![msg(2_000_000)], T0);
    let (out, fx) = q
        .receive_paged(
            ReceiveRequest {
                wait: Wait::Until(T0 + 60_000),
                ..req(2, 1, Some("i = 2000000 OR i = 3000000"))
            },
            &store,
            T0,
        )
        .unwrap();
    assert!(matches!(out, ReceiveOutcome::Parked(_)), "{out:?}");
    store.apply(&fx);
    let mut handed = vec![];
    let mut fills = 0;
    while q.more_to_look_at() {
        fills += 1;
        let fx = q.fill(&store, 16, T0).unwrap();
        store.apply(&fx);
        handed.extend(fx.handed);
        q.check_invariants();
    }
    assert!(fills >= 1);
    assert_eq!(handed.len(), 1, "the parked receiver got its message");
    assert_eq!(body(&handed[0].1[0]), "m2000000");
}

#[test]
fn a_selector_on_one_correlation_id_or_group_looks_at_those_messages_only_in_order() {
    let mut store = FakeStore::default();
    let mut q = queue(u64::MAX);
    let m = |i: u64, corr: &str, group: Option<&str>, p: u32| NewMessage {
        correlation_id: Some(corr.into()),
        group_id: group.map(str::to_owned),
        priority: Priority::new(p).unwrap(),
        ..msg(i)
    };
    send(
        &mut q,
        &mut store,
        vec![
            m(0, "a", None, 4),
            m(1, "b", Some("g"), 4),
            m(2, "b", None, 4),
            m(3, "b", Some("g"), 7),
            m(4, "a", Some("g"), 4),
            m(5, "b", None, 4),
        ],
        T0,
    );
    let d = receive(
        &mut q,
        &mut store,
        req(1, 10, Some("JMSCorrelationID = 'b' AND i > 1")),
        T0,
    );
    assert_eq!(
        bodies(&d),
        ["m3", "m2", "m5"],
        "priority first, then oldest"
    );
    let d = receive(
        &mut q,
        &mut store,
        req(1, 10, Some("JMSXGroupID = 'g'")),
        T0,
    );
    assert_eq!(bodies(&d), ["m1", "m4"]);
    let d = receive(
        &mut q,
        &mut store,
        req(2, 10, Some("JMSCorrelationID = 'a'")),
        T0,
    );
    assert_eq!(bodies(&d), ["m0"]);
    ack(&mut q, &mut store, &d, T0);
    let d = receive(
        &mut q,
        &mut store,
        req(2, 10, Some("JMSCorrelationID = 'a'")),
        T0,
    );
    assert!(d.is_empty());
    q.check_invariants();
}
