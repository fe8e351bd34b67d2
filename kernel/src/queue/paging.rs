//! Paging: queues larger than memory.
//!
//! Only a window of a queue lives in memory (its *resident* messages); the rest are *paged out*:
//! durable in the store, counted here, not held. The store keeps each queue's messages in
//! delivery order (priority high first, then sequence), so each priority is a run the shell reads
//! from a *cursor*:
//!
//! - A persistent send goes to the store only (paged out) when its priority already has paged-out
//!   messages, or when the queue's memory budget is full — unless a parked receiver takes it at
//!   once. Everything else (non-persistent messages, committed transactions, returned deliveries)
//!   stays resident.
//! - Within one priority, every paged-out message comes after every resident one that was paged in
//!   by the cursor; a message brought in out of turn (by a selector's scan, an index lookup, a
//!   parked receiver, a commit) is remembered as *pulled*, so when the cursor reaches it the read
//!   skips it. This is an exact record of what is already known, not a guess: a page read never
//!   judges a message a duplicate because it merely looks familiar, and never skips one it has
//!   not seen (the ActiveMQ 5.1 failure).
//! - The cursor moves only over what the shell has read. The shell never reads past a write that
//!   may not be applied yet ([`Queue::page_in`] takes the position the read reached).
//! - A receive that cannot be decided from memory (nothing suitable is resident, or a higher
//!   priority is paged out) answers [`ReceiveOutcome::NeedStore`]; the shell brings candidates in
//!   with [`Queue::pull`] and asks again with [`Queue::receive_scanned`].
//!
//! [`ReceiveOutcome::NeedStore`]: super::ReceiveOutcome::NeedStore

use std::collections::BTreeSet;

use super::{
    Effects, MessageState, PersistOp, Queue, ReceiveOutcome, ReceiveRequest, RecoveredMessage,
};
use crate::error::KernelError;
use crate::selector::IndexedHeader;
use crate::types::{Message, Priority, Seq};

/// How many messages one page read may bring in at most.
pub(crate) const PAGE_MAX_COUNT: usize = 1_000;
/// How many messages a priority with nothing deliverable in memory may bring in although the
/// budget is full (so a full budget can never hide a higher priority or stall a drained one).
pub(crate) const PAGE_MIN_COUNT: usize = 16;

/// How many messages a scan for a receiver reads from the store at a time.
pub const SCAN_CHUNK: usize = 1_000;
/// How many paged-out messages one receive (or one fill's look for parked receivers) examines
/// at most: a selective receiver behind a long run of messages it does not match cannot hold the
/// queue up. A receive that waits keeps looking, chunk by chunk, in later fills; and each
/// selector remembers how far the store holds nothing for it.
pub const SCAN_LOOK_MAX: usize = 20_000;
/// Selectors whose "nothing for me before here" positions are remembered.
const SCAN_MEMO_MAX: usize = 64;

/// What a look for a receiver found: the messages it would take, how far each priority was
/// looked at, and whether the look stopped at its limit.
type Look = (
    Vec<RecoveredMessage>,
    [Seq; Priority::MAX as usize + 1],
    bool,
);

/// One read of a priority's run in the store.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Page {
    /// In sequence order, with their delivery counts.
    pub messages: Vec<RecoveredMessage>,
    /// Where the read stopped: the next read of this priority starts here.
    pub next: Seq,
    /// No message of this priority at or after `next`, among the writes the source can see.
    pub end: bool,
}

/// The store as paging reads it: synchronous and read-only. The shell implements it over its
/// store, bounded to the writes it knows are applied (a read must never run ahead of a write
/// still on its way, or the cursor would step over a message). The kernel only reads through
/// it; it still writes nothing and waits for nothing.
pub trait PageSource {
    type Error;

    /// Messages of priority `p` from `from` on, in sequence order: at most `max_count`, and
    /// stopping after the one that reaches `max_bytes` (at least one if there is one).
    fn read_page(
        &self,
        p: Priority,
        from: Seq,
        max_count: usize,
        max_bytes: u64,
    ) -> Result<Page, Self::Error>;

    /// Whether every write the queue has asked for is applied, so that a read's `end` is the
    /// truth and not only what the source can see yet.
    fn settled(&self) -> bool;

    /// The (priority, seq) of messages whose `header` equals `value`, in delivery order, at most
    /// `max`. May name messages that are gone; [`PageSource::read_messages`] skips those.
    fn find_by_header(
        &self,
        header: IndexedHeader,
        value: &str,
        max: usize,
    ) -> Result<Vec<(Priority, Seq)>, Self::Error>;

    /// The messages at these keys that exist, with their delivery counts.
    fn read_messages(&self, keys: &[(Priority, Seq)])
        -> Result<Vec<RecoveredMessage>, Self::Error>;
}

