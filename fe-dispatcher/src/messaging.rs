//! The client-facing `Messaging` service: decode and check the call, keep the connection and
//! session table, forward to the owning back-end, answer.

use std::collections::BTreeMap;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use ferry_kernel::{ClockRef, NodeId, QueueName, ReceiptHandle, SessionId};
use ferry_proto::pb;
use tonic::{Request, Response, Status, Streaming};

use crate::deadline::grpc_timeout;
use crate::error::Error;
use crate::router::Router;
use crate::sessions::{Closed, Sessions};
use crate::FrontendConfig;

/// See the module docs.
#[derive(Debug, Clone)]
pub struct MessagingService {
    pub(crate) config: FrontendConfig,
    pub(crate) router: Arc<Router>,
    pub(crate) sessions: Arc<Sessions>,
    /// Becomes true when the node stops: long polls answer empty, streams end.
    pub(crate) stopping: tokio::sync::watch::Receiver<bool>,
    /// What this front-end saw that operators watch for (sends to a reply queue that is gone).
    pub(crate) events: tokio::sync::broadcast::Sender<pb::Event>,
    /// Wall time, for event stamps and lease expiries shown to clients.
    pub(crate) clock: ClockRef,
}

pub(crate) fn queue_name(name: &str) -> Result<QueueName, Status> {
    Ok(QueueName::new(name).map_err(Error::from)?)
}

pub(crate) fn session_id(id: &str) -> Result<SessionId, Status> {
    Ok(SessionId::from_str(id).map_err(Error::from)?)
}

type Reply<T> = Result<Response<T>, Status>;

impl MessagingService {
    pub(crate) fn new(
        config: FrontendConfig,
        router: Arc<Router>,
        sessions: Arc<Sessions>,
        stopping: tokio::sync::watch::Receiver<bool>,
        clock: ClockRef,
    ) -> Self {
        Self {
            config,
            router,
            sessions,
            stopping,
            events: tokio::sync::broadcast::channel(1_024).0,
            clock,
        }
    }

