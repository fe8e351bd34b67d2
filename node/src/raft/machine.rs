//! The metadata as group 0's state machine: what `ferry_multiraft`'s driver applies committed
//! entries to, and what it writes with each round's job (the durable copy, key by key, with
//! its applied index, and this node's raft id).

use ferry_cluster::meta::{
    DurableWrite, MetaError, MetaEvent, MetaState, RaftId, Touched, DURABLE_END, DURABLE_PREFIX,
};
use ferry_multiraft::{GroupMachine, Halt, LogPosition, PersistJob};

use super::driver::{IDENTITY_KEY, META_KEY};

/// See the module docs.
#[derive(Debug)]
pub(crate) struct MetaMachine {
    meta: MetaState,
    /// What entries applied since the last job changed, to write as a delta.
    touched: Touched,
    /// This node's raft id once it is a member, written with every job (a joining node's first
    /// job must carry it; it is 8 bytes).
    raft_id: Option<RaftId>,
    #[cfg(test)]
    probe: Option<Probe>,
}

/// What the machine just did to its state, as a test's [`Probe`] sees it.
#[cfg(test)]
#[derive(Debug)]
pub(crate) enum Change<'a> {
    /// A normal entry applied, with its outcome.
    Applied(&'a Result<MetaEvent, MetaError>),
    /// A configuration change passed over.
    Skipped,
    /// The state replaced by a snapshot.
    Restored,
}

/// A test's window on the machine: called after every change of its state with the position
/// reached, what happened and the state there, so that the simulations check every applied
/// entry of the real machine (`sim/checks.rs`).
#[cfg(test)]
pub(crate) struct Probe(pub(crate) Box<ProbeFn>);

#[cfg(test)]
pub(crate) type ProbeFn = dyn FnMut(LogPosition, Change<'_>, &MetaState) + Send;

#[cfg(test)]
impl std::fmt::Debug for Probe {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Probe")
    }
}

impl MetaMachine {
    /// The machine over `meta`; `rewrite` when the durable copy is in an earlier release's
    /// form and must be written again whole.
    pub(crate) fn new(meta: MetaState, raft_id: Option<RaftId>, rewrite: bool) -> Self {
        let mut touched = Touched::default();
        if rewrite {
            touched.everything();
        }
        MetaMachine {
            meta,
            touched,
            raft_id,
            #[cfg(test)]
            probe: None,
        }
    }

    /// Shows every change of the state to `probe` from now on.
    #[cfg(test)]
    pub(crate) fn set_probe(&mut self, probe: Probe) {
        self.probe = Some(probe);
    }

    #[cfg(test)]
    fn show(&mut self, position: LogPosition, change: Change<'_>) {
        if let Some(probe) = self.probe.as_mut() {
            (probe.0)(position, change, &self.meta);
        }
    }

    pub(crate) fn meta(&self) -> &MetaState {
        &self.meta
    }

    /// This node joined the cluster as `raft_id`.
    pub(crate) fn set_raft_id(&mut self, raft_id: RaftId) {
        self.raft_id = Some(raft_id);
    }
}

impl GroupMachine for MetaMachine {
    /// A refusal is an outcome (the command changed nothing, on every node alike); an error
    /// that [stops applying](MetaError::stops_apply) is a [`Halt`].
    type Outcome = Result<MetaEvent, MetaError>;

    fn applied_index(&self) -> u64 {
        self.meta.applied_index()
    }

    fn apply(&mut self, position: LogPosition, data: &[u8]) -> Result<Self::Outcome, Halt> {
        let outcome = match self.meta.apply_entry(position.index, data) {
            Ok(applied) => {
                self.touched.note_applied(&applied);
                Ok(applied.event)
            }
            Err(e) if e.stops_apply() => {
                return Err(Halt(format!(
                    "cannot apply metadata entry {} (term {}): {e}",
                    position.index, position.term
                )))
            }
            Err(e) => {
                self.touched.note_index();
                tracing::debug!(index = position.index, error = %e, "metadata command refused");
                Err(e)
            }
        };
        #[cfg(test)]
        self.show(position, Change::Applied(&outcome));
        Ok(outcome)
    }

    fn skip(&mut self, position: LogPosition) -> Result<(), Halt> {
        self.meta.skip(position.index).map_err(|e| {
            Halt(format!(
                "cannot apply metadata entry {} (term {}): {e}",
                position.index, position.term
            ))
        })?;
        self.touched.note_index();
        #[cfg(test)]
        self.show(position, Change::Skipped);
        Ok(())
    }

    fn restore(&mut self, position: LogPosition, data: &[u8]) -> Result<(), Halt> {
        let restored = if data.is_empty() {
            let mut meta = MetaState::new();
            meta.skip(position.index).map(|()| meta)
        } else {
            MetaState::restore(data)
        };
        let meta = restored.map_err(|e| {
            Halt(format!(
                "cannot read the metadata snapshot at index {}: {e}",
                position.index
            ))
        })?;
        self.meta = meta;
        self.touched.everything();
        #[cfg(test)]
        self.show(position, Change::Restored);
        Ok(())
    }

    fn snapshot(&self) -> Vec<u8> {
        self.meta.snapshot()
    }

    fn persist(&mut self, job: &mut PersistJob) {
        let touched = std::mem::take(&mut self.touched);
        for write in self.meta.durable_writes(&touched) {
            match write {
                DurableWrite::Clear => {
                    job.delete_app_range(DURABLE_PREFIX, DURABLE_END);
                    job.delete_app(META_KEY);
                }
                DurableWrite::Put { key, value } => job.put_app(key, value),
                DurableWrite::Delete { key } => job.delete_app(key),
            }
        }
        if let Some(raft_id) = self.raft_id {
            job.put_app(IDENTITY_KEY, raft_id.0.to_be_bytes().to_vec());
        }
    }
}
