//! Changing a queue on a running node (issue 17, item 9): `ferry queue update` applied live,
//! through the metadata and at the owner whichever node is asked, and kept across restarts;
//! `create --if-not-exists` telling where an existing queue differs; `delete --if-empty`.

#![allow(clippy::unwrap_used)]

use std::time::Duration;

use ferry_client::{pb, AckMode, Message, ReceiveOptions};
use ferry_integration_tests::cluster::{create_queue_on, Cluster};
use ferry_integration_tests::{ferry_cli, memory_node, stats, wait_until, Node, NodeOptions};
use serde_json::Value;
use tonic::Code;

fn json_line(out: &str) -> Value {
    let line = out.lines().next().unwrap_or_default();
    serde_json::from_str(line).unwrap_or_else(|e| panic!("{out:?}: {e}"))
}

fn max_redeliveries(info: &pb::QueueInfo) -> Option<u32> {
    info.config
        .as_ref()
        .and_then(|c| c.redelivery.as_ref())
        .and_then(|r| r.max_redeliveries)
}

async fn queue_info(client: &ferry_client::Client, name: &str) -> anyhow::Result<pb::QueueInfo> {
    Ok(client
        .admin()
        .get_queue(pb::GetQueueRequest { name: name.into() })
        .await?
        .into_inner()
        .queue
        .unwrap_or_default())
}

fn update(name: &str, patch: pb::QueueConfig, node: &str) -> pb::UpdateQueueRequest {
    pb::UpdateQueueRequest {
        name: name.into(),
        config: Some(patch),
        node: node.into(),
    }
}

