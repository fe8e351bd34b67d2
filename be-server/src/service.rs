//! The internal `Backend` gRPC service: decode, one call into the [`Broker`], encode. Front-ends
//! call it over the network, or in-process as a plain trait object.

use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use ferry_kernel::{
    Caller, Delivery, KernelError, LeaseId, LeaseRef, NewMessage, PlacementEpoch, QueueName,
    ReceiptHandle, ReceiveRequest, Selector, SelectorLimits, Seq, SessionId, Wait,
};
use ferry_proto::convert;
use ferry_proto::pb;
use tonic::{Request, Response, Status};

use crate::broker::{Broker, DeliveryRefs, QueueSummary};
use crate::error::Error;

/// The longest a `GetQueue` waits for its queue to be placed here (`wait_placed_ms`).
const WAIT_PLACED_MAX_MS: u64 = 10_000;

/// See the module docs.
#[derive(Debug, Clone)]
pub struct BackendService {
    broker: Broker,
}

impl BackendService {
    pub fn new(broker: Broker) -> Self {
        Self { broker }
    }

    fn info(&self, s: &QueueSummary) -> pb::QueueInfo {
        pb::QueueInfo {
            name: s.name.to_string(),
            config: Some(convert::queue_config_to_pb(&s.name, &s.config)),
            owner_node: self.broker.node_id().to_string(),
            temporary: s.temporary,
        }
    }

    fn deliveries(&self, queue: &QueueName, d: &[Delivery]) -> Vec<pb::Delivery> {
        let key = self.broker.handle_key(queue);
        d.iter()
            .map(|d| {
                let handle = ReceiptHandle {
                    queue: queue.clone(),
                    uid: d.queue,
                    seq: d.message.seq,
                    lease: d.lease,
                    delivery_count: d.delivery_count,
                    tag: self.broker.handle_tag(key, &d.lease_ref()),
                };
                convert::delivery_to_pb(d, &handle)
            })
            .collect()
    }

    /// The queue a single-queue request names, if this back-end owns it at the request's
    /// placement epoch.
    fn placed(&self, r: &pb::BackendQueueRequest) -> Result<QueueName, Error> {
        let name = queue_name(&r.name)?;
        self.broker
            .check_placement(&name, PlacementEpoch::new(r.placement_epoch))?;
        Ok(name)
    }

    /// Checks each queue of a call naming several against its wire epoch (missing: unknown,
    /// unchecked).
    fn check_placements(&self, queues: &[QueueName], epochs: &[u64]) -> Result<(), Error> {
        for (i, q) in queues.iter().enumerate() {
            let epoch = epochs
                .get(i)
                .copied()
                .map_or(PlacementEpoch::UNKNOWN, PlacementEpoch::new);
            self.broker.check_placement(q, epoch)?;
        }
        Ok(())
    }

    /// Decodes receipt handles, refusing any that belong to another queue. A handle from another
    /// node's back-end names another queue incarnation (uid) and fails its check value: stale. A handle
    /// whose check value this node did not compute (made up, altered, or issued before a
    /// restart) names no live delivery: it becomes a reference no delivery has (lease 0, count
    /// 0), which the queue answers as stale, handle by handle.
    fn leases(&self, queue: &QueueName, handles: &[String]) -> Result<Vec<LeaseRef>, Error> {
        let key = self.broker.handle_key(queue);
        handles
            .iter()
            .map(|h| {
                let r = ReceiptHandle::from_str(h)?;
                if &r.queue != queue {
                    return Err(Error::WrongQueue {
                        handle: ferry_kernel::shown(h),
                        handle_queue: r.queue.to_string(),
                        queue: queue.to_string(),
                    });
                }
                let lease = LeaseRef {
                    queue: r.uid,
                    seq: r.seq,
                    lease: r.lease,
                    delivery_count: r.delivery_count,
                };
                if self.broker.handle_tag(key, &lease) == r.tag {
                    Ok(lease)
                } else {
                    Ok(LeaseRef {
                        lease: LeaseId(0),
                        delivery_count: 0,
                        ..lease
                    })
                }
            })
            .collect()
    }
}

