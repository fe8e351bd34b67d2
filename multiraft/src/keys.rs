//! The key layout shared by every store, and the operations a [`crate::PersistJob`] carries.
//!
//! Raft records live in the `raft` column family under big-endian, group-prefixed keys, so
//! one group's records are contiguous and its entries sorted by index:
//!
//! ```text
//! group:u64be 0x01               -> HardState (raft-rs protobuf)
//! group:u64be 0x02               -> apply state: applied:u64be ConfState (protobuf)
//! group:u64be 0x03               -> latest Snapshot (protobuf: metadata + state machine data)
//! group:u64be 0x04 index:u64be   -> Entry (protobuf)
//! ```
//!
//! The application's own keys live in the `app` column family, untouched by the engine.

use crate::ids::GroupId;

pub(crate) const KIND_HARD_STATE: u8 = 1;
pub(crate) const KIND_APPLY_STATE: u8 = 2;
pub(crate) const KIND_SNAPSHOT: u8 = 3;
pub(crate) const KIND_ENTRY: u8 = 4;
/// Above every kind: the exclusive end of a group's key range.
const KIND_END: u8 = 0xff;

/// The key space an operation writes to (a column family in RocksDB).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Space {
    /// The engine's records.
    Raft,
    /// The application's own keys.
    App,
}

/// One write of a job, applied in order within one atomic batch ([`crate::PersistJob::ops`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KvOp {
    Put {
        space: Space,
        key: Vec<u8>,
        value: Vec<u8>,
    },
    Delete {
        space: Space,
        key: Vec<u8>,
    },
    /// Deletes keys in `[from, to)`.
    DeleteRange {
        space: Space,
        from: Vec<u8>,
        to: Vec<u8>,
    },
}

impl KvOp {
    /// Bytes this operation writes (keys and values), for accounting.
    pub fn size_bytes(&self) -> usize {
        match self {
            KvOp::Put { key, value, .. } => key.len() + value.len(),
            KvOp::Delete { key, .. } => key.len(),
            KvOp::DeleteRange { from, to, .. } => from.len() + to.len(),
        }
    }
}

pub(crate) fn record_key(group: GroupId, kind: u8) -> Vec<u8> {
    let mut key = Vec::with_capacity(17);
    key.extend_from_slice(&group.0.to_be_bytes());
    key.push(kind);
    key
}

pub(crate) fn entry_key(group: GroupId, index: u64) -> Vec<u8> {
    let mut key = record_key(group, KIND_ENTRY);
    key.extend_from_slice(&index.to_be_bytes());
    key
}

/// Deletes entries with index in `[from, to)`.
pub(crate) fn delete_entries(group: GroupId, from: u64, to: u64) -> KvOp {
    KvOp::DeleteRange {
        space: Space::Raft,
        from: entry_key(group, from),
        to: entry_key(group, to),
    }
}

/// Deletes every record of a group.
pub(crate) fn delete_group(group: GroupId) -> KvOp {
    KvOp::DeleteRange {
        space: Space::Raft,
        from: record_key(group, 0),
        to: record_key(group, KIND_END),
    }
}

pub(crate) fn put_raft(key: Vec<u8>, value: Vec<u8>) -> KvOp {
    KvOp::Put {
        space: Space::Raft,
        key,
        value,
    }
}

/// A parsed key of the `raft` column family.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RecordKey {
    HardState(GroupId),
    ApplyState(GroupId),
    Snapshot(GroupId),
    Entry(GroupId, u64),
}

pub(crate) fn parse_key(key: &[u8]) -> Option<RecordKey> {
    let group = GroupId(u64::from_be_bytes(key.get(..8)?.try_into().ok()?));
    match (key.get(8)?, key.len()) {
        (&KIND_HARD_STATE, 9) => Some(RecordKey::HardState(group)),
        (&KIND_APPLY_STATE, 9) => Some(RecordKey::ApplyState(group)),
        (&KIND_SNAPSHOT, 9) => Some(RecordKey::Snapshot(group)),
        (&KIND_ENTRY, 17) => {
            let index = u64::from_be_bytes(key.get(9..17)?.try_into().ok()?);
            Some(RecordKey::Entry(group, index))
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_sort_by_group_then_kind_then_index() {
        let keys = [
            record_key(GroupId(1), KIND_HARD_STATE),
            record_key(GroupId(1), KIND_SNAPSHOT),
            entry_key(GroupId(1), 9),
            entry_key(GroupId(1), 256),
            record_key(GroupId(2), KIND_HARD_STATE),
        ];
        assert!(keys.windows(2).all(|w| w[0] < w[1]));
        assert_eq!(parse_key(&keys[3]), Some(RecordKey::Entry(GroupId(1), 256)));
        assert_eq!(parse_key(&keys[4]), Some(RecordKey::HardState(GroupId(2))));
        assert_eq!(parse_key(b"short"), None);
    }
}
