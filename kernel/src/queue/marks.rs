//! Delivery marks: what a replicated queue writes of a delivery beside its count, so that the
//! node that serves the queue next (a new shard leader) honours what the last one handed out.
//!
//! A queue whose marks are written ([`Queue::write_delivery_marks`]) writes, for each persistent
//! message, the lease of every delivery (id, session, expiry, length) and the back-off of every
//! return. A return without back-off writes the count alone, which clears the mark. Lease
//! renewals are not written: a new leader treats each written lease as renewed when it took
//! over (it runs until the later of its written expiry and the takeover plus its length), so a
//! consumer whose session keeps renewing keeps its messages and its acknowledgements still land.
//! Message groups are not written either: a session holding an unacknowledged message of a
//! group holds the group again once that lease is read back; a group whose session holds
//! nothing unacknowledged is free after a takeover (every earlier message of it was
//! acknowledged, so its order still holds).

use std::sync::Arc;

use super::{MessageState, PersistOp, Queue, RecoveredMessage};
use crate::types::{LeaseId, Seq, SessionId};

/// What is written of a delivered message beside its delivery count (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeliveryMark {
    /// Handed to `owner` (`None`: a receiver outside any session) under `lease`, due back at
    /// `until_ms` unless renewed; `lease_ms` is the lease's length, what a renewal grants.
    Leased {
        lease: LeaseId,
        owner: Option<SessionId>,
        until_ms: u64,
        lease_ms: u64,
    },
    /// Came back, and waits for its redelivery until `until_ms`.
    Backoff { until_ms: u64 },
}

impl Queue {
    /// From now on every delivery and return of a persistent message writes its
    /// [`DeliveryMark`] (a [`super::PersistOp::MarkDelivery`]). A replicated queue's shell asks
    /// for it; a queue kept by one node alone writes delivery counts only, as it always did.
    pub fn write_delivery_marks(&mut self) {
        self.marks_written = true;
    }

    /// Leases from now on are numbered from `first` up (or from above the highest one in use,
    /// if higher): a shell whose deliveries outlive a run of the queue (a replicated queue's
    /// receipt handles stay good on the next leader) starts each run's ids where no earlier
    /// run's can be.
    pub fn begin_lease_ids_at(&mut self, first: LeaseId) {
        self.next_lease = self.next_lease.max(first);
    }

    /// The state a message read back from the store takes at `now_ms`, with its lease length: a
    /// written lease is honoured (see the module docs), a written back-off kept, a delivery
    /// time still ahead waited for.
    pub(crate) fn recovered_state(&self, m: &RecoveredMessage, now_ms: u64) -> (MessageState, u64) {
        let scheduled = |until_ms: u64| {
            if until_ms > now_ms {
                MessageState::Scheduled { until_ms }
            } else {
                MessageState::Ready
            }
        };
        let delivery_at = m.message.deliver_at_ms.unwrap_or(0);
        match m.mark {
            Some(DeliveryMark::Leased {
                lease,
                owner,
                until_ms,
                lease_ms,
            }) if m.delivery_count > 0 => (
                MessageState::Leased {
                    lease,
                    owner,
                    until_ms: until_ms.max(now_ms.saturating_add(lease_ms)),
                },
                lease_ms,
            ),
            Some(DeliveryMark::Backoff { until_ms }) => (scheduled(until_ms.max(delivery_at)), 0),
            _ => (scheduled(delivery_at), 0),
        }
    }

    /// Adds a message read back from the store in the state it takes at `now_ms` (see
    /// [`Queue::recovered_state`]); a written lease holds its session's message group again.
    /// Returns its sequence number and whether it was delivered as often as the policy allows.
    pub(crate) fn insert_recovered(&mut self, m: RecoveredMessage, now_ms: u64) -> (Seq, bool) {
        let (state, lease_ms) = self.recovered_state(&m, now_ms);
        let exhausted = self.config.redelivery.exhausted(m.delivery_count)
            && !matches!(state, MessageState::Leased { .. });
        let seq = m.message.seq;
        if let MessageState::Leased { lease, owner, .. } = state {
            self.next_lease = self.next_lease.max(LeaseId(lease.0 + 1));
            self.inherited_leases_below = self.inherited_leases_below.max(LeaseId(lease.0 + 1));
            self.groups.claim(m.message.group_id.as_deref(), owner);
        }
        self.insert_entry(Arc::new(m.message), state, m.delivery_count);
        if let Some(e) = self.entries.get_mut(&seq) {
            e.lease_ms = lease_ms;
        }
        (seq, exhausted)
    }

    /// The write that keeps a persistent message's delivery count, with its mark as its state
    /// is now when marks are written: a lease while it is leased, a back-off while it waits to
    /// be redelivered, none (the count alone) once it is Ready. `None` for a message that is
    /// not persistent or not in the queue.
    pub(crate) fn delivery_write(&self, seq: Seq) -> Option<PersistOp> {
        let e = self.entries.get(&seq).filter(|e| e.message.persistent)?;
        let count = e.delivery_count;
        let mark = match e.state {
            _ if !self.marks_written => None,
            MessageState::Leased {
                lease,
                owner,
                until_ms,
            } => Some(DeliveryMark::Leased {
                lease,
                owner,
                until_ms,
                lease_ms: e.lease_ms,
            }),
            MessageState::Scheduled { until_ms } => Some(DeliveryMark::Backoff { until_ms }),
            MessageState::Ready => None,
        };
        Some(match mark {
            Some(mark) => PersistOp::MarkDelivery { seq, count, mark },
            None => PersistOp::SetDeliveryCount { seq, count },
        })
    }
}
