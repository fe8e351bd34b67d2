//! Scripting a simulated run: every raft message the network carries, decoded into a [`Msg`];
//! rules that hold or drop the messages they match (held ones wait for the test to release
//! them, in the order it chooses); disks that stall; and the trace of what happened, step by
//! step (recorded on demand, see [`Sim::record_trace`]).

use std::fmt;

use bytes::Bytes;
use ferry_multiraft::{decode_batch, encode_batch, ConfChange, GroupId, LogPosition, NodeId, Role};
use protobuf::Message as _;
use raft::eraftpb::{Message, MessageType};

use super::{Packet, Sim};

/// One raft message on the wire, as a script matches it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Msg {
    pub from: NodeId,
    pub to: NodeId,
    pub group: GroupId,
    pub kind: MessageType,
    pub term: u64,
    /// An append's previous index; an append response's matched (or rejected) index; a vote
    /// request's last index.
    pub index: u64,
    pub log_term: u64,
    pub commit: u64,
    pub reject: bool,
    pub reject_hint: u64,
    /// First and last index of the entries carried, if any.
    pub entries: Option<(u64, u64)>,
    /// The index a snapshot message covers up to.
    pub snapshot_index: Option<u64>,
}

impl Msg {
    /// An append that carries no entries (it moves the commit index or probes).
    pub fn is_empty_append(&self) -> bool {
        self.kind == MessageType::MsgAppend && self.entries.is_none()
    }

    /// An append response that accepts (not a rejection).
    pub fn is_ack(&self) -> bool {
        self.kind == MessageType::MsgAppendResponse && !self.reject
    }

    /// A pre-vote or vote request: its sender campaigns.
    pub fn is_campaign(&self) -> bool {
        matches!(
            self.kind,
            MessageType::MsgRequestPreVote | MessageType::MsgRequestVote
        )
    }
}

/// A message in transit: what a script sees of it and its encoded bytes.
#[derive(Debug, Clone)]
pub(super) struct Carried {
    pub(super) msg: Msg,
    pub(super) bytes: Bytes,
}

/// Decodes every message of a batch from `from` (the simulator only carries what engines made).
pub(super) fn decode(from: NodeId, batch: &Bytes) -> Vec<Carried> {
    let messages = decode_batch(batch).expect("an engine's batch decodes");
    messages
        .into_iter()
        .map(|(group, bytes)| {
            let mut m = Message::default();
            m.merge_from_bytes(bytes)
                .expect("an engine's message decodes");
            let msg = Msg {
                from,
                to: NodeId(m.to),
                group,
                kind: m.get_msg_type(),
                term: m.term,
                index: m.index,
                log_term: m.log_term,
                commit: m.commit,
                reject: m.reject,
                reject_hint: m.reject_hint,
                entries: m
                    .entries
                    .first()
                    .zip(m.entries.last())
                    .map(|(a, b)| (a.index, b.index)),
                snapshot_index: m.snapshot.as_ref().map(|s| s.get_metadata().index),
            };
            Carried {
                msg,
                bytes: batch.slice_ref(bytes),
            }
        })
        .collect()
}

/// One batch of the given messages.
pub(super) fn encode(messages: &[Carried]) -> Bytes {
    encode_batch(messages.iter().map(|c| (c.msg.group, &c.bytes[..])))
}

/// What a [`Rule`] does with the messages it matches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fate {
    /// Keeps them until [`Sim::release`] or [`Sim::discard`].
    Hold,
    /// Loses them.
    Drop,
}

/// A rule in force, to lift with [`Sim::lift`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RuleId(u64);

type Matcher = Box<dyn Fn(&Msg) -> bool>;

/// Holds or drops every message it matches, while in force. The first rule that matches a
/// message decides its fate.
pub(super) struct Rule {
    id: RuleId,
    fate: Fate,
    matches: Matcher,
}

impl fmt::Debug for Rule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Rule")
            .field("id", &self.id)
            .field("fate", &self.fate)
            .finish_non_exhaustive()
    }
}

/// One thing that happened in a run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// A round handed a message to the network (a cut link, chance or a rule may still lose it).
    Sent(Msg),
    /// A message reached its destination's engine.
    Delivered(Msg),
    /// A round reported a node's new role (or leader) in a group.
    Role {
        node: NodeId,
        group: GroupId,
        role: Role,
        term: u64,
    },
    /// A node applied a configuration change or installed a snapshot.
    Applied {
        node: NodeId,
        group: GroupId,
        position: LogPosition,
        what: Applied,
    },
    /// Every job a node had written became durable.
    Synced { node: NodeId },
}

