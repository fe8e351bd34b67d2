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
mod consume;
mod deadline;
mod error;
mod messaging;
mod remote;
mod router;
mod sessions;

use std::sync::Arc;
use std::time::Duration;

pub use admin::AdminService;
pub use error::Error;
pub use messaging::MessagingService;
pub use remote::RemoteBackend;
pub use router::Router;
pub use sessions::Sessions;

/// A back-end, local or remote.
pub type BackendRef = Arc<dyn ferry_proto::pb::backend_server::Backend>;

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
            deadline_margin_ms: 50,
        }
    }
}

/// Builds both client-facing services over one router and one session table, and returns the
/// reaper that closes connections whose lease ran out (run it until shutdown).
pub fn frontend(
    config: FrontendConfig,
    router: Router,
) -> (MessagingService, AdminService, impl std::future::Future<Output = ()> + Send) {
    let router = Arc::new(router);
    let sessions = Arc::new(Sessions::new(config.clone()));
    let messaging = MessagingService::new(config, router.clone(), sessions.clone());
    let admin = AdminService::new(router.clone());
    let reaper = messaging.clone().reap_expired_connections(Duration::from_millis(250));
    (messaging, admin, reaper)
}
