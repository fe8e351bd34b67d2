//! The owner task's write path: effects become store writes, and every answer waits until its
//! write is durable (persist, then reply). Dead letters leave for their dead-letter queues, and
//! published events go out, only once the writes that removed them are durable.

use std::collections::HashMap;

use ferry_kernel::{Caller, DeadLetter, Effects, LeaseRef, QueueName};
use ferry_store::StoreOp;

use crate::log::LogError;
use tokio::sync::oneshot;

use super::answers::{deliver, Answer};
use super::{Moving, QueueActor};
use crate::log::{LogSync, QueueLog};
use crate::outbox::{BrokerEvent, DeadLetterJob, Published};

impl<L: QueueLog> QueueActor<L> {
    /// Answers now if nothing must be written, else once the write is durable.
    pub(super) async fn finish(&mut self, fx: Effects, answers: Vec<Answer>) {
        self.finish_with(fx, answers, false).await;
    }

    /// Like `finish`; `deferred`: the write may wait for a later synced write ([`LogSync`]).
    pub(super) async fn finish_with(
        &mut self,
        fx: Effects,
        mut answers: Vec<Answer>,
        deferred: bool,
    ) {
        let ops = self.collect(fx, &mut answers);
        self.submit_with(ops, answers, deferred).await;
    }

    /// Turns effects into the writes to make and the answers to send once they are made. Dead
    /// letters leave for their dead-letter queues once these writes are durable; `self.moving`
    /// then holds when each of their moves is done.
    pub(super) fn collect(&mut self, fx: Effects, answers: &mut Vec<Answer>) -> Vec<StoreOp> {
        self.moving.clear();
        for (id, deliveries) in fx.handed {
            if let Some(parked) = self.waiters.remove(&id) {
                self.tickets.remove(&parked.ticket);
                answers.push(deliver(parked.reply, deliveries));
            }
        }
        for id in fx.finished_empty {
            if let Some(parked) = self.waiters.remove(&id) {
                self.tickets.remove(&parked.ticket);
                let _ = parked.reply.send(Ok(vec![]));
            }
        }
        let mut persist = fx.persist;
        if crate::faults::on(crate::faults::SKIP_DELIVERY_COUNT) {
            persist.retain(|op| {
                !matches!(
                    op,
                    ferry_kernel::PersistOp::SetDeliveryCount { .. }
                        | ferry_kernel::PersistOp::MarkDelivery { .. }
                )
            });
        }
        let (discarded, moves) = self.sort_dead_letters(fx.dead_letters, &mut persist);
        if moves.is_empty() {
            self.publish_when_durable(fx.history, discarded, answers);
        } else {
            // The command's steps describe the moves too: published once they are done.
            self.publish_when_durable(vec![], discarded, answers);
            self.move_when_durable(moves, fx.history, answers);
        }
        if self.durable {
            let uid = self.queue.uid();
            persist
                .into_iter()
                .map(|op| StoreOp::Queue { uid, op })
                .collect()
        } else {
            vec![]
        }
    }

    /// Splits dead letters into those discarded (their deletes join `persist`; their events
    /// are returned) and those to move, by target queue, each with its event.
    pub(super) fn sort_dead_letters(
        &self,
        dead_letters: Vec<DeadLetter>,
        persist: &mut Vec<ferry_kernel::PersistOp>,
    ) -> (Vec<BrokerEvent>, HashMap<QueueName, Moving>) {
        let now = self.clock.now_ms();
        let source = self.queue.name();
        let mut discarded = Vec::new();
        let mut moves: HashMap<QueueName, Moving> = HashMap::new();
        for dl in dead_letters {
            // Temporary queues keep nothing: their dead letters are dropped (and counted).
            let target = if self.durable {
                dl.target.resolve(source)
            } else {
                None
            };
            let event = dead_letter_event(source, &dl, target.is_some(), now);
            match target {
                Some(target) => {
                    let moving = moves.entry(target).or_default();
                    moving.0.push(dl);
                    moving.1.push(event);
                }
                None => {
                    tracing::info!(
                        queue = %source,
                        message_id = %dl.message.id,
                        reason = dl.reason.as_str(),
                        "message discarded"
                    );
                    persist.extend(dl.delete);
                    discarded.push(event);
                }
            }
        }
        (discarded, moves)
    }

