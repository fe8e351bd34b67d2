//! The node's HTTP endpoint: `GET /metrics` (below), `GET /healthz` (200 while the process
//! serves HTTP at all: for a liveness probe) and `GET /readyz` (200 when the node serves clients,
//! else 503 with the reasons, one a line: for a readiness probe or a load balancer; see
//! [`crate::status`]).
//!
//! `GET /metrics` in the Prometheus text format. Values are read at scrape time from the queues
//! (their statistics) and the front-end (connections, sessions); names follow what operators
//! know from RabbitMQ's exporter: messages ready / unacked, consumers, published / delivered /
//! acknowledged / redelivered totals. Paging shows per queue (messages paged out, bytes in
//! memory and the queue's budget) and per node (bytes in memory over the node's budget), with the
//! disk guard's reading of the data directory's free space.

use std::sync::atomic::AtomicU64;
use std::sync::Arc;

use axum::http::header::CONTENT_TYPE;
use axum::response::IntoResponse;
use ferry_be_server::Broker;
use ferry_fe_dispatcher::Frontend;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct QueueLabel {
    queue: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct AlarmLabel {
    alarm: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabel {
    queue: String,
    reason: String,
}

/// What a scrape reads.
#[derive(Debug, Clone)]
pub struct Sources {
    pub broker: Broker,
    pub frontend: Arc<Frontend>,
    pub meta: crate::raft::MetaNode,
    pub node: crate::status::NodeState,
}

const TEXT: &str = "text/plain; charset=utf-8";

/// Serves `/metrics`, `/healthz` and `/readyz` on `listener` until the task is dropped.
pub async fn serve(listener: tokio::net::TcpListener, sources: Sources) -> std::io::Result<()> {
    let node = sources.node.clone();
    let app = axum::Router::new()
        .route(
            "/metrics",
            axum::routing::get(move || {
                let sources = sources.clone();
                async move {
                    let body = render(&sources).await;
                    (
                        [(
                            CONTENT_TYPE,
                            "application/openmetrics-text; version=1.0.0; charset=utf-8",
                        )],
                        body,
                    )
                        .into_response()
                }
            }),
        )
        .route(
            "/healthz",
            axum::routing::get(|| async { ([(CONTENT_TYPE, TEXT)], "ok\n").into_response() }),
        )
        .route(
            "/readyz",
            axum::routing::get(move || {
                let node = node.clone();
                async move { readyz(&node).into_response() }
            }),
        );
    axum::serve(listener, app).await
}

/// 200 `ready`, or 503 `not ready` and a line `- reason` for each reason.
fn readyz(node: &crate::status::NodeState) -> impl IntoResponse {
    use axum::http::StatusCode;
    let why = node.not_ready();
    if why.is_empty() {
        return (StatusCode::OK, [(CONTENT_TYPE, TEXT)], "ready\n".to_owned());
    }
    let mut body = "not ready\n".to_owned();
    for reason in why {
        body.push_str("- ");
        body.push_str(&reason);
        body.push('\n');
    }
    (
        StatusCode::SERVICE_UNAVAILABLE,
        [(CONTENT_TYPE, TEXT)],
        body,
    )
}

fn gauge_family(registry: &mut Registry, name: &str, help: &str) -> Family<QueueLabel, Gauge> {
    let f = Family::<QueueLabel, Gauge>::default();
    registry.register(name, help, f.clone());
    f
}

fn counter_family(registry: &mut Registry, name: &str, help: &str) -> Family<QueueLabel, Counter> {
    let f = Family::<QueueLabel, Counter>::default();
    registry.register(name, help, f.clone());
    f
}

fn as_i64(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

/// The metadata group (Raft group 0) on this node, and routing.
fn register_cluster(r: &mut Registry, s: &Sources) {
    let m = s.meta.metrics();
    for (name, help, value) in [
        (
            "raft_term",
            "Term of the metadata group known to this node",
            m.term,
        ),
        (
            "raft_leader",
            "1 if this node leads the metadata group",
            u64::from(m.leader),
        ),
        (
            "raft_commit_index",
            "Highest metadata log index known committed",
            m.commit_index,
        ),
        (
            "raft_applied_index",
            "Highest metadata log index applied on this node",
            m.applied_index,
        ),
        (
            "raft_log_entries",
            "Entries in the metadata log since its last compaction",
            m.log_entries,
        ),
        (
            "cluster_peers_down",
            "Other nodes not heard from within cluster.liveness_timeout_ms",
            m.peers_down,
        ),
    ] {
        node_gauge(r, name, help, value);
    }
    for (name, help, value) in [
        ("raft_leader_changes", "Changes of the metadata leader seen by this node", m.leader_changes_total),
        ("raft_proposals", "Metadata commands proposed through this node and applied", m.proposals_total),
        ("raft_proposals_failed", "Metadata commands proposed through this node that failed", m.proposals_failed_total),
        ("shard_snapshots_sent", "Queue shard snapshots (a shard's data, for a replica too far behind its leader's log) this node sent", m.shard_snapshots_sent_total),
        ("shard_snapshots_installed", "Queue shard snapshots this node installed in place of what it held of the shard", m.shard_snapshots_installed_total),
        (
            "raft_proposal_milliseconds",
            "Milliseconds from proposal to applied on this node, summed (divide by raft_proposals for the mean)",
            m.proposal_ms_total,
        ),
        (
            "routing_redirects",
            "Calls routed again after a back-end answered that it no longer owns the queue",
            s.frontend.routing_redirects_total(),
        ),
    ] {
        let c = Counter::<u64, AtomicU64>::default();
        c.inc_by(value);
        r.register(name, help, c);
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ShardLabel {
    shard: String,
}

/// The queue shards whose Raft groups run on this node (it holds one of their replicas): one
/// sample per shard of each.
fn register_shards(r: &mut Registry, shards: &[crate::raft::LocalShard]) {
    type Read = fn(&crate::raft::LocalShard) -> u64;
    let gauges: [(&str, &str, Read); 7] = [
        ("shard_leader", "1 if this node leads the queue shard's Raft group", |l| {
            u64::from(l.leading)
        }),
        ("shard_term", "Term of the queue shard's Raft group known to this node", |l| l.term),
        (
            "shard_commit_index",
            "Highest index of the queue shard's log known committed on this node",
            |l| l.commit_index,
        ),
        (
            "shard_applied_index",
            "Highest index of the queue shard's log applied on this node",
            |l| l.applied_index,
        ),
        (
            "shard_last_index",
            "Last index of the queue shard's log on this node",
            |l| l.last_index,
        ),
        (
            "shard_log_entries",
            "Entries in the queue shard's log on this node since its last compaction (compacted every 1000 applied entries)",
            |l| (l.last_index + 1).saturating_sub(l.first_index),
        ),
        (
            "shard_replica_lag_entries",
            "On the shard's leader only: log entries the least caught-up other replica lacks (the leader's last index minus the smallest match index)",
            |l| {
                let matched = l.match_indexes.iter().map(|(_, i)| *i).min();
                matched.map_or(0, |m| l.last_index.saturating_sub(m))
            },
        ),
    ];
    for (name, help, read) in gauges {
        let family = Family::<ShardLabel, Gauge>::default();
        r.register(name, help, family.clone());
        for l in shards {
            if name == "shard_replica_lag_entries" && !l.leading {
                continue;
            }
            let label = ShardLabel {
                shard: l.shard.0.to_string(),
            };
            family.get_or_create(&label).set(as_i64(read(l)));
        }
    }
}

/// Registers one gauge without labels.
fn node_gauge(registry: &mut Registry, name: &str, help: &str, v: u64) {
    let g = Gauge::<i64>::default();
    g.set(as_i64(v));
    registry.register(name, help, g);
}

/// Node-wide paging and disk numbers; `memory_bytes` is the sum over its queues.
fn register_node_memory(r: &mut Registry, broker: &Broker, memory_bytes: u64) {
    node_gauge(
        r,
        "node_memory_bytes",
        "Bytes of messages all queues of this node hold in memory",
        memory_bytes,
    );
    node_gauge(
        r,
        "node_memory_budget_bytes",
        "Bytes of messages the durable queues of this node may hold in memory together (paging.node_memory_budget_bytes)",
        broker.node_memory_budget_bytes(),
    );
    node_gauge(
        r,
        "store_poisoned",
        "1 when the store failed a write and refuses every write until the node restarts (the node is NOT_SERVING; see the log)",
        u64::from(broker.store_poisoned()),
    );
    if let Some((free, min)) = broker.disk_free() {
        // u64::MAX: the disk was never read successfully; no sample rather than a wrong one.
        if free != u64::MAX {
            node_gauge(
                r,
                "disk_free_bytes",
                "Free bytes on the disk holding the data directory, as the disk guard last read them",
                free,
            );
        }
        node_gauge(
            r,
            "disk_free_min_bytes",
            "Sends are refused while disk_free_bytes is under this (disk_free_min_bytes)",
            min,
        );
    }
}

/// A histogram read from the store's lock-free buckets at scrape time.
#[derive(Debug)]
struct Snapshot {
    name: &'static str,
    help: &'static str,
    /// Divides bucket bounds and the sum (1e6: µs → s; dividing keeps 100 µs as 0.0001).
    units_per_exported: f64,
    snapshot: ferry_store::BucketsSnapshot,
}

impl prometheus_client::collector::Collector for Snapshot {
    fn encode(
        &self,
        mut encoder: prometheus_client::encoding::DescriptorEncoder,
    ) -> Result<(), std::fmt::Error> {
        // The snapshot counts cumulatively; the encoder wants each bucket's own count (it
        // accumulates them itself).
        let mut below = 0;
        let buckets: Vec<(f64, u64)> = self
            .snapshot
            .buckets
            .iter()
            .map(|&(bound, cumulative)| {
                let b = if bound == u64::MAX {
                    // prometheus-client writes f64::MAX as `+Inf`, as OpenMetrics wants (INFINITY
                    // came out as `inf`, which strict parsers refuse).
                    f64::MAX
                } else {
                    bound as f64 / self.units_per_exported
                };
                let own = cumulative.saturating_sub(below);
                below = cumulative;
                (b, own)
            })
            .collect();
        let mut m = encoder.encode_descriptor(
            self.name,
            self.help,
            None,
            prometheus_client::metrics::MetricType::Histogram,
        )?;
        m.encode_histogram::<prometheus_client::encoding::NoLabelSet>(
            self.snapshot.sum as f64 / self.units_per_exported,
            self.snapshot.count,
            &buckets,
            None,
        )
    }
}

/// The text of one scrape.
pub async fn render(s: &Sources) -> String {
    let mut r = Registry::with_prefix("ferry");
    let ready = gauge_family(
        &mut r,
        "queue_messages_ready",
        "Messages ready for delivery",
    );
    let unacked = gauge_family(
        &mut r,
        "queue_messages_unacked",
        "Messages delivered and not yet acknowledged (leased)",
    );
    let scheduled = gauge_family(
        &mut r,
        "queue_messages_scheduled",
        "Messages waiting for their delivery delay or redelivery delay",
    );
    let staged = gauge_family(
        &mut r,
        "queue_messages_staged",
        "Sends of transacted sessions not yet committed",
    );
    let bytes = gauge_family(&mut r, "queue_bytes", "Bytes of the messages in the queue");
    let consumers = gauge_family(&mut r, "queue_consumers", "Receivers waiting on the queue");
    let paged_out = gauge_family(
        &mut r,
        "queue_paged_out_messages",
        "Messages kept in the store only, read back as consumers get near them (counted in ready)",
    );
    let memory = gauge_family(
        &mut r,
        "queue_memory_bytes",
        "Bytes of the queue's messages held in memory",
    );
    let budget = gauge_family(
        &mut r,
        "queue_memory_budget_bytes",
        "Bytes of messages the queue keeps in memory at most (absent: no budget, a temporary queue)",
    );
    let oldest = gauge_family(
        &mut r,
        "queue_oldest_ready_message_age_seconds",
        "Age of the oldest ready message (0 when none is ready)",
    );
    let published = counter_family(&mut r, "queue_messages_published", "Messages sent");
    let delivered = counter_family(&mut r, "queue_messages_delivered", "Deliveries made");
    let acked = counter_family(&mut r, "queue_messages_acked", "Messages acknowledged");
    let redelivered = counter_family(
        &mut r,
        "queue_messages_redelivered",
        "Deliveries flagged redelivered",
    );
    let expired = counter_family(&mut r, "queue_messages_expired", "Messages that expired");
    let dead = Family::<ReasonLabel, Counter>::default();
    r.register(
        "queue_messages_dead_lettered",
        "Messages moved to the dead-letter target (or discarded), by reason",
        dead.clone(),
    );
    let now = ferry_be_server::now_ms();
    let mut memory_total = 0u64;
    for q in s.broker.list_queues() {
        let Ok(st) = s.broker.stats(&q.name).await else {
            continue; // deleted meanwhile
        };
        let l = QueueLabel {
            queue: q.name.to_string(),
        };
        ready.get_or_create(&l).set(as_i64(st.ready));
        unacked.get_or_create(&l).set(as_i64(st.leased));
        scheduled.get_or_create(&l).set(as_i64(st.scheduled));
        staged.get_or_create(&l).set(as_i64(st.staged));
        bytes.get_or_create(&l).set(as_i64(st.bytes));
        consumers.get_or_create(&l).set(as_i64(st.waiters));
        paged_out.get_or_create(&l).set(as_i64(st.paged_out));
        memory.get_or_create(&l).set(as_i64(st.resident_bytes));
        memory_total = memory_total.saturating_add(st.resident_bytes);
        if st.memory_budget_bytes != u64::MAX {
            budget.get_or_create(&l).set(as_i64(st.memory_budget_bytes));
        }
        let age_s = st
            .oldest_ready_timestamp_ms
            .map_or(0, |t| now.saturating_sub(t) / 1_000);
        oldest.get_or_create(&l).set(as_i64(age_s));
        published.get_or_create(&l).inc_by(st.sent_total);
        delivered.get_or_create(&l).inc_by(st.delivered_total);
        acked.get_or_create(&l).inc_by(st.acked_total);
        redelivered.get_or_create(&l).inc_by(st.redelivered_total);
        expired.get_or_create(&l).inc_by(st.expired_total);
        for (reason, n) in [
            ("expired", st.expired_total),
            ("max-deliveries", st.dead_lettered.max_deliveries),
            ("rejected", st.dead_lettered.rejected),
        ] {
            dead.get_or_create(&ReasonLabel {
                queue: q.name.to_string(),
                reason: reason.into(),
            })
            .inc_by(n);
        }
    }
    register_node_memory(&mut r, &s.broker, memory_total);
    let (connections, sessions) = s.frontend.client_counts();
    node_gauge(
        &mut r,
        "connections",
        "Open client connections on this node",
        connections as u64,
    );
    node_gauge(
        &mut r,
        "sessions",
        "Open sessions on this node",
        sessions as u64,
    );
    let commit = s.broker.commit_stats();
    for (name, help, value) in [
        (
            "group_commit_writes",
            "Synced writes made by group commit (log syncs for deferred acknowledgements included)",
            commit.writes,
        ),
        (
            "group_commit_submissions",
            "Submissions carried by those writes (submissions / writes = mean batch)",
            commit.submissions,
        ),
        (
            "group_commit_deferred",
            "Acknowledgement deletes written without a sync of their own, made durable by the next synced write",
            commit.deferred,
        ),
        (
            "group_commit_deferred_syncs",
            "Log syncs made for deferred acknowledgements alone (mostly: no synced write came within ack_sync_delay_max_us)",
            commit.deferred_syncs,
        ),
        (
            "group_commit_replayable",
            "Raft rounds that only applied committed entries, written without a sync of their own (replayed from the synced log after a power loss)",
            commit.replayable,
        ),
    ] {
        let c = Counter::<u64, AtomicU64>::default();
        c.inc_by(value);
        r.register(name, help, c);
    }
    register_cluster(&mut r, s);
    // No sample when the driver does not answer (busy or stopping), rather than a wrong one.
    if let Ok(shards) = s.meta.local_shards().await {
        register_shards(&mut r, &shards);
    }
    register_node(&mut r, &s.node).await;
    let (write_micros, batch) = s.broker.commit_histograms();
    r.register_collector(Box::new(Snapshot {
        name: "group_commit_write_seconds",
        help: "Time of each synced write (the fsync included)",
        units_per_exported: 1e6,
        snapshot: write_micros,
    }));
    r.register_collector(Box::new(Snapshot {
        name: "shard_commit_seconds",
        help: "Time from a replicated write's proposal to its queue shard to its confirmation on the leader (committed on a majority of the replicas' disks and applied there): what replication adds to a send or an ack",
        units_per_exported: 1e6,
        snapshot: s.broker.shard_commit_histogram(),
    }));
    r.register_collector(Box::new(Snapshot {
        name: "group_commit_batch_submissions",
        help: "Submissions carried by each synced write",
        units_per_exported: 1.0,
        snapshot: batch,
    }));
    let process = process_registry();
    let mut out = String::new();
    let encoded = prometheus_client::encoding::text::encode_registry(&mut out, &r)
        .and_then(|()| prometheus_client::encoding::text::encode_registry(&mut out, &process))
        .and_then(|()| prometheus_client::encoding::text::encode_eof(&mut out));
    if encoded.is_err() {
        return "# encoding failed\n".into();
    }
    out
}

/// The node as a whole: build, readiness, alarms, the store's size on disk.
async fn register_node(r: &mut Registry, node: &crate::status::NodeState) {
    r.register(
        "build",
        "The ferry release this node runs",
        prometheus_client::metrics::info::Info::new(vec![
            ("version", crate::status::VERSION.to_owned()),
            ("node", node.node_id().to_owned()),
        ]),
    );
    node_gauge(
        r,
        "ready",
        "1 when the node serves clients (GET /readyz answers 200), else 0",
        u64::from(node.not_ready().is_empty()),
    );
    let alarms = Family::<AlarmLabel, Gauge>::default();
    r.register(
        "alarm",
        "1 while the alarm is raised: disk_free_low (sends refused: the disk holding the data directory has less free space than disk_free_min_bytes), store_poisoned (a write failed; writes refused until restart)",
        alarms.clone(),
    );
    let raised = node.alarms();
    for alarm in crate::status::ALARMS {
        alarms
            .get_or_create(&AlarmLabel {
                alarm: alarm.to_owned(),
            })
            .set(i64::from(raised.contains(&alarm)));
    }
    if let Some(bytes) = node.store_size_bytes().await {
        node_gauge(
            r,
            "store_size_bytes",
            "Bytes of the files under the data directory (queues and the Raft log)",
            bytes,
        );
    }
    let uptime = Gauge::<f64, AtomicU64>::default();
    uptime.set(node.uptime_seconds());
    r.register("uptime_seconds", "Seconds since the node started", uptime);
}

/// The standard `process_*` metrics, without the `ferry_` prefix (the names every Prometheus
/// client library exports, which dashboards expect); none where `/proc` cannot be read.
fn process_registry() -> Registry {
    let mut r = Registry::default();
    let Some(p) = crate::process::read() else {
        return r;
    };
    let cpu = Counter::<f64, AtomicU64>::default();
    cpu.inc_by(p.cpu_seconds);
    r.register(
        "process_cpu_seconds",
        "User and system CPU time spent, in seconds",
        cpu,
    );
    let start = Gauge::<f64, AtomicU64>::default();
    start.set(p.start_time_seconds);
    r.register(
        "process_start_time_seconds",
        "When the process started, in seconds since the Unix epoch",
        start,
    );
    for (name, help, value) in [
        (
            "process_resident_memory_bytes",
            "Resident memory size in bytes",
            Some(p.resident_memory_bytes),
        ),
        (
            "process_virtual_memory_bytes",
            "Virtual memory size in bytes",
            Some(p.virtual_memory_bytes),
        ),
        (
            "process_open_fds",
            "Open file descriptors",
            Some(p.open_fds),
        ),
        (
            "process_max_fds",
            "The most file descriptors the process may open (soft limit)",
            p.max_fds,
        ),
    ] {
        if let Some(v) = value {
            node_gauge(&mut r, name, help, v);
        }
    }
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_shard_run_here_has_its_leader_term_and_indexes() {
        use crate::raft::LocalShard;
        use ferry_be_server::ShardId;
        use ferry_cluster::meta::RaftId;
        let leading = LocalShard {
            shard: ShardId(3),
            leading: true,
            term: 5,
            leader: Some(RaftId(1)),
            applied_index: 40,
            last_index: 42,
            first_index: 31,
            commit_index: 41,
            match_indexes: vec![(RaftId(2), 42), (RaftId(3), 30)],
            voters: vec![RaftId(1), RaftId(2), RaftId(3)],
            learners: vec![],
        };
        let following = LocalShard {
            shard: ShardId(4),
            leading: false,
            leader: Some(RaftId(2)),
            match_indexes: vec![],
            ..leading.clone()
        };
        let mut r = Registry::with_prefix("ferry");
        register_shards(&mut r, &[leading, following]);
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &r).unwrap();
        for line in [
            "ferry_shard_leader{shard=\"3\"} 1",
            "ferry_shard_leader{shard=\"4\"} 0",
            "ferry_shard_term{shard=\"3\"} 5",
            "ferry_shard_commit_index{shard=\"3\"} 41",
            "ferry_shard_applied_index{shard=\"4\"} 40",
            "ferry_shard_last_index{shard=\"4\"} 42",
            "ferry_shard_replica_lag_entries{shard=\"3\"} 12",
            "ferry_shard_log_entries{shard=\"3\"} 12",
        ] {
            assert!(out.lines().any(|l| l == line), "no {line} in {out}");
        }
        assert!(
            !out.contains("ferry_shard_replica_lag_entries{shard=\"4\"}"),
            "a follower knows no lag: {out}"
        );
    }

    #[test]
    fn a_histogram_is_exported_with_the_cumulative_counts_it_was_read_with() {
        let b = ferry_store::Buckets::new(&[100, 1_000]);
        for v in [50, 60, 500, 5_000] {
            b.observe(v);
        }
        let mut r = Registry::with_prefix("ferry");
        r.register_collector(Box::new(Snapshot {
            name: "write_seconds",
            help: "test",
            units_per_exported: 1e6,
            snapshot: b.snapshot(),
        }));
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &r).unwrap();
        let bucket = |le: &str| {
            let prefix = format!("ferry_write_seconds_bucket{{le=\"{le}\"}} ");
            out.lines()
                .find_map(|l| l.strip_prefix(prefix.as_str()))
                .unwrap_or_else(|| panic!("no bucket {le} in {out}"))
                .to_string()
        };
        assert_eq!(bucket("0.0001"), "2");
        assert_eq!(bucket("0.001"), "3");
        assert_eq!(bucket("+Inf"), "4");
        assert!(out.contains("ferry_write_seconds_count 4"), "{out}");
    }
}
