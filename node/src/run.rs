//! Assembles a node: store, back-end, front-end, health and reflection, served on two listeners.
//! The client listener serves `Messaging`, `Admin`, health and reflection; the peer listener
//! serves the internal `Backend` service to the other nodes of the cluster and nothing else, so
//! no client can call the back-end past the front-end's checks. The in-process back-end is plugged
//! into the front-end's router as a plain trait object; other nodes' back-ends are reached over
//! gRPC at their peer listeners.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use crate::raft::{MetaNode, NodeLogStore, NodeSettings};
use anyhow::Context as _;
use ferry_be_server::{BackendService, Broker, BrokerConfig, SystemClock};
use ferry_fe_dispatcher::{
    BackendRef, Frontend, FrontendConfig, MessagingService, Placement, Router,
};
use ferry_kernel::{ClockRef, NodeId, QueueConfig};
use ferry_proto::pb;
use ferry_store::{CommitSettings, CommitWriter, QueueStore};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tonic::transport::Server;

use crate::accept::{incoming, ConnectionSettings};
use crate::config::{Config, Limits, Setting, Storage};
use crate::status::{NodeFacts, NodeService, NodeState};

/// The node's listeners, bound by the caller (port 0 in tests).
#[derive(Debug)]
pub struct Listeners {
    /// Clients: `Messaging`, `Admin`, health, reflection.
    pub client: TcpListener,
    /// Other nodes: `Backend`.
    pub peer: TcpListener,
}

/// Where a running node serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Addresses {
    pub client: SocketAddr,
    pub peer: SocketAddr,
    /// The Prometheus endpoint, when `metrics.listen` is set.
    pub metrics: Option<SocketAddr>,
}

type MessagingServer = pb::messaging_server::MessagingServer<MessagingService>;

/// Runs a node on `listeners` until `shutdown` completes, then stops gracefully: no new calls are
/// accepted, parked receivers are answered empty, writes already submitted finish durably, and
/// calls still queued fail with UNAVAILABLE. `on_ready` is called once every queue is recovered,
/// just before the node serves. `settings` are the configuration's values with their sources,
/// as `ferry status` shows them. Fails when the node stopped by itself (its metadata group
/// halted, or its store failed a write), with the reason.
pub async fn run(
    config: Config,
    settings: Vec<Setting>,
    listeners: Listeners,
    shutdown: impl Future<Output = ()> + Send,
    on_ready: impl FnOnce(&Addresses),
) -> anyhow::Result<()> {
    let node_id = NodeId::new(config.node_id.as_str())?;
    let client_addr = listeners.client.local_addr()?;
    let peer_addr = listeners.peer.local_addr()?;
    let meta_start = meta_settings(&config, &node_id, client_addr, peer_addr)?;
    let started = std::time::Instant::now();
    let (store, writer, broker) = open_back_end(&config, &node_id).await?;
    let backend = BackendService::new(broker.clone());
    let meta = start_metadata(meta_start, &config, (&store, &writer), &broker, &backend).await?;
    let (frontend, placement_task) = start_frontend(&config, &node_id, &meta, &backend);
    let reaper = tokio::spawn(frontend.reaper());
    let (health, health_service) = tonic_health::server::health_reporter();
    health.set_serving::<MessagingServer>().await;
    let metrics_listener = bind_metrics(&config).await?;
    let metrics_addr = metrics_listener.as_ref().map(TcpListener::local_addr);
    let addresses = Addresses {
        client: client_addr,
        peer: peer_addr,
        metrics: metrics_addr.transpose()?,
    };
    // `begun` turns true when shutdown starts; the peer listener stops with the client one.
    let (begun_tx, begun) = watch::channel(false);
    let facts = NodeFacts {
        node_id: node_id.to_string(),
        started,
        data_dir: config.data_dir.clone(),
        storage: config.storage,
        settings,
        listeners: listener_reports(&addresses),
    };
    let (node_state, metrics) =
        start_status(facts, &broker, &frontend, &meta, &begun, metrics_listener);
    tracing::info!(node = %node_id, addr = %addresses.client, peer_addr = %addresses.peer, "listening");
    on_ready(&addresses);

    // Why the node stops by itself, if it does: its metadata group halted, or its store failed
    // a write.
    let halt = Arc::new(Mutex::new(None::<String>));
    let parts = Stopping {
        broker: broker.clone(),
        health,
        meta: meta.clone(),
        frontend: Arc::clone(&frontend),
    };
    let stopping = stop_when(shutdown, parts, begun_tx, Arc::clone(&halt));
    let services = Services {
        frontend: &frontend,
        meta: &meta,
        node_state,
        backend,
    };
    serve(
        &config,
        services,
        health_service,
        listeners,
        stopping,
        begun,
    )
    .await?;
    let tasks = [reaper, placement_task];
    close(tasks.into_iter().chain(metrics), &meta, &broker, writer).await;
    drop((meta, broker, frontend));
    release_store(store).await;
    let halt = halt.lock().unwrap_or_else(PoisonError::into_inner).take();
    halt.map_or(Ok(()), |reason| {
        Err(anyhow::anyhow!("the node stopped: {reason}"))
    })
}

