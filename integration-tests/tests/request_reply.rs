//! Field note 4 (request-reply over queues): the reply is matched to its request by correlation
//! id, byte for byte; strays and late replies are discarded and counted, never mistaken.

use std::process::{Command, Stdio};
use std::time::Duration;

use ferry_client::{AckMode, Message, ReceiveOptions, Requestor};
use ferry_integration_tests::{ferry_bin, ferry_cli, memory_node, stats, wait_until};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_gets_its_own_reply_and_strays_are_counted() -> anyhow::Result<()> {
    let (_dir, _node, client) = memory_node(&["svc"]).await?;
    let conn = client.open_connection("requester").await?;
    let mut requestor = Requestor::new(&conn).await?;

    // A stray reply (say, a late answer to an earlier request) is already waiting.
    let other = client
        .open_connection("other")
        .await?
        .create_session(AckMode::Auto)
        .await?;
    other
        .send(
            requestor.reply_queue(),
            vec![Message::text("stale").correlation_id("ID:not-yours")],
        )
        .await?;

    let replier = {
        let session = client
            .open_connection("replier")
            .await?
            .create_session(AckMode::Client)
            .await?;
        tokio::spawn(async move {
            let req = session
                .receive("svc", ReceiveOptions::timeout_ms(10_000))
                .await?;
            let body = format!("re: {}", String::from_utf8_lossy(req[0].body()));
            session.reply(&req[0], Message::text(body)).await?;
            session.ack(&req).await?;
            anyhow::Ok(req[0].message_id().to_string())
        })
    };
    let reply = requestor
        .request("svc", Message::text("ping"), Duration::from_secs(10))
        .await?;
    let request_id = replier.await??;
    let reply = reply.expect("a reply within the timeout");
    assert_eq!(reply.body(), b"re: ping");
    assert_eq!(
        reply.message().correlation_id.as_deref(),
        Some(request_id.as_str())
    );
    assert_eq!(requestor.stale_replies(), 1);

    // Nobody answers: an empty result in time, not an error and not a hang.
    let none = requestor
        .request("svc", Message::text("anyone?"), Duration::from_millis(200))
        .await?;
    assert!(none.is_none());
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ferry_request_and_ferry_reply_talk_to_each_other() -> anyhow::Result<()> {
    let (_dir, node, client) = memory_node(&["svc"]).await?;
    let replier = Command::new(ferry_bin())
        .args([
            "reply",
            "--queue",
            "svc",
            "--count",
            "1",
            "--timeout-ms",
            "20000",
            "-o",
            "json",
            "--server",
        ])
        .arg(node.addr.to_string())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    wait_until(Duration::from_secs(10), "the replier to wait", || async {
        Ok(stats(&client, "svc").await?.consumers == 1)
    })
    .await?;
    let (ok, out, err) = ferry_cli(&node, &["request", "--queue", "svc", "hello", "-o", "json"])?;
    assert!(ok, "{err}");
    let reply: serde_json::Value = serde_json::from_str(out.trim())?;
    assert_eq!(reply["body"], "hello", "the replier echoes the body");
    let out = replier.wait_with_output()?;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let answered: serde_json::Value = serde_json::from_str(String::from_utf8(out.stdout)?.trim())?;
    assert_eq!(
        reply["correlation_id"], answered["request_id"],
        "matched by the request's message id"
    );

    // Without a replier the request says what to do and exits non-zero.
    let (ok, _, err) = ferry_cli(
        &node,
        &["request", "--queue", "svc", "hello", "--timeout-ms", "200"],
    )?;
    assert!(!ok);
    assert!(
        err.contains("no reply within 200 ms") && err.contains("ferry reply"),
        "{err}"
    );
    Ok(())
}

/// 1,000 round trips with a replier that answers some requests late: every reply that arrives in
/// time is the answer to its own request; each late reply is discarded and counted, never taken
/// for the answer to a later request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_round_trips_with_late_replies_never_mismatch() -> anyhow::Result<()> {
    const N: u32 = 1_000;
    // Requests the replier holds back: it answers one only when the next request arrives, which
    // is after the requester has given up on it.
    let late = |i: u32| i % 25 == 12;
    let (_dir, _node, client) = memory_node(&["svc"]).await?;
    let conn = client.open_connection("requester").await?;
    let mut requestor = Requestor::new(&conn).await?;
    let replier = {
        let session = client
            .open_connection("replier")
            .await?
            .create_session(AckMode::Individual)
            .await?;
        tokio::spawn(async move {
            let mut held = None;
            for _ in 0..N {
                let req = session
                    .receive("svc", ReceiveOptions::timeout_ms(30_000))
                    .await?;
                anyhow::ensure!(req.len() == 1, "the requester stopped sending");
                // A held request is answered now: too late for its requester.
                if let Some(old) = held.take() {
                    session.reply(&old, Message::text("late")).await?;
                    session.ack(&[old]).await?;
                }
                let body = String::from_utf8_lossy(req[0].body()).into_owned();
                let i: u32 = body.trim_start_matches("req ").parse()?;
                let r = req.into_iter().next().expect("one request");
                if late(i) {
                    held = Some(r);
                } else {
                    session.reply(&r, Message::text(format!("re {i}"))).await?;
                    session.ack(&[r]).await?;
                }
            }
            anyhow::Ok(())
        })
    };
    let mut answered = 0;
    for i in 0..N {
        let timeout = if late(i) {
            Duration::from_millis(100)
        } else {
            Duration::from_secs(30)
        };
        let reply = requestor
            .request("svc", Message::text(format!("req {i}")), timeout)
            .await?;
        match reply {
            Some(r) => {
                assert!(!late(i), "request {i} was held back, yet answered in time");
                assert_eq!(r.body(), format!("re {i}").as_bytes(), "request {i}");
                answered += 1;
            }
            None => assert!(late(i), "request {i} got no reply"),
        }
    }
    replier.await??;
    let held_back = (0..N).filter(|&i| late(i)).count() as u64;
    assert_eq!(answered, N as u64 - held_back);
    assert_eq!(
        requestor.stale_replies(),
        held_back,
        "every late reply was discarded and counted"
    );
    Ok(())
}