/// Why a paged receive failed: the queue refused it, or the store could not be read.
#[derive(Debug, Clone, PartialEq)]
pub enum PagedError<E> {
    Kernel(KernelError),
    Source(E),
}

impl<E> From<KernelError> for PagedError<E> {
    fn from(e: KernelError) -> Self {
        PagedError::Kernel(e)
    }
}

/// What to read from the store next: messages of `priority` from `from` on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct PageRequest {
    priority: Priority,
    from: Seq,
    max_count: usize,
    max_bytes: u64,
}

/// One priority's paged-out run.
#[derive(Debug, Default, Clone)]
pub(crate) struct Level {
    /// Paged-out messages (in the store, not in memory) and their bytes.
    pub(crate) count: u64,
    pub(crate) bytes: u64,
    /// Where the next page read starts; every paged-out message is at or after it.
    pub(crate) cursor: Seq,
    /// Messages at or after `cursor` already brought in (or brought in and since removed).
    pub(crate) pulled: BTreeSet<Seq>,
    /// Resident messages of this priority that are Ready.
    pub(crate) ready: u64,
}

#[derive(Debug)]
pub(crate) struct Paging {
    /// Bytes of resident messages the queue aims to stay under (`u64::MAX`: never page out).
    pub(crate) budget_bytes: u64,
    pub(crate) levels: [Level; Priority::MAX as usize + 1],
    /// Set while a receive or a hand-out runs after a look into the store: per priority, up to
    /// where the paged-out messages were looked at (`Seq(u64::MAX)`: all of them). A resident
    /// message may go out only if nothing paged out that was not looked at comes before it.
    pub(crate) checked: Option<[Seq; Priority::MAX as usize + 1]>,
    /// Parked receivers may have messages in the store, per priority: from where to look and
    /// up to which sequence number the look must reach before it counts as done.
    pub(crate) rescan: [Option<(Seq, Seq)>; Priority::MAX as usize + 1],
    /// Per selector text, per priority: every paged-out message below this position fails the
    /// selector. Paged-out messages never change (their delivery count is fixed while they are
    /// out), and new ones come after, so this stays true.
    /// Keyed by the receiver's session and selector, valid while no group changes hands (the
    /// epoch): every paged-out message below the position is one it would not take.
    pub(crate) scan_memo:
        std::collections::HashMap<String, (u64, [Seq; Priority::MAX as usize + 1])>,
    /// The last look for parked receivers stopped at its limit: the next fill should come soon.
    pub(crate) rescan_more: bool,
    /// Where the last scan for a receiver took every message from a priority's cursor on: once
    /// those are pulled, the cursor moves past them (so later reads do not walk them again).
    pub(crate) contiguous: [Option<Seq>; Priority::MAX as usize + 1],
}

impl Default for Paging {
    fn default() -> Self {
        Self {
            budget_bytes: u64::MAX,
            levels: Default::default(),
            checked: None,
            rescan: [None; Priority::MAX as usize + 1],
            scan_memo: std::collections::HashMap::new(),
            rescan_more: false,
            contiguous: Default::default(),
        }
    }
}

impl Paging {
    pub(crate) fn level(&self, p: Priority) -> &Level {
        &self.levels[usize::from(p.get())]
    }

    pub(crate) fn level_mut(&mut self, p: Priority) -> &mut Level {
        &mut self.levels[usize::from(p.get())]
    }

    /// Parked receivers must look at priority `p` of the store from `from` until they have seen
    /// `until`.
    pub(crate) fn flag_rescan(&mut self, p: Priority, from: Seq, until: Seq) {
        let slot = &mut self.rescan[usize::from(p.get())];
        *slot = Some(match *slot {
            Some((f, u)) => (f.min(from), u.max(until)),
            None => (from, until),
        });
    }

    /// Every paged-out priority must be looked at again, up to `until`.
    pub(crate) fn flag_rescan_all(&mut self, until: Seq) {
        for p in 0..=usize::from(Priority::MAX) {
            if self.levels[p].count > 0 {
                let cursor = self.levels[p].cursor;
                self.flag_rescan(priority(p), cursor, until);
            }
        }
    }

    pub(crate) fn paged_out(&self) -> (u64, u64) {
        self.levels
            .iter()
            .fold((0, 0), |(c, b), l| (c + l.count, b + l.bytes))
    }

    /// The highest priority with paged-out messages.
    pub(crate) fn top(&self) -> Option<Priority> {
        (0..=Priority::MAX)
            .rev()
            .find(|&p| self.levels[usize::from(p)].count > 0)
            .and_then(|p| Priority::new(p.into()).ok())
    }
}

fn priority(p: usize) -> Priority {
    Priority::new(p as u32).expect("invariant: level index is a priority")
}

