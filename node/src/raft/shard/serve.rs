//! Which queue shards the local back-end serves: the node tells its [`QueueHost`] when it starts
//! to lead a shard it replicates (once it has applied an entry of its own term, see
//! [`ShardGroupView::serving`]), when it stops, and when it no longer replicates one; and hands
//! the leader the metadata's queues of the shard at every change of them.

use std::collections::BTreeMap;

use ferry_be_server::{ShardId, ShardQueue};
use ferry_cluster::meta::MetaState;
use ferry_kernel::{NodeId, PlacementEpoch, QueueName};

use super::super::host::QueueHost;
use super::super::view::{MetaView, ShardGroupView};
use super::super::MetaNode;

/// What the host was last told of a shard.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Told {
    /// Serve it: this node leads it at `term`; the metadata's next epoch was `known_below`.
    Led {
        term: u64,
        queues: Vec<ShardQueue>,
        known_below: PlacementEpoch,
    },
    /// Do not serve it: `leader` does.
    Followed {
        leader: Option<String>,
        queues: Vec<QueueName>,
    },
}

/// The queues of every shard `me` replicates, by shard, in name order: the shards the
/// metadata lists it a replica of, and those whose group still runs here (`running`: a replica
/// moved away keeps its group, and its data, until the group removed it).
fn shard_queues(
    meta: &MetaState,
    me: &NodeId,
    running: impl Fn(ShardId) -> bool,
) -> BTreeMap<ShardId, Vec<ShardQueue>> {
    let mut mine: BTreeMap<ShardId, Vec<ShardQueue>> = meta
        .shards()
        .iter()
        .filter(|(id, def)| def.replicas.contains(me) || running(**id))
        .map(|(id, _)| (*id, Vec::new()))
        .collect();
    for (name, def) in meta.queues() {
        if let Some(queues) = def.shard.and_then(|s| mine.get_mut(&s)) {
            queues.push(ShardQueue {
                name: name.clone(),
                settings: def.settings.clone(),
                epoch: def.owner.epoch,
            });
        }
    }
    mine
}

/// What the host must be told of each shard `me` replicates, as `view` has it.
pub(crate) fn wanted(view: &MetaView, me: &NodeId) -> BTreeMap<ShardId, Told> {
    shard_queues(&view.meta, me, |s| view.shards.contains_key(&s))
        .into_iter()
        .map(|(shard, queues)| {
            let group = view.shards.get(&shard);
            let told = match group {
                Some(g @ ShardGroupView { serving: true, .. }) => Told::Led {
                    term: g.term,
                    queues,
                    known_below: view.meta.next_epoch(),
                },
                _ => Told::Followed {
                    leader: group
                        .and_then(|g| g.leader)
                        .and_then(|l| view.node_by_raft_id(l))
                        .map(|(id, _)| id.to_string()),
                    queues: queues.into_iter().map(|q| q.name).collect(),
                },
            };
            (shard, told)
        })
        .collect()
}

/// Tells `host` what changed from `told` to `wanted`; `refence`: serve every led shard anew if
/// its log was fenced (the host decides). Returns whether every call succeeded; `told` keeps
/// what the host was told successfully.
pub(crate) async fn carry_out(
    host: &dyn QueueHost,
    node: &MetaNode,
    told: &mut BTreeMap<ShardId, Told>,
    wanted: BTreeMap<ShardId, Told>,
    refence: bool,
) -> bool {
    let gone: Vec<ShardId> = told
        .keys()
        .filter(|s| !wanted.contains_key(s))
        .copied()
        .collect();
    let mut ok = true;
    for shard in gone {
        match host.forget_shard(shard).await {
            Ok(()) => {
                told.remove(&shard);
            }
            Err(e) => {
                tracing::error!(%shard, error = %e, "cannot delete what this node held of a queue shard that is gone");
                ok = false;
            }
        }
    }
    for (shard, want) in wanted {
        let same = told.get(&shard) == Some(&want);
        match &want {
            Told::Led {
                term,
                queues,
                known_below,
            } if !same || refence => {
                let proposer = node.shard_proposer();
                let queues = queues.clone();
                let led = host.lead_shard(shard, *term, proposer, queues, *known_below);
                if let Err(e) = led.await {
                    tracing::error!(%shard, error = %e, "cannot serve a queue shard this node leads");
                    told.remove(&shard);
                    ok = false;
                    continue;
                }
            }
            Told::Followed { leader, queues } if !same => {
                host.follow_shard(shard, leader.clone(), queues).await;
            }
            _ => continue,
        }
        told.insert(shard, want);
    }
    ok
}

