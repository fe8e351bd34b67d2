//! The set of queues this back-end owns: creating, recovering, finding and deleting them. Each
//! queue's work is done by its owner task (`actor.rs`); the broker only routes to it.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, PoisonError, RwLock};

use ferry_kernel::{
    Caller, Delivery, KernelError, LeaseRef, MessageId, NewMessage, NodeId, Queue, QueueConfig,
    QueueName, QueueStats, QueueUid, ReceiveRequest, SessionId,
};
use ferry_store::{GroupCommit, QueueDef, QueueStore, StoreOp};

use crate::actor::{ActorSetup, Browsed, Cmd, LeaseResults, QueueActor, QueueHandle, TxDecision};
use crate::clock::now_ms;
use crate::config::{queue_budget, BrokerConfig};
use crate::dead_letter::{self, Outbox};
use crate::disk::{DiskGuard, SendGate};
use crate::error::Error;

/// What a listing shows of a queue.
#[derive(Debug, Clone, PartialEq)]
pub struct QueueSummary {
    pub name: QueueName,
    pub config: QueueConfig,
    pub temporary: bool,
}

#[derive(Debug, Clone)]
struct Owned {
    def: QueueDef,
    temporary: bool,
    handle: QueueHandle,
}

/// See the module docs. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Broker {
    inner: Arc<Inner>,
}

#[derive(Debug)]
pub(crate) struct Inner {
    config: BrokerConfig,
    commit: GroupCommit,
    outbox: Outbox,
    /// Read by the queues' paging.
    store: Arc<dyn QueueStore>,
    /// Each durable queue's memory budget (see `BrokerConfig::node_memory_budget_bytes`).
    budget: Arc<AtomicU64>,
    /// Refuses sends while the disk is short of space.
    gate: SendGate,
    queues: RwLock<HashMap<QueueName, Owned>>,
    /// Create and delete are rare; one at a time keeps the map and the store in step.
    admin: tokio::sync::Mutex<()>,
    /// Set by [`Broker::shutdown`]: every call fails with UNAVAILABLE from then on.
    stopping: std::sync::atomic::AtomicBool,
    /// The group-commit writer; joined at shutdown, once it has closed the store.
    writer: std::sync::Mutex<Option<std::thread::JoinHandle<()>>>,
    /// This run of the back-end (random, never 0). What lives only in memory (a transaction's
    /// staged sends) is fenced by it: a commit naming another run answers ABORTED.
    incarnation: u64,
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
}

