//! Messages coming back after a delivery go through the queue's [`RedeliveryPolicy`]: delayed,
//! or dead-lettered once their deliveries are exhausted; expired messages are dead-lettered too.
//! A dead-lettered message leaves the queue at once; see [`Effects::dead_letters`] for how its
//! durable delete travels.
//!
//! [`RedeliveryPolicy`]: super::RedeliveryPolicy

use super::{DeadLetter, DeadLetterReason, Effects, MessageState, Queue, ReturnCause, Transition};
use crate::types::Seq;

impl Queue {
    /// A delivered message came back (nack, rollback, recover, session closed, lease expired).
    /// It is dead-lettered if it expired meanwhile or was delivered as often as the policy allows;
    /// otherwise it waits the policy's delay (or `delay_ms` when the consumer named one, at most
    /// the policy's `max_delay_ms`) and is Ready again.
    pub(crate) fn return_delivered(
        &mut self,
        seq: Seq,
        delay_ms: Option<u64>,
        cause: ReturnCause,
        now_ms: u64,
        effects: &mut Effects,
    ) {
        let Some(entry) = self.entries.get(&seq) else {
            return;
        };
        let count = entry.delivery_count;
        if entry.message.is_expired(now_ms) {
            self.dead_letter(seq, DeadLetterReason::Expired, effects);
            return;
        }
        if self.config.redelivery.exhausted(count) {
            self.dead_letter(seq, DeadLetterReason::MaxDeliveries, effects);
            return;
        }
        let delay = match delay_ms {
            // Whoever names a delay, the queue's cap holds: a consumer cannot park a message
            // out of reach (a nack with u64::MAX left it scheduled for ever).
            Some(asked) => self.config.redelivery.capped_ms(asked),
            None => {
                let spread = self.rng.spread();
                self.config.redelivery.delay_ms(count, spread)
            }
        };
        let redeliver_at_ms = (delay > 0).then(|| now_ms.saturating_add(delay));
        let state = match redeliver_at_ms {
            Some(until_ms) => MessageState::Scheduled { until_ms },
            None => MessageState::Ready,
        };
        self.record(
            effects,
            seq,
            Transition::Returned {
                cause,
                redeliver_at_ms,
            },
        );
        self.set_state(seq, state);
        if self.marks_written {
            // The lease written with the delivery is over: a new leader must not honour it.
            effects.persist.extend(self.delivery_write(seq));
        }
    }

    /// Takes a message out of the queue for its dead-letter target.
    pub(crate) fn dead_letter(
        &mut self,
        seq: Seq,
        reason: DeadLetterReason,
        effects: &mut Effects,
    ) {
        let Some(entry) = self.entries.get(&seq) else {
            return;
        };
        let (message, delivery_count) = (entry.message.clone(), entry.delivery_count);
        let target = match reason {
            DeadLetterReason::Expired => self.config.expiry.clone(),
            DeadLetterReason::MaxDeliveries | DeadLetterReason::Rejected => {
                self.config.dead_letter.clone()
            }
        };
        let delete = self.remove_entry(seq);
        self.record(effects, seq, Transition::DeadLettered { reason });
        match reason {
            DeadLetterReason::Expired => self.counters.expired_total += 1,
            DeadLetterReason::MaxDeliveries => self.counters.dead_lettered.max_deliveries += 1,
            DeadLetterReason::Rejected => self.counters.dead_lettered.rejected += 1,
        }
        effects.dead_letters.push(DeadLetter {
            message,
            reason,
            delivery_count,
            target,
            delete,
        });
    }

    /// Dead-letters every message whose expiration has come and that no receiver holds.
    pub(crate) fn expire_due(&mut self, now_ms: u64, effects: &mut Effects) {
        while let Some(&(t, seq)) = self.expiry.first() {
            if t > now_ms {
                break;
            }
            self.dead_letter(seq, DeadLetterReason::Expired, effects);
        }
    }
}
