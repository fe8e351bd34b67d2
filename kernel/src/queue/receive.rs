//! Receive: hand Ready messages to a receiver now, or park it as a waiter until a message comes,
//! its deadline passes, or it is cancelled. A waiter is removed on every way out.

use std::cmp::Reverse;
use std::sync::Arc;

use super::{DeadLetterReason, Delivery, Effects, Entry, MessageState, Queue, Transition};
use crate::error::KernelError;
use crate::selector::Selector;
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
#[derive(Debug, Clone)]
pub struct ReceiveRequest {
    /// The session that will own the leases; `None` for a session-less receiver, whose leases only
    /// end by ack, nack or expiry.
    pub owner: Option<SessionId>,
    pub max_messages: u32,
    pub wait: Wait,
    /// Lease length; the queue's default when `None`.
    pub lease_ms: Option<u64>,
    /// Only messages this selector matches; the others stay where they are, in order, for
    /// other receivers.
    pub selector: Option<Arc<Selector>>,
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
    /// Memory alone cannot answer: messages this receiver may have to get first are paged out.
    /// Nothing changed (but time: see the effects). The shell pulls in what the store holds for
    /// the receiver ([`Queue::pull`]) and asks again with [`Queue::receive_scanned`].
    NeedStore,
}

#[derive(Debug, Clone)]
pub(crate) struct Waiter {
    pub(crate) owner: Option<SessionId>,
    pub(crate) max_messages: u32,
    pub(crate) lease_ms: u64,
    pub(crate) deadline_ms: Option<u64>,
    pub(crate) selector: Option<Arc<Selector>>,
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
        let Some(deliveries) = self.take_ready(
            req.max_messages,
            req.owner,
            lease_ms,
            req.selector.as_deref(),
            now_ms,
            &mut effects,
        ) else {
            return Ok((ReceiveOutcome::NeedStore, effects));
        };
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
            // What time did (expiries, dead letters) must still reach the shell.
            self.deferred.merge(effects);
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
            selector: req.selector,
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

    /// Leases up to `max` Ready messages that `selector` matches (all, without one) and whose
    /// group `owner` may take, highest priority then oldest first; the ones it skips keep their
    /// place. Messages met on the way that may not be delivered again (expired, deliveries
    /// exhausted) are dead-lettered, never delivered.
    ///
    /// `None` (and nothing leased) when fewer than `max` are found before a message that comes
    /// after a paged-out one: the store must be looked at first.
    pub(crate) fn take_ready(
        &mut self,
        max: u32,
        owner: Option<SessionId>,
        lease_ms: u64,
        selector: Option<&Selector>,
        now_ms: u64,
        effects: &mut Effects,
    ) -> Option<Vec<Delivery>> {
        let mut chosen = Vec::new();
        let mut blocked = false;
        let mut doomed = Vec::new();
        // Groups this receiver takes within this batch count as its own already.
        let mut claimed: Vec<&str> = Vec::new();
        // A selector that asks for one correlation id or group matches nothing else: only the
        // resident messages with that value are looked at, in delivery order.
        let indexed: Option<Vec<(Reverse<crate::types::Priority>, crate::types::Seq)>> =
            selector.and_then(Selector::indexed_equality).map(|(h, v)| {
                let mut c: Vec<_> = self
                    .by_header
                    .get(&(h, v.to_owned()))
                    .into_iter()
                    .flatten()
                    .filter_map(|seq| {
                        let e = self.entries.get(seq)?;
                        (e.state == MessageState::Ready)
                            .then_some((Reverse(e.message.priority), *seq))
                    })
                    .collect();
                c.sort_unstable();
                c
            });
        let order: Box<dyn Iterator<Item = &(Reverse<crate::types::Priority>, crate::types::Seq)>> =
            match &indexed {
                Some(c) => Box::new(c.iter()),
                None => Box::new(self.ready.iter()),
            };
        for &(Reverse(priority), seq) in order {
            // What comes after a paged-out message in delivery order waits for it (or for the
            // shell to look in the store: see `paging.rs`).
            if chosen.len() >= max as usize {
                break;
            }
            if self.behind_paged_out(priority, seq) {
                blocked = true;
                break;
            }
            let Some(entry) = self.entries.get(&seq) else {
                continue;
            };
            if let Some(reason) = self.undeliverable(entry, now_ms) {
                doomed.push((seq, reason));
                continue;
            }
            let group = entry.message.group_id.as_deref();
            let group_ok =
                self.groups.may_take(group, owner) || group.is_some_and(|g| claimed.contains(&g));
            if group_ok
                && selector.is_none_or(|s| s.matches(&entry.message, entry.delivery_count + 1))
            {
                chosen.push(seq);
                if let (Some(g), Some(_)) = (group, owner) {
                    if self.groups.owner(g).is_none() {
                        claimed.push(g);
                    }
                }
            }
        }
        for (seq, reason) in doomed {
            self.dead_letter(seq, reason, effects);
        }
        // Nothing more in memory may go first, but the store may hold better messages: the shell
        // looks there first (after it has looked, what memory has is the answer).
        blocked |= self.store_unchecked();
        if blocked && chosen.len() < max as usize && self.paging.checked.is_none() {
            return None;
        }
        Some(
            chosen
                .into_iter()
                .filter_map(|seq| self.lease_one(seq, owner, lease_ms, now_ms, effects))
                .collect(),
        )
    }