impl Queue {
    /// Sets the bytes of resident messages this queue aims to stay under. Persistent sends past it
    /// are paged out; lowering it pages nothing out that is already resident.
    pub fn set_memory_budget(&mut self, bytes: u64) {
        self.paging.budget_bytes = bytes;
    }

    /// Sets the bytes in memory (resident and staged) past which a send that can only live in
    /// memory (non-persistent, or staged in a transaction) is refused with `QueueFull`. Persistent
    /// sends are never refused by it: past the memory budget they go to the store. No limit
    /// until set.
    pub fn set_pinned_budget(&mut self, bytes: u64) {
        self.pinned_budget_bytes = bytes;
    }

    /// Whether parked receivers' look into the store stopped at its limit with more to see: the
    /// shell should fill again soon even if nothing else happens.
    pub fn more_to_look_at(&self) -> bool {
        self.paging.rescan_more
            && !self.waiters.is_empty()
            && self.paging.rescan.iter().any(Option::is_some)
    }

    /// Whether the queue has paging work the shell should let it do ([`Queue::fill`]): messages
    /// paged out, or parked receivers still to be looked for in the store.
    pub fn paging_active(&self) -> bool {
        self.paging.top().is_some() || self.paging.rescan.iter().any(Option::is_some)
    }

    /// The sequence number the next message will get: every message sent so far is below it.
    pub fn next_seq(&self) -> Seq {
        self.next_seq
    }

    /// Bytes of the messages held in memory.
    pub fn resident_bytes(&self) -> u64 {
        self.bytes
    }

    /// Messages (and their bytes) in the store only.
    pub fn paged_out(&self) -> (u64, u64) {
        self.paging.paged_out()
    }

    /// After recovery: the store holds `count` messages (`bytes`) of priority `p`, none resident.
    pub fn restore_paged_out(&mut self, p: Priority, count: u64, bytes: u64) {
        let level = self.paging.level_mut(p);
        level.count = count;
        level.bytes = bytes;
        level.cursor = Seq(0);
        level.pulled.clear();
    }

    /// Priorities with paged-out messages, highest first, with where their run starts.
    pub fn paged_levels(&self) -> Vec<(Priority, Seq)> {
        (0..=usize::from(Priority::MAX))
            .rev()
            .filter(|&p| self.paging.levels[p].count > 0)
            .map(|p| (priority(p), self.paging.levels[p].cursor))
            .collect()
    }

    /// Whether a message read from the store is new to the queue: paged out, not already brought
    /// in (a read may still see a message whose delete is not applied yet).
    pub fn is_paged_out(&self, p: Priority, seq: Seq) -> bool {
        let level = self.paging.level(p);
        level.count > 0
            && seq >= level.cursor
            && !level.pulled.contains(&seq)
            && !self.entries.contains_key(&seq)
    }

    /// Takes a page the shell read for `p`: `messages` in sequence order, and `next`, the
    /// position the read reached (every message of `p` in `[cursor, next)` is in `messages` or
    /// was already known). `settled` says the read saw every write the queue ever asked for and
    /// found nothing of `p` at or after `next`; if the queue still counts paged-out messages of
    /// `p` then, its count was wrong and is corrected .
    pub(crate) fn page_in(
        &mut self,
        p: Priority,
        messages: Vec<RecoveredMessage>,
        next: Seq,
        settled: bool,
        now_ms: u64,
    ) -> Effects {
        // Brought in first, then time runs and receivers are served: a parked receiver is
        // handed the best message, not whatever was resident.
        let mut effects = Effects::default();
        self.now_ms = self.now_ms.max(now_ms);
        let level = self.paging.level_mut(p);
        let old_cursor = level.cursor;
        level.cursor = level.cursor.max(next);
        let cursor = level.cursor;
        for m in messages {
            let seq = m.message.seq;
            let level = self.paging.level(p);
            if seq < old_cursor
                || seq >= cursor
                || level.pulled.contains(&seq)
                || self.entries.contains_key(&seq)
                || m.message.priority != p
            {
                continue;
            }
            self.bring_in(m, now_ms, &mut effects);
        }
        let level = self.paging.level_mut(p);
        level.pulled = level.pulled.split_off(&cursor);
        if settled && level.count > 0 {
            level.count = 0;
            level.bytes = 0;
        }
        self.settle_level(p);
        self.fire_due(now_ms, &mut effects);
        effects
    }

    /// Brings in messages found in the store out of turn (by a scan for a receiver, an index
    /// lookup, a lookup by id). Messages not paged out any more are ignored.
    pub fn pull(&mut self, messages: Vec<RecoveredMessage>, now_ms: u64) -> Effects {
        let mut effects = Effects::default();
        self.now_ms = self.now_ms.max(now_ms);
        for m in messages {
            let p = m.message.priority;
            if !self.is_paged_out(p, m.message.seq) {
                continue;
            }
            self.paging.level_mut(p).pulled.insert(m.message.seq);
            self.bring_in(m, now_ms, &mut effects);
            self.settle_level(p);
        }
        self.fire_due(now_ms, &mut effects);
        effects
    }

