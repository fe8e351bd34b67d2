//! One point-to-point queue: its messages, each in exactly one [`MessageState`], the indexes that
//! find the next message to deliver, and the receivers parked waiting for one.
//!
//! Transitions live in files named after the operation: `send.rs`, `receive.rs`, `ack.rs`
//! (ack, nack, extend lease), `release.rs` (session close, undeliverable hand-offs, lease expiry),
//! `tick.rs` (time passing), `admin.rs` (recovery, purge, browse, stats).

mod ack;
mod admin;
mod groups;
mod history;
mod marks;
mod paging;
mod policy;
mod receive;
mod redeliver;
mod release;
mod send;
mod tick;
mod tx;

#[cfg(test)]
mod marks_tests;
#[cfg(test)]
mod semantics_tests;
#[cfg(test)]
mod tests;

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, HashMap};

use crate::selector::IndexedHeader;
use crate::types::{LeaseId, Priority, QueueName, QueueUid, Seq, SessionId, SharedMessage};

/// The headers resident messages are indexed by.
const INDEXED_HEADERS: [IndexedHeader; 2] = [IndexedHeader::CorrelationId, IndexedHeader::GroupId];

pub use ack::{Caller, Renewed};
pub use admin::{DeadLetterCounts, QueueStats, RecoveredMessage};
pub use history::{HistoryEntry, ReturnCause, Transition};
pub use marks::DeliveryMark;
pub use paging::{Page, PageSource, PagedError, SCAN_CHUNK, SCAN_LOOK_MAX};
pub use policy::{DeadLetterReason, DeadLetterTarget, RedeliveryPolicy};
pub use receive::{ReceiveOutcome, ReceiveRequest, Wait, WaiterId};
pub use send::{DedupRecord, DEDUP_IDS_MAX, DEDUP_ID_BYTES_MAX, PROPERTIES_PER_MESSAGE_MAX};
pub use tx::STAGED_MAX;

/// Per-queue settings. Every limit has its unit last in its name.
#[derive(Debug, Clone, PartialEq)]
pub struct QueueConfig {
    /// Lease of a delivery when the receiver does not ask for one.
    pub default_lease_ms: u64,
    /// The longest lease a receiver may ask for.
    pub lease_max_ms: u64,
    /// Body + properties + headers of one message.
    pub max_message_size_bytes: u64,
    /// Messages one receive may ask for.
    pub receive_batch_max: u32,
    /// Receivers parked on this queue at once.
    pub waiters_max: usize,
    /// When returned messages are delivered again, and how often.
    pub redelivery: RedeliveryPolicy,
    /// Where messages go after `max_redeliveries` or when rejected.
    pub dead_letter: DeadLetterTarget,
    /// Where expired messages go.
    pub expiry: DeadLetterTarget,
    /// How long a producer's dedup id is remembered: a send repeating it within the window
    /// returns the original message id and stores nothing.
    pub dedup_window_ms: u64,
    /// The most messages the queue may hold (Ready, Scheduled, delivered and not acknowledged,
    /// paged out); a send that would go over is refused. `None`: no limit.
    pub max_messages: Option<u64>,
    /// The most bytes of messages the queue may hold, counted like `max_message_size_bytes`.
    pub max_bytes: Option<u64>,
}

impl Default for QueueConfig {
    fn default() -> Self {
        Self {
            default_lease_ms: 30_000,
            lease_max_ms: 12 * 3_600_000,
            max_message_size_bytes: 1024 * 1024,
            receive_batch_max: 1_000,
            waiters_max: 10_000,
            redelivery: RedeliveryPolicy::default(),
            dead_letter: DeadLetterTarget::Default,
            expiry: DeadLetterTarget::Default,
            dedup_window_ms: 600_000,
            max_messages: None,
            max_bytes: None,
        }
    }
}

/// Where a message is in its life. Exactly one state per message; the queue's indexes mirror it
/// (checked by [`Queue::check_invariants`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MessageState {
    /// Delivery delay or redelivery backoff: invisible until `until_ms`.
    Scheduled { until_ms: u64 },
    /// Visible: may be delivered.
    Ready,
    /// Handed to one receiver, not yet acknowledged.
    Leased {
        lease: LeaseId,
        owner: Option<SessionId>,
        until_ms: u64,
    },
}

