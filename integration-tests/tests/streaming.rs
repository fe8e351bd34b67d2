//! The streaming fast path: the `Publish` stream (pipelined sends, confirmed in order, a refused
//! send failing alone) and the client's `Consumer` on the `Consume` stream (acks on the stream,
//! `close` giving back what was pushed ahead and never handed over).

#![allow(clippy::unwrap_used)]

use std::time::Duration;

use ferry_client::pb;
use ferry_client::{AckMode, ConsumerOptions, Message, ReceiveOptions};
use ferry_integration_tests::{create_queue, memory_node, stats, Node, NodeOptions};

fn text(r: &ferry_client::Received) -> String {
    String::from_utf8_lossy(r.body()).into_owned()
}

/// The receipt handle of the first delivery a raw `Consume` stream pushes.
async fn first_handle(
    responses: &mut tonic::Streaming<pb::ConsumeResponse>,
) -> anyhow::Result<String> {
    loop {
        match responses.message().await?.and_then(|r| r.kind) {
            Some(pb::consume_response::Kind::Deliveries(d)) if !d.deliveries.is_empty() => {
                return Ok(d.deliveries[0].receipt_handle.clone())
            }
            Some(_) => {}
            None => anyhow::bail!("the stream ended before a delivery"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pipelined_sends_are_confirmed_and_stored_in_the_order_they_were_made() -> anyhow::Result<()>
{
    let (_dir, _node, client) = memory_node(&["q"]).await?;
    let conn = client.open_connection("t").await?;
    let session = conn.create_session(AckMode::Auto).await?;
    // 2 000 sends on their way before any is awaited; two of them are too large (over the 1 MiB
    // default), so the server's coalesced calls that carry them are refused and split.
    let bad = [500usize, 1_500];
    let confirms: Vec<_> = (0..2_000usize)
        .map(|i| {
            let m = if bad.contains(&i) {
                Message::bytes(vec![b'x'; 2 * 1024 * 1024])
            } else {
                Message::text(format!("m{i}"))
            };
            session.send_async("q", vec![m])
        })
        .collect();
    let mut ids = Vec::new();
    for (i, c) in confirms.into_iter().enumerate() {
        match c.await {
            Ok(got) => {
                assert!(!bad.contains(&i), "send {i} should have been refused");
                assert_eq!(got.len(), 1);
                ids.push((i, got[0].clone()));
            }
            Err(e) => {
                assert!(bad.contains(&i), "send {i} failed: {e}");
                assert_eq!(e.code(), Some(tonic::Code::ResourceExhausted), "{e}");
            }
        }
    }
    assert_eq!(ids.len(), 1_998);
    assert_eq!(stats(&client, "q").await?.ready, 1_998);
    // Stored in call order, each under the id its caller got.
    let mut consumer = session
        .consumer("q", ConsumerOptions::default().prefetch(300))
        .await?;
    let mut got = Vec::new();
    while got.len() < ids.len() {
        let batch = consumer
            .receive_batch(1_000, Some(Duration::from_secs(10)))
            .await?;
        assert!(!batch.is_empty(), "the rest did not come");
        got.extend(batch);
    }
    for ((i, id), r) in ids.iter().zip(&got) {
        assert_eq!(text(r), format!("m{i}"));
        assert_eq!(r.message_id(), id);
    }
    consumer.close().await?;
    let s = stats(&client, "q").await?;
    assert_eq!((s.ready, s.leased, s.acked_total), (0, 0, 1_998));
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_publish_stream_confirms_each_request_by_its_position_and_goes_on_after_a_refusal(
) -> anyhow::Result<()> {
    let (_dir, _node, client) = memory_node(&["q"]).await?;
    let request = |queue: &str, body: &str| pb::PublishRequest {
        session_id: String::new(),
        queue: queue.into(),
        messages: vec![Message::text(body).0],
    };
    let requests = vec![
        request("q", "one"),
        request("missing", "lost"),
        request("q", "two"),
        pb::PublishRequest {
            queue: "Not A Queue!".into(),
            ..request("q", "bad name")
        },
        request("q", "three"),
    ];
    let mut confirms = client
        .messaging()
        .publish(tokio_stream::iter(requests))
        .await?
        .into_inner();
    let mut all = Vec::new();
    while let Some(r) = confirms.message().await? {
        all.extend(r.confirms);
    }
    // The server ended the stream (OK) once the client's side ended and everything was answered.
    let sequences: Vec<u64> = all.iter().map(|c| c.sequence).collect();
    assert_eq!(sequences, vec![0, 1, 2, 3, 4]);
    let codes: Vec<tonic::Code> = all
        .iter()
        .map(|c| tonic::Code::from_i32(c.error_code))
        .collect();
    assert_eq!(
        codes,
        vec![
            tonic::Code::Ok,
            tonic::Code::NotFound,
            tonic::Code::Ok,
            tonic::Code::InvalidArgument,
            tonic::Code::Ok
        ]
    );
    assert!(all[1].error_message.contains("missing"), "{:?}", all[1]);
    assert!(all[1].message_ids.is_empty() && all[3].message_ids.is_empty());
    let conn = client.open_connection("t").await?;
    let session = conn.create_session(AckMode::Auto).await?;
    let got = session
        .receive("q", ReceiveOptions::no_wait().max(10))
        .await?;
    let bodies: Vec<String> = got.iter().map(text).collect();
    assert_eq!(bodies, vec!["one", "two", "three"]);
    assert_eq!(got[0].message_id(), all[0].message_ids[0]);
    assert_eq!(got[2].message_id(), all[4].message_ids[0]);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn closing_a_consumer_gives_back_what_it_never_handed_over_unseen() -> anyhow::Result<()> {
    let (_dir, _node, client) = memory_node(&["q"]).await?;
    let conn = client.open_connection("t").await?;
    let session = conn.create_session(AckMode::Auto).await?;
    session
        .send(
            "q",
            (0..10).map(|i| Message::text(format!("m{i}"))).collect(),
        )
        .await?;
    let mut consumer = session
        .consumer("q", ConsumerOptions::default().prefetch(10))
        .await?;
    let mut first = Vec::new();
    while first.len() < 3 {
        let want = 3 - first.len();
        first.extend(
            consumer
                .receive_batch(want, Some(Duration::from_secs(10)))
                .await?,
        );
    }
    assert_eq!(
        first.iter().map(text).collect::<Vec<_>>(),
        vec!["m0", "m1", "m2"]
    );
    // The rest were pushed ahead (up to the prefetch of 10) and are leased to the session.
    consumer.close().await?;
    let s = stats(&client, "q").await?;
    assert_eq!((s.acked_total, s.leased, s.ready), (3, 0, 7));
    // They come back in order, not flagged: nobody saw them.
    let again = session
        .receive("q", ReceiveOptions::no_wait().max(10))
        .await?;
    assert_eq!(
        again.iter().map(text).collect::<Vec<_>>(),
        (3..10).map(|i| format!("m{i}")).collect::<Vec<_>>()
    );
    assert!(again
        .iter()
        .all(|r| !r.redelivered() && r.delivery_count() == 1));
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn consumer_acks_follow_the_session_mode() -> anyhow::Result<()> {
    let (_dir, _node, client) = memory_node(&["c", "i"]).await?;
    let conn = client.open_connection("t").await?;
    let producer = conn.create_session(AckMode::Auto).await?;
    for q in ["c", "i"] {
        producer
            .send(q, (0..4).map(|i| Message::text(format!("m{i}"))).collect())
            .await?;
    }
    async fn take(
        consumer: &mut ferry_client::Consumer,
        n: usize,
    ) -> anyhow::Result<Vec<ferry_client::Received>> {
        let mut got = Vec::new();
        while got.len() < n {
            let b = consumer
                .receive_batch(n - got.len(), Some(Duration::from_secs(10)))
                .await?;
            anyhow::ensure!(!b.is_empty(), "nothing came");
            got.extend(b);
        }
        Ok(got)
    }
    // CLIENT: acknowledging the third acknowledges the two before it; the fourth stays leased.
    let session = conn.create_session(AckMode::Client).await?;
    let mut consumer = session
        .consumer("c", ConsumerOptions::default().prefetch(4))
        .await?;
    let got = take(&mut consumer, 4).await?;
    consumer.ack(&got[2..3])?;
    consumer.close().await?;
    let s = stats(&client, "c").await?;
    assert_eq!((s.acked_total, s.leased), (3, 1));
    assert_eq!(session.close().await?, 1);

    // INDIVIDUAL: only what is named.
    let session = conn.create_session(AckMode::Individual).await?;
    let mut consumer = session
        .consumer("i", ConsumerOptions::default().prefetch(4))
        .await?;
    let got = take(&mut consumer, 4).await?;
    consumer.ack(&got[2..3])?;
    consumer.close().await?;
    let s = stats(&client, "i").await?;
    assert_eq!((s.acked_total, s.leased), (1, 3));

    // A transacted session receives with Receive; a consumer is refused at once.
    let tx = conn.create_session(AckMode::Transacted).await?;
    let e = tx
        .consumer("c", ConsumerOptions::default())
        .await
        .unwrap_err();
    assert_eq!(e.code(), Some(tonic::Code::FailedPrecondition), "{e}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ack_after_the_lease_ran_out_is_counted_stale_and_the_message_comes_back(
) -> anyhow::Result<()> {
    let (_dir, _node, client) = memory_node(&["q"]).await?;
    let conn = client.open_connection("t").await?;
    let session = conn.create_session(AckMode::Individual).await?;
    session.send("q", vec![Message::text("slow")]).await?;
    let mut consumer = session
        .consumer(
            "q",
            ConsumerOptions {
                prefetch: 1,
                lease_ms: Some(200),
                ..Default::default()
            },
        )
        .await?;
    let got = consumer
        .receive_batch(1, Some(Duration::from_secs(10)))
        .await?;
    assert_eq!(got.len(), 1);
    // The application is too slow: the lease runs out and the message is ready again.
    ferry_integration_tests::wait_until(Duration::from_secs(10), "the lease to run out", || {
        let client = client.clone();
        async move { Ok(stats(&client, "q").await?.leased == 0) }
    })
    .await?;
    consumer.ack(&got)?;
    consumer.flush().await?;
    assert_eq!(consumer.stale_acks(), 1);
    // The same message comes again, flagged.
    let again = consumer
        .receive_batch(1, Some(Duration::from_secs(10)))
        .await?;
    assert_eq!(again.len(), 1);
    assert_eq!(again[0].message_id(), got[0].message_id());
    assert!(again[0].redelivered());
    assert_eq!(stats(&client, "q").await?.acked_total, 0);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flush_means_every_ack_took_effect_whether_acks_are_quiet_or_each_answered(
) -> anyhow::Result<()> {
    // `quiet_acks: false` is how a node from before quiet acks behaves: every ack answered. The
    // consumer's flush must end on those answers and still mean "all took effect".
    for quiet in [true, false] {
        let queue = format!("q-{quiet}");
        let (_dir, _node, client) = memory_node(&[queue.as_str()]).await?;
        let conn = client.open_connection("t").await?;
        let session = conn.create_session(AckMode::Individual).await?;
        let body: Vec<Message> = (0..5).map(|i| Message::text(format!("m{i}"))).collect();
        session.send(&queue, body).await?;
        let mut consumer = session
            .consumer(
                &queue,
                ConsumerOptions::default().prefetch(5).quiet_acks(quiet),
            )
            .await?;
        let mut got = vec![];
        while got.len() < 5 {
            let b = consumer
                .receive_batch(5, Some(Duration::from_secs(10)))
                .await?;
            anyhow::ensure!(!b.is_empty(), "quiet {quiet}: nothing came");
            got.extend(b);
        }
        for m in &got {
            consumer.ack(std::slice::from_ref(m))?;
        }
        consumer.flush().await?;
        // No waiting: the flush returned only once the server had applied all five.
        let s = stats(&client, &queue).await?;
        assert_eq!((s.acked_total, s.leased), (5, 0), "quiet {quiet}");
        assert_eq!(consumer.stale_acks(), 0, "quiet {quiet}");
        consumer.close().await?;
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acks_written_before_a_consumer_goes_away_take_effect() -> anyhow::Result<()> {
    // Review finding: the front-end dropped acks still under way when the client ended the
    // stream, leaving acknowledged messages leased (and delivered again when the lease ran out).
    let queues: Vec<String> = (0..5).map(|i| format!("q{i}")).collect();
    let names: Vec<&str> = queues.iter().map(String::as_str).collect();
    let (_dir, _node, client) = memory_node(&names).await?;
    let conn = client.open_connection("t").await?;
    let session = conn.create_session(AckMode::Auto).await?;
    for q in &queues {
        session.send(q, vec![Message::text("m")]).await?;
        let mut consumer = session
            .consumer(q, ConsumerOptions::default().prefetch(1))
            .await?;
        let got = consumer
            .receive_batch(1, Some(Duration::from_secs(10)))
            .await?;
        assert_eq!(got.len(), 1);
        // Auto mode acknowledged it on the stream as it was returned; no close.
        drop(consumer);
    }
    // The leases last 30 s: an ack that was lost would leave `acked_total` at 0 well past this.
    ferry_integration_tests::wait_until(Duration::from_secs(10), "every ack to apply", || {
        let (client, queues) = (client.clone(), queues.clone());
        async move {
            for q in &queues {
                if stats(&client, q).await?.acked_total != 1 {
                    return Ok(false);
                }
            }
            Ok(true)
        }
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ack_and_then_the_end_of_the_stream_is_applied_and_answered() -> anyhow::Result<()> {
    let (_dir, _node, client) = memory_node(&["q"]).await?;
    let conn = client.open_connection("t").await?;
    let session = conn.create_session(AckMode::Individual).await?;
    session.send("q", vec![Message::text("m")]).await?;
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    tx.send(pb::ConsumeRequest {
        kind: Some(pb::consume_request::Kind::Start(pb::ConsumeStart {
            session_id: session.id().into(),
            queue: "q".into(),
            prefetch: 1,
            ..Default::default()
        })),
    })?;
    let mut responses = client
        .messaging()
        .consume(tokio_stream::wrappers::UnboundedReceiverStream::new(rx))
        .await?
        .into_inner();
    let handle = first_handle(&mut responses).await?;
    tx.send(pb::ConsumeRequest {
        kind: Some(pb::consume_request::Kind::Ack(pb::ReceiptHandles {
            receipt_handles: vec![handle],
        })),
    })?;
    // The client's side ends right after the ack.
    drop(tx);
    let mut answered = false;
    while let Some(r) = responses.message().await? {
        if let Some(pb::consume_response::Kind::AckResult(a)) = r.kind {
            assert!(a.stale_receipt_handles.is_empty(), "{a:?}");
            answered = true;
        }
    }
    assert!(answered, "the ack was not answered before the stream ended");
    let s = stats(&client, "q").await?;
    assert_eq!((s.acked_total, s.leased), (1, 0));
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quiet_acks_answer_only_stale_handles_and_a_flush_answers_after_them() -> anyhow::Result<()>
{
    let (_dir, _node, client) = memory_node(&["q"]).await?;
    let conn = client.open_connection("t").await?;
    let session = conn.create_session(AckMode::Individual).await?;
    session
        .send("q", vec![Message::text("a"), Message::text("b")])
        .await?;
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    let send = |kind| tx.send(pb::ConsumeRequest { kind: Some(kind) });
    send(pb::consume_request::Kind::Start(pb::ConsumeStart {
        session_id: session.id().into(),
        queue: "q".into(),
        prefetch: 2,
        quiet_acks: true,
        ..Default::default()
    }))?;
    let mut responses = client
        .messaging()
        .consume(tokio_stream::wrappers::UnboundedReceiverStream::new(rx))
        .await?
        .into_inner();
    let mut handles = vec![];
    while handles.len() < 2 {
        match responses.message().await?.and_then(|r| r.kind) {
            Some(pb::consume_response::Kind::Deliveries(d)) => {
                handles.extend(d.deliveries.into_iter().map(|d| d.receipt_handle))
            }
            other => anyhow::bail!("expected deliveries, got {other:?}"),
        }
    }
    let acks = |h: &[String]| {
        pb::consume_request::Kind::Ack(pb::ReceiptHandles {
            receipt_handles: h.to_vec(),
        })
    };
    // A live ack (no answer), the same handle again (stale: answered), the other live one (no
    // answer), then a flush: exactly two answers, in that order.
    send(acks(&handles[..1]))?;
    send(acks(&handles[..1]))?;
    send(acks(&handles[1..]))?;
    send(pb::consume_request::Kind::Flush(7))?;
    match responses.message().await?.and_then(|r| r.kind) {
        Some(pb::consume_response::Kind::AckResult(a)) => {
            // Each stale handle comes with why it is stale.
            assert_eq!(a.stale_receipt_handles.len(), 1, "{a:?}");
            assert!(a.stale_receipt_handles[0].starts_with(&handles[0]), "{a:?}");
        }
        other => anyhow::bail!("expected the stale ack's answer, got {other:?}"),
    }
    match responses.message().await?.and_then(|r| r.kind) {
        Some(pb::consume_response::Kind::Flushed(7)) => {}
        other => anyhow::bail!("expected flushed 7, got {other:?}"),
    }
    // Everything before the flush took effect by then.
    let s = stats(&client, "q").await?;
    assert_eq!((s.acked_total, s.leased, s.ready), (2, 0, 0));
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_push_larger_than_four_mebibytes_reaches_the_consumer() -> anyhow::Result<()> {
    // Review finding: tonic's 4 MiB default decode limit refused a batch of deliveries the
    // server was allowed to push (up to 1 000 messages of up to 1 MiB each).
    let (_dir, _node, client) = memory_node(&["q"]).await?;
    let conn = client.open_connection("t").await?;
    let session = conn.create_session(AckMode::Auto).await?;
    let body = vec![b'x'; 600 * 1024];
    session
        .send("q", (0..10).map(|_| Message::bytes(body.clone())).collect())
        .await?;
    let mut consumer = session
        .consumer("q", ConsumerOptions::default().prefetch(10))
        .await?;
    let mut got = 0;
    while got < 10 {
        let b = consumer
            .receive_batch(10, Some(Duration::from_secs(10)))
            .await?;
        anyhow::ensure!(!b.is_empty(), "nothing came");
        assert!(b.iter().all(|r| r.body().len() == body.len()));
        got += b.len();
    }
    consumer.close().await?;
    assert_eq!(stats(&client, "q").await?.acked_total, 10);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_consumer_keeps_the_send_order_while_sends_arrive_between_its_receives(
) -> anyhow::Result<()> {
    // The front-end keeps two receives open for a consumer and pushes their answers in the order
    // it asked; a small prefetch and a producer that keeps a few sends in flight make messages
    // land in both, and in the receives opened as credit comes back.
    let (_dir, _node, client) = memory_node(&["q"]).await?;
    let conn = client.open_connection("t").await?;
    let producer = conn.create_session(AckMode::Auto).await?;
    let consumer_session = conn.create_session(AckMode::Auto).await?;
    let mut consumer = consumer_session
        .consumer("q", ConsumerOptions::default().prefetch(5))
        .await?;
    const N: usize = 2_000;
    let sending = tokio::spawn(async move {
        let mut inflight = std::collections::VecDeque::new();
        for i in 0..N {
            inflight.push_back(producer.send_async("q", vec![Message::text(format!("m{i}"))]));
            if inflight.len() >= 4 {
                inflight.pop_front().expect("four in flight").await?;
            }
        }
        for c in inflight {
            c.await?;
        }
        anyhow::Ok(())
    });
    let mut got = Vec::with_capacity(N);
    while got.len() < N {
        let batch = consumer
            .receive_batch(N, Some(Duration::from_secs(10)))
            .await?;
        anyhow::ensure!(!batch.is_empty(), "nothing for 10 s after {}", got.len());
        got.extend(batch.iter().map(text));
    }
    sending.await??;
    assert_eq!(got, (0..N).map(|i| format!("m{i}")).collect::<Vec<_>>());
    consumer.close().await?;
    let s = stats(&client, "q").await?;
    assert_eq!((s.acked_total, s.leased, s.ready), (N as u64, 0, 0));
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_consumer_goes_on_with_one_receive_when_the_queue_refuses_a_second_waiter(
) -> anyhow::Result<()> {
    // One waiter per queue: the stream's second receive is refused (too many waiters), and the
    // stream must go on with the first, not fail.
    let dir = tempfile::tempdir()?;
    let node = Node::start(
        dir.path(),
        NodeOptions {
            memory: true,
            extra_toml: "[limits]\nwaiters_per_queue_max = 1\n".into(),
            ..Default::default()
        },
    )?;
    let client = node.client().await?;
    create_queue(&client, "q").await?;
    let conn = client.open_connection("t").await?;
    let session = conn.create_session(AckMode::Auto).await?;
    let mut consumer = session
        .consumer("q", ConsumerOptions::default().prefetch(10))
        .await?;
    let mut got = Vec::new();
    for i in 0..30 {
        session
            .send("q", vec![Message::text(format!("m{i}"))])
            .await?;
        let batch = consumer
            .receive_batch(10, Some(Duration::from_secs(10)))
            .await?;
        got.extend(batch.iter().map(text));
    }
    while got.len() < 30 {
        let batch = consumer
            .receive_batch(10, Some(Duration::from_secs(10)))
            .await?;
        anyhow::ensure!(!batch.is_empty(), "nothing for 10 s after {}", got.len());
        got.extend(batch.iter().map(text));
    }
    assert_eq!(got, (0..30).map(|i| format!("m{i}")).collect::<Vec<_>>());
    consumer.close().await?;
    Ok(())
}

// Postmortem: a release (and an undelivered nack) checked nothing and answered every handle as
// done, bogus ones included; and a malformed handle in an ack ended the whole stream, stranding
// its deliveries until their leases ran out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_checks_each_handle_and_a_malformed_one_keeps_the_stream() -> anyhow::Result<()> {
    let (_dir, _node, client) = memory_node(&["q"]).await?;
    let conn = client.open_connection("t").await?;
    let session = conn.create_session(AckMode::Individual).await?;
    let other = conn.create_session(AckMode::Individual).await?;
    session
        .send("q", vec![Message::text("a"), Message::text("b")])
        .await?;
    // Another session's delivery, whose handle this stream will try to release.
    let theirs = other.receive("q", ReceiveOptions::no_wait()).await?;
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    let send = |kind| tx.send(pb::ConsumeRequest { kind: Some(kind) });
    send(pb::consume_request::Kind::Start(pb::ConsumeStart {
        session_id: session.id().into(),
        queue: "q".into(),
        prefetch: 1,
        ..Default::default()
    }))?;
    let mut responses = client
        .messaging()
        .consume(tokio_stream::wrappers::UnboundedReceiverStream::new(rx))
        .await?
        .into_inner();
    let mine = first_handle(&mut responses).await?;
    let handles = |h: Vec<String>| pb::ReceiptHandles { receipt_handles: h };
    send(pb::consume_request::Kind::Ack(handles(vec![
        "not a handle\n".into(),
    ])))?;
    send(pb::consume_request::Kind::Release(handles(vec![
        theirs[0].receipt_handle().to_string(),
        mine.clone(),
    ])))?;
    let mut answers = vec![];
    while answers.len() < 2 {
        match responses.message().await?.and_then(|r| r.kind) {
            Some(pb::consume_response::Kind::AckResult(a)) => answers.push(a.stale_receipt_handles),
            Some(pb::consume_response::Kind::Deliveries(_)) => {}
            other => anyhow::bail!("expected two answers on a live stream, got {other:?}"),
        }
    }
    assert_eq!(
        answers[0].len(),
        1,
        "the malformed handle, answered alone: {answers:?}"
    );
    assert_eq!(
        answers[1].len(),
        1,
        "only the other session's handle is refused: {answers:?}"
    );
    assert!(
        answers[1][0].starts_with(theirs[0].receipt_handle()),
        "{answers:?}"
    );
    // The other session still holds its delivery (its ack succeeds); nothing was lost.
    let s = stats(&client, "q").await?;
    assert_eq!(s.ready + s.leased, 2, "{s:?}");
    other.ack(&theirs).await?;
    Ok(())
}
