//! One group's Raft log in memory: the raft-rs `Storage` view, and the source of the key/value
//! operations that make each change durable.
//!
//! The whole live log (from the last compaction on) is cached: raft-rs reads only from here, the
//! store is written and read back at start only. The application bounds the cache with
//! [`crate::Engine::compact`].

use std::cell::Cell;

use raft::eraftpb::{ConfState, Entry, HardState, Snapshot};
use raft::{GetEntriesContext, RaftState, StorageError};

use crate::ids::GroupId;
use crate::keys::{self, KvOp};

#[derive(Debug)]
pub(crate) struct GroupLog {
    group: GroupId,
    hard_state: HardState,
    /// Configuration at the applied index: what raft-rs starts from.
    conf_state: ConfState,
    /// The latest snapshot; its index is `first_index() - 1`.
    snapshot: Snapshot,
    /// `entries[0].index == snapshot index + 1`.
    entries: Vec<Entry>,
    /// raft-rs asked for a snapshot for a peer the latest one does not include (it was added
    /// after): the application must make a new one ([`crate::Round::snapshot_requests`]).
    snapshot_wanted: Cell<bool>,
}

/// Everything stored for a group, as read back at start.
#[derive(Debug, Default)]
pub(crate) struct GroupRecord {
    pub(crate) hard_state: HardState,
    pub(crate) applied_index: u64,
    pub(crate) conf_state: ConfState,
    pub(crate) snapshot: Snapshot,
    pub(crate) entries: Vec<Entry>,
}

pub(crate) fn encode<M: protobuf::Message>(message: &M) -> Vec<u8> {
    message
        .write_to_bytes()
        .expect("invariant: encoding a raft-rs message into a Vec cannot fail")
}

/// The apply state record: applied index, then the configuration at that index.
pub(crate) fn apply_state_op(group: GroupId, applied_index: u64, conf_state: &ConfState) -> KvOp {
    let mut value = applied_index.to_be_bytes().to_vec();
    value.extend_from_slice(&encode(conf_state));
    keys::put_raft(keys::record_key(group, keys::KIND_APPLY_STATE), value)
}

impl GroupLog {
    pub(crate) fn from_record(group: GroupId, record: GroupRecord) -> Self {
        GroupLog {
            group,
            hard_state: record.hard_state,
            conf_state: record.conf_state,
            snapshot: record.snapshot,
            entries: record.entries,
            snapshot_wanted: Cell::new(false),
        }
    }

    /// A group started from a snapshot at index 1, term 1 holding the initial voters, with
    /// the records that make it durable. Every initial voter bootstraps the same way; nodes
    /// added later start empty and receive a snapshot from the leader, which carries the
    /// configuration.
    pub(crate) fn bootstrap(group: GroupId, voters: &[u64], ops: &mut Vec<KvOp>) -> Self {
        let mut snapshot = Snapshot::default();
        snapshot.mut_metadata().index = 1;
        snapshot.mut_metadata().term = 1;
        snapshot.mut_metadata().mut_conf_state().voters = voters.to_vec();
        let conf_state = snapshot.get_metadata().get_conf_state().clone();
        let hard_state = HardState {
            term: 1,
            commit: 1,
            ..HardState::default()
        };
        ops.push(keys::put_raft(
            keys::record_key(group, keys::KIND_SNAPSHOT),
            encode(&snapshot),
        ));
        ops.push(keys::put_raft(
            keys::record_key(group, keys::KIND_HARD_STATE),
            encode(&hard_state),
        ));
        ops.push(apply_state_op(group, 1, &conf_state));
        GroupLog {
            group,
            hard_state,
            conf_state,
            snapshot,
            entries: Vec::new(),
            snapshot_wanted: Cell::new(false),
        }
    }

    /// An empty group waiting for a snapshot from its leader; its apply state record makes it
    /// known at the next start.
    pub(crate) fn empty(group: GroupId, ops: &mut Vec<KvOp>) -> Self {
        ops.push(apply_state_op(group, 0, &ConfState::default()));
        GroupLog {
            group,
            hard_state: HardState::default(),
            conf_state: ConfState::default(),
            snapshot: Snapshot::default(),
            entries: Vec::new(),
            snapshot_wanted: Cell::new(false),
        }
    }

