//! Shard leaders on real processes (issue 24, "Operators"): with several RF 3 shards, the
//! leader balancer hands every shard to its preferred leader (its first replica), so the
//! leaders spread over the nodes whoever won the elections; `ferry shard transfer-leader`
//! moves one, answers once the node named leads it, tells watchers (`shard-leader`) and shows in
//! `/metrics`; bad requests are refused with the codes `Cluster.TransferShardLeader` documents.
//! Each node runs on its own 127.x.y.N address (see `cluster.rs`).

#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::time::Duration;

use ferry_client::pb;
use ferry_integration_tests::cluster::{expect_error, wait_health, Cluster};
use ferry_integration_tests::{ferry_cli, http_get, wait_until};
use futures::StreamExt as _;
use serde_json::Value;
use tonic::Code;

const NODES: [&str; 3] = ["n1", "n2", "n3"];
/// Elections, then the balancer's settling (3 s) and one transfer a second per node.
const BALANCED_WAIT: Duration = Duration::from_secs(40);
const SHARDS: usize = 6;

/// The shards as `node` lists them.
async fn shards(cluster: &Cluster, node: &str) -> anyhow::Result<Vec<pb::ShardStatus>> {
    let client = cluster.node(node).client().await?;
    let listed = client
        .cluster()
        .list_shards(pb::ListShardsRequest { shard: 0 })
        .await?
        .into_inner();
    Ok(listed.shards)
}

/// Waits until every shard `node` lists is led by `leader_of(shard)`; the last listing.
async fn wait_leaders(
    cluster: &Cluster,
    node: &str,
    leader_of: impl Fn(&pb::ShardStatus) -> String,
) -> anyhow::Result<Vec<pb::ShardStatus>> {
    let last = std::sync::Mutex::new(vec![]);
    let done = wait_until(BALANCED_WAIT, "every shard led as expected", || async {
        let listed = shards(cluster, node).await?;
        let done = listed.len() == SHARDS && listed.iter().all(|s| s.leader == leader_of(s));
        *last.lock().unwrap() = listed;
        Ok(done)
    })
    .await;
    let listed = last.into_inner().unwrap();
    done.map_err(|e| e.context(format!("last listing: {listed:?}")))?;
    Ok(listed)
}

/// `ferry cluster status -o json` through `node`: node id → (replicated, led, preferred).
fn shard_counts(cluster: &Cluster, node: &str) -> anyhow::Result<BTreeMap<String, [u64; 3]>> {
    let (ok, out, err) = ferry_cli(cluster.node(node), &["cluster", "status", "-o", "json"])?;
    anyhow::ensure!(ok, "ferry cluster status failed: {err}");
    let status: Value = serde_json::from_str(out.trim())?;
    let nodes = status["nodes"].as_array().cloned().unwrap_or_default();
    Ok(nodes
        .iter()
        .map(|n| {
            let count = |f: &str| n[f].as_u64().unwrap_or(u64::MAX);
            let id = n["node_id"].as_str().unwrap_or_default().to_owned();
            let counts = [
                count("shards_replicated"),
                count("shards_led"),
                count("shards_preferred"),
            ];
            (id, counts)
        })
        .collect())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leaders_spread_over_the_nodes_and_transfer_leader_moves_one() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let mut cluster = Cluster::start(dir.path(), &NODES)?;
    cluster.wait_leader(&NODES, Duration::from_secs(20)).await?;
    let mut metrics = BTreeMap::new();
    for node in &mut cluster.nodes {
        metrics.insert(node.id().to_owned(), node.metrics_url()?);
    }
    let client = cluster.node("n1").client().await?;
    for i in 0..SHARDS {
        let request = pb::CreateQueueRequest {
            name: format!("q{i}"),
            replicas: 3,
            own_shard: true,
            ..Default::default()
        };
        client.admin().create_queue(request).await?;
    }

    // Every shard ends up led by its preferred leader: two per node.
    let listed = wait_leaders(&cluster, "n2", |s| s.replicas[0].clone()).await?;
    let mut led: BTreeMap<&str, usize> = BTreeMap::new();
    for s in &listed {
        *led.entry(s.leader.as_str()).or_default() += 1;
    }
    assert_eq!(led, BTreeMap::from([("n1", 2), ("n2", 2), ("n3", 2)]));
    let counts = shard_counts(&cluster, "n3")?;
    for node in NODES {
        assert_eq!(counts[node], [6, 2, 2], "{node} in {counts:?}");
    }

    let shard = listed[0].clone();
    let to = transfer_moves_one(&cluster, &client, &metrics, &shard).await?;
    bad_requests_are_refused(&mut cluster, shard.shard, &to).await
}

