//! Prometheus metrics: a scripted workload moves exactly the numbers it should.

use ferry_client::{AckMode, Message, ReceiveOptions};
use ferry_integration_tests::{create_queue, Node, NodeOptions};

/// The value of one sample line `name{labels} value` in a scrape.
fn sample(scrape: &str, name_and_labels: &str) -> Option<f64> {
    scrape
        .lines()
        .find_map(|l| l.strip_prefix(name_and_labels)?.trim().parse().ok())
}

fn scrape(url: &str) -> anyhow::Result<String> {
    Ok(ureq::get(url).call()?.body_mut().read_to_string()?)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_follow_a_scripted_workload() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let mut node = Node::start(
        dir.path(),
        NodeOptions {
            memory: true,
            extra_toml: "[metrics]\nlisten = \"127.0.0.1:0\"\n".into(),
            ..Default::default()
        },
    )?;
    let url = node.metrics_url()?;
    let client = node.client().await?;
    create_queue(&client, "orders").await?;
    let before = tokio::task::spawn_blocking({
        let url = url.clone();
        move || scrape(&url)
    })
    .await??;
    assert_eq!(
        sample(&before, "ferry_queue_messages_ready{queue=\"orders\"}"),
        Some(0.0)
    );

    let conn = client.open_connection("m").await?;
    let session = conn.create_session(AckMode::Individual).await?;
    let batch = (0..5).map(|i| Message::text(format!("m{i}"))).collect();
    session.send("orders", batch).await?;
    let got = session
        .receive("orders", ReceiveOptions::no_wait().max(3))
        .await?;
    session.ack(&got[..1]).await?;
    session.reject(&got[1..2], "bad").await?;

    let after = tokio::task::spawn_blocking(move || scrape(&url)).await??;
    let q = |name: &str| sample(&after, &format!("{name}{{queue=\"orders\"}}"));
    assert_eq!(q("ferry_queue_messages_ready"), Some(2.0), "{after}");
    assert_eq!(q("ferry_queue_messages_unacked"), Some(1.0));
    assert_eq!(q("ferry_queue_messages_published_total"), Some(5.0));
    assert_eq!(q("ferry_queue_messages_delivered_total"), Some(3.0));
    assert_eq!(q("ferry_queue_messages_acked_total"), Some(1.0));
    assert_eq!(
        sample(
            &after,
            "ferry_queue_messages_dead_lettered_total{queue=\"orders\",reason=\"rejected\"}"
        ),
        Some(1.0)
    );
    // Paging: everything fits in memory; orders and orders.DLQ share the node's 256 MiB, so each
    // keeps its own 64 MiB budget.
    assert_eq!(q("ferry_queue_paged_out_messages"), Some(0.0));
    let memory = q("ferry_queue_memory_bytes").unwrap_or_default();
    assert!(memory > 0.0, "{after}");
    assert_eq!(
        q("ferry_queue_memory_budget_bytes"),
        Some(64.0 * 1024.0 * 1024.0)
    );
    assert!(sample(&after, "ferry_node_memory_bytes").unwrap_or_default() >= memory);
    assert_eq!(
        sample(&after, "ferry_node_memory_budget_bytes"),
        Some(256.0 * 1024.0 * 1024.0)
    );
    assert_eq!(sample(&after, "ferry_connections"), Some(1.0));
    assert_eq!(sample(&after, "ferry_sessions"), Some(1.0));
    assert!(
        sample(&after, "ferry_group_commit_writes_total").is_some(),
        "{after}"
    );
    // The metadata group: a one-node cluster leads itself; the queue's creation was one
    // proposal through this node.
    assert_eq!(sample(&after, "ferry_raft_leader"), Some(1.0), "{after}");
    assert!(sample(&after, "ferry_raft_term").unwrap_or_default() >= 1.0);
    assert_eq!(sample(&after, "ferry_raft_proposals_total"), Some(1.0));
    assert_eq!(
        sample(&after, "ferry_raft_proposals_failed_total"),
        Some(0.0)
    );
    assert_eq!(sample(&after, "ferry_cluster_peers_down"), Some(0.0));
    assert!(
        sample(&after, "ferry_raft_applied_index").unwrap_or_default()
            >= sample(&after, "ferry_raft_log_entries").unwrap_or_default()
    );
    assert_eq!(sample(&after, "ferry_routing_redirects_total"), Some(0.0));
    // OpenMetrics' own rules, as strict parsers (Python's) apply them: a bucket bound is a
    // number or `+Inf` (Postmortem: the last bound was written `inf` and such parsers refused
    // the page), and the page ends with `# EOF`.
    for line in after.lines().filter(|l| l.contains("le=\"")) {
        let le = line
            .split("le=\"")
            .nth(1)
            .and_then(|rest| rest.split('"').next())
            .unwrap_or_default();
        assert!(
            le == "+Inf" || (le.parse::<f64>().is_ok_and(f64::is_finite)),
            "bucket bound {le:?} in {line:?}"
        );
    }
    assert!(after.trim_end().ends_with("# EOF"), "{after}");
    assert!(
        after.contains("le=\"+Inf\""),
        "a histogram ends at +Inf: {after}"
    );
    Ok(())
}
