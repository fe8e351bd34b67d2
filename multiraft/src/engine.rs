//! The per-node engine: every group hosted here, driven by explicit inputs, and the round that
//! gathers their output.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use protobuf::Message as _;
use raft::eraftpb::{Message, MessageType};
use raft::{SnapshotStatus, StateRole};

use crate::codec::decode_batch;
use crate::config::EngineConfig;
use crate::error::Error;
use crate::group::{role_of, Group};
use crate::group_log::GroupLog;
use crate::ids::{GroupId, LogPosition, NodeId, PersistId};
use crate::keys::{self, KvOp};
use crate::persist::PersistJob;
use crate::round::{ConfChange, HeldMessage, Role, Round, RoundCx};
use crate::storage::Recovered;

/// Most unknown groups remembered between two [`Engine::take_unknown_groups`] calls.
const UNKNOWN_GROUPS_MAX: usize = 1024;

/// A snapshot of one group's state on this node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupStatus {
    /// This node's role.
    pub role: Role,
    /// Current term.
    pub term: u64,
    /// The leader known, if any.
    pub leader: Option<NodeId>,
    /// Highest index known committed.
    pub commit_index: u64,
    /// Highest index handed to the application.
    pub applied_index: u64,
    /// First index still in the log (after the last compaction).
    pub first_index: u64,
    /// Last index in the log.
    pub last_index: u64,
    /// Voters in force (as of the last applied configuration change).
    pub voters: Vec<NodeId>,
    /// Learners in force.
    pub learners: Vec<NodeId>,
}

/// What the leader of a group knows of its other voters ([`Engine::leader_progress`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaderProgress {
    /// The leader's last log index.
    pub last_index: u64,
    /// The voter a leadership transfer is under way to.
    pub transferring_to: Option<NodeId>,
    /// Every other voter, in node order.
    pub followers: Vec<FollowerProgress>,
}

/// One voter as its group's leader knows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FollowerProgress {
    /// The voter.
    pub node: NodeId,
    /// The last index it acknowledged having (0: nothing since this leader was elected).
    pub match_index: u64,
    /// Heard from within the last election timeout.
    pub recently_active: bool,
}

/// A persistence job handed out and not yet reported durable.
#[derive(Debug)]
struct InFlight {
    id: PersistId,
    ready_numbers: Vec<(GroupId, u64)>,
    held: Vec<HeldMessage>,
}

/// Many Raft groups on one node. Sans-I/O: no clock, no threads, no disk, no network.
#[derive(Debug)]
pub struct Engine {
    config: EngineConfig,
    groups: BTreeMap<GroupId, Group>,
    /// Writes made outside a round (bootstrap, compaction, removal), for the next job.
    pending_ops: Vec<KvOp>,
    in_flight: VecDeque<InFlight>,
    next_persist_id: u64,
    /// Messages whose writes became durable, to send next round.
    released: Vec<HeldMessage>,
    /// Groups that peers sent messages for but this node does not host.
    unknown_groups: BTreeSet<GroupId>,
}

/// Room for a message's headers (terms, indexes, commit, context) beside its entries' bytes.
const BATCH_HEADROOM_BYTES: u64 = 64 * 1024;

impl Engine {
    /// An engine resuming from a store's durable state (empty for a new node).
    pub fn open(config: EngineConfig, recovered: Recovered) -> Result<Self, Error> {
        if config.node.0 == 0 {
            return Err(Error::InvalidConfig {
                reason: "node id 0 is reserved; give the node an id from 1".to_owned(),
            });
        }
        let message_max = config
            .max_size_per_msg_bytes
            .saturating_add(BATCH_HEADROOM_BYTES);
        if (config.batch_bytes_max as u64) < message_max {
            return Err(Error::InvalidConfig {
                reason: format!(
                    "batch_bytes_max ({}) must hold the largest append message \
                     (max_size_per_msg_bytes {} plus {BATCH_HEADROOM_BYTES} bytes of headers)",
                    config.batch_bytes_max, config.max_size_per_msg_bytes
                ),
            });
        }
        let mut engine = Engine {
            config,
            groups: BTreeMap::new(),
            pending_ops: Vec::new(),
            in_flight: VecDeque::new(),
            next_persist_id: 1,
            released: Vec::new(),
            unknown_groups: BTreeSet::new(),
        };
        for (id, record) in recovered.groups {
            let applied = record.applied_index;
            let log = GroupLog::from_record(id, record);
            let group = Group::new(&engine.config, id, log, applied)?;
            engine.groups.insert(id, group);
        }
        Ok(engine)
    }

