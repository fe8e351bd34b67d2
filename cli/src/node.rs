//! Assembles a node: store, back-end, front-end, health and reflection services on one listener.
//! The in-process back-end is plugged into the front-end's router as a plain trait object; other
//! nodes' back-ends are reached over gRPC.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use ferry_be_server::{BackendService, Broker, BrokerConfig};
use ferry_fe_dispatcher::{BackendRef, Frontend, FrontendConfig, RemoteBackend, Router};
use ferry_kernel::{NodeId, QueueConfig};
use ferry_proto::pb;
use ferry_store::{MemoryStore, QueueStore, RocksStore};
use tokio::net::TcpListener;
use tokio_stream::wrappers::TcpListenerStream;
use tonic::transport::Server;

use crate::config::{Config, Storage};

/// Runs a node on `listener` until `shutdown` completes, then stops gracefully: no new calls are
/// accepted, parked receivers are answered empty, writes already submitted finish durably, and
/// calls still queued fail with UNAVAILABLE. `on_ready` is called once every queue is recovered,
/// just before the node serves.
pub async fn run(
    config: Config,
    listener: TcpListener,
    shutdown: impl Future<Output = ()> + Send,
    on_ready: impl FnOnce(std::net::SocketAddr, Option<std::net::SocketAddr>),
) -> anyhow::Result<()> {
    let node_id = NodeId::new(config.node_id.as_str())?;
    let membership = config.cluster.validate(&node_id)?;
    let store: Arc<dyn QueueStore> = match config.storage {
        Storage::Rocksdb => {
            std::fs::create_dir_all(&config.data_dir).with_context(|| {
                format!("cannot create data directory {}", config.data_dir.display())
            })?;
            let dir = config.data_dir.join("queues");
            Arc::new(RocksStore::open(&dir).with_context(|| {
                format!(
                    "cannot open the queue store in {} (is another ferry server using it?)",
                    dir.display()
                )
            })?)
        }
        Storage::Memory => Arc::new(MemoryStore::new()),
    };
    let l = &config.limits;
    let mut broker_config = BrokerConfig::new(node_id.clone());
    broker_config.history_retention_ms = config.history.retention_ms;
    broker_config.history_max_steps = config.history.max_steps;
    broker_config.queue_memory_budget_bytes = config.paging.queue_memory_budget_bytes;
    broker_config.node_memory_budget_bytes = config.paging.node_memory_budget_bytes;
    broker_config.disk_free_min_bytes = config.disk_free_min_bytes;
    broker_config.commit_defer_max = std::time::Duration::from_micros(config.ack_sync_delay_max_us);
    broker_config.disk_guard_dir = match config.storage {
        Storage::Rocksdb => Some(config.data_dir.clone()),
        Storage::Memory => None,
    };
    broker_config.queue_defaults = QueueConfig {
        default_lease_ms: l.delivery_lease_default_ms,
        lease_max_ms: l.delivery_lease_max_ms,
        max_message_size_bytes: l.max_message_size_bytes,
        receive_batch_max: l.receive_batch_max,
        waiters_max: l.waiters_per_queue_max,
        ..QueueConfig::default()
    };
    let started = std::time::Instant::now();
    let broker = Broker::open(broker_config, store).await?;
    tracing::info!(
        elapsed_ms = started.elapsed().as_millis() as u64,
        "back-end ready"
    );

    let backend = BackendService::new(broker.clone());
    let local: BackendRef = Arc::new(backend.clone());
    let mut router = Router::new(node_id.clone(), local);
    for (node, url) in &membership.nodes {
        let remote =
            RemoteBackend::new(url).with_context(|| format!("cluster.nodes.{node} = {url:?}"))?;
        router = router.with_node(node.clone(), Arc::new(remote));
    }
    for (queue, node) in membership.placement {
        router = router.with_placement(queue, node);
    }
    let fe_config = FrontendConfig {
        connection_lease_default_ms: l.connection_lease_default_ms,
        connections_max: l.connections_max,
        sessions_per_connection_max: l.sessions_per_connection_max,
        temporary_queues_per_connection_max: l.temporary_queues_per_connection_max,
        ..FrontendConfig::default()
    };
    let frontend = Arc::new(Frontend::new(fe_config, router));
    let reaper = tokio::spawn(frontend.reaper());

    let (health, health_service) = tonic_health::server::health_reporter();
    health.set_serving::<pb::messaging_server::MessagingServer<ferry_fe_dispatcher::MessagingService>>().await;
    // Reflection in both versions: grpcurl and other tools ask for v1 or the older v1alpha.
    let reflection = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(pb::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .build_v1()?;
    let reflection_alpha = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(pb::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .build_v1alpha()?;

    let max = l.grpc_max_request_bytes;
    let addr = listener.local_addr()?;
    let metrics = if config.metrics.listen.is_empty() {
        None
    } else {
        let l = TcpListener::bind(&config.metrics.listen)
            .await
            .with_context(|| {
                format!(
                    "metrics.listen = {:?}: cannot listen there (another server? pick another port)",
                    config.metrics.listen
                )
            })?;
        let maddr = l.local_addr()?;
        let sources = crate::metrics::Sources {
            broker: broker.clone(),
            frontend: frontend.clone(),
        };
        tracing::info!(addr = %maddr, "serving metrics at /metrics");
        Some((maddr, tokio::spawn(crate::metrics::serve(l, sources))))
    };
    tracing::info!(node = %node_id, %addr, "listening");
    on_ready(addr, metrics.as_ref().map(|(a, _)| *a));
    let begun = Arc::new(tokio::sync::Notify::new());
    let stopping = {
        let (broker, health, begun) = (broker.clone(), health.clone(), begun.clone());
        let stop_frontend = frontend.stop_handle();
        async move {
            shutdown.await;
            tracing::info!("shutting down");
            begun.notify_one();
            health.set_not_serving::<pb::messaging_server::MessagingServer<ferry_fe_dispatcher::MessagingService>>().await;
            stop_frontend.stop();
            broker.shutdown().await;
        }
    };
    let server = Server::builder()
        .add_service(
            pb::messaging_server::MessagingServer::new(frontend.messaging.clone())
                .max_decoding_message_size(max),
        )
        .add_service(
            pb::admin_server::AdminServer::new(frontend.admin.clone())
                .max_decoding_message_size(max),
        )
        .add_service(pb::backend_server::BackendServer::new(backend).max_decoding_message_size(max))
        .add_service(health_service)
        .add_service(reflection)
        .add_service(reflection_alpha)
        .serve_with_incoming_shutdown(incoming(listener), stopping);
    let grace = Duration::from_millis(config.shutdown_grace_ms);
    tokio::select! {
        served = server => served?,
        () = async { begun.notified().await; tokio::time::sleep(grace).await } => {
            tracing::warn!(grace_ms = config.shutdown_grace_ms, "calls still open after the shutdown grace period; stopping anyway");
        }
    }
    reaper.abort();
    if let Some((_, task)) = metrics {
        task.abort();
    }
    broker.shutdown().await;
    tracing::info!("stopped");
    Ok(())
}

/// Completes on SIGTERM or ctrl-c.
pub async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {},
        () = term => {},
    }
}

/// Accepted connections with Nagle's algorithm off: small answers (a confirm, an ack) go out at
/// once instead of waiting up to 40 ms for the peer's delayed ACK. (`Server::tcp_nodelay` only
/// applies to listeners tonic binds itself.)
fn incoming(
    listener: tokio::net::TcpListener,
) -> impl tokio_stream::Stream<Item = std::io::Result<tokio::net::TcpStream>> {
    use tokio_stream::StreamExt as _;
    TcpListenerStream::new(listener).map(|accepted| {
        let stream = accepted?;
        stream.set_nodelay(true)?;
        Ok(stream)
    })
}
