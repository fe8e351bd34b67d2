//! Receive: hand Ready messages to a receiver now, or park it as a waiter until a message comes,
//! its deadline passes, or it is cancelled. A waiter is removed on every way out.

use std::cmp::Reverse;

use super::{Delivery, Effects, MessageState, PersistOp, Queue};
use crate::error::KernelError;
use crate::types::{LeaseId, SessionId};

/// A parked receiver.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct WaiterId(pub u64);

/// How long a receive may wait for a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wait {
    /// `receiveNoWait`: answer at once, possibly empty.
    NoWait,
    /// `receive(timeout)`: wait until this time.
    Until(u64),
    /// `receive()`: wait until a message comes or the receiver is cancelled.
    Forever,
}

impl Wait {
    /// From a JMS-style timeout: `None` waits forever, `0` does not wait, a negative value is an
    /// error (and nothing is registered).
    pub fn from_timeout_ms(timeout_ms: Option<i64>, now_ms: u64) -> Result<Wait, KernelError> {
        match timeout_ms {
            None => Ok(Wait::Forever),
            Some(0) => Ok(Wait::NoWait),
            Some(t) if t < 0 => Err(KernelError::NegativeTimeout { timeout_ms: t }),
            Some(t) => Ok(Wait::Until(now_ms.saturating_add(t.unsigned_abs()))),
        }
    }
}

/// One call to receive.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReceiveRequest {
    /// The session that will own the leases; `None` for a session-less receiver, whose leases only
    /// end by ack, nack or expiry.
    pub owner: Option<SessionId>,
    pub max_messages: u32,
    pub wait: Wait,
    /// Lease length; the queue's default when `None`.
    pub lease_ms: Option<u64>,
}

/// What a receive did.
#[derive(Debug, Clone, PartialEq)]
pub enum ReceiveOutcome {
    Delivered(Vec<Delivery>),
    /// Nothing ready; the receiver waits. Its answer comes later in [`Effects::handed`] or
    /// [`Effects::finished_empty`].
    Parked(WaiterId),
    /// Nothing ready and the receiver would not wait.
    Empty,
}

#[derive(Debug, Clone)]
pub(crate) struct Waiter {
    pub(crate) owner: Option<SessionId>,
    pub(crate) max_messages: u32,
    pub(crate) lease_ms: u64,
    pub(crate) deadline_ms: Option<u64>,
}

impl Queue {
    /// Receives up to `max_messages`, or parks the receiver. Validates everything before touching
    /// the queue, so a refused receive leaves nothing behind.
    pub fn receive(
        &mut self,
        req: ReceiveRequest,
        now_ms: u64,
    ) -> Result<(ReceiveOutcome, Effects), KernelError> {
        if req.max_messages == 0 {
            return Err(KernelError::InvalidArgument {
                field: "max_messages",
                reason: "must be at least 1".into(),
            });
        }
        if req.max_messages > self.config.receive_batch_max {
            return Err(KernelError::OverLimit {
                field: "max_messages",
                value: req.max_messages.into(),
                limit: self.config.receive_batch_max.into(),
                limit_name: "receive_batch_max",
            });
        }
        let lease_ms = self.lease_ms(req.lease_ms)?;
        let mut effects = Effects::default();
        self.fire_due(now_ms, &mut effects);
        let deliveries =
            self.take_ready(req.max_messages, req.owner, lease_ms, now_ms, &mut effects);
        if !deliveries.is_empty() {
            return Ok((ReceiveOutcome::Delivered(deliveries), effects));
        }
        let deadline_ms = match req.wait {
            Wait::NoWait => return Ok((ReceiveOutcome::Empty, effects)),
            Wait::Until(t) if t <= now_ms => return Ok((ReceiveOutcome::Empty, effects)),
            Wait::Until(t) => Some(t),
            Wait::Forever => None,
        };
        if self.waiters.len() >= self.config.waiters_max {
            return Err(KernelError::TooManyWaiters {
                queue: self.name.clone(),
                waiters: self.waiters.len(),
                limit: self.config.waiters_max,
            });
        }
        let id = self.next_waiter;
        self.next_waiter = WaiterId(id.0 + 1);
        let waiter = Waiter {
            owner: req.owner,
            max_messages: req.max_messages,
            lease_ms,
            deadline_ms,
        };
        self.insert_waiter(id, waiter);
        Ok((ReceiveOutcome::Parked(id), effects))
    }

