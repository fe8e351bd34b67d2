//! The checker: reads a finished history (the queues drained to the end) and judges it, as
//! Jepsen's total-queue checker does, plus what acknowledgements and dead-lettering promise.
//!
//! - **lost**: confirmed, never delivered;
//! - **unexpected**: delivered, never sent (or carrying no value);
//! - **duplicated**: delivered more than once; *flagged* when every delivery after the first
//!   carries the redelivered flag or a delivery count above 1, **unflagged** otherwise (one value
//!   stored twice, or delivered twice as new);
//! - **recovered**: a send whose outcome was unknown, delivered;
//! - **stranded**: delivered, but no delivery of it was ever acknowledged (ok or unknown), not
//!   even by the drain: the WebLogic story, a message stuck in "delivered";
//! - no value acknowledged twice with success; no delivery of a message requested after a
//!   successful acknowledgement of it; a definitely failed send never delivered;
//! - per-producer order of first deliveries on the queues that promise it;
//! - dead letters (when asked): each value dead-lettered exactly once, with the configured
//!   delivery count and reason.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use serde::Serialize;

use super::history::{AckMode, Delivery, Event, History, Op, Outcome, Value};

/// What the scenario promises beyond the total-queue rules.
#[derive(Debug, Clone, Default)]
pub struct CheckOptions {
    /// Queues whose deliveries are dead letters of the others (a dead letter is a new message:
    /// its delivery is not a duplicate of the original's).
    pub dead_letter_queues: Vec<String>,
    /// Queues on which first deliveries of one producer's values come in the order sent.
    pub ordered_queues: Vec<String>,
    /// Every value must end in a dead-letter queue after this rule.
    pub dead_letter_rule: Option<DeadLetterRule>,
}

/// Poison messages: how each must end.
#[derive(Debug, Clone, Copy)]
pub struct DeadLetterRule {
    /// Deliveries before a message is dead-lettered (1 + max redeliveries).
    pub max_deliveries: u32,
    /// No fault disturbed the run: the application saw deliveries 1..=max_deliveries of each.
    pub exact: bool,
}

/// The kinds of anomaly the checker reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum AnomalyKind {
    Lost,
    Unexpected,
    UnflaggedDuplicate,
    Stranded,
    AckedTwice,
    DeliveredAfterAck,
    FailedButReceived,
    OutOfOrder,
    DeadLetter,
}

/// One anomaly, with what the checker saw.
#[derive(Debug, Clone, Serialize)]
pub struct Anomaly {
    pub kind: AnomalyKind,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub value: Option<Value>,
    pub detail: String,
}

/// The checker's verdict.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Verdict {
    /// Values a producer tried to send.
    pub attempted: u64,
    /// Values whose send the server confirmed.
    pub confirmed: u64,
    /// Values every send of which definitely failed.
    pub failed: u64,
    /// Values whose sends all ended unknown.
    pub unknown: u64,
    /// Values delivered at least once.
    pub received: u64,
    /// Unknown values that were delivered.
    pub recovered: u64,
    /// Deliveries handed to the application.
    pub deliveries: u64,
    /// Deliveries beyond a value's first, flagged redelivered (or with a count above 1).
    pub duplicated_flagged: u64,
    /// Deliveries beyond a value's first that looked new.
    pub duplicated_unflagged: u64,
    pub lost: u64,
    pub unexpected: u64,
    /// Every anomaly found, by kind.
    pub anomaly_counts: BTreeMap<AnomalyKind, u64>,
    /// The anomalies (at most [`ANOMALIES_KEPT`] of each kind).
    pub anomalies: Vec<Anomaly>,
}

/// At most this many anomalies of each kind are kept with their details (all are counted).
pub const ANOMALIES_KEPT: u64 = 50;

impl Verdict {
    /// No anomaly of any kind.
    pub fn is_valid(&self) -> bool {
        self.anomaly_counts.is_empty()
    }

    pub fn count(&self, kind: AnomalyKind) -> u64 {
        self.anomaly_counts.get(&kind).copied().unwrap_or(0)
    }