    /// Whether raft-rs asked for a newer snapshot since the last call.
    pub(crate) fn take_snapshot_wanted(&self) -> bool {
        self.snapshot_wanted.replace(false)
    }

    pub(crate) fn snapshot_index(&self) -> u64 {
        self.snapshot.get_metadata().index
    }

    pub(crate) fn first_index(&self) -> u64 {
        self.snapshot_index() + 1
    }

    pub(crate) fn last_index(&self) -> u64 {
        self.snapshot_index() + self.entries.len() as u64
    }

    pub(crate) fn entry_count(&self) -> usize {
        self.entries.len()
    }

    /// Term of the entry at `index`, if it is the snapshot's or in the log.
    pub(crate) fn term_of(&self, index: u64) -> Option<u64> {
        if index == self.snapshot_index() {
            return Some(self.snapshot.get_metadata().term);
        }
        let offset = index.checked_sub(self.first_index())?;
        self.entries
            .get(usize::try_from(offset).ok()?)
            .map(|e| e.term)
    }

    /// Appends entries from a Ready, replacing any conflicting suffix.
    pub(crate) fn append(&mut self, entries: Vec<Entry>, ops: &mut Vec<KvOp>) {
        let Some(first) = entries.first().map(|e| e.index) else {
            return;
        };
        let old_last = self.last_index();
        let keep = usize::try_from(first.saturating_sub(self.first_index())).unwrap_or(usize::MAX);
        self.entries.truncate(keep);
        for entry in &entries {
            ops.push(keys::put_raft(
                keys::entry_key(self.group, entry.index),
                encode(entry),
            ));
        }
        self.entries.extend(entries);
        let new_last = self.last_index();
        if old_last > new_last {
            ops.push(keys::delete_entries(self.group, new_last + 1, old_last + 1));
        }
    }

    pub(crate) fn set_hard_state(&mut self, hard_state: HardState, ops: &mut Vec<KvOp>) {
        ops.push(keys::put_raft(
            keys::record_key(self.group, keys::KIND_HARD_STATE),
            encode(&hard_state),
        ));
        self.hard_state = hard_state;
    }

    /// Installs a snapshot received from the leader: the log restarts after it.
    pub(crate) fn install_snapshot(&mut self, snapshot: Snapshot, ops: &mut Vec<KvOp>) {
        let meta = snapshot.get_metadata();
        self.hard_state.commit = self.hard_state.commit.max(meta.index);
        self.hard_state.term = self.hard_state.term.max(meta.term);
        self.conf_state = meta.get_conf_state().clone();
        self.entries.clear();
        ops.push(keys::delete_entries(self.group, 0, u64::MAX));
        ops.push(keys::put_raft(
            keys::record_key(self.group, keys::KIND_SNAPSHOT),
            encode(&snapshot),
        ));
        ops.push(apply_state_op(self.group, meta.index, &self.conf_state));
        self.snapshot = snapshot;
    }

    /// Records the configuration at the applied index (for raft-rs's next start).
    pub(crate) fn set_applied_conf_state(&mut self, conf_state: ConfState) {
        self.conf_state = conf_state;
    }

    pub(crate) fn applied_conf_state(&self) -> &ConfState {
        &self.conf_state
    }

    /// Replaces the log up to `index` (applied, in the log) with a snapshot of the state
    /// machine at that index.
    pub(crate) fn compact(
        &mut self,
        index: u64,
        conf_state: ConfState,
        data: Vec<u8>,
        ops: &mut Vec<KvOp>,
    ) -> Option<()> {
        let term = self.term_of(index)?;
        let first = self.first_index();
        let drop_count = usize::try_from(index.checked_sub(self.snapshot_index())?).ok()?;
        let mut snapshot = Snapshot {
            data,
            ..Snapshot::default()
        };
        snapshot.mut_metadata().index = index;
        snapshot.mut_metadata().term = term;
        *snapshot.mut_metadata().mut_conf_state() = conf_state;
        ops.push(keys::put_raft(
            keys::record_key(self.group, keys::KIND_SNAPSHOT),
            encode(&snapshot),
        ));
        ops.push(keys::delete_entries(self.group, first, index + 1));
        self.entries.drain(..drop_count);
        self.snapshot = snapshot;
        Some(())
    }
}

