//! The nemesis: a fault schedule made from a seed before the run starts (the same seed gives the
//! same schedule), and its execution against a real node process and the proxy in front of it.
//! Every fault and every heal goes into the history with its time. A pause is always resumed,
//! even when the run fails (a guard sends SIGCONT on drop).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use anyhow::Context;
use rand::{Rng, SeedableRng};
use serde::Serialize;

use super::history::{Fault, History, Op};
use super::proxy::{Mode, Proxy};
use crate::Node;

/// The kinds of fault a scenario draws from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum FaultKind {
    Kill9,
    Pause,
    ProxyReset,
    ProxyDelay,
    ProxyBlackhole,
    /// A cluster node cut from the others, both ways.
    Partition,
    /// A cluster node whose packets to the others are dropped (it still hears them).
    Mute,
    /// The node's wall clock stepped by `jump_ms` (libfaketime), then back after `for_ms`
    /// (its monotonic clock runs on).
    ClockJump,
    /// The node removed from the cluster (`RemoveNode` through another node) while clients use
    /// it, and stopped (kill -9) `for_ms` later, for good.
    RemoveNode,
    /// A cluster node that no packet from the others reaches (they still hear it).
    Deaf,
    /// The cluster's metadata leader (found when the fault starts) cut from the others, and a
    /// queue created through the majority.
    PartitionLeader,
    /// kill -9 of the leader of the shard of the queue the fault names (found when the fault
    /// starts), restarted in place after `for_ms`.
    KillShardLeader,
    /// kill -9 of every cluster node at once, as a power cut of the whole cluster does,
    /// restarted in place after `for_ms` (with the `store-power-loss` fault point, each loses
    /// what no completed sync covers).
    PowerCut,
    /// kill -9 of a replica node and its data directory wiped (its disk lost); its shard
    /// replicas moved to the other nodes and waited for until every shard is whole again
    /// (`disk_lost.rs`). Never restarted.
    DiskLost,
}

/// One planned fault: at `at_ms` after the load begins, `kind`, lasting `for_ms` (the node's
/// downtime after a kill, a pause's length, how long the proxy delays or black-holes).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PlannedFault {
    pub at_ms: u64,
    pub kind: FaultKind,
    pub for_ms: u64,
    /// ProxyDelay: the delay of each chunk.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub delay_ms: Option<u64>,
    /// In a cluster: the node it hits.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    /// ClockJump: the step, forward (positive) or back.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub jump_ms: Option<i64>,
    /// KillShardLeader: the queue whose shard's leader it kills.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub queue: Option<String>,
}

/// How faults are drawn.
#[derive(Debug, Clone)]
pub struct FaultPlan {
    pub kinds: Vec<FaultKind>,
    /// Mean time between faults; each falls within ±25 % of its slot.
    pub interval_ms: u64,
    /// The longest a fault lasts (each draws up to this).
    pub for_ms_max: u64,
    /// Every other fault (the first, the third...) is of this kind; the rest are drawn from
    /// `kinds`. `None`: every fault is drawn.
    pub alternate: Option<FaultKind>,
}

