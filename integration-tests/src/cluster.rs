//! Several `ferry server` processes forming one cluster, each on its own loopback address
//! (127.x.y.N, with x.y drawn at random per cluster so that tests running side by side do not
//! meet) on fixed ports, so a node restarted in place keeps the addresses its peers know.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context};
use ferry_client::pb;
use ferry_client::Client;

use crate::{wait_until, Node, NodeOptions};

/// The client port of every node (each has its own address).
pub const CLIENT_PORT: u16 = 7400;
/// The peer port of every node.
pub const PEER_PORT: u16 = 7410;

/// A cluster of real nodes; each is killed when dropped.
#[derive(Debug)]
pub struct Cluster {
    /// The nodes, in the order started.
    pub nodes: Vec<Node>,
    dir: PathBuf,
    /// 127.x.y. — the first three octets of every node's address.
    prefix: String,
    /// Memory storage for every node.
    memory: bool,
    /// Extra environment of a node, by id (set before it starts).
    pub node_env: std::collections::BTreeMap<String, Vec<(String, String)>>,
    /// The server binary of every node: [`crate::ferry_bin`] when `None`
    /// ([`crate::ferry_faults_bin`] for planted faults).
    pub bin: Option<PathBuf>,
}

impl Cluster {
    /// Starts `ids` as the initial voters of a new cluster (data under `dir/<id>`).
    pub fn start(dir: &Path, ids: &[&str]) -> anyhow::Result<Cluster> {
        Self::start_with(dir, ids, false, "")
    }

    /// Like [`Cluster::start`], with every node in memory or not, and extra TOML for each.
    pub fn start_with(
        dir: &Path,
        ids: &[&str],
        memory: bool,
        extra_toml: &str,
    ) -> anyhow::Result<Cluster> {
        let mut cluster = Cluster::plan(dir, memory);
        cluster.start_nodes(ids, extra_toml, &[])?;
        Ok(cluster)
    }

    /// A cluster with its addresses drawn and no node started yet (see
    /// [`Cluster::start_nodes`]): what must know the addresses first (firewall rules) can.
    pub fn plan(dir: &Path, memory: bool) -> Cluster {
        let x = 2 + rand::random::<u8>() % 250;
        let y = rand::random::<u8>();
        Cluster {
            nodes: vec![],
            dir: dir.into(),
            prefix: format!("127.{x}.{y}."),
            memory,
            node_env: Default::default(),
            bin: None,
        }
    }

    /// Starts `ids` as the initial voters (with extra TOML for each); node `i` runs in the
    /// cgroup whose `cgroup.procs` is `cgroup_procs[i]`, when given.
    pub fn start_nodes(
        &mut self,
        ids: &[&str],
        extra_toml: &str,
        cgroup_procs: &[PathBuf],
    ) -> anyhow::Result<()> {
        let initial = ids
            .iter()
            .enumerate()
            .map(|(i, id)| format!("{id}={}", self.peer_addr(i)))
            .collect::<Vec<_>>()
            .join(",");
        for (i, id) in ids.iter().enumerate() {
            let toml = format!("{extra_toml}\n[cluster]\ninitial = \"{initial}\"\n");
            let node = self.spawn(i, id, &toml, cgroup_procs.get(i).cloned())?;
            self.nodes.push(node);
        }
        Ok(())
    }

    /// The loopback address of the node at `index` (started or to be).
    pub fn ip(&self, index: usize) -> String {
        format!("{}{}", self.prefix, index + 1)
    }

    /// The peer address of the node at `index` (started or to be).
    pub fn peer_addr(&self, index: usize) -> String {
        format!("{}:{PEER_PORT}", self.ip(index))
    }

    fn spawn(
        &self,
        index: usize,
        id: &str,
        toml: &str,
        cgroup_procs: Option<PathBuf>,
    ) -> anyhow::Result<Node> {
        let options = NodeOptions {
            node_id: id.into(),
            extra_toml: toml.into(),
            memory: self.memory,
            cgroup_procs,
            env: self.node_env.get(id).cloned().unwrap_or_default(),
            bin: self.bin.clone(),
            ..Default::default()
        };
        Node::start_at(
            &self.dir.join(id),
            options,
            &format!("{}:{CLIENT_PORT}", self.ip(index)),
            &self.peer_addr(index),
        )
    }

    /// Starts a node with `--join` through the node at `via`; it waits until added.
    pub fn start_joining(&mut self, id: &str, via: usize) -> anyhow::Result<usize> {
        let addr = self.peer_addr(via);
        self.start_joining_to(id, &addr)
    }

    /// Starts a node with `--join ADDR`; its index once it runs.
    pub fn start_joining_to(&mut self, id: &str, addr: &str) -> anyhow::Result<usize> {
        self.start_joining_in(id, addr, "", None)
    }

    /// [`Cluster::start_joining_to`] with extra TOML, in the cgroup whose `cgroup.procs` is
    /// given.
    pub fn start_joining_in(
        &mut self,
        id: &str,
        addr: &str,
        extra_toml: &str,
        cgroup_procs: Option<PathBuf>,
    ) -> anyhow::Result<usize> {
        let index = self.nodes.len();
        let toml = format!("{extra_toml}\n[cluster]\njoin = \"{addr}\"\n");
        let node = self.spawn(index, id, &toml, cgroup_procs)?;
        self.nodes.push(node);
        Ok(index)
    }

