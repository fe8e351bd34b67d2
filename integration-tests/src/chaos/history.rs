//! The history of a run: every client operation as it was invoked and how it ended (ok, fail,
//! unknown), every delivery handed to the application, and every fault, each with its time.
//! Jepsen's model: an operation whose outcome the client could not learn (a timeout, a broken
//! stream, a node that died mid-call) is `unknown`, never guessed.
//!
//! A *value* is what a producer sends: `(producer, seq)`, unique in a run, carried in the
//! message's properties [`PRODUCER_PROPERTY`] and [`SEQ_PROPERTY`] (and in its body and dedup id).

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Instant;

use serde::{Deserialize, Serialize};

/// The message property carrying the producer of a value.
pub const PRODUCER_PROPERTY: &str = "chaos_producer";
/// The message property carrying the sequence number of a value within its producer.
pub const SEQ_PROPERTY: &str = "chaos_seq";
/// A run records at most this many events; past it the run stops with an error (a bound on
/// memory, not a limit any scenario should reach: 200 000 messages make about 700 000).
pub const EVENTS_MAX: usize = 5_000_000;

/// One value a producer sends: unique in a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Value {
    pub producer: u32,
    pub seq: u64,
}

impl std::fmt::Display for Value {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "p{}-{}", self.producer, self.seq)
    }
}

/// How an operation ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    Ok,
    /// Definitely did not take effect (the server refused it).
    Fail {
        error: String,
    },
    /// May or may not have taken effect.
    Unknown {
        error: String,
    },
}

/// How a delivery was acknowledged, when the application had no say (auto ack).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AckMode {
    /// The client library acknowledged before handing it over; the outcome is not reported.
    Auto,
    /// The application acknowledges (client or individual mode): `AckInvoke` events follow.
    Explicit,
}

/// A fault the nemesis injected or healed. (The node it hit is the event's `node`.)
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "fault")]
pub enum Fault {
    /// SIGKILL of the node's process.
    Kill9,
    /// SIGKILL of the node's process, which led `shard`, the shard of `queue` (of every queue
    /// in `queues`) when the fault began.
    KillShardLeader {
        queue: String,
        shard: u64,
        queues: Vec<String>,
    },
    /// SIGKILL of every node of the cluster at once (the event's node: `cluster`), as a power
    /// cut does; each restarts later (`Restarted` on its own node).
    PowerCut { nodes: Vec<String> },
    /// Every write of the dead node's data directory that was not fsynced is dropped (LazyFS):
    /// a power loss.
    UnsyncedDropped,
    /// The node runs again (same data directory and ports) and serves.
    Restarted { took_ms: u64 },
    /// SIGSTOP.
    Pause,
    /// SIGCONT.
    Resume,
    /// The proxy resets every connection through it.
    ProxyReset { connections: u64 },
    /// The proxy delays every chunk of bytes it forwards.
    ProxyDelay { delay_ms: u64 },
    /// The proxy stops forwarding (connections stall, new ones too).
    ProxyBlackhole,
    /// The proxy forwards normally again.
    ProxyHeal,
    /// A client went away mid-whatever, without closing its session or connection.
    ClientKilled { client: String },
    /// The node is cut from these nodes, both ways (iptables).
    Partition { from: Vec<String> },
    /// Every packet the node sends to these nodes is dropped (iptables); theirs reach it.
    Mute { to: Vec<String> },
    /// Every packet these nodes send to the node is dropped (iptables); its reach them.
    Deaf { from: Vec<String> },
    /// The node's wall clock stepped by `jump_ms` (forward if positive).
    ClockJump { jump_ms: i64 },
    /// The node's wall clock back to the true time.
    ClockRestored,
    /// The node was removed from the cluster through node `via`, `took_ms` after the request.
    NodeRemoved { via: String, took_ms: u64 },
    /// A removed node stopped for good (kill -9), as its operator would stop it.
    Stopped,
    /// SIGKILL of the node's process and its data directory wiped: its disk is lost, and it
    /// never comes back under its identity.
    DiskLost,
    /// The lost node's replicas of `shards` moved to other nodes through node `via`, and every
    /// one of those shards whole again (a leader, nothing catching up or leaving), `took_ms`
    /// after the loss.
    ReplicasMoved {
        via: String,
        shards: Vec<u64>,
        took_ms: u64,
    },
    /// The node's partition (both ways or one way) ends.
    PartitionHeal,
    /// While the metadata leader (the event's node) was cut off, a queue was created through
    /// node `via` of the majority, `took_ms` after the cut.
    QueueCreated {
        queue: String,
        via: String,
        took_ms: u64,
    },
}

