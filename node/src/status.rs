//! What a node tells about itself, from one place: the `Node` gRPC service (`ferry status`:
//! version, uptime, data directory, listeners, the configuration with the source of each value,
//! the store and disk guard, peers), the HTTP `/healthz` and `/readyz` served beside `/metrics`,
//! and the node-wide gauges of the metrics page (readiness, alarms, store size).
//!
//! Ready means the node serves clients: its store takes writes (not poisoned), it is not
//! shutting down, and it is a member of a cluster with metadata (a node started with `--join`
//! is not, until `ferry node add`). A disk under `disk_free_min_bytes` is an alarm, not
//! unreadiness: the node still serves receives and acknowledgements, which free space.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use crate::raft::MetaNode;
use ferry_be_server::Broker;
use ferry_proto::pb;
use tokio::sync::watch;
use tonic::{Request, Response, Status};

use crate::config::{Setting, Storage};

/// The release of this binary.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// The alarm raised while sends are refused for want of disk space.
pub const ALARM_DISK_FREE_LOW: &str = "disk_free_low";
/// The alarm raised once the store failed a write (it refuses writes until restart).
pub const ALARM_STORE_POISONED: &str = "store_poisoned";
/// Every alarm, in the order they are shown.
pub const ALARMS: [&str; 2] = [ALARM_DISK_FREE_LOW, ALARM_STORE_POISONED];

/// What the node is and how it is; cheap to clone.
#[derive(Clone)]
pub struct NodeState {
    inner: Arc<Inner>,
}

struct Inner {
    node_id: String,
    started: Instant,
    started_at: SystemTime,
    data_dir: PathBuf,
    storage: Storage,
    settings: Vec<Setting>,
    listeners: Vec<pb::Listener>,
    broker: Broker,
    meta: MetaNode,
    /// True once shutdown has begun.
    stopping: watch::Receiver<bool>,
}

impl std::fmt::Debug for NodeState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeState")
            .field("node_id", &self.inner.node_id)
            .finish_non_exhaustive()
    }
}

/// What [`NodeState::new`] takes.
#[derive(Debug)]
pub struct NodeFacts {
    pub node_id: String,
    /// When the node started (before it opened its store).
    pub started: Instant,
    pub data_dir: PathBuf,
    pub storage: Storage,
    pub settings: Vec<Setting>,
    pub listeners: Vec<pb::Listener>,
}

impl NodeState {
    pub fn new(
        facts: NodeFacts,
        broker: Broker,
        meta: MetaNode,
        stopping: watch::Receiver<bool>,
    ) -> Self {
        let started_at = SystemTime::now()
            .checked_sub(facts.started.elapsed())
            .unwrap_or_else(SystemTime::now);
        Self {
            inner: Arc::new(Inner {
                node_id: facts.node_id,
                started: facts.started,
                started_at,
                data_dir: facts.data_dir,
                storage: facts.storage,
                settings: facts.settings,
                listeners: facts.listeners,
                broker,
                meta,
                stopping,
            }),
        }
    }

    pub fn node_id(&self) -> &str {
        &self.inner.node_id
    }

    /// Why the node is not ready, one reason each; empty: ready.
    pub fn not_ready(&self) -> Vec<String> {
        let mut why = vec![];
        if *self.inner.stopping.borrow() {
            why.push("shutting down".to_owned());
        }
        if self.inner.broker.store_poisoned() {
            why.push(
                "the store failed a write and refuses writes until the node restarts (see the log)"
                    .to_owned(),
            );
        }
        let view = self.inner.meta.view().borrow().clone();
        let me = self.inner.meta.node_id();
        match view.meta.cluster_id() {
            None => why.push(
                "not a member of a cluster yet: a node started with --join waits for `ferry node add` on a member; a new cluster waits for its first leader"
                    .to_owned(),
            ),
            Some(id) if !view.meta.node(me).is_some_and(|n| n.is_active()) => why.push(format!(
                "not an active member of cluster {id}: added with `ferry node add`? removed?"
            )),
            Some(_) => {}
        }
        why
    }

