//! Field note 1 (WebLogic JMS): a receiver whose client died must never keep a message.

#![allow(clippy::unwrap_used)]

use std::process::{Command, Stdio};
use std::time::Duration;

use ferry_client::{AckMode, Message, ReceiveOptions};
use ferry_integration_tests::{ferry_bin, memory_node, stats, wait_until};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_receiver_leaves_nothing_behind() -> anyhow::Result<()> {
    let (_dir, node, client) = memory_node(&["jobs"]).await?;

    // A separate client process blocks in receive(60 s)...
    let mut blocked = Command::new(ferry_bin())
        .args([
            "receive",
            "--queue",
            "jobs",
            "--timeout-ms",
            "60000",
            "--server",
        ])
        .arg(node.addr.to_string())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()?;
    wait_until(Duration::from_secs(10), "the receiver to park", || async {
        Ok(stats(&client, "jobs").await?.consumers == 1)
    })
    .await?;
    // ...and is killed.
    blocked.kill()?;
    blocked.wait()?;
    wait_until(
        Duration::from_secs(5),
        "the server to drop the dead receiver",
        || async { Ok(stats(&client, "jobs").await?.consumers == 0) },
    )
    .await?;

    // A message sent afterwards goes to the next consumer at once, not to the dead one.
    let conn = client.open_connection("t").await?;
    let session = conn.create_session(AckMode::Client).await?;
    let id = session
        .send("jobs", vec![Message::text("work")])
        .await?
        .remove(0);
    let got = session
        .receive("jobs", ReceiveOptions::timeout_ms(1_000))
        .await?;
    assert_eq!(got.len(), 1, "received within a second");
    assert_eq!(got[0].message_id(), id);
    assert_eq!(
        got[0].delivery_count(),
        1,
        "it was never handed to the dead receiver"
    );
    session.ack(&got).await?;
    let s = stats(&client, "jobs").await?;
    assert_eq!(
        (s.ready, s.leased, s.consumers),
        (0, 0, 0),
        "nothing stays leased"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_receive_hands_the_next_message_to_the_next_receiver() -> anyhow::Result<()> {
    let (_dir, _node, client) = memory_node(&["q"]).await?;
    let conn = client.open_connection("t").await?;
    let first = conn.create_session(AckMode::Client).await?;
    let second = conn.create_session(AckMode::Client).await?;
    // First receiver waits, then its call is cancelled by the client (future dropped).
    let cancelled = {
        let first = first.clone();
        tokio::spawn(async move { first.receive("q", ReceiveOptions::forever()).await })
    };
    wait_until(
        Duration::from_secs(5),
        "the first receiver to park",
        || async { Ok(stats(&client, "q").await?.consumers == 1) },
    )
    .await?;
    cancelled.abort();
    let _ = cancelled.await;
    wait_until(
        Duration::from_secs(5),
        "the cancelled receiver to be removed",
        || async { Ok(stats(&client, "q").await?.consumers == 0) },
    )
    .await?;
    let waiting = {
        let second = second.clone();
        tokio::spawn(async move { second.receive("q", ReceiveOptions::timeout_ms(5_000)).await })
    };
    wait_until(
        Duration::from_secs(5),
        "the second receiver to park",
        || async { Ok(stats(&client, "q").await?.consumers == 1) },
    )
    .await?;
    first.send("q", vec![Message::text("m")]).await?;
    let got = waiting.await??;
    assert_eq!(got.len(), 1);
    Ok(())
}
