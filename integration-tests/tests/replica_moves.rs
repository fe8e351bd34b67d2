//! A node's disk is lost (issue 24, operators): its shard replicas are moved to another node
//! with `ferry shard move-replica`, the shard's leader fills the new replica with a snapshot,
//! promotes it and removes the lost one, `ferry shard list` shows the shard fully replicated
//! again, and the new replica holds every confirmed message: handed the lead, it serves each
//! one not acknowledged, once, from its own data.

#![allow(clippy::unwrap_used)]

use std::collections::BTreeSet;
use std::time::Duration;

use ferry_client::{pb, AckMode, Message, ReceiveOptions};
use ferry_integration_tests::cluster::{create_queue_on, create_replicated, Cluster};
use ferry_integration_tests::{drain_once, ferry_cli, stats, wait_until, wipe_data};
use futures::StreamExt as _;

const WAIT: Duration = Duration::from_secs(30);
const NODES: [&str; 3] = ["n1", "n2", "n3"];
/// Sent before the disk is lost, and while the node is down.
const SENT_BEFORE: usize = 300;
const SENT_WHILE_DOWN: usize = 200;
/// Acknowledged of the first ones.
const ACKED: usize = 100;

async fn shard_status(
    client: &ferry_client::Client,
    shard: u64,
) -> anyhow::Result<pb::ShardStatus> {
    let listed = client
        .cluster()
        .list_shards(pb::ListShardsRequest { shard })
        .await?
        .into_inner()
        .shards;
    listed
        .into_iter()
        .next()
        .ok_or_else(|| anyhow::anyhow!("shard {shard} not listed"))
}

/// Three nodes with `orders` replicated on all of them (its shard returned), and a fourth node,
/// holding nothing (where a replica moves to).
async fn orders_and_a_spare(
    dir: &std::path::Path,
) -> anyhow::Result<(Cluster, ferry_client::Client, u64)> {
    let mut cluster = Cluster::start(dir, &NODES)?;
    cluster.wait_leader(&NODES, WAIT).await?;
    let client = cluster.node("n1").client().await?;
    let shard = create_replicated(&client, "orders").await?;
    add_spare_n4(&mut cluster).await?;
    Ok((cluster, client, shard))
}

