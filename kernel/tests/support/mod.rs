//! A fake store for the kernel's paging tests.

#![allow(dead_code, clippy::unwrap_used)]

use std::cell::Cell;
use std::cmp::Reverse;
use std::collections::BTreeMap;
use std::convert::Infallible;

use ferry_kernel::{
    Effects, IndexedHeader, Message, Page, PageSource, PersistOp, Priority, RecoveredMessage, Seq,
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
                PersistOp::SetDeliveryCount { seq, count } => {
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
