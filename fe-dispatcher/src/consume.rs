//! The `Consume` stream: the client grants credits, the front-end keeps long-poll receives open
//! at the owning back-end for up to that many messages and pushes what they get, in the order
//! they were asked; acks and nacks come back on the same stream. When the client goes away the
//! open receives are dropped, which removes their waiters at the back-end.
//!
//! Each ack, nack and release is answered, in order, unless the client asked for `quiet_acks`:
//! then only those with stale handles are, and a `flush` (answered `flushed` after everything
//! before it) tells the client the rest took effect. The Rust client asks for it by default:
//! one frame fewer per batch it takes.
//!
//! When the queue is on this node, two receives are kept open when the credit allows, each for a
//! share of it. While the first one's answer travels back and is pushed, the second is still
//! parked at the back-end, so a message sent meanwhile is handed over as it is stored: its
//! delivery count goes to disk in the send's own synced write. With one receive, such a message
//! would wait Ready for the next receive and cost a synced write of its own before it could be
//! pushed.
//!
//! Answers are pushed in the order the back-end made them: an answer is pushed as soon as it
//! arrives, and answers found together go out by the lease of their first delivery (a queue
//! numbers its leases in the order it hands messages out, and a new owner's leases come after the
//! old one's). Holding an answer until an older receive is answered would be wrong whenever the
//! older one was parked later: a receive opened while the queue lived on another node, still on
//! its way when the queue's new leader turned out to be this node and a second receive went
//! straight to it. The older one then waits for new messages (or a lease to run out) while the
//! answer behind it, already leased, is held back — and pushed after the redelivery its lease
//! ran out into. "Found together" needs care: the receives are looked at one after the other,
//! and the back-end may answer the older one just after it was looked at and the younger one
//! just before; so once an answer is seen, the ones still waiting are looked at again (see
//! `Receives::next`).
//!
//! Calls to another node's back-end are separate HTTP/2 streams, served by separate tasks, and
//! their answers may arrive in any order; there the stream keeps one receive open. The second
//! receive is an extra: if it fails (the queue's waiter limit, say) the stream goes on with one.

use std::collections::VecDeque;
use std::sync::Arc;
use std::task::Poll;

use std::future::Future;
use std::pin::Pin;

use ferry_proto::pb;
use ferry_proto::pb::consume_request::Kind;
use futures::stream::{FuturesOrdered, StreamExt};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Status, Streaming};

use crate::dispatch::{queue_name, Dispatch};
use crate::error::Error;
use ferry_kernel::{PlacementEpoch, QueueName, SessionId};

pub type ConsumeStream =
    Pin<Box<dyn tokio_stream::Stream<Item = Result<pb::ConsumeResponse, Status>> + Send>>;

/// Deliveries asked of the back-end in one receive.
const BATCH_MAX: u64 = 1_000;
/// Receives open at an in-process back-end at once (see the module docs).
const RECEIVES_LOCAL: usize = 2;

/// An ack, nack or release under way, and what it answers on the stream (if anything).
type AckAnswer = Pin<Box<dyn Future<Output = Option<Result<pb::ConsumeResponse, Status>>> + Send>>;

type Answer = Result<pb::BackendReceiveResponse, Status>;
type Inflight = Pin<Box<dyn Future<Output = Answer> + Send>>;

/// One receive open at the back-end, for `asked` messages.
struct Receive {
    asked: u64,
    state: ReceiveState,
}

enum ReceiveState {
    Waiting(Inflight),
    /// Answered, but an earlier receive has not been: pushed after it.
    Answered(Answer),
}

/// The open receives, oldest first.
struct Receives {
    open: VecDeque<Receive>,
    /// How many may be open at once.
    max: usize,
    /// An extra receive failed: this stream keeps one from then on.
    extra_failed: bool,
}

impl Receives {
    fn new(max: usize) -> Self {
        Self {
            open: VecDeque::new(),
            max: max.max(1),
            extra_failed: false,
        }
    }

    /// How many may be open at once from now on (one, once an extra one failed).
    fn set_max(&mut self, max: usize) {
        self.max = if self.extra_failed { 1 } else { max.max(1) };
    }

    fn asked(&self) -> u64 {
        self.open.iter().map(|r| r.asked).sum()
    }

