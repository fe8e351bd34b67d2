//! Client, connection (a lease kept alive by a background heartbeat) and session.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use ferry_proto::pb;
use ferry_proto::pb::admin_client::AdminClient;
use ferry_proto::pb::messaging_client::MessagingClient;
use tokio::sync::watch;
use tonic::transport::{Channel, Endpoint};
use tonic::Request;

use crate::message::{Message, Received};
use crate::ClientError;

/// How many times an acknowledgement answered `UNAVAILABLE` is sent again (pauses of 100 ms,
/// doubling: 1.5 s in all, on top of the node's own wait of up to 8 s for the queue's new
/// leader on each try).
pub const ACK_RETRIES: u32 = 4;

/// The pause before an acknowledgement's first retry; it doubles for each further one.
const ACK_RETRY_PAUSE_FIRST: std::time::Duration = std::time::Duration::from_millis(100);

/// The largest message the client takes from (or sends to) its server.
const RESPONSE_BYTES_MAX: usize = 1 << 30;

/// A handle to one server. Cheap to clone; all clones share one HTTP/2 connection.
#[derive(Debug, Clone)]
pub struct Client {
    channel: Channel,
}

impl Client {
    /// Connects to `addr`: `host:port` or `http://host:port`.
    pub async fn connect(addr: &str) -> Result<Self, ClientError> {
        let url = if addr.contains("://") {
            addr.to_string()
        } else {
            format!("http://{addr}")
        };
        let endpoint = Endpoint::from_shared(url.clone())
            .map_err(|e| ClientError::InvalidArgument(format!("bad server address {addr:?}: {e}")))?
            .connect_timeout(Duration::from_secs(5))
            .tcp_nodelay(true);
        let channel = endpoint
            .connect()
            .await
            .map_err(|source| ClientError::Connect { url, source })?;
        Ok(Self { channel })
    }

    /// A client over an existing channel (tests, custom transports).
    pub fn from_channel(channel: Channel) -> Self {
        Self { channel }
    }

    pub fn messaging(&self) -> MessagingClient<Channel> {
        // Deliveries come in batches (a `Consume` push or a receive of up to 1 000 messages of up
        // to the server's message size limit): larger than tonic's 4 MiB default.
        MessagingClient::new(self.channel.clone())
            .max_decoding_message_size(RESPONSE_BYTES_MAX)
            .max_encoding_message_size(RESPONSE_BYTES_MAX)
    }

    pub fn admin(&self) -> AdminClient<Channel> {
        AdminClient::new(self.channel.clone())
            .max_decoding_message_size(RESPONSE_BYTES_MAX)
            .max_encoding_message_size(RESPONSE_BYTES_MAX)
    }

    /// The `Cluster` service of the node: membership and the metadata group's status.
    pub fn cluster(&self) -> ferry_proto::pb::cluster_client::ClusterClient<Channel> {
        ferry_proto::pb::cluster_client::ClusterClient::new(self.channel.clone())
    }

    /// The `Node` service of the node: its version, configuration, readiness and peers.
    pub fn node(&self) -> ferry_proto::pb::node_client::NodeClient<Channel> {
        ferry_proto::pb::node_client::NodeClient::new(self.channel.clone())
    }

