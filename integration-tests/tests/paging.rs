//! Queues far larger than memory, through a real `ferry server` process.
//!
//! The ActiveMQ 5.1 story must never repeat: a queue of 200 000 persistent messages behind a
//! memory budget that holds a few thousand, consumers (client acknowledge, selectors on a
//! property) connecting and disconnecting every few hundred milliseconds, some killed abruptly
//! (`ferry receive` processes killed with SIGKILL, connections dropped without a word). In the end
//! every message was acknowledged exactly once, no message was delivered twice without the
//! redelivered flag, and the queue is empty.

#![allow(clippy::unwrap_used)]

use std::collections::{HashMap, HashSet};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ferry_client::{pb, AckMode, Client, Message, ReceiveOptions, Received};
use ferry_integration_tests::{create_queue, ferry_bin, stats, Node, NodeOptions};

const MESSAGES: u64 = 200_000;
const QUEUE: &str = "churn";

/// A budget of 256 KiB: about four thousand 60-byte messages fit in memory.
const CONFIG: &str = "
[paging]
queue_memory_budget_bytes = 262144
node_memory_budget_bytes = 262144

[limits]
connection_lease_default_ms = 5000
";

#[derive(Default)]
struct Ledger {
    /// Acknowledged (the server said yes), by message id.
    acked: HashMap<String, u32>,
    /// First deliveries (not flagged redelivered), by message id.
    first: HashMap<String, u32>,
    deliveries: u64,
}

impl Ledger {
    fn delivered(&mut self, id: &str, redelivered: bool) {
        self.deliveries += 1;
        if !redelivered {
            *self.first.entry(id.to_string()).or_default() += 1;
        }
    }

    fn acked(&mut self, got: &[Received]) {
        for r in got {
            *self.acked.entry(r.message_id().to_string()).or_default() += 1;
        }
    }
}

