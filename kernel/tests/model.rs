//! Model-based test: random sequences of send (priorities, delays, expiry, groups, selector
//! property) / receive (with selectors) / ack / nack / reject / extend lease / cancel / recover /
//! transacted send / commit / rollback / heartbeat / close session / advance time, run against the kernel and
//! against a deliberately naive reference model (linear scans, no indexes). After every step both
//! must agree on every message's state and delivery count, on every answer, on every message
//! dead-lettered and why, and the kernel's own invariants must hold.
//!
//! The second property runs the same sequences on a queue with a small random memory budget
//! behind a fake store, with restarts: paging must be invisible. Every answer must be the one the
//! model (which knows nothing of paging) gives; a paged-out message counts as Ready. (Messages
//! there have no time to live: a paged-out message expires when it is paged in, later than the
//! model would say.)

#![allow(clippy::unwrap_used)]

mod support;

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet};
use std::convert::Infallible;

use std::sync::Arc;
use support::FakeStore;

use ferry_kernel::{
    Caller, DeadLetterReason, Delivery, Effects, LeaseId, LeaseRef, MessageState, NewMessage,
    PagedError, Priority, PropertyValue, Queue, QueueConfig, QueueName, QueueUid, ReceiveOutcome,
    ReceiveRequest, RecoveredMessage, RedeliveryPolicy, Selector, SelectorLimits, Seq, SessionId,
    Wait, WaiterId,
};

/// The redelivery policy both sides follow: 50 ms, then doubling, capped at 150 ms; a message
/// is delivered at most 1 + 3 times.
const MAX_REDELIVERIES: u32 = 3;

fn model_delay(n: u32) -> u64 {
    if n <= 1 {
        50
    } else {
        (50u64 << (n - 1).min(20)).min(150)
    }
}
use proptest::prelude::*;

#[derive(Debug, Clone)]
enum Op {
    Send {
        count: u8,
        priority: u8,
        delay_ms: u16,
        ttl_ms: Option<u16>,
        persistent: bool,
        /// Value of the int property `n` on every message of the batch.
        n: u8,
        group: Option<u8>,
        /// Staged by this transacted session instead of sent.
        tx: Option<u8>,
    },
    Receive {
        session: u8,
        max: u8,
        wait_ms: Option<u16>,
        lease_ms: u16,
        filter: Option<Filter>,
    },
    Ack {
        pick: usize,
    },
    Nack {
        pick: usize,
        /// `None`: the policy's delay.
        delay_ms: Option<u16>,
        reject: bool,
    },
    Extend {
        pick: usize,
        lease_ms: u16,
    },
    Cancel {
        pick: usize,
    },
    CloseSession {
        session: u8,
    },
    Recover {
        session: u8,
    },
    /// Commits `session`'s staged sends with acks of every live delivery it holds, or of one
    /// picked delivery (which may be stale or another session's: then the commit fails whole).
    Commit {
        session: u8,
        pick: Option<usize>,
    },
    Rollback {
        session: u8,
    },
    /// The session's connection heartbeats: its leases are renewed.
    Heartbeat {
        session: u8,
    },
    /// The heartbeat names deliveries (what its front-end passed on): those alone are renewed.
    HeartbeatNamed {
        session: u8,
        picks: Vec<usize>,
    },
    Advance {
        ms: u16,
    },
    /// The node stops and starts again from what the store holds.
    Restart,
}

fn unwrap_paged<T>(r: Result<T, PagedError<Infallible>>) -> T {
    match r {
        Ok(v) => v,
        Err(PagedError::Kernel(e)) => panic!("kernel refused: {e}"),
        Err(PagedError::Source(never)) => match never {},
    }
}

/// Reads into the window what the queue asks for, applying every write as it goes.
fn fill(q: &mut Queue, store: &mut FakeStore, fx: &mut Effects, now: u64) {
    store.apply(fx);
    loop {
        let more = q.fill(&*store, 64, now).unwrap();
        store.apply(&more);
        let done = more.is_empty();
        fx.merge(more);
        if done {
            break;
        }
    }
}

/// A receiver's selector, `n = k` or `n > k`; the model checks it in plain Rust.
#[derive(Debug, Clone, Copy)]
struct Filter {
    greater: bool,
    k: u8,
}

