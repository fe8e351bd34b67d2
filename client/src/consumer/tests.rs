//! The consumer against a fake server: credit, acknowledgement, and its stream opened again
//! after a failover.

use std::time::Duration;

use ferry_proto::pb;
use ferry_proto::pb::consume_request::Kind;
use ferry_proto::pb::consume_response::Kind as Answer;

use crate::fake::{self, Fake, FakeStream};
use crate::{AckMode, Consumer, ConsumerOptions};

type Stream = FakeStream<pb::ConsumeRequest, pb::ConsumeResponse>;

/// A consumer on queue `q` in `mode` with `prefetch`, and its stream past the start.
async fn consumer(fake: &mut Fake, mode: AckMode, prefetch: u32) -> (Consumer, Stream) {
    let connection = fake.client.open_connection("t").await.expect("open");
    let session = connection.create_session(mode).await.expect("session");
    let consumer = session
        .consumer("q", ConsumerOptions::default().prefetch(prefetch))
        .await
        .expect("consumer");
    let mut stream = fake.next_consume().await;
    let Some(Kind::Start(start)) = stream.next().await.kind else {
        panic!("the stream opens with a start");
    };
    assert_eq!(
        (start.session_id.as_str(), start.queue.as_str()),
        ("session-1", "q")
    );
    assert_eq!(start.prefetch, prefetch.max(1), "prefetch asked for");
    (consumer, stream)
}

async fn push(stream: &Stream, handles: &[&str]) {
    let deliveries = handles
        .iter()
        .map(|h| pb::Delivery {
            receipt_handle: h.to_string(),
            delivery_count: 1,
            ..Default::default()
        })
        .collect();
    let kind = Answer::Deliveries(pb::Deliveries { deliveries });
    stream
        .answer(Ok(pb::ConsumeResponse { kind: Some(kind) }))
        .await;
}

fn handles(kind: Option<Kind>) -> (&'static str, Vec<String>) {
    match kind {
        Some(Kind::Ack(h)) => ("ack", h.receipt_handles),
        Some(Kind::Release(h)) => ("release", h.receipt_handles),
        other => panic!("expected an ack or a release, got {other:?}"),
    }
}

fn strings(s: &[&str]) -> Vec<String> {
    s.iter().map(|s| s.to_string()).collect()
}

const WAIT: Option<Duration> = Some(Duration::from_secs(10));

#[tokio::test]
async fn auto_ack_returns_one_credit_per_message_handed_over_and_gives_back_the_unseen() {
    let mut fake = fake::start(30_000).await;
    let (mut consumer, mut stream) = consumer(&mut fake, AckMode::Auto, 3).await;
    push(&stream, &["h1", "h2", "h3"]).await;
    let got = consumer.receive_batch(2, WAIT).await.expect("two");
    let got: Vec<&str> = got.iter().map(|r| r.receipt_handle()).collect();
    assert_eq!(got, ["h1", "h2"]);
    // Handed over: acknowledged (auto), and room for as many more at the server.
    assert_eq!(
        handles(stream.next().await.kind),
        ("ack", strings(&["h1", "h2"]))
    );
    assert_eq!(stream.next().await.kind, Some(Kind::Credit(2)));
    let third = consumer.receive(Some(Duration::ZERO)).await.expect("h3");
    assert_eq!(
        third.map(|r| r.receipt_handle().to_string()).as_deref(),
        Some("h3")
    );
    assert_eq!(handles(stream.next().await.kind), ("ack", strings(&["h3"])));
    assert_eq!(stream.next().await.kind, Some(Kind::Credit(1)));
    // Nothing pushed, nothing handed over: no credit.
    assert!(consumer
        .receive(Some(Duration::ZERO))
        .await
        .expect("none")
        .is_none());
    // Two more pushed, never taken: closing gives them back unseen, then waits until the
    // server says every ack and the release took effect.
    push(&stream, &["h4", "h5"]).await;
    let closing = tokio::spawn(consumer.close());
    assert_eq!(stream.next().await.kind, Some(Kind::Stop(true)));
    let stopped = Answer::Stopped(pb::Stopped {});
    stream
        .answer(Ok(pb::ConsumeResponse {
            kind: Some(stopped),
        }))
        .await;
    assert_eq!(
        handles(stream.next().await.kind),
        ("release", strings(&["h4", "h5"]))
    );
    assert_eq!(
        stream.next().await.kind,
        Some(Kind::Flush(3)),
        "two acks, one release"
    );
    assert!(
        !closing.is_finished(),
        "closed before the flush was answered"
    );
    let flushed = Answer::Flushed(3);
    stream
        .answer(Ok(pb::ConsumeResponse {
            kind: Some(flushed),
        }))
        .await;
    closing.await.expect("no panic").expect("closed");
}

