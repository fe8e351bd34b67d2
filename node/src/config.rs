//! A node's configuration: defaults, then a TOML file, then `FERRY_` environment variables
//! (`__` separates sections: `FERRY_LIMITS__MAX_MESSAGE_SIZE_BYTES`), then command-line flags.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use ferry_cluster::ClusterConfig;
use figment::providers::{Env, Format, Serialized, Toml};
use figment::Figment;
use serde::{Deserialize, Serialize};

/// `FERRY_` variables that belong to the command line, not to a node's configuration
/// (`FERRY_SERVER`, `FERRY_OUTPUT`, `FERRY_CONFIG`): the node skips them (lower-cased, as
/// figment reads them), so one environment can serve both.
pub const CLIENT_VARIABLES: &[&str] = &["server", "output", "config"];

/// The port a node listens on, and clients dial, by default.
pub const DEFAULT_PORT: u16 = 7400;

/// The port a node serves other nodes on (`peer_listen`) by default.
pub const DEFAULT_PEER_PORT: u16 = 7410;

/// With `metrics.listen` unset, metrics (and `/healthz`, `/readyz`) are served on the host of
/// `listen` at its port plus this: 7420 for the default 7400, 7421 for a node on 7401, so nodes
/// side by side on one host do not collide; a node on port 0 gets a free port for them too.
pub const METRICS_PORT_OFFSET: u16 = 20;

/// The metrics port of a node on the default port.
pub const DEFAULT_METRICS_PORT: u16 = DEFAULT_PORT + METRICS_PORT_OFFSET;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Storage {
    /// Durable: RocksDB under `data_dir`.
    Rocksdb,
    /// Nothing survives a restart (tests, demos).
    Memory,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    Text,
    Json,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LogConfig {
    /// A `RUST_LOG`-style filter; `RUST_LOG` itself wins when set.
    pub filter: String,
    pub format: LogFormat,
}

/// Limits and defaults, each with its unit last.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Limits {
    pub max_message_size_bytes: u64,
    /// Largest gRPC request a node accepts (a batch of messages).
    pub grpc_max_request_bytes: usize,
    pub receive_batch_max: u32,
    pub waiters_per_queue_max: usize,
    pub delivery_lease_default_ms: u64,
    pub delivery_lease_max_ms: u64,
    pub connection_lease_default_ms: u64,
    pub connections_max: usize,
    pub sessions_per_connection_max: usize,
    pub temporary_queues_per_connection_max: usize,
    /// Sessions this node holds at once, over all its connections.
    pub sessions_max: usize,
    /// Temporary queues this node holds at once, over all its connections.
    pub temporary_queues_max: usize,
    /// Queues this node's back-end owns at once (dead-letter and temporary queues included).
    pub queues_max: usize,
    /// Streams (calls in progress) one client connection may have open at once: HTTP/2's
    /// `SETTINGS_MAX_CONCURRENT_STREAMS`. A client past it waits for a stream to end.
    pub grpc_max_concurrent_streams: u32,
    /// The same for one connection to the peer listener. A node forwards every call it routes to
    /// another node over one connection, parked receives included, so this is larger.
    pub grpc_peer_max_concurrent_streams: u32,
    /// A TCP connection that has not sent the HTTP/2 connection preface this long after it was
    /// accepted is closed.
    pub grpc_handshake_timeout_ms: u64,
    /// How often the node pings each connection (HTTP/2 PING); 0: never.
    pub grpc_keepalive_interval_ms: u64,
    /// A connection that leaves a ping unanswered this long is closed.
    pub grpc_keepalive_timeout_ms: u64,
    /// A connection older than this is asked to go away (HTTP/2 GOAWAY): it takes no new calls,
    /// the calls on it finish, and the client opens a new one. 0: connections live as long as
    /// they are used.
    pub grpc_connection_age_max_ms: u64,
    /// Idle time before the kernel probes an accepted connection (TCP keepalive, then every 10 s,
    /// 3 probes); 0: no TCP keepalive.
    pub tcp_keepalive_idle_ms: u64,
}