/// A fourth node, holding nothing, added as a learner: where a replica moves to.
async fn add_spare_n4(cluster: &mut Cluster) -> anyhow::Result<()> {
    let n4 = cluster.start_joining("n4", 0)?;
    let address = cluster.peer_addr(n4);
    let add = ["node", "add", "n4", "--address", &address, "--learner"];
    let (ok, out, err) = ferry_cli(cluster.node("n1"), &add)?;
    anyhow::ensure!(ok, "node add: {out}{err}");
    cluster.wait_leader(&["n1", "n2", "n3", "n4"], WAIT).await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_replica_is_moved_to_another_node_and_the_shard_is_whole_again() -> anyhow::Result<()>
{
    let dir = tempfile::tempdir()?;
    let (mut cluster, client, shard) = orders_and_a_spare(dir.path()).await?;
    let replicas = shard_status(&client, shard).await?.replicas;
    // The node whose disk is lost: a replica, not the node the client talks through.
    let lost = replicas.iter().find(|r| *r != "n1").unwrap().clone();
    let spare: Vec<&str> = ["n1", "n2", "n3", "n4"]
        .into_iter()
        .filter(|n| !replicas.iter().any(|r| r == n))
        .collect();
    anyhow::ensure!(spare.len() == 1, "3 replicas of 4 nodes: {replicas:?}");
    let spare = spare[0].to_owned();

    let conn = client.open_connection("t").await?;
    let session = conn.create_session(AckMode::Client).await?;
    for i in 0..SENT_BEFORE {
        session
            .send("orders", vec![Message::text(format!("m{i}"))])
            .await?;
    }
    let mut acked = BTreeSet::new();
    while acked.len() < ACKED {
        let got = session
            .receive("orders", ReceiveOptions::timeout_ms(1_000).max(50))
            .await?;
        let take = got.len().min(ACKED - acked.len());
        session.ack(&got[..take]).await?;
        session.recover().await?;
        acked.extend(
            got[..take]
                .iter()
                .map(|m| String::from_utf8_lossy(m.body()).into_owned()),
        );
    }

    let mut events = client
        .admin()
        .watch_events(pb::WatchEventsRequest::default())
        .await?
        .into_inner();
    // The disk is lost: the node dies and its data is gone.
    cluster.node_mut(&lost).kill9();
    wipe_data(cluster.node(&lost))?;
    for i in SENT_BEFORE..SENT_BEFORE + SENT_WHILE_DOWN {
        session
            .send("orders", vec![Message::text(format!("m{i}"))])
            .await?;
    }

    // Removing the node is refused while it holds replicas, saying what to do.
    let (ok, out, err) = ferry_cli(cluster.node("n1"), &["node", "remove", &lost])?;
    anyhow::ensure!(!ok, "a node holding replicas was removed: {out}");
    anyhow::ensure!(
        err.contains("move-replica") || err.contains("voter"),
        "the refusal says what to do: {err}"
    );

    let (ok, out, err) = ferry_cli(
        cluster.node("n1"),
        &["shard", "move-replica", "--from", &lost],
    )?;
    anyhow::ensure!(ok, "move-replica failed: {out}{err}");
    anyhow::ensure!(
        out.contains(&format!("to {spare}")),
        "the replica goes to the only node without one: {out}"
    );

    // The shard's group follows: the new replica catches up and votes, the lost one leaves.
    let waited = wait_until(WAIT, "the shard is fully replicated again", || {
        let client = client.clone();
        async move {
            let s = shard_status(&client, shard).await?;
            Ok(!s.leader.is_empty()
                && s.catching_up.is_empty()
                && s.leaving.is_empty()
                && s.lag.is_some_and(|l| l < 5))
        }
    })
    .await;
    let s = shard_status(&client, shard).await?;
    if waited.is_err() {
        for node in s.replicas.iter().chain([&lost]) {
            let log = cluster.node(node).log();
            let tail: Vec<&str> = log.lines().rev().take(40).collect();
            eprintln!("--- {node}, last lines:");
            tail.iter().rev().for_each(|l| eprintln!("{l}"));
        }
        anyhow::bail!("{s:?}");
    }
    anyhow::ensure!(!s.replicas.contains(&lost), "{s:?}");
    anyhow::ensure!(s.replicas.contains(&spare), "{s:?}");

    // Watchers were told: the shard short of copies, then whole again.
    let mut under = vec![];
    let whole = tokio::time::timeout(WAIT, async {
        while let Some(e) = events.next().await {
            let e = e?;
            match e.kind.as_str() {
                "shard-under-replicated" if e.shard == shard => under.push(e.detail),
                "shard-replicated" if e.shard == shard => return anyhow::Ok(e),
                _ => {}
            }
        }
        anyhow::bail!("the event stream ended")
    })
    .await??;
    anyhow::ensure!(
        !under.is_empty(),
        "no shard-under-replicated event before {whole:?}"
    );
    anyhow::ensure!(
        under.iter().any(|d| d.contains(&lost)),
        "the events name the lost node: {under:?}"
    );
    anyhow::ensure!(whole.value == 3, "{whole:?}");

    // The new replica votes (it is not catching up) and holds the shard's data: handed the
    // lead, it serves every message not acknowledged, once, from its own store.
    let args = ["shard", "transfer-leader", &shard.to_string(), &spare];
    let moved = wait_until(WAIT, "the new replica takes the lead", || {
        let (ok, _, _) = ferry_cli(cluster.node("n1"), &args).unwrap_or_default();
        async move { Ok(ok) }
    })
    .await;
    moved?;
    anyhow::ensure!(stats(&client, "orders").await?.owner_node == spare);

    let left = drain_once(&session, "orders", &acked).await?;
    let expected: BTreeSet<String> = (0..SENT_BEFORE + SENT_WHILE_DOWN)
        .map(|i| format!("m{i}"))
        .filter(|b| !acked.contains(b))
        .collect();
    assert_eq!(left.len(), expected.len());
    assert_eq!(left, expected);
    Ok(())
}

/// Every node as the cluster reports it.
async fn nodes(client: &ferry_client::Client) -> anyhow::Result<Vec<pb::NodeStatus>> {
    Ok(client
        .cluster()
        .get_cluster_status(pb::GetClusterStatusRequest::default())
        .await?
        .into_inner()
        .nodes)
}

/// The data directory each node runs on, as the cluster recorded it (0: not yet), by node.
async fn incarnations(
    client: &ferry_client::Client,
) -> anyhow::Result<std::collections::BTreeMap<String, u64>> {
    let nodes = nodes(client).await?;
    Ok(nodes
        .into_iter()
        .map(|n| (n.node_id, n.incarnation))
        .collect())
}

/// Issue 24: a node whose disk was lost, started again on an empty data directory with its old
/// configuration, would take part under its old Raft identity with none of the log it had
/// acknowledged, and its vote could elect a leader missing confirmed entries. The cluster
/// records the data directory each node runs on; the others refuse the newcomer, which stops
/// with an error saying what happened and what to do, and the cluster goes on without it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_back_on_an_empty_disk_under_its_old_identity_is_refused_and_stops(
) -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let mut cluster = Cluster::start(dir.path(), &NODES)?;
    cluster.wait_leader(&NODES, WAIT).await?;
    let client = cluster.node("n1").client().await?;
    let recorded = || async {
        let all = incarnations(&client).await?;
        Ok(all.len() == NODES.len() && all.values().all(|i| *i != 0))
    };
    wait_until(WAIT, "every node's data directory recorded", recorded).await?;
    let before = incarnations(&client).await?;

    // n3 restarted on its own data directory is the same node: taken as before (it serves a
    // queue created after, which it learns from the others over the links it opened).
    cluster.node_mut("n3").restart_in_place()?;
    create_queue_on(&client, "on-n3", Some("n3")).await?;
    assert_eq!(stats(&client, "on-n3").await?.owner_node, "n3");
    assert!(cluster.node_mut("n3").exited().is_none(), "n3 runs on");

    // Its disk lost: started again, same id, same configuration, an empty directory.
    cluster.node_mut("n3").kill9();
    wipe_data(cluster.node("n3"))?;
    cluster.node_mut("n3").restart_in_place()?;
    let deadline = std::time::Instant::now() + WAIT;
    let status = loop {
        if let Some(status) = cluster.node_mut("n3").exited() {
            break status;
        }
        anyhow::ensure!(
            std::time::Instant::now() < deadline,
            "n3 did not stop by itself within {WAIT:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(!status.success(), "{status:?}");
    let log = cluster.node("n3").log();
    for said in [
        "a peer refused this node",
        "its disk was lost or replaced",
        "ferry shard move-replica --from n3",
    ] {
        assert!(log.contains(said), "n3's log says {said:?}:\n{log}");
    }
    assert!(
        cluster
            .node("n1")
            .log()
            .contains("refused a peer's Raft batches")
            || cluster
                .node("n2")
                .log()
                .contains("refused a peer's Raft batches"),
        "a peer logged the refusal"
    );
    // The record stands, and the others go on: a queue is created and used.
    assert_eq!(incarnations(&client).await?, before);
    let conn = client.open_connection("t").await?;
    client
        .admin()
        .create_queue(pb::CreateQueueRequest {
            name: "after".into(),
            ..Default::default()
        })
        .await?;
    let session = conn.create_session(AckMode::Auto).await?;
    session
        .send("after", vec![Message::text("still here")])
        .await?;
    assert_eq!(stats(&client, "after").await?.ready, 1);
    Ok(())
}

/// The status of node `id` as the cluster reports it.
async fn node_status(client: &ferry_client::Client, id: &str) -> anyhow::Result<pb::NodeStatus> {
    nodes(client)
        .await?
        .into_iter()
        .find(|n| n.node_id == id)
        .ok_or_else(|| anyhow::anyhow!("{id} not in the cluster status"))
}

/// Issue 24, operators: a machine whose disk was lost comes back empty under its old name.
/// Removed, its id may be added again: only on an empty data directory (added while it still
/// runs on its old one is refused, saying so), with a new raft id and its new data directory
/// recorded; it then serves like any node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_removed_node_comes_back_empty_under_its_old_name() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let mut cluster = Cluster::start(dir.path(), &NODES)?;
    cluster.wait_leader(&NODES, WAIT).await?;
    let client = cluster.node("n1").client().await?;
    let n4 = cluster.start_joining("n4", 0)?;
    let address = cluster.peer_addr(n4);
    let add = ["node", "add", "n4", "--address", &address, "--learner"];
    let (ok, out, err) = ferry_cli(cluster.node("n1"), &add)?;
    anyhow::ensure!(ok, "node add: {out}{err}");
    let recorded = || async { Ok(node_status(&client, "n4").await?.incarnation != 0) };
    wait_until(WAIT, "n4's data directory recorded", recorded).await?;
    let before = node_status(&client, "n4").await?;

    let (ok, out, err) = ferry_cli(cluster.node("n1"), &["node", "remove", "n4"])?;
    anyhow::ensure!(ok, "node remove: {out}{err}");
    // Still on its old data directory: refused, saying what to do.
    let (ok, out, err) = ferry_cli(cluster.node("n1"), &add)?;
    assert!(!ok, "{out}");
    assert!(
        err.contains("still runs on its data directory") && err.contains("empty"),
        "{err}"
    );

    // Its disk lost: started again empty, with its old configuration (--join), it waits to be
    // added, and is.
    cluster.node_mut("n4").kill9();
    wipe_data(cluster.node("n4"))?;
    cluster.node_mut("n4").restart_in_place()?;
    let (ok, out, err) = ferry_cli(cluster.node("n1"), &add)?;
    anyhow::ensure!(ok, "node add again: {out}{err}");
    let after = node_status(&client, "n4").await?;
    assert!(after.raft_id > before.raft_id, "{after:?} after {before:?}");
    let recorded_again = || async {
        let now = node_status(&client, "n4").await?.incarnation;
        Ok(now != 0 && now != before.incarnation)
    };
    wait_until(WAIT, "n4's new data directory recorded", recorded_again).await?;
    create_queue_on(&client, "on-n4", Some("n4")).await?;
    let conn = client.open_connection("t").await?;
    let session = conn.create_session(AckMode::Auto).await?;
    session
        .send("on-n4", vec![Message::text("served by n4")])
        .await?;
    let got = session
        .receive("on-n4", ReceiveOptions::timeout_ms(10_000))
        .await?;
    assert_eq!(got.len(), 1);
    assert!(cluster.node_mut("n4").exited().is_none(), "n4 runs on");
    Ok(())
}

