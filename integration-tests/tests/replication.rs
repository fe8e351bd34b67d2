//! Replicated queues on real processes (issue 24): a queue created with `--replicas 3` lives in
//! a queue shard on three nodes; its leader killed with SIGKILL, another replica serves every
//! confirmed message; the killed node comes back as a replica. Each node runs on its own
//! 127.x.y.N address (see `cluster.rs`).

#![allow(clippy::unwrap_used)]

use std::collections::HashSet;
use std::time::{Duration, Instant};

use ferry_client::{pb, AckMode, Message, ReceiveOptions};
use ferry_integration_tests::cluster::Cluster;
use ferry_integration_tests::stats;
use tonic::Code;

const LEADER_WAIT: Duration = Duration::from_secs(20);
const NODES: [&str; 3] = ["n1", "n2", "n3"];

async fn create(
    client: &ferry_client::Client,
    name: &str,
    replicas: u32,
) -> Result<pb::CreateQueueResponse, tonic::Status> {
    client
        .admin()
        .create_queue(pb::CreateQueueRequest {
            name: name.into(),
            replicas,
            ..Default::default()
        })
        .await
        .map(tonic::Response::into_inner)
}

/// Receives and acknowledges until `count` distinct messages arrived (or 60 s passed); fails
/// on a duplicate not flagged redelivered.
async fn receive_all(
    session: &ferry_client::Session,
    queue: &str,
    count: usize,
) -> anyhow::Result<Vec<String>> {
    let mut seen = HashSet::new();
    let mut bodies = vec![];
    let deadline = Instant::now() + Duration::from_secs(60);
    while seen.len() < count {
        anyhow::ensure!(
            Instant::now() < deadline,
            "received {} of {count}",
            seen.len()
        );
        let got = session
            .receive(queue, ReceiveOptions::timeout_ms(1_000).max(500))
            .await?;
        for m in &got {
            let fresh = seen.insert(m.message_id().to_string());
            anyhow::ensure!(
                fresh || m.redelivered(),
                "{} delivered twice without the redelivered flag",
                m.message_id()
            );
            if fresh {
                bodies.push(String::from_utf8_lossy(m.body()).into_owned());
            }
        }
        session.ack(&got).await?;
    }
    Ok(bodies)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replicated_queue_keeps_every_confirmed_message_when_its_leader_is_killed(
) -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let mut cluster = Cluster::start(dir.path(), &NODES)?;
    cluster.wait_leader(&NODES, LEADER_WAIT).await?;
    let first = cluster.node("n1").client().await?;
    let created = create(&first, "orders", 3).await?;
    assert!(created.created);

    // The node serving the queue is its shard's leader; send through another one.
    let leader = stats(&first, "orders").await?.owner_node;
    let survivor = NODES.iter().find(|n| **n != leader).unwrap();
    let client = cluster.node(survivor).client().await?;
    let conn = client.open_connection("t").await?;
    let session = conn.create_session(AckMode::Client).await?;
    const SENT: usize = 300;
    for start in (0..SENT).step_by(50) {
        let batch = (start..start + 50)
            .map(|i| Message::text(format!("m{i}")))
            .collect();
        session.send("orders", batch).await?;
    }

    // Every send above was confirmed: each is on a majority of the replicas' disks.
    cluster.node_mut(&leader).kill9();
    let killed_at = Instant::now();
    let after = Message::text("after the failover");
    session.send("orders", vec![after]).await?;
    eprintln!(
        "first confirmed send {:?} after the leader's kill",
        killed_at.elapsed()
    );
    let new_leader = stats(&client, "orders").await?.owner_node;
    assert_ne!(new_leader, leader, "another replica leads");

    let mut bodies = receive_all(&session, "orders", SENT + 1).await?;
    bodies.sort();
    let mut expected: Vec<String> = (0..SENT).map(|i| format!("m{i}")).collect();
    expected.push("after the failover".into());
    expected.sort();
    assert_eq!(bodies, expected);

    // The killed node comes back as a replica: calls through it reach the leader.
    cluster.node_mut(&leader).restart_in_place()?;
    let back = cluster.node(&leader).client().await?;
    let back_conn = back.open_connection("t").await?;
    let back_session = back_conn.create_session(AckMode::Client).await?;
    back_session
        .send("orders", vec![Message::text("through the old leader")])
        .await?;
    let got = receive_all(&back_session, "orders", 1).await?;
    assert_eq!(got, ["through the old leader"]);
    Ok(())
}