    /// This node.
    pub fn node(&self) -> NodeId {
        self.config.node
    }

    /// The groups hosted here.
    pub fn group_ids(&self) -> Vec<GroupId> {
        self.groups.keys().copied().collect()
    }

    /// Creates a group whose initial voters are `voters`. Every initial voter calls this with
    /// the same set; nodes added later use [`Engine::create_group`] instead. The records go
    /// into the next round's job: write it before telling anyone the group exists (a crash
    /// before that loses the group).
    pub fn bootstrap_group(&mut self, group: GroupId, voters: &[NodeId]) -> Result<(), Error> {
        if voters.is_empty() || voters.iter().any(|v| v.0 == 0) {
            return Err(Error::InvalidVoters {
                group,
                voters: voters.iter().map(|v| v.0).collect(),
            });
        }
        let ids: Vec<u64> = voters.iter().map(|v| v.0).collect();
        let mut ops = Vec::new();
        let log = GroupLog::bootstrap(group, &ids, &mut ops);
        self.insert_group(group, log, 1, ops)
    }

    /// Creates an empty group on a node about to be added to it by a configuration change; it
    /// fills from the leader's snapshot.
    pub fn create_group(&mut self, group: GroupId) -> Result<(), Error> {
        let mut ops = Vec::new();
        let log = GroupLog::empty(group, &mut ops);
        self.insert_group(group, log, 0, ops)
    }

    fn insert_group(
        &mut self,
        id: GroupId,
        log: GroupLog,
        applied: u64,
        ops: Vec<KvOp>,
    ) -> Result<(), Error> {
        if self.groups.contains_key(&id) {
            return Err(Error::GroupExists { group: id });
        }
        let group = Group::new(&self.config, id, log, applied)?;
        self.groups.insert(id, group);
        self.pending_ops.extend(ops);
        self.unknown_groups.remove(&id);
        Ok(())
    }

    /// Drops a group from this node (after it was removed from its configuration) and deletes
    /// its records in the next job.
    pub fn remove_group(&mut self, group: GroupId) -> Result<(), Error> {
        self.groups
            .remove(&group)
            .ok_or(Error::GroupNotFound { group })?;
        self.pending_ops.push(keys::delete_group(group));
        Ok(())
    }

    fn group_mut(&mut self, group: GroupId) -> Result<&mut Group, Error> {
        self.groups
            .get_mut(&group)
            .ok_or(Error::GroupNotFound { group })
    }

    /// A batch received from peer `from`. The whole batch is decoded and checked first: if any
    /// message is malformed or misaddressed nothing is stepped. Messages for groups not hosted
    /// here are dropped and listed by [`Engine::take_unknown_groups`].
    pub fn step(&mut self, from: NodeId, batch: &[u8]) -> Result<(), Error> {
        let raw = decode_batch(batch).map_err(|e| match e {
            Error::BadBatch { reason, offset, .. } => Error::BadBatch {
                from,
                reason,
                offset,
            },
            other => other,
        })?;
        let mut messages = Vec::with_capacity(raw.len());
        for (group, bytes) in raw {
            messages.push((group, self.check_message(from, group, bytes)?));
        }
        for (group, message) in messages {
            let Some(g) = self.groups.get_mut(&group) else {
                if self.unknown_groups.len() < UNKNOWN_GROUPS_MAX {
                    self.unknown_groups.insert(group);
                }
                continue;
            };
            if g.snapshot_pending.is_some() && message.get_msg_type() == MessageType::MsgTimeoutNow
            {
                // No campaign while a snapshot is not durable (see `Group::snapshot_pending`);
                // the leader transfer times out and the old leader keeps leading.
                continue;
            }
            // raft-rs refuses messages from peers it no longer knows; that is not the
            // sender's fault nor ours.
            let _ = g.raw.step(message);
            g.fix_election_timeout(&self.config);
        }
        Ok(())
    }

