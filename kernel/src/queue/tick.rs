//! Time passing: scheduled messages become Ready, expired leases return their message, expired
//! messages are dead-lettered, dedup ids are forgotten, parked receivers whose deadline came end
//! empty-handed.

use super::{Effects, MessageState, Queue, ReturnCause};

impl Queue {
    /// Fires everything due at `now_ms` and hands newly Ready messages to parked receivers. The
    /// shell calls it at [`Queue::next_deadline_ms`]; calling it early or late is harmless.
    pub fn tick(&mut self, now_ms: u64) -> Effects {
        let mut effects = Effects::default();
        self.fire_due(now_ms, &mut effects);
        effects
    }

    /// Every operation starts here, so the queue is always judged at the caller's `now`.
    pub(crate) fn fire_due(&mut self, now_ms: u64, effects: &mut Effects) {
        self.now_ms = self.now_ms.max(now_ms);
        effects.merge(std::mem::take(&mut self.deferred));
        for seq in std::mem::take(&mut self.recovered_exhausted) {
            if self
                .entries
                .get(&seq)
                .is_some_and(|e| e.state == MessageState::Ready)
            {
                self.dead_letter(seq, super::DeadLetterReason::MaxDeliveries, effects);
            }
        }
        while let Some(&(t, seq)) = self.scheduled.first() {
            if t > now_ms {
                break;
            }
            self.set_state(seq, MessageState::Ready);
        }
        while let Some(&(t, seq)) = self.lease_expiry.first() {
            if t > now_ms {
                break;
            }
            // The lease ran out: only this message returns, through the redelivery policy. Its
            // delivery count already counts the delivery, so the next one is flagged redelivered.
            let holder = match self.entries.get(&seq).map(|e| e.state) {
                Some(MessageState::Leased { owner, .. }) => owner,
                _ => None,
            };
            self.set_state(seq, MessageState::Ready);
            if let Some(holder) = holder {
                self.free_groups_of_unresponsive(seq, holder);
            }
            self.return_delivered(seq, None, ReturnCause::LeaseExpired, now_ms, effects);
            self.counters.lease_expired_total += 1;
        }
        self.expire_due(now_ms, effects);
        self.forget_dedup_due(now_ms, effects);
        // Receivers whose deadline has come end first: a message that became ready at the same
        // moment is not handed to a receiver whose caller has stopped waiting.
        while let Some(&(t, id)) = self.waiter_deadlines.first() {
            if t > now_ms {
                break;
            }
            self.remove_waiter(id);
            effects.finished_empty.push(id);
        }
        self.dispatch(now_ms, effects);
    }
}