impl Broker {
    /// Recovers every queue from `store` and starts serving them.
    pub async fn open(config: BrokerConfig, store: Arc<dyn QueueStore>) -> Result<Self, Error> {
        let recovered = tokio::task::block_in_place(|| store.recover())?;
        let now = now_ms();
        // Delayed messages stay in memory: each queue reads its own back.
        let mut delayed = Vec::with_capacity(recovered.len());
        for r in &recovered {
            delayed.push(tokio::task::block_in_place(|| {
                store.read_delayed(r.def.uid, now)
            })?);
        }
        let (commit, writer) = GroupCommit::start(
            Arc::clone(&store),
            config.commit_queue_depth,
            config.commit_batch_max,
            config.commit_defer_max,
        )
        .map_err(|e| ferry_store::StoreError::Io {
            context: "starting the writer thread",
            message: e.to_string(),
        })?;
        let budget = Arc::new(AtomicU64::new(queue_budget(&config, recovered.len())));
        let disk = match &config.disk_guard_dir {
            Some(dir) if config.disk_free_min_bytes > 0 => {
                Some(tokio::task::block_in_place(|| {
                    DiskGuard::new(dir.clone(), config.disk_free_min_bytes)
                }))
            }
            _ => None,
        };
        let inner = Arc::new_cyclic(|weak| {
            let history = Arc::new(crate::history::History::new(
                config.history_retention_ms,
                config.history_max_steps,
            ));
            let outbox = dead_letter::start(weak.clone(), history);
            let mut queues = HashMap::new();
            let mut messages = 0u64;
            for (r, delayed) in recovered.into_iter().zip(delayed) {
                let mut q = Queue::recover(
                    r.def.name.clone(),
                    r.def.uid,
                    r.def.config.clone(),
                    r.seq_reserved_until,
                    vec![],
                    r.dedup,
                    now,
                );
                q.set_pinned_budget(config.queue_memory_budget_bytes);
                for (p, level) in r.stored.iter().enumerate() {
                    let p = ferry_kernel::Priority::new(p as u32)
                        .expect("invariant: the store keeps one level per priority");
                    q.restore_paged_out(p, level.count, level.bytes);
                    messages += level.count;
                }
                let setup = ActorSetup {
                    durable: true,
                    commit: commit.clone(),
                    outbox: outbox.clone(),
                    store: Arc::clone(&store),
                    budget: Arc::clone(&budget),
                    capacity: config.queue_channel_capacity,
                };
                let handle = QueueActor::spawn(q, setup, delayed);
                queues.insert(
                    r.def.name.clone(),
                    Owned {
                        def: r.def,
                        temporary: false,
                        handle,
                    },
                );
            }
            tracing::info!(queues = queues.len(), messages, "recovered queues");
            Inner {
                config,
                commit,
                outbox,
                store,
                budget,
                gate: SendGate::new(disk),
                queues: RwLock::new(queues),
                admin: tokio::sync::Mutex::new(()),
                stopping: false.into(),
                writer: Some(writer).into(),
                incarnation: rand::random_range(1..u64::MAX),
                handle_key: (rand::random(), rand::random()),
            }
        });
        let broker = Self { inner };
        broker.create_missing_targets().await?;
        Ok(broker)
    }

    /// Queues recovered from a store written before dead-letter queues were created with their
    /// queue get theirs now (see [`Broker::create_queue`]).
    async fn create_missing_targets(&self) -> Result<(), Error> {
        let _admin = self.inner.admin.lock().await;
        for s in self.list_queues() {
            if targets_up_front(&s.name, s.temporary) {
                self.create_targets(&s.name, &s.config).await?;
            }
        }
        Ok(())
    }

    /// The check value of a receipt handle for this delivery (`ReceiptHandle::tag`): SipHash-2-4
    /// keyed with a secret of this run, so a handle cannot be made up from what is visible of a
    /// message (queue uid and sequence in its id, the delivery count in a browse).
    pub fn handle_tag(&self, lease: &LeaseRef) -> u64 {
        use std::hash::Hasher as _;
        let (k0, k1) = self.inner.handle_key;
        let mut h = siphasher::sip::SipHasher24::new_with_keys(k0, k1);
        h.write_u64(lease.queue.0);
        h.write_u64(lease.seq.0);
        h.write_u64(lease.lease.0);
        h.write_u32(lease.delivery_count);
        h.finish()
    }

    /// This run of the back-end (see `Inner::incarnation`).
    pub fn incarnation(&self) -> u64 {
        self.inner.incarnation
    }

    pub(crate) fn from_inner(inner: Arc<Inner>) -> Self {
        Self { inner }
    }

    /// The steps kept of a message's life on this back-end, oldest first.
    pub fn message_history(&self, id: &str) -> Vec<crate::history::Step> {
        self.inner.outbox.history.get(id)
    }

    /// Dead letters and expiries from now on, as they happen.
    pub fn subscribe_events(&self) -> tokio::sync::broadcast::Receiver<crate::BrokerEvent> {
        self.inner.outbox.subscribe()
    }

    /// Group commit's counters since the node started.
    pub fn commit_stats(&self) -> CommitCounts {
        let s = self.inner.commit.stats();
        let load = |c: &std::sync::atomic::AtomicU64| c.load(std::sync::atomic::Ordering::Relaxed);
        CommitCounts {
            writes: load(&s.writes),
            submissions: load(&s.submissions),
            deferred: load(&s.deferred),
            deferred_syncs: load(&s.deferred_syncs),
        }
    }

