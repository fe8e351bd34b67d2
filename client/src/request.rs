//! Request-reply over queues: the requester sends with `reply_to` set to a temporary queue of its
//! connection and waits for the reply whose correlation id is, byte for byte, the request's
//! message id. Replies that do not match (late answers to an earlier request, strays) are
//! acknowledged, discarded and counted, never mistaken for the answer.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use ferry_proto::pb;

use crate::connection::{Connection, Session};
use crate::consumer::{Consumer, ConsumerOptions};
use crate::message::{Message, Received};
use crate::ClientError;

/// Sends requests and waits for their replies; reuses one temporary queue for all of them.
/// One request at a time (`&mut self`): requests in flight together would read each other's
/// replies from the shared queue. Make one requestor per concurrent caller.
#[derive(Debug)]
pub struct Requestor {
    session: Session,
    reply_queue: String,
    /// Replies are pushed on a `Consume` stream (acknowledged on it as they are taken).
    replies: Consumer,
    stale_replies: AtomicU64,
}

impl Requestor {
    /// A requestor on `connection`: its own auto-acknowledge session and temporary reply queue
    /// (deleted when the connection closes).
    pub async fn new(connection: &Connection) -> Result<Self, ClientError> {
        let session = connection.create_session(pb::AckMode::Auto).await?;
        let reply_queue = connection.create_temporary_queue().await?;
        let replies = session
            .consumer(&reply_queue, ConsumerOptions::default().prefetch(16))
            .await?;
        Ok(Self {
            session,
            reply_queue,
            replies,
            stale_replies: AtomicU64::new(0),
        })
    }

    /// The temporary queue replies come to.
    pub fn reply_queue(&self) -> &str {
        &self.reply_queue
    }

    /// Replies received that answered no waiting request, since this requestor was made.
    pub fn stale_replies(&self) -> u64 {
        self.stale_replies.load(Ordering::Relaxed)
    }

    /// Sends `request` to `queue` and waits up to `timeout` for its reply. `Ok(None)`: no reply
    /// in time (nobody answered, or too late: a late reply is discarded by a later call).
    pub async fn request(
        &mut self,
        queue: &str,
        request: Message,
        timeout: Duration,
    ) -> Result<Option<Received>, ClientError> {
        let start = Instant::now();
        let request = request.reply_to(self.reply_queue.clone());
        let id = self
            .session
            .send(queue, vec![request])
            .await?
            .into_iter()
            .next()
            .ok_or_else(|| {
                ClientError::InvalidArgument(
                    "the server returned no message id for the request".into(),
                )
            })?;
        loop {
            let left = timeout.saturating_sub(start.elapsed());
            if left.is_zero() {
                return Ok(None);
            }
            let got = self.replies.receive_batch(16, Some(left)).await?;
            for reply in got {
                if reply.message().correlation_id.as_deref() == Some(id.as_str()) {
                    return Ok(Some(reply));
                }
                self.stale_replies.fetch_add(1, Ordering::Relaxed);
                tracing::debug!(
                    expected = %id,
                    got = ?reply.message().correlation_id,
                    "discarded a reply that answers no waiting request"
                );
            }
        }
    }
}

impl Session {
    /// Answers `request`: sends `reply` to its `reply_to` queue with the request's message id as
    /// the correlation id. Fails if the request named no reply queue, or it no longer exists.
    pub async fn reply(&self, request: &Received, reply: Message) -> Result<String, ClientError> {
        let to = &request.message().reply_to;
        if to.is_empty() {
            return Err(ClientError::InvalidArgument(format!(
                "message {} has no reply_to queue to answer",
                request.message_id()
            )));
        }
        let reply = reply.correlation_id(request.message_id());
        let ids = self.send(to, vec![reply]).await?;
        Ok(ids.into_iter().next().unwrap_or_default())
    }
}
