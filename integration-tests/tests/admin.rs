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
    assert_eq!(worker["connection_id"], conn.id());
    assert_eq!(worker["sessions"], 1);
    let (ok, out, err) = ferry_cli(&node, &["connections", "close", conn.id(), "-o", "json"])?;
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