    /// Closes connections whose lease ran out, every `period`, for ever.
    pub(crate) async fn reap_expired_connections(self, period: Duration) {
        let mut tick = tokio::time::interval(period);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            for (_, closed) in self.sessions.close_expired(tokio::time::Instant::now()) {
                self.release(closed).await;
            }
        }
    }

    /// Tells the back-ends that sessions ended (their leases return at once) and deletes the
    /// temporary queues of a closed connection. Returns how many messages were released.
    pub(crate) async fn release(&self, closed: Closed) -> u64 {
        let mut released = 0;
        for (session, queues) in closed.sessions {
            released += self.release_session_queues(session, queues, false).await;
        }
        for q in closed.temporary_queues {
            if let Ok(be) = self.router.for_queue(&q) {
                let req = pb::BackendQueueRequest {
                    name: q.to_string(),
                };
                if let Err(e) = be.delete_queue(Request::new(req)).await {
                    tracing::warn!(queue = %q, error = %e, "could not delete a temporary queue");
                }
            }
        }
        released
    }

    async fn release_session_queues(
        &self,
        session: SessionId,
        queues: Vec<QueueName>,
        recover: bool,
    ) -> u64 {
        self.session_queues_op(session, queues, recover, false)
            .await
    }

    /// Tells the back-ends holding a session's leases that it is alive (its connection's
    /// heartbeat): they renew its delivery leases.
    async fn renew_session_queues(&self, session: SessionId, queues: Vec<QueueName>) -> u64 {
        self.session_queues_op(session, queues, false, true).await
    }

    async fn session_queues_op(
        &self,
        session: SessionId,
        queues: Vec<QueueName>,
        recover: bool,
        renew: bool,
    ) -> u64 {
        // One call per owning back-end.
        let mut by_node: BTreeMap<NodeId, Vec<String>> = BTreeMap::new();
        for q in queues {
            by_node
                .entry(self.router.owner_of(&q).clone())
                .or_default()
                .push(q.to_string());
        }
        let mut released = 0;
        for (node, queues) in by_node {
            let Ok(be) = self.router.node(&node) else {
                continue;
            };
            let req = pb::BackendReleaseSessionRequest {
                session_id: session.to_string(),
                queues,
                recover,
                renew,
            };
            match be.release_session(Request::new(req)).await {
                Ok(r) => released += r.into_inner().count,
                // The back-end's own lease timers return the messages if it cannot be told.
                Err(e) => {
                    tracing::warn!(%node, session = %self.sessions.public_session(session), error = %e, "could not release a session's leases")
                }
            }
        }
        released
    }

    /// Applies `op` to receipt handles for the session `session_id` names (empty: none),
    /// grouped by owning back-end and queue. Returns the new lease expiry of each handle (0 where
    /// not applicable) and the handles that were not live deliveries of that session (or not
    /// receipt handles at all), with why.
    pub(crate) async fn lease_op<F, Fut>(
        &self,
        session_id: &str,
        handles: &[String],
        op: F,
    ) -> Result<(Vec<u64>, Vec<String>), Status>
    where
        F: Fn(crate::BackendRef, pb::BackendLeaseRequest) -> Fut,
        Fut: std::future::Future<Output = Result<Response<pb::BackendLeaseResponse>, Status>>,
    {
        let mut groups: BTreeMap<(NodeId, QueueName), Vec<(usize, String)>> = BTreeMap::new();
        let mut expires = vec![0; handles.len()];
        let mut stale = vec![];
        for (i, h) in handles.iter().enumerate() {
            match ReceiptHandle::from_str(h) {
                Ok(r) => groups
                    .entry((r.node, r.queue))
                    .or_default()
                    .push((i, h.clone())),
                // Answered for this handle alone: one bad handle on a stream must not end it
                // (and strand its deliveries until their leases run out).
                Err(e) => stale.push(format!("{} ({e})", ferry_kernel::shown(h))),
            }
        }
        for ((node, queue), items) in groups {
            let be = match self.router.node(&node) {
                Ok(be) => be.clone(),
                Err(_) => {
                    let handle = items
                        .first()
                        .map(|(_, h)| ferry_kernel::shown(h))
                        .unwrap_or_default();
                    return Err(Error::ReceiptFromUnknownNode { handle, node }.into());
                }
            };
            let req = pb::BackendLeaseRequest {
                queue: queue.to_string(),
                receipt_handles: items.iter().map(|(_, h)| h.clone()).collect(),
                session_id: session_id.to_owned(),
                ..Default::default()
            };
            let resp = op(be, req).await?.into_inner();
            for ((i, h), (err, at)) in items
                .iter()
                .zip(resp.errors.iter().zip(resp.lease_expires_at_ms))
            {
                if err.is_empty() {
                    expires[*i] = at;
                } else {
                    // A parsed handle is short (its queue name is bounded): given back whole,
                    // so a client can match it.
                    stale.push(format!("{h} ({err})"));
                }
            }
        }
        Ok((expires, stale))
    }

    /// [`Self::lease_op`] for a unary call: INVALID_ARGUMENT if a handle is not a receipt
    /// handle, FAILED_PRECONDITION if any was not a live delivery of the session.
    async fn by_receipts<F, Fut>(
        &self,
        session_id: &str,
        handles: Vec<String>,
        op: F,
    ) -> Result<Vec<u64>, Status>
    where
        F: Fn(crate::BackendRef, pb::BackendLeaseRequest) -> Fut,
        Fut: std::future::Future<Output = Result<Response<pb::BackendLeaseResponse>, Status>>,
    {
        for h in &handles {
            ReceiptHandle::from_str(h).map_err(Error::from)?;
        }
        let (expires, stale) = self.lease_op(session_id, &handles, op).await?;
        if stale.is_empty() {
            Ok(expires)
        } else {
            // A few are enough to say why; the answer stays small however many were named.
            const SHOWN: usize = 5;
            let mut detail = stale[..stale.len().min(SHOWN)].join("; ");
            if stale.len() > SHOWN {
                detail.push_str(&format!("; and {} more", stale.len() - SHOWN));
            }
            Err(Error::StaleReceipts {
                stale: stale.len(),
                total: handles.len(),
                detail,
            }
            .into())
        }
    }

    pub(crate) fn touch_session(
        &self,
        id: &str,
        queue: Option<&QueueName>,
    ) -> Result<Option<SessionId>, Status> {
        if id.is_empty() {
            return Ok(None);
        }
        let sid = session_id(id)?;
        self.sessions.use_session(sid, queue)?;
        Ok(Some(sid))
    }

    /// Sends messages to one queue (a unary `Send`, or a run of `Publish` requests): checks the
    /// session and the reply queues, forwards to the owning back-end. Returns the message ids.
    pub(crate) async fn send_messages(&self, r: pb::SendRequest) -> Result<Vec<String>, Status> {
        let queue = queue_name(&r.queue)?;
        let session = self.touch_session(&r.session_id, None)?;
        let transacted = match session {
            Some(sid) => self
                .sessions
                .tx_touch(sid, &queue, self.router.owner_of(&queue))?,
            None => false,
        };
        // A reply must have somewhere to go: a missing reply queue (a deleted temporary queue
        // above all) fails the send now instead of losing the reply later.
        let mut checked: Vec<&str> = vec![];
        for m in &r.messages {
            if m.reply_to.is_empty() || checked.contains(&m.reply_to.as_str()) {
                continue;
            }
            let reply_to = QueueName::new(m.reply_to.as_str())
                .map_err(|e| Status::invalid_argument(format!("reply_to: {e}")))?;
            let be = self.router.for_queue(&reply_to)?;
            be.get_queue(Request::new(pb::BackendQueueRequest {
                name: reply_to.to_string(),
            }))
            .await
            .map_err(|e| Status::new(e.code(), format!("reply_to: {}", e.message())))?;
            checked.push(&m.reply_to);
        }
        let be = self.router.for_queue(&queue)?;
        // A reply (it carries a correlation id, or goes to a temporary queue) whose queue is gone
        // is worth an operator's attention: its requester gave up or went away.
        let is_reply = queue.as_str().starts_with("tmp.")
            || r.messages.iter().any(|m| m.correlation_id.is_some());
        let sid = session.filter(|_| transacted);
        let out = be
            .send(Request::new(pb::BackendSendRequest {
                queue: r.queue,
                messages: r.messages,
                session_id: if transacted {
                    r.session_id
                } else {
                    String::new()
                },
                transacted,
            }))
            .await
            .inspect_err(|e| {
                if is_reply && e.code() == tonic::Code::NotFound {
                    let _ = self.events.send(pb::Event {
                        at_ms: self.clock.now_ms(),
                        kind: "reply-queue-missing".into(),
                        queue: queue.to_string(),
                        node: self.router.local_node().to_string(),
                        ..Default::default()
                    });
                }
            })?
            .into_inner();
        if let Some(sid) = sid {
            self.sessions.tx_staged_by(sid, out.incarnation)?;
        }
        Ok(out.message_ids)
    }

    /// The back-end wait for a receive: the asked wait, bounded by the call's deadline (less a
    /// margin so the empty answer arrives in time). `None`: until cancelled.
    fn backend_wait(
        &self,
        wait_ms: Option<i64>,
        deadline: Option<Duration>,
    ) -> Result<Option<u64>, Status> {
        let asked = match wait_ms {
            Some(w) if w < 0 => return Err(Error::NegativeWait { wait_ms: w }.into()),
            Some(w) => Some(w.unsigned_abs()),
            None => None,
        };
        let by_deadline = deadline.map(|d| {
            let ms = u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
            // At least 1 ms, so a short deadline still waits a little rather than not at all.
            ms.saturating_sub(self.config.deadline_margin_ms.min(ms / 10))
                .max(1)
        });
        Ok(match (asked, by_deadline) {
            (Some(0), _) => Some(0),
            (Some(a), Some(d)) => Some(a.min(d)),
            (a, d) => a.or(d),
        })
    }
}

