//! An in-process fake of the `Messaging` service for the client's unit tests, over in-memory
//! connections (no sockets, no server process; paused time works). The fake hands every stream
//! the client opens to the test, which reads what the client sent and writes the answers, so a
//! test decides each answer and sees each request.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use ferry_proto::pb;
use ferry_proto::pb::messaging_server::{Messaging, MessagingServer};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};

use crate::Client;

mod admin;

/// Answers a streaming call waits in, at most (the test writes them).
const STREAM_ANSWERS_MAX: usize = 64;

/// How long a test waits for something the client must send before it fails: a bound on a hang,
/// never a wait for something to settle (every exchange is in memory).
pub(crate) const QUIET_MAX: std::time::Duration = std::time::Duration::from_secs(10);

/// A stream the client opened: what it sends, and where the test writes the answers (dropping
/// `answers` ends the stream; an `Err` breaks it).
#[derive(Debug)]
pub(crate) struct FakeStream<Req, Resp> {
    pub(crate) requests: Streaming<Req>,
    pub(crate) answers: mpsc::Sender<Result<Resp, Status>>,
}

impl<Req, Resp> FakeStream<Req, Resp> {
    /// The next request on the stream (panics if the client ended it, or sent nothing in
    /// [`QUIET_MAX`]).
    pub(crate) async fn next(&mut self) -> Req {
        tokio::time::timeout(QUIET_MAX, self.requests.message())
            .await
            .expect("the client sent nothing")
            .expect("a request, not a broken stream")
            .expect("a request, not the end of the stream")
    }

    pub(crate) async fn answer(&self, answer: Result<Resp, Status>) {
        self.answers.send(answer).await.expect("the client listens");
    }
}

/// Answers a test scripts for a unary call, in order.
pub(crate) type Scripted<T> = Arc<Mutex<VecDeque<Result<T, tonic::Code>>>>;

/// The next scripted answer of a unary call.
fn scripted<T>(answers: &Scripted<T>, call: &str) -> Result<Response<T>, Status> {
    match answers.lock().expect("not poisoned").pop_front() {
        Some(Ok(answer)) => Ok(Response::new(answer)),
        Some(Err(code)) => Err(Status::new(code, "scripted by the test")),
        None => not_faked(call),
    }
}

/// The test's side of the fake.
#[derive(Debug)]
pub(crate) struct Fake {
    pub(crate) client: Client,
    /// The connection id of every heartbeat, as it arrives.
    pub(crate) heartbeats: mpsc::UnboundedReceiver<String>,
    /// What the next heartbeats are answered with (`Ok` once it runs out).
    pub(crate) heartbeat_answers: Arc<Mutex<VecDeque<Result<(), tonic::Code>>>>,
    /// What the next receives are answered with (UNIMPLEMENTED once it runs out).
    pub(crate) receive_answers: Scripted<pb::ReceiveResponse>,
    /// What the next acks are answered with (UNIMPLEMENTED once it runs out).
    pub(crate) ack_answers: Scripted<pb::AckResponse>,
    pub(crate) publishes:
        mpsc::UnboundedReceiver<FakeStream<pb::PublishRequest, pb::PublishResponse>>,
    pub(crate) consumes:
        mpsc::UnboundedReceiver<FakeStream<pb::ConsumeRequest, pb::ConsumeResponse>>,
    /// The dedup windows the next `GetQueue` calls answer (the server's default, 10 min, once
    /// it runs out).
    pub(crate) dedup_windows: Scripted<u64>,
    /// The queue each `GetQueue` call named, as it arrives.
    pub(crate) lookups: mpsc::UnboundedReceiver<String>,
}

impl Fake {
    /// The next publish stream the client opens (panics if it opens none in [`QUIET_MAX`]).
    pub(crate) async fn next_publish(
        &mut self,
    ) -> FakeStream<pb::PublishRequest, pb::PublishResponse> {
        within(self.publishes.recv(), "publish stream").await
    }

    /// The next consume stream the client opens (panics if it opens none in [`QUIET_MAX`]).
    pub(crate) async fn next_consume(
        &mut self,
    ) -> FakeStream<pb::ConsumeRequest, pb::ConsumeResponse> {
        within(self.consumes.recv(), "consume stream").await
    }

