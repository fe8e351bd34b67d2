//! JMS semantics through real processes and the Rust client: the redelivery policy and the
//! dead-letter queue, expiry, rejection, transacted sessions, message groups and producer dedup.

#![allow(clippy::unwrap_used)]

use std::collections::BTreeSet;
use std::time::Duration;

use anyhow::Context;
use ferry_client::{pb, AckMode, Client, Message, ReceiveOptions, Received};
use ferry_integration_tests::{
    create_queue, ferry_cli, memory_node, stats, wait_until, Node, NodeOptions,
};
use tonic::Code;

async fn create_with(client: &Client, name: &str, config: pb::QueueConfig) -> anyhow::Result<()> {
    client
        .admin()
        .create_queue(pb::CreateQueueRequest {
            replicas: 0,
            own_shard: false,
            name: name.into(),
            config: Some(config),
            if_not_exists: false,
            node: String::new(),
        })
        .await?;
    Ok(())
}

fn prop<'a>(r: &'a Received, name: &str) -> Option<&'a pb::property_value::Value> {
    r.properties().get(name).and_then(|v| v.value.as_ref())
}

fn text(r: &Received) -> String {
    String::from_utf8_lossy(r.body()).into_owned()
}

/// A poison message is delivered exactly 1 + max_redeliveries times, each redelivery scheduled
/// after the policy's delay (exponential, capped) and delivered no sooner, by the broker's own
/// timestamps; then it waits in `<queue>.DLQ` with why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_poison_message_ends_in_the_dead_letter_queue_after_the_configured_deliveries(
) -> anyhow::Result<()> {
    let (_dir, _node, client) = memory_node(&[]).await?;
    create_with(
        &client,
        "work",
        pb::QueueConfig {
            redelivery: Some(pb::RedeliveryPolicy {
                max_redeliveries: Some(3),
                initial_delay_ms: Some(200),
                delay_ms: Some(200),
                exponential_backoff: Some(true),
                backoff_multiplier: Some(2.0),
                max_delay_ms: Some(500),
                ..Default::default()
            }),
            ..Default::default()
        },
    )
    .await?;
    let conn = client.open_connection("poison").await?;
    let session = conn.create_session(AckMode::Individual).await?;
    let ids = session
        .send("work", vec![Message::text("poison").property("kind", 7)])
        .await?;

    let mut seen = Vec::new();
    for n in 1..=4u32 {
        let got = session
            .receive("work", ReceiveOptions::timeout_ms(10_000))
            .await?;
        assert_eq!(got.len(), 1, "delivery {n} arrives");
        assert_eq!(got[0].delivery_count(), n);
        assert_eq!(got[0].redelivered(), n > 1);
        seen.push(got[0].message_id().to_string());
        session.nack(&got, None).await?;
    }
    assert!(seen.iter().all(|id| *id == ids[0]));

    // The delays as the broker applied them, from its own history of the message rather than
    // from a clock around our calls (whose slack could never see a missing cap): each nack's
    // scheduled redelivery to the millisecond, and each redelivery no sooner than scheduled.
    let steps = client
        .admin()
        .get_message_history(pb::GetMessageHistoryRequest {
            message_id: ids[0].clone(),
        })
        .await?
        .into_inner()
        .steps;
    let of = |event: &str| -> Vec<&pb::HistoryStep> {
        steps.iter().filter(|s| s.event == event).collect()
    };
    let (returned, delivered) = (of("returned"), of("delivered"));
    assert_eq!((returned.len(), delivered.len()), (3, 4), "{steps:#?}");
    let expected_delays_ms = [200u64, 400, 500]; // 200, 200×2, 200×4 = 800 capped at 500
    for (i, want) in expected_delays_ms.into_iter().enumerate() {
        let (back, again) = (returned[i], delivered[i + 1]);
        let due = back
            .deliver_at_ms
            .with_context(|| format!("nack {} names no redelivery time: {back:?}", i + 1))?;
        let scheduled_ms = due.saturating_sub(back.at_ms);
        assert_eq!(
            scheduled_ms,
            want,
            "redelivery {} scheduled {scheduled_ms} ms after its nack, not the policy's {want} ms: \
             {steps:#?}",
            i + 2,
        );
        assert!(
            again.at_ms >= due,
            "redelivery {} came at {}, before its time {due}: {steps:#?}",
            i + 2,
            again.at_ms
        );
    }

    // Never a fifth delivery: the message moves to the dead-letter queue (created on demand,
    // just after the nack is answered), with why and from where.
    wait_until(
        Duration::from_secs(10),
        "the dead letter to arrive",
        || async { Ok(stats(&client, "work.DLQ").await.is_ok_and(|s| s.ready == 1)) },
    )
    .await?;
    assert_eq!(
        stats(&client, "work").await?.ready,
        0,
        "and is gone from its queue"
    );
    let dlq = session
        .receive("work.DLQ", ReceiveOptions::timeout_ms(10_000))
        .await?;
    assert_eq!(dlq.len(), 1);
    let d = &dlq[0];
    assert_eq!(text(d), "poison");
    use pb::property_value::Value;
    assert_eq!(
        prop(d, "FerryDeadLetterReason"),
        Some(&Value::StringValue("max-deliveries".into()))
    );
    assert_eq!(
        prop(d, "FerryOriginalQueue"),
        Some(&Value::StringValue("work".into()))
    );
    assert_eq!(
        prop(d, "FerryOriginalMessageId"),
        Some(&Value::StringValue(ids[0].clone()))
    );
    assert_eq!(prop(d, "FerryDeliveryCount"), Some(&Value::LongValue(4)));
    assert_eq!(
        prop(d, "kind"),
        Some(&Value::IntValue(7)),
        "its own properties stay"
    );
    session.ack(&dlq).await?;
    let s = stats(&client, "work").await?;
    assert_eq!(s.ready + s.scheduled + s.leased, 0);
    assert_eq!(s.dead_lettered_max_deliveries_total, 1);
    assert_eq!(stats(&client, "work.DLQ").await?.owner_node, s.owner_node);
    Ok(())
}

