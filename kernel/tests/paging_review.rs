//! Paging corners a review found, one test each (each failed before its fix), named by the
//! behaviour it expects, with a line on what went wrong. Helpers as in `paging.rs`.

#![allow(clippy::unwrap_used)]

mod support;

use ferry_kernel::{
    Effects, NewMessage, Priority, Queue, ReceiveOutcome, ReceiveRequest, SessionId, Wait, WaiterId,
};
use support::*;

#[test]
fn a_short_look_into_the_store_never_lets_a_newer_resident_message_overtake_an_older_match() {
    let mut store = FakeStore::default();
    let mut q = queue(0);
    send(&mut q, &mut store, (0..25_000).map(msg).collect(), T0);
    send(&mut q, &mut store, vec![msg(1_000_000)], T0);
    assert!(q.paged_out().0 > 24_000);
    // A transaction sends a match later; it commits (committed sends stay resident).
    let tx = SessionId(99);
    let late = NewMessage {
        body: b"late".to_vec(),
        ..msg(1_000_000)
    };
    let (_, fx) = q.stage(tx, vec![late], T0).unwrap();
    settle(&mut q, &mut store, fx, T0);
    let (res, fx) = q.commit(tx, &[], T0);
    res.unwrap();
    settle(&mut q, &mut store, fx, T0);
    let mut got = vec![];
    for _ in 0..3 {
        got.extend(bodies(&receive(
            &mut q,
            &mut store,
            req(1, 1, Some("i = 1000000")),
            T0,
        )));
    }
    assert_eq!(got, ["m1000000", "late"], "FIFO within a priority");
}

// Postmortem: the same for a parked receiver: a fill whose look for it stopped at the limit
// still handed it a newer resident message (dispatch runs with the flags set aside).
#[test]
fn a_parked_receiver_still_looking_in_the_store_is_not_handed_a_newer_resident_message() {
    let mut store = FakeStore::default();
    let mut q = queue(0);
    send(&mut q, &mut store, (0..50_000).map(msg).collect(), T0);
    send(&mut q, &mut store, vec![msg(1_000_000)], T0);
    // A transaction has staged a match; it commits while the receiver is still being looked
    // for (each fill looks at 20 000 paged-out messages).
    let tx = SessionId(99);
    let late = NewMessage {
        body: b"late".to_vec(),
        ..msg(1_000_000)
    };
    let (_, fx) = q.stage(tx, vec![late], T0).unwrap();
    settle(&mut q, &mut store, fx, T0);
    let r = ReceiveRequest {
        wait: Wait::Forever,
        ..req(1, 1, Some("i = 1000000"))
    };
    let (out, fx) = receive_out(&mut q, &store, r, T0);
    let ReceiveOutcome::Parked(w) = out else {
        panic!("{out:?}")
    };
    let mut handed = settle(&mut q, &mut store, fx, T0);
    let (res, fx) = q.commit(tx, &[], T0);
    res.unwrap();
    handed.extend(settle(&mut q, &mut store, fx, T0));
    while q.more_to_look_at() {
        handed.extend(settle(&mut q, &mut store, Effects::default(), T0));
    }
    let got: Vec<(WaiterId, Vec<String>)> = handed.iter().map(|(id, d)| (*id, bodies(d))).collect();
    assert_eq!(
        got,
        [(w, vec!["m1000000".to_string()])],
        "FIFO within a priority"
    );
}

// Postmortem: the look for parked receivers counted each message for one receiver as if no
// group would change hands, and stopped once every receiver had its count; the hand-out then
// gave a group to the first receiver, the second could not take its candidate, and its flag was
// already cleared, so it waited while a message it takes sat in the store.
#[test]
fn a_parked_receiver_whose_candidate_went_to_another_session_with_its_group_is_still_served() {
    let mut store = FakeStore::default();
    let mut q = queue(0);
    // A resident message nobody wants keeps the level from being read in; one paged out.
    send(&mut q, &mut store, vec![nmsg("x", 9, None, false)], T0);
    send(&mut q, &mut store, vec![nmsg("y", 9, None, true)], T0);
    assert_eq!(q.paged_out().0, 1);
    let parked = |q: &mut Queue, store: &mut FakeStore, session, sel| {
        let r = ReceiveRequest {
            wait: Wait::Forever,
            ..req(session, 1, Some(sel))
        };
        let (out, fx) = receive_out(q, store, r, T0);
        settle(q, store, fx, T0);
        match out {
            ReceiveOutcome::Parked(id) => id,
            other => panic!("{other:?}"),
        }
    };
    let w1 = parked(&mut q, &mut store, 1, "n = 1");
    let w2 = parked(&mut q, &mut store, 2, "n = 2");
    let (_, fx) = q
        .send(
            vec![
                nmsg("a", 1, Some("G"), true),
                nmsg("b", 2, Some("G"), true),
                nmsg("c", 2, None, true),
            ],
            T0,
        )
        .unwrap();
    let handed = settle(&mut q, &mut store, fx, T0);
    let got: Vec<(WaiterId, Vec<String>)> = handed.iter().map(|(id, d)| (*id, bodies(d))).collect();
    // w1 takes a (and with it group G); b is then not w2's to take, but c is.
    assert_eq!(
        got,
        [(w1, vec!["a".to_string()]), (w2, vec!["c".to_string()])]
    );
}

