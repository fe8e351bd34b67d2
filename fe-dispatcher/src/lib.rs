//! Ferry's front-end dispatcher: the client-facing `Messaging` and `Admin` gRPC services. It holds
//! connections (leases renewed by heartbeats or traffic), sessions with their ack mode, and
//! temporary queues that die with their connection, and routes every call by queue name to the
//! back-end that owns the queue.
//!
//! The front-end ↔ back-end interface is the `Backend` gRPC service. The front-end sees it as a
//! trait object ([`BackendRef`]): the node plugs in its own back-end in-process, and
//! [`RemoteBackend`] reaches another node's over gRPC. This crate never depends on the back-end
//! or the store.

mod admin;
mod catalog;
mod consume;
mod deadline;
mod dispatch;
mod error;
mod events;
#[cfg(test)]
mod fake;
mod messaging;
mod mover;
mod publish;
mod remote;
mod router;
mod sessions;

use std::sync::Arc;
use std::time::Duration;

use ferry_kernel::ClockRef;

pub use admin::AdminService;
pub use catalog::{Catalog, CatalogEntry, CatalogRef, PlacementAsked};
pub use error::Error;
pub use messaging::MessagingService;
pub use remote::{Reachability, RemoteBackend};
pub use router::{
    CatchUp, Owner, Placement, Router, CATCH_UP_WAIT_MAX, NOT_OWNER_RETRIES_MAX, REFRESH_WAIT_MAX,
};
pub use sessions::Sessions;

/// A back-end, local or remote.
pub type BackendRef =
    Arc<dyn ferry_proto::pb::backend_server::Backend<WatchEventsStream = ferry_proto::EventStream>>;

/// Front-end settings.
#[derive(Debug, Clone)]
pub struct FrontendConfig {
    /// Connection lease granted when the client asks for none.
    pub connection_lease_default_ms: u64,
    pub connection_lease_min_ms: u64,
    pub connection_lease_max_ms: u64,
    /// Sessions one connection may hold.
    pub sessions_per_connection_max: usize,
    /// Temporary queues one connection may hold.
    pub temporary_queues_per_connection_max: usize,
    /// Connections this node holds at once.
    pub connections_max: usize,
    /// Sessions this node holds at once, over all its connections.
    pub sessions_max: usize,
    /// Temporary queues this node holds at once, over all its connections.
    pub temporary_queues_max: usize,
    /// A long-poll receive bounded by the call's deadline answers this much before it, so the
    /// empty answer reaches the client in time.
    pub deadline_margin_ms: u64,
}

impl Default for FrontendConfig {
    fn default() -> Self {
        Self {
            connection_lease_default_ms: 30_000,
            connection_lease_min_ms: 1_000,
            connection_lease_max_ms: 600_000,
            sessions_per_connection_max: 1_000,
            temporary_queues_per_connection_max: 1_000,
            connections_max: 100_000,
            sessions_max: 100_000,
            temporary_queues_max: 10_000,
            deadline_margin_ms: 50,
        }
    }
}

/// The front-end of a node: both client-facing services over one router and one session table.
#[derive(Debug)]
pub struct Frontend {
    pub messaging: MessagingService,
    pub admin: AdminService,
    core: Arc<dispatch::Dispatch>,
    stop: StopHandle,
}

/// How often the reaper looks for connections whose lease ran out.
const REAP_PERIOD: Duration = Duration::from_millis(250);

/// Completes once the node is stopping.
pub(crate) async fn stopped(rx: &mut tokio::sync::watch::Receiver<bool>) {
    // An error means the sender is gone: the node is going away all the same.
    let _ = rx.wait_for(|s| *s).await;
}

/// Tells a front-end that its node is stopping. Cheap to clone.
#[derive(Debug, Clone)]
pub struct StopHandle(Arc<tokio::sync::watch::Sender<bool>>);

impl StopHandle {
    /// Long polls, `Consume` and `Publish` streams and event watchers end at once with
    /// UNAVAILABLE, so the server's graceful shutdown does not wait on them.
    pub fn stop(&self) {
        let _ = self.0.send(true);
    }
}

impl Frontend {
    /// `clock` is the wall clock the front-end stamps events and message expiries with (the
    /// system clock in a node, a `ManualClock` in tests). Connection leases and deadlines run on
    /// tokio's monotonic clock instead, so tests can pause and step it.
    pub fn new(config: FrontendConfig, router: Router, clock: ClockRef) -> Self {
        let (stop, stopping) = tokio::sync::watch::channel(false);
        let core = Arc::new(dispatch::Dispatch::new(
            config,
            Arc::new(router),
            stopping,
            clock,
        ));
        Self {
            messaging: MessagingService::new(core.clone()),
            admin: AdminService::new(core.clone()),
            core,
            stop: StopHandle(Arc::new(stop)),
        }
    }

    /// Creates and deletes queues through `catalog` (the cluster's metadata group) from now on.
    pub fn with_catalog(mut self, catalog: CatalogRef) -> Self {
        self.admin = AdminService::new(self.core.clone()).with_catalog(catalog);
        self
    }

    /// Closes connections whose lease ran out; run it until the node stops.
    pub fn reaper(&self) -> impl std::future::Future<Output = ()> + Send + 'static {
        let core = self.core.clone();
        async move { core.reap_expired_connections(REAP_PERIOD).await }
    }

    pub fn stop_handle(&self) -> StopHandle {
        self.stop.clone()
    }

    /// Calls routed again after a back-end answered "not the owner", since start.
    pub fn routing_redirects_total(&self) -> u64 {
        self.core.router.redirects_total()
    }

    /// Open client connections and sessions on this front-end.
    pub fn client_counts(&self) -> (usize, usize) {
        self.core.sessions.counts()
    }
}