    /// Whether `req` would take this paged-out message now: it is due, deliverable (not expired,
    /// deliveries not exhausted: those are dead-lettered when paged in), its group is free or the
    /// receiver's, and the selector matches.
    pub fn would_take(
        &self,
        req: &ReceiveRequest,
        m: &Message,
        delivery_count: u32,
        now_ms: u64,
    ) -> bool {
        self.deliverable_now(m, delivery_count, now_ms)
            && self.groups.may_take(m.group_id.as_deref(), req.owner)
            && req
                .selector
                .as_deref()
                .is_none_or(|s| s.matches(m, delivery_count + 1))
    }

    /// Whether some parked receiver would take this paged-out message now.
    pub fn a_waiter_takes(&self, m: &Message, delivery_count: u32, now_ms: u64) -> bool {
        self.deliverable_now(m, delivery_count, now_ms)
            && self
                .waiters
                .values()
                .any(|w| self.waiter_takes(w, m, delivery_count))
    }

    fn waiter_takes(&self, w: &super::receive::Waiter, m: &Message, delivery_count: u32) -> bool {
        self.groups.may_take(m.group_id.as_deref(), w.owner)
            && w.selector
                .as_deref()
                .is_none_or(|s| s.matches(m, delivery_count + 1))
    }

    fn deliverable_now(&self, m: &Message, delivery_count: u32, now_ms: u64) -> bool {
        m.deliver_at_ms.is_none_or(|t| t <= now_ms)
            && !m.is_expired(now_ms)
            && !self.config.redelivery.exhausted(delivery_count)
    }

    /// [`Queue::receive`] after a look into the store for this receiver reached `checked` (per
    /// priority; `Seq(u64::MAX)`: all): resident messages that nothing unlooked-at comes before
    /// are all there is to choose from.
    fn receive_scanned(
        &mut self,
        req: ReceiveRequest,
        checked: [Seq; Priority::MAX as usize + 1],
        now_ms: u64,
    ) -> Result<(super::ReceiveOutcome, Effects), KernelError> {
        self.paging.checked = Some(checked);
        let out = self.receive(req, now_ms);
        self.paging.checked = None;
        out
    }

    /// Fills the window from `src`: page reads while `page_request` asks for one and
    /// reads make progress (at most `max_reads`), then a look for parked receivers that may have
    /// messages in the store. If a read fails, what was done before it is kept for the next
    /// operation (see `deferred`) and the error is returned.
    pub fn fill<S: PageSource>(
        &mut self,
        src: &S,
        max_reads: usize,
        now_ms: u64,
    ) -> Result<Effects, S::Error> {
        let mut effects = Effects::default();
        let mut stuck = 0u16;
        for _ in 0..max_reads {
            let Some(r) = self.page_request(stuck) else {
                break;
            };
            let page = match src.read_page(r.priority, r.from, r.max_count, r.max_bytes) {
                Ok(page) => page,
                Err(e) => return Err(self.defer(effects, e)),
            };
            let progress = !page.messages.is_empty() || page.next > r.from;
            let settled = page.end && src.settled();
            effects.merge(self.page_in(r.priority, page.messages, page.next, settled, now_ms));
            if !progress || page.end {
                // Nothing more to see there until a write lands.
                stuck |= 1 << r.priority.get();
            }
        }
        if self.waiters.is_empty() {
            self.paging.rescan = Default::default();
        } else if self.paging.rescan.iter().any(Option::is_some) {
            match self.rescan_for_waiters(src, now_ms) {
                Ok(more) => effects.merge(more),
                Err(e) => return Err(self.defer(effects, e)),
            }
        }
        Ok(effects)
    }

    /// Keeps `effects` for the next operation (due at once) and passes the error on.
    fn defer<E>(&mut self, effects: Effects, e: E) -> E {
        self.deferred.merge(effects);
        e
    }

