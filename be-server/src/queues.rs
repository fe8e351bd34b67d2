//! The registry of the queues this back-end owns: creating, recovering, finding, deleting and
//! stopping them, each with its owner task (`actor/`). The broker (`broker.rs`) and the
//! dead-letter mover (`dead_letter.rs`) both use it; it uses neither (what a queue's dead-letter
//! queue is, both take from `targets.rs`).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, PoisonError, RwLock};

use ferry_kernel::{
    ClockRef, KernelError, PlacementEpoch, Queue, QueueConfig, QueueName, QueueUid,
};
use ferry_store::{QueueDef, QueueStore, RecoveredQueue, StoreOp};

use crate::actor::{ActorSetup, QueueActor, QueueHandle};
use crate::config::{queue_budget, BrokerConfig};
use crate::error::Error;
use crate::log::{LocalLog, NodeLog, QueueLog};
use crate::outbox::Outbox;
use crate::targets::{dead_letter_queue_config, targets_up_front};

/// What a listing shows of a queue.
#[derive(Debug, Clone, PartialEq)]
pub struct QueueSummary {
    pub name: QueueName,
    pub config: QueueConfig,
    pub temporary: bool,
}

/// A queue this back-end owns.
#[derive(Debug, Clone)]
pub(crate) struct Owned {
    pub(crate) def: QueueDef,
    pub(crate) temporary: bool,
    pub(crate) handle: QueueHandle,
    /// The log its owner task and its definition's writes go through: the node's group commit,
    /// or its shard's.
    pub(crate) log: NodeLog,
    /// The run serving it: the back-end's (see [`Queues::incarnation`]), or for a shard's
    /// queue the run that began when this node last started to lead the shard. What lives
    /// only in memory (a transaction's staged sends) is fenced by it.
    pub(crate) incarnation: u64,
    /// The placement epoch at which this back-end owns the queue (see
    /// [`Queues::check_placement`]).
    pub(crate) epoch: PlacementEpoch,
}

/// See the module docs. Each queue writes through its own [`NodeLog`]: its owner task, and the
/// registry's writes of its definition, which go through the same log so they are ordered with
/// them. The queues of a shard this node leads are served here too (`shards.rs`).
#[derive(Debug)]
pub(crate) struct Queues {
    pub(crate) config: BrokerConfig,
    /// The node's group commit: the log of every queue with replication factor 1.
    pub(crate) log: LocalLog,
    pub(crate) outbox: Outbox,
    pub(crate) clock: ClockRef,
    /// Read by the queues' paging.
    pub(crate) store: Arc<dyn QueueStore>,
    /// Each durable queue's memory budget (see `BrokerConfig::node_memory_budget_bytes`).
    budget: Arc<AtomicU64>,
    pub(crate) map: RwLock<HashMap<QueueName, Owned>>,
    /// Bytes of messages every queue here holds, kept up to date by their owner tasks.
    held_total: Arc<AtomicU64>,
    /// How many of `map`'s queues are durable (the budget's divisor), kept in step by create
    /// and delete so that neither counts every queue.
    pub(crate) durable: AtomicUsize,
    /// Create and delete are rare; one at a time keeps the map and the store in step.
    pub(crate) admin: tokio::sync::Mutex<()>,
    /// The queue shards this node leads and serves, and the others it replicates (see
    /// `shards.rs`).
    pub(crate) shards: RwLock<crate::shards::Shards>,
    /// Bumped each time a shard's log is fenced (see `shard_log.rs`).
    pub(crate) fences: Arc<tokio::sync::watch::Sender<u64>>,
    /// How long replicated writes take to be confirmed (`shard_log::new_commit_histogram`).
    pub(crate) shard_commit_micros: Arc<ferry_store::Buckets>,
    /// This run of the back-end (random, never 0): see [`Owned::incarnation`].
    pub(crate) incarnation: u64,
    /// Set by [`Queues::stop_all`]: every call fails with UNAVAILABLE from then on.
    stopping: AtomicBool,
    /// Turns true with `stopping`, for the streams that wait on it (see [`Queues::stopped`]).
    stopped_tx: tokio::sync::watch::Sender<bool>,
    /// Counts the changes of which queue is here at which placement epoch, and of their
    /// settings, for the callers that wait for one (see [`Queues::wait_placed`]).
    placed_tx: tokio::sync::watch::Sender<u64>,
}

/// A queue read back from the store, with its delayed messages (kept in memory).
pub(crate) type Recovered = (RecoveredQueue, Vec<ferry_kernel::RecoveredMessage>);

