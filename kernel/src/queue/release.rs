//! Giving messages back without an explicit nack: a session closing (or its lease running out),
//! a delivery that could not be handed to its receiver, a delivery whose answer was lost before
//! a failover, and lease expiry (in `tick.rs`).

use std::collections::HashSet;

use super::{Effects, LeaseRef, MessageState, Queue, ReturnCause, Transition};
use crate::types::{LeaseId, Seq, SessionId};

impl Queue {
    /// A session ended: every message it holds comes back at once through the redelivery policy
    /// (it was delivered, so the next delivery is flagged redelivered), its uncommitted sends are
    /// dropped, its message groups are free, and its parked receivers end empty-handed. Returns
    /// how many messages were released.
    pub fn release_session(&mut self, owner: SessionId, now_ms: u64) -> (u64, Effects) {
        let mut effects = Effects::default();
        self.fire_due(now_ms, &mut effects);
        self.drop_staged(owner);
        let released = self.release_leases(owner, ReturnCause::SessionEnded, now_ms, &mut effects);
        self.release_groups(owner);
        let waiters: Vec<_> = self
            .waiters
            .iter()
            .filter(|(_, w)| w.owner == Some(owner))
            .map(|(id, _)| *id)
            .collect();
        for id in waiters {
            self.remove_waiter(id);
            effects.finished_empty.push(id);
        }
        self.dispatch(now_ms, &mut effects);
        (released, effects)
    }

    /// JMS `Session.recover()`: every message the session holds comes back at once through the
    /// redelivery policy; the session keeps its groups and its parked receivers keep waiting
    /// (and may get the messages back).
    pub fn recover_session(&mut self, owner: SessionId, now_ms: u64) -> (u64, Effects) {
        let mut effects = Effects::default();
        self.fire_due(now_ms, &mut effects);
        let released = self.release_leases(owner, ReturnCause::Recover, now_ms, &mut effects);
        self.dispatch(now_ms, &mut effects);
        (released, effects)
    }

    /// A receive of `owner`'s lost its answer on the way to the client (the node that served it
    /// died, or the call to it broke, after the deliveries were written), and this queue is the
    /// next run to serve it: every delivery `owner` holds that an earlier run made (its lease
    /// was read back from the store, written as its [`super::DeliveryMark`]) comes back at once, as
    /// if its lease had run out, except the ones `keep` names (those the client got). Its
    /// delivery count stays, so its next delivery is flagged redelivered: if its answer did
    /// reach the client after all, the client sees a flagged duplicate, never an unflagged
    /// one. Deliveries this queue made are never returned here (a receive of the same session
    /// may be answered and on its way to the client), nor are the session's parked receivers
    /// or staged sends touched; a message group it no longer holds anything of is free again,
    /// as when a lease runs out. A queue whose leases are not written holds no delivery of an
    /// earlier run: nothing comes back. Returns how many messages came back.
    pub fn release_lost(
        &mut self,
        owner: SessionId,
        keep: &[(Seq, LeaseId)],
        now_ms: u64,
    ) -> (u64, Effects) {
        let mut effects = Effects::default();
        self.fire_due(now_ms, &mut effects);
        let keep: HashSet<(Seq, LeaseId)> = keep.iter().copied().collect();
        let lost: Vec<Seq> = self
            .held_by(owner)
            .into_iter()
            .filter(|seq| match self.entries.get(seq).map(|e| e.state) {
                Some(MessageState::Leased { lease, .. }) => {
                    lease < self.inherited_leases_below && !keep.contains(&(*seq, lease))
                }
                _ => false,
            })
            .collect();
        for &seq in &lost {
            self.set_state(seq, MessageState::Ready);
            self.free_groups_of_unresponsive(seq, owner);
            self.return_delivered(seq, None, ReturnCause::AnswerLost, now_ms, &mut effects);
        }
        self.dispatch(now_ms, &mut effects);
        (lost.len() as u64, effects)
    }

    /// Every message `owner` holds comes back, oldest first.
    pub(crate) fn release_leases(
        &mut self,
        owner: SessionId,
        cause: ReturnCause,
        now_ms: u64,
        effects: &mut Effects,
    ) -> u64 {
        let held = self.held_by(owner);
        for &seq in &held {
            self.set_state(seq, MessageState::Ready);
            self.return_delivered(seq, None, cause, now_ms, effects);
        }
        held.len() as u64
    }

    /// A lease of `holder` on a message of a group ran out: a session that lets a lease lapse
    /// may be gone without the back-end being told (its front-end died). If it holds nothing else
    /// of that group here, the group is free again, so the group's messages can never be stranded
    /// behind a session that no longer exists.
    pub(crate) fn free_groups_of_unresponsive(
        &mut self,
        seq: crate::types::Seq,
        holder: SessionId,
    ) {
        let Some(group) = self
            .entries
            .get(&seq)
            .and_then(|e| e.message.group_id.clone())
        else {
            return;
        };
        if self.groups.owner(&group) != Some(holder) {
            return;
        }
        let holds_more = self
            .leases_by_owner
            .get(&holder)
            .into_iter()
            .flatten()
            .any(|s| {
                self.entries
                    .get(s)
                    .is_some_and(|e| e.message.group_id.as_deref() == Some(group.as_str()))
            });
        if !holds_more {
            let freed = self.groups.release_one(&group);
            self.offer_groups(&freed);
        }
    }

    /// Frees the session's groups; their Ready messages are offered to parked receivers again.
    fn release_groups(&mut self, owner: SessionId) {
        let freed = self.groups.release(owner);
        self.offer_groups(&freed);
    }

    /// Offers the Ready messages of freed groups to parked receivers.
    fn offer_groups(&mut self, freed: &std::collections::BTreeSet<String>) {
        if freed.is_empty() || self.waiters.is_empty() {
            return;
        }
        // Paged-out messages of these groups may now be a parked receiver's to take.
        self.paging
            .flag_rescan_all(crate::types::Seq(self.next_seq.0.saturating_sub(1)));
        let seqs: Vec<_> = self
            .ready
            .iter()
            .map(|&(_, seq)| seq)
            .filter(|seq| {
                self.entries
                    .get(seq)
                    .and_then(|e| e.message.group_id.as_ref())
                    .is_some_and(|g| freed.contains(g))
            })
            .collect();
        self.newly_ready.extend(seqs);
    }

    /// Deliveries that never reached their receiver (its client was gone when the answer was
    /// ready, or a consumer gives back prefetched messages it never handed to its application):
    /// the messages return to Ready at once and the delivery does not count. Each reference is
    /// checked as an ack checks it (live, this queue, this delivery count, `caller`'s); one
    /// result per reference.
    pub fn return_undelivered(
        &mut self,
        caller: super::Caller,
        leases: &[LeaseRef],
        now_ms: u64,
    ) -> (Vec<Result<(), crate::KernelError>>, Effects) {
        let mut effects = Effects::default();
        self.fire_due(now_ms, &mut effects);
        let results = leases
            .iter()
            .map(|r| {
                self.live_lease_of(caller, *r)?;
                let entry = self
                    .entries
                    .get_mut(&r.seq)
                    .expect("invariant: a live lease names an entry");
                entry.delivery_count = entry.delivery_count.saturating_sub(1);
                self.counters.delivered_total = self.counters.delivered_total.saturating_sub(1);
                self.set_state(r.seq, MessageState::Ready);
                effects.persist.extend(self.delivery_write(r.seq));
                self.record(&mut effects, r.seq, Transition::Undelivered);
                Ok(())
            })
            .collect();
        self.dispatch(now_ms, &mut effects);
        (results, effects)
    }
}
