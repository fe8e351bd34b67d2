//! Key spaces of the node's one database that belong to other parts of the node: the Raft
//! engine's records and its groups' application keys. They are written through the same writer
//! as the queues ([`crate::StoreOp::Kv`]), so a Raft round and the queue writes it carries can
//! share one synced batch, and read back with [`crate::QueueStore::kv_get`] and
//! [`crate::QueueStore::kv_scan`]. Their bytes are opaque here.

/// A key space kept for another part of the node (a column family in RocksDB).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum KvSpace {
    /// The Raft engine's records: every group's log entries, hard state, apply state and
    /// snapshot (column family `raft`).
    RaftLog,
    /// The Raft groups' application keys: the metadata with its applied index, the node's raft
    /// id (column family `raft_app`).
    RaftApp,
}

impl KvSpace {
    /// Every space, in a fixed order.
    pub const ALL: [KvSpace; 2] = [KvSpace::RaftLog, KvSpace::RaftApp];

    /// The column family holding the space. The names are the ones the Raft engine's own
    /// database used (`data_dir/raft` before one database per node), so that database is
    /// absorbed by copying each family as it is.
    pub fn column_family(self) -> &'static str {
        match self {
            KvSpace::RaftLog => "raft",
            KvSpace::RaftApp => "raft_app",
        }
    }
}

/// One write to a [`KvSpace`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KvOp {
    /// Sets a key.
    Put {
        space: KvSpace,
        key: Vec<u8>,
        value: Vec<u8>,
    },
    /// Removes a key.
    Delete { space: KvSpace, key: Vec<u8> },
    /// Removes every key in `[from, to)`.
    DeleteRange {
        space: KvSpace,
        from: Vec<u8>,
        to: Vec<u8>,
    },
}

/// A key and its value.
pub type KeyValue = (Vec<u8>, Vec<u8>);
