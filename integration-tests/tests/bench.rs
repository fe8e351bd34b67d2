//! `ferry bench` against a real node: it sends, receives, measures, and verifies that every
//! message sent was received.

use ferry_integration_tests::{ferry_cli, memory_node};

fn run_bench(
    node: &ferry_integration_tests::Node,
    args: &[&str],
) -> anyhow::Result<serde_json::Value> {
    let mut all = vec!["bench", "-o", "json"];
    all.extend_from_slice(args);
    let (ok, out, err) = ferry_cli(node, &all)?;
    anyhow::ensure!(ok, "ferry bench {args:?} failed: {err}");
    Ok(serde_json::from_str(out.trim())?)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bench_reports_and_verifies_every_mode() -> anyhow::Result<()> {
    let (_dir, node, client) = memory_node(&[]).await?;
    let runs: [&[&str]; 3] = [
        &[
            "--count",
            "3000",
            "--producers",
            "2",
            "--consumers",
            "2",
            "--window",
            "64",
        ],
        &["--count", "600", "--tx-batch", "20", "--size", "100"],
        &[
            "--count",
            "400",
            "--rate",
            "2000",
            "--ack",
            "individual",
            "--non-persistent",
        ],
    ];
    for args in runs {
        let r = run_bench(&node, args)?;
        let sent = r["sent"].as_u64().unwrap_or_default();
        assert!(sent > 0, "{r}");
        assert_eq!(r["received"], r["sent"], "{args:?}: {r}");
        assert_eq!(r["unique_received"], r["sent"], "{args:?}: {r}");
        assert_eq!(r["missing"], 0, "{args:?}: {r}");
        assert!(r["msgs_per_sec"].as_f64().unwrap_or_default() > 0.0, "{r}");
        let (p50, p99, max) = (
            r["p50_ms"].as_f64().unwrap_or(-1.0),
            r["p99_ms"].as_f64().unwrap_or(-1.0),
            r["max_ms"].as_f64().unwrap_or(-1.0),
        );
        assert!(0.0 < p50 && p50 <= p99 && p99 <= max, "{r}");
    }
    // Request-reply: every round trip got its own reply (the body comes back), timed.
    let r = run_bench(
        &node,
        &["--request-reply", "--count", "50", "--non-persistent"],
    )?;
    assert_eq!(r["workload"], "request-reply", "{r}");
    assert_eq!(
        (r["rounds"].as_u64(), r["answered"].as_u64()),
        (Some(50), Some(50)),
        "{r}"
    );
    assert_eq!(r["failures"], 0, "{r}");
    let (p50, max) = (
        r["p50_ms"].as_f64().unwrap_or(-1.0),
        r["max_ms"].as_f64().unwrap_or(-1.0),
    );
    assert!(0.0 < p50 && p50 <= max, "{r}");
    // Its own queues are gone afterwards.
    let queues = queue_names(&client).await?;
    assert!(queues.is_empty(), "{queues:?}");

    // Bad input is refused with what to fix.
    let (ok, _, err) = ferry_cli(&node, &["bench", "--size", "10"])?;
    assert!(!ok);
    assert!(err.contains("--size must be at least 20"), "{err}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rtt_times_heartbeat_round_trips_and_leaves_no_connection() -> anyhow::Result<()> {
    let (_dir, node, client) = memory_node(&[]).await?;
    let (ok, out, err) = ferry_cli(&node, &["rtt", "--count", "20", "-o", "json"])?;
    assert!(ok, "ferry rtt failed: {err}");
    let r: serde_json::Value = serde_json::from_str(out.trim())?;
    assert_eq!(r["calls"], 20, "{r}");
    let at = |k: &str| r[k].as_f64().unwrap_or(-1.0);
    assert!(
        0.0 < at("min_ms")
            && at("min_ms") <= at("p50_ms")
            && at("p50_ms") <= at("p99_ms")
            && at("p99_ms") <= at("max_ms"),
        "{r}"
    );
    // Its connection was closed, not left to time out.
    let open = client
        .admin()
        .list_connections(ferry_client::pb::ListConnectionsRequest::default())
        .await?
        .into_inner()
        .connections;
    assert!(open.iter().all(|c| c.client_id != "ferry-rtt"), "{open:?}");
    // Bad input is refused with what to fix.
    let (ok, _, err) = ferry_cli(&node, &["rtt", "--count", "0"])?;
    assert!(!ok);
    assert!(err.contains("--count"), "{err}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bench_queues_creates_and_deletes_its_queues_and_times_both() -> anyhow::Result<()> {
    let (_dir, node, client) = memory_node(&[]).await?;
    let args = ["bench-queues", "--count", "30", "--concurrency", "4"];
    let (ok, out, err) = ferry_cli(
        &node,
        &[&args[..], &["--prefix", "bq", "--keep", "-o", "json"]].concat(),
    )?;
    assert!(ok, "ferry bench-queues failed: {err}");
    let r: serde_json::Value = serde_json::from_str(out.trim())?;
    assert_eq!(r["create"]["calls"], 30, "{r}");
    assert!(r["delete"].is_null(), "kept, so nothing deleted: {r}");
    let at = |k: &str| r["create"][k].as_f64().unwrap_or(-1.0);
    assert!(0.0 < at("p50_ms") && at("p50_ms") <= at("max_ms"), "{r}");
    let mut kept: Vec<String> = queue_names(&client)
        .await?
        .into_iter()
        .filter(|n| n.starts_with("bq."))
        .collect();
    kept.sort();
    assert_eq!(kept.len(), 30, "every queue exists, once: {kept:?}");
    assert!(kept.contains(&"bq.0".to_string()) && kept.contains(&"bq.29".to_string()));

    // Again with the same prefix: the queues exist, and the run says which one.
    let (ok, _, err) = ferry_cli(&node, &[&args[..], &["--prefix", "bq"]].concat())?;
    assert!(!ok);
    assert!(err.contains("cannot create queue bq."), "{err}");

    // Without --keep, a run of its own removes what it made.
    let (ok, out, err) = ferry_cli(&node, &["bench-queues", "--count", "10", "-o", "json"])?;
    assert!(ok, "{err}");
    let r: serde_json::Value = serde_json::from_str(out.trim())?;
    assert_eq!(r["delete"]["calls"], 10, "{r}");
    let prefix = r["prefix"].as_str().unwrap_or_default().to_string();
    let left = queue_names(&client).await?;
    assert!(left.iter().all(|q| !q.starts_with(&prefix)), "{left:?}");

    let (ok, _, err) = ferry_cli(&node, &["bench-queues", "--concurrency", "0"])?;
    assert!(!ok);
    assert!(err.contains("--concurrency"), "{err}");
    Ok(())
}

/// The names of the node's queues.
async fn queue_names(client: &ferry_client::Client) -> anyhow::Result<Vec<String>> {
    let queues = client
        .admin()
        .list_queues(ferry_client::pb::ListQueuesRequest::default())
        .await?
        .into_inner()
        .queues;
    Ok(queues.into_iter().map(|q| q.name).collect())
}
