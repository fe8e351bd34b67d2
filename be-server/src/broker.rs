//! The back-end's front door: every operation on a queue, routed to the queue's owner task
//! (`actor.rs`) through the registry of the queues this back-end owns (`queues.rs`).
//! Transactions are in `tx.rs`.

use std::sync::Arc;

use ferry_kernel::{
    Caller, ClockRef, Delivery, LeaseId, LeaseRef, MessageId, NewMessage, NodeId, PlacementEpoch,
    QueueConfig, QueueName, QueueStats, ReceiveRequest, Seq, SessionId,
};
use ferry_store::{GroupCommit, QueueStore};

use crate::actor::{AdminCmd, Browsed, Cmd, LeaseCmd, LeaseResults, QueueHandle};
use crate::config::BrokerConfig;
use crate::disk::{DiskGuard, SendGate};
use crate::error::Error;
use crate::history::History;
use crate::log::LocalLog;
use crate::outbox::Outbox;
use crate::queues::{Queues, Recovered};

pub use crate::queues::QueueSummary;

/// Deliveries named by queue, message and lease (a renewal's, or what it found gone).
pub type DeliveryRefs = Vec<(QueueName, Vec<(Seq, LeaseId)>)>;

/// The secret a queue's receipt handles are checked with ([`Broker::handle_key`]). Its `Debug`
/// shows nothing of it.
#[derive(Clone, Copy)]
pub struct HandleKey((u64, u64));

impl std::fmt::Debug for HandleKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("HandleKey(..)")
    }
}

/// See the module docs. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Broker {
    pub(crate) inner: Arc<Inner>,
}

#[derive(Debug)]
pub(crate) struct Inner {
    pub(crate) queues: Arc<Queues>,
    /// Refuses sends while the disk is short of space.
    pub(crate) gate: SendGate,
    /// The secret receipt handles' check values are computed with (see `handle_tag`).
    handle_key: (u64, u64),
}

/// Group commit's counters (see `ferry_store::GroupCommitStats`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CommitCounts {
    /// Synced writes (and log syncs) made.
    pub writes: u64,
    /// Submissions the synced writes carried.
    pub submissions: u64,
    /// Deferred submissions applied without a sync of their own.
    pub deferred: u64,
    /// Log syncs made for deferred submissions alone.
    pub deferred_syncs: u64,
    /// Raft rounds that only applied, written without a sync of their own.
    pub replayable: u64,
}

impl Broker {
    /// Recovers every queue from `store` and starts serving them. Writes go through `commit`,
    /// the node's group-commit writer on the same store (the node starts it, and stops it after
    /// [`Broker::shutdown`]); time is read from `clock`.
    pub async fn open(
        config: BrokerConfig,
        store: Arc<dyn QueueStore>,
        commit: GroupCommit,
        clock: ClockRef,
    ) -> Result<Self, Error> {
        let recovered = recover(&*store, clock.now_ms())?;
        let disk = match &config.disk_guard_dir {
            Some(dir) if config.disk_free_min_bytes > 0 => {
                Some(tokio::task::block_in_place(|| {
                    DiskGuard::new(dir.clone(), config.disk_free_min_bytes)
                }))
            }
            _ => None,
        };
        let history = Arc::new(History::new(
            config.history_retention_ms,
            config.history_max_steps,
        ));
        let (outbox, jobs) = Outbox::new(history);
        let log = LocalLog::new(commit);
        let queues = Arc::new(Queues::recover(
            config, log, outbox, clock, store, recovered,
        ));
        crate::dead_letter::start(Arc::downgrade(&queues), jobs);
        queues.create_missing_targets().await?;
        Ok(Self {
            inner: Arc::new(Inner {
                queues,
                gate: SendGate::new(disk),
                handle_key: (rand::random(), rand::random()),
            }),
        })
    }

    /// The secret receipt handles of `queue` are checked with (see [`Broker::handle_tag`]): a
    /// replicated queue's own, drawn when it was created and kept by every replica, so its
    /// handles stay good across a failover; otherwise this run's.
    pub fn handle_key(&self, queue: &QueueName) -> HandleKey {
        let kept = self.inner.queues.handle_key_of(queue);
        HandleKey(kept.unwrap_or(self.inner.handle_key))
    }