// Postmortem: the index path judged "looked short" after dropping the keys of resident
// messages, so 20 000 leased matches ahead in the index hid every paged-out one and the
// receive answered empty.
#[test]
fn a_correlation_id_receive_finds_a_paged_out_match_behind_many_leased_ones() {
    let mut store = FakeStore::default();
    let mut q = queue(u64::MAX);
    let x = |i: u64| NewMessage {
        correlation_id: Some("X".into()),
        ..msg(i)
    };
    send(&mut q, &mut store, (0..20_000).map(x).collect(), T0);
    // All of them are delivered and held.
    for s in 0..20 {
        let d = receive(&mut q, &mut store, req(100 + s, 1_000, None), T0);
        assert_eq!(d.len(), 1_000);
    }
    // The budget shrinks; a resident message nobody asks for, then one more X, paged out.
    q.set_memory_budget(0);
    send(&mut q, &mut store, vec![nmsg("filler", 0, None, false)], T0);
    send(&mut q, &mut store, vec![x(20_000)], T0);
    assert_eq!(q.paged_out().0, 1);
    let d = receive(
        &mut q,
        &mut store,
        req(1, 1, Some("JMSCorrelationID = 'X'")),
        T0,
    );
    assert_eq!(bodies(&d), ["m20000"]);
}

// Postmortem: a receive that does not wait looks at the same 20 000 paged-out messages every
// time when they fail for a reason the selector memo does not cover (a group held by another
// session): a polling consumer never reaches the free message behind them.
#[test]
fn a_polling_receiver_reaches_a_free_message_behind_a_long_run_of_a_held_group() {
    let mut store = FakeStore::default();
    let mut q = queue(0);
    let g = |i: u64| NewMessage {
        group_id: Some("G".into()),
        ..msg(i)
    };
    send(&mut q, &mut store, vec![g(0)], T0);
    // Session 1 takes group G with its first message, and keeps it.
    assert_eq!(
        bodies(&receive(&mut q, &mut store, req(1, 1, None), T0)),
        ["m0"]
    );
    send(&mut q, &mut store, (1..25_000).map(g).collect(), T0);
    send(&mut q, &mut store, vec![msg(1_000_000)], T0);
    let mut got = vec![];
    for _ in 0..10 {
        got.extend(bodies(&receive(&mut q, &mut store, req(2, 1, None), T0)));
        if !got.is_empty() {
            break;
        }
    }
    assert_eq!(got, ["m1000000"]);
}

// Postmortem: a flag "parked receivers must look at priority p" outlives the level's last
// paged-out message when another receive pulls it in; the server only calls `Queue::fill`
// (which clears such flags) while something is paged out, and dispatch waits for the flag, so
// the parked receiver never gets the matching message sent later.
#[test]
fn a_parked_receiver_is_served_after_the_store_emptied_while_it_was_flagged() {
    let mut store = FakeStore::default();
    let mut q = queue(0);
    let (_, fx) = q.send(vec![nmsg("f", 9, None, false)], T0).unwrap();
    settle_like_shell(&mut q, &mut store, fx, T0);
    let (_, fx) = q.send(vec![nmsg("a", 0, None, true)], T0).unwrap();
    settle_like_shell(&mut q, &mut store, fx, T0);
    assert_eq!(q.paged_out().0, 1);
    // A transaction commits a message at a higher priority; its write is still on its way.
    let tx = SessionId(50);
    let c = NewMessage {
        priority: Priority::new(6).unwrap(),
        ..nmsg("c", 0, None, true)
    };
    let (ids, fx) = q.stage(tx, vec![c], T0).unwrap();
    settle_like_shell(&mut q, &mut store, fx, T0);
    let c_seq: u64 = ids[0].as_str().rsplit_once('-').unwrap().1.parse().unwrap();
    let (res, fx) = q.commit(tx, &[], T0);
    res.unwrap();
    store.visible_below = Some(c_seq);
    settle_like_shell(&mut q, &mut store, fx, T0);
    // W parks while the store is not settled: it is flagged for a rescan.
    let r = ReceiveRequest {
        wait: Wait::Forever,
        ..req(1, 1, Some("n = 1"))
    };
    let (out, fx) = receive_out(&mut q, &store, r, T0);
    let ReceiveOutcome::Parked(w) = out else {
        panic!("{out:?}")
    };
    settle_like_shell(&mut q, &mut store, fx, T0);
    // Another receiver takes everything there is, the paged-out message included.
    let (out, fx) = receive_out(&mut q, &store, req(2, 10, None), T0);
    let ReceiveOutcome::Delivered(d) = out else {
        panic!("{out:?}")
    };
    assert_eq!(bodies(&d), ["c", "f", "a"]);
    settle_like_shell(&mut q, &mut store, fx, T0);
    assert_eq!(q.paged_out().0, 0);
    // The write lands; then a message W takes is sent.
    store.visible_below = None;
    settle_like_shell(&mut q, &mut store, Effects::default(), T0);
    let (_, fx) = q.send(vec![nmsg("d", 1, None, true)], T0).unwrap();
    let handed = settle_like_shell(&mut q, &mut store, fx, T0);
    let got: Vec<(WaiterId, Vec<String>)> = handed.iter().map(|(id, d)| (*id, bodies(d))).collect();
    assert_eq!(got, [(w, vec!["d".to_string()])]);
}

