//! The replicated log's entry format: one batch of [`StoreOp`]s as a queue's owner task hands
//! it to the store, so that a replica applying the entry writes what the owner's store would
//! have written (ARCHITECTURE §8: replicate decisions, not commands).
//!
//! The format is versioned and explicit, like the rest of `codec`: a version byte
//! ([`ENTRY_VERSION`]), the number of ops, then each op as a tag byte and fixed-width
//! big-endian fields. A message is written whole once, when it is put; a delete names only its
//! keys and size ([`MessageKeys`]) and decodes as [`StoreOp::DeleteMessage`], which every store
//! applies exactly as the delete of the whole message. Writes to the Raft engine's own key
//! spaces ([`StoreOp::Kv`]) never go through a queue's log and are refused.
//!
//! An entry of a version this build does not know is an error, never skipped: a replica that
//! cannot apply a committed entry must stop rather than diverge.

use ferry_kernel::{DedupRecord, PersistOp, Priority, QueueUid, Seq};

use crate::codec::{self, Reader, Writer};
use crate::{MessageKeys, StoreError, StoreOp};

/// The version written by [`encode_entry`], and the only one [`decode_entry`] reads.
pub const ENTRY_VERSION: u8 = 1;

// Op tags. Stored in replicated logs: never renumber.
const PUT_QUEUE: u8 = 1;
const DELETE_QUEUE: u8 = 2;
const PUT_MESSAGE: u8 = 3;
const DELETE_MESSAGE: u8 = 4;
const DELETE_STORED: u8 = 5;
const SET_DELIVERY_COUNT: u8 = 6;
const RESERVE_SEQ: u8 = 7;
const PUT_DEDUP: u8 = 8;
const DELETE_DEDUP: u8 = 9;
const MARK_DELIVERY: u8 = 10;

fn refused(reason: &str) -> StoreError {
    StoreError::Corrupt {
        what: "log entry",
        reason: reason.to_string(),
    }
}

/// Encodes `ops` as one log entry. Fails only for an op no queue log carries ([`StoreOp::Kv`]).
pub fn encode_entry(ops: &[StoreOp]) -> Result<Vec<u8>, StoreError> {
    let mut w = Writer(Vec::with_capacity(64 * ops.len() + 8));
    w.u8(ENTRY_VERSION);
    w.u32(u32::try_from(ops.len()).map_err(|_| refused("more than 2^32 ops in one entry"))?);
    for op in ops {
        encode_op(&mut w, op)?;
    }
    Ok(w.0)
}

fn encode_op(w: &mut Writer, op: &StoreOp) -> Result<(), StoreError> {
    match op {
        StoreOp::PutQueue(def) => {
            w.u8(PUT_QUEUE);
            w.bytes(&codec::encode_queue(def));
        }
        StoreOp::DeleteQueue(uid) => {
            w.u8(DELETE_QUEUE);
            w.u64(uid.0);
        }
        StoreOp::Queue { uid, op } => encode_queue_op(w, *uid, op),
        StoreOp::DeleteMessage { uid, keys } => encode_delete(w, *uid, keys),
        StoreOp::Kv(_) => {
            return Err(refused(
                "a write to the Raft engine's key spaces cannot go through a queue's log",
            ))
        }
        StoreOp::DeleteShard(_) => {
            return Err(refused(
                "a shard's delete is a replica's own write, never a log entry",
            ))
        }
    }
    Ok(())
}

fn encode_delete(w: &mut Writer, uid: QueueUid, k: &MessageKeys) {
    w.u8(DELETE_MESSAGE);
    w.u64(uid.0);
    w.u8(k.priority.get());
    w.u64(k.seq.0);
    w.u64(k.size_bytes);
    w.opt_str(k.correlation_id.as_deref());
    w.opt_str(k.group_id.as_deref());
    w.opt_u64(k.deliver_at_ms);
}