impl Queues {
    /// The registry of the queues recovered from the store, each with its owner task started.
    /// A replicated queue is left alone: it is served only once this node leads its shard.
    pub(crate) fn recover(
        config: BrokerConfig,
        log: LocalLog,
        outbox: Outbox,
        clock: ClockRef,
        store: Arc<dyn QueueStore>,
        recovered: Vec<Recovered>,
    ) -> Self {
        let (recovered, replicas): (Vec<_>, Vec<_>) = recovered
            .into_iter()
            .partition(|(r, _)| r.def.replica.is_none());
        let budget = Arc::new(AtomicU64::new(queue_budget(&config, recovered.len())));
        let this = Self {
            config,
            log,
            outbox,
            clock,
            store,
            budget,
            map: RwLock::new(HashMap::new()),
            held_total: Arc::default(),
            durable: AtomicUsize::new(0),
            admin: tokio::sync::Mutex::new(()),
            shards: RwLock::default(),
            fences: Arc::new(tokio::sync::watch::Sender::new(0)),
            shard_commit_micros: crate::shard_log::new_commit_histogram(),
            incarnation: rand::random_range(1..u64::MAX),
            stopping: false.into(),
            stopped_tx: tokio::sync::watch::Sender::new(false),
            placed_tx: tokio::sync::watch::Sender::new(0),
        };
        let mut messages = 0u64;
        let mut map = HashMap::new();
        for (r, delayed) in recovered {
            let log = NodeLog::Local(this.log.clone());
            messages += r.stored.iter().map(|l| l.count).sum::<u64>();
            let (def, handle) = this.spawn_recovered(r, delayed, log.clone());
            let owned = Owned {
                def,
                temporary: false,
                handle,
                log,
                incarnation: this.incarnation,
                // Placed by static configuration, as the front-end's first placement snapshot
                // numbers it, until the metadata group sets its own epoch.
                epoch: PlacementEpoch::STATIC,
            };
            map.insert(owned.def.name.clone(), owned);
        }
        tracing::info!(
            queues = map.len(),
            messages,
            replicated = replicas.len(),
            "recovered queues (replicated ones are served once this node leads their shard)"
        );
        this.durable.store(map.len(), Ordering::Relaxed);
        *this.map.write().unwrap_or_else(PoisonError::into_inner) = map;
        this
    }

    /// Starts the owner task of a queue read back from the store, writing through `log`;
    /// `held` are its messages kept in memory from the start (delayed, or with a delivery
    /// mark).
    pub(crate) fn spawn_recovered(
        &self,
        r: RecoveredQueue,
        held: Vec<ferry_kernel::RecoveredMessage>,
        log: NodeLog,
    ) -> (QueueDef, QueueHandle) {
        let mut q = Queue::recover(
            r.def.name.clone(),
            r.def.uid,
            r.def.config.clone(),
            r.seq_reserved_until,
            vec![],
            r.dedup,
            self.clock.now_ms(),
        );
        q.set_pinned_budget(self.config.queue_memory_budget_bytes);
        log.prepare(&mut q);
        for (p, level) in r.stored.iter().enumerate() {
            let p = ferry_kernel::Priority::new(p as u32)
                .expect("invariant: the store keeps one level per priority");
            q.restore_paged_out(p, level.count, level.bytes);
        }
        (r.def, QueueActor::spawn(q, self.setup(true, log), held))
    }

    /// Queues recovered from a store written before dead-letter queues were created with their
    /// queue get theirs now (see [`Queues::create`]).
    pub(crate) async fn create_missing_targets(&self) -> Result<(), Error> {
        let _admin = self.admin.lock().await;
        for s in self.list() {
            if targets_up_front(&s.name, s.temporary) {
                self.create_targets(&s.name, &s.config).await?;
            }
        }
        Ok(())
    }

    /// The receipt-handle key a replicated queue keeps in its definition, while it is served
    /// here, shutting down included (a delivery answered then must carry the key the next
    /// leader checks).
    pub(crate) fn handle_key_of(&self, queue: &QueueName) -> Option<(u64, u64)> {
        let map = self.map.read().unwrap_or_else(PoisonError::into_inner);
        map.get(queue)
            .and_then(|o| o.def.replica)
            .and_then(|r| r.handle_key)
    }