    /// Looks in the store for messages parked receivers take: where sends they would take were
    /// paged out, or everywhere after groups changed hands, or after a receiver parked before
    /// the store had applied every write or before its own look was done. A flag stays until the
    /// look has seen its last sequence number (that is, until the write of it is applied), and
    /// the look goes on from where it stopped.
    fn rescan_for_waiters<S: PageSource>(
        &mut self,
        src: &S,
        now_ms: u64,
    ) -> Result<Effects, S::Error> {
        let starts: Vec<(Priority, Seq)> = (0..=usize::from(Priority::MAX))
            .rev()
            .filter_map(|p| {
                let (from, _) = self.paging.rescan[p]?;
                let cursor = self.paging.levels[p].cursor;
                Some((priority(p), from.max(cursor)))
            })
            .collect();
        // Each receiver's best candidates, as many as it asked for: then handing them out
        // cannot give anyone a worse message than one still in the store.
        let mut wants: Vec<(super::WaiterId, u32)> = self
            .waiters
            .iter()
            .map(|(&id, w)| (id, w.max_messages))
            .collect();
        let (found, reached) = self.scan_from(src, &starts, SCAN_LOOK_MAX, |q, m, count| {
            let mut take = false;
            if q.deliverable_now(m, count, now_ms) {
                // Counted for one receiver: the oldest that still wants one and takes it.
                if let Some((_, left)) = wants.iter_mut().find(|(id, left)| {
                    *left > 0
                        && q.waiters
                            .get(id)
                            .is_some_and(|w| q.waiter_takes(w, m, count))
                }) {
                    *left -= 1;
                    take = true;
                }
            }
            (take, wants.iter().all(|&(_, left)| left == 0))
        })?;
        // Levels not flagged were looked at when their receivers parked.
        let mut checked = [Seq(u64::MAX); Priority::MAX as usize + 1];
        for &(p, from) in &starts {
            checked[usize::from(p.get())] = from;
        }
        let mut stopped_satisfied = vec![];
        for &(p, next, end, satisfied, _) in &reached {
            let i = usize::from(p.get());
            checked[i] = if end { Seq(u64::MAX) } else { next };
            let slot = &mut self.paging.rescan[i];
            if slot.is_some_and(|(_, until)| next > until || (end && src.settled())) {
                *slot = None;
            } else if let Some((from, until)) = *slot {
                // Looked up to `next`: the next look goes on from there.
                *slot = Some((from.max(next), until));
                if satisfied {
                    stopped_satisfied.push(i);
                }
            }
        }
        self.paging.rescan_more = reached.iter().any(|r| r.4);
        // Hand out now, each receiver only what nothing unlooked-at comes before; what was not
        // looked at yet is flagged still.
        let pending = std::mem::take(&mut self.paging.rescan);
        self.paging.checked = Some(checked);
        let effects = self.pull(found, now_ms);
        self.paging.checked = None;
        self.paging.rescan = pending;
        if self.waiters.is_empty() {
            self.paging.rescan = Default::default();
        } else if !stopped_satisfied.is_empty() {
            // Every receiver had candidates, but a hand-out can change who may take what (a
            // group goes to one of them): the ones still parked look on soon.
            self.paging.rescan_more = true;
        }
        Ok(effects)
    }

    /// [`Queue::receive`] on a queue that may be paged out: when memory alone cannot answer,
    /// the messages this receiver should get first are found in `src` (through the header index
    /// when its selector asks for one correlation id or group, else by a scan in chunks of
    /// [`SCAN_CHUNK`], in delivery order, holding only what matches), pulled in, and the receive
    /// is answered from memory. If a read fails, what time did is kept for the next operation.
    pub fn receive_paged<S: PageSource>(
        &mut self,
        req: ReceiveRequest,
        src: &S,
        now_ms: u64,
    ) -> Result<(ReceiveOutcome, Effects), PagedError<S::Error>> {
        let (out, mut effects) = self.receive(req.clone(), now_ms)?;
        if out != ReceiveOutcome::NeedStore {
            return Ok((out, effects));
        }
        let looked = match self.look_for_receiver(src, &req, now_ms) {
            Ok(looked) => looked,
            Err(e) => return Err(PagedError::Source(self.defer(effects, e))),
        };
        let (found, checked, short) = looked;
        effects.merge(self.pull(found, now_ms));
        self.advance_cursors();
        let (out, more) = self.receive_scanned(req, checked, now_ms)?;
        effects.merge(more);
        if matches!(out, ReceiveOutcome::Parked(_)) && (short || !src.settled()) {
            // The store may hold more for this receiver than this look saw (not every write is
            // applied yet, or it stopped at its limit): look on in later fills, before a newer
            // message can reach it ahead of an older one.
            for (i, c) in checked.iter().enumerate() {
                let level = &self.paging.levels[i];
                if level.count > 0 {
                    let from = if *c == Seq(u64::MAX) || !short {
                        level.cursor
                    } else {
                        level.cursor.max(*c)
                    };
                    self.paging.flag_rescan(
                        priority(i),
                        from,
                        Seq(self.next_seq.0.saturating_sub(1)),
                    );
                }
            }
            self.paging.rescan_more |= short;
        }
        Ok((out, effects))
    }

