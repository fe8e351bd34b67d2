//! The scenarios, each at smoke size (the test suite) or full size (`scripts/chaos`), and the
//! run: start a node (and a proxy) or a cluster, load it while the nemesis follows its schedule, heal, drain
//! every queue, check, report.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use anyhow::Context;
use ferry_client::pb;
use tokio::task::JoinSet;
use tokio::time::Instant;

use super::checker::{self, CheckOptions, DeadLetterRule};
use super::history::{History, Op};
use super::nemesis::{self, FaultKind, FaultPlan, Nemesis, Target};
use super::proxy::Proxy;
use super::report::Report;
use super::workload::{self, ConsumerKind, ConsumerSpec, Ctx, DrainMode, ProducerSpec};
use crate::{Node, NodeOptions};

/// The scenarios `scripts/chaos` knows.
pub const SCENARIOS: [&str; 15] = [
    "kill9",
    "activemq-200k",
    "poison",
    "pause",
    "proxy",
    "kill9-auto-receive",
    "cluster",
    "cluster-meta",
    "cluster-auto-receive",
    "cluster-one-way",
    "cluster-clock",
    "cluster-remove",
    "power-loss",
    "lazyfs",
    "clock",
];

/// The planted bugs `scripts/chaos --planted BUG` switches on (fault points of the `ferry-faults`
/// build, docs/reliability.md), each with the scenario that must catch it and what the checker
/// must then report.
pub const PLANTED: [(&str, &str, &str); 2] = [
    ("confirm-before-durable", "power-loss", "lost"),
    ("skip-delivery-count", "kill9", "unflagged duplicates"),
];

/// How big a run is.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Size {
    /// Seconds, for the test suite.
    Smoke,
    /// The load phase lasts this many minutes (at most; activemq-200k ends when its messages
    /// are through).
    Full { minutes: f64 },
}

/// Everything a run does, decided before it starts.
#[derive(Debug, Clone)]
pub struct Spec {
    pub name: String,
    pub seed: u64,
    pub size: Size,
    pub load: Duration,
    pub faults: FaultPlan,
    pub proxy: bool,
    /// TOML added to the node's config.
    pub node_toml: String,
    pub queue: String,
    pub queue_config: pb::QueueConfig,
    pub producers: Vec<ProducerSpec>,
    pub consumers: Vec<ConsumerSpec>,
    /// A second queue with one producer and one client-ack consumer, whose order is checked.
    pub ordered_queue: Option<String>,
    /// Poison: every message must end in `<queue>.DLQ` after this many deliveries.
    pub max_deliveries: Option<u32>,
    /// The load ends when the producers are done and the queue is empty (or at `load`).
    pub until_consumed: bool,
    pub op_timeout: Duration,
    /// The nodes of a cluster scenario (empty: one node, `n1`). Each owns the queue
    /// `chaos-<node>`; `queue` is unused.
    pub cluster: Vec<String>,
    /// Fault points switched on in the node (`FAILPOINTS`); not empty: the node runs the
    /// `ferry-faults` build (one node only).
    pub fault_points: Vec<String>,
    /// The node's data directory is on LazyFS, and each kill drops its unsynced writes.
    pub lazyfs: bool,
    /// The node runs under libfaketime, so its wall clock can jump.
    pub fake_clock: bool,
    /// A cluster node that joins as a learner owning no queue (clients use it too), removed
    /// halfway through the load and stopped.
    pub learner: Option<String>,
}

/// Node settings every scenario shares: short connection leases, so a client that vanished
/// gives its messages back within seconds.
const NODE_TOML: &str = "
[limits]
connection_lease_default_ms = 4000
delivery_lease_default_ms = 10000
";

fn policy(max_redeliveries: Option<u32>) -> pb::QueueConfig {
    pb::QueueConfig {
        redelivery: Some(pb::RedeliveryPolicy {
            unlimited_redeliveries: max_redeliveries.is_none(),
            max_redeliveries,
            initial_delay_ms: Some(20),
            delay_ms: Some(20),
            ..Default::default()
        }),
        // Longer than any run: a retried send is always recognised.
        dedup_window_ms: Some(3_600_000),
        ..Default::default()
    }
}

