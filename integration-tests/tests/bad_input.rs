//! Bad input gets the right gRPC code and a message that says what to fix; nothing panics.

#![allow(clippy::unwrap_used)]

use ferry_client::pb;
use ferry_client::{AckMode, Message, ReceiveOptions};
use ferry_integration_tests::{create_queue, stats, Node, NodeOptions};
use tonic::Code;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_is_refused_with_the_right_code() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let extra = "[limits]\nmax_message_size_bytes = 1000\n".to_string();
    let node = Node::start(
        dir.path(),
        NodeOptions {
            memory: true,
            extra_toml: extra,
            ..Default::default()
        },
    )?;
    let client = node.client().await?;
    create_queue(&client, "q").await?;
    let mut m = client.messaging();
    let conn = client.open_connection("t").await?;
    let session = conn.create_session(AckMode::Client).await?;

    // Unknown queue.
    let e = session
        .send("nope", vec![Message::text("x")])
        .await
        .unwrap_err();
    assert_eq!(e.code(), Some(Code::NotFound), "{e}");
    assert!(e.to_string().contains("nope"), "{e}");
    let e = session
        .receive("nope", ReceiveOptions::no_wait())
        .await
        .unwrap_err();
    assert_eq!(e.code(), Some(Code::NotFound), "{e}");

    // Negative wait: INVALID_ARGUMENT, and nothing is left parked.
    let e = session
        .receive("q", ReceiveOptions::timeout_ms(-5))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Some(Code::InvalidArgument), "{e}");
    assert!(e.to_string().contains("-5"), "{e}");
    assert_eq!(stats(&client, "q").await?.consumers, 0);

    // Over the message size limit, with the limit named.
    let e = session
        .send("q", vec![Message::bytes(vec![0u8; 2_000])])
        .await
        .unwrap_err();
    assert_eq!(e.code(), Some(Code::ResourceExhausted), "{e}");
    assert!(
        e.to_string().contains("max_message_size_bytes = 1000"),
        "{e}"
    );

    // Malformed names, priorities, properties, handles.
    let e = session
        .send("bad name", vec![Message::text("x")])
        .await
        .unwrap_err();
    assert_eq!(e.code(), Some(Code::InvalidArgument), "{e}");
    let e = session
        .send("q", vec![Message::text("x").priority(10)])
        .await
        .unwrap_err();
    assert_eq!(e.code(), Some(Code::InvalidArgument), "{e}");
    let e = session
        .send("q", vec![Message::text("x").property("bad-name", 1)])
        .await
        .unwrap_err();
    assert_eq!(e.code(), Some(Code::InvalidArgument), "{e}");
    let e = m
        .ack(pb::AckRequest {
            session_id: session.id().into(),
            receipt_handles: vec!["garbage".into()],
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
    let e = m
        .receive(pb::ReceiveRequest {
            session_id: "zz".into(),
            queue: "q".into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
    let e = m
        .receive(pb::ReceiveRequest {
            session_id: "00000000000000ff".into(),
            queue: "q".into(),
            wait_ms: Some(0),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::NotFound, "unknown session: {e:?}");
    let e = m
        .receive(pb::ReceiveRequest {
            queue: "q".into(),
            max_messages: 1_000_000,
            wait_ms: Some(0),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::ResourceExhausted, "{e:?}");
    assert!(e.message().contains("receive_batch_max"), "{e:?}");

    // A stale receipt handle never acknowledges anything.
    session.send("q", vec![Message::text("m")]).await?;
    let got = session.receive("q", ReceiveOptions::no_wait()).await?;
    session.nack(&got, None).await?;
    let e = session.ack(&got).await.unwrap_err();
    assert_eq!(e.code(), Some(Code::FailedPrecondition), "{e}");
    let again = session.receive("q", ReceiveOptions::no_wait()).await?;
    assert!(again[0].redelivered());
    session.ack(&again).await?;

    // A reply queue must exist; a deleted temporary queue is gone for good.
    let e = session
        .send("q", vec![Message::text("x").reply_to("missing")])
        .await
        .unwrap_err();
    assert_eq!(e.code(), Some(Code::NotFound), "{e}");
    assert!(e.to_string().contains("reply_to"), "{e}");
    let tmp = conn.create_temporary_queue().await?;
    session.send(&tmp, vec![Message::text("reply")]).await?;
    m.delete_temporary_queue(pb::DeleteTemporaryQueueRequest {
        connection_id: conn.id().into(),
        queue: tmp.clone(),
    })
    .await?;
    let e = session
        .send(&tmp, vec![Message::text("late reply")])
        .await
        .unwrap_err();
    assert_eq!(e.code(), Some(Code::NotFound), "{e}");

    // A malformed selector is refused when the receiver is created, naming the position.
    let e = session
        .receive_selected("q", "n > ", ReceiveOptions::no_wait())
        .await
        .unwrap_err();
    assert_eq!(e.code(), Some(Code::InvalidArgument), "{e}");
    assert!(e.to_string().contains("position"), "{e}");
    assert_eq!(stats(&client, "q").await?.consumers, 0);

    // Commit and rollback belong to transacted sessions.
    let e = session.commit().await.unwrap_err();
    assert_eq!(e.code(), Some(Code::FailedPrecondition), "{e}");
    assert!(e.to_string().contains("ACK_MODE_TRANSACTED"), "{e}");
    let e = session.rollback().await.unwrap_err();
    assert_eq!(e.code(), Some(Code::FailedPrecondition), "{e}");

    // A redelivery policy that makes no sense is refused, naming the field.
    let e = client
        .admin()
        .create_queue(pb::CreateQueueRequest {
            replicas: 0,
            own_shard: false,
            name: "bad-policy".into(),
            config: Some(pb::QueueConfig {
                redelivery: Some(pb::RedeliveryPolicy {
                    backoff_multiplier: Some(0.5),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            if_not_exists: false,
            node: String::new(),
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
    assert!(e.message().contains("backoff_multiplier"), "{e:?}");
    let e = client
        .admin()
        .create_queue(pb::CreateQueueRequest {
            replicas: 0,
            own_shard: false,
            name: "selfish".into(),
            config: Some(pb::QueueConfig {
                dead_letter: Some(pb::DeadLetterTarget {
                    target: Some(pb::dead_letter_target::Target::Queue("selfish".into())),
                }),
                ..Default::default()
            }),
            if_not_exists: false,
            node: String::new(),
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
    assert!(e.message().contains("own dead-letter queue"), "{e:?}");

    // Admin mistakes.
    let mut admin = client.admin();
    let e = admin
        .create_queue(pb::CreateQueueRequest {
            name: "q".into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::AlreadyExists, "{e:?}");
    let e = admin
        .delete_queue(pb::DeleteQueueRequest {
            name: "nope".into(),
            if_empty: false,
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::NotFound, "{e:?}");
    let e = admin
        .create_queue(pb::CreateQueueRequest {
            name: "tmp.sneaky".into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");

    // Extreme but valid numbers: a wait, delay and time to live at the top of their range.
    session
        .send(
            "q",
            vec![Message::text("far").delay_ms(u64::MAX).ttl_ms(u64::MAX)],
        )
        .await?;
    let far_wait = {
        let mut m = m.clone();
        let req = pb::ReceiveRequest {
            queue: "q".into(),
            wait_ms: Some(i64::MAX),
            ..Default::default()
        };
        tokio::spawn(async move { m.receive(req).await })
    };
    ferry_integration_tests::wait_until(
        std::time::Duration::from_secs(5),
        "the far receiver to park",
        || async { Ok(stats(&client, "q").await?.consumers == 1) },
    )
    .await?;
    far_wait.abort();
    let mut bounded = tonic::Request::new(pb::ReceiveRequest {
        queue: "q".into(),
        wait_ms: Some(i64::MAX),
        ..Default::default()
    });
    bounded.set_timeout(std::time::Duration::from_millis(300));
    let r = m.receive(bounded).await?.into_inner();
    assert!(
        r.deliveries.is_empty(),
        "an empty answer at the deadline is a normal OK"
    );
    assert_eq!(stats(&client, "q").await?.scheduled, 1);

    // The server is still healthy after all of that.
    node.client().await?;
    Ok(())
}