    /// Time of each synced write (µs) and submissions per write, since the node started.
    pub fn commit_histograms(
        &self,
    ) -> (ferry_store::BucketsSnapshot, ferry_store::BucketsSnapshot) {
        let s = self.inner.commit.stats();
        (s.write_micros.snapshot(), s.batch_submissions.snapshot())
    }

    /// Bytes of messages all durable queues of this node may keep in memory together.
    pub fn node_memory_budget_bytes(&self) -> u64 {
        self.inner.config.node_memory_budget_bytes
    }

    /// Whether the store failed a write and refuses every write until the node restarts.
    pub fn store_poisoned(&self) -> bool {
        self.inner.store.poisoned()
    }

    /// The free bytes the disk guard last read and its limit; `None` when there is no guard.
    pub fn disk_free(&self) -> Option<(u64, u64)> {
        self.inner.gate.disk_free()
    }

    pub fn node_id(&self) -> &NodeId {
        &self.inner.config.node_id
    }

    pub fn queue_defaults(&self) -> &QueueConfig {
        &self.inner.config.queue_defaults
    }

    fn owned(&self, queue: &QueueName) -> Result<Owned, Error> {
        if self
            .inner
            .stopping
            .load(std::sync::atomic::Ordering::Acquire)
        {
            return Err(Error::ShuttingDown);
        }
        let map = self
            .inner
            .queues
            .read()
            .unwrap_or_else(PoisonError::into_inner);
        map.get(queue).cloned().ok_or_else(|| Error::QueueNotFound {
            queue: queue.to_string(),
        })
    }

    fn setup(&self, durable: bool) -> ActorSetup {
        ActorSetup {
            durable,
            commit: self.inner.commit.clone(),
            outbox: self.inner.outbox.clone(),
            store: Arc::clone(&self.inner.store),
            budget: Arc::clone(&self.inner.budget),
            capacity: self.inner.config.queue_channel_capacity,
        }
    }

    /// Gives each durable queue its share of the node's memory budget.
    fn share_budget(&self) {
        let durable = self
            .inner
            .queues
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .values()
            .filter(|o| !o.temporary)
            .count();
        self.inner
            .budget
            .store(queue_budget(&self.inner.config, durable), Ordering::Relaxed);
    }

    fn handle(&self, queue: &QueueName) -> Result<QueueHandle, Error> {
        self.owned(queue).map(|o| o.handle)
    }

    /// The queue's owner task, if a send of `messages` may go to it now (see `disk.rs`); and
    /// whether the queue is durable.
    fn handle_for_send(
        &self,
        queue: &QueueName,
        messages: &[NewMessage],
    ) -> Result<(QueueHandle, bool), Error> {
        let owned = self.owned(queue)?;
        if !owned.temporary {
            let bytes = messages.iter().map(NewMessage::size_bytes).sum();
            self.inner.gate.before_send(bytes)?;
        }
        Ok((owned.handle, !owned.temporary))
    }

    /// Creates a queue. With `if_not_exists`, an existing queue is returned as it is (`false`).
    /// A durable queue's dead-letter and expiry queues are created with it (when they do not
    /// exist yet), so a message moved there is readable the moment its move is answered.
    pub async fn create_queue(
        &self,
        name: QueueName,
        config: QueueConfig,
        if_not_exists: bool,
        temporary: bool,
    ) -> Result<(QueueSummary, bool), Error> {
        let mut config = config;
        if temporary {
            // A temporary queue keeps nothing: not even its dead letters.
            config.dead_letter = ferry_kernel::DeadLetterTarget::Discard;
            config.expiry = ferry_kernel::DeadLetterTarget::Discard;
        }
        validate_config(&name, &config)?;
        let _admin = self.inner.admin.lock().await;
        if targets_up_front(&name, temporary) && self.owned(&name).is_err() {
            self.create_targets(&name, &config).await?;
        }
        self.create_locked(name, config, if_not_exists, temporary)
            .await
    }

