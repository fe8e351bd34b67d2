//! SIGTERM: a graceful stop ends parked receivers and open streams at once with UNAVAILABLE
//! ("shutting down"), finishes durable writes and exits 0.

#![allow(clippy::unwrap_used)]

use std::io::{BufRead as _, BufReader};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use ferry_client::{AckMode, Message, ReceiveOptions};
use ferry_integration_tests::{create_queue, ferry_command, stats, wait_until, Node, NodeOptions};

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
    // The parked receive ended, saying why: not "no message came".
    let e = parked
        .await?
        .expect_err("the stop ends a parked receive with an error");
    assert_eq!(e.code(), Some(tonic::Code::Unavailable), "{e}");
    assert!(e.to_string().contains("shutting down"), "{e}");
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

/// The grace the nodes of these tests get; a stop that waits on an open call takes all of it.
const GRACE: Duration = Duration::from_secs(20);

/// A node with a `GRACE` shutdown grace and queue `idle`.
async fn node_with_grace(dir: &std::path::Path) -> anyhow::Result<(Node, ferry_client::Client)> {
    let node = Node::start(
        dir,
        NodeOptions {
            extra_toml: format!("shutdown_grace_ms = {}", GRACE.as_millis()),
            ..Default::default()
        },
    )?;
    let client = node.client().await?;
    create_queue(&client, "idle").await?;
    Ok((node, client))
}

/// SIGTERM to `node`; asserts it stopped cleanly, in less than half its grace (a stop that waited
/// on a call takes the whole grace).
fn terminate_quickly(node: &mut Node) -> anyhow::Result<()> {
    let started = Instant::now();
    let status = node.terminate()?;
    let took = started.elapsed();
    assert!(status.success(), "{status:?}; log:\n{}", node.log());
    assert!(
        took < GRACE / 2,
        "the stop took {took:?}; log:\n{}",
        node.log()
    );
    Ok(())
}

/// Stops the node with SIGTERM, quickly; the spawned `ferry` command must then fail, saying the
/// node is shutting down, and never print `not`.
fn stop_and_expect_told(node: &mut Node, child: Child, not: &str) -> anyhow::Result<()> {
    terminate_quickly(node)?;
    let (status, err) = ended(child)?;
    assert!(!status.success(), "{status:?}");
    assert!(
        err.contains("node node-1 is shutting down") && !err.contains(not),
        "{err}"
    );
    Ok(())
}

/// How a spawned `ferry` command ended: its status and stderr.
fn ended(child: Child) -> anyhow::Result<(std::process::ExitStatus, String)> {
    let out = child.wait_with_output()?;
    Ok((
        out.status,
        String::from_utf8_lossy(&out.stderr).into_owned(),
    ))
}

// Postmortem: an event watcher's stream stayed open through SIGTERM, so the node waited out the
// whole shutdown grace (10 s) and the watcher died with "h2 protocol error ... BrokenPipe".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_ends_an_event_watcher_at_once_and_tells_it_why() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let (mut node, client) = node_with_grace(dir.path()).await?;
    let session = client
        .open_connection("t")
        .await?
        .create_session(AckMode::Auto)
        .await?;
    session.send("idle", vec![Message::text("deep")]).await?;
    // The depth is over the threshold from the start: the watcher's first check tells it, so
    // its first line says it is attached.
    let args = ["events", "--depth-high", "1", "--depth-low", "0"];
    let mut child = ferry_command(&node, &args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    let mut first = String::new();
    BufReader::new(child.stdout.take().context("stdout")?).read_line(&mut first)?;
    assert!(first.contains("queue-depth-high idle"), "{first:?}");
    stop_and_expect_told(&mut node, child, "h2 protocol error")
}

// Postmortem: a receive parked at SIGTERM was answered empty, so `ferry receive` printed "no
// message arrived" and exited 0 as if the queue had stayed empty.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_ends_a_parked_receive_with_an_error_naming_the_shutdown() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let (mut node, client) = node_with_grace(dir.path()).await?;
    let child = ferry_command(&node, &["receive", "--queue", "idle"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    wait_until(Duration::from_secs(10), "the receive to park", || async {
        Ok(stats(&client, "idle").await?.consumers == 1)
    })
    .await?;
    stop_and_expect_told(&mut node, child, "no message arrived")
}

// A consumer (a `Consume` stream) waiting for messages is told too, rather than seeing its
// stream end as if it had been closed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_ends_a_consumer_stream_with_an_error_naming_the_shutdown() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let (mut node, client) = node_with_grace(dir.path()).await?;
    let session = client
        .open_connection("t")
        .await?
        .create_session(AckMode::Auto)
        .await?;
    let mut consumer = session
        .consumer("idle", ferry_client::ConsumerOptions::default())
        .await?;
    wait_until(Duration::from_secs(10), "the consumer to wait", || async {
        Ok(stats(&client, "idle").await?.consumers == 1)
    })
    .await?;
    let waiting = tokio::spawn(async move { consumer.receive_batch(1, None).await });
    terminate_quickly(&mut node)?;
    let e = waiting
        .await?
        .expect_err("the stop ends the stream with an error");
    assert!(e.to_string().contains("shutting down"), "{e}");
    Ok(())
}
