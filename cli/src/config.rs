//! A node's configuration: defaults, then a TOML file, then `FERRY_` environment variables
//! (`__` separates sections: `FERRY_LIMITS__MAX_MESSAGE_SIZE_BYTES`), then command-line flags.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use ferry_cluster::ClusterConfig;
use figment::providers::{Env, Format, Serialized, Toml};
use figment::Figment;
use serde::{Deserialize, Serialize};

/// The port a node listens on, and clients dial, by default.
pub const DEFAULT_PORT: u16 = 7400;

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
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_message_size_bytes: 1024 * 1024,
            grpc_max_request_bytes: 64 * 1024 * 1024,
            receive_batch_max: 1_000,
            waiters_per_queue_max: 10_000,
            delivery_lease_default_ms: 30_000,
            delivery_lease_max_ms: 12 * 3_600_000,
            connection_lease_default_ms: 30_000,
            connections_max: 100_000,
            sessions_per_connection_max: 1_000,
            temporary_queues_per_connection_max: 1_000,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// This node's id in the cluster: a-z 0-9 _ -.
    pub node_id: String,
    /// Address to listen on; port 0 picks a free port (printed at startup).
    pub listen: String,
    pub data_dir: PathBuf,
    pub storage: Storage,
    /// After SIGTERM, how long open calls may take to finish before the node stops anyway.
    pub shutdown_grace_ms: u64,
    pub log: LogConfig,
    pub limits: Limits,
    #[serde(default)]
    pub cluster: ClusterConfig,
    #[serde(default)]
    pub metrics: MetricsConfig,
    #[serde(default)]
    pub history: HistoryConfig,
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
        Self {
            retention_ms: 600_000,
            max_steps: 100_000,
        }
    }
}

/// The Prometheus endpoint.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MetricsConfig {
    /// `HOST:PORT` to serve `GET /metrics` on (port 0 picks one, printed at startup); empty: off.
    #[serde(default)]
    pub listen: String,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            node_id: "node-1".into(),
            listen: format!("127.0.0.1:{DEFAULT_PORT}"),
            data_dir: PathBuf::from("./ferry-data"),
            storage: Storage::Rocksdb,
            shutdown_grace_ms: 10_000,
            log: LogConfig {
                filter: "info".into(),
                format: LogFormat::Text,
            },
            limits: Limits::default(),
            cluster: ClusterConfig::default(),
            metrics: MetricsConfig::default(),
            history: HistoryConfig::default(),
        }
    }
}

/// Values given on the command line; they override everything else.
#[derive(Debug, Default, Clone, Serialize)]
pub struct Overrides {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub node_id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub listen: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub data_dir: Option<PathBuf>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub storage: Option<Storage>,
}

impl Config {
    /// Defaults < `file` < `FERRY_*` environment < `overrides`.
    pub fn load(file: Option<&Path>, overrides: &Overrides) -> Result<Config, String> {
        let mut fig = Figment::from(Serialized::defaults(Config::default()));
        if let Some(path) = file {
            if !path.exists() {
                return Err(format!("config file {} does not exist", path.display()));
            }
            fig = fig.merge(Toml::file(path));
        }
        fig = fig
            .merge(Env::prefixed("FERRY_").split("__").ignore(&["server"]))
            .merge(Serialized::defaults(overrides));
        let config: Config = fig
            .extract()
            .map_err(|e| format!("invalid configuration: {e}"))?;
        config.check()?;
        Ok(config)
    }

    fn check(&self) -> Result<(), String> {
        self.listen.parse::<SocketAddr>().map_err(|_| {
            format!(
                "listen = {:?}: write it as HOST:PORT, e.g. 127.0.0.1:{DEFAULT_PORT}",
                self.listen
            )
        })?;
        ferry_kernel::NodeId::new(self.node_id.as_str()).map_err(|e| e.to_string())?;
        Ok(())
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
