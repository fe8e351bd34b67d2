//! Ending a session or connection, or its lease running out, returns its unacknowledged
//! messages at once; a delivery lease that runs out returns only its own message.

#![allow(clippy::unwrap_used)]

use std::time::Duration;

use ferry_client::pb;
use ferry_client::{AckMode, Message, ReceiveOptions};
use ferry_integration_tests::{memory_node, stats, wait_until};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_whose_heartbeats_stop_releases_its_messages() -> anyhow::Result<()> {
    let (_dir, _node, client) = memory_node(&["q"]).await?;
    let mut m = client.messaging();
    // A raw connection with the shortest lease and no heartbeats: a client that hung.
    let conn = m
        .open_connection(pb::OpenConnectionRequest {
            client_id: "silent".into(),
            lease_ms: Some(1_000),
        })
        .await?
        .into_inner();
    assert_eq!(conn.lease_ms, 1_000);
    let session = m
        .create_session(pb::CreateSessionRequest {
            connection_id: conn.connection_id.clone(),
            ack_mode: pb::AckMode::Client as i32,
        })
        .await?
        .into_inner()
        .session_id;
    let producer = client
        .open_connection("producer")
        .await?
        .create_session(AckMode::Auto)
        .await?;
    producer.send("q", vec![Message::text("held")]).await?;
    let got = m
        .receive(pb::ReceiveRequest {
            session_id: session.clone(),
            queue: "q".into(),
            wait_ms: Some(0),
            lease_ms: Some(600_000),
            ..Default::default()
        })
        .await?
        .into_inner()
        .deliveries;
    assert_eq!(got.len(), 1);
    assert_eq!(stats(&client, "q").await?.leased, 1);
    // Its delivery lease is ten minutes, but the connection lease runs out in about a second.
    wait_until(
        Duration::from_secs(10),
        "the silent connection's message to return",
        || async { Ok(stats(&client, "q").await?.ready == 1) },
    )
    .await?;
    let e = m
        .heartbeat(pb::HeartbeatRequest {
            connection_id: conn.connection_id,
        })
        .await
        .unwrap_err();
    assert_eq!(
        e.code(),
        tonic::Code::NotFound,
        "the expired connection is gone"
    );
    let again = producer.receive("q", ReceiveOptions::no_wait()).await?;
    assert!(again[0].redelivered());
    assert_eq!(again[0].delivery_count(), 2);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn closing_recovering_and_lease_expiry_return_messages() -> anyhow::Result<()> {
    let (_dir, _node, client) = memory_node(&["q"]).await?;
    let conn = client.open_connection("t").await?;
    let s1 = conn.create_session(AckMode::Client).await?;
    s1.send(
        "q",
        (0..3).map(|i| Message::text(format!("m{i}"))).collect(),
    )
    .await?;

    // Recover: every unacknowledged message of the session comes back, flagged.
    let got = s1.receive("q", ReceiveOptions::no_wait().max(3)).await?;
    assert_eq!(got.len(), 3);
    assert_eq!(s1.recover().await?, 3);
    let again = s1.receive("q", ReceiveOptions::no_wait().max(3)).await?;
    assert!(again
        .iter()
        .all(|r| r.redelivered() && r.delivery_count() == 2));

    // Close: released at once.
    assert_eq!(s1.close().await?, 3);
    assert_eq!(stats(&client, "q").await?.ready, 3);

    // A short delivery lease returns only its own message.
    let s2 = conn.create_session(AckMode::Client).await?;
    let short = s2
        .receive(
            "q",
            ReceiveOptions {
                lease_ms: Some(200),
                ..ReceiveOptions::no_wait()
            },
        )
        .await?;
    let long = s2
        .receive(
            "q",
            ReceiveOptions {
                lease_ms: Some(600_000),
                ..ReceiveOptions::no_wait()
            },
        )
        .await?;
    assert_eq!((short.len(), long.len()), (1, 1));
    wait_until(
        Duration::from_secs(5),
        "the short lease to run out",
        || async { Ok(stats(&client, "q").await?.ready == 2) },
    )
    .await?;
    assert_eq!(
        stats(&client, "q").await?.leased,
        1,
        "the long lease still holds its message"
    );
    let e = s2.ack(&short).await.unwrap_err();
    assert_eq!(e.code(), Some(tonic::Code::FailedPrecondition), "{e}");
    s2.ack(&long).await?;
    conn.close().await?;
    let s = stats(&client, "q").await?;
    assert_eq!((s.ready, s.leased), (2, 0));
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn closing_a_connection_deletes_its_temporary_queues() -> anyhow::Result<()> {
    let (_dir, _node, client) = memory_node(&[]).await?;
    let conn = client.open_connection("requester").await?;
    let tmp = conn.create_temporary_queue().await?;
    let session = conn.create_session(AckMode::Auto).await?;
    session.send(&tmp, vec![Message::text("reply")]).await?;
    assert_eq!(
        session
            .receive(&tmp, ReceiveOptions::no_wait())
            .await?
            .len(),
        1
    );
    conn.close().await?;
    let other = client
        .open_connection("other")
        .await?
        .create_session(AckMode::Auto)
        .await?;
    let e = other
        .send(&tmp, vec![Message::text("late")])
        .await
        .unwrap_err();
    assert_eq!(e.code(), Some(tonic::Code::NotFound), "{e}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn consume_stream_delivers_with_credits_and_takes_acks() -> anyhow::Result<()> {
    let (_dir, _node, client) = memory_node(&["q"]).await?;
    let conn = client.open_connection("t").await?;
    let session = conn.create_session(AckMode::Client).await?;
    session
        .send(
            "q",
            (0..5).map(|i| Message::text(format!("m{i}"))).collect(),
        )
        .await?;
    let (tx, rx) = tokio::sync::mpsc::channel(8);
    let start = pb::ConsumeStart {
        session_id: session.id().into(),
        queue: "q".into(),
        prefetch: 2,
        ..Default::default()
    };
    tx.send(pb::ConsumeRequest {
        kind: Some(pb::consume_request::Kind::Start(start)),
    })
    .await?;
    let mut stream = client
        .messaging()
        .consume(tokio_stream::wrappers::ReceiverStream::new(rx))
        .await?
        .into_inner();
    let mut got: Vec<pb::Delivery> = vec![];
    while got.len() < 2 {
        match stream.message().await?.and_then(|r| r.kind) {
            Some(pb::consume_response::Kind::Deliveries(d)) => got.extend(d.deliveries),
            other => anyhow::bail!("unexpected {other:?}"),
        }
    }
    assert_eq!(got.len(), 2, "no more than the credit");
    assert_eq!(stats(&client, "q").await?.leased, 2);
    let handles = got.iter().map(|d| d.receipt_handle.clone()).collect();
    tx.send(pb::ConsumeRequest {
        kind: Some(pb::consume_request::Kind::Ack(pb::ReceiptHandles {
            receipt_handles: handles,
        })),
    })
    .await?;
    match stream.message().await?.and_then(|r| r.kind) {
        Some(pb::consume_response::Kind::AckResult(r)) => {
            assert!(r.stale_receipt_handles.is_empty())
        }
        other => anyhow::bail!("unexpected {other:?}"),
    }
    tx.send(pb::ConsumeRequest {
        kind: Some(pb::consume_request::Kind::Credit(3)),
    })
    .await?;
    let mut more = 0;
    while more < 3 {
        match stream.message().await?.and_then(|r| r.kind) {
            Some(pb::consume_response::Kind::Deliveries(d)) => more += d.deliveries.len(),
            other => anyhow::bail!("unexpected {other:?}"),
        }
    }
    // Closing the stream and the session gives the unacknowledged three back.
    drop(tx);
    drop(stream);
    session.close().await?;
    let s = stats(&client, "q").await?;
    assert_eq!((s.ready, s.leased, s.acked_total), (3, 0, 2));
    Ok(())
}
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_acknowledge_is_cumulative_and_individual_is_not() -> anyhow::Result<()> {
    let (_dir, _node, client) = memory_node(&["q"]).await?;
    let conn = client.open_connection("t").await?;
    let producer = conn.create_session(AckMode::Auto).await?;
    producer
        .send(
            "q",
            (1..=6).map(|i| Message::text(format!("m{i}"))).collect(),
        )
        .await?;

    // CLIENT: acknowledging the second message acknowledges the first too, not the third.
    let client_ack = conn.create_session(AckMode::Client).await?;
    let mut got = vec![];
    for _ in 0..3 {
        got.extend(client_ack.receive("q", ReceiveOptions::no_wait()).await?);
    }
    client_ack.ack(&got[1..2]).await?;
    let s = stats(&client, "q").await?;
    assert_eq!((s.acked_total, s.leased, s.ready), (2, 1, 3));

    // INDIVIDUAL: acknowledging one acknowledges only that one.
    let individual = conn.create_session(AckMode::Individual).await?;
    let mut got = vec![];
    for _ in 0..2 {
        got.extend(individual.receive("q", ReceiveOptions::no_wait()).await?);
    }
    individual.ack(&got[1..2]).await?;
    let s = stats(&client, "q").await?;
    assert_eq!((s.acked_total, s.leased, s.ready), (3, 2, 1));

    // Recover forgets what the client session held; nothing is acknowledged by a later ack
    // beyond what it names and what was delivered after the recover.
    assert_eq!(client_ack.recover().await?, 1);
    let again = client_ack
        .receive("q", ReceiveOptions::no_wait().max(2))
        .await?;
    assert_eq!(again.len(), 2);
    client_ack.ack(&again[0..1]).await?;
    let s = stats(&client, "q").await?;
    assert_eq!((s.acked_total, s.leased), (4, 2));
    Ok(())
}

/// Postmortem: cumulative acknowledgement tracked in the front-end acknowledged deliveries that
/// never reached the application (lost on the wire, left in a closed stream's buffer). The server
/// acknowledges exactly what it is told; cumulation lives in the client library.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_server_acknowledges_exactly_the_handles_named() -> anyhow::Result<()> {
    let (_dir, _node, client) = memory_node(&["q"]).await?;
    let conn = client.open_connection("t").await?;
    conn.create_session(AckMode::Auto)
        .await?
        .send("q", vec![Message::text("a"), Message::text("b")])
        .await?;
    let mut m = client.messaging();
    let session = m
        .create_session(pb::CreateSessionRequest {
            connection_id: conn.id().into(),
            ack_mode: pb::AckMode::Client as i32,
        })
        .await?
        .into_inner()
        .session_id;
    let receive = || pb::ReceiveRequest {
        session_id: session.clone(),
        queue: "q".into(),
        wait_ms: Some(0),
        ..Default::default()
    };
    let _never_seen = m.receive(receive()).await?.into_inner().deliveries;
    let seen = m.receive(receive()).await?.into_inner().deliveries;
    m.ack(pb::AckRequest {
        session_id: session.clone(),
        receipt_handles: vec![seen[0].receipt_handle.clone()],
    })
    .await?;
    let s = stats(&client, "q").await?;
    assert_eq!(
        (s.acked_total, s.leased),
        (1, 1),
        "the first delivery is still leased, not acknowledged"
    );
    Ok(())
}

/// Concurrent sends on one session are coalesced by the client library, transparently: each
/// caller gets its own ids in its own order, and a message the server refuses fails only the
/// send it was in.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_sends_are_coalesced_without_mixing_answers() -> anyhow::Result<()> {
    let (_dir, _node, client) = ferry_integration_tests::memory_node(&["q"]).await?;
    let conn = client.open_connection("many").await?;
    let session = conn
        .create_session(ferry_client::AckMode::Individual)
        .await?;
    let mut sends = Vec::new();
    for i in 0..300u32 {
        let session = session.clone();
        sends.push(tokio::spawn(async move {
            let body = if i == 150 {
                vec![b'x'; 2 * 1024 * 1024] // over the 1 MiB default limit
            } else {
                format!("m{i}").into_bytes()
            };
            let r = session
                .send("q", vec![ferry_client::Message::bytes(body)])
                .await;
            (i, r)
        }));
    }
    let mut ids = std::collections::BTreeMap::new();
    for s in sends {
        let (i, r) = s.await?;
        if i == 150 {
            let e = r.expect_err("the oversized message is refused");
            assert_eq!(e.code(), Some(tonic::Code::ResourceExhausted), "{e}");
        } else {
            let got = r?;
            assert_eq!(got.len(), 1, "send {i}");
            ids.insert(got[0].clone(), i);
        }
    }
    assert_eq!(ids.len(), 299, "every other send got its own id");
    // Every id names the message its caller sent.
    let mut seen = 0;
    loop {
        let got = session
            .receive("q", ferry_client::ReceiveOptions::no_wait().max(100))
            .await?;
        if got.is_empty() {
            break;
        }
        for r in &got {
            let i = ids[r.message_id()];
            assert_eq!(r.body(), format!("m{i}").as_bytes());
            seen += 1;
        }
        session.ack(&got).await?;
    }
    assert_eq!(seen, 299);
    Ok(())
}