impl MessagingService {
    /// Commits a transaction at its back-end: its staged sends and held acknowledgements (which
    /// must all belong to that back-end), at once.
    async fn commit_tx(
        &self,
        id: SessionId,
        tx: &crate::sessions::Transaction,
    ) -> Result<(), Status> {
        let mut by_queue: BTreeMap<QueueName, Vec<String>> =
            tx.queues.iter().map(|q| (q.clone(), vec![])).collect();
        let mut node = tx.node.clone();
        for h in &tx.acks {
            let r = ReceiptHandle::from_str(h).map_err(Error::from)?;
            match &node {
                Some(n) if *n != r.node => {
                    return Err(Error::TransactionSpansBackends {
                        session: id.to_string(),
                        first: n.clone(),
                        queue: r.queue.to_string(),
                        second: r.node,
                    }
                    .into())
                }
                Some(_) => {}
                None => node = Some(r.node.clone()),
            }
            by_queue.entry(r.queue).or_default().push(h.clone());
        }
        let Some(node) = node else {
            return Ok(()); // nothing was done in this transaction
        };
        let req = pb::BackendCommitRequest {
            session_id: id.to_string(),
            incarnation: tx.incarnation,
            queues: by_queue
                .into_iter()
                .map(|(queue, receipt_handles)| pb::BackendTxQueue {
                    queue: queue.to_string(),
                    receipt_handles,
                })
                .collect(),
        };
        self.router.node(&node)?.commit(Request::new(req)).await?;
        Ok(())
    }

