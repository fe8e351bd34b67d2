//! Ferry's back-end: owns queues, each a kernel [`ferry_kernel::Queue`] driven by one owner task,
//! persists every change through group commit before it answers anyone the change affects, runs
//! the queues' timers, and serves the internal `Backend` gRPC service that front-ends forward to.
//!
//! Depends on the kernel, the store and the API types; never on the front-end.

mod actor;
mod broker;
mod clock;
mod config;
mod dead_letter;
mod disk;
mod error;
pub mod faults;
mod history;
mod log;
mod outbox;
mod queues;
mod service;
// The second log (a shard proposal): the node wires it with shard routing (issue 24 §1).
#[cfg_attr(not(test), allow(dead_code))]
mod shard_log;
mod shards;
mod targets;
mod tx;

pub use broker::{Broker, CommitCounts, HandleKey, QueueSummary};
pub use clock::{now_ms, SystemClock};
pub use config::BrokerConfig;
pub use dead_letter::{
    DELIVERY_COUNT_PROPERTY, ORIGINAL_MESSAGE_ID_PROPERTY, ORIGINAL_QUEUE_PROPERTY, REASON_PROPERTY,
};
pub use error::Error;
pub use history::{History, Step};
pub use outbox::BrokerEvent;
pub use service::BackendService;
pub use shard_log::{ProposalOutcome, ShardId, ShardProposer, ShardRefusal};
pub use shards::ShardQueue;
