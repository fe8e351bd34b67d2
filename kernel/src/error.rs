use crate::types::{QueueName, Seq};

/// Everything a kernel operation can refuse. Each variant names what the caller did wrong and
/// carries the values needed to say how to fix it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KernelError {
    /// `receive` with a negative timeout (JMS: "invalid timeout"). Nothing was registered.
    #[error("receive timeout must be zero (no wait) or positive, got {timeout_ms} ms")]
    NegativeTimeout { timeout_ms: i64 },
    #[error("{field} is {value}, above the limit {limit} ({limit_name})")]
    OverLimit {
        field: &'static str,
        value: u64,
        limit: u64,
        limit_name: &'static str,
    },
    #[error("{field} is invalid: {reason}")]
    InvalidArgument { field: &'static str, reason: String },
    #[error("message {index} is {size_bytes} bytes, over the queue's max_message_size_bytes = {limit_bytes}")]
    MessageTooLarge {
        index: usize,
        size_bytes: u64,
        limit_bytes: u64,
    },
    #[error("queue {queue} has {waiters} parked receivers, the limit waiters_max = {limit}")]
    TooManyWaiters {
        queue: QueueName,
        waiters: usize,
        limit: usize,
    },
    /// A message selector that does not parse, uses a name or type wrongly, or exceeds a limit.
    /// `position` is the 1-based character position where the problem starts.
    #[error("selector is invalid at position {position}: {reason}")]
    InvalidSelector { position: usize, reason: String },
    /// The receipt handle names no live delivery: the message was acknowledged, its lease ran out
    /// and it was (or may be) delivered again, or the handle never existed.
    /// No message with this id is in the queue (acknowledged, expired, deleted, or never sent
    /// here).
    #[error("message {id} is not in the queue")]
    NoSuchMessage { id: String },
    /// The message is with a consumer right now.
    #[error("message {id} is delivered and not yet acknowledged; it can be deleted once it is back in the queue (or after its consumer's session ends)")]
    MessageLeased { id: String },
    /// A send would take the queue over one of its limits (`max_messages`, `max_bytes`).
    #[error("queue {queue} is full: {value} {what} with this send, over its {limit_name} = {limit}; consume or purge messages, or raise the limit")]
    QueueFull {
        queue: QueueName,
        what: &'static str,
        value: u64,
        limit: u64,
        limit_name: &'static str,
    },
    #[error("receipt handle for message seq {seq} is not a live delivery (lease expired, already acknowledged, or redelivered since)")]
    StaleReceipt { seq: Seq },
    /// The delivery is live but belongs to another session (or to one, when the call named
    /// none): only the session that received a message may acknowledge, reject, release or
    /// extend it.
    #[error("receipt handle for message seq {seq} is a delivery of another session{}; act on it through the session that received it", if *session_named { "" } else { " (the call named no session_id)" })]
    NotOwner { seq: Seq, session_named: bool },
    /// A send repeats a dedup id that another session's open transaction staged: which one
    /// stands is decided when that transaction ends.
    #[error("dedup id {dedup_id:?} is held by another session's open transaction; send again once it commits (then this send is its duplicate) or rolls back")]
    DedupInTransaction { dedup_id: String },
}
