//! Connections and sessions: open, heartbeat, close, recover; and telling the back-ends that a
//! session ended (its leases return at once) or is alive (its leases are renewed).

use std::collections::HashMap;
use std::time::Duration;

use ferry_kernel::{LeaseId, QueueName, Seq, SessionId};
use ferry_proto::pb;
use tonic::{Request, Status};

use super::{count_u32, session_id, Dispatch};
use crate::sessions::{Closed, Held};

impl Dispatch {
    pub(crate) fn open_connection(
        &self,
        r: pb::OpenConnectionRequest,
    ) -> Result<pb::OpenConnectionResponse, Status> {
        let (connection_id, lease_ms) = self.sessions.open(r.client_id, r.lease_ms)?;
        Ok(pb::OpenConnectionResponse {
            connection_id,
            lease_ms,
            node_id: self.router.local_node().to_string(),
        })
    }

    pub(crate) async fn heartbeat(
        &self,
        r: pb::HeartbeatRequest,
    ) -> Result<pb::HeartbeatResponse, Status> {
        let connection = r.connection_id;
        let at = self.sessions.touch(&connection)?;
        // A consumer heartbeat: the connection's sessions are alive, so the leases of the
        // deliveries they were given are renewed (each for its own length).
        for (session, held) in self.sessions.connection_held(&connection)? {
            self.renew_held(session, held).await;
        }
        let left = at.saturating_duration_since(tokio::time::Instant::now());
        let lease_expires_at_ms =
            self.clock.now_ms() + u64::try_from(left.as_millis()).unwrap_or(0);
        Ok(pb::HeartbeatResponse {
            lease_expires_at_ms,
        })
    }

    pub(crate) async fn close_connection(
        &self,
        r: pb::CloseConnectionRequest,
    ) -> Result<pb::CloseConnectionResponse, Status> {
        let closed = self.sessions.close_connection(&r.connection_id)?;
        self.release(closed).await;
        Ok(pb::CloseConnectionResponse {})
    }

    pub(crate) fn create_session(
        &self,
        r: pb::CreateSessionRequest,
    ) -> Result<pb::CreateSessionResponse, Status> {
        let mode = pb::AckMode::try_from(r.ack_mode).map_err(|_| {
            Status::invalid_argument(format!("ack_mode {} is not an ack mode", r.ack_mode))
        })?;
        let id = self.sessions.create_session(&r.connection_id, mode)?;
        Ok(pb::CreateSessionResponse {
            session_id: id.to_string(),
        })
    }

    pub(crate) async fn close_session(
        &self,
        r: pb::CloseSessionRequest,
    ) -> Result<pb::CloseSessionResponse, Status> {
        let closed = self.sessions.close_session(session_id(&r.session_id)?)?;
        let released = self.release(closed).await;
        Ok(pb::CloseSessionResponse {
            released: count_u32(released),
        })
    }

    pub(crate) async fn recover(
        &self,
        r: pb::RecoverRequest,
    ) -> Result<pb::RecoverResponse, Status> {
        let id = session_id(&r.session_id)?;
        self.sessions.use_session(id, None)?;
        let queues = self.sessions.session_queues(id)?;
        let n = self.release_session_queues(id, queues, true).await;
        Ok(pb::RecoverResponse {
            redelivered: count_u32(n),
        })
    }

    /// Checks the session `id` names (empty: none) and renews its connection; with `queue`,
    /// remembers the session may hold leases there.
    pub(crate) fn touch_session(
        &self,
        id: &str,
        queue: Option<&QueueName>,
    ) -> Result<Option<SessionId>, Status> {
        if id.is_empty() {
            return Ok(None);
        }
        let sid = session_id(id)?;
        self.sessions.use_session(sid, queue)?;
        Ok(Some(sid))
    }

