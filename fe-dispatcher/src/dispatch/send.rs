//! Sends: a unary `Send`, or a run of `Publish` requests coalesced into one back-end call.

use ferry_kernel::{PlacementEpoch, QueueName};
use ferry_proto::pb;
use tonic::{Request, Status};

use super::{queue_name, Dispatch};

impl Dispatch {
    pub(crate) async fn send(&self, r: pb::SendRequest) -> Result<pb::SendResponse, Status> {
        let message_ids = self.send_messages(r).await?;
        Ok(pb::SendResponse { message_ids })
    }

    /// Sends messages to one queue: checks the session and the reply queues, forwards to the
    /// owning back-end. Returns the message ids.
    pub(crate) async fn send_messages(&self, r: pb::SendRequest) -> Result<Vec<String>, Status> {
        let queue = queue_name(&r.queue)?;
        let session = self.touch_session(&r.session_id, None)?;
        let transacted = match session {
            Some(sid) => self
                .sessions
                .tx_touch(sid, &queue, &self.router.owner_of(&queue).node)?,
            None => false,
        };
        self.check_reply_queues(&r.messages).await?;
        // A reply (it carries a correlation id, or goes to a temporary queue) whose queue is gone
        // is worth an operator's attention: its requester gave up or went away.
        let is_reply =
            queue.is_temporary() || r.messages.iter().any(|m| m.correlation_id.is_some());
        let sid = session.filter(|_| transacted);
        let session_id = if transacted {
            r.session_id
        } else {
            String::new()
        };
        let mut messages = Some(r.messages);
        let out = self
            .router
            .call(&queue, |be, placement_epoch| {
                let messages = messages_for_try(&mut messages, placement_epoch);
                let req = messages.map(|messages| pb::BackendSendRequest {
                    queue: r.queue.clone(),
                    messages,
                    session_id: session_id.clone(),
                    transacted,
                    placement_epoch: placement_epoch.get(),
                });
                async move { be.send(Request::new(req?)).await }
            })
            .await
            .inspect_err(|e| {
                if is_reply && e.code() == tonic::Code::NotFound {
                    self.reply_queue_missing(&queue);
                }
            })?;
        if let Some(sid) = sid {
            self.sessions.tx_staged_by(sid, out.incarnation)?;
        }
        Ok(out.message_ids)
    }

    /// A reply must have somewhere to go: a missing reply queue (a deleted temporary queue above
    /// all) fails the send now instead of losing the reply later.
    async fn check_reply_queues(&self, messages: &[pb::OutgoingMessage]) -> Result<(), Status> {
        let mut checked: Vec<&str> = vec![];
        for m in messages {
            if m.reply_to.is_empty() || checked.contains(&m.reply_to.as_str()) {
                continue;
            }
            let reply_to = QueueName::new(m.reply_to.as_str())
                .map_err(|e| Status::invalid_argument(format!("reply_to: {e}")))?;
            self.router
                .call(&reply_to, |be, placement_epoch| {
                    let req = pb::BackendQueueRequest {
                        name: reply_to.to_string(),
                        placement_epoch: placement_epoch.get(),
                        wait_placed_ms: 0,
                        wait_settings: None,
                    };
                    async move { be.get_queue(Request::new(req)).await }
                })
                .await
                .map_err(|e| Status::new(e.code(), format!("reply_to: {}", e.message())))?;
            checked.push(&m.reply_to);
        }
        Ok(())
    }

    /// Tells watchers that a reply went to a queue that is gone.
    fn reply_queue_missing(&self, queue: &QueueName) {
        // No watcher is not an error.
        let _ = self.events.send(pb::Event {
            at_ms: self.clock.now_ms(),
            kind: "reply-queue-missing".into(),
            queue: queue.to_string(),
            node: self.router.local_node().to_string(),
            ..Default::default()
        });
    }
}

/// The messages one try of a send carries. A try at a known placement epoch may be answered
/// "not the owner", having consumed its request, so it sends a copy and keeps the messages for
/// the next try. A try at [`PlacementEpoch::UNKNOWN`] is never answered so (the back-end skips the
/// check), so it sends them as they are: a send to an unplaced queue copies nothing.
fn messages_for_try(
    messages: &mut Option<Vec<pb::OutgoingMessage>>,
    placement_epoch: PlacementEpoch,
) -> Result<Vec<pb::OutgoingMessage>, Status> {
    let taken = if placement_epoch.is_known() {
        messages.clone()
    } else {
        messages.take()
    };
    taken.ok_or_else(|| {
        Status::unavailable(
            "a back-end answered \"not the owner\" to a send at placement epoch 0, which it must not check; the send was not stored",
        )
    })
}
