//! Membership commands: bootstrap, add, promote and remove a node. Raft ids come from the
//! state's counter and are never reused. A removed node's id may be added again (a machine
//! back on an empty disk under its old name): it gets a new raft id, and its old one is
//! forgotten (the group's leader removes a raft id no node has, see
//! [`super::next_membership_step`]).

use std::collections::BTreeSet;

use ferry_kernel::{NodeId, ShardId};

use super::command::{bootstrap_raft_ids, MetaEvent, NewNode};
use super::error::MetaError;
use super::state::{ClusterId, MetaState, NodeInfo, NodeRole, NodeState};

impl MetaState {
    pub(crate) fn bootstrap(
        &mut self,
        cluster_id: ClusterId,
        nodes: &[NewNode],
    ) -> Result<MetaEvent, MetaError> {
        if let Some(expected) = self.cluster_id {
            return Err(if expected == cluster_id {
                MetaError::AlreadyBootstrapped { cluster_id }
            } else {
                MetaError::WrongCluster {
                    expected,
                    got: cluster_id,
                }
            });
        }
        if nodes.is_empty() {
            return Err(MetaError::NoNodes);
        }
        let mut seen = BTreeSet::new();
        if let Some(n) = nodes.iter().find(|n| !seen.insert(&n.id)) {
            return Err(MetaError::DuplicateNode { node: n.id.clone() });
        }
        for n in nodes {
            check_addrs(&n.id, &n.client_addr, &n.peer_addr)?;
        }
        let ids: Vec<NodeId> = nodes.iter().map(|n| n.id.clone()).collect();
        let voters = bootstrap_raft_ids(&ids);
        for (id, raft_id) in &voters {
            let Some(n) = nodes.iter().find(|n| &n.id == id) else {
                continue;
            };
            self.nodes.insert(
                id.clone(),
                NodeInfo {
                    raft_id: *raft_id,
                    client_addr: n.client_addr.clone(),
                    peer_addr: n.peer_addr.clone(),
                    role: NodeRole::Voter,
                    state: NodeState::Active,
                    incarnation: 0,
                },
            );
        }
        self.next_raft_id = voters.len() as u64 + 1;
        self.cluster_id = Some(cluster_id);
        Ok(MetaEvent::Bootstrapped { cluster_id, voters })
    }

    pub(crate) fn add_node(
        &mut self,
        id: &NodeId,
        client_addr: &str,
        peer_addr: &str,
        learner: bool,
    ) -> Result<MetaEvent, MetaError> {
        if self.nodes.get(id).is_some_and(NodeInfo::is_active) {
            return Err(MetaError::DuplicateNode { node: id.clone() });
        }
        check_addrs(id, client_addr, peer_addr)?;
        let raft_id = self.next_raft_id();
        let role = if learner {
            NodeRole::Learner
        } else {
            NodeRole::Voter
        };
        self.nodes.insert(
            id.clone(),
            NodeInfo {
                raft_id,
                client_addr: client_addr.to_owned(),
                peer_addr: peer_addr.to_owned(),
                role,
                state: NodeState::Active,
                incarnation: 0,
            },
        );
        self.next_raft_id += 1;
        Ok(MetaEvent::NodeAdded {
            id: id.clone(),
            raft_id,
            role,
        })
    }

    /// The node, if it exists and is active.
    pub(crate) fn active_node(&self, id: &NodeId) -> Result<&NodeInfo, MetaError> {
        let node = self
            .nodes
            .get(id)
            .ok_or_else(|| MetaError::UnknownNode { node: id.clone() })?;
        match node.state {
            NodeState::Active => Ok(node),
            NodeState::Removed => Err(MetaError::NodeRemoved { node: id.clone() }),
        }
    }

    /// Applies [`super::MetaCommand::NoteIncarnation`]: recorded once, the same again (or 0)
    /// changes nothing, another one is refused.
    pub(crate) fn note_incarnation(
        &mut self,
        id: &NodeId,
        incarnation: u64,
    ) -> Result<MetaEvent, MetaError> {
        let recorded = self.active_node(id)?.incarnation;
        // 0 is "none": there is nothing to record.
        if recorded == incarnation || incarnation == 0 {
            return Ok(MetaEvent::Nothing);
        }
        if recorded != 0 {
            return Err(MetaError::OtherIncarnation {
                node: id.clone(),
                recorded,
                got: incarnation,
            });
        }
        if let Some(n) = self.nodes.get_mut(id) {
            n.incarnation = incarnation;
        }
        Ok(MetaEvent::IncarnationNoted {
            node: id.clone(),
            incarnation,
        })
    }

    pub(crate) fn promote_node(&mut self, id: &NodeId) -> Result<MetaEvent, MetaError> {
        let node = self.active_node(id)?;
        if node.role == NodeRole::Voter {
            return Err(MetaError::AlreadyVoter { node: id.clone() });
        }
        let raft_id = node.raft_id;
        if let Some(n) = self.nodes.get_mut(id) {
            n.role = NodeRole::Voter;
        }
        Ok(MetaEvent::NodePromoted {
            id: id.clone(),
            raft_id,
        })
    }

    pub(crate) fn remove_node(&mut self, id: &NodeId) -> Result<MetaEvent, MetaError> {
        let node = self.active_node(id)?;
        if node.role == NodeRole::Voter && self.voters().len() == 1 {
            return Err(MetaError::LastVoter { node: id.clone() });
        }
        let raft_id = node.raft_id;
        let queues = self.queues_of(id);
        if !queues.is_empty() {
            return Err(MetaError::NodeOwnsQueues {
                node: id.clone(),
                queues,
            });
        }
        let shards: Vec<ShardId> = self
            .shards
            .iter()
            .filter(|(_, s)| s.replicas.contains(id))
            .map(|(shard, _)| *shard)
            .collect();
        if !shards.is_empty() {
            return Err(MetaError::NodeHoldsReplicas {
                node: id.clone(),
                shards,
            });
        }
        if let Some(n) = self.nodes.get_mut(id) {
            n.state = NodeState::Removed;
        }
        Ok(MetaEvent::NodeRemoved {
            id: id.clone(),
            raft_id,
        })
    }
}

/// Both addresses are `host:port` with a non-empty host and a port number.
fn check_addrs(node: &NodeId, client_addr: &str, peer_addr: &str) -> Result<(), MetaError> {
    for (field, addr) in [("client_addr", client_addr), ("peer_addr", peer_addr)] {
        let ok = addr
            .rsplit_once(':')
            .is_some_and(|(host, port)| !host.is_empty() && port.parse::<u16>().is_ok());
        if !ok {
            return Err(MetaError::InvalidAddress {
                node: node.clone(),
                field,
                addr: addr.to_owned(),
            });
        }
    }
    Ok(())
}