    /// Rolls back a transaction at its back-end. Returns how many messages come back.
    async fn rollback_tx(
        &self,
        id: SessionId,
        tx: &crate::sessions::Transaction,
    ) -> Result<u64, Status> {
        let Some(node) = &tx.node else {
            return Ok(0);
        };
        let req = pb::BackendRollbackRequest {
            session_id: id.to_string(),
            queues: tx.queues.iter().map(ToString::to_string).collect(),
        };
        let out = self.router.node(node)?.rollback(Request::new(req)).await;
        match out {
            Ok(r) => Ok(r.into_inner().count),
            Err(e) => {
                tracing::warn!(session = %self.sessions.public_session(id), error = %e, "could not roll back a transaction; its leases return when they expire");
                Err(e)
            }
        }
    }
}

#[tonic::async_trait]
impl pb::messaging_server::Messaging for MessagingService {
    async fn open_connection(
        &self,
        req: Request<pb::OpenConnectionRequest>,
    ) -> Reply<pb::OpenConnectionResponse> {
        let r = req.into_inner();
        let (connection_id, lease_ms) = self.sessions.open(r.client_id, r.lease_ms)?;
        Ok(Response::new(pb::OpenConnectionResponse {
            connection_id,
            lease_ms,
            node_id: self.router.local_node().to_string(),
        }))
    }

    async fn heartbeat(&self, req: Request<pb::HeartbeatRequest>) -> Reply<pb::HeartbeatResponse> {
        let connection = req.into_inner().connection_id;
        let at = self.sessions.touch(&connection)?;
        // A consumer heartbeat: the connection's sessions are alive, so their deliveries' leases
        // are renewed (each for its own length).
        for (session, queues) in self.sessions.connection_sessions(&connection)? {
            self.renew_session_queues(session, queues).await;
        }
        let left = at.saturating_duration_since(tokio::time::Instant::now());
        let lease_expires_at_ms =
            self.clock.now_ms() + u64::try_from(left.as_millis()).unwrap_or(0);
        Ok(Response::new(pb::HeartbeatResponse {
            lease_expires_at_ms,
        }))
    }

    async fn close_connection(
        &self,
        req: Request<pb::CloseConnectionRequest>,
    ) -> Reply<pb::CloseConnectionResponse> {
        let closed = self
            .sessions
            .close_connection(&req.into_inner().connection_id)?;
        self.release(closed).await;
        Ok(Response::new(pb::CloseConnectionResponse {}))
    }

    async fn create_session(
        &self,
        req: Request<pb::CreateSessionRequest>,
    ) -> Reply<pb::CreateSessionResponse> {
        let r = req.into_inner();
        let mode = pb::AckMode::try_from(r.ack_mode).map_err(|_| {
            Status::invalid_argument(format!("ack_mode {} is not an ack mode", r.ack_mode))
        })?;
        let id = self.sessions.create_session(&r.connection_id, mode)?;
        Ok(Response::new(pb::CreateSessionResponse {
            session_id: id.to_string(),
        }))
    }

    async fn close_session(
        &self,
        req: Request<pb::CloseSessionRequest>,
    ) -> Reply<pb::CloseSessionResponse> {
        let closed = self
            .sessions
            .close_session(session_id(&req.into_inner().session_id)?)?;
        let released = self.release(closed).await;
        Ok(Response::new(pb::CloseSessionResponse {
            released: u32::try_from(released).unwrap_or(u32::MAX),
        }))
    }

    async fn send(&self, req: Request<pb::SendRequest>) -> Reply<pb::SendResponse> {
        let message_ids = self.send_messages(req.into_inner()).await?;
        Ok(Response::new(pb::SendResponse { message_ids }))
    }

