//! A fake store for the kernel's paging tests.

#![allow(dead_code, clippy::unwrap_used)]

use std::cell::Cell;
use std::cmp::Reverse;
use std::collections::BTreeMap;
use std::convert::Infallible;

use std::sync::Arc;

use ferry_kernel::{
    Caller, Delivery, Effects, IndexedHeader, Message, NewMessage, Page, PageSource, PagedError,
    PersistOp, Priority, PropertyValue, Queue, QueueConfig, QueueName, QueueUid, ReceiveOutcome,
    ReceiveRequest, RecoveredMessage, RedeliveryPolicy, Selector, SelectorLimits, Seq, SessionId,
    Wait, WaiterId,
};

/// The store behind a queue in tests: writes applied as the test says, read in delivery order.
/// Messages at or above `visible_below` are written but not yet visible to reads (their write is
/// still on its way), unless it is `None`.
#[derive(Debug, Default)]
pub struct FakeStore {
    pub messages: BTreeMap<(Reverse<u8>, u64), (Message, u32)>,
    priority_of: BTreeMap<u64, u8>,
    pub reserved: u64,
    pub visible_below: Option<u64>,
    /// Deletes wait here until `land_deletes` (their write is on its way): reads still see the
    /// messages, as they may in the real store.
    pub lag_deletes: bool,
    late: Vec<PersistOp>,
    /// Page reads and header lookups made.
    pub page_reads: Cell<usize>,
    pub index_lookups: Cell<usize>,
}

impl FakeStore {
    pub fn apply(&mut self, fx: &Effects) {
        let deletes = fx.dead_letters.iter().filter_map(|d| d.delete.as_ref());
        let ops: Vec<PersistOp> = fx.persist.iter().chain(deletes).cloned().collect();
        for op in ops {
            let late = matches!(
                op,
                PersistOp::DeleteMessage(_) | PersistOp::DeleteStored { .. }
            );
            if late && self.lag_deletes {
                self.late.push(op);
            } else {
                self.apply_op(&op);
            }
        }
    }

    /// The deletes on their way land.
    pub fn land_deletes(&mut self) {
        for op in std::mem::take(&mut self.late) {
            self.apply_op(&op);
        }
    }

    fn apply_op(&mut self, op: &PersistOp) {
        {
            match op {
                PersistOp::PutMessage(m) => {
                    let p = m.priority.get();
                    self.messages
                        .insert((Reverse(p), m.seq.0), ((**m).clone(), 0));
                    self.priority_of.insert(m.seq.0, p);
                }
                PersistOp::DeleteMessage(m) => {
                    self.messages.remove(&(Reverse(m.priority.get()), m.seq.0));
                    self.priority_of.remove(&m.seq.0);
                }
                PersistOp::DeleteStored {
                    priority, from, to, ..
                } => {
                    let p = priority.get();
                    let doomed: Vec<u64> = self
                        .messages
                        .range((Reverse(p), from.0)..(Reverse(p), to.0))
                        .map(|(&(_, s), _)| s)
                        .collect();
                    for s in doomed {
                        self.messages.remove(&(Reverse(p), s));
                        self.priority_of.remove(&s);
                    }
                }
                PersistOp::SetDeliveryCount { seq, count }
                | PersistOp::MarkDelivery { seq, count, .. } => {
                    if let Some(p) = self.priority_of.get(&seq.0) {
                        if let Some(e) = self.messages.get_mut(&(Reverse(*p), seq.0)) {
                            e.1 = *count;
                        }
                    }
                }
                PersistOp::ReserveSeq { until } => self.reserved = until.0,
                PersistOp::PutDedup(_) | PersistOp::DeleteDedup { .. } => {}
            }
        }
    }

    fn visible(&self, seq: u64) -> bool {
        self.visible_below.is_none_or(|v| seq < v)
    }

    pub fn recovered(&self, (m, count): &(Message, u32)) -> RecoveredMessage {
        RecoveredMessage {
            message: m.clone(),
            delivery_count: *count,
            mark: None,
        }
    }
}

impl PageSource for FakeStore {
    type Error = Infallible;

    fn read_page(
        &self,
        p: Priority,
        from: Seq,
        max_count: usize,
        max_bytes: u64,
    ) -> Result<Page, Infallible> {
        self.page_reads.set(self.page_reads.get() + 1);
        let p = p.get();
        let mut page = Page {
            next: from,
            ..Page::default()
        };
        let mut bytes = 0;
        let mut it = self
            .messages
            .range((Reverse(p), from.0)..=(Reverse(p), u64::MAX))
            .peekable();
        while let Some((&(_, seq), e)) = it.peek() {
            if !self.visible(seq) {
                break;
            }
            if page.messages.len() >= max_count || (bytes >= max_bytes && !page.messages.is_empty())
            {
                break;
            }
            bytes += e.0.size_bytes();
            page.messages.push(self.recovered(e));
            page.next = Seq(seq + 1);
            it.next();
        }
        page.end = it.peek().is_none_or(|(&(_, seq), _)| !self.visible(seq));
        Ok(page)
    }

    fn settled(&self) -> bool {
        self.visible_below.is_none()
    }

    fn find_by_header(
        &self,
        header: IndexedHeader,
        value: &str,
        max: usize,
    ) -> Result<Vec<(Priority, Seq)>, Infallible> {
        self.index_lookups.set(self.index_lookups.get() + 1);
        Ok(self
            .messages
            .iter()
            .filter(|(&(_, s), (m, _))| self.visible(s) && header.value_of(m) == Some(value))
            .map(|(&(Reverse(p), s), _)| (Priority::new(p.into()).unwrap(), Seq(s)))
            .take(max)
            .collect())
    }

