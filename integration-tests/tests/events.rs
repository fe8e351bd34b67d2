//! Events: each threshold crossing is told once (with hysteresis), and dead letters, expiries and
//! replies to a vanished queue are told as they happen.

use std::time::Duration;

use ferry_client::{pb, AckMode, Message, ReceiveOptions};
use ferry_integration_tests::{create_queue, memory_node};

async fn next(stream: &mut tonic::Streaming<pb::Event>) -> anyhow::Result<pb::Event> {
    tokio::time::timeout(Duration::from_secs(10), stream.message())
        .await??
        .ok_or_else(|| anyhow::anyhow!("the event stream ended"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_come_once_per_crossing_and_as_things_happen() -> anyhow::Result<()> {
    let (_dir, _node, client) = memory_node(&["orders"]).await?;
    let mut events = client
        .admin()
        .watch_events(pb::WatchEventsRequest {
            queue: String::new(),
            depth_high: 5,
            depth_low: Some(2),
            age_high_ms: 0,
            check_every_ms: Some(50),
        })
        .await?
        .into_inner();
    let conn = client.open_connection("e").await?;
    let session = conn.create_session(AckMode::Individual).await?;

    // Up to 6: one high event, however long it stays high and however many more arrive.
    let batch = (0..6).map(|i| Message::text(format!("m{i}"))).collect();
    session.send("orders", batch).await?;
    let e = next(&mut events).await?;
    assert_eq!(
        (e.kind.as_str(), e.queue.as_str()),
        ("queue-depth-high", "orders")
    );
    assert_eq!(e.value, 6);
    session
        .send("orders", vec![Message::text("m6"), Message::text("m7")])
        .await?;
    // Down to 3 (above depth_low): nothing; down to 2: one normal event. Each step is told
    // apart by a dead letter, which comes on the same stream.
    let got = session
        .receive("orders", ReceiveOptions::no_wait().max(5))
        .await?;
    session.reject(&got[..1], "bad").await?;
    let e = next(&mut events).await?;
    assert_eq!(e.kind, "dead-lettered", "{e:?}");
    assert_eq!(
        (e.queue.as_str(), e.reason.as_str()),
        ("orders", "rejected")
    );
    assert_eq!(e.message_id, got[0].message_id());
    session.ack(&got[1..]).await?;
    let got = session
        .receive("orders", ReceiveOptions::no_wait().max(1))
        .await?;
    session.ack(&got).await?;
    let e = next(&mut events).await?;
    assert_eq!(e.kind, "queue-depth-normal", "{e:?}");
    assert_eq!(e.value, 2);

    // An expiry, moved to the DLQ.
    create_queue(&client, "quotes").await?;
    let ids = session
        .send("quotes", vec![Message::text("old").ttl_ms(20)])
        .await?;
    let e = next(&mut events).await?;
    assert_eq!(
        (e.kind.as_str(), e.queue.as_str()),
        ("expired", "quotes"),
        "{e:?}"
    );
    assert_eq!(
        (e.message_id.as_str(), e.reason.as_str()),
        (ids[0].as_str(), "moved")
    );

    // A reply to a temporary queue that is gone.
    let tmp = conn.create_temporary_queue().await?;
    client
        .messaging()
        .delete_temporary_queue(pb::DeleteTemporaryQueueRequest {
            connection_id: conn.id().to_string(),
            queue: tmp.clone(),
        })
        .await?;
    let err = session
        .send(
            &tmp,
            vec![Message::text("late answer").correlation_id("ID:x")],
        )
        .await
        .unwrap_err();
    assert_eq!(err.code(), Some(tonic::Code::NotFound));
    let e = next(&mut events).await?;
    assert_eq!(
        (e.kind.as_str(), e.queue.as_str()),
        ("reply-queue-missing", tmp.as_str())
    );
    Ok(())
}