/// The defaults of the components the node configures, read where each component keeps them
/// (the kernel's queue settings, the back-end's, the front-end's, the store writer's): one
/// place for every default, which the node's configuration shows and may change.
struct ComponentDefaults {
    queue: ferry_kernel::QueueConfig,
    broker: ferry_be_server::BrokerConfig,
    frontend: ferry_fe_dispatcher::FrontendConfig,
    commit: ferry_store::CommitSettings,
}

impl ComponentDefaults {
    fn get() -> Self {
        ComponentDefaults {
            queue: ferry_kernel::QueueConfig::default(),
            broker: ferry_be_server::BrokerConfig::new(default_node_id()),
            frontend: ferry_fe_dispatcher::FrontendConfig::default(),
            commit: ferry_store::CommitSettings::default(),
        }
    }
}

/// The node id of a node configured with nothing.
fn default_node_id() -> ferry_kernel::NodeId {
    ferry_kernel::NodeId::new("node-1").unwrap_or_else(|_| unreachable!("a valid node id"))
}

impl Default for Limits {
    fn default() -> Self {
        let ComponentDefaults {
            queue,
            broker,
            frontend,
            ..
        } = ComponentDefaults::get();
        Self {
            max_message_size_bytes: queue.max_message_size_bytes,
            grpc_max_request_bytes: 64 * 1024 * 1024,
            receive_batch_max: queue.receive_batch_max,
            waiters_per_queue_max: queue.waiters_max,
            delivery_lease_default_ms: queue.default_lease_ms,
            delivery_lease_max_ms: queue.lease_max_ms,
            connection_lease_default_ms: frontend.connection_lease_default_ms,
            connections_max: frontend.connections_max,
            sessions_per_connection_max: frontend.sessions_per_connection_max,
            temporary_queues_per_connection_max: frontend.temporary_queues_per_connection_max,
            sessions_max: frontend.sessions_max,
            temporary_queues_max: frontend.temporary_queues_max,
            queues_max: broker.queues_max,
            grpc_max_concurrent_streams: 1_024,
            grpc_peer_max_concurrent_streams: 65_536,
            grpc_handshake_timeout_ms: 10_000,
            grpc_keepalive_interval_ms: 30_000,
            grpc_keepalive_timeout_ms: 20_000,
            grpc_connection_age_max_ms: 0,
            tcp_keepalive_idle_ms: 60_000,
        }
    }
}