fn producers(
    queue: &str,
    n: u32,
    batch: u32,
    values_max: u64,
    pad_bytes: usize,
) -> Vec<ProducerSpec> {
    (0..n)
        .map(|id| ProducerSpec {
            id,
            queue: queue.into(),
            batch,
            values_max,
            pad_bytes,
        })
        .collect()
}

fn consumer(id: u32, queue: &str, kind: ConsumerKind, batch: u32) -> ConsumerSpec {
    ConsumerSpec {
        id,
        queue: queue.into(),
        kind,
        batch,
        lifetime_ms_max: None,
        kill_percent: 0,
    }
}

/// The usual mix: a client-ack receiver, an auto-ack receiver, an auto-ack stream, a client-ack
/// stream. (The `*-auto-receive` scenarios run auto-ack receivers only: the consumer of bugs 1
/// and 2, docs/reliability.md.)
fn mixed_consumers(queue: &str) -> Vec<ConsumerSpec> {
    vec![
        consumer(0, queue, ConsumerKind::ClientAck, 10),
        consumer(1, queue, ConsumerKind::AutoAck, 10),
        consumer(2, queue, ConsumerKind::AutoAckStream, 10),
        consumer(3, queue, ConsumerKind::Stream, 20),
    ]
}

/// Only auto-acknowledge receives: the consumer that lost messages at a kill -9 (its ack's
/// outcome unknown, the client threw the batch away).
fn auto_receive_consumers(queue: &str) -> Vec<ConsumerSpec> {
    (0..4)
        .map(|i| consumer(i, queue, ConsumerKind::AutoAck, 10))
        .collect()
}