    /// The connection id of the next heartbeat (panics if none comes in [`QUIET_MAX`]).
    pub(crate) async fn next_heartbeat(&mut self) -> String {
        within(self.heartbeats.recv(), "heartbeat").await
    }
}

/// What `what` yields, in [`QUIET_MAX`] at most.
async fn within<T>(what: impl std::future::Future<Output = Option<T>>, name: &str) -> T {
    tokio::time::timeout(QUIET_MAX, what)
        .await
        .unwrap_or_else(|_| panic!("the client sent no {name} in {QUIET_MAX:?}"))
        .unwrap_or_else(|| panic!("the fake server stopped before a {name}"))
}

#[derive(Debug)]
struct Service {
    connection_lease_ms: u64,
    heartbeats: mpsc::UnboundedSender<String>,
    heartbeat_answers: Arc<Mutex<VecDeque<Result<(), tonic::Code>>>>,
    receive_answers: Scripted<pb::ReceiveResponse>,
    ack_answers: Scripted<pb::AckResponse>,
    publishes: mpsc::UnboundedSender<FakeStream<pb::PublishRequest, pb::PublishResponse>>,
    consumes: mpsc::UnboundedSender<FakeStream<pb::ConsumeRequest, pb::ConsumeResponse>>,
}

/// Starts the fake; connections it grants last `connection_lease_ms`.
pub(crate) async fn start(connection_lease_ms: u64) -> Fake {
    let (heartbeats_tx, heartbeats) = mpsc::unbounded_channel();
    let (publishes_tx, publishes) = mpsc::unbounded_channel();
    let (consumes_tx, consumes) = mpsc::unbounded_channel();
    let heartbeat_answers = Arc::new(Mutex::new(VecDeque::new()));
    let receive_answers = Scripted::default();
    let ack_answers = Scripted::default();
    let service = Service {
        connection_lease_ms,
        heartbeats: heartbeats_tx,
        heartbeat_answers: heartbeat_answers.clone(),
        receive_answers: receive_answers.clone(),
        ack_answers: ack_answers.clone(),
        publishes: publishes_tx,
        consumes: consumes_tx,
    };
    // Each connection the client makes is one end of an in-memory pipe; the server gets the other.
    let (incoming_tx, incoming) = mpsc::channel::<std::io::Result<tokio::io::DuplexStream>>(4);
    let (admin, dedup_windows, lookups) = admin::service();
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(MessagingServer::new(service))
            .add_service(ferry_proto::pb::admin_server::AdminServer::new(admin))
            .serve_with_incoming(ReceiverStream::new(incoming)),
    );
    let channel = tonic::transport::Endpoint::from_static("http://fake.invalid")
        .connect_with_connector(tower::service_fn(move |_| {
            let incoming_tx = incoming_tx.clone();
            async move {
                let (client_end, server_end) = tokio::io::duplex(1 << 16);
                incoming_tx
                    .send(Ok(server_end))
                    .await
                    .map_err(|_| std::io::Error::other("the fake server stopped"))?;
                Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(client_end))
            }
        }))
        .await
        .expect("an in-memory connection");
    Fake {
        client: Client::from_channel(channel),
        heartbeats,
        heartbeat_answers,
        receive_answers,
        ack_answers,
        publishes,
        consumes,
        dedup_windows,
        lookups,
    }
}

fn stream<Req, Resp>(
    requests: Request<Streaming<Req>>,
    to_test: &mpsc::UnboundedSender<FakeStream<Req, Resp>>,
) -> Result<Response<ReceiverStream<Result<Resp, Status>>>, Status> {
    let (answers, rx) = mpsc::channel(STREAM_ANSWERS_MAX);
    let requests = requests.into_inner();
    to_test
        .send(FakeStream { requests, answers })
        .map_err(|_| Status::unavailable("the test stopped"))?;
    Ok(Response::new(ReceiverStream::new(rx)))
}

fn not_faked<T>(call: &str) -> Result<Response<T>, Status> {
    Err(Status::unimplemented(format!("the fake has no {call}")))
}

#[tonic::async_trait]
impl Messaging for Service {
    async fn open_connection(
        &self,
        _: Request<pb::OpenConnectionRequest>,
    ) -> Result<Response<pb::OpenConnectionResponse>, Status> {
        Ok(Response::new(pb::OpenConnectionResponse {
            connection_id: "connection-1".into(),
            lease_ms: self.connection_lease_ms,
            node_id: "fake".into(),
        }))
    }

