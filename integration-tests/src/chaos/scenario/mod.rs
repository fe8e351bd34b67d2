//! The scenarios, each at smoke size (the test suite) or full size (`scripts/chaos`), and the
//! run: start a node (and a proxy) or a cluster, load it while the nemesis follows its schedule, heal, drain
//! every queue, check, report. The scenarios themselves are in `spec.rs`.

mod spec;

use spec::{consumer, producers_one};
pub use spec::{spec, Placement, Size, Spec, PLANTED, SCENARIOS};

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use anyhow::Context;
use ferry_client::pb;
use tokio::task::JoinSet;
use tokio::time::Instant;

use super::checker::{self, CheckOptions, DeadLetterRule};
use super::history::{History, Op};
use super::nemesis::{self, FaultKind, Nemesis, Target};
use super::proxy::Proxy;
use super::report::{Report, ShardAtStart};
use super::workload::{self, ConsumerKind, Ctx, DrainMode, ProducerSpec};
use crate::{Node, NodeOptions};

/// The node or nodes (their data directory lives as long as they do) and the proxy of a run.
struct Started {
    nemesis: Nemesis,
    /// Where the workers connect first: the node, or the proxy in front of it.
    client_url: String,
    /// Every node as (name, client URL).
    nodes: Vec<(String, String)>,
    /// Replicated queues: each queue's shard leader when the load starts, as an index of
    /// `nodes` (workers start on the nodes after it). Empty otherwise.
    leaders: HashMap<String, usize>,
    /// Replicated queues: each one's shard when the load starts.
    shards: Vec<ShardAtStart>,
    // Dropped last: the nodes are killed first (fields drop in declaration order).
    _data: tempfile::TempDir,
}