    /// How many messages the next receive asks for, if one should be opened: a share of the
    /// credit nobody has asked for yet, so a second receive stays parked while the first one's
    /// answer is pushed.
    fn next_ask(&self, credits: u64) -> Option<u64> {
        let free = credits.saturating_sub(self.asked());
        if self.open.len() >= self.max || free == 0 {
            return None;
        }
        let share = if self.open.is_empty() {
            free.div_ceil(self.max as u64)
        } else {
            free
        };
        Some(share.min(BATCH_MAX))
    }

    fn open(&mut self, asked: u64, receive: Inflight) {
        self.open.push_back(Receive {
            asked,
            state: ReceiveState::Waiting(receive),
        });
    }

    /// The next answer, as soon as one arrives (see the module docs): of those answered, the
    /// one the back-end made first. A later receive that fails while an older one is open is
    /// dropped, and no second one is opened again: the stream goes on with one (the open one
    /// reports anything lasting).
    ///
    /// Looking at the receives one after the other races the back-end: the older one may be
    /// looked at just before its answer is made, the younger one just after its own, later
    /// answer. So once an answer is seen, the receives still waiting are looked at once more:
    /// every answer made before the one seen is there now. Of those, the one with the lowest
    /// lease goes first (a queue numbers its leases in the order it hands messages out).
    async fn next(&mut self) -> Answer {
        std::future::poll_fn(|cx| {
            if self.poll_waiting(cx) {
                self.poll_waiting(cx);
            }
            self.drop_failed_extra();
            let Some(first) = self
                .open
                .iter()
                .enumerate()
                .filter_map(|(i, r)| match &r.state {
                    ReceiveState::Answered(answer) => Some((handed_out_at(answer), i)),
                    ReceiveState::Waiting(_) => None,
                })
                .min()
                .map(|(_, i)| i)
            else {
                return Poll::Pending;
            };
            match self.open.remove(first) {
                Some(Receive {
                    state: ReceiveState::Answered(answer),
                    ..
                }) => Poll::Ready(answer),
                _ => Poll::Pending,
            }
        })
        .await
    }

    /// Polls the receives still waiting; whether any was answered.
    fn poll_waiting(&mut self, cx: &mut std::task::Context<'_>) -> bool {
        let mut answered = false;
        for r in &mut self.open {
            if let ReceiveState::Waiting(f) = &mut r.state {
                if let Poll::Ready(answer) = f.as_mut().poll(cx) {
                    r.state = ReceiveState::Answered(answer);
                    answered = true;
                }
            }
        }
        answered
    }

    /// A later receive that failed is dropped, and the stream keeps one receive from then on.
    fn drop_failed_extra(&mut self) {
        let failed_extra = self
            .open
            .iter()
            .skip(1)
            .position(|r| matches!(r.state, ReceiveState::Answered(Err(_))));
        if let Some(i) = failed_extra {
            if let Some(Receive {
                state: ReceiveState::Answered(Err(status)),
                ..
            }) = self.open.remove(i + 1)
            {
                tracing::debug!(error = %status, "a Consume stream's extra receive failed; going on with one");
            }
            self.max = 1;
            self.extra_failed = true;
        }
    }

    fn is_empty(&self) -> bool {
        self.open.is_empty()
    }
}

/// Where an answer goes among those found together: by the lease of its first delivery (a
/// queue's leases are numbered in the order it hands messages out); errors and empty answers
/// first.
fn handed_out_at(answer: &Answer) -> u64 {
    answer
        .as_ref()
        .ok()
        .and_then(|r| r.deliveries.first())
        .and_then(|d| d.receipt_handle.parse::<ferry_kernel::ReceiptHandle>().ok())
        .map_or(0, |h| h.lease.0)
}

pub(crate) async fn start(
    svc: Arc<Dispatch>,
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
    let session = svc.touch_session(&start.session_id, Some(&queue))?;
    if let Some(sid) = session {
        if svc.sessions.is_transacted(sid)? {
            return Err(crate::error::Error::Transacted {
                id: sid.to_string(),
                what: "Consume streams acknowledge as they go; a transacted session receives with Receive and acknowledges at Commit",
            }
            .into());
        }
    }
    let (tx, rx) = mpsc::channel(16);
    tokio::spawn(run(svc, queue, session, start, inbound, tx));
    Ok(Box::pin(ReceiverStream::new(rx)))
}

