//! What a run reports: the checker's verdict, the fault schedule and the faults as they
//! happened, the longest time sends waited and nothing was confirmed (overall and by queue),
//! and latency percentiles (HDR histograms), as JSON and as a short summary.

use std::collections::{BTreeMap, HashMap};

use hdrhistogram::Histogram;
use serde::Serialize;

use super::checker::Verdict;
use super::failover::Failovers;
use super::history::{load_window, Event, Fault, History, Op, Outcome};
use super::nemesis::PlannedFault;
use super::unavailability::{self, Stretch};

/// Percentiles of a latency, in ms.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Latency {
    pub count: u64,
    pub p50_ms: f64,
    pub p90_ms: f64,
    pub p99_ms: f64,
    pub p999_ms: f64,
    pub max_ms: f64,
}

impl Latency {
    fn of(h: &Histogram<u64>) -> Self {
        let ms = |us: u64| us as f64 / 1_000.0;
        Self {
            count: h.len(),
            p50_ms: ms(h.value_at_quantile(0.50)),
            p90_ms: ms(h.value_at_quantile(0.90)),
            p99_ms: ms(h.value_at_quantile(0.99)),
            p999_ms: ms(h.value_at_quantile(0.999)),
            max_ms: ms(h.max()),
        }
    }
}

/// A fault as it happened.
#[derive(Debug, Clone, Serialize)]
pub struct FaultAt {
    pub at_ms: f64,
    /// The node it hit ("*": every node).
    pub node: String,
    #[serde(flatten)]
    pub fault: Fault,
}

/// The sends confirmed from one planned fault to the next (the last: to the load's last send):
/// a run whose node stopped taking sends after a fault has a window with none.
#[derive(Debug, Clone, Serialize)]
pub struct FaultWindow {
    pub at_ms: f64,
    pub node: String,
    #[serde(flatten)]
    pub fault: Fault,
    pub confirmed: u64,
}

/// A replicated queue's shard when the load began, as `Cluster.ListShards` named it.
#[derive(Debug, Clone, Serialize)]
pub struct ShardAtStart {
    pub queue: String,
    pub shard: u64,
    pub leader: String,
    /// The preferred leader first (the placement rule balances these over the nodes).
    pub replicas: Vec<String>,
}

/// The report of one run.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub scenario: String,
    pub seed: u64,
    pub size: String,
    pub load_ms: u64,
    pub elapsed_ms: u64,
    pub fault_schedule: Vec<PlannedFault>,
    pub faults: Vec<FaultAt>,
    /// Confirmed sends in the stretch each planned fault opens (see [`FaultWindow`]).
    pub fault_windows: Vec<FaultWindow>,
    /// Confirmed sends after the last heal of the load phase (a restart, a resume, a proxy,
    /// partition or clock heal), `None` when nothing healed while sends went on.
    pub confirmed_after_last_heal: Option<u64>,
    #[serde(flatten)]
    pub verdict: Verdict,
    /// The longest stretch of the load phase in which sends were invoked and none was
    /// confirmed (defined in [`super::unavailability`]).
    pub longest_unavailability_ms: f64,
    /// The same for each queue sent to, when there are several (a queue is out while the node
    /// serving it is down or cut off and until another takes over, whatever the others do).
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub longest_unavailability_by_queue_ms: BTreeMap<String, f64>,
    /// Where each of those stretches lay: `from_ms` and `to_ms` since the run began, as the
    /// faults' `at_ms`.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub longest_unavailability_by_queue: BTreeMap<String, Stretch>,
    /// With kills of shard leaders (`failover`): each kill's failover time and their
    /// percentiles.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub failover: Option<Failovers>,
    /// Replicated queues: each one's shard, leader and replicas when the load began.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub shards_at_start: Vec<ShardAtStart>,
    /// Invoke to confirm of each confirmed send attempt.
    pub send_latency: Latency,
    /// A value's first send invoke to its first delivery.
    pub end_to_end_latency: Latency,
    /// Calls that failed outside sends and acks (receives, opening sessions).
    pub client_errors: u64,
    /// Problems of the run itself (a drain that did not finish, a history that overflowed).
    pub run_errors: Vec<String>,
    pub history_file: String,
    /// Fault points the node ran with (the `ferry-faults` build): the power-loss store, planted
    /// bugs.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub fault_points: Vec<String>,
    /// A planted bug of the client the run's consumers emulated.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub planted_in_client: Option<String>,
    /// Acknowledgements sent by the client library after auto receives returned that failed or
    /// got no answer: auto receives whose acknowledgement a fault cut off (their batches were
    /// handed over all the same).
    pub auto_ack_failures: u64,
    /// With a poison rule: whether "dead-lettered after exactly max deliveries" was checked (it
    /// is not when a fault or a client error disturbed the run); `None` without one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dead_letter_exact_checked: Option<bool>,
    pub valid: bool,
}