impl Limits {
    /// Refuses settings that would turn a bound off; each message names the setting.
    fn check(&self) -> Result<(), String> {
        let positive = [
            (
                "limits.grpc_max_concurrent_streams",
                u64::from(self.grpc_max_concurrent_streams),
            ),
            (
                "limits.grpc_peer_max_concurrent_streams",
                u64::from(self.grpc_peer_max_concurrent_streams),
            ),
            (
                "limits.grpc_handshake_timeout_ms",
                self.grpc_handshake_timeout_ms,
            ),
            (
                "limits.grpc_keepalive_timeout_ms",
                self.grpc_keepalive_timeout_ms,
            ),
        ];
        match positive.iter().find(|(_, value)| *value == 0) {
            Some((name, _)) => Err(format!("{name} = 0: it must be at least 1")),
            None => Ok(()),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// This node's id in the cluster: a-z 0-9 _ -.
    pub node_id: String,
    /// Address clients dial (`Messaging`, `Admin`, health, reflection); port 0 picks a free port
    /// (printed at startup).
    pub listen: String,
    /// Address other nodes dial (the internal `Backend` service, which trusts its caller: keep it
    /// off networks clients can reach). Other nodes' `cluster.nodes` name this address. Port 0
    /// picks a free port (printed at startup).
    #[serde(default = "default_peer_listen")]
    pub peer_listen: String,
    pub data_dir: PathBuf,
    pub storage: Storage,
    /// Sends to durable queues (and commits of transactions that staged sends) are refused while
    /// the disk holding `data_dir` has fewer free bytes than this, as RabbitMQ's
    /// `disk_free_limit` does; receives, acknowledgements and dead-letter moves go on, since they
    /// free space. Read at most every 500 ms. 0: never refused. Unused with `storage = "memory"`.
    #[serde(default = "default_disk_free_min_bytes")]
    pub disk_free_min_bytes: u64,
    /// After SIGTERM, how long open calls may take to finish before the node stops anyway.
    pub shutdown_grace_ms: u64,
    /// How long the delete of an acknowledgement made on a `Consume` stream (which the client
    /// does not wait for) may wait for a synced write to share, before the write-ahead log is
    /// synced for it alone. Its answer still comes only once it is durable. 0: every such
    /// delete is synced on its own, as sends are.
    #[serde(default = "default_ack_sync_delay_max_us")]
    pub ack_sync_delay_max_us: u64,
    pub log: LogConfig,
    pub limits: Limits,
    #[serde(default)]
    pub cluster: ClusterConfig,
    #[serde(default)]
    pub metrics: MetricsConfig,
    #[serde(default)]
    pub history: HistoryConfig,
    #[serde(default)]
    pub paging: PagingConfig,
}

fn default_peer_listen() -> String {
    format!("127.0.0.1:{DEFAULT_PEER_PORT}")
}

fn default_ack_sync_delay_max_us() -> u64 {
    u64::try_from(ComponentDefaults::get().commit.defer_max.as_micros()).unwrap_or(u64::MAX)
}

fn default_disk_free_min_bytes() -> u64 {
    ComponentDefaults::get().broker.disk_free_min_bytes
}

/// How many bytes of messages a node keeps in memory. Messages over the budget wait in the store
/// (on disk) and are read back in delivery order as consumers get near them, so a queue may be
/// far larger than memory. Temporary queues keep nothing on disk and have no budget.
///
/// 0 is allowed for both: every message is paged out as soon as it is written, and receives read
/// from the store (slower, least memory). With `storage = "memory"` the store is in memory too,
/// so paging saves nothing.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PagingConfig {
    /// The most bytes of messages one durable queue keeps in memory.
    pub queue_memory_budget_bytes: u64,
    /// The most bytes of messages all durable queues of the node keep in memory together: each
    /// queue's budget is the smaller of `queue_memory_budget_bytes` and an equal share of this.
    pub node_memory_budget_bytes: u64,
}

impl Default for PagingConfig {
    fn default() -> Self {
        let broker = ComponentDefaults::get().broker;
        Self {
            queue_memory_budget_bytes: broker.queue_memory_budget_bytes,
            node_memory_budget_bytes: broker.node_memory_budget_bytes,
        }
    }
}

/// Per-message history (`ferry message history`), kept in memory.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HistoryConfig {
    /// How long each step is kept; 0: no history.
    pub retention_ms: u64,
    /// The most steps kept on this node (oldest go first).
    pub max_steps: usize,
}

impl Default for HistoryConfig {
    fn default() -> Self {
        let broker = ComponentDefaults::get().broker;
        Self {
            retention_ms: broker.history_retention_ms,
            max_steps: broker.history_max_steps,
        }
    }
}

/// The HTTP endpoint for Prometheus (`GET /metrics`) and health checks (`GET /healthz`,
/// `GET /readyz`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MetricsConfig {
    /// false: no HTTP endpoint at all.
    #[serde(default = "default_true")]
    pub enabled: bool,
    /// `HOST:PORT` to serve on (port 0 picks one, printed at startup); empty: the host of
    /// `listen` at its port + [`METRICS_PORT_OFFSET`] (7420 by default).
    #[serde(default)]
    pub listen: String,
}

fn default_true() -> bool {
    true
}

impl Default for MetricsConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            listen: String::new(),
        }
    }
}

