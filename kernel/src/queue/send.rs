//! Send: messages enter the queue, Ready or Scheduled (delivery delay).

use std::sync::Arc;

use super::{Effects, MessageState, PersistOp, Queue, SEQ_RESERVATION_BLOCK};
use crate::error::KernelError;
use crate::types::{validate_property_name, Message, MessageId, NewMessage, Seq};

impl Queue {
    /// Accepts a batch of messages, all or nothing: if one is refused, none is added. Returns the
    /// server-assigned message ids in the order of the batch.
    pub fn send(
        &mut self,
        messages: Vec<NewMessage>,
        now_ms: u64,
    ) -> Result<(Vec<MessageId>, Effects), KernelError> {
        for (index, m) in messages.iter().enumerate() {
            let size_bytes = m.size_bytes();
            if size_bytes > self.config.max_message_size_bytes {
                return Err(KernelError::MessageTooLarge {
                    index,
                    size_bytes,
                    limit_bytes: self.config.max_message_size_bytes,
                });
            }
            m.properties
                .keys()
                .try_for_each(|k| validate_property_name(k))?;
        }
        let mut effects = Effects::default();
        self.fire_due(now_ms, &mut effects);
        let mut ids = Vec::with_capacity(messages.len());
        for m in messages {
            let seq = self.allocate_seq(&mut effects);
            let message = Arc::new(stamp(m, MessageId::new(self.uid, seq), seq, now_ms));
            ids.push(message.id.clone());
            let state = match message.deliver_at_ms {
                Some(until_ms) if until_ms > now_ms => MessageState::Scheduled { until_ms },
                _ => MessageState::Ready,
            };
            if message.persistent {
                effects
                    .persist
                    .push(PersistOp::PutMessage(Arc::clone(&message)));
            }
            self.insert_entry(message, state, 0);
            self.counters.sent_total += 1;
        }
        self.dispatch(now_ms, &mut effects);
        Ok((ids, effects))
    }

    fn allocate_seq(&mut self, effects: &mut Effects) -> Seq {
        let seq = self.next_seq;
        self.next_seq = Seq(seq.0 + 1);
        if self.next_seq > self.seq_reserved_until {
            self.seq_reserved_until = Seq(seq.0 + SEQ_RESERVATION_BLOCK);
            effects.persist.push(PersistOp::ReserveSeq {
                until: self.seq_reserved_until,
            });
        }
        seq
    }
}

fn stamp(m: NewMessage, id: MessageId, seq: Seq, now_ms: u64) -> Message {
    let after = |ms: Option<u64>| ms.filter(|&ms| ms > 0).map(|ms| now_ms.saturating_add(ms));
    Message {
        id,
        seq,
        body: m.body,
        properties: m.properties,
        correlation_id: m.correlation_id,
        reply_to: m.reply_to,
        jms_type: m.jms_type,
        priority: m.priority,
        timestamp_ms: now_ms,
        expiration_ms: after(m.time_to_live_ms),
        deliver_at_ms: after(m.delivery_delay_ms),
        persistent: m.persistent,
        dedup_id: m.dedup_id,
        group_id: m.group_id,
    }
}
