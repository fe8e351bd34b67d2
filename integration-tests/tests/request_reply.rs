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
