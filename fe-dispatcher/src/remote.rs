//! A back-end on another node, reached over gRPC at that node's peer listener (the only place a
//! node serves `Backend`; its client port does not). It implements the same trait the in-process
//! back-end does, so routing never cares which one it has.
//!
//! Given the node's [`Reachability`], a call to a node this one has not heard from within the
//! cluster's liveness timeout fails at once with UNAVAILABLE, nothing sent: a paused node, or one
//! cut off from this one, would otherwise hold every new call until the client's own deadline.
//! A call already under way keeps waiting for its answer (until the client's deadline): the
//! owner may have acted on it, and an answer that arrives once the link heals (TCP retransmits
//! it) still reaches the client; dropping it would strand what a receive was handed.

use std::future::Future;

use ferry_proto::pb;
use ferry_proto::pb::backend_client::BackendClient;
use tonic::transport::{Channel, Endpoint};
use tonic::{Request, Response, Status};

/// The largest message one node sends another.
const NODE_MESSAGE_BYTES_MAX: usize = 1 << 30;

/// See the module docs.
#[derive(Debug, Clone)]
pub struct RemoteBackend {
    client: BackendClient<Channel>,
    reach: Option<Reachability>,
}

/// Whether a node is reachable from this one, as the cluster's links see it.
#[derive(Clone)]
pub struct Reachability {
    /// The node's id, for error messages.
    pub node: String,
    /// True while it is heard from.
    pub up: std::sync::Arc<dyn Fn() -> bool + Send + Sync>,
}

impl std::fmt::Debug for Reachability {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reachability")
            .field("node", &self.node)
            .finish_non_exhaustive()
    }
}

impl RemoteBackend {
    /// A back-end at `url` (`http://host:port` of the node's peer listener). Connects lazily,
    /// reconnects on its own.
    pub fn new(url: &str) -> Result<Self, tonic::transport::Error> {
        let channel = Endpoint::from_shared(url.to_string())?
            .connect_timeout(std::time::Duration::from_secs(5))
            .tcp_nodelay(true)
            .http2_keep_alive_interval(std::time::Duration::from_secs(10))
            .keep_alive_while_idle(true)
            .connect_lazy();
        Ok(Self {
            // Node to node: a receive of up to 1 000 messages of up to the message size limit is
            // larger than tonic's 4 MiB default. The peer is a member of the cluster.
            client: BackendClient::new(channel)
                .max_decoding_message_size(NODE_MESSAGE_BYTES_MAX)
                .max_encoding_message_size(NODE_MESSAGE_BYTES_MAX),
            reach: None,
        })
    }

    /// Fails calls at once while `reach` says the node is unreachable (see the module docs).
    pub fn with_reachability(mut self, reach: Reachability) -> Self {
        self.reach = Some(reach);
        self
    }

    /// Runs `call` unless the node is unreachable (see the module docs).
    async fn guarded<T>(&self, call: impl Future<Output = Result<T, Status>>) -> Result<T, Status> {
        if let Some(reach) = &self.reach {
            if !(reach.up)() {
                return Err(Status::unavailable(format!(
                    "node {} is unreachable from this node (not heard from within the cluster's liveness timeout: down, paused or cut off); nothing was sent to it; retry, or connect to another node",
                    reach.node
                )));
            }
        }
        call.await
    }
}

/// Forwards one call, keeping the caller's deadline.
fn forward<T>(req: Request<T>) -> Request<T> {
    let timeout = crate::deadline::grpc_timeout(req.metadata());
    let mut out = Request::new(req.into_inner());
    if let Some(t) = timeout {
        out.set_timeout(t);
    }
    out
}

macro_rules! forward_all {
    ($($name:ident($req:ty) -> $resp:ty;)*) => {
        #[tonic::async_trait]
        impl pb::backend_server::Backend for RemoteBackend {
            $(
                async fn $name(&self, req: Request<$req>) -> Result<Response<$resp>, Status> {
                    self.guarded(self.client.clone().$name(forward(req))).await
                }
            )*

            type WatchEventsStream = ferry_proto::EventStream;

            async fn watch_events(
                &self,
                req: Request<pb::BackendWatchEventsRequest>,
            ) -> Result<Response<Self::WatchEventsStream>, Status> {
                let stream = self
                    .guarded(self.client.clone().watch_events(req.into_inner()))
                    .await?;
                Ok(Response::new(Box::pin(stream.into_inner())))
            }
        }
    };
}

forward_all! {
    create_queue(pb::BackendCreateQueueRequest) -> pb::QueueInfo;
    get_queue(pb::BackendQueueRequest) -> pb::QueueInfo;
    list_queues(pb::BackendListQueuesRequest) -> pb::BackendListQueuesResponse;
    delete_queue(pb::BackendQueueRequest) -> pb::BackendCountResponse;
    purge_queue(pb::BackendQueueRequest) -> pb::BackendCountResponse;
    get_queue_stats(pb::BackendQueueRequest) -> pb::QueueStats;
    send(pb::BackendSendRequest) -> pb::BackendSendResponse;
    receive(pb::BackendReceiveRequest) -> pb::BackendReceiveResponse;
    ack(pb::BackendLeaseRequest) -> pb::BackendLeaseResponse;
    nack(pb::BackendLeaseRequest) -> pb::BackendLeaseResponse;
    extend_lease(pb::BackendLeaseRequest) -> pb::BackendLeaseResponse;
    release_session(pb::BackendReleaseSessionRequest) -> pb::BackendReleaseSessionResponse;
    browse(pb::BackendBrowseRequest) -> pb::BackendBrowseResponse;
    commit(pb::BackendCommitRequest) -> pb::BackendCountResponse;
    rollback(pb::BackendRollbackRequest) -> pb::BackendCountResponse;
    delete_message(pb::BackendDeleteMessageRequest) -> pb::BackendCountResponse;
    get_message_history(pb::GetMessageHistoryRequest) -> pb::GetMessageHistoryResponse;
    seal_queue(pb::BackendSealQueueRequest) -> pb::BackendCountResponse;
    session_leases(pb::BackendSessionLeasesRequest) -> pb::BackendSessionLeasesResponse;
}
