//! The on-disk encoding of queue definitions and messages: a version byte, then fixed-width
//! big-endian numbers and length-prefixed strings. Hand-written so the format is explicit and
//! does not change when a struct does.

use std::collections::BTreeMap;

use ferry_kernel::{
    DeadLetterTarget, DeliveryMark, LeaseId, Message, MessageId, PlacementEpoch, Priority,
    PropertyValue, QueueConfig, QueueName, QueueUid, RedeliveryPolicy, Seq, SessionId, ShardId,
};

use crate::{QueueDef, ShardReplica, StoreError, StoredLevel};

const MESSAGE_V1: u8 = 1;
const QUEUE_V1: u8 = 1;
/// V1 plus the redelivery policy, dead-letter and expiry targets and the dedup window.
const QUEUE_V2: u8 = 2;
/// V2 plus the queue limits (`max_messages`, `max_bytes`).
const QUEUE_V3: u8 = 3;
/// V3 plus the queue's shard and placement epoch: written only for a replicated queue, so a
/// queue with replication factor 1 is written as before, byte for byte.
const QUEUE_V4: u8 = 4;
/// V4 plus the key of the queue's receipt handles, shared by every replica (replicated queues
/// only).
const QUEUE_V5: u8 = 5;

pub(crate) struct Writer(pub(crate) Vec<u8>);

impl Writer {
    pub(crate) fn u8(&mut self, v: u8) {
        self.0.push(v);
    }
    pub(crate) fn u32(&mut self, v: u32) {
        self.0.extend_from_slice(&v.to_be_bytes());
    }
    pub(crate) fn u64(&mut self, v: u64) {
        self.0.extend_from_slice(&v.to_be_bytes());
    }
    pub(crate) fn bytes(&mut self, b: &[u8]) {
        // Lengths are bounded by the message size limit, far below u32::MAX.
        self.u32(u32::try_from(b.len()).unwrap_or(u32::MAX));
        self.0.extend_from_slice(b);
    }
    pub(crate) fn opt_u64(&mut self, v: Option<u64>) {
        match v {
            Some(v) => {
                self.u8(1);
                self.u64(v);
            }
            None => self.u8(0),
        }
    }
    pub(crate) fn opt_str(&mut self, v: Option<&str>) {
        match v {
            Some(s) => {
                self.u8(1);
                self.bytes(s.as_bytes());
            }
            None => self.u8(0),
        }
    }
}

pub(crate) struct Reader<'a> {
    pub(crate) buf: &'a [u8],
    pub(crate) what: &'static str,
}

impl<'a> Reader<'a> {
    pub(crate) fn corrupt(&self, reason: &str) -> StoreError {
        StoreError::Corrupt {
            what: self.what,
            reason: reason.to_string(),
        }
    }
    pub(crate) fn take(&mut self, n: usize) -> Result<&'a [u8], StoreError> {
        if self.buf.len() < n {
            return Err(self.corrupt("truncated record"));
        }
        let (head, tail) = self.buf.split_at(n);
        self.buf = tail;
        Ok(head)
    }
    pub(crate) fn u8(&mut self) -> Result<u8, StoreError> {
        Ok(self.take(1)?[0])
    }
    pub(crate) fn u32(&mut self) -> Result<u32, StoreError> {
        let b = self.take(4)?;
        Ok(u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    }
    pub(crate) fn u64(&mut self) -> Result<u64, StoreError> {
        let mut a = [0u8; 8];
        a.copy_from_slice(self.take(8)?);
        Ok(u64::from_be_bytes(a))
    }
    pub(crate) fn bytes(&mut self) -> Result<&'a [u8], StoreError> {
        let n = self.u32()? as usize;
        self.take(n)
    }
    pub(crate) fn string(&mut self) -> Result<String, StoreError> {
        String::from_utf8(self.bytes()?.to_vec()).map_err(|_| self.corrupt("invalid UTF-8"))
    }
    pub(crate) fn opt_u64(&mut self) -> Result<Option<u64>, StoreError> {
        match self.u8()? {
            0 => Ok(None),
            1 => self.u64().map(Some),
            _ => Err(self.corrupt("bad option tag")),
        }
    }
    pub(crate) fn opt_string(&mut self) -> Result<Option<String>, StoreError> {
        match self.u8()? {
            0 => Ok(None),
            1 => self.string().map(Some),
            _ => Err(self.corrupt("bad option tag")),
        }
    }
    pub(crate) fn queue_name(&mut self) -> Result<QueueName, StoreError> {
        let s = self.string()?;
        QueueName::new(s).map_err(|e| self.corrupt(&e.to_string()))
    }
}