/// Issue 24 §2: the node serving the queue died under the stream (a replicated queue's
/// shard elects another leader): the consumer opens the stream again on the same session
/// and counts the ack whose outcome it never learned.
#[tokio::test]
async fn a_stream_ended_unavailable_is_opened_again_on_the_same_session() {
    let mut fake = fake::start(30_000).await;
    let (mut consumer, mut stream) = consumer(&mut fake, AckMode::Client, 3).await;
    push(&stream, &["h1", "h2", "h3"]).await;
    let got = consumer.receive_batch(3, WAIT).await.expect("three");
    assert_eq!(got.len(), 3);
    assert_eq!(stream.next().await.kind, Some(Kind::Credit(3)));
    consumer.ack(&got[..1]).expect("ack");
    assert_eq!(handles(stream.next().await.kind), ("ack", strings(&["h1"])));
    stream
        .answer(Err(tonic::Status::unavailable(
            "the shard's leader is gone",
        )))
        .await;

    let server = async {
        let mut again = fake.next_consume().await;
        let Some(Kind::Start(start)) = again.next().await.kind else {
            panic!("the new stream opens with a start");
        };
        assert_eq!(
            (
                start.session_id.as_str(),
                start.queue.as_str(),
                start.prefetch
            ),
            ("session-1", "q", 3),
            "the same session, queue and prefetch"
        );
        push(&again, &["h4"]).await;
        again
    };
    // Waits through the pause and the new stream's opening.
    let (next, mut again) = tokio::join!(consumer.receive_batch(5, WAIT), server);
    let next: Vec<String> = next
        .expect("the consumer goes on")
        .iter()
        .map(|r| r.receipt_handle().to_string())
        .collect();
    assert_eq!(next, ["h4"]);
    assert_eq!(consumer.reopened(), 1);
    assert_eq!(
        consumer.unconfirmed_acks(),
        1,
        "the ack of h1 was never confirmed"
    );
    // Messages taken before the break stay the session's: acknowledged on the new stream.
    assert_eq!(again.next().await.kind, Some(Kind::Credit(1)));
    consumer.ack(&got[1..]).expect("ack");
    assert_eq!(
        handles(again.next().await.kind),
        ("ack", strings(&["h2", "h3"]))
    );
}

/// An application that only ever polls (receiveNoWait every 10 ms, each read cut short at
/// once) still gets its stream opened again: the opening goes on between its reads.
#[tokio::test]
async fn a_consumer_polled_without_waiting_still_opens_its_stream_again() {
    let mut fake = fake::start(30_000).await;
    let (mut consumer, stream) = consumer(&mut fake, AckMode::Auto, 3).await;
    stream
        .answer(Err(tonic::Status::unavailable(
            "the shard's leader is gone",
        )))
        .await;
    let poller = async {
        let mut every = tokio::time::interval(Duration::from_millis(10));
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        let mut got = vec![];
        while got.is_empty() && tokio::time::Instant::now() < deadline {
            every.tick().await;
            got = consumer
                .receive_batch(5, Some(Duration::ZERO))
                .await
                .expect("no error while it opens again");
        }
        got
    };
    let server = async {
        let mut again = fake.next_consume().await;
        assert!(matches!(again.next().await.kind, Some(Kind::Start(_))));
        push(&again, &["h9"]).await;
        again
    };
    let (got, _again) = tokio::join!(poller, server);
    assert_eq!(got.len(), 1, "the new stream's push arrived");
    assert_eq!(got[0].receipt_handle(), "h9");
    assert_eq!(consumer.reopened(), 1);
}

