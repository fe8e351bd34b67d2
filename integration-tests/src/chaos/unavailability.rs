//! Unavailability from a history: the longest stretch of the load phase in which sends to a
//! queue (or to any queue, for the run as a whole) were invoked and none was confirmed.
//!
//! The definition, for the sends one figure covers:
//! - a stretch **begins** at the first moment after a confirmation (or after the load began) at
//!   which a send is outstanding: at that confirmation itself when a send invoked before it was
//!   still waiting for its answer, otherwise when the next send is invoked;
//! - it **ends** at the next confirmation (a `send_end` `ok`, when the producer read the
//!   answer), or at the end of the load phase if none came;
//! - everything in between counts, whatever the producers did: waiting for an answer, a send
//!   that was refused or timed out, opening a session through another node, the pause before
//!   it. Time in which no send was invoked since the last confirmation (before a producer's
//!   first send, after producers of a fixed count finished) is not a stretch.
//!
//! Each producer has one call in flight and invokes the next at once, so under load a stretch
//! is the gap between two confirmations. A confirmation read just after a fault from a call the
//! node answered just before it ends a stretch, as it should (the queue was available then).
//! Unlike a failover time ([`super::failover`]), which counts only sends invoked after the kill,
//! a stretch ends at any confirmation: a send that waited through an election ends it.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};

use serde::Serialize;

use super::history::{load_window, Event, Op, Outcome};

/// One stretch in which sends were invoked and none was confirmed (see the module's doc).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct Stretch {
    pub ms: f64,
    /// When it began and ended, ms since the run began (both 0 when there was none).
    pub from_ms: f64,
    pub to_ms: f64,
}

impl Stretch {
    fn of(from_us: u64, to_us: u64) -> Self {
        let ms = |us: u64| us as f64 / 1_000.0;
        Stretch {
            ms: ms(to_us.saturating_sub(from_us)),
            from_ms: ms(from_us),
            to_ms: ms(to_us),
        }
    }
}

/// The longest stretch of the load phase in which sends (those of the operations `mine` picks)
/// were invoked and none was confirmed.
pub fn longest(events: &[Event], mine: impl Fn(u64) -> bool) -> Stretch {
    let (start_us, end_us) = load_window(events);
    let mut pending: HashSet<u64> = HashSet::new();
    // When the stretch under way began; `None` while no send waits since the last confirmation.
    let mut open_us: Option<u64> = None;
    let mut longest = Stretch::default();
    let mut close = |from_us: u64, to_us: u64| {
        let s = Stretch::of(from_us, to_us);
        if s.ms > longest.ms {
            longest = s;
        }
    };
    for e in events.iter().take_while(|e| e.t_us <= end_us) {
        match &e.op {
            Op::SendInvoke { op, .. } if mine(*op) => {
                pending.insert(*op);
                open_us.get_or_insert(e.t_us.max(start_us));
            }
            Op::SendEnd { op, outcome, .. } if mine(*op) => {
                pending.remove(op);
                if *outcome == Outcome::Ok {
                    if let Some(from_us) = open_us.take() {
                        close(from_us, e.t_us.max(start_us));
                    }
                    if !pending.is_empty() {
                        open_us = Some(e.t_us.max(start_us));
                    }
                }
            }
            _ => {}
        }
    }
    if let Some(from_us) = open_us {
        close(from_us, end_us);
    }
    longest
}