fn queue_name(name: &str) -> Result<QueueName, Error> {
    Ok(QueueName::new(name)?)
}

/// Parses a selector (empty: none). A bad one fails here, when the receiver is created.
fn selector(text: &str) -> Result<Option<Arc<Selector>>, Error> {
    if text.is_empty() {
        return Ok(None);
    }
    Ok(Some(Arc::new(Selector::parse(
        text,
        &SelectorLimits::default(),
    )?)))
}

/// The caller of a lease operation: the session the client's call named.
fn caller(session_id: &str) -> Result<Caller, Error> {
    Ok(Caller::Client(session(session_id)?))
}

fn session(s: &str) -> Result<Option<SessionId>, Error> {
    if s.is_empty() {
        return Ok(None);
    }
    Ok(Some(SessionId::from_str(s)?))
}

/// A required session id and the queues it names.
fn session_and_queues(
    session_id: &str,
    queues: &[String],
) -> Result<(SessionId, Vec<QueueName>), Status> {
    let Some(session) = session(session_id)? else {
        return Err(Status::invalid_argument("session_id is required"));
    };
    let queues = queues
        .iter()
        .map(|q| queue_name(q))
        .collect::<Result<Vec<_>, _>>()?;
    Ok((session, queues))
}

/// The deliveries a renewal names, by queue; each queue must be one of the request's `queues`
/// (whose placements were checked).
fn delivery_refs(
    held: &[pb::BackendDeliveryRefs],
    queues: &[QueueName],
) -> Result<DeliveryRefs, Status> {
    held.iter()
        .map(|h| {
            let queue = queue_name(&h.queue)?;
            if !queues.contains(&queue) {
                return Err(Status::invalid_argument(format!(
                    "held names queue {queue}, which is not in queues; list every queue of held in queues"
                )));
            }
            if h.seqs.len() != h.leases.len() {
                return Err(Status::invalid_argument(format!(
                    "held for queue {queue} has {} seqs and {} leases; they are pairs",
                    h.seqs.len(),
                    h.leases.len()
                )));
            }
            let refs = h
                .seqs
                .iter()
                .zip(&h.leases)
                .map(|(&s, &l)| (Seq(s), LeaseId(l)))
                .collect();
            Ok((queue, refs))
        })
        .collect()
}

fn lease_response<T>(
    results: Vec<Result<T, KernelError>>,
    value: impl Fn(&T) -> u64,
) -> pb::BackendLeaseResponse {
    let mut out = pb::BackendLeaseResponse::default();
    for r in results {
        match r {
            Ok(v) => {
                out.errors.push(String::new());
                out.lease_expires_at_ms.push(value(&v));
            }
            Err(e) => {
                out.errors.push(e.to_string());
                out.lease_expires_at_ms.push(0);
            }
        }
    }
    out
}

type Reply<T> = Result<Response<T>, Status>;

#[tonic::async_trait]
impl pb::backend_server::Backend for BackendService {
    async fn create_queue(
        &self,
        req: Request<pb::BackendCreateQueueRequest>,
    ) -> Reply<pb::QueueInfo> {
        let r = req.into_inner();
        let name = queue_name(&r.name)?;
        self.broker
            .check_placement(&name, PlacementEpoch::new(r.placement_epoch))?;
        let config = convert::queue_config_from_pb(r.config, self.broker.queue_defaults())
            .map_err(Error::from)?;
        let (s, _) = self
            .broker
            .create_queue(name, config, r.if_not_exists, r.temporary)
            .await?;
        Ok(Response::new(self.info(&s)))
    }

