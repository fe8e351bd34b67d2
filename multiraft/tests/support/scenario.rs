//! What scenarios ask of a simulation: who leads, what committed, whether every member caught
//! up; and the waits they share (a proposal or a configuration change committed everywhere).

use ferry_multiraft::{ConfChange, GroupId, LogPosition, NodeId, Role};

use super::{Sim, TICK_STEPS};

/// Enough steps for several election timeouts.
pub const ELECTION_STEPS: u64 = 40 * TICK_STEPS;

pub fn nodes(ids: &[u64]) -> Vec<NodeId> {
    ids.iter().copied().map(NodeId).collect()
}

impl Sim {
    /// Three nodes, 1 to 3, every one a voter of every group.
    pub fn three_nodes(seed: u64, groups: &[GroupId]) -> Sim {
        Sim::new(seed, 3, groups, &nodes(&[1, 2, 3]))
    }

    /// The up node that leads `group` in the highest term, if any.
    pub fn leader(&self, group: GroupId) -> Option<NodeId> {
        self.nodes
            .iter()
            .filter_map(|(&id, n)| Some((id, n.engine.as_ref()?.status(group)?)))
            .filter(|(_, s)| s.role == Role::Leader)
            .max_by_key(|(_, s)| s.term)
            .map(|(id, _)| id)
    }

    /// Proposes through the current leader; `None` if there is none or it refused.
    pub fn propose(&mut self, group: GroupId, data: &[u8]) -> Option<LogPosition> {
        let leader = self.leader(group)?;
        self.engine_mut(leader).propose(group, data.to_vec()).ok()
    }

    pub fn propose_conf_change(
        &mut self,
        group: GroupId,
        change: ConfChange,
    ) -> Option<LogPosition> {
        let leader = self.leader(group)?;
        self.engine_mut(leader)
            .propose_conf_change(group, change)
            .ok()
    }

    pub fn applied_index(&self, node: NodeId, group: GroupId) -> Option<u64> {
        Some(self.nodes[&node].apps.get(&group)?.applied_index)
    }

    /// Whether (group, position) was committed (applied somewhere) with that term.
    pub fn is_committed(&self, group: GroupId, position: LogPosition) -> bool {
        self.committed
            .get(&(group, position.index))
            .is_some_and(|(term, _, _)| *term == position.term)
    }

    /// Every up member of the group's configuration applied everything its leader committed.
    pub fn converged(&self, group: GroupId) -> bool {
        let Some(leader) = self.leader(group) else {
            return false;
        };
        let status = self.engine(leader).status(group).unwrap();
        status.applied_index == status.commit_index
            && status.voters.iter().chain(&status.learners).all(|m| {
                !self.is_up(*m)
                    || self.engine(*m).status(group).is_some_and(|s| {
                        s.applied_index == status.commit_index && s.leader == Some(leader)
                    })
            })
    }

    pub fn all_converged(&self, groups: &[GroupId]) -> bool {
        groups.iter().all(|g| self.converged(*g))
    }

    /// Every node's view of a group, for failure messages.
    pub fn describe(&self, group: GroupId) -> String {
        let mut out = format!("seed {} step {}:", self.seed, self.now);
        for (&id, n) in &self.nodes {
            match n
                .engine
                .as_ref()
                .map(|e| (e.status(group), e.in_flight_job_count()))
            {
                None => out += &format!("\n  {id}: down"),
                Some((None, _)) => out += &format!("\n  {id}: no group"),
                Some((Some(s), jobs)) => {
                    out += &format!("\n  {id}: {s:?} jobs in flight {jobs}");
                }
            }
        }
        out
    }

    pub fn committed_count(&self) -> usize {
        self.committed.len()
    }

    /// Proposes `data` until it is committed and every member applied it; a proposal lost to
    /// a leader change is made again.
    pub fn propose_and_wait(&mut self, group: GroupId, data: &[u8]) {
        let mut position = None;
        for _ in 0..ELECTION_STEPS * 4 {
            if position.is_some_and(|p| self.is_committed(group, p)) && self.converged(group) {
                return;
            }
            if position.is_none_or(|p| self.is_lost(group, p)) {
                position = self.propose(group, data);
            }
            self.step();
        }
        panic!(
            "{group}: {data:?} not committed everywhere (position {position:?}) {}",
            self.describe(group)
        );
    }

    /// Commits `data` without waiting for every member (`absent` is cut off or down).
    pub fn propose_and_wait_without(&mut self, group: GroupId, absent: NodeId, data: &[u8]) {
        let mut position = None;
        for _ in 0..ELECTION_STEPS * 4 {
            if position.is_some_and(|p| self.is_committed(group, p)) {
                return;
            }
            if position.is_none_or(|p| self.is_lost(group, p)) {
                position = self.propose(group, data);
            }
            self.step();
        }
        panic!("{group}: {data:?} not committed without {absent}");
    }

    /// Proposes `change` until it is committed and every member applied it.
    pub fn conf_change_and_wait(&mut self, group: GroupId, change: ConfChange) {
        let mut position = None;
        for _ in 0..ELECTION_STEPS * 4 {
            if position.is_some_and(|p| self.is_committed(group, p)) && self.converged(group) {
                return;
            }
            if position.is_none_or(|p| self.is_lost(group, p)) {
                position = self.propose_conf_change(group, change);
            }
            self.step();
        }
        panic!("{group}: {change:?} not applied everywhere (position {position:?})");
    }

    /// A proposal that can no longer commit: another leader took over before it committed.
    fn is_lost(&self, group: GroupId, position: LogPosition) -> bool {
        !self.is_committed(group, position)
            && self
                .leader(group)
                .is_some_and(|l| self.engine(l).status(group).unwrap().term != position.term)
    }
}