    fn check_message(&self, from: NodeId, group: GroupId, bytes: &[u8]) -> Result<Message, Error> {
        let bad = |reason: String| Error::BadMessage {
            from,
            group,
            reason,
        };
        let mut message = Message::default();
        message
            .merge_from_bytes(bytes)
            .map_err(|e| bad(format!("undecodable: {e}")))?;
        if message.from != from.0 {
            return Err(bad(format!("claims to be from node {}", message.from)));
        }
        if message.to != self.config.node.0 {
            return Err(bad(format!("addressed to node {}", message.to)));
        }
        if raft::raw_node::is_local_msg(message.get_msg_type()) {
            return Err(bad(format!(
                "local message type {:?}",
                message.get_msg_type()
            )));
        }
        Ok(message)
    }

    /// Groups that peers sent messages for but this node does not host, since the last call.
    pub fn take_unknown_groups(&mut self) -> Vec<GroupId> {
        std::mem::take(&mut self.unknown_groups)
            .into_iter()
            .collect()
    }

    /// One logical clock tick for every group.
    pub fn tick(&mut self) {
        for group in self.groups.values_mut() {
            // No campaign while a snapshot is not durable (see `Group::snapshot_pending`).
            if group.snapshot_pending.is_none() {
                group.raw.tick();
                group.fix_election_timeout(&self.config);
            }
        }
    }

    /// Proposes `data` to a group this node leads; returns where it was appended (it is
    /// committed when an [`crate::Apply::Entry`] with this position comes out of a round).
    pub fn propose(&mut self, group: GroupId, data: Vec<u8>) -> Result<LogPosition, Error> {
        let g = self.leader_group(group)?;
        g.raw
            .propose(Vec::new(), data)
            .map_err(|e| Error::ProposalDropped {
                group,
                reason: e.to_string(),
            })?;
        Ok(g.last_position())
    }

    /// Proposes a membership change to a group this node leads. One at a time: raft-rs drops
    /// a second one while the first is not applied.
    pub fn propose_conf_change(
        &mut self,
        group: GroupId,
        change: ConfChange,
    ) -> Result<LogPosition, Error> {
        let g = self.leader_group(group)?;
        let before = g.raw.raft.raft_log.last_index();
        g.raw
            .propose_conf_change(Vec::new(), change.to_raft())
            .map_err(|e| Error::ProposalDropped {
                group,
                reason: e.to_string(),
            })?;
        // raft-rs turns a refused conf change into an empty entry rather than an error.
        if g.raw.raft.pending_conf_index <= before {
            return Err(Error::ProposalDropped {
                group,
                reason: "another configuration change is pending".to_owned(),
            });
        }
        Ok(g.last_position())
    }

    fn leader_group(&mut self, group: GroupId) -> Result<&mut Group, Error> {
        let g = self.group_mut(group)?;
        if !g.is_leader() {
            return Err(Error::NotLeader {
                group,
                leader: g.leader(),
            });
        }
        Ok(g)
    }

    /// Asks this node to campaign in a group now (tests, or a preferred leader).
    pub fn campaign(&mut self, group: GroupId) -> Result<(), Error> {
        let config = self.config.clone();
        let g = self.group_mut(group)?;
        if g.snapshot_pending.is_some() {
            return Err(Error::Raft {
                group,
                reason: "a snapshot is being persisted; campaign after it".to_owned(),
            });
        }
        g.raw.campaign().map_err(|e| Error::Raft {
            group,
            reason: e.to_string(),
        })?;
        g.fix_election_timeout(&config);
        Ok(())
    }

