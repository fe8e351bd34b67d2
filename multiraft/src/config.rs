//! Engine configuration, turned into one raft-rs `Config` per group.

use crate::error::Error;
use crate::ids::{GroupId, NodeId};

/// Settings shared by every group on a node.
#[derive(Debug, Clone)]
pub struct EngineConfig {
    /// This node; its Raft peer id in every group.
    pub node: NodeId,
    /// Ticks without hearing from a leader before a follower campaigns (the actual timeout is
    /// drawn in `[election_tick, 2 * election_tick)`).
    pub election_tick: usize,
    /// Ticks between a leader's heartbeats.
    pub heartbeat_tick: usize,
    /// Largest append message, in bytes of entries.
    pub max_size_per_msg_bytes: u64,
    /// Most append messages in flight to one follower, per group.
    pub max_inflight_msgs: usize,
    /// Most bytes of uncommitted entries a leader accepts before dropping proposals.
    pub max_uncommitted_size_bytes: u64,
    /// Largest encoded batch for one peer: a round's messages to a peer that do not fit go in
    /// further batches, in order (a single message larger than this goes alone). Keep it under
    /// what the transport accepts, and at least `max_size_per_msg_bytes` plus room for a
    /// message's headers.
    pub batch_bytes_max: usize,
    /// Seed of the election timeout draws. raft-rs draws them from a thread-local random source;
    /// the engine overrides each draw with a hash of (seed, node, group, term, role) so that a
    /// simulation replays exactly. Defaults to the node id.
    pub election_seed: u64,
}

impl EngineConfig {
    /// Defaults for a node: election after 10 ticks, heartbeat every 2, 1 MiB messages,
    /// batches of at most 16 MiB.
    pub fn new(node: NodeId) -> Self {
        EngineConfig {
            node,
            election_tick: 10,
            heartbeat_tick: 2,
            max_size_per_msg_bytes: 1024 * 1024,
            max_inflight_msgs: 256,
            max_uncommitted_size_bytes: 64 * 1024 * 1024,
            batch_bytes_max: 16 * 1024 * 1024,
            election_seed: node.0,
        }
    }

    /// The raft-rs configuration of one group, with `check_quorum`, `pre_vote` and
    /// `skip_bcast_commit` on, and `batch_append` OFF.
    ///
    /// raft-rs 0.7's `batch_append` is unsafe under message loss and reordering: its
    /// `try_batching` appends entries to a pending MsgAppend that carries no entries without
    /// checking that they follow its `index`. After a rejection lowers a follower's next index,
    /// a pending empty append at prev index 14 plus entry 14 becomes "prev 14, entries [14]";
    /// the follower, which lacks 15, answers "matched 15" and the leader counts it towards
    /// commitment (found by the simulation, seed 1001: a follower got commit 15 with log 14).
    /// The engine already sends one batch per peer per round, which is what `batch_append`
    /// would save on the wire.
    pub(crate) fn raft_config(&self, group: GroupId, applied: u64) -> Result<raft::Config, Error> {
        let config = raft::Config {
            id: self.node.0,
            election_tick: self.election_tick,
            heartbeat_tick: self.heartbeat_tick,
            applied,
            max_size_per_msg: self.max_size_per_msg_bytes,
            max_inflight_msgs: self.max_inflight_msgs,
            check_quorum: true,
            pre_vote: true,
            batch_append: false,
            skip_bcast_commit: true,
            max_uncommitted_size: self.max_uncommitted_size_bytes,
            ..raft::Config::default()
        };
        config.validate().map_err(|e| Error::InvalidConfig {
            reason: format!("{group}: {e}"),
        })?;
        Ok(config)
    }

    /// The election timeout for (group, term, role): deterministic, in
    /// `[election_tick, 2 * election_tick)`.
    pub(crate) fn election_timeout_ticks(&self, group: GroupId, term: u64, role: u8) -> usize {
        // The seed goes through the mixer on its own: xor-ing it with the node id first made
        // every node draw the same timeouts when the seed was the node id (the default), so the
        // node that ticked first won every election.
        let mut h = splitmix64(self.election_seed);
        for word in [self.node.0, group.0, term, u64::from(role)] {
            h = splitmix64(h ^ word);
        }
        let spread = self.election_tick.max(1) as u64;
        // `spread` fits in usize, so does the remainder.
        self.election_tick + (h % spread) as usize
    }
}

fn splitmix64(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nodes_with_default_seeds_draw_different_election_timeouts() {
        let configs: Vec<EngineConfig> = (1..=3).map(|n| EngineConfig::new(NodeId(n))).collect();
        let mut first_by_node = [0usize; 3];
        for g in 0..64 {
            let draws: Vec<usize> = configs
                .iter()
                .map(|c| c.election_timeout_ticks(GroupId(g), 1, 0))
                .collect();
            assert!(draws.iter().all(|d| (10..20).contains(d)));
            let min = draws.iter().min().copied().unwrap_or(0);
            first_by_node[draws.iter().position(|d| *d == min).unwrap_or(0)] += 1;
        }
        // Regression: with seed == node id every node drew the same timeouts.
        assert!(first_by_node.iter().all(|n| *n >= 10), "{first_by_node:?}");
    }
}