    /// Opens a connection and keeps it alive with heartbeats until it is closed or dropped.
    pub async fn open_connection(&self, client_id: &str) -> Result<Connection, ClientError> {
        let mut m = self.messaging();
        let r = m
            .open_connection(pb::OpenConnectionRequest {
                client_id: client_id.into(),
                lease_ms: None,
            })
            .await?
            .into_inner();
        let id = r.connection_id;
        let interval = Duration::from_millis((r.lease_ms / 3).max(100));
        let heartbeat = {
            let (mut m, id) = (m.clone(), id.clone());
            tokio::spawn(async move {
                let mut tick = tokio::time::interval(interval);
                tick.tick().await;
                loop {
                    tick.tick().await;
                    match m
                        .heartbeat(pb::HeartbeatRequest {
                            connection_id: id.clone(),
                        })
                        .await
                    {
                        Err(s) if s.code() == tonic::Code::NotFound => return,
                        Err(s) => tracing::warn!(error = %s, "heartbeat failed"),
                        Ok(_) => {}
                    }
                }
            })
        };
        Ok(Connection {
            client: self.clone(),
            id,
            heartbeat: Arc::new(AbortOnDrop(heartbeat)),
            acks_in_flight: Arc::new(watch::Sender::new(0)),
            failed_auto_acks: AutoAckFailures::default(),
        })
    }
}

#[derive(Debug)]
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// A connection: owns sessions and temporary queues; the server closes it if heartbeats stop.
#[derive(Debug, Clone)]
pub struct Connection {
    client: Client,
    id: String,
    heartbeat: Arc<AbortOnDrop>,
    /// Its sessions' acknowledgements still on their way (see [`AcksInFlight`]).
    acks_in_flight: Arc<watch::Sender<usize>>,
    /// Its sessions' acknowledgements after auto receives that failed or got no answer.
    failed_auto_acks: AutoAckFailures,
}

/// A live count of the acknowledgements sent after auto-acknowledge (or dups-ok) receives
/// returned that failed or got no answer in time (a broken connection, a node that went down
/// mid-call, a refusal). Each such receive's messages were still handed to the application; the
/// server may have applied the acknowledgement (its answer was lost) or not (the messages come
/// again when their leases run out, flagged redelivered). A non-zero count is what an
/// application that must not process a message twice watches for. It counts on after its
/// connection is dropped, so it can be read once the acknowledgements have settled.
#[derive(Debug, Clone, Default)]
pub struct AutoAckFailures(Arc<std::sync::atomic::AtomicU64>);

impl AutoAckFailures {
    /// Acknowledgements (each covering one receive's batch) that failed or got no answer so far.
    pub fn count(&self) -> u64 {
        self.0.load(std::sync::atomic::Ordering::Relaxed)
    }

    fn add_one(&self) {
        self.0.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }
}

/// Acknowledgements sent after an auto or dups-ok receive returned (see
/// [`Session::receive_selected`]) whose answers have not come: counted per session (its next
/// receive waits for them) and per connection (closing it waits for them).
#[derive(Debug, Clone)]
struct AcksInFlight {
    session: Arc<watch::Sender<usize>>,
    connection: Arc<watch::Sender<usize>>,
    /// The connection's count of those that failed or got no answer.
    failed: AutoAckFailures,
}

impl AcksInFlight {
    fn started(&self) {
        self.session.send_modify(|n| *n += 1);
        self.connection.send_modify(|n| *n += 1);
    }

    fn finished(&self) {
        self.session.send_modify(|n| *n -= 1);
        self.connection.send_modify(|n| *n -= 1);
    }
}

/// Waits until `count` is 0, or `bound` passes.
async fn settled(count: &watch::Sender<usize>, bound: Option<Duration>) {
    let mut watch = count.subscribe();
    let zero = watch.wait_for(|n| *n == 0);
    match bound {
        Some(bound) => {
            let _ = tokio::time::timeout(bound, zero).await;
        }
        None => {
            let _ = zero.await;
        }
    }
}

impl Connection {
    pub fn id(&self) -> &str {
        &self.id
    }

    /// The count of this connection's auto acknowledgements that failed or got no answer (see
    /// [`AutoAckFailures`]).
    pub fn auto_ack_failures(&self) -> AutoAckFailures {
        self.failed_auto_acks.clone()
    }