/// A burst of creates on a new cluster (an application creating its queues at start, eight at
/// a time) makes one shared shard per node, each preferring another node as leader, and the
/// rest join them: chosen side by side, the first creates each made a shard of their own, all
/// preferring n1, which then led every queue.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_of_creates_makes_one_shard_per_node_each_led_by_another() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let cluster = Cluster::start(dir.path(), &NODES)?;
    cluster.wait_leader(&NODES, Duration::from_secs(20)).await?;
    let client = cluster.node("n1").client().await?;
    let creates = (0..24).map(|i| {
        let mut admin = client.admin();
        async move {
            let request = pb::CreateQueueRequest {
                name: format!("burst{i}"),
                replicas: 3,
                ..Default::default()
            };
            admin.create_queue(request).await
        }
    });
    let created = futures::stream::iter(creates)
        .buffer_unordered(8)
        .collect::<Vec<_>>()
        .await;
    for c in created {
        c?;
    }
    let listed = shards(&cluster, "n2").await?;
    let preferred: std::collections::BTreeSet<&str> =
        listed.iter().map(|s| s.replicas[0].as_str()).collect();
    assert_eq!(listed.len(), 3, "one shard per node: {listed:?}");
    assert_eq!(
        preferred.len(),
        3,
        "each preferring another node: {listed:?}"
    );
    Ok(())
}

/// `shard` moved from its leader to its second replica through the third node: answered once
/// moved, told to watchers through n1, shown in metrics; asked again, answered at once. The
/// node it went to.
async fn transfer_moves_one(
    cluster: &Cluster,
    client: &ferry_client::Client,
    metrics: &BTreeMap<String, String>,
    shard: &pb::ShardStatus,
) -> anyhow::Result<String> {
    let from = shard.leader.clone();
    let to = shard.replicas[1].clone();
    let via = NODES.iter().find(|n| **n != from && **n != to).unwrap();
    let mut events = client
        .admin()
        .watch_events(pb::WatchEventsRequest::default())
        .await?
        .into_inner();
    let args = ["shard", "transfer-leader", &shard.shard.to_string(), &to];
    let (ok, out, err) = ferry_cli(cluster.node(via), &args)?;
    assert!(ok, "{err}");
    assert!(
        out.contains(&format!("shard {} is led by {to}", shard.shard)),
        "{out}"
    );
    let told = tokio::time::timeout(Duration::from_secs(10), async {
        while let Some(e) = events.next().await {
            let e = e?;
            if e.kind == "shard-leader" && e.shard == shard.shard {
                return anyhow::Ok(e);
            }
        }
        anyhow::bail!("the event stream ended")
    })
    .await??;
    assert_eq!(told.node, to, "{told:?}");
    assert!(told.value > shard.term, "{told:?} after {shard:?}");
    assert!(told.detail.contains(&format!("(was {from})")), "{told:?}");
    let now = shards(cluster, &to).await?;
    let moved = now.iter().find(|s| s.shard == shard.shard).unwrap();
    assert_eq!(moved.leader, to, "{moved:?}");

    // Its metrics say so on the new leader, and the old one's say it follows.
    let sample = |node: &str| -> anyhow::Result<String> { Ok(http_get(&metrics[node])?.1) };
    let line = |v: u8| format!("ferry_shard_leader{{shard=\"{}\"}} {v}", shard.shard);
    assert!(sample(&to)?.lines().any(|l| l == line(1)), "on {to}");
    assert!(sample(&from)?.lines().any(|l| l == line(0)), "on {from}");

    // Asked to the node that leads it already: answered at once.
    let again = client
        .cluster()
        .transfer_shard_leader(pb::TransferShardLeaderRequest {
            shard: shard.shard,
            node_id: to.clone(),
        })
        .await?
        .into_inner();
    assert_eq!(again.leader, to);
    Ok(to)
}

/// Every bad request refused with its documented code; `leader` leads `shard`.
async fn bad_requests_are_refused(
    cluster: &mut Cluster,
    shard: u64,
    leader: &str,
) -> anyhow::Result<()> {
    let client = cluster.node(leader).client().await?;
    let transfer = |shard: u64, node: &str| {
        let mut c = client.cluster();
        let request = pb::TransferShardLeaderRequest {
            shard,
            node_id: node.into(),
        };
        async move { c.transfer_shard_leader(request).await }
    };
    expect_error(transfer(0, "n1").await, Code::InvalidArgument, "shard")?;
    expect_error(transfer(999, "n1").await, Code::NotFound, "999")?;
    expect_error(
        transfer(shard, "n9").await,
        Code::InvalidArgument,
        "not a replica",
    )?;
    expect_error(
        transfer(shard, "N 1!").await,
        Code::InvalidArgument,
        "node_id",
    )?;
    let (ok, _, err) = ferry_cli(
        cluster.node(leader),
        &["shard", "transfer-leader", "999", "n1"],
    )?;
    assert!(!ok);
    assert!(err.contains("shard 999 does not exist"), "{err}");

    // A replica that is down cannot take the lead.
    let down = NODES.iter().find(|n| **n != leader).unwrap();
    cluster.node_mut(down).kill9();
    wait_health(
        cluster.node(leader),
        &[down],
        "down",
        Duration::from_secs(20),
    )
    .await?;
    expect_error(
        transfer(shard, down).await,
        Code::Unavailable,
        "not reachable",
    )?;
    Ok(())
}