/// Whether a Consume stream goes on after an event.
enum Next {
    Continue,
    End,
    /// The node is stopping: end the stream with its status.
    NodeStopping,
}

/// One Consume stream's state, driven by [`run`].
struct Stream {
    svc: Arc<Dispatch>,
    queue: QueueName,
    /// The session the stream receives for, if any: its heartbeats renew what is pushed.
    session: Option<SessionId>,
    start: pb::ConsumeStart,
    tx: mpsc::Sender<Result<pb::ConsumeResponse, Status>>,
    credits: u64,
    /// Tags this stream's receives at the back-end, so its two count as one consumer there.
    consumer: u64,
    receives: Receives,
    /// Acks, nacks and releases under way: they run while deliveries keep flowing, and their
    /// answers go out in the order they were asked.
    acks: FuturesOrdered<AckAnswer>,
    /// The client asked for nothing more (`stop`).
    stopped: bool,
}

async fn run(
    svc: Arc<Dispatch>,
    queue: QueueName,
    session: Option<SessionId>,
    start: pb::ConsumeStart,
    mut inbound: Streaming<pb::ConsumeRequest>,
    tx: mpsc::Sender<Result<pb::ConsumeResponse, Status>>,
) {
    let mut stopping = svc.stopping.clone();
    let mut s = Stream {
        credits: u64::from(start.prefetch),
        consumer: rand::random::<u64>().max(1),
        receives: Receives::new(1),
        acks: FuturesOrdered::new(),
        stopped: false,
        svc,
        queue,
        session,
        start,
        tx,
    };
    let last = loop {
        // Traffic on the stream keeps the connection alive; a session that is gone ends it.
        if let Err(status) = s.svc.touch_session(&s.start.session_id, None) {
            break Some(status);
        }
        s.open_receives();
        let next = tokio::select! {
            msg = inbound.message() => match msg {
                Ok(Some(pb::ConsumeRequest { kind: Some(kind) })) => s.on_request(kind).await,
                Ok(Some(_)) => Next::Continue,
                // The client ended its side (or went away): finish below.
                Ok(None) | Err(_) => Next::End,
            },
            Some(reply) = s.acks.next(), if !s.acks.is_empty() => match reply {
                Some(reply) => s.push(reply).await,
                None => Next::Continue,
            },
            res = s.receives.next(), if !s.receives.is_empty() => s.on_deliveries(res).await,
            () = s.tx.closed() => Next::End,
            () = crate::stopped(&mut stopping) => Next::NodeStopping,
        };
        match next {
            Next::Continue => {}
            Next::End => break None,
            Next::NodeStopping => break Some(s.svc.stopping_status()),
        }
    };
    s.finish(last).await;
}

impl Stream {
    /// Opens receives while the credit allows (and the client has not stopped). Each is routed
    /// to the queue's owner when it opens; two are open only while that owner is this node
    /// (see the module docs).
    fn open_receives(&mut self) {
        let local = self.svc.router.is_local(&self.queue);
        self.receives
            .set_max(if local { RECEIVES_LOCAL } else { 1 });
        while let Some(ask) = self
            .receives
            .next_ask(self.credits)
            .filter(|_| !self.stopped)
        {
            let req = pb::BackendReceiveRequest {
                queue: self.start.queue.clone(),
                session_id: self.start.session_id.clone(),
                selector: self.start.selector.clone(),
                max_messages: u32::try_from(ask).unwrap_or(1),
                wait_ms: None,
                lease_ms: self.start.lease_ms,
                clamp_max_messages: true,
                consumer: self.consumer,
                placement_epoch: PlacementEpoch::UNKNOWN.get(),
            };
            let (svc, queue, session) = (self.svc.clone(), self.queue.clone(), self.session);
            let receive = async move {
                svc.receive_at(session, &queue, None, |be, placement_epoch| {
                    let req = pb::BackendReceiveRequest {
                        placement_epoch: placement_epoch.get(),
                        ..req.clone()
                    };
                    async move { be.receive(Request::new(req)).await }
                })
                .await
            };
            // Out of tokio's task budget: a spent budget would have the second look at a
            // receive (`Receives::next`) report an answer that is there as not yet made.
            self.receives
                .open(ask, Box::pin(tokio::task::unconstrained(receive)));
        }
    }

