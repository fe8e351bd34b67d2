//! How the rest of the back-end talks to a queue's owner task: the commands it takes and a cheap
//! handle to send them (with the guard that removes a receive whose caller stopped waiting).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use ferry_kernel::{
    Caller, Delivery, KernelError, LeaseId, LeaseRef, MessageId, MessageState, NewMessage,
    QueueStats, ReceiveRequest, Renewed, Seq, SessionId,
};
use ferry_store::StoreOp;

use crate::log::LogError;
use tokio::sync::{mpsc, oneshot};

use super::Reply;
use crate::error::Error;

pub(crate) type LeaseResults<T> = Vec<Result<T, KernelError>>;
/// Browsed messages with their state and delivery count, and where to resume (`None`: done).
pub(crate) type Browsed = (
    Vec<(Arc<ferry_kernel::Message>, MessageState, u32)>,
    Option<ferry_kernel::Seq>,
);

pub(crate) enum Cmd {
    Send {
        messages: Vec<NewMessage>,
        reply: Reply<Vec<MessageId>>,
    },
    /// Sends of a transacted session: staged until it commits.
    Stage {
        session: SessionId,
        messages: Vec<NewMessage>,
        reply: Reply<Vec<MessageId>>,
    },
    /// Dead letters moved here from another queue, with the durable deletes from their source
    /// queue: both are written in one batch.
    AcceptDeadLetters {
        messages: Vec<NewMessage>,
        source_deletes: Vec<StoreOp>,
        reply: Reply<Vec<MessageId>>,
    },
    /// First phase of a commit: may the session's transaction commit here? If so, the task
    /// answers and then waits for the decision, touching nothing else until it comes, so the
    /// answer stays true.
    TxPrepare {
        session: SessionId,
        acks: Vec<LeaseRef>,
        reply: Reply<()>,
        decision: oneshot::Receiver<TxDecision>,
    },
    /// Drops the session's staged sends and gives back what it received.
    Rollback {
        session: SessionId,
        reply: Reply<u64>,
    },
    Receive {
        req: ReceiveRequest,
        ticket: u64,
        /// Receives with the same nonzero tag come from one consumer: counted once.
        consumer: u64,
        reply: Reply<Vec<Delivery>>,
    },
    CancelReceive {
        ticket: u64,
    },
    /// About deliveries already made: giving them back, acknowledging, renewing.
    Lease(LeaseCmd),
    /// Reading and managing the queue as a whole.
    Admin(AdminCmd),
    /// Ends the task; pending writes finish first. Parked receivers are answered NOT_FOUND
    /// when the queue is `deleted`, else (the node is stopping) UNAVAILABLE.
    Stop {
        deleted: bool,
        reply: oneshot::Sender<u64>,
    },
}

/// Commands about deliveries already made (see [`Cmd::Lease`]).
pub(crate) enum LeaseCmd {
    /// Deliveries that never reached their consumer: those that reached the caller's side after
    /// it stopped waiting (`Caller::Backend`, no answer), or prefetched messages a consumer gives
    /// back unseen (answered per lease).
    ReturnUndelivered {
        caller: Caller,
        leases: Vec<LeaseRef>,
        reply: Option<Reply<LeaseResults<()>>>,
    },
    Ack {
        caller: Caller,
        leases: Vec<LeaseRef>,
        /// Nobody waits for the answer: the write may be deferred (see `GroupCommit`).
        defer_sync: bool,
        reply: Reply<LeaseResults<()>>,
    },
    /// Answered once the write is durable and, for messages it dead-letters, once they are in
    /// their dead-letter queue.
    Nack {
        caller: Caller,
        leases: Vec<LeaseRef>,
        delay_ms: Option<u64>,
        /// Straight to the dead-letter target.
        reject: bool,
        reply: Reply<LeaseResults<()>>,
    },
    Extend {
        caller: Caller,
        leases: Vec<LeaseRef>,
        lease_ms: Option<u64>,
        reply: Reply<LeaseResults<u64>>,
    },
    /// A session is alive: renew its delivery leases.
    RenewSession {
        session: SessionId,
        reply: Reply<u64>,
    },
    /// A session is alive and holds these deliveries: renew them alone.
    RenewNamed {
        session: SessionId,
        named: Vec<(Seq, LeaseId)>,
        reply: Reply<Renewed>,
    },
    /// A session ended (`recover: false`) or is recovering (`true`).
    ReleaseSession {
        session: SessionId,
        recover: bool,
        reply: Reply<u64>,
    },
    /// A receive of the session lost its answer: return its deliveries of an earlier run
    /// except those named (`Queue::release_lost`).
    ReleaseLost {
        session: SessionId,
        keep: Vec<(Seq, LeaseId)>,
        reply: Reply<u64>,
    },
}

