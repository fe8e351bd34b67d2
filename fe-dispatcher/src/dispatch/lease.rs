//! Acting on deliveries by receipt handle: ack, nack, extend lease (unary), and the shared
//! [`Dispatch::lease_op`] the `Consume` stream uses too.

use std::collections::BTreeMap;
use std::future::Future;
use std::str::FromStr;

use ferry_kernel::{QueueName, ReceiptHandle};
use ferry_proto::pb;
use tonic::{Request, Response, Status};

use super::Dispatch;
use crate::error::Error;
use crate::BackendRef;

/// What a unary call's error shows of its stale handles; the answer stays small however many
/// were named.
const STALE_SHOWN_MAX: usize = 5;

impl Dispatch {
    pub(crate) async fn ack(&self, r: pb::AckRequest) -> Result<pb::AckResponse, Status> {
        if let Some(sid) = self.touch_session(&r.session_id, None)? {
            // A transacted session's acknowledgements take effect at commit.
            for h in &r.receipt_handles {
                ReceiptHandle::from_str(h).map_err(Error::from)?;
            }
            if self.sessions.tx_hold_acks(sid, &r.receipt_handles)? {
                return Ok(pb::AckResponse {});
            }
        }
        self.by_receipts(&r.session_id, r.receipt_handles, |be, req| async move {
            be.ack(Request::new(req)).await
        })
        .await?;
        Ok(pb::AckResponse {})
    }

    pub(crate) async fn nack(&self, r: pb::NackRequest) -> Result<pb::NackResponse, Status> {
        self.touch_session(&r.session_id, None)?;
        let (delay_ms, dead_letter) = (r.delay_ms, r.dead_letter);
        if dead_letter && !r.reason.is_empty() {
            tracing::info!(reason = %ferry_kernel::shown(&r.reason), handles = r.receipt_handles.len(), "consumer rejected messages");
        }
        self.by_receipts(&r.session_id, r.receipt_handles, |be, req| async move {
            be.nack(Request::new(pb::BackendLeaseRequest {
                delay_ms,
                dead_letter,
                ..req
            }))
            .await
        })
        .await?;
        Ok(pb::NackResponse {})
    }

    pub(crate) async fn extend_lease(
        &self,
        r: pb::ExtendLeaseRequest,
    ) -> Result<pb::ExtendLeaseResponse, Status> {
        self.touch_session(&r.session_id, None)?;
        let lease_ms = r.lease_ms;
        let lease_expires_at_ms = self
            .by_receipts(&r.session_id, r.receipt_handles, |be, req| async move {
                be.extend_lease(Request::new(pb::BackendLeaseRequest { lease_ms, ..req }))
                    .await
            })
            .await?;
        Ok(pb::ExtendLeaseResponse {
            lease_expires_at_ms,
        })
    }

    /// Applies `op` to receipt handles for the session `session_id` names (empty: none), one
    /// call per queue, routed by the queue each handle names (never by the node written in it:
    /// the queue may have moved since). Returns the new lease expiry of each handle (0 where not
    /// applicable) and the handles that were not live deliveries of that session (or not
    /// receipt handles at all), with why.
    pub(crate) async fn lease_op<F, Fut>(
        &self,
        session_id: &str,
        handles: &[String],
        op: F,
    ) -> Result<(Vec<u64>, Vec<String>), Status>
    where
        F: Fn(BackendRef, pb::BackendLeaseRequest) -> Fut,
        Fut: Future<Output = Result<Response<pb::BackendLeaseResponse>, Status>>,
    {
        let mut groups: BTreeMap<QueueName, Vec<(usize, String)>> = BTreeMap::new();
        let mut expires = vec![0; handles.len()];
        let mut stale = vec![];
        for (i, h) in handles.iter().enumerate() {
            match ReceiptHandle::from_str(h) {
                Ok(r) => groups.entry(r.queue).or_default().push((i, h.clone())),
                // Answered for this handle alone: one bad handle on a stream must not end it
                // (and strand its deliveries until their leases run out).
                Err(e) => stale.push(format!("{} ({e})", ferry_kernel::shown(h))),
            }
        }
        for (queue, items) in groups {
            let receipt_handles: Vec<String> = items.iter().map(|(_, h)| h.clone()).collect();
            let resp = self
                .router
                .call(&queue, |be, placement_epoch| {
                    let req = pb::BackendLeaseRequest {
                        queue: queue.to_string(),
                        receipt_handles: receipt_handles.clone(),
                        session_id: session_id.to_owned(),
                        placement_epoch: placement_epoch.get(),
                        ..Default::default()
                    };
                    op(be, req)
                })
                .await?;
            for ((i, h), (err, at)) in items
                .iter()
                .zip(resp.errors.iter().zip(resp.lease_expires_at_ms))
            {
                if err.is_empty() {
                    expires[*i] = at;
                } else {
                    // A parsed handle is short (its queue name is bounded): given back whole,
                    // so a client can match it.
                    stale.push(format!("{h} ({err})"));
                }
            }
        }
        Ok((expires, stale))
    }

    /// [`Self::lease_op`] for a unary call: INVALID_ARGUMENT if a handle is not a receipt
    /// handle, FAILED_PRECONDITION if any was not a live delivery of the session.
    async fn by_receipts<F, Fut>(
        &self,
        session_id: &str,
        handles: Vec<String>,
        op: F,
    ) -> Result<Vec<u64>, Status>
    where
        F: Fn(BackendRef, pb::BackendLeaseRequest) -> Fut,
        Fut: Future<Output = Result<Response<pb::BackendLeaseResponse>, Status>>,
    {
        for h in &handles {
            ReceiptHandle::from_str(h).map_err(Error::from)?;
        }
        let (expires, stale) = self.lease_op(session_id, &handles, op).await?;
        if stale.is_empty() {
            return Ok(expires);
        }
        let mut detail = stale[..stale.len().min(STALE_SHOWN_MAX)].join("; ");
        if stale.len() > STALE_SHOWN_MAX {
            detail.push_str(&format!("; and {} more", stale.len() - STALE_SHOWN_MAX));
        }
        Err(Error::StaleReceipts {
            stale: stale.len(),
            total: handles.len(),
            detail,
        }
        .into())
    }
}