    async fn heartbeat(
        &self,
        r: Request<pb::HeartbeatRequest>,
    ) -> Result<Response<pb::HeartbeatResponse>, Status> {
        let _ = self.heartbeats.send(r.into_inner().connection_id);
        let answer = self
            .heartbeat_answers
            .lock()
            .expect("not poisoned")
            .pop_front();
        match answer {
            Some(Err(code)) => Err(Status::new(code, "scripted by the test")),
            Some(Ok(())) | None => Ok(Response::new(pb::HeartbeatResponse::default())),
        }
    }

    async fn close_connection(
        &self,
        _: Request<pb::CloseConnectionRequest>,
    ) -> Result<Response<pb::CloseConnectionResponse>, Status> {
        Ok(Response::new(pb::CloseConnectionResponse {}))
    }

    async fn create_session(
        &self,
        _: Request<pb::CreateSessionRequest>,
    ) -> Result<Response<pb::CreateSessionResponse>, Status> {
        Ok(Response::new(pb::CreateSessionResponse {
            session_id: "session-1".into(),
        }))
    }

    async fn close_session(
        &self,
        _: Request<pb::CloseSessionRequest>,
    ) -> Result<Response<pb::CloseSessionResponse>, Status> {
        not_faked("close_session")
    }

    async fn send(
        &self,
        _: Request<pb::SendRequest>,
    ) -> Result<Response<pb::SendResponse>, Status> {
        not_faked("send")
    }

    type PublishStream = ReceiverStream<Result<pb::PublishResponse, Status>>;

    async fn publish(
        &self,
        r: Request<Streaming<pb::PublishRequest>>,
    ) -> Result<Response<Self::PublishStream>, Status> {
        stream(r, &self.publishes)
    }

    async fn receive(
        &self,
        _: Request<pb::ReceiveRequest>,
    ) -> Result<Response<pb::ReceiveResponse>, Status> {
        scripted(&self.receive_answers, "receive")
    }

    type ConsumeStream = ReceiverStream<Result<pb::ConsumeResponse, Status>>;

    async fn consume(
        &self,
        r: Request<Streaming<pb::ConsumeRequest>>,
    ) -> Result<Response<Self::ConsumeStream>, Status> {
        stream(r, &self.consumes)
    }

    async fn ack(&self, _: Request<pb::AckRequest>) -> Result<Response<pb::AckResponse>, Status> {
        scripted(&self.ack_answers, "ack")
    }

    async fn nack(
        &self,
        _: Request<pb::NackRequest>,
    ) -> Result<Response<pb::NackResponse>, Status> {
        not_faked("nack")
    }

    async fn extend_lease(
        &self,
        _: Request<pb::ExtendLeaseRequest>,
    ) -> Result<Response<pb::ExtendLeaseResponse>, Status> {
        not_faked("extend_lease")
    }

    async fn recover(
        &self,
        _: Request<pb::RecoverRequest>,
    ) -> Result<Response<pb::RecoverResponse>, Status> {
        not_faked("recover")
    }

    async fn commit(
        &self,
        _: Request<pb::CommitRequest>,
    ) -> Result<Response<pb::CommitResponse>, Status> {
        not_faked("commit")
    }

    async fn rollback(
        &self,
        _: Request<pb::RollbackRequest>,
    ) -> Result<Response<pb::RollbackResponse>, Status> {
        not_faked("rollback")
    }

    async fn create_temporary_queue(
        &self,
        _: Request<pb::CreateTemporaryQueueRequest>,
    ) -> Result<Response<pb::CreateTemporaryQueueResponse>, Status> {
        not_faked("create_temporary_queue")
    }

    async fn delete_temporary_queue(
        &self,
        _: Request<pb::DeleteTemporaryQueueRequest>,
    ) -> Result<Response<pb::DeleteTemporaryQueueResponse>, Status> {
        not_faked("delete_temporary_queue")
    }

    async fn browse(
        &self,
        _: Request<pb::BrowseRequest>,
    ) -> Result<Response<pb::BrowseResponse>, Status> {
        not_faked("browse")
    }
}
