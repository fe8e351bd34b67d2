//! Every group a node's driver runs, behind one type: group 0's metadata ([`MetaMachine`]) and
//! the queue shards ([`ShardMachine`]). The driver's round loop is generic over one machine
//! type; this is it.

use ferry_cluster::meta::{MetaError, MetaEvent};
use ferry_multiraft::{GroupMachine, Halt, LogPosition, PersistJob};

use super::machine::MetaMachine;
use super::shard::ShardMachine;

/// See the module docs.
#[derive(Debug)]
pub(crate) enum NodeMachine {
    /// Boxed: one per node, and far larger than a shard's.
    Meta(Box<MetaMachine>),
    Shard(ShardMachine),
}

/// What applying an entry answered, by kind of group.
#[derive(Debug)]
pub(crate) enum Outcome {
    Meta(Result<MetaEvent, MetaError>),
    Shard,
}

impl NodeMachine {
    pub(crate) fn as_meta(&self) -> Option<&MetaMachine> {
        match self {
            NodeMachine::Meta(m) => Some(m),
            NodeMachine::Shard(_) => None,
        }
    }

    pub(crate) fn as_shard(&self) -> Option<&ShardMachine> {
        match self {
            NodeMachine::Meta(_) => None,
            NodeMachine::Shard(m) => Some(m),
        }
    }

    pub(crate) fn as_meta_mut(&mut self) -> Option<&mut MetaMachine> {
        match self {
            NodeMachine::Meta(m) => Some(m),
            NodeMachine::Shard(_) => None,
        }
    }
}

impl GroupMachine for NodeMachine {
    type Outcome = Outcome;

    fn applied_index(&self) -> u64 {
        match self {
            NodeMachine::Meta(m) => m.applied_index(),
            NodeMachine::Shard(m) => m.applied_index(),
        }
    }

    fn apply(&mut self, position: LogPosition, data: &[u8]) -> Result<Outcome, Halt> {
        match self {
            NodeMachine::Meta(m) => m.apply(position, data).map(Outcome::Meta),
            NodeMachine::Shard(m) => m.apply(position, data).map(|()| Outcome::Shard),
        }
    }

    fn skip(&mut self, position: LogPosition) -> Result<(), Halt> {
        match self {
            NodeMachine::Meta(m) => m.skip(position),
            NodeMachine::Shard(m) => m.skip(position),
        }
    }

    fn restore(&mut self, position: LogPosition, data: &[u8]) -> Result<(), Halt> {
        match self {
            NodeMachine::Meta(m) => m.restore(position, data),
            NodeMachine::Shard(m) => m.restore(position, data),
        }
    }

    fn snapshot(&self) -> Vec<u8> {
        match self {
            NodeMachine::Meta(m) => m.snapshot(),
            NodeMachine::Shard(m) => m.snapshot(),
        }
    }

    fn can_snapshot(&self) -> bool {
        match self {
            NodeMachine::Meta(m) => m.can_snapshot(),
            NodeMachine::Shard(m) => m.can_snapshot(),
        }
    }

    fn persist(&mut self, job: &mut PersistJob) {
        match self {
            NodeMachine::Meta(m) => m.persist(job),
            NodeMachine::Shard(m) => m.persist(job),
        }
    }

    fn close(&mut self, job: &mut PersistJob) {
        match self {
            NodeMachine::Meta(m) => m.close(job),
            NodeMachine::Shard(m) => m.close(job),
        }
    }
}
