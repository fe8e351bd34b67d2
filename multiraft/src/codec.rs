//! The wire format of a batch: every message one node sends another in a round, across groups.
//!
//! ```text
//! batch   = version:u8 (1) message*
//! message = group:varint length:varint raft_message:length bytes
//! ```
//!
//! Varints are LEB128 (7 bits a byte, low first, at most 10 bytes). Decoding never panics:
//! truncated or garbage input is an [`Error::BadBatch`].

use bytes::{BufMut, Bytes, BytesMut};

use crate::error::Error;
use crate::ids::{GroupId, LogPosition, NodeId};

/// The version byte that opens every batch.
pub const BATCH_VERSION: u8 = 1;

/// Encodes messages (group, raft message bytes) into one batch.
pub fn encode_batch<'a>(messages: impl IntoIterator<Item = (GroupId, &'a [u8])>) -> Bytes {
    let mut out = BytesMut::with_capacity(64);
    out.put_u8(BATCH_VERSION);
    for (group, message) in messages {
        put_varint(&mut out, group.0);
        put_varint(&mut out, message.len() as u64);
        out.put_slice(message);
    }
    out.freeze()
}

/// The log position of the snapshot an encoded raft message carries (a snapshot message as
/// [`crate::OutSnapshot::bytes`] holds it); `None` for bytes that are not a snapshot message.
pub fn snapshot_position(message: &[u8]) -> Option<LogPosition> {
    use protobuf::Message as _;
    // `merge_from_bytes`, as the engine decodes: raft-rs's message types implement only it.
    let mut m = raft::eraftpb::Message::default();
    m.merge_from_bytes(message).ok()?;
    if m.get_msg_type() != raft::eraftpb::MessageType::MsgSnapshot {
        return None;
    }
    let meta = m.get_snapshot().get_metadata();
    Some(LogPosition {
        index: meta.index,
        term: meta.term,
    })
}

/// Decodes a batch into (group, raft message bytes) pairs borrowing from `batch`.
pub fn decode_batch(batch: &[u8]) -> Result<Vec<(GroupId, &[u8])>, Error> {
    let bad = |reason, offset| Error::BadBatch {
        from: NodeId(0),
        reason,
        offset,
    };
    let Some((&version, mut rest)) = batch.split_first() else {
        return Err(bad("empty batch, no version byte", 0));
    };
    if version != BATCH_VERSION {
        return Err(bad("unknown batch version", 0));
    }
    let mut messages = Vec::new();
    while !rest.is_empty() {
        let offset = batch.len() - rest.len();
        let group = take_varint(&mut rest).ok_or_else(|| bad("bad group varint", offset))?;
        let offset = batch.len() - rest.len();
        let length = take_varint(&mut rest).ok_or_else(|| bad("bad length varint", offset))?;
        let offset = batch.len() - rest.len();
        let length = usize::try_from(length).map_err(|_| bad("length too large", offset))?;
        if length > rest.len() {
            return Err(bad("message runs past the end of the batch", offset));
        }
        let (message, tail) = rest.split_at(length);
        messages.push((GroupId(group), message));
        rest = tail;
    }
    Ok(messages)
}

fn put_varint(out: &mut BytesMut, mut value: u64) {
    while value >= 0x80 {
        out.put_u8((value as u8 & 0x7f) | 0x80);
        value >>= 7;
    }
    out.put_u8(value as u8);
}

/// Reads a LEB128 varint; `None` on truncation or more than 64 bits.
fn take_varint(input: &mut &[u8]) -> Option<u64> {
    let mut value = 0u64;
    for (i, &byte) in input.iter().enumerate().take(10) {
        let bits = u64::from(byte & 0x7f);
        if i == 9 && bits > 1 {
            return None;
        }
        value |= bits << (7 * i);
        if byte & 0x80 == 0 {
            *input = &input[i + 1..];
            return Some(value);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_snapshot_messages_position_is_read_and_anything_else_is_none() {
        let mut m = raft::eraftpb::Message::default();
        m.set_msg_type(raft::eraftpb::MessageType::MsgSnapshot);
        m.mut_snapshot().mut_metadata().index = 42;
        m.mut_snapshot().mut_metadata().term = 7;
        let bytes = crate::group_log::encode(&m);
        assert_eq!(
            snapshot_position(&bytes),
            Some(LogPosition { index: 42, term: 7 })
        );
        m.set_msg_type(raft::eraftpb::MessageType::MsgAppend);
        assert_eq!(snapshot_position(&crate::group_log::encode(&m)), None);
        assert_eq!(snapshot_position(b"\xff\xff garbage"), None);
    }

    #[test]
    fn a_batch_round_trips_messages_of_many_groups() {
        let big = vec![7u8; 300];
        let messages = [
            (GroupId(0), &b"hello"[..]),
            (GroupId(u64::MAX), &b""[..]),
            (GroupId(300), &big[..]),
        ];
        let batch = encode_batch(messages.iter().copied());
        assert_eq!(batch[0], BATCH_VERSION);
        assert_eq!(decode_batch(&batch).unwrap(), messages.to_vec());
    }

    #[test]
    fn an_empty_batch_holds_no_messages() {
        let batch = encode_batch(std::iter::empty());
        assert_eq!(decode_batch(&batch).unwrap(), vec![]);
    }

    #[test]
    fn every_truncation_of_a_batch_is_an_error_or_a_prefix() {
        let messages = [(GroupId(5), &b"abcdef"[..]), (GroupId(200), &b"xyz"[..])];
        let batch = encode_batch(messages.iter().copied());
        assert!(decode_batch(&[]).is_err());
        for cut in 1..batch.len() {
            match decode_batch(&batch[..cut]) {
                // A cut exactly between two messages decodes to the messages before it.
                Ok(decoded) => assert!(messages.starts_with(&decoded), "cut {cut}"),
                Err(Error::BadBatch { .. }) => {}
                Err(other) => panic!("unexpected error {other}"),
            }
        }
    }

    #[test]
    fn garbage_is_refused_without_panicking() {
        assert!(decode_batch(&[9, 1, 2, 3]).is_err(), "unknown version");
        assert!(
            decode_batch(&[1, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f]).is_err()
        );
        assert!(
            decode_batch(&[1, 1, 0xff, 0xff, 0xff, 0xff, 0x0f]).is_err(),
            "huge length"
        );
        // A deterministic pseudo-random walk over byte strings: never a panic.
        let mut x: u64 = 0x1234_5678;
        for len in 0..2000usize {
            let bytes: Vec<u8> = (0..len % 64)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    x as u8
                })
                .collect();
            let mut input = vec![BATCH_VERSION];
            input.extend_from_slice(&bytes);
            let _ = decode_batch(&input);
        }
    }
}
