//! Recovery, purge, browse and statistics.

use super::{DedupRecord, Effects, MessageState, Queue, QueueConfig, Transition};
use crate::error::KernelError;
use crate::selector::Selector;
use crate::types::{Message, MessageId, QueueName, QueueUid, Seq, SessionId, SharedMessage};

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Counters {
    pub(crate) sent_total: u64,
    pub(crate) delivered_total: u64,
    pub(crate) redelivered_total: u64,
    pub(crate) acked_total: u64,
    pub(crate) expired_total: u64,
    pub(crate) lease_expired_total: u64,
    pub(crate) purged_total: u64,
    pub(crate) dead_lettered: DeadLetterCounts,
}

/// Messages dead-lettered, by reason (expired messages are in `expired_total`).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct DeadLetterCounts {
    pub max_deliveries: u64,
    pub rejected: u64,
}

/// A queue's numbers at one moment. Totals count since the node started.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct QueueStats {
    pub ready: u64,
    pub scheduled: u64,
    pub leased: u64,
    pub waiters: u64,
    pub bytes: u64,
    pub sent_total: u64,
    pub delivered_total: u64,
    pub redelivered_total: u64,
    pub acked_total: u64,
    pub expired_total: u64,
    pub lease_expired_total: u64,
    pub purged_total: u64,
    /// Messages that left for the dead-letter target (or were discarded) after their deliveries
    /// ran out or a consumer rejected them.
    pub dead_lettered: DeadLetterCounts,
    /// Sends staged by transacted sessions, not yet committed.
    pub staged: u64,
    /// Message groups held by a session.
    pub groups: u64,
    /// JMSTimestamp of the oldest Ready message (the lowest sequence among them), if any.
    /// Paged-out messages are not looked at.
    pub oldest_ready_timestamp_ms: Option<u64>,
    /// Messages in the store only (counted in `ready`, whatever their delivery time).
    pub paged_out: u64,
    /// Bytes of the messages held in memory.
    pub resident_bytes: u64,
    /// What the queue aims to keep in memory (`u64::MAX`: no limit).
    pub memory_budget_bytes: u64,
}

/// A message read back from the store at startup.
#[derive(Debug, Clone, PartialEq)]
pub struct RecoveredMessage {
    pub message: Message,
    pub delivery_count: u32,
    /// What a replicated queue wrote of its last delivery or return (see
    /// [`super::DeliveryMark`]); always `None` for a queue that writes counts only.
    pub mark: Option<super::DeliveryMark>,
}

impl Queue {
    /// Rebuilds a queue from what the store kept. Messages that were leased when the node stopped
    /// are Ready again (their delivery count survives, so their next delivery is flagged
    /// redelivered), unless their lease was written (a replicated queue's, see
    /// [`super::DeliveryMark`]); delayed ones stay Scheduled; dedup ids are remembered until their window
    /// ends. Messages that may not be delivered again (expired, deliveries exhausted) are
    /// dead-lettered by the first [`Queue::tick`], which is due at once.
    pub fn recover(
        name: QueueName,
        uid: QueueUid,
        config: QueueConfig,
        seq_reserved_until: Seq,
        messages: Vec<RecoveredMessage>,
        dedup: Vec<DedupRecord>,
        now_ms: u64,
    ) -> Self {
        let mut q = Queue::new(name, uid, config);
        for r in dedup {
            q.remember_dedup(r);
        }
        let mut next = seq_reserved_until.max(Seq(1));
        for m in messages {
            next = next.max(Seq(m.message.seq.0 + 1));
            let (seq, exhausted) = q.insert_recovered(m, now_ms);
            if exhausted {
                q.recovered_exhausted.push(seq);
            }
        }
        q.next_seq = next;
        q.seq_reserved_until = next;
        q
    }

    /// Deletes one message by its id, unless a consumer holds it.
    pub fn delete_message(
        &mut self,
        id: &MessageId,
        now_ms: u64,
    ) -> (Result<(), KernelError>, Effects) {
        let mut effects = Effects::default();
        self.fire_due(now_ms, &mut effects);
        // `ID:<queue uid>-<seq>`: the sequence number finds it; the whole id must match.
        let found = id
            .as_str()
            .rsplit_once('-')
            .and_then(|(_, seq)| seq.parse().ok())
            .map(Seq)
            .filter(|&seq| MessageId::new(self.uid, seq) == *id)
            .and_then(|seq| self.entries.get(&seq).map(|e| (seq, e.state)));
        let result = match found {
            None => Err(KernelError::NoSuchMessage { id: id.to_string() }),
            Some((_, MessageState::Leased { .. })) => {
                Err(KernelError::MessageLeased { id: id.to_string() })
            }
            Some((seq, _)) => {
                effects.persist.extend(self.remove_entry(seq));
                self.record(&mut effects, seq, Transition::Deleted);
                self.counters.purged_total += 1;
                Ok(())
            }
        };
        self.dispatch(now_ms, &mut effects);
        (result, effects)
    }

