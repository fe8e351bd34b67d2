//! The owner task of one queue. It alone touches the queue's kernel state; callers talk to it
//! through a bounded channel. No lock is held across an `.await`.
//!
//! Persist, then reply: an operation's effects go to the queue's log (`log.rs`), and everyone the
//! operation answers (the caller, receivers handed a message) is answered only once the write is
//! durable. Writes become durable in submission order, so a receiver never sees a message before
//! it is on disk.

use std::collections::HashMap;
use std::future::Future;
use std::ops::ControlFlow;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use ferry_kernel::{
    ClockRef, DeadLetter, Delivery, Effects, LeaseRef, MessageId, MessageState, NewMessage,
    PagedError, Queue, ReceiveOutcome, ReceiveRequest, RecoveredMessage, Seq, SessionId, WaiterId,
};
use ferry_store::{QueueStore, StoreError, StoreOp};
use futures::stream::{FuturesOrdered, StreamExt};
use tokio::sync::{mpsc, oneshot};

use crate::error::Error;
use crate::log::{LogError, QueueLog};
use crate::outbox::{BrokerEvent, Outbox};

mod admin;
mod answers;
mod handle;
mod lease;
mod store_source;
mod write;

use answers::{answer, deliver, Answer};
pub(crate) use handle::{AdminCmd, Browsed, Cmd, LeaseCmd, LeaseResults, QueueHandle, TxDecision};
use store_source::StoreSource;

type Reply<T> = oneshot::Sender<Result<T, Error>>;

/// The longest a queue's timer sleeps before looking again (one hour).
const TIMER_MAX_MS: u64 = 3_600_000;

/// A write on its way: its result, the answers waiting for it, and the queue's next sequence
/// number when it was submitted (every message write below it is in this write or an earlier one).
/// A result of `None` is a command that wrote nothing: it is answered behind the writes submitted
/// before it, with the result of the last of them.
type PendingCommit =
    Pin<Box<dyn Future<Output = (Option<Result<(), LogError>>, Vec<Answer>, Seq)> + Send>>;

/// Dead letters bound for one target queue, with the event of each.
type Moving = (Vec<DeadLetter>, Vec<BrokerEvent>);

/// How many page reads one fill of the window may make before the task serves commands again.
const FILL_READS_MAX: usize = 16;

/// The owner task of one queue, writing through the log `L` (static dispatch: the hot path
/// makes no allocation for it).
pub(crate) struct QueueActor<L: QueueLog> {
    queue: Queue,
    /// Temporary queues keep nothing on disk (and discard their dead letters).
    durable: bool,
    log: L,
    /// Read by paging (durable queues only), synchronously: reads are short and bounded.
    store: Arc<dyn QueueStore>,
    /// The memory budget of each durable queue of this back-end (it changes as queues come and
    /// go).
    budget: Arc<AtomicU64>,
    /// Every message write below this sequence number is applied (readable).
    applied: Seq,
    outbox: Outbox,
    clock: ClockRef,
    /// The queue's name, shared with its history steps.
    name: Arc<str>,
    rx: mpsc::Receiver<handle::Mail>,
    waiters: HashMap<WaiterId, Parked>,
    tickets: HashMap<u64, WaiterId>,
    pending: FuturesOrdered<PendingCommit>,
    /// The result of the last write that completed (see `PendingCommit`).
    last_write: Result<(), LogError>,
    /// Dead letters of the command being handled, on their way to their dead-letter queues:
    /// each says when its move is done (see `collect`).
    moving: Vec<oneshot::Receiver<Result<(), Error>>>,
    /// Sends are refused until this time (wall clock, ms): the queue is being deleted because
    /// it was found empty (see [`AdminCmd::Seal`]).
    sealed_until_ms: Option<u64>,
    /// The back-end's total of bytes held (see [`QueueActor::report_held`]), and this queue's
    /// part of it.
    held_total: Arc<AtomicU64>,
    held_reported: u64,
}

/// What woke the owner task (see [`QueueActor::run`]).
enum Wake {
    /// A command, or `None`: every handle is gone.
    Mail(Option<handle::Mail>),
    /// A write completed (see `PendingCommit`).
    Written(Option<Result<(), LogError>>, Vec<Answer>, Seq),
    /// The queue's next deadline came.
    Due,
}

/// A receive parked at the queue, waiting for messages.
struct Parked {
    ticket: u64,
    /// Receives with the same nonzero tag come from one consumer (see `Cmd::Receive`).
    consumer: u64,
    reply: Reply<Vec<Delivery>>,
}

