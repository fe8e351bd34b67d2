//! Which back-end owns a queue. Placement is static configuration for now (a queue named in the
//! placement map lives on that node, every other queue on this node); the Raft metadata group
//! will make it dynamic without changing this interface.

use std::collections::HashMap;

use ferry_kernel::{NodeId, QueueName};

use crate::error::Error;
use crate::BackendRef;

/// See the module docs.
#[derive(Clone)]
pub struct Router {
    local_node: NodeId,
    backends: HashMap<NodeId, BackendRef>,
    placement: HashMap<QueueName, NodeId>,
}

impl std::fmt::Debug for Router {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Router")
            .field("local_node", &self.local_node)
            .field("nodes", &self.backends.keys().collect::<Vec<_>>())
            .field("placement", &self.placement)
            .finish()
    }
}

impl Router {
    /// A router whose every queue lives on the local back-end.
    pub fn new(local_node: NodeId, local: BackendRef) -> Self {
        let mut backends = HashMap::new();
        backends.insert(local_node.clone(), local);
        Self {
            local_node,
            backends,
            placement: HashMap::new(),
        }
    }

    /// Adds another node's back-end.
    pub fn with_node(mut self, node: NodeId, backend: BackendRef) -> Self {
        self.backends.insert(node, backend);
        self
    }

    /// Places a queue on a node.
    pub fn with_placement(mut self, queue: QueueName, node: NodeId) -> Self {
        self.placement.insert(queue, node);
        self
    }

    pub fn local_node(&self) -> &NodeId {
        &self.local_node
    }

    pub fn local(&self) -> Result<&BackendRef, Error> {
        self.node(&self.local_node)
    }

    /// The node that owns `queue`. A temporary queue (`tmp.<node>.<connection>.<n>`) lives on
    /// the node that created it; `<queue>.DLQ` lives with `<queue>`.
    pub fn owner_of(&self, queue: &QueueName) -> &NodeId {
        if let Some(node) = queue
            .as_str()
            .strip_prefix("tmp.")
            .and_then(|rest| rest.split('.').next())
        {
            if let Some((id, _)) = self.backends.get_key_value(node) {
                return id;
            }
        }
        if let Some(node) = self.placement.get(queue) {
            return node;
        }
        // A dead-letter queue is created on demand next to its queue: `<queue>.DLQ` lives where
        // `<queue>` does unless placed explicitly.
        if let Some(base) = queue
            .as_str()
            .strip_suffix(".DLQ")
            .and_then(|b| QueueName::new(b).ok())
        {
            return self.owner_of(&base);
        }
        &self.local_node
    }

    /// The back-end that owns `queue`.
    pub fn for_queue(&self, queue: &QueueName) -> Result<&BackendRef, Error> {
        self.node(self.owner_of(queue))
    }

    pub fn node(&self, node: &NodeId) -> Result<&BackendRef, Error> {
        self.backends
            .get(node)
            .ok_or_else(|| Error::UnknownNode { node: node.clone() })
    }

    /// Every back-end, this node's first.
    pub fn all(&self) -> Vec<(&NodeId, &BackendRef)> {
        let mut all: Vec<_> = self.backends.iter().collect();
        all.sort_by_key(|(n, _)| (*n != &self.local_node, (*n).clone()));
        all
    }
}