impl Fault {
    /// A fault the nemesis injects from its schedule (not a heal, a restart or a client's death).
    pub fn is_planned_injection(&self) -> bool {
        match self {
            Fault::Kill9
            | Fault::KillShardLeader { .. }
            | Fault::PowerCut { .. }
            | Fault::Pause
            | Fault::ProxyReset { .. }
            | Fault::ProxyDelay { .. }
            | Fault::ProxyBlackhole
            | Fault::Partition { .. }
            | Fault::Mute { .. }
            | Fault::ClockJump { .. }
            | Fault::NodeRemoved { .. }
            | Fault::DiskLost
            | Fault::Deaf { .. } => true,
            Fault::Restarted { .. }
            | Fault::UnsyncedDropped
            | Fault::ClockRestored
            | Fault::ReplicasMoved { .. }
            | Fault::Stopped
            | Fault::Resume
            | Fault::ProxyHeal
            | Fault::ClientKilled { .. }
            | Fault::PartitionHeal
            | Fault::QueueCreated { .. } => false,
        }
    }
}

/// What happened.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "type")]
pub enum Op {
    /// A send of the values `first_seq .. first_seq + count` of `producer` (one call, one batch),
    /// its `attempt`-th try (a retry carries the same dedup ids).
    SendInvoke {
        op: u64,
        queue: String,
        producer: u32,
        first_seq: u64,
        count: u32,
        attempt: u32,
    },
    /// How send `op` ended; `message_ids` when ok.
    SendEnd {
        op: u64,
        outcome: Outcome,
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        message_ids: Vec<String>,
    },
    /// A message handed to the application.
    Deliver(Delivery),
    /// An acknowledgement of the deliveries named (by [`Delivery::delivery`]).
    AckInvoke {
        op: u64,
        deliveries: Vec<u64>,
    },
    AckEnd {
        op: u64,
        outcome: Outcome,
    },
    /// Deliveries given back on purpose: nack, rollback, recover, session closed.
    Release {
        deliveries: Vec<u64>,
        how: String,
    },
    /// A fault injected or healed.
    Fault(Fault),
    /// A call that failed outside the operations above (a receive, opening a session).
    Error {
        what: String,
        error: String,
    },
    /// A phase of the run begins: "load", "heal", "drain", "done".
    Phase {
        name: String,
    },
}

/// One delivery as the application saw it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Delivery {
    /// Unique in the run; acks name it.
    pub delivery: u64,
    pub queue: String,
    /// `None` when the message carried no value (the checker calls it unexpected).
    pub value: Option<Value>,
    pub message_id: String,
    pub delivery_count: u32,
    pub redelivered: bool,
    pub ack: AckMode,
    /// When the receive that got it was invoked (for a stream consumer: when the stream was
    /// started), in µs since the run began: no ack that ended before this may have covered it.
    pub requested_us: u64,
    /// `FerryDeadLetterReason` and `FerryDeliveryCount`, for a dead letter.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dead_letter: Option<(String, i64)>,
}

/// An event of the history: what happened, when (µs since the run began), to whom.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Event {
    pub t_us: u64,
    /// Who did it: "producer-3", "consumer-1", "nemesis", "drain".
    pub process: String,
    pub node: String,
    #[serde(flatten)]
    pub op: Op,
}

/// The load phase of `events`, in µs since the run began: from the "load" phase event to the
/// next phase event (or the last event).
pub fn load_window(events: &[Event]) -> (u64, u64) {
    let mut phases = events.iter().filter_map(|e| match &e.op {
        Op::Phase { name } => Some((name.as_str(), e.t_us)),
        _ => None,
    });
    let start = phases
        .by_ref()
        .find(|(n, _)| *n == "load")
        .map_or(0, |(_, t)| t);
    let end = phases
        .next()
        .map_or_else(|| events.last().map_or(0, |e| e.t_us), |(_, t)| t);
    (start, end)
}