impl Filter {
    fn text(self) -> String {
        format!("n {} {}", if self.greater { ">" } else { "=" }, self.k)
    }

    fn accepts(self, n: u8) -> bool {
        if self.greater {
            n > self.k
        } else {
            n == self.k
        }
    }
}

fn op() -> impl Strategy<Value = Op> {
    let filter = proptest::option::weighted(
        0.4,
        (any::<bool>(), 0..3u8).prop_map(|(greater, k)| Filter { greater, k }),
    );
    prop_oneof![
        3 => (
            (1..4u8, 0..10u8, prop_oneof![Just(0u16), 1..300u16]),
            proptest::option::weighted(0.3, 1..400u16),
            (any::<bool>(), 0..3u8, proptest::option::weighted(0.3, 0..3u8)),
            proptest::option::weighted(0.25, 0..3u8),
        )
            .prop_map(|((count, priority, delay_ms), ttl_ms, (persistent, n, group), tx)| {
                Op::Send { count, priority, delay_ms, ttl_ms, persistent, n, group, tx }
            }),
        3 => (0..3u8, 1..4u8, proptest::option::of(0..400u16), 1..500u16, filter)
            .prop_map(|(session, max, wait_ms, lease_ms, filter)| Op::Receive { session, max, wait_ms, lease_ms, filter }),
        2 => any::<usize>().prop_map(|pick| Op::Ack { pick }),
        2 => (any::<usize>(), proptest::option::of(prop_oneof![Just(0u16), 1..200u16]), proptest::bool::weighted(0.15))
            .prop_map(|(pick, delay_ms, reject)| Op::Nack { pick, delay_ms, reject }),
        1 => (any::<usize>(), 1..500u16).prop_map(|(pick, lease_ms)| Op::Extend { pick, lease_ms }),
        1 => any::<usize>().prop_map(|pick| Op::Cancel { pick }),
        1 => (0..3u8).prop_map(|session| Op::CloseSession { session }),
        1 => (0..3u8).prop_map(|session| Op::Recover { session }),
        1 => (0..3u8, proptest::option::weighted(0.3, any::<usize>()))
            .prop_map(|(session, pick)| Op::Commit { session, pick }),
        1 => (0..3u8).prop_map(|session| Op::Rollback { session }),
        1 => (0..3u8).prop_map(|session| Op::Heartbeat { session }),
        1 => (0..3u8, proptest::collection::vec(any::<usize>(), 0..4))
            .prop_map(|(session, picks)| Op::HeartbeatNamed { session, picks }),
        3 => (0..300u16).prop_map(|ms| Op::Advance { ms }),
        1 => Just(Op::Restart),
    ]
}

#[derive(Debug, Clone, Copy, PartialEq)]
struct ModelMsg {
    priority: u8,
    persistent: bool,
    /// When its delivery delay ends (a restart keeps it; a redelivery backoff is forgotten).
    deliver_at: Option<u64>,
    n: u8,
    group: Option<u8>,
    expires: Option<u64>,
    state: MessageState,
    count: u32,
    lease_ms: u64,
}

#[derive(Debug, Clone, Copy)]
struct ModelWaiter {
    id: u64,
    owner: SessionId,
    max: u32,
    lease_ms: u64,
    deadline: Option<u64>,
    filter: Option<Filter>,
}

/// The reference: the same rules, written as plainly as possible.
#[derive(Debug, Default)]
struct Model {
    msgs: BTreeMap<u64, ModelMsg>,
    /// Transacted sends not yet committed, by session.
    staged: BTreeMap<SessionId, Vec<(u64, ModelMsg)>>,
    /// Which session holds each message group.
    groups: BTreeMap<u8, SessionId>,
    /// Dead-lettered this step.
    dead: Vec<(u64, DeadLetterReason)>,
    waiters: Vec<ModelWaiter>,
    next_seq: u64,
    next_lease: u64,
    next_waiter: u64,
}

type Handed = Vec<(u64, Vec<(u64, u64, u32)>)>;

impl Model {
    fn new() -> Self {
        Self {
            next_seq: 1,
            next_lease: 1,
            next_waiter: 1,
            ..Default::default()
        }
    }