impl raft::Storage for GroupLog {
    fn initial_state(&self) -> raft::Result<RaftState> {
        Ok(RaftState::new(
            self.hard_state.clone(),
            self.conf_state.clone(),
        ))
    }

    fn entries(
        &self,
        low: u64,
        high: u64,
        max_size: impl Into<Option<u64>>,
        _context: GetEntriesContext,
    ) -> raft::Result<Vec<Entry>> {
        if low < self.first_index() {
            return Err(raft::Error::Store(StorageError::Compacted));
        }
        if high > self.last_index() + 1 || low > high {
            return Err(raft::Error::Store(StorageError::Unavailable));
        }
        let from = (low - self.first_index()) as usize;
        let to = (high - self.first_index()) as usize;
        let mut entries = self.entries[from..to].to_vec();
        raft::util::limit_size(&mut entries, max_size.into());
        Ok(entries)
    }

    fn term(&self, idx: u64) -> raft::Result<u64> {
        if idx < self.snapshot_index() {
            return Err(raft::Error::Store(StorageError::Compacted));
        }
        self.term_of(idx)
            .ok_or(raft::Error::Store(StorageError::Unavailable))
    }

    fn first_index(&self) -> raft::Result<u64> {
        Ok(GroupLog::first_index(self))
    }

    fn last_index(&self) -> raft::Result<u64> {
        Ok(GroupLog::last_index(self))
    }

    /// The latest snapshot, unless it predates `to` joining the group: then the application
    /// is asked for a new one and raft-rs retries later.
    fn snapshot(&self, _request_index: u64, to: u64) -> raft::Result<Snapshot> {
        let conf = self.snapshot.get_metadata().get_conf_state();
        let members = [
            &conf.voters,
            &conf.learners,
            &conf.voters_outgoing,
            &conf.learners_next,
        ];
        if members.iter().any(|m| m.contains(&to)) {
            return Ok(self.snapshot.clone());
        }
        self.snapshot_wanted.set(true);
        Err(raft::Error::Store(
            StorageError::SnapshotTemporarilyUnavailable,
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use raft::Storage as _;

    fn entry(index: u64, term: u64) -> Entry {
        Entry {
            index,
            term,
            ..Entry::default()
        }
    }

    #[test]
    fn a_conflicting_append_replaces_the_tail_and_deletes_its_records() {
        let mut ops = Vec::new();
        let mut log = GroupLog::bootstrap(GroupId(3), &[1, 2, 3], &mut ops);
        log.append((2..=6).map(|i| entry(i, 1)).collect(), &mut ops);
        assert_eq!((log.first_index(), log.last_index()), (2, 6));
        ops.clear();
        log.append(vec![entry(4, 2)], &mut ops);
        assert_eq!(log.last_index(), 4);
        assert_eq!(log.term(4).unwrap(), 2);
        assert_eq!(log.term(1).unwrap(), 1, "the snapshot's term");
        assert_eq!(ops.last(), Some(&keys::delete_entries(GroupId(3), 5, 7)));
    }

    #[test]
    fn compaction_keeps_the_term_of_the_compacted_index() {
        let mut ops = Vec::new();
        let mut log = GroupLog::bootstrap(GroupId(0), &[1], &mut ops);
        log.append((2..=10).map(|i| entry(i, 2)).collect(), &mut ops);
        log.compact(7, ConfState::default(), b"state".to_vec(), &mut ops)
            .unwrap();
        assert_eq!((log.first_index(), log.last_index()), (8, 10));
        assert_eq!(log.term(7).unwrap(), 2);
        assert!(log
            .entries(7, 9, None, GetEntriesContext::empty(false))
            .is_err());
        assert_eq!(
            log.entries(8, 11, None, GetEntriesContext::empty(false))
                .unwrap()
                .len(),
            3
        );
        assert!(log
            .compact(11, ConfState::default(), vec![], &mut ops)
            .is_none());
    }
}
