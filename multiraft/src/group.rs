//! One group on this node: its raft-rs `RawNode` over its [`GroupLog`], and what a round does
//! with its Ready.

use protobuf::Message as _;
use raft::eraftpb::{ConfChange as RaftConfChange, ConfChangeType, ConfState, Entry, EntryType};
use raft::{RawNode, StateRole};

use crate::config::EngineConfig;
use crate::error::Error;
use crate::group_log::{apply_state_op, GroupLog};
use crate::ids::{GroupId, LogPosition, NodeId};
use crate::logger::raft_logger;
use crate::round::{Apply, ConfChange, EntryKind, Role, RoleChange, RoundCx};

pub(crate) struct Group {
    pub(crate) id: GroupId,
    pub(crate) raw: RawNode<GroupLog>,
    /// Index of the last committed entry handed to the application.
    pub(crate) applied_index: u64,
    /// Configurations since the last compaction point known: (index where it took effect,
    /// configuration), oldest first; never empty.
    conf_history: Vec<(u64, ConfState)>,
    /// A snapshot installed but not yet durable: (ready number, snapshot index). Until then
    /// raft-rs's applied index lies below the new log start, and a campaign would read the
    /// compacted range (raft-rs aborts), so the group neither ticks nor campaigns.
    pub(crate) snapshot_pending: Option<(u64, u64)>,
}

impl std::fmt::Debug for Group {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Group")
            .field("id", &self.id)
            .field("applied_index", &self.applied_index)
            .finish_non_exhaustive()
    }
}

pub(crate) fn role_of(state: StateRole) -> Role {
    match state {
        StateRole::Follower => Role::Follower,
        StateRole::PreCandidate => Role::PreCandidate,
        StateRole::Candidate => Role::Candidate,
        StateRole::Leader => Role::Leader,
    }
}

fn leader_of(id: u64) -> Option<NodeId> {
    (id != raft::INVALID_ID).then_some(NodeId(id))
}

impl Group {
    pub(crate) fn new(
        config: &EngineConfig,
        id: GroupId,
        log: GroupLog,
        applied_index: u64,
    ) -> Result<Self, Error> {
        let conf_history = vec![(applied_index, log.applied_conf_state().clone())];
        let raft_config = config.raft_config(id, applied_index)?;
        let logger = raft_logger(config.node, id);
        let raw = RawNode::new(&raft_config, log, &logger).map_err(|e| Error::Raft {
            group: id,
            reason: e.to_string(),
        })?;
        let mut group = Group {
            id,
            raw,
            applied_index,
            conf_history,
            snapshot_pending: None,
        };
        group.fix_election_timeout(config);
        Ok(group)
    }

    /// Replaces raft-rs's thread-random election timeout with the engine's deterministic draw;
    /// called after every input that may have reset it.
    pub(crate) fn fix_election_timeout(&mut self, config: &EngineConfig) {
        let raft = &mut self.raw.raft;
        let role = role_of(raft.state) as u8;
        let ticks = config.election_timeout_ticks(self.id, raft.term, role);
        if raft.randomized_election_timeout() != ticks {
            raft.set_randomized_election_timeout(ticks);
        }
    }

    pub(crate) fn leader(&self) -> Option<NodeId> {
        leader_of(self.raw.raft.leader_id)
    }

    pub(crate) fn is_leader(&self) -> bool {
        self.raw.raft.state == StateRole::Leader
    }

    pub(crate) fn last_position(&self) -> LogPosition {
        LogPosition {
            index: self.raw.raft.raft_log.last_index(),
            term: self.raw.raft.term,
        }
    }

    /// The configuration in force at `index`, if known (at or after the oldest one kept).
    pub(crate) fn conf_state_at(&self, index: u64) -> Option<ConfState> {
        self.conf_history
            .iter()
            .rev()
            .find(|(from, _)| *from <= index)
            .map(|(_, conf)| conf.clone())
    }

    /// Forgets configurations older than the one in force at `index`.
    pub(crate) fn prune_conf_history(&mut self, index: u64) {
        let keep_from = self
            .conf_history
            .iter()
            .rposition(|(from, _)| *from <= index)
            .unwrap_or(0);
        self.conf_history.drain(..keep_from);
    }

    /// Takes the group's Ready, if any, into the round: messages, writes, applies, roles.
    pub(crate) fn collect_ready(&mut self, cx: &mut RoundCx) -> Result<(), Error> {
        if !self.raw.has_ready() {
            return Ok(());
        }
        let mut rd = self.raw.ready();
        if let Some(ss) = rd.ss() {
            cx.role_changes.push(RoleChange {
                group: self.id,
                role: role_of(ss.raft_state),
                term: self.raw.raft.term,
                leader: leader_of(ss.leader_id),
            });
        }
        for message in rd.take_messages() {
            cx.send(self.id, message);
        }
        if !rd.snapshot().is_empty() {
            self.install_snapshot(rd.snapshot().clone(), cx);
            self.snapshot_pending = Some((rd.number(), rd.snapshot().get_metadata().index));
        }
        self.raw.mut_store().append(rd.take_entries(), &mut cx.ops);
        if let Some(hs) = rd.hs() {
            self.raw.mut_store().set_hard_state(hs.clone(), &mut cx.ops);
        }
        let committed = rd.take_committed_entries();
        for message in rd.take_persisted_messages() {
            cx.hold(self.id, message);
        }
        cx.must_sync |= rd.must_sync();
        cx.ready_numbers.push((self.id, rd.number()));
        self.raw.advance_append_async(rd);
        self.apply_committed(committed, cx)
    }

