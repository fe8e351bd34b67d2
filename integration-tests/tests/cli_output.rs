//! What the `ferry` command line prints for people (issue 17, items 8 and 10): sizes and
//! durations in units, `queue stats` within 80 columns unless asked for more, `--watch`, a
//! compact `queue show`, one error format, and connections an operator can trace.

#![allow(clippy::unwrap_used)]

use ferry_client::{AckMode, Message, ReceiveOptions};
use ferry_integration_tests::{ferry_cli, memory_node};
use serde_json::Value;

fn json_lines(s: &str) -> Vec<Value> {
    s.lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{l:?}: {e}")))
        .collect()
}

/// The header row of a table: its cells, trimmed.
fn header(table: &str) -> Vec<String> {
    let line = table
        .lines()
        .find(|l| l.starts_with('|'))
        .unwrap_or_else(|| panic!("no table in {table:?}"));
    line.trim_matches('|')
        .split('|')
        .map(|c| c.trim().to_owned())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queue_stats_fits_80_columns_in_units_and_shows_more_when_asked() -> anyhow::Result<()> {
    let (_dir, node, client) = memory_node(&["orders"]).await?;
    let session = client
        .open_connection("t")
        .await?
        .create_session(AckMode::Auto)
        .await?;
    let body = "x".repeat(2 * 1024);
    session
        .send(
            "orders",
            (0..3).map(|_| Message::text(body.clone())).collect(),
        )
        .await?;

    let (ok, out, err) = ferry_cli(&node, &["queue", "stats"])?;
    assert!(ok, "{err}");
    assert!(
        out.lines().all(|l| l.chars().count() <= 80),
        "wider than 80:\n{out}"
    );
    assert_eq!(
        header(&out),
        [
            "queue",
            "ready",
            "scheduled",
            "leased",
            "consumers",
            "bytes",
            "oldest"
        ]
    );
    let row = out.lines().find(|l| l.contains("| orders ")).unwrap();
    assert!(row.contains(" KiB "), "bytes in units: {row}");
    assert!(
        row.contains(" ms ") || row.contains(" s "),
        "age in units: {row}"
    );
    assert!(!out.contains("6144"), "no raw byte counts: {out}");

    let (ok, out, err) = ferry_cli(&node, &["queue", "stats", "--wide"])?;
    assert!(ok, "{err}");
    let wide = header(&out);
    for col in [
        "paged out",
        "memory / budget",
        "sent",
        "acked",
        "dead-lettered",
        "owner",
    ] {
        assert!(wide.iter().any(|h| h == col), "{col} in {wide:?}");
    }
    assert!(out.contains("MiB"), "the budget in units: {out}");

    // rabbitmqctl list_queues name messages consumers
    let (ok, out, err) = ferry_cli(
        &node,
        &["queue", "stats", "--columns", "name,messages,consumers"],
    )?;
    assert!(ok, "{err}");
    assert_eq!(header(&out), ["queue", "messages", "consumers"]);
    assert!(out.contains("| orders "), "{out}");
    assert!(
        out.lines()
            .any(|l| l.starts_with("| orders") && l.contains("| 3 ")),
        "{out}"
    );
    let (ok, _, err) = ferry_cli(&node, &["queue", "stats", "--columns", "name,depth"])?;
    assert!(!ok);
    assert!(
        err.contains("no column \"depth\"") && err.contains("messages"),
        "{err}"
    );

    // JSON keeps raw numbers, whatever the columns.
    let (ok, out, err) = ferry_cli(
        &node,
        &[
            "queue",
            "stats",
            "orders",
            "--columns",
            "name",
            "-o",
            "json",
        ],
    )?;
    assert!(ok, "{err}");
    let s = &json_lines(&out)[0];
    assert!(s["bytes"].as_u64().unwrap() >= 3 * 2048, "{s}");
    assert_eq!(s["ready"], 3);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queue_stats_watch_redraws_with_a_timestamp_and_stops_when_told() -> anyhow::Result<()> {
    let (_dir, node, _client) = memory_node(&["orders"]).await?;
    let started = std::time::Instant::now();
    let (ok, out, err) = ferry_cli(
        &node,
        &[
            "queue",
            "stats",
            "--watch",
            "--interval-ms",
            "100",
            "--count",
            "3",
        ],
    )?;
    assert!(ok, "{err}");
    assert!(started.elapsed() < std::time::Duration::from_secs(10));
    let stamps: Vec<&str> = out
        .lines()
        .filter(|l| l.contains("ctrl-c to stop"))
        .collect();
    assert_eq!(stamps.len(), 3, "{out}");
    // 2026-12-02T02:13:00Z (every 100 ms; ctrl-c to stop)
    assert!(
        stamps
            .iter()
            .all(|s| s.len() > 20 && &s[4..5] == "-" && s[..20].ends_with('Z')),
        "{stamps:?}"
    );
    assert!(stamps[0].contains("every 100 ms"), "{stamps:?}");
    assert_eq!(out.matches("| orders ").count(), 3, "{out}");
    // Not on a terminal: no escape codes to clear the screen.
    assert!(!out.contains('\x1b'), "{out:?}");
    // JSON: just the lines, each refresh after the other.
    let (ok, out, err) = ferry_cli(
        &node,
        &[
            "queue",
            "stats",
            "--watch",
            "--interval-ms",
            "100",
            "--count",
            "2",
            "-o",
            "json",
        ],
    )?;
    assert!(ok, "{err}");
    assert_eq!(json_lines(&out).len(), 4, "two queues, twice: {out}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queue_show_is_compact_and_in_units() -> anyhow::Result<()> {
    let (_dir, node, _client) = memory_node(&[]).await?;
    let (ok, _, err) = ferry_cli(
        &node,
        &[
            "queue",
            "create",
            "jobs",
            "--max-bytes",
            "67108864",
            "--redelivery-delay-ms",
            "1500",
        ],
    )?;
    assert!(ok, "{err}");
    let (ok, out, err) = ferry_cli(&node, &["queue", "show", "jobs"])?;
    assert!(ok, "{err}");
    assert!(out.lines().count() <= 12, "{out}");
    assert!(out.starts_with("queue jobs on node-1"), "{out}");
    for want in [
        "30 s by default, 12 h at most",
        "max message size   1 MiB",
        "max bytes          64 MiB",
        "max messages       unlimited",
        "then 1.5 s",
        "dedup window       10 min",
        "dead letters to    jobs.DLQ",
    ] {
        assert!(out.contains(want), "{want:?} in\n{out}");
    }
    assert!(
        !out.contains("43200000") && !out.contains("67108864"),
        "{out}"
    );
    // JSON: the raw values.
    let (ok, out, _) = ferry_cli(&node, &["queue", "show", "jobs", "-o", "json"])?;
    assert!(ok);
    let v = &json_lines(&out)[0];
    assert_eq!(v["lease_max_ms"], "43200000");
    assert_eq!(v["max_bytes"], "67108864");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_command_fails_in_one_format_without_library_internals() -> anyhow::Result<()> {
    let (_dir, node, _client) = memory_node(&["orders"]).await?;
    // Deleting what is not there does not advise creating it.
    let (ok, _, err) = ferry_cli(&node, &["queue", "delete", "nope"])?;
    assert!(!ok);
    assert!(
        err.starts_with("error: cannot delete queue nope: "),
        "{err}"
    );
    assert!(err.contains("does not exist"), "{err}");
    assert!(!err.contains("create"), "{err}");
    // What failed, why, and what to do on its own line.
    for (args, what) in [
        (
            vec!["queue", "show", "nope"],
            "error: cannot show queue nope: ",
        ),
        (
            vec!["queue", "stats", "nope"],
            "error: cannot read the statistics of queue nope: ",
        ),
        (vec!["send", "--queue", "nope", "x"], "error: "),
        (
            vec!["queue", "move", "--from", "nope", "--to", "orders"],
            "error: cannot move messages from nope to orders: ",
        ),
    ] {
        let (ok, _, err) = ferry_cli(&node, &args)?;
        assert!(!ok, "{args:?}");
        assert!(err.starts_with(what), "{args:?}: {err}");
        assert!(err.contains("\n  hint: create it first"), "{args:?}: {err}");
        for internal in [
            "code:",
            "Some requested entity",
            "tonic",
            "Status {",
            "NotFound",
        ] {
            assert!(!err.contains(internal), "{args:?}: {internal} in {err}");
        }
    }
    // Nothing listening: said in words, with what to do.
    for args in [
        vec!["queue", "list"],
        vec!["queue", "stats"],
        vec!["send", "--queue", "orders", "x"],
        vec!["connections", "list"],
    ] {
        let out = std::process::Command::new(ferry_integration_tests::ferry_bin())
            .args(&args)
            .args(["--server", "127.0.0.1:1"])
            .env_remove("FERRY_SERVER")
            .output()?;
        assert!(!out.status.success());
        let err = String::from_utf8(out.stderr)?;
        assert!(
            err.starts_with("error: cannot reach the server at 127.0.0.1:1: connection refused\n  hint: is `ferry server` running there?"),
            "{args:?}: {err}"
        );
        assert!(
            err.contains("--server HOST:PORT (or FERRY_SERVER)"),
            "{err}"
        );
        assert!(
            !err.contains("transport error") && !err.contains("tonic"),
            "{err}"
        );
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_list_shows_where_each_client_is_from_since_when_and_what_it_holds(
) -> anyhow::Result<()> {
    let (_dir, node, client) = memory_node(&["orders", "audit"]).await?;
    let conn = client.open_connection("billing-worker").await?;
    let producer = conn.create_session(AckMode::Auto).await?;
    producer
        .send(
            "orders",
            (0..5).map(|i| Message::text(format!("{i}"))).collect(),
        )
        .await?;
    producer.send("audit", vec![Message::text("a")]).await?;
    // Two held on one queue, one on another, by two sessions; one acknowledged.
    let s1 = conn.create_session(AckMode::Client).await?;
    let s2 = conn.create_session(AckMode::Individual).await?;
    let got = s1
        .receive("orders", ReceiveOptions::timeout_ms(1_000).max(2))
        .await?;
    assert_eq!(got.len(), 2);
    let got = s2
        .receive("orders", ReceiveOptions::timeout_ms(1_000).max(2))
        .await?;
    s2.ack(&got[..1]).await?;
    s2.receive("audit", ReceiveOptions::timeout_ms(1_000))
        .await?;

    let (ok, out, err) = ferry_cli(&node, &["connections", "list", "-o", "json"])?;
    assert!(ok, "{err}");
    let all = json_lines(&out);
    let c = all
        .iter()
        .find(|c| c["client_id"] == "billing-worker")
        .unwrap_or_else(|| panic!("{out}"));
    assert_eq!(c["unacked"], 4, "{c}");
    assert_eq!(c["sessions"], 3, "{c}");
    assert!(
        c["client_address"]
            .as_str()
            .unwrap()
            .starts_with("127.0.0.1:"),
        "{c}"
    );
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)?
        .as_millis() as u64;
    let since = c["connected_at_ms"].as_u64().unwrap();
    assert!(since <= now + 1_000 && now - since < 60_000, "{c}");

    let (ok, out, err) = ferry_cli(&node, &["connections", "list"])?;
    assert!(ok, "{err}");
    assert_eq!(
        header(&out),
        [
            "connection",
            "client",
            "address",
            "connected",
            "sessions",
            "unacked"
        ]
    );
    let row = out
        .lines()
        .find(|l| l.contains("billing-worker"))
        .unwrap_or_else(|| panic!("{out}"));
    assert!(row.contains("127.0.0.1:") && row.contains(" ago "), "{row}");
    assert!(
        row.trim_end().ends_with("| 4       |") || row.contains("| 4 "),
        "{row}"
    );
    // Piped, each connection is one line whatever its width (a terminal wraps cells to fit).
    let rows = out.lines().filter(|l| l.starts_with("| ")).count();
    assert_eq!(rows, 2, "the header and one row, unwrapped:\n{out}");
    conn.close().await?;
    Ok(())
}
