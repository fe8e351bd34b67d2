//! `Cluster.ListShards` (`ferry shard list`): every queue shard, from any node, with its
//! leader's numbers.
//!
//! The shards, their replicas and their queues come from the answering node's metadata. What
//! only a shard's Raft group knows (who leads, at which term, what it applied, how far each
//! replica's log matches the leader's) is asked of the replicas themselves, once per node
//! whatever the number of shards: this node's driver directly, the others on their peer
//! listeners (`Peer.LocalShards`), concurrently, at most [`ASK_TIMEOUT`] each, and not at all
//! when this node shows them down. A shard's line then takes the leader's numbers
//! ([`summarize`]): the replica leading at the newest term any replica reported; with none
//! leading, the leader the others name if it did not answer (its numbers unknown); else no
//! leader.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use ferry_be_server::ShardId;
use ferry_cluster::meta::{MetaState, RaftId};
use ferry_kernel::NodeId;
use ferry_proto::pb;
use tokio::sync::oneshot;

use super::super::driver::Input;
use super::super::propose::peer_client;
use super::super::MetaNode;

/// The longest the listing waits for one node's answer.
pub(crate) const ASK_TIMEOUT: Duration = Duration::from_secs(2);

/// One queue shard's Raft group on one node, as its engine and machine stand now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct LocalShard {
    pub(crate) shard: ShardId,
    /// The node leads the group.
    pub(crate) leading: bool,
    /// Its current term in the group.
    pub(crate) term: u64,
    /// The leader it knows.
    pub(crate) leader: Option<RaftId>,
    /// The last entry its shard machine applied.
    pub(crate) applied_index: u64,
    /// The last entry in its log.
    pub(crate) last_index: u64,
    /// The first entry in its log (one past the last compaction).
    pub(crate) first_index: u64,
    /// The highest index it knows committed.
    pub(crate) commit_index: u64,
    /// When leading: each other voter and the last index it acknowledged having (0 if nothing
    /// since this node was elected), in raft id order. Empty otherwise.
    pub(crate) match_indexes: Vec<(RaftId, u64)>,
    /// The group's voters and learners as this node knows them, in raft id order.
    pub(crate) voters: Vec<RaftId>,
    pub(crate) learners: Vec<RaftId>,
}

impl From<&LocalShard> for pb::LocalShard {
    fn from(l: &LocalShard) -> Self {
        pb::LocalShard {
            shard: l.shard.0,
            leading: l.leading,
            term: l.term,
            leader_raft_id: l.leader.map_or(0, |r| r.0),
            applied_index: l.applied_index,
            last_index: l.last_index,
            match_indexes: l.match_indexes.iter().map(|(r, i)| (r.0, *i)).collect(),
            commit_index: l.commit_index,
            first_index: l.first_index,
            voters: l.voters.iter().map(|r| r.0).collect(),
            learners: l.learners.iter().map(|r| r.0).collect(),
        }
    }
}

impl From<pb::LocalShard> for LocalShard {
    fn from(l: pb::LocalShard) -> Self {
        let mut match_indexes: Vec<(RaftId, u64)> = l
            .match_indexes
            .into_iter()
            .map(|(r, i)| (RaftId(r), i))
            .collect();
        match_indexes.sort_unstable();
        LocalShard {
            shard: ShardId(l.shard),
            leading: l.leading,
            term: l.term,
            leader: (l.leader_raft_id != 0).then_some(RaftId(l.leader_raft_id)),
            applied_index: l.applied_index,
            last_index: l.last_index,
            first_index: l.first_index,
            commit_index: l.commit_index,
            match_indexes,
            voters: sorted_ids(l.voters),
            learners: sorted_ids(l.learners),
        }
    }
}

fn sorted_ids(ids: Vec<u64>) -> Vec<RaftId> {
    let mut ids: Vec<RaftId> = ids.into_iter().map(RaftId).collect();
    ids.sort_unstable();
    ids
}

/// Why a listing was refused.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ShardListError {
    /// The shard asked for is not in this node's metadata.
    #[error(
        "shard {} does not exist (never made, or gone with its last queue); `ferry shard list` \
         shows the shards that do",
        shard.0
    )]
    UnknownShard { shard: ShardId },
}

impl From<ShardListError> for tonic::Status {
    fn from(e: ShardListError) -> Self {
        match e {
            ShardListError::UnknownShard { .. } => tonic::Status::not_found(e.to_string()),
        }
    }
}

/// One replica of a shard, as the node listing it heard from it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Replica<'a> {
    pub(crate) node: &'a NodeId,
    /// Its raft id, from the metadata.
    pub(crate) raft_id: Option<RaftId>,
    /// What it reported of the shard: `None`: it did not answer; `Some(None)`: it answered and
    /// does not run the shard's group (not started yet).
    pub(crate) heard: Option<Option<&'a LocalShard>>,
}