/// Commands reading and managing the queue as a whole (see [`Cmd::Admin`]).
pub(crate) enum AdminCmd {
    Browse {
        after: Option<ferry_kernel::Seq>,
        max: usize,
        selector: Option<Arc<ferry_kernel::Selector>>,
        reply: Reply<Browsed>,
    },
    Purge {
        reply: Reply<u64>,
    },
    DeleteMessage {
        id: MessageId,
        reply: Reply<()>,
    },
    Stats {
        reply: Reply<QueueStats>,
    },
    /// New settings, from the next operation on (see `Queue::set_config`).
    SetConfig {
        config: ferry_kernel::QueueConfig,
        reply: Reply<()>,
    },
    /// `until_ms: Some(t)`: refuse sends until `t` (or until unsealed), if the queue holds no
    /// message (else refused, [`Error::NotEmpty`]). `None`: take sends again.
    Seal {
        until_ms: Option<u64>,
        reply: Reply<()>,
    },
    /// How many deliveries each session holds here.
    SessionLeases {
        sessions: Vec<SessionId>,
        reply: Reply<Vec<u64>>,
    },
}

/// The second phase of a commit (see [`Cmd::TxPrepare`]).
pub(crate) enum TxDecision {
    /// Apply the transaction and hand over its writes; they are written in one batch with the
    /// other queues' writes, and `durable` says when that batch is on disk.
    Commit {
        ops: oneshot::Sender<Vec<StoreOp>>,
        /// The batch is queued for writing (after every write this queue submitted before).
        submitted: oneshot::Receiver<()>,
        durable: oneshot::Receiver<Result<(), LogError>>,
    },
    Abort,
}

/// What a queue's owner task is sent. Boxed: tokio's channel allocates its first block of 32
/// slots when it is made, so every idle queue paid 32 times the size of a `Cmd` (184 bytes,
/// about 6 KiB) for a channel that is mostly empty; a box costs one small allocation per command.
pub(super) type Mail = Box<Cmd>;

/// A cheap handle to a queue's owner task.
#[derive(Debug, Clone)]
pub(crate) struct QueueHandle {
    tx: mpsc::Sender<Mail>,
    tickets: Arc<AtomicU64>,
}

impl QueueHandle {
    /// A handle sending on `tx`, the channel of a queue's owner task.
    pub(super) fn new(tx: mpsc::Sender<Mail>) -> Self {
        Self {
            tx,
            tickets: Arc::new(AtomicU64::new(1)),
        }
    }

    pub(crate) async fn call<T>(&self, make: impl FnOnce(Reply<T>) -> Cmd) -> Result<T, Error> {
        let (tx, rx) = oneshot::channel();
        self.tx
            .send(Box::new(make(tx)))
            .await
            .map_err(|_| Error::ShuttingDown)?;
        rx.await.map_err(|_| Error::ShuttingDown)?
    }

    /// Receives; if the caller stops waiting (its future is dropped: client cancelled or went
    /// away), the parked receiver is removed from the queue at once.
    pub(crate) async fn receive(
        &self,
        req: ReceiveRequest,
        consumer: u64,
    ) -> Result<Vec<Delivery>, Error> {
        let ticket = self.tickets.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        self.tx
            .send(Box::new(Cmd::Receive {
                req,
                ticket,
                consumer,
                reply: tx,
            }))
            .await
            .map_err(|_| Error::ShuttingDown)?;
        let mut guard = CancelOnDrop {
            tx: self.tx.clone(),
            ticket,
            rx: Some(rx),
        };
        let rx = guard.rx.as_mut().expect("invariant: set just above");
        let out = rx.await.map_err(|_| Error::ShuttingDown);
        guard.rx = None;
        out?
    }

    pub(crate) async fn stop(&self, deleted: bool) -> u64 {
        let (tx, rx) = oneshot::channel();
        if self
            .tx
            .send(Box::new(Cmd::Stop { deleted, reply: tx }))
            .await
            .is_err()
        {
            return 0;
        }
        rx.await.unwrap_or(0)
    }
}

/// Armed while a receive waits for its answer. Dropped armed (the caller stopped waiting), it
/// removes the parked receiver, or, if the answer already arrived, gives its deliveries back.
struct CancelOnDrop {
    tx: mpsc::Sender<Mail>,
    ticket: u64,
    rx: Option<oneshot::Receiver<Result<Vec<Delivery>, Error>>>,
}

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        let Some(mut rx) = self.rx.take() else { return };
        // After close() the owner task can no longer hand us anything: its send fails and it
        // returns the messages itself. Whatever was sent before is still readable here.
        rx.close();
        let cmd = Box::new(match rx.try_recv() {
            Ok(Ok(deliveries)) if !deliveries.is_empty() => {
                Cmd::Lease(LeaseCmd::ReturnUndelivered {
                    caller: Caller::Backend,
                    leases: deliveries.iter().map(Delivery::lease_ref).collect(),
                    reply: None,
                })
            }
            _ => Cmd::CancelReceive {
                ticket: self.ticket,
            },
        });
        if let Err(mpsc::error::TrySendError::Full(cmd)) = self.tx.try_send(cmd) {
            // The queue is busy; deliver the command without blocking the dropping thread.
            if let Ok(rt) = tokio::runtime::Handle::try_current() {
                let tx = self.tx.clone();
                rt.spawn(async move {
                    let _ = tx.send(cmd).await;
                });
            }
        }
    }
}
