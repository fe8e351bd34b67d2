//! Send: messages enter the queue, Ready or Scheduled (delivery delay). A dedup id seen within
//! the queue's window returns the original message id and adds nothing.

use std::sync::Arc;

use super::{Effects, MessageState, PersistOp, Queue, Transition, SEQ_RESERVATION_BLOCK};
use crate::error::KernelError;
use crate::types::{validate_property_name, Message, MessageId, NewMessage, Seq, SharedMessage};

/// The most properties one message may carry.
pub const PROPERTIES_PER_MESSAGE_MAX: usize = 1_000;

/// The longest dedup id a send may carry (it is remembered after its message is gone).
pub const DEDUP_ID_BYTES_MAX: usize = 256;

/// The most dedup ids one queue remembers (see `Queue::forget_dedup_over`).
pub const DEDUP_IDS_MAX: usize = 100_000;

/// A producer's dedup id, remembered until `expires_ms` with the message it produced.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DedupRecord {
    pub dedup_id: String,
    /// The message the first send produced (its id is `MessageId::new(queue uid, seq)`).
    pub seq: Seq,
    pub expires_ms: u64,
}

impl Queue {
    /// Accepts a batch of messages, all or nothing: if one is refused, none is added. Returns the
    /// server-assigned message ids in the order of the batch.
    pub fn send(
        &mut self,
        messages: Vec<NewMessage>,
        now_ms: u64,
    ) -> Result<(Vec<MessageId>, Effects), KernelError> {
        self.validate_sends(&messages, None)?;
        let mut effects = Effects::default();
        self.fire_due(now_ms, &mut effects);
        let ids = self.accept(messages, None, now_ms, &mut effects, |q, m, fx| {
            q.enqueue(m, false, now_ms, fx);
        });
        self.dispatch(now_ms, &mut effects);
        Ok((ids, effects))
    }

    /// Stamps each message that is not a remembered duplicate and hands it to `place`, in batch
    /// order. Returns every message's id (a duplicate's is the first send's). `staging`: the
    /// transacted session these sends are staged for (its own staged dedup ids count too).
    pub(crate) fn accept(
        &mut self,
        messages: Vec<NewMessage>,
        staging: Option<crate::types::SessionId>,
        now_ms: u64,
        effects: &mut Effects,
        mut place: impl FnMut(&mut Self, SharedMessage, &mut Effects),
    ) -> Vec<MessageId> {
        let mut ids = Vec::with_capacity(messages.len());
        for m in messages {
            if let Some(id) = self.dedup_hit(m.dedup_id.as_deref(), staging) {
                ids.push(id);
                continue;
            }
            let message = self.stamp(m, now_ms, effects);
            ids.push(message.id.clone());
            place(self, message, effects);
        }
        ids
    }

    /// Takes messages moved here from another queue (dead letters): they were accepted once, so
    /// no size limit or dedup applies and nothing is refused.
    pub fn send_moved(
        &mut self,
        messages: Vec<NewMessage>,
        now_ms: u64,
    ) -> (Vec<MessageId>, Effects) {
        let mut effects = Effects::default();
        self.fire_due(now_ms, &mut effects);
        let messages = messages
            .into_iter()
            .map(|m| NewMessage {
                dedup_id: None,
                ..m
            })
            .collect();
        let ids = self.accept(messages, None, now_ms, &mut effects, |q, m, fx| {
            q.enqueue(m, false, now_ms, fx);
        });
        self.dispatch(now_ms, &mut effects);
        (ids, effects)
    }