/// The spec of scenario `name`.
pub fn spec(name: &str, seed: u64, size: Size) -> anyhow::Result<Spec> {
    let smoke = size == Size::Smoke;
    let load = match size {
        Size::Smoke => Duration::from_secs(8),
        Size::Full { minutes } => Duration::from_secs_f64(minutes * 60.0),
    };
    // Full size: a fault every 10 s; smoke: every 2 s.
    let interval_ms = if smoke { 2_000 } else { 10_000 };
    let queue = "chaos".to_string();
    let mut s = Spec {
        name: name.into(),
        seed,
        size,
        load,
        faults: FaultPlan {
            kinds: vec![],
            interval_ms,
            for_ms_max: 0,
        },
        proxy: false,
        node_toml: NODE_TOML.into(),
        queue: queue.clone(),
        queue_config: policy(None),
        producers: producers(&queue, 4, 1, u64::MAX, 16),
        consumers: mixed_consumers(&queue),
        ordered_queue: None,
        max_deliveries: None,
        until_consumed: false,
        op_timeout: Duration::from_secs(5),
        cluster: vec![],
        fault_points: vec![],
        lazyfs: false,
        fake_clock: false,
        learner: None,
    };
    match name {
        "kill9" | "kill9-auto-receive" | "power-loss" | "lazyfs" => {
            if name == "kill9-auto-receive" {
                s.consumers = auto_receive_consumers(&queue);
            }
            // `power-loss`: kill9 on a store that loses every write no completed sync covers
            // (a kill -9 alone keeps what the process handed to the kernel).
            if name == "power-loss" {
                s.fault_points = vec![ferry_store::faults::POWER_LOSS.into()];
            }
            // `lazyfs`: the same with the release build, its data on LazyFS, which drops
            // whatever was not fsynced at each kill.
            s.lazyfs = name == "lazyfs";
            s.faults.kinds = vec![FaultKind::Kill9];
            s.faults.for_ms_max = 500;
            s.ordered_queue = Some("chaos-ordered".into());
        }
        "clock" => {
            // The wall clock stepped 5 s to 2 min forward or back, for 1-4 s (smoke: up to
            // 1 s), then back: leases, delays and timestamps run on it.
            s.fake_clock = true;
            s.faults.kinds = vec![FaultKind::ClockJump];
            s.faults.for_ms_max = if smoke { 1_000 } else { 4_000 };
            s.ordered_queue = Some("chaos-ordered".into());
        }
        "pause" => {
            s.faults.kinds = vec![FaultKind::Pause];
            s.faults.for_ms_max = if smoke { 1_000 } else { 4_000 };
        }
        "proxy" => {
            s.proxy = true;
            s.faults.kinds = vec![
                FaultKind::ProxyReset,
                FaultKind::ProxyDelay,
                FaultKind::ProxyBlackhole,
            ];
            s.faults.for_ms_max = if smoke { 1_000 } else { 3_000 };
            s.ordered_queue = Some("chaos-ordered".into());
        }
        "activemq-200k" => {
            // 200 000 messages of ~60 bytes behind a 256 KiB budget (some 4 000 fit); at smoke
            // size 12 000 behind 24 KiB. Consumers come and go; a third of them die mid-whatever.
            let (total, budget) = if smoke {
                (12_000u64, 24_576)
            } else {
                (200_000, 262_144)
            };
            s.node_toml = format!(
                "{NODE_TOML}\n[paging]\nqueue_memory_budget_bytes = {budget}\nnode_memory_budget_bytes = {budget}\n"
            );
            s.producers = producers(&queue, 4, if smoke { 100 } else { 500 }, total / 4, 40);
            s.consumers = (0..4)
                .map(|id| ConsumerSpec {
                    lifetime_ms_max: Some(if smoke { 400 } else { 1_500 }),
                    kill_percent: 35,
                    ..consumer(id, &queue, ConsumerKind::ClientAck, 50)
                })
                .collect();
            s.until_consumed = true;
            if smoke {
                s.load = Duration::from_secs(40);
            }
        }
        "poison" => {
            // Every message is given back until it is dead-lettered: 1 + 3 deliveries. At full
            // size (20 000 messages) the node is also killed every 3 s: the delivery count
            // survives restarts.
            s.queue = "poison".into();
            s.queue_config = policy(Some(3));
            s.max_deliveries = Some(4);
            s.producers = producers("poison", 2, 10, if smoke { 100 } else { 10_000 }, 16);
            s.consumers = vec![
                consumer(0, "poison", ConsumerKind::PoisonNack, 10),
                consumer(1, "poison", ConsumerKind::PoisonNack, 10),
                consumer(2, "poison", ConsumerKind::PoisonRollback, 10),
                consumer(3, "poison", ConsumerKind::PoisonRollback, 10),
            ];
            if !smoke {
                // The load lasts about as long as the messages take to go through: a kill
                // every 3 s, so several land in it.
                s.faults.kinds = vec![FaultKind::Kill9];
                s.faults.interval_ms = 3_000;
                s.faults.for_ms_max = 500;
            }
            s.until_consumed = true;
            if smoke {
                s.load = Duration::from_secs(30);
            }
        }
        "cluster"
        | "cluster-meta"
        | "cluster-auto-receive"
        | "cluster-one-way"
        | "cluster-clock"
        | "cluster-remove" => {
            // Three nodes, a queue on each; 2 producers and 2 consumers per queue, each first
            // connected through a node that does not own its queue. `cluster`: every 10 s
            // (smoke: 2 s) one node is killed, paused or cut from the other two.
            // `cluster-meta`: every 15 s (smoke: 6 s) the metadata leader is cut from the
            // other two, and a queue is created through them. `cluster-auto-receive`: as
            // `cluster` with auto-ack `Session::receive` consumers only (bug 2).
            s.cluster = ["n1", "n2", "n3"].map(String::from).to_vec();
            let queues = s.queues();
            s.producers = (0..6)
                .map(|id| ProducerSpec {
                    id,
                    ..producers_one(&queues[id as usize % 3])
                })
                .collect();
            // Consumer `id` takes queue `id mod 3`: each queue gets two different kinds, and
            // every kind is in the run.
            let kinds = match name {
                "cluster-auto-receive" => [ConsumerKind::AutoAck; 6],
                _ => [
                    ConsumerKind::ClientAck,
                    ConsumerKind::Stream,
                    ConsumerKind::AutoAck,
                    ConsumerKind::AutoAckStream,
                    ConsumerKind::AutoAck,
                    ConsumerKind::ClientAck,
                ],
            };
            s.consumers = (0..6u32)
                .map(|id| consumer(id, &queues[id as usize % 3], kinds[id as usize], 10))
                .collect();
            s.faults.kinds = vec![FaultKind::Kill9, FaultKind::Pause, FaultKind::Partition];
            s.faults.for_ms_max = if smoke { 1_000 } else { 4_000 };
            // `cluster-one-way`: a node muted (its packets to the others dropped), deafened
            // (theirs to it dropped) or cut both ways.
            if name == "cluster-one-way" {
                s.faults.kinds = vec![FaultKind::Mute, FaultKind::Deaf, FaultKind::Partition];
            }
            // `cluster-clock`: a node's wall clock stepped 5 s to 2 min forward or back, for
            // 1-4 s (smoke: up to 1 s), then back; Raft runs on the monotonic clock.
            if name == "cluster-clock" {
                s.fake_clock = true;
                s.faults.kinds = vec![FaultKind::ClockJump];
            }
            // `cluster-remove`: as `cluster`, with a fourth node, n4, a learner owning no queue
            // that clients use too, removed halfway through the load and stopped 1 s later.
            if name == "cluster-remove" {
                s.learner = Some("n4".into());
            }
            if name == "cluster-meta" {
                s.faults.kinds = vec![FaultKind::PartitionLeader];
                s.faults.interval_ms = if smoke { 6_000 } else { 15_000 };
                s.faults.for_ms_max = if smoke { 3_000 } else { 7_000 };
                if smoke {
                    s.load = Duration::from_secs(14);
                }
            }
        }
        other => anyhow::bail!("no scenario {other:?}; there are {SCENARIOS:?}"),
    }
    Ok(s)
}