/// Starts the node, creates the queues, starts the proxy; or starts the cluster.
async fn start(spec: &Spec) -> anyhow::Result<Started> {
    let data = tempfile::tempdir()?;
    if !spec.cluster.is_empty() {
        return start_cluster(spec, data).await;
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
                replicas: 0,
                own_shard: false,
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
        leaders: HashMap::new(),
        shards: vec![],
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

/// Starts the cluster and creates its queues as `spec.placement` says: pinned on their nodes,
/// or replicated (the cluster's default, or each in a shard of its own), whose shards' leaders
/// are then waited for.
async fn start_cluster(spec: &Spec, data: tempfile::TempDir) -> anyhow::Result<Started> {
    let ids: Vec<&str> = spec.cluster.iter().map(String::as_str).collect();
    let creates: Vec<pb::CreateQueueRequest> = spec
        .queues()
        .iter()
        .zip(&spec.cluster)
        .map(|(queue, owner)| match spec.placement {
            Placement::Pinned => super::cluster::pinned(queue, owner, &spec.queue_config),
            Placement::Default => super::cluster::by_default(queue, &spec.queue_config),
            Placement::OwnShard { replicas } => pb::CreateQueueRequest {
                replicas,
                own_shard: true,
                ..super::cluster::by_default(queue, &spec.queue_config)
            },
        })
        .collect();
    let target = super::cluster::start_with(
        data.path(),
        &ids,
        spec.learner.as_deref(),
        &spec.node_toml,
        &creates,
        spec.fake_clock,
        &spec.fault_points,
    )
    .await?;
    let nemesis = Nemesis::Cluster(target);
    let nodes = node_urls(&nemesis);
    let (mut leaders, mut shards) = (HashMap::new(), vec![]);
    if spec.placement.replicated() {
        for q in spec.queues() {
            let shard = super::cluster::shard_of(&nodes, &q, super::cluster::LEADER_WAIT).await?;
            let at = nodes.iter().position(|(n, _)| *n == shard.leader);
            leaders.insert(
                q.clone(),
                at.context("a shard led by a node not in the cluster")?,
            );
            shards.push(ShardAtStart {
                queue: q,
                shard: shard.shard,
                leader: shard.leader,
                replicas: shard.replicas,
            });
        }
    }
    Ok(Started {
        client_url: nodes[0].1.clone(),
        nemesis,
        nodes,
        leaders,
        shards,
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
            let mut s = nemesis::cluster_schedule(spec.seed, &spec.faults, load_ms, &ids);
            nemesis::aim_at_queues(spec.seed, &mut s, &spec.queues());
            s
        }
    };
    // Halfway through the load, between two slots of the other faults (the nemesis runs them
    // one after another: a fault under way delays the next): the learner removed, or a disk lost.
    let halfway = match (&spec.lose_disk_of, &spec.learner) {
        (Some(lost), _) => Some((FaultKind::DiskLost, lost.clone())),
        (None, Some(learner)) => Some((FaultKind::RemoveNode, learner.clone())),
        (None, None) => None,
    };
    if let Some((kind, node)) = halfway {
        let at_ms = load_ms / 2;
        if kind == FaultKind::DiskLost {
            // The lost node never comes back: no later fault is planned on it.
            schedule.retain(|f| f.at_ms <= at_ms || f.node.as_ref() != Some(&node));
        }
        let at = schedule.partition_point(|f| f.at_ms <= at_ms);
        schedule.insert(
            at,
            nemesis::PlannedFault {
                at_ms,
                kind,
                for_ms: 1_000,
                delay_ms: None,
                node: Some(node),
                jump_ms: None,
                queue: None,
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
        auto_ack_failures: Arc::default(),
        auto_ack_drops_unconfirmed_batch: spec.auto_ack_drops_unconfirmed_batch,
    };
    let mut run_errors = vec![];
    load(spec, &ctx, &started, &schedule, stop_tx, &mut run_errors).await;
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
    report.shards_at_start = started.shards.clone();
    if let Some(f) = &mut report.failover {
        f.target_judged = spec.size != Size::Smoke;
    }
    if spec.auto_ack_drops_unconfirmed_batch {
        report.planted_in_client = Some(workload::AUTO_ACK_DROPS_UNCONFIRMED_BATCH.into());
    }
    // After the drain: every acknowledgement the faults cut off has failed by now.
    report.auto_ack_failures = ctx.auto_ack_failures();
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
    started: &Started,
    schedule: &[nemesis::PlannedFault],
    stop_tx: tokio::sync::watch::Sender<bool>,
    run_errors: &mut Vec<String>,
) {
    let history = &ctx.history;
    let nemesis = &started.nemesis;
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
    // A replicated queue's producers start on the node after its shard's leader when the load
    // begins, its consumers on the one after that: none on the node serving its queue. Pinned
    // queues likewise: producer `i` starts on node `i + 1` and consumer `i` on node `i + 2`
    // (modulo 3), after the owner of queue `i` modulo 3.
    let after_leader = |queue: &str, id: u32, offset: usize| {
        started
            .leaders
            .get(queue)
            .map_or(id as usize + offset, |leader| leader + offset)
    };
    for p in spec.producers.clone() {
        let via = after_leader(&p.queue, p.id, 1);
        producers.spawn(workload::producer(ctx.clone().via(via), p, settle_by));
    }
    for c in spec.consumers.clone() {
        let via = after_leader(&c.queue, c.id, 2);
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
    // While producers send without end, each fault waits for a send confirmed after the last
    // heal (see `Nemesis::run`); producers of a fixed count may be done before the faults are,
    // and a node with a planted bug may never take sends again (a power loss that took its
    // queues), which its run must still go on through.
    let endless = spec.producers.iter().all(|p| p.values_max == u64::MAX);
    let planted = spec.fault_points.iter().any(|p| p.starts_with("planted-"));
    let progress = (endless && !planted).then_some(AFTER_HEAL_WAIT);
    let mut nemesis_task = {
        let (target, history, schedule) = (nemesis.clone(), history.clone(), schedule.to_vec());
        let stop = ctx.stop.clone();
        tokio::spawn(async move {
            target
                .run(&history, &schedule, load_start, progress, stop)
                .await
        })
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

/// Waits, at most [`AFTER_HEAL_WAIT`], until a send is confirmed after now (the nemesis's
/// heal), while producers still run. Does not fail: a run that confirms nothing after its last
/// heal is reported so (`confirmed_after_last_heal`), and the smoke tests refuse it.
async fn wait_confirmed_after_heal(
    history: &History,
    producers: &mut JoinSet<anyhow::Result<()>>,
    run_errors: &mut Vec<String>,
) {
    let before = history.confirmed_sends();
    let confirmed = history.wait_confirmed_beyond(before, AFTER_HEAL_WAIT);
    // Producers that all finished (a fixed number of messages) send nothing more: stop waiting.
    let finished = async {
        while let Some(done) = producers.join_next().await {
            match done {
                Ok(Ok(())) => {}
                Ok(Err(e)) => run_errors.push(format!("producer: {e:#}")),
                Err(e) => run_errors.push(format!("producer: {e}")),
            }
        }
    };
    tokio::select! {
        _ = confirmed => {}
        () = finished => {}
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
