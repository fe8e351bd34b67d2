//! Message selectors end to end: receive, browse and consume streams take only what matches,
//! the rest keeps its order, and a bad selector fails when the consumer is created.

#![allow(clippy::unwrap_used)]

use ferry_client::pb;
use ferry_client::{AckMode, Message, ReceiveOptions};
use ferry_integration_tests::{ferry_cli, memory_node};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn selectors_take_only_matching_messages_and_keep_the_rest_in_order() -> anyhow::Result<()> {
    let (_dir, _node, client) = memory_node(&["q"]).await?;
    let conn = client.open_connection("t").await?;
    let session = conn.create_session(AckMode::Auto).await?;
    let msgs = (1..=6)
        .map(|n| {
            Message::text(format!("m{n}"))
                .property("n", n)
                .property("color", if n % 2 == 0 { "red" } else { "blue" })
        })
        .collect();
    session.send("q", msgs).await?;

    let got = session
        .receive_selected(
            "q",
            "n > 3 AND color = 'red'",
            ReceiveOptions::no_wait().max(10),
        )
        .await?;
    let bodies: Vec<_> = got
        .iter()
        .map(|r| String::from_utf8_lossy(r.body()).to_string())
        .collect();
    assert_eq!(bodies, ["m4", "m6"]);

    // Browse with a selector looks without taking.
    let mut m = client.messaging();
    let page = m
        .browse(pb::BrowseRequest {
            queue: "q".into(),
            selector: "color = 'blue'".into(),
            max_messages: 10,
            page_token: String::new(),
        })
        .await?
        .into_inner();
    let browsed: Vec<_> = page
        .messages
        .iter()
        .map(|b| String::from_utf8_lossy(&b.message.as_ref().unwrap().body).to_string())
        .collect();
    assert_eq!(browsed, ["m1", "m3", "m5"]);

    // The others are still there, in their order.
    let rest = session
        .receive("q", ReceiveOptions::no_wait().max(10))
        .await?;
    let bodies: Vec<_> = rest
        .iter()
        .map(|r| String::from_utf8_lossy(r.body()).to_string())
        .collect();
    assert_eq!(bodies, ["m1", "m2", "m3", "m5"]);

    // A parked selective receiver is woken only by a matching message.
    let waiting = {
        let session = session.clone();
        tokio::spawn(async move {
            session
                .receive_selected("q", "JMSPriority = 9", ReceiveOptions::timeout_ms(10_000))
                .await
        })
    };
    ferry_integration_tests::wait_until(
        std::time::Duration::from_secs(5),
        "the receiver to park",
        || async {
            Ok(ferry_integration_tests::stats(&client, "q")
                .await?
                .consumers
                == 1)
        },
    )
    .await?;
    session.send("q", vec![Message::text("low")]).await?;
    session
        .send("q", vec![Message::text("urgent").priority(9)])
        .await?;
    let got = waiting.await??;
    assert_eq!(got[0].body(), b"urgent");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_consume_stream_with_a_bad_selector_is_refused_at_start() -> anyhow::Result<()> {
    let (_dir, node, client) = memory_node(&["q"]).await?;
    let start = pb::ConsumeStart {
        queue: "q".into(),
        selector: "color = ".into(),
        prefetch: 1,
        ..Default::default()
    };
    let first = pb::ConsumeRequest {
        kind: Some(pb::consume_request::Kind::Start(start)),
    };
    let e = client
        .messaging()
        .consume(tokio_stream::iter(vec![first]))
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e:?}");
    assert!(e.message().contains("position"), "{e:?}");

    // And from the command line.
    let (ok, _, err) = ferry_cli(
        &node,
        &[
            "receive",
            "--queue",
            "q",
            "--selector",
            "n >",
            "--timeout-ms",
            "0",
        ],
    )?;
    assert!(!ok);
    assert!(err.contains("position"), "{err}");
    Ok(())
}
