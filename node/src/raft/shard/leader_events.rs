//! `shard-leader` events (`Admin.WatchEvents`): a node tells watchers when it begins to lead a
//! queue shard, once per term it leads it at, naming the leader it knew before. One node tells
//! each change (the new leader), so a watcher of the whole cluster sees every change once; a
//! change seen only between two views that one `watch` read coalesced (led and lost again at
//! once) is not told.

use std::collections::BTreeMap;

use ferry_be_server::ShardId;
use ferry_multiraft::Role;

use super::super::view::{MetaView, ShardGroupView};

/// What `before` must be for the next [`became_leader`]: the groups of `now`, each with the
/// last leader known of it when `now` knows none (a candidate forgets its leader; the event
/// names the one before).
pub(crate) fn remember(before: &mut BTreeMap<ShardId, ShardGroupView>, now: &MetaView) {
    let mut next = now.shards.clone();
    for (shard, g) in &mut next {
        if g.leader.is_none() {
            g.leader = before.get(shard).and_then(|b| b.leader);
        }
    }
    *before = next;
}

/// A shard this node began to lead: at `term`, with the event's text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct BecameLeader {
    pub(crate) shard: ShardId,
    pub(crate) term: u64,
    pub(crate) detail: String,
}

/// The shards `now` shows this node leading that `before` did not show it leading at the same
/// term. Pure.
pub(crate) fn became_leader(
    before: &BTreeMap<ShardId, ShardGroupView>,
    now: &MetaView,
) -> Vec<BecameLeader> {
    let name = |raft_id| {
        now.node_by_raft_id(raft_id)
            .map_or_else(|| "unknown".to_owned(), |(id, _)| id.to_string())
    };
    let me = now.raft_id.map_or_else(|| "this node".to_owned(), name);
    now.shards
        .iter()
        .filter(|(_, g)| g.role == Role::Leader)
        .filter(|(shard, g)| {
            before
                .get(shard)
                .is_none_or(|b| b.role != Role::Leader || b.term != g.term)
        })
        .map(|(shard, g)| {
            let was = before
                .get(shard)
                .and_then(|b| b.leader)
                .filter(|l| Some(*l) != now.raft_id)
                .map_or_else(|| "unknown".to_owned(), name);
            BecameLeader {
                shard: *shard,
                term: g.term,
                detail: format!(
                    "{me} leads shard {} at term {} (was {was})",
                    shard.0, g.term
                ),
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use ferry_cluster::meta::{ClusterId, MetaCommand, MetaState, NewNode, RaftId};

    use super::*;

    fn group(role: Role, term: u64, leader: u64) -> ShardGroupView {
        ShardGroupView {
            role,
            term,
            leader: (leader != 0).then_some(RaftId(leader)),
            voters: vec![RaftId(1), RaftId(2), RaftId(3)],
            learners: vec![],
            serving: false,
        }
    }

    /// Nodes n1, n2, n3 (raft ids 1-3); this node is n1.
    fn view(shards: &[(u64, ShardGroupView)]) -> MetaView {
        let mut meta = MetaState::new();
        let nodes = ["n1", "n2", "n3"].map(|n| NewNode {
            id: ferry_kernel::NodeId::new(n).unwrap(),
            client_addr: format!("{n}:1"),
            peer_addr: format!("{n}:2"),
        });
        let command = MetaCommand::Bootstrap {
            cluster_id: ClusterId(7),
            nodes: nodes.to_vec(),
        };
        meta.apply(2, &command).unwrap();
        MetaView {
            meta,
            raft_id: Some(RaftId(1)),
            shards: shards
                .iter()
                .map(|(s, g)| (ShardId(*s), g.clone()))
                .collect(),
            ..MetaView::empty()
        }
    }

    #[test]
    fn a_node_that_begins_to_lead_says_so_once_per_term_naming_the_leader_before() {
        let before = view(&[
            (4, group(Role::Follower, 3, 2)),
            (5, group(Role::Leader, 3, 1)),
        ]);
        let now = view(&[
            (4, group(Role::Leader, 4, 1)),
            (5, group(Role::Leader, 3, 1)),
        ]);
        let events = became_leader(&before.shards, &now);
        assert_eq!(
            events,
            [BecameLeader {
                shard: ShardId(4),
                term: 4,
                detail: "n1 leads shard 4 at term 4 (was n2)".into(),
            }],
            "shard 5 was led here at the same term already"
        );
        assert!(became_leader(&now.shards, &now).is_empty());
        // A shard first seen led (a restart): the leader before is unknown.
        let events = became_leader(&BTreeMap::new(), &now);
        assert_eq!(events.len(), 2);
        assert_eq!(events[0].detail, "n1 leads shard 4 at term 4 (was unknown)");
        // Candidates and followers say nothing.
        let later = view(&[(4, group(Role::Candidate, 5, 0))]);
        assert!(became_leader(&now.shards, &later).is_empty());
    }

    #[test]
    fn the_leader_before_an_election_is_named_after_it() {
        // n1 follows n2, campaigns (forgetting n2), then leads.
        let mut before = BTreeMap::new();
        remember(&mut before, &view(&[(4, group(Role::Follower, 3, 2))]));
        remember(&mut before, &view(&[(4, group(Role::Candidate, 4, 0))]));
        let now = view(&[(4, group(Role::Leader, 4, 1))]);
        let events = became_leader(&before, &now);
        assert_eq!(events.len(), 1);
        assert_eq!(events[0].detail, "n1 leads shard 4 at term 4 (was n2)");
    }
}