impl Spec {
    /// Switches planted bug `bug` (a name of [`PLANTED`]) on in the node.
    pub fn plant(&mut self, bug: &str) -> anyhow::Result<()> {
        if !PLANTED.iter().any(|(name, _, _)| *name == bug) {
            let names: Vec<&str> = PLANTED.iter().map(|(name, _, _)| *name).collect();
            anyhow::bail!("no planted bug {bug:?}; there are {names:?}");
        }
        if !self.cluster.is_empty() {
            anyhow::bail!(
                "planted bugs run on one node; {} is a cluster scenario",
                self.name
            );
        }
        self.fault_points.push(format!("planted-{bug}"));
        Ok(())
    }

    fn size_name(&self) -> String {
        match self.size {
            Size::Smoke => "smoke".into(),
            Size::Full { minutes } => format!("full ({minutes} min)"),
        }
    }

    fn queues(&self) -> Vec<String> {
        if !self.cluster.is_empty() {
            return self.cluster.iter().map(|n| format!("chaos-{n}")).collect();
        }
        let mut q = vec![self.queue.clone()];
        q.extend(self.ordered_queue.clone());
        q
    }
}

/// The node or nodes (their data directory lives as long as they do) and the proxy of a run.
struct Started {
    nemesis: Nemesis,
    /// Where the workers connect first: the node, or the proxy in front of it.
    client_url: String,
    /// Every node as (name, client URL).
    nodes: Vec<(String, String)>,
    // Dropped last: the nodes are killed first (fields drop in declaration order).
    _data: tempfile::TempDir,
}

