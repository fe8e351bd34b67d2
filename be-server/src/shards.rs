//! The queue shards this node replicates, as its back-end serves them (issue 24 §2).
//!
//! A replicated queue's definition and messages reach every replica's store through its shard's
//! log (the node's Raft driver applies each committed entry to the store). Only the replica that
//! leads the shard serves the shard's queues: the node tells the back-end when it starts to lead
//! a shard ([`Broker::lead_shard`], once the new leader has applied an entry of its own term, so
//! everything committed before is in the store), and the back-end then recovers the shard's
//! queues from its store, as a restart does, and starts their owner tasks writing through the
//! shard's log. When the node stops leading ([`Broker::follow_shard`]) those owner tasks stop at
//! once; calls for the shard's queues are answered "not the leader" with the leader this node
//! knows. Each run of serving a shard has its own incarnation, which fences a transaction whose
//! sends were staged in an earlier run.
//!
//! The leader also carries out the metadata's queues of the shard: a queue the metadata defines
//! and the store lacks is created through the log (its uid drawn here once, for every replica),
//! one the metadata no longer defines (or defines at another epoch: deleted and created again)
//! is deleted through the log, new settings are written through it.
//!
//! A batch the shard does not confirm fences the run's log (`shard_log.rs`): the node then ends
//! the run and starts a new one from the store, if it still leads.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::Ordering;
use std::sync::{Arc, PoisonError};

use ferry_kernel::{PlacementEpoch, QueueConfig, QueueName, QueueUid};
use ferry_proto::pb;
use ferry_store::{QueueDef, ShardReplica, StoreOp};

use crate::actor::{AdminCmd, Cmd, QueueHandle};
use crate::broker::Broker;
use crate::error::Error;
use crate::log::{NodeLog, QueueLog};
use crate::queues::{Owned, Queues};
use crate::shard_log::{ShardId, ShardLog, ShardProposer, ShardRefusal};
use crate::targets::{dead_letter_queue_config, targets_up_front};

/// A replicated queue as the metadata defines it.
#[derive(Debug, Clone, PartialEq)]
pub struct ShardQueue {
    pub name: QueueName,
    /// Its settings as given at creation or last update (empty for a dead-letter or expiry
    /// queue created with its queue: it gets the settings derived from its source's). `None`:
    /// unchanged since the last [`Broker::lead_shard`] of the same run, which gave them (the
    /// node passes only what changed, so that a change to one queue does not cost in proportion
    /// to all of them); a queue the run does not serve yet must come with its settings.
    pub settings: Option<pb::QueueConfig>,
    /// The metadata's placement epoch of the queue.
    pub epoch: PlacementEpoch,
}

/// What the back-end knows of the shards this node replicates.
#[derive(Debug, Default)]
pub(crate) struct Shards {
    /// The shards served here, each with its run's log and incarnation.
    led: HashMap<ShardId, Led>,
    /// Every replicated queue of a shard this node replicates, with its shard.
    queues: HashMap<QueueName, ShardId>,
    /// The names in `queues` of each shard, so that one shard's list is replaced in
    /// proportion to its queues, not to every queue here.
    members: HashMap<ShardId, Vec<QueueName>>,
    /// The leader this node knows of each shard it replicates and does not lead.
    leaders: HashMap<ShardId, Option<String>>,
}

#[derive(Debug)]
struct Led {
    log: ShardLog,
    /// The shard's term the run began at.
    term: u64,
    incarnation: u64,
}

impl Shards {
    /// Why `queue` is not served here, if it is a replicated queue of a shard this node
    /// replicates and does not lead.
    pub(crate) fn not_here(&self, queue: &QueueName) -> Option<Error> {
        let shard = *self.queues.get(queue)?;
        if self.led.contains_key(&shard) {
            return None;
        }
        let leader = self.leaders.get(&shard).cloned().flatten();
        Some(Error::Shard(ShardRefusal::NotLeader { shard, leader }))
    }

    /// Whether `incarnation` is the run of a shard served here.
    pub(crate) fn serves_run(&self, incarnation: u64) -> bool {
        self.led.values().any(|l| l.incarnation == incarnation)
    }

    /// Records that `shard` has the queues `names` (and no others).
    fn index(&mut self, shard: ShardId, names: Vec<QueueName>) {
        self.unindex(shard);
        for name in &names {
            self.queues.insert(name.clone(), shard);
        }
        self.members.insert(shard, names);
    }

    /// Forgets which queues `shard` has.
    fn unindex(&mut self, shard: ShardId) {
        for name in self.members.remove(&shard).unwrap_or_default() {
            if self.queues.get(&name) == Some(&shard) {
                self.queues.remove(&name);
            }
        }
    }
}

