use ferry_kernel::{KernelError, NodeId};
use ferry_store::StoreError;
use tonic::{Code, Status};

/// Everything the back-end can refuse or fail at.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("queue {queue:?} does not exist; create it first (ferry queue create {queue})")]
    QueueNotFound { queue: String },
    #[error("queue {queue:?} already exists")]
    QueueExists { queue: String },
    #[error(transparent)]
    Kernel(#[from] KernelError),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("receipt handle {handle:?} belongs to node {owner}, not this node ({this})")]
    WrongNode {
        handle: String,
        owner: NodeId,
        this: NodeId,
    },
    #[error("receipt handle {handle:?} belongs to queue {handle_queue:?}, not {queue:?}")]
    WrongQueue {
        handle: String,
        handle_queue: String,
        queue: String,
    },
    #[error("the node is shutting down; retry on another node or after it restarts")]
    ShuttingDown,
}

impl From<Error> for Status {
    fn from(e: Error) -> Status {
        let code = match &e {
            Error::QueueNotFound { .. } => Code::NotFound,
            Error::QueueExists { .. } => Code::AlreadyExists,
            Error::Kernel(k) => ferry_proto::convert::kernel_error_code(k),
            Error::Store(s) => match s {
                StoreError::Io { .. } | StoreError::Poisoned | StoreError::Closed => {
                    Code::Unavailable
                }
                StoreError::Corrupt { .. } => Code::DataLoss,
            },
            Error::WrongNode { .. } | Error::WrongQueue { .. } => Code::FailedPrecondition,
            Error::ShuttingDown => Code::Unavailable,
        };
        Status::new(code, e.to_string())
    }
}
