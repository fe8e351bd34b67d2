//! Cluster membership and queue placement.
//!
//! Today placement is static configuration, checked here once at startup: the nodes of the
//! cluster with their addresses, and which queues live on which node (every other queue lives on
//! the node where it is created). [`meta`] is its replacement, the metadata state machine of
//! Raft group 0 (group 0 of the multi-group engine); the front-end's router keeps the same
//! interface.
//!
//! Depends on the kernel for ids and on ferry-proto for queue settings (`pb::QueueConfig`);
//! must not depend on the Raft engine, tonic services, tokio, a clock or a random source.

pub mod meta;

use std::collections::BTreeMap;

use ferry_kernel::{NodeId, QueueName};
use serde::{Deserialize, Serialize};

/// The `[cluster]` section of a node's configuration.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClusterConfig {
    /// Other nodes: node id → address of the node's peer listener (`http://host:port`, its
    /// `peer_listen`), where it serves the internal `Backend` service; not its client port.
    #[serde(default)]
    pub nodes: BTreeMap<String, String>,
    /// Queue name → id of the node that owns it.
    #[serde(default)]
    pub placement: BTreeMap<String, String>,
}

/// A checked cluster configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Membership {
    pub nodes: BTreeMap<NodeId, String>,
    pub placement: BTreeMap<QueueName, NodeId>,
}

/// What is wrong with a cluster configuration.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ClusterError {
    #[error("cluster.nodes: {reason}")]
    BadNode { reason: String },
    #[error("cluster.placement: {reason}")]
    BadPlacement { reason: String },
}

impl ClusterConfig {
    /// Checks names and addresses and that every placement names a known node (this one or one in
    /// `nodes`).
    pub fn validate(&self, this_node: &NodeId) -> Result<Membership, ClusterError> {
        let mut nodes = BTreeMap::new();
        for (id, addr) in &self.nodes {
            let node = NodeId::new(id.as_str()).map_err(|e| ClusterError::BadNode {
                reason: e.to_string(),
            })?;
            if !(addr.starts_with("http://") || addr.starts_with("https://")) {
                return Err(ClusterError::BadNode {
                    reason: format!("address of {id} is {addr:?}; write it as http://host:port"),
                });
            }
            if &node != this_node {
                nodes.insert(node, addr.clone());
            }
        }
        let mut placement = BTreeMap::new();
        for (queue, node) in &self.placement {
            let q = QueueName::new(queue.as_str()).map_err(|e| ClusterError::BadPlacement {
                reason: e.to_string(),
            })?;
            let n = NodeId::new(node.as_str()).map_err(|e| ClusterError::BadPlacement {
                reason: e.to_string(),
            })?;
            if &n != this_node && !nodes.contains_key(&n) {
                return Err(ClusterError::BadPlacement {
                    reason: format!(
                        "queue {queue} is placed on {node}, which is not in cluster.nodes"
                    ),
                });
            }
            placement.insert(q, n);
        }
        Ok(Membership { nodes, placement })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn placement_must_name_a_known_node() {
        let me = NodeId::new("a").unwrap();
        let mut c = ClusterConfig::default();
        c.placement.insert("orders".into(), "b".into());
        assert!(matches!(
            c.validate(&me),
            Err(ClusterError::BadPlacement { .. })
        ));
        c.nodes.insert("b".into(), "http://127.0.0.1:7401".into());
        let m = c.validate(&me).unwrap();
        assert_eq!(
            m.placement[&QueueName::new("orders").unwrap()],
            NodeId::new("b").unwrap()
        );
        c.nodes.insert("c".into(), "127.0.0.1:7402".into());
        assert!(matches!(c.validate(&me), Err(ClusterError::BadNode { .. })));
    }
}
