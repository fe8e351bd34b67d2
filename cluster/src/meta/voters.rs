//! Voter counts and membership of the Raft group: the metadata group keeps 1, 3 or 5 voters
//! (other nodes are learners), and the leader's driver makes the Raft configuration follow
//! the nodes recorded here, one change at a time.

use std::collections::BTreeSet;

use super::state::{MetaState, NodeRole, NodeState, RaftId};

/// The voter counts the cluster aims for.
pub const VOTER_COUNTS: [usize; 3] = [1, 3, 5];

/// A membership change an admin asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VoterChange {
    /// A node joins as a voter.
    AddVoter,
    /// A learner becomes a voter.
    Promote,
    /// A voter leaves.
    RemoveVoter,
}

/// What a change does to the voter count.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum VoterCheck {
    /// The count after the change is 1, 3 or 5.
    Keeps {
        /// Voters after the change.
        voters_after: usize,
    },
    /// The count after the change is not 1, 3 or 5; `advice` says what to do instead.
    Breaks {
        /// Voters after the change.
        voters_after: usize,
        /// What to do.
        advice: String,
    },
}

/// Whether `change` keeps 1, 3 or 5 active voters, and what to do otherwise.
pub fn check_voters(state: &MetaState, change: VoterChange) -> VoterCheck {
    let voters = state.voters().len();
    let learners = state.learners().len();
    let voters_after = match change {
        VoterChange::AddVoter | VoterChange::Promote => voters + 1,
        VoterChange::RemoveVoter => voters.saturating_sub(1),
    };
    if VOTER_COUNTS.contains(&voters_after) {
        return VoterCheck::Keeps { voters_after };
    }
    let advice = match change {
        _ if voters_after > 5 => {
            "5 voters is the most; add the node as a learner (--learner)".to_owned()
        }
        VoterChange::AddVoter => format!(
            "{voters_after} voters tolerate no more failures than {voters}; add the node as a \
             learner (--learner) and promote two learners together"
        ),
        VoterChange::Promote if learners >= 2 => format!(
            "{voters_after} voters tolerate no more failures than {voters}; promote a second \
             learner right after this one"
        ),
        VoterChange::Promote => format!(
            "{voters_after} voters tolerate no more failures than {voters}; add another \
             learner first, then promote both"
        ),
        VoterChange::RemoveVoter if learners >= 1 => format!(
            "{voters_after} voters tolerate no more failures than {}; promote a learner \
             first",
            voters_after.saturating_sub(1)
        ),
        VoterChange::RemoveVoter => format!(
            "{voters_after} voters tolerate no more failures than {}; add a learner and \
             promote it first, or remove a second voter",
            voters_after.saturating_sub(1)
        ),
    };
    VoterCheck::Breaks {
        voters_after,
        advice,
    }
}

/// One Raft configuration change (the shell maps it to the engine's `ConfChange`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MembershipStep {
    /// Add a voter.
    AddVoter(RaftId),
    /// Add a learner.
    AddLearner(RaftId),
    /// Make a learner a voter.
    Promote(RaftId),
    /// Remove a member.
    Remove(RaftId),
}

/// The next Raft configuration change that brings the group's configuration (`voters`,
/// `learners`: raft ids as the engine reports them) towards the nodes recorded here; `None`
/// when they agree. The leader's driver proposes it whenever no change is pending, so a
/// change is never lost to a leader change between applying `AddNode` and proposing.
/// Removals first, so the group never grows before it shrinks. A member no node has (the old
/// raft id of a removed node added again) is removed too, once the cluster is formed.
pub fn next_membership_step(
    state: &MetaState,
    voters: &[RaftId],
    learners: &[RaftId],
) -> Option<MembershipStep> {
    let voters: BTreeSet<RaftId> = voters.iter().copied().collect();
    let learners: BTreeSet<RaftId> = learners.iter().copied().collect();
    if state.cluster_id().is_some() {
        let known: BTreeSet<RaftId> = state.nodes().values().map(|n| n.raft_id).collect();
        if let Some(gone) = voters.iter().chain(&learners).find(|r| !known.contains(r)) {
            return Some(MembershipStep::Remove(*gone));
        }
    }
    let mut adds = None;
    for n in state.nodes().values() {
        let id = n.raft_id;
        let step = match (n.state, n.role) {
            (NodeState::Removed, _) if voters.contains(&id) || learners.contains(&id) => {
                return Some(MembershipStep::Remove(id));
            }
            (NodeState::Removed, _) => None,
            (NodeState::Active, NodeRole::Voter) if learners.contains(&id) => {
                Some(MembershipStep::Promote(id))
            }
            (NodeState::Active, NodeRole::Voter) if !voters.contains(&id) => {
                Some(MembershipStep::AddVoter(id))
            }
            (NodeState::Active, NodeRole::Learner) if !learners.contains(&id) => {
                // A learner recorded here that votes in Raft: only if demoted, never done.
                (!voters.contains(&id)).then_some(MembershipStep::AddLearner(id))
            }
            (NodeState::Active, _) => None,
        };
        adds = adds.or(step);
    }
    adds
}