/// A message in the queue, with how many times it has been delivered so far.
#[derive(Debug, Clone)]
pub(crate) struct Entry {
    pub(crate) message: SharedMessage,
    pub(crate) state: MessageState,
    pub(crate) delivery_count: u32,
    /// The lease length of its current delivery: what a heartbeat of its session renews.
    pub(crate) lease_ms: u64,
}

/// What the shell must write durably before it answers anyone affected by the operation.
#[derive(Debug, Clone, PartialEq)]
pub enum PersistOp {
    PutMessage(SharedMessage),
    /// Deletes a message. It carries the whole message because the store's keys, counts and
    /// header indexes need its priority, size, correlation id and group id.
    DeleteMessage(SharedMessage),
    /// Deletes the paged-out messages of one priority with sequence numbers in `[from, to)`.
    /// `count` and `bytes` are how many messages (and their bytes) the store holds there: the
    /// queue knows them exactly, and the store keeps its per-priority counts with them.
    DeleteStored {
        priority: Priority,
        from: Seq,
        to: Seq,
        count: u64,
        bytes: u64,
    },
    /// How many times the message has been delivered (survives restarts: redelivered flag and,
    /// later, the redelivery policy depend on it).
    SetDeliveryCount {
        seq: Seq,
        count: u32,
    },
    /// The delivery count with what was handed out or when it is due again: written by a
    /// queue whose delivery marks are written (a replicated queue, see [`DeliveryMark`]) in
    /// place of [`PersistOp::SetDeliveryCount`], which for such a queue clears the mark.
    MarkDelivery {
        seq: Seq,
        count: u32,
        mark: DeliveryMark,
    },
    /// Sequence numbers below `until` may have been used; after a restart the queue continues from
    /// at least here, so message ids are never reused (not even of non-persistent messages).
    ReserveSeq {
        until: Seq,
    },
    /// Remember a producer's dedup id until `record.expires_ms`.
    PutDedup(DedupRecord),
    /// Forget a dedup id whose window has passed.
    DeleteDedup {
        dedup_id: String,
    },
}

/// A delivery: one message leased to one receiver.
#[derive(Debug, Clone, PartialEq)]
pub struct Delivery {
    /// The queue incarnation the message is in.
    pub queue: QueueUid,
    pub message: SharedMessage,
    pub lease: LeaseId,
    /// JMSXDeliveryCount: 1 on the first delivery.
    pub delivery_count: u32,
    pub lease_until_ms: u64,
}

impl Delivery {
    /// JMSRedelivered: the message may have been seen before.
    pub fn redelivered(&self) -> bool {
        self.delivery_count > 1
    }

    pub fn lease_ref(&self) -> LeaseRef {
        LeaseRef {
            queue: self.queue,
            seq: self.message.seq,
            lease: self.lease,
            delivery_count: self.delivery_count,
        }
    }
}

/// Names one delivery of one message. Lease ids are unique within one run of a queue; the queue
/// uid and the (persisted) delivery count make the name unique across restarts and across a
/// queue deleted and created again, so a stale reference can never match a newer delivery.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct LeaseRef {
    pub queue: QueueUid,
    pub seq: Seq,
    pub lease: LeaseId,
    pub delivery_count: u32,
}

/// What an operation changed that the shell must act on.
#[derive(Debug, Default, Clone, PartialEq)]
#[must_use = "effects carry writes to persist and receivers to answer"]
pub struct Effects {
    /// Write these (in order, in one batch) before answering the callers of this operation.
    pub persist: Vec<PersistOp>,
    /// Parked receivers that got messages; each waiter is gone from the queue.
    pub handed: Vec<(WaiterId, Vec<Delivery>)>,
    /// Parked receivers that ended empty-handed (their time ran out or their session closed);
    /// each waiter is gone from the queue.
    pub finished_empty: Vec<WaiterId>,
    /// Messages that left the queue for its dead-letter target. They are gone from the queue's
    /// memory, but each one's durable delete is in [`DeadLetter::delete`], not in `persist`: the
    /// shell writes it in the same batch that stores the message in its new queue (or alone, when
    /// the target is to discard), so a crash can never lose it in between.
    pub dead_letters: Vec<DeadLetter>,
    /// Steps of messages' lives, for the shell's message history.
    pub history: Vec<HistoryEntry>,
}

