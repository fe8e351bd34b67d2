//! Send coalescing: concurrent sends of one session to one queue travel together in one `Send`
//! call, transparently. A lone send goes out at once (no timer, no added latency); sends that
//! arrive while a call is in flight wait for it and then go out together, like group commit. One
//! call in flight per session and queue keeps a session's messages in the order it sent them.
//!
//! A `Send` is all or nothing at the server. If a coalesced call is refused for something one
//! message did (too large, a bad property, a missing reply queue), nothing was stored, so each
//! caller's messages are sent again on their own and only the offender fails.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use ferry_proto::pb;
use tokio::sync::{mpsc, oneshot};

use crate::ClientError;

/// The most messages one coalesced call carries.
const BATCH_MAX: usize = 1_000;

struct Pending {
    messages: Vec<pb::OutgoingMessage>,
    reply: oneshot::Sender<Result<Vec<String>, ClientError>>,
}

/// One batcher task per queue a session sends to; they end with the session. Their channels are
/// unbounded but hold at most one entry per caller, and every caller waits for its answer: the
/// callers' own concurrency bounds them.
#[derive(Debug, Clone, Default)]
pub(crate) struct Batchers {
    queues: Arc<Mutex<HashMap<String, mpsc::UnboundedSender<Pending>>>>,
}

impl Batchers {
    pub(crate) async fn send(
        &self,
        messaging: pb::messaging_client::MessagingClient<tonic::transport::Channel>,
        session_id: &str,
        queue: &str,
        messages: Vec<pb::OutgoingMessage>,
    ) -> Result<Vec<String>, ClientError> {
        let (reply, answer) = oneshot::channel();
        let mut pending = Pending { messages, reply };
        for _ in 0..2 {
            let tx = {
                let mut map = self.queues.lock().unwrap_or_else(PoisonError::into_inner);
                map.entry(queue.to_string())
                    .or_insert_with(|| start(messaging.clone(), session_id.into(), queue.into()))
                    .clone()
            };
            match tx.send(pending) {
                Ok(()) => {
                    return answer.await.unwrap_or_else(|_| {
                        Err(ClientError::InvalidArgument(
                            "the send was dropped before it was answered".into(),
                        ))
                    })
                }
                // The task ended (it cannot, while the map holds its sender; be safe anyway).
                Err(mpsc::error::SendError(p)) => {
                    pending = p;
                    self.queues
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .remove(queue);
                }
            }
        }
        Err(ClientError::InvalidArgument(
            "the session's sender for this queue stopped".into(),
        ))
    }
}

fn start(
    messaging: pb::messaging_client::MessagingClient<tonic::transport::Channel>,
    session_id: String,
    queue: String,
) -> mpsc::UnboundedSender<Pending> {
    let (tx, mut rx) = mpsc::unbounded_channel::<Pending>();
    tokio::spawn(async move {
        while let Some(first) = rx.recv().await {
            let mut batch = vec![first];
            let mut count = batch[0].messages.len();
            while count < BATCH_MAX {
                match rx.try_recv() {
                    Ok(p) => {
                        count += p.messages.len();
                        batch.push(p);
                    }
                    Err(_) => break,
                }
            }
            send_batch(messaging.clone(), &session_id, &queue, batch).await;
        }
    });
    tx
}

async fn send_batch(
    mut messaging: pb::messaging_client::MessagingClient<tonic::transport::Channel>,
    session_id: &str,
    queue: &str,
    batch: Vec<Pending>,
) {
    let call = |messages: Vec<pb::OutgoingMessage>| pb::SendRequest {
        session_id: session_id.into(),
        queue: queue.into(),
        messages,
    };
    if batch.len() == 1 {
        let p = batch.into_iter().next().expect("one pending send");
        let r = messaging.send(call(p.messages)).await;
        let _ = p
            .reply
            .send(r.map(|r| r.into_inner().message_ids).map_err(Into::into));
        return;
    }
    let all: Vec<pb::OutgoingMessage> = batch.iter().flat_map(|p| p.messages.clone()).collect();
    match messaging.send(call(all)).await {
        Ok(r) => {
            let mut ids = r.into_inner().message_ids.into_iter();
            for p in batch {
                let mine: Vec<String> = ids.by_ref().take(p.messages.len()).collect();
                let _ = p.reply.send(Ok(mine));
            }
        }
        // Refused for what a message is: nothing was stored; each caller on its own.
        Err(s) if is_about_a_message(s.code()) => {
            for p in batch {
                let r = messaging.send(call(p.messages)).await;
                let _ = p
                    .reply
                    .send(r.map(|r| r.into_inner().message_ids).map_err(Into::into));
            }
        }
        // Anything else (the server or the network) is everyone's answer: resending could store
        // twice what the failed call may have stored.
        Err(s) => {
            for p in batch {
                let _ = p.reply.send(Err(s.clone().into()));
            }
        }
    }
}

fn is_about_a_message(code: tonic::Code) -> bool {
    matches!(
        code,
        tonic::Code::InvalidArgument | tonic::Code::ResourceExhausted | tonic::Code::NotFound
    )
}