/// A send attempt that ended confirmed.
fn is_confirmed_send(op: &Op) -> bool {
    matches!(
        op,
        Op::SendEnd {
            outcome: Outcome::Ok,
            ..
        }
    )
}

#[derive(Debug, Default)]
struct Inner {
    events: Vec<Event>,
    next_id: u64,
    overflowed: bool,
}

/// The recorder, shared by every worker of a run. Cheap to clone.
#[derive(Debug, Clone)]
pub struct History {
    start: Instant,
    inner: Arc<Mutex<Inner>>,
    /// How many sends were confirmed so far, for those who wait on the run's progress.
    confirmed: Arc<tokio::sync::watch::Sender<u64>>,
}

impl Default for History {
    fn default() -> Self {
        Self::new()
    }
}

impl History {
    pub fn new() -> Self {
        Self {
            start: Instant::now(),
            inner: Arc::default(),
            confirmed: Arc::new(tokio::sync::watch::Sender::new(0)),
        }
    }

    /// A history made of these events (synthetic histories in tests, a history read back).
    pub fn from_events(events: Vec<Event>) -> Self {
        let next_id = events.len() as u64 + 1_000_000;
        let confirmed = events.iter().filter(|e| is_confirmed_send(&e.op)).count();
        Self {
            confirmed: Arc::new(tokio::sync::watch::Sender::new(confirmed as u64)),
            start: Instant::now(),
            inner: Arc::new(Mutex::new(Inner {
                events,
                next_id,
                overflowed: false,
            })),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// µs since the run began.
    pub fn now_us(&self) -> u64 {
        u64::try_from(self.start.elapsed().as_micros()).unwrap_or(u64::MAX)
    }

    /// A fresh id for an operation or a delivery.
    pub fn next_id(&self) -> u64 {
        let mut inner = self.lock();
        inner.next_id += 1;
        inner.next_id
    }

    /// Records `op` now. The time is read under the lock, so events are in time order.
    pub fn record(&self, process: &str, node: &str, op: Op) {
        let mut inner = self.lock();
        let t_us = self.now_us();
        if inner.events.len() >= EVENTS_MAX {
            inner.overflowed = true;
            return;
        }
        let confirmed = is_confirmed_send(&op);
        inner.events.push(Event {
            t_us,
            process: process.into(),
            node: node.into(),
            op,
        });
        drop(inner);
        if confirmed {
            self.confirmed.send_modify(|n| *n += 1);
        }
    }

    /// How many sends were confirmed so far.
    pub fn confirmed_sends(&self) -> u64 {
        *self.confirmed.borrow()
    }

    /// Waits until more than `count` sends were confirmed, or `bound` passes; whether they were.
    pub async fn wait_confirmed_beyond(&self, count: u64, bound: std::time::Duration) -> bool {
        let mut confirmed = self.confirmed.subscribe();
        tokio::time::timeout(bound, confirmed.wait_for(|n| *n > count))
            .await
            .is_ok_and(|r| r.is_ok())
    }

    /// Whether events were dropped because the history reached [`EVENTS_MAX`].
    pub fn overflowed(&self) -> bool {
        self.lock().overflowed
    }

    pub fn len(&self) -> usize {
        self.lock().events.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// A copy of every event so far, in the order recorded.
    pub fn events(&self) -> Vec<Event> {
        self.lock().events.clone()
    }

    /// Writes the history as JSON lines.
    pub fn write_jsonl(&self, path: &std::path::Path) -> anyhow::Result<()> {
        use std::io::Write;
        let mut out = std::io::BufWriter::new(std::fs::File::create(path)?);
        for e in self.lock().events.iter() {
            serde_json::to_writer(&mut out, e)?;
            out.write_all(b"\n")?;
        }
        out.flush()?;
        Ok(())
    }

    /// Reads a history written by [`History::write_jsonl`].
    pub fn read_jsonl(path: &std::path::Path) -> anyhow::Result<Self> {
        let text = std::fs::read_to_string(path)?;
        let events = text
            .lines()
            .filter(|l| !l.trim().is_empty())
            .map(serde_json::from_str)
            .collect::<Result<Vec<Event>, _>>()?;
        Ok(Self::from_events(events))
    }
}