pub(crate) fn encode_message(m: &Message) -> Vec<u8> {
    let mut w = Writer(Vec::with_capacity(m.body.len() + 64));
    w.u8(MESSAGE_V1);
    w.u64(m.seq.0);
    w.u64(m.timestamp_ms);
    w.u8(u8::from(m.persistent));
    w.u8(m.priority.get());
    w.opt_u64(m.expiration_ms);
    w.opt_u64(m.deliver_at_ms);
    w.opt_str(m.correlation_id.as_deref());
    w.opt_str(m.reply_to.as_ref().map(QueueName::as_str));
    w.opt_str(m.jms_type.as_deref());
    w.opt_str(m.dedup_id.as_deref());
    w.opt_str(m.group_id.as_deref());
    w.u32(u32::try_from(m.properties.len()).unwrap_or(u32::MAX));
    for (k, v) in &m.properties {
        w.bytes(k.as_bytes());
        match v {
            PropertyValue::Bool(b) => {
                w.u8(0);
                w.u8(u8::from(*b));
            }
            PropertyValue::Int(i) => {
                w.u8(1);
                w.u32(*i as u32);
            }
            PropertyValue::Long(l) => {
                w.u8(2);
                w.u64(*l as u64);
            }
            PropertyValue::Double(d) => {
                w.u8(3);
                w.u64(d.to_bits());
            }
            PropertyValue::String(s) => {
                w.u8(4);
                w.bytes(s.as_bytes());
            }
        }
    }
    w.bytes(&m.body);
    w.0
}

pub(crate) fn decode_message(uid: QueueUid, buf: &[u8]) -> Result<Message, StoreError> {
    let mut r = Reader {
        buf,
        what: "message",
    };
    if r.u8()? != MESSAGE_V1 {
        return Err(r.corrupt("unknown message format version"));
    }
    let seq = Seq(r.u64()?);
    let timestamp_ms = r.u64()?;
    let persistent = r.u8()? != 0;
    let priority = Priority::new(r.u8()?.into()).map_err(|e| r.corrupt(&e.to_string()))?;
    let expiration_ms = r.opt_u64()?;
    let deliver_at_ms = r.opt_u64()?;
    let correlation_id = r.opt_string()?;
    let reply_to = r
        .opt_string()?
        .map(QueueName::new)
        .transpose()
        .map_err(|e| r.corrupt(&e.to_string()))?;
    let jms_type = r.opt_string()?;
    let dedup_id = r.opt_string()?;
    let group_id = r.opt_string()?;
    let mut properties = BTreeMap::new();
    for _ in 0..r.u32()? {
        let k = r.string()?;
        let v = match r.u8()? {
            0 => PropertyValue::Bool(r.u8()? != 0),
            1 => PropertyValue::Int(r.u32()? as i32),
            2 => PropertyValue::Long(r.u64()? as i64),
            3 => PropertyValue::Double(f64::from_bits(r.u64()?)),
            4 => PropertyValue::String(r.string()?),
            _ => return Err(r.corrupt("unknown property type")),
        };
        properties.insert(k, v);
    }
    let body = bytes::Bytes::copy_from_slice(r.bytes()?);
    if !r.buf.is_empty() {
        return Err(r.corrupt("trailing bytes"));
    }
    Ok(Message {
        id: MessageId::new(uid, seq),
        seq,
        body,
        properties,
        correlation_id,
        reply_to,
        jms_type,
        priority,
        timestamp_ms,
        expiration_ms,
        deliver_at_ms,
        persistent,
        dedup_id,
        group_id,
    })
}