    pub(crate) fn owned(&self, queue: &QueueName) -> Result<Owned, Error> {
        if self.stopping.load(Ordering::Acquire) {
            return Err(Error::ShuttingDown);
        }
        let map = self.map.read().unwrap_or_else(PoisonError::into_inner);
        if let Some(o) = map.get(queue) {
            return Ok(o.clone());
        }
        drop(map);
        // A replicated queue of a shard led elsewhere: "not the leader", never NOT_FOUND.
        let shards = self.shards.read().unwrap_or_else(PoisonError::into_inner);
        Err(shards
            .not_here(queue)
            .unwrap_or_else(|| Error::QueueNotFound {
                queue: queue.to_string(),
            }))
    }

    /// Refuses a call routed by placement epoch `asked` unless this back-end owns `queue` at
    /// that epoch. [`PlacementEpoch::UNKNOWN`]: the caller does not know (a temporary queue, a
    /// queue with no placement entry); nothing is checked. A queue this back-end does not have is left to the call
    /// itself (NOT_FOUND).
    pub(crate) fn check_placement(
        &self,
        queue: &QueueName,
        asked: PlacementEpoch,
    ) -> Result<(), Error> {
        if !asked.is_known() {
            return Ok(());
        }
        let map = self.map.read().unwrap_or_else(PoisonError::into_inner);
        match map.get(queue) {
            Some(o) if o.epoch != asked => Err(Error::NotOwner {
                queue: queue.to_string(),
                owner: self.config.node_id.clone(),
                epoch: o.epoch,
                asked,
            }),
            _ => Ok(()),
        }
    }

    /// Records the placement epoch at which this back-end owns `queue` (the metadata group
    /// calls it when a placement change is committed). Returns whether the queue is here.
    pub(crate) fn set_placement_epoch(&self, queue: &QueueName, epoch: PlacementEpoch) -> bool {
        let here = {
            let mut map = self.map.write().unwrap_or_else(PoisonError::into_inner);
            map.get_mut(queue).map(|o| o.epoch = epoch).is_some()
        };
        if here {
            self.placed_changed();
        }
        here
    }

    pub(crate) fn placed_changed(&self) {
        self.placed_tx.send_modify(|n| *n = n.wrapping_add(1));
    }

    /// Waits until `queue` is here at placement epoch `asked` (any epoch, when `asked` is
    /// unknown) with settings that `settled` accepts, or `bound` passes; whether it is. A queue
    /// the metadata defined (or changed) a moment ago is created (or changed) here when this
    /// node applies that change: whoever must answer "created" (or "updated") waits for exactly
    /// that, instead of asking again and again.
    pub(crate) async fn wait_placed(
        &self,
        queue: &QueueName,
        asked: PlacementEpoch,
        settled: impl Fn(&QueueConfig) -> bool,
        bound: std::time::Duration,
    ) -> bool {
        let mut changes = self.placed_tx.subscribe();
        let placed = || {
            let map = self.map.read().unwrap_or_else(PoisonError::into_inner);
            map.get(queue)
                .is_some_and(|o| (!asked.is_known() || o.epoch == asked) && settled(&o.def.config))
        };
        let wait = async {
            // Bounded by the timeout below; each turn waits for a change of the map.
            loop {
                changes.borrow_and_update();
                if placed() {
                    return;
                }
                if changes.changed().await.is_err() {
                    return;
                }
            }
        };
        let _ = tokio::time::timeout(bound, wait).await;
        placed()
    }

    /// Bytes of messages every queue here holds (each owner task's figure after its last
    /// wake-up).
    pub(crate) fn held_bytes(&self) -> u64 {
        self.held_total.load(Ordering::Relaxed)
    }

    /// The placement epoch `queue` is served at, if it is here.
    pub(crate) fn placement_epoch(&self, queue: &QueueName) -> Option<PlacementEpoch> {
        let map = self.map.read().unwrap_or_else(PoisonError::into_inner);
        map.get(queue).map(|o| o.epoch)
    }

    pub(crate) fn handle(&self, queue: &QueueName) -> Result<QueueHandle, Error> {
        self.owned(queue).map(|o| o.handle)
    }

    pub(crate) fn setup(&self, durable: bool, log: NodeLog) -> ActorSetup<NodeLog> {
        ActorSetup {
            durable,
            log,
            outbox: self.outbox.clone(),
            clock: Arc::clone(&self.clock),
            store: Arc::clone(&self.store),
            budget: Arc::clone(&self.budget),
            held_total: Arc::clone(&self.held_total),
            capacity: self.config.queue_channel_capacity,
        }
    }

    /// Gives each durable queue its share of the node's memory budget.
    pub(crate) fn share_budget(&self) {
        let durable = self.durable.load(Ordering::Relaxed);
        self.budget
            .store(queue_budget(&self.config, durable), Ordering::Relaxed);
    }