    /// Asks the leader of a group to hand leadership to `to`, a voter of it. raft-rs brings
    /// `to`'s log up to date, then tells it to campaign at once; the transfer is abandoned
    /// after one election timeout, and proposals are dropped while it is under way. Refused
    /// when this node does not lead the group or `to` is not one of its other voters.
    pub fn transfer_leader(&mut self, group: GroupId, to: NodeId) -> Result<(), Error> {
        let me = self.config.node;
        let g = self.leader_group(group)?;
        if to == me || !g.raw.raft.prs().conf().voters().contains(to.0) {
            return Err(Error::Raft {
                group,
                reason: format!("node {} is not another voter of the group", to.0),
            });
        }
        g.raw.transfer_leader(to.0);
        Ok(())
    }

    /// The transport lost its stream to `node`: every group probes it again.
    pub fn report_unreachable(&mut self, node: NodeId) {
        for group in self.groups.values_mut() {
            group.raw.report_unreachable(node.0);
        }
    }

    /// Replaces a group's log up to `applied_index` with `snapshot_data`, the application's
    /// state at that index; later followers too far behind get it as a snapshot. Written in
    /// the next job.
    pub fn compact(
        &mut self,
        group: GroupId,
        applied_index: u64,
        snapshot_data: Vec<u8>,
    ) -> Result<(), Error> {
        let invalid = |reason| Error::InvalidCompaction {
            group,
            index: applied_index,
            reason,
        };
        let g = self
            .groups
            .get_mut(&group)
            .ok_or(Error::GroupNotFound { group })?;
        if applied_index > g.applied_index {
            return Err(invalid("not applied yet"));
        }
        if applied_index <= g.raw.store().snapshot_index() {
            return Err(invalid("already compacted"));
        }
        let conf = g.conf_state_at(applied_index).ok_or_else(|| {
            invalid(
                "configuration at that index unknown since restart; compact at the applied index",
            )
        })?;
        g.raw
            .mut_store()
            .compact(applied_index, conf, snapshot_data, &mut self.pending_ops)
            .ok_or_else(|| invalid("index not in the log"))?;
        g.prune_conf_history(applied_index);
        Ok(())
    }

    /// The state of one group, or `None` if not hosted here.
    pub fn status(&self, group: GroupId) -> Option<GroupStatus> {
        let g = self.groups.get(&group)?;
        let raft = &g.raw.raft;
        let conf = g.raw.store().applied_conf_state();
        Some(GroupStatus {
            role: role_of(raft.state),
            term: raft.term,
            leader: g.leader(),
            commit_index: raft.raft_log.committed,
            applied_index: g.applied_index,
            first_index: g.raw.store().first_index(),
            last_index: raft.raft_log.last_index(),
            voters: crate::ids::sorted_nodes(&conf.voters),
            learners: crate::ids::sorted_nodes(&conf.learners),
        })
    }

    /// As the leader of `group`: how far each other member's log is known to match this
    /// node's, as (member, match index) in member order, from raft-rs's progress tracker.
    /// `None` unless this node leads `group`. A member that has not acknowledged anything since
    /// this node was elected shows 0 (a leader starts knowing nothing of the others' logs).
    pub fn match_indexes(&self, group: GroupId) -> Option<Vec<(NodeId, u64)>> {
        let g = self.groups.get(&group)?;
        if !g.is_leader() {
            return None;
        }
        let me = self.config.node;
        let mut matched: Vec<(NodeId, u64)> = g
            .raw
            .raft
            .prs()
            .iter()
            .map(|(id, p)| (NodeId(*id), p.matched))
            .filter(|(id, _)| *id != me)
            .collect();
        matched.sort_unstable();
        Some(matched)
    }

    /// As the leader of `group`: each other voter's progress (match index and whether it was
    /// heard from within the last election timeout, which `check_quorum` tracks) and the node
    /// a leadership transfer is under way to, if any. `None` unless this node leads `group`.
    pub fn leader_progress(&self, group: GroupId) -> Option<LeaderProgress> {
        let g = self.groups.get(&group)?;
        if !g.is_leader() {
            return None;
        }
        let me = self.config.node;
        let voters = g.raw.raft.prs().conf().voters();
        let mut followers: Vec<FollowerProgress> = g
            .raw
            .raft
            .prs()
            .iter()
            .filter(|(id, _)| NodeId(**id) != me && voters.contains(**id))
            .map(|(id, p)| FollowerProgress {
                node: NodeId(*id),
                match_index: p.matched,
                recently_active: p.recent_active,
            })
            .collect();
        followers.sort_unstable_by_key(|f| f.node);
        Some(LeaderProgress {
            last_index: g.raw.raft.raft_log.last_index(),
            transferring_to: g.raw.raft.lead_transferee.map(NodeId),
            followers,
        })
    }

