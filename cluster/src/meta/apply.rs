//! Applying committed log entries: the entry points, [`MetaState::apply_entry`] (log bytes,
//! with their request id) and [`MetaState::apply`] (a command), and the dispatch to the
//! command's own file (`nodes.rs`, `queues.rs`, `shards.rs`).

use super::command::{Applied, MetaCommand, MetaEvent};
use super::error::MetaError;
use super::requests::RequestId;
use super::state::MetaState;

impl MetaState {
    /// Applies the command committed at `index`. Deterministic. A refused command changes
    /// nothing but the applied index (every node refuses it alike); an `index` already applied
    /// is refused without any change (a driver bug).
    pub fn apply(&mut self, index: u64, command: &MetaCommand) -> Result<MetaEvent, MetaError> {
        self.advance(index)?;
        let bootstrap = matches!(command, MetaCommand::Bootstrap { .. });
        if !bootstrap && self.cluster_id.is_none() {
            return Err(MetaError::NotBootstrapped);
        }
        match command {
            MetaCommand::Bootstrap { cluster_id, nodes } => self.bootstrap(*cluster_id, nodes),
            MetaCommand::AddNode {
                id,
                client_addr,
                peer_addr,
                learner,
            } => self.add_node(id, client_addr, peer_addr, *learner),
            MetaCommand::PromoteNode { id } => self.promote_node(id),
            MetaCommand::RemoveNode { id } => self.remove_node(id),
            MetaCommand::CreateQueue {
                name,
                settings,
                owner,
            } => self.create_queue(name, settings, owner),
            MetaCommand::CreateReplicatedQueue {
                name,
                settings,
                shard,
            } => self.create_replicated_queue(name, settings, shard),
            MetaCommand::UpdateQueue {
                name,
                settings,
                expected,
            } => self.update_queue(name, settings, expected.as_deref()),
            MetaCommand::DeleteQueue { name } => self.delete_queue(name),
            MetaCommand::MoveReplica { shard, from, to } => self.move_replica(*shard, from, to),
            MetaCommand::NoteIncarnation { node, incarnation } => {
                self.note_incarnation(node, *incarnation)
            }
        }
    }

    /// Applies `command` proposed with `request`: a request applied before answers
    /// [`MetaEvent::Repeated`] and changes nothing but the applied index; a new one applies
    /// and, if the command is not refused, is remembered.
    pub fn apply_request(
        &mut self,
        index: u64,
        request: Option<RequestId>,
        command: &MetaCommand,
    ) -> Result<Applied, MetaError> {
        let first = request.and_then(|r| self.requests.applied_at(r));
        if let Some(first_index) = first {
            self.advance(index)?;
            return Ok(Applied {
                event: MetaEvent::Repeated { first_index },
                recorded: None,
                evicted: None,
            });
        }
        let event = self.apply(index, command)?;
        let evicted = request.and_then(|r| self.requests.record(r, index));
        Ok(Applied {
            event,
            recorded: request,
            evicted,
        })
    }

    /// Applies the bytes of a normal entry: empty (a new leader's no-op) is nothing. Bytes that
    /// do not decode change nothing, not even the applied index, and are an error that
    /// [stops applying](MetaError::stops_apply): the entry is committed, so every later entry
    /// may depend on it, and a node that skipped it would diverge from one that applied it (a
    /// newer release's command, during a rolling upgrade).
    pub fn apply_entry(&mut self, index: u64, bytes: &[u8]) -> Result<Applied, MetaError> {
        if bytes.is_empty() {
            self.skip(index)?;
            return Ok(Applied {
                event: MetaEvent::Nothing,
                recorded: None,
                evicted: None,
            });
        }
        let (request, command) = MetaCommand::decode_request(bytes)?;
        self.apply_request(index, request, &command)
    }

    /// Notes an entry that is no command (a Raft configuration change).
    pub fn skip(&mut self, index: u64) -> Result<(), MetaError> {
        self.advance(index)
    }

    fn advance(&mut self, index: u64) -> Result<(), MetaError> {
        if index <= self.applied_index {
            return Err(MetaError::StaleIndex {
                index,
                applied_index: self.applied_index,
            });
        }
        self.applied_index = index;
        Ok(())
    }
}
