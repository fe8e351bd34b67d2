//! Leader balancing: each node hands the shards it leads to their preferred leaders.
//!
//! Every shard has a preferred leader, its first replica in the metadata
//! ([`ferry_cluster::meta::ShardDef::preferred_leader`]); the placement rule gives each new
//! shard the node that is preferred leader of the fewest shards, so preferred leaders are spread
//! evenly over the nodes. Elections do not follow it: the replica whose election timer fires
//! first wins, and after a restart or a failover one node may lead every shard. So each node
//! runs a [`Balancer`] for the shards it leads (no node decides for another: the leader has the
//! progress of the others at hand, and no metadata command is needed). Every
//! [`BALANCE_EVERY_TICKS`] its driver hands it the shards it leads; it picks at most one to
//! hand over, which the driver passes to the engine's `transfer_leader`. A shard is handed over
//! when all of these hold:
//! - this node is not its preferred leader, and the preferred leader is one of its voters;
//! - no transfer of it is under way, and this node has led it for at least [`SETTLE_TICKS`]
//!   at the current term (a new leader settles first; the preferred one may just be starting);
//! - its leadership was not set by an operator (`ferry shard transfer-leader`, which holds
//!   the shard on the node it named for as long as that node keeps leading it at that term);
//! - the preferred leader was heard from within the last election timeout and its log is at
//!   most [`CAUGHT_UP_LAG_MAX`] entries behind (raft-rs drops proposals while a transfer waits
//!   for the target to catch up, so a transfer to a slow or dead node would stall the shard);
//! - this node started no transfer of it in the last [`SHARD_RETRY_TICKS`] (a preferred
//!   leader that cannot take over is not asked again and again) and no transfer of any shard
//!   in the last [`NODE_INTERVAL_TICKS`] (shards move one at a time).
//!
//! The preferred leader's own balancer never moves a shard away, so leadership cannot flap
//! between two nodes. Time is counted in Raft ticks: the balancer reads no clock.

use std::collections::BTreeMap;

use ferry_be_server::ShardId;
use ferry_multiraft::{LeaderProgress, NodeId as PeerId};

/// How often (in ticks) the driver runs the balancer.
pub(crate) const BALANCE_EVERY_TICKS: u64 = 5;
/// How long a node leads a shard at a term before it may hand it over (3 s of 100 ms ticks).
pub(crate) const SETTLE_TICKS: u64 = 30;
/// How long a node waits before it tries to hand the same shard over again (30 s).
pub(crate) const SHARD_RETRY_TICKS: u64 = 300;
/// How long a node waits between two transfers it starts (1 s).
pub(crate) const NODE_INTERVAL_TICKS: u64 = 10;
/// How far behind the leader's log the preferred leader may be and still be handed the shard.
pub(crate) const CAUGHT_UP_LAG_MAX: u64 = 16;
/// How long an operator's hold waits for the node it names to lead (10 s).
pub(crate) const HOLD_PENDING_TICKS: u64 = 100;

/// A shard this node leads, as the driver sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct LedShard {
    pub(crate) shard: ShardId,
    /// The term this node leads it at.
    pub(crate) term: u64,
    /// Its preferred leader, as a peer of the group (`None`: the metadata does not name one
    /// this node knows).
    pub(crate) preferred: Option<PeerId>,
    /// What this node knows of the other voters.
    pub(crate) progress: LeaderProgress,
}

/// Why a shard is left where it is (the first reason that applies).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Stay {
    /// This node is the preferred leader, or the preferred leader is unknown or not a voter.
    Preferred,
    /// A transfer is under way.
    Transferring,
    /// An operator set its leader.
    Held,
    /// Led here for less than [`SETTLE_TICKS`].
    Settling,
    /// A transfer of it was started here less than [`SHARD_RETRY_TICKS`] ago.
    TriedRecently,
    /// The preferred leader was not heard from within the last election timeout.
    PreferredSilent,
    /// The preferred leader's log is more than [`CAUGHT_UP_LAG_MAX`] entries behind.
    PreferredBehind,
}