    /// Finds the paged-out messages `req` should get first: through the header index when its
    /// selector names one correlation id or group (complete, so everything counts as looked
    /// at), else by [`Queue::scan_for_receiver`]. Returns them, how far each priority was looked
    /// at, and whether the look stopped at its limit.
    fn look_for_receiver<S: PageSource>(
        &mut self,
        src: &S,
        req: &ReceiveRequest,
        now_ms: u64,
    ) -> Result<Look, S::Error> {
        let max = req.max_messages as usize;
        let indexed = req
            .selector
            .as_deref()
            .and_then(|s| s.indexed_equality().map(|(h, v)| (h, v.to_owned())));
        if let Some((header, value)) = indexed {
            let raw = src.find_by_header(header, &value, SCAN_LOOK_MAX)?;
            // A value with more entries than one look takes is scanned like any selector.
            if raw.len() < SCAN_LOOK_MAX {
                let keys: Vec<(Priority, Seq)> = raw
                    .into_iter()
                    .filter(|&(p, seq)| self.is_paged_out(p, seq))
                    .collect();
                let mut found = Vec::new();
                for chunk in keys.chunks(SCAN_CHUNK) {
                    let messages = src.read_messages(chunk)?;
                    found.extend(
                        messages
                            .into_iter()
                            .filter(|m| self.would_take(req, &m.message, m.delivery_count, now_ms)),
                    );
                    if found.len() >= max {
                        break;
                    }
                }
                found.truncate(max);
                return Ok((found, [Seq(u64::MAX); Priority::MAX as usize + 1], false));
            }
        }
        self.scan_for_receiver(src, req, max, now_ms)
    }

    /// The first `max` paged-out messages `req` would take, looking at no more than
    /// [`SCAN_LOOK_MAX`] and starting, per priority, where the receiver's memo says the store
    /// holds nothing for it. Returns them, how far each priority was looked at, and whether the
    /// look stopped at its limit.
    fn scan_for_receiver<S: PageSource>(
        &mut self,
        src: &S,
        req: &ReceiveRequest,
        max: usize,
        now_ms: u64,
    ) -> Result<Look, S::Error> {
        let key = format!(
            "{:?}\u{0}{}",
            req.owner,
            req.selector.as_deref().map_or("", |s| s.text())
        );
        let epoch = self.groups.epoch;
        let memo = self
            .paging
            .scan_memo
            .get(&key)
            .filter(|(e, _)| *e == epoch)
            .map(|&(_, m)| m)
            .unwrap_or_default();
        let starts: Vec<(Priority, Seq)> = self
            .paged_levels()
            .into_iter()
            .map(|(p, cursor)| (p, cursor.max(memo[usize::from(p.get())])))
            .collect();
        // While every message seen so far at a priority is one this receiver would not take,
        // the memo moves on.
        let mut clean = [true; Priority::MAX as usize + 1];
        let mut new_memo = memo;
        // While every message seen from a priority's cursor on is taken, the cursor may follow.
        let mut contiguous: [Option<Seq>; Priority::MAX as usize + 1] = Default::default();
        for &(p, start) in &starts {
            if start == self.paging.level(p).cursor {
                contiguous[usize::from(p.get())] = Some(start);
            }
        }
        let mut taken = 0;
        let (found, reached) = self.scan_from(src, &starts, SCAN_LOOK_MAX, |q, m, count| {
            let p = usize::from(m.priority.get());
            let take = q.would_take(req, m, count, now_ms);
            if clean[p] {
                if take {
                    clean[p] = false;
                } else {
                    new_memo[p] = new_memo[p].max(Seq(m.seq.0 + 1));
                }
            }
            contiguous[p] = contiguous[p].filter(|_| take).map(|_| Seq(m.seq.0 + 1));
            taken += usize::from(take);
            (take, taken >= max)
        })?;
        self.paging.contiguous = contiguous;
        if new_memo != memo {
            if self.paging.scan_memo.len() >= SCAN_MEMO_MAX
                && !self.paging.scan_memo.contains_key(&key)
            {
                self.paging.scan_memo.clear();
            }
            self.paging.scan_memo.insert(key, (epoch, new_memo));
        }
        // Up to the start (the memo's region holds nothing for it) everything counts as looked
        // at; then as far as the look went.
        let mut checked = [Seq(u64::MAX); Priority::MAX as usize + 1];
        for &(p, start) in &starts {
            checked[usize::from(p.get())] = start;
        }
        for &(p, next, end, _, _) in &reached {
            checked[usize::from(p.get())] = if end { Seq(u64::MAX) } else { next };
        }
        let short = reached.iter().any(|r| r.4);
        Ok((found, checked, short))
    }

