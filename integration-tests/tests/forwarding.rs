//! The FE/BE split across processes: node A's front-end serves a queue owned by node B's back-end.

#![allow(clippy::unwrap_used)]

use std::time::Duration;

use ferry_client::{AckMode, ConsumerOptions, Message, ReceiveOptions};
use ferry_integration_tests::cluster::{create_queue_on, Cluster};
use ferry_integration_tests::{stats, wait_until};

/// A two-node cluster; `orders` is pinned to `b` when created, everything else to `a`.
fn two_nodes(dir: &std::path::Path) -> anyhow::Result<Cluster> {
    Cluster::start(dir, &["a", "b"])
}

async fn create_on(client: &ferry_client::Client, name: &str, node: &str) -> anyhow::Result<()> {
    create_queue_on(client, name, Some(node)).await.map(|_| ())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_a_serves_a_queue_owned_by_node_b() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let cluster = two_nodes(dir.path())?;
    cluster
        .wait_leader(&["a", "b"], Duration::from_secs(20))
        .await?;
    let via_a = cluster.node("a").client().await?;
    let via_b = cluster.node("b").client().await?;

    create_on(&via_a, "orders", "b").await?;
    create_on(&via_a, "local", "a").await?;
    let s = stats(&via_a, "orders").await?;
    assert_eq!(s.owner_node, "b", "created through A, owned by B");
    assert_eq!(stats(&via_a, "local").await?.owner_node, "a");
    // B has the queue itself; A holds nothing of it.
    assert_eq!(stats(&via_b, "orders").await?.owner_node, "b");

    // A long-poll receive through A parks at B (nothing is there yet) and is woken by a send
    // through B.
    let conn = via_a.open_connection("t").await?;
    let session = conn.create_session(AckMode::Client).await?;
    let waiting = {
        let session = session.clone();
        tokio::spawn(async move {
            session
                .receive("orders", ReceiveOptions::timeout_ms(30_000).max(3))
                .await
        })
    };
    wait_until(
        Duration::from_secs(10),
        "the receive parked at B",
        || async { Ok(stats(&via_b, "orders").await?.consumers == 1) },
    )
    .await?;
    assert!(!waiting.is_finished(), "answered with nothing in the queue");
    let sender = via_b.open_connection("s").await?;
    let ids = sender
        .create_session(AckMode::Auto)
        .await?
        .send("orders", vec![Message::text("one")])
        .await?;
    let got = waiting.await??;
    assert_eq!(
        got.iter()
            .map(|r| r.message_id().to_string())
            .collect::<Vec<_>>(),
        ids
    );
    assert!(
        got[0].receipt_handle().starts_with("r3.") && got[0].receipt_handle().ends_with(".orders"),
        "the receipt handle names the queue, not a node: {}",
        got[0].receipt_handle()
    );
    assert_eq!(stats(&via_b, "orders").await?.leased, 1);
    // Acks sent to A are routed to B by the queue the receipt handle names, through placement.
    session.ack(&got).await?;
    let s = stats(&via_b, "orders").await?;
    assert_eq!((s.ready, s.leased, s.acked_total), (0, 0, 1));

    // Closing the session through A releases its leases at B.
    let late = session.send("orders", vec![Message::text("three")]).await?;
    let held = session.receive("orders", ReceiveOptions::no_wait()).await?;
    assert_eq!(held[0].message_id(), late[0]);
    assert_eq!(session.close().await?, 1);
    let s = stats(&via_b, "orders").await?;
    assert_eq!((s.ready, s.leased), (1, 0));
    Ok(())
}

// Postmortem: a transaction's staged sends live only in the back-end's memory, and a commit
// carried nothing naming the run that staged them: when the back-end restarted between the sends
// and the commit, the commit answered OK and published nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_commit_after_the_back_end_restarted_is_aborted_not_lost() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let mut cluster = two_nodes(dir.path())?;
    cluster
        .wait_leader(&["a", "b"], Duration::from_secs(20))
        .await?;
    let via_a = cluster.node("a").client().await?;
    create_on(&via_a, "orders", "b").await?;
    let conn = via_a.open_connection("t").await?;
    let tx = conn.create_session(AckMode::Transacted).await?;
    tx.send("orders", vec![Message::text("staged at b")])
        .await?;
    // B restarts (same ports) between the send and the commit: the staged send is gone.
    cluster.node_mut("b").restart_in_place()?;
    let via_b = cluster.node("b").client().await?;
    let e = tx.commit().await.unwrap_err();
    assert_eq!(e.code(), Some(tonic::Code::Aborted), "{e}");
    assert!(e.to_string().contains("restarted"), "{e}");
    assert_eq!(stats(&via_b, "orders").await?.ready, 0);
    // The session goes on: a new transaction commits.
    tx.send("orders", vec![Message::text("again")]).await?;
    tx.commit().await?;
    assert_eq!(stats(&via_b, "orders").await?.ready, 1);
    Ok(())
}

/// A two-node cluster with `orders` on `b`, and a session through `a`.
async fn owner_b(
    dir: &std::path::Path,
) -> anyhow::Result<(Cluster, ferry_client::Client, ferry_client::Session)> {
    let cluster = two_nodes(dir)?;
    cluster
        .wait_leader(&["a", "b"], Duration::from_secs(20))
        .await?;
    let via_a = cluster.node("a").client().await?;
    create_on(&via_a, "orders", "b").await?;
    let session = via_a
        .open_connection("t")
        .await?
        .create_session(AckMode::Client)
        .await?;
    let via_b = cluster.node("b").client().await?;
    Ok((cluster, via_b, session))
}

/// Waits until a receive through `a` is parked at `b` (nothing is in the queue).
async fn parked_at_b(via_b: &ferry_client::Client) -> anyhow::Result<()> {
    wait_until(
        Duration::from_secs(10),
        "the receive parked at B",
        || async { Ok(stats(via_b, "orders").await?.consumers == 1) },
    )
    .await
}

/// Fails unless `e` is UNAVAILABLE naming node `b` and saying the leases bring the messages back.
fn owner_b_lost(e: &ferry_client::ClientError) {
    assert_eq!(e.code(), Some(tonic::Code::Unavailable), "{e}");
    let text = e.to_string();
    assert!(text.starts_with("node b: "), "names the owner: {text}");
    assert!(text.contains("while the receive was under way"), "{text}");
    assert!(text.contains("when their leases run out"), "{text}");
}

// Postmortem: the front-end passed on the broken link's own error, `UNKNOWN: transport
// error`, which said neither which node was lost nor what became of the receive (the CLI even
// read it as its own connection failing).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_receive_parked_at_an_owner_that_dies_ends_unavailable_naming_it() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let (mut cluster, via_b, session) = owner_b(dir.path()).await?;
    let waiting = tokio::spawn(async move {
        session
            .receive("orders", ReceiveOptions::timeout_ms(60_000))
            .await
    });
    parked_at_b(&via_b).await?;
    cluster.node_mut("b").kill9();
    let e = waiting.await?.unwrap_err();
    owner_b_lost(&e);
    Ok(())
}

// Postmortem: as above, on a Consume stream, whose open receive is parked at the owner.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_consume_stream_whose_owner_dies_ends_unavailable_naming_it() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let (mut cluster, via_b, session) = owner_b(dir.path()).await?;
    let mut consumer = session
        .consumer("orders", ConsumerOptions::default().prefetch(1))
        .await?;
    parked_at_b(&via_b).await?;
    cluster.node_mut("b").kill9();
    let e = consumer
        .receive(Some(Duration::from_secs(60)))
        .await
        .unwrap_err();
    owner_b_lost(&e);
    Ok(())
}