    fn next_ready(&self, owner: SessionId, filter: Option<Filter>) -> Option<u64> {
        self.msgs
            .iter()
            .filter(|(_, m)| m.state == MessageState::Ready)
            .filter(|(_, m)| filter.is_none_or(|f| f.accepts(m.n)))
            .filter(|(_, m)| {
                m.group
                    .is_none_or(|g| self.groups.get(&g).is_none_or(|&o| o == owner))
            })
            .min_by_key(|(&seq, m)| (std::cmp::Reverse(m.priority), seq))
            .map(|(&seq, _)| seq)
    }

    fn take(
        &mut self,
        max: u32,
        owner: SessionId,
        lease_ms: u64,
        filter: Option<Filter>,
        now: u64,
    ) -> Vec<(u64, u64, u32)> {
        let mut out = vec![];
        while out.len() < max as usize {
            let Some(seq) = self.next_ready(owner, filter) else {
                break;
            };
            let lease = self.next_lease;
            self.next_lease += 1;
            let m = self.msgs.get_mut(&seq).unwrap();
            m.count += 1;
            m.lease_ms = lease_ms;
            if let Some(g) = m.group {
                self.groups.entry(g).or_insert(owner);
            }
            m.state = MessageState::Leased {
                lease: LeaseId(lease),
                owner: Some(owner),
                until_ms: now + lease_ms,
            };
            out.push((seq, lease, m.count));
        }
        out
    }

    fn expire(&mut self, now: u64) {
        let expired: Vec<u64> = self
            .msgs
            .iter()
            .filter(|(_, m)| !matches!(m.state, MessageState::Leased { .. }))
            .filter(|(_, m)| m.expires.is_some_and(|t| t <= now))
            .map(|(&s, _)| s)
            .collect();
        for seq in expired {
            self.msgs.remove(&seq);
            self.dead.push((seq, DeadLetterReason::Expired));
        }
    }

    /// Oldest receiver first; one whose filter matches nothing keeps waiting.
    fn dispatch(&mut self, now: u64, handed: &mut Handed) {
        self.expire(now);
        let mut i = 0;
        while i < self.waiters.len() {
            let w = self.waiters[i];
            let got = self.take(w.max, w.owner, w.lease_ms, w.filter, now);
            if got.is_empty() {
                i += 1;
            } else {
                self.waiters.remove(i);
                handed.push((w.id, got));
            }
        }
    }

    /// A delivered message came back: dead-lettered if expired or delivered as often as allowed,
    /// else Ready after the policy's delay (or `delay`, held to the policy's 150 ms cap).
    fn give_back(&mut self, seq: u64, delay: Option<u64>, now: u64) {
        let m = self.msgs[&seq];
        let reason = if m.expires.is_some_and(|t| t <= now) {
            Some(DeadLetterReason::Expired)
        } else if m.count > MAX_REDELIVERIES {
            Some(DeadLetterReason::MaxDeliveries)
        } else {
            None
        };
        if let Some(reason) = reason {
            self.msgs.remove(&seq);
            self.dead.push((seq, reason));
            return;
        }
        let delay = delay.map_or_else(|| model_delay(m.count), |d| d.min(150));
        self.msgs.get_mut(&seq).unwrap().state = if delay > 0 {
            MessageState::Scheduled {
                until_ms: now + delay,
            }
        } else {
            MessageState::Ready
        };
    }

    fn held_by(&self, owner: SessionId) -> Vec<u64> {
        self.msgs
            .iter()
            .filter(|(_, m)| matches!(m.state, MessageState::Leased { owner: Some(o), .. } if o == owner))
            .map(|(&s, _)| s)
            .collect()
    }

