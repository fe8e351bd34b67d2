//! Sends travel on one `Publish` stream per session: each send is written to the stream at once,
//! without waiting for earlier ones, and its confirmation comes back in order. The server sends
//! the requests that pile up while it writes to disk together (its group commit), so many
//! concurrent or pipelined sends cost one back-end write, not one each, and no timer adds latency.
//!
//! Order: a send is placed on the stream when [`Publisher::send`] is called, not when its future
//! is first polled, so sends are stored in the order they were made. A refused send (too large, a
//! bad property, a missing reply queue) fails alone; the server keeps the others in order.
//!
//! **Resends.** A send answered `UNAVAILABLE` (a replicated queue's leader failed the write, so
//! its outcome is unknown, or the stream broke with the node still reachable) is sent again by
//! this task, up to [`RESEND_ATTEMPTS`] times with a doubling pause, when that is safe: the send
//! is resendable (every message carries a dedup id and the session is not transacted, decided by
//! the session) and the queue remembers dedup ids for at least 20 s longer than the send has
//! been under way (its `dedup_window_ms`, asked of the node before each round: the answer
//! doubles as a sign that the queue is served again). A resend whose first try was stored is answered with the first
//! try's message ids and stores nothing. While sends wait for a resend, later sends wait behind
//! them, so a session's order holds, except that a send resent after a failover lands after the
//! sends in flight with it that the server did confirm.
//!
//! Anything else fails the send with the error it met first, unchanged: a refusal
//! (`INVALID_ARGUMENT`, `NOT_FOUND`, `RESOURCE_EXHAUSTED` ...), a transport error (the node this
//! client talks to is gone, and the session with it), a send that is not resendable, a queue
//! without dedup, or the last resend failing again.

use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use ferry_proto::pb;
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;
use tokio_stream::wrappers::UnboundedReceiverStream;
use tonic::{Code, Status, Streaming};

use crate::{Client, ClientError};

/// How many times a send answered `UNAVAILABLE` is sent again before it fails with that first
/// error (pauses of 100 ms, doubling: about 3 s in all, on top of the node's own wait of up to
/// 8 s for the queue's new leader on each try). See [`crate::Session::send`].
pub const RESEND_ATTEMPTS: u32 = 5;

/// How much longer than a send has been under way its queue's dedup window must be for the
/// send to go again: the resend may still wait at the node for the queue's leader (up to 8 s)
/// before its dedup ids are looked up, and leaders' clocks differ.
const RESEND_WINDOW_MARGIN: Duration = Duration::from_secs(20);

/// The pause before the first resend; it doubles for each further one.
const RESEND_PAUSE_FIRST: Duration = Duration::from_millis(100);

/// The longest the lookup of a queue's dedup window may take (the node waits up to 8 s for the
/// queue's leader) before the round counts as one more failed try.
const WINDOW_LOOKUP_MAX: Duration = Duration::from_secs(10);

type Answer = Result<Vec<String>, ClientError>;

struct Pending {
    request: pb::PublishRequest,
    reply: oneshot::Sender<Answer>,
    /// May be sent again after `UNAVAILABLE` (see the module docs).
    resendable: bool,
    /// Tries so far (a lookup that found no leader counts as one).
    tries: u32,
    /// The error the first try met: what the send fails with if no resend succeeds.
    first_cause: Option<Status>,
    first_sent: Option<Instant>,
}

/// The session's publish stream. Cheap to clone; the stream task ends when the last clone is
/// dropped and every send was answered.
#[derive(Debug, Clone)]
pub(crate) struct Publisher {
    tx: mpsc::UnboundedSender<Pending>,
    dedup_ids: Arc<DedupIds>,
}

/// Dedup ids the client makes: this publisher's random prefix and a count. The prefix is 128
/// bits from the process's hash keys, the process id and the clock, so two publishers (in one
/// process or many) do not meet.
#[derive(Debug)]
struct DedupIds {
    prefix: String,
    next: AtomicU64,
    /// Queues the server said are kept on one node (a confirm's `replicas` 1): no failover to
    /// resend across, so their messages get no ids of the client's (they cost the queue a
    /// record each). Replicated queues, and queues not yet confirmed, get them.
    unreplicated: std::sync::Mutex<std::collections::HashSet<String>>,
}

impl DedupIds {
    fn new() -> Self {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        let a =
            std::collections::hash_map::RandomState::new().hash_one((std::process::id(), nanos));
        let b = std::collections::hash_map::RandomState::new().hash_one((nanos, a));
        Self {
            prefix: format!("ferry-client:{a:016x}{b:016x}"),
            next: AtomicU64::new(0),
            unreplicated: std::sync::Mutex::default(),
        }
    }
}

