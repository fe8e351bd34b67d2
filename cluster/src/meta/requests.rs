//! Proposals applied once however often they are retried: the client sessions of the Raft
//! dissertation (§6.3), reduced to what the metadata needs.
//!
//! A node proposing a command gives it a [`RequestId`] drawn at random, and keeps the same id
//! (the same bytes) across every retry of that one call: through a follower whose leader died
//! after committing the entry but before answering, the retry commits a second copy. The first
//! copy to apply is applied and remembered here with its index; a later copy changes nothing
//! and answers [`MetaEvent::Repeated`](super::MetaEvent::Repeated), as successful as the original was. A refused command is
//! not remembered: it changed nothing, so its retry is judged again where it is ordered, as if
//! the first attempt had never been.
//!
//! The last [`REQUESTS_KEPT`] applied ids are kept, evicted oldest first by the index they
//! applied at, so every node keeps the same ones. A retry is recognized while fewer than that
//! many other identified commands committed after its original: a node retries a call for at
//! most its proposal timeout (10 s), far under the time that many metadata commands take.

use std::fmt;

use imbl::OrdMap;

/// How many applied request ids the metadata remembers.
pub const REQUESTS_KEPT: usize = 16_384;

/// The id of one proposal, the same across its retries. Drawn at random (128 bits) by the node
/// that first proposes the call; never 0.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct RequestId(pub u128);

impl fmt::Display for RequestId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:032x}", self.0)
    }
}

/// The request ids applied, with the index each applied at. Persistent maps: the metadata is
/// cloned at every change it publishes, and this table is its largest part below 16 384 queues.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Requests {
    index_of: OrdMap<RequestId, u64>,
    by_index: OrdMap<u64, RequestId>,
}

impl Requests {
    /// The index `id` applied at, if it is remembered.
    pub(crate) fn applied_at(&self, id: RequestId) -> Option<u64> {
        self.index_of.get(&id).copied()
    }

    /// Remembers `id` applied at `index`; returns the id evicted to make room, if any.
    pub(crate) fn record(&mut self, id: RequestId, index: u64) -> Option<RequestId> {
        self.index_of.insert(id, index);
        self.by_index.insert(index, id);
        if self.by_index.len() <= REQUESTS_KEPT {
            return None;
        }
        let (first_index, oldest) = self.by_index.get_min().copied()?;
        self.by_index.remove(&first_index);
        self.index_of.remove(&oldest);
        Some(oldest)
    }

    /// Every remembered id with its index, oldest first.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (RequestId, u64)> + '_ {
        self.by_index.iter().map(|(index, id)| (*id, *index))
    }

    /// How many are remembered.
    pub(crate) fn len(&self) -> usize {
        self.by_index.len()
    }

    /// Checks the two maps agree, the count is in bounds and no index is above `applied`.
    pub(crate) fn check(&self, applied: u64) -> Result<(), String> {
        if self.index_of.len() != self.by_index.len() || self.len() > REQUESTS_KEPT {
            return Err(format!(
                "request table: {} ids, {} indexes (at most {REQUESTS_KEPT})",
                self.index_of.len(),
                self.by_index.len()
            ));
        }
        for (index, id) in &self.by_index {
            if *index > applied || self.index_of.get(id) != Some(index) {
                return Err(format!("request {id} at index {index}: inconsistent"));
            }
        }
        Ok(())
    }
}
