//! Ids, names and the message itself.

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;
use std::sync::Arc;

use crate::error::KernelError;

/// A queue's name. 1-200 characters of `A-Z a-z 0-9 . _ - :`; not starting with `.` or `-`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct QueueName(String);

impl QueueName {
    pub const LEN_MAX: usize = 200;

    pub fn new(name: impl Into<String>) -> Result<Self, KernelError> {
        let name = name.into();
        let bad = |reason: String| KernelError::InvalidArgument {
            field: "queue",
            reason,
        };
        if name.is_empty() {
            return Err(bad("the queue name is empty".into()));
        }
        if name.len() > Self::LEN_MAX {
            return Err(bad(format!(
                "the queue name is {} bytes, the limit is {}",
                name.len(),
                Self::LEN_MAX
            )));
        }
        if let Some((i, c)) = name
            .char_indices()
            .find(|&(_, c)| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-' | ':')))
        {
            return Err(bad(format!(
                "character {c:?} at position {i} of {name:?} is not allowed (use A-Z a-z 0-9 . _ - :)"
            )));
        }
        if name.starts_with(['.', '-']) {
            return Err(bad(format!("{name:?} must not start with '.' or '-'")));
        }
        Ok(Self(name))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for QueueName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A node's id: 1-64 characters of `a-z 0-9 _ -`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct NodeId(String);

impl NodeId {
    pub fn new(id: impl Into<String>) -> Result<Self, KernelError> {
        let id = id.into();
        let ok = !id.is_empty()
            && id.len() <= 64
            && id
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_' || c == '-');
        if ok {
            Ok(Self(id))
        } else {
            Err(KernelError::InvalidArgument {
                field: "node_id",
                reason: format!("{id:?} must be 1-64 characters of a-z 0-9 _ -"),
            })
        }
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl std::borrow::Borrow<str> for NodeId {
    fn borrow(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for NodeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A queue's identity for its whole life, chosen when it is created. Storage keys and message ids
/// use it, so a queue deleted and created again under the same name never reuses an id.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct QueueUid(pub u64);

/// A message's position in its queue, assigned at send, never reused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct Seq(pub u64);

impl fmt::Display for Seq {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// One delivery of one message: a new lease id every time a message is handed out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct LeaseId(pub u64);

/// The session that owns a delivery. Leases owned by a session return when it closes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SessionId(pub u64);

impl fmt::Display for SessionId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:016x}", self.0)
    }
}

impl FromStr for SessionId {
    type Err = KernelError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        u64::from_str_radix(s, 16)
            .map(SessionId)
            .map_err(|_| KernelError::InvalidArgument {
                field: "session_id",
                reason: format!("{s:?} is not a session id (16 hex digits from CreateSession)"),
            })
    }
}

/// The JMS message id, `ID:<queue uid>-<seq>`, assigned by the server at send.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct MessageId(String);

impl MessageId {
    pub fn new(uid: QueueUid, seq: Seq) -> Self {
        Self(format!("ID:{:016x}-{}", uid.0, seq.0))
    }

    /// Reads an id as `Send` returned it.
    pub fn parse(text: &str) -> Result<Self, KernelError> {
        let (uid, seq) = Self::parts(text)?;
        Ok(Self::new(uid, seq))
    }

    /// The queue incarnation and sequence number an id names.
    pub fn parts(text: &str) -> Result<(QueueUid, Seq), KernelError> {
        text.strip_prefix("ID:")
            .and_then(|rest| rest.split_once('-'))
            .and_then(|(uid, seq)| {
                Some((u64::from_str_radix(uid, 16).ok()?, seq.parse::<u64>().ok()?))
            })
            .map(|(uid, seq)| (QueueUid(uid), Seq(seq)))
            .filter(|&(uid, seq)| Self::new(uid, seq).0 == text)
            .ok_or_else(|| KernelError::InvalidArgument {
                field: "message_id",
                reason: format!(
                    "{text:?} is not a message id (they look like ID:5c0e1f2a3b4d5e6f-42)"
                ),
            })
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for MessageId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// JMS priority 0-9; higher is delivered first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Priority(u8);

impl Priority {
    pub const DEFAULT: Priority = Priority(4);
    pub const MAX: u8 = 9;

    pub fn new(p: u32) -> Result<Self, KernelError> {
        if p <= u32::from(Self::MAX) {
            Ok(Self(p as u8))
        } else {
            Err(KernelError::InvalidArgument {
                field: "priority",
                reason: format!("{p} is outside 0-9"),
            })
        }
    }

    pub fn get(self) -> u8 {
        self.0
    }
}

impl Default for Priority {
    fn default() -> Self {
        Self::DEFAULT
    }
}

/// A typed message property (JMS: boolean, int, long, double, String).
#[derive(Debug, Clone, PartialEq)]
pub enum PropertyValue {
    Bool(bool),
    Int(i32),
    Long(i64),
    Double(f64),
    String(String),
}

impl PropertyValue {
    fn size_bytes(&self) -> u64 {
        match self {
            PropertyValue::Bool(_) => 1,
            PropertyValue::Int(_) => 4,
            PropertyValue::Long(_) | PropertyValue::Double(_) => 8,
            PropertyValue::String(s) => s.len() as u64,
        }
    }
}

/// A property name must be a Java identifier (so selectors can name it) and must not start with
/// `JMS`, which the specification reserves.
pub fn validate_property_name(name: &str) -> Result<(), KernelError> {
    let bad = |reason: String| KernelError::InvalidArgument {
        field: "properties",
        reason,
    };
    let mut chars = name.chars();
    match chars.next() {
        None => return Err(bad("a property name is empty".into())),
        Some(c) if !(c.is_alphabetic() || c == '_' || c == '$') => {
            return Err(bad(format!(
                "property name {name:?} must start with a letter, _ or $"
            )))
        }
        _ => {}
    }
    if let Some(c) = chars.find(|&c| !(c.is_alphanumeric() || c == '_' || c == '$')) {
        return Err(bad(format!(
            "property name {name:?} contains {c:?}; use letters, digits, _ or $"
        )));
    }
    if name.starts_with("JMS") {
        return Err(bad(format!(
            "property name {name:?} starts with JMS, which is reserved"
        )));
    }
    Ok(())
}

/// Body, properties and headers: what a message costs, and what its size limit is checked against.
fn content_size_bytes(
    body: &[u8],
    properties: &BTreeMap<String, PropertyValue>,
    reply_to: Option<&QueueName>,
    texts: [&Option<String>; 4],
) -> u64 {
    let props: u64 = properties
        .iter()
        .map(|(k, v)| k.len() as u64 + v.size_bytes())
        .sum();
    let texts: u64 = texts
        .iter()
        .map(|t| t.as_ref().map_or(0, |s| s.len() as u64))
        .sum();
    body.len() as u64 + props + texts + reply_to.map_or(0, |q| q.as_str().len() as u64)
}

/// What a producer sends: the message before the server stamps it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct NewMessage {
    pub body: Vec<u8>,
    pub properties: BTreeMap<String, PropertyValue>,
    /// Stored byte for byte: never trimmed, case-folded or re-encoded.
    pub correlation_id: Option<String>,
    pub reply_to: Option<QueueName>,
    pub jms_type: Option<String>,
    pub priority: Priority,
    /// 0 or `None`: never expires.
    pub time_to_live_ms: Option<u64>,
    pub delivery_delay_ms: Option<u64>,
    pub persistent: bool,
    pub dedup_id: Option<String>,
    pub group_id: Option<String>,
}

impl NewMessage {
    /// The bytes this message costs: body, properties, headers. Limits are checked against it.
    pub fn size_bytes(&self) -> u64 {
        content_size_bytes(
            &self.body,
            &self.properties,
            self.reply_to.as_ref(),
            [
                &self.correlation_id,
                &self.jms_type,
                &self.dedup_id,
                &self.group_id,
            ],
        )
    }
}

/// A message as stored and delivered: what was sent plus what the server stamped on it.
#[derive(Debug, Clone, PartialEq)]
pub struct Message {
    pub id: MessageId,
    pub seq: Seq,
    /// Shared, so a delivery or a copy of the message does not copy it.
    pub body: bytes::Bytes,
    pub properties: BTreeMap<String, PropertyValue>,
    pub correlation_id: Option<String>,
    pub reply_to: Option<QueueName>,
    pub jms_type: Option<String>,
    pub priority: Priority,
    /// JMSTimestamp: when the server accepted the message.
    pub timestamp_ms: u64,
    /// JMSExpiration; `None`: never expires.
    pub expiration_ms: Option<u64>,
    /// JMSDeliveryTime: invisible before this.
    pub deliver_at_ms: Option<u64>,
    pub persistent: bool,
    pub dedup_id: Option<String>,
    pub group_id: Option<String>,
}

impl Message {
    /// The bytes this message costs; the same measure as [`NewMessage::size_bytes`].
    pub fn size_bytes(&self) -> u64 {
        content_size_bytes(
            &self.body,
            &self.properties,
            self.reply_to.as_ref(),
            [
                &self.correlation_id,
                &self.jms_type,
                &self.dedup_id,
                &self.group_id,
            ],
        )
    }

    pub fn is_expired(&self, now_ms: u64) -> bool {
        self.expiration_ms.is_some_and(|at| at <= now_ms)
    }
}

/// The token a consumer acknowledges with. It names the back-end node and the queue, so any
/// front-end can route an ack without a lookup, and the exact delivery (queue incarnation, seq,
/// lease, delivery count), so a stale handle never acknowledges a newer delivery of the same
/// message, not even after a restart or a queue deleted and created again.
///
/// Text form: `r1.<node>.<uid hex>.<seq>.<lease>.<count>.<queue>` (the queue last: it may contain
/// dots).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ReceiptHandle {
    pub node: NodeId,
    pub queue: QueueName,
    pub uid: QueueUid,
    pub seq: Seq,
    pub lease: LeaseId,
    pub delivery_count: u32,
}

impl fmt::Display for ReceiptHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "r1.{}.{:x}.{}.{}.{}.{}",
            self.node, self.uid.0, self.seq.0, self.lease.0, self.delivery_count, self.queue
        )
    }
}

impl FromStr for ReceiptHandle {
    type Err = KernelError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = || KernelError::InvalidArgument {
            field: "receipt_handle",
            reason: format!("{s:?} is not a receipt handle from a delivery"),
        };
        let mut parts = s.splitn(7, '.');
        if parts.next() != Some("r1") {
            return Err(bad());
        }
        let node = NodeId::new(parts.next().ok_or_else(bad)?).map_err(|_| bad())?;
        let uid = parts
            .next()
            .and_then(|p| u64::from_str_radix(p, 16).ok())
            .ok_or_else(bad)?;
        let mut number = || {
            parts
                .next()
                .and_then(|p| p.parse::<u64>().ok())
                .ok_or_else(bad)
        };
        let seq = Seq(number()?);
        let lease = LeaseId(number()?);
        let delivery_count = u32::try_from(number()?).map_err(|_| bad())?;
        let queue = QueueName::new(parts.next().ok_or_else(bad)?).map_err(|_| bad())?;
        Ok(Self {
            node,
            queue,
            uid: QueueUid(uid),
            seq,
            lease,
            delivery_count,
        })
    }
}

