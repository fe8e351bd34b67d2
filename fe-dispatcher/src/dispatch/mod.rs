//! The front-end's core: what every client-facing call shares (the router, the connection and
//! session table, the settings, the clock, the event bus), and one function per command. The gRPC
//! services (`Messaging`, `Admin`) and the two streams (`Publish`, `Consume`) are thin shells
//! over it: decode, one call here, encode.
//!
//! One file per kind of command: `connection.rs` (connections, sessions, recover, and telling the
//! back-ends a session ended), `send.rs`, `receive.rs`, `lease.rs` (ack, nack, extend lease by
//! receipt handle), `tx.rs` (commit, rollback), `queue.rs` (temporary queues, browse).

mod connection;
mod lease;
mod queue;
mod receive;
mod send;
mod tx;

use std::str::FromStr;
use std::sync::Arc;

use ferry_kernel::{ClockRef, QueueName, SessionId};
use ferry_proto::pb;
use tokio::sync::{broadcast, watch};
use tonic::Status;

use crate::error::Error;
use crate::router::Router;
use crate::sessions::Sessions;
use crate::FrontendConfig;

/// See the module docs. Shared by the services and streams of one node as an `Arc`.
#[derive(Debug)]
pub(crate) struct Dispatch {
    pub(crate) config: FrontendConfig,
    pub(crate) router: Arc<Router>,
    pub(crate) sessions: Arc<Sessions>,
    /// Becomes true when the node stops: long polls and streams end with
    /// [`Dispatch::stopping_status`].
    pub(crate) stopping: watch::Receiver<bool>,
    /// What this front-end saw that operators watch for (sends to a reply queue that is gone).
    pub(crate) events: broadcast::Sender<pb::Event>,
    /// Wall time, for event stamps and lease expiries shown to clients. Connection leases and
    /// deadlines run on tokio's monotonic clock instead.
    pub(crate) clock: ClockRef,
}

/// Events this front-end's bus holds for a slow watcher before it lags (told `events-lost`).
const EVENTS_BUFFERED_MAX: usize = 1_024;

impl Dispatch {
    pub(crate) fn new(
        config: FrontendConfig,
        router: Arc<Router>,
        stopping: watch::Receiver<bool>,
        clock: ClockRef,
    ) -> Self {
        Self {
            sessions: Arc::new(Sessions::new(config.clone())),
            config,
            router,
            stopping,
            events: broadcast::channel(EVENTS_BUFFERED_MAX).0,
            clock,
        }
    }
}

impl Dispatch {
    /// What a parked receive or an open stream ends with when the node stops (UNAVAILABLE).
    pub(crate) fn stopping_status(&self) -> Status {
        Error::NodeStopping {
            node: self.router.local_node().clone(),
        }
        .into()
    }
}

pub(crate) fn queue_name(name: &str) -> Result<QueueName, Status> {
    Ok(QueueName::new(name).map_err(Error::from)?)
}

pub(crate) fn session_id(id: &str) -> Result<SessionId, Status> {
    Ok(SessionId::from_str(id).map_err(Error::from)?)
}

/// A count for a 32-bit answer field, saturating.
fn count_u32(n: u64) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

#[cfg(test)]
mod tests;
