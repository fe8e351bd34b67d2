//! Prometheus metrics: a scripted workload moves exactly the numbers it should.

use std::time::Duration;

use anyhow::Context as _;
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
    // The node records its data directory in the metadata once formed: one proposal.
    let recorded = || async {
        let status = client
            .cluster()
            .get_cluster_status(ferry_client::pb::GetClusterStatusRequest::default())
            .await?
            .into_inner();
        Ok(status.nodes.iter().all(|n| n.incarnation != 0))
    };
    ferry_integration_tests::wait_until(
        Duration::from_secs(10),
        "the data directory recorded",
        recorded,
    )
    .await?;
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
    // The metadata's rounds that only applied what its synced log held were not synced again.
    assert!(
        sample(&after, "ferry_group_commit_replayable_total").unwrap_or_default() >= 1.0,
        "{after}"
    );
    // The metadata group: a one-node cluster leads itself; recording its data directory and
    // the queue's creation were the proposals through this node.
    assert_eq!(sample(&after, "ferry_raft_leader"), Some(1.0), "{after}");
    assert!(sample(&after, "ferry_raft_term").unwrap_or_default() >= 1.0);
    assert_eq!(sample(&after, "ferry_raft_proposals_total"), Some(2.0));
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
    check_openmetrics(&after);
    Ok(())
}

/// The page against the rules of OpenMetrics' text format that strict parsers (Python's
/// `prometheus_client.openmetrics.parser`) enforce: each family declared once by `# TYPE` and
/// its samples right after it (not interleaved with another's), each sample named by its family
/// and a suffix its type allows, each value a number, `+Inf`, `-Inf` or `NaN`, and `# EOF` once,
/// last.
fn check_openmetrics(page: &str) {
    let lines: Vec<&str> = page.lines().collect();
    assert_eq!(lines.last(), Some(&"# EOF"), "{page}");
    let mut declared = std::collections::HashSet::new();
    let mut family: Option<(&str, &str)> = None;
    for line in &lines[..lines.len() - 1] {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').expect("# TYPE name type");
            assert!(declared.insert(name), "{name} declared twice");
            family = Some((name, kind));
            continue;
        }
        if line.starts_with("# HELP ") || line.starts_with("# UNIT ") {
            continue;
        }
        assert!(!line.starts_with('#'), "not OpenMetrics: {line:?}");
        let (name, kind) = family.unwrap_or_else(|| panic!("{line:?} before any # TYPE"));
        let sample = line.split(['{', ' ']).next().unwrap_or_default();
        let suffix = sample
            .strip_prefix(name)
            .unwrap_or_else(|| panic!("{line:?} is not of family {name}"));
        let allowed: &[&str] = match kind {
            "counter" => &["_total", "_created"],
            "gauge" | "unknown" => &[""],
            "histogram" => &["_bucket", "_count", "_sum", "_created"],
            "info" => &["_info"],
            other => panic!("type {other} of {name}"),
        };
        assert!(
            allowed.contains(&suffix),
            "{line:?}: a {kind} has no {suffix:?}"
        );
        let value = line.rsplit(' ').next().unwrap_or_default();
        assert!(
            ["+Inf", "-Inf", "NaN"].contains(&value) || value.parse::<f64>().is_ok(),
            "{line:?}: value {value:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_node_its_alarms_and_its_process_are_on_the_page() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let mut node = Node::start(dir.path(), NodeOptions::default())?;
    let client = node.client().await?;
    create_queue(&client, "orders").await?;
    let url = node.metrics_url()?;
    // The node's CPU time as the kernel tells it, read around the scrape: the page's must lie
    // between the two readings (it may be 0 on a loaded machine: accounting is by ticks).
    let pid = node.pid().context("the node runs")?;
    let cpu_before = cpu_seconds_of(pid)?;
    let page = tokio::task::spawn_blocking(move || scrape(&url)).await??;
    let cpu_after = cpu_seconds_of(pid)?;
    check_openmetrics(&page);
    let version = env!("CARGO_PKG_VERSION");
    assert_eq!(
        sample(
            &page,
            &format!("ferry_build_info{{version=\"{version}\",node=\"node-1\"}}")
        ),
        Some(1.0),
        "{page}"
    );
    assert_eq!(sample(&page, "ferry_ready"), Some(1.0));
    for alarm in ["disk_free_low", "store_poisoned"] {
        let line = format!("ferry_alarm{{alarm=\"{alarm}\"}}");
        assert_eq!(sample(&page, &line), Some(0.0), "{page}");
    }
    assert!(sample(&page, "ferry_store_size_bytes").unwrap_or_default() > 0.0);
    assert!(sample(&page, "ferry_uptime_seconds").is_some());
    // The standard process metrics, read from /proc/self of the node.
    assert!(sample(&page, "process_resident_memory_bytes").unwrap_or_default() > 1e6);
    assert!(sample(&page, "process_virtual_memory_bytes").unwrap_or_default() > 1e6);
    assert!(sample(&page, "process_open_fds").unwrap_or_default() >= 5.0);
    assert!(sample(&page, "process_max_fds").unwrap_or_default() >= 5.0);
    let cpu = sample(&page, "process_cpu_seconds_total").context("process_cpu_seconds_total")?;
    assert!(
        cpu_before <= cpu && cpu <= cpu_after,
        "{cpu} not within {cpu_before}..={cpu_after}"
    );
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)?
        .as_secs_f64();
    let start = sample(&page, "process_start_time_seconds").unwrap_or_default();
    assert!(
        start > now - 600.0 && start <= now + 1.0,
        "{start} vs {now}"
    );
    Ok(())
}

/// User and system CPU seconds of process `pid`, from `/proc/<pid>/stat` (fields 14 and 15,
/// counted after the parenthesised command name).
fn cpu_seconds_of(pid: u32) -> anyhow::Result<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    let after_name = &stat[stat.rfind(')').context("no command name")? + 1..];
    let fields: Vec<&str> = after_name.split_whitespace().collect();
    let ticks =
        |n: usize| -> anyhow::Result<u64> { Ok(fields.get(n - 3).context("short stat")?.parse()?) };
    let ticks_per_second = rustix::param::clock_ticks_per_second() as f64;
    Ok((ticks(14)? + ticks(15)?) as f64 / ticks_per_second)
}
