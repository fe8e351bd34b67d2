//! One store for every group's Raft records (log, hard state, apply state, snapshot) and the
//! application's own keys, with two implementations sharing the key layout of [`crate::keys`]:
//! [`rocks::RocksStore`] on disk and [`memory::MemStore`], an in-memory model of durability for
//! simulations.

pub mod memory;
pub mod rocks;

use std::collections::BTreeMap;

use raft::eraftpb::{ConfState, Entry, HardState, Snapshot};

use crate::error::Error;
use crate::group_log::GroupRecord;
use crate::ids::GroupId;
use crate::keys::{parse_key, RecordKey};
use crate::persist::PersistJob;

/// An application key and its value.
pub type KeyValue = (Vec<u8>, Vec<u8>);

/// Durable storage of the engine's [`PersistJob`]s.
pub trait LogStore {
    /// Writes a job atomically, durably unless [`PersistJob::must_sync`] is false (one write,
    /// synced or not; a later synced write makes the earlier ones durable too, and a power loss
    /// never keeps a job without the jobs before it). On failure the store is poisoned: it refuses further writes ([`Error::StoragePoisoned`]) until restart.
    fn write(&mut self, job: &PersistJob) -> Result<(), Error>;

    /// Reads back every group's durable state, for [`crate::Engine::open`].
    fn load(&self) -> Result<Recovered, Error>;

    /// Reads one application key written with [`PersistJob::put_app`].
    fn app_get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, Error>;

    /// Reads every application key starting with `prefix`, in key order.
    fn app_scan(&self, prefix: &[u8]) -> Result<Vec<KeyValue>, Error>;
}

/// The durable state of every group found in a store.
#[derive(Debug, Default)]
pub struct Recovered {
    pub(crate) groups: BTreeMap<GroupId, GroupRecord>,
}

impl Recovered {
    /// The groups found.
    pub fn group_ids(&self) -> Vec<GroupId> {
        self.groups.keys().copied().collect()
    }

    /// The applied index recorded for a group (what the engine resumes applying after).
    pub fn applied_index(&self, group: GroupId) -> Option<u64> {
        self.groups.get(&group).map(|g| g.applied_index)
    }

    /// Builds the state from the `raft` key space ([`Space::Raft`]), read in key order: for a
    /// store implemented outside this crate.
    ///
    /// [`Space::Raft`]: crate::Space::Raft
    pub fn from_records<K, V>(
        records: impl Iterator<Item = Result<(K, V), Error>>,
    ) -> Result<Self, Error>
    where
        K: AsRef<[u8]>,
        V: AsRef<[u8]>,
    {
        let mut groups: BTreeMap<GroupId, GroupRecord> = BTreeMap::new();
        let mut has_apply_state = BTreeMap::new();
        for record in records {
            let (key, value) = record?;
            let (key, value) = (key.as_ref(), value.as_ref());
            let Some(parsed) = parse_key(key) else {
                return Err(Error::CorruptStorage {
                    group: GroupId(0),
                    reason: format!("unknown key {key:02x?}"),
                });
            };
            match parsed {
                RecordKey::HardState(g) => {
                    groups.entry(g).or_default().hard_state = decode::<HardState>(g, value)?;
                }
                RecordKey::ApplyState(g) => {
                    let (applied, conf) = decode_apply_state(g, value)?;
                    let record = groups.entry(g).or_default();
                    record.applied_index = applied;
                    record.conf_state = conf;
                    has_apply_state.insert(g, ());
                }
                RecordKey::Snapshot(g) => {
                    groups.entry(g).or_default().snapshot = decode::<Snapshot>(g, value)?;
                }
                RecordKey::Entry(g, _) => {
                    groups
                        .entry(g)
                        .or_default()
                        .entries
                        .push(decode::<Entry>(g, value)?);
                }
            }
        }
        for (group, record) in &mut groups {
            if !has_apply_state.contains_key(group) {
                record.applied_index = record.snapshot.get_metadata().index;
                record.conf_state = record.snapshot.get_metadata().get_conf_state().clone();
            }
            check_log(*group, record)?;
        }
        Ok(Recovered { groups })
    }
}

/// The log must follow the snapshot without gaps, and the applied index lie between the
/// snapshot and the commit index.
fn check_log(group: GroupId, record: &mut GroupRecord) -> Result<(), Error> {
    let snapshot_index = record.snapshot.get_metadata().index;
    record.entries.retain(|e| e.index > snapshot_index);
    for (offset, entry) in record.entries.iter().enumerate() {
        let expected = snapshot_index + 1 + offset as u64;
        if entry.index != expected {
            return Err(Error::CorruptStorage {
                group,
                reason: format!(
                    "log gap: entry {} where {} was expected",
                    entry.index, expected
                ),
            });
        }
    }
    if record.applied_index < snapshot_index || record.applied_index > record.hard_state.commit {
        return Err(Error::CorruptStorage {
            group,
            reason: format!(
                "applied index {} outside [snapshot {}, commit {}]",
                record.applied_index, snapshot_index, record.hard_state.commit
            ),
        });
    }
    Ok(())
}

fn decode<M: protobuf::Message + Default>(group: GroupId, bytes: &[u8]) -> Result<M, Error> {
    let mut message = M::default();
    message
        .merge_from_bytes(bytes)
        .map_err(|e| Error::CorruptStorage {
            group,
            reason: format!("undecodable record: {e}"),
        })?;
    Ok(message)
}

fn decode_apply_state(group: GroupId, value: &[u8]) -> Result<(u64, ConfState), Error> {
    let (applied, conf) = value
        .split_first_chunk::<8>()
        .ok_or_else(|| Error::CorruptStorage {
            group,
            reason: "apply state shorter than 8 bytes".to_owned(),
        })?;
    Ok((
        u64::from_be_bytes(*applied),
        decode::<ConfState>(group, conf)?,
    ))
}
