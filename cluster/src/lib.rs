//! Cluster membership and queue placement, replicated with Raft.
//!
//! [`meta`] is the metadata state machine of Raft group 0 (nodes, queue definitions, placement
//! with epochs): pure and deterministic, it depends on no engine, runtime, clock or random
//! source. Beside it: [`next_conf_change`], which turns the membership recorded in the metadata
//! into the engine's next configuration change, [`StartMode`] and [`ClusterConfig`], the
//! `[cluster]` section of a node's configuration. The shell that runs the metadata group on a
//! node (the engine's thread, peer streams, the `Peer` and `Cluster` services) is the node
//! library, `ferry-node`.
//!
//! Depends on the kernel for ids, ferry-proto for queue settings, and the Raft engine's plain
//! types; must not depend on an async runtime, gRPC, the back-end or the front-end.

pub mod meta;

use std::time::Duration;

use ferry_kernel::NodeId;
use ferry_multiraft::{ConfChange, GroupStatus, NodeId as PeerId};

use meta::{next_membership_step, MembershipStep, MetaState, RaftId};
use serde::{Deserialize, Serialize};

/// The next Raft configuration change of group 0 that brings `status` (the engine's view)
/// towards the nodes recorded in `meta` ([`next_membership_step`]), as the engine's type.
pub fn next_conf_change(meta: &MetaState, status: &GroupStatus) -> Option<ConfChange> {
    let ids = |nodes: &[PeerId]| nodes.iter().map(|n| RaftId(n.0)).collect::<Vec<_>>();
    let step = next_membership_step(meta, &ids(&status.voters), &ids(&status.learners))?;
    Some(conf_change_of(step))
}

/// A membership step (of group 0 or a queue shard) as the engine's configuration change.
pub fn conf_change_of(step: MembershipStep) -> ConfChange {
    match step {
        MembershipStep::AddVoter(r) => ConfChange::AddVoter(PeerId(r.0)),
        MembershipStep::AddLearner(r) => ConfChange::AddLearner(PeerId(r.0)),
        MembershipStep::Promote(r) => ConfChange::PromoteLearner(PeerId(r.0)),
        MembershipStep::Remove(r) => ConfChange::Remove(PeerId(r.0)),
    }
}

/// How this node takes part when it has no Raft state yet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StartMode {
    /// Form a new cluster with these voters (node id → peer address, this node included). One
    /// entry, this node: a one-node cluster.
    Initial(Vec<(NodeId, String)>),
    /// Wait to be added to the cluster whose node serves peers at this address.
    Join(String),
}

/// The `[cluster]` section of a node's configuration.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClusterConfig {
    /// Forms a new cluster: every initial node as `id=host:port` (its peer listener),
    /// comma-separated, this node included; the same list on each. Empty (and no `join`): a
    /// one-node cluster of this node. Read only when the node has no Raft state yet.
    #[serde(default)]
    pub initial: String,
    /// Joins a running cluster: the peer address (`host:port`) of one of its members. The node
    /// waits until an admin adds it (`ferry node add`). Read only when it has no Raft state.
    #[serde(default)]
    pub join: String,
    /// The client address recorded for this node; empty: the address the client listener is
    /// bound to (set it when listening on 0.0.0.0).
    #[serde(default)]
    pub advertise_client: String,
    /// The peer address other nodes dial; empty: the address the peer listener is bound to.
    #[serde(default)]
    pub advertise_peer: String,
    /// One Raft tick: a leader heartbeats every 2, a follower campaigns after 10-20 silent ones.
    #[serde(default = "default_tick_ms")]
    pub tick_ms: u64,
    /// A peer not heard from for this long shows as down (`ferry cluster status`). Idle links
    /// are probed every `liveness_timeout_ms / 6`.
    #[serde(default = "default_liveness_timeout_ms")]
    pub liveness_timeout_ms: u64,
}

fn default_tick_ms() -> u64 {
    100
}

fn default_liveness_timeout_ms() -> u64 {
    3_000
}

impl Default for ClusterConfig {
    fn default() -> Self {
        ClusterConfig {
            initial: String::new(),
            join: String::new(),
            advertise_client: String::new(),
            advertise_peer: String::new(),
            tick_ms: default_tick_ms(),
            liveness_timeout_ms: default_liveness_timeout_ms(),
        }
    }
}

/// What is wrong with a cluster configuration.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ClusterError {
    /// `cluster.initial` is malformed.
    #[error("cluster.initial: {reason}")]
    BadInitial {
        /// What to fix.
        reason: String,
    },
    /// `cluster.join` is malformed or conflicts.
    #[error("cluster.join: {reason}")]
    BadJoin {
        /// What to fix.
        reason: String,
    },
    /// A timing setting is out of range.
    #[error("cluster.{field} = {value}: {reason}")]
    BadTiming {
        /// The setting.
        field: &'static str,
        /// Its value.
        value: u64,
        /// What to fix.
        reason: &'static str,
    },
}