/// The node's one database, its one group-commit writer and the back-end over them, every queue
/// recovered. The back-end and the Raft driver both write through the writer (a round's
/// records share a synced batch with the queues' writes), and the node stops it last, once
/// nothing writes any more.
async fn open_back_end(
    config: &Config,
    node_id: &NodeId,
) -> anyhow::Result<(Arc<dyn QueueStore>, CommitWriter, Broker)> {
    let started = std::time::Instant::now();
    let store = crate::data_dir::open_store(config)?;
    let writer = CommitWriter::start(Arc::clone(&store), commit_settings(config))?;
    let clock: ClockRef = Arc::new(SystemClock);
    let broker = Broker::open(
        broker_config(config, node_id.clone()),
        Arc::clone(&store),
        writer.handle(),
        clock,
    )
    .await?;
    tracing::info!(
        elapsed_ms = started.elapsed().as_millis() as u64,
        "back-end ready"
    );
    Ok((store, writer, broker))
}

/// The front-end over a router that follows the placement rebuilt from the metadata at every
/// change (the task that rebuilds it is returned), with the metadata as its catalog.
fn start_frontend(
    config: &Config,
    node_id: &NodeId,
    meta: &MetaNode,
    backend: &BackendService,
) -> (Arc<Frontend>, tokio::task::JoinHandle<()>) {
    let local: BackendRef = Arc::new(backend.clone());
    let mut builder = {
        let meta = meta.clone();
        crate::meta_link::PlacementBuilder::new(node_id.clone(), local.clone())
            .with_reachability(move |node| meta.is_reachable(node))
    };
    let first = builder
        .build(&meta.view().borrow().meta)
        .unwrap_or_else(|_| Placement::new(node_id.clone(), local));
    let (placement_tx, placement_rx) = watch::channel(Arc::new(first));
    let placement_task = tokio::spawn(crate::meta_link::follow_placement(
        meta.view(),
        builder,
        placement_tx,
    ));
    let router = Router::new(placement_rx)
        .with_catch_up(Arc::new(crate::meta_link::MetaCatchUp(meta.clone())));
    let frontend = Frontend::new(
        frontend_config(&config.limits),
        router,
        Arc::new(ferry_be_server::SystemClock),
    )
    .with_catalog(Arc::new(crate::meta_link::MetaCatalog(meta.clone())));
    (Arc::new(frontend), placement_task)
}