    fn add(&mut self, kind: AnomalyKind, value: Option<Value>, detail: String) {
        let n = self.anomaly_counts.entry(kind).or_default();
        *n += 1;
        if *n <= ANOMALIES_KEPT {
            self.anomalies.push(Anomaly {
                kind,
                value,
                detail,
            });
        }
    }
}

#[derive(Debug, Default)]
struct SendState {
    ok: bool,
    failed: bool,
    unknown: bool,
}

/// The acknowledgement a delivery got, the strongest of all that named it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum AckState {
    None,
    Failed,
    Unknown,
    Ok { at_us: u64 },
}

struct Seen {
    t_us: u64,
    d: Delivery,
    ack: AckState,
}

/// Judges `history` under `options`.
pub fn check(history: &History, options: &CheckOptions) -> Verdict {
    let events = history.events();
    let mut verdict = Verdict::default();
    let sends = sends(&events);
    let mut seen = deliveries(&events);
    acks(&events, &mut seen);
    let dlq = |q: &str| options.dead_letter_queues.iter().any(|d| d == q);

    verdict.attempted = sends.len() as u64;
    verdict.deliveries = seen.len() as u64;
    let mut by_value: BTreeMap<Value, Vec<&Seen>> = BTreeMap::new();
    for s in &seen {
        match s.d.value {
            Some(v) if sends.contains_key(&v) => by_value.entry(v).or_default().push(s),
            _ => verdict.add(
                AnomalyKind::Unexpected,
                s.d.value,
                format!(
                    "{} delivered from {} (delivery {}) was never sent",
                    s.d.message_id, s.d.queue, s.d.delivery
                ),
            ),
        }
    }
    verdict.unexpected = verdict.count(AnomalyKind::Unexpected);

    for (value, st) in &sends {
        let got = by_value.get(value).map_or(&[][..], Vec::as_slice);
        if st.ok {
            verdict.confirmed += 1;
        } else if st.unknown {
            verdict.unknown += 1;
        } else {
            verdict.failed += 1;
        }
        if got.is_empty() {
            if st.ok {
                verdict.add(
                    AnomalyKind::Lost,
                    Some(*value),
                    format!("{value} was confirmed and never delivered"),
                );
            }
            continue;
        }
        verdict.received += 1;
        if !st.ok && st.unknown {
            verdict.recovered += 1;
        }
        if !st.ok && !st.unknown {
            verdict.add(
                AnomalyKind::FailedButReceived,
                Some(*value),
                format!("every send of {value} failed, yet it was delivered"),
            );
        }
        judge_value(&mut verdict, *value, got, &dlq);
    }
    verdict.lost = verdict.count(AnomalyKind::Lost);
    delivered_after_ack(&mut verdict, &seen);
    for q in &options.ordered_queues {
        order(&mut verdict, &seen, &sends, q);
    }
    if let Some(rule) = options.dead_letter_rule {
        for (value, got) in &by_value {
            dead_letters(&mut verdict, *value, got, &dlq, rule);
        }
    }
    verdict
}

/// Every value attempted, with how its sends ended (an invoke without an end is unknown).
fn sends(events: &[Event]) -> BTreeMap<Value, SendState> {
    let mut values: BTreeMap<Value, SendState> = BTreeMap::new();
    let mut open: HashMap<u64, (u32, u64, u32)> = HashMap::new();
    for e in events {
        match &e.op {
            Op::SendInvoke {
                op,
                producer,
                first_seq,
                count,
                ..
            } => {
                open.insert(*op, (*producer, *first_seq, *count));
                for seq in *first_seq..first_seq + u64::from(*count) {
                    values
                        .entry(Value {
                            producer: *producer,
                            seq,
                        })
                        .or_default();
                }
            }
            Op::SendEnd { op, outcome, .. } => {
                let Some((producer, first, count)) = open.remove(op) else {
                    continue;
                };
                for seq in first..first + u64::from(count) {
                    let st = values.entry(Value { producer, seq }).or_default();
                    match outcome {
                        Outcome::Ok => st.ok = true,
                        Outcome::Fail { .. } => st.failed = true,
                        Outcome::Unknown { .. } => st.unknown = true,
                    }
                }
            }
            _ => {}
        }
    }
    for (producer, first, count) in open.into_values() {
        for seq in first..first + u64::from(count) {
            values.entry(Value { producer, seq }).or_default().unknown = true;
        }
    }
    values
}

