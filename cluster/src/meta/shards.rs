//! Queue shards: which replicated queues share a Raft group, and on which nodes it lives.
//!
//! A shard holds many queues (one Raft group per queue is what limits quorum queues and
//! streams elsewhere to a few thousand per node). The metadata maps queue → shard
//! ([`QueueDef::shard`]) and shard → replicas ([`ShardDef`]), each with an epoch from the one
//! cluster-wide counter. A queue's dead-letter and expiry queues live in its shard. A queue of
//! replication factor 1 has no shard: its data is on its owner alone, written with no log in
//! front.
//!
//! The rule, applied by the proposer before it proposes
//! [`MetaCommand::CreateReplicatedQueue`](super::MetaCommand::CreateReplicatedQueue)
//! ([`choose_shard`]; apply checks the choice again):
//! - replication factor 3 or 5 ([`REPLICATION_FACTORS`]), at most the number of active nodes;
//!   the default is 3 once the cluster has 3 active nodes or more, 1 below
//!   ([`default_replication`]);
//! - a queue whose dead-letter or expiry queue exists already goes where that queue is;
//! - a queue asking for a shard of its own gets a new one, which no other queue joins (but the
//!   queue itself, made again where its dead-letter queue stayed);
//! - otherwise it joins the shared shard of its replication factor, all of whose replicas are
//!   active, holding the fewest queues (then the smallest id), once there are as many such
//!   shards as active nodes (so that every node can lead one) and one of them holds fewer than
//!   [`QUEUES_PER_SHARD_MAX`]; until then a new shard is made;
//! - a new shard's first replica, its preferred leader, is the node that is first replica of
//!   the fewest shards; the others are the nodes holding the fewest replicas; nodes the
//!   proposer cannot reach come last (a shard made while a node is down spreads over the
//!   others), ties go to the smaller id. Leaders are balanced by the preferred leader; replicas
//!   by their count.

use std::collections::{BTreeMap, BTreeSet};

use ferry_kernel::{NodeId, PlacementEpoch, QueueName, ShardId};
use ferry_proto::pb;

use super::command::MetaEvent;
use super::error::MetaError;
use super::queues::companions;
use super::state::MetaState;

/// The replication factors a queue may have. 1 is a queue with no shard.
pub const REPLICATION_FACTORS: [usize; 3] = [1, 3, 5];

/// A shared shard takes new queues while it holds fewer than this many.
pub const QUEUES_PER_SHARD_MAX: usize = 4_096;

/// A queue shard: its replicas and the epoch that fences a former replica set.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShardDef {
    /// The nodes holding a replica, distinct, the preferred leader first.
    pub replicas: Vec<NodeId>,
    /// Given when the replica set was last decided, from the counter queues' epochs come from.
    pub epoch: PlacementEpoch,
    /// Made for one queue (and its companions), which asked for a shard of its own: no other
    /// queue joins it.
    pub dedicated: bool,
    /// Its replicas changed since it was made ([`super::MetaCommand::MoveReplica`]): its group
    /// formed long ago, so a replica that starts the group now starts it empty and is filled
    /// by the leader (a snapshot), instead of forming it with the first replicas as voters.
    pub reshaped: bool,
    /// How many queues it holds (derived from the queues, kept by
    /// [`MetaState::insert_queue`] and [`MetaState::remove_queue`]).
    pub queues: usize,
}

impl ShardDef {
    /// How many replicas it has.
    pub fn replication(&self) -> usize {
        self.replicas.len()
    }

    /// The preferred leader (first replica).
    pub fn preferred_leader(&self) -> &NodeId {
        &self.replicas[0]
    }
}

/// The shards by id: a persistent map, cheap to copy with the rest of the state.
pub type ShardDefs = imbl::OrdMap<ShardId, ShardDef>;

/// Where a new replicated queue goes, as the proposer chose it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ShardChoice {
    /// A shard that exists.
    Existing(ShardId),
    /// A new shard on these replicas (the preferred leader first).
    New {
        /// Its replicas.
        replicas: Vec<NodeId>,
        /// Made for this queue alone.
        dedicated: bool,
    },
}