/// The node's own status (`ferry status`, `Node` service), and its metrics endpoint when it has
/// a listener (the task serving it, to stop at the end).
fn start_status(
    facts: NodeFacts,
    broker: &Broker,
    frontend: &Arc<Frontend>,
    meta: &MetaNode,
    begun: &watch::Receiver<bool>,
    metrics_listener: Option<TcpListener>,
) -> (NodeState, Option<tokio::task::JoinHandle<()>>) {
    let node_state = NodeState::new(facts, broker.clone(), meta.clone(), begun.clone());
    let metrics = metrics_listener.map(|l| {
        let sources = crate::metrics::Sources {
            broker: broker.clone(),
            frontend: Arc::clone(frontend),
            meta: meta.clone(),
            node: node_state.clone(),
        };
        tokio::spawn(async move {
            if let Err(e) = crate::metrics::serve(l, sources).await {
                tracing::error!(error = %e, "the metrics endpoint stopped");
            }
        })
    });
    (node_state, metrics)
}

/// What stopping the node stops, in order.
struct Stopping {
    broker: Broker,
    health: tonic_health::server::HealthReporter,
    meta: MetaNode,
    frontend: Arc<Frontend>,
}

/// Completes once the node has begun to stop: at `shutdown`, when its metadata group halts, or
/// when its store failed a write (the reason is kept in `halt`). Says so on `begun`, stops
/// taking calls, and stops the metadata group and the back-end.
///
/// A store that failed a write takes no more (the disk is behind memory), and the Raft log of
/// every group on the node goes through it: whichever path met the failure first (a queue's
/// write, or a Raft round's, which halts the metadata group), the node stops, so that its
/// shards fail over at once and an operator meets one outcome, not a node that answers
/// `NOT_SERVING` until its next Raft write stops it.
async fn stop_when(
    shutdown: impl Future<Output = ()> + Send,
    parts: Stopping,
    begun: watch::Sender<bool>,
    halt: Arc<Mutex<Option<String>>>,
) {
    let reason = tokio::select! {
        () = shutdown => None,
        reason = parts.meta.halted() => Some(if parts.broker.store_poisoned() {
            format!("{STORE_FAILED} ({reason})")
        } else {
            format!("its metadata group halted: {reason}")
        }),
        () = store_failed(&parts.broker) => Some(STORE_FAILED.to_owned()),
    };
    match reason {
        None => tracing::info!("shutting down"),
        Some(reason) => {
            tracing::error!(%reason, "the node stops serving (start it again once the cause is fixed)");
            *halt.lock().unwrap_or_else(PoisonError::into_inner) = Some(reason);
        }
    }
    let _ = begun.send(true);
    parts.health.set_not_serving::<MessagingServer>().await;
    parts
        .health
        .set_service_status("", tonic_health::ServingStatus::NotServing)
        .await;
    parts.frontend.stop_handle().stop();
    parts.meta.stop().await;
    parts.broker.shutdown().await;
}

/// Why a node whose store failed a write stops, and what to do.
const STORE_FAILED: &str = "its store failed a write (the error is in the log above: a full disk, a failing one) and takes no more: free space on the disk or replace it, then start the node again; nothing confirmed is lost";

/// What the two listeners serve.
struct Services<'a> {
    frontend: &'a Frontend,
    meta: &'a MetaNode,
    node_state: NodeState,
    backend: BackendService,
}

