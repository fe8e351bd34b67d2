//! The node's back-end as the metadata group sees it: the queues it holds, and how the
//! committed metadata is carried out on it (a queue created or deleted on its owner only after
//! the command is committed and applied here).

use std::collections::{BTreeMap, BTreeSet};

use std::sync::Arc;

use ferry_be_server::{ShardId, ShardProposer, ShardQueue};
use ferry_kernel::{NodeId, PlacementEpoch, QueueName};
use ferry_proto::pb;

use ferry_cluster::meta::{MetaState, QueueDef};

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
    /// Serves `shard`, which this node leads at `term` (see
    /// `ferry_be_server::Broker::lead_shard`), with the metadata's `queues` of it; whether a
    /// queue newer than the metadata (`known_below`) was kept.
    async fn lead_shard(
        &self,
        shard: ShardId,
        term: u64,
        proposer: Arc<dyn ShardProposer>,
        queues: Vec<ShardQueue>,
        known_below: PlacementEpoch,
    ) -> Result<bool, String>;
    /// Stops serving `shard`, which this node replicates and `leader` leads (if known).
    async fn follow_shard(&self, shard: ShardId, leader: Option<String>, queues: &[QueueName]);
    /// Forgets `shard`: this node no longer replicates it (its data is deleted here).
    async fn forget_shard(&self, shard: ShardId) -> Result<(), String>;
    /// Changes each time a served shard's log is fenced: the shard must be served anew.
    fn shard_fences(&self) -> tokio::sync::watch::Receiver<u64>;
    /// Tells watchers (`Admin.WatchEvents`) that this node began to lead `shard` at `term`.
    fn shard_leader_event(&self, shard: ShardId, term: u64, detail: String);
    /// Tells watchers that `shard`, led here, is short of copies (`under`) or whole again,
    /// with `whole` replicas up and voting (see `shard/replication_events.rs`).
    fn shard_replication_event(&self, shard: ShardId, under: bool, whole: u64, detail: String);
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
        if !local_here(def, me) {
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
        // A replicated queue is its shard's: never deleted here as a local one.
        let placed_here = meta
            .queue(name)
            .is_some_and(|d| local_here(d, me) || d.shard.is_some());
        if !placed_here {
            tracing::warn!(queue = %name, "deleting a queue the cluster metadata does not place on this node (deleted while the node was down)");
            if let Err(e) = host.delete(name).await {
                tracing::error!(queue = %name, error = %e, "cannot delete the queue");
            }
        }
    }
}

/// Carries out on the local back-end what changed between `before` and `after` (two states
/// the node published, `after` the newer), looking only at the queues that changed
/// ([`MetaState::queue_changes`]): a queue `me` owned at an epoch and no longer owns at it is
/// deleted (deleted through any node, or deleted and created again: the two changes seen in
/// one view, the new queue has a new epoch and must start empty); a queue `me` owns at a new
/// epoch is created; a queue `me` owns at the same epoch with other settings is updated.
///
/// `retry` holds the queues whose creation failed at an earlier change: each is created now if
/// `after` still places it here (as the walk over every queue at each change used to retry it);
/// those that fail again stay in it.
pub(crate) async fn carry_out(
    host: &dyn QueueHost,
    before: &MetaState,
    after: &MetaState,
    me: &NodeId,
    retry: &mut BTreeSet<QueueName>,
) {
    for name in std::mem::take(retry) {
        if let Some(def) = after.queue(&name).filter(|d| local_here(d, me)) {
            create(host, &name, def, retry).await;
        }
    }
    for change in before.queue_changes(after) {
        let (was, is) = (owned_by(change.before, me), owned_by(change.after, me));
        let same_epoch = matches!((was, is), (Some(w), Some(i)) if w.owner.epoch == i.owner.epoch);
        if was.is_some() && !same_epoch {
            if let Err(e) = host.delete(change.name).await {
                tracing::error!(queue = %change.name, error = %e, "cannot delete a queue deleted from the metadata");
            }
        }
        match (was, is) {
            (Some(was), Some(is)) if same_epoch => {
                if was.settings != is.settings {
                    update(host, change.name, &is.settings).await;
                }
            }
            (_, Some(is)) => create(host, change.name, is, retry).await,
            (_, None) => {}
        }
    }
}

/// `def` if it places its queue on `me`'s own store (see [`local_here`]).
fn owned_by<'a>(def: Option<&'a QueueDef>, me: &NodeId) -> Option<&'a QueueDef> {
    def.filter(|d| local_here(d, me))
}

/// Whether `def` places its queue on `me`'s own store, served here with no log in front
/// (replication factor 1). A replicated queue belongs to its shard: its owner in the metadata is
/// the shard's preferred leader, but the node leading the shard serves it (not yet built), so it
/// is never created, updated or deleted here as a local queue.
fn local_here(def: &QueueDef, me: &NodeId) -> bool {
    &def.owner.node == me && def.shard.is_none()
}

