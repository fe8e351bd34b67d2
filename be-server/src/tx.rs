//! Transacted sessions on the back-end: staging sends, and committing or rolling back a
//! session's work over several queues. A commit is two-phase inside the node: every queue's
//! owner task checks its part and holds still (`Cmd::TxPrepare`), then all their writes go to
//! disk in one batch, and each queue applies what it decided once that batch is durable.

use std::collections::{BTreeMap, HashSet};

use ferry_kernel::{LeaseRef, MessageId, NewMessage, QueueName, SessionId};
use tokio::sync::oneshot;

use crate::actor::{Cmd, QueueHandle, TxDecision};
use crate::broker::Broker;
use crate::error::Error;
use crate::log::{LogError, LogSync, NodeLog, QueueLog};

impl Broker {
    /// Stages sends of a transacted session: invisible until [`Broker::commit`]. Returns their
    /// ids and the run of the back-end that staged them (what the commit must name; see
    /// [`Broker::queue_incarnation`]), read from the same lookup the sends went through.
    pub async fn stage(
        &self,
        queue: &QueueName,
        session: SessionId,
        messages: Vec<NewMessage>,
    ) -> Result<(Vec<MessageId>, u64), Error> {
        let (handle, durable, incarnation) = self.handle_for_send(queue, &messages)?;
        let ids = handle
            .call(|reply| Cmd::Stage {
                session,
                messages,
                reply,
            })
            .await?;
        if durable {
            self.inner.gate.staged(session);
        }
        Ok((ids, incarnation))
    }

    /// Commits a transacted session's work on these queues (its staged sends in each, and the
    /// acknowledgements it names) atomically: every queue agrees first, then all their writes go
    /// to disk in one batch. If any acknowledgement is stale nothing changes and the error says
    /// which; the caller rolls back.
    ///
    /// Queues are asked in name order, so two transactions over the same queues can never wait
    /// for each other. Runs to its end even if the caller stops waiting.
    ///
    /// `incarnation`: the run of this back-end that staged the transaction's sends (0: it staged
    /// none). If the back-end restarted since, those sends are gone: the commit is refused with
    /// [`Error::TransactionFenced`] and rolled back.
    pub async fn commit(
        &self,
        session: SessionId,
        incarnation: u64,
        parts: Vec<(QueueName, Vec<LeaseRef>)>,
    ) -> Result<(), Error> {
        let merged = merge_parts(parts);
        let queues: Vec<QueueName> = merged.keys().cloned().collect();
        let (handles, log) = match self.commit_allowed(session, incarnation, merged) {
            Ok(allowed) => allowed,
            Err(e) => {
                self.rollback(session, &queues).await?;
                return Err(e);
            }
        };
        let broker = self.clone();
        tokio::spawn(async move {
            let decisions = match prepare_all(session, handles).await {
                Ok(decisions) => decisions,
                Err(e) => {
                    // A refused commit rolls the whole transaction back here, so its staged
                    // sends can never be published by a later commit of the session.
                    if let Err(r) = broker.rollback(session, &queues).await {
                        tracing::warn!(%session, error = %r, "rolling back a refused commit failed");
                    }
                    return Err(e);
                }
            };
            write_decided(&log, decisions).await.map_err(Error::from)
        })
        .await
        .map_err(|_| Error::ShuttingDown)?
    }

    /// Whether the transaction may commit at all (its queues still here, served by the run
    /// that staged its sends, all writing through one log; room on disk): the owner task of
    /// each queue with the acks to make there, and the log the commit is written through.
    fn commit_allowed(
        &self,
        session: SessionId,
        incarnation: u64,
        merged: BTreeMap<QueueName, Vec<LeaseRef>>,
    ) -> Result<(Vec<QueuePart>, NodeLog), Error> {
        let fenced = || Error::TransactionFenced {
            session: session.to_string(),
        };
        if incarnation != 0
            && incarnation != self.inner.queues.incarnation
            && !self.serves_run(incarnation)
        {
            return Err(fenced());
        }
        self.inner.gate.before_tx_commit(session)?;
        let mut handles = Vec::with_capacity(merged.len());
        let mut log: Option<(QueueName, NodeLog)> = None;
        for (queue, acks) in merged {
            match self.inner.queues.owned(&queue) {
                Ok(o) => {
                    match &log {
                        Some((first, l)) if l.shard() != o.log.shard() => {
                            return Err(Error::TransactionAcrossLogs {
                                first: first.to_string(),
                                second: queue.to_string(),
                            })
                        }
                        Some(_) => {}
                        None => log = Some((queue.clone(), o.log.clone())),
                    }
                    // A shard queue served since a leader change lost what was staged in it.
                    if incarnation != 0 && o.incarnation != incarnation {
                        return Err(fenced());
                    }
                    handles.push((o.handle, acks));
                }
                // A queue deleted meanwhile has no staged sends left; its acks cannot succeed.
                Err(Error::QueueNotFound { .. }) if acks.is_empty() => {}
                Err(e) => return Err(e),
            }
        }
        let log = log.map_or_else(|| NodeLog::Local(self.inner.queues.log.clone()), |(_, l)| l);
        Ok((handles, log))
    }