    fn fire(&mut self, now: u64, handed: &mut Handed, ended: &mut Vec<u64>) {
        for m in self.msgs.values_mut() {
            match m.state {
                MessageState::Scheduled { until_ms } if until_ms <= now => {
                    m.state = MessageState::Ready
                }
                _ => {}
            }
        }
        let lapsed: Vec<u64> = self
            .msgs
            .iter()
            .filter(|(_, m)| matches!(m.state, MessageState::Leased { until_ms, .. } if until_ms <= now))
            .map(|(&s, _)| s)
            .collect();
        let mut lapsed_groups = Vec::new();
        for seq in lapsed {
            let m = self.msgs[&seq];
            if let (Some(g), MessageState::Leased { owner: Some(o), .. }) = (m.group, m.state) {
                lapsed_groups.push((g, o));
            }
            self.give_back(seq, None, now);
        }
        // A session that let the lease of the last message of its group lapse loses the group.
        for (g, holder) in lapsed_groups {
            let holds_more = self
                .held_by(holder)
                .iter()
                .any(|s| self.msgs[s].group == Some(g));
            if self.groups.get(&g) == Some(&holder) && !holds_more {
                self.groups.remove(&g);
            }
        }
        self.expire(now);
        let (gone, keep): (Vec<ModelWaiter>, Vec<ModelWaiter>) = std::mem::take(&mut self.waiters)
            .into_iter()
            .partition(|w| w.deadline.is_some_and(|d| d <= now));
        ended.extend(gone.iter().map(|w| w.id));
        self.waiters = keep;
        self.dispatch(now, handed);
    }
}

fn flatten(deliveries: &[Delivery]) -> Vec<(u64, u64, u32)> {
    deliveries
        .iter()
        .map(|d| (d.message.seq.0, d.lease.0, d.delivery_count))
        .collect()
}

fn kernel_handed(fx: &Effects) -> Handed {
    fx.handed.iter().map(|(id, d)| (id.0, flatten(d))).collect()
}

fn ended_ids(fx: &Effects) -> Vec<u64> {
    fx.finished_empty.iter().map(|w| w.0).collect()
}