/// Deliveries made before a failover stay their consumer's: its acknowledgements land on the new
/// leader (the lease was written with each delivery, the receipt handles stay good), and no
/// acknowledged message comes back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_consumers_acks_of_deliveries_made_before_the_failover_land_on_the_new_leader(
) -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let mut cluster = Cluster::start(dir.path(), &NODES)?;
    cluster.wait_leader(&NODES, LEADER_WAIT).await?;
    let first = cluster.node("n1").client().await?;
    create(&first, "work", 3).await?;
    let leader = stats(&first, "work").await?.owner_node;
    let survivor = NODES.iter().find(|n| **n != leader).unwrap();
    let client = cluster.node(survivor).client().await?;
    let conn = client.open_connection("t").await?;
    let session = conn.create_session(AckMode::Client).await?;
    let batch = (0..20).map(|i| Message::text(format!("w{i:02}"))).collect();
    session.send("work", batch).await?;
    let held = session
        .receive("work", ReceiveOptions::timeout_ms(5_000).max(10))
        .await?;
    assert_eq!(held.len(), 10);

    cluster.node_mut(&leader).kill9();
    session.ack(&held).await?;
    assert_ne!(stats(&client, "work").await?.owner_node, leader);

    let rest = receive_all(&session, "work", 10).await?;
    let acked: HashSet<String> = held
        .iter()
        .map(|m| String::from_utf8_lossy(m.body()).into_owned())
        .collect();
    assert!(
        rest.iter().all(|b| !acked.contains(b)),
        "an acknowledged message came back: {rest:?}"
    );
    let mut all: Vec<String> = acked.into_iter().chain(rest).collect();
    all.sort();
    let expected: Vec<String> = (0..20).map(|i| format!("w{i:02}")).collect();
    assert_eq!(all, expected);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicated_queues_are_administered_like_others_and_bad_factors_refused(
) -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let cluster = Cluster::start(dir.path(), &NODES)?;
    cluster.wait_leader(&NODES, LEADER_WAIT).await?;
    let client = cluster.node("n2").client().await?;

    let two = create(&client, "two", 2).await.unwrap_err();
    assert_eq!(two.code(), Code::InvalidArgument, "{two}");
    assert!(two.message().contains("1, 3 or 5"), "{two}");

    let five = create(&client, "five", 5).await.unwrap_err();
    assert_ne!(five.code(), Code::Ok);
    assert!(five.message().contains('5'), "{five}");

    let pinned = client
        .admin()
        .create_queue(pb::CreateQueueRequest {
            name: "pinned".into(),
            replicas: 3,
            node: "n1".into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(pinned.code(), Code::InvalidArgument, "{pinned}");

    // Nothing was made of the refused creates.
    for name in ["two", "five", "pinned"] {
        let e = stats(&client, name).await.unwrap_err();
        assert!(
            e.to_string().contains("not found") || e.to_string().contains("NotFound"),
            "{e}"
        );
    }

    // Changed, deleted and created again through a node that need not lead its shard: each
    // answered once the shard's leader carried it out.
    create(&client, "orders", 3).await?;
    let conn = client.open_connection("t").await?;
    let session = conn.create_session(AckMode::Client).await?;
    session.send("orders", vec![Message::text("old")]).await?;
    let limited = pb::QueueConfig {
        max_messages: Some(10),
        ..Default::default()
    };
    let updated = client
        .admin()
        .update_queue(pb::UpdateQueueRequest {
            name: "orders".into(),
            config: Some(limited),
            ..Default::default()
        })
        .await?
        .into_inner();
    let config = updated.queue.unwrap().config.unwrap();
    assert_eq!(config.max_messages, Some(10));
    client
        .admin()
        .delete_queue(pb::DeleteQueueRequest {
            name: "orders".into(),
            ..Default::default()
        })
        .await?;
    create(&client, "orders", 3).await?;
    assert_eq!(
        stats(&client, "orders").await?.ready,
        0,
        "created again empty"
    );
    Ok(())
}
