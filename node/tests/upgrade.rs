//! Whole nodes, run in this process on port 0, started on data directories that earlier
//! releases wrote: the release before one database per node (two databases), and the
//! single-node release before cluster metadata (no Raft state at all).

use std::future::Future;
use std::path::Path;
use std::time::Duration;

use anyhow::Context as _;
use ferry_client::{pb, AckMode, Client, Message, ReceiveOptions};
use ferry_node::config::Config;
use ferry_node::data_dir::{DATABASE_DIR, OLD_RAFT_DIR};
use ferry_node::raft::IMPORT_MARKER;
use ferry_node::run::{run, Addresses, Listeners};
use tokio::net::TcpListener;
use tokio::sync::oneshot;

/// Runs a node on `data_dir` while `body` runs with its client URL, then stops it gracefully.
async fn with_node<F, Fut>(data_dir: &Path, body: F) -> anyhow::Result<()>
where
    F: FnOnce(String) -> Fut,
    Fut: Future<Output = anyhow::Result<()>>,
{
    let mut config = Config {
        node_id: "n1".into(),
        data_dir: data_dir.to_path_buf(),
        shutdown_grace_ms: 2_000,
        ..Config::default()
    };
    config.metrics.enabled = false;
    let listeners = Listeners {
        client: TcpListener::bind("127.0.0.1:0").await?,
        peer: TcpListener::bind("127.0.0.1:0").await?,
    };
    let (addr_tx, addr_rx) = oneshot::channel();
    let (stop_tx, stop_rx) = oneshot::channel::<()>();
    let node = run(
        config,
        Vec::new(),
        listeners,
        async {
            let _ = stop_rx.await;
        },
        move |a: &Addresses| {
            let _ = addr_tx.send(a.client);
        },
    );
    let test = async move {
        let result = match addr_rx.await {
            Ok(addr) => body(format!("http://{addr}")).await,
            Err(_) => Err(anyhow::anyhow!("the node stopped before it served")),
        };
        let _ = stop_tx.send(());
        result
    };
    let (ran, tested) = tokio::join!(node, test);
    ran.context("the node failed")?;
    tested
}

async fn cluster_status(client: &Client) -> anyhow::Result<pb::ClusterStatus> {
    Ok(client
        .cluster()
        .get_cluster_status(pb::GetClusterStatusRequest {})
        .await?
        .into_inner())
}

async fn ready(client: &Client, queue: &str) -> anyhow::Result<u64> {
    let stats = client
        .admin()
        .get_queue_stats(pb::GetQueueStatsRequest { name: queue.into() })
        .await?
        .into_inner();
    Ok(stats.queues.first().context("no stats")?.ready)
}

async fn create_orders_with(client: &Client, messages: usize) -> anyhow::Result<()> {
    client
        .admin()
        .create_queue(pb::CreateQueueRequest {
            replicas: 0,
            own_shard: false,
            name: "orders".into(),
            config: Some(pb::QueueConfig {
                max_messages: Some(500),
                ..Default::default()
            }),
            if_not_exists: false,
            node: String::new(),
        })
        .await?;
    let conn = client.open_connection("p").await?;
    let session = conn.create_session(AckMode::Auto).await?;
    let batch = (0..messages)
        .map(|i| Message::text(format!("m{i}")))
        .collect();
    session.send("orders", batch).await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_data_directory_with_two_databases_keeps_its_cluster_and_messages() -> anyhow::Result<()>
{
    let dir = tempfile::tempdir()?;
    let mut cluster_id = String::new();
    let found = &mut cluster_id;
    with_node(dir.path(), |url| async move {
        let client = Client::connect(&url).await?;
        create_orders_with(&client, 10).await?;
        *found = cluster_status(&client).await?.cluster_id;
        Ok(())
    })
    .await?;
    assert!(!cluster_id.is_empty());
    let old = dir.path().join(OLD_RAFT_DIR);
    ferry_store::split_raft_database_out(&dir.path().join(DATABASE_DIR), &old)?;
    assert!(old.join("CURRENT").exists(), "the old layout is made");

    let expected = &cluster_id;
    with_node(dir.path(), |url| async move {
        let client = Client::connect(&url).await?;
        let status = cluster_status(&client).await?;
        assert_eq!(&status.cluster_id, expected, "the same cluster");
        assert_eq!(ready(&client, "orders").await?, 10, "messages kept");
        Ok(())
    })
    .await?;
    assert!(!old.exists(), "the old database is gone");
    Ok(())
}

/// The upgrade path from the single-node release: a data directory with queues and no cluster
/// state becomes a one-node cluster holding its queues, with their settings and messages.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_single_node_data_directory_becomes_a_one_node_cluster_with_its_queues(
) -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    with_node(dir.path(), |url| async move {
        let client = Client::connect(&url).await?;
        create_orders_with(&client, 300).await
    })
    .await?;
    // What the single-node release left: the queues, no Raft state anywhere.
    let old = dir.path().join(OLD_RAFT_DIR);
    ferry_store::split_raft_database_out(&dir.path().join(DATABASE_DIR), &old)?;
    std::fs::remove_dir_all(&old)?;

    with_node(dir.path(), |url| async move {
        let client = Client::connect(&url).await?;
        assert!(!cluster_status(&client).await?.cluster_id.is_empty());
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        loop {
            let st = cluster_status(&client).await?;
            if st
                .nodes
                .first()
                .is_some_and(|n| n.queues == ["orders", "orders.DLQ"])
            {
                break;
            }
            anyhow::ensure!(
                tokio::time::Instant::now() < deadline,
                "queues not imported: {:?}",
                st.nodes
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let info = client
            .admin()
            .get_queue(pb::GetQueueRequest {
                name: "orders".into(),
            })
            .await?
            .into_inner()
            .queue
            .context("no queue")?;
        assert_eq!(
            info.config.and_then(|c| c.max_messages),
            Some(500),
            "settings kept"
        );
        assert_eq!(ready(&client, "orders").await?, 300, "messages kept");
        Ok(())
    })
    .await?;
    // The import marker is removed once every queue is defined (after the wait above).
    assert!(!dir.path().join(IMPORT_MARKER).exists());

    // Restarted again: nothing is imported twice or lost; new queues work.
    with_node(dir.path(), |url| async move {
        let client = Client::connect(&url).await?;
        assert_eq!(ready(&client, "orders").await?, 300);
        client
            .admin()
            .create_queue(pb::CreateQueueRequest {
                name: "fresh".into(),
                ..Default::default()
            })
            .await?;
        let conn = client.open_connection("c").await?;
        let session = conn.create_session(AckMode::Client).await?;
        let mut seen = std::collections::HashSet::new();
        for _ in 0..10 {
            let got = session
                .receive("orders", ReceiveOptions::timeout_ms(1_000).max(100))
                .await?;
            for m in &got {
                anyhow::ensure!(seen.insert(m.message_id().to_string()), "delivered twice");
            }
            session.ack(&got).await?;
            if seen.len() == 300 {
                return Ok(());
            }
        }
        anyhow::bail!("received {} of 300", seen.len())
    })
    .await
}