/// Issue 24, operators: draining a node that works. The replica of a shard it leads is moved to
/// a fourth node while a producer sends: the leader hands its leadership to a replica that
/// stays (no election, the producer sees no error) and keeps voting until the new replica votes,
/// then leaves the group; every message sent is there once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_working_leaders_replica_moves_off_while_a_producer_sends() -> anyhow::Result<()> {
    const BEFORE: usize = 100;
    const DURING: usize = 300;
    let dir = tempfile::tempdir()?;
    let (cluster, client, shard) = orders_and_a_spare(dir.path()).await?;
    wait_until(WAIT, "the shard has a leader", || {
        let client = client.clone();
        async move { Ok(!shard_status(&client, shard).await?.leader.is_empty()) }
    })
    .await?;
    let from = shard_status(&client, shard).await?.leader;

    let conn = client.open_connection("t").await?;
    let session = conn.create_session(AckMode::Client).await?;
    for i in 0..BEFORE {
        session
            .send("orders", vec![Message::text(format!("m{i}"))])
            .await?;
    }
    let producer = conn.create_session(AckMode::Auto).await?;
    let sending = tokio::spawn(async move {
        for i in BEFORE..BEFORE + DURING {
            producer
                .send("orders", vec![Message::text(format!("m{i}"))])
                .await?;
        }
        anyhow::Ok(())
    });
    let (ok, out, err) = ferry_cli(
        cluster.node("n1"),
        &[
            "shard",
            "move-replica",
            &shard.to_string(),
            "--from",
            &from,
            "--to",
            "n4",
        ],
    )?;
    anyhow::ensure!(ok, "move-replica failed: {out}{err}");
    sending.await??;

    wait_until(WAIT, "the shard is whole on its new replicas", || {
        let client = client.clone();
        async move {
            let s = shard_status(&client, shard).await?;
            Ok(!s.leader.is_empty()
                && s.catching_up.is_empty()
                && s.leaving.is_empty()
                && s.replicas.iter().any(|r| r == "n4"))
        }
    })
    .await?;
    let s = shard_status(&client, shard).await?;
    anyhow::ensure!(!s.replicas.contains(&from) && s.leader != from, "{s:?}");
    assert!(
        cluster
            .node(&from)
            .log()
            .contains("handing its leadership over first"),
        "{from} handed its leadership over"
    );

    let left = drain_once(&session, "orders", &BTreeSet::new()).await?;
    let expected: BTreeSet<String> = (0..BEFORE + DURING).map(|i| format!("m{i}")).collect();
    assert_eq!(left, expected);
    Ok(())
}