/// The schedule of faults over `load_ms`, from `seed` alone. Faults never overlap: each ends
/// before the next slot begins.
pub fn schedule(seed: u64, plan: &FaultPlan, load_ms: u64) -> Vec<PlannedFault> {
    // A stream of its own, so adding a worker never shifts the faults of a seed.
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed ^ 0x6e65_6d65_7369_7300);
    let mut out = vec![];
    if plan.kinds.is_empty() || plan.interval_ms == 0 {
        return out;
    }
    let slot = plan.interval_ms;
    let mut start = slot / 2;
    // Bounded by the load's length.
    let mut slot_index = 0u64;
    while start + slot / 4 < load_ms {
        let at_ms = start + rng.random_range(0..=slot / 4);
        // Drawn even when `alternate` overrides it: a seed's other draws stay the same.
        let drawn = plan.kinds[rng.random_range(0..plan.kinds.len())];
        let kind = match plan.alternate {
            Some(k) if slot_index.is_multiple_of(2) => k,
            _ => drawn,
        };
        slot_index += 1;
        let longest = plan.for_ms_max.min(slot / 2).max(1);
        let for_ms = match kind {
            FaultKind::ProxyReset => 0,
            _ => rng.random_range(longest / 4..=longest),
        };
        let delay_ms = (kind == FaultKind::ProxyDelay).then(|| rng.random_range(20..=200));
        // 5 s to 2 min, either way: past the connection (4 s) and delivery (10 s) leases.
        let jump_ms = (kind == FaultKind::ClockJump).then(|| {
            let step = rng.random_range(5_000..=120_000i64);
            if rng.random_bool(0.5) {
                step
            } else {
                -step
            }
        });
        if at_ms + for_ms < load_ms {
            out.push(PlannedFault {
                at_ms,
                kind,
                for_ms,
                delay_ms,
                node: None,
                jump_ms,
                queue: None,
            });
        }
        start += slot;
    }
    out
}

/// [`schedule`], each fault aimed at one of `nodes`, drawn from a stream of its own (the
/// faults of a seed are those of [`schedule`]).
pub fn cluster_schedule(
    seed: u64,
    plan: &FaultPlan,
    load_ms: u64,
    nodes: &[&str],
) -> Vec<PlannedFault> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed ^ 0x6e6f_6465_7300);
    let mut out = schedule(seed, plan, load_ms);
    if !nodes.is_empty() {
        // The leader is whoever leads when its fault starts.
        for f in out.iter_mut().filter(|f| {
            !matches!(
                f.kind,
                FaultKind::PartitionLeader | FaultKind::KillShardLeader
            )
        }) {
            f.node = Some(nodes[rng.random_range(0..nodes.len())].to_string());
        }
    }
    out
}

/// Aims each [`FaultKind::KillShardLeader`] of `schedule` at one of `queues` (its shard's
/// leader is found when the fault starts), drawn from a stream of its own.
pub fn aim_at_queues(seed: u64, schedule: &mut [PlannedFault], queues: &[String]) {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed ^ 0x0071_7565_7565_7300);
    if queues.is_empty() {
        return;
    }
    for f in schedule
        .iter_mut()
        .filter(|f| f.kind == FaultKind::KillShardLeader)
    {
        f.queue = Some(queues[rng.random_range(0..queues.len())].clone());
    }
}

/// What the nemesis acts on.
#[derive(Debug, Clone)]
pub struct Target {
    pub node: Arc<Mutex<Node>>,
    pub node_name: String,
    pub proxy: Option<Arc<Proxy>>,
    /// The node's data directory is on LazyFS: a kill drops its unsynced writes too.
    pub lazyfs: Option<Arc<super::lazyfs::LazyFs>>,
    /// The node runs under libfaketime, its wall clock's offset read from this file.
    pub clock: Option<PathBuf>,
}

/// libfaketime (Debian's `faketime` package), preloaded into a node whose clock jumps.
pub const LIBFAKETIME: &str = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1";

/// The environment of a node under libfaketime whose wall clock offset is in `file`; its
/// monotonic clock is left alone.
pub fn fake_clock_env(file: &Path) -> anyhow::Result<Vec<(String, String)>> {
    anyhow::ensure!(
        Path::new(LIBFAKETIME).exists(),
        "the clock scenarios need libfaketime ({LIBFAKETIME}): apt-get install faketime"
    );
    set_clock_offset(file, 0)?;
    Ok(vec![
        ("LD_PRELOAD".into(), LIBFAKETIME.into()),
        ("FAKETIME_TIMESTAMP_FILE".into(), file.display().to_string()),
        // Read at every call, so a jump takes effect at once (a node runs some 12 % slower).
        ("FAKETIME_NO_CACHE".into(), "1".into()),
        ("DONT_FAKE_MONOTONIC".into(), "1".into()),
    ])
}

