//! Reading messages while queues run: pages of one priority's run, header index lookups, point
//! reads, delayed messages. Each read sees one snapshot, so a message and its delivery count
//! agree.

use ferry_kernel::{IndexedHeader, Message, Priority, QueueUid, RecoveredMessage, Seq};
use rocksdb::{ReadOptions, Snapshot};

use super::keys::{self, delivery_key, message_key};
use super::{io, RocksStore};
use crate::{codec, priorities_high_first, Page, StoreError};

/// The most index entries checked against their messages in one multi-get: bounds the memory
/// of a lookup whatever `max` is.
const INDEX_CHUNK_MAX: usize = 1_024;

fn at(snapshot: &Snapshot<'_>) -> ReadOptions {
    let mut ro = ReadOptions::default();
    ro.set_snapshot(snapshot);
    ro
}

impl RocksStore {
    pub(super) fn page(
        &self,
        uid: QueueUid,
        p: Priority,
        from: Seq,
        upto: Seq,
        max_count: usize,
        max_bytes: u64,
    ) -> Result<Page, StoreError> {
        if from >= upto {
            return Ok(Page {
                messages: vec![],
                next: from,
                end: true,
            });
        }
        let cfs = self.cfs()?;
        let snapshot = self.db.snapshot();
        let mut ro = at(&snapshot);
        // Exactly this priority's [from, upto): tombstones of messages deleted below `from` (the
        // acknowledged head of the run) are never walked.
        ro.set_iterate_lower_bound(message_key(uid, p, from));
        ro.set_iterate_upper_bound(message_key(uid, p, upto));
        let mut it = self.db.raw_iterator_cf_opt(cfs.messages, ro);
        it.seek_to_first();
        let (mut messages, mut bytes) = (Vec::new(), 0u64);
        while let Some(v) = it.value() {
            if messages.len() >= max_count || (!messages.is_empty() && bytes >= max_bytes) {
                break;
            }
            let m = codec::decode_message(uid, v)?;
            bytes = bytes.saturating_add(m.size_bytes());
            messages.push(m);
            it.next();
        }
        it.status().map_err(io("reading a page of messages"))?;
        let end = !it.valid();
        let next = match messages.last() {
            _ if end => upto,
            Some(m) => Seq(m.seq.0.saturating_add(1)),
            None => from,
        };
        Ok(Page {
            messages: self.with_delivery_counts(uid, messages, &snapshot)?,
            next,
            end,
        })
    }

    pub(super) fn by_header(
        &self,
        uid: QueueUid,
        header: IndexedHeader,
        value: &str,
        max: usize,
    ) -> Result<Vec<(Priority, Seq)>, StoreError> {
        let cfs = self.cfs()?;
        let snapshot = self.db.snapshot();
        let prefix = keys::index_prefix(uid, header, value);
        // A value longer than the index holds shares its entries with every value of the same
        // first bytes: check it on the messages.
        let truncated = value.len() > keys::INDEX_VALUE_MAX;
        let mut ro = at(&snapshot);
        ro.set_iterate_lower_bound(keys::index_bound(&prefix, 0));
        ro.set_iterate_upper_bound(keys::index_bound(&prefix, Priority::MAX + 1));
        ro.set_prefix_same_as_start(true);
        let mut it = self.db.raw_iterator_cf_opt(cfs.index, ro);
        it.seek_to_first();
        let mut found = Vec::new();
        while found.len() < max {
            let want = (max - found.len()).min(INDEX_CHUNK_MAX);
            let mut entries = Vec::with_capacity(want);
            while entries.len() < want {
                let Some(k) = it.key() else { break };
                entries.push(keys::index_entry(k).ok_or_else(|| StoreError::Corrupt {
                    what: "header index entry",
                    reason: "the key is too short or its priority byte is out of range".into(),
                })?);
                it.next();
            }
            it.status().map_err(io("reading the header index"))?;
            if entries.is_empty() {
                break;
            }
            let message_keys: Vec<_> = entries
                .iter()
                .map(|&(p, seq)| message_key(uid, p, seq))
                .collect();
            let got =
                self.db
                    .batched_multi_get_cf_opt(cfs.messages, &message_keys, true, &at(&snapshot));
            for (entry, got) in entries.into_iter().zip(got) {
                // No message: an orphan left by `DeleteStored`.
                let Some(bytes) = got.map_err(io("reading indexed messages"))? else {
                    continue;
                };
                if truncated && header.value_of(&codec::decode_message(uid, &bytes)?) != Some(value)
                {
                    continue;
                }
                found.push(entry);
            }
        }
        Ok(found)
    }

    pub(super) fn messages_at(
        &self,
        uid: QueueUid,
        at_keys: &[(Priority, Seq)],
    ) -> Result<Vec<RecoveredMessage>, StoreError> {
        let snapshot = self.db.snapshot();
        self.messages_in(uid, at_keys, &snapshot)
    }

