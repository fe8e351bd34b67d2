//! The admin surface through the CLI: deleting one message, listing and closing connections.

use ferry_client::{AckMode, Message, ReceiveOptions};
use ferry_integration_tests::{ferry_cli, memory_node, stats};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delete_one_message_and_close_a_connection() -> anyhow::Result<()> {
    let (_dir, node, client) = memory_node(&["q"]).await?;
    let conn = client.open_connection("worker").await?;
    let session = conn.create_session(AckMode::Individual).await?;
    let ids = session
        .send(
            "q",
            vec![Message::text("a"), Message::text("b"), Message::text("c")],
        )
        .await?;
    let held = session.receive("q", ReceiveOptions::no_wait()).await?;
    assert_eq!(held[0].message_id(), ids[0]);

    // One message goes; a held one and a malformed id are refused with what to do.
    let (ok, out, err) = ferry_cli(&node, &["message", "delete", "--queue", "q", &ids[1]])?;
    assert!(ok, "{err}");
    assert!(out.contains("deleted"), "{out}");
    assert_eq!(stats(&client, "q").await?.ready, 1);
    let (ok, _, err) = ferry_cli(&node, &["message", "delete", "--queue", "q", &ids[0]])?;
    assert!(!ok);
    assert!(err.contains("not yet acknowledged"), "{err}");
    let (ok, _, err) = ferry_cli(&node, &["message", "delete", "--queue", "q", "ID:nope"])?;
    assert!(!ok);
    assert!(err.contains("is not a message id"), "{err}");
    let (ok, _, err) = ferry_cli(&node, &["message", "delete", "--queue", "q", &ids[1]])?;
    assert!(!ok);
    assert!(err.contains("not in the queue"), "{err}");

    // The worker's connection is listed, and closing it returns its message at once.
    let (ok, out, err) = ferry_cli(&node, &["connections", "list", "-o", "json"])?;
    assert!(ok, "{err}");
    let listed: Vec<serde_json::Value> = out
        .lines()
        .map(serde_json::from_str)
        .collect::<Result<_, _>>()?;
    let worker = listed
        .iter()
        .find(|c| c["client_id"] == "worker")
        .expect("the worker's connection is listed");
    // Listed by its public form: the id itself is what the worker's calls carry.
    let listed_id = worker["connection_id"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    assert!(
        listed_id.starts_with('c') && listed_id.len() == 9,
        "{listed_id}"
    );
    assert_ne!(listed_id, conn.id());
    assert_eq!(worker["sessions"], 1);
    let (ok, out, err) = ferry_cli(&node, &["connections", "close", &listed_id, "-o", "json"])?;
    assert!(ok, "{err}");
    let closed: serde_json::Value = serde_json::from_str(out.trim())?;
    assert_eq!(closed["released"], 1);
    let s = stats(&client, "q").await?;
    assert_eq!((s.ready, s.leased), (2, 0));
    let e = session
        .receive("q", ReceiveOptions::no_wait())
        .await
        .unwrap_err();
    assert_eq!(e.code(), Some(tonic::Code::NotFound), "{e}");
    Ok(())
}

/// The "retry the DLQ" action: moving the messages a selector matches, rate-limited, with
/// progress; nothing lost, nothing duplicated, order kept, each message in its turn.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn move_messages_with_a_selector_and_a_rate_limit() -> anyhow::Result<()> {
    let (_dir, node, client) = memory_node(&["work.DLQ", "work"]).await?;
    let session = client
        .open_connection("m")
        .await?
        .create_session(AckMode::Individual)
        .await?;
    let batch = (0..50)
        .map(|i| Message::text(format!("m{i}")).property("n", i))
        .collect();
    session.send("work.DLQ", batch).await?;

    let (ok, out, err) = ferry_cli(
        &node,
        &[
            "queue",
            "move",
            "--from",
            "work.DLQ",
            "--to",
            "work",
            "--selector",
            "n < 20",
            "--rate",
            "100",
            "-o",
            "json",
        ],
    )?;
    assert!(ok, "{err}");
    let task: serde_json::Value = serde_json::from_str(out.trim())?;
    assert_eq!(task["state"], "done", "{task}");
    assert_eq!(task["moved"], 20);
    assert_eq!(task["source_messages_at_start"], 50);
    // The task's progress stays readable afterwards.
    let id = task["task_id"].as_str().unwrap_or_default();
    let (ok, out, _) = ferry_cli(&node, &["queue", "move-status", id, "-o", "json"])?;
    assert!(ok);
    let status: serde_json::Value = serde_json::from_str(out.trim())?;
    assert_eq!(status, task, "the same task, its start and end times too");

    assert_eq!(stats(&client, "work").await?.ready, 20);
    assert_eq!(stats(&client, "work.DLQ").await?.ready, 30);
    let moved = session
        .receive("work", ReceiveOptions::no_wait().max(100))
        .await?;
    let bodies: Vec<String> = moved
        .iter()
        .map(|r| String::from_utf8_lossy(r.body()).into_owned())
        .collect();
    let want: Vec<String> = (0..20).map(|i| format!("m{i}")).collect();
    assert_eq!(bodies, want, "all of them, once, in order");

    // The rate as the node applied it, by its own clock rather than one around the CLI (whose
    // start-up alone can outlast the whole move): at 100 per second, message n (from 0) was sent
    // to `work` no sooner than n × 10 ms after the task started. 1 ms of slack: the pacing runs
    // on the monotonic clock, the timestamps come from the wall clock, which may be slewed.
    let (started_at, finished_at) = (
        task["started_at_ms"].as_u64().unwrap_or_default(),
        task["finished_at_ms"].as_u64().unwrap_or_default(),
    );
    assert!(started_at > 0 && finished_at >= started_at, "{task}");
    let mut admin = client.admin();
    for (n, m) in (0u64..).zip(&moved) {
        let steps = admin
            .get_message_history(ferry_client::pb::GetMessageHistoryRequest {
                message_id: m.message_id().to_string(),
            })
            .await?
            .into_inner()
            .steps;
        let sent_at = steps
            .iter()
            .find(|s| s.event == "sent")
            .map(|s| s.at_ms)
            .ok_or_else(|| anyhow::anyhow!("no sent step for message {n}: {steps:?}"))?;
        let turn = started_at + n * 10;
        assert!(
            sent_at + 1 >= turn,
            "message {n} moved at {sent_at}, {} ms before its turn {turn}",
            turn - sent_at
        );
        assert!(
            sent_at <= finished_at,
            "message {n} moved at {sent_at}, after the task ended at {finished_at}"
        );
    }

    // Bad requests say what to fix.
    let (ok, _, err) = ferry_cli(&node, &["queue", "move", "--from", "work", "--to", "work"])?;
    assert!(!ok);
    assert!(err.contains("name two queues"), "{err}");
    let (ok, _, err) = ferry_cli(
        &node,
        &["queue", "move", "--from", "work", "--to", "nowhere"],
    )?;
    assert!(!ok);
    assert!(err.contains("to_queue"), "{err}");
    Ok(())
}