    type PublishStream = crate::publish::PublishStream;

    async fn publish(
        &self,
        req: Request<Streaming<pb::PublishRequest>>,
    ) -> Reply<Self::PublishStream> {
        Ok(Response::new(crate::publish::start(
            self.clone(),
            req.into_inner(),
        )))
    }

    async fn receive(&self, req: Request<pb::ReceiveRequest>) -> Reply<pb::ReceiveResponse> {
        let deadline = grpc_timeout(req.metadata());
        let r = req.into_inner();
        let queue = queue_name(&r.queue)?;
        let wait_ms = self.backend_wait(r.wait_ms, deadline)?;
        if let Some(sid) = self.touch_session(&r.session_id, Some(&queue))? {
            self.sessions
                .tx_touch(sid, &queue, self.router.owner_of(&queue))?;
        }
        let be = self.router.for_queue(&queue)?;
        let mut fwd = Request::new(pb::BackendReceiveRequest {
            queue: r.queue,
            session_id: r.session_id,
            selector: r.selector,
            max_messages: r.max_messages,
            wait_ms,
            lease_ms: r.lease_ms,
            clamp_max_messages: false,
            consumer: 0,
        });
        if let Some(d) = deadline {
            fwd.set_timeout(d);
        }
        let mut stopping = self.stopping.clone();
        let deliveries = tokio::select! {
            out = be.receive(fwd) => out?.into_inner().deliveries,
            // The node is stopping: a long poll ends empty (dropping the receive removes it).
            () = crate::stopped(&mut stopping) => vec![],
        };
        Ok(Response::new(pb::ReceiveResponse { deliveries }))
    }

    type ConsumeStream = crate::consume::ConsumeStream;

    async fn consume(
        &self,
        req: Request<Streaming<pb::ConsumeRequest>>,
    ) -> Reply<Self::ConsumeStream> {
        crate::consume::start(self.clone(), req.into_inner())
            .await
            .map(Response::new)
    }

    async fn ack(&self, req: Request<pb::AckRequest>) -> Reply<pb::AckResponse> {
        let r = req.into_inner();
        if let Some(sid) = self.touch_session(&r.session_id, None)? {
            // A transacted session's acknowledgements take effect at commit.
            for h in &r.receipt_handles {
                ReceiptHandle::from_str(h).map_err(Error::from)?;
            }
            if self.sessions.tx_hold_acks(sid, &r.receipt_handles)? {
                return Ok(Response::new(pb::AckResponse {}));
            }
        }
        self.by_receipts(&r.session_id, r.receipt_handles, |be, req| async move {
            be.ack(Request::new(req)).await
        })
        .await?;
        Ok(Response::new(pb::AckResponse {}))
    }

    async fn nack(&self, req: Request<pb::NackRequest>) -> Reply<pb::NackResponse> {
        let r = req.into_inner();
        self.touch_session(&r.session_id, None)?;
        let (delay_ms, dead_letter) = (r.delay_ms, r.dead_letter);
        if dead_letter && !r.reason.is_empty() {
            tracing::info!(reason = %ferry_kernel::shown(&r.reason), handles = r.receipt_handles.len(), "consumer rejected messages");
        }
        self.by_receipts(&r.session_id, r.receipt_handles, |be, req| async move {
            be.nack(Request::new(pb::BackendLeaseRequest {
                delay_ms,
                dead_letter,
                ..req
            }))
            .await
        })
        .await?;
        Ok(Response::new(pb::NackResponse {}))
    }

    async fn extend_lease(
        &self,
        req: Request<pb::ExtendLeaseRequest>,
    ) -> Reply<pb::ExtendLeaseResponse> {
        let r = req.into_inner();
        self.touch_session(&r.session_id, None)?;
        let lease_ms = r.lease_ms;
        let lease_expires_at_ms = self
            .by_receipts(&r.session_id, r.receipt_handles, |be, req| async move {
                be.extend_lease(Request::new(pb::BackendLeaseRequest { lease_ms, ..req }))
                    .await
            })
            .await?;
        Ok(Response::new(pb::ExtendLeaseResponse {
            lease_expires_at_ms,
        }))
    }

