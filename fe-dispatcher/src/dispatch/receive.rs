//! Unary `Receive`: a long poll at the owning back-end, bounded by the asked wait and the call's
//! deadline, ended with UNAVAILABLE when the node stops. Every receive of a session, unary or
//! on a `Consume` stream, goes through [`Dispatch::receive_at`], which gives back what an
//! earlier receive of the session lost with its answer at a replicated queue.

use std::future::Future;
use std::time::Duration;

use ferry_kernel::{PlacementEpoch, QueueName, SessionId};
use ferry_proto::pb;
use tokio::time::Instant;
use tonic::{Code, Request, Response, Status};

use super::{queue_name, Dispatch};
use crate::error::Error;
use crate::sessions::Sessions;
use crate::BackendRef;

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
        let until = deadline.map(|d| Instant::now() + d);
        let receive = self.receive_at(session, &queue, until, |be, placement_epoch| {
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
                fwd.set_timeout(until.saturating_duration_since(Instant::now()));
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

    /// One receive at `queue`'s owner for `session` (`f` makes it, as for
    /// `Router::call_until`). A session's receive first gives back what an earlier one lost
    /// there ([`Self::release_lost`]); one that ends UNAVAILABLE at a replicated queue having
    /// perhaps acted (the link to the shard's leader broke under it, or the shard could not
    /// confirm its write: `remote::may_have_acted`), or that is dropped before its answer
    /// came, is noted, so that the next one does. Such a
    /// receive's deliveries may be written leases, which the queue's next leader honours: left
    /// alone, they would return only when their leases run out (30 s by default). A queue kept
    /// by one node writes no lease: its next run holds none of them, and nothing is noted.
    pub(crate) async fn receive_at<F, Fut>(
        &self,
        session: Option<SessionId>,
        queue: &QueueName,
        until: Option<Instant>,
        f: F,
    ) -> Result<pb::BackendReceiveResponse, Status>
    where
        F: FnMut(BackendRef, PlacementEpoch) -> Fut,
        Fut: Future<Output = Result<Response<pb::BackendReceiveResponse>, Status>>,
    {
        let Some(sid) = session else {
            return self.router.call_until(queue, until, f).await;
        };
        self.release_lost(sid, queue).await;
        let replicated = self.router.placement().shard_of(queue).is_some();
        // Dropped before it is answered (the `Consume` stream it serves ended, say, on an ack
        // that failed with the same dead leader), it may have left written leases at a back-end
        // that can no longer take them back when it sees the call cancelled.
        let mut unanswered = NoteLost {
            sessions: &self.sessions,
            session: sid,
            queue,
            armed: replicated,
        };
        let answer = self.router.call_until(queue, until, f).await;
        unanswered.armed = false;
        if let Err(status) = &answer {
            if replicated && crate::remote::may_have_acted(status) {
                tracing::info!(%queue, session = %self.sessions.public_session(sid), error = %status, "a receive lost its answer; its deliveries go back at the session's next receive there");
                self.sessions.note_answer_lost(sid, queue);
            }
        }
        answer
    }

    /// If a receive of `session` at `queue` lost its answer: asks the back-end now serving the
    /// queue to give back the session's deliveries there that an earlier run of the queue made,
    /// except those this front-end passed on to the client (`BackendReleaseLostRequest`). Its
    /// deliveries of the current run are never given back, so a receive of the same session on
    /// another stream, served there meanwhile, keeps what it got. Asked again before the next
    /// receive if the back-end could not be reached (or this one was dropped before it was
    /// answered); other refusals (a node of an older release, a queue deleted) leave the
    /// deliveries to their leases.
    async fn release_lost(&self, session: SessionId, queue: &QueueName) {
        let Some(held) = self.sessions.take_answer_lost(session, queue) else {
            return;
        };
        let mut again = NoteLost {
            sessions: &self.sessions,
            session,
            queue,
            armed: true,
        };
        let (held_seqs, held_leases): (Vec<u64>, Vec<u64>) =
            held.iter().map(|(s, l)| (s.0, l.0)).unzip();
        let answer = self
            .router
            .call(queue, |be, placement_epoch| {
                let req = pb::BackendReleaseLostRequest {
                    queue: queue.to_string(),
                    session_id: session.to_string(),
                    held_seqs: held_seqs.clone(),
                    held_leases: held_leases.clone(),
                    placement_epoch: placement_epoch.get(),
                };
                async move { be.release_lost(Request::new(req)).await }
            })
            .await;
        let shown = self.sessions.public_session(session);
        match answer {
            Ok(r) => {
                again.armed = false;
                tracing::info!(%queue, session = %shown, returned = r.count, kept = held.len(), "gave back the deliveries a receive lost with its answer");
            }
            Err(status) => {
                again.armed = status.code() == Code::Unavailable;
                tracing::warn!(%queue, session = %shown, error = %status, ask_again = again.armed, "could not give back the deliveries a receive lost with its answer");
            }
        }
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

/// Notes that a receive of `session` at `queue` may have lost its answer when dropped armed:
/// a receive dropped before its answer came, or a give-back dropped before it was done (see
/// [`Dispatch::release_lost`]).
struct NoteLost<'a> {
    sessions: &'a Sessions,
    session: SessionId,
    queue: &'a QueueName,
    armed: bool,
}

impl Drop for NoteLost<'_> {
    fn drop(&mut self) {
        if self.armed {
            self.sessions.note_answer_lost(self.session, self.queue);
        }
    }
}
