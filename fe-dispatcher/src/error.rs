use ferry_kernel::{KernelError, NodeId};
use tonic::{Code, Status};

/// What the front-end itself refuses (back-end errors pass through as they are).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Kernel(#[from] KernelError),
    #[error("connection {id:?} is unknown or its lease ran out; open a new connection")]
    ConnectionNotFound { id: String },
    #[error("session {id:?} is unknown or closed; create a new session")]
    SessionNotFound { id: String },
    #[error("wait_ms must be 0 (receive no wait) or positive, got {wait_ms}; omit it to wait until the call's deadline")]
    NegativeWait { wait_ms: i64 },
    #[error("no route to node {node}: it is not in this node's cluster configuration")]
    UnknownNode { node: NodeId },
    #[error("queue {queue} is moving between nodes: its owner answered \"not the owner\" {tries} times ({last}); try again")]
    OwnerUnsettled {
        queue: String,
        tries: u32,
        last: String,
    },
    #[error("{what}: this node allows {limit} ({limit_name})")]
    LimitReached {
        what: String,
        limit: usize,
        limit_name: &'static str,
    },
    #[error("session {id} is not transacted: Commit and Rollback need a session created with ACK_MODE_TRANSACTED")]
    NotTransacted { id: String },
    #[error("session {session}'s transaction is on back-end {first}, but queue {queue} lives on {second}: a transaction spans the queues of one back-end; commit or roll back first, or place the queues on one node")]
    TransactionSpansBackends {
        session: String,
        first: ferry_kernel::NodeId,
        queue: String,
        second: ferry_kernel::NodeId,
    },
    #[error("transaction of session {session} rolled back: {reason}")]
    RolledBack { session: String, reason: String },
    #[error("session {id} is transacted: {what}")]
    Transacted { id: String, what: &'static str },
    #[error("queue {queue} is not a temporary queue of connection {connection}")]
    NotOwnTemporaryQueue { queue: String, connection: String },
    #[error("{stale} of {total} receipt handles are not live deliveries (lease expired, already acknowledged, or redelivered since): {detail}")]
    StaleReceipts {
        stale: usize,
        total: usize,
        detail: String,
    },
    #[error("the first message on a Consume stream must be `start`")]
    ConsumeNotStarted,
    /// Ends parked receives and open streams when the node stops, so its graceful shutdown
    /// does not wait on them and clients can tell the end from "no message came".
    #[error("node {node} is shutting down; retry on another node or after it restarts")]
    NodeStopping { node: NodeId },
    /// The link to another node broke while a call to it was under way (it stopped, restarted or
    /// was cut off). The router prefixes the node's name, as for every UNAVAILABLE from another
    /// node; the message says what may have happened there.
    #[error("the connection to it broke while the {call} was under way (the node stopped, restarted or was cut off): {outcome}; retry, or connect to another node")]
    OwnerLost {
        call: &'static str,
        outcome: CallOutcome,
    },
    /// A queue's creation or change is committed in the metadata, but the node that must serve
    /// the queue did not show it carried out within the wait (see `admin/create.rs`).
    #[error("{change} is committed in the metadata, but {waited_for} did not serve it in the {waited_ms} ms waited ({last}); it is served once that node has applied it: retry (a create with if_not_exists), and see whether the nodes are up (`ferry cluster status`, `ferry shard list`)")]
    NotServedInTime {
        change: String,
        waited_for: String,
        waited_ms: u64,
        last: String,
    },
    /// A read of another node's that got no answer in the time it was given (the node is down,
    /// paused or cut off; nothing changed).
    #[error("node {node} did not answer within {within_ms} ms (down, paused or cut off)")]
    NoAnswer { node: NodeId, within_ms: u64 },
}

/// What a call may have done at a node that was lost while it was under way.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CallOutcome {
    /// It may have taken effect or not (a send may be stored, an ack may be applied).
    Unknown,
    /// A receive: whatever it was handed stays leased until the leases run out (a replicated
    /// queue's until the session's next receive there, see `Dispatch::receive_at`), then is
    /// delivered again.
    LeasesReturn,
    /// A read: nothing changed.
    NothingChanged,
}

impl std::fmt::Display for CallOutcome {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            CallOutcome::Unknown => "its outcome is unknown, it may or may not have taken effect",
            CallOutcome::LeasesReturn => {
                "any messages it was handed return to the queue when their leases run out (a replicated queue's as soon as the session receives from it again)"
            }
            CallOutcome::NothingChanged => "it changed nothing",
        })
    }
}

impl From<Error> for Status {
    fn from(e: Error) -> Status {
        let code = match &e {
            Error::Kernel(k) => ferry_proto::convert::kernel_error_code(k),
            Error::ConnectionNotFound { .. } | Error::SessionNotFound { .. } => Code::NotFound,
            Error::NegativeWait { .. } | Error::ConsumeNotStarted => Code::InvalidArgument,
            Error::UnknownNode { .. }
            | Error::NodeStopping { .. }
            | Error::OwnerLost { .. }
            | Error::NotServedInTime { .. }
            | Error::NoAnswer { .. } => Code::Unavailable,
            Error::OwnerUnsettled { .. } => Code::FailedPrecondition,
            Error::LimitReached { .. } => Code::ResourceExhausted,
            Error::RolledBack { .. } => Code::Aborted,
            Error::NotTransacted { .. }
            | Error::TransactionSpansBackends { .. }
            | Error::Transacted { .. }
            | Error::NotOwnTemporaryQueue { .. }
            | Error::StaleReceipts { .. } => Code::FailedPrecondition,
        };
        Status::new(code, e.to_string())
    }
}