impl Broker {
    /// Serves `shard` from now on: this node leads it and has applied an entry of its term.
    /// The first call of a run recovers the shard's queues from the store and starts their
    /// owner tasks writing through `proposer`; every call then carries out `queues`, the
    /// metadata's queues of the shard (see the module docs). A run whose log was fenced ends
    /// here and a new one begins.
    ///
    /// `term`: the shard's Raft term this node leads it at. A run begun at another term ends
    /// first: whatever another leader wrote in between is in the store, not in the run's memory.
    ///
    /// `known_below`: the metadata's next epoch (`MetaState::next_epoch`). A stored queue the
    /// metadata does not list is deleted only if its epoch is below it: this node's metadata
    /// may be older than the shard's log (a node that just restarted), and then a queue created
    /// since is not in it, but must not be deleted. Returns whether such a queue was kept:
    /// the caller then calls again when its metadata has moved on, to delete it if the
    /// metadata still does not list it.
    pub async fn lead_shard(
        &self,
        shard: ShardId,
        term: u64,
        proposer: Arc<dyn ShardProposer>,
        queues: Vec<ShardQueue>,
        known_below: PlacementEpoch,
    ) -> Result<bool, Error> {
        let q = &self.inner.queues;
        let _admin = q.admin.lock().await;
        let current = read(q)
            .led
            .get(&shard)
            .map(|l| !l.log.is_fenced() && l.term == term);
        if current == Some(false) {
            q.stop_shard(shard).await;
        }
        if current != Some(true) {
            q.start_shard(shard, term, proposer)?;
        }
        q.index_shard(shard, queues.iter().map(|w| w.name.clone()).collect(), None);
        q.carry_out_shard(shard, queues, known_below).await
    }

    /// This node replicates `shard` and does not lead it (any more): its queues stop here at
    /// once (pending calls fail with UNAVAILABLE), and calls for them are answered "not the
    /// leader", naming `leader` if known.
    pub async fn follow_shard(&self, shard: ShardId, leader: Option<String>, queues: &[QueueName]) {
        let q = &self.inner.queues;
        let _admin = q.admin.lock().await;
        q.stop_shard(shard).await;
        q.index_shard(shard, queues.to_vec(), Some(leader));
    }

    /// This node no longer replicates `shard` (the shard is gone with its last queue: its Raft
    /// group left this node with it, so no entry of it comes any more): its queues stop here,
    /// what the store still holds of them is deleted through the node's own log, and it is
    /// forgotten.
    pub async fn forget_shard(&self, shard: ShardId) -> Result<(), Error> {
        let q = &self.inner.queues;
        let _admin = q.admin.lock().await;
        q.stop_shard(shard).await;
        {
            let mut shards = write(q);
            shards.leaders.remove(&shard);
            shards.unindex(shard);
        }
        let left: Vec<QueueUid> =
            tokio::task::block_in_place(|| q.store.recover_where(&in_shard(shard)))?
                .into_iter()
                .map(|r| r.def.uid)
                .collect();
        if !left.is_empty() {
            let deletes = left.iter().map(|uid| StoreOp::DeleteQueue(*uid)).collect();
            q.log.write(deletes).await?;
            tracing::info!(%shard, queues = left.len(), "deleted what the store held of a queue shard that is gone");
        }
        Ok(())
    }

    /// A receiver that changes each time a shard's log is fenced (see the module docs).
    pub fn shard_fences(&self) -> tokio::sync::watch::Receiver<u64> {
        self.inner.queues.fences.subscribe()
    }

    /// The shards served here.
    pub fn shards_led(&self) -> Vec<ShardId> {
        let mut led: Vec<ShardId> = read(&self.inner.queues).led.keys().copied().collect();
        led.sort();
        led
    }

    /// Whether `incarnation` is the run of this back-end or of a shard it serves.
    pub(crate) fn serves_run(&self, incarnation: u64) -> bool {
        incarnation == self.inner.queues.incarnation
            || read(&self.inner.queues).serves_run(incarnation)
    }
}

/// Whether a stored queue's definition names `shard`.
fn in_shard(shard: ShardId) -> impl Fn(&QueueDef) -> bool {
    move |d| d.replica.is_some_and(|s| s.shard == shard)
}

fn read(q: &Queues) -> std::sync::RwLockReadGuard<'_, Shards> {
    q.shards.read().unwrap_or_else(PoisonError::into_inner)
}

fn write(q: &Queues) -> std::sync::RwLockWriteGuard<'_, Shards> {
    q.shards.write().unwrap_or_else(PoisonError::into_inner)
}

