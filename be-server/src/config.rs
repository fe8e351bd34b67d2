//! The back-end's settings.

use std::path::PathBuf;

use ferry_kernel::{NodeId, QueueConfig};

/// Back-end settings.
#[derive(Debug, Clone)]
pub struct BrokerConfig {
    pub node_id: NodeId,
    /// Settings of a queue created without its own.
    pub queue_defaults: QueueConfig,
    /// Commands waiting for one queue's owner task.
    pub queue_channel_capacity: usize,
    /// How long each step of a message's history is kept (0: no history).
    pub history_retention_ms: u64,
    /// The most history steps kept on this node.
    pub history_max_steps: usize,
    /// Bytes of messages one durable queue keeps in memory at most; the rest waits in the store.
    pub queue_memory_budget_bytes: u64,
    /// Bytes of messages all durable queues of this node keep in memory together: each queue's
    /// budget is the smaller of `queue_memory_budget_bytes` and an equal share of this.
    pub node_memory_budget_bytes: u64,
    /// The directory whose disk the disk guard watches (the data directory); `None`: no guard
    /// (a store without a disk).
    pub disk_guard_dir: Option<PathBuf>,
    /// Sends to durable queues are refused while that disk has fewer free bytes (0: never).
    pub disk_free_min_bytes: u64,
    /// Queues this back-end owns at once (dead-letter and temporary queues included).
    pub queues_max: usize,
}

impl BrokerConfig {
    pub fn new(node_id: NodeId) -> Self {
        Self {
            node_id,
            queue_defaults: QueueConfig::default(),
            queue_channel_capacity: 1_024,
            history_retention_ms: 600_000,
            history_max_steps: 100_000,
            queue_memory_budget_bytes: 64 * 1024 * 1024,
            node_memory_budget_bytes: 256 * 1024 * 1024,
            disk_guard_dir: None,
            disk_free_min_bytes: 64 * 1024 * 1024,
            queues_max: 10_000,
        }
    }
}

/// Each durable queue's memory budget when `queues` durable queues share the node's.
pub(crate) fn queue_budget(config: &BrokerConfig, queues: usize) -> u64 {
    let share = config.node_memory_budget_bytes / queues.max(1) as u64;
    config.queue_memory_budget_bytes.min(share)
}
