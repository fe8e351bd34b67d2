//! A node tells about itself: `ferry status` (text and JSON) with the configuration's sources,
//! and the HTTP `/healthz` and `/readyz` beside `/metrics`: ready once serving, not ready while
//! it waits to be added to a cluster, and not ready (but alive) while it shuts down.

#![allow(clippy::unwrap_used)]

use std::time::{Duration, Instant};

use ferry_integration_tests::raw::RawCodec;
use ferry_integration_tests::{
    create_queue, ferry_cli, http_get, send_signal, wait_until, Node, NodeOptions,
};
use serde_json::Value;
use tonic::codegen::http::uri::PathAndQuery;

/// A node on disk whose settings come from each layer: `receive_batch_max` from the file,
/// `history.max_steps` from the environment, `listen` and `data_dir` from flags (the harness
/// passes them).
fn layered_node(dir: &std::path::Path) -> anyhow::Result<Node> {
    Node::start(
        dir,
        NodeOptions {
            extra_toml: "[limits]\nreceive_batch_max = 500\n".into(),
            env: vec![("FERRY_HISTORY__MAX_STEPS".into(), "5000".into())],
            ..Default::default()
        },
    )
}

/// The setting `key` of a `ferry status -o json` report: (value, source).
fn setting(report: &Value, key: &str) -> (String, String) {
    let s = report["config"]
        .as_array()
        .and_then(|all| all.iter().find(|s| s["key"] == key))
        .unwrap_or_else(|| panic!("no setting {key} in {report}"));
    (
        s["value"].as_str().unwrap().to_owned(),
        s["source"].as_str().unwrap().to_owned(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_tells_what_the_node_runs_where_and_with_which_settings() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let mut node = layered_node(dir.path())?;
    let client = node.client().await?;
    create_queue(&client, "orders").await?;
    let metrics = node.metrics_url()?;

    let (ok, out, err) = ferry_cli(&node, &["status", "-o", "json"])?;
    assert!(ok, "{err}");
    let r: Value = serde_json::from_str(out.trim())?;
    assert_eq!(r["node_id"], "node-1");
    assert_eq!(r["version"], env!("CARGO_PKG_VERSION"));
    assert_eq!(r["ready"], true, "{r}");
    assert_eq!(r["alarms"], serde_json::json!([]));
    assert_eq!(r["storage"], "rocksdb");
    assert_eq!(r["data_dir"], dir.path().display().to_string());
    assert_eq!(r["store"]["state"], "ok");
    assert!(r["store"]["size_bytes"].as_u64().unwrap() > 0, "{r}");
    assert_eq!(r["store"]["disk_guard_tripped"], false);
    assert_eq!(r["store"]["disk_free_min_bytes"], 64 * 1024 * 1024);
    assert!(r["uptime_ms"].as_u64().is_some() && r["started_at_ms"].as_u64().unwrap() > 0);
    let listeners: Vec<(String, String)> = r["listeners"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| {
            (
                l["name"].as_str().unwrap().to_owned(),
                l["address"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    let metrics_addr = metrics
        .strip_prefix("http://")
        .and_then(|m| m.strip_suffix("/metrics"))
        .unwrap();
    assert_eq!(
        listeners,
        [
            ("client".to_owned(), node.addr.to_string()),
            ("peer".to_owned(), node.peer_addr.to_string()),
            ("metrics".to_owned(), metrics_addr.to_owned()),
        ]
    );
    // Each layer named: the file by its path, the variable by its name, the flag by its flag.
    let file = dir.path().join("ferry.toml");
    assert_eq!(
        setting(&r, "limits.receive_batch_max"),
        ("500".into(), format!("file {}", file.display()))
    );
    assert_eq!(
        setting(&r, "history.max_steps"),
        ("5000".into(), "env FERRY_HISTORY__MAX_STEPS".into())
    );
    assert_eq!(
        setting(&r, "listen"),
        ("\"127.0.0.1:0\"".into(), "flag --listen".into())
    );
    assert_eq!(setting(&r, "node_id").1, format!("file {}", file.display()));
    assert_eq!(
        setting(&r, "shutdown_grace_ms"),
        ("10000".into(), "default".into())
    );
    // A one-node cluster: itself, no peers.
    assert_eq!(r["leader_node_id"], "node-1");
    assert_eq!(r["peers"], serde_json::json!([]));

    // For people: the same facts; settings at their defaults only counted, unless --all.
    let (ok, text, err) = ferry_cli(&node, &["status"])?;
    assert!(ok, "{err}");
    for needle in [
        "node        node-1",
        &format!("version     ferry {}", env!("CARGO_PKG_VERSION")),
        "ready       yes",
        "alarms      none",
        &format!("data dir    {} (rocksdb, ", dir.path().display()),
        "store       ok",
        "disk guard  ok: ",
        "peers       none",
        "limits.receive_batch_max",
        "env FERRY_HISTORY__MAX_STEPS",
        "more at their defaults)",
    ] {
        assert!(text.contains(needle), "no {needle:?} in:\n{text}");
    }
    assert!(!text.contains("shutdown_grace_ms"), "{text}");
    let (ok, all, _) = ferry_cli(&node, &["status", "--all"])?;
    assert!(ok && all.contains("shutdown_grace_ms") && !all.contains("more at their defaults"));
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn healthz_and_readyz_answer_beside_the_metrics() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let mut node = Node::start(
        dir.path(),
        NodeOptions {
            memory: true,
            ..Default::default()
        },
    )?;
    node.client().await?;
    let (healthz, readyz) = (node.http_url("healthz")?, node.http_url("readyz")?);
    let (h, r) =
        tokio::task::spawn_blocking(move || (http_get(&healthz), http_get(&readyz))).await?;
    assert_eq!(h?, (200, "ok\n".to_owned()));
    assert_eq!(r?, (200, "ready\n".to_owned()));
    Ok(())
}

/// Polls `url` until it answers `status` with a body containing `needle`; returns the body.
async fn wait_http(url: &str, status: u16, needle: &str) -> anyhow::Result<String> {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let url = url.to_owned();
        let answer = tokio::task::spawn_blocking(move || http_get(&url)).await?;
        match answer {
            Ok((code, body)) if code == status && body.contains(needle) => return Ok(body),
            other if Instant::now() > deadline => {
                anyhow::bail!("waited 20 s for {status} {needle:?}; last answer {other:?}")
            }
            _ => tokio::time::sleep(Duration::from_millis(10)).await,
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_waiting_to_join_is_alive_but_not_ready_until_added() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let first = Node::start(
        &dir.path().join("a"),
        NodeOptions {
            node_id: "a".into(),
            memory: true,
            ..Default::default()
        },
    )?;
    first.client().await?;
    let mut joining = Node::start(
        &dir.path().join("b"),
        NodeOptions {
            node_id: "b".into(),
            memory: true,
            extra_toml: format!("[cluster]\njoin = \"{}\"\n", first.peer_addr),
            ..Default::default()
        },
    )?;
    let readyz = joining.http_url("readyz")?;
    let healthz = joining.http_url("healthz")?;
    let answer = wait_http(&readyz, 503, "not a member of a cluster yet").await?;
    assert!(answer.contains("not ready"), "{answer}");
    wait_http(&healthz, 200, "ok").await?;
    let (ok, out, err) = ferry_cli(&joining, &["status", "-o", "json"])?;
    assert!(ok, "{err}");
    let r: Value = serde_json::from_str(out.trim())?;
    assert_eq!(r["ready"], false);
    assert!(r["not_ready"][0]
        .as_str()
        .unwrap()
        .contains("ferry node add"));

    let peer = joining.peer_addr.to_string();
    let (ok, _, err) = ferry_cli(
        &first,
        &["node", "add", "b", "--address", &peer, "--learner"],
    )?;
    assert!(ok, "{err}");
    wait_http(&readyz, 200, "ready").await?;
    // Each node logs the other reachable once it hears from it.
    wait_until(Duration::from_secs(20), "a logs b reachable", || async {
        Ok(first.log().contains("peer b reachable"))
    })
    .await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_shutting_down_is_not_ready_while_it_finishes_its_calls() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let mut node = Node::start(
        dir.path(),
        NodeOptions {
            memory: true,
            extra_toml: "shutdown_grace_ms = 5000\n".into(),
            ..Default::default()
        },
    )?;
    node.client().await?;
    let (readyz, healthz) = (node.http_url("readyz")?, node.http_url("healthz")?);
    // A unary call whose request never ends: the node serves it until the grace runs out, so
    // its shutdown lasts that long.
    let channel = tonic::transport::Endpoint::from_shared(node.url())?
        .connect()
        .await?;
    let mut grpc = tonic::client::Grpc::new(channel.clone());
    grpc.ready().await?;
    let mut held = Box::pin(grpc.client_streaming(
        tonic::Request::new(futures::stream::pending::<Vec<u8>>()),
        PathAndQuery::from_static("/ferry.v1.Admin/ListQueues"),
        RawCodec,
    ));
    assert!(futures::poll!(&mut held).is_pending());
    // A call on the same connection after it: once answered, the node holds the first one.
    ferry_client::pb::admin_client::AdminClient::new(channel)
        .list_queues(ferry_client::pb::ListQueuesRequest::default())
        .await?;
    let pid = node.pid().unwrap();
    send_signal(pid, "TERM")?;
    let answer = wait_http(&readyz, 503, "shutting down").await?;
    assert!(answer.contains("not ready"), "{answer}");
    // Alive all the same: a liveness probe must not kill a node that is stopping cleanly.
    wait_http(&healthz, 200, "ok").await?;
    let status = tokio::task::spawn_blocking(move || node.terminate()).await??;
    assert!(status.success(), "{status:?}");
    drop(held);
    Ok(())
}