/// Serves clients and peers until `stopping` completes and the open calls finish, or the
/// shutdown grace period ends.
async fn serve<H: tonic_health::pb::health_server::Health>(
    config: &Config,
    services: Services<'_>,
    health_service: tonic_health::pb::health_server::HealthServer<H>,
    listeners: Listeners,
    stopping: impl Future<Output = ()> + Send,
    begun: watch::Receiver<bool>,
) -> anyhow::Result<()> {
    let Services {
        frontend,
        meta,
        node_state,
        backend,
    } = services;
    let l = &config.limits;
    let max = l.grpc_max_request_bytes;
    let (reflection, reflection_alpha) = client_reflection()?;
    let client_server = server(l, l.grpc_max_concurrent_streams)
        .add_service(
            MessagingServer::new(frontend.messaging.clone()).max_decoding_message_size(max),
        )
        .add_service(
            pb::admin_server::AdminServer::new(frontend.admin.clone())
                .max_decoding_message_size(max),
        )
        .add_service(meta.cluster_service())
        .add_service(pb::node_server::NodeServer::new(NodeService(node_state)))
        .add_service(health_service)
        .add_service(reflection)
        .add_service(reflection_alpha)
        .serve_with_incoming_shutdown(incoming(listeners.client, connection_settings(l)), stopping);
    let peer_server = server(l, l.grpc_peer_max_concurrent_streams)
        .add_service(pb::backend_server::BackendServer::new(backend).max_decoding_message_size(max))
        .add_service(meta.peer_service())
        .serve_with_incoming_shutdown(
            incoming(listeners.peer, connection_settings(l)),
            has_begun(begun.clone()),
        );
    let grace = Duration::from_millis(config.shutdown_grace_ms);
    tokio::select! {
        served = async { tokio::try_join!(client_server, peer_server) } => { served?; }
        () = async { has_begun(begun).await; tokio::time::sleep(grace).await } => {
            tracing::warn!(grace_ms = config.shutdown_grace_ms, "calls still open after the shutdown grace period; stopping anyway");
        }
    }
    Ok(())
}

/// Stops what still runs once nothing is served: the node's tasks, the metadata group, the
/// back-end, and last the writer. Returns once none of them holds the store any more, so that
/// the database is closed when `run` returns (RocksDB must be closed before the process exits,
/// and a node run again in the same process must be able to open it).
async fn close(
    tasks: impl IntoIterator<Item = tokio::task::JoinHandle<()>>,
    meta: &MetaNode,
    broker: &Broker,
    writer: CommitWriter,
) {
    for task in tasks {
        task.abort();
        // Returns once the task's future is dropped, with what it held (the store among it).
        let _ = task.await;
    }
    meta.stop().await;
    broker.shutdown().await;
    if !writer.stop().await {
        tracing::error!("the group-commit writer did not stop cleanly");
    }
    tracing::info!("stopped");
}

/// Drops the node's last handle on its store once every other is gone (at most
/// [`STORE_RELEASE_WAIT`]), so that the database is closed when `run` returns. What may hold it
/// a moment longer: a task that answered its last call and has not yet ended (an owner task, a
/// connection's).
async fn release_store(store: Arc<dyn QueueStore>) {
    let deadline = tokio::time::Instant::now() + STORE_RELEASE_WAIT;
    // Bounded by the deadline; each turn lets the other tasks run to their end.
    while Arc::strong_count(&store) > 1 && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    let others = Arc::strong_count(&store) - 1;
    if others > 0 {
        tracing::warn!(
            others,
            "the store is still held after the node stopped; the database closes when they end"
        );
    }
}

/// The longest [`release_store`] waits.
const STORE_RELEASE_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

/// Completes once shutdown has begun (or can no longer begin).
async fn has_begun(mut begun: watch::Receiver<bool>) {
    let _ = begun.wait_for(|begun| *begun).await;
}

/// How often the node looks whether its store failed a write.
const STORE_WATCH_INTERVAL: Duration = Duration::from_millis(250);

/// Completes once the store failed a write (never with a store in memory).
async fn store_failed(broker: &Broker) {
    let mut tick = tokio::time::interval(STORE_WATCH_INTERVAL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        if broker.store_poisoned() {
            return;
        }
    }
}

fn commit_settings(config: &Config) -> CommitSettings {
    CommitSettings {
        defer_max: Duration::from_micros(config.ack_sync_delay_max_us),
        ..CommitSettings::default()
    }
}