/// Sets the wall clock offset of the node reading `file`.
fn set_clock_offset(file: &Path, offset_ms: i64) -> anyhow::Result<()> {
    // libfaketime's relative format: "+12.5s" or "-3s".
    let text = format!("{:+}s\n", offset_ms as f64 / 1000.0);
    std::fs::write(file, text).with_context(|| format!("writing {}", file.display()))
}

/// Sends SIGCONT to a stopped process when dropped.
#[derive(Debug)]
struct Paused(u32);

impl Drop for Paused {
    fn drop(&mut self) {
        let _ = signal(self.0, "CONT");
    }
}

fn signal(pid: u32, sig: &str) -> anyhow::Result<()> {
    let status = Command::new("kill")
        .arg(format!("-{sig}"))
        .arg(pid.to_string())
        .status()
        .context("running kill")?;
    anyhow::ensure!(status.success(), "kill -{sig} {pid} failed");
    Ok(())
}

impl Target {
    pub(crate) fn with_node<T: Send + 'static>(
        &self,
        f: impl FnOnce(&mut Node) -> T + Send + 'static,
    ) -> tokio::task::JoinHandle<T> {
        let node = self.node.clone();
        tokio::task::spawn_blocking(move || {
            let mut guard = node.lock().unwrap_or_else(PoisonError::into_inner);
            f(&mut guard)
        })
    }

    fn record(&self, history: &History, fault: Fault) {
        history.record("nemesis", &self.node_name, Op::Fault(fault));
    }

    fn proxy(&self) -> anyhow::Result<&Proxy> {
        self.proxy
            .as_deref()
            .context("a proxy fault in a scenario without a proxy")
    }

    /// Injects one fault and heals it after `f.for_ms`.
    pub async fn inject(&self, history: &History, f: &PlannedFault) -> anyhow::Result<()> {
        let lasting = Duration::from_millis(f.for_ms);
        match f.kind {
            FaultKind::Kill9 => {
                self.with_node(Node::kill9).await?;
                self.record(history, Fault::Kill9);
                if let Some(fs) = self.lazyfs.clone() {
                    tokio::task::spawn_blocking(move || fs.clear_cache()).await??;
                    self.record(history, Fault::UnsyncedDropped);
                }
                tokio::time::sleep(lasting).await;
                self.restart(history).await?;
            }
            FaultKind::ClockJump => {
                let file = self
                    .clock
                    .as_deref()
                    .context("a clock jump on a node without a fake clock")?;
                let jump_ms = f.jump_ms.unwrap_or(60_000);
                set_clock_offset(file, jump_ms)?;
                self.record(history, Fault::ClockJump { jump_ms });
                tokio::time::sleep(lasting).await;
                set_clock_offset(file, 0)?;
                self.record(history, Fault::ClockRestored);
            }
            FaultKind::Pause => {
                let pid = self
                    .with_node(|n| n.pid())
                    .await?
                    .context("pausing a node that is not running")?;
                signal(pid, "STOP")?;
                let paused = Paused(pid);
                self.record(history, Fault::Pause);
                tokio::time::sleep(lasting).await;
                drop(paused);
                self.record(history, Fault::Resume);
            }
            FaultKind::ProxyReset => {
                let connections = self.proxy()?.reset_all();
                self.record(history, Fault::ProxyReset { connections });
            }
            FaultKind::ProxyDelay => {
                let delay_ms = f.delay_ms.unwrap_or(100);
                self.proxy()?
                    .set_mode(Mode::Delay(Duration::from_millis(delay_ms)));
                self.record(history, Fault::ProxyDelay { delay_ms });
                tokio::time::sleep(lasting).await;
                self.proxy()?.set_mode(Mode::Forward);
                self.record(history, Fault::ProxyHeal);
            }
            FaultKind::ProxyBlackhole => {
                self.proxy()?.set_mode(Mode::Blackhole);
                self.record(history, Fault::ProxyBlackhole);
                tokio::time::sleep(lasting).await;
                self.proxy()?.set_mode(Mode::Forward);
                self.record(history, Fault::ProxyHeal);
            }
            FaultKind::Partition
            | FaultKind::PartitionLeader
            | FaultKind::Mute
            | FaultKind::Deaf
            | FaultKind::RemoveNode
            | FaultKind::KillShardLeader
            | FaultKind::PowerCut
            | FaultKind::DiskLost => {
                anyhow::bail!("a {:?} fault needs a cluster", f.kind)
            }
        }
        Ok(())
    }

    pub(crate) async fn restart(&self, history: &History) -> anyhow::Result<()> {
        let started = Instant::now();
        self.with_node(Node::restart_in_place).await??;
        self.record(
            history,
            Fault::Restarted {
                took_ms: u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX),
            },
        );
        Ok(())
    }

    /// Ends every fault: the node runs (restarted if it is down), the proxy forwards.
    pub async fn heal(&self, history: &History) -> anyhow::Result<()> {
        if let Some(p) = &self.proxy {
            if p.mode() != Mode::Forward {
                p.set_mode(Mode::Forward);
                self.record(history, Fault::ProxyHeal);
            }
        }
        if self.with_node(|n| n.pid()).await?.is_none() {
            self.restart(history).await?;
        }
        Ok(())
    }
}