    async fn get_queue(&self, req: Request<pb::BackendQueueRequest>) -> Reply<pb::QueueInfo> {
        let r = req.into_inner();
        if r.wait_placed_ms > 0 {
            let name = queue_name(&r.name)?;
            let bound = Duration::from_millis(r.wait_placed_ms.min(WAIT_PLACED_MAX_MS));
            let wanted = r.wait_settings.as_ref();
            let settled = |config: &ferry_kernel::QueueConfig| {
                wanted.is_none_or(|w| &convert::queue_config_to_pb(&name, config) == w)
            };
            self.broker
                .wait_placed(
                    &name,
                    PlacementEpoch::new(r.placement_epoch),
                    settled,
                    bound,
                )
                .await;
        }
        let name = self.placed(&r)?;
        Ok(Response::new(self.info(&self.broker.get_queue(&name)?)))
    }

    async fn list_queues(
        &self,
        _: Request<pb::BackendListQueuesRequest>,
    ) -> Reply<pb::BackendListQueuesResponse> {
        let queues = self
            .broker
            .list_queues()
            .iter()
            .map(|s| self.info(s))
            .collect();
        Ok(Response::new(pb::BackendListQueuesResponse { queues }))
    }

    async fn delete_queue(
        &self,
        req: Request<pb::BackendQueueRequest>,
    ) -> Reply<pb::BackendCountResponse> {
        let name = self.placed(&req.into_inner())?;
        let count = self.broker.delete_queue(&name).await?;
        Ok(Response::new(pb::BackendCountResponse { count }))
    }

    async fn purge_queue(
        &self,
        req: Request<pb::BackendQueueRequest>,
    ) -> Reply<pb::BackendCountResponse> {
        let name = self.placed(&req.into_inner())?;
        let count = self.broker.purge(&name).await?;
        Ok(Response::new(pb::BackendCountResponse { count }))
    }

    async fn get_queue_stats(
        &self,
        req: Request<pb::BackendQueueRequest>,
    ) -> Reply<pb::QueueStats> {
        let name = self.placed(&req.into_inner())?;
        let stats = self.broker.stats(&name).await?;
        Ok(Response::new(convert::queue_stats_to_pb(
            &name,
            self.broker.node_id().as_str(),
            &stats,
            self.broker.clock().now_ms(),
        )))
    }

    async fn send(&self, req: Request<pb::BackendSendRequest>) -> Reply<pb::BackendSendResponse> {
        let r = req.into_inner();
        let queue = queue_name(&r.queue)?;
        self.broker
            .check_placement(&queue, PlacementEpoch::new(r.placement_epoch))?;
        let messages = r
            .messages
            .into_iter()
            .enumerate()
            .map(|(i, m)| {
                NewMessage::try_from(m).map_err(|e| match e {
                    KernelError::InvalidArgument { field, reason } => {
                        KernelError::InvalidArgument {
                            field,
                            reason: format!("message {i}: {reason}"),
                        }
                    }
                    other => other,
                })
            })
            .collect::<Result<Vec<_>, _>>()
            .map_err(Error::from)?;
        let (ids, incarnation) = if r.transacted {
            let Some(session) = session(&r.session_id)? else {
                return Err(Status::invalid_argument(
                    "session_id is required for a transacted send",
                ));
            };
            // The run that staged them, as the lookup the sends went through found it.
            self.broker.stage(&queue, session, messages).await?
        } else {
            let ids = self.broker.send(&queue, messages).await?;
            (ids, self.broker.queue_incarnation(&queue))
        };
        Ok(Response::new(pb::BackendSendResponse {
            message_ids: ids.iter().map(ToString::to_string).collect(),
            incarnation,
        }))
    }

