//! Where a queue's dead letters and expired messages go: the rules both the queue registry
//! (`queues.rs`, which creates a queue's targets with it) and the dead-letter mover
//! (`dead_letter.rs`, which creates them on demand) follow. Uses neither.

use ferry_kernel::{DeadLetterTarget, QueueConfig, QueueName, RedeliveryPolicy};

/// The settings of a dead-letter queue created on demand: like its source queue, but it keeps
/// what it is given (no redelivery limit, no further dead-lettering, room for any message its
/// source accepted).
pub(crate) fn dead_letter_queue_config(source: &QueueConfig) -> QueueConfig {
    QueueConfig {
        redelivery: RedeliveryPolicy {
            max_redeliveries: None,
            ..RedeliveryPolicy::default()
        },
        dead_letter: DeadLetterTarget::Discard,
        expiry: DeadLetterTarget::Discard,
        ..source.clone()
    }
}

/// Whether a queue's dead-letter and expiry queues are created with it. Not for a temporary
/// queue (it keeps nothing), nor for one named like a dead-letter queue (no `X.DLQ.DLQ` beside
/// every `X.DLQ` a user creates; should it dead-letter, one is made on demand).
pub(crate) fn targets_up_front(name: &QueueName, temporary: bool) -> bool {
    !temporary && !name.is_dead_letter_queue()
}