/// What a scenario's nemesis acts on: one node (and its proxy) or a cluster.
#[derive(Debug, Clone)]
pub enum Nemesis {
    Node(Target),
    Cluster(super::cluster::ClusterTarget),
}

impl Nemesis {
    /// Injects one fault and heals it after `f.for_ms`.
    pub async fn inject(&self, history: &History, f: &PlannedFault) -> anyhow::Result<()> {
        match self {
            Nemesis::Node(t) => t.inject(history, f).await,
            Nemesis::Cluster(c) => c.inject(history, f).await,
        }
    }

    /// Ends every fault: every node runs and is reachable, the proxy forwards.
    pub async fn heal(&self, history: &History) -> anyhow::Result<()> {
        match self {
            Nemesis::Node(t) => t.heal(history).await,
            Nemesis::Cluster(c) => c.heal(history).await,
        }
    }

    /// Every node, by name.
    pub fn nodes(&self) -> Vec<(String, Arc<Mutex<Node>>)> {
        match self {
            Nemesis::Node(t) => vec![(t.node_name.clone(), t.node.clone())],
            Nemesis::Cluster(c) => c
                .nodes
                .iter()
                .map(|t| (t.node_name.clone(), t.node.clone()))
                .collect(),
        }
    }

    /// Runs `schedule` from `load_start`, fault after fault, each at its time, until the
    /// schedule ends or `stop` turns true (a load that ended early: the fault under way is
    /// finished and healed, no new one starts). With `progress`, a fault starts only once a
    /// send was confirmed after the one before was healed, or `progress` passed: so that each
    /// fault hits a broker that came back and took sends again, however slow the machine (a
    /// broker that does not is reported by the fault windows, and the smoke tests refuse it).
    pub async fn run(
        &self,
        history: &History,
        schedule: &[PlannedFault],
        load_start: tokio::time::Instant,
        progress: Option<Duration>,
        mut stop: tokio::sync::watch::Receiver<bool>,
    ) -> anyhow::Result<()> {
        let mut healed_at: Option<u64> = None;
        for f in schedule {
            let at = load_start + Duration::from_millis(f.at_ms);
            let progressed = async {
                if let (Some(bound), Some(count)) = (progress, healed_at) {
                    history.wait_confirmed_beyond(count, bound).await;
                }
                tokio::time::sleep_until(at).await;
            };
            tokio::select! {
                () = progressed => {}
                _ = stop.wait_for(|s| *s) => return Ok(()),
            }
            self.inject(history, f).await?;
            healed_at = Some(history.confirmed_sends());
        }
        Ok(())
    }
}