impl MetaNode {
    /// Follows the shard groups running here (see the module docs). Ends at shutdown. A call
    /// that failed is made again at the next change, or after [`RETRY_AFTER`].
    pub(crate) async fn serve_shards(self) {
        let mut view = self.shared.view.clone();
        let mut fences = self.shared.host.shard_fences();
        let mut shutdown = self.shared.shutdown.clone();
        let me = self.shared.settings.node_id.clone();
        let mut told = BTreeMap::new();
        let mut refence = false;
        let mut groups_before = BTreeMap::new();
        let mut replication_told = BTreeMap::new();
        // Whether to look at the view's changes (not only at replicas gone down or back up).
        let mut work = true;
        let mut ok = true;
        loop {
            let current = view.borrow_and_update().clone();
            if work {
                for e in super::leader_events::became_leader(&groups_before, &current) {
                    tracing::info!(shard = %e.shard, term = e.term, "{}", e.detail);
                    self.shared
                        .host
                        .shard_leader_event(e.shard, e.term, e.detail);
                }
                super::leader_events::remember(&mut groups_before, &current);
                let wanted = wanted(&current, &me);
                ok = carry_out(&*self.shared.host, &self, &mut told, wanted, refence).await;
                refence = false;
            }
            self.tell_replication(&current, &mut replication_told);
            let retry = async {
                if ok {
                    std::future::pending::<()>().await;
                }
                tokio::time::sleep(RETRY_AFTER).await;
            };
            work = true;
            tokio::select! {
                changed = view.changed() => if changed.is_err() { return },
                changed = fences.changed() => {
                    if changed.is_err() { return }
                    fences.borrow_and_update();
                    refence = true;
                }
                () = retry => {}
                // Replicas go down and come back without a change of the view; a failed call
                // is made again then too.
                () = tokio::time::sleep(REPLICATION_CHECK_EVERY) => work = !ok,
                _ = shutdown.wait_for(|s| *s) => return,
            }
        }
    }

    /// Tells watchers what changed in the replication of the shards led here (see
    /// `replication_events.rs`); `told` is what they were told.
    fn tell_replication(
        &self,
        view: &MetaView,
        told: &mut BTreeMap<ShardId, super::replication_events::Shortfall>,
    ) {
        let timeout = self.shared.settings.liveness_timeout;
        let up = |id: ferry_cluster::meta::RaftId| self.shared.links.is_up(id.0, timeout);
        let now = super::replication_events::shortfalls(view, up);
        let replicas = |s: ShardId| view.meta.shard(s).map_or(0, |d| d.replicas.len());
        for e in super::replication_events::changes(told, now, replicas) {
            if e.under {
                tracing::warn!(shard = %e.shard, "{}", e.detail);
            } else {
                tracing::info!(shard = %e.shard, "{}", e.detail);
            }
            self.shared
                .host
                .shard_replication_event(e.shard, e.under, e.whole, e.detail);
        }
    }
}

/// How often the shards led here are looked at for replicas gone down or back up.
const REPLICATION_CHECK_EVERY: std::time::Duration = std::time::Duration::from_secs(1);

