//! A queue shard as a Raft group's state machine (issue 24 §1): what the driver applies a
//! shard's committed entries to.
//!
//! An entry is one batch of store operations in the format of [`ferry_store::encode_entry`],
//! as the shard leader's owner task handed it to its log. Applying it hands the same batch to
//! the node's store: the machine attaches the batches applied in a round to the round's job
//! (`log_store::ShardWrites`), so they reach the disk in the node's one synced write, with the Raft log,
//! the engine's applied index and the shard's own applied position (exactly-once apply: after a
//! crash the engine resumes past what was written, and an entry at or below the machine's
//! applied position is skipped, never applied twice, because counts are merge deltas that a
//! replay would corrupt for good).
//!
//! Snapshots: the shard's state is in the store, so its log is compacted like any group's and
//! a replica too far behind is sent the shard's data itself (`snapshot.rs`).

use std::sync::Arc;

use ferry_multiraft::{GroupId, GroupMachine, Halt, LogPosition, LogStore, PersistJob};
use ferry_store::{decode_entry, StoreOp};

use snapshot::SNAPSHOT_FORMAT;
pub(crate) use snapshot::{ShardSnapshots, Staged};

pub(crate) use balance::{Balancer, LedShard, BALANCE_EVERY_TICKS};
pub(crate) use list::LocalShard;
pub(crate) use members::ShardMembers;
pub(crate) use transfer::TransferRefusal;

/// The application key of a shard's applied position: `shard/` and the group id, big-endian.
pub(crate) fn applied_key(group: GroupId) -> Vec<u8> {
    let mut key = b"shard/".to_vec();
    key.extend_from_slice(&group.0.to_be_bytes());
    key.extend_from_slice(b"/applied");
    key
}

pub(crate) fn encode_position(p: LogPosition) -> Vec<u8> {
    let mut v = p.index.to_be_bytes().to_vec();
    v.extend_from_slice(&p.term.to_be_bytes());
    v
}

pub(crate) fn decode_position(v: &[u8]) -> Option<LogPosition> {
    let index = u64::from_be_bytes(v.get(..8)?.try_into().ok()?);
    let term = u64::from_be_bytes(v.get(8..16)?.try_into().ok()?);
    (v.len() == 16).then_some(LogPosition { index, term })
}

/// See the module docs.
#[derive(Debug)]
pub(crate) struct ShardMachine {
    group: GroupId,
    /// The last entry applied.
    applied: LogPosition,
    /// Batches applied since the last job, for the next one.
    pending: Vec<StoreOp>,
    /// The applied position moved since the last job.
    dirty: bool,
    /// Where a snapshot's data waits for its install.
    snapshots: Arc<ShardSnapshots>,
    #[cfg(test)]
    plant: Plant,
}

/// Bugs a test plants to show its checker catches them.
#[cfg(test)]
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct Plant {
    /// The applied data is written one job late: a crash between the two jobs keeps the
    /// applied position and loses what was applied.
    pub(crate) data_one_job_late: bool,
    /// A snapshot's install takes the snapshot's index as its applied position, not the
    /// data's (which may hold later entries): those entries are applied again.
    pub(crate) restore_at_snapshot_index: bool,
    /// A snapshot's install writes its data over what the replica held of the shard, without
    /// deleting it first.
    pub(crate) restore_over_old_data: bool,
}

impl ShardMachine {
    /// The machine of `group` as `store` last made it durable (a new group: nothing applied),
    /// installing snapshots' data staged in `snapshots`.
    pub(crate) fn open(
        group: GroupId,
        store: &dyn LogStore,
        snapshots: Arc<ShardSnapshots>,
    ) -> Result<Self, Halt> {
        let read = store
            .app_get(&applied_key(group))
            .map_err(|e| Halt(format!("cannot read shard {group}'s applied position: {e}")))?;
        let applied = match read {
            None => LogPosition { index: 0, term: 0 },
            Some(v) => decode_position(&v).ok_or_else(|| {
                Halt(format!(
                    "shard {group}'s applied position is unreadable ({} bytes)",
                    v.len()
                ))
            })?,
        };
        Ok(ShardMachine {
            group,
            applied,
            pending: Vec::new(),
            dirty: false,
            snapshots,
            #[cfg(test)]
            plant: Plant::default(),
        })
    }

    #[cfg(test)]
    pub(crate) fn plant(&mut self, plant: Plant) {
        self.plant = plant;
    }

    /// Whether `position` was applied already (then it is skipped).
    fn done(&self, position: LogPosition) -> bool {
        position.index <= self.applied.index
    }