    /// Reads paged-out messages from the given positions (highest priority first) in chunks,
    /// keeping those `wanted` takes, until it says stop (its answer is (take, stop)) or
    /// `look_max` messages were looked at. Says how far it read each priority: the next position,
    /// whether the priority's run ended there, whether `wanted` stopped it there, and whether the
    /// look limit did.
    #[allow(clippy::type_complexity)]
    fn scan_from<S: PageSource>(
        &self,
        src: &S,
        starts: &[(Priority, Seq)],
        look_max: usize,
        mut wanted: impl FnMut(&Self, &Message, u32) -> (bool, bool),
    ) -> Result<
        (
            Vec<RecoveredMessage>,
            Vec<(Priority, Seq, bool, bool, bool)>,
        ),
        S::Error,
    > {
        let mut found = Vec::new();
        let mut reached = Vec::new();
        let (mut stopped, mut looked) = (false, 0usize);
        for &(p, start) in starts {
            if stopped || looked >= look_max {
                break;
            }
            let mut from = start;
            loop {
                let chunk = SCAN_CHUNK.min(look_max - looked).max(1);
                let page = src.read_page(p, from, chunk, u64::MAX)?;
                let mut last = from;
                for m in page.messages {
                    last = Seq(m.message.seq.0 + 1);
                    looked += 1;
                    if self.is_paged_out(p, m.message.seq) {
                        let (take, stop) = wanted(self, &m.message, m.delivery_count);
                        if take {
                            found.push(m);
                        }
                        if stop {
                            stopped = true;
                            break;
                        }
                    }
                }
                if stopped {
                    reached.push((p, last, false, true, false));
                    break;
                }
                if page.end || page.next <= from {
                    reached.push((p, page.next, page.end, false, false));
                    break;
                }
                from = page.next;
                if looked >= look_max {
                    reached.push((p, from, false, false, true));
                    break;
                }
            }
        }
        Ok((found, reached))
    }

    /// The next read to fill the window, if any, skipping the priorities in `stuck` (a bit each):
    /// the highest priority with paged-out messages that either fits in the budget's room (reads
    /// are worth making once a quarter of the budget is free) or has nothing Ready in memory
    /// (then a few messages come in although the budget is full).
    fn page_request(&self, stuck: u16) -> Option<PageRequest> {
        let budget = self.paging.budget_bytes;
        let room = budget.saturating_sub(self.bytes);
        (0..=usize::from(Priority::MAX)).rev().find_map(|p| {
            let level = &self.paging.levels[p];
            if level.count == 0 || stuck & (1 << p) != 0 {
                return None;
            }
            let starving = level.ready == 0;
            let (max_count, max_bytes) = if room > 0 && (room >= budget / 4 || starving) {
                (PAGE_MAX_COUNT, room)
            } else if starving {
                // Paged-out messages are all due (delayed ones stay resident), so this ends
                // as soon as one Ready message is in.
                (PAGE_MIN_COUNT, 1)
            } else {
                return None;
            };
            Some(PageRequest {
                priority: priority(p),
                from: level.cursor,
                max_count: max_count.min(usize::try_from(level.count).unwrap_or(usize::MAX)),
                max_bytes,
            })
        })
    }

    /// Moves cursors over runs the last scan pulled in whole (see `Paging::contiguous`).
    fn advance_cursors(&mut self) {
        for (p, until) in std::mem::take(&mut self.paging.contiguous)
            .into_iter()
            .enumerate()
        {
            let level = &mut self.paging.levels[p];
            match until {
                Some(until) if level.count > 0 && until > level.cursor => {
                    level.cursor = until;
                    level.pulled = level.pulled.split_off(&until);
                }
                _ => {}
            }
        }
    }

    /// A paged-out message becomes resident (it leaves the level's paged-out count). One
    /// delivered as often as the policy allows is dead-lettered at once.
    fn bring_in(&mut self, m: RecoveredMessage, now_ms: u64, effects: &mut Effects) {
        let p = m.message.priority;
        let size = m.message.size_bytes();
        let (seq, exhausted) = self.insert_recovered(m, now_ms);
        let level = self.paging.level_mut(p);
        level.count = level.count.saturating_sub(1);
        level.bytes = level.bytes.saturating_sub(size);
        if exhausted {
            self.dead_letter(seq, super::DeadLetterReason::MaxDeliveries, effects);
        }
    }

    /// A level with nothing paged out forgets its pulled set: no read will look there until a
    /// send pages out again, at a sequence number above every one it remembers.
    fn settle_level(&mut self, p: Priority) {
        let level = self.paging.level_mut(p);
        if level.count == 0 {
            level.bytes = 0;
            level.pulled.clear();
            self.paging.rescan[usize::from(p.get())] = None;
        }
    }

