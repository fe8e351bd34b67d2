//! `shard-under-replicated` and `shard-replicated` events (`Admin.WatchEvents`): the leader of a
//! queue shard tells watchers when the shard has fewer copies than its replication factor asks
//! (a replica down, a new replica still catching up after a move, an old one not yet removed),
//! each time what it lacks changes, and once more when it is whole again: the operator's cue to
//! bring a node back or move its replicas (`ferry shard move-replica`).
//!
//! One node tells each change (the shard's leader); a new leader that finds the shard short
//! says so, one that finds it whole says nothing. A replica counts as down when this node has
//! not heard from it within the liveness timeout (what `ferry cluster status` shows as down).

use std::collections::BTreeMap;

use ferry_be_server::ShardId;
use ferry_cluster::meta::RaftId;
use ferry_multiraft::Role;

use super::super::view::MetaView;

/// What one shard led here lacks: each replica's problem, in replica order, then the nodes
/// leaving. Empty: fully replicated.
pub(crate) type Shortfall = Vec<String>;

/// A change to tell watchers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ReplicationEvent {
    pub(crate) shard: ShardId,
    /// Whether the shard is short of copies now.
    pub(crate) under: bool,
    /// Replicas up and voting.
    pub(crate) whole: u64,
    pub(crate) detail: String,
}

/// What each shard `view` shows this node leading lacks; `up` says whether a node (by raft id)
/// was heard from within the liveness timeout. Pure.
pub(crate) fn shortfalls(
    view: &MetaView,
    up: impl Fn(RaftId) -> bool,
) -> BTreeMap<ShardId, (Shortfall, u64)> {
    let me = view.raft_id;
    let name = |id: RaftId| {
        view.node_by_raft_id(id)
            .map_or_else(|| format!("raft id {}", id.0), |(n, _)| n.to_string())
    };
    view.shards
        .iter()
        .filter(|(_, g)| g.role == Role::Leader)
        .filter_map(|(shard, g)| {
            let def = view.meta.shard(*shard)?;
            let wanted: Vec<(&ferry_kernel::NodeId, RaftId)> = def
                .replicas
                .iter()
                .filter_map(|r| view.meta.node(r).map(|n| (r, n.raft_id)))
                .collect();
            let mut lacks = Vec::new();
            let mut whole = 0;
            for (r, id) in &wanted {
                if !g.voters.contains(id) {
                    lacks.push(format!("{r} catching up"));
                } else if Some(*id) != me && !up(*id) {
                    lacks.push(format!("{r} down"));
                } else {
                    whole += 1;
                }
            }
            for id in g.voters.iter().chain(&g.learners) {
                if !wanted.iter().any(|(_, w)| w == id) {
                    lacks.push(format!("{} leaving", name(*id)));
                }
            }
            Some((*shard, (lacks, whole)))
        })
        .collect()
}

/// The events that take watchers from what they were told (`told`, updated) to `now`: a shard
/// whose shortfall changed, and one whole again. Shards no longer led here are forgotten.
pub(crate) fn changes(
    told: &mut BTreeMap<ShardId, Shortfall>,
    now: BTreeMap<ShardId, (Shortfall, u64)>,
    replicas: impl Fn(ShardId) -> usize,
) -> Vec<ReplicationEvent> {
    let mut events = Vec::new();
    for (shard, (lacks, whole)) in &now {
        let before = told.get(shard);
        if before == Some(lacks) || (before.is_none() && lacks.is_empty()) {
            continue;
        }
        let of = replicas(*shard);
        let detail = if lacks.is_empty() {
            format!("shard {}: all {of} replicas up and voting again", shard.0)
        } else {
            format!(
                "shard {}: {whole} of {of} replicas up and voting ({})",
                shard.0,
                lacks.join(", ")
            )
        };
        events.push(ReplicationEvent {
            shard: *shard,
            under: !lacks.is_empty(),
            whole: *whole,
            detail,
        });
    }
    *told = now.into_iter().map(|(s, (lacks, _))| (s, lacks)).collect();
    events
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn lacking(items: &[&str], whole: u64) -> (Shortfall, u64) {
        (items.iter().map(|s| (*s).to_owned()).collect(), whole)
    }

    #[test]
    fn watchers_hear_each_change_of_what_a_shard_lacks_and_when_it_is_whole_again() {
        let mut told = BTreeMap::new();
        let three = |_| 3;
        let s = ShardId(4);
        // A new leader of a whole shard says nothing.
        let now = BTreeMap::from([(s, lacking(&[], 3))]);
        assert!(changes(&mut told, now.clone(), three).is_empty());
        // A replica goes down.
        let down = BTreeMap::from([(s, lacking(&["c down"], 2))]);
        let e = changes(&mut told, down.clone(), three);
        assert_eq!(e.len(), 1);
        assert!(e[0].under);
        assert_eq!(
            e[0].detail,
            "shard 4: 2 of 3 replicas up and voting (c down)"
        );
        // Nothing changed: nothing told.
        assert!(changes(&mut told, down, three).is_empty());
        // Moved: d catching up, c leaving; then whole again.
        let moving = BTreeMap::from([(s, lacking(&["d catching up", "c leaving"], 2))]);
        assert_eq!(changes(&mut told, moving, three).len(), 1);
        let e = changes(&mut told, now, three);
        assert_eq!(
            e,
            [ReplicationEvent {
                shard: s,
                under: false,
                whole: 3,
                detail: "shard 4: all 3 replicas up and voting again".into(),
            }]
        );
        // A new leader (nothing told yet) that finds the shard short says so.
        let mut fresh = BTreeMap::new();
        let short = BTreeMap::from([(s, lacking(&["a down"], 2))]);
        assert_eq!(changes(&mut fresh, short, three).len(), 1);
        // Leadership lost: forgotten.
        assert!(changes(&mut fresh, BTreeMap::new(), three).is_empty());
        assert!(fresh.is_empty());
    }
}