    /// Entries held in memory across all groups (bounded by compaction).
    pub fn cached_entry_count(&self) -> usize {
        self.groups
            .values()
            .map(|g| g.raw.store().entry_count())
            .sum()
    }

    /// Whether a round now would produce anything.
    pub fn has_ready(&self) -> bool {
        !self.released.is_empty()
            || !self.pending_ops.is_empty()
            || self.groups.values().any(|g| g.raw.has_ready())
    }

    /// Jobs handed out and not yet reported durable.
    pub fn in_flight_job_count(&self) -> usize {
        self.in_flight.len()
    }

    /// Groups this node leads.
    pub fn leader_count(&self) -> usize {
        self.groups
            .values()
            .filter(|g| g.raw.raft.state == StateRole::Leader)
            .count()
    }

    /// The job `job` (and every earlier one) is durable: raft-rs learns it, and the messages
    /// that waited for it go out in the next round.
    pub fn on_persisted(&mut self, job: PersistId) -> Result<(), Error> {
        let expected = self.in_flight.front().map(|f| f.id);
        if !self.in_flight.iter().any(|f| f.id == job) {
            return Err(Error::UnknownPersistJob { job, expected });
        }
        while self.in_flight.front().is_some_and(|f| f.id <= job) {
            let Some(done) = self.in_flight.pop_front() else {
                break;
            };
            self.persisted(done.ready_numbers);
            self.released.extend(done.held);
        }
        Ok(())
    }

    fn persisted(&mut self, ready_numbers: Vec<(GroupId, u64)>) {
        for (group, number) in ready_numbers {
            // A group removed meanwhile has nothing left to learn.
            if let Some(g) = self.groups.get_mut(&group) {
                g.on_persisted(number);
            }
        }
    }

    /// Gathers every group's Ready into one [`Round`]; see the crate docs for what the shell
    /// does with it. Call it after each batch of inputs, and again while
    /// [`Engine::has_ready`] is true.
    pub fn round(&mut self) -> Round {
        // A group created, removed or compacted is synced like raft-rs's own records.
        let ops = std::mem::take(&mut self.pending_ops);
        let mut cx = RoundCx {
            must_sync: !ops.is_empty(),
            ops,
            ..RoundCx::default()
        };
        cx.release(std::mem::take(&mut self.released));
        for group in self.groups.values_mut() {
            if let Err(e) = group.collect_ready(&mut cx) {
                tracing::error!(group = group.id.0, error = %e, "applying a committed entry failed");
            }
        }
        let persist = self.persist_job(&mut cx);
        for (group, to) in std::mem::take(&mut cx.snapshots_sent) {
            // Reported as delivered once handed to the transport: if it is lost, the follower's
            // rejection or silence makes the leader probe and send it again.
            if let Some(g) = self.groups.get_mut(&group) {
                g.raw.report_snapshot(to, SnapshotStatus::Finish);
            }
        }
        let snapshot_requests = self
            .groups
            .values()
            .filter(|g| g.raw.store().take_snapshot_wanted())
            .map(|g| g.id)
            .collect();
        Round {
            persist,
            batches: RoundCx::batches(std::mem::take(&mut cx.outbox), self.config.batch_bytes_max),
            snapshots: std::mem::take(&mut cx.snapshots),
            applies: cx.applies,
            role_changes: cx.role_changes,
            snapshot_requests,
        }
    }