    /// The check value of a receipt handle for this delivery (`ReceiptHandle::tag`): SipHash-2-4
    /// keyed with its queue's [`Broker::handle_key`], so a handle cannot be made up from what is
    /// visible of a message (queue uid and sequence in its id, the delivery count in a browse).
    pub fn handle_tag(&self, key: HandleKey, lease: &LeaseRef) -> u64 {
        use std::hash::Hasher as _;
        let HandleKey((k0, k1)) = key;
        let mut h = siphasher::sip::SipHasher24::new_with_keys(k0, k1);
        h.write_u64(lease.queue.0);
        h.write_u64(lease.seq.0);
        h.write_u64(lease.lease.0);
        h.write_u32(lease.delivery_count);
        h.finish()
    }

    /// This run of the back-end (random, never 0): what lives only in memory (a transaction's
    /// staged sends) is fenced by it, and a commit naming another run answers ABORTED.
    pub fn incarnation(&self) -> u64 {
        self.inner.queues.incarnation
    }

    /// The run serving `queue` (see [`Broker::incarnation`]): for a replicated queue, the run
    /// that began when this node last started to lead its shard. What a send answers.
    pub fn queue_incarnation(&self, queue: &QueueName) -> u64 {
        self.inner
            .queues
            .owned(queue)
            .map_or(self.incarnation(), |o| o.incarnation)
    }

    /// The clock this back-end reads.
    pub fn clock(&self) -> &ClockRef {
        &self.inner.queues.clock
    }

    /// The steps kept of a message's life on this back-end, oldest first.
    pub fn message_history(&self, id: &str) -> Vec<crate::history::Step> {
        self.inner.queues.outbox.history.get(id)
    }