    /// Creates the dead-letter and expiry queues of `source` that do not exist. Holds `admin`.
    async fn create_targets(&self, source: &QueueName, config: &QueueConfig) -> Result<(), Error> {
        for target in [&config.dead_letter, &config.expiry] {
            let Some(target) = target.resolve(source) else {
                continue;
            };
            if self.owned(&target).is_err() {
                let dlq = dead_letter::dead_letter_queue_config(config);
                self.create_locked(target, dlq, true, false).await?;
            }
        }
        Ok(())
    }

    /// [`Broker::create_queue`] once the `admin` lock is held.
    async fn create_locked(
        &self,
        name: QueueName,
        config: QueueConfig,
        if_not_exists: bool,
        temporary: bool,
    ) -> Result<(QueueSummary, bool), Error> {
        match self.owned(&name) {
            Ok(existing) if if_not_exists => return Ok((summary(&existing), false)),
            Ok(_) => {
                return Err(Error::QueueExists {
                    queue: name.to_string(),
                })
            }
            Err(Error::QueueNotFound { .. }) => {}
            Err(e) => return Err(e),
        }
        let owned = self
            .inner
            .queues
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .len();
        if owned >= self.inner.config.queues_max {
            return Err(Error::Kernel(KernelError::OverLimit {
                field: "queues on this node",
                value: owned as u64 + 1,
                limit: self.inner.config.queues_max as u64,
                limit_name: "queues_max",
            }));
        }
        // 0 and u64::MAX are reserved (key-range bounds in the store).
        let uid = QueueUid(rand::random_range(1..u64::MAX));
        let def = QueueDef {
            name: name.clone(),
            uid,
            config,
        };
        if !temporary {
            self.inner
                .commit
                .commit(vec![StoreOp::PutQueue(def.clone())])
                .await?;
        }
        let mut q = Queue::new(name.clone(), uid, def.config.clone());
        // What cannot be paged out (non-persistent and staged messages) stops at the per-queue
        // budget as configured, not the queue's share of the node's, which shrinks as queues come.
        q.set_pinned_budget(self.inner.config.queue_memory_budget_bytes);
        let handle = QueueActor::spawn(q, self.setup(!temporary), vec![]);
        let owned = Owned {
            def,
            temporary,
            handle,
        };
        let s = summary(&owned);
        self.inner
            .queues
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(name, owned);
        self.share_budget();
        tracing::info!(queue = %s.name, temporary, "queue created");
        Ok((s, true))
    }

    /// The dead-letter queue `target` of `source`, created on demand with settings derived from
    /// the source's.
    pub(crate) async fn dead_letter_queue(
        &self,
        source: &QueueName,
        target: &QueueName,
    ) -> Result<QueueHandle, Error> {
        if let Ok(h) = self.handle(target) {
            return Ok(h);
        }
        let config = self
            .owned(source)
            .map(|o| dead_letter::dead_letter_queue_config(&o.def.config))
            .unwrap_or_else(|_| dead_letter::dead_letter_queue_config(self.queue_defaults()));
        self.create_queue(target.clone(), config, true, false)
            .await?;
        self.handle(target)
    }

    pub fn get_queue(&self, name: &QueueName) -> Result<QueueSummary, Error> {
        self.owned(name).map(|o| summary(&o))
    }

    pub fn list_queues(&self) -> Vec<QueueSummary> {
        let map = self
            .inner
            .queues
            .read()
            .unwrap_or_else(PoisonError::into_inner);
        let mut all: Vec<_> = map.values().map(summary).collect();
        all.sort_by(|a, b| a.name.cmp(&b.name));
        all
    }

