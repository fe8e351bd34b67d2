//! A consumer on a `Consume` stream: the server pushes up to `prefetch` messages ahead of the
//! application, and acknowledgements and new credit go back on the same stream, coalesced per
//! batch the application takes. No call per receive, no call per ack.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use ferry_proto::pb;
use ferry_proto::pb::consume_request::Kind;
use tokio::sync::mpsc;
use tokio_stream::wrappers::UnboundedReceiverStream;
use tonic::Streaming;

use crate::connection::Session;
use crate::message::Received;
use crate::ClientError;

/// How a [`Consumer`] consumes.
#[derive(Debug, Clone)]
pub struct ConsumerOptions {
    /// A JMS message selector; empty: every message.
    pub selector: String,
    /// Messages the server may push ahead of the application (at least 1).
    pub prefetch: u32,
    /// Lease of each delivery; the queue's default when absent.
    pub lease_ms: Option<u64>,
    /// Ask the server to answer only acknowledgements that found stale handles (default), and
    /// learn of the rest from a flush. `false` has it answer each one, as nodes from before
    /// quiet acks do; the consumer behaves the same either way.
    pub quiet_acks: bool,
}

impl Default for ConsumerOptions {
    fn default() -> Self {
        Self {
            selector: String::new(),
            prefetch: 100,
            lease_ms: None,
            quiet_acks: true,
        }
    }
}

impl ConsumerOptions {
    pub fn prefetch(mut self, n: u32) -> Self {
        self.prefetch = n;
        self
    }

    pub fn selector(mut self, s: impl Into<String>) -> Self {
        self.selector = s.into();
        self
    }

    pub fn quiet_acks(mut self, quiet: bool) -> Self {
        self.quiet_acks = quiet;
        self
    }
}

/// See the module docs. Made by [`Session::consumer`]. [`Consumer::close`] gives the messages
/// pushed ahead and never handed over back to the queue at once and waits until every ack took
/// effect. Dropping a consumer without closing still delivers the acks already made and gives
/// back what it holds, but a push that was on its way at that moment stays leased to the
/// session until it closes or the leases run out.
///
/// Acknowledgement follows the session's mode:
/// - auto / dups-ok: the messages a receive returns are acknowledged on the stream as it returns
///   them, without waiting for the server (as JMS brokers with prefetch do); a message whose ack
///   arrives after its lease ran out is redelivered flagged, and counted in
///   [`Consumer::stale_acks`];
/// - client: [`Consumer::ack`] acknowledges the named messages and every message the session
///   handed over before them;
/// - individual: [`Consumer::ack`] acknowledges exactly the named messages.
///
/// A delivery's lease runs from when the server pushed it: messages waiting in the prefetch
/// buffer use up their lease. Keep the prefetch to what the application handles well within one
/// lease.
///
/// **Failover.** When the stream ends `UNAVAILABLE` (the node serving the queue died or stopped
/// leading it: a replicated queue's shard elects another leader within seconds), the consumer
/// opens a new stream on the same session by itself, up to [`REOPEN_ATTEMPTS`] times in a row
/// with a growing pause, and [`Consumer::reopened`] counts it. What the application sees:
/// - messages it already took stay its own: on a replicated queue their acknowledgements land
///   on the new leader (its leases and receipt handles outlive the failover);
/// - messages pushed ahead and not yet taken are still handed over (they are leased to the
///   session; the new stream pushes more only as the application takes messages beyond them);
///   acknowledgements made while no stream is open go on the next one;
/// - an acknowledgement sent on the broken stream that the server had not confirmed may or may
///   not have landed ([`Consumer::unconfirmed_acks`] counts them); if it did not, that message
///   comes back flagged redelivered when its lease runs out. Nothing is lost, and nothing is
///   handed over twice without the redelivered flag. The next [`Consumer::flush`] (and
///   [`Consumer::close`]) fails `UNAVAILABLE` saying how many acknowledgements went
///   unconfirmed, so an application that counts on its acks learns it.
///
/// Any other error ends the consumer with that error; so does a stream that cannot be opened
/// again: `UNAVAILABLE` [`REOPEN_ATTEMPTS`] times in a row, or no connection to the node at all
/// (it stopped, and the session with it). Then the error is what ended the first stream.
#[derive(Debug)]
pub struct Consumer {
    session: Session,
    /// What each stream of this consumer starts with.
    start: pb::ConsumeStart,
    requests: mpsc::UnboundedSender<pb::ConsumeRequest>,
    /// Always `Some` until the consumer is dropped (see `Drop`).
    responses: Option<Streaming<pb::ConsumeResponse>>,
    buffer: VecDeque<Received>,
    stale_acks: Arc<AtomicU64>,
    /// Acks, nacks and releases sent, and how many of the first of them are known to have taken
    /// effect: each `ack_result` answers one; `flushed(n)` answers the first n. The server
    /// answers only stale ones (`quiet_acks`), so a flush is how the consumer learns of the
    /// others; a server too old for `quiet_acks` answers each and ignores the flush.
    acks_sent: u64,
    acks_answered: u64,
    /// The server answered `stop`: nothing more comes.
    stopped: bool,
    /// `close` asked the server to stop: a stream that breaks now is not opened again.
    closing: bool,
    /// The stream ended `UNAVAILABLE` and another is not open yet: why.
    broken: Option<tonic::Status>,
    /// The next stream on its way (a task, so a read cancelled meanwhile loses nothing).
    opening: Option<tokio::task::JoinHandle<Result<Opened, ClientError>>>,
    /// Requests made while the stream was broken, for the next one.
    pending: Vec<Kind>,
    /// Messages in `buffer` pushed by a stream that broke since: handing them over grants the
    /// new stream no credit (it starts with the whole prefetch).
    carried: usize,
    /// What ended the stream first, when it broke and has not answered since: the error the
    /// consumer ends with if it cannot open another.
    first_break: Option<tonic::Status>,
    /// Unconfirmed acks (see `unconfirmed_acks`) the next `flush` has not reported yet.
    unconfirmed_unreported: u64,
    /// Streams opened again after an `UNAVAILABLE` end, in all and since the last answer.
    reopened: u64,
    reopens_in_a_row: u32,
    /// Acks, nacks and releases sent on streams that broke before the server confirmed them.
    unconfirmed_acks: u64,
}