impl Report {
    /// Builds the report; `valid` requires a clean verdict and no run error.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        scenario: &str,
        seed: u64,
        size: &str,
        load_ms: u64,
        fault_schedule: Vec<PlannedFault>,
        history: &History,
        verdict: Verdict,
        run_errors: Vec<String>,
        history_file: String,
    ) -> Self {
        let events = history.events();
        let valid = verdict.is_valid() && run_errors.is_empty();
        let by_queue = unavailability::longest_by_queue(&events);
        Report {
            scenario: scenario.into(),
            seed,
            size: size.into(),
            load_ms,
            elapsed_ms: events.last().map_or(0, |e| e.t_us / 1_000),
            fault_schedule,
            faults: faults(&events),
            fault_windows: fault_windows(&events),
            confirmed_after_last_heal: confirmed_after_last_heal(&events),
            verdict,
            longest_unavailability_ms: unavailability::longest(&events, |_| true).ms,
            longest_unavailability_by_queue_ms: by_queue
                .iter()
                .map(|(q, s)| (q.clone(), s.ms))
                .collect(),
            longest_unavailability_by_queue: by_queue,
            failover: Failovers::of(&events),
            shards_at_start: vec![],
            send_latency: send_latency(&events),
            end_to_end_latency: end_to_end(&events),
            client_errors: events
                .iter()
                .filter(|e| matches!(e.op, Op::Error { .. }))
                .count() as u64,
            run_errors,
            history_file,
            fault_points: vec![],
            planted_in_client: None,
            auto_ack_failures: 0,
            dead_letter_exact_checked: None,
            valid,
        }
    }

    /// A few lines for a terminal.
    pub fn summary(&self) -> String {
        let v = &self.verdict;
        let mut s = format!(
            "{} seed {} ({}): {}\n  attempted {} confirmed {} unknown {} failed {} received {} recovered {}\n  \
             lost {} unexpected {} duplicated: flagged {} unflagged {}\n  \
             faults {} (planned {}), longest unavailability {:.0} ms, client errors {}\n  \
             send latency ms p50 {:.1} p99 {:.1} max {:.1}; end-to-end p50 {:.1} p99 {:.1} max {:.1}\n",
            self.scenario,
            self.seed,
            self.size,
            if self.valid { "VALID" } else { "INVALID" },
            v.attempted,
            v.confirmed,
            v.unknown,
            v.failed,
            v.received,
            v.recovered,
            v.lost,
            v.unexpected,
            v.duplicated_flagged,
            v.duplicated_unflagged,
            self.faults.len(),
            self.fault_schedule.len(),
            self.longest_unavailability_ms,
            self.client_errors,
            self.send_latency.p50_ms,
            self.send_latency.p99_ms,
            self.send_latency.max_ms,
            self.end_to_end_latency.p50_ms,
            self.end_to_end_latency.p99_ms,
            self.end_to_end_latency.max_ms,
        );
        if !self.fault_points.is_empty() {
            s.push_str(&format!(
                "  fault points: {}\n",
                self.fault_points.join(", ")
            ));
        }
        if let Some(bug) = &self.planted_in_client {
            s.push_str(&format!("  planted in the client: {bug}\n"));
        }
        for f in &self.faults {
            if let Fault::ReplicasMoved {
                via,
                shards,
                took_ms,
            } = &f.fault
            {
                s.push_str(&format!(
                    "  disk lost on {}: replicas of shards {shards:?} moved through {via}, every one whole again {took_ms} ms after the loss\n",
                    f.node
                ));
            }
        }
        if self.auto_ack_failures > 0 {
            s.push_str(&format!(
                "  auto acknowledgements cut off (failed or unanswered): {}\n",
                self.auto_ack_failures
            ));
        }
        if let Some(exact) = self.dead_letter_exact_checked {
            s.push_str(if exact {
                "  dead letters after exactly max deliveries: checked\n"
            } else {
                "  dead letters after exactly max deliveries: NOT checked (the run was disturbed)\n"
            });
        }
        if !self.longest_unavailability_by_queue.is_empty() {
            s.push_str("  longest unavailability by queue (sends waiting, none confirmed):");
            for (q, st) in &self.longest_unavailability_by_queue {
                let from_s = st.from_ms / 1_000.0;
                s.push_str(&format!(" {q} {:.0} ms from {from_s:.2} s;", st.ms));
            }
            s.push('\n');
        }
        if !self.shards_at_start.is_empty() {
            s.push_str("  shard leaders at the start (replicas, the preferred leader first):");
            for sh in &self.shards_at_start {
                let replicas = sh.replicas.join(", ");
                s.push_str(&format!(" {} {} ({replicas});", sh.queue, sh.leader));
            }
            s.push('\n');
        }
        if let Some(f) = &self.failover {
            s.push_str(&f.summary());
        }
        for (kind, n) in &v.anomaly_counts {
            s.push_str(&format!("  ANOMALY {kind:?}: {n}\n"));
        }
        for a in v.anomalies.iter().take(10) {
            s.push_str(&format!("    {:?}: {}\n", a.kind, a.detail));
        }
        for e in &self.run_errors {
            s.push_str(&format!("  RUN ERROR: {e}\n"));
        }
        s
    }
}