    /// Deletes a queue and its messages; parked receivers are answered NOT_FOUND. Returns how
    /// many messages it held.
    pub async fn delete_queue(&self, name: &QueueName) -> Result<u64, Error> {
        let _admin = self.inner.admin.lock().await;
        let owned = self.owned(name)?;
        // Stop the owner task first (its submitted writes finish), then delete what it left on
        // disk: no write for this queue can land after the range delete.
        self.inner
            .queues
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(name);
        let held = owned.handle.stop(true).await;
        self.share_budget();
        if !owned.temporary {
            self.inner
                .commit
                .commit(vec![StoreOp::DeleteQueue(owned.def.uid)])
                .await?;
        }
        tracing::info!(queue = %name, messages = held, "queue deleted");
        Ok(held)
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
            .call(|reply| Cmd::Ack {
                caller,
                leases,
                defer_sync,
                reply,
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
            .call(|reply| Cmd::Nack {
                caller,
                leases,
                delay_ms,
                reject,
                reply,
            })
            .await
    }

    /// Stages sends of a transacted session: invisible until [`Broker::commit`].
    pub async fn stage(
        &self,
        queue: &QueueName,
        session: SessionId,
        messages: Vec<NewMessage>,
    ) -> Result<Vec<MessageId>, Error> {
        let (handle, durable) = self.handle_for_send(queue, &messages)?;
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
        Ok(ids)
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
        // One part per queue (a queue asked twice would wait for itself), one ack per delivery.
        let mut merged: std::collections::BTreeMap<QueueName, Vec<LeaseRef>> =
            std::collections::BTreeMap::new();
        let mut seen = std::collections::HashSet::new();
        for (queue, acks) in parts {
            let all = merged.entry(queue).or_default();
            all.extend(acks.into_iter().filter(|a| seen.insert(*a)));
        }
        let queues: Vec<QueueName> = merged.keys().cloned().collect();
        if incarnation != 0 && incarnation != self.inner.incarnation {
            self.rollback(session, &queues).await?;
            return Err(Error::TransactionFenced {
                session: session.to_string(),
            });
        }
        if let Err(e) = self.inner.gate.before_tx_commit(session) {
            self.rollback(session, &queues).await?;
            return Err(e);
        }
        let mut handles = Vec::with_capacity(merged.len());
        for (queue, acks) in merged {
            match self.handle(&queue) {
                Ok(h) => handles.push((h, acks)),
                // A queue deleted meanwhile has no staged sends left; its acks cannot succeed.
                Err(Error::QueueNotFound { .. }) if acks.is_empty() => {}
                Err(e) => {
                    self.rollback(session, &queues).await?;
                    return Err(e);
                }
            }
        }
        let commit = self.inner.commit.clone();
        let broker = self.clone();
        tokio::spawn(async move {
            let mut decisions = Vec::with_capacity(handles.len());
            for (h, acks) in handles {
                let (decide, decision) = tokio::sync::oneshot::channel();
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
                        let _ = tokio::sync::oneshot::Sender::send(d, TxDecision::Abort);
                    }
                    // A refused commit rolls the whole transaction back here, so its staged
                    // sends can never be published by a later commit of the session.
                    if let Err(r) = broker.rollback(session, &queues).await {
                        tracing::warn!(%session, error = %r, "rolling back a refused commit failed");
                    }
                    return Err(e);
                }
                decisions.push(decide);
            }
            let mut writes = Vec::with_capacity(decisions.len());
            let mut submitted = Vec::with_capacity(decisions.len());
            let mut durables = Vec::with_capacity(decisions.len());
            for d in decisions {
                let (ops_tx, ops_rx) = tokio::sync::oneshot::channel();
                let (submitted_tx, submitted_rx) = tokio::sync::oneshot::channel();
                let (durable_tx, durable_rx) = tokio::sync::oneshot::channel();
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
                Some(commit.submit(ops).await)
            };
            for s in submitted {
                let _ = s.send(());
            }
            let written = match ticket {
                None => Ok(()),
                Some(Ok(t)) => t.durable().await,
                Some(Err(e)) => Err(e),
            };
            for d in durables {
                let _ = d.send(written.clone());
            }
            written.map_err(Error::from)
        })
        .await
        .map_err(|_| Error::ShuttingDown)?
    }

