//! A message's life, step by step, as the queue sees it: operations report each step in
//! [`Effects::history`](super::Effects::history) and the shell keeps them for a while
//! (`ferry message history`).

use super::{DeadLetterReason, Effects, Queue};
use crate::types::{Seq, SessionId};

/// Why a delivered message came back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReturnCause {
    Nack,
    Rollback,
    Recover,
    /// Its session closed, or the session's connection lease ran out.
    SessionEnded,
    /// The delivery's own lease ran out.
    LeaseExpired,
    /// The answer of the receive that made the delivery never reached the client (the node
    /// that served it died, or the call to it broke): see [`super::Queue::release_lost`].
    AnswerLost,
}

impl ReturnCause {
    pub fn as_str(self) -> &'static str {
        match self {
            ReturnCause::Nack => "nack",
            ReturnCause::Rollback => "rollback",
            ReturnCause::Recover => "recover",
            ReturnCause::SessionEnded => "session ended",
            ReturnCause::LeaseExpired => "lease expired",
            ReturnCause::AnswerLost => "receive answer lost",
        }
    }
}

/// One step of a message's life.
#[derive(Debug, Clone, PartialEq)]
pub enum Transition {
    /// Accepted; invisible until `deliver_at_ms` when delayed. `committed`: a transacted send
    /// that became visible at its commit.
    Sent {
        deliver_at_ms: Option<u64>,
        committed: bool,
    },
    Delivered {
        session: Option<SessionId>,
        delivery_count: u32,
        lease_until_ms: u64,
    },
    Acked,
    /// Came back; redelivered from `redeliver_at_ms` (`None`: at once).
    Returned {
        cause: ReturnCause,
        redeliver_at_ms: Option<u64>,
    },
    /// Handed to a receiver that was already gone: back at once, not counted.
    Undelivered,
    DeadLettered {
        reason: DeadLetterReason,
    },
    /// Removed by an administrator (purge, delete).
    Deleted,
}

/// A step of one message, at one time.
#[derive(Debug, Clone, PartialEq)]
pub struct HistoryEntry {
    pub seq: Seq,
    pub at_ms: u64,
    pub transition: Transition,
}

impl Queue {
    /// Notes a step of message `seq` at the time of the current operation.
    pub(crate) fn record(&self, effects: &mut Effects, seq: Seq, transition: Transition) {
        effects.history.push(HistoryEntry {
            seq,
            at_ms: self.now_ms,
            transition,
        });
    }
}