fn faults(events: &[Event]) -> Vec<FaultAt> {
    events
        .iter()
        .filter_map(|e| match &e.op {
            Op::Fault(f) => Some(FaultAt {
                at_ms: e.t_us as f64 / 1_000.0,
                node: e.node.clone(),
                fault: f.clone(),
            }),
            _ => None,
        })
        .collect()
}

/// When the load's sends ended: its last send event (producers with a fixed number of messages
/// may finish before the load does).
fn last_send_us(events: &[Event]) -> u64 {
    let (_, load_end) = load_window(events);
    events
        .iter()
        .filter(|e| e.t_us <= load_end)
        .filter(|e| matches!(e.op, Op::SendInvoke { .. } | Op::SendEnd { .. }))
        .map(|e| e.t_us)
        .max()
        .unwrap_or(0)
}

/// Confirmed sends in `from_us ..= to_us`.
fn confirmed_between(events: &[Event], from_us: u64, to_us: u64) -> u64 {
    events
        .iter()
        .filter(|e| (from_us..=to_us).contains(&e.t_us))
        .filter(|e| {
            matches!(
                e.op,
                Op::SendEnd {
                    outcome: Outcome::Ok,
                    ..
                }
            )
        })
        .count() as u64
}

/// The stretch each planned fault of the load opens, up to the next one (or the last send), with
/// the sends confirmed in it. Faults after the last send open none.
fn fault_windows(events: &[Event]) -> Vec<FaultWindow> {
    let last_send = last_send_us(events);
    let injected: Vec<(&Event, &Fault)> = events
        .iter()
        .filter(|e| e.t_us < last_send)
        .filter_map(|e| match &e.op {
            Op::Fault(f) if f.is_planned_injection() => Some((e, f)),
            _ => None,
        })
        .collect();
    injected
        .iter()
        .enumerate()
        .map(|(i, (e, fault))| {
            let to = injected.get(i + 1).map_or(last_send, |(next, _)| next.t_us);
            FaultWindow {
                at_ms: e.t_us as f64 / 1_000.0,
                node: e.node.clone(),
                fault: (*fault).clone(),
                confirmed: confirmed_between(events, e.t_us, to),
            }
        })
        .collect()
}

/// Confirmed sends after the last heal that came while sends went on.
fn confirmed_after_last_heal(events: &[Event]) -> Option<u64> {
    let last_send = last_send_us(events);
    let healed = events
        .iter()
        .filter(|e| e.t_us < last_send)
        .filter(|e| {
            matches!(
                &e.op,
                Op::Fault(
                    Fault::Restarted { .. }
                        | Fault::Resume
                        | Fault::ProxyHeal
                        | Fault::PartitionHeal
                        | Fault::ClockRestored
                )
            )
        })
        .map(|e| e.t_us)
        .max()?;
    Some(confirmed_between(events, healed, last_send))
}

fn histogram() -> Histogram<u64> {
    Histogram::new(3).expect("invariant: 3 significant figures are valid")
}

fn send_latency(events: &[Event]) -> Latency {
    let mut invoked: HashMap<u64, u64> = HashMap::new();
    let mut h = histogram();
    for e in events {
        match &e.op {
            Op::SendInvoke { op, .. } => {
                invoked.insert(*op, e.t_us);
            }
            Op::SendEnd {
                op,
                outcome: Outcome::Ok,
                ..
            } => {
                if let Some(t) = invoked.remove(op) {
                    let _ = h.record(e.t_us.saturating_sub(t));
                }
            }
            _ => {}
        }
    }
    Latency::of(&h)
}

fn end_to_end(events: &[Event]) -> Latency {
    let mut first_invoke = HashMap::new();
    let mut h = histogram();
    for e in events {
        match &e.op {
            Op::SendInvoke {
                producer,
                first_seq,
                count,
                ..
            } => {
                for seq in *first_seq..first_seq + u64::from(*count) {
                    first_invoke.entry((*producer, seq)).or_insert(e.t_us);
                }
            }
            Op::Deliver(d) => {
                if let Some(t) = d
                    .value
                    .and_then(|v| first_invoke.remove(&(v.producer, v.seq)))
                {
                    let _ = h.record(e.t_us.saturating_sub(t));
                }
            }
            _ => {}
        }
    }
    Latency::of(&h)
}