    /// Ready `number` (and all before it) is durable.
    pub(crate) fn on_persisted(&mut self, number: u64) {
        self.raw.on_persist_ready(number);
        if let Some((ready, index)) = self.snapshot_pending {
            if ready <= number {
                self.snapshot_pending = None;
                if index > self.raw.raft.raft_log.applied() {
                    self.raw.advance_apply_to(index);
                }
            }
        }
    }

    fn install_snapshot(&mut self, snapshot: raft::eraftpb::Snapshot, cx: &mut RoundCx) {
        let meta = snapshot.get_metadata();
        let (index, term) = (meta.index, meta.term);
        let conf = meta.get_conf_state().clone();
        cx.applies.push(Apply::Snapshot {
            group: self.id,
            position: LogPosition { index, term },
            data: snapshot.data.clone(),
            voters: crate::ids::sorted_nodes(&conf.voters),
            learners: crate::ids::sorted_nodes(&conf.learners),
        });
        self.raw.mut_store().install_snapshot(snapshot, &mut cx.ops);
        self.applied_index = index;
        self.conf_history = vec![(index, conf)];
    }

    fn apply_committed(&mut self, committed: Vec<Entry>, cx: &mut RoundCx) -> Result<(), Error> {
        if committed.is_empty() {
            return Ok(());
        }
        for entry in committed {
            if entry.index <= self.applied_index {
                continue;
            }
            let kind = self.entry_kind(&entry)?;
            // A configuration change applied is synced with its commit: a node it removes may
            // stop for good once it applied it, and a node that forgot, at a power loss, that
            // the change committed could need that node's vote to commit it again.
            cx.must_sync |= !matches!(kind, EntryKind::Normal(_));
            self.applied_index = entry.index;
            cx.applies.push(Apply::Entry {
                group: self.id,
                position: LogPosition {
                    index: entry.index,
                    term: entry.term,
                },
                kind,
            });
        }
        let conf = self.raw.store().applied_conf_state().clone();
        cx.ops
            .push(apply_state_op(self.id, self.applied_index, &conf));
        if self.applied_index > self.raw.raft.raft_log.applied() {
            self.raw.advance_apply_to(self.applied_index);
        }
        Ok(())
    }

    /// What a committed entry is; configuration changes take effect here.
    fn entry_kind(&mut self, entry: &Entry) -> Result<EntryKind, Error> {
        let raft_error = |e: raft::Error| Error::Raft {
            group: self.id,
            reason: e.to_string(),
        };
        let (change, conf) = match entry.get_entry_type() {
            EntryType::EntryNormal => return Ok(EntryKind::Normal(entry.data.clone())),
            EntryType::EntryConfChange => {
                let mut cc = RaftConfChange::default();
                cc.merge_from_bytes(&entry.data)
                    .map_err(|e| raft_error(raft::Error::CodecError(e)))?;
                let conf = self.raw.apply_conf_change(&cc).map_err(raft_error)?;
                (Some(ConfChange::from_raft(&cc)), conf)
            }
            EntryType::EntryConfChangeV2 => {
                let mut cc = raft::eraftpb::ConfChangeV2::default();
                cc.merge_from_bytes(&entry.data)
                    .map_err(|e| raft_error(raft::Error::CodecError(e)))?;
                (None, self.raw.apply_conf_change(&cc).map_err(raft_error)?)
            }
        };
        self.step_down_if_removed(&conf);
        self.conf_history.push((entry.index, conf.clone()));
        self.raw.mut_store().set_applied_conf_state(conf.clone());
        let voters = crate::ids::sorted_nodes(&conf.voters);
        let learners = crate::ids::sorted_nodes(&conf.learners);
        Ok(match change {
            Some(change) => EntryKind::ConfChange {
                change,
                voters,
                learners,
            },
            None => EntryKind::ConfTransition { voters, learners },
        })
    }
}

impl Group {
    /// raft-rs 0.7 leaves a leader that applied its own removal leading, and panics at its
    /// next commit (its own progress is gone). It steps down here instead, in the same term;
    /// the remaining voters elect a leader after an election timeout.
    fn step_down_if_removed(&mut self, conf: &ConfState) {
        let raft = &mut self.raw.raft;
        if raft.state == StateRole::Leader && !conf.voters.contains(&raft.id) {
            let term = raft.term;
            raft.become_follower(term, raft::INVALID_ID);
        }
    }
}

/// Marks a `PromoteLearner` in the conf change's context: raft-rs promotes with `AddNode`.
const PROMOTE_CONTEXT: &[u8] = b"promote";

impl ConfChange {
    pub(crate) fn to_raft(self) -> RaftConfChange {
        let mut cc = RaftConfChange::default();
        let (kind, node) = match self {
            ConfChange::AddVoter(n) => (ConfChangeType::AddNode, n),
            ConfChange::AddLearner(n) => (ConfChangeType::AddLearnerNode, n),
            ConfChange::PromoteLearner(n) => {
                cc.context = PROMOTE_CONTEXT.to_vec();
                (ConfChangeType::AddNode, n)
            }
            ConfChange::Remove(n) => (ConfChangeType::RemoveNode, n),
        };
        cc.set_change_type(kind);
        cc.node_id = node.0;
        cc
    }

    fn from_raft(cc: &RaftConfChange) -> Self {
        let node = NodeId(cc.node_id);
        match cc.get_change_type() {
            ConfChangeType::AddNode if cc.context == PROMOTE_CONTEXT => {
                ConfChange::PromoteLearner(node)
            }
            ConfChangeType::AddNode => ConfChange::AddVoter(node),
            ConfChangeType::AddLearnerNode => ConfChange::AddLearner(node),
            ConfChangeType::RemoveNode => ConfChange::Remove(node),
        }
    }
}