/// Starts the node, creates the queues, starts the proxy; or starts the cluster.
async fn start(spec: &Spec) -> anyhow::Result<Started> {
    let data = tempfile::tempdir()?;
    if !spec.cluster.is_empty() {
        let ids: Vec<&str> = spec.cluster.iter().map(String::as_str).collect();
        let queues: Vec<(String, String)> = spec
            .queues()
            .into_iter()
            .zip(spec.cluster.clone())
            .collect();
        let target = super::cluster::start_with(
            data.path(),
            &ids,
            spec.learner.as_deref(),
            &spec.node_toml,
            &queues,
            &spec.queue_config,
            spec.fake_clock,
        )
        .await?;
        let nemesis = Nemesis::Cluster(target);
        let nodes = node_urls(&nemesis);
        return Ok(Started {
            client_url: nodes[0].1.clone(),
            nemesis,
            nodes,
            _data: data,
        });
    }
    let lazyfs = match spec.lazyfs {
        true => Some(Arc::new(super::lazyfs::LazyFs::mount(data.path())?)),
        false => None,
    };
    let clock = spec.fake_clock.then(|| data.path().join("clock-offset"));
    let mut env = match &clock {
        Some(file) => nemesis::fake_clock_env(file)?,
        None => vec![],
    };
    let node = Node::start(
        lazyfs.as_ref().map_or(data.path(), |fs| fs.dir.as_path()),
        NodeOptions {
            log_dir: Some(data.path().into()),
            node_id: "n1".into(),
            extra_toml: spec.node_toml.clone(),
            env: {
                if !spec.fault_points.is_empty() {
                    let points: Vec<String> = spec
                        .fault_points
                        .iter()
                        .map(|p| format!("{p}=return"))
                        .collect();
                    env.push(("FAILPOINTS".into(), points.join(";")));
                }
                env
            },
            bin: (!spec.fault_points.is_empty()).then(crate::ferry_faults_bin),
            ..NodeOptions::default()
        },
    )?;
    let admin = node.client().await?;
    for q in spec.queues() {
        admin
            .admin()
            .create_queue(pb::CreateQueueRequest {
                name: q.clone(),
                config: Some(spec.queue_config.clone()),
                if_not_exists: false,
                node: String::new(),
            })
            .await
            .with_context(|| format!("creating {q}"))?;
    }
    let proxy = match spec.proxy {
        true => Some(Arc::new(Proxy::start(node.addr).await?)),
        false => None,
    };
    let nodes = vec![("n1".to_string(), node.url())];
    Ok(Started {
        client_url: proxy.as_ref().map_or(node.url(), |p| p.url()),
        nemesis: Nemesis::Node(Target {
            node: Arc::new(Mutex::new(node)),
            node_name: "n1".into(),
            proxy,
            lazyfs,
            clock,
        }),
        nodes,
        _data: data,
    })
}

/// Every node's client URL (fixed: a node restarts in place).
fn node_urls(nemesis: &Nemesis) -> Vec<(String, String)> {
    nemesis
        .nodes()
        .into_iter()
        .map(|(name, node)| {
            let url = node.lock().unwrap_or_else(PoisonError::into_inner).url();
            (name, url)
        })
        .collect()
}