/// How many times in a row a [`Consumer`] opens its stream again after it ended `UNAVAILABLE`
/// before giving up (pauses of 100 ms, doubling: about 3 s in all, on top of the server's own
/// wait for a new leader).
pub const REOPEN_ATTEMPTS: u32 = 5;

impl Session {
    /// Starts a consumer on `queue` over a `Consume` stream. Fails at once for a bad selector or
    /// a transacted session (which receives with [`Session::receive`] and acknowledges at commit).
    pub async fn consumer(
        &self,
        queue: &str,
        opts: ConsumerOptions,
    ) -> Result<Consumer, ClientError> {
        let start = pb::ConsumeStart {
            session_id: self.id().to_string(),
            queue: queue.into(),
            selector: opts.selector,
            prefetch: opts.prefetch.max(1),
            lease_ms: opts.lease_ms,
            quiet_acks: opts.quiet_acks,
        };
        let (requests, responses) = open(self, &start, vec![]).await?;
        Ok(Consumer {
            session: self.clone(),
            start,
            requests,
            responses: Some(responses),
            buffer: VecDeque::new(),
            stale_acks: Arc::default(),
            acks_sent: 0,
            acks_answered: 0,
            stopped: false,
            closing: false,
            broken: None,
            opening: None,
            pending: vec![],
            carried: 0,
            first_break: None,
            unconfirmed_unreported: 0,
            reopened: 0,
            reopens_in_a_row: 0,
            unconfirmed_acks: 0,
        })
    }
}

type Opened = (
    mpsc::UnboundedSender<pb::ConsumeRequest>,
    Streaming<pb::ConsumeResponse>,
);

/// Opens a `Consume` stream with `start`, then `first` on it.
async fn open(
    session: &Session,
    start: &pb::ConsumeStart,
    first: Vec<Kind>,
) -> Result<Opened, ClientError> {
    let (requests, outbound) = mpsc::unbounded_channel();
    for kind in std::iter::once(Kind::Start(start.clone())).chain(first) {
        let _ = requests.send(pb::ConsumeRequest { kind: Some(kind) });
    }
    let responses = session
        .client()
        .messaging()
        .consume(UnboundedReceiverStream::new(outbound))
        .await?
        .into_inner();
    Ok((requests, responses))
}