/// Runs `ops` against the kernel and the model; with `budget`, the queue keeps at most about
/// that many bytes in memory and pages the rest out to a fake store.
fn run(ops: Vec<Op>, budget: Option<u64>) -> Result<(), TestCaseError> {
    let config = QueueConfig {
        redelivery: RedeliveryPolicy {
            max_redeliveries: Some(MAX_REDELIVERIES),
            initial_delay_ms: 50,
            delay_ms: 50,
            exponential_backoff: true,
            backoff_multiplier: 2.0,
            collision_avoidance_percent: 0,
            max_delay_ms: 150,
        },
        ..QueueConfig::default()
    };
    let mut q = Queue::new(
        QueueName::new("model").unwrap(),
        QueueUid(1),
        config.clone(),
    );
    q.set_memory_budget(budget.unwrap_or(u64::MAX));
    let mut store = FakeStore::default();
    // Acknowledged messages stay readable for a step, as when their delete is on its way.
    store.lag_deletes = budget.is_some();
    // Messages delivered as often as allowed when the node restarted: dead-lettered whenever
    // they are paged in.
    let mut limbo: BTreeSet<u64> = BTreeSet::new();
    let mut m = Model::new();
    let mut now = 1_000u64;
    // Deliveries handed out so far (live or stale) and parked waiters, for ops to pick from.
    let mut leases: Vec<LeaseRef> = vec![];
    let mut parked: Vec<WaiterId> = vec![];
    let mut acked = 0u64;
    let mut sent = 0u64;
    let mut dead = 0u64;
    for op in ops {
        store.land_deletes();
        let (mut h, mut e) = (Handed::new(), Vec::new());
        let fx = match op {
            Op::Send {
                count,
                priority,
                delay_ms,
                ttl_ms,
                persistent,
                n,
                group,
                tx,
            } => {
                let ttl_ms = ttl_ms.filter(|_| budget.is_none());
                let batch = (0..count)
                    .map(|_| NewMessage {
                        properties: [("n".to_string(), PropertyValue::Int(n.into()))].into(),
                        priority: Priority::new(priority.into()).unwrap(),
                        delivery_delay_ms: Some(delay_ms.into()),
                        time_to_live_ms: ttl_ms.map(u64::from),
                        group_id: group.map(|g| format!("g{g}")),
                        persistent,
                        ..Default::default()
                    })
                    .collect();
                let (ids, fx) = match tx {
                    Some(t) => q.stage(SessionId(t.into()), batch, now).unwrap(),
                    None => q.send(batch, now).unwrap(),
                };
                prop_assert_eq!(ids.len(), count as usize);
                m.fire(now, &mut h, &mut e);
                for _ in 0..count {
                    let state = if delay_ms > 0 {
                        MessageState::Scheduled {
                            until_ms: now + u64::from(delay_ms),
                        }
                    } else {
                        MessageState::Ready
                    };
                    let msg = ModelMsg {
                        priority,
                        persistent,
                        deliver_at: (delay_ms > 0).then(|| now + u64::from(delay_ms)),
                        n,
                        group,
                        expires: ttl_ms.map(|t| now + u64::from(t)),
                        state,
                        count: 0,
                        lease_ms: 0,
                    };
                    match tx {
                        Some(t) => m
                            .staged
                            .entry(SessionId(t.into()))
                            .or_default()
                            .push((m.next_seq, msg)),
                        None => {
                            m.msgs.insert(m.next_seq, msg);
                            sent += 1;
                        }
                    }
                    m.next_seq += 1;
                }
                m.dispatch(now, &mut h);
                fx
            }
            Op::Receive {
                session,
                max,
                wait_ms,
                lease_ms,
                filter,
            } => {
                // A parked receiver of a paged queue may be handed fewer messages than it asked
                // for (never out of turn) where the model would give more; receivers that may
                // park ask for one there.
                let max = if budget.is_some() && wait_ms != Some(0) {
                    1
                } else {
                    max
                };
                let wait = Wait::from_timeout_ms(wait_ms.map(i64::from), now).unwrap();
                let owner = SessionId(session.into());
                let selector = filter.map(|f| {
                    Arc::new(Selector::parse(&f.text(), &SelectorLimits::default()).unwrap())
                });
                let req = ReceiveRequest {
                    owner: Some(owner),
                    max_messages: max.into(),
                    wait,
                    lease_ms: Some(lease_ms.into()),
                    selector,
                };
                let (out, fx) = unwrap_paged(q.receive_paged(req, &store, now));
                m.fire(now, &mut h, &mut e);
                let got = m.take(max.into(), owner, lease_ms.into(), filter, now);
                match out {
                    ReceiveOutcome::Delivered(d) => {
                        prop_assert_eq!(flatten(&d), got);
                        leases.extend(d.iter().map(Delivery::lease_ref));
                    }
                    ReceiveOutcome::Empty => {
                        prop_assert!(got.is_empty());
                        prop_assert!(
                            matches!(wait, Wait::NoWait)
                                || matches!(wait, Wait::Until(t) if t <= now)
                        );
                    }
                    ReceiveOutcome::Parked(id) => {
                        prop_assert!(got.is_empty());
                        let deadline = match wait {
                            Wait::Until(t) => Some(t),
                            _ => None,
                        };
                        prop_assert_eq!(id.0, m.next_waiter);
                        m.next_waiter += 1;
                        m.waiters.push(ModelWaiter {
                            id: id.0,
                            owner,
                            max: max.into(),
                            lease_ms: lease_ms.into(),
                            deadline,
                            filter,
                        });
                        parked.push(id);
                    }
                    ReceiveOutcome::NeedStore => {
                        prop_assert!(false, "receive_paged answers from the store");
                    }
                }
                fx
            }
            Op::Ack { pick } | Op::Nack { pick, .. } | Op::Extend { pick, .. }
                if leases.is_empty() =>
            {
                let _ = pick;
                q.tick(now)
            }
            Op::Ack { pick } => {
                let r = leases[pick % leases.len()];
                let (res, fx) = q.ack(Caller::Backend, &[r], now);
                m.fire(now, &mut h, &mut e);
                let live = matches!(m.msgs.get(&r.seq.0), Some(mm) if mm.count == r.delivery_count && matches!(mm.state, MessageState::Leased { lease, .. } if lease == r.lease));
                prop_assert_eq!(res[0].is_ok(), live);
                if live {
                    m.msgs.remove(&r.seq.0);
                    acked += 1;
                }
                m.dispatch(now, &mut h);
                fx
            }
            Op::Nack {
                pick,
                delay_ms,
                reject,
            } => {
                let r = leases[pick % leases.len()];
                let (res, fx) = q.nack(Caller::Backend, &[r], delay_ms.map(u64::from), reject, now);
                m.fire(now, &mut h, &mut e);
                let live = matches!(m.msgs.get(&r.seq.0), Some(mm) if mm.count == r.delivery_count && matches!(mm.state, MessageState::Leased { lease, .. } if lease == r.lease));
                prop_assert_eq!(res[0].is_ok(), live);
                if live && reject {
                    m.msgs.remove(&r.seq.0);
                    m.dead.push((r.seq.0, DeadLetterReason::Rejected));
                } else if live {
                    m.give_back(r.seq.0, delay_ms.map(u64::from), now);
                }
                m.dispatch(now, &mut h);
                fx
            }
            Op::Extend { pick, lease_ms } => {
                let r = leases[pick % leases.len()];
                let (res, fx) = q
                    .extend_lease(Caller::Backend, &[r], Some(lease_ms.into()), now)
                    .unwrap();
                m.fire(now, &mut h, &mut e);
                if let Some(mm) = m.msgs.get_mut(&r.seq.0) {
                    if let MessageState::Leased { lease, owner, .. } = mm.state {
                        if lease == r.lease && mm.count == r.delivery_count {
                            mm.state = MessageState::Leased {
                                lease,
                                owner,
                                until_ms: now + u64::from(lease_ms),
                            };
                            mm.lease_ms = lease_ms.into();
                            prop_assert_eq!(res[0].clone(), Ok(now + u64::from(lease_ms)));
                        }
                    }
                }
                m.dispatch(now, &mut h);
                fx
            }
            Op::Cancel { pick } => {
                if parked.is_empty() {
                    q.tick(now)
                } else {
                    let id = parked[pick % parked.len()];
                    let was = q.cancel_waiter(id);
                    let pos = m.waiters.iter().position(|w| w.id == id.0);
                    prop_assert_eq!(was, pos.is_some());
                    if let Some(pos) = pos {
                        m.waiters.remove(pos);
                    }
                    Effects::default()
                }
            }
            Op::CloseSession { session } => {
                let owner = SessionId(session.into());
                let (_, fx) = q.release_session(owner, now);
                m.fire(now, &mut h, &mut e);
                m.staged.remove(&owner);
                for seq in m.held_by(owner) {
                    m.give_back(seq, None, now);
                }
                m.groups.retain(|_, o| *o != owner);
                let (gone, keep): (Vec<ModelWaiter>, Vec<ModelWaiter>) =
                    std::mem::take(&mut m.waiters)
                        .into_iter()
                        .partition(|w| w.owner == owner);
                e.extend(gone.iter().map(|w| w.id));
                m.waiters = keep;
                m.dispatch(now, &mut h);
                fx
            }
            Op::Recover { session } | Op::Rollback { session } => {
                let owner = SessionId(session.into());
                let (released, fx) = if matches!(op, Op::Recover { .. }) {
                    q.recover_session(owner, now)
                } else {
                    m.staged.remove(&owner);
                    q.rollback(owner, now)
                };
                m.fire(now, &mut h, &mut e);
                let held = m.held_by(owner);
                prop_assert_eq!(released, held.len() as u64);
                for seq in held {
                    m.give_back(seq, None, now);
                }
                m.dispatch(now, &mut h);
                fx
            }
            Op::Heartbeat { session } => {
                let owner = SessionId(session.into());
                let (renewed, fx) = q.renew_session(owner, now);
                m.fire(now, &mut h, &mut e);
                let mut n = 0;
                for seq in m.held_by(owner) {
                    let mm = m.msgs.get_mut(&seq).unwrap();
                    if let MessageState::Leased {
                        lease,
                        owner: o,
                        until_ms,
                    } = mm.state
                    {
                        if now + mm.lease_ms > until_ms {
                            mm.state = MessageState::Leased {
                                lease,
                                owner: o,
                                until_ms: now + mm.lease_ms,
                            };
                            n += 1;
                        }
                    }
                }
                prop_assert_eq!(renewed, n);
                m.dispatch(now, &mut h);
                fx
            }
            Op::HeartbeatNamed { session, picks } => {
                let owner = SessionId(session.into());
                let mut named: Vec<(Seq, LeaseId)> = vec![];
                if !leases.is_empty() {
                    for p in picks {
                        let r = leases[p % leases.len()];
                        if !named.iter().any(|(s, _)| *s == r.seq) {
                            named.push((r.seq, r.lease));
                        }
                    }
                }
                let (renewed, fx) = q.renew_named(owner, &named, now);
                m.fire(now, &mut h, &mut e);
                let (mut n, mut gone) = (0, vec![]);
                for &(seq, lease) in &named {
                    let held = m.msgs.get_mut(&seq.0).and_then(|mm| match mm.state {
                        MessageState::Leased {
                            lease: l,
                            owner: o,
                            until_ms,
                        } if l == lease && o == Some(owner) => Some((mm, until_ms)),
                        _ => None,
                    });
                    let Some((mm, until_ms)) = held else {
                        gone.push((seq, lease));
                        continue;
                    };
                    if now + mm.lease_ms > until_ms {
                        mm.state = MessageState::Leased {
                            lease,
                            owner: Some(owner),
                            until_ms: now + mm.lease_ms,
                        };
                        n += 1;
                    }
                }
                prop_assert_eq!(renewed.renewed, n);
                prop_assert_eq!(renewed.not_held, gone);
                m.dispatch(now, &mut h);
                fx
            }
            Op::Commit { session, pick } => {
                let owner = SessionId(session.into());
                let acks: Vec<LeaseRef> = match pick {
                    Some(p) if !leases.is_empty() => vec![leases[p % leases.len()]],
                    _ => {
                        m.fire(now, &mut Handed::new(), &mut Vec::new());
                        let held = m.held_by(owner);
                        leases
                            .iter()
                            .copied()
                            .filter(|r| held.contains(&r.seq.0))
                            .filter(|r| m.msgs[&r.seq.0].count == r.delivery_count && matches!(m.msgs[&r.seq.0].state, MessageState::Leased { lease, .. } if lease == r.lease))
                            .collect()
                    }
                };
                let (result, fx) = q.commit(owner, &acks, now);
                m.fire(now, &mut h, &mut e);
                let valid = acks.iter().all(|r| {
                    matches!(m.msgs.get(&r.seq.0), Some(mm) if mm.count == r.delivery_count && matches!(mm.state, MessageState::Leased { lease, owner: Some(o), .. } if lease == r.lease && o == owner))
                });
                prop_assert_eq!(result.is_ok(), valid);
                if valid {
                    for r in &acks {
                        m.msgs.remove(&r.seq.0);
                        acked += 1;
                    }
                    for (seq, mut msg) in m.staged.remove(&owner).unwrap_or_default() {
                        // The delivery delay counts from the send, not the commit.
                        if matches!(msg.state, MessageState::Scheduled { until_ms } if until_ms <= now)
                        {
                            msg.state = MessageState::Ready;
                        }
                        m.msgs.insert(seq, msg);
                        sent += 1;
                    }
                }
                m.dispatch(now, &mut h);
                fx
            }
            Op::Advance { ms } => {
                now += u64::from(ms);
                let fx = q.tick(now);
                m.fire(now, &mut h, &mut e);
                fx
            }
            Op::Restart => {
                let mut fx = q.tick(now);
                m.fire(now, &mut h, &mut e);
                store.apply(&fx);
                store.land_deletes();
                let kept = fx.dead_letters.len();
                fx.handed.clear();
                fx.finished_empty.clear();
                h.clear();
                e.clear();
                // What the model forgets: non-persistent messages, leases, backoffs, groups,
                // parked receivers, staged sends.
                let lost = m.msgs.iter().filter(|(_, mm)| !mm.persistent).count() as u64;
                sent -= lost;
                m.msgs.retain(|_, mm| mm.persistent);
                for (&seq, mm) in m.msgs.iter_mut() {
                    mm.state = match mm.deliver_at {
                        Some(t) if t > now => MessageState::Scheduled { until_ms: t },
                        _ => MessageState::Ready,
                    };
                    if mm.count > MAX_REDELIVERIES {
                        limbo.insert(seq);
                    }
                }
                m.msgs.retain(|seq, _| !limbo.contains(seq));
                // Recovered messages whose time ran out while they were delivered are judged
                // as they come back.
                m.expire(now);
                m.staged.clear();
                m.groups.clear();
                m.waiters.clear();
                parked.clear();
                m.next_lease = 1;
                m.next_waiter = 1;
                m.next_seq = store.reserved.max(1);
                q = Queue::recover(
                    QueueName::new("model").unwrap(),
                    QueueUid(1),
                    config.clone(),
                    Seq(store.reserved),
                    vec![],
                    vec![],
                    now,
                );
                q.set_memory_budget(budget.unwrap_or(u64::MAX));
                for p in 0..=9u8 {
                    let (count, bytes) = store
                        .messages
                        .range((Reverse(p), 0)..=(Reverse(p), u64::MAX))
                        .fold((0, 0), |(c, b), (_, (msg, _))| {
                            (c + 1, b + msg.size_bytes())
                        });
                    q.restore_paged_out(Priority::new(p.into()).unwrap(), count, bytes);
                }
                // Delayed messages stay in memory: the store finds them by their delivery time.
                let delayed: Vec<RecoveredMessage> = store
                    .messages
                    .values()
                    .filter(|(msg, _)| msg.deliver_at_ms.is_some_and(|t| t > now))
                    .map(|e| store.recovered(e))
                    .collect();
                fx.merge(q.pull(delayed, now));
                debug_assert_eq!(kept, fx.dead_letters.len());
                fx
            }
        };
        let mut fx = fx;
        fill(&mut q, &mut store, &mut fx, now);
        q.check_invariants();
        prop_assert_eq!(kernel_handed(&fx), h.clone());
        let mut kernel_dead: Vec<(u64, DeadLetterReason)> = vec![];
        for d in &fx.dead_letters {
            let seq = d.message.seq.0;
            if limbo.remove(&seq) {
                prop_assert_eq!(d.reason, DeadLetterReason::MaxDeliveries);
                dead += 1;
            } else {
                kernel_dead.push((seq, d.reason));
            }
        }
        kernel_dead.sort_unstable_by_key(|d| d.0);
        let mut model_dead = std::mem::take(&mut m.dead);
        model_dead.sort_unstable_by_key(|d| d.0);
        prop_assert_eq!(&kernel_dead, &model_dead);
        dead += model_dead.len() as u64;
        // Which receivers ended matters, not the order they are reported in.
        let mut ended = ended_ids(&fx);
        ended.sort_unstable();
        e.sort_unstable();
        prop_assert_eq!(ended, e);
        for (_, d) in &fx.handed {
            leases.extend(d.iter().map(Delivery::lease_ref));
        }
        // Every message the model holds, the kernel holds in the same state with the same count;
        // a paged-out message is in the store, and the model has it Ready (or Scheduled by its
        // delivery delay, after a restart).
        let mut all: BTreeMap<u64, (MessageState, u32)> = q
            .browse(None, usize::MAX, None, usize::MAX)
            .0
            .into_iter()
            .map(|(msg, state, count)| (msg.seq.0, (state, count)))
            .collect();
        for ((Reverse(p), seq), (msg, count)) in &store.messages {
            if q.is_paged_out(Priority::new((*p).into()).unwrap(), Seq(*seq))
                && !limbo.contains(seq)
            {
                let state = match (m.msgs.get(seq).map(|mm| mm.state), msg.deliver_at_ms) {
                    (Some(s @ MessageState::Scheduled { until_ms }), Some(t)) if t == until_ms => s,
                    _ => MessageState::Ready,
                };
                prop_assert!(all.insert(*seq, (state, *count)).is_none());
            }
        }
        let model: BTreeMap<u64, (MessageState, u32)> = m
            .msgs
            .iter()
            .map(|(&s, mm)| (s, (mm.state, mm.count)))
            .collect();
        prop_assert_eq!(&all, &model);
        // Nothing is lost: every message sent is still in the queue, was acknowledged, or was
        // dead-lettered.
        prop_assert_eq!(sent, acked + dead + all.len() as u64 + limbo.len() as u64);
        prop_assert_eq!(
            q.stats().staged,
            m.staged.values().map(Vec::len).sum::<usize>() as u64
        );
        prop_assert_eq!(q.waiter_count(), m.waiters.len());
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]
    #[test]
    fn kernel_agrees_with_reference_model(ops in proptest::collection::vec(op(), 1..120)) {
        run(ops, None)?;
    }

    #[test]
    fn paging_is_invisible(
        ops in proptest::collection::vec(op(), 1..120),
        budget in prop_oneof![Just(0u64), 1..200u64],
    ) {
        run(ops, Some(budget))?;
    }
}
