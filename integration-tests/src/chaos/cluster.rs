//! The cluster scenarios' nodes: three `ferry server` processes (see `crate::cluster`), each in
//! a cgroup of its own behind the run's [`Firewall`], with the scenario's queues (replicated by
//! default, or pinned one on each node); and their nemesis: each planned fault hits the node it
//! names — kill -9 and a restart in place, SIGSTOP/SIGCONT (both as for one node, through its
//! [`Target`]), or a partition of that node from all the others, both ways — or the node it
//! finds when the fault starts: the metadata leader, a queue's shard leader. A partition is
//! always healed, even when the run fails (a guard flushes the rules on drop; the firewall
//! removes them all on its own drop).

use std::path::Path;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use anyhow::Context;
use ferry_client::pb;

use super::history::{Fault, History, Op};
use super::nemesis::{FaultKind, PlannedFault, Target};
use super::partition::Firewall;
use crate::cluster::{status_at, Cluster};
use crate::Node;

/// The nodes of a cluster and the firewall between them.
#[derive(Debug, Clone)]
pub struct ClusterTarget {
    /// One per node (no proxy).
    pub nodes: Vec<Target>,
    /// Each node's loopback address, in the order of `nodes`.
    pub ips: Vec<String>,
    pub firewall: Arc<Firewall>,
    /// Nodes removed from the cluster and stopped for good: never restarted.
    pub removed: Arc<Mutex<std::collections::BTreeSet<String>>>,
}

/// Heals every partition when dropped.
struct Healing<'a>(&'a Firewall);

impl Drop for Healing<'_> {
    fn drop(&mut self) {
        if let Err(e) = self.0.heal() {
            eprintln!("chaos: healing a partition failed: {e:#}");
        }
    }
}

impl ClusterTarget {
    pub(super) fn index(&self, name: &str) -> anyhow::Result<usize> {
        self.nodes
            .iter()
            .position(|t| t.node_name == name)
            .with_context(|| format!("no node {name} in the cluster"))
    }

    /// Injects one fault on the node it names (the metadata leader, for
    /// [`FaultKind::PartitionLeader`]) and heals it after `f.for_ms`.
    pub async fn inject(&self, history: &History, f: &PlannedFault) -> anyhow::Result<()> {
        if f.kind == FaultKind::PartitionLeader {
            return self.partition_leader(history, f).await;
        }
        if f.kind == FaultKind::RemoveNode {
            return self.remove_node(history, f).await;
        }
        if f.kind == FaultKind::KillShardLeader {
            return self.kill_shard_leader(history, f).await;
        }
        if f.kind == FaultKind::PowerCut {
            return self.power_cut(history, f).await;
        }
        if f.kind == FaultKind::DiskLost {
            return self.disk_lost(history, f).await;
        }
        let gone = f.node.as_ref().is_some_and(|n| {
            self.removed
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .contains(n)
        });
        if gone {
            // Removed, or its disk lost: never started again, so nothing to fault.
            return Ok(());
        }
        let name = f.node.as_deref().context("a cluster fault names no node")?;
        let i = self.index(name)?;
        let healing = match f.kind {
            FaultKind::Partition => self.cut(history, i)?,
            FaultKind::Mute | FaultKind::Deaf => self.cut_one_way(history, i, f.kind)?,
            _ => return self.nodes[i].inject(history, f).await,
        };
        tokio::time::sleep(Duration::from_millis(f.for_ms)).await;
        drop(healing);
        history.record("nemesis", name, Op::Fault(Fault::PartitionHeal));
        Ok(())
    }

