//! The node's back-end as the metadata group sees it: the queues it holds, and how the
//! committed metadata is carried out on it (a queue created or deleted on its owner only after
//! the command is committed and applied here).

use std::collections::BTreeMap;

use ferry_kernel::{NodeId, PlacementEpoch, QueueName};
use ferry_proto::pb;

use ferry_cluster::meta::MetaState;

/// A durable queue held by the local back-end.
#[derive(Debug, Clone)]
pub struct HeldQueue {
    /// Its name.
    pub name: QueueName,
    /// Its settings, as given at creation.
    pub settings: pb::QueueConfig,
    /// The placement epoch it is served at.
    pub epoch: PlacementEpoch,
}

/// The local back-end, implemented by the node assembly (the cluster crate does not depend on
/// the back-end).
#[tonic::async_trait]
pub trait QueueHost: Send + Sync + 'static {
    /// The durable queues held here (temporary queues never touch the metadata).
    fn queues(&self) -> Vec<HeldQueue>;
    /// Checks a new queue's settings as its creation would (the answer to a caller's mistake,
    /// given before anything is proposed).
    fn check_settings(
        &self,
        name: &QueueName,
        settings: &pb::QueueConfig,
    ) -> Result<(), tonic::Status>;
    /// Creates a queue (if missing) and serves it at `epoch`.
    async fn create(
        &self,
        name: &QueueName,
        settings: &pb::QueueConfig,
        epoch: PlacementEpoch,
    ) -> Result<(), String>;
    /// Bytes of messages held by every queue here (the placement rule's second criterion).
    async fn stored_bytes(&self) -> u64;
    /// Serves a held queue at `epoch` from now on.
    fn set_epoch(&self, name: &QueueName, epoch: PlacementEpoch);
    /// Deletes a queue and its messages.
    async fn delete(&self, name: &QueueName) -> Result<(), String>;
    /// Applies a queue's settings from the metadata to the held queue, as a change (each field
    /// set replaces the queue's); nothing when it has them already.
    async fn update(&self, name: &QueueName, settings: &pb::QueueConfig) -> Result<(), String>;
}

/// Brings the local back-end in line with `meta`: every queue `me` owns exists at its epoch;
/// with `delete_unknown`, a held queue the metadata does not place here is deleted (only at
/// start, from the metadata written with the last applied index: a queue is created on a
/// back-end only after its command is applied and durable here, so one missing from that
/// metadata was deleted while the node was down).
pub(crate) async fn reconcile(
    host: &dyn QueueHost,
    meta: &MetaState,
    me: &NodeId,
    delete_unknown: bool,
) {
    let held: BTreeMap<QueueName, HeldQueue> = host
        .queues()
        .into_iter()
        .map(|q| (q.name.clone(), q))
        .collect();
    for (name, def) in meta.queues() {
        if &def.owner.node != me {
            continue;
        }
        match held.get(name) {
            Some(q) => {
                if q.epoch != def.owner.epoch {
                    host.set_epoch(name, def.owner.epoch);
                }
                // At start: a change committed just before the node stopped may not have
                // reached the back-end. Settings never given (a dead-letter queue made with its
                // queue) change nothing.
                if delete_unknown && def.settings != pb::QueueConfig::default() {
                    if let Err(e) = host.update(name, &def.settings).await {
                        tracing::error!(queue = %name, error = %e, "cannot give a queue the settings the metadata has for it");
                    }
                }
            }
            None => {
                if let Err(e) = host.create(name, &def.settings, def.owner.epoch).await {
                    tracing::error!(queue = %name, error = %e, "cannot create a queue the metadata places here");
                }
            }
        }
    }
    if !delete_unknown {
        return;
    }
    for name in held.keys() {
        let placed_here = meta.queue(name).is_some_and(|d| &d.owner.node == me);
        if !placed_here {
            tracing::warn!(queue = %name, "deleting a queue the cluster metadata does not place on this node (deleted while the node was down)");
            if let Err(e) = host.delete(name).await {
                tracing::error!(queue = %name, error = %e, "cannot delete the queue");
            }
        }
    }
}

/// Deletes on the local back-end the queues `me` owned in `before` and no longer owns in
/// `after` at the same epoch: deleted through any node, or deleted and created again (the two
/// changes seen in one view: the new queue has a new epoch and must start empty; [`reconcile`]
/// creates it next).
pub(crate) async fn delete_gone(
    host: &dyn QueueHost,
    before: &MetaState,
    after: &MetaState,
    me: &NodeId,
) {
    for (name, def) in before.queues() {
        let gone = &def.owner.node == me
            && after
                .queue(name)
                .is_none_or(|d| &d.owner.node != me || d.owner.epoch != def.owner.epoch);
        if gone {
            if let Err(e) = host.delete(name).await {
                tracing::error!(queue = %name, error = %e, "cannot delete a queue deleted from the metadata");
            }
        }
    }
}

/// Applies on the local back-end the settings that changed between `before` and `after` for the
/// queues `me` owns in both (updated through any node).
pub(crate) async fn update_changed(
    host: &dyn QueueHost,
    before: &MetaState,
    after: &MetaState,
    me: &NodeId,
) {
    for (name, def) in after.queues() {
        if &def.owner.node != me {
            continue;
        }
        let changed = before
            .queue(name)
            .is_some_and(|b| &b.owner.node == me && b.settings != def.settings);
        if changed {
            match host.update(name, &def.settings).await {
                Ok(()) => {
                    tracing::debug!(queue = %name, "queue settings applied from the metadata")
                }
                Err(e) => {
                    tracing::error!(queue = %name, error = %e, "cannot apply a queue's new settings from the metadata")
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use ferry_cluster::meta::{ClusterId, MetaCommand, NewNode};

    use super::super::test_host::Recorder;
    use super::*;

    fn q(name: &str) -> QueueName {
        QueueName::new(name).unwrap()
    }

    /// Regression: a delete and a create again of one queue, coalesced into one view of the
    /// metadata, kept the old queue (and its messages) under the new definition, because only
    /// owners were compared. Now the epochs are: the old queue is deleted, the new one created.
    #[tokio::test]
    async fn a_delete_and_create_again_seen_in_one_view_starts_the_queue_empty() {
        let me = NodeId::new("a").unwrap();
        let mut meta = MetaState::new();
        let node = NewNode {
            id: me.clone(),
            client_addr: "a:1".into(),
            peer_addr: "a:2".into(),
        };
        let bootstrap = MetaCommand::Bootstrap {
            cluster_id: ClusterId(1),
            nodes: vec![node],
        };
        meta.apply(1, &bootstrap).unwrap();
        let create = MetaCommand::CreateQueue {
            name: q("orders"),
            settings: pb::QueueConfig::default(),
            owner: me.clone(),
        };
        meta.apply(2, &create).unwrap();
        let host = Recorder::default();
        reconcile(&host, &meta, &me, false).await;
        let before = meta.clone();
        meta.apply(3, &MetaCommand::DeleteQueue { name: q("orders") })
            .unwrap();
        meta.apply(4, &create).unwrap();
        let epoch = meta.queue(&q("orders")).unwrap().owner.epoch;
        assert_ne!(epoch, before.queue(&q("orders")).unwrap().owner.epoch);
        host.calls.lock().unwrap().clear();
        delete_gone(&host, &before, &meta, &me).await;
        reconcile(&host, &meta, &me, false).await;
        assert_eq!(
            *host.calls.lock().unwrap(),
            ["delete orders".to_owned(), format!("create orders {epoch}")]
        );
    }
}