    /// Whether a resident message comes after a paged-out one in delivery order: a higher
    /// priority is paged out, or its own priority is from a sequence number at or below it.
    /// Never, once the shell has looked in the store for the receive in progress.
    pub(crate) fn behind_paged_out(&self, p: Priority, seq: Seq) -> bool {
        let levels = &self.paging.levels;
        let unchecked_from = |q: usize| match self.paging.checked {
            Some(c) => levels[q].cursor.max(c[q]),
            None => levels[q].cursor,
        };
        let q = usize::from(p.get());
        (levels[q].count > 0 && seq >= unchecked_from(q))
            || (q + 1..levels.len())
                .any(|h| levels[h].count > 0 && unchecked_from(h) < Seq(u64::MAX))
    }

    /// Whether paged-out messages this receive has not looked at may hold better ones.
    pub(crate) fn store_unchecked(&self) -> bool {
        match self.paging.checked {
            Some(_) => false,
            None => self.paging.top().is_some(),
        }
    }

    /// Whether a new persistent message goes to the store only. A parked receiver that would
    /// take it keeps it in memory.
    pub(crate) fn pages_out(&self, m: &Message) -> bool {
        if !m.persistent || m.deliver_at_ms.is_some_and(|t| t > self.now_ms) {
            // A delayed message stays in memory until it is due: the queue's timer must see it.
            return false;
        }
        let level = self.paging.level(m.priority);
        if level.count > 0 {
            // Behind paged-out messages of its priority, it waits its turn in the store, even
            // for a parked receiver (which may want an older one whose write is on its way).
            return true;
        }
        self.bytes.saturating_add(m.size_bytes()) > self.paging.budget_bytes
            && !self.a_waiter_takes(m, 0, self.now_ms)
    }

    /// Records a new persistent message as paged out (its write is already in the effects).
    pub(crate) fn page_out(&mut self, m: &Message) {
        if self.a_waiter_takes(m, 0, self.now_ms) {
            self.paging.flag_rescan(m.priority, m.seq, m.seq);
        }
        let level = self.paging.level_mut(m.priority);
        if level.count == 0 {
            level.cursor = m.seq;
            level.pulled.clear();
        }
        level.count += 1;
        level.bytes += m.size_bytes();
    }

    /// A resident persistent message past its level's cursor must be remembered as pulled, or a
    /// page read would bring it in twice.
    pub(crate) fn note_resident(&mut self, m: &Message) {
        let level = self.paging.level_mut(m.priority);
        if m.persistent && level.count > 0 && m.seq >= level.cursor {
            level.pulled.insert(m.seq);
        }
    }

    /// Deletes of every paged-out message (purge), leaving alone the pulled messages still in the
    /// queue (`keep`): they are resident and delivered.
    pub(crate) fn purge_paged_out(&mut self, effects: &mut Effects) -> u64 {
        let mut purged = 0;
        for p in 0..=usize::from(Priority::MAX) {
            let keep: Vec<Seq> = self.paging.levels[p]
                .pulled
                .iter()
                .copied()
                .filter(|s| self.entries.contains_key(s))
                .collect();
            let level = &mut self.paging.levels[p];
            if level.count == 0 {
                continue;
            }
            let (mut count, mut bytes) = (level.count, level.bytes);
            purged += level.count;
            let mut from = level.cursor;
            for to in keep.into_iter().chain([Seq(u64::MAX)]) {
                if to > from {
                    // The counts ride on the first range; the store adds them up per priority.
                    effects.persist.push(PersistOp::DeleteStored {
                        priority: priority(p),
                        from,
                        to,
                        count: std::mem::take(&mut count),
                        bytes: std::mem::take(&mut bytes),
                    });
                }
                from = Seq(to.0.saturating_add(1));
            }
            level.count = 0;
            level.bytes = 0;
            level.pulled.clear();
        }
        self.paging.rescan = Default::default();
        purged
    }

    /// Paging's part of [`Queue::check_invariants`].
    pub(crate) fn check_paging(&self) {
        let mut ready = [0u64; Priority::MAX as usize + 1];
        for (&seq, e) in &self.entries {
            let p = usize::from(e.message.priority.get());
            if e.state == MessageState::Ready {
                ready[p] += 1;
            }
            let level = &self.paging.levels[p];
            if e.message.persistent && level.count > 0 && seq >= level.cursor {
                assert!(
                    level.pulled.contains(&seq),
                    "resident message {seq} past the cursor {} is not remembered as pulled",
                    level.cursor
                );
            }
        }
        for (p, level) in self.paging.levels.iter().enumerate() {
            assert_eq!(level.ready, ready[p], "ready count of priority {p}");
            assert!(level.pulled.iter().all(|&s| s >= level.cursor));
            if level.count == 0 {
                assert!(
                    level.pulled.is_empty(),
                    "pulled set of a level with nothing paged out"
                );
                assert_eq!(level.bytes, 0);
                assert!(
                    self.paging.rescan[p].is_none(),
                    "rescan flag of an empty level"
                );
            }
        }
    }
}
