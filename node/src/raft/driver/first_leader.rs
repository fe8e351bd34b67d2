//! A new shard is first led by its preferred leader.
//!
//! Every replica starts a new shard's group when it applies the metadata that made it, and left
//! to their timers, the replica whose election timeout fires first wins: two times in three not
//! the preferred leader, whose balancer takes the shard over some seconds later
//! (`shard/balance.rs`), breaking the `Consume` streams and the sends of the queue's first
//! clients in between. So the preferred leader campaigns as it starts the group, and again on
//! each tick while the group knows no leader, for one election timeout: the other replicas
//! start the group a little later (when the metadata's commit reaches them), and a campaign
//! that reached a node without the group yet is dropped there. Their own timers run at least an
//! election timeout from their start, so the preferred leader asks first. Its campaigns ask for
//! pre-votes, which move no term: a replica that has heard from a leader, or whose log is ahead,
//! refuses them, so a campaign can never take leadership from a leader already elected (a
//! preferred leader that starts the group late, after a restart, asks in vain and follows).

use ferry_multiraft::{GroupId, NodeId as PeerId};

use super::{Driver, Role};

/// How many ticks the preferred leader of a new shard keeps asking (the election timeout).
const FIRST_CAMPAIGN_TICKS: u64 = 10;

impl Driver {
    /// A shard group just started here with `voters` (in the metadata's order: the preferred
    /// leader first): if this node is its preferred leader, campaigns now and on the ticks to
    /// come ([`Driver::campaign_first`]).
    pub(super) fn lead_new_shard(&mut self, group: GroupId, voters: &[PeerId]) {
        let Some(engine) = self.rounds.engine_mut() else {
            return;
        };
        if voters.len() < 2 || voters.first() != Some(&engine.node()) {
            return;
        }
        self.first_campaigns
            .insert(group, self.ticks + FIRST_CAMPAIGN_TICKS);
        self.campaign_first();
    }

    /// On each tick: the new shards preferred here that know no leader yet campaign again,
    /// until one is elected or their time is up.
    pub(super) fn campaign_first(&mut self) {
        if self.first_campaigns.is_empty() {
            return;
        }
        let ticks = self.ticks;
        let Some(engine) = self.rounds.engine_mut() else {
            return;
        };
        self.first_campaigns.retain(|group, until| {
            let Some(status) = engine.status(*group) else {
                return false;
            };
            if status.leader.is_some() || ticks > *until {
                return false;
            }
            // A candidate is in a vote already; a new campaign would abandon it.
            if matches!(status.role, Role::Follower | Role::PreCandidate) {
                if let Err(e) = engine.campaign(*group) {
                    tracing::debug!(%group, error = %e, "no first campaign");
                }
            }
            true
        });
    }
}
