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
#[derive(Debug)]
pub struct Consumer {
    session: Session,
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
}

impl Session {
    /// Starts a consumer on `queue` over a `Consume` stream. Fails at once for a bad selector or
    /// a transacted session (which receives with [`Session::receive`] and acknowledges at commit).
    pub async fn consumer(
        &self,
        queue: &str,
        opts: ConsumerOptions,
    ) -> Result<Consumer, ClientError> {
        let (requests, outbound) = mpsc::unbounded_channel();
        let start = pb::ConsumeRequest {
            kind: Some(Kind::Start(pb::ConsumeStart {
                session_id: self.id().to_string(),
                queue: queue.into(),
                selector: opts.selector,
                prefetch: opts.prefetch.max(1),
                lease_ms: opts.lease_ms,
                quiet_acks: opts.quiet_acks,
            })),
        };
        let _ = requests.send(start);
        let responses = self
            .client()
            .messaging()
            .consume(UnboundedReceiverStream::new(outbound))
            .await?
            .into_inner();
        Ok(Consumer {
            session: self.clone(),
            requests,
            responses: Some(responses),
            buffer: VecDeque::new(),
            stale_acks: Arc::default(),
            acks_sent: 0,
            acks_answered: 0,
            stopped: false,
        })
    }
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

    fn handed_over(&mut self, out: &[Received]) {
        let n = u32::try_from(out.len()).unwrap_or(u32::MAX);
        if self.session.acknowledges_on_receive() {
            let handles = out.iter().map(|r| r.receipt_handle().to_string()).collect();
            let _ = self.send(Kind::Ack(pb::ReceiptHandles {
                receipt_handles: handles,
            }));
        } else {
            self.session.track_unacked(out);
        }
        // The application took these: the server may push as many more.
        let _ = self.send(Kind::Credit(n));
    }