    /// The node called `id`.
    pub fn node(&self, id: &str) -> &Node {
        self.nodes
            .iter()
            .find(|n| n.id() == id)
            .unwrap_or_else(|| panic!("no node {id} in the cluster"))
    }

    /// The node called `id`, to kill or restart.
    pub fn node_mut(&mut self, id: &str) -> &mut Node {
        self.nodes
            .iter_mut()
            .find(|n| n.id() == id)
            .unwrap_or_else(|| panic!("no node {id} in the cluster"))
    }

    /// Waits until the node called `asked` knows a metadata leader among `candidates` that
    /// every node in `candidates` agrees on (and the cluster is formed); returns its id.
    pub async fn wait_leader(
        &self,
        candidates: &[&str],
        timeout: Duration,
    ) -> anyhow::Result<String> {
        wait_until(timeout, "an agreed metadata leader", || async move {
            let mut seen = vec![];
            for id in candidates {
                match status(self.node(id)).await {
                    Ok(s) if !s.cluster_id.is_empty() => seen.push(s.leader_node_id),
                    _ => return Ok(false),
                }
            }
            Ok(seen.windows(2).all(|w| w[0] == w[1])
                && seen
                    .first()
                    .is_some_and(|l| candidates.contains(&l.as_str())))
        })
        .await?;
        Ok(status(self.node(candidates[0])).await?.leader_node_id)
    }

    /// Waits until every node in `candidates` names the same leader, one of them, in the same
    /// term above `above_term`: a leader elected after that term. Returns its id and term.
    pub async fn wait_leader_above(
        &self,
        candidates: &[&str],
        above_term: u64,
        timeout: Duration,
    ) -> anyhow::Result<(String, u64)> {
        // The (leader, term) each candidate named when last asked.
        let last = std::cell::RefCell::new(vec![]);
        let what = format!("a metadata leader among {candidates:?} in a term above {above_term}");
        wait_until(timeout, &what, || {
            let last = &last;
            async move {
                let mut seen = vec![];
                for id in candidates {
                    match status(self.node(id)).await {
                        Ok(s) => seen.push((s.leader_node_id, s.term)),
                        // A survivor that cannot answer yet is asked again.
                        Err(_) => return Ok(false),
                    }
                }
                let agreed = seen.windows(2).all(|w| w[0] == w[1]);
                let done = agreed
                    && seen.first().is_some_and(|(leader, term)| {
                        *term > above_term && candidates.contains(&leader.as_str())
                    });
                *last.borrow_mut() = seen;
                Ok(done)
            }
        })
        .await
        .with_context(|| {
            format!(
                "(leader, term) as each of {candidates:?} saw it: {:?}",
                last.borrow()
            )
        })?;
        let seen = last.into_inner();
        seen.into_iter()
            .next()
            .context("invariant: the wait succeeded with every candidate's answer")
    }
}

/// The cluster status as `node` sees it.
pub async fn status(node: &Node) -> anyhow::Result<pb::ClusterStatus> {
    status_at(&node.url()).await
}

/// The cluster status as the node serving `url` sees it.
pub async fn status_at(url: &str) -> anyhow::Result<pb::ClusterStatus> {
    let client = Client::connect(url).await?;
    Ok(client
        .cluster()
        .get_cluster_status(pb::GetClusterStatusRequest {})
        .await?
        .into_inner())
}

/// Creates an unreplicated queue (replication factor 1: the default on 3 or more nodes is 3)
/// pinned to `owner`, or placed by the rule (the node owning the fewest queues) with `None`.
pub async fn create_queue_on(
    client: &Client,
    name: &str,
    owner: Option<&str>,
) -> anyhow::Result<pb::CreateQueueResponse> {
    Ok(client
        .admin()
        .create_queue(pb::CreateQueueRequest {
            replicas: 1,
            own_shard: false,
            name: name.into(),
            config: None,
            if_not_exists: false,
            node: owner.unwrap_or_default().into(),
        })
        .await
        .with_context(|| format!("creating {name}"))?
        .into_inner())
}

/// Creates `name` with replication factor 3; its shard.
pub async fn create_replicated(client: &Client, name: &str) -> anyhow::Result<u64> {
    client
        .admin()
        .create_queue(pb::CreateQueueRequest {
            name: name.into(),
            replicas: 3,
            ..Default::default()
        })
        .await
        .with_context(|| format!("creating {name}"))?;
    let shard = client
        .admin()
        .get_queue(pb::GetQueueRequest { name: name.into() })
        .await?
        .into_inner()
        .shard;
    anyhow::ensure!(shard != 0, "a replicated queue is in a shard");
    Ok(shard)
}

/// Waits until `node` sees every node in `ids` with `health`.
pub async fn wait_health(
    node: &Node,
    ids: &[&str],
    health: &str,
    timeout: Duration,
) -> anyhow::Result<()> {
    wait_until(
        timeout,
        &format!("{ids:?} {health} as seen by {}", node.id()),
        || async {
            let s = status(node).await?;
            Ok(ids.iter().all(|id| {
                s.nodes
                    .iter()
                    .any(|n| n.node_id == *id && n.health == health)
            }))
        },
    )
    .await
}

/// Fails unless `result` is an error with `code` whose message contains `needle`.
pub fn expect_error<T: std::fmt::Debug>(
    result: Result<T, tonic::Status>,
    code: tonic::Code,
    needle: &str,
) -> anyhow::Result<()> {
    match result {
        Err(s) if s.code() == code && s.message().contains(needle) => Ok(()),
        other => bail!("expected {code:?} containing {needle:?}, got {other:?}"),
    }
}