pub(crate) fn encode_queue(d: &QueueDef) -> Vec<u8> {
    let mut w = Writer(Vec::with_capacity(128));
    let c = &d.config;
    w.u8(match d.replica {
        None => QUEUE_V3,
        Some(ShardReplica {
            handle_key: None, ..
        }) => QUEUE_V4,
        Some(_) => QUEUE_V5,
    });
    w.u64(d.uid.0);
    w.bytes(d.name.as_str().as_bytes());
    w.u64(c.default_lease_ms);
    w.u64(c.lease_max_ms);
    w.u64(c.max_message_size_bytes);
    w.u32(c.receive_batch_max);
    w.u64(c.waiters_max as u64);
    let r = &c.redelivery;
    w.opt_u64(r.max_redeliveries.map(u64::from));
    w.u64(r.initial_delay_ms);
    w.u64(r.delay_ms);
    w.u8(u8::from(r.exponential_backoff));
    w.u64(r.backoff_multiplier.to_bits());
    w.u8(r.collision_avoidance_percent);
    w.u64(r.max_delay_ms);
    target(&mut w, &c.dead_letter);
    target(&mut w, &c.expiry);
    w.u64(c.dedup_window_ms);
    w.opt_u64(c.max_messages);
    w.opt_u64(c.max_bytes);
    if let Some(r) = d.replica {
        w.u64(r.shard.0);
        w.u64(r.epoch.get());
        if let Some((k0, k1)) = r.handle_key {
            w.u64(k0);
            w.u64(k1);
        }
    }
    w.0
}

fn target(w: &mut Writer, t: &DeadLetterTarget) {
    match t {
        DeadLetterTarget::Default => w.u8(0),
        DeadLetterTarget::Queue(q) => {
            w.u8(1);
            w.bytes(q.as_str().as_bytes());
        }
        DeadLetterTarget::Discard => w.u8(2),
    }
}

fn read_target(r: &mut Reader) -> Result<DeadLetterTarget, StoreError> {
    Ok(match r.u8()? {
        0 => DeadLetterTarget::Default,
        1 => DeadLetterTarget::Queue(r.queue_name()?),
        2 => DeadLetterTarget::Discard,
        _ => return Err(r.corrupt("unknown dead-letter target")),
    })
}

pub(crate) fn decode_queue(buf: &[u8]) -> Result<QueueDef, StoreError> {
    let mut r = Reader {
        buf,
        what: "queue definition",
    };
    let version = r.u8()?;
    if !(QUEUE_V1..=QUEUE_V5).contains(&version) {
        return Err(r.corrupt("unknown queue format version"));
    }
    let uid = QueueUid(r.u64()?);
    let name = r.queue_name()?;
    let mut config = QueueConfig {
        default_lease_ms: r.u64()?,
        lease_max_ms: r.u64()?,
        max_message_size_bytes: r.u64()?,
        receive_batch_max: r.u32()?,
        waiters_max: usize::try_from(r.u64()?).unwrap_or(usize::MAX),
        ..QueueConfig::default()
    };
    if version >= QUEUE_V2 {
        config.redelivery = RedeliveryPolicy {
            max_redeliveries: r.opt_u64()?.map(|v| u32::try_from(v).unwrap_or(u32::MAX)),
            initial_delay_ms: r.u64()?,
            delay_ms: r.u64()?,
            exponential_backoff: r.u8()? != 0,
            backoff_multiplier: f64::from_bits(r.u64()?),
            collision_avoidance_percent: r.u8()?,
            max_delay_ms: r.u64()?,
        };
        config.dead_letter = read_target(&mut r)?;
        config.expiry = read_target(&mut r)?;
        config.dedup_window_ms = r.u64()?;
    }
    if version >= QUEUE_V3 {
        config.max_messages = r.opt_u64()?;
        config.max_bytes = r.opt_u64()?;
    }
    let replica = if version >= QUEUE_V4 {
        Some(ShardReplica {
            shard: ShardId(r.u64()?),
            epoch: PlacementEpoch::new(r.u64()?),
            handle_key: if version >= QUEUE_V5 {
                Some((r.u64()?, r.u64()?))
            } else {
                None
            },
        })
    } else {
        None
    };
    if !r.buf.is_empty() {
        return Err(r.corrupt("trailing bytes"));
    }
    Ok(QueueDef {
        name,
        uid,
        config,
        replica,
    })
}

// Delivery mark kinds, in the deliveries value and in log entries: never renumber.
const MARK_LEASED: u8 = 1;
const MARK_BACKOFF: u8 = 2;