    /// Hands the dead letters to the mover once this queue's own writes are durable, so the
    /// move's delete of the source copy can never be overtaken by an earlier write of it.
    /// `self.moving` then holds when each move is done; the mover publishes each move's events
    /// (and the command's `history`, with the last move) once it is durable.
    pub(super) fn move_when_durable(
        &mut self,
        moves: HashMap<QueueName, Moving>,
        history: Vec<ferry_kernel::HistoryEntry>,
        answers: &mut Vec<Answer>,
    ) {
        let sink = self.outbox.clone();
        let (source, uid) = (self.queue.name().clone(), self.queue.uid());
        let mut history = Some(history);
        let last = moves.len();
        let jobs: Vec<DeadLetterJob> = moves
            .into_iter()
            .enumerate()
            .map(|(i, (target, (letters, events)))| {
                let (done, moved) = oneshot::channel();
                self.moving.push(moved);
                let history = if i + 1 == last {
                    history.take().unwrap_or_default()
                } else {
                    vec![]
                };
                DeadLetterJob {
                    source: source.clone(),
                    source_uid: uid,
                    target,
                    letters,
                    done: Some(done),
                    published: Published { history, events },
                }
            })
            .collect();
        answers.push(Box::new(move |written| {
            if written.is_ok() {
                for job in jobs {
                    sink.send(job);
                }
            }
            vec![]
        }));
    }

    /// History steps and events describe writes: they are published once the write is durable
    /// (first among its answers, so a caller told "done" finds them), never if it fails.
    pub(super) fn publish_when_durable(
        &self,
        history: Vec<ferry_kernel::HistoryEntry>,
        events: Vec<BrokerEvent>,
        answers: &mut Vec<Answer>,
    ) {
        let history = if self.outbox.history.enabled() {
            history
        } else {
            vec![]
        };
        if history.is_empty() && events.is_empty() {
            return;
        }
        let (outbox, name, uid) = (self.outbox.clone(), self.name.clone(), self.queue.uid());
        let published = Published { history, events };
        answers.insert(
            0,
            Box::new(move |written| {
                if written.is_ok() {
                    outbox.publish(&name, uid, published);
                }
                vec![]
            }),
        );
    }

    /// Writes `ops` (if any) and answers once they are durable.
    pub(super) async fn submit(&mut self, ops: Vec<StoreOp>, answers: Vec<Answer>) {
        self.submit_with(ops, answers, false).await;
    }

    /// Like `submit`; `deferred`: the write may wait for a later synced write.
    pub(super) async fn submit_with(
        &mut self,
        ops: Vec<StoreOp>,
        answers: Vec<Answer>,
        deferred: bool,
    ) {
        let seq = self.queue.next_seq();
        if ops.is_empty() {
            if answers.is_empty() {
                return;
            }
            if self.pending.is_empty() {
                self.answer(Ok(()), answers).await;
            } else {
                // Behind the writes already on their way: a command that writes nothing may
                // still depend on them (a repeated dedup id on its first send's write), and
                // must not be answered before they are durable, nor as done if they fail.
                self.pending
                    .push_back(Box::pin(async move { (None, answers, seq) }));
            }
            return;
        }
        let sync = if deferred {
            LogSync::Deferred
        } else {
            LogSync::Now
        };
        match self.log.submit(ops, sync).await {
            Ok(durable) => self
                .pending
                .push_back(Box::pin(async move { (Some(durable.await), answers, seq) })),
            Err(e) => self.answer(Err(e), answers).await,
        }
    }

    /// Sends the answers; deliveries nobody took go straight back to Ready.
    pub(super) async fn answer(&mut self, result: Result<(), LogError>, answers: Vec<Answer>) {
        let undelivered: Vec<LeaseRef> = answers
            .into_iter()
            .flat_map(|a| a(result.clone()))
            .collect();
        if !undelivered.is_empty() {
            let (_, fx) =
                self.queue
                    .return_undelivered(Caller::Backend, &undelivered, self.clock.now_ms());
            Box::pin(self.finish(fx, vec![])).await;
        }
    }
}

/// What watchers are told of a message that left its queue as a dead letter.
fn dead_letter_event(source: &QueueName, dl: &DeadLetter, moved: bool, now_ms: u64) -> BrokerEvent {
    let expired = dl.reason == ferry_kernel::DeadLetterReason::Expired;
    BrokerEvent {
        at_ms: now_ms,
        kind: if expired { "expired" } else { "dead-lettered" },
        queue: Some(source.clone()),
        shard: None,
        value: 0,
        message_id: dl.message.id.to_string(),
        reason: match (expired, moved) {
            (true, true) => "moved",
            (true, false) => "discarded",
            (false, _) => dl.reason.as_str(),
        },
        detail: String::new(),
    }
}
