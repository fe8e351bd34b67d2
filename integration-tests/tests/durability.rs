//! Persist, then reply: every send the server confirmed survives `kill -9`.

#![allow(clippy::unwrap_used)]

use std::collections::HashSet;

use ferry_client::{AckMode, Message, ReceiveOptions};
use ferry_integration_tests::{create_queue, stats, Node, NodeOptions};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_confirmed_messages_survive_kill_9_exactly_once() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let mut node = Node::start(dir.path(), NodeOptions::default())?;
    let client = node.client().await?;
    create_queue(&client, "durable").await?;
    let conn = client.open_connection("producer").await?;
    let session = conn.create_session(AckMode::Auto).await?;
    let mut sent = HashSet::new();
    // Ten concurrent producers, so group commit shares fsyncs the way it does in production.
    let mut tasks = vec![];
    for p in 0..10 {
        let session = session.clone();
        tasks.push(tokio::spawn(async move {
            let mut ids = vec![];
            for batch in 0..10 {
                let msgs = (0..100)
                    .map(|i| Message::text(format!("p{p}-b{batch}-m{i}")))
                    .collect();
                ids.extend(session.send("durable", msgs).await?);
            }
            anyhow::Ok(ids)
        }));
    }
    for t in tasks {
        for id in t.await?? {
            assert!(sent.insert(id), "message ids are unique");
        }
    }
    assert_eq!(sent.len(), 10_000);

    // Every send above was confirmed; now the node dies without a chance to flush anything.
    node.kill9();
    node.restart()?;
    let client = node.client().await?;
    assert_eq!(stats(&client, "durable").await?.ready, 10_000);
    let conn = client.open_connection("consumer").await?;
    let session = conn.create_session(AckMode::Auto).await?;
    let mut received = HashSet::new();
    let mut bodies = HashSet::new();
    loop {
        let batch = session
            .receive("durable", ReceiveOptions::no_wait().max(1_000))
            .await?;
        if batch.is_empty() {
            break;
        }
        for r in batch {
            assert!(
                received.insert(r.message_id().to_string()),
                "duplicate delivery of {}",
                r.message_id()
            );
            assert!(bodies.insert(r.body().to_vec()));
            assert!(!r.redelivered(), "nothing was delivered before the crash");
        }
    }
    assert_eq!(received, sent, "every confirmed message, and nothing else");
    let s = stats(&client, "durable").await?;
    assert_eq!((s.ready, s.leased), (0, 0));
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delivery_count_and_unacked_messages_survive_a_crash() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let mut node = Node::start(dir.path(), NodeOptions::default())?;
    let client = node.client().await?;
    create_queue(&client, "q").await?;
    let conn = client.open_connection("t").await?;
    let session = conn.create_session(AckMode::Client).await?;
    let id = session
        .send("q", vec![Message::text("once")])
        .await?
        .remove(0);
    let got = session.receive("q", ReceiveOptions::no_wait()).await?;
    assert_eq!(
        (got[0].message_id(), got[0].delivery_count()),
        (id.as_str(), 1)
    );
    // Delivered, never acknowledged, then the node crashes.
    node.kill9();
    node.restart()?;
    let client = node.client().await?;
    let conn = client.open_connection("t").await?;
    let session = conn.create_session(AckMode::Client).await?;
    let again = session.receive("q", ReceiveOptions::no_wait()).await?;
    assert_eq!(again[0].message_id(), id);
    assert_eq!(again[0].delivery_count(), 2);
    assert!(
        again[0].redelivered(),
        "it may have been seen before the crash"
    );
    session.ack(&again).await?;
    // Message ids never repeat after a restart.
    let next = session
        .send("q", vec![Message::text("after")])
        .await?
        .remove(0);
    assert_ne!(next, id);
    Ok(())
}

// The test above kills the node only after every write finished. This one kills it while
// producers are mid-send, each send followed at once by a repeat of its dedup id (postmortem: a
// repeat was confirmed before the first send was durable, and a kill -9 right after its OK lost
// the message): every send confirmed before the kill is received after the restart, once.
// (kill -9 keeps the page cache, so a missing fsync would still pass; the fault harness's
// simulated disk covers that.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sends_confirmed_while_the_node_is_killed_mid_flight_all_survive() -> anyhow::Result<()> {
    use std::sync::{Arc, Mutex};
    const PRODUCERS: usize = 8;
    const CONFIRMED_BEFORE_KILL: usize = 3_000;
    let dir = tempfile::tempdir()?;
    let mut node = Node::start(dir.path(), NodeOptions::default())?;
    let client = node.client().await?;
    create_queue(&client, "inflight").await?;
    let conn = client.open_connection("producer").await?;
    let confirmed: Arc<Mutex<Vec<(String, String)>>> = Arc::default();
    let (count_tx, mut count_rx) = tokio::sync::watch::channel(0usize);
    let count_tx = Arc::new(count_tx);
    let mut producers = vec![];
    for p in 0..PRODUCERS {
        let session = conn.create_session(AckMode::Auto).await?;
        let (confirmed, count_tx) = (confirmed.clone(), count_tx.clone());
        producers.push(tokio::spawn(async move {
            // Bounded: the kill ends it long before.
            for i in 0..1_000_000u64 {
                let key = format!("p{p}-{i}");
                let m = || Message::text(key.clone()).dedup_id(key.clone());
                let first = session.send_async("inflight", vec![m()]);
                let repeat = session.send_async("inflight", vec![m()]);
                let (first, repeat) = tokio::join!(first, repeat);
                let mut ok = false;
                for ids in [first, repeat].into_iter().flatten() {
                    confirmed
                        .lock()
                        .unwrap()
                        .push((key.clone(), ids[0].clone()));
                    ok = true;
                }
                count_tx.send_modify(|n| *n += 1);
                if !ok {
                    return;
                }
            }
        }));
    }
    tokio::time::timeout(
        std::time::Duration::from_secs(120),
        count_rx.wait_for(|n| *n >= CONFIRMED_BEFORE_KILL),
    )
    .await??;
    // Producers are still sending: some writes are on their way as the process dies.
    node.kill9();
    for p in producers {
        p.await?;
    }
    let confirmed = confirmed.lock().unwrap().clone();
    node.restart()?;
    let client = node.client().await?;
    let conn = client.open_connection("consumer").await?;
    let session = conn.create_session(AckMode::Auto).await?;
    let mut received = std::collections::HashMap::new();
    loop {
        let batch = session
            .receive("inflight", ReceiveOptions::no_wait().max(1_000))
            .await?;
        if batch.is_empty() {
            break;
        }
        for r in batch {
            let body = String::from_utf8(r.body().to_vec())?;
            let earlier = received.insert(body.clone(), r.message_id().to_string());
            assert!(
                earlier.is_none(),
                "{body} stored twice despite its dedup id"
            );
        }
    }
    assert!(confirmed.len() >= CONFIRMED_BEFORE_KILL);
    for (key, id) in &confirmed {
        assert_eq!(
            received.get(key),
            Some(id),
            "{key} was confirmed as {id} before the kill and is not in the queue after it"
        );
    }
    Ok(())
}
