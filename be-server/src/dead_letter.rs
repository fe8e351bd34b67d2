//! Moving dead letters to their dead-letter queue. A queue's owner task hands each batch of
//! dead letters here once its own writes are durable; this task creates the dead-letter queue on
//! demand (on this back-end) and has its owner task store them together with the durable
//! deletes from the source queue, in one batch: a crash leaves each message in exactly one of
//! the two queues (or, if it strikes before the move, in the source queue, where it is judged
//! again at recovery), never in neither.

use std::sync::Weak;

use ferry_kernel::{
    DeadLetter, NewMessage, PropertyValue, QueueConfig, QueueName, QueueUid, RedeliveryPolicy,
};
use ferry_store::StoreOp;
use tokio::sync::mpsc;

use crate::actor::Cmd;

/// Properties a dead letter carries, besides everything the original message had.
pub const REASON_PROPERTY: &str = "FerryDeadLetterReason";
pub const ORIGINAL_QUEUE_PROPERTY: &str = "FerryOriginalQueue";
pub const ORIGINAL_MESSAGE_ID_PROPERTY: &str = "FerryOriginalMessageId";
pub const DELIVERY_COUNT_PROPERTY: &str = "FerryDeliveryCount";

/// Dead letters of one source queue bound for one target queue.
#[derive(Debug)]
pub(crate) struct DeadLetterJob {
    pub(crate) source: QueueName,
    pub(crate) source_uid: QueueUid,
    pub(crate) target: QueueName,
    pub(crate) letters: Vec<DeadLetter>,
    /// Told when the letters are in the target queue (durable and visible there), or why not.
    pub(crate) done: Option<tokio::sync::oneshot::Sender<Result<(), crate::error::Error>>>,
}

/// Something that happened to a message, for operators watching (`WatchEvents`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BrokerEvent {
    pub at_ms: u64,
    /// `dead-lettered` or `expired`.
    pub kind: &'static str,
    pub queue: QueueName,
    pub message_id: String,
    /// `dead-lettered`: why; `expired`: `moved` or `discarded`.
    pub reason: &'static str,
}

/// What leaves a queue's owner task for the rest of the back-end: dead letters to move, events
/// for watchers, steps for message history. Cheap to clone.
#[derive(Debug, Clone)]
pub(crate) struct Outbox {
    /// Unbounded on purpose: a job is handed over from an answer callback, which cannot wait,
    /// and each job holds messages already out of their queue's memory, so refusing one would
    /// strand them until a restart. Jobs come at most one per queue operation and the mover
    /// drains them as fast as the target queues write.
    jobs: mpsc::UnboundedSender<DeadLetterJob>,
    events: tokio::sync::broadcast::Sender<BrokerEvent>,
    /// Where owner tasks note each step of each message.
    pub(crate) history: std::sync::Arc<crate::history::History>,
}

impl Outbox {
    /// Tells watchers (if any) what happened; never blocks, drops for watchers that lag.
    pub(crate) fn event(&self, e: BrokerEvent) {
        let _ = self.events.send(e);
    }

    pub(crate) fn subscribe(&self) -> tokio::sync::broadcast::Receiver<BrokerEvent> {
        self.events.subscribe()
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

/// The settings of a dead-letter queue created on demand: like its source queue, but it keeps
/// what it is given (no redelivery limit, no further dead-lettering, room for any message its
/// source accepted).
pub(crate) fn dead_letter_queue_config(source: &QueueConfig) -> QueueConfig {
    QueueConfig {
        redelivery: RedeliveryPolicy {
            max_redeliveries: None,
            ..RedeliveryPolicy::default()
        },
        dead_letter: ferry_kernel::DeadLetterTarget::Discard,
        expiry: ferry_kernel::DeadLetterTarget::Discard,
        ..source.clone()
    }
}

/// What the dead-letter queue stores for a dead letter: the original message (body, properties,
/// headers, priority, group) without its expiry or delay, plus why and from where.
pub(crate) fn moved_message(source: &QueueName, dl: &DeadLetter) -> NewMessage {
    let m = &dl.message;
    let mut properties = m.properties.clone();
    properties.insert(
        REASON_PROPERTY.into(),
        PropertyValue::String(dl.reason.as_str().into()),
    );
    properties.insert(
        ORIGINAL_QUEUE_PROPERTY.into(),
        PropertyValue::String(source.to_string()),
    );
    properties.insert(
        ORIGINAL_MESSAGE_ID_PROPERTY.into(),
        PropertyValue::String(m.id.to_string()),
    );
    properties.insert(
        DELIVERY_COUNT_PROPERTY.into(),
        PropertyValue::Long(dl.delivery_count.into()),
    );
    NewMessage {
        body: m.body.to_vec(),
        properties,
        correlation_id: m.correlation_id.clone(),
        reply_to: m.reply_to.clone(),
        jms_type: m.jms_type.clone(),
        priority: m.priority,
        time_to_live_ms: None,
        delivery_delay_ms: None,
        persistent: m.persistent,
        dedup_id: None,
        group_id: m.group_id.clone(),
    }
}

/// Starts the task that moves dead letters; it ends when the broker is gone.
pub(crate) fn start(
    broker: Weak<crate::broker::Inner>,
    history: std::sync::Arc<crate::history::History>,
) -> Outbox {
    let (tx, mut rx) = mpsc::unbounded_channel::<DeadLetterJob>();
    let (events, _) = tokio::sync::broadcast::channel(4_096);
    tokio::spawn(async move {
        while let Some(mut job) = rx.recv().await {
            let Some(inner) = broker.upgrade() else {
                return;
            };
            let broker = crate::broker::Broker::from_inner(inner);
            let (source, target, count) =
                (job.source.clone(), job.target.clone(), job.letters.len());
            let done = job.done.take();
            let moved = move_letters(&broker, job).await;
            if let Err(e) = &moved {
                tracing::error!(
                    queue = %source,
                    dead_letter_queue = %target,
                    messages = count,
                    error = %e,
                    "dead letters could not be moved; they stay in their queue on disk and are judged again at restart"
                );
            }
            if let Some(done) = done {
                let _ = done.send(moved);
            }
        }
    });
    Outbox {
        jobs: tx,
        events,
        history,
    }
}

async fn move_letters(
    broker: &crate::broker::Broker,
    job: DeadLetterJob,
) -> Result<(), crate::error::Error> {
    let handle = broker.dead_letter_queue(&job.source, &job.target).await?;
    let messages = job
        .letters
        .iter()
        .map(|dl| moved_message(&job.source, dl))
        .collect();
    let source_deletes = job
        .letters
        .iter()
        .filter_map(|dl| dl.delete.clone())
        .map(|op| StoreOp::Queue {
            uid: job.source_uid,
            op,
        })
        .collect();
    let ids = handle
        .call(|reply| Cmd::AcceptDeadLetters {
            messages,
            source_deletes,
            reply,
        })
        .await?;
    for (dl, id) in job.letters.iter().zip(&ids) {
        tracing::info!(
            queue = %job.source,
            message = %dl.message.id,
            reason = dl.reason.as_str(),
            deliveries = dl.delivery_count,
            dead_letter_queue = %job.target,
            dead_letter_id = %id,
            "message dead-lettered"
        );
    }
    Ok(())
}
