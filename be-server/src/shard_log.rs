//! The log of a replicated queue: its batches proposed to the queue shard's Raft group
//! (issue 24 §1), the second implementation of [`QueueLog`] beside the node's group commit.
//!
//! A batch is encoded as a shard entry (`ferry_store::encode_entry`) and handed to a
//! [`ShardProposer`], the node's Raft driver behind a trait so that the back-end knows no
//! engine. It is durable once the entry is committed (on a majority of the shard's replicas'
//! disks) and applied on this node; entries are proposed in the order they are submitted, so
//! they are applied in that order. A batch that is not confirmed fails with a
//! [`ShardRefusal`]: the owner task's memory may then be ahead of the log, and it must be
//! rebuilt from the store before it serves again (a later batch may still be applied; the
//! kernel's view is only trusted up to the last confirmed one).

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use ferry_store::{Buckets, StoreOp};
use tokio::sync::{oneshot, watch};

use crate::log::{LogError, LogSync, QueueLog};

pub use ferry_kernel::ShardId;

/// Why a proposal to a shard was not confirmed here.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ShardRefusal {
    /// This node does not lead the shard; `leader` is the node it believes does.
    #[error("this node does not lead {shard} (leader: {}); the write was not made: retry it (any node routes it to the leader)", leader.as_deref().unwrap_or("unknown"))]
    NotLeader {
        shard: ShardId,
        leader: Option<String>,
    },
    /// The entry may or may not be committed: it was appended and then overwritten or dropped,
    /// or the driver stopped before it was applied.
    #[error("the outcome of a write to {shard} is unknown ({reason}): a send may or may not have been stored; resend it with the same dedup id, through any node, so it is stored once")]
    Unknown { shard: ShardId, reason: String },
}

/// What answers a proposal: its outcome once the entry is applied here, or why it has none.
pub type ProposalOutcome = oneshot::Receiver<Result<(), ShardRefusal>>;

/// The node's side of a shard's log: proposes an encoded entry to the shard's Raft group.
/// Proposals must reach the group in the order of the calls.
pub trait ShardProposer: Send + Sync + fmt::Debug + 'static {
    /// Proposes `entry` to `shard` if this node leads it at exactly `term` (else the outcome
    /// is [`ShardRefusal::NotLeader`]: a run of serving begun at one term never writes in
    /// another, whatever happened in between). The outcome's sender is dropped if the driver
    /// stops.
    fn propose(&self, shard: ShardId, term: u64, entry: Vec<u8>) -> ProposalOutcome;
}

/// See the module docs. Cheap to clone: every owner task of the shard holds one.
///
/// **Fenced** after the first batch that is not confirmed: from then on every batch is refused
/// at once, so no owner task of the shard writes on from a memory that may be ahead of the log,
/// and `fences` is bumped so that whoever serves the shard reloads its queues from the store (a
/// new [`ShardLog`] for the new run).
#[derive(Debug, Clone)]
pub(crate) struct ShardLog {
    shard: ShardId,
    /// The term the run leads the shard at: every proposal is made at it.
    term: u64,
    proposer: Arc<dyn ShardProposer>,
    fenced: Arc<AtomicBool>,
    fences: Arc<watch::Sender<u64>>,
    /// Microseconds from each batch's proposal to its confirmation here (node-wide).
    commit_micros: Arc<Buckets>,
}

/// The bounds, in microseconds, of [`new_commit_histogram`]'s buckets.
const COMMIT_MICROS_BOUNDS: &[u64] = &[
    250, 500, 1_000, 2_500, 5_000, 10_000, 25_000, 50_000, 100_000, 250_000, 1_000_000, 5_000_000,
];

/// The node's histogram of the time a replicated write takes, from its proposal to the
/// shard's group to its confirmation on the leader (committed on a majority of the replicas'
/// disks, and applied here): what replication adds to a send or an ack.
pub(crate) fn new_commit_histogram() -> Arc<Buckets> {
    Arc::new(Buckets::new(COMMIT_MICROS_BOUNDS))
}

impl ShardLog {
    /// The log of a run leading `shard` at `term`, whose fencing bumps `fences` (see the
    /// type's docs) and whose confirmed batches are timed into `commit_micros`.
    pub(crate) fn new(
        shard: ShardId,
        term: u64,
        proposer: Arc<dyn ShardProposer>,
        fences: Arc<watch::Sender<u64>>,
        commit_micros: Arc<Buckets>,
    ) -> Self {
        ShardLog {
            shard,
            term,
            proposer,
            fenced: Arc::default(),
            fences,
            commit_micros,
        }
    }

    /// Whether a batch was not confirmed (see the type's docs).
    pub(crate) fn is_fenced(&self) -> bool {
        self.fenced.load(Ordering::Acquire)
    }

    fn fence(&self) {
        if !self.fenced.swap(true, Ordering::AcqRel) {
            tracing::warn!(shard = %self.shard, "a write to the shard was not confirmed: its queues stop and are reloaded from the store");
            self.fences.send_modify(|n| *n = n.wrapping_add(1));
        }
    }

    /// The shard it proposes to.
    pub(crate) fn shard(&self) -> ShardId {
        self.shard
    }

    /// The term its run leads the shard at.
    pub(crate) fn term(&self) -> u64 {
        self.term
    }
}

/// A [`ShardLog`] batch's durability (see [`QueueLog::Durable`]).
#[derive(Debug)]
pub(crate) struct ShardDurable {
    log: ShardLog,
    outcome: ProposalOutcome,
    proposed: tokio::time::Instant,
}

impl Future for ShardDurable {
    type Output = Result<(), LogError>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let shard = self.log.shard;
        let got = std::task::ready!(Pin::new(&mut self.outcome).poll(cx));
        let result = match got {
            Ok(outcome) => outcome.map_err(LogError::from),
            Err(_) => Err(LogError::Shard(ShardRefusal::Unknown {
                shard,
                reason: "the node's Raft driver stopped before the entry was applied".into(),
            })),
        };
        if result.is_err() {
            self.log.fence();
        } else {
            let micros = self.proposed.elapsed().as_micros();
            self.log
                .commit_micros
                .observe(u64::try_from(micros).unwrap_or(u64::MAX));
        }
        Poll::Ready(result)
    }
}

impl QueueLog for ShardLog {
    type Durable = ShardDurable;

    /// Every batch is a proposal: replication has no deferred write (`sync` is moot: a
    /// committed entry is on a majority's disks).
    async fn submit(&self, ops: Vec<StoreOp>, _sync: LogSync) -> Result<ShardDurable, LogError> {
        if self.is_fenced() {
            return Err(LogError::Shard(ShardRefusal::Unknown {
                shard: self.shard,
                reason: "an earlier write to the shard was not confirmed, so its queues are being reloaded from the store; nothing was written".into(),
            }));
        }
        let entry = ferry_store::encode_entry(&ops)?;
        Ok(ShardDurable {
            log: self.clone(),
            outcome: self.proposer.propose(self.shard, self.term, entry),
            proposed: tokio::time::Instant::now(),
        })
    }
}

#[cfg(test)]
mod tests;