    /// The alarms raised now, from [`ALARMS`].
    pub fn alarms(&self) -> Vec<&'static str> {
        let mut raised = vec![];
        if self.disk_guard().2 {
            raised.push(ALARM_DISK_FREE_LOW);
        }
        if self.inner.broker.store_poisoned() {
            raised.push(ALARM_STORE_POISONED);
        }
        raised
    }

    /// Free bytes as the disk guard last read them (`None`: no reading yet, or no guard), its
    /// limit (0: no guard), and whether sends are refused.
    fn disk_guard(&self) -> (Option<u64>, u64, bool) {
        match self.inner.broker.disk_free() {
            // u64::MAX: never read successfully.
            Some((free, min)) => {
                let free = (free != u64::MAX).then_some(free);
                (free, min, free.is_some_and(|f| f < min))
            }
            None => (None, 0, false),
        }
    }

    /// Bytes of the files under the data directory; `None` in memory.
    pub async fn store_size_bytes(&self) -> Option<u64> {
        if self.inner.storage == Storage::Memory {
            return None;
        }
        let dir = self.inner.data_dir.clone();
        tokio::task::spawn_blocking(move || dir_size_bytes(&dir))
            .await
            .ok()
    }

    /// Seconds since the node started.
    pub fn uptime_seconds(&self) -> f64 {
        self.inner.started.elapsed().as_secs_f64()
    }

    /// The whole report `ferry status` shows.
    pub async fn report(&self) -> pb::NodeStatusReport {
        let i = &self.inner;
        let (disk_free_bytes, disk_free_min_bytes, disk_guard_tripped) = self.disk_guard();
        let store = pb::StoreReport {
            state: match (i.storage, i.broker.store_poisoned()) {
                (_, true) => "poisoned",
                (Storage::Memory, false) => "memory",
                (Storage::Rocksdb, false) => "ok",
            }
            .to_owned(),
            size_bytes: self.store_size_bytes().await.unwrap_or(0),
            disk_free_bytes,
            disk_free_min_bytes,
            disk_guard_tripped,
        };
        let cluster = i.meta.status();
        let peers = cluster
            .nodes
            .iter()
            .filter(|n| n.node_id != i.node_id)
            .map(|n| pb::PeerReport {
                node_id: n.node_id.clone(),
                peer_address: n.peer_address.clone(),
                client_address: n.client_address.clone(),
                role: n.role.clone(),
                reachable: n.health == "up",
                // The cluster status says 0 for "never heard from".
                last_heard_ms_ago: (n.last_heard_ms_ago > 0 || n.health == "up")
                    .then_some(n.last_heard_ms_ago),
            })
            .collect();
        let not_ready = self.not_ready();
        pb::NodeStatusReport {
            version: VERSION.to_owned(),
            node_id: i.node_id.clone(),
            uptime_ms: u64::try_from(i.started.elapsed().as_millis()).unwrap_or(u64::MAX),
            started_at_ms: i
                .started_at
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX)),
            data_dir: i.data_dir.display().to_string(),
            storage: match i.storage {
                Storage::Rocksdb => "rocksdb",
                Storage::Memory => "memory",
            }
            .to_owned(),
            listeners: i.listeners.clone(),
            config: i
                .settings
                .iter()
                .map(|s| pb::ConfigSetting {
                    key: s.key.clone(),
                    value: s.value.clone(),
                    source: s.source.clone(),
                })
                .collect(),
            store: Some(store),
            ready: not_ready.is_empty(),
            not_ready,
            alarms: self.alarms().into_iter().map(str::to_owned).collect(),
            cluster_id: cluster.cluster_id,
            leader_node_id: cluster.leader_node_id,
            peers,
        }
    }
}

/// Bytes of the regular files under `dir`, links not followed; what cannot be read counts 0.
fn dir_size_bytes(dir: &Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    entries
        .filter_map(Result::ok)
        .map(|e| match e.file_type() {
            Ok(t) if t.is_dir() => dir_size_bytes(&e.path()),
            Ok(t) if t.is_file() => e.metadata().map_or(0, |m| m.len()),
            _ => 0,
        })
        .fold(0, u64::saturating_add)
}

/// The `Node` gRPC service over a [`NodeState`].
#[derive(Debug, Clone)]
pub struct NodeService(pub NodeState);

#[tonic::async_trait]
impl pb::node_server::Node for NodeService {
    async fn get_node_status(
        &self,
        _req: Request<pb::GetNodeStatusRequest>,
    ) -> Result<Response<pb::NodeStatusReport>, Status> {
        Ok(Response::new(self.0.report().await))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_size_of_a_directory_counts_its_files_at_every_depth() {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::write(dir.path().join("a"), [0u8; 100]).expect("write");
        std::fs::create_dir_all(dir.path().join("queues/sub")).expect("mkdir");
        std::fs::write(dir.path().join("queues/b"), [0u8; 20]).expect("write");
        std::fs::write(dir.path().join("queues/sub/c"), [0u8; 3]).expect("write");
        assert_eq!(dir_size_bytes(dir.path()), 123);
        assert_eq!(dir_size_bytes(&dir.path().join("missing")), 0);
    }
}