    /// Rolls back a transacted session's work on these queues: staged sends are dropped and
    /// what it received comes back through each queue's redelivery policy. Queues that no longer
    /// exist are skipped. Returns how many messages came back.
    pub async fn rollback(&self, session: SessionId, queues: &[QueueName]) -> Result<u64, Error> {
        self.inner.gate.tx_ended(session);
        let mut released = 0;
        for q in queues {
            if let Ok(h) = self.handle(q) {
                released += h.call(|reply| Cmd::Rollback { session, reply }).await?;
            }
        }
        Ok(released)
    }

    pub async fn extend_lease(
        &self,
        queue: &QueueName,
        caller: Caller,
        leases: Vec<LeaseRef>,
        lease_ms: Option<u64>,
    ) -> Result<LeaseResults<u64>, Error> {
        self.handle(queue)?
            .call(|reply| Cmd::Extend {
                caller,
                leases,
                lease_ms,
                reply,
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
            if let Ok(h) = self.handle(q) {
                released += h
                    .call(|reply| Cmd::ReleaseSession {
                        session,
                        recover,
                        reply,
                    })
                    .await?;
            }
        }
        Ok(released)
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
            if let Ok(h) = self.handle(q) {
                renewed += h.call(|reply| Cmd::RenewSession { session, reply }).await?;
            }
        }
        Ok(renewed)
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
            .call(|reply| Cmd::ReturnUndelivered {
                caller,
                leases,
                reply: Some(reply),
            })
            .await
    }

    /// The most messages one receive may ask of `queue`.
    pub fn receive_batch_max(&self, queue: &QueueName) -> Result<u32, Error> {
        self.owned(queue).map(|o| o.def.config.receive_batch_max)
    }

    pub async fn browse(
        &self,
        queue: &QueueName,
        after: Option<ferry_kernel::Seq>,
        max: usize,
        selector: Option<Arc<ferry_kernel::Selector>>,
    ) -> Result<Browsed, Error> {
        self.handle(queue)?
            .call(|reply| Cmd::Browse {
                after,
                max,
                selector,
                reply,
            })
            .await
    }

    /// Deletes one message by its id, unless a consumer holds it.
    pub async fn delete_message(&self, queue: &QueueName, id: MessageId) -> Result<(), Error> {
        self.handle(queue)?
            .call(|reply| Cmd::DeleteMessage { id, reply })
            .await
    }

    pub async fn purge(&self, queue: &QueueName) -> Result<u64, Error> {
        self.handle(queue)?.call(|reply| Cmd::Purge { reply }).await
    }

    pub async fn stats(&self, queue: &QueueName) -> Result<QueueStats, Error> {
        self.handle(queue)?.call(|reply| Cmd::Stats { reply }).await
    }

    /// Stops every queue: parked receivers are answered empty, writes already submitted finish.
    pub async fn shutdown(&self) {
        self.inner
            .stopping
            .store(true, std::sync::atomic::Ordering::Release);
        let all: Vec<_> = {
            let mut map = self
                .inner
                .queues
                .write()
                .unwrap_or_else(PoisonError::into_inner);
            map.drain().map(|(_, o)| o.handle).collect()
        };
        for h in all {
            h.stop(false).await;
        }
        // Every queue has finished its writes: close the store, and wait until it is closed
        // (RocksDB must be closed before the process exits).
        self.inner.commit.close().await;
        let writer = self
            .inner
            .writer
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        if let Some(w) = writer {
            if !matches!(
                tokio::task::spawn_blocking(move || w.join()).await,
                Ok(Ok(()))
            ) {
                tracing::error!("the group-commit writer did not stop cleanly");
            }
        }
    }
}