impl<L: QueueLog> QueueActor<L> {
    /// Starts the owner task of `queue`; `delayed` are its recovered messages with a delivery
    /// time still to come (they are kept in memory, whatever the budget).
    pub(crate) fn spawn(
        queue: Queue,
        setup: ActorSetup<L>,
        delayed: Vec<RecoveredMessage>,
    ) -> QueueHandle {
        let (tx, rx) = mpsc::channel(setup.capacity.max(1));
        let actor = QueueActor {
            name: Arc::from(queue.name().as_str()),
            applied: queue.next_seq(),
            queue,
            durable: setup.durable,
            log: setup.log,
            store: setup.store,
            budget: setup.budget,
            outbox: setup.outbox,
            clock: setup.clock,
            rx,
            waiters: HashMap::new(),
            tickets: HashMap::new(),
            pending: FuturesOrdered::new(),
            last_write: Ok(()),
            moving: Vec::new(),
            sealed_until_ms: None,
            held_total: setup.held_total,
            held_reported: 0,
        };
        tokio::spawn(Box::new(actor).run(delayed));
        QueueHandle::new(tx)
    }

    /// The task: waits for mail, a write to complete or its next deadline, then handles it.
    ///
    /// Sized for idle queues, which are most of them: an async fn's future is as large as its
    /// largest await plus its arguments twice (they are moved into the body), and an idle
    /// queue's task held 7.2 KiB. So the actor comes boxed (its 2.5 KiB are held once), and
    /// the handling of each wake-up (and the start) runs in a boxed future of its own, which
    /// costs one allocation per wake-up: the task's future holds only what waiting needs.
    async fn run(mut self: Box<Self>, delayed: Vec<RecoveredMessage>) {
        Box::pin(self.begin(delayed)).await;
        loop {
            let wake = self.next_wake().await;
            if Box::pin(self.wake(wake)).await.is_break() {
                return;
            }
        }
    }