/// Expired messages and rejected ones go to the dead-letter queue too, with their reason; a
/// queue may discard expired messages instead (counted).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expired_and_rejected_messages_are_dead_lettered_with_their_reason() -> anyhow::Result<()> {
    let (_dir, node, client) = memory_node(&["orders"]).await?;
    create_with(
        &client,
        "quotes",
        pb::QueueConfig {
            expiry: Some(pb::DeadLetterTarget {
                target: Some(pb::dead_letter_target::Target::Discard(true)),
            }),
            ..Default::default()
        },
    )
    .await?;
    let conn = client.open_connection("t").await?;
    let session = conn.create_session(AckMode::Individual).await?;
    session
        .send(
            "orders",
            vec![Message::text("stale").ttl_ms(50), Message::text("fresh")],
        )
        .await?;
    session
        .send("quotes", vec![Message::text("old quote").ttl_ms(50)])
        .await?;
    // Nobody receives: the server moves the expired message on its own, on time.
    wait_until(
        Duration::from_secs(10),
        "the expired message to move",
        || async {
            Ok(stats(&client, "orders.DLQ")
                .await
                .is_ok_and(|s| s.ready == 1))
        },
    )
    .await?;
    let got = session
        .receive("orders.DLQ", ReceiveOptions::no_wait())
        .await?;
    assert_eq!(text(&got[0]), "stale");
    assert_eq!(
        prop(&got[0], "FerryDeadLetterReason"),
        Some(&pb::property_value::Value::StringValue("expired".into()))
    );
    session.ack(&got).await?;
    wait_until(Duration::from_secs(10), "the quote to expire", || async {
        Ok(stats(&client, "quotes").await?.expired_total == 1)
    })
    .await?;
    assert_eq!(stats(&client, "quotes").await?.ready, 0);
    // Its dead-letter queue was created with it, and got nothing: discarded, not moved.
    assert_eq!(stats(&client, "quotes.DLQ").await?.sent_total, 0);

    // A consumer rejects a message: no redelivery, straight to the DLQ.
    let (ok, out, err) = ferry_cli(
        &node,
        &[
            "receive",
            "--queue",
            "orders",
            "--ack",
            "reject",
            "--timeout-ms",
            "5000",
        ],
    )?;
    assert!(ok, "{err}");
    assert!(out.contains("fresh"), "{out}");
    let got = session
        .receive("orders.DLQ", ReceiveOptions::timeout_ms(5_000))
        .await?;
    assert_eq!(text(&got[0]), "fresh");
    assert_eq!(
        prop(&got[0], "FerryDeadLetterReason"),
        Some(&pb::property_value::Value::StringValue("rejected".into()))
    );
    assert_eq!(
        stats(&client, "orders").await?.dead_lettered_rejected_total,
        1
    );
    Ok(())
}