/// The fake store, failing every read after the first `ok_reads` page reads.
struct Failing<'a> {
    inner: &'a FakeStore,
    ok_reads: std::cell::Cell<usize>,
}

impl ferry_kernel::PageSource for Failing<'_> {
    type Error = &'static str;

    fn read_page(
        &self,
        p: Priority,
        from: ferry_kernel::Seq,
        max_count: usize,
        max_bytes: u64,
    ) -> Result<ferry_kernel::Page, &'static str> {
        if self.ok_reads.get() == 0 {
            return Err("disk");
        }
        self.ok_reads.set(self.ok_reads.get() - 1);
        Ok(match self.inner.read_page(p, from, max_count, max_bytes) {
            Ok(page) => page,
            Err(never) => match never {},
        })
    }

    fn settled(&self) -> bool {
        self.inner.settled()
    }

    fn find_by_header(
        &self,
        _: ferry_kernel::IndexedHeader,
        _: &str,
        _: usize,
    ) -> Result<Vec<(Priority, ferry_kernel::Seq)>, &'static str> {
        Err("disk")
    }

    fn read_messages(
        &self,
        _: &[(Priority, ferry_kernel::Seq)],
    ) -> Result<Vec<ferry_kernel::RecoveredMessage>, &'static str> {
        Err("disk")
    }
}

// Postmortem: `Queue::fill` applies each page as it reads it (and with it, time: leases run
// out, receivers are handed messages); a read failing after that returned only the error, so
// the hand-off it had already made in the queue never reached the shell: the receiver is gone
// from the queue, its message leased to nobody who knows.
#[test]
fn a_fill_whose_second_read_fails_loses_no_hand_off_it_already_made() {
    let mut store = FakeStore::default();
    let mut q = queue(0);
    let at = |p: u32, name: &str| NewMessage {
        priority: Priority::new(p).unwrap(),
        ..nmsg(name, 9, None, true)
    };
    // Session 2 holds a message W will want, on a short lease.
    send(&mut q, &mut store, vec![nmsg("held", 1, None, true)], T0);
    let held = receive(
        &mut q,
        &mut store,
        ReceiveRequest {
            lease_ms: Some(50),
            ..req(2, 1, None)
        },
        T0,
    );
    assert_eq!(bodies(&held), ["held"]);
    // Two priorities paged out with nothing Ready in memory: a fill reads both.
    let (_, fx) = q.send(vec![at(6, "p6"), at(5, "p5")], T0).unwrap();
    store.apply(&fx);
    assert_eq!(q.paged_out().0, 2);
    let r = ReceiveRequest {
        wait: Wait::Until(T0 + 1_000),
        ..req(1, 1, Some("n = 1"))
    };
    let (out, fx) = receive_out(&mut q, &store, r, T0);
    let ReceiveOutcome::Parked(w) = out else {
        panic!("{out:?}")
    };
    store.apply(&fx);
    // 60 ms later the lease has run out; the first read of the fill works, the second fails.
    let failing = Failing {
        inner: &store,
        ok_reads: std::cell::Cell::new(1),
    };
    let handed = match q.fill(&failing, 16, T0 + 60) {
        Ok(fx) => fx.handed,
        // What the fill did before the failed read is kept for the next operation, which is
        // due at once.
        Err(_) => {
            assert_eq!(q.next_deadline_ms(), Some(0));
            q.tick(T0 + 60).handed
        }
    };
    let reported = handed.iter().any(|(id, _)| *id == w);
    assert!(
        q.waiter_count() == 1 || reported,
        "the waiter left the queue with a message, and nobody was told"
    );
}