/// The replication factor of a queue created without one: 3 once the cluster has 3 active
/// nodes or more, 1 below.
pub fn default_replication(active_nodes: usize) -> usize {
    if active_nodes >= 3 {
        3
    } else {
        1
    }
}

/// The replication factor of a queue created with none asked for, once the cluster has that many
/// active nodes (see [`MetaState::default_replication`]).
pub const DEFAULT_REPLICATION: usize = 3;

/// Chooses the shard of a new queue `name` with `settings` and `replication` (3 or 5) by the
/// rule of the module docs. `down` are the nodes the proposer cannot reach. Pure.
pub fn choose_shard(
    state: &MetaState,
    name: &QueueName,
    settings: &pb::QueueConfig,
    replication: usize,
    dedicated: bool,
    down: &BTreeSet<NodeId>,
) -> Result<ShardChoice, MetaError> {
    state.check_replication(replication)?;
    if let Some(existing) = state.companion_placement(name, settings)? {
        return match existing.shard {
            Some(shard) => {
                // The other companions, if they exist, must be there too.
                let leader = state
                    .shards
                    .get(&shard)
                    .map(|s| s.preferred_leader().clone());
                if let Some(leader) = leader {
                    state.missing_companions(name, settings, &leader, Some(shard))?;
                }
                Ok(ShardChoice::Existing(shard))
            }
            None => Err(MetaError::CompanionInOtherShard {
                queue: name.clone(),
                companion: existing.name,
                shard: None,
            }),
        };
    }
    if !dedicated {
        let shared: Vec<(&ShardId, &ShardDef)> = state
            .shards
            .iter()
            .filter(|(_, s)| !s.dedicated && s.replication() == replication)
            .filter(|(_, s)| s.replicas.iter().all(|r| state.is_active(r)))
            .collect();
        let roomy = shared
            .iter()
            .filter(|(_, s)| s.queues < QUEUES_PER_SHARD_MAX)
            .min_by_key(|(id, s)| (s.queues, **id));
        if let (Some((id, _)), true) = (roomy, shared.len() >= state.active_count()) {
            return Ok(ShardChoice::Existing(**id));
        }
    }
    Ok(ShardChoice::New {
        replicas: state.new_shard_replicas(replication, down),
        dedicated,
    })
}

/// A companion queue that exists already, and its shard.
pub(crate) struct CompanionPlacement {
    pub(crate) name: QueueName,
    pub(crate) shard: Option<ShardId>,
}

impl MetaState {
    /// Whether `node` is an active node of the cluster.
    pub(crate) fn is_active(&self, node: &NodeId) -> bool {
        self.nodes.get(node).is_some_and(|n| n.is_active())
    }

    fn active_count(&self) -> usize {
        self.nodes.values().filter(|n| n.is_active()).count()
    }

    /// The replication factor of queue `name` created with `settings` and none asked for
    /// (issue 24): its dead-letter or expiry queue's, if one exists already (they live
    /// together); 1 for a queue pinned to a node; 3 once the cluster has 3 or more active
    /// nodes, 1 below that.
    pub fn default_replication(
        &self,
        name: &QueueName,
        settings: &pb::QueueConfig,
        pinned: bool,
    ) -> Result<usize, MetaError> {
        if pinned {
            return Ok(1);
        }
        if let Some(companion) = self.companion_placement(name, settings)? {
            return Ok(companion
                .shard
                .and_then(|s| self.shards.get(&s))
                .map_or(1, ShardDef::replication));
        }
        Ok(if self.active_count() >= DEFAULT_REPLICATION {
            DEFAULT_REPLICATION
        } else {
            1
        })
    }