impl Consumer {
    /// The next message: `timeout` `None` waits for ever, `Some(ZERO)` only takes what already
    /// arrived (receiveNoWait). `Ok(None)`: nothing in time.
    pub async fn receive(
        &mut self,
        timeout: Option<Duration>,
    ) -> Result<Option<Received>, ClientError> {
        Ok(self.receive_batch(1, timeout).await?.pop())
    }

    /// Every message already pushed (at most `max`), waiting up to `timeout` for the first one
    /// when none has arrived. Empty: nothing in time.
    pub async fn receive_batch(
        &mut self,
        max: usize,
        timeout: Option<Duration>,
    ) -> Result<Vec<Received>, ClientError> {
        if self.buffer.is_empty() {
            let wait = async {
                while self.buffer.is_empty() {
                    self.read_one().await?;
                }
                Ok::<_, ClientError>(())
            };
            match timeout {
                None => wait.await?,
                // Timing out is an empty answer, not an error.
                Some(t) => {
                    if let Ok(r) = tokio::time::timeout(t, wait).await {
                        r?;
                    }
                }
            }
        }
        // Take whatever else has arrived meanwhile, without waiting.
        while self.buffer.len() < max {
            match futures::FutureExt::now_or_never(self.read_one()) {
                Some(r) => r?,
                None => break,
            }
        }
        let n = max.min(self.buffer.len());
        let out: Vec<Received> = self.buffer.drain(..n).collect();
        if !out.is_empty() {
            self.handed_over(&out);
        }
        Ok(out)
    }

    /// Acknowledges on the stream (client and individual modes; see the type's docs). Does not
    /// wait for the server: an ack that finds the lease gone is counted in
    /// [`Consumer::stale_acks`], and that message is redelivered.
    pub fn ack(&mut self, received: &[Received]) -> Result<(), ClientError> {
        let handles = self.session.take_acknowledged(received);
        self.send(Kind::Ack(pb::ReceiptHandles {
            receipt_handles: handles,
        }))
    }

    /// Acks that arrived after their message's lease ran out (those messages are redelivered).
    pub fn stale_acks(&self) -> u64 {
        self.stale_acks.load(Ordering::Relaxed)
    }

    /// How many times the stream was opened again after it ended `UNAVAILABLE` (see the type's
    /// docs on failover).
    pub fn reopened(&self) -> u64 {
        self.reopened
    }

    /// Acks, nacks and releases sent on a stream that broke before the server confirmed them:
    /// each may or may not have taken effect (a message whose ack did not is redelivered,
    /// flagged, when its lease runs out).
    pub fn unconfirmed_acks(&self) -> u64 {
        self.unconfirmed_acks
    }

    fn handed_over(&mut self, out: &[Received]) {
        let carried = self.carried.min(out.len());
        self.carried -= carried;
        let n = u32::try_from(out.len() - carried).unwrap_or(u32::MAX);
        if self.session.acknowledges_on_receive() {
            let handles = out.iter().map(|r| r.receipt_handle().to_string()).collect();
            let _ = self.send(Kind::Ack(pb::ReceiptHandles {
                receipt_handles: handles,
            }));
        } else {
            self.session.track_unacked(out);
        }
        // The application took these: the server may push as many more.
        if n > 0 {
            let _ = self.send(Kind::Credit(n));
        }
    }

    /// Stops the stream: no more deliveries; the ones pushed ahead and never handed over go back
    /// to the queue unseen (not counted as deliveries); waits until every acknowledgement sent on
    /// the stream took effect ([`Consumer::flush`]).
    pub async fn close(mut self) -> Result<(), ClientError> {
        if self.requests.is_closed() && self.broken.is_none() {
            // The stream ended unnoticed: find out how (and open another if it can be).
            self.read_one().await?;
        }
        if self.broken.is_some() {
            self.reopen().await?;
        }
        self.closing = true;
        self.send(Kind::Stop(true))?;
        while !self.stopped {
            self.read_one().await?;
        }
        self.release_unseen()?;
        self.flush().await
    }