    /// Cuts node `i` from all the others until the guard returned is dropped.
    fn cut(&self, history: &History, i: usize) -> anyhow::Result<Healing<'_>> {
        let (mut others, mut names) = (vec![], vec![]);
        for (j, t) in self.nodes.iter().enumerate().filter(|(j, _)| *j != i) {
            others.push(self.ips[j].clone());
            names.push(t.node_name.clone());
        }
        let healing = Healing(&self.firewall);
        self.firewall.partition(&self.ips[i], &others)?;
        let name = &self.nodes[i].node_name;
        history.record("nemesis", name, Op::Fault(Fault::Partition { from: names }));
        Ok(healing)
    }

    /// Node `i` muted (its packets to the others dropped) or deafened (theirs to it dropped)
    /// until the guard returned is dropped.
    fn cut_one_way(
        &self,
        history: &History,
        i: usize,
        kind: FaultKind,
    ) -> anyhow::Result<Healing<'_>> {
        let (mut others, mut names) = (vec![], vec![]);
        for (j, t) in self.nodes.iter().enumerate().filter(|(j, _)| *j != i) {
            others.push(self.ips[j].clone());
            names.push(t.node_name.clone());
        }
        let healing = Healing(&self.firewall);
        let fault = if kind == FaultKind::Mute {
            self.firewall.cut_one_way(&self.ips[i], &others)?;
            Fault::Mute { to: names }
        } else {
            for o in &others {
                self.firewall.cut_one_way(o, &[self.ips[i].clone()])?;
            }
            Fault::Deaf { from: names }
        };
        history.record("nemesis", &self.nodes[i].node_name, Op::Fault(fault));
        Ok(healing)
    }

    /// Every node as (name, client URL).
    pub fn urls(&self) -> Vec<(String, String)> {
        self.nodes
            .iter()
            .map(|t| {
                let node = t.node.lock().unwrap_or_else(PoisonError::into_inner);
                (t.node_name.clone(), node.url())
            })
            .collect()
    }

    /// Cuts the metadata leader from the majority for `f.for_ms` (longer, until the check is
    /// done), and creates a queue through a node of the majority: it must be created within
    /// [`META_WRITE_MAX`] of the cut.
    async fn partition_leader(&self, history: &History, f: &PlannedFault) -> anyhow::Result<()> {
        let urls = self.urls();
        let leader = wait_leader(&urls, LEADER_WAIT).await?;
        let i = self.index(&leader)?;
        let via = (i + 1) % self.nodes.len();
        let (via_name, via_url) = urls[via].clone();
        let cut_at = tokio::time::Instant::now();
        let healing = self.cut(history, i)?;
        let queue = format!("meta-{}", f.at_ms);
        let created = create_by(&via_url, &queue, cut_at + META_WRITE_MAX).await;
        let took_ms = u64::try_from(cut_at.elapsed().as_millis()).unwrap_or(u64::MAX);
        if created.is_ok() {
            let event = Fault::QueueCreated {
                queue: queue.clone(),
                via: via_name.clone(),
                took_ms,
            };
            history.record("nemesis", &leader, Op::Fault(event));
        }
        tokio::time::sleep_until(cut_at + Duration::from_millis(f.for_ms)).await;
        drop(healing);
        history.record("nemesis", &leader, Op::Fault(Fault::PartitionHeal));
        created.with_context(|| {
            format!(
                "creating {queue} through {via_name} while the metadata leader {leader} was \
                 cut off: not done within {META_WRITE_MAX:?}"
            )
        })
    }

    /// Kills (kill -9) the leader of the shard of the queue `f` names, as the nodes report it
    /// when the fault starts, and restarts it in place after `f.for_ms`.
    async fn kill_shard_leader(&self, history: &History, f: &PlannedFault) -> anyhow::Result<()> {
        let queue = f
            .queue
            .as_deref()
            .context("a shard leader's kill names no queue")?;
        let shard = shard_of(&self.member_urls(), queue, SHARD_LEADER_WAIT).await?;
        let i = self.index(&shard.leader)?;
        self.nodes[i].with_node(Node::kill9).await?;
        let event = Fault::KillShardLeader {
            queue: queue.into(),
            shard: shard.shard,
            queues: shard.queues,
        };
        history.record("nemesis", &shard.leader, Op::Fault(event));
        tokio::time::sleep(Duration::from_millis(f.for_ms)).await;
        self.nodes[i].restart(history).await
    }

    /// Kills (kill -9) every node, and restarts them all in place after `f.for_ms`.
    async fn power_cut(&self, history: &History, f: &PlannedFault) -> anyhow::Result<()> {
        let mut nodes = vec![];
        for t in &self.nodes {
            t.with_node(Node::kill9).await?;
            nodes.push(t.node_name.clone());
        }
        history.record("nemesis", "cluster", Op::Fault(Fault::PowerCut { nodes }));
        tokio::time::sleep(Duration::from_millis(f.for_ms)).await;
        for t in &self.nodes {
            t.restart(history).await?;
        }
        Ok(())
    }

    /// Removes the node `f` names through the next node (retried for [`META_WRITE_MAX`]),
    /// and stops it `f.for_ms` later, as an operator would; it is never restarted.
    async fn remove_node(&self, history: &History, f: &PlannedFault) -> anyhow::Result<()> {
        let name = f.node.as_deref().context("a removal names no node")?;
        let i = self.index(name)?;
        let urls = self.urls();
        let (via_name, via_url) = urls[(i + 1) % urls.len()].clone();
        let asked = tokio::time::Instant::now();
        let deadline = asked + META_WRITE_MAX;
        let mut last = String::from("no attempt");
        // Bounded by the deadline; each attempt too.
        let mut removed = false;
        while !removed && tokio::time::Instant::now() < deadline {
            let attempt = tokio::time::timeout_at(deadline, async {
                let client = ferry_client::Client::connect(&via_url).await?;
                client
                    .cluster()
                    .remove_node(pb::RemoveNodeRequest {
                        node_id: name.into(),
                    })
                    .await?;
                Ok::<(), anyhow::Error>(())
            })
            .await;
            match attempt {
                Ok(Ok(())) => removed = true,
                Ok(Err(e)) => last = format!("{e:#}"),
                Err(_) => last = "timed out".into(),
            }
            if !removed {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
        anyhow::ensure!(removed, "removing {name} through {via_name}: {last}");
        let took_ms = u64::try_from(asked.elapsed().as_millis()).unwrap_or(u64::MAX);
        let event = Fault::NodeRemoved {
            via: via_name,
            took_ms,
        };
        history.record("nemesis", name, Op::Fault(event));
        self.removed
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(name.to_string());
        tokio::time::sleep(Duration::from_millis(f.for_ms)).await;
        self.nodes[i].with_node(Node::kill9).await?;
        history.record("nemesis", name, Op::Fault(Fault::Stopped));
        Ok(())
    }

    /// Every node still in the cluster as (name, client URL).
    pub fn member_urls(&self) -> Vec<(String, String)> {
        let removed = self.removed.lock().unwrap_or_else(PoisonError::into_inner);
        self.urls()
            .into_iter()
            .filter(|(name, _)| !removed.contains(name))
            .collect()
    }

    /// Ends every fault: no partition, every node still in the cluster running (restarted if it
    /// is down).
    pub async fn heal(&self, history: &History) -> anyhow::Result<()> {
        if self.firewall.heal()? {
            history.record("nemesis", "*", Op::Fault(Fault::PartitionHeal));
        }
        let removed = self
            .removed
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        for t in self
            .nodes
            .iter()
            .filter(|t| !removed.contains(&t.node_name))
        {
            t.heal(history).await?;
        }
        Ok(())
    }
}

/// Starts `ids` as a cluster under `dir` (each with `node_toml`), waits for its metadata leader,
/// and creates each `(queue, owner)` with `config`.
pub async fn start(
    dir: &Path,
    ids: &[&str],
    node_toml: &str,
    queues: &[(String, String)],
    config: &pb::QueueConfig,
) -> anyhow::Result<ClusterTarget> {
    let creates: Vec<pb::CreateQueueRequest> = queues
        .iter()
        .map(|(queue, owner)| pinned(queue, owner, config))
        .collect();
    start_with(dir, ids, None, node_toml, &creates, false, &[]).await
}

/// The creation of `queue` placed as the cluster places a queue by default: replicated on 3
/// nodes, in a shared shard, once the cluster has 3 active nodes (1 below that).
pub fn by_default(queue: &str, config: &pb::QueueConfig) -> pb::CreateQueueRequest {
    pb::CreateQueueRequest {
        replicas: 0,
        own_shard: false,
        name: queue.into(),
        config: Some(config.clone()),
        if_not_exists: false,
        node: String::new(),
    }
}

/// The creation of `queue` pinned on `owner` (replication factor 1: not replicated).
pub fn pinned(queue: &str, owner: &str, config: &pb::QueueConfig) -> pb::CreateQueueRequest {
    pb::CreateQueueRequest {
        node: owner.into(),
        ..by_default(queue, config)
    }
}

/// [`start`] with each queue created as `queues` asks; then `learner` joins as a learner owning
/// no queue; with `fake_clocks`, every node runs under libfaketime (its wall clock can jump).
pub async fn start_with(
    dir: &Path,
    ids: &[&str],
    learner: Option<&str>,
    node_toml: &str,
    queues: &[pb::CreateQueueRequest],
    fake_clocks: bool,
    fault_points: &[String],
) -> anyhow::Result<ClusterTarget> {
    let mut firewall = Firewall::new()?;
    // Declared after the firewall: dropped (its nodes killed) before it, on every path.
    let mut cluster = Cluster::plan(dir, false);
    let clock_file = |id: &str| fake_clocks.then(|| dir.join(format!("{id}.clock-offset")));
    for id in ids.iter().chain(learner.iter()) {
        let mut env = match clock_file(id) {
            Some(file) => super::nemesis::fake_clock_env(&file)?,
            None => vec![],
        };
        if !fault_points.is_empty() {
            let points: Vec<String> = fault_points.iter().map(|p| format!("{p}=return")).collect();
            env.push(("FAILPOINTS".into(), points.join(";")));
        }
        cluster.node_env.insert(id.to_string(), env);
    }
    if !fault_points.is_empty() {
        cluster.bin = Some(crate::ferry_faults_bin());
    }
    let mut procs = vec![];
    for (i, id) in ids.iter().enumerate() {
        procs.push(firewall.add_node(id, &cluster.ip(i))?);
    }
    cluster.start_nodes(ids, node_toml, &procs)?;
    cluster.wait_leader(ids, LEADER_WAIT).await?;
    let admin = cluster.nodes[0].client().await?;
    for create in queues {
        admin
            .admin()
            .create_queue(create.clone())
            .await
            .with_context(|| format!("creating {} on {:?}", create.name, create.node))?;
    }
    if let Some(id) = learner {
        let procs = firewall.add_node(id, &cluster.ip(ids.len()))?;
        let join = cluster.peer_addr(0);
        let index = cluster.start_joining_in(id, &join, node_toml, Some(procs))?;
        admin
            .cluster()
            .add_node(pb::AddNodeRequest {
                node_id: id.into(),
                peer_address: cluster.peer_addr(index),
                learner: true,
            })
            .await
            .with_context(|| format!("adding {id}"))?;
        let all: Vec<&str> = ids.iter().chain([&id]).copied().collect();
        cluster.wait_leader(&all, LEADER_WAIT).await?;
    }
    let ips = (0..cluster.nodes.len()).map(|i| cluster.ip(i)).collect();
    let nodes = std::mem::take(&mut cluster.nodes)
        .into_iter()
        .map(|n| Target {
            lazyfs: None,
            clock: clock_file(n.id()),
            node_name: n.id().to_string(),
            node: Arc::new(Mutex::new(n)),
            proxy: None,
        })
        .collect();
    Ok(ClusterTarget {
        nodes,
        ips,
        firewall: Arc::new(firewall),
        removed: Arc::default(),
    })
}

/// With the metadata leader cut off, a queue is created through the majority within this.
pub const META_WRITE_MAX: Duration = Duration::from_secs(5);

/// Creates `queue` placed by default (replicated on the three nodes: its shard's preferred
/// leader may be the node cut off, and another replica then serves it; bug 4 in
/// docs/reliability.md, fixed) through the node at `url`, retrying until `deadline` (with
/// `if_not_exists`: a retry of a creation that took effect is no error).
async fn create_by(url: &str, queue: &str, deadline: tokio::time::Instant) -> anyhow::Result<()> {
    let mut last = String::from("no attempt");
    // Bounded by the deadline; each attempt too.
    while tokio::time::Instant::now() < deadline {
        let attempt = tokio::time::timeout_at(deadline, async {
            let client = ferry_client::Client::connect(url).await?;
            client
                .admin()
                .create_queue(pb::CreateQueueRequest {
                    config: None,
                    if_not_exists: true,
                    ..by_default(queue, &pb::QueueConfig::default())
                })
                .await?;
            Ok::<(), anyhow::Error>(())
        })
        .await;
        match attempt {
            Ok(Ok(())) => return Ok(()),
            Ok(Err(e)) => last = format!("{e:#}"),
            Err(_) => last = "timed out".into(),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    anyhow::bail!("last error: {last}")
}

/// How long a shard may go without a known leader before a kill of its leader gives up (an
/// election takes a second or two; a fault before the kill may have held it up).
pub const SHARD_LEADER_WAIT: Duration = Duration::from_secs(20);

/// The shard holding `queue`, with a leader, as the first of `nodes` (name, URL) that answers
/// `Cluster.ListShards` names it; asked until `timeout` passes.
pub async fn shard_of(
    nodes: &[(String, String)],
    queue: &str,
    timeout: Duration,
) -> anyhow::Result<pb::ShardStatus> {
    let deadline = tokio::time::Instant::now() + timeout;
    let mut last = String::from("no answer");
    // Polled every 100 ms until the deadline; each call bounded by 2 s.
    while tokio::time::Instant::now() < deadline {
        for (name, url) in nodes {
            let listed = tokio::time::timeout(Duration::from_secs(2), async {
                let client = ferry_client::Client::connect(url).await?;
                let shards = client
                    .cluster()
                    .list_shards(pb::ListShardsRequest { shard: 0 })
                    .await?
                    .into_inner()
                    .shards;
                Ok::<_, anyhow::Error>(shards)
            })
            .await;
            let shards = match listed {
                Ok(Ok(shards)) => shards,
                Ok(Err(e)) => {
                    last = format!("{name}: {e:#}");
                    continue;
                }
                Err(_) => {
                    last = format!("{name}: timed out");
                    continue;
                }
            };
            match shards
                .into_iter()
                .find(|s| s.queues.iter().any(|q| q == queue))
            {
                Some(s) if !s.leader.is_empty() => return Ok(s),
                Some(s) => last = format!("{name}: shard {} has no leader", s.shard),
                None => last = format!("{name}: no shard holds {queue}"),
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    anyhow::bail!("no leader of {queue}'s shard within {timeout:?}; last: {last}")
}

/// How long a cluster may take to agree on a metadata leader (at the start, after the heal).
pub const LEADER_WAIT: Duration = Duration::from_secs(30);

/// Waits until every node of `nodes` (name, URL) names the same metadata leader, one of them.
pub async fn wait_leader(nodes: &[(String, String)], timeout: Duration) -> anyhow::Result<String> {
    let deadline = tokio::time::Instant::now() + timeout;
    let mut last = String::new();
    // Polled every 100 ms until the deadline.
    while tokio::time::Instant::now() < deadline {
        let mut leaders = vec![];
        for (_, url) in nodes {
            let seen = tokio::time::timeout(Duration::from_secs(2), status_at(url)).await;
            match seen {
                Ok(Ok(s)) if !s.cluster_id.is_empty() => leaders.push(s.leader_node_id),
                Ok(Ok(_)) => leaders.push(String::new()),
                Ok(Err(e)) => leaders.push(format!("error: {e:#}")),
                Err(_) => leaders.push("status timed out".into()),
            }
        }
        let agreed = leaders.windows(2).all(|w| w[0] == w[1]);
        if let Some(l) = leaders
            .first()
            .filter(|l| agreed && nodes.iter().any(|(n, _)| n == *l))
        {
            return Ok(l.clone());
        }
        last = format!("{leaders:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    anyhow::bail!("no agreed metadata leader within {timeout:?}; last seen: {last}")
}
