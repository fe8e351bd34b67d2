//! The client-facing `Messaging` service, a thin shell over [`Dispatch`]: each call takes its
//! request (and, for receives, its deadline), makes one call into the core, and answers.

use std::sync::Arc;

use ferry_proto::pb;
use tonic::{Request, Response, Status, Streaming};

use crate::deadline::grpc_timeout;
use crate::dispatch::Dispatch;

/// See the module docs.
#[derive(Debug, Clone)]
pub struct MessagingService {
    core: Arc<Dispatch>,
}

impl MessagingService {
    pub(crate) fn new(core: Arc<Dispatch>) -> Self {
        Self { core }
    }
}

type Reply<T> = Result<Response<T>, Status>;

#[tonic::async_trait]
impl pb::messaging_server::Messaging for MessagingService {
    async fn open_connection(
        &self,
        req: Request<pb::OpenConnectionRequest>,
    ) -> Reply<pb::OpenConnectionResponse> {
        let from = req.remote_addr();
        let opened = self.core.open_connection(req.into_inner())?;
        if let Some(addr) = from {
            self.core
                .sessions
                .set_client_address(&opened.connection_id, addr.to_string());
        }
        Ok(Response::new(opened))
    }

    async fn heartbeat(&self, req: Request<pb::HeartbeatRequest>) -> Reply<pb::HeartbeatResponse> {
        self.core
            .heartbeat(req.into_inner())
            .await
            .map(Response::new)
    }

    async fn close_connection(
        &self,
        req: Request<pb::CloseConnectionRequest>,
    ) -> Reply<pb::CloseConnectionResponse> {
        self.core
            .close_connection(req.into_inner())
            .await
            .map(Response::new)
    }

    async fn create_session(
        &self,
        req: Request<pb::CreateSessionRequest>,
    ) -> Reply<pb::CreateSessionResponse> {
        self.core
            .create_session(req.into_inner())
            .map(Response::new)
    }

    async fn close_session(
        &self,
        req: Request<pb::CloseSessionRequest>,
    ) -> Reply<pb::CloseSessionResponse> {
        self.core
            .close_session(req.into_inner())
            .await
            .map(Response::new)
    }

    async fn send(&self, req: Request<pb::SendRequest>) -> Reply<pb::SendResponse> {
        self.core.send(req.into_inner()).await.map(Response::new)
    }

    type PublishStream = crate::publish::PublishStream;

    async fn publish(
        &self,
        req: Request<Streaming<pb::PublishRequest>>,
    ) -> Reply<Self::PublishStream> {
        Ok(Response::new(crate::publish::start(
            self.core.clone(),
            req.into_inner(),
        )))
    }

    async fn receive(&self, req: Request<pb::ReceiveRequest>) -> Reply<pb::ReceiveResponse> {
        let deadline = grpc_timeout(req.metadata());
        self.core
            .receive(req.into_inner(), deadline)
            .await
            .map(Response::new)
    }

    type ConsumeStream = crate::consume::ConsumeStream;

    async fn consume(
        &self,
        req: Request<Streaming<pb::ConsumeRequest>>,
    ) -> Reply<Self::ConsumeStream> {
        crate::consume::start(self.core.clone(), req.into_inner())
            .await
            .map(Response::new)
    }

    async fn ack(&self, req: Request<pb::AckRequest>) -> Reply<pb::AckResponse> {
        self.core.ack(req.into_inner()).await.map(Response::new)
    }

    async fn nack(&self, req: Request<pb::NackRequest>) -> Reply<pb::NackResponse> {
        self.core.nack(req.into_inner()).await.map(Response::new)
    }

    async fn extend_lease(
        &self,
        req: Request<pb::ExtendLeaseRequest>,
    ) -> Reply<pb::ExtendLeaseResponse> {
        self.core
            .extend_lease(req.into_inner())
            .await
            .map(Response::new)
    }

    async fn recover(&self, req: Request<pb::RecoverRequest>) -> Reply<pb::RecoverResponse> {
        self.core.recover(req.into_inner()).await.map(Response::new)
    }

    async fn commit(&self, req: Request<pb::CommitRequest>) -> Reply<pb::CommitResponse> {
        self.core.commit(req.into_inner()).await.map(Response::new)
    }

    async fn rollback(&self, req: Request<pb::RollbackRequest>) -> Reply<pb::RollbackResponse> {
        self.core
            .rollback(req.into_inner())
            .await
            .map(Response::new)
    }

    async fn create_temporary_queue(
        &self,
        req: Request<pb::CreateTemporaryQueueRequest>,
    ) -> Reply<pb::CreateTemporaryQueueResponse> {
        self.core
            .create_temporary_queue(req.into_inner())
            .await
            .map(Response::new)
    }

    async fn delete_temporary_queue(
        &self,
        req: Request<pb::DeleteTemporaryQueueRequest>,
    ) -> Reply<pb::DeleteTemporaryQueueResponse> {
        self.core
            .delete_temporary_queue(req.into_inner())
            .await
            .map(Response::new)
    }

    async fn browse(&self, req: Request<pb::BrowseRequest>) -> Reply<pb::BrowseResponse> {
        self.core.browse(req.into_inner()).await.map(Response::new)
    }
}