impl Publisher {
    pub(crate) fn new(client: Client) -> Self {
        let (tx, rx) = mpsc::unbounded_channel();
        let dedup_ids = Arc::new(DedupIds::new());
        let task = Task {
            dedup_ids: dedup_ids.clone(),
            client,
            rx,
            rx_open: true,
            open: None,
            waiting: VecDeque::new(),
            resend: VecDeque::new(),
            resend_at: Instant::now(),
        };
        tokio::spawn(task.run());
        Self { tx, dedup_ids }
    }

    /// Whether the server said `queue` is kept on one node (see [`DedupIds::unreplicated`]).
    pub(crate) fn is_unreplicated(&self, queue: &str) -> bool {
        self.dedup_ids
            .unreplicated
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .contains(queue)
    }

    /// A dedup id no other message has (see [`DedupIds`]).
    pub(crate) fn next_dedup_id(&self) -> String {
        let n = self.dedup_ids.next.fetch_add(1, Ordering::Relaxed);
        format!("{}-{n}", self.dedup_ids.prefix)
    }

    /// Puts the send on the stream now; the future resolves with its message ids once the
    /// server confirms it. `resendable`: it may be sent again after `UNAVAILABLE`.
    pub(crate) fn send(
        &self,
        session_id: &str,
        queue: &str,
        messages: Vec<pb::OutgoingMessage>,
        resendable: bool,
    ) -> impl Future<Output = Answer> + Send + 'static {
        let (reply, answer) = oneshot::channel();
        let request = pb::PublishRequest {
            session_id: session_id.into(),
            queue: queue.into(),
            messages,
        };
        let pending = Pending {
            request,
            reply,
            resendable,
            tries: 0,
            first_cause: None,
            first_sent: None,
        };
        let queued = self.tx.send(pending).is_ok();
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

/// An open publish stream.
struct Open {
    requests: mpsc::UnboundedSender<pb::PublishRequest>,
    confirms: Streaming<pb::PublishResponse>,
}

/// The task behind a [`Publisher`]: opens a stream when there is something to send, keeps it
/// while it works, opens another after it breaks, and resends.
struct Task {
    client: Client,
    /// Shared with the publisher: what confirms say of the queues' replication.
    dedup_ids: Arc<DedupIds>,
    rx: mpsc::UnboundedReceiver<Pending>,
    /// The session may still send (a publisher clone lives).
    rx_open: bool,
    open: Option<Open>,
    /// Written to `open`, not yet confirmed, in the order written.
    waiting: VecDeque<Pending>,
    /// Answered `UNAVAILABLE`, to be sent again at `resend_at` in this order, before anything
    /// sent since.
    resend: VecDeque<Pending>,
    resend_at: Instant,
}

/// An `UNAVAILABLE` answer from the node (not a transport error: that node is gone for good,
/// and the session with it): the queue's leader failed the write or is being elected.
pub(crate) fn transient(s: &Status) -> bool {
    s.code() == Code::Unavailable && std::error::Error::source(s).is_none()
}

/// The next answer on `open`, never if no stream is open.
async fn next_confirms(open: &mut Option<Open>) -> Result<Option<pb::PublishResponse>, Status> {
    match open {
        Some(open) => open.confirms.message().await,
        None => std::future::pending().await,
    }
}

impl Task {
    async fn run(mut self) {
        loop {
            if !self.rx_open && self.waiting.is_empty() && self.resend.is_empty() {
                return;
            }
            let (pausing, taking) = (
                !self.resend.is_empty(),
                self.rx_open && self.resend.is_empty(),
            );
            tokio::select! {
                () = tokio::time::sleep_until(self.resend_at), if pausing => self.resend_due().await,
                p = self.rx.recv(), if taking => match p {
                    Some(p) => self.write(p).await,
                    None => self.rx_open = false,
                },
                msg = next_confirms(&mut self.open) => match msg {
                    Ok(Some(r)) => r.confirms.into_iter().for_each(|c| self.confirmed(c)),
                    Ok(None) => self.broke(Status::unavailable(
                        "the publish stream ended before confirming these sends; they may or may not have been stored",
                    )),
                    Err(s) => self.broke(s),
                },
            }
        }
    }

    /// Writes `p` to the open stream, opening one first if none is.
    async fn write(&mut self, mut p: Pending) {
        p.tries += 1;
        p.first_sent.get_or_insert_with(Instant::now);
        let request = if p.resendable {
            p.request.clone()
        } else {
            std::mem::take(&mut p.request)
        };
        if let Some(open) = &self.open {
            // A stream whose call ended refuses the write; reading it tells how it ended.
            let _ = open.requests.send(request);
            self.waiting.push_back(p);
            return;
        }
        let (requests, outbound) = mpsc::unbounded_channel();
        let _ = requests.send(request);
        self.waiting.push_back(p);
        let opened = self
            .client
            .messaging()
            .publish(UnboundedReceiverStream::new(outbound))
            .await;
        match opened {
            Ok(r) => {
                self.open = Some(Open {
                    requests,
                    confirms: r.into_inner(),
                })
            }
            Err(s) => self.broke(s),
        }
    }