/// Whether `addr` is `host:port` with a nonzero port.
pub fn is_host_port(addr: &str) -> bool {
    addr.rsplit_once(':').is_some_and(|(host, port)| {
        !host.is_empty() && !host.contains("://") && port.parse::<u16>().is_ok_and(|p| p > 0)
    })
}

impl ClusterConfig {
    /// How the node starts when it has no Raft state, given its id and peer address.
    pub fn start_mode(&self, me: &NodeId, my_peer_addr: &str) -> Result<StartMode, ClusterError> {
        let (initial, join) = (self.initial.trim(), self.join.trim());
        if !join.is_empty() {
            if !initial.is_empty() {
                return Err(ClusterError::BadJoin {
                    reason: "set either cluster.initial (form a new cluster) or cluster.join (join a running one), not both".into(),
                });
            }
            if !is_host_port(join) {
                return Err(ClusterError::BadJoin {
                    reason: format!("{join:?}: write the peer address of a member as host:port"),
                });
            }
            return Ok(StartMode::Join(join.to_owned()));
        }
        if initial.is_empty() {
            return Ok(StartMode::Initial(vec![(
                me.clone(),
                my_peer_addr.to_owned(),
            )]));
        }
        let mut voters: Vec<(NodeId, String)> = vec![];
        for entry in initial.split(',').map(str::trim).filter(|e| !e.is_empty()) {
            let bad = |reason: String| ClusterError::BadInitial { reason };
            let (id, addr) = entry
                .split_once('=')
                .ok_or_else(|| bad(format!("{entry:?}: write each node as id=host:port")))?;
            let id = NodeId::new(id.trim()).map_err(|e| bad(format!("{entry:?}: {e}")))?;
            let addr = addr.trim();
            if !is_host_port(addr) {
                return Err(bad(format!(
                    "{entry:?}: the address must be host:port (the node's peer listener)"
                )));
            }
            if voters.iter().any(|(v, _)| v == &id) {
                return Err(bad(format!("node {id} is listed twice")));
            }
            voters.push((id, addr.to_owned()));
        }
        if !voters.iter().any(|(id, _)| id == me) {
            return Err(ClusterError::BadInitial {
                reason: format!(
                    "this node ({me}) is not listed; list every initial node, this one included"
                ),
            });
        }
        Ok(StartMode::Initial(voters))
    }

    /// The tick and the liveness timeout, checked.
    pub fn timings(&self) -> Result<(Duration, Duration), ClusterError> {
        if !(10..=10_000).contains(&self.tick_ms) {
            return Err(ClusterError::BadTiming {
                field: "tick_ms",
                value: self.tick_ms,
                reason: "use 10 to 10000 (default 100)",
            });
        }
        if self.liveness_timeout_ms < 600 {
            return Err(ClusterError::BadTiming {
                field: "liveness_timeout_ms",
                value: self.liveness_timeout_ms,
                reason: "use at least 600 (default 3000)",
            });
        }
        Ok((
            Duration::from_millis(self.tick_ms),
            Duration::from_millis(self.liveness_timeout_ms),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn me() -> NodeId {
        NodeId::new("a").unwrap()
    }

    #[test]
    fn no_cluster_options_make_a_one_node_cluster() {
        let mode = ClusterConfig::default().start_mode(&me(), "127.0.0.1:7410");
        assert_eq!(
            mode,
            Ok(StartMode::Initial(vec![(me(), "127.0.0.1:7410".into())]))
        );
    }

    #[test]
    fn the_initial_cluster_must_list_this_node_once_with_host_ports() {
        let with = |initial: &str| ClusterConfig {
            initial: initial.into(),
            ..ClusterConfig::default()
        };
        let ok = with("a=127.0.0.1:1, b=127.0.0.2:1").start_mode(&me(), "x:1");
        assert!(matches!(ok, Ok(StartMode::Initial(v)) if v.len() == 2));
        for bad in [
            "b=127.0.0.2:1",
            "a=127.0.0.1:1,a=h:2",
            "a",
            "a=http://h:1",
            "a=h:0",
            "A=h:1",
        ] {
            assert!(
                matches!(
                    with(bad).start_mode(&me(), "x:1"),
                    Err(ClusterError::BadInitial { .. })
                ),
                "{bad}"
            );
        }
    }

    #[test]
    fn join_takes_one_address_and_excludes_initial() {
        let join = ClusterConfig {
            join: "127.0.0.1:7410".into(),
            ..ClusterConfig::default()
        };
        assert_eq!(
            join.start_mode(&me(), "x:1"),
            Ok(StartMode::Join("127.0.0.1:7410".into()))
        );
        let both = ClusterConfig {
            initial: "a=h:1".into(),
            ..join.clone()
        };
        assert!(matches!(
            both.start_mode(&me(), "x:1"),
            Err(ClusterError::BadJoin { .. })
        ));
        let bad = ClusterConfig {
            join: "nowhere".into(),
            ..ClusterConfig::default()
        };
        assert!(matches!(
            bad.start_mode(&me(), "x:1"),
            Err(ClusterError::BadJoin { .. })
        ));
    }
}