/// A [`DeliveryMark`]: its kind, then its fields (a lease: id, session as an optional u64,
/// expiry and length; a back-off: its end).
pub(crate) fn write_mark(w: &mut Writer, mark: &DeliveryMark) {
    match *mark {
        DeliveryMark::Leased {
            lease,
            owner,
            until_ms,
            lease_ms,
        } => {
            w.u8(MARK_LEASED);
            w.u64(lease.0);
            w.opt_u64(owner.map(|o| o.0));
            w.u64(until_ms);
            w.u64(lease_ms);
        }
        DeliveryMark::Backoff { until_ms } => {
            w.u8(MARK_BACKOFF);
            w.u64(until_ms);
        }
    }
}

pub(crate) fn read_mark(r: &mut Reader) -> Result<DeliveryMark, StoreError> {
    Ok(match r.u8()? {
        MARK_LEASED => DeliveryMark::Leased {
            lease: LeaseId(r.u64()?),
            owner: r.opt_u64()?.map(SessionId),
            until_ms: r.u64()?,
            lease_ms: r.u64()?,
        },
        MARK_BACKOFF => DeliveryMark::Backoff { until_ms: r.u64()? },
        _ => return Err(r.corrupt("unknown delivery mark")),
    })
}

/// A message's value in the deliveries key space: its delivery count (4 bytes, all a queue
/// kept by one node ever writes), then, for a replicated queue, its mark.
pub(crate) fn encode_delivery(count: u32, mark: &DeliveryMark) -> Vec<u8> {
    let mut w = Writer(Vec::with_capacity(4 + 34));
    w.u32(count);
    write_mark(&mut w, mark);
    w.0
}

pub(crate) fn decode_delivery(v: &[u8]) -> Result<(u32, Option<DeliveryMark>), StoreError> {
    let mut r = Reader {
        buf: v,
        what: "delivery count",
    };
    let count = r.u32()?;
    let mark = if r.buf.is_empty() {
        None
    } else {
        Some(read_mark(&mut r)?)
    };
    if !r.buf.is_empty() {
        return Err(r.corrupt("trailing bytes"));
    }
    Ok((count, mark))
}

/// A dedup record's value: when it expires, and the sequence number of the message it produced.
pub(crate) fn encode_dedup(seq: Seq, expires_ms: u64) -> [u8; 16] {
    let mut v = [0u8; 16];
    v[..8].copy_from_slice(&expires_ms.to_be_bytes());
    v[8..].copy_from_slice(&seq.0.to_be_bytes());
    v
}

pub(crate) fn decode_dedup(v: &[u8]) -> Result<(Seq, u64), StoreError> {
    let mut r = Reader {
        buf: v,
        what: "dedup record",
    };
    let expires = r.u64()?;
    Ok((Seq(r.u64()?), expires))
}

/// A change to one priority's counts, or (the same shape) the counts themselves: message count
/// and bytes as two big-endian u64s. A negative delta is stored as its two's complement, so
/// adding with wrap-around subtracts; the merge operator adds every operand to the value.
pub(crate) fn encode_counts(count: i64, bytes: i64) -> [u8; 16] {
    let mut v = [0u8; 16];
    v[..8].copy_from_slice(&count.to_be_bytes());
    v[8..].copy_from_slice(&bytes.to_be_bytes());
    v
}

/// Adds counts encoded by [`encode_counts`]: `None` when a value is not 16 bytes.
pub(crate) fn add_counts<'a>(values: impl IntoIterator<Item = &'a [u8]>) -> Option<[u8; 16]> {
    let (mut count, mut bytes) = (0i64, 0i64);
    for v in values {
        let (c, b) = split_counts(v)?;
        count = count.wrapping_add(c);
        bytes = bytes.wrapping_add(b);
    }
    Some(encode_counts(count, bytes))
}

fn split_counts(v: &[u8]) -> Option<(i64, i64)> {
    let v: &[u8; 16] = v.try_into().ok()?;
    let (c, b) = v.split_at(8);
    Some((
        i64::from_be_bytes(c.try_into().ok()?),
        i64::from_be_bytes(b.try_into().ok()?),
    ))
}

/// The counts of one priority as recovered. A negative total means the kernel deleted more than
/// it put (a bug elsewhere); it reads as zero, with a warning, so the queue still opens.
pub(crate) fn stored_level(count: i64, bytes: i64) -> StoredLevel {
    if count < 0 || bytes < 0 {
        tracing::warn!(
            count,
            bytes,
            "stored counts went negative; reading them as zero"
        );
    }
    StoredLevel {
        count: u64::try_from(count).unwrap_or(0),
        bytes: u64::try_from(bytes).unwrap_or(0),
    }
}