impl Effects {
    pub fn is_empty(&self) -> bool {
        self.persist.is_empty()
            && self.handed.is_empty()
            && self.finished_empty.is_empty()
            && self.dead_letters.is_empty()
    }

    pub fn merge(&mut self, other: Effects) {
        self.persist.extend(other.persist);
        self.handed.extend(other.handed);
        self.finished_empty.extend(other.finished_empty);
        self.dead_letters.extend(other.dead_letters);
        self.history.extend(other.history);
    }
}

/// A message leaving its queue for the dead-letter target (see [`Effects::dead_letters`]).
#[derive(Debug, Clone, PartialEq)]
pub struct DeadLetter {
    pub message: SharedMessage,
    pub reason: DeadLetterReason,
    /// Deliveries it had (0 for a message that expired before any).
    pub delivery_count: u32,
    /// Where the queue's configuration sends it.
    pub target: DeadLetterTarget,
    /// Removes it from the source queue's durable state; `None` for a non-persistent message.
    pub delete: Option<PersistOp>,
}

/// How many sequence numbers one [`PersistOp::ReserveSeq`] reserves.
pub(crate) const SEQ_RESERVATION_BLOCK: u64 = 10_000;

/// A point-to-point queue. See the module docs.
#[derive(Debug)]
pub struct Queue {
    name: QueueName,
    uid: QueueUid,
    config: QueueConfig,
    entries: BTreeMap<Seq, Entry>,
    /// Ready messages, highest priority first, then oldest first.
    ready: BTreeSet<(Reverse<Priority>, Seq)>,
    scheduled: BTreeSet<(u64, Seq)>,
    lease_expiry: BTreeSet<(u64, Seq)>,
    /// Expiration of every message that is not leased (a leased message is judged when it comes
    /// back: its receiver got it in time).
    expiry: BTreeSet<(u64, Seq)>,
    leases_by_owner: HashMap<SessionId, BTreeSet<Seq>>,
    waiters: BTreeMap<WaiterId, receive::Waiter>,
    waiter_deadlines: BTreeSet<(u64, WaiterId)>,
    next_seq: Seq,
    seq_reserved_until: Seq,
    next_lease: LeaseId,
    /// Every lease below it that the queue holds was granted by an earlier run of the queue and
    /// read back from the store (a written delivery mark); every lease this queue granted
    /// itself is at or above it (see [`Queue::release_lost`]).
    inherited_leases_below: LeaseId,
    next_waiter: WaiterId,
    /// Sum of `size_bytes` of every message in the queue.
    bytes: u64,
    /// Messages that became Ready since the last dispatch (see `dispatch`).
    newly_ready: Vec<Seq>,
    counters: admin::Counters,
    /// Collision avoidance for redelivery delays.
    rng: policy::SplitMix64,
    /// Message groups (JMSXGroupID) and the session each belongs to.
    groups: groups::Groups,
    /// Sends of transacted sessions, invisible until commit.
    staged: HashMap<SessionId, Vec<SharedMessage>>,
    /// Bytes of the staged sends (they are held in memory until their transaction ends).
    staged_bytes: u64,
    /// The most bytes in memory past which messages that cannot be paged out are refused.
    pinned_budget_bytes: u64,
    /// Dedup ids of staged sends, with the session that staged each and its message: a
    /// transaction holds its dedup ids until it ends (see `tx.rs`).
    staged_dedup: HashMap<String, (SessionId, Seq)>,
    /// Producer dedup ids remembered, with the message id they produced.
    dedup: HashMap<String, (Seq, u64)>,
    dedup_expiry: BTreeSet<(u64, String)>,
    /// Recovered messages delivered as often as the policy allows: dead-lettered at the first
    /// tick.
    recovered_exhausted: Vec<Seq>,
    /// Effects of an operation that was refused after time had already been applied (say, a
    /// receive over `waiters_max` after messages expired): handed to the shell with the next
    /// operation's, which is due at once.
    deferred: Effects,
    /// The `now` of the operation in progress (set as it starts), for history entries.
    now_ms: u64,
    /// What is paged out to the store, per priority (see `paging.rs`).
    paging: paging::Paging,
    /// Resident messages by correlation id and by group: a receive whose selector asks for one
    /// value of either looks at those only.
    by_header: HashMap<(IndexedHeader, String), BTreeSet<Seq>>,
    /// Whether deliveries and returns write their [`DeliveryMark`] (see `marks.rs`).
    marks_written: bool,
}