/// Creates `name` at its epoch; remembers it in `retry` when that fails.
async fn create(
    host: &dyn QueueHost,
    name: &QueueName,
    def: &QueueDef,
    retry: &mut BTreeSet<QueueName>,
) {
    if let Err(e) = host.create(name, &def.settings, def.owner.epoch).await {
        tracing::error!(queue = %name, error = %e, "cannot create a queue the metadata places here");
        retry.insert(name.clone());
    }
}

/// Applies a queue's settings changed in the metadata (updated through any node).
async fn update(host: &dyn QueueHost, name: &QueueName, settings: &pb::QueueConfig) {
    match host.update(name, settings).await {
        Ok(()) => tracing::debug!(queue = %name, "queue settings applied from the metadata"),
        Err(e) => {
            tracing::error!(queue = %name, error = %e, "cannot apply a queue's new settings from the metadata")
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

    fn node(id: &str) -> NodeId {
        NodeId::new(id).unwrap()
    }

    /// A cluster of nodes `a` (this node) and `b`, each owning `per_node` queues.
    fn cluster(per_node: usize) -> MetaState {
        let mut meta = MetaState::new();
        let nodes = ["a", "b"]
            .map(|id| NewNode {
                id: node(id),
                client_addr: format!("{id}:1"),
                peer_addr: format!("{id}:2"),
            })
            .to_vec();
        let bootstrap = MetaCommand::Bootstrap {
            cluster_id: ClusterId(1),
            nodes,
        };
        meta.apply(1, &bootstrap).unwrap();
        for i in 0..per_node {
            for owner in ["a", "b"] {
                apply(&mut meta, create(&format!("{owner}.{i}"), owner));
            }
        }
        meta
    }

    /// Settings with no dead-letter or expiry queue, so that each create defines one queue.
    fn lone() -> pb::QueueConfig {
        let discard = || pb::DeadLetterTarget {
            target: Some(pb::dead_letter_target::Target::Discard(true)),
        };
        pb::QueueConfig {
            dead_letter: Some(discard()),
            expiry: Some(discard()),
            ..Default::default()
        }
    }

    fn create(name: &str, owner: &str) -> MetaCommand {
        MetaCommand::CreateQueue {
            name: q(name),
            settings: lone(),
            owner: node(owner),
        }
    }

    fn delete(name: &str) -> MetaCommand {
        MetaCommand::DeleteQueue { name: q(name) }
    }

    fn apply(meta: &mut MetaState, command: MetaCommand) {
        let index = meta.applied_index() + 1;
        meta.apply(index, &command).unwrap();
    }

    fn epoch(meta: &MetaState, name: &str) -> PlacementEpoch {
        meta.queue(&q(name)).unwrap().owner.epoch
    }

    /// What `carry_out` from `before` to `after` asks of a host that holds what `before` places
    /// on `a`; the calls, and how often the host was asked for all its queues.
    async fn carried_out(before: &MetaState, after: &MetaState) -> (Vec<String>, usize) {
        let host = Recorder::default();
        reconcile(&host, before, &node("a"), false).await;
        host.calls.lock().unwrap().clear();
        let listed = host.listed();
        let mut retry = BTreeSet::new();
        carry_out(&host, before, after, &node("a"), &mut retry).await;
        assert!(retry.is_empty());
        let calls = host.calls.lock().unwrap().clone();
        (calls, host.listed() - listed)
    }

    /// A replicated queue whose shard's preferred leader is this node is not made a local
    /// queue here (it would be served unreplicated), at a change or at start, and a local queue
    /// of that name is not deleted at start either.
    #[tokio::test]
    async fn a_replicated_queue_is_never_served_as_a_local_one() {
        let mut before = cluster(1);
        apply(
            &mut before,
            MetaCommand::AddNode {
                id: node("c"),
                client_addr: "c:1".into(),
                peer_addr: "c:2".into(),
                learner: true,
            },
        );
        let mut after = before.clone();
        let replicated = MetaCommand::CreateReplicatedQueue {
            name: q("orders"),
            settings: lone(),
            shard: ferry_cluster::meta::ShardChoice::New {
                replicas: vec![node("a"), node("b"), node("c")],
                dedicated: false,
            },
        };
        apply(&mut after, replicated);
        assert_eq!(after.queue(&q("orders")).unwrap().owner.node, node("a"));
        let (calls, _) = carried_out(&before, &after).await;
        assert!(calls.is_empty(), "{calls:?}");
        let host = Recorder::default();
        host.held
            .lock()
            .unwrap()
            .insert(q("orders"), PlacementEpoch::new(1));
        reconcile(&host, &after, &node("a"), true).await;
        let calls = host.calls.lock().unwrap().clone();
        assert_eq!(
            calls,
            ["create a.0 ".to_owned() + &epoch(&after, "a.0").to_string()]
        );
    }

    #[tokio::test]
    async fn a_change_carries_out_only_the_queues_it_touched() {
        let before = cluster(100);
        let mut after = before.clone();
        apply(&mut after, create("new", "a"));
        apply(&mut after, create("elsewhere", "b"));
        apply(&mut after, delete("b.7"));
        apply(&mut after, delete("a.3"));
        let new = epoch(&after, "new");
        let (calls, listed) = carried_out(&before, &after).await;
        assert_eq!(
            calls,
            ["delete a.3".to_owned(), format!("create new {new}")]
        );
        assert_eq!(listed, 0, "the host's queues are not walked at a change");
        let touched: Vec<String> = before
            .queue_changes(&after)
            .map(|c| c.name.to_string())
            .collect();
        assert_eq!(touched, ["a.3", "b.7", "elsewhere", "new"]);
    }

    /// Regression: a delete and a create again of one queue, coalesced into one view of the
    /// metadata, kept the old queue (and its messages) under the new definition, because only
    /// owners were compared. Now the epochs are: the old queue is deleted, the new one created.
    #[tokio::test]
    async fn a_delete_and_create_again_seen_in_one_view_starts_the_queue_empty() {
        let before = cluster(3);
        let mut after = before.clone();
        apply(&mut after, delete("a.1"));
        apply(&mut after, create("a.1", "a"));
        let (old, new) = (epoch(&before, "a.1"), epoch(&after, "a.1"));
        assert_ne!(old, new);
        let (calls, _) = carried_out(&before, &after).await;
        assert_eq!(
            calls,
            ["delete a.1".to_owned(), format!("create a.1 {new}")]
        );
    }

    #[tokio::test]
    async fn a_queue_deleted_here_and_created_again_elsewhere_is_only_deleted_here() {
        let before = cluster(3);
        let mut after = before.clone();
        apply(&mut after, delete("a.1"));
        apply(&mut after, create("a.1", "b"));
        apply(&mut after, delete("b.2"));
        apply(&mut after, create("b.2", "a"));
        let new = epoch(&after, "b.2");
        let (calls, _) = carried_out(&before, &after).await;
        assert_eq!(
            calls,
            ["delete a.1".to_owned(), format!("create b.2 {new}")]
        );
    }

    #[tokio::test]
    async fn new_settings_are_applied_to_the_queues_owned_here_only() {
        let before = cluster(3);
        let mut after = before.clone();
        let settings = pb::QueueConfig {
            max_messages: Some(3),
            ..lone()
        };
        for name in ["a.1", "b.1"] {
            let update = MetaCommand::UpdateQueue {
                name: q(name),
                settings: settings.clone(),
                expected: None,
            };
            apply(&mut after, update);
        }
        let (calls, _) = carried_out(&before, &after).await;
        assert_eq!(calls, ["update a.1"]);
    }

    /// A state read back from a snapshot shares nothing with the one it came from: the
    /// comparison walks every queue then, and must find the same changes.
    #[tokio::test]
    async fn changes_from_a_restored_snapshot_are_the_same() {
        let before = cluster(20);
        let mut after = before.clone();
        apply(&mut after, delete("a.4"));
        apply(&mut after, create("a.4", "a"));
        apply(&mut after, create("fresh", "a"));
        let restored = MetaState::restore(&after.snapshot()).unwrap();
        assert_eq!(restored, after);
        assert_eq!(
            carried_out(&before, &after).await,
            carried_out(&before, &restored).await
        );
    }

    #[tokio::test]
    async fn a_create_that_failed_is_tried_again_at_the_next_change_while_placed_here() {
        let before = cluster(2);
        let mut after = before.clone();
        apply(&mut after, create("flaky", "a"));
        apply(&mut after, create("gone", "a"));
        let host = Recorder::default();
        host.fail_creates
            .lock()
            .unwrap()
            .extend([q("flaky"), q("gone")]);
        let mut retry = BTreeSet::new();
        carry_out(&host, &before, &after, &node("a"), &mut retry).await;
        assert_eq!(retry, BTreeSet::from([q("flaky"), q("gone")]));
        host.fail_creates.lock().unwrap().clear();
        host.calls.lock().unwrap().clear();
        let mut later = after.clone();
        apply(&mut later, delete("gone"));
        carry_out(&host, &after, &later, &node("a"), &mut retry).await;
        let flaky = epoch(&later, "flaky");
        assert!(retry.is_empty());
        // "gone" was never created here: its delete is carried out all the same (a no-op).
        assert_eq!(
            *host.calls.lock().unwrap(),
            [format!("create flaky {flaky}"), "delete gone".to_owned()]
        );
    }
}