/// A transacted consume-and-produce loop with rollbacks: every input produces exactly one
/// output, none is lost or duplicated, and nothing is visible before its commit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transacted_consume_and_produce_loop_with_rollbacks_loses_and_duplicates_nothing(
) -> anyhow::Result<()> {
    const N: usize = 150;
    let (_dir, _node, client) = memory_node(&["in", "out"]).await?;
    let conn = client.open_connection("tx").await?;
    let producer = conn.create_session(AckMode::Auto).await?;
    let inputs: Vec<Message> = (0..N).map(|i| Message::text(format!("m{i}"))).collect();
    producer.send("in", inputs).await?;
    let tx = conn.create_session(AckMode::Transacted).await?;
    let (mut commits, mut rollbacks, mut step) = (0, 0, 0u64);
    let mut committed = 0u64;
    loop {
        let got = tx.receive("in", ReceiveOptions::no_wait().max(3)).await?;
        if got.is_empty() {
            break;
        }
        let outs: Vec<Message> = got
            .iter()
            .map(|r| Message::text(format!("done {}", text(r))))
            .collect();
        tx.send("out", outs).await?;
        // Staged: invisible to everyone until the commit.
        let out = stats(&client, "out").await?;
        assert_eq!(out.ready, committed, "only committed sends are visible");
        assert_eq!(out.staged, got.len() as u64);
        step += 1;
        if step % 4 == 0 {
            let back = tx.rollback().await?;
            assert_eq!(back as usize, got.len(), "everything received comes back");
            rollbacks += 1;
        } else {
            tx.commit().await?;
            committed += got.len() as u64;
            commits += 1;
        }
    }
    assert!(rollbacks > 0 && commits > 0);
    let observer = conn.create_session(AckMode::Individual).await?;
    let mut bodies = BTreeSet::new();
    let mut total = 0;
    loop {
        let got = observer
            .receive("out", ReceiveOptions::no_wait().max(100))
            .await?;
        if got.is_empty() {
            break;
        }
        observer.ack(&got).await?;
        total += got.len();
        bodies.extend(got.iter().map(text));
    }
    assert_eq!(total, N, "one output per input, no duplicate");
    let want: BTreeSet<String> = (0..N).map(|i| format!("done m{i}")).collect();
    assert_eq!(bodies, want);
    let s = stats(&client, "in").await?;
    assert_eq!((s.ready, s.leased, s.scheduled), (0, 0, 0));
    assert!(
        s.redelivered_total > 0,
        "rolled-back messages were redelivered"
    );
    assert_eq!(stats(&client, "out").await?.staged, 0);
    Ok(())
}

