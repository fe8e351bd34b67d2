//! Ack, nack and lease extension: each names one delivery by its [`LeaseRef`]. A reference to a
//! delivery that is no longer live (acknowledged, lease expired, redelivered since) is refused and
//! never touches a newer delivery of the same message; so is one to another session's delivery.

use super::{DeadLetterReason, Effects, LeaseRef, MessageState, Queue, ReturnCause, Transition};
use crate::error::KernelError;
use crate::types::{Seq, SessionId};

/// Who names a delivery in an ack, nack, release or lease extension.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Caller {
    /// The back-end itself (a hand-off that never reached its receiver): no owner check.
    Backend,
    /// A client's call, with the session it named (`None`: none). It may act only on
    /// deliveries of that session (with `None`, only on deliveries made outside any session).
    Client(Option<SessionId>),
}

impl Queue {
    /// Acknowledges deliveries: each live one of `caller` removes its message. One result per
    /// reference.
    pub fn ack(
        &mut self,
        caller: Caller,
        leases: &[LeaseRef],
        now_ms: u64,
    ) -> (Vec<Result<(), KernelError>>, Effects) {
        let mut effects = Effects::default();
        self.fire_due(now_ms, &mut effects);
        let results = leases
            .iter()
            .map(|r| {
                self.live_lease_of(caller, *r)?;
                effects.persist.extend(self.remove_entry(r.seq));
                self.record(&mut effects, r.seq, Transition::Acked);
                self.counters.acked_total += 1;
                Ok(())
            })
            .collect();
        self.dispatch(now_ms, &mut effects);
        (results, effects)
    }

    /// Gives deliveries back. Each message goes through the redelivery policy (`delay_ms`, when
    /// given, replaces the policy's delay; exhausted deliveries still dead-letter), or straight to
    /// the dead-letter target with `reject`.
    pub fn nack(
        &mut self,
        caller: Caller,
        leases: &[LeaseRef],
        delay_ms: Option<u64>,
        reject: bool,
        now_ms: u64,
    ) -> (Vec<Result<(), KernelError>>, Effects) {
        let mut effects = Effects::default();
        self.fire_due(now_ms, &mut effects);
        let results = leases
            .iter()
            .map(|r| {
                self.live_lease_of(caller, *r)?;
                if reject {
                    self.dead_letter(r.seq, DeadLetterReason::Rejected, &mut effects);
                } else {
                    self.return_delivered(r.seq, delay_ms, ReturnCause::Nack, now_ms, &mut effects);
                }
                Ok(())
            })
            .collect();
        self.dispatch(now_ms, &mut effects);
        (results, effects)
    }

    /// Extends live leases to `now + lease_ms`; returns each new expiry.
    pub fn extend_lease(
        &mut self,
        caller: Caller,
        leases: &[LeaseRef],
        lease_ms: Option<u64>,
        now_ms: u64,
    ) -> Result<(Vec<Result<u64, KernelError>>, Effects), KernelError> {
        let lease_ms = self.lease_ms(lease_ms)?;
        let mut effects = Effects::default();
        self.fire_due(now_ms, &mut effects);
        let results = leases
            .iter()
            .map(|r| {
                let owner = self.live_lease_of(caller, *r)?;
                let until_ms = now_ms.saturating_add(lease_ms);
                if let Some(e) = self.entries.get_mut(&r.seq) {
                    e.lease_ms = lease_ms;
                }
                self.set_state(
                    r.seq,
                    MessageState::Leased {
                        lease: r.lease,
                        owner,
                        until_ms,
                    },
                );
                Ok(until_ms)
            })
            .collect();
        self.dispatch(now_ms, &mut effects);
        Ok((results, effects))
    }

    /// A session is alive (its connection's heartbeat): every delivery it holds here is renewed
    /// for its own lease length, counted from now (a lease is never shortened). Deliveries whose
    /// lease already ran out are not revived. Returns how many were renewed.
    pub fn renew_session(&mut self, owner: SessionId, now_ms: u64) -> (u64, Effects) {
        let mut effects = Effects::default();
        self.fire_due(now_ms, &mut effects);
        let held = self.held_by(owner);
        let mut renewed = 0;
        for seq in held {
            let Some(e) = self.entries.get(&seq) else {
                continue;
            };
            let MessageState::Leased {
                lease,
                owner: o,
                until_ms,
            } = e.state
            else {
                continue;
            };
            let until = now_ms.saturating_add(e.lease_ms);
            if until > until_ms {
                self.set_state(
                    seq,
                    MessageState::Leased {
                        lease,
                        owner: o,
                        until_ms: until,
                    },
                );
                renewed += 1;
            }
        }
        self.dispatch(now_ms, &mut effects);
        (renewed, effects)
    }

    /// The messages a session holds here, oldest first.
    pub(crate) fn held_by(&self, owner: SessionId) -> Vec<Seq> {
        self.leases_by_owner
            .get(&owner)
            .into_iter()
            .flatten()
            .copied()
            .collect()
    }

    /// The owner of a live delivery that `caller` may act on, or why it may not.
    pub(crate) fn live_lease_of(
        &self,
        caller: Caller,
        r: LeaseRef,
    ) -> Result<Option<SessionId>, KernelError> {
        let owner = self.live_lease(r)?;
        match caller {
            Caller::Client(session) if session != owner => Err(KernelError::NotOwner {
                seq: r.seq,
                session_named: session.is_some(),
            }),
            Caller::Client(_) | Caller::Backend => Ok(owner),
        }
    }

    /// The owner of a live delivery, or why the reference is stale.
    pub(crate) fn live_lease(
        &self,
        r: LeaseRef,
    ) -> Result<Option<crate::types::SessionId>, KernelError> {
        let entry = self.entries.get(&r.seq).filter(|_| r.queue == self.uid);
        match entry.map(|e| (e.state, e.delivery_count)) {
            Some((MessageState::Leased { lease, owner, .. }, count))
                if lease == r.lease && count == r.delivery_count =>
            {
                Ok(owner)
            }
            Some((
                MessageState::Leased { .. } | MessageState::Ready | MessageState::Scheduled { .. },
                _,
            ))
            | None => Err(KernelError::StaleReceipt { seq: r.seq }),
        }
    }
}
