//! Transacted sessions: sends are staged (stamped with their ids, invisible, not persisted) and
//! acknowledgements are held by the session until it commits. Commit makes both take effect at
//! once, in one durable batch; rollback (and a session that ends without committing) drops the
//! staged sends and gives back every message the session holds through the redelivery policy.
//!
//! A transaction may span several queues of one back-end: the shell first asks each queue
//! [`Queue::check_commit`] at one `now`, and only if every queue agrees calls [`Queue::commit`]
//! on each at that same `now`, before anything else touches them, and writes all their persist
//! ops in one batch.

use super::{Effects, LeaseRef, Queue, ReturnCause, Transition};
use crate::error::KernelError;
use crate::types::{MessageId, NewMessage, SessionId};

/// The most sends one session may stage in one queue before it commits.
pub const STAGED_MAX: usize = 100_000;

impl Queue {
    /// Stages sends of a transacted session. Returns their message ids; nothing is visible or
    /// persisted until [`Queue::commit`].
    pub fn stage(
        &mut self,
        owner: SessionId,
        messages: Vec<NewMessage>,
        now_ms: u64,
    ) -> Result<(Vec<MessageId>, Effects), KernelError> {
        self.validate_sends(&messages, Some(owner))?;
        let staged = self.staged.get(&owner).map_or(0, Vec::len);
        if staged + messages.len() > STAGED_MAX {
            return Err(KernelError::OverLimit {
                field: "staged sends in one transaction",
                value: (staged + messages.len()) as u64,
                limit: STAGED_MAX as u64,
                limit_name: "transaction_sends_max",
            });
        }
        let mut effects = Effects::default();
        self.fire_due(now_ms, &mut effects);
        let ids = self.accept(messages, Some(owner), now_ms, &mut effects, |q, m, _| {
            // The transaction holds its dedup ids until it ends: a repeat in it gets this
            // message's id, another session's send with it is refused (see `validate_sends`).
            if let Some(dedup_id) = m.dedup_id.clone().filter(|_| q.config.dedup_window_ms > 0) {
                q.staged_dedup.insert(dedup_id, (owner, m.seq));
            }
            q.staged_bytes += m.size_bytes();
            q.staged.entry(owner).or_default().push(m);
        });
        self.dispatch(now_ms, &mut effects);
        Ok((ids, effects))
    }

    /// Whether [`Queue::commit`] would succeed: every acknowledgement names a live delivery of
    /// this session. Runs what is due at `now_ms` first (those effects are returned either way);
    /// the shell must commit at the same `now_ms` with nothing in between.
    pub fn check_commit(
        &mut self,
        owner: SessionId,
        acks: &[LeaseRef],
        now_ms: u64,
    ) -> (Result<(), KernelError>, Effects) {
        let mut effects = Effects::default();
        self.fire_due(now_ms, &mut effects);
        (self.commit_refusal(owner, acks), effects)
    }

    fn commit_refusal(&self, owner: SessionId, acks: &[LeaseRef]) -> Result<(), KernelError> {
        for r in acks {
            match self.live_lease(*r)? {
                Some(o) if o == owner => {}
                _ => return Err(KernelError::StaleReceipt { seq: r.seq }),
            }
        }
        Ok(())
    }

    /// Commits a transacted session's work on this queue: the held acknowledgements remove their
    /// messages and the staged sends enter the queue. All or nothing: if an acknowledgement is
    /// stale, nothing of the transaction changes and the error says which (the effects of time
    /// passing are returned either way).
    pub fn commit(
        &mut self,
        owner: SessionId,
        acks: &[LeaseRef],
        now_ms: u64,
    ) -> (Result<(), KernelError>, Effects) {
        let (checked, mut effects) = self.check_commit(owner, acks, now_ms);
        if checked.is_err() {
            return (checked, effects);
        }
        for r in acks {
            // The same receipt named twice acknowledges once.
            if self.entries.contains_key(&r.seq) {
                effects.persist.extend(self.remove_entry(r.seq));
                self.record(&mut effects, r.seq, Transition::Acked);
                self.counters.acked_total += 1;
            }
        }
        for message in self.take_staged(owner) {
            // The transaction held its dedup ids (no other send could take them meanwhile), so
            // every id it was given is the id of a message that now enters the queue.
            self.enqueue(message, true, now_ms, &mut effects);
        }
        self.dispatch(now_ms, &mut effects);
        (Ok(()), effects)
    }

    /// Rolls back a transacted session's work on this queue: staged sends are dropped and every
    /// message the session holds comes back through the redelivery policy. Returns how many
    /// messages came back.
    pub fn rollback(&mut self, owner: SessionId, now_ms: u64) -> (u64, Effects) {
        let mut effects = Effects::default();
        self.fire_due(now_ms, &mut effects);
        self.drop_staged(owner);
        let released = self.release_leases(owner, ReturnCause::Rollback, now_ms, &mut effects);
        self.dispatch(now_ms, &mut effects);
        (released, effects)
    }

    /// Forgets a session's staged sends.
    pub(crate) fn drop_staged(&mut self, owner: SessionId) {
        drop(self.take_staged(owner));
    }

    /// Takes a session's staged sends out, with the dedup ids they held.
    fn take_staged(&mut self, owner: SessionId) -> Vec<crate::types::SharedMessage> {
        let staged = self.staged.remove(&owner).unwrap_or_default();
        for m in &staged {
            self.staged_bytes = self.staged_bytes.saturating_sub(m.size_bytes());
            if let Some(dedup_id) = &m.dedup_id {
                if self
                    .staged_dedup
                    .get(dedup_id)
                    .is_some_and(|(s, _)| *s == owner)
                {
                    self.staged_dedup.remove(dedup_id);
                }
            }
        }
        staged
    }

    /// Sends staged by transacted sessions and not yet committed.
    pub fn staged_count(&self) -> usize {
        self.staged.values().map(Vec::len).sum()
    }
}