fn encode_queue_op(w: &mut Writer, uid: QueueUid, op: &PersistOp) {
    match op {
        PersistOp::PutMessage(m) => {
            w.u8(PUT_MESSAGE);
            w.u64(uid.0);
            w.bytes(&codec::encode_message(m));
        }
        PersistOp::DeleteMessage(m) => encode_delete(w, uid, &MessageKeys::of(m)),
        PersistOp::DeleteStored {
            priority,
            from,
            to,
            count,
            bytes,
        } => {
            w.u8(DELETE_STORED);
            w.u64(uid.0);
            w.u8(priority.get());
            for v in [from.0, to.0, *count, *bytes] {
                w.u64(v);
            }
        }
        PersistOp::SetDeliveryCount { seq, count } => {
            w.u8(SET_DELIVERY_COUNT);
            w.u64(uid.0);
            w.u64(seq.0);
            w.u32(*count);
        }
        PersistOp::MarkDelivery { seq, count, mark } => {
            w.u8(MARK_DELIVERY);
            w.u64(uid.0);
            w.u64(seq.0);
            w.u32(*count);
            codec::write_mark(w, mark);
        }
        PersistOp::ReserveSeq { until } => {
            w.u8(RESERVE_SEQ);
            w.u64(uid.0);
            w.u64(until.0);
        }
        PersistOp::PutDedup(r) => {
            w.u8(PUT_DEDUP);
            w.u64(uid.0);
            w.bytes(r.dedup_id.as_bytes());
            w.u64(r.seq.0);
            w.u64(r.expires_ms);
        }
        PersistOp::DeleteDedup { dedup_id } => {
            w.u8(DELETE_DEDUP);
            w.u64(uid.0);
            w.bytes(dedup_id.as_bytes());
        }
    }
}

/// Decodes an entry written by [`encode_entry`]. A delete decodes as
/// [`StoreOp::DeleteMessage`]; everything else as it was encoded.
pub fn decode_entry(buf: &[u8]) -> Result<Vec<StoreOp>, StoreError> {
    let mut r = Reader {
        buf,
        what: "log entry",
    };
    let version = r.u8()?;
    if version != ENTRY_VERSION {
        return Err(r.corrupt(&format!(
            "entry format version {version}; this build reads version {ENTRY_VERSION} only \
             (a node of a newer release wrote it: upgrade this node)"
        )));
    }
    let count = r.u32()? as usize;
    // Every op takes at least 9 bytes: a corrupt count must not reserve gigabytes.
    let mut ops = Vec::with_capacity(count.min(r.buf.len() / 9));
    for _ in 0..count {
        ops.push(decode_op(&mut r)?);
    }
    if !r.buf.is_empty() {
        return Err(r.corrupt("trailing bytes"));
    }
    Ok(ops)
}

fn priority(r: &mut Reader) -> Result<Priority, StoreError> {
    let p = r.u8()?;
    Priority::new(p.into()).map_err(|e| r.corrupt(&e.to_string()))
}

fn decode_op(r: &mut Reader) -> Result<StoreOp, StoreError> {
    let tag = r.u8()?;
    if tag == PUT_QUEUE {
        return Ok(StoreOp::PutQueue(codec::decode_queue(r.bytes()?)?));
    }
    let uid = QueueUid(r.u64()?);
    let op = match tag {
        DELETE_QUEUE => return Ok(StoreOp::DeleteQueue(uid)),
        DELETE_MESSAGE => {
            let keys = MessageKeys {
                priority: priority(r)?,
                seq: Seq(r.u64()?),
                size_bytes: r.u64()?,
                correlation_id: r.opt_string()?,
                group_id: r.opt_string()?,
                deliver_at_ms: r.opt_u64()?,
            };
            return Ok(StoreOp::DeleteMessage { uid, keys });
        }
        PUT_MESSAGE => {
            PersistOp::PutMessage(std::sync::Arc::new(codec::decode_message(uid, r.bytes()?)?))
        }
        DELETE_STORED => PersistOp::DeleteStored {
            priority: priority(r)?,
            from: Seq(r.u64()?),
            to: Seq(r.u64()?),
            count: r.u64()?,
            bytes: r.u64()?,
        },
        SET_DELIVERY_COUNT => PersistOp::SetDeliveryCount {
            seq: Seq(r.u64()?),
            count: r.u32()?,
        },
        MARK_DELIVERY => PersistOp::MarkDelivery {
            seq: Seq(r.u64()?),
            count: r.u32()?,
            mark: codec::read_mark(r)?,
        },
        RESERVE_SEQ => PersistOp::ReserveSeq {
            until: Seq(r.u64()?),
        },
        PUT_DEDUP => PersistOp::PutDedup(DedupRecord {
            dedup_id: r.string()?,
            seq: Seq(r.u64()?),
            expires_ms: r.u64()?,
        }),
        DELETE_DEDUP => PersistOp::DeleteDedup {
            dedup_id: r.string()?,
        },
        other => return Err(r.corrupt(&format!("unknown op tag {other}"))),
    };
    Ok(StoreOp::Queue { uid, op })
}
