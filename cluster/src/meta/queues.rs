//! Queue commands: create, update, delete. A queue's dead-letter and expiry queues live on
//! the queue's owner and are created with it; every new owner of a queue gets a fresh epoch
//! from the cluster-wide counter.

use ferry_kernel::{NodeId, QueueConfig, QueueName};
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
        if self.queues.contains_key(name) {
            return Err(MetaError::QueueExists {
                queue: name.clone(),
            });
        }
        self.active_node(owner)?;
        let companions = self.missing_companions(name, settings, owner)?;
        let mut queues = vec![(name.clone(), self.place(name, settings.clone(), owner))];
        for companion in companions {
            let placed = self.place(&companion, pb::QueueConfig::default(), owner);
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
        let (owner, current) = self
            .queues
            .get(name)
            .map(|q| (q.owner.clone(), &q.settings))
            .ok_or_else(|| MetaError::QueueNotFound {
                queue: name.clone(),
            })?;
        if expected.is_some_and(|e| e != current) {
            return Err(MetaError::SettingsChanged {
                queue: name.clone(),
            });
        }
        let companions = self.missing_companions(name, settings, &owner.node)?;
        let mut created = Vec::new();
        for companion in companions {
            let placed = self.place(&companion, pb::QueueConfig::default(), &owner.node);
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
        Ok(MetaEvent::QueueDeleted {
            name: name.clone(),
            owner: removed.owner,
        })
    }

    /// Defines a queue on `node` with the next epoch.
    fn place(&mut self, name: &QueueName, settings: pb::QueueConfig, node: &NodeId) -> Owner {
        let owner = Owner {
            node: node.clone(),
            epoch: self.next_epoch,
        };
        self.next_epoch = self.next_epoch.next().expect(
            "invariant: check_invariants keeps next_epoch <= COUNTER_MAX, far below u64::MAX",
        );
        let def = QueueDef {
            settings,
            owner: owner.clone(),
        };
        self.insert_queue(name.clone(), def);
        owner
    }

    /// Checks the settings and returns the dead-letter / expiry queues of `name` that do not
    /// exist yet; refuses when one exists on another node. Companions are created with default
    /// settings and get no companions of their own (today's back-end resolves a dead-letter
    /// queue's own target locally; placing those is left to the wiring).
    fn missing_companions(
        &self,
        name: &QueueName,
        settings: &pb::QueueConfig,
        owner: &NodeId,
    ) -> Result<Vec<QueueName>, MetaError> {
        let mut missing = Vec::new();
        for companion in companions(name, settings)? {
            match self.queues.get(&companion) {
                None => missing.push(companion),
                Some(q) if &q.owner.node == owner => {}
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
