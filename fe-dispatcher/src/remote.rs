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
//!
//! When the link breaks while a call is under way (the node was killed, restarted, or its
//! connection reset), the call fails with UNAVAILABLE saying what may have happened there
//! ([`Error::OwnerLost`]): a send's or an ack's outcome is unknown, a receive's messages come
//! back when their leases run out (a replicated queue's at the session's next receive there:
//! [`may_have_acted`] tells the front-end to ask for them), a read changed nothing. The router
//! names the node.

use std::future::Future;

use ferry_proto::pb;
use ferry_proto::pb::backend_client::BackendClient;
use tonic::transport::{Channel, Endpoint};
use tonic::{Request, Response, Status};

use crate::error::{CallOutcome, Error};

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

    /// Runs `call` unless the node is unreachable (see the module docs); `name` and `outcome`
    /// say what the call was and what it may have done if the link breaks under it.
    async fn guarded<T>(
        &self,
        name: &'static str,
        outcome: CallOutcome,
        call: impl Future<Output = Result<T, Status>>,
    ) -> Result<T, Status> {
        if let Some(reach) = &self.reach {
            if !(reach.up)() {
                return Err(not_sent(Status::unavailable(format!(
                    "node {} is unreachable from this node (not heard from within the cluster's liveness timeout: down, paused or cut off); nothing was sent to it; retry, or connect to another node",
                    reach.node
                ))));
            }
        }
        call.await
            .map_err(|status| lost_mid_call(status, name, outcome))
    }
}

/// `status` as the caller sees it: a failure of the link itself, rather than an answer from
/// the node, becomes [`Error::OwnerLost`]. Only such failures carry a source error: a status
/// the node answered arrives without one. An UNAVAILABLE passes as it is (a connection that
/// could not be made: nothing was sent).
fn lost_mid_call(status: Status, call: &'static str, outcome: CallOutcome) -> Status {
    use std::error::Error as _;
    if status.code() == tonic::Code::Unavailable && status.source().is_some() {
        return not_sent(status);
    }
    if status.code() == tonic::Code::Unavailable || status.source().is_none() {
        return status;
    }
    tracing::debug!(error = %status, call, "the link to a back-end broke during a call");
    Error::OwnerLost { call, outcome }.into()
}

/// The metadata key the front-end marks an answer with when the call never reached the
/// back-end (the node unreachable, or no connection could be made): nothing was done, so the
/// router may try it elsewhere. Never sent to clients as a promise of anything else.
pub(crate) const NOT_SENT_KEY: &str = "ferry-not-sent";

/// `status`, marked as a call that never reached its back-end (see [`NOT_SENT_KEY`]).
pub(crate) fn not_sent(mut status: Status) -> Status {
    status.metadata_mut().insert(
        NOT_SENT_KEY,
        tonic::metadata::MetadataValue::from_static("1"),
    );
    status
}

/// Whether `status` says its call never reached the back-end (see [`NOT_SENT_KEY`]).
pub(crate) fn was_not_sent(status: &Status) -> bool {
    status.metadata().contains_key(NOT_SENT_KEY)
}

/// Whether a failed call may have acted at the back-end all the same, as far as `status` says:
/// an UNAVAILABLE that is neither marked as never sent (see [`NOT_SENT_KEY`]) nor a "not the
/// leader" answer (a link lost mid-call, [`Error::OwnerLost`], or a write the queue's shard
/// could not confirm). Any other error is the back-end's answer that it did not.
pub(crate) fn may_have_acted(status: &Status) -> bool {
    status.code() == tonic::Code::Unavailable
        && !was_not_sent(status)
        && ferry_proto::not_leader_of(status).is_none()
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
    ($($name:ident($req:ty) -> $resp:ty, $outcome:ident;)*) => {
        #[tonic::async_trait]
        impl pb::backend_server::Backend for RemoteBackend {
            $(
                async fn $name(&self, req: Request<$req>) -> Result<Response<$resp>, Status> {
                    let mut client = self.client.clone();
                    let call = client.$name(forward(req));
                    self.guarded(stringify!($name), CallOutcome::$outcome, call).await
                }
            )*

            type WatchEventsStream = ferry_proto::EventStream;

            async fn watch_events(
                &self,
                req: Request<pb::BackendWatchEventsRequest>,
            ) -> Result<Response<Self::WatchEventsStream>, Status> {
                let mut client = self.client.clone();
                let stream = self
                    .guarded(
                        "watch_events",
                        CallOutcome::NothingChanged,
                        client.watch_events(req.into_inner()),
                    )
                    .await?;
                Ok(Response::new(Box::pin(stream.into_inner())))
            }
        }
    };
}