/// Whether a queue's dead-letter and expiry queues are created with it. Not for a temporary
/// queue (it keeps nothing), nor for one named like a dead-letter queue (no `X.DLQ.DLQ` beside
/// every `X.DLQ` a user creates; should it dead-letter, one is made on demand).
fn targets_up_front(name: &QueueName, temporary: bool) -> bool {
    !temporary && !name.as_str().ends_with(".DLQ")
}

fn summary(o: &Owned) -> QueueSummary {
    QueueSummary {
        name: o.def.name.clone(),
        config: o.def.config.clone(),
        temporary: o.temporary,
    }
}

fn validate_config(name: &QueueName, c: &QueueConfig) -> Result<(), Error> {
    if let Err((field, reason)) = c.redelivery.validate() {
        return Err(Error::Kernel(KernelError::InvalidArgument {
            field,
            reason,
        }));
    }
    for (field, target) in [
        ("dead_letter_queue", &c.dead_letter),
        ("expiry_queue", &c.expiry),
    ] {
        match target {
            ferry_kernel::DeadLetterTarget::Default if target.resolve(name).is_none() => {
                return Err(Error::Kernel(KernelError::InvalidArgument {
                    field,
                    reason: format!(
                        "the default {name}.DLQ is not a valid queue name (names are at most {} bytes); name another queue or discard",
                        QueueName::LEN_MAX
                    ),
                }));
            }
            ferry_kernel::DeadLetterTarget::Queue(q) if q == name => {
                return Err(Error::Kernel(KernelError::InvalidArgument {
                    field,
                    reason: format!("{name} cannot be its own dead-letter queue"),
                }));
            }
            _ => {}
        }
    }
    let bad = |field: &'static str, reason: &str| {
        Err(Error::Kernel(KernelError::InvalidArgument {
            field,
            reason: reason.into(),
        }))
    };
    if c.default_lease_ms == 0 || c.default_lease_ms > c.lease_max_ms {
        return bad(
            "default_lease_ms",
            "must be at least 1 and at most lease_max_ms",
        );
    }
    if c.receive_batch_max == 0 {
        return bad("receive_batch_max", "must be at least 1");
    }
    if c.max_message_size_bytes == 0 {
        return bad("max_message_size_bytes", "must be at least 1");
    }
    // Every setting that sizes memory or time has a ceiling: a queue created with u64::MAX
    // must not hold a lease, a dedup id or a parked receiver for ever.
    const WEEK_MS: u64 = 7 * 24 * 3_600_000;
    let ceilings: [(&'static str, u64, u64); 7] = [
        ("lease_max_ms", c.lease_max_ms, WEEK_MS),
        ("dedup_window_ms", c.dedup_window_ms, WEEK_MS),
        (
            "redelivery.max_delay_ms",
            c.redelivery.max_delay_ms,
            WEEK_MS,
        ),
        ("receive_batch_max", u64::from(c.receive_batch_max), 10_000),
        ("waiters_max", c.waiters_max as u64, 100_000),
        (
            "max_message_size_bytes",
            c.max_message_size_bytes,
            MESSAGE_SIZE_BYTES_CEILING,
        ),
        (
            "redelivery.max_redeliveries",
            u64::from(c.redelivery.max_redeliveries.unwrap_or(0)),
            1_000_000,
        ),
    ];
    for (field, value, ceiling) in ceilings {
        if value > ceiling {
            return Err(Error::Kernel(KernelError::InvalidArgument {
                field,
                reason: format!("is {value}, above the most this node allows, {ceiling}"),
            }));
        }
    }
    Ok(())
}

/// The largest `max_message_size_bytes` a queue may have (64 MiB).
pub const MESSAGE_SIZE_BYTES_CEILING: u64 = 64 * 1024 * 1024;