/// Closing a transacted session without commit drops its staged sends and returns what it
/// received; a commit whose delivery lease ran out is rolled back (ABORTED) as a whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn uncommitted_work_is_undone_when_the_session_closes_or_the_commit_fails(
) -> anyhow::Result<()> {
    let (_dir, _node, client) = memory_node(&["in", "out"]).await?;
    let conn = client.open_connection("tx").await?;
    let producer = conn.create_session(AckMode::Auto).await?;
    producer
        .send("in", vec![Message::text("a"), Message::text("b")])
        .await?;

    let tx = conn.create_session(AckMode::Transacted).await?;
    let got = tx.receive("in", ReceiveOptions::no_wait()).await?;
    assert_eq!(got.len(), 1);
    tx.send("out", vec![Message::text("never")]).await?;
    assert_eq!(stats(&client, "out").await?.staged, 1);
    assert_eq!(tx.close().await?, 1, "the received message comes back");
    let s = stats(&client, "out").await?;
    assert_eq!((s.ready, s.staged), (0, 0), "the staged send is gone");
    assert_eq!(stats(&client, "in").await?.ready, 2);

    // A short lease runs out before the commit: the commit fails whole and nothing is sent.
    let tx = conn.create_session(AckMode::Transacted).await?;
    let opts = ReceiveOptions {
        lease_ms: Some(100),
        ..ReceiveOptions::no_wait()
    };
    let got = tx.receive("in", opts).await?;
    assert_eq!(got.len(), 1);
    tx.send("out", vec![Message::text("too late")]).await?;
    wait_until(Duration::from_secs(10), "the lease to run out", || async {
        Ok(stats(&client, "in").await?.leased == 0)
    })
    .await?;
    let e = tx.commit().await.unwrap_err();
    assert_eq!(e.code(), Some(Code::Aborted), "{e}");
    assert!(e.to_string().contains("rolled back"), "{e}");
    let s = stats(&client, "out").await?;
    assert_eq!((s.ready, s.staged), (0, 0));
    // The session goes on: the next transaction commits.
    let got = tx.receive("in", ReceiveOptions::no_wait().max(5)).await?;
    assert_eq!(got.len(), 2);
    tx.commit().await?;
    assert_eq!(stats(&client, "in").await?.ready, 0);
    Ok(())
}

/// A transaction spans the queues of one back-end; touching a second says so plainly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transaction_touching_two_back_ends_is_refused_clearly() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let cluster =
        ferry_integration_tests::cluster::Cluster::start_with(dir.path(), &["a", "b"], true, "")?;
    cluster
        .wait_leader(&["a", "b"], std::time::Duration::from_secs(20))
        .await?;
    let a = cluster.node("a");
    let client = a.client().await?;
    ferry_integration_tests::cluster::create_queue_on(&client, "local", Some("a")).await?;
    ferry_integration_tests::cluster::create_queue_on(&client, "remote", Some("b")).await?;
    let conn = client.open_connection("tx").await?;
    let tx = conn.create_session(AckMode::Transacted).await?;
    tx.send("local", vec![Message::text("here")]).await?;
    let e = tx
        .send("remote", vec![Message::text("there")])
        .await
        .unwrap_err();
    assert_eq!(e.code(), Some(Code::FailedPrecondition), "{e}");
    assert!(e.to_string().contains("one back-end"), "{e}");
    // The transaction is intact: it commits what it holds.
    tx.commit().await?;
    assert_eq!(stats(&client, "local").await?.ready, 1);
    assert_eq!(stats(&client, "remote").await?.ready, 0);
    // A transaction on the remote back-end alone works through this node.
    tx.send("remote", vec![Message::text("there")]).await?;
    tx.commit().await?;
    assert_eq!(stats(&client, "remote").await?.ready, 1);

    // Dead letters move within one back-end: a queue pinned away from its dead-letter target
    // is refused up front, and one left to the placement rule goes where its target is.
    let jobs = |node: &str| pb::CreateQueueRequest {
        replicas: 0,
        own_shard: false,
        name: "jobs".into(),
        config: Some(pb::QueueConfig {
            dead_letter: Some(pb::DeadLetterTarget {
                target: Some(pb::dead_letter_target::Target::Queue("remote".into())),
            }),
            ..Default::default()
        }),
        if_not_exists: false,
        node: node.into(),
    };
    let e = client.admin().create_queue(jobs("a")).await.unwrap_err();
    assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
    assert!(e.message().contains("lives on node b"), "{e:?}");
    let placed = client.admin().create_queue(jobs("")).await?.into_inner();
    assert_eq!(placed.queue.map(|q| q.owner_node).as_deref(), Some("b"));
    // `remote.DLQ` goes where `remote` is.
    let conn_b = client.open_connection("reject").await?;
    let s = conn_b.create_session(AckMode::Individual).await?;
    let got = s.receive("remote", ReceiveOptions::no_wait()).await?;
    s.reject(&got, "test").await?;
    wait_until(
        Duration::from_secs(10),
        "the rejected message to move",
        || async {
            Ok(stats(&client, "remote.DLQ")
                .await
                .is_ok_and(|q| q.ready == 1))
        },
    )
    .await?;
    assert_eq!(stats(&client, "remote.DLQ").await?.owner_node, "b");
    Ok(())
}