/// Runs `spec`, writing `<name>-<seed>.json`, `<name>-<seed>.history.jsonl` and, when the run
/// is not valid, each node's log into `out_dir`. Everything it starts is gone when it returns.
pub async fn run(spec: &Spec, out_dir: &Path) -> anyhow::Result<Report> {
    std::fs::create_dir_all(out_dir)?;
    let started = start(spec).await?;
    let history = History::new();
    let load_ms = u64::try_from(spec.load.as_millis())?;
    let mut schedule = match spec.cluster.is_empty() {
        true => nemesis::schedule(spec.seed, &spec.faults, load_ms),
        false => {
            let ids: Vec<&str> = spec.cluster.iter().map(String::as_str).collect();
            nemesis::cluster_schedule(spec.seed, &spec.faults, load_ms, &ids)
        }
    };
    if let Some(learner) = &spec.learner {
        // Halfway through the load, between two slots of the other faults (the nemesis runs
        // them one after another: a fault under way delays the next).
        let at_ms = load_ms / 2;
        let at = schedule.partition_point(|f| f.at_ms <= at_ms);
        schedule.insert(
            at,
            nemesis::PlannedFault {
                at_ms,
                kind: FaultKind::RemoveNode,
                for_ms: 1_000,
                delay_ms: None,
                node: Some(learner.clone()),
                jump_ms: None,
            },
        );
    }
    let (stop_tx, stop) = tokio::sync::watch::channel(false);
    let ctx = Ctx {
        history: history.clone(),
        node_name: "n1".into(),
        url: started.client_url.clone(),
        op_timeout: spec.op_timeout,
        stop,
        seed: spec.seed,
        nodes: match spec.cluster.is_empty() {
            true => vec![],
            false => started.nodes.clone(),
        },
    };
    let mut run_errors = vec![];
    load(
        spec,
        &ctx,
        &started.nemesis,
        &schedule,
        stop_tx,
        &mut run_errors,
    )
    .await;
    if !spec.cluster.is_empty() {
        let members = match &started.nemesis {
            Nemesis::Cluster(c) => c.member_urls(),
            Nemesis::Node(_) => started.nodes.clone(),
        };
        let agreed = super::cluster::wait_leader(&members, super::cluster::LEADER_WAIT);
        if let Err(e) = agreed.await {
            run_errors.push(format!("after the heal: {e:#}"));
        }
    }
    history.record(
        "runner",
        "n1",
        Op::Phase {
            name: "drain".into(),
        },
    );
    let drain_ctx = Ctx {
        url: started.nodes[0].1.clone(),
        ..ctx.clone()
    };
    drain_all(spec, &drain_ctx, &mut run_errors).await;
    history.record(
        "runner",
        "n1",
        Op::Phase {
            name: "done".into(),
        },
    );
    if history.overflowed() {
        run_errors.push(format!(
            "the history reached {} events and dropped the rest",
            super::history::EVENTS_MAX
        ));
    }
    let options = check_options(spec, &history);
    let verdict = checker::check(&history, &options);
    let stem = format!("{}-{}", spec.name, spec.seed);
    let history_path = out_dir.join(format!("{stem}.history.jsonl"));
    history.write_jsonl(&history_path)?;
    let mut report = Report::new(
        &spec.name,
        spec.seed,
        &spec.size_name(),
        load_ms,
        schedule,
        &history,
        verdict,
        run_errors,
        history_path.display().to_string(),
    );
    report.fault_points = spec.fault_points.clone();
    report.dead_letter_exact_checked = options.dead_letter_rule.map(|r| r.exact);
    std::fs::write(
        out_dir.join(format!("{stem}.json")),
        serde_json::to_string_pretty(&report)?,
    )?;
    for (name, node) in started.nemesis.nodes() {
        let mut node = node.lock().unwrap_or_else(PoisonError::into_inner);
        if !report.valid {
            let log = node.log();
            // One node: `<stem>.node.log`, as before; a cluster: `<stem>.<name>.log`.
            let file = match spec.cluster.is_empty() {
                true => format!("{stem}.node.log"),
                false => format!("{stem}.{name}.log"),
            };
            std::fs::write(out_dir.join(file), log)?;
        }
        // Killed here, before the firewall's rules and cgroups are removed.
        node.kill9();
    }
    Ok(report)
}