impl Default for Config {
    fn default() -> Self {
        Self {
            node_id: default_node_id().to_string(),
            listen: format!("127.0.0.1:{DEFAULT_PORT}"),
            peer_listen: default_peer_listen(),
            data_dir: PathBuf::from("./ferry-data"),
            storage: Storage::Rocksdb,
            disk_free_min_bytes: default_disk_free_min_bytes(),
            shutdown_grace_ms: 10_000,
            ack_sync_delay_max_us: default_ack_sync_delay_max_us(),
            log: LogConfig {
                filter: "info".into(),
                format: LogFormat::Text,
            },
            limits: Limits::default(),
            cluster: ClusterConfig::default(),
            metrics: MetricsConfig::default(),
            history: HistoryConfig::default(),
            paging: PagingConfig::default(),
        }
    }
}

/// One setting in effect, and where its value came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Setting {
    /// Dotted, as in the TOML file: `limits.max_message_size_bytes`.
    pub key: String,
    /// As TOML writes it (strings quoted).
    pub value: String,
    /// `default`, `file <path>`, `env <VARIABLE>` or `flag --<name>`.
    pub source: String,
}

/// Values given on the command line; they override everything else.
#[derive(Debug, Default, Clone, Serialize)]
pub struct Overrides {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub node_id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub listen: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub peer_listen: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub data_dir: Option<PathBuf>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub storage: Option<Storage>,
    #[serde(skip_serializing_if = "ClusterOverrides::is_empty")]
    pub cluster: ClusterOverrides,
}

/// `[cluster]` settings given as flags.
#[derive(Debug, Default, Clone, Serialize)]
pub struct ClusterOverrides {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub initial: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub join: Option<String>,
}

impl ClusterOverrides {
    fn is_empty(&self) -> bool {
        self.initial.is_none() && self.join.is_none()
    }
}

impl Config {
    /// Defaults < `file` < `FERRY_*` environment < `overrides`.
    pub fn load(file: Option<&Path>, overrides: &Overrides) -> Result<Config, String> {
        Self::load_explained(file, overrides).map(|(config, _)| config)
    }

    /// [`Config::load`], with every setting in effect and its source, in key order.
    pub fn load_explained(
        file: Option<&Path>,
        overrides: &Overrides,
    ) -> Result<(Config, Vec<Setting>), String> {
        let mut fig = Figment::from(Serialized::defaults(Config::default()));
        if let Some(path) = file {
            if !path.exists() {
                return Err(format!("config file {} does not exist", path.display()));
            }
            fig = fig.merge(Toml::file(path));
        }
        fig = fig
            .merge(Env::prefixed("FERRY_").split("__").ignore(CLIENT_VARIABLES))
            .merge(Serialized::defaults(overrides));
        let config: Config = fig
            .extract()
            .map_err(|e| format!("invalid configuration: {e}"))?;
        config.check()?;
        let settings = explain(&fig, &config);
        Ok((config, settings))
    }

    /// Where metrics and health are served (see [`MetricsConfig`]); `None`: off.
    pub fn metrics_listen(&self) -> Result<Option<String>, String> {
        let m = &self.metrics;
        if !m.enabled {
            return Ok(None);
        }
        if !m.listen.is_empty() {
            m.listen.parse::<SocketAddr>().map_err(|_| {
                format!(
                    "metrics.listen = {:?}: write it as HOST:PORT, e.g. 127.0.0.1:{DEFAULT_METRICS_PORT}, or leave it empty for the host of listen at its port + {METRICS_PORT_OFFSET}",
                    m.listen
                )
            })?;
            return Ok(Some(m.listen.clone()));
        }
        let mut addr = self
            .listen
            .parse::<SocketAddr>()
            .map_err(|_| format!("listen = {:?}: write it as HOST:PORT", self.listen))?;
        let port = match addr.port() {
            0 => 0,
            p => p.checked_add(METRICS_PORT_OFFSET).ok_or_else(|| {
                format!(
                    "listen = {:?}: its port + {METRICS_PORT_OFFSET} (the metrics port) is past 65535; set metrics.listen",
                    self.listen
                )
            })?,
        };
        addr.set_port(port);
        Ok(Some(addr.to_string()))
    }