fn broker_config(config: &Config, node_id: NodeId) -> BrokerConfig {
    let l = &config.limits;
    let mut broker_config = BrokerConfig::new(node_id);
    broker_config.history_retention_ms = config.history.retention_ms;
    broker_config.history_max_steps = config.history.max_steps;
    broker_config.queue_memory_budget_bytes = config.paging.queue_memory_budget_bytes;
    broker_config.node_memory_budget_bytes = config.paging.node_memory_budget_bytes;
    broker_config.disk_free_min_bytes = config.disk_free_min_bytes;
    broker_config.queues_max = l.queues_max;
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
    broker_config
}

/// The metadata group's settings from the node's configuration and bound addresses.
fn meta_settings(
    config: &Config,
    node_id: &NodeId,
    client_addr: SocketAddr,
    peer_addr: SocketAddr,
) -> anyhow::Result<NodeSettings> {
    let c = &config.cluster;
    let advertise = |set: &str, bound: SocketAddr, field: &str| -> anyhow::Result<String> {
        if !set.is_empty() {
            anyhow::ensure!(
                ferry_cluster::is_host_port(set),
                "cluster.{field} = {set:?}: write it as host:port"
            );
            return Ok(set.to_owned());
        }
        anyhow::ensure!(
            !bound.ip().is_unspecified(),
            "the node listens on {bound}, an address other nodes cannot dial: set cluster.{field} to the address they reach it at"
        );
        Ok(bound.to_string())
    };
    let client = advertise(&c.advertise_client, client_addr, "advertise_client")?;
    let peer = advertise(&c.advertise_peer, peer_addr, "advertise_peer")?;
    let start = c.start_mode(node_id, &peer)?;
    let (tick, liveness_timeout) = c.timings()?;
    Ok(NodeSettings {
        node_id: node_id.clone(),
        client_addr: client,
        peer_addr: peer,
        start,
        tick,
        liveness_timeout,
        probe_interval: liveness_timeout / 6,
        import_marker: None,
        shard_data: None,
        incarnation: 0,
    })
}

/// Starts the metadata group on the node's store, written through its writer. A data
/// directory written before the node had cluster state (a single-node release) has its queues
/// imported into the new cluster's metadata ([`crate::data_dir::import_marker`]).
async fn start_metadata(
    mut settings: NodeSettings,
    config: &Config,
    parts: (&Arc<dyn QueueStore>, &CommitWriter),
    broker: &Broker,
    backend: &BackendService,
) -> anyhow::Result<MetaNode> {
    let (store, writer) = parts;
    let held = broker.list_queues().iter().filter(|q| !q.temporary).count();
    settings.import_marker =
        crate::data_dir::import_marker(config, store.as_ref(), held, &settings.start)?;
    let host = Arc::new(crate::meta_link::BrokerHost {
        broker: broker.clone(),
        backend: backend.clone(),
    });
    settings.shard_data = Some(Arc::clone(store));
    settings.incarnation = crate::data_dir::incarnation(store.as_ref(), &writer.handle()).await?;
    let log = NodeLogStore::new(Arc::clone(store), writer.handle());
    Ok(MetaNode::start(settings, host, Box::new(log)).await?)
}

fn frontend_config(l: &Limits) -> FrontendConfig {
    FrontendConfig {
        connection_lease_default_ms: l.connection_lease_default_ms,
        connections_max: l.connections_max,
        sessions_per_connection_max: l.sessions_per_connection_max,
        temporary_queues_per_connection_max: l.temporary_queues_per_connection_max,
        sessions_max: l.sessions_max,
        temporary_queues_max: l.temporary_queues_max,
        ..FrontendConfig::default()
    }
}