    /// Removes a parked receiver (its client went away). Returns whether it was still parked.
    pub fn cancel_waiter(&mut self, id: WaiterId) -> bool {
        self.remove_waiter(id).is_some()
    }

    /// Number of parked receivers.
    pub fn waiter_count(&self) -> usize {
        self.waiters.len()
    }

    pub(crate) fn lease_ms(&self, asked: Option<u64>) -> Result<u64, KernelError> {
        match asked {
            None => Ok(self.config.default_lease_ms),
            Some(0) => Err(KernelError::InvalidArgument {
                field: "lease_ms",
                reason: "must be at least 1".into(),
            }),
            Some(ms) if ms > self.config.lease_max_ms => Err(KernelError::OverLimit {
                field: "lease_ms",
                value: ms,
                limit: self.config.lease_max_ms,
                limit_name: "lease_max_ms",
            }),
            Some(ms) => Ok(ms),
        }
    }

    fn insert_waiter(&mut self, id: WaiterId, waiter: Waiter) {
        if let Some(d) = waiter.deadline_ms {
            self.waiter_deadlines.insert((d, id));
        }
        self.waiters.insert(id, waiter);
    }

    pub(crate) fn remove_waiter(&mut self, id: WaiterId) -> Option<Waiter> {
        let waiter = self.waiters.remove(&id)?;
        if let Some(d) = waiter.deadline_ms {
            self.waiter_deadlines.remove(&(d, id));
        }
        Some(waiter)
    }

    /// Leases up to `max` Ready messages (highest priority, then oldest, first). Expired messages
    /// met on the way are removed, never delivered.
    pub(crate) fn take_ready(
        &mut self,
        max: u32,
        owner: Option<SessionId>,
        lease_ms: u64,
        now_ms: u64,
        effects: &mut Effects,
    ) -> Vec<Delivery> {
        let mut out = Vec::new();
        while out.len() < max as usize {
            let Some(&(Reverse(_), seq)) = self.ready.first() else {
                break;
            };
            let Some(entry) = self.entries.get(&seq) else {
                break;
            };
            if entry.message.is_expired(now_ms) {
                self.counters.expired_total += 1;
                effects.persist.extend(self.remove_entry(seq));
                continue;
            }
            let lease = self.next_lease;
            self.next_lease = LeaseId(lease.0 + 1);
            let until_ms = now_ms.saturating_add(lease_ms);
            self.set_state(
                seq,
                MessageState::Leased {
                    lease,
                    owner,
                    until_ms,
                },
            );
            let Some(entry) = self.entries.get_mut(&seq) else {
                break;
            };
            entry.delivery_count += 1;
            let delivery = Delivery {
                queue: self.uid,
                message: entry.message.clone(),
                lease,
                delivery_count: entry.delivery_count,
                lease_until_ms: until_ms,
            };
            if delivery.message.persistent {
                effects.persist.push(PersistOp::SetDeliveryCount {
                    seq,
                    count: entry.delivery_count,
                });
            }
            self.counters.delivered_total += 1;
            if delivery.redelivered() {
                self.counters.redelivered_total += 1;
            }
            out.push(delivery);
        }
        out
    }

    /// Hands Ready messages to parked receivers, oldest receiver first, until one side runs out.
    pub(crate) fn dispatch(&mut self, now_ms: u64, effects: &mut Effects) {
        while !self.ready.is_empty() {
            let Some((&id, _)) = self.waiters.first_key_value() else {
                break;
            };
            let Some(w) = self.remove_waiter(id) else {
                break;
            };
            let deliveries = self.take_ready(w.max_messages, w.owner, w.lease_ms, now_ms, effects);
            if deliveries.is_empty() {
                // Everything that was ready had expired: the receiver keeps waiting.
                self.insert_waiter(id, w);
                break;
            }
            effects.handed.push((id, deliveries));
        }
    }
}