    /// Stops the stream: no more deliveries; the ones pushed ahead and never handed over go back
    /// to the queue unseen (not counted as deliveries); waits until every acknowledgement sent on
    /// the stream took effect ([`Consumer::flush`]).
    pub async fn close(mut self) -> Result<(), ClientError> {
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
    pub async fn flush(&mut self) -> Result<(), ClientError> {
        let upto = self.acks_sent;
        if self.acks_answered < upto {
            self.send(Kind::Flush(upto))?;
        }
        while self.acks_answered < upto {
            self.read_one().await?;
        }
        Ok(())
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
        if matches!(kind, Kind::Ack(_) | Kind::Release(_) | Kind::Nack(_)) {
            self.acks_sent += 1;
        }
        self.requests
            .send(pb::ConsumeRequest { kind: Some(kind) })
            .map_err(|_| ClientError::InvalidArgument("the consumer's stream has ended".into()))
    }

    /// Reads one response off the stream into the buffer.
    async fn read_one(&mut self) -> Result<(), ClientError> {
        let Some(responses) = self.responses.as_mut() else {
            return Err(ClientError::InvalidArgument(
                "the consumer's stream has ended".into(),
            ));
        };
        match responses.message().await? {
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
mod tests {
    use std::time::Duration;

    use ferry_proto::pb;
    use ferry_proto::pb::consume_request::Kind;
    use ferry_proto::pb::consume_response::Kind as Answer;

    use crate::fake::{self, Fake, FakeStream};
    use crate::{AckMode, Consumer, ConsumerOptions};

    type Stream = FakeStream<pb::ConsumeRequest, pb::ConsumeResponse>;

    /// A consumer on queue `q` in `mode` with `prefetch`, and its stream past the start.
    async fn consumer(fake: &mut Fake, mode: AckMode, prefetch: u32) -> (Consumer, Stream) {
        let connection = fake.client.open_connection("t").await.expect("open");
        let session = connection.create_session(mode).await.expect("session");
        let consumer = session
            .consumer("q", ConsumerOptions::default().prefetch(prefetch))
            .await
            .expect("consumer");
        let mut stream = fake.next_consume().await;
        let Some(Kind::Start(start)) = stream.next().await.kind else {
            panic!("the stream opens with a start");
        };
        assert_eq!(
            (start.session_id.as_str(), start.queue.as_str()),
            ("session-1", "q")
        );
        assert_eq!(start.prefetch, prefetch.max(1), "prefetch asked for");
        (consumer, stream)
    }

    async fn push(stream: &Stream, handles: &[&str]) {
        let deliveries = handles
            .iter()
            .map(|h| pb::Delivery {
                receipt_handle: h.to_string(),
                delivery_count: 1,
                ..Default::default()
            })
            .collect();
        let kind = Answer::Deliveries(pb::Deliveries { deliveries });
        stream
            .answer(Ok(pb::ConsumeResponse { kind: Some(kind) }))
            .await;
    }

    fn handles(kind: Option<Kind>) -> (&'static str, Vec<String>) {
        match kind {
            Some(Kind::Ack(h)) => ("ack", h.receipt_handles),
            Some(Kind::Release(h)) => ("release", h.receipt_handles),
            other => panic!("expected an ack or a release, got {other:?}"),
        }
    }

    fn strings(s: &[&str]) -> Vec<String> {
        s.iter().map(|s| s.to_string()).collect()
    }

    const WAIT: Option<Duration> = Some(Duration::from_secs(10));

    #[tokio::test]
    async fn auto_ack_returns_one_credit_per_message_handed_over_and_gives_back_the_unseen() {
        let mut fake = fake::start(30_000).await;
        let (mut consumer, mut stream) = consumer(&mut fake, AckMode::Auto, 3).await;
        push(&stream, &["h1", "h2", "h3"]).await;
        let got = consumer.receive_batch(2, WAIT).await.expect("two");
        let got: Vec<&str> = got.iter().map(|r| r.receipt_handle()).collect();
        assert_eq!(got, ["h1", "h2"]);
        // Handed over: acknowledged (auto), and room for as many more at the server.
        assert_eq!(
            handles(stream.next().await.kind),
            ("ack", strings(&["h1", "h2"]))
        );
        assert_eq!(stream.next().await.kind, Some(Kind::Credit(2)));
        let third = consumer.receive(Some(Duration::ZERO)).await.expect("h3");
        assert_eq!(
            third.map(|r| r.receipt_handle().to_string()).as_deref(),
            Some("h3")
        );
        assert_eq!(handles(stream.next().await.kind), ("ack", strings(&["h3"])));
        assert_eq!(stream.next().await.kind, Some(Kind::Credit(1)));
        // Nothing pushed, nothing handed over: no credit.
        assert!(consumer
            .receive(Some(Duration::ZERO))
            .await
            .expect("none")
            .is_none());
        // Two more pushed, never taken: closing gives them back unseen, then waits until the
        // server says every ack and the release took effect.
        push(&stream, &["h4", "h5"]).await;
        let closing = tokio::spawn(consumer.close());
        assert_eq!(stream.next().await.kind, Some(Kind::Stop(true)));
        let stopped = Answer::Stopped(pb::Stopped {});
        stream
            .answer(Ok(pb::ConsumeResponse {
                kind: Some(stopped),
            }))
            .await;
        assert_eq!(
            handles(stream.next().await.kind),
            ("release", strings(&["h4", "h5"]))
        );
        assert_eq!(
            stream.next().await.kind,
            Some(Kind::Flush(3)),
            "two acks, one release"
        );
        assert!(
            !closing.is_finished(),
            "closed before the flush was answered"
        );
        let flushed = Answer::Flushed(3);
        stream
            .answer(Ok(pb::ConsumeResponse {
                kind: Some(flushed),
            }))
            .await;
        closing.await.expect("no panic").expect("closed");
    }

    #[tokio::test]
    async fn client_ack_returns_credit_on_handing_over_and_acks_cumulatively_when_told() {
        let mut fake = fake::start(30_000).await;
        let (mut consumer, mut stream) = consumer(&mut fake, AckMode::Client, 0).await;
        push(&stream, &["h1", "h2", "h3"]).await;
        let got = consumer.receive_batch(3, WAIT).await.expect("three");
        assert_eq!(got.len(), 3);
        // No ack until the application says so; the credit comes at once.
        assert_eq!(stream.next().await.kind, Some(Kind::Credit(3)));
        // Acknowledging the second acknowledges the first with it (JMS CLIENT_ACKNOWLEDGE).
        consumer.ack(&got[1..2]).expect("ack");
        let (kind, mut acked) = handles(stream.next().await.kind);
        acked.sort();
        assert_eq!((kind, acked), ("ack", strings(&["h1", "h2"])));
        consumer.ack(&got[2..]).expect("ack");
        assert_eq!(handles(stream.next().await.kind), ("ack", strings(&["h3"])));
    }
}