    /// Refuses a replication factor that is not 3 or 5 or exceeds the active nodes.
    pub(crate) fn check_replication(&self, replication: usize) -> Result<(), MetaError> {
        let active = self.active_count();
        if replication < 3 || !REPLICATION_FACTORS.contains(&replication) {
            return Err(MetaError::InvalidReplication { replication });
        }
        if replication > active {
            return Err(MetaError::TooFewNodes {
                replication,
                active,
            });
        }
        Ok(())
    }

    /// The first of `name`'s dead-letter and expiry queues that exists, with where it lives.
    pub(crate) fn companion_placement(
        &self,
        name: &QueueName,
        settings: &pb::QueueConfig,
    ) -> Result<Option<CompanionPlacement>, MetaError> {
        Ok(companions(name, settings)?.into_iter().find_map(|c| {
            let q = self.queues.get(&c)?;
            Some(CompanionPlacement {
                shard: q.shard,
                name: c,
            })
        }))
    }

    /// The replicas of a new shard of `replication` (the module docs' rule).
    fn new_shard_replicas(&self, replication: usize, down: &BTreeSet<NodeId>) -> Vec<NodeId> {
        let mut led: BTreeMap<&NodeId, usize> = Default::default();
        let mut held: BTreeMap<&NodeId, usize> = Default::default();
        for s in self.shards.values() {
            *led.entry(s.preferred_leader()).or_default() += 1;
            for r in &s.replicas {
                *held.entry(r).or_default() += 1;
            }
        }
        let active: Vec<&NodeId> = self
            .nodes
            .iter()
            .filter(|(_, n)| n.is_active())
            .map(|(id, _)| id)
            .collect();
        let count = |m: &BTreeMap<&NodeId, usize>, id: &NodeId| m.get(id).copied().unwrap_or(0);
        let leader = active
            .iter()
            .min_by_key(|id| (down.contains(**id), count(&led, id), count(&held, id), **id))
            .copied();
        let mut replicas: Vec<NodeId> = leader.into_iter().cloned().collect();
        let mut others: Vec<&NodeId> = active
            .into_iter()
            .filter(|id| Some(*id) != leader)
            .collect();
        others.sort_by_key(|id| (down.contains(*id), count(&held, id), *id));
        replicas.extend(
            others
                .into_iter()
                .take(replication.saturating_sub(1))
                .cloned(),
        );
        replicas
    }

    pub(crate) fn create_replicated_queue(
        &mut self,
        name: &QueueName,
        settings: &pb::QueueConfig,
        choice: &ShardChoice,
    ) -> Result<MetaEvent, MetaError> {
        self.check_absent(name)?;
        let (shard, leader) = match choice {
            ShardChoice::Existing(id) => {
                let def = self
                    .shards
                    .get(id)
                    .ok_or(MetaError::ShardNotFound { shard: *id })?;
                if def.dedicated && !self.only_companions_in(*id, name, settings)? {
                    return Err(MetaError::ShardDedicated { shard: *id });
                }
                (*id, def.preferred_leader().clone())
            }
            ShardChoice::New { replicas, .. } => {
                self.check_replicas(replicas)?;
                (self.next_shard(), replicas[0].clone())
            }
        };
        // Every companion that exists must be in this shard (checked before anything changes).
        let missing = self.missing_companions(name, settings, &leader, Some(shard))?;
        let created_shard = match choice {
            ShardChoice::Existing(_) => false,
            ShardChoice::New {
                replicas,
                dedicated,
            } => {
                self.make_shard(replicas.clone(), *dedicated);
                true
            }
        };
        let mut queues = vec![(
            name.clone(),
            self.place(name, settings.clone(), &leader, Some(shard)),
        )];
        for companion in missing {
            let placed = self.place(&companion, pb::QueueConfig::default(), &leader, Some(shard));
            queues.push((companion, placed));
        }
        Ok(MetaEvent::ReplicatedQueuesCreated {
            shard,
            created_shard,
            queues,
        })
    }

