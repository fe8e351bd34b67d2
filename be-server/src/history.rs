//! Per-message history: each step the queues report (sent, delivered to whom, returned and why,
//! acknowledged, dead-lettered ...), kept in memory for a retention time and up to a number of
//! steps, whichever ends first. It does not survive a restart.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, PoisonError};

use ferry_kernel::{HistoryEntry, MessageId, QueueUid, Transition};

/// One step, as `ferry message history` shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Step {
    pub at_ms: u64,
    pub queue: String,
    pub event: &'static str,
    pub detail: String,
    /// When the message may be delivered (again), as the queue scheduled it: a delayed send or a
    /// delayed redelivery; `None` on other steps.
    pub deliver_at_ms: Option<u64>,
}

/// A kept step: plain data, rendered only when asked for (recording is on the hot path).
#[derive(Debug, Clone)]
struct Kept {
    uid: u64,
    seq: u64,
    at_ms: u64,
    transition: Transition,
}

#[derive(Debug, Default)]
struct Steps {
    /// Every kept step in the order it came. Recording appends and prunes from the front, with
    /// no hashing and no allocation per message; asking for a message's steps reads them all,
    /// which is at most `max_steps` and happens when an operator asks.
    order: VecDeque<Kept>,
    /// The name of each queue that has steps, by uid.
    queues: HashMap<u64, Arc<str>>,
}

/// See the module docs.
#[derive(Debug)]
pub struct History {
    retention_ms: u64,
    max_steps: usize,
    steps: Mutex<Steps>,
    /// Sessions are shown by their public form: a session id is what its calls carry.
    public: ferry_kernel::PublicIds,
}

impl History {
    /// `retention_ms == 0` or `max_steps == 0` keeps nothing.
    pub fn new(retention_ms: u64, max_steps: usize) -> Self {
        Self {
            retention_ms,
            max_steps,
            steps: Mutex::new(Steps::default()),
            public: ferry_kernel::PublicIds::new((rand::random(), rand::random())),
        }
    }

    pub(crate) fn enabled(&self) -> bool {
        self.retention_ms > 0 && self.max_steps > 0
    }

    /// Keeps the steps of one operation on one queue.
    pub(crate) fn record(&self, queue: &Arc<str>, uid: QueueUid, entries: &[HistoryEntry]) {
        if !self.enabled() || entries.is_empty() {
            return;
        }
        let mut s = self.steps.lock().unwrap_or_else(PoisonError::into_inner);
        if s.queues.get(&uid.0).is_none_or(|q| q != queue) {
            s.queues.insert(uid.0, queue.clone());
        }
        let mut newest = 0;
        for e in entries {
            s.order.push_back(Kept {
                uid: uid.0,
                seq: e.seq.0,
                at_ms: e.at_ms,
                transition: e.transition.clone(),
            });
            newest = newest.max(e.at_ms);
        }
        let oldest_kept = newest.saturating_sub(self.retention_ms);
        while s
            .order
            .front()
            .is_some_and(|k| k.at_ms < oldest_kept || s.order.len() > self.max_steps)
        {
            s.order.pop_front();
        }
    }

    /// The steps kept for a message, oldest first (none for an id that is not one).
    pub fn get(&self, id: &str) -> Vec<Step> {
        let Ok((uid, seq)) = MessageId::parts(id) else {
            return vec![];
        };
        let s = self.steps.lock().unwrap_or_else(PoisonError::into_inner);
        let queue = s
            .queues
            .get(&uid.0)
            .map(ToString::to_string)
            .unwrap_or_default();
        s.order
            .iter()
            .filter(|k| k.uid == uid.0 && k.seq == seq.0)
            .map(|k| {
                let (event, detail) = describe(&k.transition, &self.public);
                Step {
                    at_ms: k.at_ms,
                    queue: queue.clone(),
                    event,
                    detail,
                    deliver_at_ms: deliver_at_ms(&k.transition),
                }
            })
            .collect()
    }
}

fn deliver_at_ms(t: &Transition) -> Option<u64> {
    match t {
        Transition::Sent { deliver_at_ms, .. } => *deliver_at_ms,
        Transition::Returned {
            redeliver_at_ms, ..
        } => *redeliver_at_ms,
        Transition::Delivered { .. }
        | Transition::Acked
        | Transition::Undelivered
        | Transition::DeadLettered { .. }
        | Transition::Deleted => None,
    }
}

fn describe(t: &Transition, public: &ferry_kernel::PublicIds) -> (&'static str, String) {
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
                    |s| format!("session {}", public.session(s))
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
    use ferry_kernel::Seq;

    fn entry(seq: u64, at_ms: u64) -> HistoryEntry {
        HistoryEntry {
            seq: Seq(seq),
            at_ms,
            transition: Transition::Acked,
        }
    }

    #[test]
    fn steps_older_than_the_retention_or_beyond_the_cap_go_first() {
        let q: Arc<str> = Arc::from("q");
        let uid = QueueUid(1);
        let id = |seq| MessageId::new(uid, Seq(seq));
        let h = History::new(1_000, 3);
        h.record(&q, uid, &[entry(1, 0)]);
        h.record(&q, uid, &[entry(2, 500), entry(2, 600)]);
        assert_eq!(h.get(id(1).as_str()).len(), 1);
        assert_eq!(h.get(id(1).as_str())[0].queue, "q");
        // A fourth step: over the cap, the oldest (message 1's) goes.
        h.record(&q, uid, &[entry(3, 700)]);
        assert!(h.get(id(1).as_str()).is_empty());
        assert_eq!(h.get(id(2).as_str()).len(), 2);
        // Time passes beyond the retention of message 2's steps.
        h.record(&q, uid, &[entry(3, 1_650)]);
        assert!(h.get(id(2).as_str()).is_empty());
        assert_eq!(h.get(id(3).as_str()).len(), 2);
        assert!(h.get("not an id").is_empty());
        let off = History::new(0, 10);
        off.record(&q, uid, &[entry(1, 0)]);
        assert!(off.get(id(1).as_str()).is_empty());
    }
}