fn deliveries(events: &[Event]) -> Vec<Seen> {
    events
        .iter()
        .filter_map(|e| match &e.op {
            Op::Deliver(d) => Some(Seen {
                t_us: e.t_us,
                ack: match d.ack {
                    AckMode::Auto => AckState::Unknown,
                    AckMode::Explicit => AckState::None,
                },
                d: d.clone(),
            }),
            _ => None,
        })
        .collect()
}

/// Sets each delivery's strongest acknowledgement (an ack invoked and never ended is unknown).
fn acks(events: &[Event], seen: &mut [Seen]) {
    let index: HashMap<u64, usize> = seen
        .iter()
        .enumerate()
        .map(|(i, s)| (s.d.delivery, i))
        .collect();
    let mut open: HashMap<u64, &Vec<u64>> = HashMap::new();
    let mut set = |deliveries: &Vec<u64>, state: AckState| {
        for d in deliveries {
            if let Some(&i) = index.get(d) {
                seen[i].ack = seen[i].ack.max(state);
            }
        }
    };
    for e in events {
        match &e.op {
            Op::AckInvoke { op, deliveries } => {
                open.insert(*op, deliveries);
            }
            Op::AckEnd { op, outcome } => {
                let Some(deliveries) = open.remove(op) else {
                    continue;
                };
                let state = match outcome {
                    Outcome::Ok => AckState::Ok { at_us: e.t_us },
                    Outcome::Fail { .. } => AckState::Failed,
                    Outcome::Unknown { .. } => AckState::Unknown,
                };
                set(deliveries, state);
            }
            _ => {}
        }
    }
    for deliveries in open.into_values() {
        set(deliveries, AckState::Unknown);
    }
}

/// Duplicates, stranded values and double acknowledgements of one value.
fn judge_value(verdict: &mut Verdict, value: Value, got: &[&Seen], dlq: &dyn Fn(&str) -> bool) {
    let acked = got
        .iter()
        .any(|s| matches!(s.ack, AckState::Ok { .. } | AckState::Unknown));
    if !acked {
        verdict.add(
            AnomalyKind::Stranded,
            Some(value),
            format!(
                "{value} was delivered {} times and never acknowledged",
                got.len()
            ),
        );
    }
    // A dead letter is a new message: judged apart from the original's deliveries.
    for class in [false, true] {
        let group: Vec<&&Seen> = got.iter().filter(|s| dlq(&s.d.queue) == class).collect();
        if group.len() < 2 {
            continue;
        }
        let looked_new = group
            .iter()
            .filter(|s| !s.d.redelivered && s.d.delivery_count <= 1)
            .count() as u64;
        let unflagged = looked_new.saturating_sub(1);
        verdict.duplicated_unflagged += unflagged;
        verdict.duplicated_flagged += group.len() as u64 - 1 - unflagged;
        if unflagged > 0 {
            let ids: BTreeSet<&str> = group.iter().map(|s| s.d.message_id.as_str()).collect();
            verdict.add(
                AnomalyKind::UnflaggedDuplicate,
                Some(value),
                format!(
                    "{value} was delivered {} times, {looked_new} of them as new (message ids {ids:?})",
                    group.len()
                ),
            );
        }
        let acked_ok = group
            .iter()
            .filter(|s| matches!(s.ack, AckState::Ok { .. }))
            .count();
        if acked_ok > 1 {
            verdict.add(
                AnomalyKind::AckedTwice,
                Some(value),
                format!("{value} was acknowledged with success {acked_ok} times"),
            );
        }
    }
}

