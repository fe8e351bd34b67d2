//! Commands reading and managing the queue as a whole: browse, purge, delete one message,
//! statistics, settings, sealing for deletion ([`AdminCmd`]).

use ferry_kernel::MessageId;

use super::answers::answer;
use super::{AdminCmd, QueueActor, Reply};
use crate::error::Error;
use crate::log::QueueLog;

impl<L: QueueLog> QueueActor<L> {
    pub(super) async fn on_admin(&mut self, cmd: AdminCmd, now: u64) {
        match cmd {
            AdminCmd::Browse {
                after,
                max,
                selector,
                reply,
            } => {
                let _ = reply.send(self.browse(after, max, selector.as_deref()));
            }
            AdminCmd::DeleteMessage { id, reply } => self.on_delete_message(&id, reply, now).await,
            AdminCmd::Purge { reply } => {
                let (n, fx) = self.queue.purge(now);
                self.finish(fx, vec![answer(reply, n)]).await;
            }
            AdminCmd::Stats { reply } => {
                let mut stats = self.queue.stats();
                stats.waiters = self.receivers();
                let _ = reply.send(Ok(stats));
            }
            AdminCmd::SetConfig { config, reply } => {
                self.queue.set_config(config);
                let _ = reply.send(Ok(()));
            }
            AdminCmd::Seal { until_ms, reply } => {
                let _ = reply.send(self.seal(until_ms));
            }
            AdminCmd::SessionLeases { sessions, reply } => {
                let counts = sessions
                    .iter()
                    .map(|s| self.queue.leases_held_by(*s))
                    .collect();
                let _ = reply.send(Ok(counts));
            }
        }
    }

    /// See [`AdminCmd::Seal`].
    fn seal(&mut self, until_ms: Option<u64>) -> Result<(), Error> {
        let Some(until) = until_ms else {
            self.sealed_until_ms = None;
            return Ok(());
        };
        let s = self.queue.stats();
        if s.ready + s.scheduled + s.leased + s.staged > 0 {
            return Err(Error::NotEmpty {
                queue: self.queue.name().to_string(),
                ready: s.ready,
                scheduled: s.scheduled,
                leased: s.leased,
                staged: s.staged,
            });
        }
        self.sealed_until_ms = Some(until);
        Ok(())
    }

    /// Deletes one message by id: it is brought into memory first if it is paged out.
    async fn on_delete_message(&mut self, id: &MessageId, reply: Reply<()>, now: u64) {
        let fx = self.pull_by_id(id, now);
        self.finish(fx, vec![]).await;
        let (result, fx) = self.queue.delete_message(id, now);
        match result {
            Ok(()) => self.finish(fx, vec![answer(reply, ())]).await,
            Err(e) => {
                let _ = reply.send(Err(e.into()));
                self.finish(fx, vec![]).await;
            }
        }
    }
}