    /// Planted bug only: see [`Plant::restore_at_snapshot_index`].
    fn restores_at_snapshot_index(&self) -> bool {
        #[cfg(test)]
        return self.plant.restore_at_snapshot_index;
        #[cfg(not(test))]
        false
    }

    /// Planted bug only: see [`Plant::restore_over_old_data`].
    fn restores_over_old_data(&self) -> bool {
        #[cfg(test)]
        return self.plant.restore_over_old_data;
        #[cfg(not(test))]
        false
    }

    /// Planted bug only: the applied data waits for a job that must sync.
    fn holds_data_back(&self, _job: &PersistJob) -> bool {
        #[cfg(test)]
        return self.plant.data_one_job_late && !_job.must_sync();
        #[cfg(not(test))]
        false
    }

    /// The term of the last entry applied (a new leader serves once it applied an entry of its
    /// own term: everything committed before it is then applied here).
    pub(crate) fn applied_term(&self) -> u64 {
        self.applied.term
    }

    fn advance(&mut self, position: LogPosition) {
        self.applied = position;
        self.dirty = true;
    }
}

impl GroupMachine for ShardMachine {
    /// The leader's owner task learns only that its batch was applied (at the index the driver
    /// reports): the batch's effects are already in its kernel's memory.
    type Outcome = ();

    fn applied_index(&self) -> u64 {
        self.applied.index
    }

    fn apply(&mut self, position: LogPosition, data: &[u8]) -> Result<(), Halt> {
        if self.done(position) {
            tracing::debug!(shard = %self.group, index = position.index, "entry applied already");
            return Ok(());
        }
        if !data.is_empty() {
            let ops = decode_entry(data).map_err(|e| {
                Halt(format!(
                    "cannot apply shard {} entry {} (term {}): {e}",
                    self.group, position.index, position.term
                ))
            })?;
            self.pending.extend(ops);
        }
        self.advance(position);
        Ok(())
    }

    fn skip(&mut self, position: LogPosition) -> Result<(), Halt> {
        if !self.done(position) {
            self.advance(position);
        }
        Ok(())
    }

    /// Installs the data staged for the snapshot at `position` (see `snapshot.rs`): every
    /// queue of the shard this replica held is deleted and the data written in its place, in
    /// the round's job; the applied position becomes the data's.
    fn restore(&mut self, position: LogPosition, _data: &[u8]) -> Result<(), Halt> {
        let done = self.done(position);
        let staged = self.snapshots.take(self.group, position.index, !done);
        if done {
            return Ok(());
        }
        let Some(staged) = staged else {
            return Err(Halt(format!(
                "shard {} was given a snapshot at index {} whose data never arrived",
                self.group, position.index
            )));
        };
        // What this round applied before the snapshot is in the data too.
        self.pending.clear();
        if !self.restores_over_old_data() {
            self.pending
                .push(StoreOp::DeleteShard(ferry_kernel::ShardId(self.group.0)));
        }
        for batch in staged.ops {
            self.pending.extend(batch);
        }
        if self.restores_at_snapshot_index() {
            self.advance(position);
        } else {
            self.advance(staged.applied);
        }
        tracing::info!(
            shard = %self.group,
            index = position.index,
            applied = staged.applied.index,
            "queue shard restored from a snapshot"
        );
        Ok(())
    }

    fn snapshot(&self) -> Vec<u8> {
        vec![SNAPSHOT_FORMAT]
    }

    /// The shard left this node (its last queue was deleted, or its replica here moved to
    /// another node): what this node held of it is deleted, and its applied position goes with
    /// the group's Raft records, in the same job. A node that was down when its replica moved
    /// does this when it comes back and applies the move.
    fn close(&mut self, job: &mut PersistJob) {
        self.pending
            .push(StoreOp::DeleteShard(ferry_kernel::ShardId(self.group.0)));
        job.attach(Arc::new(std::mem::take(&mut self.pending)));
        job.delete_app(applied_key(self.group));
    }

    fn persist(&mut self, job: &mut PersistJob) {
        if !self.pending.is_empty() && !self.holds_data_back(job) {
            job.attach(Arc::new(std::mem::take(&mut self.pending)));
        }
        if std::mem::take(&mut self.dirty) {
            job.put_app(applied_key(self.group), encode_position(self.applied));
        }
    }
}

mod balance;
mod leader_events;
mod list;
mod members;
mod moves;
#[cfg(test)]
mod node_tests;
mod proposer;
mod replication_events;
mod serve;
#[cfg(test)]
pub(crate) mod sim_link;
mod snapshot;
#[cfg(test)]
mod tests;
mod transfer;
