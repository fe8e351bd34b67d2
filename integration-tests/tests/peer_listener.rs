//! The internal `Backend` service is served on the peer listener only: a client on the client
//! port can neither call it nor find it through reflection, and the peer port serves nothing
//! else. Forwarding between nodes through the peer listener is `forwarding.rs`.

use ferry_integration_tests::{create_queue, memory_node, Node};
use ferry_proto::pb;
use tonic::transport::Channel;
use tonic::Code;

async fn channel(url: String) -> anyhow::Result<Channel> {
    Ok(tonic::transport::Endpoint::from_shared(url)?
        .connect()
        .await?)
}

// Postmortem: `ferry.v1.Backend` was served on the client port, so any client could call the
// back-end directly and skip every front-end check (ownership of sessions and connections).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_back_end_answers_on_the_peer_port_only() -> anyhow::Result<()> {
    let (_dir, node, client) = memory_node(&["orders"]).await?;
    let request = || pb::BackendListQueuesRequest::default();

    let mut on_client_port = pb::backend_client::BackendClient::new(channel(node.url()).await?);
    let refused = on_client_port
        .list_queues(request())
        .await
        .expect_err("no Backend on the client port");
    assert_eq!(refused.code(), Code::Unimplemented, "{refused}");

    let mut on_peer_port = pb::backend_client::BackendClient::new(channel(node.peer_url()).await?);
    let listed = on_peer_port.list_queues(request()).await?.into_inner();
    assert!(
        listed.queues.iter().any(|q| q.name == "orders"),
        "{listed:?}"
    );

    // The peer port serves the back-end and nothing a client would use.
    let mut admin_on_peer_port =
        pb::admin_client::AdminClient::new(channel(node.peer_url()).await?);
    let refused = admin_on_peer_port
        .list_queues(pb::ListQueuesRequest::default())
        .await
        .expect_err("no Admin on the peer port");
    assert_eq!(refused.code(), Code::Unimplemented, "{refused}");
    // The client port still serves clients.
    create_queue(&client, "invoices").await?;
    Ok(())
}

async fn listed_v1(node: &Node) -> anyhow::Result<Vec<String>> {
    use tonic_reflection::pb::v1::server_reflection_client::ServerReflectionClient;
    use tonic_reflection::pb::v1::server_reflection_request::MessageRequest;
    use tonic_reflection::pb::v1::server_reflection_response::MessageResponse;
    use tonic_reflection::pb::v1::ServerReflectionRequest;
    let request = ServerReflectionRequest {
        host: String::new(),
        message_request: Some(MessageRequest::ListServices(String::new())),
    };
    let mut answers = ServerReflectionClient::new(channel(node.url()).await?)
        .server_reflection_info(tokio_stream::iter(vec![request]))
        .await?
        .into_inner();
    let Some(answer) = answers.message().await? else {
        anyhow::bail!("no reflection answer")
    };
    let Some(MessageResponse::ListServicesResponse(list)) = answer.message_response else {
        anyhow::bail!("unexpected reflection answer {answer:?}")
    };
    Ok(list.service.into_iter().map(|s| s.name).collect())
}

async fn listed_v1alpha(node: &Node) -> anyhow::Result<Vec<String>> {
    use tonic_reflection::pb::v1alpha::server_reflection_client::ServerReflectionClient;
    use tonic_reflection::pb::v1alpha::server_reflection_request::MessageRequest;
    use tonic_reflection::pb::v1alpha::server_reflection_response::MessageResponse;
    use tonic_reflection::pb::v1alpha::ServerReflectionRequest;
    let request = ServerReflectionRequest {
        host: String::new(),
        message_request: Some(MessageRequest::ListServices(String::new())),
    };
    let mut answers = ServerReflectionClient::new(channel(node.url()).await?)
        .server_reflection_info(tokio_stream::iter(vec![request]))
        .await?
        .into_inner();
    let Some(answer) = answers.message().await? else {
        anyhow::bail!("no reflection answer")
    };
    let Some(MessageResponse::ListServicesResponse(list)) = answer.message_response else {
        anyhow::bail!("unexpected reflection answer {answer:?}")
    };
    Ok(list.service.into_iter().map(|s| s.name).collect())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reflection_on_the_client_port_does_not_list_the_back_end() -> anyhow::Result<()> {
    let (_dir, node, _client) = memory_node(&[]).await?;
    for (version, names) in [
        ("v1", listed_v1(&node).await?),
        ("v1alpha", listed_v1alpha(&node).await?),
    ] {
        for expected in [
            "ferry.v1.Messaging",
            "ferry.v1.Admin",
            "grpc.health.v1.Health",
        ] {
            assert!(
                names.iter().any(|n| n == expected),
                "{version}: {expected} missing from {names:?}"
            );
        }
        assert!(
            !names.iter().any(|n| n == "ferry.v1.Backend"),
            "{version}: {names:?}"
        );
        assert!(
            names.iter().any(|n| n.starts_with("grpc.reflection.")),
            "{version}: reflection lists itself, as before: {names:?}"
        );
    }
    Ok(())
}