    /// Removes every message that is not leased, paged-out ones included. Returns how many were
    /// removed.
    pub fn purge(&mut self, now_ms: u64) -> (u64, Effects) {
        let mut effects = Effects::default();
        self.fire_due(now_ms, &mut effects);
        let doomed: Vec<Seq> = self
            .entries
            .iter()
            .filter(|(_, e)| !matches!(e.state, MessageState::Leased { .. }))
            .map(|(&s, _)| s)
            .collect();
        for &seq in &doomed {
            effects.persist.extend(self.remove_entry(seq));
            self.record(&mut effects, seq, Transition::Deleted);
        }
        let purged = doomed.len() as u64 + self.purge_paged_out(&mut effects);
        self.counters.purged_total += purged;
        (purged, effects)
    }

    /// Up to `max` messages after `after` in sequence order that `selector` matches, with their
    /// state and delivery count, without leasing anything. Looks at no more than `scan_max`
    /// messages; returns where to resume (`None`: nothing more).
    pub fn browse(
        &self,
        after: Option<Seq>,
        max: usize,
        selector: Option<&Selector>,
        scan_max: usize,
    ) -> (Vec<(SharedMessage, MessageState, u32)>, Option<Seq>) {
        use std::ops::Bound::{Excluded, Unbounded};
        let start = after.map_or(Unbounded, Excluded);
        let mut out = Vec::new();
        let mut last = None;
        for (scanned, (&seq, e)) in self.entries.range((start, Unbounded)).enumerate() {
            if out.len() >= max || scanned >= scan_max {
                return (out, last);
            }
            last = Some(seq);
            if selector.is_none_or(|s| s.matches(&e.message, e.delivery_count)) {
                out.push((e.message.clone(), e.state, e.delivery_count));
            }
        }
        (out, None)
    }

    /// Replaces the queue's settings while it runs (checked by the caller, as at creation).
    /// Each applies from the next operation that reads it: a lease already granted keeps its
    /// length, a message already scheduled for redelivery keeps its time, a dedup id already
    /// remembered keeps its expiry; the next return, delivery, dead letter or send follows the
    /// new settings.
    pub fn set_config(&mut self, config: QueueConfig) {
        self.config = config;
    }

    /// How many deliveries `owner` holds in this queue (delivered, not acknowledged).
    pub fn leases_held_by(&self, owner: SessionId) -> u64 {
        self.leases_by_owner
            .get(&owner)
            .map_or(0, |s| s.len() as u64)
    }

    /// Bytes of messages the queue holds, resident and paged out (`QueueStats::bytes`), without
    /// building the rest of the statistics.
    pub fn held_bytes(&self) -> u64 {
        self.bytes + self.paging.paged_out().1
    }

    pub fn stats(&self) -> QueueStats {
        let c = self.counters;
        let (paged_out, paged_out_bytes) = self.paging.paged_out();
        QueueStats {
            ready: self.ready.len() as u64 + paged_out,
            scheduled: self.scheduled.len() as u64,
            leased: self.lease_expiry.len() as u64,
            waiters: self.waiters.len() as u64,
            bytes: self.bytes + paged_out_bytes,
            sent_total: c.sent_total,
            delivered_total: c.delivered_total,
            redelivered_total: c.redelivered_total,
            acked_total: c.acked_total,
            expired_total: c.expired_total,
            lease_expired_total: c.lease_expired_total,
            purged_total: c.purged_total,
            dead_lettered: c.dead_lettered,
            staged: self.staged_count() as u64,
            groups: self.groups.len() as u64,
            oldest_ready_timestamp_ms: self.oldest_ready_timestamp_ms(),
            paged_out,
            resident_bytes: self.bytes,
            memory_budget_bytes: self.paging.budget_bytes,
        }
    }

    /// The oldest Ready message is the first of some priority's run in the ready index: ten
    /// lookups, not a scan.
    fn oldest_ready_timestamp_ms(&self) -> Option<u64> {
        use std::cmp::Reverse;
        (0..=crate::types::Priority::MAX)
            .filter_map(|p| {
                let p = crate::types::Priority::new(p.into()).ok()?;
                self.ready
                    .range((Reverse(p), Seq(0))..=(Reverse(p), Seq(u64::MAX)))
                    .next()
                    .map(|&(_, seq)| seq)
            })
            .min()
            .and_then(|seq| self.entries.get(&seq))
            .map(|e| e.message.timestamp_ms)
    }
}