impl Queue {
    /// A new, empty queue.
    pub fn new(name: QueueName, uid: QueueUid, config: QueueConfig) -> Self {
        Self {
            name,
            uid,
            config,
            entries: BTreeMap::new(),
            ready: BTreeSet::new(),
            scheduled: BTreeSet::new(),
            lease_expiry: BTreeSet::new(),
            expiry: BTreeSet::new(),
            leases_by_owner: HashMap::new(),
            waiters: BTreeMap::new(),
            waiter_deadlines: BTreeSet::new(),
            next_seq: Seq(1),
            seq_reserved_until: Seq(1),
            next_lease: LeaseId(1),
            inherited_leases_below: LeaseId(1),
            next_waiter: WaiterId(1),
            bytes: 0,
            newly_ready: Vec::new(),
            counters: admin::Counters::default(),
            rng: policy::SplitMix64::new(uid.0),
            groups: groups::Groups::default(),
            staged: HashMap::new(),
            staged_bytes: 0,
            pinned_budget_bytes: u64::MAX,
            staged_dedup: HashMap::new(),
            dedup: HashMap::new(),
            dedup_expiry: BTreeSet::new(),
            recovered_exhausted: Vec::new(),
            deferred: Effects::default(),
            now_ms: 0,
            paging: paging::Paging::default(),
            by_header: HashMap::new(),
            marks_written: false,
        }
    }

    /// Reseeds the random source of collision avoidance (tests pin the delays with it).
    pub fn seed_random(&mut self, seed: u64) {
        self.rng = policy::SplitMix64::new(seed);
    }

    pub fn name(&self) -> &QueueName {
        &self.name
    }

    pub fn uid(&self) -> QueueUid {
        self.uid
    }

    pub fn config(&self) -> &QueueConfig {
        &self.config
    }

    /// The state of one message, if it is in the queue.
    pub fn state_of(&self, seq: Seq) -> Option<MessageState> {
        self.entries.get(&seq).map(|e| e.state)
    }

    /// The earliest time at which [`Queue::tick`] has something to do.
    pub fn next_deadline_ms(&self) -> Option<u64> {
        [
            (!self.recovered_exhausted.is_empty() || !self.deferred.is_empty()).then_some(0),
            self.scheduled.first().map(|&(t, _)| t),
            self.lease_expiry.first().map(|&(t, _)| t),
            self.expiry.first().map(|&(t, _)| t),
            self.waiter_deadlines.first().map(|&(t, _)| t),
            self.dedup_expiry.first().map(|&(t, _)| t),
        ]
        .into_iter()
        .flatten()
        .min()
    }