    /// Creates a queue. With `if_not_exists`, an existing queue is returned as it is (`false`).
    /// A durable queue's dead-letter and expiry queues are created with it (when they do not
    /// exist yet), so a message moved there is readable the moment its move is answered.
    pub(crate) async fn create(
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
        let _admin = self.admin.lock().await;
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
                let dlq = dead_letter_queue_config(config);
                self.create_locked(target, dlq, true, false).await?;
            }
        }
        Ok(())
    }

    /// [`Queues::create`] once the `admin` lock is held.
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
            .map
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .len();
        if owned >= self.config.queues_max {
            return Err(Error::Kernel(KernelError::OverLimit {
                field: "queues on this node",
                value: owned as u64 + 1,
                limit: self.config.queues_max as u64,
                limit_name: "queues_max",
            }));
        }
        // 0 and u64::MAX are reserved (key-range bounds in the store).
        let uid = QueueUid(rand::random_range(1..u64::MAX));
        let def = QueueDef {
            name: name.clone(),
            uid,
            replica: None,
            config,
        };
        let log = NodeLog::Local(self.log.clone());
        if !temporary {
            log.write(vec![StoreOp::PutQueue(def.clone())]).await?;
        }
        let handle = self.spawn_new(&def, !temporary, log.clone());
        let owned = Owned {
            def,
            temporary,
            handle,
            log,
            incarnation: self.incarnation,
            epoch: PlacementEpoch::STATIC,
        };
        let s = summary(&owned);
        self.map
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(name, owned);
        if !temporary {
            self.durable.fetch_add(1, Ordering::Relaxed);
        }
        self.placed_changed();
        self.share_budget();
        tracing::info!(queue = %s.name, temporary, "queue created");
        Ok((s, true))
    }

    /// Starts the owner task of a new, empty queue, writing through `log`.
    pub(crate) fn spawn_new(&self, def: &QueueDef, durable: bool, log: NodeLog) -> QueueHandle {
        let mut q = Queue::new(def.name.clone(), def.uid, def.config.clone());
        // What cannot be paged out (non-persistent and staged messages) stops at the per-queue
        // budget as configured, not the queue's share of the node's, which shrinks as queues come.
        q.set_pinned_budget(self.config.queue_memory_budget_bytes);
        log.prepare(&mut q);
        QueueActor::spawn(q, self.setup(durable, log), vec![])
    }

    /// The dead-letter queue `target` of `source`, created on demand with settings derived from
    /// the source's.
    pub(crate) async fn dead_letter_queue(
        &self,
        source: &QueueName,
        target: &QueueName,
    ) -> Result<QueueHandle, Error> {
        // The move is one batch through the target's log, which deletes from the source too:
        // both must write through the same log (a replicated queue's dead-letter queue is in its
        // shard, and is never made here as a local one).
        let shard = self.owned(source).ok().and_then(|o| o.log.shard());
        let across = || Error::DeadLetterAcrossLogs {
            source_queue: source.to_string(),
            target: target.to_string(),
        };
        match self.owned(target) {
            Ok(t) if t.log.shard() == shard => return Ok(t.handle),
            // A local queue's missing dead-letter queue is made here, as ever.
            Err(Error::QueueNotFound { .. }) if shard.is_none() => {}
            Ok(_) | Err(Error::QueueNotFound { .. } | Error::Shard(_)) => return Err(across()),
            Err(e) => return Err(e),
        }
        let config = self
            .owned(source)
            .map(|o| dead_letter_queue_config(&o.def.config))
            .unwrap_or_else(|_| dead_letter_queue_config(&self.config.queue_defaults));
        self.create(target.clone(), config, true, false).await?;
        self.handle(target)
    }

    pub(crate) fn get(&self, name: &QueueName) -> Result<QueueSummary, Error> {
        self.owned(name).map(|o| summary(&o))
    }

    /// Every queue, in name order.
    pub(crate) fn list(&self) -> Vec<QueueSummary> {
        let map = self.map.read().unwrap_or_else(PoisonError::into_inner);
        let mut all: Vec<_> = map.values().map(summary).collect();
        all.sort_by(|a, b| a.name.cmp(&b.name));
        all
    }

    /// Deletes a queue and its messages; parked receivers are answered NOT_FOUND. Returns how
    /// many messages it held.
    pub(crate) async fn delete(&self, name: &QueueName) -> Result<u64, Error> {
        let _admin = self.admin.lock().await;
        let owned = self.owned(name)?;
        // Stop the owner task first (its submitted writes finish), then delete what it left on
        // disk: no write for this queue can land after the range delete.
        self.map
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(name);
        self.placed_changed();
        let held = owned.handle.stop(true).await;
        if !owned.temporary {
            self.durable.fetch_sub(1, Ordering::Relaxed);
        }
        self.share_budget();
        if !owned.temporary {
            owned
                .log
                .write(vec![StoreOp::DeleteQueue(owned.def.uid)])
                .await?;
        }
        tracing::info!(queue = %name, messages = held, "queue deleted");
        Ok(held)
    }

    /// Applies `patch` to a durable queue's settings (each field set replaces the queue's; see
    /// `ferry_proto::convert::queue_config_from_pb`), checked as at creation and written to the
    /// store before the queue follows them; its new dead-letter and expiry queues are created
    /// first. Returns the settings before and after, or `None` when they were already so.
    pub(crate) async fn update(
        &self,
        name: &QueueName,
        patch: ferry_proto::pb::QueueConfig,
    ) -> Result<Option<(QueueConfig, QueueConfig)>, Error> {
        let _admin = self.admin.lock().await;
        let owned = self.owned(name)?;
        if owned.temporary {
            return Err(Error::CannotUpdate {
                field: "name",
                reason: format!(
                    "{name} is a temporary queue: it has no settings to change, and lives only as long as its connection"
                ),
            });
        }
        let before = owned.def.config.clone();
        let config = ferry_proto::convert::queue_config_from_pb(Some(patch), &before)?;
        validate_config(name, &config)?;
        if before == config {
            return Ok(None);
        }
        if targets_up_front(name, false) {
            self.create_targets(name, &config).await?;
        }
        let def = QueueDef {
            config: config.clone(),
            ..owned.def.clone()
        };
        owned
            .log
            .write(vec![StoreOp::PutQueue(def.clone())])
            .await?;
        owned
            .handle
            .call(|reply| {
                crate::actor::Cmd::Admin(crate::actor::AdminCmd::SetConfig {
                    config: config.clone(),
                    reply,
                })
            })
            .await?;
        if let Some(o) = self
            .map
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .get_mut(name)
        {
            o.def = def;
        }
        self.placed_changed();
        let changes = crate::queues::changes(name, &before, &config);
        tracing::info!(queue = %name, changes = %changes, "queue updated");
        self.outbox.event(crate::outbox::BrokerEvent {
            at_ms: self.clock.now_ms(),
            kind: "queue-updated",
            queue: Some(name.clone()),
            shard: None,
            value: 0,
            message_id: String::new(),
            reason: "",
            detail: changes,
        });
        Ok(Some((before, config)))
    }

    /// Completes once [`Queues::stop_all`] began.
    pub(crate) fn stopped(&self) -> impl std::future::Future<Output = ()> + Send + 'static {
        let mut rx = self.stopped_tx.subscribe();
        async move {
            // An error means the sender is gone: the queues are gone all the same.
            let _ = rx.wait_for(|stopped| *stopped).await;
        }
    }

    /// Stops every queue: calls fail with UNAVAILABLE from now on, and so do parked receivers;
    /// writes already submitted finish.
    pub(crate) async fn stop_all(&self) {
        self.stopping.store(true, Ordering::Release);
        self.stopped_tx.send_replace(true);
        let all: Vec<_> = {
            let mut map = self.map.write().unwrap_or_else(PoisonError::into_inner);
            map.drain().map(|(_, o)| o.handle).collect()
        };
        for h in all {
            h.stop(false).await;
        }
    }
}

fn summary(o: &Owned) -> QueueSummary {
    QueueSummary {
        name: o.def.name.clone(),
        config: o.def.config.clone(),
        temporary: o.temporary,
    }
}

pub(crate) fn validate_config(name: &QueueName, c: &QueueConfig) -> Result<(), Error> {
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
                        "the default {name}{} is not a valid queue name (names are at most {} bytes); name another queue or discard",
                        QueueName::DEAD_LETTER_SUFFIX,
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

/// What differs between two settings of `name`, as "field: old -> new" pairs joined by ", ".
pub(crate) fn changes(name: &QueueName, before: &QueueConfig, after: &QueueConfig) -> String {
    ferry_proto::settings::queue_config_changes(
        &ferry_proto::convert::queue_config_to_pb(name, before),
        &ferry_proto::convert::queue_config_to_pb(name, after),
    )
    .into_iter()
    .map(|c| format!("{}: {} -> {}", c.field, c.before, c.after))
    .collect::<Vec<_>>()
    .join(", ")
}