/// Message groups: a group's messages go to one session at a time, in order; when that session
/// closes, the group moves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_group_sticks_to_one_consumer_and_moves_when_it_leaves() -> anyhow::Result<()> {
    let (_dir, _node, client) = memory_node(&["g"]).await?;
    let conn = client.open_connection("groups").await?;
    let producer = conn.create_session(AckMode::Auto).await?;
    let mut batch = Vec::new();
    for i in 0..4 {
        batch.push(Message::text(format!("A{i}")).group_id("A"));
        batch.push(Message::text(format!("B{i}")).group_id("B"));
    }
    producer.send("g", batch).await?;
    let one = conn.create_session(AckMode::Individual).await?;
    let two = conn.create_session(AckMode::Individual).await?;
    let first = one.receive("g", ReceiveOptions::no_wait()).await?;
    assert_eq!(text(&first[0]), "A0");
    let other = two.receive("g", ReceiveOptions::no_wait().max(10)).await?;
    let names: Vec<String> = other.iter().map(text).collect();
    assert_eq!(names, ["B0", "B1", "B2", "B3"], "group A is session one's");
    two.ack(&other).await?;
    let more = one.receive("g", ReceiveOptions::no_wait().max(10)).await?;
    assert_eq!(
        more.iter().map(text).collect::<Vec<_>>(),
        ["A1", "A2", "A3"]
    );
    one.ack(&more[..1]).await?;
    // Session one goes away holding A0, A2, A3: they move to session two, in order.
    one.close().await?;
    let moved = two.receive("g", ReceiveOptions::no_wait().max(10)).await?;
    assert_eq!(
        moved.iter().map(text).collect::<Vec<_>>(),
        ["A0", "A2", "A3"]
    );
    assert!(moved.iter().all(Received::redelivered));
    Ok(())
}

/// A repeated producer dedup id returns the first message id and stores nothing new, also
/// after a restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_repeated_dedup_id_stores_nothing_new_even_after_a_restart() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let mut node = Node::start(dir.path(), NodeOptions::default())?;
    let client = node.client().await?;
    create_queue(&client, "payments").await?;
    let session = client
        .open_connection("p")
        .await?
        .create_session(AckMode::Auto)
        .await?;
    let first = session
        .send(
            "payments",
            vec![Message::text("pay 5").dedup_id("order-17")],
        )
        .await?;
    let again = session
        .send(
            "payments",
            vec![Message::text("pay 5").dedup_id("order-17")],
        )
        .await?;
    assert_eq!(first, again);
    assert_eq!(stats(&client, "payments").await?.ready, 1);
    drop(session);
    node.restart()?;
    let client = node.client().await?;
    let session = client
        .open_connection("p")
        .await?
        .create_session(AckMode::Auto)
        .await?;
    let after = session
        .send(
            "payments",
            vec![
                Message::text("pay 5").dedup_id("order-17"),
                Message::text("pay 6").dedup_id("order-18"),
            ],
        )
        .await?;
    assert_eq!(after[0], first[0], "remembered across the restart");
    assert_ne!(after[1], first[0]);
    assert_eq!(stats(&client, "payments").await?.ready, 2);
    Ok(())
}

