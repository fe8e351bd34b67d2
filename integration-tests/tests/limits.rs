//! Limits operators set: a queue's `max_messages` / `max_bytes`, and the node's
//! `disk_free_min_bytes`. Each refusal is RESOURCE_EXHAUSTED naming the setting, and consuming
//! (or freeing disk) lets sends through again.

#![allow(clippy::unwrap_used)]

use ferry_client::{AckMode, ClientError, Message, ReceiveOptions, Session};
use ferry_integration_tests::{create_queue, ferry_cli, memory_node, Node, NodeOptions};
use serde_json::Value;

/// More free space than any disk has (2^60 bytes), small enough for every config parser.
const ABSURD_DISK_FREE_MIN_BYTES: &str = "1152921504606846976";

fn json_line(s: &str) -> Value {
    serde_json::from_str(s.lines().next().unwrap_or_default())
        .unwrap_or_else(|e| panic!("{s:?}: {e}"))
}

fn assert_exhausted(result: Result<Vec<String>, ClientError>, names: &str) {
    let err = result.expect_err("the send should have been refused");
    assert_eq!(err.code(), Some(tonic::Code::ResourceExhausted), "{err}");
    assert!(err.to_string().contains(names), "{err}");
}

/// Receives one message and acknowledges it.
async fn consume_one(session: &Session, queue: &str) -> anyhow::Result<()> {
    let got = session
        .receive(queue, ReceiveOptions::no_wait().max(1))
        .await?;
    assert_eq!(got.len(), 1);
    session.ack(&got).await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_queue_refuses_sends_until_a_message_is_consumed() -> anyhow::Result<()> {
    let (_dir, node, client) = memory_node(&[]).await?;
    let (ok, _, err) = ferry_cli(&node, &["queue", "create", "capped", "--max-messages", "3"])?;
    assert!(ok, "{err}");
    let (ok, out, err) = ferry_cli(&node, &["queue", "show", "capped", "-o", "json"])?;
    assert!(ok, "{err}");
    let shown = json_line(&out);
    assert_eq!(
        (shown["max_messages"].as_str(), shown["max_bytes"].as_str()),
        (Some("3"), Some("unlimited"))
    );

    let conn = client.open_connection("limits").await?;
    // Bodies alone: no dedup ids of the client's, which count too (the first sends to a queue
    // get them, until a confirm says the queue is kept on one node).
    let session = conn
        .create_session(AckMode::Individual)
        .await?
        .with_auto_dedup_ids(false);
    for i in 0..3 {
        session
            .send("capped", vec![Message::text(format!("m{i}"))])
            .await?;
    }
    assert_exhausted(
        session.send("capped", vec![Message::text("m3")]).await,
        "max_messages = 3",
    );
    // The command line says the same.
    let (ok, _, err) = ferry_cli(&node, &["send", "--queue", "capped", "m3"])?;
    assert!(!ok && err.contains("max_messages = 3"), "{err}");

    consume_one(&session, "capped").await?;
    session.send("capped", vec![Message::text("m3")]).await?;

    // Bodies only: each message counts 100 bytes.
    let (ok, _, err) = ferry_cli(
        &node,
        &[
            "queue",
            "create",
            "small",
            "--max-bytes",
            "250",
            "--max-messages",
            "0",
        ],
    )?;
    assert!(ok, "{err}");
    let body = || Message::bytes(vec![b'x'; 100]);
    session.send("small", vec![body(), body()]).await?;
    assert_exhausted(session.send("small", vec![body()]).await, "max_bytes = 250");
    consume_one(&session, "small").await?;
    session.send("small", vec![body()]).await?;

    let (ok, out, err) = ferry_cli(&node, &["queue", "show", "small", "-o", "json"])?;
    assert!(ok, "{err}");
    let shown = json_line(&out);
    assert_eq!(
        (shown["max_messages"].as_str(), shown["max_bytes"].as_str()),
        (Some("unlimited"), Some("250"))
    );
    let (ok, out, err) = ferry_cli(&node, &["queue", "stats", "small", "-o", "json"])?;
    assert!(ok, "{err}");
    let stats = json_line(&out);
    assert_eq!(stats["paged_out"].as_u64(), Some(0), "{stats}");
    assert_eq!(stats["memory_bytes"].as_u64(), Some(200), "{stats}");
    assert!(stats["memory_budget_bytes"].as_u64().is_some(), "{stats}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_short_disk_refuses_sends_while_receives_and_acks_go_on() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let mut node = Node::start(dir.path(), NodeOptions::default())?;
    let client = node.client().await?;
    create_queue(&client, "orders").await?;
    let conn = client.open_connection("before").await?;
    let session = conn.create_session(AckMode::Individual).await?;
    session
        .send("orders", vec![Message::text("a"), Message::text("b")])
        .await?;
    drop((session, conn, client));
    assert!(node.terminate()?.success());
    drop(node);

    // The same data directory, now with a limit no disk can meet (set the way operators do).
    let mut node = Node::start(
        dir.path(),
        NodeOptions {
            env: vec![(
                "FERRY_DISK_FREE_MIN_BYTES".into(),
                ABSURD_DISK_FREE_MIN_BYTES.into(),
            )],
            extra_toml: "[metrics]\nlisten = \"127.0.0.1:0\"\n".into(),
            ..Default::default()
        },
    )?;
    let url = node.metrics_url()?;
    let client = node.client().await?;
    let conn = client.open_connection("after").await?;
    let session = conn.create_session(AckMode::Individual).await?;
    assert_exhausted(
        session.send("orders", vec![Message::text("c")]).await,
        "disk_free_min_bytes",
    );
    let tx = conn.create_session(AckMode::Transacted).await?;
    assert_exhausted(
        tx.send("orders", vec![Message::text("c")]).await,
        "disk_free_min_bytes",
    );
    consume_one(&session, "orders").await?;
    consume_one(&session, "orders").await?;

    let scrape = tokio::task::spawn_blocking(move || -> anyhow::Result<String> {
        Ok(ureq::get(&url).call()?.body_mut().read_to_string()?)
    })
    .await??;
    assert!(
        scrape.contains(&format!(
            "ferry_disk_free_min_bytes {ABSURD_DISK_FREE_MIN_BYTES}"
        )),
        "{scrape}"
    );
    assert!(scrape.contains("ferry_disk_free_bytes "), "{scrape}");
    Ok(())
}