    async fn receive(
        &self,
        req: Request<pb::BackendReceiveRequest>,
    ) -> Reply<pb::BackendReceiveResponse> {
        let r = req.into_inner();
        let queue = queue_name(&r.queue)?;
        self.broker
            .check_placement(&queue, PlacementEpoch::new(r.placement_epoch))?;
        let selector = selector(&r.selector)?;
        let wait = match r.wait_ms {
            None => Wait::Forever,
            Some(0) => Wait::NoWait,
            Some(ms) => Wait::Until(self.broker.clock().now_ms().saturating_add(ms)),
        };
        let mut max_messages = r.max_messages.max(1);
        if r.clamp_max_messages {
            max_messages = max_messages.min(self.broker.receive_batch_max(&queue)?);
        }
        let req = ReceiveRequest {
            owner: session(&r.session_id)?,
            max_messages,
            wait,
            lease_ms: r.lease_ms,
            selector,
        };
        let d = self.broker.receive_for(&queue, req, r.consumer).await?;
        if !d.is_empty() && crate::faults::on(crate::faults::SLOW_RECEIVE_ANSWER) {
            tracing::warn!(
                deliveries = d.len(),
                "fault slow-receive-answer: holding a receive answer whose leases are written"
            );
            tokio::time::sleep(crate::faults::SLOW_RECEIVE_ANSWER_FOR).await;
        }
        Ok(Response::new(pb::BackendReceiveResponse {
            deliveries: self.deliveries(&queue, &d),
        }))
    }

    async fn ack(&self, req: Request<pb::BackendLeaseRequest>) -> Reply<pb::BackendLeaseResponse> {
        let r = req.into_inner();
        let queue = queue_name(&r.queue)?;
        self.broker
            .check_placement(&queue, PlacementEpoch::new(r.placement_epoch))?;
        let leases = self.leases(&queue, &r.receipt_handles)?;
        let results = self
            .broker
            .ack(&queue, caller(&r.session_id)?, leases, r.defer_sync)
            .await?;
        if crate::faults::on(crate::faults::SLOW_ACK_ANSWER) {
            tokio::time::sleep(crate::faults::SLOW_ACK_ANSWER_FOR).await;
        }
        Ok(Response::new(lease_response(results, |()| 0)))
    }

    async fn nack(&self, req: Request<pb::BackendLeaseRequest>) -> Reply<pb::BackendLeaseResponse> {
        let r = req.into_inner();
        let queue = queue_name(&r.queue)?;
        self.broker
            .check_placement(&queue, PlacementEpoch::new(r.placement_epoch))?;
        let leases = self.leases(&queue, &r.receipt_handles)?;
        let caller = caller(&r.session_id)?;
        let results = if r.undelivered {
            self.broker
                .return_undelivered(&queue, caller, leases)
                .await?
        } else {
            self.broker
                .nack(&queue, caller, leases, r.delay_ms, r.dead_letter)
                .await?
        };
        Ok(Response::new(lease_response(results, |()| 0)))
    }

    async fn extend_lease(
        &self,
        req: Request<pb::BackendLeaseRequest>,
    ) -> Reply<pb::BackendLeaseResponse> {
        let r = req.into_inner();
        let queue = queue_name(&r.queue)?;
        self.broker
            .check_placement(&queue, PlacementEpoch::new(r.placement_epoch))?;
        let leases = self.leases(&queue, &r.receipt_handles)?;
        let results = self
            .broker
            .extend_lease(&queue, caller(&r.session_id)?, leases, r.lease_ms)
            .await?;
        Ok(Response::new(lease_response(results, |t| *t)))
    }

    async fn release_session(
        &self,
        req: Request<pb::BackendReleaseSessionRequest>,
    ) -> Reply<pb::BackendReleaseSessionResponse> {
        let r = req.into_inner();
        let (session, queues) = session_and_queues(&r.session_id, &r.queues)?;
        self.check_placements(&queues, &r.placement_epochs)?;
        if r.renew && !r.held.is_empty() {
            let held = delivery_refs(&r.held, &queues)?;
            let (count, not_held) = self.broker.renew_named(session, held).await?;
            return Ok(Response::new(pb::BackendReleaseSessionResponse {
                count,
                not_held: not_held
                    .into_iter()
                    .map(|(q, refs)| pb::BackendDeliveryRefs {
                        queue: q.to_string(),
                        seqs: refs.iter().map(|(s, _)| s.0).collect(),
                        leases: refs.iter().map(|(_, l)| l.0).collect(),
                    })
                    .collect(),
            }));
        }
        let count = if r.renew {
            self.broker.renew_session(session, &queues).await?
        } else {
            self.broker
                .release_session(session, &queues, r.recover)
                .await?
        };
        Ok(Response::new(pb::BackendReleaseSessionResponse {
            count,
            not_held: vec![],
        }))
    }

