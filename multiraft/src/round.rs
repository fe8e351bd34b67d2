//! What a round hands the shell: the persistence job, one batch per peer, what to apply, and
//! role changes.

use std::collections::BTreeMap;

use bytes::Bytes;
use raft::eraftpb::{Message, MessageType};

use crate::codec::encode_batch;
use crate::group_log::encode;
use crate::ids::{GroupId, LogPosition, NodeId};
use crate::keys::KvOp;
use crate::persist::PersistJob;

/// The output of [`crate::Engine::round`].
#[derive(Debug, Default)]
pub struct Round {
    /// The writes of every group (and room for the application's), for one synced write;
    /// `None` when nothing needs persisting.
    pub persist: Option<PersistJob>,
    /// At most one batch per destination node, with messages of every group (snapshots apart).
    pub batches: Vec<OutBatch>,
    /// Snapshots for followers too far behind, apart from `batches` so the transport can send
    /// them on a stream of their own, in chunks, without holding up the small messages.
    pub snapshots: Vec<OutSnapshot>,
    /// Committed entries and installed snapshots, in order per group, to apply. Whenever
    /// this is not empty, `persist` is `Some` (it records the new applied indexes), so the
    /// application's writes for them can join it.
    pub applies: Vec<Apply>,
    /// Role or leader changes seen this round.
    pub role_changes: Vec<RoleChange>,
    /// Groups whose leader must send a snapshot to a peer added after the latest snapshot:
    /// the application calls [`crate::Engine::compact`] at its applied index with its state
    /// (the follower is served once it has).
    pub snapshot_requests: Vec<GroupId>,
}

/// One encoded batch for one peer node ([`crate::encode_batch`] format).
#[derive(Debug, Clone)]
pub struct OutBatch {
    /// The destination node.
    pub to: NodeId,
    /// The encoded batch, opaque to the transport.
    pub bytes: Bytes,
    /// Raft messages inside (for metrics).
    pub message_count: usize,
}

/// One snapshot message for one peer: opaque bytes for the transport, which hands them to the
/// peer's engine whole ([`OutSnapshot::as_batch`]).
#[derive(Debug, Clone)]
pub struct OutSnapshot {
    /// The destination node.
    pub to: NodeId,
    /// The group it belongs to.
    pub group: GroupId,
    /// The log position the snapshot covers (its index and that entry's term).
    pub position: LogPosition,
    /// The encoded message (the state machine's snapshot inside), opaque to the transport.
    pub bytes: Bytes,
}

impl OutSnapshot {
    /// The snapshot as a one-message batch for [`crate::Engine::step`] on the receiving node.
    pub fn as_batch(&self) -> Bytes {
        encode_batch([(self.group, &self.bytes[..])])
    }
}

/// Something for the application's state machine, in log order per group.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Apply {
    /// A committed entry.
    Entry {
        /// Its group.
        group: GroupId,
        /// Its index and term.
        position: LogPosition,
        /// What it holds.
        kind: EntryKind,
    },
    /// A snapshot from the leader replaced the group's state: the application replaces its
    /// state with `data` (what it gave [`crate::Engine::compact`] on the leader).
    Snapshot {
        /// Its group.
        group: GroupId,
        /// The last entry the snapshot covers.
        position: LogPosition,
        /// The state machine's data.
        data: Vec<u8>,
        /// Voters at that point.
        voters: Vec<NodeId>,
        /// Learners at that point.
        learners: Vec<NodeId>,
    },
}

impl Apply {
    /// The group this is for.
    pub fn group(&self) -> GroupId {
        match self {
            Apply::Entry { group, .. } | Apply::Snapshot { group, .. } => *group,
        }
    }

    /// The index and term reached once applied.
    pub fn position(&self) -> LogPosition {
        match self {
            Apply::Entry { position, .. } | Apply::Snapshot { position, .. } => *position,
        }
    }
}

/// The content of a committed entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EntryKind {
    /// Data proposed with [`crate::Engine::propose`]; empty for the no-op a new leader
    /// appends.
    Normal(Vec<u8>),
    /// A configuration change, already in effect for the engine.
    ConfChange {
        /// The change.
        change: ConfChange,
        /// Voters after it.
        voters: Vec<NodeId>,
        /// Learners after it.
        learners: Vec<NodeId>,
    },
    /// raft-rs's own step out of a joint configuration (never proposed by this engine).
    ConfTransition {
        /// Voters after it.
        voters: Vec<NodeId>,
        /// Learners after it.
        learners: Vec<NodeId>,
    },
}

/// A membership change of one group, proposed with [`crate::Engine::propose_conf_change`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConfChange {
    /// Adds a voter.
    AddVoter(NodeId),
    /// Adds a learner: it receives the log but neither votes nor counts for commitment.
    AddLearner(NodeId),
    /// Makes a learner a voter.
    PromoteLearner(NodeId),
    /// Removes a voter or learner.
    Remove(NodeId),
}

/// A node's role in a group.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// Follows a leader (or waits for one).
    Follower = 0,
    /// Asking for pre-votes before campaigning (`pre_vote`).
    PreCandidate = 1,
    /// Campaigning.
    Candidate = 2,
    /// Leads the group.
    Leader = 3,
}