/// Each queue's longest stretch, when sends went to more than one queue (with one, it is the
/// run's).
pub fn longest_by_queue(events: &[Event]) -> BTreeMap<String, Stretch> {
    let mut queue_of: HashMap<u64, &str> = HashMap::new();
    for e in events {
        if let Op::SendInvoke { op, queue, .. } = &e.op {
            queue_of.insert(*op, queue.as_str());
        }
    }
    let queues: BTreeSet<&str> = queue_of.values().copied().collect();
    if queues.len() < 2 {
        return BTreeMap::new();
    }
    queues
        .into_iter()
        .map(|q| {
            let mine = |op: u64| queue_of.get(&op) == Some(&q);
            (q.to_string(), longest(events, mine))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(t_ms: u64, op: Op) -> Event {
        Event {
            t_us: t_ms * 1_000,
            process: "producer-0".into(),
            node: "n1".into(),
            op,
        }
    }

    fn phase(t_ms: u64, name: &str) -> Event {
        at(t_ms, Op::Phase { name: name.into() })
    }

    fn invoke(t_ms: u64, op: u64, queue: &str) -> Event {
        let invoke = Op::SendInvoke {
            op,
            queue: queue.into(),
            producer: 0,
            first_seq: op,
            count: 1,
            attempt: 1,
        };
        at(t_ms, invoke)
    }

    fn end(t_ms: u64, op: u64, ok: bool) -> Event {
        let outcome = match ok {
            true => Outcome::Ok,
            false => Outcome::Unknown {
                error: "timed out".into(),
            },
        };
        let end = Op::SendEnd {
            op,
            outcome,
            message_ids: vec![],
        };
        at(t_ms, end)
    }

    #[test]
    fn a_stretch_runs_from_the_first_send_left_waiting_to_the_next_confirmation() {
        let events = vec![
            phase(0, "load"),
            // Nothing invoked for 100 ms: not a stretch.
            invoke(100, 1, "a"),
            end(101, 1, true),
            // A send that times out, a session opened elsewhere, its retry confirmed: one
            // stretch from the first invoke to the confirmation.
            invoke(300, 2, "a"),
            end(5_300, 2, false),
            invoke(5_400, 3, "a"),
            end(5_410, 3, true),
            phase(6_000, "heal"),
        ];
        let s = longest(&events, |_| true);
        assert_eq!(s, Stretch::of(300_000, 5_410_000));
    }

    #[test]
    fn a_send_still_waiting_at_a_confirmation_opens_a_stretch_there() {
        let events = vec![
            phase(0, "load"),
            invoke(10, 1, "a"),
            invoke(20, 2, "a"),
            end(30, 1, true),
            // Send 2 waits from 30 ms on, while nothing else is invoked.
            end(2_030, 2, true),
            phase(3_000, "heal"),
        ];
        assert_eq!(longest(&events, |_| true), Stretch::of(30_000, 2_030_000));
    }

    #[test]
    fn a_stretch_open_when_the_load_ends_is_cut_there_and_one_never_opened_is_none() {
        let events = vec![
            phase(0, "load"),
            invoke(10, 1, "a"),
            end(11, 1, true),
            invoke(1_000, 2, "b"),
            phase(4_000, "heal"),
            end(9_000, 2, true),
        ];
        let by_queue = longest_by_queue(&events);
        assert_eq!(by_queue["a"], Stretch::of(10_000, 11_000));
        assert_eq!(by_queue["b"], Stretch::of(1_000_000, 4_000_000));
        // The run as a whole: the same stretch of "b" (the confirmation of "a" came before).
        assert_eq!(
            longest(&events, |_| true),
            Stretch::of(1_000_000, 4_000_000)
        );
    }

    #[test]
    fn one_queue_confirming_does_not_end_another_queues_stretch() {
        let events = vec![
            phase(0, "load"),
            invoke(10, 1, "a"),
            invoke(10, 2, "b"),
            end(20, 1, true),
            invoke(20, 3, "a"),
            end(30, 3, true),
            end(3_010, 2, true),
            phase(4_000, "heal"),
        ];
        let by_queue = longest_by_queue(&events);
        assert_eq!(by_queue["b"], Stretch::of(10_000, 3_010_000));
        assert_eq!(by_queue["a"].ms, 10.0);
        assert_eq!(longest(&events, |_| true), Stretch::of(30_000, 3_010_000));
    }
}
