//! Ferry's pure queue semantics: the message state machine of a point-to-point queue, delivery
//! leases, waiting receivers, priorities, delivery delays, expiry, the redelivery policy and dead
//! letters, transacted sessions, message groups, producer dedup, and the effects the shell must
//! persist.
//!
//! The kernel does no I/O. It has no clock, no timers, no threads, no async runtime and no random
//! source (collision avoidance uses a seeded generator): every operation that depends on time takes `now_ms` (milliseconds since the Unix epoch),
//! the kernel reports its next deadline with [`Queue::next_deadline_ms`], and the shell calls
//! [`Queue::tick`] when that time comes. Operations return what happened ([`Effects`]: things to
//! persist, deliveries for parked receivers, receivers that timed out); the kernel never calls back.
//!
//! This crate must not depend on tokio, tonic, prost or rocksdb (CI checks `cargo tree`); its
//! dependencies are pure (bytes, thiserror, siphasher).

mod clock;
mod error;
mod queue;
pub mod selector;
mod types;

pub use clock::{Clock, ClockRef, ManualClock};
pub use error::KernelError;
pub use queue::{
    Caller, DeadLetter, DeadLetterCounts, DeadLetterReason, DeadLetterTarget, DedupRecord,
    Delivery, DeliveryMark, Effects, HistoryEntry, LeaseRef, MessageState, Page, PageSource,
    PagedError, PersistOp, Queue, QueueConfig, QueueStats, ReceiveOutcome, ReceiveRequest,
    RecoveredMessage, RedeliveryPolicy, Renewed, ReturnCause, Transition, Wait, WaiterId,
    DEDUP_IDS_MAX, DEDUP_ID_BYTES_MAX, PROPERTIES_PER_MESSAGE_MAX, SCAN_CHUNK, SCAN_LOOK_MAX,
    STAGED_MAX,
};
pub use selector::{IndexedHeader, Selector, SelectorLimits};
pub use types::shown;
pub use types::{
    validate_property_name, LeaseId, Message, MessageId, NewMessage, NodeId, PlacementEpoch,
    Priority, PropertyValue, PublicIds, QueueName, QueueUid, ReceiptHandle, Seq, SessionId,
    ShardId, SHOWN_CHARS_MAX,
};
