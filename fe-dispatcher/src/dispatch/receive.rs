//! Unary `Receive`: a long poll at the owning back-end, bounded by the asked wait and the call's
//! deadline, ended with UNAVAILABLE when the node stops.

use std::time::Duration;

use ferry_proto::pb;
use tonic::{Request, Status};

use super::{queue_name, Dispatch};
use crate::error::Error;

impl Dispatch {
    /// `deadline`: the time the client gave the call, if it set one.
    pub(crate) async fn receive(
        &self,
        r: pb::ReceiveRequest,
        deadline: Option<Duration>,
    ) -> Result<pb::ReceiveResponse, Status> {
        let queue = queue_name(&r.queue)?;
        let wait_ms = self.backend_wait(r.wait_ms, deadline)?;
        let session = self.touch_session(&r.session_id, Some(&queue))?;
        if let Some(sid) = session {
            self.sessions
                .tx_touch(sid, &queue, &self.router.owner_of(&queue).node)?;
        }
        let until = deadline.map(|d| tokio::time::Instant::now() + d);
        let receive = self
            .router
            .call_until(&queue, until, |be, placement_epoch| {
                let mut fwd = Request::new(pb::BackendReceiveRequest {
                    queue: r.queue.clone(),
                    session_id: r.session_id.clone(),
                    selector: r.selector.clone(),
                    max_messages: r.max_messages,
                    wait_ms,
                    lease_ms: r.lease_ms,
                    clamp_max_messages: false,
                    consumer: 0,
                    placement_epoch: placement_epoch.get(),
                });
                if let Some(until) = until {
                    fwd.set_timeout(until.saturating_duration_since(tokio::time::Instant::now()));
                }
                async move { be.receive(fwd).await }
            });
        let mut stopping = self.stopping.clone();
        let deliveries = tokio::select! {
            out = receive => out?.deliveries,
            // The node is stopping: the long poll ends at once (dropping the receive removes it),
            // with an error, so the receiver does not take it for "no message came".
            () = crate::stopped(&mut stopping) => return Err(self.stopping_status()),
        };
        if let Some(sid) = session {
            self.sessions
                .note_delivered(sid, deliveries.iter().map(|d| d.receipt_handle.as_str()));
        }
        Ok(pb::ReceiveResponse { deliveries })
    }

    /// The back-end wait for a receive: the asked wait, bounded by the call's deadline (less a
    /// margin so the empty answer arrives in time). `None`: until cancelled.
    fn backend_wait(
        &self,
        wait_ms: Option<i64>,
        deadline: Option<Duration>,
    ) -> Result<Option<u64>, Status> {
        let asked = match wait_ms {
            Some(w) if w < 0 => return Err(Error::NegativeWait { wait_ms: w }.into()),
            Some(w) => Some(w.unsigned_abs()),
            None => None,
        };
        let by_deadline = deadline.map(|d| {
            let ms = u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
            // At least 1 ms, so a short deadline still waits a little rather than not at all.
            ms.saturating_sub(self.config.deadline_margin_ms.min(ms / 10))
                .max(1)
        });
        Ok(match (asked, by_deadline) {
            (Some(0), _) => Some(0),
            (Some(a), Some(d)) => Some(a.min(d)),
            (a, d) => a.or(d),
        })
    }
}
