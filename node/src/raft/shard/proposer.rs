//! The node's side of a queue shard's log: `ferry_be_server::ShardProposer` over the driver's
//! inputs, and starting a shard's group on this node.

use std::sync::mpsc::{SyncSender, TrySendError};

use ferry_be_server::{ProposalOutcome, ShardId, ShardProposer, ShardRefusal};
use ferry_multiraft::{GroupId, NodeId as PeerId};
use tokio::sync::oneshot;

use super::super::driver::Input;
use super::super::MetaNode;

/// Proposes shard entries to this node's driver, in the order of the calls (one input
/// channel).
pub(crate) struct DriverProposer {
    inputs: SyncSender<Input>,
}

impl std::fmt::Debug for DriverProposer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("DriverProposer")
    }
}

impl ShardProposer for DriverProposer {
    fn propose(&self, shard: ShardId, term: u64, entry: Vec<u8>) -> ProposalOutcome {
        let (reply, outcome) = oneshot::channel();
        let input = Input::ProposeShard {
            group: GroupId(shard.0),
            term,
            entry,
            reply,
        };
        if let Err(e) = self.inputs.try_send(input) {
            let (TrySendError::Full(input) | TrySendError::Disconnected(input)) = e;
            let Input::ProposeShard { reply, .. } = input else {
                return outcome;
            };
            let _ = reply.send(Err(ShardRefusal::Unknown {
                shard,
                reason: "the node's Raft driver is busy or stopped; nothing was proposed".into(),
            }));
        }
        outcome
    }
}

impl MetaNode {
    /// What the back-end's shard logs propose through.
    pub fn shard_proposer(&self) -> std::sync::Arc<dyn ShardProposer> {
        std::sync::Arc::new(DriverProposer {
            inputs: self.shared.inputs.clone(),
        })
    }

    /// Starts `shard`'s Raft group on this node with `voters` (raft ids) as its first replicas,
    /// unless it runs here already. Every first replica is started with the same voters.
    pub async fn open_shard(&self, shard: ShardId, voters: &[u64]) -> Result<(), String> {
        let (reply, answer) = oneshot::channel();
        let input = Input::OpenShard {
            group: GroupId(shard.0),
            voters: voters.iter().copied().map(PeerId).collect(),
            reply,
        };
        self.shared
            .inputs
            .try_send(input)
            .map_err(|_| "the node's Raft driver is busy or stopped".to_string())?;
        answer
            .await
            .unwrap_or_else(|_| Err("the node's Raft driver stopped".into()))
    }
}