/// What an [`Event::Applied`] was.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Applied {
    ConfChange(ConfChange),
    Snapshot,
}

/// An [`Event`] at the step it happened in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Traced {
    pub step: u64,
    pub event: Event,
}

/// What the scripting hooks keep in a [`Sim`].
#[derive(Debug, Default)]
pub(super) struct Script {
    rules: Vec<Rule>,
    next_rule: u64,
    held: Vec<Carried>,
    trace: Option<Vec<Traced>>,
}

impl Script {
    /// The fate of a message sent now: `None` when it goes on.
    fn fate(&self, msg: &Msg) -> Option<Fate> {
        self.rules.iter().find(|r| (r.matches)(msg)).map(|r| r.fate)
    }
}

impl Sim {
    /// Starts recording the trace ([`Sim::trace`]).
    pub fn record_trace(&mut self) {
        self.script.trace.get_or_insert_with(Vec::new);
    }

    /// What happened since [`Sim::record_trace`].
    pub fn trace(&self) -> &[Traced] {
        self.script.trace.as_deref().unwrap_or_default()
    }

    pub(super) fn note(&mut self, event: Event) {
        if let Some(trace) = &mut self.script.trace {
            trace.push(Traced {
                step: self.now,
                event,
            });
        }
    }

    /// Holds every message `matches` selects from now on, until the rule is lifted.
    pub fn hold(&mut self, matches: impl Fn(&Msg) -> bool + 'static) -> RuleId {
        self.add_rule(Fate::Hold, Box::new(matches))
    }

    /// Loses every message `matches` selects from now on, until the rule is lifted.
    pub fn drop_matching(&mut self, matches: impl Fn(&Msg) -> bool + 'static) -> RuleId {
        self.add_rule(Fate::Drop, Box::new(matches))
    }

    fn add_rule(&mut self, fate: Fate, matches: Matcher) -> RuleId {
        let id = RuleId(self.script.next_rule);
        self.script.next_rule += 1;
        self.script.rules.push(Rule { id, fate, matches });
        id
    }

    pub fn lift(&mut self, rule: RuleId) {
        self.script.rules.retain(|r| r.id != rule);
    }

    pub fn lift_all(&mut self) {
        self.script.rules.clear();
    }

    /// The messages held, oldest first.
    pub fn held(&self) -> Vec<Msg> {
        self.script.held.iter().map(|c| c.msg).collect()
    }

    /// Sends the oldest held message `matches` selects: it arrives next step, after whatever
    /// was released before it. Panics if none is held.
    pub fn release_first(&mut self, matches: impl Fn(&Msg) -> bool) -> Msg {
        let at = self.script.held.iter().position(|c| matches(&c.msg));
        let carried = self
            .script
            .held
            .remove(at.expect("a held message to release"));
        let msg = carried.msg;
        self.packets.push(Packet {
            from: msg.from,
            to: msg.to,
            deliver_at: self.now + 1,
            bytes: encode(std::slice::from_ref(&carried)),
            messages: vec![msg],
        });
        msg
    }

    /// Sends every held message `matches` selects, oldest first; how many.
    pub fn release(&mut self, matches: impl Fn(&Msg) -> bool) -> usize {
        let count = self.script.held.iter().filter(|c| matches(&c.msg)).count();
        for _ in 0..count {
            self.release_first(&matches);
        }
        count
    }

    /// Loses the held messages `matches` selects; how many.
    pub fn discard(&mut self, matches: impl Fn(&Msg) -> bool) -> usize {
        let before = self.script.held.len();
        self.script.held.retain(|c| !matches(&c.msg));
        before - self.script.held.len()
    }

    /// Applies the rules to the messages of a batch: keeps those that go on; whether any did
    /// not.
    pub(super) fn filter(&mut self, messages: &mut Vec<Carried>) -> bool {
        if self.script.rules.is_empty() {
            return false;
        }
        let before = messages.len();
        for carried in std::mem::take(messages) {
            match self.script.fate(&carried.msg) {
                None => messages.push(carried),
                Some(Fate::Hold) => self.script.held.push(carried),
                Some(Fate::Drop) => {}
            }
        }
        messages.len() != before
    }

    /// Stops `node`'s disk: what it writes stays unsynced until [`Sim::resume_disk`].
    pub fn stall_disk(&mut self, node: NodeId) {
        self.stalled.insert(node);
    }

    pub fn resume_disk(&mut self, node: NodeId) {
        self.stalled.remove(&node);
    }

    /// Ticks `node`'s engine had so far.
    pub fn ticks(&self, node: NodeId) -> u64 {
        self.ticks.get(&node).copied().unwrap_or(0)
    }
}