    async fn recover(&self, req: Request<pb::RecoverRequest>) -> Reply<pb::RecoverResponse> {
        let id = session_id(&req.into_inner().session_id)?;
        self.sessions.use_session(id, None)?;
        let queues = self.sessions.session_queues(id)?;
        let n = self.release_session_queues(id, queues, true).await;
        Ok(Response::new(pb::RecoverResponse {
            redelivered: u32::try_from(n).unwrap_or(u32::MAX),
        }))
    }

    async fn commit(&self, req: Request<pb::CommitRequest>) -> Reply<pb::CommitResponse> {
        let r = req.into_inner();
        let id = session_id(&r.session_id)?;
        self.sessions.use_session(id, None)?;
        for h in &r.receipt_handles {
            ReceiptHandle::from_str(h).map_err(Error::from)?;
        }
        let mut tx = self.sessions.tx_take(id)?;
        tx.acks.extend(r.receipt_handles);
        let Err(e) = self.commit_tx(id, &tx).await else {
            return Ok(Response::new(pb::CommitResponse {}));
        };
        // JMS: a commit that fails rolls the transaction back (the back-end already did, if it
        // refused; this covers a commit that never reached it).
        if self.rollback_tx(id, &tx).await.is_err() {
            self.sessions.tx_restore(id, tx);
        }
        Err(Error::RolledBack {
            session: id.to_string(),
            reason: e.message().to_owned(),
        }
        .into())
    }

    async fn rollback(&self, req: Request<pb::RollbackRequest>) -> Reply<pb::RollbackResponse> {
        let id = session_id(&req.into_inner().session_id)?;
        self.sessions.use_session(id, None)?;
        let tx = self.sessions.tx_take(id)?;
        let redelivered = match self.rollback_tx(id, &tx).await {
            Ok(n) => n,
            Err(e) => {
                self.sessions.tx_restore(id, tx);
                return Err(e);
            }
        };
        Ok(Response::new(pb::RollbackResponse {
            redelivered: u32::try_from(redelivered).unwrap_or(u32::MAX),
        }))
    }

    async fn create_temporary_queue(
        &self,
        req: Request<pb::CreateTemporaryQueueRequest>,
    ) -> Reply<pb::CreateTemporaryQueueResponse> {
        let connection = req.into_inner().connection_id;
        let name = self
            .sessions
            .add_temporary_queue(&connection, self.router.local_node())?;
        // Temporary queues live on this node's back-end: the requester is here.
        let be = self.router.local()?;
        let create = pb::BackendCreateQueueRequest {
            name: name.to_string(),
            temporary: true,
            ..Default::default()
        };
        if let Err(e) = be.create_queue(Request::new(create)).await {
            let _ = self.sessions.remove_temporary_queue(&connection, &name);
            return Err(e);
        }
        Ok(Response::new(pb::CreateTemporaryQueueResponse {
            queue: name.to_string(),
        }))
    }

    async fn delete_temporary_queue(
        &self,
        req: Request<pb::DeleteTemporaryQueueRequest>,
    ) -> Reply<pb::DeleteTemporaryQueueResponse> {
        let r = req.into_inner();
        let queue = queue_name(&r.queue)?;
        self.sessions
            .remove_temporary_queue(&r.connection_id, &queue)?;
        self.router
            .local()?
            .delete_queue(Request::new(pb::BackendQueueRequest { name: r.queue }))
            .await?;
        Ok(Response::new(pb::DeleteTemporaryQueueResponse {}))
    }

    async fn browse(&self, req: Request<pb::BrowseRequest>) -> Reply<pb::BrowseResponse> {
        let r = req.into_inner();
        let queue = queue_name(&r.queue)?;
        let after_seq = if r.page_token.is_empty() {
            0
        } else {
            r.page_token.parse().map_err(|_| {
                Status::invalid_argument(
                    "page_token: pass back the next_page_token of the previous answer",
                )
            })?
        };
        let max_messages = if r.max_messages == 0 {
            100
        } else {
            r.max_messages.min(1_000)
        };
        let be = self.router.for_queue(&queue)?;
        let out = be
            .browse(Request::new(pb::BackendBrowseRequest {
                queue: r.queue,
                max_messages,
                after_seq,
                selector: r.selector,
            }))
            .await?
            .into_inner();
        let next_page_token = match out.resume_after_seq {
            0 => String::new(),
            seq => seq.to_string(),
        };
        Ok(Response::new(pb::BrowseResponse {
            messages: out.messages,
            next_page_token,
        }))
    }
}
