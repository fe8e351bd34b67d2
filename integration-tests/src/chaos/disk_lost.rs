//! The `disk-lost` fault: a replica node dies and its data directory is wiped, as when its disk
//! is lost. The operator's procedure follows (`docs/operations.md`, *A lost disk*): every shard
//! replica it held is moved to another node through a surviving one
//! (`Cluster.MoveShardReplica`, the replacement chosen by the cluster), and the fault lasts
//! until every such shard is whole again (a leader, no replica catching up or leaving). The
//! node never comes back under its identity: it is counted as removed, never restarted, and
//! later faults planned on it are skipped.

use std::time::Duration;

use anyhow::Context;
use ferry_client::pb;
use tokio::time::Instant;

use super::cluster::ClusterTarget;
use super::history::{Fault, History, Op};
use super::nemesis::PlannedFault;

/// How long the moves and the shards' catching up may take: each new replica receives its
/// shard's data as a snapshot, a few MiB in a run.
pub const MOVE_MAX: Duration = Duration::from_secs(60);

/// The shards listed by the node at `url`.
async fn list(url: &str) -> anyhow::Result<Vec<pb::ShardStatus>> {
    let client = ferry_client::Client::connect(url).await?;
    Ok(client
        .cluster()
        .list_shards(pb::ListShardsRequest { shard: 0 })
        .await?
        .into_inner()
        .shards)
}

impl ClusterTarget {
    /// See the module docs.
    pub(super) async fn disk_lost(
        &self,
        history: &History,
        f: &PlannedFault,
    ) -> anyhow::Result<()> {
        let name = f
            .node
            .as_deref()
            .context("a lost disk names no node")?
            .to_owned();
        let i = self.index(&name)?;
        self.removed
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .insert(name.clone());
        self.nodes[i]
            .with_node(|n| {
                n.kill9();
                crate::wipe_data(n)
            })
            .await??;
        history.record("nemesis", &name, Op::Fault(Fault::DiskLost));
        let asked = Instant::now();
        let deadline = asked + MOVE_MAX;
        let urls = self.urls();
        let (via, url) = urls[(i + 1) % urls.len()].clone();
        let mut moved = vec![];
        let mut last = String::from("no attempt");
        // Bounded by the deadline, each call too; a shard electing a leader answers UNAVAILABLE.
        while Instant::now() < deadline {
            let step = tokio::time::timeout_at(deadline, self.move_next(&url, &name)).await;
            match step {
                Ok(Ok(Some(shard))) => moved.push(shard),
                Ok(Ok(None)) => break,
                Ok(Err(e)) => last = format!("{e:#}"),
                Err(_) => last = "timed out".into(),
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let whole = self.wait_whole(&url, &moved, deadline).await;
        let took_ms = u64::try_from(asked.elapsed().as_millis()).unwrap_or(u64::MAX);
        whole.with_context(|| format!("moving {name}'s replicas through {via}; last: {last}"))?;
        let event = Fault::ReplicasMoved {
            via,
            shards: moved,
            took_ms,
        };
        history.record("nemesis", &name, Op::Fault(event));
        Ok(())
    }

    /// Moves the replica of the first shard `from` still holds, through the node at `url`; the
    /// shard moved, or `None` when it holds none.
    async fn move_next(&self, url: &str, from: &str) -> anyhow::Result<Option<u64>> {
        let shards = list(url).await?;
        let Some(shard) = shards.iter().find(|s| s.replicas.iter().any(|r| r == from)) else {
            return Ok(None);
        };
        let client = ferry_client::Client::connect(url).await?;
        client
            .cluster()
            .move_shard_replica(pb::MoveShardReplicaRequest {
                shard: shard.shard,
                from_node: from.into(),
                to_node: String::new(),
            })
            .await?;
        Ok(Some(shard.shard))
    }

    /// Waits until each of `shards` has a leader and no replica catching up or leaving.
    async fn wait_whole(&self, url: &str, shards: &[u64], deadline: Instant) -> anyhow::Result<()> {
        let mut last = String::from("not asked");
        // Polled every 100 ms until the deadline; each listing bounded by it.
        while Instant::now() < deadline {
            match tokio::time::timeout_at(deadline, list(url)).await {
                Ok(Ok(listed)) => {
                    let pending: Vec<&pb::ShardStatus> = listed
                        .iter()
                        .filter(|s| shards.contains(&s.shard))
                        .filter(|s| {
                            s.leader.is_empty()
                                || !s.catching_up.is_empty()
                                || !s.leaving.is_empty()
                        })
                        .collect();
                    if pending.is_empty() {
                        return Ok(());
                    }
                    last = format!("{pending:?}");
                }
                Ok(Err(e)) => last = format!("{e:#}"),
                Err(_) => last = "timed out".into(),
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        anyhow::bail!("shards {shards:?} not whole again within {MOVE_MAX:?}: {last}")
    }
}