/// Messages are shared between the queue, deliveries and the store without copying bodies.
pub(crate) type SharedMessage = Arc<Message>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn receipt_handle_round_trips_with_dots_in_queue_name() {
        let h = ReceiptHandle {
            node: NodeId::new("node-1").unwrap(),
            queue: QueueName::new("orders.eu.DLQ").unwrap(),
            uid: QueueUid(0xabc),
            seq: Seq(42),
            lease: LeaseId(7),
            delivery_count: 2,
        };
        assert_eq!(h.to_string().parse::<ReceiptHandle>().unwrap(), h);
        assert!("r2.node.1.2.q".parse::<ReceiptHandle>().is_err());
        assert!("r1.node.1.x.2.1.q".parse::<ReceiptHandle>().is_err());
        assert!("r1.node.zz.1.2.1.q".parse::<ReceiptHandle>().is_err());
        assert!("r1.node.1.1.2.99999999999.q"
            .parse::<ReceiptHandle>()
            .is_err());
        assert!("r1.node.1.1.2.1".parse::<ReceiptHandle>().is_err());
    }

    #[test]
    fn queue_names_are_checked() {
        assert!(QueueName::new("orders").is_ok());
        assert!(QueueName::new("").is_err());
        assert!(QueueName::new("a b").is_err());
        assert!(QueueName::new(".hidden").is_err());
        assert!(QueueName::new("x".repeat(201)).is_err());
    }

    #[test]
    fn property_names_must_be_identifiers() {
        assert!(validate_property_name("orderCount").is_ok());
        assert!(validate_property_name("1x").is_err());
        assert!(validate_property_name("a-b").is_err());
        assert!(validate_property_name("JMSFoo").is_err());
    }
}
