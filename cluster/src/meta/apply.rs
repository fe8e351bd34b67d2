//! Applying committed log entries: the one entry point, [`MetaState::apply`], and the
//! dispatch to the command's own file (`nodes.rs`, `queues.rs`).

use super::command::{MetaCommand, MetaEvent};
use super::error::MetaError;
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
            MetaCommand::UpdateQueue {
                name,
                settings,
                expected,
            } => self.update_queue(name, settings, expected.as_deref()),
            MetaCommand::DeleteQueue { name } => self.delete_queue(name),
        }
    }

    /// Applies the bytes of a normal entry: empty (a new leader's no-op) is nothing, bytes that
    /// do not decode are a refused command.
    pub fn apply_bytes(&mut self, index: u64, bytes: &[u8]) -> Result<MetaEvent, MetaError> {
        if bytes.is_empty() {
            return self.skip(index).map(|()| MetaEvent::Nothing);
        }
        match MetaCommand::decode(bytes) {
            Ok(command) => self.apply(index, &command),
            Err(e) => self.skip(index).and(Err(e)),
        }
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
