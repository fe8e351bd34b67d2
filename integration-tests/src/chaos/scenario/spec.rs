//! What each scenario does, decided before it starts: its load, its faults, its checks.

use std::time::Duration;

use ferry_client::pb;

use crate::chaos::nemesis::{FaultKind, FaultPlan};
use crate::chaos::workload::{
    ConsumerKind, ConsumerSpec, ProducerSpec, AUTO_ACK_DROPS_UNCONFIRMED_BATCH,
};

/// The scenarios `scripts/chaos` knows.
pub const SCENARIOS: [&str; 19] = [
    "kill9",
    "activemq-200k",
    "poison",
    "pause",
    "proxy",
    "kill9-auto-receive",
    "cluster",
    "cluster-rf1",
    "cluster-meta",
    "cluster-auto-receive",
    "cluster-one-way",
    "cluster-clock",
    "cluster-remove",
    "failover",
    "cluster-power-loss",
    "disk-lost",
    "power-loss",
    "lazyfs",
    "clock",
];

/// The planted bugs `scripts/chaos --planted BUG` switches on (fault points of the `ferry-faults`
/// build, docs/reliability.md), each with the scenario that must catch it and what the checker
/// must then report.
pub const PLANTED: [(&str, &str, &str); 4] = [
    ("confirm-before-durable", "power-loss", "lost"),
    ("raft-entries-unsynced", "cluster-power-loss", "lost"),
    ("skip-delivery-count", "kill9", "unflagged duplicates"),
    (
        AUTO_ACK_DROPS_UNCONFIRMED_BATCH,
        "kill9-auto-receive",
        "lost",
    ),
];

/// The fault point `ferry_be_server::faults::SLOW_ACK_ANSWER` (the harness does not link the
/// back-end).
const SLOW_ACK_ANSWER: &str = "slow-ack-answer";

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
    /// The nodes of a cluster scenario (empty: one node, `n1`), with as many queues, placed
    /// as `placement` says; `queue` is unused.
    pub cluster: Vec<String>,
    /// How a cluster scenario's queues are placed.
    pub placement: Placement,
    /// Fault points switched on in the node (`FAILPOINTS`); not empty: the node runs the
    /// `ferry-faults` build (one node only).
    pub fault_points: Vec<String>,
    /// The node's data directory is on LazyFS, and each kill drops its unsynced writes.
    pub lazyfs: bool,
    /// The node runs under libfaketime, so its wall clock can jump.
    pub fake_clock: bool,
    /// A cluster node that joins as a learner owning no queue (clients use it too), removed
    /// halfway through the load and stopped (unless `lose_disk_of` is set).
    pub learner: Option<String>,
    /// `disk-lost`: the node whose disk is lost halfway through the load (its replicas then
    /// moved, the learner taking them); the learner stays.
    pub lose_disk_of: Option<String>,
    /// The planted client bug [`AUTO_ACK_DROPS_UNCONFIRMED_BATCH`] is on (in the harness's
    /// auto-acknowledge consumers, not in the node).
    pub auto_ack_drops_unconfirmed_batch: bool,
}

/// How a cluster scenario's queues are placed (one queue per node of the cluster).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Placement {
    /// Created with the cluster's default: replicated on 3 nodes (the default once the
    /// cluster has 3 active nodes), in the shared shards, whose leaders serve them: `chaos-q1`...
    Default,
    /// Each pinned on its node (`--node`), replication factor 1, not replicated: `chaos-n1`
    /// on `n1`...
    Pinned,
    /// Replicated on this many nodes, each in a shard of its own: `chaos-s1`...
    OwnShard { replicas: u32 },
}