    async fn release_lost(
        &self,
        req: Request<pb::BackendReleaseLostRequest>,
    ) -> Reply<pb::BackendCountResponse> {
        let r = req.into_inner();
        let queue = queue_name(&r.queue)?;
        let Some(session) = session(&r.session_id)? else {
            return Err(Status::invalid_argument("session_id is required"));
        };
        if r.held_seqs.len() != r.held_leases.len() {
            return Err(Status::invalid_argument(format!(
                "held_seqs has {} entries and held_leases {}; they are pairs",
                r.held_seqs.len(),
                r.held_leases.len()
            )));
        }
        self.broker
            .check_placement(&queue, PlacementEpoch::new(r.placement_epoch))?;
        let keep = r
            .held_seqs
            .iter()
            .zip(&r.held_leases)
            .map(|(&s, &l)| (Seq(s), LeaseId(l)))
            .collect();
        let count = self.broker.release_lost(&queue, session, keep).await?;
        Ok(Response::new(pb::BackendCountResponse { count }))
    }

    async fn browse(
        &self,
        req: Request<pb::BackendBrowseRequest>,
    ) -> Reply<pb::BackendBrowseResponse> {
        let r = req.into_inner();
        let queue = queue_name(&r.queue)?;
        self.broker
            .check_placement(&queue, PlacementEpoch::new(r.placement_epoch))?;
        let after = (r.after_seq > 0).then_some(Seq(r.after_seq));
        let max = r.max_messages.clamp(1, 1_000) as usize;
        let selector = selector(&r.selector)?;
        let (browsed, resume) = self.broker.browse(&queue, after, max, selector).await?;
        let messages = browsed
            .iter()
            .map(|(m, state, count)| pb::BrowsedMessage {
                message: Some(convert::message_to_pb(m, &queue)),
                state: convert::state_to_pb(*state) as i32,
                delivery_count: *count,
            })
            .collect();
        Ok(Response::new(pb::BackendBrowseResponse {
            messages,
            resume_after_seq: resume.map_or(0, |s| s.0),
        }))
    }

    async fn commit(
        &self,
        req: Request<pb::BackendCommitRequest>,
    ) -> Reply<pb::BackendCountResponse> {
        let r = req.into_inner();
        let Some(session) = session(&r.session_id)? else {
            return Err(Status::invalid_argument("session_id is required"));
        };
        let mut parts = Vec::with_capacity(r.queues.len());
        let mut acked = 0u64;
        for q in r.queues {
            let queue = queue_name(&q.queue)?;
            self.broker
                .check_placement(&queue, PlacementEpoch::new(q.placement_epoch))?;
            let leases = self.leases(&queue, &q.receipt_handles)?;
            acked += leases.len() as u64;
            parts.push((queue, leases));
        }
        self.broker.commit(session, r.incarnation, parts).await?;
        Ok(Response::new(pb::BackendCountResponse { count: acked }))
    }

    async fn rollback(
        &self,
        req: Request<pb::BackendRollbackRequest>,
    ) -> Reply<pb::BackendCountResponse> {
        let r = req.into_inner();
        let (session, queues) = session_and_queues(&r.session_id, &r.queues)?;
        self.check_placements(&queues, &r.placement_epochs)?;
        let count = self.broker.rollback(session, &queues).await?;
        Ok(Response::new(pb::BackendCountResponse { count }))
    }