/// How long a failed call to the host waits before it is made again without a change.
pub(crate) const RETRY_AFTER: std::time::Duration = std::time::Duration::from_secs(1);

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use ferry_cluster::meta::{ClusterId, MetaCommand, NewNode, ShardChoice};
    use ferry_multiraft::Role;
    use ferry_proto::pb;

    use super::*;
    use crate::raft::view::ShardGroupView;

    fn node(id: &str) -> NodeId {
        NodeId::new(id).unwrap()
    }

    /// Nodes a, b, c, d; `orders` (with its dead-letter queue) in a new shard on a, b, c.
    fn meta() -> MetaState {
        let mut meta = MetaState::new();
        let nodes = ["a", "b", "c", "d"]
            .map(|id| NewNode {
                id: node(id),
                client_addr: format!("{id}:1"),
                peer_addr: format!("{id}:2"),
            })
            .to_vec();
        let commands = [
            MetaCommand::Bootstrap {
                cluster_id: ClusterId(1),
                nodes,
            },
            MetaCommand::CreateReplicatedQueue {
                name: QueueName::new("orders").unwrap(),
                settings: pb::QueueConfig::default(),
                shard: ShardChoice::New {
                    replicas: vec![node("a"), node("b"), node("c")],
                    dedicated: false,
                },
            },
        ];
        for (i, c) in commands.iter().enumerate() {
            meta.apply(i as u64 + 1, c).unwrap();
        }
        meta
    }

    fn view(group: Option<ShardGroupView>) -> MetaView {
        let meta = meta();
        let shard = *meta.shards().keys().next().unwrap();
        MetaView {
            shards: group.into_iter().map(|g| (shard, g)).collect(),
            meta,
            ..MetaView::empty()
        }
    }

    fn group(role: Role, serving: bool, leader: &str, meta: &MetaState) -> ShardGroupView {
        ShardGroupView {
            role,
            term: 3,
            leader: meta.node(&node(leader)).map(|n| n.raft_id),
            voters: vec![],
            learners: vec![],
            serving,
        }
    }

    #[test]
    fn a_replica_serves_its_shard_only_once_it_leads_with_an_entry_of_its_term_applied() {
        let m = meta();
        let names = |told: &Told| match told {
            Told::Led { queues, .. } => queues.iter().map(|q| q.name.to_string()).collect(),
            Told::Followed { queues, .. } => {
                queues.iter().map(ToString::to_string).collect::<Vec<_>>()
            }
        };
        let serving = wanted(&view(Some(group(Role::Leader, true, "a", &m))), &node("a"));
        let told = serving.values().next().unwrap();
        assert!(matches!(told, Told::Led { term: 3, .. }), "{told:?}");
        assert_eq!(names(told), ["orders", "orders.DLQ"]);

        // Elected, but nothing of its term applied yet: not served, leader named.
        let elected = wanted(&view(Some(group(Role::Leader, false, "a", &m))), &node("a"));
        let told = elected.values().next().unwrap();
        assert_eq!(
            *told,
            Told::Followed {
                leader: Some("a".into()),
                queues: vec![
                    QueueName::new("orders").unwrap(),
                    QueueName::new("orders.DLQ").unwrap()
                ],
            }
        );

        let follower = wanted(
            &view(Some(group(Role::Follower, false, "b", &m))),
            &node("a"),
        );
        assert!(
            matches!(follower.values().next().unwrap(), Told::Followed { leader: Some(l), .. } if l == "b")
        );
        // The group not running here yet: followed, no leader known.
        let not_started = wanted(&view(None), &node("c"));
        assert!(matches!(
            not_started.values().next().unwrap(),
            Told::Followed { leader: None, .. }
        ));
        // Not a replica: nothing to tell.
        assert!(wanted(&view(None), &node("d")).is_empty());
        // Not a replica in the metadata, but its group still runs here (its replica moved away,
        // its group has not removed it yet): still followed, its data kept, never forgotten.
        let leaving = wanted(
            &view(Some(group(Role::Follower, false, "b", &m))),
            &node("d"),
        );
        assert!(
            matches!(leaving.values().next().unwrap(), Told::Followed { leader: Some(l), .. } if l == "b"),
            "{leaving:?}"
        );
    }
}