    /// Closes connections whose lease ran out, every `period`, for ever.
    pub(crate) async fn reap_expired_connections(&self, period: Duration) {
        let mut tick = tokio::time::interval(period);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            for (_, closed) in self.sessions.close_expired(tokio::time::Instant::now()) {
                self.release(closed).await;
            }
        }
    }

    /// Tells the back-ends that sessions ended (their leases return at once) and deletes the
    /// temporary queues of a closed connection. Returns how many messages were released.
    pub(crate) async fn release(&self, closed: Closed) -> u64 {
        let mut released = 0;
        for (session, queues) in closed.sessions {
            released += self.release_session_queues(session, queues, false).await;
        }
        for q in closed.temporary_queues {
            let deleted = self
                .router
                .call(&q, |be, placement_epoch| {
                    let req = pb::BackendQueueRequest {
                        name: q.to_string(),
                        placement_epoch: placement_epoch.get(),
                        wait_placed_ms: 0,
                        wait_settings: None,
                    };
                    async move { be.delete_queue(Request::new(req)).await }
                })
                .await;
            if let Err(e) = deleted {
                tracing::warn!(queue = %q, error = %e, "could not delete a temporary queue");
            }
        }
        released
    }

    async fn release_session_queues(
        &self,
        session: SessionId,
        queues: Vec<QueueName>,
        recover: bool,
    ) -> u64 {
        self.session_queues_op(session, queues, recover).await
    }

    /// Tells the back-ends holding deliveries passed on to a session's client that it is alive:
    /// they renew those leases, and name the ones already settled, which are forgotten here.
    /// A back-end that cannot be reached is not retried: its own timers return the deliveries if
    /// the session stays out of touch longer than their leases.
    async fn renew_held(&self, session: SessionId, held: Held) -> u64 {
        let session_id = session.to_string();
        let by_queue: HashMap<QueueName, Vec<(Seq, LeaseId)>> = held.into_iter().collect();
        let queues = by_queue.keys().cloned().collect();
        let answers = self
            .router
            .call_each(queues, |be, queues| {
                let mut req = pb::BackendReleaseSessionRequest {
                    session_id: session_id.clone(),
                    renew: true,
                    ..Default::default()
                };
                for (q, epoch) in queues {
                    let refs = by_queue.get(&q).map(Vec::as_slice).unwrap_or_default();
                    req.held.push(pb::BackendDeliveryRefs {
                        queue: q.to_string(),
                        seqs: refs.iter().map(|(s, _)| s.0).collect(),
                        leases: refs.iter().map(|(_, l)| l.0).collect(),
                    });
                    req.queues.push(q.to_string());
                    req.placement_epochs.push(epoch.get());
                }
                async move { be.release_session(Request::new(req)).await }
            })
            .await;
        let mut renewed = 0;
        for (node, answer) in answers {
            match answer {
                Ok(r) => {
                    renewed += r.count;
                    for gone in r.not_held {
                        let Ok(q) = QueueName::new(gone.queue) else {
                            continue;
                        };
                        let refs: Vec<_> = gone
                            .seqs
                            .into_iter()
                            .zip(gone.leases)
                            .map(|(s, l)| (Seq(s), LeaseId(l)))
                            .collect();
                        self.sessions.forget_held(session, &q, &refs);
                    }
                }
                Err(e) => {
                    tracing::warn!(%node, session = %self.sessions.public_session(session), error = %e, "could not renew a session's leases")
                }
            }
        }
        renewed
    }

    async fn session_queues_op(
        &self,
        session: SessionId,
        queues: Vec<QueueName>,
        recover: bool,
    ) -> u64 {
        let session_id = session.to_string();
        let answers = self
            .router
            .call_each(queues, |be, queues| {
                let (queues, placement_epochs) = queues
                    .into_iter()
                    .map(|(q, epoch)| (q.to_string(), epoch.get()))
                    .unzip();
                let req = pb::BackendReleaseSessionRequest {
                    session_id: session_id.clone(),
                    queues,
                    recover,
                    renew: false,
                    held: vec![],
                    placement_epochs,
                };
                async move { be.release_session(Request::new(req)).await }
            })
            .await;
        let mut released = 0;
        for (node, answer) in answers {
            match answer {
                Ok(r) => released += r.count,
                // The back-end's own lease timers return the messages if it cannot be told.
                Err(e) => {
                    tracing::warn!(%node, session = %self.sessions.public_session(session), error = %e, "could not release a session's leases")
                }
            }
        }
        released
    }
}
