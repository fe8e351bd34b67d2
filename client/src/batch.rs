//! Sends travel on one `Publish` stream per session: each send is written to the stream at once,
//! without waiting for earlier ones, and its confirmation comes back in order. The server sends
//! the requests that pile up while it writes to disk together (its group commit), so many
//! concurrent or pipelined sends cost one back-end write, not one each, and no timer adds latency.
//!
//! Order: a send is placed on the stream when [`Publisher::send`] is called, not when its future
//! is first polled, so sends are stored in the order they were made. A refused send (too large, a
//! bad property, a missing reply queue) fails alone; the server keeps the others in order.
//!
//! If the stream breaks, every send written to it and not yet confirmed fails with the stream's
//! error (it may or may not have been stored, as for any call that fails in flight); the sends
//! behind them go on a new stream.

use std::collections::VecDeque;
use std::future::Future;

use ferry_proto::pb;
use tokio::sync::{mpsc, oneshot};
use tokio_stream::wrappers::UnboundedReceiverStream;

use crate::ClientError;

type Answer = Result<Vec<String>, ClientError>;

struct Pending {
    request: pb::PublishRequest,
    reply: oneshot::Sender<Answer>,
}

/// The session's publish stream. Cheap to clone; the stream task ends when the last clone is
/// dropped and every send was answered.
#[derive(Debug, Clone)]
pub(crate) struct Publisher {
    tx: mpsc::UnboundedSender<Pending>,
}

impl Publisher {
    pub(crate) fn new(
        messaging: pb::messaging_client::MessagingClient<tonic::transport::Channel>,
    ) -> Self {
        let (tx, rx) = mpsc::unbounded_channel();
        tokio::spawn(run(messaging, rx));
        Self { tx }
    }

    /// Puts the send on the stream now; the future resolves with its message ids once the
    /// server confirms it.
    pub(crate) fn send(
        &self,
        session_id: &str,
        queue: &str,
        messages: Vec<pb::OutgoingMessage>,
    ) -> impl Future<Output = Answer> + Send + 'static {
        let (reply, answer) = oneshot::channel();
        let request = pb::PublishRequest {
            session_id: session_id.into(),
            queue: queue.into(),
            messages,
        };
        let queued = self.tx.send(Pending { request, reply }).is_ok();
        async move {
            if !queued {
                return Err(ClientError::InvalidArgument(
                    "the session's publish stream stopped".into(),
                ));
            }
            answer.await.unwrap_or_else(|_| {
                Err(ClientError::InvalidArgument(
                    "the send was dropped before it was answered".into(),
                ))
            })
        }
    }
}

/// Opens a stream when there is something to send, keeps it while it works, and opens another
/// after it breaks.
async fn run(
    messaging: pb::messaging_client::MessagingClient<tonic::transport::Channel>,
    mut rx: mpsc::UnboundedReceiver<Pending>,
) {
    while let Some(first) = rx.recv().await {
        let rx_open = stream(messaging.clone(), first, &mut rx).await;
        if !rx_open {
            return;
        }
    }
}

/// One stream's life. Returns whether more sends may come (the session still exists).
async fn stream(
    mut messaging: pb::messaging_client::MessagingClient<tonic::transport::Channel>,
    first: Pending,
    rx: &mut mpsc::UnboundedReceiver<Pending>,
) -> bool {
    let (requests, outbound) = mpsc::unbounded_channel();
    let mut waiting: VecDeque<oneshot::Sender<Answer>> = VecDeque::new();
    let _ = requests.send(first.request);
    waiting.push_back(first.reply);
    let mut confirms = match messaging
        .publish(UnboundedReceiverStream::new(outbound))
        .await
    {
        Ok(r) => r.into_inner(),
        Err(s) => {
            fail_all(&mut waiting, &s);
            return true;
        }
    };
    let mut rx_open = true;
    loop {
        tokio::select! {
            p = rx.recv(), if rx_open => match p {
                Some(p) => {
                    let _ = requests.send(p.request);
                    waiting.push_back(p.reply);
                }
                None => rx_open = false,
            },
            msg = confirms.message() => match msg {
                Ok(Some(r)) => {
                    for c in r.confirms {
                        let Some(reply) = waiting.pop_front() else {
                            tracing::warn!(sequence = c.sequence, "a publish confirm for no send");
                            continue;
                        };
                        let answer = if c.error_code == 0 {
                            Ok(c.message_ids)
                        } else {
                            Err(ClientError::Status(tonic::Status::new(
                                tonic::Code::from_i32(c.error_code),
                                c.error_message,
                            )))
                        };
                        let _ = reply.send(answer);
                    }
                    if !rx_open && waiting.is_empty() {
                        return false;
                    }
                }
                Ok(None) => {
                    let s = tonic::Status::unavailable(
                        "the publish stream ended before confirming these sends; they may or may not have been stored",
                    );
                    fail_all(&mut waiting, &s);
                    return rx_open;
                }
                Err(s) => {
                    fail_all(&mut waiting, &s);
                    return rx_open;
                }
            },
        }
        if !rx_open && waiting.is_empty() {
            return false;
        }
    }
}