    pub async fn create_session(&self, ack_mode: pb::AckMode) -> Result<Session, ClientError> {
        let r = self
            .client
            .messaging()
            .create_session(pb::CreateSessionRequest {
                connection_id: self.id.clone(),
                ack_mode: ack_mode as i32,
            })
            .await?
            .into_inner();
        Ok(Session {
            client: self.client.clone(),
            id: r.session_id,
            ack_mode,
            _heartbeat: self.heartbeat.clone(),
            unacked: Arc::default(),
            acks_in_flight: AcksInFlight {
                session: Arc::new(watch::Sender::new(0)),
                connection: self.acks_in_flight.clone(),
                failed: self.failed_auto_acks.clone(),
            },
            publisher: crate::batch::Publisher::new(self.client.clone()),
            auto_dedup_ids: true,
        })
    }

    /// A queue that lives as long as this connection.
    pub async fn create_temporary_queue(&self) -> Result<String, ClientError> {
        let r = self
            .client
            .messaging()
            .create_temporary_queue(pb::CreateTemporaryQueueRequest {
                connection_id: self.id.clone(),
            })
            .await?;
        Ok(r.into_inner().queue)
    }

    /// Closes the connection: its sessions' unacknowledged messages return to their queues and its
    /// temporary queues are deleted. First waits (30 s at most) for the acknowledgements of auto
    /// and dups-ok receives still on their way, so what the application received does not come
    /// back.
    pub async fn close(self) -> Result<(), ClientError> {
        settled(&self.acks_in_flight, Some(AUTO_ACK_TIMEOUT)).await;
        self.heartbeat.0.abort();
        self.client
            .messaging()
            .close_connection(pb::CloseConnectionRequest {
                connection_id: self.id,
            })
            .await?;
        Ok(())
    }
}

/// How a receive waits and how much it takes.
#[derive(Debug, Clone, Copy, Default)]
pub struct ReceiveOptions {
    /// `None`: wait until a message comes (`receive()`); `Some(0)`: `receiveNoWait()`.
    pub timeout_ms: Option<i64>,
    /// At most this many messages (default 1).
    pub max_messages: u32,
    /// Lease of each delivery (the queue's default when `None`).
    pub lease_ms: Option<u64>,
}

impl ReceiveOptions {
    pub fn timeout_ms(ms: i64) -> Self {
        Self {
            timeout_ms: Some(ms),
            ..Self::default()
        }
    }

    pub fn no_wait() -> Self {
        Self::timeout_ms(0)
    }

    pub fn forever() -> Self {
        Self::default()
    }

    pub fn max(mut self, n: u32) -> Self {
        self.max_messages = n;
        self
    }
}

/// A session: a single-threaded context for sending and receiving, with one ack mode.
#[derive(Debug, Clone)]
pub struct Session {
    client: Client,
    id: String,
    ack_mode: pb::AckMode,
    /// A session keeps its connection's heartbeat going.
    _heartbeat: Arc<AbortOnDrop>,
    unacked: Arc<std::sync::Mutex<VecDeque<String>>>,
    /// Auto and dups-ok receives acknowledge after they return.
    acks_in_flight: AcksInFlight,
    /// Sends travel on one publish stream, pipelined (see `batch.rs`).
    publisher: crate::batch::Publisher,
    /// Give persistent messages without a dedup id one of the client's (see [`Session::send`]).
    auto_dedup_ids: bool,
}

/// How long an acknowledgement sent after an auto-acknowledge receive returned may take before
/// the session stops waiting for it (its message then comes again when its lease runs out,
/// flagged redelivered).
const AUTO_ACK_TIMEOUT: Duration = Duration::from_secs(30);

impl Session {
    pub fn id(&self) -> &str {
        &self.id
    }

