//! Issue 24 §2: a send answered `UNAVAILABLE` (a replicated queue's leader died with the write
//! unconfirmed) is sent again with the same dedup ids, when that is safe, and stored once.

use std::collections::HashMap;

use ferry_proto::pb;
use tonic::Code;

use super::{confirm, confirmed, owned, refused, seen, session};
use crate::fake::{self, Fake};
use crate::{AckMode, Message, Session, RESEND_ATTEMPTS};

/// The queue as the fake keeps it: a message id per dedup id, as a queue with a dedup window
/// does. A request whose ids it has seen stores nothing and answers the first ids.
#[derive(Default)]
struct Queue {
    stored: HashMap<String, String>,
}

impl Queue {
    fn store(&mut self, r: &pb::PublishRequest) -> pb::PublishConfirm {
        let ids: Vec<String> = r
            .messages
            .iter()
            .map(|m| {
                assert!(!m.dedup_id.is_empty(), "a resendable send has dedup ids");
                let next = format!("id-{}", self.stored.len());
                self.stored
                    .entry(m.dedup_id.clone())
                    .or_insert(next)
                    .clone()
            })
            .collect();
        pb::PublishConfirm {
            message_ids: ids,
            ..Default::default()
        }
    }
}

fn unknown(message: &str) -> pb::PublishConfirm {
    pb::PublishConfirm {
        error_code: Code::Unavailable as i32,
        error_message: message.into(),
        ..Default::default()
    }
}

fn dedup_ids(r: &pb::PublishRequest) -> Vec<String> {
    r.messages.iter().map(|m| m.dedup_id.clone()).collect()
}

async fn session_in(fake: &Fake, mode: AckMode) -> Session {
    let connection = fake.client.open_connection("t").await.expect("open");
    connection.create_session(mode).await.expect("session")
}

/// The next dedup window lookup (panics if none comes in the fake's bound).
async fn lookup(fake: &mut Fake) -> String {
    tokio::time::timeout(fake::QUIET_MAX, fake.lookups.recv())
        .await
        .expect("a lookup in time")
        .expect("the fake runs")
}

/// The stored-once path: the leader stored the first try and died before confirming it; the
/// resend, with the same dedup ids, answers the first try's ids and stores nothing new. A send
/// made meanwhile waits behind it.
#[tokio::test(start_paused = true)]
async fn a_send_answered_unavailable_is_resent_with_its_dedup_ids_and_stored_once() {
    let mut fake = fake::start(30_000).await;
    let session = session(&fake).await;
    let mine = Message::text("b").dedup_id("app-1");
    let a = session.send_async("q", vec![Message::text("a"), mine]);
    let mut stream = fake.next_publish().await;
    let first = stream.next().await;
    let ids = dedup_ids(&first);
    assert!(ids[0].starts_with("ferry-client:"), "the client's: {ids:?}");
    assert_eq!(ids[1], "app-1", "the application's own is kept");
    let mut queue = Queue::default();
    queue.store(&first);
    confirm(
        &stream,
        vec![unknown("the outcome of a write to shard-1 is unknown")],
    )
    .await;

    assert_eq!(lookup(&mut fake).await, "q", "its dedup window asked first");
    // A send made once the client knows of the failure waits behind the resend.
    let c = session.send_async("q", vec![Message::text("c")]);
    let again = stream.next().await;
    assert_eq!(seen(&again), owned("q", &["a", "b"]), "resent before c");
    assert_eq!(dedup_ids(&again), ids, "with the same dedup ids");
    let resent = queue.store(&again);
    let third = stream.next().await;
    assert_eq!(seen(&third), owned("q", &["c"]));
    let later = queue.store(&third);
    confirm(&stream, vec![resent, later]).await;

    assert_eq!(a.await.expect("no error for the app"), ["id-0", "id-1"]);
    assert_eq!(c.await.expect("c confirmed"), ["id-2"]);
    assert_eq!(queue.stored.len(), 3, "a and b stored once");
}

