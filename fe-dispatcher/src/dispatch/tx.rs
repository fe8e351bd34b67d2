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

    /// Commits a transaction at its back-end: its staged sends and held acknowledgements (which
    /// must all belong to that back-end), at once.
    async fn commit_tx(&self, id: SessionId, tx: &Transaction) -> Result<(), Status> {
        let mut by_queue: BTreeMap<QueueName, Vec<String>> =
            tx.queues.iter().map(|q| (q.clone(), vec![])).collect();
        let mut node = tx.node.clone();
        for h in &tx.acks {
            let r = ReceiptHandle::from_str(h).map_err(Error::from)?;
            match &node {
                Some(n) if *n != r.node => {
                    return Err(Error::TransactionSpansBackends {
                        session: id.to_string(),
                        first: n.clone(),
                        queue: r.queue.to_string(),
                        second: r.node,
                    }
                    .into())
                }
                Some(_) => {}
                None => node = Some(r.node.clone()),
            }
            by_queue.entry(r.queue).or_default().push(h.clone());
        }
        let Some(node) = node else {
            return Ok(()); // nothing was done in this transaction
        };
        let req = pb::BackendCommitRequest {
            session_id: id.to_string(),
            incarnation: tx.incarnation,
            queues: by_queue
                .into_iter()
                .map(|(queue, receipt_handles)| pb::BackendTxQueue {
                    queue: queue.to_string(),
                    receipt_handles,
                })
                .collect(),
        };
        self.router.node(&node)?.commit(Request::new(req)).await?;
        Ok(())
    }

    /// Rolls back a transaction at its back-end. Returns how many messages come back.
    async fn rollback_tx(&self, id: SessionId, tx: &Transaction) -> Result<u64, Status> {
        let Some(node) = &tx.node else {
            return Ok(0);
        };
        let req = pb::BackendRollbackRequest {
            session_id: id.to_string(),
            queues: tx.queues.iter().map(ToString::to_string).collect(),
        };
        let out = self.router.node(node)?.rollback(Request::new(req)).await;
        match out {
            Ok(r) => Ok(r.into_inner().count),
            Err(e) => {
                tracing::warn!(session = %self.sessions.public_session(id), error = %e, "could not roll back a transaction; its leases return when they expire");
                Err(e)
            }
        }
    }
}
