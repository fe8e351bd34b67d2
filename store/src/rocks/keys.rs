//! Key layouts of the RocksDB store (see the module docs of `rocks`). Every number is big-endian
//! so keys sort by it.

use ferry_kernel::{IndexedHeader, Priority, QueueUid, Seq};

use crate::{header_kind, priority_of_rank, rank};

/// `uid ++ rank ++ seq`.
pub(super) const MESSAGE_KEY_LEN: usize = 17;
/// What follows the value in a header index key: `rank ++ seq`.
const INDEX_SUFFIX_LEN: usize = 9;
/// `uid ++ kind ++ len`, before the value in a header index key.
const INDEX_HEAD_LEN: usize = 11;
/// Header values longer than this are indexed by their first `INDEX_VALUE_MAX` bytes (the
/// length field is a u16); lookups then check the value on the message itself.
pub(super) const INDEX_VALUE_MAX: usize = u16::MAX as usize;

pub(super) fn uid_prefix(uid: QueueUid) -> [u8; 8] {
    uid.0.to_be_bytes()
}

/// The first key after every key starting with `prefix`; `None` when there is none (the prefix
/// is all `0xFF`, so every later key starts with it).
pub(super) fn prefix_end(prefix: &[u8]) -> Option<Vec<u8>> {
    let last = prefix.iter().rposition(|&b| b != 0xFF)?;
    let mut end = prefix[..=last].to_vec();
    end[last] += 1;
    Some(end)
}

/// `queue_messages`: `uid ++ (9 - priority) ++ seq`, so a queue's messages sort in delivery
/// order.
pub(super) fn message_key(uid: QueueUid, p: Priority, seq: Seq) -> [u8; MESSAGE_KEY_LEN] {
    let mut k = [0u8; MESSAGE_KEY_LEN];
    k[..8].copy_from_slice(&uid.0.to_be_bytes());
    k[8] = rank(p);
    k[9..].copy_from_slice(&seq.0.to_be_bytes());
    k
}

/// `deliveries` (and the old `messages` layout): `uid ++ seq`.
pub(super) fn delivery_key(uid: QueueUid, seq: Seq) -> [u8; 16] {
    let mut k = [0u8; 16];
    k[..8].copy_from_slice(&uid.0.to_be_bytes());
    k[8..].copy_from_slice(&seq.0.to_be_bytes());
    k
}

/// `delayed`: `uid ++ deliver_at_ms ++ seq`, so a queue's delayed messages sort by delivery
/// time.
pub(super) fn delayed_key(uid: QueueUid, deliver_at_ms: u64, seq: Seq) -> [u8; 24] {
    let mut k = [0u8; 24];
    k[..8].copy_from_slice(&uid.0.to_be_bytes());
    k[8..16].copy_from_slice(&deliver_at_ms.to_be_bytes());
    k[16..].copy_from_slice(&seq.0.to_be_bytes());
    k
}

/// The seq a `delayed` key ends with.
pub(super) fn delayed_seq(key: &[u8]) -> Option<Seq> {
    key.get(16..).and_then(be_u64).map(Seq)
}

/// `counts`: `uid ++ priority`.
pub(super) fn counts_key(uid: QueueUid, p: Priority) -> [u8; 9] {
    let mut k = [0u8; 9];
    k[..8].copy_from_slice(&uid.0.to_be_bytes());
    k[8] = p.get();
    k
}

pub(super) fn seq_key(uid: QueueUid) -> [u8; 12] {
    let mut k = [0u8; 12];
    k[..4].copy_from_slice(b"seq/");
    k[4..].copy_from_slice(&uid.0.to_be_bytes());
    k
}

pub(super) fn dedup_key(uid: QueueUid, dedup_id: &str) -> Vec<u8> {
    let mut k = Vec::with_capacity(8 + dedup_id.len());
    k.extend_from_slice(&uid.0.to_be_bytes());
    k.extend_from_slice(dedup_id.as_bytes());
    k
}

/// The part of a header value the index holds.
pub(super) fn indexed_value(value: &str) -> &[u8] {
    let b = value.as_bytes();
    &b[..b.len().min(INDEX_VALUE_MAX)]
}

/// `uid ++ kind ++ len(u16) ++ value`: every entry of one header value starts with it.
pub(super) fn index_prefix(uid: QueueUid, h: IndexedHeader, value: &str) -> Vec<u8> {
    let v = indexed_value(value);
    let mut k = Vec::with_capacity(INDEX_HEAD_LEN + v.len() + INDEX_SUFFIX_LEN);
    k.extend_from_slice(&uid.0.to_be_bytes());
    k.push(header_kind(h));
    // `indexed_value` keeps at most u16::MAX bytes.
    k.extend_from_slice(&u16::try_from(v.len()).unwrap_or(u16::MAX).to_be_bytes());
    k.extend_from_slice(v);
    k
}