/// A stream that breaks `UNAVAILABLE` (not a transport error: the node still answers) with
/// sends unconfirmed: they go again, in order, on a new stream.
#[tokio::test(start_paused = true)]
async fn sends_in_flight_on_a_stream_that_broke_unavailable_go_again_on_a_new_stream() {
    let mut fake = fake::start(30_000).await;
    let session = session(&fake).await;
    let a = session.send_async("q", vec![Message::text("a")]);
    let b = session.send_async("q", vec![Message::text("b")]);
    let mut first = fake.next_publish().await;
    let (ra, rb) = (first.next().await, first.next().await);
    first
        .answer(Err(tonic::Status::unavailable("the node is stopping")))
        .await;
    assert_eq!(lookup(&mut fake).await, "q");
    let mut second = fake.next_publish().await;
    let (again_a, again_b) = (second.next().await, second.next().await);
    assert_eq!(
        (dedup_ids(&again_a), dedup_ids(&again_b)),
        (dedup_ids(&ra), dedup_ids(&rb))
    );
    confirm(&second, vec![confirmed(&["id-a"]), confirmed(&["id-b"])]).await;
    assert_eq!(a.await.expect("a"), ["id-a"]);
    assert_eq!(b.await.expect("b"), ["id-b"]);
}

/// Refusals say what to fix (or that nothing was stored): sending again cannot help.
#[tokio::test(start_paused = true)]
async fn sends_refused_with_a_lasting_error_are_not_resent() {
    let mut fake = fake::start(30_000).await;
    let session = session(&fake).await;
    let lasting = [
        Code::InvalidArgument,
        Code::NotFound,
        Code::ResourceExhausted,
        Code::FailedPrecondition,
        Code::PermissionDenied,
        Code::Aborted,
    ];
    let sends: Vec<_> = lasting
        .iter()
        .map(|_| session.send_async("q", vec![Message::text("x")]))
        .collect();
    let mut stream = fake.next_publish().await;
    for _ in &lasting {
        stream.next().await;
    }
    confirm(&stream, lasting.iter().map(|c| refused(*c)).collect()).await;
    for (send, code) in sends.into_iter().zip(lasting) {
        let err = send.await.expect_err("refused");
        assert_eq!(err.code(), Some(code), "{err}");
    }
    // The next thing on the stream is the next send, not a resend.
    let next = session.send_async("q", vec![Message::text("next")]);
    assert_eq!(seen(&stream.next().await), owned("q", &["next"]));
    confirm(&stream, vec![confirmed(&["id-n"])]).await;
    next.await.expect("confirmed");
    assert!(fake.lookups.try_recv().is_err(), "no resend was prepared");
}

/// A failover that outlasts the bound: the send fails with the first error it met (its
/// outcome unknown), after the first try and [`RESEND_ATTEMPTS`] resends.
#[tokio::test(start_paused = true)]
async fn a_send_gives_up_after_the_resend_bound_with_its_first_error() {
    let mut fake = fake::start(30_000).await;
    let session = session(&fake).await;
    let a = session.send_async("q", vec![Message::text("a")]);
    let mut stream = fake.next_publish().await;
    let first = stream.next().await;
    confirm(&stream, vec![unknown("first: the leader died mid-write")]).await;
    let start = tokio::time::Instant::now();
    for n in 1..=RESEND_ATTEMPTS {
        assert_eq!(lookup(&mut fake).await, "q");
        let again = stream.next().await;
        assert_eq!(dedup_ids(&again), dedup_ids(&first), "resend {n}");
        confirm(&stream, vec![unknown("later: still no leader")]).await;
    }
    let err = a.await.expect_err("gives up");
    assert_eq!(err.code(), Some(Code::Unavailable));
    assert!(err.to_string().contains("first: the leader died"), "{err}");
    // Pauses of 100 ms doubling: 100 + 200 + 400 + 800 + 1 600.
    assert_eq!(start.elapsed().as_millis(), 3_100);
    assert!(fake.lookups.try_recv().is_err(), "no more resends");
}

/// Issue 24 §2: a transaction's sends are never resent (its commit across a leader change
/// fails ABORTED; the application rolls back and starts over), and get no dedup id of the
/// client's.
#[tokio::test(start_paused = true)]
async fn sends_in_a_transacted_session_are_never_resent() {
    let mut fake = fake::start(30_000).await;
    let session = session_in(&fake, AckMode::Transacted).await;
    let mine = Message::text("b").dedup_id("app-1");
    let a = session.send_async("q", vec![Message::text("a"), mine]);
    let mut stream = fake.next_publish().await;
    let first = stream.next().await;
    assert_eq!(dedup_ids(&first), ["", "app-1"], "no id of the client's");
    confirm(&stream, vec![unknown("the leader died mid-write")]).await;
    let err = a.await.expect_err("surfaced at once");
    assert_eq!(err.code(), Some(Code::Unavailable));
    assert!(
        err.to_string().contains("the leader died mid-write"),
        "{err}"
    );
    assert!(fake.lookups.try_recv().is_err(), "no resend prepared");
}

