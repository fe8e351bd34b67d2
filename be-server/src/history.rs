//! Per-message history: each step the queues report (sent, delivered to whom, returned and why,
//! acknowledged, dead-lettered ...), kept in memory for a retention time and up to a number of
//! steps, whichever ends first. It does not survive a restart.

use std::collections::{HashMap, VecDeque};
use std::sync::{Mutex, PoisonError};

use ferry_kernel::{HistoryEntry, MessageId, QueueName, Transition};

/// One step, as `ferry message history` shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Step {
    pub at_ms: u64,
    pub queue: String,
    pub event: &'static str,
    pub detail: String,
}

#[derive(Debug, Default)]
struct Steps {
    by_id: HashMap<String, VecDeque<Step>>,
    /// Every kept step in the order it came: (time, message id), for pruning.
    order: VecDeque<(u64, String)>,
}

/// See the module docs.
#[derive(Debug)]
pub struct History {
    retention_ms: u64,
    max_steps: usize,
    steps: Mutex<Steps>,
}

impl History {
    /// `retention_ms == 0` or `max_steps == 0` keeps nothing.
    pub fn new(retention_ms: u64, max_steps: usize) -> Self {
        Self {
            retention_ms,
            max_steps,
            steps: Mutex::new(Steps::default()),
        }
    }

    pub(crate) fn enabled(&self) -> bool {
        self.retention_ms > 0 && self.max_steps > 0
    }

    pub(crate) fn record(&self, queue: &QueueName, id: MessageId, e: &HistoryEntry) {
        if !self.enabled() {
            return;
        }
        let (event, detail) = describe(&e.transition);
        let id = id.to_string();
        let mut s = self.steps.lock().unwrap_or_else(PoisonError::into_inner);
        s.by_id.entry(id.clone()).or_default().push_back(Step {
            at_ms: e.at_ms,
            queue: queue.to_string(),
            event,
            detail,
        });
        s.order.push_back((e.at_ms, id));
        let oldest_kept = e.at_ms.saturating_sub(self.retention_ms);
        while s
            .order
            .front()
            .is_some_and(|(at, _)| *at < oldest_kept || s.order.len() > self.max_steps)
        {
            let Some((_, old)) = s.order.pop_front() else {
                break;
            };
            if let Some(v) = s.by_id.get_mut(&old) {
                v.pop_front();
                if v.is_empty() {
                    s.by_id.remove(&old);
                }
            }
        }
    }

    /// The steps kept for a message, oldest first.
    pub fn get(&self, id: &str) -> Vec<Step> {
        let s = self.steps.lock().unwrap_or_else(PoisonError::into_inner);
        s.by_id
            .get(id)
            .map(|v| v.iter().cloned().collect())
            .unwrap_or_default()
    }
}

fn describe(t: &Transition) -> (&'static str, String) {
    match t {
        Transition::Sent {
            deliver_at_ms,
            committed,
        } => (
            "sent",
            match (deliver_at_ms, committed) {
                (Some(at), _) => format!("delayed until {at}"),
                (None, true) => "visible at its transaction's commit".into(),
                (None, false) => String::new(),
            },
        ),
        Transition::Delivered {
            session,
            delivery_count,
            lease_until_ms,
        } => (
            "delivered",
            format!(
                "to {}, delivery {delivery_count}, lease until {lease_until_ms}",
                session.map_or_else(
                    || "a receiver without a session".into(),
                    |s| format!("session {s}")
                )
            ),
        ),
        Transition::Acked => ("acked", String::new()),
        Transition::Returned {
            cause,
            redeliver_at_ms,
        } => (
            "returned",
            match redeliver_at_ms {
                Some(at) => format!("{}; redelivery delayed until {at}", cause.as_str()),
                None => format!("{}; ready again", cause.as_str()),
            },
        ),
        Transition::Undelivered => (
            "undelivered",
            "its receiver was gone; not counted as a delivery".into(),
        ),
        Transition::DeadLettered { reason } => ("dead-lettered", reason.as_str().into()),
        Transition::Deleted => ("deleted", "purged or deleted by an administrator".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ferry_kernel::{QueueUid, Seq};

    fn entry(seq: u64, at_ms: u64) -> HistoryEntry {
        HistoryEntry {
            seq: Seq(seq),
            at_ms,
            transition: Transition::Acked,
        }
    }

    #[test]
    fn steps_older_than_the_retention_or_beyond_the_cap_go_first() {
        let q = QueueName::new("q").unwrap_or_else(|e| panic!("{e}"));
        let id = |seq| MessageId::new(QueueUid(1), Seq(seq));
        let h = History::new(1_000, 3);
        h.record(&q, id(1), &entry(1, 0));
        h.record(&q, id(2), &entry(2, 500));
        h.record(&q, id(2), &entry(2, 600));
        assert_eq!(h.get(id(1).as_str()).len(), 1);
        // A fourth step: over the cap, the oldest (message 1's) goes.
        h.record(&q, id(3), &entry(3, 700));
        assert!(h.get(id(1).as_str()).is_empty());
        assert_eq!(h.get(id(2).as_str()).len(), 2);
        // Time passes beyond the retention of message 2's steps.
        h.record(&q, id(3), &entry(3, 1_650));
        assert!(h.get(id(2).as_str()).is_empty());
        assert_eq!(h.get(id(3).as_str()).len(), 2);
        let off = History::new(0, 10);
        off.record(&q, id(1), &entry(1, 0));
        assert!(off.get(id(1).as_str()).is_empty());
    }
}
