//! Requests that are not what they say they are get the documented code: bytes that do not decode
//! as the request are `INVALID_ARGUMENT` naming the problem (tonic-prost answers `INTERNAL`), a
//! request over `limits.grpc_max_request_bytes` is `OUT_OF_RANGE` (tonic's, see
//! docs/operations.md). And the node's log, written to a file, is plain text: no colour codes, one
//! line per event whatever a caller sends.

#![allow(clippy::unwrap_used)]

use ferry_client::pb;
use ferry_integration_tests::raw::RawCodec;
use ferry_integration_tests::{create_queue, memory_node, Node, NodeOptions};
use prost::Message as _;
use tonic::codegen::http::uri::PathAndQuery;
use tonic::{Code, Status};

/// Sends `body` to the gRPC method `path` as it is, and returns the answer's bytes.
async fn call_raw(node: &Node, path: &'static str, body: Vec<u8>) -> Result<Vec<u8>, Status> {
    let channel = tonic::transport::Endpoint::from_shared(node.url())
        .map_err(|e| Status::unknown(e.to_string()))?
        .connect()
        .await
        .map_err(|e| Status::unavailable(e.to_string()))?;
    let mut grpc = tonic::client::Grpc::new(channel);
    grpc.ready()
        .await
        .map_err(|e| Status::unavailable(e.to_string()))?;
    let answer = grpc
        .unary(
            tonic::Request::new(body),
            PathAndQuery::from_static(path),
            RawCodec,
        )
        .await?;
    Ok(answer.into_inner())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cut_short_request_is_invalid_argument() -> anyhow::Result<()> {
    let (_dir, node, client) = memory_node(&["q"]).await?;
    let whole = pb::SendRequest {
        queue: "q".into(),
        messages: vec![pb::OutgoingMessage {
            body: b"hello".to_vec().into(),
            ..Default::default()
        }],
        ..Default::default()
    }
    .encode_to_vec();
    // The body as sent, then cut inside the message's body and inside the queue name.
    call_raw(&node, "/ferry.v1.Messaging/Send", whole.clone()).await?;
    for cut in [whole.len() - 2, 4] {
        let e = call_raw(&node, "/ferry.v1.Messaging/Send", whole[..cut].to_vec())
            .await
            .unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument, "cut at {cut}: {e:?}");
        assert!(
            e.message()
                .starts_with("not a valid ferry.v1.SendRequest: failed to decode Protobuf message"),
            "{e:?}"
        );
    }
    // Only the one good send was stored, and the node still serves.
    assert_eq!(ferry_integration_tests::stats(&client, "q").await?.ready, 1);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_utf8_in_a_string_field_is_invalid_argument_naming_the_field() -> anyhow::Result<()>
{
    let (_dir, node, _client) = memory_node(&["q"]).await?;
    // SendRequest.queue is field 2 (tag 0x12), OpenConnectionRequest.client_id field 1 (tag 0x0a);
    // 0xc3 0x28 is not UTF-8 (a lead byte followed by no continuation byte).
    let rows: [(&'static str, Vec<u8>, &str); 2] = [
        (
            "/ferry.v1.Messaging/Send",
            vec![0x12, 2, 0xc3, 0x28],
            "SendRequest.queue",
        ),
        (
            "/ferry.v1.Messaging/OpenConnection",
            vec![0x0a, 3, b'a', 0xc3, 0x28],
            "OpenConnectionRequest.client_id",
        ),
    ];
    for (path, body, field) in rows {
        let e = call_raw(&node, path, body).await.unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument, "{path}: {e:?}");
        assert!(e.message().contains(field), "{path}: {e:?}");
        assert!(e.message().contains("not UTF-8"), "{path}: {e:?}");
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_over_grpc_max_request_bytes_is_out_of_range() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let node = Node::start(
        dir.path(),
        NodeOptions {
            memory: true,
            extra_toml: "[limits]\ngrpc_max_request_bytes = 65536\n".into(),
            ..Default::default()
        },
    )?;
    let client = node.client().await?;
    create_queue(&client, "q").await?;
    let send = |body_bytes: usize| {
        let mut m = client.messaging();
        async move {
            m.send(pb::SendRequest {
                queue: "q".into(),
                messages: vec![pb::OutgoingMessage {
                    body: vec![7u8; body_bytes].into(),
                    ..Default::default()
                }],
                ..Default::default()
            })
            .await
        }
    };
    send(60_000).await?;
    let e = send(70_000).await.unwrap_err();
    // The code docs/operations.md gives: tonic's, from the frame header, before any decoding.
    assert_eq!(e.code(), Code::OutOfRange, "{e:?}");
    assert!(e.message().contains("the limit is: 65536 bytes"), "{e:?}");
    assert_eq!(ferry_integration_tests::stats(&client, "q").await?.ready, 1);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_log_file_has_no_colour_codes_and_caller_text_stays_on_its_line() -> anyhow::Result<()>
{
    let (_dir, node, client) = memory_node(&["q"]).await?;
    let forged = "x\n2026-01-01T00:00:00.000000Z ERROR forged: the store is on fire\x1b[31m";
    // A rejected message's reason is logged.
    let conn = client.open_connection(forged).await?;
    let session = conn
        .create_session(ferry_client::AckMode::Individual)
        .await?;
    session
        .send("q", vec![ferry_client::Message::text("m")])
        .await?;
    let got = session
        .receive("q", ferry_client::ReceiveOptions::no_wait())
        .await?;
    let mut m = client.messaging();
    m.nack(pb::NackRequest {
        session_id: session.id().into(),
        receipt_handles: got.iter().map(|g| g.receipt_handle().into()).collect(),
        dead_letter: true,
        reason: forged.into(),
        ..Default::default()
    })
    .await?;
    let log = node.log();
    assert!(log.contains("consumer rejected messages"), "{log}");
    assert!(
        !log.contains('\x1b'),
        "colour codes in the log file:\n{log}"
    );
    assert!(
        log.lines().all(|l| !l.starts_with("2026-01-01")),
        "a forged line:\n{log}"
    );
    Ok(())
}
