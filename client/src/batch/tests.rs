//! The publisher against a fake server: pipelining, broken streams, and resends after a failover.

use ferry_proto::pb;
use tonic::Code;

use crate::fake::{self, Fake, FakeStream};
use crate::{AckMode, Message, Session};

mod resend;

async fn session(fake: &Fake) -> Session {
    let connection = fake.client.open_connection("t").await.expect("open");
    connection
        .create_session(AckMode::Auto)
        .await
        .expect("session")
}

/// A request's queue and text bodies.
fn seen(r: &pb::PublishRequest) -> (String, Vec<String>) {
    let bodies = r
        .messages
        .iter()
        .map(|m| String::from_utf8_lossy(&m.body).into_owned())
        .collect();
    (r.queue.clone(), bodies)
}

fn confirmed(ids: &[&str]) -> pb::PublishConfirm {
    pb::PublishConfirm {
        message_ids: ids.iter().map(|s| s.to_string()).collect(),
        ..Default::default()
    }
}

fn refused(code: Code) -> pb::PublishConfirm {
    pb::PublishConfirm {
        error_code: code as i32,
        error_message: "refused by the test".into(),
        ..Default::default()
    }
}

async fn confirm(
    stream: &FakeStream<pb::PublishRequest, pb::PublishResponse>,
    confirms: Vec<pb::PublishConfirm>,
) {
    stream.answer(Ok(pb::PublishResponse { confirms })).await;
}

fn owned(queue: &str, bodies: &[&str]) -> (String, Vec<String>) {
    (queue.into(), bodies.iter().map(|s| s.to_string()).collect())
}

#[tokio::test]
async fn sends_made_together_travel_on_one_stream_in_call_order_each_with_its_own_answer() {
    let mut fake = fake::start(30_000).await;
    let session = session(&fake).await;
    let a = session.send_async("q", vec![Message::text("a")]);
    let b = session.send_async("q", vec![Message::text("b"), Message::text("c")]);
    let c = session.send_async("r", vec![Message::text("d")]);
    let mut stream = fake.next_publish().await;
    // All three are written before any is confirmed: pipelined, not one round trip each.
    let mut requests = vec![];
    for _ in 0..3 {
        requests.push(seen(&stream.next().await));
    }
    assert_eq!(
        requests,
        [
            owned("q", &["a"]),
            owned("q", &["b", "c"]),
            owned("r", &["d"])
        ]
    );
    // One answer confirms the three; the middle one is refused, alone.
    confirm(
        &stream,
        vec![
            confirmed(&["id-a"]),
            refused(Code::InvalidArgument),
            confirmed(&["id-d"]),
        ],
    )
    .await;
    assert_eq!(a.await.expect("a confirmed"), ["id-a"]);
    let refusal = b.await.expect_err("b refused");
    assert_eq!(refusal.code(), Some(Code::InvalidArgument), "{refusal}");
    assert_eq!(c.await.expect("c confirmed"), ["id-d"]);
    assert!(
        fake.publishes.try_recv().is_err(),
        "one stream for the three"
    );
}

#[tokio::test]
async fn a_broken_stream_fails_its_unconfirmed_sends_without_dedup_ids_and_the_next_opens_another()
{
    let mut fake = fake::start(30_000).await;
    // No dedup ids: a send whose outcome is unknown cannot be resent safely.
    let session = session(&fake).await.with_auto_dedup_ids(false);
    let a = session.send_async("q", vec![Message::text("a")]);
    let b = session.send_async("q", vec![Message::text("b")]);
    let mut first = fake.next_publish().await;
    assert_eq!(seen(&first.next().await), owned("q", &["a"]));
    assert_eq!(seen(&first.next().await), owned("q", &["b"]));
    confirm(&first, vec![confirmed(&["id-a"])]).await;
    assert_eq!(a.await.expect("a confirmed"), ["id-a"]);
    // The stream breaks with b written and unconfirmed: b gets the stream's error (it may or
    // may not have been stored), not a made-up one.
    first
        .answer(Err(tonic::Status::unavailable("the node went away")))
        .await;
    let lost = b.await.expect_err("b in flight on the broken stream");
    assert_eq!(lost.code(), Some(Code::Unavailable), "{lost}");
    assert!(lost.to_string().contains("went away"), "unchanged: {lost}");
    // The session goes on: the next send opens a new stream.
    let c = session.send_async("q", vec![Message::text("c")]);
    let mut second = fake.next_publish().await;
    assert_eq!(seen(&second.next().await), owned("q", &["c"]));
    confirm(&second, vec![confirmed(&["id-c"])]).await;
    assert_eq!(c.await.expect("c confirmed"), ["id-c"]);
}