/// A break noticed by a flush: the flush says an ack went unconfirmed, and the message
/// pushed before the break is still handed over (it is the session's), granting the new
/// stream no credit (it starts with the whole prefetch).
#[tokio::test]
async fn a_flush_across_a_break_reports_the_unconfirmed_ack_and_the_buffer_is_kept() {
    let mut fake = fake::start(30_000).await;
    let (mut consumer, mut stream) = consumer(&mut fake, AckMode::Auto, 3).await;
    push(&stream, &["h1", "h2"]).await;
    let got = consumer.receive_batch(1, WAIT).await.expect("one");
    assert_eq!(got[0].receipt_handle(), "h1");
    assert_eq!(handles(stream.next().await.kind), ("ack", strings(&["h1"])));
    assert_eq!(stream.next().await.kind, Some(Kind::Credit(1)));
    stream
        .answer(Err(tonic::Status::unavailable(
            "the shard's leader is gone",
        )))
        .await;
    let server = async {
        let mut again = fake.next_consume().await;
        assert!(matches!(again.next().await.kind, Some(Kind::Start(_))));
        again
    };
    let (flushed, mut again) = tokio::join!(consumer.flush(), server);
    let err = flushed.expect_err("an ack went unconfirmed");
    assert!(err.to_string().contains("1 acknowledgement"), "{err}");
    assert_eq!((consumer.reopened(), consumer.unconfirmed_acks()), (1, 1));
    consumer.flush().await.expect("reported once");

    let kept = consumer.receive(Some(Duration::ZERO)).await.expect("kept");
    assert_eq!(
        kept.map(|r| r.receipt_handle().to_string()).as_deref(),
        Some("h2")
    );
    assert_eq!(
        handles(again.next().await.kind),
        ("ack", strings(&["h2"])),
        "acknowledged on the new stream, and no credit for it"
    );
    push(&again, &["h3"]).await;
    let next = consumer.receive(WAIT).await.expect("h3");
    assert_eq!(
        next.map(|r| r.receipt_handle().to_string()).as_deref(),
        Some("h3")
    );
    assert_eq!(handles(again.next().await.kind), ("ack", strings(&["h3"])));
    assert_eq!(again.next().await.kind, Some(Kind::Credit(1)));
}

#[tokio::test]
async fn a_stream_ended_with_another_error_ends_the_consumer() {
    let mut fake = fake::start(30_000).await;
    let (mut consumer, stream) = consumer(&mut fake, AckMode::Auto, 3).await;
    stream
        .answer(Err(tonic::Status::not_found("queue q does not exist")))
        .await;
    let err = consumer.receive(WAIT).await.expect_err("the error");
    assert!(err.to_string().contains("does not exist"), "{err}");
    assert_eq!(consumer.reopened(), 0);
}

#[tokio::test]
async fn a_consumer_gives_up_after_its_stream_ends_unavailable_each_time_it_is_opened() {
    let mut fake = fake::start(30_000).await;
    let (mut consumer, stream) = consumer(&mut fake, AckMode::Auto, 3).await;
    let down = || Err(tonic::Status::unavailable("no leader"));
    stream.answer(down()).await;
    let server = async {
        for _ in 0..crate::REOPEN_ATTEMPTS {
            let mut again = fake.next_consume().await;
            assert!(matches!(again.next().await.kind, Some(Kind::Start(_))));
            again.answer(down()).await;
        }
    };
    let (got, ()) = tokio::join!(consumer.receive(None), server);
    let err = got.expect_err("gives up");
    assert!(err.to_string().contains("no leader"), "{err}");
    assert_eq!(consumer.reopened(), u64::from(crate::REOPEN_ATTEMPTS));
}

#[tokio::test]
async fn client_ack_returns_credit_on_handing_over_and_acks_cumulatively_when_told() {
    let mut fake = fake::start(30_000).await;
    let (mut consumer, mut stream) = consumer(&mut fake, AckMode::Client, 0).await;
    push(&stream, &["h1", "h2", "h3"]).await;
    let got = consumer.receive_batch(3, WAIT).await.expect("three");
    assert_eq!(got.len(), 3);
    // No ack until the application says so; the credit comes at once.
    assert_eq!(stream.next().await.kind, Some(Kind::Credit(3)));
    // Acknowledging the second acknowledges the first with it (JMS CLIENT_ACKNOWLEDGE).
    consumer.ack(&got[1..2]).expect("ack");
    let (kind, mut acked) = handles(stream.next().await.kind);
    acked.sort();
    assert_eq!((kind, acked), ("ack", strings(&["h1", "h2"])));
    consumer.ack(&got[2..]).expect("ack");
    assert_eq!(handles(stream.next().await.kind), ("ack", strings(&["h3"])));
}