    /// Waits for mail, a write to complete, or the queue's next deadline.
    async fn next_wake(&mut self) -> Wake {
        // Parked receivers still being looked for in the store: come back at once.
        let due = if self.queue.more_to_look_at() {
            Some(0)
        } else {
            self.queue.next_deadline_ms()
        };
        let deadline = due.map(|at| {
            // Capped so a far-off deadline (a huge wait or delay from a client) can never
            // overflow the timer; waking early is harmless, the kernel just re-arms.
            let wait =
                Duration::from_millis(at.saturating_sub(self.clock.now_ms()).min(TIMER_MAX_MS));
            tokio::time::Instant::now() + wait
        });
        let timer = async {
            match deadline {
                Some(t) => tokio::time::sleep_until(t).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            mail = self.rx.recv() => Wake::Mail(mail),
            Some((result, answers, seq)) = self.pending.next(), if !self.pending.is_empty() => {
                Wake::Written(result, answers, seq)
            }
            () = timer => Wake::Due,
        }
    }

    /// The start: recovered messages still to be delivered later, then the window's first fill.
    async fn begin(&mut self, delayed: Vec<RecoveredMessage>) {
        if !delayed.is_empty() {
            let fx = self.queue.pull(delayed, self.clock.now_ms());
            self.finish(fx, vec![]).await;
        }
        self.fill().await;
        self.report_held(self.queue.held_bytes());
    }

    /// One wake-up, then the window filled again. Breaks after [`Cmd::Stop`] or once every
    /// handle is gone.
    async fn wake(&mut self, wake: Wake) -> ControlFlow<()> {
        match wake {
            Wake::Mail(Some(cmd)) => {
                if self.handle(*cmd).await.is_break() {
                    return ControlFlow::Break(());
                }
            }
            Wake::Mail(None) => {
                self.stop(false).await;
                self.report_held(0);
                return ControlFlow::Break(());
            }
            Wake::Written(result, answers, seq) => {
                let result = self.settle(result, seq);
                self.answer(result, answers).await;
            }
            Wake::Due => {
                let fx = self.queue.tick(self.clock.now_ms());
                self.finish(fx, vec![]).await;
            }
        }
        self.fill().await;
        self.report_held(self.queue.held_bytes());
        ControlFlow::Continue(())
    }

    /// Brings this queue's part of the back-end's total of bytes held to `held`: the node
    /// reads the total every 2 s for the placement rule, and asking every owner task for it
    /// cost a round trip per queue (25 % of a core at rest with 10 000 queues, debug build).
    fn report_held(&mut self, held: u64) {
        if held >= self.held_reported {
            self.held_total
                .fetch_add(held - self.held_reported, Ordering::Relaxed);
        } else {
            self.held_total
                .fetch_sub(self.held_reported - held, Ordering::Relaxed);
        }
        self.held_reported = held;
    }

    async fn stop(&mut self, deleted: bool) {
        for (_, parked) in self.waiters.drain() {
            // A receiver must not read either end as "no message came".
            let answer = if deleted {
                Err(Error::QueueNotFound {
                    queue: self.queue.name().to_string(),
                })
            } else {
                Err(Error::ShuttingDown)
            };
            let _ = parked.reply.send(answer);
        }
        self.tickets.clear();
        while let Some((result, answers, seq)) = self.pending.next().await {
            let result = self.settle(result, seq);
            for a in answers {
                a(result.clone());
            }
        }
    }

    /// A pending write (or a command behind it, `None`) completed: its result.
    fn settle(&mut self, result: Option<Result<(), LogError>>, seq: Seq) -> Result<(), LogError> {
        let result = result.unwrap_or_else(|| self.last_write.clone());
        if result.is_ok() {
            self.applied = self.applied.max(seq);
        }
        self.last_write = result.clone();
        result
    }

    /// Refuses a send while the queue is sealed for deletion (see [`AdminCmd::Seal`]).
    fn check_unsealed(&mut self, now: u64) -> Result<(), Error> {
        match self.sealed_until_ms {
            Some(until) if now < until => Err(Error::QueueDeleting {
                queue: self.queue.name().to_string(),
            }),
            Some(_) => {
                self.sealed_until_ms = None;
                Ok(())
            }
            None => Ok(()),
        }
    }

    /// One command: sends, transactions and receives here, the others by kind (`lease.rs`,
    /// `admin.rs`). Breaks after [`Cmd::Stop`].
    async fn handle(&mut self, cmd: Cmd) -> ControlFlow<()> {
        let now = self.clock.now_ms();
        let Some(cmd) = self.unless_sealed(cmd, now) else {
            return ControlFlow::Continue(());
        };
        match cmd {
            Cmd::Send { messages, reply } => match self.queue.send(messages, now) {
                Ok((ids, fx)) => self.finish(fx, vec![answer(reply, ids)]).await,
                Err(e) => drop(reply.send(Err(e.into()))),
            },
            Cmd::Stage {
                session,
                messages,
                reply,
            } => match self.queue.stage(session, messages, now) {
                Ok((ids, fx)) => self.finish(fx, vec![answer(reply, ids)]).await,
                Err(e) => drop(reply.send(Err(e.into()))),
            },
            Cmd::AcceptDeadLetters {
                messages,
                source_deletes,
                reply,
            } => {
                self.on_accept_dead_letters(messages, source_deletes, reply, now)
                    .await;
            }
            Cmd::TxPrepare {
                session,
                acks,
                reply,
                decision,
            } => self.prepare(session, acks, now, reply, decision).await,
            Cmd::Rollback { session, reply } => {
                let (released, fx) = self.queue.rollback(session, now);
                self.finish(fx, vec![answer(reply, released)]).await;
            }
            Cmd::Receive {
                req,
                ticket,
                consumer,
                reply,
            } => self.on_receive(req, ticket, consumer, reply, now).await,
            Cmd::CancelReceive { ticket } => {
                if let Some(id) = self.tickets.remove(&ticket) {
                    self.queue.cancel_waiter(id);
                    self.waiters.remove(&id);
                }
            }
            Cmd::Lease(cmd) => self.on_lease(cmd, now).await,
            Cmd::Admin(cmd) => self.on_admin(cmd, now).await,
            Cmd::Stop { deleted, reply } => {
                let count = self.queue.stats();
                self.stop(deleted).await;
                // Before the answer: whoever waits for the stop sees the queue's bytes gone.
                self.report_held(0);
                let _ = reply.send(count.ready + count.scheduled + count.leased);
                return ControlFlow::Break(());
            }
        }
        ControlFlow::Continue(())
    }

    /// `cmd`, unless it is a send the sealed queue refuses (then answered here).
    fn unless_sealed(&mut self, cmd: Cmd, now: u64) -> Option<Cmd> {
        let sends = matches!(
            cmd,
            Cmd::Send { .. } | Cmd::Stage { .. } | Cmd::AcceptDeadLetters { .. }
        );
        if !sends {
            return Some(cmd);
        }
        let Err(e) = self.check_unsealed(now) else {
            return Some(cmd);
        };
        if let Cmd::Send { reply, .. }
        | Cmd::Stage { reply, .. }
        | Cmd::AcceptDeadLetters { reply, .. } = cmd
        {
            let _ = reply.send(Err(e));
        }
        None
    }

    async fn on_receive(
        &mut self,
        req: ReceiveRequest,
        ticket: u64,
        consumer: u64,
        reply: Reply<Vec<Delivery>>,
        now: u64,
    ) {
        match self.receive(req, now) {
            Ok((ReceiveOutcome::Delivered(d), fx)) => {
                self.finish(fx, vec![deliver(reply, d)]).await;
            }
            Ok((ReceiveOutcome::Empty, fx)) => {
                let _ = reply.send(Ok(vec![]));
                self.finish(fx, vec![]).await;
            }
            Ok((ReceiveOutcome::Parked(id), fx)) => {
                self.waiters.insert(
                    id,
                    Parked {
                        ticket,
                        consumer,
                        reply,
                    },
                );
                self.tickets.insert(ticket, id);
                self.finish(fx, vec![]).await;
            }
            Ok((ReceiveOutcome::NeedStore, _)) => {
                unreachable!("receive_paged answers from the store")
            }
            Err(e) => drop(reply.send(Err(e))),
        }
    }

    /// Dead letters moved here, written in one batch with their deletes from the source queue.
    async fn on_accept_dead_letters(
        &mut self,
        messages: Vec<NewMessage>,
        source_deletes: Vec<StoreOp>,
        reply: Reply<Vec<MessageId>>,
        now: u64,
    ) {
        let (ids, fx) = self.queue.send_moved(messages, now);
        let mut answers = vec![answer(reply, ids)];
        let mut ops = self.collect(fx, &mut answers);
        ops.extend(source_deletes);
        self.submit(ops, answers).await;
    }

    /// Receivers waiting: parked receives, those of one consumer counted once.
    fn receivers(&self) -> u64 {
        let mut consumers = std::collections::HashSet::new();
        let mut untagged = 0u64;
        for p in self.waiters.values() {
            if p.consumer == 0 {
                untagged += 1;
            } else {
                consumers.insert(p.consumer);
            }
        }
        untagged + consumers.len() as u64
    }

    /// See [`Cmd::TxPrepare`]. Both phases run at the same `now`, with nothing in between: even
    /// the effects of the check (time passing) are held until the decision, so no answer (and no
    /// undelivered hand-off coming back) can change the queue before the commit.
    async fn prepare(
        &mut self,
        session: SessionId,
        acks: Vec<LeaseRef>,
        now: u64,
        reply: Reply<()>,
        decision: oneshot::Receiver<TxDecision>,
    ) {
        let (checked, fx) = self.queue.check_commit(session, &acks, now);
        let mut answers = vec![];
        let mut ops = self.collect(fx, &mut answers);
        let refused = checked.is_err();
        let _ = reply.send(checked.map_err(Error::from));
        if refused {
            self.submit(ops, answers).await;
            return;
        }
        // A dropped decision (the coordinator went away) is an abort: nothing was changed.
        let Ok(TxDecision::Commit {
            ops: hand_over,
            submitted,
            durable,
        }) = decision.await
        else {
            self.submit(ops, answers).await;
            return;
        };
        let (result, fx) = self.queue.commit(session, &acks, now);
        if let Err(e) = result {
            // Cannot happen: nothing ran between the check and the commit.
            tracing::error!(queue = %self.queue.name(), error = %e, "commit refused after its check passed");
        }
        ops.extend(self.collect(fx, &mut answers));
        let _ = hand_over.send(ops);
        // Go on only once the transaction's batch is queued for writing: no later write of this
        // queue may reach the disk before it.
        let _ = submitted.await;
        let seq = self.queue.next_seq();
        self.pending.push_back(Box::pin(async move {
            (
                Some(
                    durable
                        .await
                        .unwrap_or(Err(LogError::Store(StoreError::Closed))),
                ),
                answers,
                seq,
            )
        }));
    }

    /// Brings into memory what the queue asks for (see `Queue::fill`).
    async fn fill(&mut self) {
        if !self.durable {
            return;
        }
        self.queue
            .set_memory_budget(self.budget.load(Ordering::Relaxed));
        if !self.queue.paging_active() {
            return;
        }
        let now = self.clock.now_ms();
        let src = StoreSource::new(
            &*self.store,
            &self.queue,
            self.pending.is_empty(),
            self.applied,
        );
        let filled = self.queue.fill(&src, FILL_READS_MAX, now);
        match filled {
            Ok(fx) => self.finish(fx, vec![]).await,
            Err(e) => {
                tracing::error!(queue = %self.queue.name(), error = %e, "paging in failed");
            }
        }
    }

    /// A receive, looking in the store when memory alone cannot answer.
    fn receive(
        &mut self,
        req: ReceiveRequest,
        now: u64,
    ) -> Result<(ReceiveOutcome, Effects), Error> {
        if !self.durable {
            return self.queue.receive(req, now).map_err(Error::from);
        }
        let src = StoreSource::new(
            &*self.store,
            &self.queue,
            self.pending.is_empty(),
            self.applied,
        );
        self.queue
            .receive_paged(req, &src, now)
            .map_err(|e| match e {
                PagedError::Kernel(k) => Error::Kernel(k),
                PagedError::Source(s) => Error::Store(s),
            })
    }

    /// Brings a paged-out message into memory by its id (to delete it).
    fn pull_by_id(&mut self, id: &MessageId, now: u64) -> Effects {
        let seq = id
            .as_str()
            .rsplit_once('-')
            .and_then(|(_, seq)| seq.parse().ok())
            .map(Seq)
            .filter(|&seq| MessageId::new(self.queue.uid(), seq) == *id);
        let Some(seq) = seq.filter(|_| self.durable && self.queue.paged_out().0 > 0) else {
            return Effects::default();
        };
        match self.store.find_message(self.queue.uid(), seq) {
            Ok(Some(m)) => self.queue.pull(vec![m], now),
            Ok(None) => Effects::default(),
            Err(e) => {
                tracing::error!(queue = %self.queue.name(), error = %e, "reading a message failed");
                Effects::default()
            }
        }
    }

    /// Browses in sequence order, paged-out messages included (read from the store, not
    /// brought into memory).
    fn browse(
        &self,
        after: Option<Seq>,
        max: usize,
        selector: Option<&ferry_kernel::Selector>,
    ) -> Result<Browsed, Error> {
        // Bounded work per call: at most this many messages are looked at.
        let scan_max = max.saturating_mul(100).max(10_000);
        let (resident, resident_next) = self.queue.browse(after, max, selector, scan_max);
        let levels = self.queue.paged_levels();
        if !self.durable || levels.is_empty() {
            return Ok((resident, resident_next));
        }
        let from = Seq(after.map_or(0, |s| s.0.saturating_add(1)));
        let mut all: Vec<(Arc<ferry_kernel::Message>, MessageState, u32)> = resident;
        // Where each source stopped short of the end: nothing past the lowest of those may be
        // returned, or a later call would miss what lies before it.
        let mut limit = resident_next;
        for (p, cursor) in levels {
            let mut at = from.max(cursor);
            let (mut taken, mut scanned) = (0, 0);
            let mut last_looked = None;
            loop {
                let page = self.store.read_page(
                    self.queue.uid(),
                    p,
                    at,
                    Seq(u64::MAX),
                    ferry_kernel::SCAN_CHUNK,
                    u64::MAX,
                )?;
                for m in page.messages {
                    scanned += 1;
                    last_looked = Some(m.message.seq);
                    if !self.queue.is_paged_out(p, m.message.seq) {
                        continue;
                    }
                    if selector.is_none_or(|s| s.matches(&m.message, m.delivery_count)) {
                        taken += 1;
                        all.push((Arc::new(m.message), MessageState::Ready, m.delivery_count));
                    }
                    if taken >= max || scanned >= scan_max {
                        break;
                    }
                }
                if taken >= max || scanned >= scan_max {
                    // The next call resumes after the last one looked at.
                    limit = min_seq(limit, last_looked);
                    break;
                }
                if page.end || page.next <= at {
                    break;
                }
                at = page.next;
            }
        }
        all.sort_by_key(|(m, _, _)| m.seq);
        if let Some(limit) = limit {
            all.retain(|(m, _, _)| m.seq <= limit);
        }
        let next = if all.len() > max {
            all.truncate(max);
            all.last().map(|(m, _, _)| m.seq)
        } else {
            limit
        };
        Ok((all, next))
    }
}

fn min_seq(a: Option<Seq>, b: Option<Seq>) -> Option<Seq> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, None) => a,
        (None, b) => b,
    }
}

/// What an owner task needs besides its queue.
pub(crate) struct ActorSetup<L> {
    pub(crate) durable: bool,
    pub(crate) log: L,
    pub(crate) outbox: Outbox,
    pub(crate) clock: ClockRef,
    pub(crate) store: Arc<dyn QueueStore>,
    pub(crate) budget: Arc<AtomicU64>,
    /// The bytes every queue of this back-end holds, which each task keeps up to date.
    pub(crate) held_total: Arc<AtomicU64>,
    pub(crate) capacity: usize,
}