    pub(super) fn delayed_after(
        &self,
        uid: QueueUid,
        after_ms: u64,
    ) -> Result<Vec<RecoveredMessage>, StoreError> {
        // No delivery time is after the last millisecond.
        let Some(from_ms) = after_ms.checked_add(1) else {
            return Ok(vec![]);
        };
        let cfs = self.cfs()?;
        let snapshot = self.db.snapshot();
        let mut ro = at(&snapshot);
        // Entries at or before `after_ms` (messages already due, kept until deleted, and the
        // tombstones of deleted ones) are never walked.
        ro.set_iterate_lower_bound(keys::delayed_key(uid, from_ms, Seq(0)));
        if let Some(end) = keys::prefix_end(&keys::uid_prefix(uid)) {
            ro.set_iterate_upper_bound(end);
        }
        ro.set_prefix_same_as_start(true);
        let mut it = self.db.raw_iterator_cf_opt(cfs.delayed, ro);
        it.seek_to_first();
        let mut at_keys = Vec::new();
        while let Some((k, v)) = it.item() {
            let p = v.first().and_then(|&b| Priority::new(b.into()).ok());
            let (Some(p), Some(seq)) = (p, keys::delayed_seq(k)) else {
                return Err(StoreError::Corrupt {
                    what: "delayed entry",
                    reason: "the key is too short or the priority is out of range".into(),
                });
            };
            at_keys.push((p, seq));
            it.next();
        }
        it.status().map_err(io("reading delayed entries"))?;
        // Entries with no message are orphans left by `DeleteStored`: skipped.
        self.messages_in(uid, &at_keys, &snapshot)
    }

    /// Messages whose delivery is marked (see `QueueStore::read_marked`): one walk of the
    /// queue's delivery records, then each marked message looked up at every priority (a
    /// delivery record does not name its message's priority; bloom filters turn away the
    /// misses).
    pub(super) fn marked(&self, uid: QueueUid) -> Result<Vec<RecoveredMessage>, StoreError> {
        let cfs = self.cfs()?;
        let snapshot = self.db.snapshot();
        let mut ro = at(&snapshot);
        ro.set_iterate_lower_bound(keys::uid_prefix(uid).to_vec());
        if let Some(end) = keys::prefix_end(&keys::uid_prefix(uid)) {
            ro.set_iterate_upper_bound(end);
        }
        let mut it = self.db.raw_iterator_cf_opt(cfs.deliveries, ro);
        it.seek_to_first();
        let mut seqs = Vec::new();
        while let Some((k, v)) = it.item() {
            // A value longer than a count carries a mark.
            if v.len() > 4 {
                let seq = k
                    .get(8..16)
                    .and_then(|s| <[u8; 8]>::try_from(s).ok())
                    .map(|s| Seq(u64::from_be_bytes(s)))
                    .ok_or_else(|| StoreError::Corrupt {
                        what: "delivery count",
                        reason: format!("a key of {} bytes instead of 16", k.len()),
                    })?;
                seqs.push(seq);
            }
            it.next();
        }
        it.status().map_err(io("reading delivery records"))?;
        let at_keys: Vec<_> = seqs
            .iter()
            .flat_map(|&seq| priorities_high_first().map(move |p| (p, seq)))
            .collect();
        self.messages_in(uid, &at_keys, &snapshot)
    }

    /// The messages at these keys in `snapshot`, in the order of `at_keys`, skipping keys with no
    /// message.
    fn messages_in(
        &self,
        uid: QueueUid,
        at_keys: &[(Priority, Seq)],
        snapshot: &Snapshot<'_>,
    ) -> Result<Vec<RecoveredMessage>, StoreError> {
        let cfs = self.cfs()?;
        let message_keys: Vec<_> = at_keys
            .iter()
            .map(|&(p, seq)| message_key(uid, p, seq))
            .collect();
        let mut messages = Vec::with_capacity(at_keys.len());
        for got in
            self.db
                .batched_multi_get_cf_opt(cfs.messages, &message_keys, false, &at(snapshot))
        {
            if let Some(v) = got.map_err(io("reading messages"))? {
                messages.push(codec::decode_message(uid, &v)?);
            }
        }
        self.with_delivery_counts(uid, messages, snapshot)
    }

    pub(super) fn message_by_seq(
        &self,
        uid: QueueUid,
        seq: Seq,
    ) -> Result<Option<RecoveredMessage>, StoreError> {
        let cfs = self.cfs()?;
        let snapshot = self.db.snapshot();
        // One key per priority, in key order; bloom filters turn away the nine that miss.
        let message_keys: Vec<_> = priorities_high_first()
            .map(|p| message_key(uid, p, seq))
            .collect();
        let mut found = None;
        for got in
            self.db
                .batched_multi_get_cf_opt(cfs.messages, &message_keys, true, &at(&snapshot))
        {
            if let Some(v) = got.map_err(io("reading a message"))? {
                found = Some(codec::decode_message(uid, &v)?);
                break;
            }
        }
        let found = self.with_delivery_counts(uid, found.into_iter().collect(), &snapshot)?;
        Ok(found.into_iter().next())
    }

    fn with_delivery_counts(
        &self,
        uid: QueueUid,
        messages: Vec<Message>,
        snapshot: &Snapshot<'_>,
    ) -> Result<Vec<RecoveredMessage>, StoreError> {
        if messages.is_empty() {
            return Ok(vec![]);
        }
        let cfs = self.cfs()?;
        let delivery_keys: Vec<_> = messages.iter().map(|m| delivery_key(uid, m.seq)).collect();
        let counts =
            self.db
                .batched_multi_get_cf_opt(cfs.deliveries, &delivery_keys, false, &at(snapshot));
        messages
            .into_iter()
            .zip(counts)
            .map(|(message, count)| {
                let (delivery_count, mark) = match count.map_err(io("reading delivery counts"))? {
                    Some(v) => codec::decode_delivery(&v)?,
                    None => (0, None),
                };
                Ok(RecoveredMessage {
                    message,
                    delivery_count,
                    mark,
                })
            })
            .collect()
    }
}
