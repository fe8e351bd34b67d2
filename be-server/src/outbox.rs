//! What leaves a queue's owner task for the rest of the back-end, once the write it follows from
//! is durable: dead letters to move to their dead-letter queue, events for watchers, steps for
//! message history. Plain types, shared by the owner tasks (`actor.rs`), the queue registry
//! (`queues.rs`) and the dead-letter mover (`dead_letter.rs`), none of which import each other
//! through it.

use std::sync::Arc;

use ferry_kernel::{DeadLetter, HistoryEntry, QueueName, QueueUid};
use tokio::sync::{broadcast, mpsc, oneshot};

use crate::error::Error;
use crate::history::History;

/// Events kept for watchers that lag before the oldest is dropped for them.
const EVENTS_BUFFERED: usize = 4_096;

/// Dead letters of one source queue bound for one target queue.
#[derive(Debug)]
pub(crate) struct DeadLetterJob {
    pub(crate) source: QueueName,
    pub(crate) source_uid: QueueUid,
    pub(crate) target: QueueName,
    pub(crate) letters: Vec<DeadLetter>,
    /// Told when the letters are in the target queue (durable and visible there), or why not.
    pub(crate) done: Option<oneshot::Sender<Result<(), Error>>>,
    /// Published once the move is durable (before `done` is told), dropped if it fails.
    pub(crate) published: Published,
}

/// History steps and events that describe a write, published once it is durable.
#[derive(Debug, Default)]
pub(crate) struct Published {
    pub(crate) history: Vec<HistoryEntry>,
    pub(crate) events: Vec<BrokerEvent>,
}

/// Something that happened to a message, for operators watching (`WatchEvents`). Published
/// only once the write that made it happen is durable.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BrokerEvent {
    pub at_ms: u64,
    /// `dead-lettered`, `expired`, `queue-updated` or `shard-leader`.
    pub kind: &'static str,
    /// The queue it is about (none for `shard-leader`).
    pub queue: Option<QueueName>,
    /// `shard-leader`: the shard.
    pub shard: Option<ferry_kernel::ShardId>,
    /// `shard-leader`: the new leader's term.
    pub value: u64,
    pub message_id: String,
    /// `dead-lettered`: why; `expired`: `moved` or `discarded`.
    pub reason: &'static str,
    /// `queue-updated`: what changed.
    pub detail: String,
}

/// See the module docs. Cheap to clone.
#[derive(Debug, Clone)]
pub(crate) struct Outbox {
    /// Unbounded on purpose: a job is handed over from an answer callback, which cannot wait,
    /// and each job holds messages already out of their queue's memory, so refusing one would
    /// strand them until a restart. Jobs come at most one per queue operation and the mover
    /// drains them as fast as the target queues write.
    jobs: mpsc::UnboundedSender<DeadLetterJob>,
    events: broadcast::Sender<BrokerEvent>,
    /// Where owner tasks note each step of each message.
    pub(crate) history: Arc<History>,
}

impl Outbox {
    /// An outbox and the receiving end of its dead-letter jobs (for the mover).
    pub(crate) fn new(history: Arc<History>) -> (Self, mpsc::UnboundedReceiver<DeadLetterJob>) {
        let (jobs, rx) = mpsc::unbounded_channel();
        let (events, _) = broadcast::channel(EVENTS_BUFFERED);
        (
            Self {
                jobs,
                events,
                history,
            },
            rx,
        )
    }

    /// Tells watchers (if any) what happened; never blocks, drops for watchers that lag.
    pub(crate) fn event(&self, e: BrokerEvent) {
        let _ = self.events.send(e);
    }

    pub(crate) fn subscribe(&self) -> broadcast::Receiver<BrokerEvent> {
        self.events.subscribe()
    }

    /// Publishes what a durable write of `queue` did.
    pub(crate) fn publish(&self, queue: &Arc<str>, uid: QueueUid, published: Published) {
        self.history.record(queue, uid, &published.history);
        for e in published.events {
            self.event(e);
        }
    }

    pub(crate) fn send(&self, job: DeadLetterJob) {
        if let Err(e) = self.jobs.send(job) {
            let job = e.0;
            tracing::warn!(
                queue = %job.source,
                messages = job.letters.len(),
                "dead letters not moved: the node is stopping; they stay in their queue on disk and are judged again at restart"
            );
        }
    }
}