/// A node with the small paging budget of [`CONFIG`], its data under `dir`.
fn paged_node(dir: &std::path::Path) -> anyhow::Result<Node> {
    Node::start(
        dir,
        NodeOptions {
            extra_toml: CONFIG.into(),
            ..NodeOptions::default()
        },
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn consumers_churning_over_a_paged_queue_lose_and_duplicate_nothing() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let node = paged_node(dir.path())?;
    let client = node.client().await?;
    // Redelivered as often as it takes: churning consumers give some messages back many times,
    // and this test is about none being lost (the dead-letter rule has tests of its own).
    client
        .admin()
        .create_queue(pb::CreateQueueRequest {
            replicas: 0,
            own_shard: false,
            name: QUEUE.into(),
            config: Some(pb::QueueConfig {
                redelivery: Some(pb::RedeliveryPolicy {
                    unlimited_redeliveries: true,
                    ..Default::default()
                }),
                ..Default::default()
            }),
            if_not_exists: false,
            node: String::new(),
        })
        .await?;

    // Producers: four sessions sending in batches while the consumers churn.
    let mut producers = vec![];
    for p in 0..4u64 {
        let client = client.clone();
        producers.push(tokio::spawn(async move {
            let conn = client.open_connection(&format!("producer-{p}")).await?;
            let session = conn.create_session(AckMode::Auto).await?;
            for batch in 0..(MESSAGES / 4 / 500) {
                let msgs = (0..500)
                    .map(|i| {
                        let n = p * (MESSAGES / 4) + batch * 500 + i;
                        // About 60 bytes: some four thousand fit in the budget.
                        Message::text(format!("m{n:<50}")).property("k", (n % 10) as i32)
                    })
                    .collect();
                session.send(QUEUE, msgs).await?;
            }
            conn.close().await?;
            anyhow::Ok(())
        }));
    }

    let ledger = Arc::new(Mutex::new(Ledger::default()));
    let started = Instant::now();
    let mut round = 0u64;
    let mut paged_out_seen = 0u64;
    let (mut last_acked, mut progress_at) = (0, Instant::now());
    loop {
        let s = stats(&client, QUEUE).await?;
        paged_out_seen = paged_out_seen.max(s.paged_out);
        let acked = ledger.lock().unwrap().acked.len() as u64;
        if acked >= MESSAGES {
            break;
        }
        if acked > last_acked {
            (last_acked, progress_at) = (acked, Instant::now());
        }
        assert!(
            progress_at.elapsed() < Duration::from_secs(30),
            "stalled: {acked} of {MESSAGES} acknowledged; queue {s:?}"
        );
        round += 1;
        // Three consumers at a time, each living a few hundred milliseconds.
        let mut tasks = vec![];
        for c in 0..3u64 {
            let kind = (round * 3 + c) % 6;
            let client = client.clone();
            let ledger = Arc::clone(&ledger);
            let node_url = node.url();
            tasks.push(tokio::spawn(async move {
                consume(kind, round, &client, &node_url, &ledger).await
            }));
        }
        for t in tasks {
            tokio::time::timeout(Duration::from_secs(20), t)
                .await
                .map_err(|_| anyhow::anyhow!("a consumer hung (round {round})"))???;
        }
    }
    for p in producers {
        p.await??;
    }

    let s = stats(&client, QUEUE).await?;
    let ledger = std::mem::take(&mut *ledger.lock().unwrap());
    let twice: Vec<_> = ledger.acked.iter().filter(|(_, &n)| n > 1).collect();
    assert!(twice.is_empty(), "acknowledged more than once: {twice:?}");
    let unflagged: Vec<_> = ledger.first.iter().filter(|(_, &n)| n > 1).collect();
    assert!(
        unflagged.is_empty(),
        "delivered again without the redelivered flag: {unflagged:?}"
    );
    assert_eq!(ledger.acked.len() as u64, MESSAGES);
    assert!(
        ledger.deliveries > MESSAGES,
        "some deliveries were given back and redelivered ({} deliveries)",
        ledger.deliveries
    );
    assert!(
        paged_out_seen > MESSAGES / 2,
        "the queue was paged out (at most {paged_out_seen} messages in the store only)"
    );
    // Nothing is left, in memory or in the store.
    assert_eq!((s.ready, s.scheduled, s.leased, s.paged_out), (0, 0, 0, 0));
    eprintln!(
        "{MESSAGES} messages, {} deliveries, {round} rounds of consumers, {:.1} s",
        ledger.deliveries,
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

/// One consumer's short life.
async fn consume(
    kind: u64,
    round: u64,
    client: &Client,
    node_url: &str,
    ledger: &Mutex<Ledger>,
) -> anyhow::Result<()> {
    let life = Duration::from_millis(200 + (round * 37 % 200));
    match kind {
        // A `ferry receive` process that never acknowledges, killed with SIGKILL mid-flight:
        // what it was given comes back when its connection lease runs out.
        0 => {
            let mut child = Command::new(ferry_bin())
                .args([
                    "receive",
                    "--server",
                    node_url,
                    "--queue",
                    QUEUE,
                    "--count",
                    "1000000",
                    "--timeout-ms",
                    "100",
                    "--ack",
                    "none",
                    "-o",
                    "json",
                ])
                .stdout(Stdio::piped())
                .stderr(Stdio::null())
                .spawn()?;
            tokio::time::sleep(life).await;
            child.kill()?;
            let out = child.wait_with_output()?;
            let mut ledger = ledger.lock().unwrap();
            for line in String::from_utf8_lossy(&out.stdout).lines() {
                let Ok(v) = serde_json::from_str::<serde_json::Value>(line) else {
                    continue; // a line cut short by the kill
                };
                ledger.delivered(
                    v["message_id"].as_str().unwrap_or_default(),
                    v["redelivered"].as_bool().unwrap_or(false),
                );
            }
        }
        // Client acknowledge, with a selector on a property or none; closes politely (what it
        // did not acknowledge comes back at once) or is dropped without a word.
        _ => {
            let conn = client
                .open_connection(&format!("consumer-{round}-{kind}"))
                .await?;
            let session = conn.create_session(AckMode::Client).await?;
            let selector = kind
                .is_multiple_of(2)
                .then(|| format!("k = {}", round % 10));
            let deadline = Instant::now() + life;
            // Client acknowledge covers everything the session received, so the batch left
            // unacknowledged (every other consumer leaves one) is its last.
            let leave_one = (round + kind).is_multiple_of(2);
            loop {
                let opts = ReceiveOptions::timeout_ms(100).max(200);
                let got = match &selector {
                    Some(s) => session.receive_selected(QUEUE, s, opts).await?,
                    None => session.receive(QUEUE, opts).await?,
                };
                {
                    let mut ledger = ledger.lock().unwrap();
                    for r in &got {
                        ledger.delivered(r.message_id(), r.redelivered());
                    }
                }
                let last = Instant::now() >= deadline;
                if !got.is_empty() && (!last || !leave_one) {
                    session.ack(&got).await?;
                    ledger.lock().unwrap().acked(&got);
                }
                if last {
                    break;
                }
            }
            if kind == 5 {
                drop(conn);
            } else {
                conn.close().await?;
            }
        }
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paged_queue_recovers_without_loading_its_messages_and_keeps_its_order(
) -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let mut node = paged_node(dir.path())?;
    let client = node.client().await?;
    create_queue(&client, "big").await?;
    let conn = client.open_connection("producer").await?;
    let session = conn.create_session(AckMode::Auto).await?;
    let mut want = vec![];
    for batch in 0..40u64 {
        let msgs: Vec<Message> = (0..500)
            .map(|i| {
                let n = batch * 500 + i;
                // 200-byte bodies: 4 MB in all, 16 times the budget.
                let m = Message::text(format!("m{n:<199}"));
                // One in a hundred is urgent; one request waits behind everything.
                if n % 100 == 7 {
                    m.priority(8)
                } else if n == 19_999 {
                    m.correlation_id("the-reply")
                } else {
                    m
                }
            })
            .collect();
        want.extend(session.send("big", msgs).await?);
    }
    let before = stats(&client, "big").await?;
    assert_eq!(before.ready, 20_000);
    assert!(before.paged_out > 15_000, "{before:?}");

    node.kill9();
    node.restart()?;
    let client = node.client().await?;
    let after = stats(&client, "big").await?;
    assert_eq!(after.ready, 20_000, "counted from the store's counts");
    assert!(
        after.memory_bytes <= 2 * 262_144,
        "recovery loaded at most the window: {after:?}"
    );
    let conn = client.open_connection("consumer").await?;
    let session = conn.create_session(AckMode::Auto).await?;
    // The request's reply is found behind 19 999 others.
    let got = session
        .receive_selected(
            "big",
            "JMSCorrelationID = 'the-reply'",
            ReceiveOptions::no_wait(),
        )
        .await?;
    assert_eq!(got.len(), 1);
    assert_eq!(String::from_utf8_lossy(got[0].body()).trim_end(), "m19999");
    // Then everything else in order: priority 8 first, then the rest oldest first.
    let mut bodies = vec![];
    loop {
        let got = session
            .receive("big", ReceiveOptions::no_wait().max(1_000))
            .await?;
        if got.is_empty() {
            break;
        }
        bodies.extend(
            got.iter()
                .map(|r| String::from_utf8_lossy(r.body()).trim_end().to_string()),
        );
    }
    let urgent = (0..20_000u64).filter(|n| n % 100 == 7);
    let rest = (0..19_999u64).filter(|n| n % 100 != 7);
    let expected: Vec<String> = urgent.chain(rest).map(|n| format!("m{n}")).collect();
    assert_eq!(bodies.len(), expected.len());
    if let Some(i) = (0..bodies.len()).find(|&i| bodies[i] != expected[i]) {
        panic!(
            "order differs after a restart at {i}: got {:?}, expected {:?}",
            &bodies[i..(i + 5).min(bodies.len())],
            &expected[i..(i + 5).min(expected.len())]
        );
    }
    let unique: HashSet<_> = bodies.iter().collect();
    assert_eq!(unique.len(), bodies.len());
    assert_eq!(want.len(), 20_000);
    Ok(())
}
