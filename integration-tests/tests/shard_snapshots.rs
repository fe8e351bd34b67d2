//! Shard snapshots on real processes (issue 24 §3): a queue shard's log is compacted as it
//! grows, so a replica that was down meanwhile cannot catch up from the log; it is sent the
//! shard's data instead, installs it, and holds exactly what the others hold: handed the
//! shard's leadership, it serves every message that was not acknowledged, once.

#![allow(clippy::unwrap_used)]

use std::collections::BTreeSet;
use std::time::Duration;

use ferry_client::{AckMode, Message, ReceiveOptions};
use ferry_integration_tests::cluster::{create_replicated, Cluster};
use ferry_integration_tests::{drain_once, ferry_cli, http_get, stats, wait_until, Node};

const LEADER_WAIT: Duration = Duration::from_secs(20);
const NODES: [&str; 3] = ["n1", "n2", "n3"];
/// Sends made while a replica is down, one log entry each: past the 1 000 applied entries
/// after which a shard's log is compacted.
const SENT: usize = 1_300;
/// Of those, acknowledged before it comes back.
const ACKED: usize = 200;

/// The value of the sample `name` (with its labels) in `node`'s metrics; `None` when absent.
fn metric(node: &mut Node, sample: &str) -> anyhow::Result<Option<f64>> {
    let (_, text) = http_get(&node.metrics_url()?)?;
    Ok(text.lines().find_map(|l| {
        let (name, value) = l.rsplit_once(' ')?;
        (name == sample).then(|| value.parse().ok())?
    }))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_behind_a_compacted_log_is_rebuilt_from_a_snapshot_and_serves_every_message(
) -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let mut cluster = Cluster::start(dir.path(), &NODES)?;
    cluster.wait_leader(&NODES, LEADER_WAIT).await?;
    let client = cluster.node("n1").client().await?;
    let shard = create_replicated(&client, "orders").await?;
    let leader = stats(&client, "orders").await?.owner_node;
    // A replica other than the leader and the node the client talks through.
    let away = *NODES.iter().find(|n| **n != leader && **n != "n1").unwrap();
    cluster.node_mut(away).kill9();

    let conn = client.open_connection("t").await?;
    let session = conn.create_session(AckMode::Client).await?;
    for i in 0..SENT {
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
    let label = format!("{{shard=\"{shard}\"}}");
    let entries = metric(
        cluster.node_mut(&leader),
        &format!("ferry_shard_log_entries{label}"),
    )?;
    assert!(
        entries.is_some_and(|e| e < SENT as f64),
        "the leader compacted the shard's log: {entries:?} entries after {SENT} sends"
    );
    // Each send was a replicated write, timed from its proposal to its confirmation.
    let timed = metric(
        cluster.node_mut(&leader),
        "ferry_shard_commit_seconds_count",
    )?;
    assert!(
        timed.is_some_and(|n| n >= SENT as f64),
        "{timed:?} replicated writes timed after {SENT} sends"
    );

    cluster.node_mut(away).restart_in_place()?;
    let back = cluster.node_mut(away);
    let installed = "ferry_shard_snapshots_installed_total";
    let waited = wait_until(LEADER_WAIT, "the replica installs a snapshot", || {
        let seen = metric(back, installed);
        async move { Ok(seen?.is_some_and(|n| n >= 1.0)) }
    })
    .await;
    if let Err(e) = waited {
        for node in [away, leader.as_str()] {
            let log = cluster.node(node).log();
            let tail: Vec<&str> = log.lines().rev().take(60).collect();
            eprintln!("--- {node}, last lines:");
            tail.iter().rev().for_each(|l| eprintln!("{l}"));
        }
        return Err(e);
    }
    let args = ["shard", "transfer-leader", &shard.to_string(), away];
    let (ok, out, err) = ferry_cli(cluster.node("n1"), &args)?;
    anyhow::ensure!(ok, "transfer-leader failed: {out} {err}");
    anyhow::ensure!(stats(&client, "orders").await?.owner_node == away);

    // The restored replica serves the queue: every message not acknowledged, once.
    let left = drain_once(&session, "orders", &acked).await?;
    let expected: BTreeSet<String> = (0..SENT)
        .map(|i| format!("m{i}"))
        .filter(|b| !acked.contains(b))
        .collect();
    assert_eq!(left.len(), expected.len());
    assert_eq!(left, expected);
    Ok(())
}