/// The load phase with the nemesis, then the heal; returns when every worker has stopped.
async fn load(
    spec: &Spec,
    ctx: &Ctx,
    nemesis: &Nemesis,
    schedule: &[nemesis::PlannedFault],
    stop_tx: tokio::sync::watch::Sender<bool>,
    run_errors: &mut Vec<String>,
) {
    let history = &ctx.history;
    let load_start = Instant::now();
    history.record(
        "runner",
        "n1",
        Op::Phase {
            name: "load".into(),
        },
    );
    let (mut producers, mut consumers) = (JoinSet::new(), JoinSet::new());
    let settle_by = load_start + spec.load + Duration::from_secs(30);
    // In a cluster, producer `i` starts on node `i + 1` and consumer `i` on node `i + 2`
    // (modulo 3): neither on the node that owns its queue (`i` modulo 3).
    for p in spec.producers.clone() {
        let via = p.id as usize + 1;
        producers.spawn(workload::producer(ctx.clone().via(via), p, settle_by));
    }
    for c in spec.consumers.clone() {
        let via = c.id as usize + 2;
        consumers.spawn(workload::consumer(ctx.clone().via(via), c));
    }
    if let Some(q) = &spec.ordered_queue {
        let p = ProducerSpec {
            id: 1_000,
            ..producers_one(q)
        };
        producers.spawn(workload::producer(ctx.clone(), p, settle_by));
        let c = consumer(1_000, q, ConsumerKind::ClientAck, 10);
        consumers.spawn(workload::consumer(ctx.clone(), c));
    }
    let mut nemesis_task = {
        let (target, history, schedule) = (nemesis.clone(), history.clone(), schedule.to_vec());
        let stop = ctx.stop.clone();
        tokio::spawn(async move { target.run(&history, &schedule, load_start, stop).await })
    };
    let load_end = load_start + spec.load;
    if spec.until_consumed {
        wait_consumed(ctx, spec, &mut producers, load_end, run_errors).await;
    } else {
        tokio::time::sleep_until(load_end).await;
    }
    // The load goes on until the nemesis has run its whole schedule and healed, and a send was
    // confirmed after that: a fault late in the load is still one the run went on through.
    match timeout_at(load_end + Duration::from_secs(30), &mut nemesis_task).await {
        Some(Ok(Ok(()))) => {}
        Some(Ok(Err(e))) => run_errors.push(format!("nemesis: {e:#}")),
        Some(Err(e)) => run_errors.push(format!("nemesis: {e}")),
        None => {
            // Aborting drops its pause guard: a paused node is resumed.
            nemesis_task.abort();
            run_errors.push("the nemesis did not finish its schedule in time".into());
        }
    }
    if let Err(e) = nemesis.heal(history).await {
        run_errors.push(format!("heal: {e:#}"));
    }
    if !spec.until_consumed && !schedule.is_empty() {
        wait_confirmed_after_heal(history, &mut producers, run_errors).await;
    }
    let _ = stop_tx.send(true);
    history.record(
        "runner",
        "n1",
        Op::Phase {
            name: "heal".into(),
        },
    );
    // Workers end at the stop signal, producers once their last batch settles.
    let workers_by = Instant::now() + spec.op_timeout * 3 + Duration::from_secs(35);
    for (what, set) in [("producer", &mut producers), ("consumer", &mut consumers)] {
        join_all(set, what, workers_by, run_errors).await;
    }
}