impl Queues {
    /// Begins a run of serving `shard`: its queues recovered from the store, each with its owner
    /// task. Holds `admin`.
    fn start_shard(
        &self,
        shard: ShardId,
        term: u64,
        proposer: Arc<dyn ShardProposer>,
    ) -> Result<(), Error> {
        let log = ShardLog::new(
            shard,
            term,
            proposer,
            Arc::clone(&self.fences),
            Arc::clone(&self.shard_commit_micros),
        );
        let incarnation = rand::random_range(1..u64::MAX);
        let now = self.clock.now_ms();
        let recovered = tokio::task::block_in_place(|| -> Result<Vec<_>, Error> {
            let mut mine = Vec::new();
            for r in self.store.recover_where(&in_shard(shard))? {
                // Kept in memory from the start: messages still to be delivered at a time of
                // their own, and those the last leader wrote a lease or a back-off for.
                let mut held = self.store.read_delayed(r.def.uid, now)?;
                held.extend(self.store.read_marked(r.def.uid)?);
                mine.push((r, held));
            }
            Ok(mine)
        })?;
        let count = recovered.len();
        for (r, delayed) in recovered {
            let epoch = r.def.replica.map_or(PlacementEpoch::UNKNOWN, |s| s.epoch);
            if self
                .map
                .read()
                .unwrap_or_else(PoisonError::into_inner)
                .contains_key(&r.def.name)
            {
                tracing::error!(queue = %r.def.name, %shard, "a replicated queue has the name of a queue served here already: not served");
                continue;
            }
            let node_log = NodeLog::Shard(log.clone());
            let (def, handle) = self.spawn_recovered(r, delayed, node_log.clone());
            self.insert(def, handle, node_log, incarnation, epoch);
        }
        write(self).led.insert(
            shard,
            Led {
                log,
                term,
                incarnation,
            },
        );
        tracing::info!(%shard, term, queues = count, "serving a queue shard as its leader");
        Ok(())
    }

    /// Ends the run of serving `shard`, if there is one: its owner tasks stop (their submitted
    /// writes resolve first). Holds `admin`.
    async fn stop_shard(&self, shard: ShardId) {
        if write(self).led.remove(&shard).is_none() {
            return;
        }
        let stopped: Vec<Owned> = {
            let mut map = self.map.write().unwrap_or_else(PoisonError::into_inner);
            let names: Vec<QueueName> = map
                .values()
                .filter(|o| o.log.shard() == Some(shard))
                .map(|o| o.def.name.clone())
                .collect();
            names.iter().filter_map(|n| map.remove(n)).collect()
        };
        self.durable.fetch_sub(stopped.len(), Ordering::Relaxed);
        self.placed_changed();
        self.share_budget();
        for o in &stopped {
            o.handle.stop(false).await;
        }
        tracing::info!(%shard, queues = stopped.len(), "no longer serving a queue shard");
    }

    /// Records which queues `shard` has and, for a shard not led here, its leader.
    fn index_shard(&self, shard: ShardId, names: Vec<QueueName>, leader: Option<Option<String>>) {
        let mut shards = write(self);
        shards.index(shard, names);
        match leader {
            Some(leader) => shards.leaders.insert(shard, leader),
            None => shards.leaders.remove(&shard),
        };
    }

    /// Serves a replicated queue of a run from now on.
    fn insert(
        &self,
        def: QueueDef,
        handle: QueueHandle,
        log: NodeLog,
        incarnation: u64,
        epoch: PlacementEpoch,
    ) {
        let owned = Owned {
            def,
            temporary: false,
            handle,
            log,
            incarnation,
            epoch,
        };
        self.map
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(owned.def.name.clone(), owned);
        self.durable.fetch_add(1, Ordering::Relaxed);
        self.placed_changed();
        self.share_budget();
    }