impl Placement {
    /// Whether the queues live in shards (their leaders are found before the load).
    pub fn replicated(self) -> bool {
        match self {
            Placement::Default | Placement::OwnShard { .. } => true,
            Placement::Pinned => false,
        }
    }
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

pub(super) fn consumer(id: u32, queue: &str, kind: ConsumerKind, batch: u32) -> ConsumerSpec {
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
            alternate: None,
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
        placement: Placement::Default,
        fault_points: vec![],
        lazyfs: false,
        fake_clock: false,
        learner: None,
        lose_disk_of: None,
        auto_ack_drops_unconfirmed_batch: false,
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
        | "cluster-rf1"
        | "cluster-meta"
        | "cluster-auto-receive"
        | "cluster-one-way"
        | "cluster-clock"
        | "cluster-remove"
        | "failover"
        | "cluster-power-loss"
        | "disk-lost" => {
            // Three nodes, three queues created with the cluster's default (replicated on the
            // three, in the shared shards); 2 producers and 2 consumers per queue, each first
            // connected through a node that does not lead its queue's shard. `cluster`: every
            // 10 s (smoke: 2 s) one node is killed, paused or cut from the other two.
            // `cluster-meta`: every 15 s (smoke: 6 s) the metadata leader is cut from the
            // other two, and a queue is created through them. `cluster-auto-receive`: as
            // `cluster` with auto-ack `Session::receive` consumers only (bug 2).
            s.cluster = ["n1", "n2", "n3"].map(String::from).to_vec();
            s.placement = match name {
                // `cluster-rf1`: `cluster` with each queue pinned on its node, not replicated
                // (replication factor 1, which a queue may still ask for): a queue waits for its
                // one node to come back, the baseline failover is measured against.
                "cluster-rf1" => Placement::Pinned,
                // `failover`: the queues replicated on the three nodes, each in its own shard.
                "failover" | "cluster-power-loss" => Placement::OwnShard { replicas: 3 },
                _ => Placement::Default,
            };
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
            // `disk-lost`: as `cluster`, with a fourth node, n4, a learner holding nothing at
            // first; halfway through the load n2 or n3 (by seed) dies and its data directory is
            // wiped, and its shard replicas are moved (to n4, the node holding fewest). It never
            // comes back; later faults planned on it are skipped.
            if name == "disk-lost" {
                s.learner = Some("n4".into());
                s.lose_disk_of = Some(["n2", "n3"][(seed % 2) as usize].into());
            }
            // `failover`: every other fault a kill -9 of a shard's leader (restarted in place
            // after 1-4 s, smoke 0.25-1 s); the others a pause or a partition of a random node.
            // Every 8 s (smoke: 3 s), so that 3 minutes make 11 kills.
            if name == "failover" {
                s.faults.kinds = vec![FaultKind::Pause, FaultKind::Partition];
                s.faults.alternate = Some(FaultKind::KillShardLeader);
                s.faults.interval_ms = if smoke { 3_000 } else { 8_000 };
                if smoke {
                    s.load = Duration::from_secs(12);
                }
            }
            // `cluster-power-loss`: every node's store loses what no completed sync covers at a
            // kill (`store-power-loss`: the Raft log, the metadata and the queues, one store
            // per node); every other fault a power cut of the whole cluster (every node killed
            // at once), the others a kill -9 of a shard's leader.
            if name == "cluster-power-loss" {
                s.fault_points = vec![ferry_store::faults::POWER_LOSS.into()];
                s.faults.kinds = vec![FaultKind::PowerCut];
                s.faults.alternate = Some(FaultKind::KillShardLeader);
                s.faults.interval_ms = if smoke { 3_000 } else { 8_000 };
                if smoke {
                    s.load = Duration::from_secs(15);
                }
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
    /// Switches planted bug `bug` (a name of [`PLANTED`]) on: in the node (a fault point of the
    /// `ferry-faults` build), or for [`AUTO_ACK_DROPS_UNCONFIRMED_BATCH`] in the harness's
    /// auto-acknowledge consumers.
    pub fn plant(&mut self, bug: &str) -> anyhow::Result<()> {
        if !PLANTED.iter().any(|(name, _, _)| *name == bug) {
            let names: Vec<&str> = PLANTED.iter().map(|(name, _, _)| *name).collect();
            anyhow::bail!("no planted bug {bug:?}; there are {names:?}");
        }
        if bug == AUTO_ACK_DROPS_UNCONFIRMED_BATCH {
            self.auto_ack_drops_unconfirmed_batch = true;
            // The node answers each acknowledgement 300 ms after it is durable
            // (`ferry_be_server::faults::SLOW_ACK_ANSWER`), so a kill lands on an applied
            // acknowledgement whose answer never left, the corner this bug loses messages in.
            // Without it that window is microseconds wide and four kills missed it (CI, seed 1).
            self.fault_points.push(SLOW_ACK_ANSWER.into());
            return Ok(());
        }
        if bug == "skip-delivery-count" {
            // A consumer that hangs after a batch or two, holding what it took unacknowledged
            // until it is dropped (as a hung process would), so that every kill lands on
            // deliveries whose count the bug never wrote. Without it the window is a consumer's
            // moment between a receive and its acknowledgement, and the four kills of a smoke
            // run all missed it once (CI, seed 1).
            let id = self.consumers.iter().map(|c| c.id + 1).max().unwrap_or(0);
            self.consumers.push(ConsumerSpec {
                lifetime_ms_max: Some(2_000),
                kill_percent: 100,
                ..consumer(id, &self.queue, ConsumerKind::ClientAck, 10)
            });
        }
        self.fault_points.push(format!("planted-{bug}"));
        Ok(())
    }

    pub(super) fn size_name(&self) -> String {
        match self.size {
            Size::Smoke => "smoke".into(),
            Size::Full { minutes } => format!("full ({minutes} min)"),
        }
    }

    pub(super) fn queues(&self) -> Vec<String> {
        if !self.cluster.is_empty() {
            let prefix = match self.placement {
                Placement::Default => "q",
                Placement::OwnShard { .. } => "s",
                Placement::Pinned => {
                    return self.cluster.iter().map(|n| format!("chaos-{n}")).collect()
                }
            };
            return (1..=self.cluster.len())
                .map(|i| format!("chaos-{prefix}{i}"))
                .collect();
        }
        let mut q = vec![self.queue.clone()];
        q.extend(self.ordered_queue.clone());
        q
    }
}

pub(super) fn producers_one(queue: &str) -> ProducerSpec {
    ProducerSpec {
        id: 0,
        queue: queue.into(),
        batch: 1,
        values_max: u64::MAX,
        pad_bytes: 16,
    }
}