    /// Moves a message to a new state, keeping every index in step. The only place that writes
    /// `Entry::state`.
    fn set_state(&mut self, seq: Seq, new: MessageState) {
        let Some(entry) = self.entries.get_mut(&seq) else {
            return;
        };
        let old = std::mem::replace(&mut entry.state, new);
        let priority = entry.message.priority;
        match (old == MessageState::Ready, new == MessageState::Ready) {
            (true, false) => self.paging.level_mut(priority).ready -= 1,
            (false, true) => self.paging.level_mut(priority).ready += 1,
            _ => {}
        }
        if let Some(at) = entry.message.expiration_ms {
            if !matches!(old, MessageState::Leased { .. }) {
                self.expiry.remove(&(at, seq));
            }
            if !matches!(new, MessageState::Leased { .. }) {
                self.expiry.insert((at, seq));
            }
        }
        match old {
            MessageState::Scheduled { until_ms } => {
                self.scheduled.remove(&(until_ms, seq));
            }
            MessageState::Ready => {
                self.ready.remove(&(Reverse(priority), seq));
            }
            MessageState::Leased {
                owner, until_ms, ..
            } => {
                self.lease_expiry.remove(&(until_ms, seq));
                if let Some(owner) = owner {
                    if let Some(set) = self.leases_by_owner.get_mut(&owner) {
                        set.remove(&seq);
                        if set.is_empty() {
                            self.leases_by_owner.remove(&owner);
                        }
                    }
                }
            }
        }
        match new {
            MessageState::Scheduled { until_ms } => {
                self.scheduled.insert((until_ms, seq));
            }
            MessageState::Ready => {
                self.ready.insert((Reverse(priority), seq));
                if !self.waiters.is_empty() {
                    self.newly_ready.push(seq);
                }
            }
            MessageState::Leased {
                owner, until_ms, ..
            } => {
                self.lease_expiry.insert((until_ms, seq));
                if let Some(owner) = owner {
                    self.leases_by_owner.entry(owner).or_default().insert(seq);
                }
            }
        }
    }

    /// Adds a message in the given state.
    fn insert_entry(&mut self, message: SharedMessage, state: MessageState, delivery_count: u32) {
        let seq = message.seq;
        let priority = message.priority;
        self.bytes += message.size_bytes();
        self.note_resident(&message);
        self.paging.level_mut(priority).ready += 1;
        for h in INDEXED_HEADERS {
            if let Some(v) = h.value_of(&message) {
                self.by_header
                    .entry((h, v.to_owned()))
                    .or_default()
                    .insert(seq);
            }
        }
        self.entries.insert(
            seq,
            Entry {
                message,
                state: MessageState::Ready,
                delivery_count,
                lease_ms: 0,
            },
        );
        self.ready.insert((Reverse(priority), seq));
        if let Some(at) = self.entries.get(&seq).and_then(|e| e.message.expiration_ms) {
            self.expiry.insert((at, seq));
        }
        self.set_state(seq, state);
    }

    /// Removes a message from the queue and from every index. Returns the persist op that deletes
    /// it, if it was persistent.
    fn remove_entry(&mut self, seq: Seq) -> Option<PersistOp> {
        // Move it to a neutral state first so set_state clears its index entries.
        self.set_state(seq, MessageState::Ready);
        let entry = self.entries.remove(&seq)?;
        self.ready.remove(&(Reverse(entry.message.priority), seq));
        self.paging.level_mut(entry.message.priority).ready -= 1;
        for h in INDEXED_HEADERS {
            if let Some(v) = h.value_of(&entry.message) {
                let key = (h, v.to_owned());
                if let Some(set) = self.by_header.get_mut(&key) {
                    set.remove(&seq);
                    if set.is_empty() {
                        self.by_header.remove(&key);
                    }
                }
            }
        }
        if let Some(at) = entry.message.expiration_ms {
            self.expiry.remove(&(at, seq));
        }
        self.bytes -= entry.message.size_bytes();
        entry
            .message
            .persistent
            .then(|| PersistOp::DeleteMessage(entry.message.clone()))
    }