/// Decodes a counts value; `Corrupt` when it is not 16 bytes.
pub(crate) fn decode_counts(v: &[u8]) -> Result<StoredLevel, StoreError> {
    let (count, bytes) = split_counts(v).ok_or_else(|| StoreError::Corrupt {
        what: "message counts",
        reason: format!("{} bytes instead of 16", v.len()),
    })?;
    Ok(stored_level(count, bytes))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn prop_value() -> impl Strategy<Value = PropertyValue> {
        prop_oneof![
            any::<bool>().prop_map(PropertyValue::Bool),
            any::<i32>().prop_map(PropertyValue::Int),
            any::<i64>().prop_map(PropertyValue::Long),
            any::<f64>()
                .prop_filter("NaN != NaN", |d| !d.is_nan())
                .prop_map(PropertyValue::Double),
            ".*".prop_map(PropertyValue::String),
        ]
    }

    proptest! {
        #[test]
        fn message_round_trips(
            seq in any::<u64>(), ts in any::<u64>(), persistent in any::<bool>(), prio in 0u32..10,
            exp in any::<Option<u64>>(), at in any::<Option<u64>>(), corr in any::<Option<String>>(),
            body in any::<Vec<u8>>(), props in proptest::collection::btree_map("[a-z]{1,8}", prop_value(), 0..5),
        ) {
            let m = Message {
                id: MessageId::new(QueueUid(9), Seq(seq)), seq: Seq(seq), body: body.into(), properties: props,
                correlation_id: corr, reply_to: Some(QueueName::new("reply.q").unwrap()),
                jms_type: Some("t".into()), priority: Priority::new(prio).unwrap(), timestamp_ms: ts,
                expiration_ms: exp, deliver_at_ms: at, persistent, dedup_id: None, group_id: Some("g".into()),
            };
            prop_assert_eq!(decode_message(QueueUid(9), &encode_message(&m)).unwrap(), m);
        }
    }

    #[test]
    fn truncated_records_are_reported_not_panicked_on() {
        let d = QueueDef {
            name: QueueName::new("q").unwrap(),
            uid: QueueUid(1),
            replica: None,
            config: QueueConfig::default(),
        };
        let bytes = encode_queue(&d);
        assert_eq!(decode_queue(&bytes).unwrap(), d);
        for n in 0..bytes.len() {
            assert!(decode_queue(&bytes[..n]).is_err());
        }
    }

    #[test]
    fn queue_settings_round_trip() {
        let d = QueueDef {
            name: QueueName::new("orders").unwrap(),
            uid: QueueUid(77),
            replica: None,
            config: QueueConfig {
                redelivery: RedeliveryPolicy {
                    max_redeliveries: None,
                    initial_delay_ms: 10,
                    delay_ms: 20,
                    exponential_backoff: true,
                    backoff_multiplier: 1.5,
                    collision_avoidance_percent: 15,
                    max_delay_ms: 99_000,
                },
                dead_letter: DeadLetterTarget::Queue(QueueName::new("parking").unwrap()),
                expiry: DeadLetterTarget::Discard,
                dedup_window_ms: 5,
                max_messages: Some(1_000_000),
                max_bytes: Some(u64::MAX),
                ..QueueConfig::default()
            },
        };
        assert_eq!(decode_queue(&encode_queue(&d)).unwrap(), d);
    }

    /// A replicated queue's definition carries its shard and epoch (version 4); a queue with
    /// replication factor 1 is still written as version 3, byte for byte as before.
    #[test]
    fn a_replicated_definition_names_its_shard_and_an_unreplicated_one_is_written_as_before() {
        let local = QueueDef {
            name: QueueName::new("plain").unwrap(),
            uid: QueueUid(5),
            replica: None,
            config: QueueConfig::default(),
        };
        let bytes = encode_queue(&local);
        assert_eq!(bytes[0], QUEUE_V3);
        assert_eq!(decode_queue(&bytes).unwrap(), local);
        let replicated = QueueDef {
            replica: Some(ShardReplica {
                shard: ShardId(7),
                epoch: PlacementEpoch::new(41),
                handle_key: None,
            }),
            ..local
        };
        let v4 = encode_queue(&replicated);
        assert_eq!(v4[0], QUEUE_V4);
        assert_eq!(v4.len(), bytes.len() + 16);
        assert_eq!(decode_queue(&v4).unwrap(), replicated);
        for n in 0..v4.len() {
            assert!(decode_queue(&v4[..n]).is_err());
        }
        let mut keyed = replicated.clone();
        if let Some(r) = keyed.replica.as_mut() {
            r.handle_key = Some((0x0123_4567, u64::MAX - 3));
        }
        let v5 = encode_queue(&keyed);
        assert_eq!(v5[0], QUEUE_V5);
        assert_eq!(v5.len(), v4.len() + 16);
        assert_eq!(decode_queue(&v5).unwrap(), keyed);
        for n in 0..v5.len() {
            assert!(decode_queue(&v5[..n]).is_err());
        }
    }

    #[test]
    fn a_delivery_value_is_a_count_or_a_count_and_its_mark() {
        use ferry_kernel::{DeliveryMark, LeaseId, SessionId};
        assert_eq!(decode_delivery(&7u32.to_be_bytes()).unwrap(), (7, None));
        for mark in [
            DeliveryMark::Leased {
                lease: LeaseId(3),
                owner: Some(SessionId(u64::MAX)),
                until_ms: 99,
                lease_ms: 30_000,
            },
            DeliveryMark::Leased {
                lease: LeaseId(4),
                owner: None,
                until_ms: 0,
                lease_ms: 1,
            },
            DeliveryMark::Backoff { until_ms: 12_345 },
        ] {
            let v = encode_delivery(2, &mark);
            assert_eq!(decode_delivery(&v).unwrap(), (2, Some(mark)));
            for n in 0..v.len() {
                if n != 4 {
                    assert!(
                        decode_delivery(&v[..n]).is_err(),
                        "{n} of {} bytes",
                        v.len()
                    );
                }
            }
            let mut longer = v.clone();
            longer.push(0);
            assert!(decode_delivery(&longer).is_err());
        }
    }

    #[test]
    fn version_1_definitions_read_with_default_policies() {
        let d = QueueDef {
            name: QueueName::new("old").unwrap(),
            uid: QueueUid(3),
            replica: None,
            config: QueueConfig {
                default_lease_ms: 1_234,
                ..QueueConfig::default()
            },
        };
        let mut w = Writer(vec![]);
        w.u8(QUEUE_V1);
        w.u64(3);
        w.bytes(b"old");
        w.u64(1_234);
        w.u64(d.config.lease_max_ms);
        w.u64(d.config.max_message_size_bytes);
        w.u32(d.config.receive_batch_max);
        w.u64(d.config.waiters_max as u64);
        assert_eq!(decode_queue(&w.0).unwrap(), d);
    }

    #[test]
    fn version_2_definitions_read_without_limits() {
        let d = QueueDef {
            name: QueueName::new("v2").unwrap(),
            uid: QueueUid(4),
            replica: None,
            config: QueueConfig {
                dedup_window_ms: 42,
                expiry: DeadLetterTarget::Discard,
                ..QueueConfig::default()
            },
        };
        // A V2 record is a V3 record without the two limits (here both absent: one tag byte each).
        let mut v2 = encode_queue(&d);
        assert_eq!(v2.split_off(v2.len() - 2), [0, 0]);
        v2[0] = QUEUE_V2;
        assert_eq!(decode_queue(&v2).unwrap(), d);
        let limited = QueueDef {
            config: QueueConfig {
                max_messages: Some(7),
                ..d.config.clone()
            },
            ..d.clone()
        };
        let mut v2_with_extra = encode_queue(&limited);
        v2_with_extra[0] = QUEUE_V2;
        assert!(
            decode_queue(&v2_with_extra).is_err(),
            "a V2 record never carries limits"
        );
    }

    #[test]
    fn counts_add_signed_deltas() {
        let total = add_counts([
            &encode_counts(3, 300)[..],
            &encode_counts(-1, -120)[..],
            &encode_counts(2, 20)[..],
        ])
        .unwrap();
        assert_eq!(
            decode_counts(&total).unwrap(),
            StoredLevel {
                count: 4,
                bytes: 200
            }
        );
        let negative = add_counts([&encode_counts(-1, -5)[..]]).unwrap();
        assert_eq!(decode_counts(&negative).unwrap(), StoredLevel::default());
        assert!(add_counts([&[1u8, 2][..]]).is_none());
        assert!(decode_counts(&[0; 15]).is_err());
    }
}