/// No delivery of a message requested after an acknowledgement of it succeeded.
fn delivered_after_ack(verdict: &mut Verdict, seen: &[Seen]) {
    let mut by_id: HashMap<&str, Vec<&Seen>> = HashMap::new();
    for s in seen {
        by_id.entry(&s.d.message_id).or_default().push(s);
    }
    for group in by_id.values() {
        for acked in group {
            let AckState::Ok { at_us } = acked.ack else {
                continue;
            };
            for later in group.iter().filter(|s| s.d.requested_us > at_us) {
                verdict.add(
                    AnomalyKind::DeliveredAfterAck,
                    later.d.value,
                    format!(
                        "{} was acknowledged at {} µs (delivery {}) and delivered again to a \
                         receive requested at {} µs (delivery {}, count {})",
                        acked.d.message_id,
                        at_us,
                        acked.d.delivery,
                        later.d.requested_us,
                        later.d.delivery,
                        later.d.delivery_count
                    ),
                );
            }
        }
    }
}

/// First deliveries on `queue` come in each producer's order (values whose sends all went
/// cleanly, since a retried send may legitimately be stored after later ones).
fn order(verdict: &mut Verdict, seen: &[Seen], sends: &BTreeMap<Value, SendState>, queue: &str) {
    let mut last: HashMap<u32, u64> = HashMap::new();
    let mut sorted: Vec<&Seen> = seen.iter().filter(|s| s.d.queue == queue).collect();
    sorted.sort_by_key(|s| s.t_us);
    for s in sorted {
        let Some(v) = s.d.value else { continue };
        let clean = sends
            .get(&v)
            .is_some_and(|st| st.ok && !st.unknown && !st.failed);
        if s.d.redelivered || s.d.delivery_count > 1 || !clean {
            continue;
        }
        if let Some(&prev) = last.get(&v.producer) {
            if v.seq < prev {
                verdict.add(
                    AnomalyKind::OutOfOrder,
                    Some(v),
                    format!(
                        "{v} was first delivered on {queue} after p{}-{prev}",
                        v.producer
                    ),
                );
                continue;
            }
        }
        last.insert(v.producer, v.seq);
    }
}

fn dead_letters(
    verdict: &mut Verdict,
    value: Value,
    got: &[&Seen],
    dlq: &dyn Fn(&str) -> bool,
    rule: DeadLetterRule,
) {
    let letters: Vec<&&Seen> = got.iter().filter(|s| dlq(&s.d.queue)).collect();
    let ids: BTreeSet<&str> = letters.iter().map(|s| s.d.message_id.as_str()).collect();
    let mut problem = |detail: String| verdict.add(AnomalyKind::DeadLetter, Some(value), detail);
    if ids.len() != 1 {
        problem(format!(
            "{value} is in a dead-letter queue {} times (message ids {ids:?}), not once",
            ids.len()
        ));
    }
    let want = ("max-deliveries".to_string(), i64::from(rule.max_deliveries));
    for s in &letters {
        if s.d.dead_letter.as_ref() != Some(&want) {
            problem(format!(
                "{value} was dead-lettered with {:?}, not {want:?}",
                s.d.dead_letter
            ));
        }
    }
    let counts: Vec<u32> = got
        .iter()
        .filter(|s| !dlq(&s.d.queue))
        .map(|s| s.d.delivery_count)
        .collect();
    if let Some(c) = counts.iter().find(|&&c| c > rule.max_deliveries) {
        problem(format!(
            "{value} was delivered a {c}th time, past max deliveries {}",
            rule.max_deliveries
        ));
    }
    let distinct: BTreeSet<u32> = counts.iter().copied().collect();
    if distinct.len() != counts.len() {
        problem(format!(
            "{value} was delivered twice with one delivery count: {counts:?}"
        ));
    }
    if rule.exact && distinct != (1..=rule.max_deliveries).collect() {
        problem(format!(
            "{value} was delivered with counts {counts:?}, not 1..={}",
            rule.max_deliveries
        ));
    }
}