    /// Rolls back a transacted session's work on these queues: staged sends are dropped and
    /// what it received comes back through each queue's redelivery policy. Queues that no longer
    /// exist are skipped. Returns how many messages came back.
    pub async fn rollback(&self, session: SessionId, queues: &[QueueName]) -> Result<u64, Error> {
        self.inner.gate.tx_ended(session);
        let mut released = 0;
        for q in queues {
            if let Some(h) = self.handle_if_here(q)? {
                released += h.call(|reply| Cmd::Rollback { session, reply }).await?;
            }
        }
        Ok(released)
    }
}

/// A queue's owner task with the acknowledgements a commit makes there.
type QueuePart = (QueueHandle, Vec<LeaseRef>);

/// One part per queue, in name order (a queue asked twice would wait for itself), one ack per
/// delivery.
fn merge_parts(parts: Vec<(QueueName, Vec<LeaseRef>)>) -> BTreeMap<QueueName, Vec<LeaseRef>> {
    let mut merged: BTreeMap<QueueName, Vec<LeaseRef>> = BTreeMap::new();
    let mut seen = HashSet::new();
    for (queue, acks) in parts {
        let all = merged.entry(queue).or_default();
        all.extend(acks.into_iter().filter(|a| seen.insert(*a)));
    }
    merged
}

/// The first phase: each queue checks its part and, if it agrees, holds still until told the
/// decision. On the first refusal the queues that agreed are told to abort.
async fn prepare_all(
    session: SessionId,
    handles: Vec<(QueueHandle, Vec<LeaseRef>)>,
) -> Result<Vec<oneshot::Sender<TxDecision>>, Error> {
    let mut decisions = Vec::with_capacity(handles.len());
    for (h, acks) in handles {
        let (decide, decision) = oneshot::channel();
        let prepared = h
            .call(|reply| Cmd::TxPrepare {
                session,
                acks,
                reply,
                decision,
            })
            .await;
        if let Err(e) = prepared {
            for d in decisions {
                let _ = oneshot::Sender::send(d, TxDecision::Abort);
            }
            return Err(e);
        }
        decisions.push(decide);
    }
    Ok(decisions)
}

/// The second phase: every queue hands over its writes, they go to disk in one batch, and each
/// queue learns when it is durable (and goes on only once the batch is queued, so no later
/// write of the queue can reach the disk before it).
async fn write_decided(
    log: &impl QueueLog,
    decisions: Vec<oneshot::Sender<TxDecision>>,
) -> Result<(), LogError> {
    let mut writes = Vec::with_capacity(decisions.len());
    let mut submitted = Vec::with_capacity(decisions.len());
    let mut durables = Vec::with_capacity(decisions.len());
    for d in decisions {
        let (ops_tx, ops_rx) = oneshot::channel();
        let (submitted_tx, submitted_rx) = oneshot::channel();
        let (durable_tx, durable_rx) = oneshot::channel();
        let _ = d.send(TxDecision::Commit {
            ops: ops_tx,
            submitted: submitted_rx,
            durable: durable_rx,
        });
        writes.push(ops_rx);
        submitted.push(submitted_tx);
        durables.push(durable_tx);
    }
    let mut ops = Vec::new();
    for w in writes {
        ops.extend(w.await.unwrap_or_default());
    }
    let ticket = if ops.is_empty() {
        None
    } else {
        Some(log.submit(ops, LogSync::Now).await)
    };
    for s in submitted {
        let _ = s.send(());
    }
    let written = match ticket {
        None => Ok(()),
        Some(Ok(durable)) => durable.await,
        Some(Err(e)) => Err(e),
    };
    for d in durables {
        let _ = d.send(written.clone());
    }
    written
}