    /// The round's job, or, when it writes nothing, its held messages and ready numbers
    /// attached to the last job in flight (or released now if none is).
    fn persist_job(&mut self, cx: &mut RoundCx) -> Option<PersistJob> {
        let ready_numbers = std::mem::take(&mut cx.ready_numbers);
        let held = std::mem::take(&mut cx.held);
        if cx.ops.is_empty() {
            if let Some(last) = self.in_flight.back_mut() {
                last.ready_numbers.extend(ready_numbers);
                last.held.extend(held);
            } else {
                self.persisted(ready_numbers);
                cx.release(held);
            }
            return None;
        }
        let id = PersistId(self.next_persist_id);
        self.next_persist_id += 1;
        self.in_flight.push_back(InFlight {
            id,
            ready_numbers,
            held,
        });
        Some(PersistJob {
            id,
            ops: std::mem::take(&mut cx.ops),
            must_sync: cx.must_sync,
            attached: Vec::new(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codec::encode_batch;
    use crate::group_log::encode;

    fn engine(node: u64) -> Engine {
        let mut engine =
            Engine::open(EngineConfig::new(NodeId(node)), Recovered::default()).expect("engine");
        engine
            .bootstrap_group(GroupId(1), &[NodeId(1), NodeId(2)])
            .expect("bootstrap");
        engine
    }

    fn heartbeat(from: u64, to: u64) -> Vec<u8> {
        let mut m = Message::default();
        m.set_msg_type(MessageType::MsgHeartbeat);
        m.from = from;
        m.to = to;
        m.term = 1;
        encode(&m)
    }

    #[test]
    fn a_batch_cap_below_the_largest_message_is_refused_saying_why() {
        let config = EngineConfig {
            batch_bytes_max: 1024 * 1024,
            ..EngineConfig::new(NodeId(1))
        };
        let Err(e) = Engine::open(config, Recovered::default()) else {
            panic!("opened");
        };
        assert!(e.to_string().contains("batch_bytes_max"), "{e}");
    }

    #[test]
    fn a_batch_with_garbage_or_misaddressed_messages_is_refused_whole() {
        let mut e = engine(1);
        let good = heartbeat(2, 1);
        let garbage = [0xffu8, 0xff, 0xff];
        let batch = encode_batch([(GroupId(1), &good[..]), (GroupId(1), &garbage[..])]);
        assert!(matches!(
            e.step(NodeId(2), &batch),
            Err(Error::BadMessage { .. })
        ));
        let forged = heartbeat(3, 1);
        let batch = encode_batch([(GroupId(1), &forged[..])]);
        assert!(matches!(
            e.step(NodeId(2), &batch),
            Err(Error::BadMessage { .. })
        ));
        let elsewhere = heartbeat(2, 9);
        let batch = encode_batch([(GroupId(1), &elsewhere[..])]);
        assert!(matches!(
            e.step(NodeId(2), &batch),
            Err(Error::BadMessage { .. })
        ));
        assert!(matches!(
            e.step(NodeId(2), &[7, 1]),
            Err(Error::BadBatch { .. })
        ));
        let batch = encode_batch([(GroupId(1), &good[..])]);
        e.step(NodeId(2), &batch).expect("a well-formed batch");
    }

    #[test]
    fn messages_for_unknown_groups_are_dropped_and_listed() {
        let mut e = engine(1);
        let m = heartbeat(2, 1);
        let batch = encode_batch([(GroupId(40), &m[..]), (GroupId(41), &m[..])]);
        e.step(NodeId(2), &batch).expect("dropped, not refused");
        assert_eq!(e.take_unknown_groups(), vec![GroupId(40), GroupId(41)]);
        assert!(e.take_unknown_groups().is_empty());
    }

    #[test]
    fn a_follower_is_told_who_leads() {
        let mut e = engine(2);
        let batch = encode_batch([(GroupId(1), &heartbeat(1, 2)[..])]);
        e.step(NodeId(1), &batch).expect("step");
        match e.propose(GroupId(1), b"x".to_vec()) {
            Err(Error::NotLeader { leader, .. }) => assert_eq!(leader, Some(NodeId(1))),
            other => panic!("expected NotLeader, got {other:?}"),
        }
        assert!(matches!(
            e.propose(GroupId(9), vec![]),
            Err(Error::GroupNotFound { .. })
        ));
    }
}