/// The stream broke: every send written to it and not yet confirmed gets its error. Sends not
/// yet written go on the next stream.
fn fail_all(waiting: &mut VecDeque<oneshot::Sender<Answer>>, s: &tonic::Status) {
    for reply in waiting.drain(..) {
        let _ = reply.send(Err(ClientError::Status(s.clone())));
    }
}

#[cfg(test)]
mod tests {
    use ferry_proto::pb;
    use tonic::Code;

    use crate::fake::{self, Fake, FakeStream};
    use crate::{AckMode, Message, Session};

    async fn session(fake: &Fake) -> Session {
        let connection = fake.client.open_connection("t").await.expect("open");
        connection
            .create_session(AckMode::Auto)
            .await
            .expect("session")
    }

    /// A request's queue and text bodies.
    fn seen(r: &pb::PublishRequest) -> (String, Vec<String>) {
        let bodies = r
            .messages
            .iter()
            .map(|m| String::from_utf8_lossy(&m.body).into_owned())
            .collect();
        (r.queue.clone(), bodies)
    }

    fn confirmed(ids: &[&str]) -> pb::PublishConfirm {
        pb::PublishConfirm {
            message_ids: ids.iter().map(|s| s.to_string()).collect(),
            ..Default::default()
        }
    }

    fn refused(code: Code) -> pb::PublishConfirm {
        pb::PublishConfirm {
            error_code: code as i32,
            error_message: "refused by the test".into(),
            ..Default::default()
        }
    }

    async fn confirm(
        stream: &FakeStream<pb::PublishRequest, pb::PublishResponse>,
        confirms: Vec<pb::PublishConfirm>,
    ) {
        stream.answer(Ok(pb::PublishResponse { confirms })).await;
    }

    fn owned(queue: &str, bodies: &[&str]) -> (String, Vec<String>) {
        (queue.into(), bodies.iter().map(|s| s.to_string()).collect())
    }

    #[tokio::test]
    async fn sends_made_together_travel_on_one_stream_in_call_order_each_with_its_own_answer() {
        let mut fake = fake::start(30_000).await;
        let session = session(&fake).await;
        let a = session.send_async("q", vec![Message::text("a")]);
        let b = session.send_async("q", vec![Message::text("b"), Message::text("c")]);
        let c = session.send_async("r", vec![Message::text("d")]);
        let mut stream = fake.next_publish().await;
        // All three are written before any is confirmed: pipelined, not one round trip each.
        let mut requests = vec![];
        for _ in 0..3 {
            requests.push(seen(&stream.next().await));
        }
        assert_eq!(
            requests,
            [
                owned("q", &["a"]),
                owned("q", &["b", "c"]),
                owned("r", &["d"])
            ]
        );
        // One answer confirms the three; the middle one is refused, alone.
        confirm(
            &stream,
            vec![
                confirmed(&["id-a"]),
                refused(Code::InvalidArgument),
                confirmed(&["id-d"]),
            ],
        )
        .await;
        assert_eq!(a.await.expect("a confirmed"), ["id-a"]);
        let refusal = b.await.expect_err("b refused");
        assert_eq!(refusal.code(), Some(Code::InvalidArgument), "{refusal}");
        assert_eq!(c.await.expect("c confirmed"), ["id-d"]);
        assert!(
            fake.publishes.try_recv().is_err(),
            "one stream for the three"
        );
    }

    #[tokio::test]
    async fn a_broken_stream_fails_its_unconfirmed_sends_and_the_next_send_opens_another() {
        let mut fake = fake::start(30_000).await;
        let session = session(&fake).await;
        let a = session.send_async("q", vec![Message::text("a")]);
        let b = session.send_async("q", vec![Message::text("b")]);
        let mut first = fake.next_publish().await;
        assert_eq!(seen(&first.next().await), owned("q", &["a"]));
        assert_eq!(seen(&first.next().await), owned("q", &["b"]));
        confirm(&first, vec![confirmed(&["id-a"])]).await;
        assert_eq!(a.await.expect("a confirmed"), ["id-a"]);
        // The stream breaks with b written and unconfirmed: b gets the stream's error (it may or
        // may not have been stored), not a made-up one.
        first
            .answer(Err(tonic::Status::unavailable("the node went away")))
            .await;
        let lost = b.await.expect_err("b in flight on the broken stream");
        assert_eq!(lost.code(), Some(Code::Unavailable), "{lost}");
        // The session goes on: the next send opens a new stream.
        let c = session.send_async("q", vec![Message::text("c")]);
        let mut second = fake.next_publish().await;
        assert_eq!(seen(&second.next().await), owned("q", &["c"]));
        confirm(&second, vec![confirmed(&["id-c"])]).await;
        assert_eq!(c.await.expect("c confirmed"), ["id-c"]);
    }
}
