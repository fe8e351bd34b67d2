//! Commands about deliveries already made: giving them back, acknowledging, renewing
//! ([`LeaseCmd`]).

use ferry_kernel::{Caller, LeaseRef};

use super::answers::{answer, answer_after_moves};
use super::{LeaseCmd, LeaseResults, QueueActor, Reply};
use crate::log::QueueLog;

impl<L: QueueLog> QueueActor<L> {
    pub(super) async fn on_lease(&mut self, cmd: LeaseCmd, now: u64) {
        match cmd {
            LeaseCmd::ReturnUndelivered {
                caller,
                leases,
                reply,
            } => {
                let (results, fx) = self.queue.return_undelivered(caller, &leases, now);
                let answers = reply.map(|r| answer(r, results)).into_iter().collect();
                self.finish(fx, answers).await;
            }
            LeaseCmd::Ack {
                caller,
                leases,
                defer_sync,
                reply,
            } => self.on_ack(caller, leases, defer_sync, reply, now).await,
            LeaseCmd::Nack {
                caller,
                leases,
                delay_ms,
                reject,
                reply,
            } => {
                self.on_nack(caller, leases, delay_ms, reject, reply, now)
                    .await;
            }
            LeaseCmd::Extend {
                caller,
                leases,
                lease_ms,
                reply,
            } => match self.queue.extend_lease(caller, &leases, lease_ms, now) {
                Ok((results, fx)) => self.finish(fx, vec![answer(reply, results)]).await,
                Err(e) => drop(reply.send(Err(e.into()))),
            },
            LeaseCmd::RenewSession { session, reply } => {
                let (renewed, fx) = self.queue.renew_session(session, now);
                self.finish(fx, vec![answer(reply, renewed)]).await;
            }
            LeaseCmd::RenewNamed {
                session,
                named,
                reply,
            } => {
                let (renewed, fx) = self.queue.renew_named(session, &named, now);
                self.finish(fx, vec![answer(reply, renewed)]).await;
            }
            LeaseCmd::ReleaseSession {
                session,
                recover,
                reply,
            } => {
                let (released, fx) = if recover {
                    self.queue.recover_session(session, now)
                } else {
                    self.queue.release_session(session, now)
                };
                self.finish(fx, vec![answer(reply, released)]).await;
            }
            LeaseCmd::ReleaseLost {
                session,
                keep,
                reply,
            } => {
                let (released, fx) = self.queue.release_lost(session, &keep, now);
                self.finish(fx, vec![answer(reply, released)]).await;
            }
        }
    }

    async fn on_ack(
        &mut self,
        caller: Caller,
        leases: Vec<LeaseRef>,
        defer_sync: bool,
        reply: Reply<LeaseResults<()>>,
        now: u64,
    ) {
        let (results, fx) = self.queue.ack(caller, &leases, now);
        // Deferred only when the answer is all that waits: a hand-off or a dead letter the
        // ack's time passing produced goes out as soon as it is durable.
        let defer = defer_sync && fx.handed.is_empty() && fx.dead_letters.is_empty();
        self.finish_with(fx, vec![answer(reply, results)], defer)
            .await;
    }

    async fn on_nack(
        &mut self,
        caller: Caller,
        leases: Vec<LeaseRef>,
        delay_ms: Option<u64>,
        reject: bool,
        reply: Reply<LeaseResults<()>>,
        now: u64,
    ) {
        let (results, fx) = self.queue.nack(caller, &leases, delay_ms, reject, now);
        let mut answers = vec![];
        let ops = self.collect(fx, &mut answers);
        // A rejected message is answered for once it is where the answer says it went.
        let moving = std::mem::take(&mut self.moving);
        answers.push(answer_after_moves(reply, results, moving));
        self.submit(ops, answers).await;
    }
}