    /// Waits until every acknowledgement sent on this stream so far took effect at the server
    /// (one `flush` round trip; none if the server already said so). Deliveries that arrive
    /// meanwhile wait in the consumer's buffer. After this,
    /// [`Consumer::stale_acks`] counts every one of them that came too late.
    ///
    /// Fails `UNAVAILABLE` if acknowledgements were sent on a stream that broke before the
    /// server confirmed them ([`Consumer::unconfirmed_acks`]): each may or may not have taken
    /// effect (a message whose ack did not comes back flagged redelivered). The consumer goes on.
    pub async fn flush(&mut self) -> Result<(), ClientError> {
        loop {
            if self.broken.is_some() {
                self.reopen().await?;
            }
            // A stream opened again meanwhile counts from zero: flush that one.
            let (upto, stream) = (self.acks_sent, self.reopened);
            if self.acks_answered < upto {
                self.send(Kind::Flush(upto))?;
            }
            while self.acks_answered < upto && self.reopened == stream {
                self.read_one().await?;
            }
            if self.reopened == stream && self.broken.is_none() {
                break;
            }
        }
        match std::mem::take(&mut self.unconfirmed_unreported) {
            0 => Ok(()),
            n => Err(ClientError::Status(tonic::Status::unavailable(format!(
                "the consumer's stream broke before the server confirmed {n} acknowledgement(s): each may or may not have taken effect (a message whose ack did not comes back flagged redelivered); the consumer goes on, on a new stream"
            )))),
        }
    }

    /// Gives back, unseen, what was pushed and never handed to the application.
    fn release_unseen(&mut self) -> Result<(), ClientError> {
        let unseen: Vec<String> = self
            .buffer
            .drain(..)
            .map(|r| r.delivery.receipt_handle)
            .collect();
        if unseen.is_empty() {
            return Ok(());
        }
        self.send(Kind::Release(pb::ReceiptHandles {
            receipt_handles: unseen,
        }))
    }

    fn send(&mut self, kind: Kind) -> Result<(), ClientError> {
        let settles = matches!(kind, Kind::Ack(_) | Kind::Release(_) | Kind::Nack(_));
        let kind = if self.broken.is_none() || self.closing {
            match self.requests.send(pb::ConsumeRequest { kind: Some(kind) }) {
                Ok(()) => {
                    self.acks_sent += u64::from(settles);
                    return Ok(());
                }
                Err(_) if self.closing => {
                    return Err(ClientError::InvalidArgument(
                        "the consumer's stream has ended".into(),
                    ))
                }
                // The stream is gone; the next read finds out why.
                Err(mpsc::error::SendError(request)) => request.kind,
            }
        } else {
            Some(kind)
        };
        // Acks, nacks and releases go on the next stream; credit and flushes were for this one.
        if let Some(kind) = kind.filter(|_| settles) {
            self.pending.push(kind);
        }
        Ok(())
    }

    /// Reads one response off the stream into the buffer.
    async fn read_one(&mut self) -> Result<(), ClientError> {
        if self.broken.is_some() {
            return self.reopen().await;
        }
        let Some(responses) = self.responses.as_mut() else {
            return Err(ClientError::InvalidArgument(
                "the consumer's stream has ended".into(),
            ));
        };
        let response = match responses.message().await {
            Ok(r) => r,
            Err(status) if status.code() == tonic::Code::Unavailable && !self.closing => {
                // Noted, and the next stream on its way, before anything awaits: a read
                // cancelled meanwhile (a short timeout) loses nothing.
                self.note_break(status);
                return self.reopen().await;
            }
            Err(status) => return Err(status.into()),
        };
        self.reopens_in_a_row = 0;
        self.first_break = None;
        match response {
            Some(pb::ConsumeResponse {
                kind: Some(pb::consume_response::Kind::Deliveries(d)),
            }) => self.buffer.extend(
                d.deliveries
                    .into_iter()
                    .map(|delivery| Received { delivery }),
            ),
            Some(pb::ConsumeResponse {
                kind: Some(pb::consume_response::Kind::AckResult(r)),
            }) => {
                self.acks_answered += 1;
                if !r.stale_receipt_handles.is_empty() {
                    self.stale_acks
                        .fetch_add(r.stale_receipt_handles.len() as u64, Ordering::Relaxed);
                    tracing::warn!(
                        stale = r.stale_receipt_handles.len(),
                        "acknowledgements found expired leases; those messages are redelivered"
                    );
                }
            }
            Some(pb::ConsumeResponse {
                kind: Some(pb::consume_response::Kind::Stopped(_)),
            }) => self.stopped = true,
            Some(pb::ConsumeResponse {
                kind: Some(pb::consume_response::Kind::Flushed(token)),
            }) => self.acks_answered = self.acks_answered.max(token),
            Some(_) => {}
            None => {
                return Err(ClientError::Status(tonic::Status::unavailable(
                    "the server ended the consumer's stream",
                )))
            }
        }
        Ok(())
    }
}