    fn confirmed(&mut self, c: pb::PublishConfirm) {
        let Some(p) = self.waiting.pop_front() else {
            tracing::warn!(sequence = c.sequence, "a publish confirm for no send");
            return;
        };
        if c.error_code == 0 {
            if c.replicas != 0 {
                let mut unreplicated = self
                    .dedup_ids
                    .unreplicated
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
                if c.replicas == 1 {
                    unreplicated.insert(p.request.queue.clone());
                } else {
                    unreplicated.remove(&p.request.queue);
                }
            }
            let _ = p.reply.send(Ok(c.message_ids));
        } else {
            let s = Status::new(Code::from_i32(c.error_code), c.error_message);
            self.failed(p, s);
        }
    }

    /// The stream broke: every send written to it and not yet confirmed met `s` (it may or may
    /// not have been stored). Sends not yet written go on the next stream.
    fn broke(&mut self, s: Status) {
        self.open = None;
        for p in std::mem::take(&mut self.waiting) {
            self.failed(p, s.clone());
        }
    }

    /// `p` met `s`: sent again after a pause if it may be, else answered with its first error.
    fn failed(&mut self, mut p: Pending, s: Status) {
        if p.resendable && transient(&s) && p.tries <= RESEND_ATTEMPTS {
            if self.resend.is_empty() {
                let pause = RESEND_PAUSE_FIRST * 2u32.pow(p.tries.saturating_sub(1).min(16));
                self.resend_at = Instant::now() + pause;
                tracing::warn!(error = %s, queue = %p.request.queue, ?pause, "a send met UNAVAILABLE; sending it again with its dedup ids");
            }
            p.first_cause.get_or_insert(s);
            self.resend.push_back(p);
            return;
        }
        let cause = match p.first_cause.take() {
            Some(first) => {
                tracing::warn!(first = %first, last = %s, queue = %p.request.queue, tries = p.tries, "a send gave up; it fails with the first error it met");
                first
            }
            None => s,
        };
        let _ = p.reply.send(Err(ClientError::Status(cause)));
    }

    /// The pause is over: the sends waiting are sent again, in order, to each queue that
    /// remembers their dedup ids for long enough; the others fail with their first error.
    async fn resend_due(&mut self) {
        let due: Vec<Pending> = self.resend.drain(..).collect();
        let windows = self.dedup_windows(&due).await;
        for mut p in due {
            if !self.resend.is_empty() {
                // The stream broke again on the way: the rest wait for the next round, untried.
                self.resend.push_back(p);
                continue;
            }
            let since = p.first_sent.map_or(Duration::ZERO, |t| t.elapsed());
            match windows.get(&p.request.queue) {
                Some(Ok(window_ms))
                    if Duration::from_millis(*window_ms) > since + RESEND_WINDOW_MARGIN =>
                {
                    self.write(p).await
                }
                Some(Err(s)) if transient(s) => {
                    p.tries += 1;
                    self.failed(p, s.clone());
                }
                _ => {
                    p.resendable = false;
                    let s = Status::failed_precondition(format!(
                        "queue {} does not remember dedup ids long enough to resend",
                        p.request.queue
                    ));
                    self.failed(p, s);
                }
            }
        }
    }

    /// Each queue's dedup window in ms, as the node says now (`UNAVAILABLE` while the queue has
    /// no leader).
    async fn dedup_windows(&self, due: &[Pending]) -> HashMap<String, Result<u64, Status>> {
        let mut windows = HashMap::new();
        for p in due {
            let queue = &p.request.queue;
            if windows.contains_key(queue) {
                continue;
            }
            let mut admin = self.client.admin();
            let ask = admin.get_queue(pb::GetQueueRequest {
                name: queue.clone(),
            });
            let window = match tokio::time::timeout(WINDOW_LOOKUP_MAX, ask).await {
                Ok(Ok(r)) => Ok(r
                    .into_inner()
                    .queue
                    .and_then(|q| q.config)
                    .and_then(|c| c.dedup_window_ms)
                    .unwrap_or(0)),
                Ok(Err(s)) => Err(s),
                Err(_) => Err(Status::unavailable(format!(
                    "no answer about queue {queue} in {WINDOW_LOOKUP_MAX:?}"
                ))),
            };
            windows.insert(queue.clone(), window);
        }
        windows
    }
}

#[cfg(test)]
mod tests;