/// Without a dedup id on every message a resend might store a message twice: a
/// non-persistent message gets none of the client's (it would cost a write to disk).
#[tokio::test(start_paused = true)]
async fn a_send_with_a_message_without_dedup_id_is_not_resent() {
    let mut fake = fake::start(30_000).await;
    let session = session(&fake).await;
    let fleeting = Message::text("b").non_persistent();
    let a = session.send_async("q", vec![Message::text("a"), fleeting]);
    let mut stream = fake.next_publish().await;
    let first = stream.next().await;
    assert!(dedup_ids(&first)[1].is_empty(), "{:?}", dedup_ids(&first));
    confirm(&stream, vec![unknown("the leader died mid-write")]).await;
    let err = a.await.expect_err("surfaced at once");
    assert_eq!(err.code(), Some(Code::Unavailable), "{err}");
    assert!(fake.lookups.try_recv().is_err(), "no resend prepared");
}

/// A queue that keeps no dedup ids (`dedup_window_ms` 0) would store a resent message twice:
/// the send fails with its first error. A lookup that finds no leader yet counts as a try.
#[tokio::test(start_paused = true)]
async fn a_send_to_a_queue_without_dedup_is_not_resent() {
    let mut fake = fake::start(30_000).await;
    fake.dedup_windows
        .lock()
        .expect("not poisoned")
        .extend([Err(Code::Unavailable), Ok(0)]);
    let session = session(&fake).await;
    let a = session.send_async("q", vec![Message::text("a")]);
    let mut stream = fake.next_publish().await;
    stream.next().await;
    confirm(&stream, vec![unknown("first: the leader died mid-write")]).await;
    assert_eq!(lookup(&mut fake).await, "q", "no leader yet");
    assert_eq!(lookup(&mut fake).await, "q", "window 0");
    let err = a.await.expect_err("not safe to resend");
    assert!(err.to_string().contains("first: the leader died"), "{err}");
    // Nothing was written again: the next request is the next send.
    let next = session.send_async("q", vec![Message::text("next")]);
    assert_eq!(seen(&stream.next().await), owned("q", &["next"]));
    confirm(&stream, vec![confirmed(&["id-n"])]).await;
    next.await.expect("confirmed");
}

/// A window shorter than the send has been under way plus the margin (the node may still wait
/// for the leader before the ids are looked up, and clocks differ) is as good as none.
#[tokio::test(start_paused = true)]
async fn a_send_to_a_queue_whose_window_is_too_short_for_the_margin_is_not_resent() {
    let mut fake = fake::start(30_000).await;
    fake.dedup_windows
        .lock()
        .expect("not poisoned")
        .extend([Ok(15_000)]);
    let session = session(&fake).await;
    let a = session.send_async("q", vec![Message::text("a")]);
    let mut stream = fake.next_publish().await;
    stream.next().await;
    confirm(&stream, vec![unknown("first: the leader died mid-write")]).await;
    assert_eq!(lookup(&mut fake).await, "q", "a 15 s window");
    let err = a.await.expect_err("not safe to resend");
    assert!(err.to_string().contains("first: the leader died"), "{err}");
}

/// A queue the server says is kept on one node has no failover to resend across: once a
/// confirm says so, its messages get no ids of the client's (each would cost the queue a
/// record); a queue it says is replicated, and one not yet confirmed, get them.
#[tokio::test(start_paused = true)]
async fn messages_to_a_queue_kept_on_one_node_get_no_client_dedup_ids() {
    let mut fake = fake::start(30_000).await;
    let session = session(&fake).await;
    let first = session.send_async("one", vec![Message::text("a")]);
    let replicated = session.send_async("three", vec![Message::text("b")]);
    let mut stream = fake.next_publish().await;
    let (a, b) = (stream.next().await, stream.next().await);
    assert!(
        dedup_ids(&a)[0].starts_with("ferry-client:"),
        "not known yet"
    );
    assert!(dedup_ids(&b)[0].starts_with("ferry-client:"));
    let said = |replicas| pb::PublishConfirm {
        message_ids: vec!["id".into()],
        replicas,
        ..Default::default()
    };
    confirm(&stream, vec![said(1), said(3)]).await;
    first.await.expect("confirmed");
    replicated.await.expect("confirmed");

    let later = session.send_async("one", vec![Message::text("c")]);
    let still = session.send_async("three", vec![Message::text("d")]);
    assert_eq!(dedup_ids(&stream.next().await), [""], "kept on one node");
    assert!(dedup_ids(&stream.next().await)[0].starts_with("ferry-client:"));
    confirm(&stream, vec![said(1), said(3)]).await;
    later.await.expect("confirmed");
    still.await.expect("confirmed");
}
