//! Queue commands: create, update, delete. A queue's dead-letter and expiry queues live on
//! the queue's owner, in its shard if it has one, and are created with it; every new owner of
//! a queue gets a fresh epoch from the cluster-wide counter. Replicated queues are created in
//! `shards.rs`.

use ferry_kernel::{NodeId, PlacementEpoch, QueueConfig, QueueName, ShardId};
use ferry_proto::convert::queue_config_from_pb;
use ferry_proto::pb;

use super::command::MetaEvent;
use super::error::MetaError;
use super::state::{MetaState, Owner, QueueDef};

impl MetaState {
    pub(crate) fn create_queue(
        &mut self,
        name: &QueueName,
        settings: &pb::QueueConfig,
        owner: &NodeId,
    ) -> Result<MetaEvent, MetaError> {
        self.check_absent(name)?;
        self.active_node(owner)?;
        let companions = self.missing_companions(name, settings, owner, None)?;
        let mut queues = vec![(
            name.clone(),
            self.place(name, settings.clone(), owner, None),
        )];
        for companion in companions {
            let placed = self.place(&companion, pb::QueueConfig::default(), owner, None);
            queues.push((companion, placed));
        }
        Ok(MetaEvent::QueuesCreated { queues })
    }

    pub(crate) fn update_queue(
        &mut self,
        name: &QueueName,
        settings: &pb::QueueConfig,
        expected: Option<&pb::QueueConfig>,
    ) -> Result<MetaEvent, MetaError> {
        let (owner, shard, current) = self
            .queues
            .get(name)
            .map(|q| (q.owner.clone(), q.shard, &q.settings))
            .ok_or_else(|| MetaError::QueueNotFound {
                queue: name.clone(),
            })?;
        if expected.is_some_and(|e| e != current) {
            return Err(MetaError::SettingsChanged {
                queue: name.clone(),
            });
        }
        let companions = self.missing_companions(name, settings, &owner.node, shard)?;
        let mut created = Vec::new();
        for companion in companions {
            let placed = self.place(&companion, pb::QueueConfig::default(), &owner.node, shard);
            created.push((companion, placed));
        }
        if let Some(q) = self.queues.get_mut(name) {
            q.settings = settings.clone();
        }
        Ok(MetaEvent::QueueUpdated {
            name: name.clone(),
            owner,
            created,
        })
    }

    pub(crate) fn delete_queue(&mut self, name: &QueueName) -> Result<MetaEvent, MetaError> {
        let removed = self
            .remove_queue(name)
            .ok_or_else(|| MetaError::QueueNotFound {
                queue: name.clone(),
            })?;
        let removed_shard = self.drop_if_empty(removed.shard);
        Ok(MetaEvent::QueueDeleted {
            name: name.clone(),
            owner: removed.owner,
            removed_shard,
        })
    }

    /// Refuses a new queue whose name is taken.
    pub(crate) fn check_absent(&self, name: &QueueName) -> Result<(), MetaError> {
        if self.queues.contains_key(name) {
            return Err(MetaError::QueueExists {
                queue: name.clone(),
            });
        }
        Ok(())
    }

    /// Defines a queue on `node` (in `shard`, if replicated) with the next epoch.
    pub(crate) fn place(
        &mut self,
        name: &QueueName,
        settings: pb::QueueConfig,
        node: &NodeId,
        shard: Option<ShardId>,
    ) -> Owner {
        let owner = Owner {
            node: node.clone(),
            epoch: self.take_epoch(),
        };
        let def = QueueDef {
            settings,
            owner: owner.clone(),
            shard,
        };
        self.insert_queue(name.clone(), def);
        owner
    }

    /// The next epoch of the cluster-wide counter, which moves on.
    pub(crate) fn take_epoch(&mut self) -> PlacementEpoch {
        let epoch = self.next_epoch;
        self.next_epoch = self.next_epoch.next().expect(
            "invariant: check_invariants keeps next_epoch <= COUNTER_MAX, far below u64::MAX",
        );
        epoch
    }

    /// Checks the settings and returns the dead-letter / expiry queues of `name` that do not
    /// exist yet; refuses when one exists on another node or in another shard. Companions are created with default
    /// settings and get no companions of their own (today's back-end resolves a dead-letter
    /// queue's own target locally; placing those is left to the wiring).
    pub(crate) fn missing_companions(
        &self,
        name: &QueueName,
        settings: &pb::QueueConfig,
        owner: &NodeId,
        shard: Option<ShardId>,
    ) -> Result<Vec<QueueName>, MetaError> {
        let mut missing = Vec::new();
        for companion in companions(name, settings)? {
            match self.queues.get(&companion) {
                None => missing.push(companion),
                Some(q) if q.shard != shard => {
                    return Err(MetaError::CompanionInOtherShard {
                        queue: name.clone(),
                        companion,
                        shard: q.shard,
                    })
                }
                Some(q) if shard.is_some() || &q.owner.node == owner => {}
                Some(q) => {
                    return Err(MetaError::CompanionElsewhere {
                        queue: name.clone(),
                        companion,
                        owner: q.owner.node.clone(),
                    })
                }
            }
        }
        Ok(missing)
    }
}

/// The dead-letter and expiry queues of `name` with these settings (distinct, never `name`
/// itself); invalid settings are refused.
pub(crate) fn companions(
    name: &QueueName,
    settings: &pb::QueueConfig,
) -> Result<Vec<QueueName>, MetaError> {
    let config =
        queue_config_from_pb(Some(settings.clone()), &QueueConfig::default()).map_err(|e| {
            MetaError::InvalidSettings {
                queue: name.clone(),
                reason: e.to_string(),
            }
        })?;
    let mut out = Vec::new();
    for companion in [
        config.dead_letter.resolve(name),
        config.expiry.resolve(name),
    ]
    .into_iter()
    .flatten()
    {
        if &companion != name && !out.contains(&companion) {
            out.push(companion);
        }
    }
    Ok(out)
}