/// `header_index`: `index_prefix ++ (9 - priority) ++ seq`, so one value's entries sort in
/// delivery order.
pub(super) fn index_key(
    uid: QueueUid,
    h: IndexedHeader,
    value: &str,
    p: Priority,
    seq: Seq,
) -> Vec<u8> {
    let mut k = index_prefix(uid, h, value);
    k.push(rank(p));
    k.extend_from_slice(&seq.0.to_be_bytes());
    k
}

/// A full-length key at `rank` and seq 0 after `prefix`: iteration bounds over one value's
/// entries (full length, so the prefix extractor sees the value's prefix in them).
pub(super) fn index_bound(prefix: &[u8], rank: u8) -> Vec<u8> {
    let mut k = Vec::with_capacity(prefix.len() + INDEX_SUFFIX_LEN);
    k.extend_from_slice(prefix);
    k.push(rank);
    k.extend_from_slice(&[0; 8]);
    k
}

/// The (priority, seq) an index key ends with.
pub(super) fn index_entry(key: &[u8]) -> Option<(Priority, Seq)> {
    let suffix = key.get(key.len().checked_sub(INDEX_SUFFIX_LEN)?..)?;
    let p = priority_of_rank(suffix[0])?;
    Some((p, Seq(u64::from_be_bytes(suffix[1..].try_into().ok()?))))
}

/// The prefix extractor of `header_index`: the key without `rank ++ seq`. Called by RocksDB only
/// for keys [`index_key_in_domain`] accepts; never panics on others.
pub(super) fn index_key_prefix(key: &[u8]) -> &[u8] {
    &key[..key.len().saturating_sub(INDEX_SUFFIX_LEN)]
}

/// Whether `key` has the shape of a header index key (its length field agrees with its length).
pub(super) fn index_key_in_domain(key: &[u8]) -> bool {
    match key.get(9..INDEX_HEAD_LEN) {
        Some(len) => {
            let len = usize::from(u16::from_be_bytes([len[0], len[1]]));
            key.len() == INDEX_HEAD_LEN + len + INDEX_SUFFIX_LEN
        }
        None => false,
    }
}

pub(super) fn be_u64(b: &[u8]) -> Option<u64> {
    Some(u64::from_be_bytes(b.try_into().ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The (priority, seq) a `queue_messages` key names.
    fn message_entry(key: &[u8]) -> Option<(Priority, Seq)> {
        if key.len() != MESSAGE_KEY_LEN {
            return None;
        }
        let p = priority_of_rank(key[8])?;
        Some((p, Seq(u64::from_be_bytes(key[9..].try_into().ok()?))))
    }

    fn p(n: u32) -> Priority {
        Priority::new(n).unwrap()
    }

    #[test]
    fn message_keys_sort_in_delivery_order_within_a_queue() {
        let uid = QueueUid(5);
        let mut keys = [
            message_key(uid, p(0), Seq(1)),
            message_key(uid, p(9), Seq(7)),
            message_key(uid, p(4), Seq(2)),
            message_key(uid, p(9), Seq(3)),
            message_key(QueueUid(4), p(0), Seq(9)),
        ];
        keys.sort();
        let order: Vec<_> = keys.iter().map(|k| message_entry(k).unwrap()).collect();
        assert_eq!(
            order,
            [
                (p(0), Seq(9)),
                (p(9), Seq(3)),
                (p(9), Seq(7)),
                (p(4), Seq(2)),
                (p(0), Seq(1))
            ]
        );
    }

    #[test]
    fn index_keys_of_one_value_never_interleave_with_another_value() {
        let uid = QueueUid(1);
        let h = IndexedHeader::CorrelationId;
        // "a" followed by a rank byte must not fall inside the range of "a\u{1}..." or vice versa.
        let short = index_prefix(uid, h, "a");
        let long = index_key(uid, h, "a\u{1}", p(9), Seq(0));
        assert!(long < index_bound(&short, 0) || long >= index_bound(&short, 10));
        let k = index_key(uid, h, "a", p(3), Seq(42));
        assert!(index_key_in_domain(&k));
        assert_eq!(index_key_prefix(&k), &short[..]);
        assert_eq!(index_entry(&k), Some((p(3), Seq(42))));
        assert!(!index_key_in_domain(&k[..k.len() - 1]));
        assert!(index_bound(&short, 0) <= k && k < index_bound(&short, 10));
    }

    #[test]
    fn long_values_are_indexed_by_their_first_bytes() {
        let long = "x".repeat(INDEX_VALUE_MAX + 10);
        let k = index_key(QueueUid(1), IndexedHeader::GroupId, &long, p(4), Seq(1));
        assert!(index_key_in_domain(&k));
        assert_eq!(k.len(), 11 + INDEX_VALUE_MAX + 9);
    }

    #[test]
    fn prefix_end_is_the_first_key_after_the_prefix() {
        assert_eq!(prefix_end(&[0, 1]), Some(vec![0, 2]));
        assert_eq!(prefix_end(&[0, 0xFF]), Some(vec![1]));
        assert_eq!(prefix_end(&[0xFF, 0xFF]), None);
    }
}