    /// Completes once [`Broker::shutdown`] began: streams end with UNAVAILABLE then.
    pub fn stopped(&self) -> impl std::future::Future<Output = ()> + Send + 'static {
        self.inner.queues.stopped()
    }

    /// Dead letters and expiries from now on, as they become durable.
    pub fn subscribe_events(&self) -> tokio::sync::broadcast::Receiver<crate::BrokerEvent> {
        self.inner.queues.outbox.subscribe()
    }

    /// Tells watchers that this node began to lead queue shard `shard` at `term` (`detail`
    /// says who led before), as a `shard-leader` event.
    pub fn shard_leader_event(&self, shard: crate::ShardId, term: u64, detail: String) {
        self.inner.queues.outbox.event(crate::BrokerEvent {
            at_ms: self.clock().now_ms(),
            kind: "shard-leader",
            queue: None,
            shard: Some(shard),
            value: term,
            message_id: String::new(),
            reason: "",
            detail,
        });
    }

    /// Tells watchers that queue shard `shard`, which this node leads, is short of copies
    /// (`under`: `shard-under-replicated`) or whole again (`shard-replicated`), with `whole`
    /// replicas up and voting; `detail` says what it lacks.
    pub fn shard_replication_event(
        &self,
        shard: crate::ShardId,
        under: bool,
        whole: u64,
        detail: String,
    ) {
        self.inner.queues.outbox.event(crate::BrokerEvent {
            at_ms: self.clock().now_ms(),
            kind: if under {
                "shard-under-replicated"
            } else {
                "shard-replicated"
            },
            queue: None,
            shard: Some(shard),
            value: whole,
            message_id: String::new(),
            reason: "",
            detail,
        });
    }

    /// Group commit's counters since the node started.
    pub fn commit_stats(&self) -> CommitCounts {
        let s = self.inner.queues.log.group_commit().stats();
        let load = |c: &std::sync::atomic::AtomicU64| c.load(std::sync::atomic::Ordering::Relaxed);
        CommitCounts {
            writes: load(&s.writes),
            submissions: load(&s.submissions),
            deferred: load(&s.deferred),
            deferred_syncs: load(&s.deferred_syncs),
            replayable: load(&s.replayable),
        }
    }

    /// Time of each synced write (µs) and submissions per write, since the node started.
    pub fn commit_histograms(
        &self,
    ) -> (ferry_store::BucketsSnapshot, ferry_store::BucketsSnapshot) {
        let s = self.inner.queues.log.group_commit().stats();
        (s.write_micros.snapshot(), s.batch_submissions.snapshot())
    }

    /// How long this node's replicated writes took, from their proposal to the shard to their
    /// confirmation here, in microseconds (`shard_log::new_commit_histogram`).
    pub fn shard_commit_histogram(&self) -> ferry_store::BucketsSnapshot {
        self.inner.queues.shard_commit_micros.snapshot()
    }

    /// Bytes of messages all durable queues of this node may keep in memory together.
    pub fn node_memory_budget_bytes(&self) -> u64 {
        self.inner.queues.config.node_memory_budget_bytes
    }

    /// Whether the store failed a write and refuses every write until the node restarts.
    pub fn store_poisoned(&self) -> bool {
        self.inner.queues.store.poisoned()
    }

    /// The free bytes the disk guard last read and its limit; `None` when there is no guard.
    pub fn disk_free(&self) -> Option<(u64, u64)> {
        self.inner.gate.disk_free()
    }

    pub fn node_id(&self) -> &NodeId {
        &self.inner.queues.config.node_id
    }

    pub fn queue_defaults(&self) -> &QueueConfig {
        &self.inner.queues.config.queue_defaults
    }

    /// Refuses a call routed by a placement epoch at which this back-end does not own `queue`
    /// ([`Error::NotOwner`], answered FAILED_PRECONDITION with a `ferry.v1.NotOwner` detail);
    /// 0 checks nothing.
    pub fn check_placement(&self, queue: &QueueName, epoch: PlacementEpoch) -> Result<(), Error> {
        self.inner.queues.check_placement(queue, epoch)
    }

    /// Records the placement epoch at which this back-end owns `queue` from now on; calls
    /// routed by any other epoch are refused. Returns whether the queue is here.
    pub fn set_placement_epoch(&self, queue: &QueueName, epoch: PlacementEpoch) -> bool {
        self.inner.queues.set_placement_epoch(queue, epoch)
    }

    /// Checks settings given on the wire for a new queue `name`, as its creation here would,
    /// without creating it (the cluster checks them before it defines the queue).
    pub fn check_queue_config(
        &self,
        name: &QueueName,
        settings: ferry_proto::pb::QueueConfig,
    ) -> Result<(), Error> {
        let config =
            ferry_proto::convert::queue_config_from_pb(Some(settings), self.queue_defaults())?;
        crate::queues::validate_config(name, &config)
    }

    /// Waits, at most `bound`, until this back-end holds `queue` at placement epoch `epoch`
    /// (at any epoch when `epoch` is unknown) with settings `settled` accepts; whether it does.
    pub async fn wait_placed(
        &self,
        queue: &QueueName,
        epoch: PlacementEpoch,
        settled: impl Fn(&QueueConfig) -> bool,
        bound: std::time::Duration,
    ) -> bool {
        self.inner
            .queues
            .wait_placed(queue, epoch, settled, bound)
            .await
    }

    /// The placement epoch `queue` is served at, if this back-end holds it.
    pub fn placement_epoch(&self, queue: &QueueName) -> Option<PlacementEpoch> {
        self.inner.queues.placement_epoch(queue)
    }

    pub(crate) fn handle(&self, queue: &QueueName) -> Result<QueueHandle, Error> {
        self.inner.queues.handle(queue)
    }

    /// The owner task of `queue`, or `None` when the queue is not here (deleted, or the node
    /// stopping): what a call over a session's queues skips. A replicated queue whose shard
    /// another node leads is an error ("not the leader"), never skipped: the call must reach
    /// the leader, where the session's deliveries and staged sends are.
    pub(crate) fn handle_if_here(&self, queue: &QueueName) -> Result<Option<QueueHandle>, Error> {
        match self.inner.queues.handle(queue) {
            Ok(h) => Ok(Some(h)),
            Err(e @ Error::Shard(_)) => Err(e),
            Err(_) => Ok(None),
        }
    }

    /// The queue's owner task, if a send of `messages` may go to it now (see `disk.rs`); and
    /// whether the queue is durable.
    pub(crate) fn handle_for_send(
        &self,
        queue: &QueueName,
        messages: &[NewMessage],
    ) -> Result<(QueueHandle, bool, u64), Error> {
        let owned = self.inner.queues.owned(queue)?;
        if !owned.temporary {
            let bytes = messages.iter().map(NewMessage::size_bytes).sum();
            self.inner.gate.before_send(bytes)?;
        }
        Ok((owned.handle, !owned.temporary, owned.incarnation))
    }

    /// Creates a queue, and with a durable one its dead-letter and expiry queues when missing.
    /// With `if_not_exists`, an existing queue is returned as it is (`false`).
    pub async fn create_queue(
        &self,
        name: QueueName,
        config: QueueConfig,
        if_not_exists: bool,
        temporary: bool,
    ) -> Result<(QueueSummary, bool), Error> {
        self.inner
            .queues
            .create(name, config, if_not_exists, temporary)
            .await
    }

    pub fn get_queue(&self, name: &QueueName) -> Result<QueueSummary, Error> {
        self.inner.queues.get(name)
    }

    pub fn list_queues(&self) -> Vec<QueueSummary> {
        self.inner.queues.list()
    }

    /// Deletes a queue and its messages; parked receivers are answered NOT_FOUND. Returns how
    /// many messages it held.
    pub async fn delete_queue(&self, name: &QueueName) -> Result<u64, Error> {
        self.inner.queues.delete(name).await
    }

    /// Applies `patch` to a durable queue's settings (each field set replaces the queue's),
    /// checked as at creation, durable before the queue follows them. Returns the settings
    /// before and after, or `None` when they were already so.
    pub async fn update_queue(
        &self,
        name: &QueueName,
        patch: ferry_proto::pb::QueueConfig,
    ) -> Result<Option<(QueueConfig, QueueConfig)>, Error> {
        self.inner.queues.update(name, patch).await
    }

    /// How long a seal holds when its deletion never comes (see [`Broker::seal_queue`]).
    pub const SEAL_MS: u64 = 30_000;

    /// `seal`: refuses with [`Error::NotEmpty`] unless the queue holds no message; otherwise the
    /// queue refuses sends ([`Error::QueueDeleting`]) for [`Broker::SEAL_MS`], or until it is
    /// deleted or unsealed. The check and the seal are one step of the queue's owner task.
    /// `!seal`: takes sends again.
    pub async fn seal_queue(&self, name: &QueueName, seal: bool) -> Result<(), Error> {
        let until_ms = seal.then(|| self.clock().now_ms().saturating_add(Self::SEAL_MS));
        self.handle(name)?
            .call(|reply| Cmd::Admin(AdminCmd::Seal { until_ms, reply }))
            .await
    }

    /// How many deliveries each session holds in `queue`, in order.
    pub async fn session_leases(
        &self,
        queue: &QueueName,
        sessions: Vec<SessionId>,
    ) -> Result<Vec<u64>, Error> {
        self.handle(queue)?
            .call(|reply| Cmd::Admin(AdminCmd::SessionLeases { sessions, reply }))
            .await
    }

    /// Sends to a queue. A durable queue refuses with [`Error::DiskFull`] while the data
    /// directory's disk is short of space (see `disk.rs`).
    pub async fn send(
        &self,
        queue: &QueueName,
        messages: Vec<NewMessage>,
    ) -> Result<Vec<MessageId>, Error> {
        self.handle_for_send(queue, &messages)?
            .0
            .call(|reply| Cmd::Send { messages, reply })
            .await
    }

    /// Receives from a queue; see [`ReceiveRequest`]. Dropping the future removes the receiver.
    pub async fn receive(
        &self,
        queue: &QueueName,
        req: ReceiveRequest,
    ) -> Result<Vec<Delivery>, Error> {
        self.receive_for(queue, req, 0).await
    }

    /// Like `receive`, for one of the receives a consumer keeps open: those with the same
    /// nonzero `consumer` tag count once among the queue's waiting receivers.
    pub async fn receive_for(
        &self,
        queue: &QueueName,
        req: ReceiveRequest,
        consumer: u64,
    ) -> Result<Vec<Delivery>, Error> {
        self.handle(queue)?.receive(req, consumer).await
    }

    /// Acknowledges deliveries. `defer_sync`: nobody waits for the answer, so the delete may
    /// share a later synced write (up to `commit_defer_max`); the answer still means durable.
    pub async fn ack(
        &self,
        queue: &QueueName,
        caller: Caller,
        leases: Vec<LeaseRef>,
        defer_sync: bool,
    ) -> Result<LeaseResults<()>, Error> {
        self.handle(queue)?
            .call(|reply| {
                Cmd::Lease(LeaseCmd::Ack {
                    caller,
                    leases,
                    defer_sync,
                    reply,
                })
            })
            .await
    }

    /// Gives deliveries back through the queue's redelivery policy (`delay_ms` replaces its
    /// delay, up to its maximum), or with `reject` straight to its dead-letter target; answered
    /// once every dead-lettered message is in its dead-letter queue.
    pub async fn nack(
        &self,
        queue: &QueueName,
        caller: Caller,
        leases: Vec<LeaseRef>,
        delay_ms: Option<u64>,
        reject: bool,
    ) -> Result<LeaseResults<()>, Error> {
        self.handle(queue)?
            .call(|reply| {
                Cmd::Lease(LeaseCmd::Nack {
                    caller,
                    leases,
                    delay_ms,
                    reject,
                    reply,
                })
            })
            .await
    }

    pub async fn extend_lease(
        &self,
        queue: &QueueName,
        caller: Caller,
        leases: Vec<LeaseRef>,
        lease_ms: Option<u64>,
    ) -> Result<LeaseResults<u64>, Error> {
        self.handle(queue)?
            .call(|reply| {
                Cmd::Lease(LeaseCmd::Extend {
                    caller,
                    leases,
                    lease_ms,
                    reply,
                })
            })
            .await
    }

    /// A session ended: its messages in these queues return at once. Queues that no longer exist
    /// are skipped. Returns how many messages were released.
    pub async fn release_session(
        &self,
        session: SessionId,
        queues: &[QueueName],
        recover: bool,
    ) -> Result<u64, Error> {
        if !recover {
            self.inner.gate.tx_ended(session);
        }
        let mut released = 0;
        for q in queues {
            if let Some(h) = self.handle_if_here(q)? {
                released += h
                    .call(|reply| {
                        Cmd::Lease(LeaseCmd::ReleaseSession {
                            session,
                            recover,
                            reply,
                        })
                    })
                    .await?;
            }
        }
        Ok(released)
    }

    /// A receive of `session` at `queue` lost its answer (the node that served it died, or the
    /// call to it broke): its deliveries there that an earlier run of the queue made come back
    /// at once, except `keep` (those its client got): `Queue::release_lost`. Returns how many
    /// came back.
    pub async fn release_lost(
        &self,
        queue: &QueueName,
        session: SessionId,
        keep: Vec<(Seq, LeaseId)>,
    ) -> Result<u64, Error> {
        self.handle(queue)?
            .call(|reply| {
                Cmd::Lease(LeaseCmd::ReleaseLost {
                    session,
                    keep,
                    reply,
                })
            })
            .await
    }

    /// A session is alive (its connection's heartbeat): its delivery leases in these queues are
    /// renewed for their own lengths. Queues that no longer exist are skipped. Returns how many
    /// leases were renewed.
    pub async fn renew_session(
        &self,
        session: SessionId,
        queues: &[QueueName],
    ) -> Result<u64, Error> {
        let mut renewed = 0;
        for q in queues {
            if let Some(h) = self.handle_if_here(q)? {
                renewed += h
                    .call(|reply| Cmd::Lease(LeaseCmd::RenewSession { session, reply }))
                    .await?;
            }
        }
        Ok(renewed)
    }

    /// A session is alive and holds exactly these deliveries (what its front-end passed on):
    /// they alone are renewed (`Queue::renew_named`). Queues that no longer exist are skipped
    /// (their deliveries are gone). Returns how many leases were renewed and, by queue, the named
    /// deliveries the session no longer holds.
    pub async fn renew_named(
        &self,
        session: SessionId,
        held: DeliveryRefs,
    ) -> Result<(u64, DeliveryRefs), Error> {
        let mut renewed = 0;
        let mut not_held = vec![];
        for (q, named) in held {
            let gone = match self.handle_if_here(&q)? {
                Some(h) => {
                    let r = h
                        .call(|reply| {
                            Cmd::Lease(LeaseCmd::RenewNamed {
                                session,
                                named,
                                reply,
                            })
                        })
                        .await?;
                    renewed += r.renewed;
                    r.not_held
                }
                None => named,
            };
            if !gone.is_empty() {
                not_held.push((q, gone));
            }
        }
        Ok((renewed, not_held))
    }

    /// Deliveries that never reached their consumer's application: back at once, not counted
    /// as deliveries. Each handle is checked as an ack checks it; one result per lease.
    pub async fn return_undelivered(
        &self,
        queue: &QueueName,
        caller: Caller,
        leases: Vec<LeaseRef>,
    ) -> Result<LeaseResults<()>, Error> {
        self.handle(queue)?
            .call(|reply| {
                Cmd::Lease(LeaseCmd::ReturnUndelivered {
                    caller,
                    leases,
                    reply: Some(reply),
                })
            })
            .await
    }

    /// The most messages one receive may ask of `queue`.
    pub fn receive_batch_max(&self, queue: &QueueName) -> Result<u32, Error> {
        self.inner
            .queues
            .owned(queue)
            .map(|o| o.def.config.receive_batch_max)
    }

    pub async fn browse(
        &self,
        queue: &QueueName,
        after: Option<ferry_kernel::Seq>,
        max: usize,
        selector: Option<Arc<ferry_kernel::Selector>>,
    ) -> Result<Browsed, Error> {
        self.handle(queue)?
            .call(|reply| {
                Cmd::Admin(AdminCmd::Browse {
                    after,
                    max,
                    selector,
                    reply,
                })
            })
            .await
    }

    /// Deletes one message by its id, unless a consumer holds it.
    pub async fn delete_message(&self, queue: &QueueName, id: MessageId) -> Result<(), Error> {
        self.handle(queue)?
            .call(|reply| Cmd::Admin(AdminCmd::DeleteMessage { id, reply }))
            .await
    }

    pub async fn purge(&self, queue: &QueueName) -> Result<u64, Error> {
        self.handle(queue)?
            .call(|reply| Cmd::Admin(AdminCmd::Purge { reply }))
            .await
    }

    /// Bytes of messages every queue of this back-end holds (the sum of their `stats().bytes`,
    /// as each queue's owner task last saw it), without asking each queue.
    pub fn stored_bytes(&self) -> u64 {
        self.inner.queues.held_bytes()
    }

    pub async fn stats(&self, queue: &QueueName) -> Result<QueueStats, Error> {
        self.handle(queue)?
            .call(|reply| Cmd::Admin(AdminCmd::Stats { reply }))
            .await
    }

    /// Stops every queue: parked receivers are answered UNAVAILABLE, writes already submitted finish
    /// durably, and every call fails with UNAVAILABLE from then on. The node then stops its
    /// group-commit writer, which closes the store.
    pub async fn shutdown(&self) {
        self.inner.queues.stop_all().await;
    }
}

/// Every queue in `store`, with its delayed messages (they stay in memory: each queue reads its
/// own back).
fn recover(store: &dyn QueueStore, now_ms: u64) -> Result<Vec<Recovered>, Error> {
    tokio::task::block_in_place(|| {
        let recovered = store.recover()?;
        let mut all = Vec::with_capacity(recovered.len());
        for r in recovered {
            let delayed = store.read_delayed(r.def.uid, now_ms)?;
            all.push((r, delayed));
        }
        Ok(all)
    })
}
