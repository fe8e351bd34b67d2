//! The `Consume` stream: the client grants credits, the front-end keeps one long-poll receive open
//! at the owning back-end for up to that many messages and pushes what it gets; acks and nacks
//! come back on the same stream. When the client goes away the open receive is dropped, which
//! removes its waiter at the back-end.

use std::future::Future;
use std::pin::Pin;

use ferry_proto::pb;
use ferry_proto::pb::consume_request::Kind;
use futures::stream::{FuturesOrdered, StreamExt};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};

use crate::error::Error;
use crate::messaging::{queue_name, MessagingService};
use crate::BackendRef;

pub type ConsumeStream =
    Pin<Box<dyn tokio_stream::Stream<Item = Result<pb::ConsumeResponse, Status>> + Send>>;

/// Deliveries asked of the back-end in one receive.
const BATCH_MAX: u64 = 1_000;

/// An ack, nack or release under way, and what it answers on the stream (if anything).
type AckAnswer = Pin<Box<dyn Future<Output = Option<Result<pb::ConsumeResponse, Status>>> + Send>>;

type Inflight =
    Pin<Box<dyn Future<Output = Result<Response<pb::BackendReceiveResponse>, Status>> + Send>>;

pub(crate) async fn start(
    svc: MessagingService,
    mut inbound: Streaming<pb::ConsumeRequest>,
) -> Result<ConsumeStream, Status> {
    let first = inbound.message().await?.ok_or(Error::ConsumeNotStarted)?;
    let Some(Kind::Start(start)) = first.kind else {
        return Err(Error::ConsumeNotStarted.into());
    };
    let queue = queue_name(&start.queue)?;
    if !start.selector.is_empty() {
        // A bad selector fails when the consumer is created, never later.
        ferry_kernel::Selector::parse(&start.selector, &ferry_kernel::SelectorLimits::default())
            .map_err(Error::from)?;
    }
    if let Some(sid) = svc.touch_session(&start.session_id, Some(&queue))? {
        if svc.sessions.is_transacted(sid)? {
            return Err(crate::error::Error::Transacted {
                id: sid.to_string(),
                what: "Consume streams acknowledge as they go; a transacted session receives with Receive and acknowledges at Commit",
            }
            .into());
        }
    }
    let be = svc.router.for_queue(&queue)?.clone();
    let (tx, rx) = mpsc::channel(16);
    tokio::spawn(run(svc, be, start, inbound, tx));
    Ok(Box::pin(ReceiverStream::new(rx)))
}

async fn run(
    svc: MessagingService,
    be: BackendRef,
    start: pb::ConsumeStart,
    mut inbound: Streaming<pb::ConsumeRequest>,
    tx: mpsc::Sender<Result<pb::ConsumeResponse, Status>>,
) {
    let mut credits = u64::from(start.prefetch);
    let mut inflight: Option<Inflight> = None;
    // Acks, nacks and releases under way: they run while deliveries keep flowing, and their
    // answers go out in the order they were asked.
    let mut acks: FuturesOrdered<AckAnswer> = FuturesOrdered::new();
    // The client asked for nothing more (`stop`).
    let mut stopped = false;
    let mut stopping = svc.stopping.clone();
    loop {
        // Traffic on the stream keeps the connection alive; a session that is gone ends it.
        if let Err(status) = svc.touch_session(&start.session_id, None) {
            let _ = tx.send(Err(status)).await;
            break;
        }
        if inflight.is_none() && credits > 0 && !stopped {
            let req = pb::BackendReceiveRequest {
                queue: start.queue.clone(),
                session_id: start.session_id.clone(),
                selector: start.selector.clone(),
                max_messages: u32::try_from(credits.min(BATCH_MAX)).unwrap_or(1),
                wait_ms: None,
                lease_ms: start.lease_ms,
                clamp_max_messages: true,
            };
            let be = be.clone();
            inflight = Some(Box::pin(async move { be.receive(Request::new(req)).await }));
        }
        tokio::select! {
            msg = inbound.message() => {
                let kind = match msg {
                    Ok(Some(pb::ConsumeRequest { kind: Some(kind) })) => kind,
                    Ok(Some(_)) => continue,
                    // The client ended its side (or went away): finish below.
                    Ok(None) | Err(_) => break,
                };
                if matches!(kind, Kind::Stop(true)) {
                    stopped = true;
                    give_back(&svc, inflight.take()).await;
                    let out = pb::ConsumeResponse { kind: Some(pb::consume_response::Kind::Stopped(pb::Stopped {})) };
                    if tx.send(Ok(out)).await.is_err() {
                        break;
                    }
                    continue;
                }
                if let Kind::Credit(n) = kind {
                    credits = credits.saturating_add(u64::from(n));
                    continue;
                }
                let svc = svc.clone();
                acks.push_back(Box::pin(async move { handle(&svc, kind).await }));
            }
            Some(reply) = acks.next(), if !acks.is_empty() => {
                if let Some(reply) = reply {
                    if tx.send(reply).await.is_err() {
                        break;
                    }
                }
            }
            res = async { inflight.as_mut().expect("invariant: guarded by is_some").await }, if inflight.is_some() => {
                inflight = None;
                match res {
                    Ok(r) => {
                        let deliveries = r.into_inner().deliveries;
                        credits = credits.saturating_sub(deliveries.len() as u64);
                        let handles: Vec<String> = deliveries.iter().map(|d| d.receipt_handle.clone()).collect();
                        let out = pb::ConsumeResponse { kind: Some(pb::consume_response::Kind::Deliveries(pb::Deliveries { deliveries })) };
                        if tx.send(Ok(out)).await.is_err() {
                            // The client is gone: give these back now rather than at lease expiry,
                            // not counted as deliveries (nobody saw them).
                            let _ = release(&svc, &handles).await;
                            break;
                        }
                    }
                    Err(status) => {
                        let _ = tx.send(Err(status)).await;
                        break;
                    }
                }
            }
            () = tx.closed() => break,
            () = crate::stopped(&mut stopping) => break,
        }
    }
    // However the stream ends: the open receive gives back what it holds, and every ack, nack
    // and release the client wrote before the end takes effect (and is answered, if the client
    // still listens). Dropping them would leave acknowledged messages leased, to be delivered
    // again when their leases run out.
    give_back(&svc, inflight.take()).await;
    while let Some(reply) = acks.next().await {
        if let Some(reply) = reply {
            let _ = tx.send(reply).await;
        }
    }
}

