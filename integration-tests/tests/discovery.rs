//! Standard gRPC tooling works against a node: server reflection (what `grpcurl list` uses) and
//! the health service.

use ferry_integration_tests::memory_node;
use tonic_reflection::pb::v1::server_reflection_client::ServerReflectionClient;
use tonic_reflection::pb::v1::server_reflection_request::MessageRequest;
use tonic_reflection::pb::v1::server_reflection_response::MessageResponse;
use tonic_reflection::pb::v1::ServerReflectionRequest;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reflection_lists_the_api_services() -> anyhow::Result<()> {
    let (_dir, node, _client) = memory_node(&[]).await?; // SERVING once this returns
    let channel = tonic::transport::Endpoint::from_shared(node.url())?
        .connect()
        .await?;
    let mut reflection = ServerReflectionClient::new(channel);
    let request = ServerReflectionRequest {
        host: String::new(),
        message_request: Some(MessageRequest::ListServices(String::new())),
    };
    let mut answers = reflection
        .server_reflection_info(tokio_stream::iter(vec![request]))
        .await?
        .into_inner();
    let Some(answer) = answers.message().await? else {
        anyhow::bail!("no reflection answer")
    };
    let Some(MessageResponse::ListServicesResponse(list)) = answer.message_response else {
        anyhow::bail!("unexpected reflection answer {answer:?}")
    };
    let names: Vec<String> = list.service.into_iter().map(|s| s.name).collect();
    for expected in [
        "ferry.v1.Messaging",
        "ferry.v1.Admin",
        "grpc.health.v1.Health",
    ] {
        assert!(
            names.iter().any(|n| n == expected),
            "{expected} missing from {names:?}"
        );
    }
    Ok(())
}