impl Consumer {
    /// The stream ended `UNAVAILABLE`: closes its books and starts opening another on the same
    /// session (see the type's docs on failover) after a pause, in a task of its own. What was
    /// pushed and not handed over goes back on the new stream first, so the application never
    /// takes a message that is being given back. Past [`REOPEN_ATTEMPTS`] in a row, nothing is
    /// started and `reopen` answers `cause`.
    fn note_break(&mut self, cause: tonic::Status) {
        let unconfirmed = self.acks_sent.saturating_sub(self.acks_answered);
        self.unconfirmed_acks += unconfirmed;
        self.unconfirmed_unreported += unconfirmed;
        (self.acks_sent, self.acks_answered) = (0, 0);
        self.carried = self.buffer.len();
        if self.first_break.is_none() {
            self.first_break = Some(cause.clone());
        }
        let attempt = self.reopens_in_a_row;
        self.broken = Some(cause);
        if attempt >= REOPEN_ATTEMPTS {
            return;
        }
        self.reopens_in_a_row += 1;
        let pause = Duration::from_millis(100) * 2u32.pow(attempt);
        if let Some(cause) = &self.broken {
            tracing::warn!(error = %cause, queue = %self.start.queue, ?pause, "the consumer's stream ended; opening it again");
        }
        let (session, start) = (self.session.clone(), self.start.clone());
        self.opening = Some(tokio::spawn(async move {
            tokio::time::sleep(pause).await;
            open(&session, &start, vec![]).await
        }));
    }

    /// The error the consumer ends with when it cannot open another stream: what ended the
    /// first one.
    fn gave_up(&mut self) -> ClientError {
        self.first_break
            .clone()
            .or_else(|| self.broken.clone())
            .unwrap_or_else(|| tonic::Status::unavailable("the consumer's stream ended"))
            .into()
    }

    /// Waits for the stream `note_break` started to open, starting another while it ends
    /// `UNAVAILABLE`; then sends on it what was asked for meanwhile.
    async fn reopen(&mut self) -> Result<(), ClientError> {
        while self.broken.is_some() {
            let Some(task) = self.opening.as_mut() else {
                return Err(self.gave_up());
            };
            // A JoinHandle may be awaited again after a cancelled wait.
            let opened = task.await;
            self.opening = None;
            match opened {
                Ok(Ok((requests, responses))) => {
                    self.requests = requests;
                    self.responses = Some(responses);
                    self.broken = None;
                    self.reopened += 1;
                    for kind in std::mem::take(&mut self.pending) {
                        self.send(kind)?;
                    }
                }
                // The node answered "unavailable": try again. No connection to it at all (a
                // transport error: it stopped), and the session is gone with it.
                Ok(Err(ClientError::Status(s)))
                    if s.code() == tonic::Code::Unavailable
                        && std::error::Error::source(&s).is_none() =>
                {
                    self.note_break(s);
                }
                Ok(Err(ClientError::Status(s))) if s.code() == tonic::Code::Unavailable => {
                    return Err(self.gave_up())
                }
                Ok(Err(e)) => return Err(e),
                Err(e) => {
                    return Err(ClientError::InvalidArgument(format!(
                        "opening the consumer's stream again failed: {e}"
                    )))
                }
            }
        }
        Ok(())
    }
}

impl Drop for Consumer {
    /// The acks already written must reach the server: dropping the response stream would cancel
    /// the call and lose them. So: give back what was pushed and never handed over, end the
    /// request side (the sender goes with `self`), and keep reading the responses in the
    /// background until the server, having applied everything, ends the stream.
    fn drop(&mut self) {
        let Some(mut responses) = self.responses.take() else {
            return;
        };
        let _ = self.release_unseen();
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move { while let Ok(Some(_)) = responses.message().await {} });
        }
    }
}

#[cfg(test)]
mod tests;