/// Ends the open receive. Dropping it removes its waiter at the back-end, and a back-end that
/// answers a dropped receive takes the deliveries back; an answer that already arrived but was
/// not pushed is given back here, uncounted.
async fn give_back(svc: &MessagingService, inflight: Option<Inflight>) {
    let Some(inflight) = inflight else { return };
    if let Some(Ok(r)) = futures::FutureExt::now_or_never(inflight) {
        let handles: Vec<String> = r
            .into_inner()
            .deliveries
            .iter()
            .map(|d| d.receipt_handle.clone())
            .collect();
        let _ = release(svc, &handles).await;
    }
}

/// Returns deliveries nobody saw: back to Ready at once, not counted as deliveries.
async fn release(svc: &MessagingService, handles: &[String]) -> Result<Vec<String>, Status> {
    if handles.is_empty() {
        return Ok(vec![]);
    }
    svc.lease_op(handles, |be, req| async move {
        be.nack(Request::new(pb::BackendLeaseRequest {
            undelivered: true,
            ..req
        }))
        .await
    })
    .await
    .map(|(_, stale)| stale)
}

async fn handle(svc: &MessagingService, kind: Kind) -> Option<Result<pb::ConsumeResponse, Status>> {
    let result = |stale_receipt_handles| {
        Some(Ok(pb::ConsumeResponse {
            kind: Some(pb::consume_response::Kind::AckResult(pb::AckResult {
                stale_receipt_handles,
            })),
        }))
    };
    match kind {
        Kind::Start(_) => Some(Err(Status::invalid_argument(
            "a Consume stream takes `start` once, first",
        ))),
        // `stop: true` is handled by the stream loop; `stop: false` asks nothing.
        Kind::Stop(_) => None,
        Kind::Release(h) => match release(svc, &h.receipt_handles).await {
            Ok(stale) => result(stale),
            Err(status) => Some(Err(status)),
        },
        // Taken by the stream loop.
        Kind::Credit(_) => None,
        // The client does not wait for this answer (unless it flushes): the delete may share
        // the next synced write.
        Kind::Ack(h) => match svc
            .lease_op(&h.receipt_handles, |be, req| async move {
                be.ack(Request::new(pb::BackendLeaseRequest {
                    defer_sync: true,
                    ..req
                }))
                .await
            })
            .await
        {
            Ok((_, stale)) => result(stale),
            Err(status) => Some(Err(status)),
        },
        Kind::Nack(h) => match svc
            .lease_op(&h.receipt_handles, |be, req| async move {
                be.nack(Request::new(req)).await
            })
            .await
        {
            Ok((_, stale)) => result(stale),
            Err(status) => Some(Err(status)),
        },
    }
}