/// Reflection for the client listener, in both versions (grpcurl and other tools ask for v1 or
/// the older v1alpha). It lists only what that listener serves: never `ferry.v1.Backend`.
#[allow(clippy::type_complexity)]
fn client_reflection() -> anyhow::Result<(
    tonic_reflection::server::v1::ServerReflectionServer<
        impl tonic_reflection::server::v1::ServerReflection,
    >,
    tonic_reflection::server::v1alpha::ServerReflectionServer<
        impl tonic_reflection::server::v1alpha::ServerReflection,
    >,
)> {
    let listed = [
        pb::messaging_server::SERVICE_NAME,
        pb::admin_server::SERVICE_NAME,
        pb::cluster_server::SERVICE_NAME,
        pb::node_server::SERVICE_NAME,
        tonic_health::pb::health_server::SERVICE_NAME,
    ];
    let builder = || {
        listed.iter().fold(
            tonic_reflection::server::Builder::configure()
                .register_encoded_file_descriptor_set(pb::FILE_DESCRIPTOR_SET)
                .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET),
            |builder, name| builder.with_service_name(*name),
        )
    };
    let v1 = builder()
        .with_service_name(tonic_reflection::pb::v1::server_reflection_server::SERVICE_NAME)
        .build_v1()?;
    let v1alpha = builder()
        .with_service_name(tonic_reflection::pb::v1alpha::server_reflection_server::SERVICE_NAME)
        .build_v1alpha()?;
    Ok((v1, v1alpha))
}

/// A gRPC server with the node's connection limits: at most `max_concurrent_streams` calls open
/// per connection (tonic sets none, which overrides hyper's default), HTTP/2 keepalive pings
/// that close a connection whose peer stopped answering, and an optional maximum age.
fn server(l: &Limits, max_concurrent_streams: u32) -> Server {
    let ms = Duration::from_millis;
    let keepalive_interval =
        (l.grpc_keepalive_interval_ms > 0).then(|| ms(l.grpc_keepalive_interval_ms));
    let builder = Server::builder()
        .max_concurrent_streams(max_concurrent_streams)
        .http2_keepalive_interval(keepalive_interval)
        .http2_keepalive_timeout(Some(ms(l.grpc_keepalive_timeout_ms)));
    match l.grpc_connection_age_max_ms {
        0 => builder,
        age_ms => builder.max_connection_age(ms(age_ms)),
    }
}

fn connection_settings(l: &Limits) -> ConnectionSettings {
    ConnectionSettings {
        handshake_timeout: Duration::from_millis(l.grpc_handshake_timeout_ms),
        tcp_keepalive_idle: (l.tcp_keepalive_idle_ms > 0)
            .then(|| Duration::from_millis(l.tcp_keepalive_idle_ms)),
    }
}

/// Binds the metrics and health endpoint where the configuration says (see
/// [`Config::metrics_listen`]); `None` when it is off.
async fn bind_metrics(config: &Config) -> anyhow::Result<Option<TcpListener>> {
    let Some(addr) = config.metrics_listen().map_err(anyhow::Error::msg)? else {
        return Ok(None);
    };
    let l = TcpListener::bind(&addr).await.with_context(|| {
        format!(
            "cannot serve metrics on {addr} (another server there? set metrics.listen to another HOST:PORT, or metrics.enabled = false)"
        )
    })?;
    tracing::info!(addr = %l.local_addr()?, "serving /metrics, /healthz and /readyz");
    Ok(Some(l))
}

/// The node's listeners as `ferry status` shows them.
fn listener_reports(a: &Addresses) -> Vec<pb::Listener> {
    let one = |name: &str, addr: SocketAddr, serves: &str| pb::Listener {
        name: name.to_owned(),
        address: addr.to_string(),
        serves: serves.to_owned(),
    };
    let mut all = vec![
        one(
            "client",
            a.client,
            "clients: Messaging, Admin, Cluster, Node, gRPC health, reflection",
        ),
        one("peer", a.peer, "other nodes only: Backend, Peer"),
    ];
    if let Some(m) = a.metrics {
        all.push(one("metrics", m, "HTTP: /metrics, /healthz, /readyz"));
    }
    all
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