/// A consumer's heartbeats renew the leases of what it holds, and only while they come: the
/// message stays leased to the consumer a whole lease past the point its first lease ran out, and
/// once the heartbeats stop it expires one lease after the last of them and is redelivered. Every
/// time compared is the server's (a heartbeat answer carries the connection's new expiry, a
/// delivery its lease's); the redelivery is waited for by a receive parked at the server, not a
/// sleep. The connection lease running out is `sessions.rs`' business: here it outlasts the test.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn heartbeats_renew_delivery_leases_until_they_stop() -> anyhow::Result<()> {
    const LEASE_MS: u64 = 1_500;
    let (_dir, _node, client) = memory_node(&["q"]).await?;
    let mut messaging = client.messaging();
    // A connection of the raw API: no heartbeats but the test's own.
    let opened = messaging
        .open_connection(pb::OpenConnectionRequest {
            client_id: "slow-worker".into(),
            lease_ms: Some(120_000),
        })
        .await?
        .into_inner();
    let connection_lease_ms = opened.lease_ms;
    let session_id = messaging
        .create_session(pb::CreateSessionRequest {
            connection_id: opened.connection_id.clone(),
            ack_mode: AckMode::Individual as i32,
        })
        .await?
        .into_inner()
        .session_id;
    let producer = client.open_connection("producer").await?;
    let sent = producer
        .create_session(AckMode::Auto)
        .await?
        .send("q", vec![Message::text("long job")])
        .await?;
    let mut got = messaging
        .receive(pb::ReceiveRequest {
            session_id: session_id.clone(),
            queue: "q".into(),
            selector: String::new(),
            max_messages: 1,
            wait_ms: Some(0),
            lease_ms: Some(LEASE_MS),
        })
        .await?
        .into_inner()
        .deliveries;
    assert_eq!(got.len(), 1);
    let first = got.remove(0);
    let first_expiry_ms = first.lease_expires_at_ms;

    // Heartbeats every 100 ms (the consumer's pace, not a wait for anything), each followed by a
    // look at the queue, until the server's clock is a whole lease past the first expiry.
    let mut pace = tokio::time::interval(Duration::from_millis(100));
    let last_heartbeat_ms = loop {
        pace.tick().await;
        let connection_expiry_ms = messaging
            .heartbeat(pb::HeartbeatRequest {
                connection_id: opened.connection_id.clone(),
            })
            .await?
            .into_inner()
            .lease_expires_at_ms;
        let server_now_ms = connection_expiry_ms - connection_lease_ms;
        let s = stats(&client, "q").await?;
        assert_eq!(
            (s.leased, s.lease_expired_total),
            (1, 0),
            "held at server time {server_now_ms} ms; its first lease ran out at {first_expiry_ms}"
        );
        if server_now_ms >= first_expiry_ms + LEASE_MS {
            break server_now_ms;
        }
    };

    // The heartbeats stop. A receive parked on another connection gets the message back once its
    // lease, renewed last by the last heartbeat, runs out.
    let other = client
        .open_connection("other")
        .await?
        .create_session(AckMode::Individual)
        .await?;
    let second_lease_ms = 60_000;
    let again = other
        .receive(
            "q",
            ReceiveOptions {
                timeout_ms: Some(10 * LEASE_MS as i64),
                max_messages: 1,
                lease_ms: Some(second_lease_ms),
            },
        )
        .await?;
    let [again] = again.as_slice() else {
        anyhow::bail!("not redelivered within 10 leases of the last heartbeat: {again:?}");
    };
    assert_eq!(again.message_id(), sent[0]);
    assert!(again.redelivered());
    assert_eq!(again.delivery_count(), 2);
    let redelivered_at_ms = again.delivery.lease_expires_at_ms - second_lease_ms;
    assert!(
        redelivered_at_ms >= last_heartbeat_ms + LEASE_MS,
        "redelivered at {redelivered_at_ms} ms, before the lease renewed by the last heartbeat \
         (at {last_heartbeat_ms} ms) ran out"
    );
    let s = stats(&client, "q").await?;
    assert_eq!((s.leased, s.lease_expired_total), (1, 1), "an expiry");
    // The first delivery is over: its handle acknowledges nothing.
    let stale = messaging
        .ack(pb::AckRequest {
            session_id,
            receipt_handles: vec![first.receipt_handle],
        })
        .await
        .expect_err("a stale handle");
    assert_eq!(stale.code(), Code::FailedPrecondition, "{stale:?}");
    other.ack(std::slice::from_ref(again)).await?;
    assert_eq!(stats(&client, "q").await?.acked_total, 1);
    Ok(())
}