    async fn delete_message(
        &self,
        req: Request<pb::BackendDeleteMessageRequest>,
    ) -> Reply<pb::BackendCountResponse> {
        let r = req.into_inner();
        let queue = queue_name(&r.queue)?;
        self.broker
            .check_placement(&queue, PlacementEpoch::new(r.placement_epoch))?;
        let id = ferry_kernel::MessageId::parse(&r.message_id).map_err(Error::from)?;
        self.broker.delete_message(&queue, id).await?;
        Ok(Response::new(pb::BackendCountResponse { count: 1 }))
    }

    async fn seal_queue(
        &self,
        req: Request<pb::BackendSealQueueRequest>,
    ) -> Reply<pb::BackendCountResponse> {
        let r = req.into_inner();
        let name = queue_name(&r.name)?;
        self.broker
            .check_placement(&name, PlacementEpoch::new(r.placement_epoch))?;
        self.broker.seal_queue(&name, r.seal).await?;
        Ok(Response::new(pb::BackendCountResponse { count: 0 }))
    }

    async fn session_leases(
        &self,
        req: Request<pb::BackendSessionLeasesRequest>,
    ) -> Reply<pb::BackendSessionLeasesResponse> {
        let r = req.into_inner();
        let queue = queue_name(&r.queue)?;
        self.broker
            .check_placement(&queue, PlacementEpoch::new(r.placement_epoch))?;
        let sessions = r
            .session_ids
            .iter()
            .map(|s| SessionId::from_str(s).map_err(Error::from))
            .collect::<Result<Vec<_>, _>>()?;
        let leased = self.broker.session_leases(&queue, sessions).await?;
        Ok(Response::new(pb::BackendSessionLeasesResponse { leased }))
    }

    type WatchEventsStream = ferry_proto::EventStream;

    async fn watch_events(
        &self,
        _req: Request<pb::BackendWatchEventsRequest>,
    ) -> Reply<Self::WatchEventsStream> {
        use futures::StreamExt as _;
        let node = self.broker.node_id().to_string();
        let clock = self.broker.clock().clone();
        let events = tokio_stream::wrappers::BroadcastStream::new(self.broker.subscribe_events())
            .map(move |e| {
                Ok(match e {
                    Ok(e) => pb::Event {
                        at_ms: e.at_ms,
                        kind: e.kind.into(),
                        queue: e.queue.map(|q| q.to_string()).unwrap_or_default(),
                        message_id: e.message_id,
                        reason: e.reason.into(),
                        value: e.value,
                        node: node.clone(),
                        detail: e.detail,
                        shard: e.shard.map_or(0, |s| s.0),
                    },
                    // A watcher that falls behind is told how much it missed.
                    Err(tokio_stream::wrappers::errors::BroadcastStreamRecvError::Lagged(n)) => {
                        pb::Event {
                            at_ms: clock.now_ms(),
                            kind: "events-lost".into(),
                            value: n,
                            node: node.clone(),
                            ..Default::default()
                        }
                    }
                })
            });
        // The node stopping ends the stream at once, saying so: its graceful shutdown does not
        // wait for watchers (other nodes' front-ends) to go away.
        let end = futures::stream::once(async { Err(Status::from(Error::ShuttingDown)) });
        let events = events.take_until(self.broker.stopped()).chain(end);
        Ok(Response::new(Box::pin(events)))
    }

    async fn get_message_history(
        &self,
        req: Request<pb::GetMessageHistoryRequest>,
    ) -> Reply<pb::GetMessageHistoryResponse> {
        let id = req.into_inner().message_id;
        let node = self.broker.node_id().to_string();
        let steps = self
            .broker
            .message_history(&id)
            .into_iter()
            .map(|s| pb::HistoryStep {
                at_ms: s.at_ms,
                queue: s.queue,
                event: s.event.into(),
                detail: s.detail,
                node: node.clone(),
                deliver_at_ms: s.deliver_at_ms,
            })
            .collect();
        Ok(Response::new(pb::GetMessageHistoryResponse {
            steps,
            unreachable_nodes: vec![],
        }))
    }
}