    fn check(&self) -> Result<(), String> {
        let listen = self.listen.parse::<SocketAddr>().map_err(|_| {
            format!(
                "listen = {:?}: write it as HOST:PORT, e.g. 127.0.0.1:{DEFAULT_PORT}",
                self.listen
            )
        })?;
        let peer = self.peer_listen.parse::<SocketAddr>().map_err(|_| {
            format!(
                "peer_listen = {:?}: write it as HOST:PORT, e.g. 127.0.0.1:{DEFAULT_PEER_PORT}",
                self.peer_listen
            )
        })?;
        let overlap =
            listen.ip() == peer.ip() || listen.ip().is_unspecified() || peer.ip().is_unspecified();
        if listen.port() != 0 && listen.port() == peer.port() && overlap {
            return Err(format!(
                "listen = {:?} and peer_listen = {:?} are the same address: clients and other \
                 nodes need one each; pick another port for peer_listen",
                self.listen, self.peer_listen
            ));
        }
        ferry_kernel::NodeId::new(self.node_id.as_str()).map_err(|e| e.to_string())?;
        self.metrics_listen()?;
        self.limits.check()
    }
}

/// Every setting of `config` with the source `fig` took it from.
fn explain(fig: &Figment, config: &Config) -> Vec<Setting> {
    let mut leaves = vec![];
    if let Ok(value) = serde_json::to_value(config) {
        flatten("", &value, &mut leaves);
    }
    leaves.sort_by(|a, b| a.0.cmp(&b.0));
    leaves
        .into_iter()
        .map(|(key, value)| {
            let source = fig
                .find_metadata(&key)
                .map_or_else(|| "default".to_owned(), |m| source_of(m, &key));
            Setting { key, value, source }
        })
        .collect()
}

/// The leaves of `value` as (dotted key, value as TOML writes it); nulls are left out.
fn flatten(prefix: &str, value: &serde_json::Value, out: &mut Vec<(String, String)>) {
    match value {
        serde_json::Value::Object(map) => {
            for (k, v) in map {
                let key = if prefix.is_empty() {
                    k.clone()
                } else {
                    format!("{prefix}.{k}")
                };
                flatten(&key, v, out);
            }
        }
        serde_json::Value::Null => {}
        leaf => out.push((prefix.to_owned(), leaf.to_string())),
    }
}

/// Which layer gave `key` its value: the defaults, the file, a `FERRY_` variable or a flag.
fn source_of(m: &figment::Metadata, key: &str) -> String {
    if m.name.contains(std::any::type_name::<Overrides>()) {
        let flag = match key {
            "storage" => "memory",
            "cluster.initial" => "initial-cluster",
            "cluster.join" => "join",
            other => other,
        };
        return format!("flag --{}", flag.replace('_', "-"));
    }
    if m.name.contains("environment") {
        return format!("env FERRY_{}", key.replace('.', "__").to_uppercase());
    }
    match &m.source {
        Some(figment::Source::File(path)) => format!("file {}", path.display()),
        _ => "default".to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn file_then_flags_override_defaults() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ferry.toml");
        std::fs::write(&path, "node_id = \"n2\"\nlisten = \"127.0.0.1:9000\"\n[limits]\nmax_message_size_bytes = 10\n").unwrap();
        let c = Config::load(Some(&path), &Overrides::default()).unwrap();
        assert_eq!(
            (c.node_id.as_str(), c.listen.as_str()),
            ("n2", "127.0.0.1:9000")
        );
        assert_eq!(c.limits.max_message_size_bytes, 10);
        assert_eq!(
            c.limits.receive_batch_max,
            Limits::default().receive_batch_max
        );
        let o = Overrides {
            listen: Some("127.0.0.1:9001".into()),
            ..Default::default()
        };
        assert_eq!(
            Config::load(Some(&path), &o).unwrap().listen,
            "127.0.0.1:9001"
        );
    }

    #[test]
    fn bad_values_are_explained() {
        let o = Overrides {
            listen: Some("nowhere".into()),
            ..Default::default()
        };
        assert!(Config::load(None, &o).unwrap_err().contains("HOST:PORT"));
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ferry.toml");
        std::fs::write(&path, "lsiten = \"x\"\n").unwrap();
        assert!(Config::load(Some(&path), &Overrides::default())
            .unwrap_err()
            .contains("lsiten"));
        assert!(Config::load(
            Some(&dir.path().join("missing.toml")),
            &Overrides::default()
        )
        .is_err());
    }
}

