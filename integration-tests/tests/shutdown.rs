//! SIGTERM: a graceful stop answers parked receivers, finishes durable writes and exits 0.

#![allow(clippy::unwrap_used)]

use std::time::Duration;

use ferry_client::{AckMode, Message, ReceiveOptions};
use ferry_integration_tests::{create_queue, stats, wait_until, Node, NodeOptions};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_stops_cleanly_and_keeps_confirmed_messages() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let mut node = Node::start(dir.path(), NodeOptions::default())?;
    let client = node.client().await?;
    create_queue(&client, "q").await?;
    create_queue(&client, "idle").await?;
    let conn = client.open_connection("t").await?;
    let session = conn.create_session(AckMode::Auto).await?;
    let ids = session
        .send("q", vec![Message::text("a"), Message::text("b")])
        .await?;
    let parked = {
        let session = session.clone();
        tokio::spawn(async move { session.receive("idle", ReceiveOptions::forever()).await })
    };
    wait_until(Duration::from_secs(5), "the receiver to park", || async {
        Ok(stats(&client, "idle").await?.consumers == 1)
    })
    .await?;
    // Postmortem: RocksDB was still open when main returned, and its background threads aborted
    // the process (SIGABRT) after a clean stop; the broker now closes the store before exiting.
    let status = node.terminate()?;
    assert!(
        status.success(),
        "exit status {status:?}; log:\n{}",
        node.log()
    );
    // The parked receive ended (empty, or UNAVAILABLE if the stop raced it): it did not hang.
    match parked.await? {
        Ok(got) => assert!(got.is_empty()),
        Err(e) => assert!(
            matches!(
                e.code(),
                Some(tonic::Code::Unavailable | tonic::Code::Cancelled)
            ),
            "{e}"
        ),
    }
    assert!(
        node.log().contains("stopped"),
        "the node logged a clean stop"
    );
    node.restart()?;
    let client = node.client().await?;
    let session = client
        .open_connection("t")
        .await?
        .create_session(AckMode::Auto)
        .await?;
    let got = session
        .receive("q", ReceiveOptions::no_wait().max(10))
        .await?;
    assert_eq!(
        got.iter()
            .map(|r| r.message_id().to_string())
            .collect::<Vec<_>>(),
        ids
    );
    Ok(())
}
