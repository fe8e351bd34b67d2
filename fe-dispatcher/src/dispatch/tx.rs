//! Transactions: `Commit` and `Rollback` of a transacted session, at the one back-end its
//! transaction lives on.

use std::collections::BTreeMap;
use std::str::FromStr;

use ferry_kernel::{QueueName, ReceiptHandle, SessionId};
use ferry_proto::pb;
use tonic::{Request, Status};

use super::{count_u32, session_id, Dispatch};
use crate::error::Error;
use crate::sessions::Transaction;

impl Dispatch {
    pub(crate) async fn commit(&self, r: pb::CommitRequest) -> Result<pb::CommitResponse, Status> {
        let id = session_id(&r.session_id)?;
        self.sessions.use_session(id, None)?;
        for h in &r.receipt_handles {
            ReceiptHandle::from_str(h).map_err(Error::from)?;
        }
        let mut tx = self.sessions.tx_take(id)?;
        tx.acks.extend(r.receipt_handles);
        let Err(e) = self.commit_tx(id, &tx).await else {
            return Ok(pb::CommitResponse {});
        };
        // JMS: a commit that fails rolls the transaction back (the back-end already did, if it
        // refused; this covers a commit that never reached it).
        if self.rollback_tx(id, &tx).await.is_err() {
            self.sessions.tx_restore(id, tx);
        }
        Err(Error::RolledBack {
            session: id.to_string(),
            reason: e.message().to_owned(),
        }
        .into())
    }

    pub(crate) async fn rollback(
        &self,
        r: pb::RollbackRequest,
    ) -> Result<pb::RollbackResponse, Status> {
        let id = session_id(&r.session_id)?;
        self.sessions.use_session(id, None)?;
        let tx = self.sessions.tx_take(id)?;
        let redelivered = match self.rollback_tx(id, &tx).await {
            Ok(n) => n,
            Err(e) => {
                self.sessions.tx_restore(id, tx);
                return Err(e);
            }
        };
        Ok(pb::RollbackResponse {
            redelivered: count_u32(redelivered),
        })
    }

    /// Commits a transaction at its back-end: its staged sends and held acknowledgements (whose
    /// queues must all live on that back-end), at once.
    async fn commit_tx(&self, id: SessionId, tx: &Transaction) -> Result<(), Status> {
        let mut by_queue: BTreeMap<QueueName, Vec<String>> =
            tx.queues.iter().map(|q| (q.clone(), vec![])).collect();
        for h in &tx.acks {
            let r = ReceiptHandle::from_str(h).map_err(Error::from)?;
            by_queue.entry(r.queue).or_default().push(h.clone());
        }
        let Some(first) = by_queue.keys().next().cloned() else {
            return Ok(()); // nothing was done in this transaction
        };
        // One call, to the owner of the first queue; each try checks that the others live there
        // too, in the placement it is made with.
        self.router
            .call(&first, |be, _| {
                let req = self.commit_request(id, tx, &first, &by_queue);
                async move { be.commit(Request::new(req?)).await }
            })
            .await?;
        Ok(())
    }

    /// The commit of `tx` at the owner of `first`, each queue with its placement epoch; fails
    /// if a queue lives elsewhere.
    fn commit_request(
        &self,
        id: SessionId,
        tx: &Transaction,
        first: &QueueName,
        by_queue: &BTreeMap<QueueName, Vec<String>>,
    ) -> Result<pb::BackendCommitRequest, Status> {
        let placement = self.router.placement();
        let node = placement.owner_of(first).node;
        let mut queues = Vec::with_capacity(by_queue.len());
        for (queue, receipt_handles) in by_queue {
            let owner = placement.owner_of(queue);
            if owner.node != node {
                return Err(Error::TransactionSpansBackends {
                    session: id.to_string(),
                    first: node,
                    queue: queue.to_string(),
                    second: owner.node,
                }
                .into());
            }
            queues.push(pb::BackendTxQueue {
                queue: queue.to_string(),
                receipt_handles: receipt_handles.clone(),
                placement_epoch: owner.epoch.get(),
            });
        }
        Ok(pb::BackendCommitRequest {
            session_id: id.to_string(),
            incarnation: tx.incarnation,
            queues,
        })
    }

    /// Rolls back a transaction at the back-ends of its queues. Returns how many messages come
    /// back.
    async fn rollback_tx(&self, id: SessionId, tx: &Transaction) -> Result<u64, Status> {
        if tx.node.is_none() {
            return Ok(0);
        }
        let session_id = id.to_string();
        let answers = self
            .router
            .call_each(tx.queues.iter().cloned().collect(), |be, queues| {
                let (queues, placement_epochs) = queues
                    .into_iter()
                    .map(|(q, epoch)| (q.to_string(), epoch.get()))
                    .unzip();
                let req = pb::BackendRollbackRequest {
                    session_id: session_id.clone(),
                    queues,
                    placement_epochs,
                };
                async move { be.rollback(Request::new(req)).await }
            })
            .await;
        let mut count = 0;
        for (_, answer) in answers {
            match answer {
                Ok(r) => count += r.count,
                Err(e) => {
                    tracing::warn!(session = %self.sessions.public_session(id), error = %e, "could not roll back a transaction; its leases return when they expire");
                    return Err(e);
                }
            }
        }
        Ok(count)
    }
}
