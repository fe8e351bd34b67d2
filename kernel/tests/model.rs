//! Model-based test: random sequences of send / receive / ack / nack / cancel / close session /
//! extend lease / advance time, run against the kernel and against a deliberately naive reference
//! model (linear scans, no indexes). After every step both must agree on every message's state and
//! delivery count, on every answer, and the kernel's own invariants must hold.

#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::sync::Arc;

use ferry_kernel::{
    Delivery, Effects, LeaseId, LeaseRef, MessageState, NewMessage, Priority, PropertyValue, Queue,
    QueueConfig, QueueName, QueueUid, ReceiveOutcome, ReceiveRequest, Selector, SelectorLimits,
    SessionId, Wait, WaiterId,
};
use proptest::prelude::*;

#[derive(Debug, Clone)]
enum Op {
    Send {
        count: u8,
        priority: u8,
        delay_ms: u16,
        persistent: bool,
        /// Value of the int property `n` on every message of the batch.
        n: u8,
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
        delay_ms: u16,
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
    Advance {
        ms: u16,
    },
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
        3 => (1..4u8, 0..10u8, prop_oneof![Just(0u16), 1..300u16], any::<bool>(), 0..3u8)
            .prop_map(|(count, priority, delay_ms, persistent, n)| Op::Send { count, priority, delay_ms, persistent, n }),
        3 => (0..3u8, 1..4u8, proptest::option::of(0..400u16), 1..500u16, filter)
            .prop_map(|(session, max, wait_ms, lease_ms, filter)| Op::Receive { session, max, wait_ms, lease_ms, filter }),
        2 => any::<usize>().prop_map(|pick| Op::Ack { pick }),
        1 => (any::<usize>(), prop_oneof![Just(0u16), 1..200u16]).prop_map(|(pick, delay_ms)| Op::Nack { pick, delay_ms }),
        1 => (any::<usize>(), 1..500u16).prop_map(|(pick, lease_ms)| Op::Extend { pick, lease_ms }),
        1 => any::<usize>().prop_map(|pick| Op::Cancel { pick }),
        1 => (0..3u8).prop_map(|session| Op::CloseSession { session }),
        3 => (0..300u16).prop_map(|ms| Op::Advance { ms }),
    ]
}

#[derive(Debug, Clone, Copy, PartialEq)]
struct ModelMsg {
    priority: u8,
    n: u8,
    state: MessageState,
    count: u32,
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