#[cfg(test)]
mod sources_and_metrics {
    use super::*;

    fn source<'a>(settings: &'a [Setting], key: &str) -> &'a str {
        settings
            .iter()
            .find(|s| s.key == key)
            .map(|s| s.source.as_str())
            .unwrap_or_else(|| panic!("no {key} in {settings:?}"))
    }

    #[test]
    fn each_setting_names_the_layer_its_value_came_from() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("ferry.toml");
        std::fs::write(
            &path,
            "[limits]
receive_batch_max = 7
",
        )
        .expect("write");
        let o = Overrides {
            listen: Some("127.0.0.1:9001".into()),
            storage: Some(Storage::Memory),
            cluster: ClusterOverrides {
                join: Some("127.0.0.1:7410".into()),
                initial: None,
            },
            ..Default::default()
        };
        let (c, settings) = Config::load_explained(Some(&path), &o).expect("loads");
        assert_eq!(c.limits.receive_batch_max, 7);
        assert_eq!(
            source(&settings, "limits.receive_batch_max"),
            format!("file {}", path.display())
        );
        assert_eq!(source(&settings, "listen"), "flag --listen");
        assert_eq!(source(&settings, "storage"), "flag --memory");
        assert_eq!(source(&settings, "cluster.join"), "flag --join");
        assert_eq!(source(&settings, "shutdown_grace_ms"), "default");
        let listen = settings.iter().find(|s| s.key == "listen").expect("listen");
        assert_eq!(listen.value, "\"127.0.0.1:9001\"");
        // In key order, every leaf once.
        let keys: Vec<&str> = settings.iter().map(|s| s.key.as_str()).collect();
        let mut sorted = keys.clone();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(keys, sorted);
        assert!(
            keys.contains(&"metrics.enabled") && keys.contains(&"paging.node_memory_budget_bytes")
        );
    }

    #[test]
    fn metrics_are_on_by_default_beside_the_client_port() {
        let at = |listen: &str, metrics: &str| {
            let mut c = Config {
                listen: listen.into(),
                ..Config::default()
            };
            c.metrics.listen = metrics.into();
            c.metrics_listen()
        };
        assert_eq!(at("127.0.0.1:7400", ""), Ok(Some("127.0.0.1:7420".into())));
        assert_eq!(at("10.0.0.5:7401", ""), Ok(Some("10.0.0.5:7421".into())));
        assert_eq!(at("127.0.0.1:0", ""), Ok(Some("127.0.0.1:0".into())));
        assert_eq!(at("[::1]:7400", ""), Ok(Some("[::1]:7420".into())));
        assert_eq!(
            at("127.0.0.1:7400", "0.0.0.0:9464"),
            Ok(Some("0.0.0.0:9464".into()))
        );
        assert!(at("127.0.0.1:65530", "")
            .unwrap_err()
            .contains("metrics.listen"));
        assert!(at("127.0.0.1:7400", "nowhere")
            .unwrap_err()
            .contains("metrics.listen"));
        let mut off = Config::default();
        off.metrics.enabled = false;
        assert_eq!(off.metrics_listen(), Ok(None));
        assert_eq!(DEFAULT_METRICS_PORT, 7420);
    }
}

#[cfg(test)]
mod listeners_and_transport {
    use super::*;

