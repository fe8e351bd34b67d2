//! Moving dead letters to their dead-letter queue. A queue's owner task hands each batch of
//! dead letters here once its own writes are durable; this task creates the dead-letter queue on
//! demand (on this back-end) and has its owner task store them together with the durable
//! deletes from the source queue, in one batch: a crash leaves each message in exactly one of
//! the two queues (or, if it strikes before the move, in the source queue, where it is judged
//! again at recovery), never in neither.

use std::sync::Weak;

use ferry_kernel::{DeadLetter, NewMessage, PropertyValue, QueueName};
use ferry_store::StoreOp;
use tokio::sync::mpsc;

use crate::actor::Cmd;
use crate::error::Error;
use crate::outbox::DeadLetterJob;
use crate::queues::Queues;

/// Properties a dead letter carries, besides everything the original message had.
pub const REASON_PROPERTY: &str = "FerryDeadLetterReason";
pub const ORIGINAL_QUEUE_PROPERTY: &str = "FerryOriginalQueue";
pub const ORIGINAL_MESSAGE_ID_PROPERTY: &str = "FerryOriginalMessageId";
pub const DELIVERY_COUNT_PROPERTY: &str = "FerryDeliveryCount";

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

/// Starts the task that moves dead letters; it ends when the registry is gone (its last
/// owner, the broker, dropped it: the job channel closes with it).
pub(crate) fn start(queues: Weak<Queues>, mut jobs: mpsc::UnboundedReceiver<DeadLetterJob>) {
    tokio::spawn(async move {
        while let Some(mut job) = jobs.recv().await {
            let Some(queues) = queues.upgrade() else {
                return;
            };
            let (source, target, count) =
                (job.source.clone(), job.target.clone(), job.letters.len());
            let done = job.done.take();
            let moved = move_letters(&queues, job).await;
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
}

async fn move_letters(queues: &Queues, job: DeadLetterJob) -> Result<(), Error> {
    let handle = queues.dead_letter_queue(&job.source, &job.target).await?;
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
    let name: std::sync::Arc<str> = std::sync::Arc::from(job.source.as_str());
    queues.outbox.publish(&name, job.source_uid, job.published);
    for (dl, id) in job.letters.iter().zip(&ids) {
        tracing::info!(
            queue = %job.source,
            message_id = %dl.message.id,
            reason = dl.reason.as_str(),
            deliveries = dl.delivery_count,
            dead_letter_queue = %job.target,
            dead_letter_id = %id,
            "message dead-lettered"
        );
    }
    Ok(())
}