    /// Brings the served queues of `shard` in line with `wanted` (see the module docs); whether
    /// a queue newer than the metadata was kept. Holds `admin`.
    async fn carry_out_shard(
        &self,
        shard: ShardId,
        wanted: Vec<ShardQueue>,
        known_below: PlacementEpoch,
    ) -> Result<bool, Error> {
        let (log, incarnation) = match read(self).led.get(&shard) {
            Some(l) => (l.log.clone(), l.incarnation),
            None => return Ok(false),
        };
        let held: Vec<Owned> = self
            .map
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .values()
            .filter(|o| o.log.shard() == Some(shard))
            .cloned()
            .collect();
        let by_name: HashMap<&QueueName, &ShardQueue> =
            wanted.iter().map(|w| (&w.name, w)).collect();
        let mut kept = HashSet::new();
        let mut kept_newer = false;
        for o in held {
            let epoch = o.def.replica.map_or(PlacementEpoch::UNKNOWN, |r| r.epoch);
            match by_name.get(&o.def.name) {
                Some(w) if epoch == w.epoch => {
                    kept.insert(o.def.name.clone());
                    match &w.settings {
                        Some(s) if *s != pb::QueueConfig::default() => {
                            self.update_shard_queue(&o, s).await?;
                        }
                        _ => {}
                    }
                }
                // Newer than this node's metadata: kept until the metadata says more.
                _ if epoch >= known_below => {
                    tracing::debug!(queue = %o.def.name, %epoch, %known_below, "a replicated queue newer than this node's metadata is kept");
                    kept.insert(o.def.name.clone());
                    kept_newer = true;
                }
                _ => self.delete_shard_queue(o).await?,
            }
        }
        // Sources first: a dead-letter or expiry queue created with its queue takes settings
        // derived from the source's.
        let mut derived: HashMap<QueueName, QueueConfig> = HashMap::new();
        let mut missing: Vec<&ShardQueue> =
            wanted.iter().filter(|w| !kept.contains(&w.name)).collect();
        missing.sort_by_key(|w| !targets_up_front(&w.name, false));
        for w in missing {
            let Some(settings) = &w.settings else {
                return Err(Error::SettingsMissing {
                    queue: w.name.to_string(),
                    shard: shard.to_string(),
                });
            };
            let config = match derived.get(&w.name) {
                Some(c) if *settings == pb::QueueConfig::default() => c.clone(),
                _ => ferry_proto::convert::queue_config_from_pb(
                    Some(settings.clone()),
                    &self.config.queue_defaults,
                )?,
            };
            crate::queues::validate_config(&w.name, &config)?;
            for target in [&config.dead_letter, &config.expiry] {
                if let Some(t) = target.resolve(&w.name) {
                    derived.insert(t, dead_letter_queue_config(&config));
                }
            }
            self.create_shard_queue(shard, &log, incarnation, w, config)
                .await?;
        }
        Ok(kept_newer)
    }

    async fn create_shard_queue(
        &self,
        shard: ShardId,
        log: &ShardLog,
        incarnation: u64,
        w: &ShardQueue,
        config: QueueConfig,
    ) -> Result<(), Error> {
        if self
            .map
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .contains_key(&w.name)
        {
            tracing::error!(queue = %w.name, %shard, "a replicated queue has the name of a queue served here already: not created");
            return Ok(());
        }
        let def = QueueDef {
            name: w.name.clone(),
            // Drawn once, here: every replica applies the same definition. 0 and u64::MAX are
            // reserved (key-range bounds in the store).
            uid: QueueUid(rand::random_range(1..u64::MAX)),
            config,
            replica: Some(ShardReplica {
                shard,
                epoch: w.epoch,
                // Drawn once too: a receipt handle stays good on whichever replica leads next.
                handle_key: Some((rand::random(), rand::random())),
            }),
        };
        let node_log = NodeLog::Shard(log.clone());
        node_log.write(vec![StoreOp::PutQueue(def.clone())]).await?;
        let handle = self.spawn_new(&def, true, node_log.clone());
        self.insert(def, handle, node_log, incarnation, w.epoch);
        tracing::info!(queue = %w.name, %shard, "replicated queue created");
        Ok(())
    }

    async fn delete_shard_queue(&self, o: Owned) -> Result<(), Error> {
        self.map
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&o.def.name);
        self.durable.fetch_sub(1, Ordering::Relaxed);
        self.placed_changed();
        self.share_budget();
        let held = o.handle.stop(true).await;
        o.log.write(vec![StoreOp::DeleteQueue(o.def.uid)]).await?;
        tracing::info!(queue = %o.def.name, messages = held, "replicated queue deleted");
        Ok(())
    }

    /// Gives a served queue the metadata's settings, if they differ.
    async fn update_shard_queue(&self, o: &Owned, settings: &pb::QueueConfig) -> Result<(), Error> {
        let config =
            ferry_proto::convert::queue_config_from_pb(Some(settings.clone()), &o.def.config)?;
        if config == o.def.config {
            return Ok(());
        }
        crate::queues::validate_config(&o.def.name, &config)?;
        let def = QueueDef {
            config: config.clone(),
            ..o.def.clone()
        };
        o.log.write(vec![StoreOp::PutQueue(def.clone())]).await?;
        o.handle
            .call(|reply| Cmd::Admin(AdminCmd::SetConfig { config, reply }))
            .await?;
        if let Some(held) = self
            .map
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .get_mut(&o.def.name)
        {
            held.def = def;
        }
        self.placed_changed();
        Ok(())
    }
}