/// The node's role or known leader changed in a group.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RoleChange {
    /// The group.
    pub group: GroupId,
    /// The new role.
    pub role: Role,
    /// The term it holds in.
    pub term: u64,
    /// The leader known, if any.
    pub leader: Option<NodeId>,
}

/// What a round gathers from every group before it is turned into a [`Round`].
#[derive(Debug, Default)]
pub(crate) struct RoundCx {
    pub(crate) ops: Vec<KvOp>,
    pub(crate) must_sync: bool,
    /// Messages to send this round, per destination: (group, encoded raft message).
    pub(crate) outbox: BTreeMap<NodeId, Vec<(GroupId, Vec<u8>)>>,
    /// Messages to send only once this round's writes are durable.
    pub(crate) held: Vec<HeldMessage>,
    /// Ready numbers to report to raft-rs once this round's writes are durable.
    pub(crate) ready_numbers: Vec<(GroupId, u64)>,
    pub(crate) applies: Vec<Apply>,
    pub(crate) role_changes: Vec<RoleChange>,
    /// Snapshots sent: (group, to).
    pub(crate) snapshots_sent: Vec<(GroupId, u64)>,
    /// Snapshot messages, apart from the batches.
    pub(crate) snapshots: Vec<OutSnapshot>,
}

/// An encoded message waiting for persistence.
#[derive(Debug)]
pub(crate) struct HeldMessage {
    pub(crate) to: NodeId,
    pub(crate) group: GroupId,
    pub(crate) bytes: Vec<u8>,
}

impl RoundCx {
    pub(crate) fn send(&mut self, group: GroupId, message: Message) {
        let to = NodeId(message.to);
        if message.get_msg_type() == MessageType::MsgSnapshot {
            self.snapshots_sent.push((group, message.to));
            let meta = message.get_snapshot().get_metadata();
            self.snapshots.push(OutSnapshot {
                to,
                group,
                position: LogPosition {
                    index: meta.index,
                    term: meta.term,
                },
                bytes: Bytes::from(encode(&message)),
            });
            return;
        }
        self.outbox
            .entry(to)
            .or_default()
            .push((group, encode(&message)));
    }

    pub(crate) fn hold(&mut self, group: GroupId, message: Message) {
        self.held.push(HeldMessage {
            to: NodeId(message.to),
            group,
            bytes: encode(&message),
        });
    }

    pub(crate) fn release(&mut self, held: impl IntoIterator<Item = HeldMessage>) {
        for m in held {
            self.outbox
                .entry(m.to)
                .or_default()
                .push((m.group, m.bytes));
        }
    }

    /// The batches for each destination, in the order of the messages, each at most
    /// `max_bytes` encoded (a message larger than that goes alone).
    pub(crate) fn batches(
        outbox: BTreeMap<NodeId, Vec<(GroupId, Vec<u8>)>>,
        max_bytes: usize,
    ) -> Vec<OutBatch> {
        let mut batches = Vec::new();
        for (to, messages) in outbox {
            let mut start = 0;
            let mut size = 1; // the version byte
            for (i, (_, m)) in messages.iter().enumerate() {
                // Two varints of at most 10 bytes each, then the message.
                let cost = m.len() + 20;
                if i > start && size + cost > max_bytes {
                    batches.push(OutBatch::of(to, &messages[start..i]));
                    (start, size) = (i, 1);
                }
                size += cost;
            }
            if start < messages.len() {
                batches.push(OutBatch::of(to, &messages[start..]));
            }
        }
        batches
    }
}

impl OutBatch {
    fn of(to: NodeId, messages: &[(GroupId, Vec<u8>)]) -> Self {
        OutBatch {
            to,
            bytes: encode_batch(messages.iter().map(|(g, m)| (*g, &m[..]))),
            message_count: messages.len(),
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::collections::BTreeMap;

    use super::RoundCx;
    use crate::codec::decode_batch;
    use crate::ids::{GroupId, NodeId};

    #[test]
    fn a_peers_messages_are_split_into_batches_under_the_cap_in_order() {
        let messages: Vec<(GroupId, Vec<u8>)> = (0..10u8)
            .map(|i| (GroupId(u64::from(i)), vec![i; 100 * usize::from(i + 1)]))
            .collect();
        let outbox = BTreeMap::from([(NodeId(2), messages.clone()), (NodeId(3), vec![])]);
        let batches = RoundCx::batches(outbox, 1_000);
        assert!(batches.len() > 3, "{}", batches.len());
        let mut seen = Vec::new();
        for b in &batches {
            assert_eq!(b.to, NodeId(2));
            let decoded = decode_batch(&b.bytes).unwrap();
            assert_eq!(decoded.len(), b.message_count);
            // Under the cap, unless one message alone is larger.
            assert!(
                b.bytes.len() <= 1_000 || decoded.len() == 1,
                "{}",
                b.bytes.len()
            );
            seen.extend(decoded.into_iter().map(|(g, m)| (g, m.to_vec())));
        }
        assert_eq!(seen, messages);
        let one = RoundCx::batches(BTreeMap::from([(NodeId(2), messages)]), usize::MAX);
        assert_eq!(one.len(), 1);
    }
}