    /// Sends a batch to one queue; returns the server-assigned message ids once every persistent
    /// message is on disk (on a replicated queue: on a majority of its replicas). Sends made
    /// concurrently on one session travel together on the session's publish stream (in the order
    /// they were made), transparently: each caller still gets its own ids, or its own error.
    ///
    /// **Failover.** A send answered `UNAVAILABLE` (the queue's shard leader died with the write
    /// unconfirmed, so it may or may not have been stored, or no leader is elected yet) is sent
    /// again by the client, up to [`crate::RESEND_ATTEMPTS`] times with a doubling pause from
    /// 100 ms, when that stores each message once at most:
    /// - every message carries a dedup id: the application's ([`Message::dedup_id`]), or one the
    ///   client gives each persistent message without one (a unique `ferry-client:...` id; see
    ///   [`Session::with_auto_dedup_ids`]). A resend whose first try was stored answers with
    ///   the first try's message ids and stores nothing new;
    /// - the session is not transacted: a transaction's sends and its commit are never resent
    ///   (a commit across a leader change fails `ABORTED`; the application rolls back and
    ///   starts over);
    /// - the queue remembers dedup ids (its `dedup_window_ms`, asked of the node before each
    ///   resend, is not 0 and at least 20 s longer than the send has been under way).
    ///
    /// So during a replicated queue's failover (1.5-3 s) a send takes longer and then succeeds;
    /// sends made meanwhile wait behind it, in order. Nothing is retried for any other error
    /// (`INVALID_ARGUMENT`, `NOT_FOUND`, `RESOURCE_EXHAUSTED` ...), a transport error (the node
    /// this client talks to is gone, and the session with it), or a send that is not safe to
    /// resend: those fail at once with the error unchanged. A send that fails every resend fails
    /// with the first error it met (`UNAVAILABLE`: it may or may not have been stored).
    pub async fn send(
        &self,
        queue: &str,
        messages: Vec<Message>,
    ) -> Result<Vec<String>, ClientError> {
        self.send_async(queue, messages).await
    }