    fn load(toml: &str) -> Result<Config, String> {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("ferry.toml");
        std::fs::write(&path, toml).expect("write config");
        Config::load(Some(&path), &Overrides::default())
    }

    #[test]
    fn the_peer_listener_is_loopback_on_its_own_port_by_default() {
        let c = Config::default();
        let peer: SocketAddr = c.peer_listen.parse().expect("a socket address");
        assert!(peer.ip().is_loopback(), "{peer}");
        assert_eq!(peer.port(), DEFAULT_PEER_PORT);
        assert_ne!(DEFAULT_PEER_PORT, DEFAULT_PORT);
    }

    #[test]
    fn the_peer_listener_may_not_take_the_client_address() {
        let err = load("listen = \"0.0.0.0:7400\"\npeer_listen = \"10.0.0.1:7400\"\n")
            .expect_err("same port on an overlapping address");
        assert!(err.contains("peer_listen"), "{err}");
        let err = load("peer_listen = \"nowhere\"\n").expect_err("not an address");
        assert!(
            err.contains("peer_listen") && err.contains("HOST:PORT"),
            "{err}"
        );
        // Different interfaces, or port 0 for both (tests), are fine.
        load("listen = \"10.0.0.1:7400\"\npeer_listen = \"10.0.0.2:7400\"\n").expect("loads");
        load("listen = \"127.0.0.1:0\"\npeer_listen = \"127.0.0.1:0\"\n").expect("loads");
    }

    #[test]
    fn flags_override_the_peer_listener() {
        let o = Overrides {
            peer_listen: Some("127.0.0.1:0".into()),
            ..Default::default()
        };
        assert_eq!(
            Config::load(None, &o).expect("loads").peer_listen,
            "127.0.0.1:0"
        );
    }

    #[test]
    fn a_transport_bound_cannot_be_turned_off() {
        for key in [
            "grpc_max_concurrent_streams",
            "grpc_peer_max_concurrent_streams",
            "grpc_handshake_timeout_ms",
            "grpc_keepalive_timeout_ms",
        ] {
            let err = load(&format!("[limits]\n{key} = 0\n")).expect_err(key);
            assert!(err.contains(&format!("limits.{key} = 0")), "{err}");
        }
        let c = load("[limits]\ngrpc_keepalive_interval_ms = 0\ntcp_keepalive_idle_ms = 0\n")
            .expect("keepalives may be off");
        assert_eq!(
            (
                c.limits.grpc_keepalive_interval_ms,
                c.limits.tcp_keepalive_idle_ms
            ),
            (0, 0)
        );
    }
}

#[cfg(test)]
mod paging_and_disk {
    use super::*;

    #[test]
    fn zero_budgets_and_no_disk_limit_are_allowed() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("ferry.toml");
        std::fs::write(
            &path,
            "disk_free_min_bytes = 0\n[paging]\nqueue_memory_budget_bytes = 0\nnode_memory_budget_bytes = 0\n",
        )
        .expect("write config");
        let c = Config::load(Some(&path), &Overrides::default()).expect("loads");
        assert_eq!(c.disk_free_min_bytes, 0);
        assert_eq!(
            c.paging,
            PagingConfig {
                queue_memory_budget_bytes: 0,
                node_memory_budget_bytes: 0
            }
        );
    }

    #[test]
    fn a_misspelled_paging_key_is_named() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("ferry.toml");
        std::fs::write(&path, "[paging]\nqueue_budget_bytes = 1\n").expect("write config");
        let err = Config::load(Some(&path), &Overrides::default()).expect_err("unknown key");
        assert!(err.contains("queue_budget_bytes"), "{err}");
    }
}

#[cfg(test)]
mod deploy_example {
    use super::*;

    /// The documented example must stay loadable and equal to the defaults it claims to show.
    #[test]
    fn deploy_ferry_toml_is_the_defaults() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/ferry.toml");
        let c = Config::load(Some(&path), &Overrides::default()).unwrap();
        assert_eq!(c, Config::default());
    }
}
