//! Message groups (JMSXGroupID): every message of a group goes to one session at a time, so a
//! group is consumed in order. A session takes a group with the first message of it it receives
//! and keeps it until the session ends (or lets the lease of the group's last message it holds
//! run out: it may be gone unannounced); then the group is free and goes to whichever session
//! receives from it next. Receivers without a session never take a group: they may receive a
//! message of a group nobody holds, as if it had none.

use std::collections::{BTreeSet, HashMap};

use super::{Entry, MessageState};
use crate::types::SessionId;

#[derive(Debug, Default)]
pub(crate) struct Groups {
    owner_of: HashMap<String, SessionId>,
    by_owner: HashMap<SessionId, BTreeSet<String>>,
    /// Changes every time a group changes hands (paging's scan memo depends on who holds what).
    pub(crate) epoch: u64,
}

impl Groups {
    /// Whether `receiver` may be given a message of `group`.
    pub(crate) fn may_take(&self, group: Option<&str>, receiver: Option<SessionId>) -> bool {
        match group.and_then(|g| self.owner_of.get(g)) {
            None => true,
            Some(owner) => Some(*owner) == receiver,
        }
    }

    /// `receiver` was given a message of `group`: it holds the group from now on.
    pub(crate) fn claim(&mut self, group: Option<&str>, receiver: Option<SessionId>) {
        let (Some(group), Some(receiver)) = (group, receiver) else {
            return;
        };
        if self.owner_of.contains_key(group) {
            return;
        }
        self.owner_of.insert(group.to_owned(), receiver);
        self.epoch += 1;
        self.by_owner
            .entry(receiver)
            .or_default()
            .insert(group.to_owned());
    }

    /// The session ended: its groups are free. Returns them.
    pub(crate) fn release(&mut self, owner: SessionId) -> BTreeSet<String> {
        let groups = self.by_owner.remove(&owner).unwrap_or_default();
        for g in &groups {
            self.owner_of.remove(g);
        }
        self.epoch += u64::from(!groups.is_empty());
        groups
    }

    /// Frees one group. Returns it (empty if nobody held it).
    pub(crate) fn release_one(&mut self, group: &str) -> BTreeSet<String> {
        let Some(owner) = self.owner_of.remove(group) else {
            return BTreeSet::new();
        };
        self.epoch += 1;
        if let Some(set) = self.by_owner.get_mut(&owner) {
            set.remove(group);
            if set.is_empty() {
                self.by_owner.remove(&owner);
            }
        }
        BTreeSet::from([group.to_owned()])
    }

    /// The session holding `group`, if any.
    pub(crate) fn owner(&self, group: &str) -> Option<SessionId> {
        self.owner_of.get(group).copied()
    }

    pub(crate) fn len(&self) -> usize {
        self.owner_of.len()
    }

    /// A message of a held group is leased to no other session than the group's (a session-less
    /// receiver may hold one it got while the group was free).
    pub(crate) fn check_entry(&self, e: &Entry) {
        if let (
            Some(group),
            MessageState::Leased {
                owner: Some(owner), ..
            },
        ) = (&e.message.group_id, e.state)
        {
            if let Some(holder) = self.owner_of.get(group) {
                assert_eq!(
                    owner, *holder,
                    "a message of group {group} is leased outside the session holding it"
                );
            }
        }
        assert_eq!(
            self.owner_of.len(),
            self.by_owner.values().map(BTreeSet::len).sum::<usize>(),
            "group indexes agree"
        );
    }
}
