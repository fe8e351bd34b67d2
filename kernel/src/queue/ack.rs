//! Ack, nack and lease extension: each names one delivery by its [`LeaseRef`]. A reference to a
//! delivery that is no longer live (acknowledged, lease expired, redelivered since) is refused and
//! never touches a newer delivery of the same message; so is one to another session's delivery.

use super::{DeadLetterReason, Effects, LeaseRef, MessageState, Queue, ReturnCause, Transition};
use crate::error::KernelError;
use crate::types::{LeaseId, Seq, SessionId};

/// Who names a delivery in an ack, nack, release or lease extension.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Caller {
    /// The back-end itself (a hand-off that never reached its receiver): no owner check.
    Backend,
    /// A client's call, with the session it named (`None`: none). It may act only on
    /// deliveries of that session (with `None`, only on deliveries made outside any session).
    Client(Option<SessionId>),
}

/// What a heartbeat naming deliveries did ([`Queue::renew_named`]).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Renewed {
    /// Deliveries whose lease now runs later.
    pub renewed: u64,
    /// Named deliveries the session no longer holds here.
    pub not_held: Vec<(Seq, LeaseId)>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Renewal {
    Renewed,
    /// Held, and its lease already runs at least as long as a renewal would make it.
    AlreadyLonger,
    NotHeld,
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
    ///
    /// This renews deliveries whose hand-off may have been lost on the way to the client too;
    /// front-ends name what they passed on instead ([`Queue::renew_named`]). It stays for
    /// front-ends that do not.
    pub fn renew_session(&mut self, owner: SessionId, now_ms: u64) -> (u64, Effects) {
        let mut effects = Effects::default();
        self.fire_due(now_ms, &mut effects);
        let renewed = self
            .held_by(owner)
            .into_iter()
            .filter(|&seq| self.renew_one(seq, None, owner, now_ms) == Renewal::Renewed)
            .count() as u64;
        self.dispatch(now_ms, &mut effects);
        (renewed, effects)
    }

    /// A session is alive and still holds these deliveries (the ones its front-end passed on to
    /// the client and has not seen settled): each is renewed as [`Queue::renew_session`] renews.
    /// Any other delivery of the session is left to run out, so a delivery whose answer was lost
    /// on the way is redelivered however long the session lives. Names that are not live
    /// deliveries of `owner` (acknowledged, returned, expired, redelivered since) come back in
    /// [`Renewed::not_held`], for the front-end to forget.
    pub fn renew_named(
        &mut self,
        owner: SessionId,
        named: &[(Seq, LeaseId)],
        now_ms: u64,
    ) -> (Renewed, Effects) {
        let mut effects = Effects::default();
        self.fire_due(now_ms, &mut effects);
        let mut out = Renewed::default();
        for &(seq, lease) in named {
            match self.renew_one(seq, Some(lease), owner, now_ms) {
                Renewal::Renewed => out.renewed += 1,
                Renewal::AlreadyLonger => {}
                Renewal::NotHeld => out.not_held.push((seq, lease)),
            }
        }
        self.dispatch(now_ms, &mut effects);
        (out, effects)
    }

    /// Renews one delivery of `owner` (with `lease`: only that delivery of the message).
    fn renew_one(
        &mut self,
        seq: Seq,
        lease: Option<LeaseId>,
        owner: SessionId,
        now_ms: u64,
    ) -> Renewal {
        let Some(e) = self.entries.get(&seq) else {
            return Renewal::NotHeld;
        };
        let MessageState::Leased {
            lease: l,
            owner: o,
            until_ms,
        } = e.state
        else {
            return Renewal::NotHeld;
        };
        if o != Some(owner) || lease.is_some_and(|lease| lease != l) {
            return Renewal::NotHeld;
        }
        let until = now_ms.saturating_add(e.lease_ms);
        if until <= until_ms {
            return Renewal::AlreadyLonger;
        }
        self.set_state(
            seq,
            MessageState::Leased {
                lease: l,
                owner: o,
                until_ms: until,
            },
        );
        Renewal::Renewed
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
