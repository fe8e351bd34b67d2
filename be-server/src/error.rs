use ferry_kernel::{KernelError, NodeId, PlacementEpoch};
use ferry_store::StoreError;

use crate::log::LogError;
use crate::shard_log::ShardRefusal;
use tonic::{Code, Status};

/// Everything the back-end can refuse or fail at.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("queue {queue:?} does not exist; create it first (ferry queue create {queue})")]
    QueueNotFound { queue: String },
    /// A delete that asked for an empty queue found messages in it.
    #[error("queue {queue:?} is not empty: it holds {ready} ready, {scheduled} scheduled, {leased} delivered and not acknowledged, {staged} staged in open transactions; receive or purge them first (`ferry queue purge {queue}`), or delete without --if-empty")]
    NotEmpty {
        queue: String,
        ready: u64,
        scheduled: u64,
        leased: u64,
        staged: u64,
    },
    /// The queue was found empty and is being deleted: sends are refused.
    #[error("queue {queue:?} is being deleted (it was empty); send to another queue")]
    QueueDeleting { queue: String },
    /// A setting that cannot change on a queue that exists.
    #[error("{field}: {reason}")]
    CannotUpdate { field: &'static str, reason: String },
    #[error("queue {queue:?} already exists")]
    QueueExists { queue: String },
    #[error(transparent)]
    Kernel(#[from] KernelError),
    #[error(transparent)]
    Store(#[from] StoreError),
    /// A replicated queue's shard did not confirm a write here (see `shard_log.rs`).
    #[error(transparent)]
    Shard(ShardRefusal),
    #[error("receipt handle {handle:?} belongs to queue {handle_queue:?}, not {queue:?}")]
    WrongQueue {
        handle: String,
        handle_queue: String,
        queue: String,
    },
    #[error("the node is shutting down; retry on another node or after it restarts")]
    ShuttingDown,
    /// The transaction's staged sends were made by an earlier run of this back-end: it
    /// restarted, they are gone, and the commit is refused (and rolled back).
    #[error("transaction of session {session} was rolled back: the back-end holding its sends restarted, or their queue's shard changed leader, since they were made, and they were lost with it; send them again in a new transaction")]
    TransactionFenced { session: String },
    /// A transaction named queues written through different logs (another queue shard, or a
    /// replicated and an unreplicated queue): their writes cannot be made in one batch.
    #[error("a transaction can only span queues written through one log: {first} and {second} are in different queue shards (or one is replicated and the other is not); commit their work in separate transactions")]
    TransactionAcrossLogs { first: String, second: String },
    /// A dead letter would move between queues written through different logs (a replicated
    /// queue's dead-letter queue missing from its shard, or in another).
    #[error("cannot move dead letters from {source_queue} to {target}: they are not in the same queue shard (create {target} again, or give {source_queue} another dead-letter queue); the messages stay in {source_queue}")]
    DeadLetterAcrossLogs {
        source_queue: String,
        target: String,
    },

    /// The request was routed by a placement epoch at which this back-end does not own the
    /// queue: the caller's placement is older or newer than this back-end's. Answered with a
    /// structured `ferry.v1.NotOwner` detail (see `ferry_proto::not_owner`).
    #[error("this back-end owns queue {queue:?} at placement epoch {epoch}, not at {asked}")]
    NotOwner {
        queue: String,
        owner: NodeId,
        epoch: PlacementEpoch,
        asked: PlacementEpoch,
    },

    /// The node asked the back-end to serve a replicated queue it does not serve yet without
    /// the queue's settings (see `ShardQueue::settings`): the node's bug, told again in full.
    #[error("replicated queue {queue} of shard {shard} is not served here and came without its settings; the node tells the shard's queues again in full")]
    SettingsMissing { queue: String, shard: String },

    /// The disk guard (see `disk.rs`): sends are refused while free space is short.
    #[error("the disk holding the data directory has {free_bytes} bytes free, under disk_free_min_bytes = {limit_bytes}: free space or raise the limit; receives and acknowledgements still work")]
    DiskFull { free_bytes: u64, limit_bytes: u64 },
}

impl From<LogError> for Error {
    fn from(e: LogError) -> Self {
        match e {
            LogError::Store(e) => Error::Store(e),
            LogError::Shard(e) => Error::Shard(e),
        }
    }
}

/// RocksDB reports a full disk (ENOSPC) as an I/O error whose text the store keeps.
fn is_no_space(message: &str) -> bool {
    message.contains("No space left on device")
}

impl From<Error> for Status {
    fn from(e: Error) -> Status {
        if let Error::Store(StoreError::Io { message, .. }) = &e {
            if is_no_space(message) {
                return Status::resource_exhausted(format!(
                    "{e}; the disk holding the data directory is full: free space, then restart the node (after a failed write the store takes no more until it restarts)"
                ));
            }
        }
        if let Error::Shard(ShardRefusal::NotLeader { shard, leader }) = &e {
            let n = ferry_proto::pb::NotLeader {
                shard: shard.0,
                leader_node: leader.clone().unwrap_or_default(),
            };
            return ferry_proto::not_leader_status(n, e.to_string());
        }
        if let Error::NotOwner {
            queue,
            owner,
            epoch,
            ..
        } = e
        {
            return ferry_proto::not_owner_status(ferry_proto::pb::NotOwner {
                queue,
                owner_node: owner.to_string(),
                epoch: epoch.get(),
            });
        }
        let code = match &e {
            Error::QueueNotFound { .. } => Code::NotFound,
            Error::NotEmpty { .. } | Error::QueueDeleting { .. } => Code::FailedPrecondition,
            Error::CannotUpdate { .. } => Code::InvalidArgument,
            Error::QueueExists { .. } => Code::AlreadyExists,
            Error::Kernel(k) => ferry_proto::convert::kernel_error_code(k),
            Error::Store(s) => match s {
                StoreError::Io { .. } | StoreError::Poisoned | StoreError::Closed => {
                    Code::Unavailable
                }
                StoreError::Corrupt { .. } => Code::DataLoss,
            },
            Error::WrongQueue { .. } | Error::NotOwner { .. } => Code::FailedPrecondition,
            Error::ShuttingDown | Error::Shard(_) => Code::Unavailable,
            Error::TransactionFenced { .. } => Code::Aborted,
            Error::TransactionAcrossLogs { .. } | Error::DeadLetterAcrossLogs { .. } => {
                Code::FailedPrecondition
            }
            Error::DiskFull { .. } => Code::ResourceExhausted,
            Error::SettingsMissing { .. } => Code::Internal,
        };
        Status::new(code, e.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_disk_under_the_store_is_resource_exhausted() {
        let e = Error::Store(StoreError::Io {
            context: "writing a batch",
            message: "IO error: No space left on device: While appending to file: /d/000012.log"
                .into(),
        });
        let s = Status::from(e);
        assert_eq!(s.code(), Code::ResourceExhausted);
        assert!(s.message().contains("free space"), "{}", s.message());
        let other = Error::Store(StoreError::Io {
            context: "writing a batch",
            message: "IO error: Input/output error".into(),
        });
        assert_eq!(Status::from(other).code(), Code::Unavailable);
    }

    #[test]
    fn a_write_a_shard_did_not_confirm_is_unavailable_saying_what_to_do() {
        use crate::shard_log::{ShardId, ShardRefusal};
        let not_leader = Status::from(Error::from(LogError::Shard(ShardRefusal::NotLeader {
            shard: ShardId(3),
            leader: Some("n2".into()),
        })));
        assert_eq!(not_leader.code(), Code::Unavailable);
        assert!(
            not_leader.message().contains("shard 3 (leader: n2)"),
            "{}",
            not_leader.message()
        );
        assert!(
            not_leader.message().contains("was not made"),
            "{}",
            not_leader.message()
        );
        let unknown = Status::from(Error::from(LogError::Shard(ShardRefusal::Unknown {
            shard: ShardId(3),
            reason: "overwritten by a new leader".into(),
        })));
        assert_eq!(unknown.code(), Code::Unavailable);
        assert!(
            unknown.message().contains("same dedup id"),
            "{}",
            unknown.message()
        );
    }
}