/// `ferry message history`: the steps of a message that was delivered, rolled back, redelivered
/// after the policy's delay, and acknowledged in a commit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn message_history_tells_each_step() -> anyhow::Result<()> {
    let (_dir, node, client) = memory_node(&[]).await?;
    client
        .admin()
        .create_queue(ferry_client::pb::CreateQueueRequest {
            replicas: 0,
            own_shard: false,
            name: "jobs".into(),
            config: Some(ferry_client::pb::QueueConfig {
                redelivery: Some(ferry_client::pb::RedeliveryPolicy {
                    initial_delay_ms: Some(100),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            if_not_exists: false,
            node: String::new(),
        })
        .await?;
    let conn = client.open_connection("h").await?;
    let tx = conn.create_session(AckMode::Transacted).await?;
    let producer = conn.create_session(AckMode::Auto).await?;
    let ids = producer.send("jobs", vec![Message::text("job")]).await?;
    let got = tx
        .receive("jobs", ReceiveOptions::timeout_ms(5_000))
        .await?;
    assert_eq!(got.len(), 1);
    tx.rollback().await?;
    let again = tx
        .receive("jobs", ReceiveOptions::timeout_ms(5_000))
        .await?;
    assert_eq!(again[0].delivery_count(), 2);
    tx.commit().await?;

    let (ok, out, err) = ferry_cli(&node, &["message", "history", &ids[0], "-o", "json"])?;
    assert!(ok, "{err}");
    let steps: Vec<serde_json::Value> = out
        .lines()
        .map(serde_json::from_str)
        .collect::<Result<_, _>>()?;
    let events: Vec<&str> = steps.iter().filter_map(|s| s["event"].as_str()).collect();
    assert_eq!(
        events,
        ["sent", "delivered", "returned", "delivered", "acked"],
        "{out}"
    );
    let detail = |i: usize| steps[i]["detail"].as_str().unwrap_or_default().to_owned();
    // The session is named by its public form, never by its id (a credential).
    assert!(
        detail(1).contains("to session s") && detail(1).contains("delivery 1"),
        "{out}"
    );
    assert!(!out.contains(tx.id()), "{out}");
    assert!(
        detail(2).starts_with("rollback; redelivery delayed until"),
        "{out}"
    );
    assert!(detail(3).contains("delivery 2"), "{out}");
    let at = |i: usize| steps[i]["at_ms"].as_u64().unwrap_or_default();
    assert_eq!(
        steps[2]["deliver_at_ms"].as_u64(),
        Some(at(2) + 100),
        "the rollback scheduled the redelivery after the policy's delay: {out}"
    );
    assert!(
        at(3) >= at(2) + 100,
        "redelivered no sooner than the policy's delay: {out}"
    );

    let (ok, _, err) = ferry_cli(&node, &["message", "history", "ID:0000000000000001-9"])?;
    assert!(!ok);
    assert!(err.contains("no history"), "{err}");
    Ok(())
}

// Postmortem: listings came whole, so a node with many queues or connections answered one
// unbounded message.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn listings_come_a_page_at_a_time_in_order() -> anyhow::Result<()> {
    let names: Vec<String> = (0..7).map(|i| format!("page-{i}")).collect();
    let refs: Vec<&str> = names.iter().map(String::as_str).collect();
    let (_dir, node, client) = memory_node(&refs).await?;
    let mut admin = client.admin();
    let mut seen = vec![];
    let mut page_token = String::new();
    let mut pages = 0;
    loop {
        let page = admin
            .list_queues(ferry_client::pb::ListQueuesRequest {
                page_size: 3,
                page_token,
            })
            .await?
            .into_inner();
        assert!(page.queues.len() <= 3);
        seen.extend(page.queues.into_iter().map(|q| q.name));
        pages += 1;
        assert!(pages <= 10, "the pages never ended");
        if page.next_page_token.is_empty() {
            break;
        }
        page_token = page.next_page_token;
    }
    // Every queue once, in name order (with the dead-letter queues created beside them).
    let mut sorted = seen.clone();
    sorted.sort();
    sorted.dedup();
    assert_eq!(seen, sorted);
    for n in &names {
        assert!(seen.contains(n), "{n} missing from {seen:?}");
    }
    // The command line reads every page.
    let (ok, out, err) = ferry_cli(&node, &["queue", "list", "-o", "json"])?;
    assert!(ok, "{err}");
    assert_eq!(out.lines().count(), seen.len());
    Ok(())
}