    /// Refuses a batch with a message the queue cannot take, or one that would take the queue
    /// over its limits (staged sends count: they will enter the queue), or one whose dedup id
    /// another session's open transaction holds. `staging`: the session staging the batch.
    pub(crate) fn validate_sends(
        &self,
        messages: &[NewMessage],
        staging: Option<crate::types::SessionId>,
    ) -> Result<(), KernelError> {
        for m in messages {
            let Some(dedup_id) = m.dedup_id.as_deref() else {
                continue;
            };
            if self.dedup.contains_key(dedup_id) {
                continue;
            }
            if let Some((holder, _)) = self.staged_dedup.get(dedup_id) {
                if Some(*holder) != staging {
                    return Err(KernelError::DedupInTransaction {
                        dedup_id: crate::types::shown(dedup_id),
                    });
                }
            }
        }
        let (paged_count, paged_bytes) = self.paging.paged_out();
        if let Some(limit) = self.config.max_messages {
            let value =
                (self.entries.len() + self.staged_count() + messages.len()) as u64 + paged_count;
            if value > limit {
                return Err(KernelError::QueueFull {
                    queue: self.name.clone(),
                    what: "messages",
                    value,
                    limit,
                    limit_name: "max_messages",
                });
            }
        }
        if let Some(limit) = self.config.max_bytes {
            let value = self.bytes
                + paged_bytes
                + self.staged_bytes
                + messages.iter().map(NewMessage::size_bytes).sum::<u64>();
            if value > limit {
                return Err(KernelError::QueueFull {
                    queue: self.name.clone(),
                    what: "bytes",
                    value,
                    limit,
                    limit_name: "max_bytes",
                });
            }
        }
        self.validate_pinned(messages, staging)?;
        for (index, m) in messages.iter().enumerate() {
            if m.properties.len() > PROPERTIES_PER_MESSAGE_MAX {
                return Err(KernelError::OverLimit {
                    field: "properties in one message",
                    value: m.properties.len() as u64,
                    limit: PROPERTIES_PER_MESSAGE_MAX as u64,
                    limit_name: "properties_per_message_max",
                });
            }
            let dedup_bytes = m.dedup_id.as_ref().map_or(0, String::len);
            if dedup_bytes > DEDUP_ID_BYTES_MAX {
                return Err(KernelError::OverLimit {
                    field: "dedup_id bytes",
                    value: dedup_bytes as u64,
                    limit: DEDUP_ID_BYTES_MAX as u64,
                    limit_name: "dedup_id_bytes_max",
                });
            }
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
        Ok(())
    }

    /// Messages that can only live in memory (non-persistent ones, and every staged send until
    /// its transaction ends) are refused once the queue's resident and staged bytes would pass
    /// its pinned budget (see [`Queue::set_pinned_budget`]): unlike persistent messages they
    /// cannot wait in the store. (Postmortem: they ignored the budget, and 300 MB
    /// of either went in unrefused.)
    fn validate_pinned(
        &self,
        messages: &[NewMessage],
        staging: Option<crate::types::SessionId>,
    ) -> Result<(), KernelError> {
        let pinned: u64 = messages
            .iter()
            .filter(|m| staging.is_some() || !m.persistent)
            .map(NewMessage::size_bytes)
            .sum();
        if pinned == 0 {
            return Ok(());
        }
        let value = self
            .bytes
            .saturating_add(self.staged_bytes)
            .saturating_add(pinned);
        let limit = self.pinned_budget_bytes;
        if value > limit {
            return Err(KernelError::QueueFull {
                queue: self.name.clone(),
                what:
                    "bytes in memory (non-persistent and uncommitted messages cannot be paged out)",
                value,
                limit,
                limit_name: "memory budget (paging.queue_memory_budget_bytes)",
            });
        }
        Ok(())
    }

    /// The message id an earlier send with this dedup id produced, if it is still remembered;
    /// or, for sends `staging` in a transaction, the one it staged before with it.
    pub(crate) fn dedup_hit(
        &self,
        dedup_id: Option<&str>,
        staging: Option<crate::types::SessionId>,
    ) -> Option<MessageId> {
        let dedup_id = dedup_id?;
        if let Some(&(seq, _)) = self.dedup.get(dedup_id) {
            return Some(MessageId::new(self.uid, seq));
        }
        match self.staged_dedup.get(dedup_id) {
            Some(&(holder, seq)) if Some(holder) == staging => Some(MessageId::new(self.uid, seq)),
            _ => None,
        }
    }

    /// Gives a new message its sequence number, id and times.
    pub(crate) fn stamp(
        &mut self,
        m: NewMessage,
        now_ms: u64,
        effects: &mut Effects,
    ) -> SharedMessage {
        let seq = self.allocate_seq(effects);
        Arc::new(stamp(m, MessageId::new(self.uid, seq), seq, now_ms))
    }

    /// A stamped message enters the queue (and is persisted, if persistent); its dedup id is
    /// remembered for the queue's window.
    pub(crate) fn enqueue(
        &mut self,
        message: SharedMessage,
        committed: bool,
        now_ms: u64,
        effects: &mut Effects,
    ) {
        let state = match message.deliver_at_ms {
            Some(until_ms) if until_ms > now_ms => MessageState::Scheduled { until_ms },
            _ => MessageState::Ready,
        };
        self.record(
            effects,
            message.seq,
            Transition::Sent {
                deliver_at_ms: match state {
                    MessageState::Scheduled { until_ms } => Some(until_ms),
                    _ => None,
                },
                committed,
            },
        );
        if message.persistent {
            effects
                .persist
                .push(PersistOp::PutMessage(Arc::clone(&message)));
        }
        if let Some(dedup_id) = message.dedup_id.clone() {
            if self.config.dedup_window_ms > 0 {
                let record = DedupRecord {
                    dedup_id,
                    seq: message.seq,
                    expires_ms: now_ms.saturating_add(self.config.dedup_window_ms),
                };
                self.remember_dedup(record.clone());
                effects.persist.push(PersistOp::PutDedup(record));
                self.forget_dedup_over(DEDUP_IDS_MAX, effects);
            }
        }
        self.counters.sent_total += 1;
        // Past the memory budget (or behind paged-out messages of its priority) a persistent
        // message goes to the store only; a committed transaction's sends stay in memory, like
        // every message that was already visible.
        if !committed && self.pages_out(&message) {
            self.page_out(&message);
        } else {
            self.insert_entry(message, state, 0);
        }
    }

    pub(crate) fn remember_dedup(&mut self, r: DedupRecord) {
        if let Some((_, old)) = self.dedup.insert(r.dedup_id.clone(), (r.seq, r.expires_ms)) {
            self.dedup_expiry.remove(&(old, r.dedup_id.clone()));
        }
        self.dedup_expiry.insert((r.expires_ms, r.dedup_id));
    }

    /// Keeps at most `max` dedup ids: past it, those whose window ends first are forgotten
    /// early (a fixed-size cache, as Artemis keeps its duplicate ids), so memory stays bounded
    /// whatever the send rate times the window.
    pub(crate) fn forget_dedup_over(&mut self, max: usize, effects: &mut Effects) {
        while self.dedup.len() > max {
            let Some((_, dedup_id)) = self.dedup_expiry.pop_first() else {
                break;
            };
            self.dedup.remove(&dedup_id);
            effects.persist.push(PersistOp::DeleteDedup { dedup_id });
        }
    }

    /// Forgets dedup ids whose window has passed.
    pub(crate) fn forget_dedup_due(&mut self, now_ms: u64, effects: &mut Effects) {
        while let Some((t, _)) = self.dedup_expiry.first() {
            if *t > now_ms {
                break;
            }
            let Some((_, dedup_id)) = self.dedup_expiry.pop_first() else {
                break;
            };
            self.dedup.remove(&dedup_id);
            effects.persist.push(PersistOp::DeleteDedup { dedup_id });
        }
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
        body: m.body.into(),
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
