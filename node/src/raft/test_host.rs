//! A [`QueueHost`] for tests of the node's shell: records what it is asked.

#![allow(clippy::unwrap_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use std::sync::Arc;

use ferry_be_server::{ShardId, ShardProposer, ShardQueue};
use ferry_kernel::{PlacementEpoch, QueueName};
use ferry_proto::pb;

use super::host::{HeldQueue, QueueHost};

/// Records what it is asked; holds what it was told to create.
pub(crate) struct Recorder {
    pub(crate) held: Mutex<BTreeMap<QueueName, PlacementEpoch>>,
    pub(crate) calls: Mutex<Vec<String>>,
    /// Creating these fails.
    pub(crate) fail_creates: Mutex<BTreeSet<QueueName>>,
    /// How often `queues` was asked.
    listed: AtomicUsize,
    /// What `shard_fences` answers.
    pub(crate) fences: tokio::sync::watch::Sender<u64>,
}

impl Default for Recorder {
    fn default() -> Self {
        Recorder {
            held: Mutex::default(),
            calls: Mutex::default(),
            fail_creates: Mutex::default(),
            listed: AtomicUsize::default(),
            fences: tokio::sync::watch::Sender::new(0),
        }
    }
}

impl Recorder {
    /// How often the host was asked for all its queues.
    pub(crate) fn listed(&self) -> usize {
        self.listed.load(Ordering::Relaxed)
    }
}

#[tonic::async_trait]
impl QueueHost for Recorder {
    fn queues(&self) -> Vec<HeldQueue> {
        self.listed.fetch_add(1, Ordering::Relaxed);
        let held = self.held.lock().unwrap();
        held.iter()
            .map(|(name, epoch)| HeldQueue {
                name: name.clone(),
                settings: pb::QueueConfig::default(),
                epoch: *epoch,
            })
            .collect()
    }
    fn check_settings(&self, _: &QueueName, _: &pb::QueueConfig) -> Result<(), tonic::Status> {
        Ok(())
    }
    async fn create(
        &self,
        name: &QueueName,
        _: &pb::QueueConfig,
        epoch: PlacementEpoch,
    ) -> Result<(), String> {
        if self.fail_creates.lock().unwrap().contains(name) {
            return Err(format!("{name}: refused by the test"));
        }
        self.calls
            .lock()
            .unwrap()
            .push(format!("create {name} {epoch}"));
        self.held.lock().unwrap().insert(name.clone(), epoch);
        Ok(())
    }
    async fn stored_bytes(&self) -> u64 {
        0
    }
    fn set_epoch(&self, name: &QueueName, epoch: PlacementEpoch) {
        self.calls
            .lock()
            .unwrap()
            .push(format!("set_epoch {name} {epoch}"));
        self.held.lock().unwrap().insert(name.clone(), epoch);
    }
    async fn delete(&self, name: &QueueName) -> Result<(), String> {
        self.calls.lock().unwrap().push(format!("delete {name}"));
        self.held.lock().unwrap().remove(name);
        Ok(())
    }
    async fn update(&self, name: &QueueName, _: &pb::QueueConfig) -> Result<(), String> {
        self.calls.lock().unwrap().push(format!("update {name}"));
        Ok(())
    }
    async fn lead_shard(
        &self,
        shard: ShardId,
        term: u64,
        _: Arc<dyn ShardProposer>,
        queues: Vec<ShardQueue>,
        _: PlacementEpoch,
    ) -> Result<bool, String> {
        let names: Vec<String> = queues.iter().map(|q| q.name.to_string()).collect();
        self.calls
            .lock()
            .unwrap()
            .push(format!("lead {shard} {term} [{}]", names.join(" ")));
        Ok(false)
    }
    async fn follow_shard(&self, shard: ShardId, leader: Option<String>, queues: &[QueueName]) {
        let names: Vec<String> = queues.iter().map(ToString::to_string).collect();
        let leader = leader.unwrap_or_else(|| "?".into());
        self.calls
            .lock()
            .unwrap()
            .push(format!("follow {shard} {leader} [{}]", names.join(" ")));
    }
    async fn forget_shard(&self, shard: ShardId) -> Result<(), String> {
        self.calls.lock().unwrap().push(format!("forget {shard}"));
        Ok(())
    }
    fn shard_fences(&self) -> tokio::sync::watch::Receiver<u64> {
        self.fences.subscribe()
    }
    fn shard_leader_event(&self, _shard: ferry_be_server::ShardId, _term: u64, _detail: String) {}

    fn shard_replication_event(
        &self,
        _shard: ferry_be_server::ShardId,
        _under: bool,
        _whole: u64,
        _detail: String,
    ) {
    }
}

/// The settings of a one-node cluster named `a` that forms by itself, with a 10 ms tick.
pub(crate) fn one_node_settings() -> super::NodeSettings {
    let me = ferry_kernel::NodeId::new("a").unwrap();
    super::NodeSettings {
        node_id: me.clone(),
        client_addr: "127.0.0.1:1".into(),
        peer_addr: "127.0.0.1:2".into(),
        start: super::StartMode::Initial(vec![(me, "127.0.0.1:2".into())]),
        tick: std::time::Duration::from_millis(10),
        liveness_timeout: std::time::Duration::from_secs(3),
        probe_interval: std::time::Duration::from_millis(500),
        import_marker: None,
        shard_data: None,
        incarnation: 1,
    }
}