    /// Sends one answer to the client; ends the stream if the client is gone.
    async fn push(&mut self, reply: Result<pb::ConsumeResponse, Status>) -> Next {
        match self.tx.send(reply).await {
            Ok(()) => Next::Continue,
            Err(_) => Next::End,
        }
    }

    /// One request the client wrote after `start`.
    async fn on_request(&mut self, kind: Kind) -> Next {
        match kind {
            Kind::Stop(true) => {
                self.stopped = true;
                let open = std::mem::take(&mut self.receives.open);
                give_back(&self.svc, &self.start.session_id, open).await;
                let out = pb::ConsumeResponse {
                    kind: Some(pb::consume_response::Kind::Stopped(pb::Stopped {})),
                };
                self.push(Ok(out)).await
            }
            Kind::Credit(n) => {
                self.credits = self.credits.saturating_add(u64::from(n));
                Next::Continue
            }
            Kind::Flush(token) => {
                // Answered after everything queued before it (the answers go out in order).
                let out = pb::ConsumeResponse {
                    kind: Some(pb::consume_response::Kind::Flushed(token)),
                };
                self.acks
                    .push_back(Box::pin(std::future::ready(Some(Ok(out)))));
                Next::Continue
            }
            kind => {
                let svc = self.svc.clone();
                let quiet = self.start.quiet_acks;
                let session_id = self.start.session_id.clone();
                self.acks.push_back(Box::pin(async move {
                    handle(&svc, &session_id, kind, quiet).await
                }));
                Next::Continue
            }
        }
    }

    /// The oldest open receive answered: push its deliveries.
    async fn on_deliveries(&mut self, res: Answer) -> Next {
        let deliveries = match res {
            Ok(r) => r.deliveries,
            Err(status) => {
                let _ = self.tx.send(Err(status)).await;
                return Next::End;
            }
        };
        self.credits = self.credits.saturating_sub(deliveries.len() as u64);
        let handles: Vec<String> = deliveries
            .iter()
            .map(|d| d.receipt_handle.clone())
            .collect();
        // Noted before the push, which may wait for room on the stream: a receive of the same
        // session that lost its answer has the back-end keep what is noted (see
        // `Dispatch::release_lost`), and must keep these.
        if let Some(sid) = self.session {
            self.svc
                .sessions
                .note_delivered(sid, handles.iter().map(String::as_str));
        }
        let out = pb::ConsumeResponse {
            kind: Some(pb::consume_response::Kind::Deliveries(pb::Deliveries {
                deliveries,
            })),
        };
        if self.tx.send(Ok(out)).await.is_err() {
            // The client is gone: give these back now rather than at lease expiry, not counted
            // as deliveries (nobody saw them). A heartbeat then finds them gone.
            let _ = release(&self.svc, &self.start.session_id, &handles).await;
            return Next::End;
        }
        Next::Continue
    }

    /// However the stream ends: the open receive gives back what it holds, and every ack, nack
    /// and release the client wrote before the end takes effect (and is answered, if the client
    /// still listens). Dropping them would leave acknowledged messages leased, to be delivered
    /// again when their leases run out. `last`, if any, is the status the stream ends with.
    async fn finish(mut self, last: Option<Status>) {
        give_back(&self.svc, &self.start.session_id, self.receives.open).await;
        while let Some(reply) = self.acks.next().await {
            if let Some(reply) = reply {
                let _ = self.tx.send(reply).await;
            }
        }
        if let Some(status) = last {
            let _ = self.tx.send(Err(status)).await;
        }
    }
}

/// Ends the open receives. Dropping one removes its waiter at the back-end, and a back-end that
/// answers a dropped receive takes the deliveries back; answers that already arrived but were
/// not pushed are given back here, uncounted.
async fn give_back(svc: &Dispatch, session_id: &str, receives: VecDeque<Receive>) {
    let mut handles: Vec<String> = vec![];
    for r in receives {
        let answer = match r.state {
            ReceiveState::Answered(answer) => Some(answer),
            ReceiveState::Waiting(f) => futures::FutureExt::now_or_never(f),
        };
        if let Some(Ok(r)) = answer {
            handles.extend(r.deliveries.iter().map(|d| d.receipt_handle.clone()));
        }
    }
    let _ = release(svc, session_id, &handles).await;
}