/// A shard's line: its leader's numbers, as described in the module docs and in
/// `ferry.v1.ShardStatus`. `replicas` in the metadata's order (the preferred leader first);
/// `name_of` names a raft id that is no replica (a replica leaving).
pub(crate) fn summarize(
    shard: ShardId,
    replicas: &[Replica<'_>],
    queues: Vec<String>,
    name_of: impl Fn(RaftId) -> String,
) -> pb::ShardStatus {
    let reports = || replicas.iter().filter_map(|r| Some((r, r.heard??)));
    // A replica at a newer term than a leader's has seen an election the leader may have lost.
    let newest = reports().map(|(_, l)| l.term).max().unwrap_or(0);
    let leading = reports().find(|(_, l)| l.leading && l.term == newest);
    let mut status = pb::ShardStatus {
        shard: shard.0,
        replicas: replicas.iter().map(|r| r.node.to_string()).collect(),
        queues,
        unreachable: replicas
            .iter()
            .filter(|r| r.heard.is_none())
            .map(|r| r.node.to_string())
            .collect(),
        ..Default::default()
    };
    if let Some((leader, l)) = leading {
        status.leader = leader.node.to_string();
        status.term = l.term;
        status.applied_index = Some(l.applied_index);
        status.lag = Some(lag(leader, l, replicas));
        status.catching_up = replicas
            .iter()
            .filter(|r| !r.raft_id.is_some_and(|id| l.voters.contains(&id)))
            .map(|r| r.node.to_string())
            .collect();
        status.leaving = l
            .voters
            .iter()
            .chain(&l.learners)
            .filter(|id| !replicas.iter().any(|r| r.raft_id == Some(**id)))
            .map(|id| name_of(*id))
            .collect();
        return status;
    }
    // No replica that answered leads at the newest term: the leader they name, if it is a
    // replica that did not answer (one that answered and does not lead is no longer leader).
    let named = reports()
        .filter(|(_, l)| l.term == newest)
        .find_map(|(_, l)| l.leader)
        .and_then(|id| replicas.iter().find(|r| r.raft_id == Some(id)))
        .filter(|r| r.heard.is_none());
    if let Some(r) = named {
        status.leader = r.node.to_string();
        status.term = newest;
    }
    status
}

/// How far the least caught-up other replica is behind `leader`'s log: its last index minus
/// the smallest match index it holds for the others (0 for one it holds none for).
fn lag(leader: &Replica<'_>, l: &LocalShard, replicas: &[Replica<'_>]) -> u64 {
    replicas
        .iter()
        .filter(|r| r.node != leader.node)
        .map(|r| {
            let matched = r
                .raft_id
                .and_then(|id| l.match_indexes.iter().find(|(m, _)| *m == id))
                .map_or(0, |(_, index)| *index);
            l.last_index.saturating_sub(matched)
        })
        .max()
        .unwrap_or(0)
}

impl MetaNode {
    /// The queue shard groups running on this node, asked of its driver.
    pub(crate) async fn local_shards(&self) -> Result<Vec<LocalShard>, String> {
        let (reply, answer) = oneshot::channel();
        self.shared
            .inputs
            .try_send(Input::LocalShards { reply })
            .map_err(|_| "the node's Raft driver is busy or stopped".to_string())?;
        answer
            .await
            .map_err(|_| "the node's Raft driver stopped".to_string())
    }

    /// Every queue shard (or `only` that one) with its leader's numbers; see the module docs.
    pub(crate) async fn list_shards(
        &self,
        only: Option<ShardId>,
    ) -> Result<Vec<pb::ShardStatus>, ShardListError> {
        let view = self.shared.view.borrow().clone();
        let meta = &view.meta;
        let shards: Vec<(ShardId, Vec<NodeId>)> = match only {
            Some(shard) => {
                let def = meta
                    .shard(shard)
                    .ok_or(ShardListError::UnknownShard { shard })?;
                vec![(shard, def.replicas.clone())]
            }
            None => meta
                .shards()
                .iter()
                .map(|(id, def)| (*id, def.replicas.clone()))
                .collect(),
        };
        let mut queues: BTreeMap<ShardId, Vec<String>> =
            shards.iter().map(|(id, _)| (*id, Vec::new())).collect();
        for (name, def) in meta.queues() {
            if let Some(names) = def.shard.and_then(|s| queues.get_mut(&s)) {
                names.push(name.to_string());
            }
        }
        let nodes: BTreeSet<&NodeId> = shards.iter().flat_map(|(_, r)| r).collect();
        let asks = nodes.into_iter().map(|node| async move {
            let answer = self.ask_local_shards(node, meta).await;
            if let Err(reason) = &answer {
                tracing::debug!(%node, %reason, "no shard report from a replica");
            }
            (node.clone(), answer.ok())
        });
        let answers: BTreeMap<NodeId, Option<Vec<LocalShard>>> =
            futures::future::join_all(asks).await.into_iter().collect();
        Ok(shards
            .into_iter()
            .map(|(shard, replicas)| {
                let replicas: Vec<Replica<'_>> = replicas
                    .iter()
                    .map(|node| Replica {
                        node,
                        raft_id: meta.node(node).map(|n| n.raft_id),
                        heard: answers
                            .get(node)
                            .and_then(Option::as_ref)
                            .map(|all| all.iter().find(|l| l.shard == shard)),
                    })
                    .collect();
                let names = queues.remove(&shard).unwrap_or_default();
                let name_of = |id: RaftId| {
                    meta.node_by_raft_id(id)
                        .map_or_else(|| format!("raft id {}", id.0), |(n, _)| n.to_string())
                };
                summarize(shard, &replicas, names, name_of)
            })
            .collect())
    }