    /// Panics if any index disagrees with the states of the messages. Tests call it after every
    /// step.
    pub fn check_invariants(&self) {
        let (mut ready, mut scheduled, mut leased) = (0usize, 0usize, 0usize);
        let (mut owned, mut expiring) = (0usize, 0usize);
        for (&seq, e) in &self.entries {
            assert_eq!(e.message.seq, seq, "entry key matches message seq");
            assert!(seq < self.next_seq, "seq {seq} below next_seq");
            if let Some(at) = e.message.expiration_ms {
                let leased = matches!(e.state, MessageState::Leased { .. });
                assert_eq!(self.expiry.contains(&(at, seq)), !leased, "expiry index");
                expiring += usize::from(!leased);
            }
            self.groups.check_entry(e);
            match e.state {
                MessageState::Ready => {
                    ready += 1;
                    assert!(self.ready.contains(&(Reverse(e.message.priority), seq)));
                }
                MessageState::Scheduled { until_ms } => {
                    scheduled += 1;
                    assert!(self.scheduled.contains(&(until_ms, seq)));
                }
                MessageState::Leased {
                    owner,
                    until_ms,
                    lease,
                } => {
                    leased += 1;
                    assert!(lease < self.next_lease);
                    assert!(self.inherited_leases_below <= self.next_lease);
                    assert!(e.delivery_count >= 1, "a leased message has been delivered");
                    assert!(self.lease_expiry.contains(&(until_ms, seq)));
                    if let Some(owner) = owner {
                        owned += 1;
                        assert!(self
                            .leases_by_owner
                            .get(&owner)
                            .is_some_and(|s| s.contains(&seq)));
                    }
                }
            }
        }
        assert_eq!(self.ready.len(), ready, "ready index size");
        assert_eq!(self.scheduled.len(), scheduled, "scheduled index size");
        assert_eq!(self.lease_expiry.len(), leased, "lease index size");
        assert_eq!(self.expiry.len(), expiring, "expiry index size");
        for staged in self.staged.values() {
            for m in staged {
                assert!(m.seq < self.next_seq && !self.entries.contains_key(&m.seq));
            }
        }
        assert_eq!(
            self.staged_bytes,
            self.staged
                .values()
                .flatten()
                .map(|m| m.size_bytes())
                .sum::<u64>(),
            "staged bytes"
        );
        for (dedup_id, (session, seq)) in &self.staged_dedup {
            assert!(
                self.staged.get(session).is_some_and(|ms| ms
                    .iter()
                    .any(|m| m.seq == *seq && m.dedup_id.as_ref() == Some(dedup_id))),
                "a staged dedup id names a staged send of its session"
            );
        }
        assert_eq!(
            self.dedup.len(),
            self.dedup_expiry.len(),
            "dedup index size"
        );
        for (at, id) in &self.dedup_expiry {
            assert_eq!(self.dedup.get(id).map(|(_, t)| *t), Some(*at));
        }
        assert_eq!(
            self.leases_by_owner
                .values()
                .map(BTreeSet::len)
                .sum::<usize>(),
            owned
        );
        assert!(self.leases_by_owner.values().all(|s| !s.is_empty()));
        assert_eq!(
            self.waiters.len(),
            self.waiter_deadlines.len()
                + self
                    .waiters
                    .values()
                    .filter(|w| w.deadline_ms.is_none())
                    .count()
        );
        for (id, w) in &self.waiters {
            if let Some(d) = w.deadline_ms {
                assert!(self.waiter_deadlines.contains(&(d, *id)));
            }
        }
        // A parked receiver and a deliverable message never coexist: dispatch runs after every
        // change that makes a message ready or parks a receiver.
        assert!(
            self.paging.rescan.iter().any(Option::is_some) || !self.waiter_could_take_ready(),
            "a parked receiver matches a ready message"
        );
        assert!(
            self.next_seq <= self.seq_reserved_until,
            "every used seq is reserved durably"
        );
        assert_eq!(
            self.bytes,
            self.entries
                .values()
                .map(|e| e.message.size_bytes())
                .sum::<u64>()
        );
        self.check_paging();
        let indexed: usize = self.by_header.values().map(BTreeSet::len).sum();
        let mut want = 0;
        for (&seq, e) in &self.entries {
            for h in INDEXED_HEADERS {
                if let Some(v) = h.value_of(&e.message) {
                    want += 1;
                    assert!(
                        self.by_header
                            .get(&(h, v.to_owned()))
                            .is_some_and(|s| s.contains(&seq)),
                        "header index misses {seq}"
                    );
                }
            }
        }
        assert_eq!(indexed, want, "header index size");
    }
}