forward_all! {
    create_queue(pb::BackendCreateQueueRequest) -> pb::QueueInfo, Unknown;
    get_queue(pb::BackendQueueRequest) -> pb::QueueInfo, NothingChanged;
    list_queues(pb::BackendListQueuesRequest) -> pb::BackendListQueuesResponse, NothingChanged;
    delete_queue(pb::BackendQueueRequest) -> pb::BackendCountResponse, Unknown;
    purge_queue(pb::BackendQueueRequest) -> pb::BackendCountResponse, Unknown;
    get_queue_stats(pb::BackendQueueRequest) -> pb::QueueStats, NothingChanged;
    send(pb::BackendSendRequest) -> pb::BackendSendResponse, Unknown;
    receive(pb::BackendReceiveRequest) -> pb::BackendReceiveResponse, LeasesReturn;
    ack(pb::BackendLeaseRequest) -> pb::BackendLeaseResponse, Unknown;
    nack(pb::BackendLeaseRequest) -> pb::BackendLeaseResponse, Unknown;
    extend_lease(pb::BackendLeaseRequest) -> pb::BackendLeaseResponse, Unknown;
    release_session(pb::BackendReleaseSessionRequest) -> pb::BackendReleaseSessionResponse, Unknown;
    browse(pb::BackendBrowseRequest) -> pb::BackendBrowseResponse, NothingChanged;
    commit(pb::BackendCommitRequest) -> pb::BackendCountResponse, Unknown;
    rollback(pb::BackendRollbackRequest) -> pb::BackendCountResponse, Unknown;
    delete_message(pb::BackendDeleteMessageRequest) -> pb::BackendCountResponse, Unknown;
    get_message_history(pb::GetMessageHistoryRequest) -> pb::GetMessageHistoryResponse, NothingChanged;
    seal_queue(pb::BackendSealQueueRequest) -> pb::BackendCountResponse, Unknown;
    session_leases(pb::BackendSessionLeasesRequest) -> pb::BackendSessionLeasesResponse, NothingChanged;
    release_lost(pb::BackendReleaseLostRequest) -> pb::BackendCountResponse, Unknown;
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What tonic makes of a connection reset under a call: UNKNOWN, with the I/O error as its
    /// source.
    fn reset() -> Status {
        let e = std::io::Error::new(std::io::ErrorKind::ConnectionReset, "connection reset");
        Status::from_error(Box::new(e))
    }

    // Postmortem: a send whose owner died under it ended `UNKNOWN: transport error`, which did
    // not say that the send may have been stored.
    #[test]
    fn a_send_whose_link_breaks_under_it_is_unavailable_with_its_outcome_unknown() {
        let broken = reset();
        assert_eq!(broken.code(), tonic::Code::Unknown, "what tonic gives");
        let status = lost_mid_call(broken, "send", CallOutcome::Unknown);
        assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");
        let message = status.message();
        assert!(
            message.contains("while the send was under way"),
            "{message}"
        );
        assert!(message.contains("its outcome is unknown"), "{message}");
    }

    #[test]
    fn a_read_whose_link_breaks_says_it_changed_nothing() {
        let status = lost_mid_call(reset(), "browse", CallOutcome::NothingChanged);
        assert_eq!(status.code(), tonic::Code::Unavailable);
        assert!(
            status.message().contains("it changed nothing"),
            "{status:?}"
        );
    }

    #[test]
    fn an_answer_from_the_node_passes_as_it_is() {
        let answered = Status::unknown("the node's own answer");
        let status = lost_mid_call(answered, "send", CallOutcome::Unknown);
        assert_eq!(status.code(), tonic::Code::Unknown);
        assert_eq!(status.message(), "the node's own answer");
        // A connection that could not be made: nothing was sent, and it already says so.
        let refused = Status::unavailable("tcp connect error");
        let status = lost_mid_call(refused, "send", CallOutcome::Unknown);
        assert_eq!(status.message(), "tcp connect error");
    }
}