    fn next_ready(&self, filter: Option<Filter>) -> Option<u64> {
        self.msgs
            .iter()
            .filter(|(_, m)| m.state == MessageState::Ready)
            .filter(|(_, m)| filter.is_none_or(|f| f.accepts(m.n)))
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
            let Some(seq) = self.next_ready(filter) else {
                break;
            };
            let lease = self.next_lease;
            self.next_lease += 1;
            let m = self.msgs.get_mut(&seq).unwrap();
            m.count += 1;
            m.state = MessageState::Leased {
                lease: LeaseId(lease),
                owner: Some(owner),
                until_ms: now + lease_ms,
            };
            out.push((seq, lease, m.count));
        }
        out
    }

    /// Oldest receiver first; one whose filter matches nothing keeps waiting.
    fn dispatch(&mut self, now: u64, handed: &mut Handed) {
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

    fn fire(&mut self, now: u64, handed: &mut Handed, ended: &mut Vec<u64>) {
        for m in self.msgs.values_mut() {
            match m.state {
                MessageState::Scheduled { until_ms } | MessageState::Leased { until_ms, .. }
                    if until_ms <= now =>
                {
                    m.state = MessageState::Ready
                }
                _ => {}
            }
        }
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

fn run(ops: Vec<Op>) -> Result<(), TestCaseError> {
    let mut q = Queue::new(
        QueueName::new("model").unwrap(),
        QueueUid(1),
        QueueConfig::default(),
    );
    let mut m = Model::new();
    let mut now = 1_000u64;
    // Deliveries handed out so far (live or stale) and parked waiters, for ops to pick from.
    let mut leases: Vec<LeaseRef> = vec![];
    let mut parked: Vec<WaiterId> = vec![];
    let mut acked = 0u64;
    let mut sent = 0u64;
    for op in ops {
        let (mut h, mut e) = (Handed::new(), Vec::new());
        let fx = match op {
            Op::Send {
                count,
                priority,
                delay_ms,
                persistent,
                n,
            } => {
                let batch = (0..count)
                    .map(|_| NewMessage {
                        properties: [("n".to_string(), PropertyValue::Int(n.into()))].into(),
                        priority: Priority::new(priority.into()).unwrap(),
                        delivery_delay_ms: Some(delay_ms.into()),
                        persistent,
                        ..Default::default()
                    })
                    .collect();
                let (ids, fx) = q.send(batch, now).unwrap();
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
                    m.msgs.insert(
                        m.next_seq,
                        ModelMsg {
                            priority,
                            n,
                            state,
                            count: 0,
                        },
                    );
                    m.next_seq += 1;
                    sent += 1;
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
                let (out, fx) = q.receive(req, now).unwrap();
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
                let (res, fx) = q.ack(&[r], now);
                m.fire(now, &mut h, &mut e);
                let live = matches!(m.msgs.get(&r.seq.0), Some(mm) if matches!(mm.state, MessageState::Leased { lease, .. } if lease == r.lease));
                prop_assert_eq!(res[0].is_ok(), live);
                if live {
                    m.msgs.remove(&r.seq.0);
                    acked += 1;
                }
                m.dispatch(now, &mut h);
                fx
            }
            Op::Nack { pick, delay_ms } => {
                let r = leases[pick % leases.len()];
                let (res, fx) = q.nack(&[r], Some(delay_ms.into()), now);
                m.fire(now, &mut h, &mut e);
                let live = matches!(m.msgs.get(&r.seq.0), Some(mm) if matches!(mm.state, MessageState::Leased { lease, .. } if lease == r.lease));
                prop_assert_eq!(res[0].is_ok(), live);
                if live {
                    m.msgs.get_mut(&r.seq.0).unwrap().state = if delay_ms > 0 {
                        MessageState::Scheduled {
                            until_ms: now + u64::from(delay_ms),
                        }
                    } else {
                        MessageState::Ready
                    };
                }
                m.dispatch(now, &mut h);
                fx
            }
            Op::Extend { pick, lease_ms } => {
                let r = leases[pick % leases.len()];
                let (res, fx) = q.extend_lease(&[r], Some(lease_ms.into()), now).unwrap();
                m.fire(now, &mut h, &mut e);
                if let Some(mm) = m.msgs.get_mut(&r.seq.0) {
                    if let MessageState::Leased { lease, owner, .. } = mm.state {
                        if lease == r.lease {
                            mm.state = MessageState::Leased {
                                lease,
                                owner,
                                until_ms: now + u64::from(lease_ms),
                            };
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
                for mm in m.msgs.values_mut() {
                    if matches!(mm.state, MessageState::Leased { owner: Some(o), .. } if o == owner)
                    {
                        mm.state = MessageState::Ready;
                    }
                }
                let (gone, keep): (Vec<ModelWaiter>, Vec<ModelWaiter>) =
                    std::mem::take(&mut m.waiters)
                        .into_iter()
                        .partition(|w| w.owner == owner);
                e.extend(gone.iter().map(|w| w.id));
                m.waiters = keep;
                m.dispatch(now, &mut h);
                fx
            }
            Op::Advance { ms } => {
                now += u64::from(ms);
                let fx = q.tick(now);
                m.fire(now, &mut h, &mut e);
                fx
            }
        };
        q.check_invariants();
        prop_assert_eq!(kernel_handed(&fx), h.clone());
        // Which receivers ended matters, not the order they are reported in.
        let mut ended = ended_ids(&fx);
        ended.sort_unstable();
        e.sort_unstable();
        prop_assert_eq!(ended, e);
        for (_, d) in &fx.handed {
            leases.extend(d.iter().map(Delivery::lease_ref));
        }
        // Every message the model holds, the kernel holds in the same state with the same count.
        let all: BTreeMap<u64, (MessageState, u32)> = q
            .browse(None, usize::MAX, None, usize::MAX)
            .0
            .into_iter()
            .map(|(msg, state, count)| (msg.seq.0, (state, count)))
            .collect();
        let model: BTreeMap<u64, (MessageState, u32)> = m
            .msgs
            .iter()
            .map(|(&s, mm)| (s, (mm.state, mm.count)))
            .collect();
        prop_assert_eq!(&all, &model);
        // Nothing is lost: every message sent is still in the queue or was acknowledged.
        prop_assert_eq!(sent, acked + all.len() as u64);
        prop_assert_eq!(q.waiter_count(), m.waiters.len());
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]
    #[test]
    fn kernel_agrees_with_reference_model(ops in proptest::collection::vec(op(), 1..120)) {
        run(ops)?;
    }
}