fn redeliveries(n: u32) -> pb::QueueConfig {
    pb::QueueConfig {
        redelivery: Some(pb::RedeliveryPolicy {
            max_redeliveries: Some(n),
            ..Default::default()
        }),
        ..Default::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_update_applies_live_is_told_to_watchers_and_is_checked_like_a_create(
) -> anyhow::Result<()> {
    let (_dir, node, client) = memory_node(&["jobs"]).await?;
    let mut events = client
        .admin()
        .watch_events(pb::WatchEventsRequest {
            queue: "jobs".into(),
            ..Default::default()
        })
        .await?
        .into_inner();

    let (ok, out, err) = ferry_cli(
        &node,
        &["queue", "update", "jobs", "--max-redeliveries", "0"],
    )?;
    assert!(ok, "{err}");
    assert!(out.contains("updated queue jobs on node-1"), "{out}");
    assert!(out.contains("max-redeliveries: 6 -> 0"), "{out}");
    let e = tokio::time::timeout(Duration::from_secs(10), events.message())
        .await??
        .unwrap();
    assert_eq!(
        (e.kind.as_str(), e.queue.as_str()),
        ("queue-updated", "jobs")
    );
    assert_eq!(e.detail, "redelivery.max_redeliveries: 6 -> 0");

    // Live: with no redelivery left, the first message given back is dead-lettered at once.
    let conn = client.open_connection("t").await?;
    let session = conn.create_session(AckMode::Client).await?;
    session.send("jobs", vec![Message::text("x")]).await?;
    let got = session
        .receive("jobs", ReceiveOptions::timeout_ms(1_000))
        .await?;
    assert_eq!(got.len(), 1);
    assert_eq!(session.recover().await?, 1);
    wait_until(
        Duration::from_secs(10),
        "dead-lettered by the new setting",
        || async { Ok(stats(&client, "jobs.DLQ").await?.ready == 1) },
    )
    .await?;

    // The same again: nothing to change. JSON keeps raw values.
    let (ok, out, err) = ferry_cli(
        &node,
        &[
            "queue",
            "update",
            "jobs",
            "--max-redeliveries",
            "0",
            "-o",
            "json",
        ],
    )?;
    assert!(ok, "{err}");
    let v = json_line(&out);
    assert_eq!(v["changed"], false, "{out}");
    let (ok, out, err) = ferry_cli(
        &node,
        &[
            "queue",
            "update",
            "jobs",
            "--lease-ms",
            "5000",
            "-o",
            "json",
        ],
    )?;
    assert!(ok, "{err}");
    let v = json_line(&out);
    assert_eq!(v["changes"][0]["setting"], "default_lease_ms", "{out}");
    assert_eq!(v["changes"][0]["before"], "30000", "{out}");
    assert_eq!(v["changes"][0]["after"], "5000", "{out}");

    // Checked like a create: the field is named, nothing changes.
    let (ok, _, err) = ferry_cli(&node, &["queue", "update", "jobs", "--lease-ms", "0"])?;
    assert!(!ok);
    assert!(err.contains("default_lease_ms"), "{err}");
    let e = client
        .admin()
        .update_queue(update(
            "jobs",
            pb::QueueConfig {
                max_message_size_bytes: Some(u64::MAX),
                ..Default::default()
            },
            "",
        ))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
    assert!(e.message().contains("max_message_size_bytes"), "{e:?}");
    // What cannot change: the node a queue lives on, the settings of a temporary queue.
    let e = client
        .admin()
        .update_queue(update("jobs", redeliveries(1), "elsewhere"))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
    assert!(e.message().starts_with("node:"), "{e:?}");
    let tmp = conn.create_temporary_queue().await?;
    let e = client
        .admin()
        .update_queue(update(&tmp, redeliveries(1), ""))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
    assert!(e.message().contains("temporary"), "{e:?}");
    let (ok, _, err) = ferry_cli(
        &node,
        &["queue", "update", "nope", "--max-redeliveries", "1"],
    )?;
    assert!(!ok);
    assert!(err.contains("does not exist"), "{err}");
    let (ok, _, err) = ferry_cli(&node, &["queue", "update", "jobs"])?;
    assert!(!ok);
    assert!(err.contains("nothing to change"), "{err}");

    let info = queue_info(&client, "jobs").await?;
    assert_eq!(max_redeliveries(&info), Some(0));
    assert_eq!(info.config.unwrap().default_lease_ms, Some(5_000));
    conn.close().await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_update_survives_a_restart() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let mut node = Node::start(dir.path(), NodeOptions::default())?;
    let client = node.client().await?;
    let (ok, _, err) = ferry_cli(&node, &["queue", "create", "jobs"])?;
    assert!(ok, "{err}");
    let (ok, _, err) = ferry_cli(
        &node,
        &[
            "queue",
            "update",
            "jobs",
            "--max-redeliveries",
            "2",
            "--max-messages",
            "10",
            "--dead-letter-queue",
            "jobs.failed",
        ],
    )?;
    assert!(ok, "{err}");
    drop(client);
    node.kill9();
    node.restart()?;
    let client = node.client().await?;
    let info = queue_info(&client, "jobs").await?;
    let cfg = info.config.clone().unwrap();
    assert_eq!(max_redeliveries(&info), Some(2));
    assert_eq!(cfg.max_messages, Some(10));
    assert_eq!(
        cfg.dead_letter.and_then(|t| t.target),
        Some(pb::dead_letter_target::Target::Queue("jobs.failed".into()))
    );
    // The new dead-letter queue was made next to it, and is still there.
    queue_info(&client, "jobs.failed").await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_update_sent_to_another_node_applies_at_the_owner_and_persists() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let mut cluster = Cluster::start(dir.path(), &["n1", "n2", "n3"])?;
    cluster
        .wait_leader(&["n1", "n2", "n3"], Duration::from_secs(20))
        .await?;
    let via1 = cluster.node("n1").client().await?;
    create_queue_on(&via1, "orders", Some("n3")).await?;

    // Asked of n1, which neither owns the queue nor (necessarily) leads the metadata.
    let r = via1
        .admin()
        .update_queue(update("orders", redeliveries(1), ""))
        .await?
        .into_inner();
    assert!(r.changed);
    let after = r.queue.unwrap();
    assert_eq!(after.owner_node, "n3");
    assert_eq!(
        max_redeliveries(&after),
        Some(1),
        "answered once the owner serves it"
    );
    assert_eq!(
        r.previous
            .and_then(|p| p.redelivery)
            .and_then(|p| p.max_redeliveries),
        Some(6)
    );
    // Every node routes to the owner, which has it.
    let via2 = cluster.node("n2").client().await?;
    assert_eq!(
        max_redeliveries(&queue_info(&via2, "orders").await?),
        Some(1)
    );

    // Live at the owner: a producer on n2, a consumer on n1; the second return dead-letters.
    let conn = via1.open_connection("c").await?;
    let session = conn.create_session(AckMode::Client).await?;
    let producer = via2.open_connection("p").await?;
    producer
        .create_session(AckMode::Auto)
        .await?
        .send("orders", vec![Message::text("x")])
        .await?;
    for _ in 0..2 {
        let got = session
            .receive("orders", ReceiveOptions::timeout_ms(2_000))
            .await?;
        assert_eq!(got.len(), 1);
        session.recover().await?;
    }
    wait_until(
        Duration::from_secs(10),
        "dead-lettered at the owner",
        || async { Ok(stats(&via2, "orders.DLQ").await?.ready == 1) },
    )
    .await?;
    conn.close().await?;
    producer.close().await?;

    // A node asked to put the queue elsewhere refuses: queues do not move.
    let e = via1
        .admin()
        .update_queue(update("orders", redeliveries(2), "n1"))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");

    // Kept across a restart of the owner.
    drop((via1, via2));
    cluster.node_mut("n3").kill9();
    cluster.node_mut("n3").restart_in_place()?;
    cluster
        .wait_leader(&["n1", "n2", "n3"], Duration::from_secs(20))
        .await?;
    let via3 = cluster.node("n3").client().await?;
    assert_eq!(
        max_redeliveries(&queue_info(&via3, "orders").await?),
        Some(1)
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn create_if_not_exists_says_where_the_existing_queue_differs() -> anyhow::Result<()> {
    let (_dir, node, _client) = memory_node(&[]).await?;
    let (ok, _, err) = ferry_cli(
        &node,
        &["queue", "create", "jobs", "--max-redeliveries", "3"],
    )?;
    assert!(ok, "{err}");
    // The same settings: quiet.
    let (ok, out, err) = ferry_cli(
        &node,
        &[
            "queue",
            "create",
            "jobs",
            "--if-not-exists",
            "--max-redeliveries",
            "3",
        ],
    )?;
    assert!(ok, "{err}");
    assert!(out.contains("already exists"), "{out}");
    assert!(!err.contains("warning"), "{err}");
    // Others: a warning naming each difference, the queue kept as it is.
    let (ok, _, err) = ferry_cli(
        &node,
        &[
            "queue",
            "create",
            "jobs",
            "--if-not-exists",
            "--max-redeliveries",
            "5",
            "--lease-ms",
            "2000",
        ],
    )?;
    assert!(ok, "{err}");
    assert!(
        err.contains("warning: queue jobs exists with other settings"),
        "{err}"
    );
    assert!(err.contains("max-redeliveries: 3 (asked 5)"), "{err}");
    assert!(err.contains("lease-ms: 30 s (asked 2 s)"), "{err}");
    assert!(err.contains("ferry queue update jobs"), "{err}");
    let (ok, out, err) = ferry_cli(
        &node,
        &[
            "queue",
            "create",
            "jobs",
            "--if-not-exists",
            "--max-redeliveries",
            "5",
            "-o",
            "json",
        ],
    )?;
    assert!(ok, "{err}");
    let v = json_line(&out);
    assert_eq!(v["created"], false);
    assert_eq!(
        v["different_settings"][0],
        serde_json::json!({ "setting": "redelivery.max_redeliveries", "existing": "3", "asked": "5" })
    );
    let (ok, out, _) = ferry_cli(&node, &["queue", "show", "jobs", "-o", "json"])?;
    assert!(ok);
    assert_eq!(json_line(&out)["max_redeliveries"], "3", "kept");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delete_if_empty_refuses_a_queue_holding_messages_and_says_how_many() -> anyhow::Result<()>
{
    let (_dir, node, client) = memory_node(&["orders"]).await?;
    let conn = client.open_connection("t").await?;
    let session = conn.create_session(AckMode::Client).await?;
    session
        .send(
            "orders",
            (0..3).map(|i| Message::text(format!("{i}"))).collect(),
        )
        .await?;
    session
        .receive("orders", ReceiveOptions::timeout_ms(1_000))
        .await?;
    let (ok, _, err) = ferry_cli(&node, &["queue", "delete", "orders", "--if-empty"])?;
    assert!(!ok);
    assert!(err.contains("not empty"), "{err}");
    assert!(
        err.contains("2 ready") && err.contains("1 delivered"),
        "{err}"
    );
    let e = client
        .admin()
        .delete_queue(pb::DeleteQueueRequest {
            name: "orders".into(),
            if_empty: true,
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
    // Refused: the queue and its messages are untouched, and it still takes sends.
    session.send("orders", vec![Message::text("more")]).await?;
    let s = stats(&client, "orders").await?;
    assert_eq!((s.ready, s.leased), (3, 1));
    conn.close().await?;

    let (ok, _, err) = ferry_cli(&node, &["queue", "purge", "orders"])?;
    assert!(ok, "{err}");
    let (ok, out, err) = ferry_cli(&node, &["queue", "delete", "orders", "--if-empty"])?;
    assert!(ok, "{err}");
    assert!(out.contains("deleted queue orders"), "{out}");
    let (ok, _, err) = ferry_cli(&node, &["queue", "show", "orders"])?;
    assert!(!ok);
    assert!(err.contains("does not exist"), "{err}");
    Ok(())
}