/// Returns deliveries nobody saw: back to Ready at once, not counted as deliveries.
async fn release(
    svc: &Dispatch,
    session_id: &str,
    handles: &[String],
) -> Result<Vec<String>, Status> {
    if handles.is_empty() {
        return Ok(vec![]);
    }
    svc.lease_op(session_id, handles, |be, req| async move {
        be.nack(Request::new(pb::BackendLeaseRequest {
            undelivered: true,
            ..req
        }))
        .await
    })
    .await
    .map(|(_, stale)| stale)
}

/// Applies an ack, nack or release; its answer, if it gets one: always with `quiet` false, only
/// when some handles were stale (or it failed) with `quiet` true.
async fn handle(
    svc: &Dispatch,
    session_id: &str,
    kind: Kind,
    quiet: bool,
) -> Option<Result<pb::ConsumeResponse, Status>> {
    let result = |stale_receipt_handles: Vec<String>| {
        if quiet && stale_receipt_handles.is_empty() {
            return None;
        }
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
        Kind::Release(h) => match release(svc, session_id, &h.receipt_handles).await {
            Ok(stale) => result(stale),
            Err(status) => Some(Err(status)),
        },
        // Taken by the stream loop.
        Kind::Credit(_) | Kind::Flush(_) => None,
        // The client does not wait for this answer (unless it flushes): the delete may share
        // the next synced write.
        Kind::Ack(h) => match svc
            .lease_op(session_id, &h.receipt_handles, |be, req| async move {
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
            .lease_op(session_id, &h.receipt_handles, |be, req| async move {
                be.nack(Request::new(req)).await
            })
            .await
        {
            Ok((_, stale)) => result(stale),
            Err(status) => Some(Err(status)),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::FutureExt;
    use tokio::sync::oneshot;

    /// A receive whose answer the test gives by hand.
    fn receive() -> (oneshot::Sender<Answer>, Inflight) {
        let (tx, rx) = oneshot::channel();
        let f = async move {
            rx.await
                .unwrap_or_else(|_| Err(Status::cancelled("test dropped it")))
        };
        (tx, Box::pin(f))
    }

    /// `n` deliveries, the first one's lease `lease`.
    fn answer(lease: u64, n: usize) -> Answer {
        let delivery = |l: u64| pb::Delivery {
            receipt_handle: ferry_kernel::ReceiptHandle {
                queue: QueueName::new("q").expect("a valid name"),
                uid: ferry_kernel::QueueUid(1),
                seq: ferry_kernel::Seq(l),
                lease: ferry_kernel::LeaseId(l),
                delivery_count: 1,
                tag: 0,
            }
            .to_string(),
            ..Default::default()
        };
        Ok(pb::BackendReceiveResponse {
            deliveries: (lease..lease + n as u64).map(delivery).collect(),
        })
    }

    fn count(a: Answer) -> usize {
        a.expect("an answer").deliveries.len()
    }

    #[test]
    fn credit_is_shared_between_two_receives_and_never_overasked() {
        let mut r = Receives::new(2);
        assert_eq!(r.next_ask(0), None, "no credit, no receive");
        assert_eq!(r.next_ask(9), Some(5), "the first takes a share");
        r.open(5, receive().1);
        assert_eq!(r.next_ask(9), Some(4), "the second the rest");
        r.open(4, receive().1);
        assert_eq!(r.next_ask(100), None, "two at most");
        let mut one = Receives::new(1);
        assert_eq!(one.next_ask(5_000), Some(BATCH_MAX), "bounded by the batch");
        one.open(BATCH_MAX, receive().1);
        assert_eq!(one.next_ask(5_000), None);
    }

    /// The next answer, which must be there already.
    fn next_now(r: &mut Receives) -> pb::BackendReceiveResponse {
        r.next()
            .now_or_never()
            .expect("answered")
            .expect("deliveries")
    }

    /// Found together, answers go out in the order the back-end handed their messages out,
    /// whichever receive was opened first.
    #[test]
    fn answers_found_together_are_pushed_in_the_order_handed_out() {
        for (older_lease, younger_lease) in [(1, 3), (3, 1)] {
            let mut r = Receives::new(2);
            let (older, f) = receive();
            r.open(2, f);
            let (younger, f) = receive();
            r.open(2, f);
            younger.send(answer(younger_lease, 2)).expect("listening");
            older.send(answer(older_lease, 2)).expect("listening");
            assert_eq!(handed_out_at(&Ok(next_now(&mut r))), 1);
            assert_eq!(handed_out_at(&Ok(next_now(&mut r))), 3);
            assert!(r.is_empty());
        }
    }

    /// The race `Receives::next` closes: the back-end answers the older receive just after it
    /// was looked at and the younger one before it is looked at. The older answer, made first,
    /// still goes out first.
    #[test]
    fn an_answer_made_while_the_receives_are_looked_at_keeps_its_place() {
        let mut r = Receives::new(2);
        let (older_tx, older_rx) = oneshot::channel::<Answer>();
        let (younger_tx, younger) = receive();
        let mut senders = Some((older_tx, younger_tx));
        let mut older_rx = Some(older_rx);
        let older = std::future::poll_fn(move |cx| {
            if let Some((older_tx, younger_tx)) = senders.take() {
                // Looked at before the back-end answered; both answers are made right after.
                older_tx.send(answer(1, 1)).expect("listening");
                younger_tx.send(answer(2, 1)).expect("listening");
                cx.waker().wake_by_ref();
                return Poll::Pending;
            }
            let rx = older_rx.as_mut().expect("polled until answered");
            let answer = std::task::ready!(Pin::new(rx).poll(cx));
            older_rx = None;
            Poll::Ready(answer.unwrap_or_else(|_| Err(Status::cancelled("dropped"))))
        });
        r.open(1, Box::pin(older));
        r.open(1, younger);
        assert_eq!(
            handed_out_at(&Ok(next_now(&mut r))),
            1,
            "the answer made first goes first"
        );
        assert_eq!(handed_out_at(&Ok(next_now(&mut r))), 2);
        assert!(r.is_empty());
    }

    /// The failover case (see the module docs): the older receive was parked after the newer
    /// one, which the back-end answered first. Its answer goes out at once, not after the older
    /// one's, which may wait for a lease to run out.
    #[test]
    fn an_answer_is_not_held_behind_an_older_receive_still_waiting() {
        let mut r = Receives::new(2);
        let (first, f) = receive();
        r.open(1, f);
        let (second, f) = receive();
        r.open(1, f);
        second.send(answer(1, 2)).expect("listening");
        assert_eq!(r.next().now_or_never().map(count), Some(2));
        assert_eq!(r.open.len(), 1, "the older one still waits");
        assert!(r.next().now_or_never().is_none());
        first.send(answer(3, 1)).expect("listening");
        assert_eq!(r.next().now_or_never().map(count), Some(1));
        assert!(r.is_empty());
    }

    #[test]
    fn a_failed_extra_receive_leaves_the_stream_with_one_for_good() {
        let mut r = Receives::new(2);
        let (first, f) = receive();
        r.open(1, f);
        let (second, f) = receive();
        r.open(1, f);
        second
            .send(Err(Status::resource_exhausted("waiters_per_queue_max")))
            .expect("listening");
        assert!(r.next().now_or_never().is_none(), "the first still waits");
        assert_eq!(r.open.len(), 1, "the failed one is dropped");
        r.set_max(RECEIVES_LOCAL);
        assert_eq!(r.next_ask(10), None, "no second one again");
        first.send(answer(1, 3)).expect("listening");
        assert_eq!(r.next().now_or_never().map(count), Some(3));
        assert_eq!(r.next_ask(10), Some(10), "one receive, the whole credit");
    }

    #[test]
    fn a_remote_owner_gets_one_receive() {
        let mut r = Receives::new(RECEIVES_LOCAL);
        r.set_max(1);
        assert_eq!(r.next_ask(10), Some(10));
        r.open(10, receive().1);
        assert_eq!(r.next_ask(20), None);
    }
}