    fn read_messages(&self, keys: &[(Priority, Seq)]) -> Result<Vec<RecoveredMessage>, Infallible> {
        Ok(keys
            .iter()
            .filter(|(_, s)| self.visible(s.0))
            .filter_map(|(p, s)| self.messages.get(&(Reverse(p.get()), s.0)))
            .map(|e| self.recovered(e))
            .collect())
    }
}

// Helpers of the paging tests (`paging.rs`, `paging_review.rs`).

pub const T0: u64 = 1_000_000;

pub fn queue(budget: u64) -> Queue {
    let mut q = Queue::new(
        QueueName::new("paged").unwrap(),
        QueueUid(7),
        QueueConfig {
            redelivery: RedeliveryPolicy {
                initial_delay_ms: 0,
                delay_ms: 0,
                max_redeliveries: None,
                ..RedeliveryPolicy::default()
            },
            ..QueueConfig::default()
        },
    );
    q.set_memory_budget(budget);
    q
}

pub fn msg(i: u64) -> NewMessage {
    NewMessage {
        body: format!("m{i}").into_bytes(),
        properties: [("i".to_string(), PropertyValue::Long(i as i64))].into(),
        persistent: true,
        ..NewMessage::default()
    }
}

/// A message with the int property `n`, a body naming it, at priority 4.
pub fn nmsg(name: &str, n: i32, group: Option<&str>, persistent: bool) -> NewMessage {
    NewMessage {
        body: name.as_bytes().to_vec(),
        properties: [("n".to_string(), PropertyValue::Int(n))].into(),
        group_id: group.map(str::to_owned),
        persistent,
        ..NewMessage::default()
    }
}

/// Applies the effects and lets the queue fill its window; returns what parked receivers got.
pub fn settle(
    q: &mut Queue,
    store: &mut FakeStore,
    fx: Effects,
    now: u64,
) -> Vec<(WaiterId, Vec<Delivery>)> {
    fill_until_quiet(q, store, fx, now, 64, false)
}

/// As `settle`, but as the server's owner task does it (`QueueActor::fill`): the kernel's fill
/// is only called while it has paging work.
pub fn settle_like_shell(
    q: &mut Queue,
    store: &mut FakeStore,
    fx: Effects,
    now: u64,
) -> Vec<(WaiterId, Vec<Delivery>)> {
    fill_until_quiet(q, store, fx, now, 16, true)
}

/// Applies `fx`, then fills (at most `max_reads` page reads each time) until a fill does
/// nothing, or, `only_while_paging`, until the queue has no paging work.
fn fill_until_quiet(
    q: &mut Queue,
    store: &mut FakeStore,
    fx: Effects,
    now: u64,
    max_reads: usize,
    only_while_paging: bool,
) -> Vec<(WaiterId, Vec<Delivery>)> {
    let mut handed = fx.handed.clone();
    store.apply(&fx);
    loop {
        if only_while_paging && !q.paging_active() {
            q.check_invariants();
            return handed;
        }
        let more = q.fill(&*store, max_reads, now).unwrap();
        store.apply(&more);
        handed.extend(more.handed.iter().cloned());
        if more.is_empty() {
            q.check_invariants();
            return handed;
        }
    }
}

pub fn send(q: &mut Queue, store: &mut FakeStore, batch: Vec<NewMessage>, now: u64) {
    let (_, fx) = q.send(batch, now).unwrap();
    settle(q, store, fx, now);
}

pub fn selector(s: &str) -> Arc<Selector> {
    Arc::new(Selector::parse(s, &SelectorLimits::default()).unwrap())
}

pub fn req(session: u64, max: u32, sel: Option<&str>) -> ReceiveRequest {
    ReceiveRequest {
        owner: Some(SessionId(session)),
        max_messages: max,
        wait: Wait::NoWait,
        lease_ms: Some(60_000),
        selector: sel.map(selector),
    }
}

pub fn receive_out(
    q: &mut Queue,
    store: &FakeStore,
    r: ReceiveRequest,
    now: u64,
) -> (ReceiveOutcome, Effects) {
    match q.receive_paged(r, store, now) {
        Ok(v) => v,
        Err(PagedError::Kernel(e)) => panic!("{e}"),
        Err(PagedError::Source(never)) => match never {},
    }
}

pub fn receive(q: &mut Queue, store: &mut FakeStore, r: ReceiveRequest, now: u64) -> Vec<Delivery> {
    let (out, fx) = receive_out(q, store, r, now);
    settle(q, store, fx, now);
    match out {
        ReceiveOutcome::Delivered(d) => d,
        ReceiveOutcome::Empty | ReceiveOutcome::Parked(_) => vec![],
        ReceiveOutcome::NeedStore => panic!("receive_paged answers from the store"),
    }
}

pub fn body(d: &Delivery) -> String {
    String::from_utf8(d.message.body.to_vec()).unwrap()
}

pub fn bodies(d: &[Delivery]) -> Vec<String> {
    d.iter().map(body).collect()
}

// Postmortem: a receive whose look into the store stopped at SCAN_LOOK_MAX answered from memory
// as if the store had been read whole (`store_checked`), so a newer resident message overtook an
// older paged-out one of the same priority that the look had not reached.

pub fn ack(q: &mut Queue, store: &mut FakeStore, d: &[Delivery], now: u64) {
    let refs: Vec<_> = d.iter().map(Delivery::lease_ref).collect();
    let (results, fx) = q.ack(Caller::Backend, &refs, now);
    assert!(results.iter().all(Result::is_ok), "{results:?}");
    settle(q, store, fx, now);
}