    /// Whether every queue in `shard` is a dead-letter or expiry queue of `name`: a queue made
    /// again where its dedicated shard kept its dead-letter queue.
    fn only_companions_in(
        &self,
        shard: ShardId,
        name: &QueueName,
        settings: &pb::QueueConfig,
    ) -> Result<bool, MetaError> {
        let held = self.shards.get(&shard).map_or(0, |s| s.queues);
        let in_shard = companions(name, settings)?
            .iter()
            .filter(|c| self.queues.get(*c).is_some_and(|q| q.shard == Some(shard)))
            .count();
        Ok(in_shard == held)
    }

    /// Refuses replicas that are not 3 or 5 distinct active nodes.
    fn check_replicas(&self, replicas: &[NodeId]) -> Result<(), MetaError> {
        self.check_replication(replicas.len())?;
        let distinct: BTreeSet<&NodeId> = replicas.iter().collect();
        if distinct.len() != replicas.len() {
            return Err(MetaError::InvalidReplicas {
                reason: format!("{replicas:?} names a node twice"),
            });
        }
        for r in replicas {
            self.active_node(r)?;
        }
        Ok(())
    }

    /// Defines shard `next_shard` on `replicas` with the next epoch.
    fn make_shard(&mut self, replicas: Vec<NodeId>, dedicated: bool) {
        let id = self.next_shard();
        let def = ShardDef {
            replicas,
            epoch: self.take_epoch(),
            dedicated,
            reshaped: false,
            queues: 0,
        };
        self.shards.insert(id, def);
        self.next_shard += 1;
    }

    /// Removes `shard` if it holds no queue any more; whether it did.
    pub(crate) fn drop_if_empty(&mut self, shard: Option<ShardId>) -> Option<ShardId> {
        let id = shard?;
        if self.shards.get(&id)?.queues == 0 {
            self.shards.remove(&id);
            return Some(id);
        }
        None
    }

    /// The shard half of [`MetaState::check_invariants`]: ids below the counter, replicas 3 or
    /// 5 distinct active nodes, epochs known, below the counter and given once (shards and
    /// queues alike), every queue's shard defined, no shard empty and its count right.
    pub(crate) fn check_shards(&self) -> Result<(), String> {
        if !(1..=super::state::COUNTER_MAX).contains(&self.next_shard) {
            return Err(format!("next shard id {} out of range", self.next_shard));
        }
        let mut epochs: BTreeSet<PlacementEpoch> =
            self.queues.values().map(|q| q.owner.epoch).collect();
        let mut held: BTreeMap<ShardId, usize> = Default::default();
        for q in self.queues.values() {
            if let Some(id) = q.shard {
                *held.entry(id).or_default() += 1;
            }
        }
        for (id, s) in &self.shards {
            if id.0 == 0 || id.0 >= self.next_shard {
                return Err(format!("{id} not below next shard id {}", self.next_shard));
            }
            let distinct: BTreeSet<&NodeId> = s.replicas.iter().collect();
            if !REPLICATION_FACTORS.contains(&s.replicas.len())
                || s.replicas.len() < 3
                || distinct.len() != s.replicas.len()
                || !s.replicas.iter().all(|r| self.is_active(r))
            {
                return Err(format!(
                    "{id}: replicas {:?} are not 3 or 5 distinct active nodes",
                    s.replicas
                ));
            }
            if !s.epoch.is_known() || s.epoch >= self.next_epoch || !epochs.insert(s.epoch) {
                return Err(format!("{id}: epoch {} reused or out of range", s.epoch));
            }
            let held = held.get(id).copied().unwrap_or(0);
            if held != s.queues || held == 0 {
                return Err(format!("{id}: counts {} queues, holds {held}", s.queues));
            }
        }
        for (name, q) in &self.queues {
            if let Some(id) = q.shard {
                let Some(s) = self.shards.get(&id) else {
                    return Err(format!("queue {name}: {id} is not defined"));
                };
                if s.preferred_leader() != &q.owner.node {
                    return Err(format!(
                        "queue {name}: owner {} is not the preferred leader of {id}",
                        q.owner.node
                    ));
                }
            }
        }
        Ok(())
    }
}