    /// What `node` runs, asked of this node's driver or on its peer listener, at most
    /// [`ASK_TIMEOUT`]; a node this node shows down is not asked.
    async fn ask_local_shards(
        &self,
        node: &NodeId,
        meta: &MetaState,
    ) -> Result<Vec<LocalShard>, String> {
        if node == self.node_id() {
            return tokio::time::timeout(ASK_TIMEOUT, self.local_shards())
                .await
                .map_err(|_| "this node's Raft driver did not answer within 2 s".to_string())?;
        }
        if !self.is_reachable(node) {
            return Err("not heard from within the liveness timeout".into());
        }
        let info = meta
            .node(node)
            .ok_or_else(|| "not a node of the metadata".to_string())?;
        let mut client = peer_client(&info.peer_addr).map_err(|s| s.message().to_owned())?;
        let mut request = tonic::Request::new(pb::LocalShardsRequest {});
        request.set_timeout(ASK_TIMEOUT);
        let answer = tokio::time::timeout(ASK_TIMEOUT, client.local_shards(request))
            .await
            .map_err(|_| "no answer within 2 s".to_string())?
            .map_err(|s| s.message().to_owned())?;
        Ok(answer
            .into_inner()
            .shards
            .into_iter()
            .map(LocalShard::from)
            .collect())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn node(s: &str) -> NodeId {
        NodeId::new(s).unwrap()
    }

    /// `leading` at `term` with `last` entries; `applied`; `leader` as raft id (0: none).
    fn report(
        leading: bool,
        term: u64,
        leader: u64,
        last: u64,
        matched: &[(u64, u64)],
    ) -> LocalShard {
        LocalShard {
            shard: ShardId(3),
            leading,
            term,
            leader: (leader != 0).then_some(RaftId(leader)),
            applied_index: last.saturating_sub(1),
            last_index: last,
            first_index: 1,
            commit_index: last,
            match_indexes: matched.iter().map(|(r, i)| (RaftId(*r), *i)).collect(),
            voters: vec![RaftId(1), RaftId(2), RaftId(3)],
            learners: vec![],
        }
    }

    /// n1, n2, n3 with raft ids 1, 2, 3, each heard as given.
    fn line(heard: [Option<Option<&LocalShard>>; 3]) -> pb::ShardStatus {
        let nodes = [node("n1"), node("n2"), node("n3")];
        let replicas: Vec<Replica<'_>> = nodes
            .iter()
            .zip(heard)
            .enumerate()
            .map(|(i, (node, heard))| Replica {
                node,
                raft_id: Some(RaftId(i as u64 + 1)),
                heard,
            })
            .collect();
        summarize(
            ShardId(3),
            &replicas,
            vec!["orders".into(), "orders.DLQ".into()],
            |id| format!("n{}", id.0),
        )
    }

    #[test]
    fn a_shard_with_a_leader_shows_its_applied_index_and_the_slowest_replicas_lag() {
        let leader = report(true, 4, 2, 50, &[(1, 50), (3, 45)]);
        let follower = report(false, 4, 2, 48, &[]);
        let s = line([
            Some(Some(&follower)),
            Some(Some(&leader)),
            Some(Some(&follower)),
        ]);
        assert_eq!(s.shard, 3);
        assert_eq!((s.leader.as_str(), s.term), ("n2", 4));
        assert_eq!(s.replicas, ["n1", "n2", "n3"]);
        assert_eq!(s.queues, ["orders", "orders.DLQ"]);
        assert_eq!(s.applied_index, Some(49), "the leader's, not a follower's");
        assert_eq!(s.lag, Some(5), "n3 matches 45 of the leader's 50");
        assert!(s.unreachable.is_empty());

        let caught_up = report(true, 4, 2, 50, &[(1, 50), (3, 50)]);
        let s = line([None, Some(Some(&caught_up)), Some(Some(&follower))]);
        assert_eq!(s.lag, Some(0));
        assert_eq!(
            s.unreachable,
            ["n1"],
            "a replica that did not answer is named"
        );
    }

    #[test]
    fn a_replica_the_leader_has_heard_nothing_from_lags_by_the_whole_log() {
        // Elected since n1 went down: its progress for n1 is 0, or missing altogether.
        for matched in [&[(1, 0), (3, 30)][..], &[(3, 30)][..]] {
            let leader = report(true, 5, 2, 30, matched);
            let s = line([None, Some(Some(&leader)), Some(None)]);
            assert_eq!(s.lag, Some(30), "{matched:?}");
        }
    }

    #[test]
    fn with_no_leader_the_line_says_so_and_gives_no_numbers() {
        // An election under way: a candidate at a newer term than the last leader.
        let deposed = report(true, 4, 2, 50, &[(1, 50), (3, 50)]);
        let candidate = report(false, 5, 0, 50, &[]);
        let s = line([Some(Some(&candidate)), Some(Some(&deposed)), None]);
        assert_eq!((s.leader.as_str(), s.term), ("", 0), "{s:?}");
        assert_eq!((s.applied_index, s.lag), (None, None));
        // Nobody answered.
        let s = line([None, None, None]);
        assert_eq!(s.leader, "");
        assert_eq!((s.applied_index, s.lag), (None, None));
        assert_eq!(s.unreachable, ["n1", "n2", "n3"]);
        // Answers from nodes that do not run the group yet.
        let s = line([Some(None), Some(None), None]);
        assert_eq!((s.leader.as_str(), s.lag), ("", None));
        assert_eq!(s.unreachable, ["n3"]);
    }

    #[test]
    fn a_leader_named_by_the_others_that_did_not_answer_is_shown_without_numbers() {
        let follower = report(false, 6, 3, 40, &[]);
        let s = line([Some(Some(&follower)), Some(Some(&follower)), None]);
        assert_eq!((s.leader.as_str(), s.term), ("n3", 6));
        assert_eq!((s.applied_index, s.lag), (None, None));
        // One that answered and does not lead is not the leader, whatever a follower believes.
        let former = report(false, 6, 0, 40, &[]);
        let s = line([
            Some(Some(&follower)),
            Some(Some(&follower)),
            Some(Some(&former)),
        ]);
        assert_eq!(s.leader, "");
    }

    #[test]
    fn of_two_replicas_that_lead_the_newer_term_is_the_leader() {
        let old = report(true, 4, 1, 60, &[(2, 10), (3, 10)]);
        let new = report(true, 7, 2, 50, &[(1, 0), (3, 50)]);
        let s = line([Some(Some(&old)), Some(Some(&new)), None]);
        assert_eq!((s.leader.as_str(), s.term), ("n2", 7));
        assert_eq!(s.applied_index, Some(49));
    }

    #[test]
    fn a_moved_replica_shows_catching_up_then_the_old_one_leaving() {
        // n3 (raft id 3) replaced by n4 (raft id 4) in the metadata: n4 learns, n3 still votes.
        let mut leader = report(true, 4, 1, 50, &[(2, 50), (3, 0), (4, 10)]);
        leader.learners = vec![RaftId(4)];
        let nodes = [node("n1"), node("n2"), node("n4")];
        let replicas: Vec<Replica<'_>> = nodes
            .iter()
            .zip([1, 2, 4])
            .map(|(node, id)| Replica {
                node,
                raft_id: Some(RaftId(id)),
                heard: (id == 1).then_some(Some(&leader)),
            })
            .collect();
        let name = |id: RaftId| format!("n{}", id.0);
        let s = summarize(ShardId(3), &replicas, vec![], name);
        assert_eq!(s.catching_up, ["n4"]);
        assert_eq!(s.leaving, ["n3"]);
        // Promoted, and n3 removed: fully replicated again.
        let whole = LocalShard {
            voters: vec![RaftId(1), RaftId(2), RaftId(4)],
            learners: vec![],
            ..leader.clone()
        };
        let replicas: Vec<Replica<'_>> = replicas
            .into_iter()
            .map(|r| Replica {
                heard: (r.raft_id == Some(RaftId(1))).then_some(Some(&whole)),
                ..r
            })
            .collect();
        let s = summarize(ShardId(3), &replicas, vec![], name);
        assert!(s.catching_up.is_empty() && s.leaving.is_empty(), "{s:?}");
    }

    #[test]
    fn a_report_crosses_the_wire_unchanged() {
        let l = report(true, 7, 2, 50, &[(1, 20), (3, 50)]);
        assert_eq!(LocalShard::from(pb::LocalShard::from(&l)), l);
        let f = report(false, 7, 0, 50, &[]);
        assert_eq!(LocalShard::from(pb::LocalShard::from(&f)), f);
    }
}