/// An operator's hold on a shard (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Hold {
    /// Waiting for this node to lead the shard, until this tick.
    Pending { until: u64 },
    /// This node leads it at this term: kept until it no longer does.
    Term(u64),
}

/// See the module docs. Pure: time is the tick count its caller passes.
#[derive(Debug, Default)]
pub(crate) struct Balancer {
    /// Per shard led here: the term and the tick it was first seen led at that term.
    led_since: BTreeMap<ShardId, (u64, u64)>,
    /// When a transfer of each shard was last started here.
    tried_at: BTreeMap<ShardId, u64>,
    /// When the last transfer was started here.
    last_started_at: Option<u64>,
    holds: BTreeMap<ShardId, Hold>,
}

impl Balancer {
    /// An operator asked this node to lead `shard` (`now`: ticks): the balancer leaves it here
    /// while this node leads it at the term it gets it at.
    pub(crate) fn hold(&mut self, shard: ShardId, now: u64) {
        let until = now + HOLD_PENDING_TICKS;
        self.holds.insert(shard, Hold::Pending { until });
    }

    /// The shard to hand over now and to whom, if any; `led`: every shard this node leads, at
    /// tick `now`. Remembers what it decided.
    pub(crate) fn decide(&mut self, now: u64, led: &[LedShard]) -> Option<(ShardId, PeerId)> {
        self.observe(now, led);
        if self
            .last_started_at
            .is_some_and(|at| now < at + NODE_INTERVAL_TICKS)
        {
            return None;
        }
        let (shard, to) = led
            .iter()
            .find_map(|l| self.target(now, l).ok().map(|to| (l.shard, to)))?;
        self.tried_at.insert(shard, now);
        self.last_started_at = Some(now);
        Some((shard, to))
    }

    /// Where `l` should go now, or why it stays (the module docs' rule).
    pub(crate) fn target(&self, now: u64, l: &LedShard) -> Result<PeerId, Stay> {
        let preferred = l.preferred.ok_or(Stay::Preferred)?;
        let follower = l
            .progress
            .followers
            .iter()
            .find(|f| f.node == preferred)
            .ok_or(Stay::Preferred)?;
        if l.progress.transferring_to.is_some() {
            return Err(Stay::Transferring);
        }
        if self.holds.get(&l.shard) == Some(&Hold::Term(l.term)) {
            return Err(Stay::Held);
        }
        let since = self.led_since.get(&l.shard).map_or(now, |(_, at)| *at);
        if now < since + SETTLE_TICKS {
            return Err(Stay::Settling);
        }
        if self
            .tried_at
            .get(&l.shard)
            .is_some_and(|at| now < at + SHARD_RETRY_TICKS)
        {
            return Err(Stay::TriedRecently);
        }
        if !follower.recently_active {
            return Err(Stay::PreferredSilent);
        }
        if l.progress.last_index.saturating_sub(follower.match_index) > CAUGHT_UP_LAG_MAX {
            return Err(Stay::PreferredBehind);
        }
        Ok(preferred)
    }

    /// Brings what it remembers in line with the shards led now.
    fn observe(&mut self, now: u64, led: &[LedShard]) {
        let terms: BTreeMap<ShardId, u64> = led.iter().map(|l| (l.shard, l.term)).collect();
        self.led_since
            .retain(|s, (term, _)| terms.get(s) == Some(term));
        for (shard, term) in &terms {
            self.led_since.entry(*shard).or_insert((*term, now));
        }
        self.tried_at.retain(|_, at| now < *at + SHARD_RETRY_TICKS);
        self.holds
            .retain(|shard, hold| match (*hold, terms.get(shard)) {
                (Hold::Pending { .. }, Some(term)) => {
                    *hold = Hold::Term(*term);
                    true
                }
                (Hold::Pending { until }, None) => now <= until,
                (Hold::Term(held), Some(term)) => held == *term,
                (Hold::Term(_), None) => false,
            });
    }
}

#[cfg(test)]
#[path = "balance_tests.rs"]
mod tests;