    /// Pipelined send: the messages are on their way when this returns (in the order of calls),
    /// and the future resolves with their ids once the server confirms them durable. Keep many in
    /// flight (a window) for throughput without a task per send; dropping the future does not
    /// cancel the send (nor its resends, see [`Session::send`]).
    pub fn send_async(
        &self,
        queue: &str,
        messages: Vec<Message>,
    ) -> impl std::future::Future<Output = Result<Vec<String>, ClientError>> + Send + 'static {
        let transacted = self.ack_mode == pb::AckMode::Transacted;
        let auto_ids = self.auto_dedup_ids && !transacted && !self.publisher.is_unreplicated(queue);
        let messages: Vec<pb::OutgoingMessage> = messages
            .into_iter()
            .map(|Message(mut m)| {
                let persistent = m.delivery_mode != pb::DeliveryMode::NonPersistent as i32;
                if auto_ids && persistent && m.dedup_id.is_empty() {
                    m.dedup_id = self.publisher.next_dedup_id();
                }
                m
            })
            .collect();
        let resendable = !transacted && messages.iter().all(|m| !m.dedup_id.is_empty());
        self.publisher.send(&self.id, queue, messages, resendable)
    }

    /// This session, giving (`true`, the default) or not giving (`false`) each persistent
    /// message sent without a dedup id one of the client's own, unique ones, so that a send
    /// can be resent safely after a failover (see [`Session::send`]). Transacted sessions and
    /// non-persistent messages never get one, nor messages to a queue the server said is kept
    /// on one node (replication factor 1: no failover to resend across; each publish confirm
    /// says, and until the first one the client gives ids). What it costs: the queue remembers each id for
    /// its dedup window (10 min by default; a small record in memory and on disk, written
    /// with the message), and a queue keeps at most 100 000 ids, forgetting those
    /// closest to the end of their window first: a producer sending faster than 100 000
    /// messages per window shortens how long the application's own ids on that queue are
    /// remembered. With `false`, only messages the application gave a dedup id are resent.
    pub fn with_auto_dedup_ids(mut self, on: bool) -> Self {
        self.auto_dedup_ids = on;
        self
    }

    /// Receives. In auto and dups-ok mode the messages are acknowledged once they are returned
    /// (JMS: when `receive` has returned), in the background: the session's next receive, and
    /// closing the session or its connection, wait for that acknowledgement; otherwise call
    /// [`Session::ack`]. A receive dropped before it returns (a caller's timeout) acknowledges
    /// nothing: its messages come again when their leases run out, flagged redelivered.
    pub async fn receive(
        &self,
        queue: &str,
        opts: ReceiveOptions,
    ) -> Result<Vec<Received>, ClientError> {
        self.receive_selected(queue, "", opts).await
    }

    /// [`Session::receive`] of only the messages that match a JMS message selector.
    pub async fn receive_selected(
        &self,
        queue: &str,
        selector: &str,
        opts: ReceiveOptions,
    ) -> Result<Vec<Received>, ClientError> {
        let req = pb::ReceiveRequest {
            session_id: self.id.clone(),
            queue: queue.into(),
            selector: selector.into(),
            max_messages: opts.max_messages.max(1),
            wait_ms: opts.timeout_ms,
            lease_ms: opts.lease_ms,
        };
        // The previous receive's acknowledgement first: a session's receives see the queue as
        // its own earlier receives left it.
        settled(&self.acks_in_flight.session, None).await;
        let deliveries = self
            .client
            .messaging()
            .receive(Request::new(req))
            .await?
            .into_inner()
            .deliveries;
        let received: Vec<Received> = deliveries
            .into_iter()
            .map(|delivery| Received { delivery })
            .collect();
        if self.acknowledges_on_receive() && !received.is_empty() {
            self.acknowledge_after_return(&received);
        }
        self.track_unacked(&received);
        Ok(received)
    }

    /// Auto and dups-ok: acknowledges what a receive hands over once it is handed over, never
    /// before. Nothing between the server's answer and the return awaits, so a caller that stops
    /// waiting (its own timeout) either has the messages or left them unacknowledged (they come
    /// again when their leases run out, flagged redelivered).
    /// Postmortem (bug 2, the chaos harness's `cluster` scenario, seed 201): the receive
    /// acknowledged first and returned after the answer; a partition held the answer back, the
    /// application's timeout dropped the receive, and the message, removed at the server, was
    /// lost. Whatever becomes of this acknowledgement, the messages are the application's: some
    /// leases may run out before it (those messages come again, flagged), or its answer may be
    /// lost with the connection after the server applied it.
    fn acknowledge_after_return(&self, received: &[Received]) {
        let session = self.clone();
        let received = received.to_vec();
        self.acks_in_flight.started();
        tokio::spawn(async move {
            let outcome = tokio::time::timeout(AUTO_ACK_TIMEOUT, session.ack(&received)).await;
            let error = match outcome {
                Ok(Ok(())) => None,
                Ok(Err(e)) => Some(e.to_string()),
                Err(_) => Some(format!("no answer in {AUTO_ACK_TIMEOUT:?}")),
            };
            if let Some(error) = error {
                session.acks_in_flight.failed.add_one();
                tracing::warn!(%error, messages = received.len(), "auto-acknowledge failed or its outcome is unknown; the messages were handed over and may come again, flagged redelivered");
            }
            session.acks_in_flight.finished();
        });
    }

    /// Acknowledges messages. In client-acknowledge mode this acknowledges, as JMS
    /// `Message.acknowledge()` does, every message this session handed to the application up to
    /// the latest one named; otherwise exactly the ones named. Fails with FAILED_PRECONDITION if a
    /// named delivery is no longer live (its lease ran out: it is or will be redelivered).
    pub async fn ack(&self, received: &[Received]) -> Result<(), ClientError> {
        let named: Vec<String> = received
            .iter()
            .map(|r| r.receipt_handle().to_string())
            .collect();
        let implied = self.implied_by(&named);
        if !implied.is_empty() {
            match self.send_ack(implied.clone()).await {
                // An earlier delivery whose lease ran out is redelivered; not this call's mistake.
                Err(ClientError::Status(s)) if s.code() == tonic::Code::FailedPrecondition => {}
                other => other?,
            }
        }
        let result = self.send_ack(named.clone()).await;
        let acked_or_stale = match &result {
            Ok(()) => true,
            Err(ClientError::Status(s)) => s.code() == tonic::Code::FailedPrecondition,
            Err(_) => false,
        };
        if acked_or_stale {
            self.unacked()
                .retain(|h| !named.contains(h) && !implied.contains(h));
        }
        result
    }

    /// Client-acknowledge mode: the deliveries handed over before the latest of `named` that an
    /// acknowledgement of `named` covers too (none in other modes).
    fn implied_by(&self, named: &[String]) -> Vec<String> {
        if self.ack_mode != pb::AckMode::Client {
            return vec![];
        }
        let unacked = self.unacked();
        let upto = named
            .iter()
            .filter_map(|h| unacked.iter().position(|u| u == h))
            .max();
        upto.map_or_else(Vec::new, |upto| {
            unacked
                .iter()
                .take(upto + 1)
                .filter(|h| !named.contains(h))
                .cloned()
                .collect()
        })
    }

    /// What acknowledging `received` acknowledges (with what client mode implies), taken off the
    /// unacknowledged list.
    pub(crate) fn take_acknowledged(&self, received: &[Received]) -> Vec<String> {
        let mut handles: Vec<String> = received
            .iter()
            .map(|r| r.receipt_handle().to_string())
            .collect();
        let implied = self.implied_by(&handles);
        handles.extend(implied);
        self.unacked().retain(|h| !handles.contains(h));
        handles
    }

    /// Auto and dups-ok sessions acknowledge what a receive hands over.
    pub(crate) fn acknowledges_on_receive(&self) -> bool {
        matches!(
            self.ack_mode,
            pb::AckMode::Auto | pb::AckMode::DupsOk | pb::AckMode::Unspecified
        )
    }

    /// Client mode and transactions: remembers what was handed over and not yet acknowledged (in
    /// client mode, what a cumulative acknowledge covers; in a transaction, what commit
    /// acknowledges).
    pub(crate) fn track_unacked(&self, received: &[Received]) {
        if matches!(self.ack_mode, pb::AckMode::Client | pb::AckMode::Transacted) {
            self.unacked()
                .extend(received.iter().map(|r| r.receipt_handle().to_string()));
        }
    }

    pub(crate) fn client(&self) -> &Client {
        &self.client
    }

    /// Acknowledges `receipt_handles`. An acknowledgement answered `UNAVAILABLE` by the node
    /// (its queue's leader died with the call under way: the outcome is unknown, and a
    /// replicated queue's new leader still holds the deliveries) is sent again, up to
    /// [`ACK_RETRIES`] times with a doubling pause; an acknowledgement is idempotent in effect
    /// (a delivery acknowledged twice is gone once). A retry answered `FAILED_PRECONDITION`
    /// (not a live delivery) cannot tell whether the first attempt was applied or the lease ran
    /// out: the acknowledgement fails with the first attempt's `UNAVAILABLE` (outcome
    /// unknown), saying so.
    async fn send_ack(&self, receipt_handles: Vec<String>) -> Result<(), ClientError> {
        let req = pb::AckRequest {
            session_id: self.id.clone(),
            receipt_handles,
        };
        let mut pause = ACK_RETRY_PAUSE_FIRST;
        let mut unknown: Option<tonic::Status> = None;
        for attempt in 0..=ACK_RETRIES {
            let status = match self.client.messaging().ack(req.clone()).await {
                Ok(_) => return Ok(()),
                Err(s) => s,
            };
            if crate::batch::transient(&status) && attempt < ACK_RETRIES {
                unknown.get_or_insert(status);
                tokio::time::sleep(pause).await;
                pause *= 2;
                continue;
            }
            return Err(match (&unknown, status.code()) {
                (Some(first), tonic::Code::FailedPrecondition) => {
                    ClientError::Status(tonic::Status::unavailable(format!(
                        "{} (sent again, it was answered \"{}\": the first attempt may have \
                         been applied)",
                        first.message(),
                        status.message()
                    )))
                }
                _ => status.into(),
            });
        }
        Err(unknown.map_or_else(
            || ClientError::Status(tonic::Status::unavailable("acknowledgement not sent")),
            Into::into,
        ))
    }

    /// Client-acknowledge bookkeeping: deliveries handed to the application, not yet acknowledged.
    fn unacked(&self) -> std::sync::MutexGuard<'_, VecDeque<String>> {
        self.unacked
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Gives messages back: they are redelivered through their queue's redelivery policy, or
    /// after `delay_ms` when given.
    pub async fn nack(
        &self,
        received: &[Received],
        delay_ms: Option<u64>,
    ) -> Result<(), ClientError> {
        self.send_nack(received, delay_ms, false, "").await
    }

    async fn send_nack(
        &self,
        received: &[Received],
        delay_ms: Option<u64>,
        dead_letter: bool,
        reason: &str,
    ) -> Result<(), ClientError> {
        let receipt_handles: Vec<String> = received
            .iter()
            .map(|r| r.receipt_handle().to_string())
            .collect();
        self.unacked().retain(|h| !receipt_handles.contains(h));
        let req = pb::NackRequest {
            session_id: self.id.clone(),
            receipt_handles,
            delay_ms,
            dead_letter,
            reason: reason.into(),
        };
        self.client.messaging().nack(req).await?;
        Ok(())
    }

    /// Rejects messages: they go straight to their queue's dead-letter queue (reason `rejected`)
    /// instead of being redelivered.
    pub async fn reject(&self, received: &[Received], reason: &str) -> Result<(), ClientError> {
        self.send_nack(received, None, true, reason).await
    }

    /// Transacted sessions: makes every send of the transaction visible and acknowledges every
    /// message received in it, atomically. If a received message's lease ran out meanwhile the
    /// whole transaction is rolled back and this fails with ABORTED.
    pub async fn commit(&self) -> Result<(), ClientError> {
        let receipt_handles: Vec<String> = self.unacked().drain(..).collect();
        self.client
            .messaging()
            .commit(pb::CommitRequest {
                session_id: self.id.clone(),
                receipt_handles,
            })
            .await?;
        Ok(())
    }

    /// Transacted sessions: drops the transaction's sends and redelivers what it received
    /// (through each queue's redelivery policy). Returns how many messages come back.
    pub async fn rollback(&self) -> Result<u32, ClientError> {
        self.unacked().clear();
        let r = self
            .client
            .messaging()
            .rollback(pb::RollbackRequest {
                session_id: self.id.clone(),
            })
            .await?;
        Ok(r.into_inner().redelivered)
    }

    /// Redelivers every unacknowledged message of this session.
    pub async fn recover(&self) -> Result<u32, ClientError> {
        self.unacked().clear();
        let r = self
            .client
            .messaging()
            .recover(pb::RecoverRequest {
                session_id: self.id.clone(),
            })
            .await?;
        Ok(r.into_inner().redelivered)
    }

    /// Closes the session; its unacknowledged messages return to their queues at once. First
    /// waits (30 s at most) for the acknowledgements of auto and dups-ok receives still on their
    /// way, so what the application received does not come back.
    pub async fn close(self) -> Result<u32, ClientError> {
        settled(&self.acks_in_flight.session, Some(AUTO_ACK_TIMEOUT)).await;
        let r = self
            .client
            .messaging()
            .close_session(pb::CloseSessionRequest {
                session_id: self.id,
            })
            .await?;
        Ok(r.into_inner().released)
    }
}

#[cfg(test)]
mod tests;