    /// Why a Ready message may not be delivered again, if so.
    pub(crate) fn undeliverable(&self, e: &Entry, now_ms: u64) -> Option<DeadLetterReason> {
        if e.message.is_expired(now_ms) {
            Some(DeadLetterReason::Expired)
        } else if self.config.redelivery.exhausted(e.delivery_count) {
            Some(DeadLetterReason::MaxDeliveries)
        } else {
            None
        }
    }

    /// Whether a receiver (its session and selector) may be given this message.
    fn may_receive(
        &self,
        e: &Entry,
        owner: Option<SessionId>,
        selector: Option<&Selector>,
    ) -> bool {
        self.groups.may_take(e.message.group_id.as_deref(), owner)
            && selector.is_none_or(|s| s.matches(&e.message, e.delivery_count + 1))
    }

    /// Leases one Ready message.
    fn lease_one(
        &mut self,
        seq: crate::types::Seq,
        owner: Option<SessionId>,
        lease_ms: u64,
        now_ms: u64,
        effects: &mut Effects,
    ) -> Option<Delivery> {
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
        let entry = self.entries.get_mut(&seq)?;
        entry.delivery_count += 1;
        entry.lease_ms = lease_ms;
        self.groups.claim(entry.message.group_id.as_deref(), owner);
        let delivery = Delivery {
            queue: self.uid,
            message: entry.message.clone(),
            lease,
            delivery_count: entry.delivery_count,
            lease_until_ms: until_ms,
        };
        effects.persist.extend(self.delivery_write(seq));
        self.record(
            effects,
            seq,
            Transition::Delivered {
                session: owner,
                delivery_count: delivery.delivery_count,
                lease_until_ms: until_ms,
            },
        );
        self.counters.delivered_total += 1;
        if delivery.redelivered() {
            self.counters.redelivered_total += 1;
        }
        Some(delivery)
    }

    /// Hands Ready messages to parked receivers, oldest receiver first; a receiver whose selector
    /// matches none of them keeps waiting and the next one is served.
    ///
    /// Only messages that became Ready since the last dispatch are looked at: after every
    /// operation no parked receiver matches any Ready message (checked by `check_invariants`), and
    /// a receiver that parks has just seen every Ready message.
    pub(crate) fn dispatch(&mut self, now_ms: u64, effects: &mut Effects) {
        self.expire_due(now_ms, effects);
        if self.waiters.is_empty() {
            self.newly_ready.clear();
            return;
        }
        if self.paging.rescan.iter().any(Option::is_some) {
            // The store may hold what parked receivers should get first: the shell looks there
            // (`Queue::fill`) and this dispatch happens then, with everything it has now.
            return;
        }
        let mut fresh: Vec<(Reverse<crate::types::Priority>, crate::types::Seq)> =
            std::mem::take(&mut self.newly_ready)
                .into_iter()
                .filter_map(|seq| {
                    let e = self.entries.get(&seq)?;
                    (e.state == MessageState::Ready).then_some((Reverse(e.message.priority), seq))
                })
                .collect();
        fresh.sort_unstable();
        fresh.dedup();
        let mut doomed = Vec::new();
        fresh.retain(|&(_, seq)| {
            let reason = self
                .entries
                .get(&seq)
                .and_then(|e| self.undeliverable(e, now_ms));
            if let Some(reason) = reason {
                doomed.push((seq, reason));
            }
            reason.is_none()
        });
        for (seq, reason) in doomed {
            self.dead_letter(seq, reason, effects);
        }
        let ids: Vec<WaiterId> = self.waiters.keys().copied().collect();
        for id in ids {
            if fresh.is_empty() {
                break;
            }
            let Some(w) = self.waiters.get(&id) else {
                continue;
            };
            let (max, owner, lease_ms, selector) =
                (w.max_messages, w.owner, w.lease_ms, w.selector.clone());
            let mut picks = Vec::new();
            let mut i = 0;
            // One at a time: taking a message of a free group gives the group to this receiver,
            // which decides whether the next message of that group is its to take.
            while i < fresh.len() && picks.len() < max as usize {
                let (std::cmp::Reverse(priority), seq) = fresh[i];
                // During a hand-out after a look into the store that stopped short, nothing
                // goes ahead of what was not looked at.
                if self.paging.checked.is_some() && self.behind_paged_out(priority, seq) {
                    i += 1;
                    continue;
                }
                let take = self
                    .entries
                    .get(&seq)
                    .is_some_and(|e| self.may_receive(e, owner, selector.as_deref()));
                if take {
                    fresh.remove(i);
                    picks.extend(self.lease_one(seq, owner, lease_ms, now_ms, effects));
                } else {
                    i += 1;
                }
            }
            if !picks.is_empty() {
                self.remove_waiter(id);
                effects.handed.push((id, picks));
            }
        }
        self.newly_ready.clear();
    }

    /// Whether a parked receiver could take a Ready message now (never true between operations).
    pub(crate) fn waiter_could_take_ready(&self) -> bool {
        self.waiters.values().any(|w| {
            self.ready.iter().any(|&(Reverse(_), seq)| {
                self.entries
                    .get(&seq)
                    .is_some_and(|e| self.may_receive(e, w.owner, w.selector.as_deref()))
            })
        })
    }
}
