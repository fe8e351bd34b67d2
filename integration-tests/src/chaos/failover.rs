//! Failover times from a history: for each kill of a shard's leader
//! ([`Fault::KillShardLeader`]), the time from the kill to the first confirmed send on a queue
//! of that shard invoked after it. A send invoked before the kill may have been confirmed by
//! the dying leader and its answer read a moment after the kill was recorded; a send invoked
//! after it can only have been confirmed by a new leader. The figure runs over by at most one
//! send's latency on the new leader (the producers' sends that waited through the election are
//! confirmed first, and the next ones are invoked then).

use std::collections::HashMap;

use serde::Serialize;

use super::history::{Event, Fault, Op, Outcome};

/// The p99 failover time issue 24 asks for.
pub const TARGET_P99_MS: f64 = 3_000.0;

/// One kill of a shard's leader and its failover time.
#[derive(Debug, Clone, Serialize)]
pub struct Kill {
    /// When the kill was recorded, ms since the run began.
    pub at_ms: f64,
    /// The leader killed.
    pub node: String,
    pub queue: String,
    pub shard: u64,
    /// From the kill to the first send on the shard's queues invoked after it and confirmed;
    /// `None` when none was (in the run, load and heal).
    pub failover_ms: Option<f64>,
}

/// The failover times of a run with shard leader kills.
#[derive(Debug, Clone, Serialize)]
pub struct Failovers {
    /// Kills with a failover time (every kill, unless some shard never took a send again).
    pub count: u64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
    /// Kills after which no send on the shard was confirmed.
    pub not_recovered: u64,
    pub target_p99_ms: f64,
    /// Whether the target is judged (full size); a smoke run reports its times only.
    pub target_judged: bool,
    pub kills: Vec<Kill>,
}

impl Failovers {
    /// The failover times of `events`; `None` when no shard leader was killed.
    pub fn of(events: &[Event]) -> Option<Self> {
        let mut queue_of: HashMap<u64, (&str, u64)> = HashMap::new();
        // Each kill with its time in µs and its shard's queues.
        let mut kills: Vec<(Kill, u64, &[String])> = vec![];
        for e in events {
            match &e.op {
                Op::SendInvoke { op, queue, .. } => {
                    queue_of.insert(*op, (queue.as_str(), e.t_us));
                }
                Op::SendEnd {
                    op,
                    outcome: Outcome::Ok,
                    ..
                } => {
                    let Some((queue, invoked_us)) = queue_of.get(op) else {
                        continue;
                    };
                    let waiting = kills.iter_mut().filter(|(k, at_us, queues)| {
                        k.failover_ms.is_none()
                            && *invoked_us > *at_us
                            && queues.iter().any(|q| q == queue)
                    });
                    for (kill, at_us, _) in waiting {
                        kill.failover_ms = Some((e.t_us - *at_us) as f64 / 1_000.0);
                    }
                }
                Op::Fault(Fault::KillShardLeader {
                    queue,
                    shard,
                    queues,
                }) => {
                    let kill = Kill {
                        at_ms: e.t_us as f64 / 1_000.0,
                        node: e.node.clone(),
                        queue: queue.clone(),
                        shard: *shard,
                        failover_ms: None,
                    };
                    kills.push((kill, e.t_us, queues.as_slice()));
                }
                _ => {}
            }
        }
        if kills.is_empty() {
            return None;
        }
        let kills: Vec<Kill> = kills.into_iter().map(|(k, _, _)| k).collect();
        let mut times: Vec<f64> = kills.iter().filter_map(|k| k.failover_ms).collect();
        times.sort_by(f64::total_cmp);
        Some(Failovers {
            count: times.len() as u64,
            p50_ms: nearest_rank(&times, 0.50),
            p99_ms: nearest_rank(&times, 0.99),
            max_ms: times.last().copied().unwrap_or(0.0),
            not_recovered: (kills.len() - times.len()) as u64,
            target_p99_ms: TARGET_P99_MS,
            target_judged: false,
            kills,
        })
    }

    /// Whether the p99 is within the target and every shard took sends again.
    pub fn target_met(&self) -> bool {
        self.p99_ms <= self.target_p99_ms && self.not_recovered == 0
    }

    /// One line for the summary.
    pub fn summary(&self) -> String {
        let verdict = match (self.target_judged, self.target_met()) {
            (false, _) => "not judged at this size",
            (true, true) => "met",
            (true, false) => "NOT MET",
        };
        format!(
            "  failover (shard leader kill -9 to the first send confirmed on its shard): {} kills, \
             p50 {:.0} ms p99 {:.0} ms max {:.0} ms, not recovered {}; target p99 <= {:.0} ms: {verdict}\n",
            self.count,
            self.p50_ms,
            self.p99_ms,
            self.max_ms,
            self.not_recovered,
            self.target_p99_ms,
        )
    }
}

/// The nearest-rank percentile `q` of `sorted` (0 when empty): with few samples, p99 is the
/// largest.
fn nearest_rank(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = (q * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}