/// Waits, at most [`AFTER_HEAL_WAIT`], until a send was confirmed after the last event of the
/// history (the nemesis's heal), while producers still run. Checks every 50 ms: the condition
/// is the history's, which has no signal of its own. Does not fail: a run that confirms nothing
/// after its last heal is reported so (`confirmed_after_last_heal`), and the smoke tests refuse
/// it.
async fn wait_confirmed_after_heal(
    history: &History,
    producers: &mut JoinSet<anyhow::Result<()>>,
    run_errors: &mut Vec<String>,
) {
    let healed_us = history.now_us();
    let until = Instant::now() + AFTER_HEAL_WAIT;
    while Instant::now() < until && !producers.is_empty() {
        // Producers that finished (a fixed number of messages) send nothing more.
        while let Some(done) = producers.try_join_next() {
            match done {
                Ok(Ok(())) => {}
                Ok(Err(e)) => run_errors.push(format!("producer: {e:#}")),
                Err(e) => run_errors.push(format!("producer: {e}")),
            }
        }
        let confirmed = history.events().iter().rev().any(|e| {
            e.t_us > healed_us
                && matches!(
                    e.op,
                    Op::SendEnd {
                        outcome: super::history::Outcome::Ok,
                        ..
                    }
                )
        });
        if confirmed {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The longest the load goes on after the last heal for a send to be confirmed.
const AFTER_HEAL_WAIT: Duration = Duration::from_secs(20);

/// Empties every queue and dead-letter queue; poison queues are nacked until all is dead-lettered.
async fn drain_all(spec: &Spec, ctx: &Ctx, run_errors: &mut Vec<String>) {
    let drain_by = Instant::now() + Duration::from_secs(120);
    let mut drains = vec![];
    if spec.max_deliveries.is_some() {
        drains.push((spec.queue.clone(), DrainMode::Nack));
    } else {
        drains.extend(spec.queues().into_iter().map(|q| (q, DrainMode::Ack)));
    }
    drains.extend(
        spec.queues()
            .into_iter()
            .map(|q| (format!("{q}.DLQ"), DrainMode::Ack)),
    );
    for (q, mode) in drains {
        if let Err(e) = workload::drain(ctx, &q, mode, drain_by).await {
            run_errors.push(format!("{e:#}"));
        }
    }
}

fn producers_one(queue: &str) -> ProducerSpec {
    ProducerSpec {
        id: 0,
        queue: queue.into(),
        batch: 1,
        values_max: u64::MAX,
        pad_bytes: 16,
    }
}

/// What the checker is told: the dead-letter queues, the ordered queue, the poison rule (exact
/// only when nothing disturbed the run).
fn check_options(spec: &Spec, history: &History) -> CheckOptions {
    let disturbed = history
        .events()
        .iter()
        .any(|e| matches!(e.op, Op::Fault(_) | Op::Error { .. }));
    CheckOptions {
        dead_letter_queues: spec.queues().iter().map(|q| format!("{q}.DLQ")).collect(),
        ordered_queues: spec.ordered_queue.clone().into_iter().collect(),
        dead_letter_rule: spec.max_deliveries.map(|max_deliveries| DeadLetterRule {
            max_deliveries,
            exact: !disturbed,
        }),
    }
}

/// Until-consumed loads: the producers finish, then the consumers empty the queue (its ready,
/// scheduled and leased counts all 0), or `load_end` comes first.
async fn wait_consumed(
    ctx: &Ctx,
    spec: &Spec,
    producers: &mut JoinSet<anyhow::Result<()>>,
    load_end: Instant,
    run_errors: &mut Vec<String>,
) {
    while !producers.is_empty() {
        match tokio::time::timeout_at(load_end, producers.join_next()).await {
            Ok(Some(Ok(Ok(())))) => {}
            Ok(Some(Ok(Err(e)))) => run_errors.push(format!("producer: {e:#}")),
            Ok(Some(Err(e))) => run_errors.push(format!("producer: {e}")),
            // The rest are stopped with the consumers.
            Ok(None) | Err(_) => return,
        }
    }
    let Ok(client) = ferry_client::Client::connect(&ctx.url).await else {
        return;
    };
    // Polled every 100 ms until the deadline: the queue empties as the consumers go.
    while Instant::now() < load_end {
        let stats = tokio::time::timeout(ctx.op_timeout, crate::stats(&client, &spec.queue)).await;
        if let Ok(Ok(s)) = stats {
            if s.ready + s.scheduled + s.leased == 0 {
                return;
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn timeout_at<F: std::future::Future>(deadline: Instant, f: F) -> Option<F::Output> {
    tokio::time::timeout_at(deadline, f).await.ok()
}

async fn join_all(
    set: &mut JoinSet<anyhow::Result<()>>,
    what: &str,
    by: Instant,
    run_errors: &mut Vec<String>,
) {
    while !set.is_empty() {
        match tokio::time::timeout_at(by, set.join_next()).await {
            Ok(Some(Ok(Ok(())))) => {}
            Ok(Some(Ok(Err(e)))) => run_errors.push(format!("{what}: {e:#}")),
            Ok(Some(Err(e))) => run_errors.push(format!("{what}: {e}")),
            Ok(None) => break,
            Err(_) => {
                run_errors.push(format!("{} {what}s did not stop in time", set.len()));
                set.abort_all();
                break;
            }
        }
    }
}

/// The default directory for results: `chaos-results/` under the current directory.
pub fn default_out_dir() -> PathBuf {
    PathBuf::from("chaos-results")
}
