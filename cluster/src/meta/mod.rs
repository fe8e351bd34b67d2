//! The metadata state machine of Raft group 0: the cluster id, the nodes (with their raft
//! ids, roles and addresses), queue definitions and their placement (owner and epoch), and the
//! queue shards of replicated queues (their replicas and epoch, `shards.rs`).
//!
//! Pure and deterministic: [`MetaState::apply`] takes a committed [`MetaCommand`] and its log
//! index and returns a [`MetaEvent`] for the shell, or a [`MetaError`] (a refused command
//! changes nothing but the applied index). No Raft engine, I/O, clock or random source here:
//! the shell draws the cluster id, chooses owners with [`choose_owner`] before proposing, maps
//! [`MembershipStep`]s to engine configuration changes and publishes
//! [`MetaState::placement_snapshot`] to the front-end.
//!
//! Log entries and snapshots are versioned protobuf (prost) messages (`codec.rs`); the node's
//! durable copy is kept key by key, so a change writes what it changed (`durable.rs`). A
//! proposal carries a request id, so a retry of one that committed applies once
//! (`requests.rs`). An entry this release cannot read stops applying
//! ([`MetaError::stops_apply`]): skipping it would let the nodes' metadata diverge.

mod apply;
mod changes;
mod codec;
mod command;
mod durable;
mod error;
mod nodes;
mod placement;
mod queues;
mod replica_moves;
mod requests;
mod shards;
mod state;
mod voters;

#[cfg(test)]
mod durable_tests;
#[cfg(test)]
mod replica_move_tests;
#[cfg(test)]
mod returning_node_tests;
#[cfg(test)]
mod shard_tests;
#[cfg(test)]
mod tests;

pub use changes::QueueChange;
pub use codec::{COMMAND_LEVEL, COMMAND_VERSION, SNAPSHOT_VERSION};
pub use command::{bootstrap_raft_ids, Applied, MetaCommand, MetaEvent, NewNode};
pub use durable::{DurableWrite, Touched, DURABLE_END, DURABLE_PREFIX};
pub use error::MetaError;
pub use placement::{
    choose_owner, choose_owner_avoiding, choose_queue_owner, choose_queue_owner_avoiding,
    NodeAddrs, PlacementSnapshot,
};
pub use replica_moves::{choose_replacement, next_replica_step};
pub use requests::{RequestId, REQUESTS_KEPT};
pub use shards::{
    choose_shard, default_replication, ShardChoice, ShardDef, ShardDefs, QUEUES_PER_SHARD_MAX,
    REPLICATION_FACTORS,
};
pub use state::{
    ClusterId, MetaState, NodeInfo, NodeRole, NodeState, Owner, QueueDef, QueueDefs, RaftId,
};
pub use voters::{
    check_voters, next_membership_step, MembershipStep, VoterChange, VoterCheck, VOTER_COUNTS,
};
